"""Building Atlas ISA programs: typed constructors and an operator-overloading ``Var``.

Every constructor types its result through ``verify.infer``, so a program built
here is valid by construction, and NumPy broadcasting is spelled out as explicit
RESHAPE and EXPAND (the backends then never guess at index arithmetic).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Union

import numpy as np

from ..errors import ShapeError, VerifyError
from . import dtypes
from .dtypes import DType, to_dtype
from .opcodes import SCATTER_STEP, Op
from .value import Shape, Value
from .verify import RuleError, infer, normalize_axes


def make(op: Op, srcs: Sequence[Value] = (), attrs: dict | None = None,
         dtype: DType | None = None, shape: Shape = ()) -> Value:
    """Create an instruction, typed by the ISA rules; a rule violation is a VerifyError."""
    attrs = attrs or {}
    try:
        d, s = infer(op, srcs, attrs, dtype, tuple(shape))
    except RuleError as e:
        raise VerifyError(f"{op}: {e}") from None
    return Value(op, d, s, tuple(srcs), tuple(attrs.items()))


def ldg(index: int, dtype: DType | str, shape: Shape) -> Value:
    return make(Op.LDG, (), {"in": int(index)}, to_dtype(dtype), tuple(shape))


def ldg_phi(phi: tuple[int, int, int], dtype: DType | str, shape: Shape) -> Value:
    return make(Op.LDG, (), {"phi": tuple(phi)}, to_dtype(dtype), tuple(shape))


def stg(x: Value, index: int) -> Value:
    return make(Op.STG, (x,), {"out": int(index)})


def stg_phi(x: Value, phi: tuple[int, int, int]) -> Value:
    return make(Op.STG, (x,), {"phi": tuple(phi)})


def const(value: float | int | bool, dtype: DType | str, shape: Shape = ()) -> Value:
    d = to_dtype(dtype)
    py = {"f": float, "i": int, "b": bool}[d.kind](value)
    return make(Op.CONST, (), {"value": py}, d, tuple(shape))


def broadcast_shape(*shapes: Shape) -> Shape:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ShapeError(
            "shapes " + ", ".join(str(list(s)) for s in shapes) + " do not broadcast"
        ) from None


def reshape(x: Value, shape: Shape) -> Value:
    shape = tuple(int(s) for s in shape)
    return x if shape == x.shape else make(Op.RESHAPE, (x,), None, x.dtype, shape)


def expand(x: Value, shape: Shape) -> Value:
    shape = tuple(shape)
    if x.shape == shape:
        return x
    if x.op is Op.CONST:  # a constant is already the same everywhere
        return const(x.attr("value"), x.dtype, shape)
    if x.ndim < len(shape):
        x = reshape(x, (1,) * (len(shape) - x.ndim) + x.shape)
    return make(Op.EXPAND, (x,), None, x.dtype, shape)


def permute(x: Value, perm: Sequence[int]) -> Value:
    perm = tuple(int(p) for p in perm)
    if perm == tuple(range(x.ndim)):
        return x
    return make(Op.PERMUTE, (x,), {"perm": perm})


def slice(x: Value, starts: Sequence[int], sizes: Sequence[int]) -> Value:
    """``x[starts[0]:starts[0]+sizes[0], ...]`` (step 1): a view, so a GEMM or a fused
    kernel reads it in place. A slice of all of ``x`` is ``x`` itself."""
    starts, sizes = tuple(int(s) for s in starts), tuple(int(s) for s in sizes)
    if starts == (0,) * x.ndim and sizes == x.shape:
        return x
    return make(Op.SLICE, (x,), {"starts": starts}, x.dtype, sizes)


def split(x: Value, sizes: Sequence[int], axis: int) -> list[Value]:
    """Consecutive slices of ``x`` along ``axis`` with the given sizes (which must add
    up to that axis's size): ``torch.split`` / ``np.split`` at cumulative offsets."""
    try:
        (axis,) = normalize_axes((axis,), x.ndim)
    except RuleError as e:
        raise VerifyError(f"{Op.SLICE}: {e}") from None
    if sum(sizes) != x.shape[axis]:
        raise ShapeError(f"split sizes {list(sizes)} do not add up to axis {axis} of "
                         f"{list(x.shape)}")
    out, start = [], 0
    for n in sizes:
        starts = tuple(start if d == axis else 0 for d in range(x.ndim))
        shape = tuple(n if d == axis else s for d, s in enumerate(x.shape))
        out.append(slice(x, starts, shape))
        start += n
    return out


def concat(parts: Sequence[Value], axis: int) -> Value:
    """``np.concatenate(parts, axis)``; one part is itself."""
    parts = tuple(parts)
    if not parts:
        raise VerifyError(f"{Op.CONCAT}: needs at least one operand")
    try:
        (axis,) = normalize_axes((axis,), parts[0].ndim)
    except RuleError as e:
        raise VerifyError(f"{Op.CONCAT}: {e}") from None
    if len(parts) == 1:
        return parts[0]
    return make(Op.CONCAT, parts, {"axis": axis})


def cast(x: Value, dtype: DType | str) -> Value:
    d = to_dtype(dtype)
    return x if d is x.dtype else make(Op.CVT, (x,), None, d, x.shape)


def unary(op: Op, x: Value) -> Value:
    return make(op, (x,))


def elementwise(op: Op, *xs: Value) -> Value:
    """An element-wise op over operands broadcast to one shape."""
    shape = broadcast_shape(*(x.shape for x in xs))
    return make(op, tuple(expand(x, shape) for x in xs))


def reduce(op: Op, x: Value, axes: int | Sequence[int] | None = None,
           keepdims: bool = False) -> Value:
    if axes is None:
        axes = tuple(range(x.ndim))
    elif isinstance(axes, int):
        axes = (axes,)
    try:
        norm = normalize_axes(tuple(axes), x.ndim)
    except RuleError as e:
        raise VerifyError(f"{op}: {e}") from None
    if not norm:
        return x
    r = make(op, (x,), {"axes": norm})
    if keepdims:
        return r
    return reshape(r, tuple(n for i, n in enumerate(x.shape) if i not in norm))


def gemm(a: Value, b: Value) -> Value:
    """The GEMM instruction as the ISA has it: ``[*batch, m, k] @ [*batch, k, n]`` with
    equal batch dims (use :func:`matmul` for NumPy's broadcasting rules)."""
    return make(Op.GEMM, (a, b))


def matmul(a: Value, b: Value) -> Value:
    """``np.matmul(a, b)``: a 1-D operand is a row (a) or column (b) vector whose
    size-1 axis leaves the result, and the batch dims broadcast, spelled as explicit
    RESHAPE/EXPAND before one GEMM (the ISA GEMM itself takes equal batch dims)."""
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError(f"matmul needs operands of rank >= 1, got {list(a.shape)} @ "
                         f"{list(b.shape)}")
    row, col = a.ndim == 1, b.ndim == 1
    if row:
        a = reshape(a, (1, *a.shape))
    if col:
        b = reshape(b, (*b.shape, 1))
    if a.shape[-1] != b.shape[-2]:
        raise ShapeError(f"matmul inner sizes differ: {list(a.shape)} @ {list(b.shape)}")
    batch = broadcast_shape(a.shape[:-2], b.shape[:-2])
    r = gemm(expand(a, (*batch, *a.shape[-2:])), expand(b, (*batch, *b.shape[-2:])))
    m, n = r.shape[-2:]
    return reshape(r, (*batch, *(() if row else (m,)), *(() if col else (n,))))


def _one_axis(op: Op, axis: int, ndim: int) -> int:
    try:
        (a,) = normalize_axes((axis,), ndim)
    except RuleError as e:
        raise VerifyError(f"{op}: {e}") from None
    return a


def iota(shape: Shape, axis: int, dtype: DType | str) -> Value:
    """Each element's coordinate along ``axis`` (NumPy: ``arange`` broadcast along it);
    element-wise, so kernels compute it from their loop index and read no memory."""
    shape = tuple(int(s) for s in shape)
    return make(Op.IOTA, (), {"axis": _one_axis(Op.IOTA, axis, len(shape))},
                to_dtype(dtype), shape)


def gather(x: Value, idx: Value, axis: int) -> Value:
    """``np.take_along_axis(x, idx, axis)`` (torch.gather): ``idx`` is i32 or i64, of
    ``x``'s rank and no larger off ``axis``; the result has ``idx``'s shape. Indices
    outside ``[0, x.shape[axis])`` raise IndexError when the program runs."""
    return make(Op.GATHER, (x, idx), {"axis": _one_axis(Op.GATHER, axis, x.ndim)})


def scatter_add(base: Value, idx: Value, src: Value, axis: int) -> Value:
    """``base`` with ``src[j]`` added at ``j`` whose ``axis`` coordinate is ``idx[j]``
    (torch.scatter_add; ``np.add.at``): duplicates add up, in ascending ``j[axis]``."""
    return make(Op.SCATTER_ADD, (base, idx, src),
                {"axis": _one_axis(Op.SCATTER_ADD, axis, base.ndim)})


def scatter(base: Value, idx: Value, src: Value, axis: int) -> Value:
    """``base`` with ``src[j]`` written at ``j`` whose ``axis`` coordinate is ``idx[j]``
    (torch.scatter); among duplicates the largest ``j[axis]`` wins (deterministic)."""
    return make(Op.SCATTER, (base, idx, src), {"axis": _one_axis(Op.SCATTER, axis, base.ndim)})


#: The scatter instruction of each combining step (opcodes.SCATTER_STEP inverted).
SCATTER_BY_STEP: dict[Op | None, Op] = {step: op for op, step in SCATTER_STEP.items()}


def scatter_combine(base: Value, idx: Value, src: Value, axis: int, step: Op) -> Value:
    """``base`` with each ``src[j]`` combined by ``step`` (ADD, MUL, MAX or MIN: the
    element first, then the update) into the element at ``j`` whose ``axis``
    coordinate is ``idx[j]`` (``np.<ufunc>.at``; torch.scatter_reduce's sum, prod,
    amax, amin with include_self): duplicates combine in ascending ``j[axis]``."""
    op = SCATTER_BY_STEP.get(step)
    if op is None or step is None:
        raise VerifyError(f"no scatter combines by {step} (one of "
                          f"{', '.join(str(s) for s in SCATTER_BY_STEP if s is not None)})")
    return make(op, (base, idx, src), {"axis": _one_axis(op, axis, base.ndim)})


def cumsum(x: Value, axis: int) -> Value:
    """Inclusive prefix sums along ``axis`` (floats narrower than f64 add in f64)."""
    return make(Op.CUMSUM, (x,), {"axis": _one_axis(Op.CUMSUM, axis, x.ndim)})


def cumprod(x: Value, axis: int) -> Value:
    """Inclusive prefix products along ``axis`` (floats narrower than f64 in f64)."""
    return make(Op.CUMPROD, (x,), {"axis": _one_axis(Op.CUMPROD, axis, x.ndim)})


def argsort(x: Value, axis: int, descending: bool = False, dtype: DType | str = "i64") -> Value:
    """``np.argsort(x, axis, kind="stable")`` (torch.sort's indices with stable=True):
    the positions along ``axis`` that sort each fiber; equal keys keep their order,
    -0.0 equals 0.0, NaN sorts last (first with ``descending``, as in PyTorch)."""
    return make(Op.ARGSORT, (x,), {"axis": _one_axis(Op.ARGSORT, axis, x.ndim),
                                   "descending": bool(descending)}, to_dtype(dtype), x.shape)


def take(x: Value, idx: Value, axis: int) -> Value:
    """``np.take(x, idx, axis)``: ``x``'s slices along ``axis`` picked by an index of any
    rank, the result ``x.shape[:axis] + idx.shape + x.shape[axis+1:]`` (embedding,
    index_select). One GATHER over views: ``x`` gets ``idx``'s leading axes as broadcast
    (size-1, expanded) axes and ``idx`` is broadcast over ``x``'s other axes, so the
    kernel computes each index once per slice and reads nothing twice."""
    a = _one_axis(Op.GATHER, axis, x.ndim)
    k = idx.ndim
    if k == 0:
        idx = reshape(idx, (1,))
        return reshape(take(x, idx, a), (*x.shape[:a], *x.shape[a + 1:]))
    out = (*x.shape[:a], *idx.shape, *x.shape[a + 1:])
    table = reshape(x, (*x.shape[:a], *(1,) * (k - 1), x.shape[a], *x.shape[a + 1:]))
    table = expand(table, (*x.shape[:a], *idx.shape[:-1], x.shape[a], *x.shape[a + 1:]))
    ind = reshape(idx, (*(1,) * a, *idx.shape, *(1,) * (x.ndim - a - 1)))
    return gather(table, expand(ind, out), a + k - 1)


def default_attention_scale(e: int) -> float:
    """ATen's default softmax scale: 1/sqrt(E) in double (inf for E = 0, as in C++)."""
    return 1.0 / math.sqrt(e) if e else math.inf


def _attention_attrs(scale: float | None, causal: bool, e: int) -> dict:
    return {"scale": float(default_attention_scale(e) if scale is None else scale),
            "causal": bool(causal)}


def attention(q: Value, k: Value, v: Value, mask: Value | None = None, *,
              scale: float | None = None, causal: bool = False) -> tuple[Value, Value]:
    """``(out, lse)`` of ``softmax(q k^T * scale + mask) v`` (``q [*b, L, E]``, ``k [*b, S,
    E]``, ``v [*b, S, Ev]``, an additive ``mask [*b, L, S]``), ``lse`` the log-sum-exp of
    each row of scores. Two values of one fused computation: the scheduler computes
    whichever the program uses in one step. ``scale`` defaults to ``1/sqrt(E)``;
    ``causal`` hides key ``j`` from query ``i`` when ``j > i``. The batch dims must be
    equal (expand a broadcast one first: the backends read an EXPAND in place)."""
    srcs = (q, k, v) if mask is None else (q, k, v, mask)
    attrs = _attention_attrs(scale, causal, q.shape[-1] if q.ndim else 0)
    return make(Op.ATTN, srcs, attrs), make(Op.ATTN_LSE, srcs, attrs)


def attention_grads(dout: Value, q: Value, k: Value, v: Value, out: Value, lse: Value,
                    mask: Value | None = None, *, scale: float | None = None,
                    causal: bool = False) -> tuple[Value, Value, Value]:
    """``(dq, dk, dv)``: the gradients of :func:`attention`'s ``out`` given ``dout``, from
    the forward's ``out`` and ``lse`` (FlashAttention-2's backward: the probabilities
    are recomputed from ``lse``, never stored). One fused step computes the parts a
    program uses."""
    srcs = (dout, q, k, v, out, lse) + (() if mask is None else (mask,))
    attrs = _attention_attrs(scale, causal, q.shape[-1] if q.ndim else 0)
    return tuple(make(op, srcs, attrs) for op in (Op.ATTN_DQ, Op.ATTN_DK, Op.ATTN_DV))


Operand = Union["Var", Value, float, int, bool]


class Var:
    """A Value with Python operators, for writing composite ops and traced functions.

    Python scalars become constants of the other operand's dtype, so
    ``0.5 * x`` stays f32 when x is f32 (NumPy's rule for Python scalars).
    Methods return ``type(self)``, so a subclass (the jit's NumPy-speaking
    ``npjit.traced.Traced``) keeps its own semantics through the composites.
    """

    __slots__ = ("v",)
    __array_priority__ = 1000  # keep NumPy scalars from taking over the operators

    def __init__(self, v: Value) -> None:
        self.v = v

    @property
    def shape(self) -> Shape:
        return self.v.shape

    @property
    def dtype(self) -> DType:
        return self.v.dtype

    @property
    def ndim(self) -> int:
        return self.v.ndim

    def _lift(self, other: Operand) -> Value:
        if isinstance(other, Var):
            return other.v
        if isinstance(other, Value):
            return other
        if isinstance(other, (bool, int, float, np.generic)):
            return const(other.item() if isinstance(other, np.generic) else other,
                         self.v.dtype, self.v.shape)
        return NotImplemented  # type: ignore[return-value]

    def _bin(self, op: Op, other: Operand, reverse: bool = False) -> Var:
        o = self._lift(other)
        if o is NotImplemented:
            return NotImplemented  # type: ignore[return-value]
        a, b = (o, self.v) if reverse else (self.v, o)
        if a.dtype is not b.dtype:
            raise VerifyError(f"{op}: operands differ in dtype ({a.dtype} vs {b.dtype})")
        return type(self)(elementwise(op, a, b))

    def __add__(self, o: Operand) -> Var: return self._bin(Op.ADD, o)
    def __radd__(self, o: Operand) -> Var: return self._bin(Op.ADD, o, True)
    def __sub__(self, o: Operand) -> Var: return self._bin(Op.SUB, o)
    def __rsub__(self, o: Operand) -> Var: return self._bin(Op.SUB, o, True)
    def __mul__(self, o: Operand) -> Var: return self._bin(Op.MUL, o)
    def __rmul__(self, o: Operand) -> Var: return self._bin(Op.MUL, o, True)
    def __truediv__(self, o: Operand) -> Var: return self._bin(Op.DIV, o)
    def __rtruediv__(self, o: Operand) -> Var: return self._bin(Op.DIV, o, True)
    def __pow__(self, o: Operand) -> Var: return self._bin(Op.POW, o)
    def __rpow__(self, o: Operand) -> Var: return self._bin(Op.POW, o, True)
    def __lt__(self, o: Operand) -> Var: return self._bin(Op.CMPLT, o)
    def __gt__(self, o: Operand) -> Var: return self._bin(Op.CMPLT, o, True)
    # bitwise ops and shifts: integers (and bool for & | ^ ~, the logical ops)
    def __and__(self, o: Operand) -> Var: return self._bin(Op.AND, o)
    def __rand__(self, o: Operand) -> Var: return self._bin(Op.AND, o, True)
    def __or__(self, o: Operand) -> Var: return self._bin(Op.OR, o)
    def __ror__(self, o: Operand) -> Var: return self._bin(Op.OR, o, True)
    def __xor__(self, o: Operand) -> Var: return self._bin(Op.XOR, o)
    def __rxor__(self, o: Operand) -> Var: return self._bin(Op.XOR, o, True)
    def __lshift__(self, o: Operand) -> Var: return self._bin(Op.SHL, o)
    def __rshift__(self, o: Operand) -> Var: return self._bin(Op.SHR, o)
    def __invert__(self) -> Var: return type(self)(unary(Op.NOT, self.v))
    def __neg__(self) -> Var: return type(self)(unary(Op.NEG, self.v))
    def __abs__(self) -> Var: return type(self)(unary(Op.ABS, self.v))
    def __matmul__(self, o: Var) -> Var: return type(self)(matmul(self.v, o.v))

    def eq(self, o: Operand) -> Var: return self._bin(Op.CMPEQ, o)
    def minimum(self, o: Operand) -> Var: return self._bin(Op.MIN, o)
    def maximum(self, o: Operand) -> Var: return self._bin(Op.MAX, o)

    def exp(self) -> Var: return type(self)(unary(Op.EXP, self.v))
    def log(self) -> Var: return type(self)(unary(Op.LOG, self.v))
    def sqrt(self) -> Var: return type(self)(unary(Op.SQRT, self.v))
    def rsqrt(self) -> Var: return type(self)(unary(Op.RSQRT, self.v))
    def recip(self) -> Var: return type(self)(unary(Op.RECIP, self.v))
    def tanh(self) -> Var: return type(self)(unary(Op.TANH, self.v))
    def sigmoid(self) -> Var: return type(self)(unary(Op.SIGMOID, self.v))
    def erf(self) -> Var: return type(self)(unary(Op.ERF, self.v))
    def sin(self) -> Var: return type(self)(unary(Op.SIN, self.v))
    def cos(self) -> Var: return type(self)(unary(Op.COS, self.v))

    def where(self, a: Operand, b: Operand) -> Var:
        """self is the bool condition: self ? a : b."""
        ref = a if isinstance(a, Var) else b if isinstance(b, Var) else None
        if ref is None:
            raise VerifyError("sel: at least one branch must be an array")
        av, bv = ref._lift(a), ref._lift(b)
        return type(self)(elementwise(Op.SEL, self.v, av, bv))

    def mad(self, b: Operand, c: Operand) -> Var:
        return type(self)(elementwise(Op.MAD, self.v, self._lift(b), self._lift(c)))

    def sum(self, axis=None, keepdims=False) -> Var:
        return type(self)(reduce(Op.RSUM, self.v, axis, keepdims))

    def max(self, axis=None, keepdims=False, initial=None) -> Var:
        """An empty reduction gives -inf (the identity), or ``max(-inf, initial)``."""
        r = type(self)(reduce(Op.RMAX, self.v, axis, keepdims))
        return r if initial is None else r.maximum(initial)

    def min(self, axis=None, keepdims=False, initial=None) -> Var:
        r = type(self)(reduce(Op.RMIN, self.v, axis, keepdims))
        return r if initial is None else r.minimum(initial)

    def prod(self, axis=None, keepdims=False) -> Var:
        return type(self)(reduce(Op.RPROD, self.v, axis, keepdims))

    def mean(self, axis=None, keepdims=False) -> Var:
        axes = range(self.ndim) if axis is None else [axis] if isinstance(axis, int) else axis
        n = math.prod(self.shape[a] for a in axes)
        # 1/n is not exact for most n; dividing keeps the result correctly rounded.
        return self.sum(axis, keepdims) / float(n) if n else self.sum(axis, keepdims) / 0.0

    def reshape(self, *shape) -> Var:
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        if -1 in shape:
            known = math.prod(s for s in shape if s != -1)
            shape = tuple(self.v.size // known if s == -1 else s for s in shape)
        return type(self)(reshape(self.v, tuple(shape)))

    def expand(self, shape: Shape) -> Var:
        return type(self)(expand(self.v, tuple(shape)))

    def permute(self, *perm) -> Var:
        perm = perm[0] if len(perm) == 1 and isinstance(perm[0], (tuple, list)) else perm
        return type(self)(permute(self.v, perm))

    @property
    def T(self) -> Var:
        return self.permute(tuple(reversed(range(self.ndim))))

    def slice(self, starts: Sequence[int], sizes: Sequence[int]) -> Var:
        return type(self)(slice(self.v, starts, sizes))

    def split(self, sizes: Sequence[int], axis: int) -> list[Var]:
        return [type(self)(p) for p in split(self.v, sizes, axis)]

    def cast(self, dtype: DType | str) -> Var:
        return type(self)(cast(self.v, dtype))

    def gather(self, idx: Var, axis: int) -> Var:
        return type(self)(gather(self.v, idx.v, axis))

    def take(self, idx: Var, axis: int) -> Var:
        return type(self)(take(self.v, idx.v, axis))

    def scatter_add(self, idx: Var, src: Var, axis: int) -> Var:
        """self is the base: a copy with ``src`` added at ``idx`` along ``axis``."""
        return type(self)(scatter_add(self.v, idx.v, src.v, axis))

    def scatter(self, idx: Var, src: Var, axis: int) -> Var:
        """self is the base: a copy with ``src`` written at ``idx`` along ``axis``."""
        return type(self)(scatter(self.v, idx.v, src.v, axis))

    def scatter_combine(self, idx: Var, src: Var, axis: int, step: Op) -> Var:
        """self is the base: a copy with ``src`` combined by ``step`` at ``idx``."""
        return type(self)(scatter_combine(self.v, idx.v, src.v, axis, step))

    def argsort(self, axis: int, descending: bool = False, dtype: DType | str = "i64") -> Var:
        return type(self)(argsort(self.v, axis, descending, dtype))

    def cumsum(self, axis: int) -> Var:
        return type(self)(cumsum(self.v, axis))

    def cumprod(self, axis: int) -> Var:
        return type(self)(cumprod(self.v, axis))

    def __repr__(self) -> str:
        return f"Var({self.v!r})"


def program(fn, in_specs: Sequence[tuple[DType | str, Shape]], name: str = ""):
    """Build a Program by calling ``fn`` on one Var per input; fn returns Var(s)."""
    from .program import Program

    specs = [(to_dtype(d), tuple(s)) for d, s in in_specs]
    args = [Var(ldg(i, d, s)) for i, (d, s) in enumerate(specs)]
    result = fn(*args)
    outs = result if isinstance(result, (tuple, list)) else (result,)
    stores = [stg(o.v if isinstance(o, Var) else o, i) for i, o in enumerate(outs)]
    return Program(stores, specs, name=name)


__all__ = [
    "argsort", "attention", "attention_grads", "default_attention_scale",
    "Var", "broadcast_shape", "cast", "concat", "const", "cumprod", "cumsum", "dtypes",
    "elementwise", "expand", "gather", "gemm", "iota", "ldg", "ldg_phi", "make", "matmul",
    "permute", "program", "reduce", "reshape", "scatter", "scatter_add", "scatter_combine",
    "slice", "split", "stg", "stg_phi", "take", "unary",
]
