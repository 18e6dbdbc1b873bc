"""The ATen op -> Atlas ISA translation table of the ``torch.compile`` backend.

Why this module exists: every ATen op the backend runs in hologram is one row of
:data:`ATEN_TABLE`, mapping the op (an overload packet, such as ``aten.add``) to a
function over :class:`hologram.isa.builder.Var`. A table and not an if-chain, so
that adding an op is adding a row, and the table doubles as the list of supported
ops (:func:`supported_ops`). The regions, plans and runners that use the table live
in :mod:`hologram_torch.compile_backend`; what each node produces (:class:`TInfo`)
lives in :mod:`hologram_torch.fx_info`.

How to add an op: write ``_name(ctx, *args, **kwargs) -> Var`` with the ATen op's
own signature (tensor arguments arrive as ``Var``, the rest as Python values), ask
``ctx`` for the result's dtype and shape (``ctx.out_dtype``, ``ctx.out_shape``),
build the result from ``Var`` methods, :mod:`hologram.isa.builder` constructors and
:mod:`hologram.ops.composites`, and add the row ``aten.name: _name``. Raise
:class:`Unsupported` with a reason for the cases it does not cover: that node then
runs in PyTorch and the reason is logged once. An op that only re-indexes also goes
into :data:`VIEW_OPS`; an op that AOT autograd should decompose into ops of the
table instead goes into :data:`DECOMPOSE`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.fx

from hologram.isa import dtypes
from hologram.isa.builder import Var, concat, const, elementwise, make
from hologram.isa.dtypes import DType
from hologram.isa.opcodes import Op
from hologram.isa.value import Value
from hologram.ops import composites

from .fx_info import INT_DTYPES, ISA_FLOAT, TInfo

if TYPE_CHECKING:
    from .compile_backend import _Region

__all__ = [
    "ATEN_TABLE",
    "DECOMPOSE",
    "FREE_IN_EAGER",
    "VIEW_OPS",
    "Ctx",
    "Unsupported",
    "supported_ops",
]

aten = torch.ops.aten


class Unsupported(Exception):
    """A node hologram cannot run; the message is the reason shown to the user."""


class Ctx:
    """What a translation function may ask about the node it translates."""

    def __init__(self, node: torch.fx.Node, out: Any, region: _Region) -> None:
        self.node = node
        self.out = out
        self._region = region

    @property
    def out_dtype(self) -> DType:
        """The ISA dtype of the (first) tensor result."""
        info = self.out[0] if isinstance(self.out, tuple) else self.out
        return _isa_dtype(info.dtype)

    @property
    def out_shape(self) -> tuple[int, ...]:
        info = self.out[0] if isinstance(self.out, tuple) else self.out
        return info.shape

    def iota(self, n: int, dtype: DType) -> Var:
        """0, 1, ..., n-1 as an input the region receives (the ISA has no iota)."""
        return self._region.aux_input(("iota", n, dtype.name),
                                      lambda: np.arange(n, dtype=dtype.np_dtype))

    def check_index(self, target: Var, n_classes: int, ignore_index: int) -> None:
        """Have the runtime check class indices as PyTorch does before running."""
        self._region.add_index_check(target, n_classes, ignore_index)


def _isa_dtype(td: torch.dtype) -> DType:
    """The dtype a tensor of ``td`` has inside a program (integers ride in f64)."""
    if td is torch.bool:
        return dtypes.boolean
    if td in INT_DTYPES:
        return dtypes.f64
    d = ISA_FLOAT.get(td)
    if d is None:
        raise Unsupported(f"dtype {td} is not an Atlas ISA dtype the executor runs")
    return d


def _var(x: Any, dtype: DType) -> Var:
    """A Var of ``dtype``: casts a Var, turns a Python scalar into a 0-d constant."""
    if isinstance(x, Var):
        return x.cast(dtype) if x.dtype is not dtype else x
    if isinstance(x, (bool, int, float)):
        if dtype is dtypes.boolean:
            return Var(const(bool(x), dtype, ()))
        return Var(const(float(x) if dtype.is_float else int(x), dtype, ()))
    raise Unsupported(f"operand of type {type(x).__name__} is not a tensor or a number")


def _wider(*xs: Any) -> DType:
    """The compute dtype for comparing or combining mixed operands (PyTorch-like)."""
    ds = [x.dtype for x in xs if isinstance(x, Var) and x.dtype.is_float]
    if not ds:
        return dtypes.f32
    full = [x.dtype for x in xs if isinstance(x, Var) and x.dtype.is_float and x.ndim > 0]
    pool = full or ds
    return dtypes.f64 if dtypes.f64 in pool else pool[0]


def _bool_const(value: bool) -> Value:
    return const(value, dtypes.boolean, ())


def _or(p: Var, q: Var) -> Var:
    return Var(elementwise(Op.SEL, p.v, _bool_const(True), q.v))


def _and(p: Var, q: Var) -> Var:
    return Var(elementwise(Op.SEL, p.v, q.v, _bool_const(False)))


def _not(p: Var) -> Var:
    return Var(elementwise(Op.SEL, p.v, _bool_const(False), _bool_const(True)))


def _logical(kind: str) -> Callable[..., Var]:
    """and/or/not over bool tensors (integer bitwise ops fail the dtype check first)."""

    def tr(ctx: Ctx, a: Any, b: Any = None) -> Var:
        if ctx.out.dtype is not torch.bool:
            raise Unsupported(f"bitwise {kind} on {ctx.out.dtype} (only bool is translated)")
        p = _var(a, dtypes.boolean)
        if kind == "not":
            return _not(p)
        q = _var(b, dtypes.boolean)
        return _or(p, q) if kind == "or" else _and(p, q)

    return tr


def _sign(ctx: Ctx, x: Var) -> Var:
    x = x.cast(ctx.out_dtype)
    # x * 0 keeps NaN as NaN (and 0 as 0) where neither comparison holds.
    return (0.0 < x).where(1.0, (x < 0.0).where(-1.0, x * 0.0))


def _cmp(kind: str, a: Any, b: Any) -> Var:
    d = _wider(a, b)
    x, y = _var(a, d), _var(b, d)
    # Written with < and == only (the ISA's compares), keeping IEEE NaN behaviour:
    # every comparison with NaN is false except !=.
    forms: dict[str, Callable[[], Var]] = {
        "lt": lambda: x < y,
        "gt": lambda: y < x,
        "eq": lambda: x.eq(y),
        "ne": lambda: _not(x.eq(y)),
        "le": lambda: _or(x < y, x.eq(y)),
        "ge": lambda: _or(y < x, x.eq(y)),
    }
    return forms[kind]()


def _dims(x: Var, dim: Any) -> tuple[int, ...]:
    """ATen's dim argument: None or [] means every dimension."""
    if dim is None:
        return tuple(range(x.ndim))
    if isinstance(dim, int):
        dim = [dim]
    if len(dim) == 0:
        return tuple(range(x.ndim))
    return tuple(d % x.ndim if x.ndim else 0 for d in dim)


def _reduce_as(method: str) -> Callable[..., Var]:
    def fn(ctx: Ctx, x: Var, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Var:
        x = x.cast(ctx.out_dtype)  # a bool count sums in the (integer, so f64) result
        if x.ndim == 0:
            return x
        r = getattr(x, method)(_dims(x, dim), keepdims=bool(keepdim))
        return r.reshape(ctx.out_shape)

    return fn


def _loss_reduce(per_elem: Var, reduction: int) -> Var:
    # ATen encodes reduction as an int: 0 none, 1 mean, 2 sum.
    return composites.reduce_loss(per_elem, {0: "none", 1: "mean", 2: "sum"}[int(reduction)])


def _binary(fn: Callable[[Var, Var], Var]) -> Callable[..., Var]:
    def tr(ctx: Ctx, a: Any, b: Any, *, alpha: Any = 1) -> Var:
        d = ctx.out_dtype
        x, y = _var(a, d), _var(b, d)
        if alpha != 1:
            y = y * float(alpha)
        return fn(x, y)

    return tr


def _rsub(ctx: Ctx, a: Any, b: Any, *, alpha: Any = 1) -> Var:
    d = ctx.out_dtype
    x, y = _var(a, d), _var(b, d)
    return y - (x * float(alpha) if alpha != 1 else x)


def _div(ctx: Ctx, a: Any, b: Any, *, rounding_mode: str | None = None) -> Var:
    if rounding_mode is not None:
        raise Unsupported(f"div rounding_mode={rounding_mode!r} has no ISA form")
    d = ctx.out_dtype
    return _var(a, d) / _var(b, d)


def _unary(method: str) -> Callable[..., Var]:
    def tr(ctx: Ctx, x: Var) -> Var:
        return getattr(x.cast(ctx.out_dtype), method)()

    return tr


def _where(ctx: Ctx, cond: Any, a: Any, b: Any) -> Var:
    d = ctx.out_dtype
    c = _var(cond, dtypes.boolean)
    return c.where(_var(a, d), _var(b, d))


def _clamp(ctx: Ctx, x: Var, min: Any = None, max: Any = None) -> Var:  # noqa: A002
    d = ctx.out_dtype
    y = x.cast(d)
    if min is not None:
        y = y.maximum(_var(min, d))
    if max is not None:
        y = y.minimum(_var(max, d))
    return y


def _gelu(ctx: Ctx, x: Var, approximate: str = "none") -> Var:
    return composites.gelu(x.cast(ctx.out_dtype), approximate)


def _gelu_backward(ctx: Ctx, grad: Var, x: Var, approximate: str = "none") -> Var:
    d = ctx.out_dtype
    g, x = grad.cast(d), x.cast(d)
    if approximate == "tanh":
        k0, k1 = composites.SQRT_2_OVER_PI, 0.044715
        t = (k0 * (x + k1 * (x * x * x))).tanh()
        left_d = 0.5 * (1.0 + t)
        right_d = (0.5 * x) * (1.0 - t * t) * k0 * (1.0 + (3.0 * k1) * (x * x))
        return g * (left_d + right_d)
    cdf = 0.5 * (1.0 + (x * composites.INV_SQRT2).erf())
    pdf = (-0.5 * (x * x)).exp() * (1.0 / math.sqrt(2.0 * math.pi))
    return g * (cdf + x * pdf)


def _threshold_backward(ctx: Ctx, grad: Var, x: Var, threshold: float) -> Var:
    return _cmp("le", x, threshold).where(0.0, _var(grad, ctx.out_dtype))


def _softmax(ctx: Ctx, x: Var, dim: int, half_to_float: bool = False) -> Var:
    return composites.softmax(x.cast(ctx.out_dtype), dim)


def _log_softmax(ctx: Ctx, x: Var, dim: int, half_to_float: bool = False) -> Var:
    return composites.log_softmax(x.cast(ctx.out_dtype), dim)


def _softmax_backward(ctx: Ctx, grad: Var, out: Var, dim: int, input_dtype: Any = None) -> Var:
    d = ctx.out_dtype
    g, y = grad.cast(d), out.cast(d)
    return y * (g - (g * y).sum(dim, keepdims=True))


def _log_softmax_backward(ctx: Ctx, grad: Var, out: Var, dim: int,
                          input_dtype: Any = None) -> Var:
    d = ctx.out_dtype
    g, y = grad.cast(d), out.cast(d)
    return g - y.exp() * g.sum(dim, keepdims=True)


def _var_of(x: Var, dims: tuple[int, ...], correction: float, keepdim: bool) -> tuple[Var, Var]:
    n = math.prod(x.shape[d] for d in dims)
    mean = x.mean(dims, keepdims=True)
    dev = x - mean
    var = (dev * dev).sum(dims, keepdims=True) / float(max(n - correction, 0))
    if not keepdim:
        keep = tuple(s for i, s in enumerate(x.shape) if i not in dims)
        var, mean = var.reshape(keep), mean.reshape(keep)
    return var, mean


def _var_correction(ctx: Ctx, x: Var, dim: Any = None, *, correction: Any = None,
                    keepdim: bool = False) -> Var:
    x = x.cast(ctx.out_dtype)
    return _var_of(x, _dims(x, dim), 1.0 if correction is None else float(correction),
                   keepdim)[0]


def _var_mean_correction(ctx: Ctx, x: Var, dim: Any = None, *, correction: Any = None,
                         keepdim: bool = False) -> tuple[Var, Var]:
    x = x.cast(ctx.out_dtype)
    return _var_of(x, _dims(x, dim), 1.0 if correction is None else float(correction), keepdim)


def _layer_norm(ctx: Ctx, x: Var, normalized_shape: Sequence[int], weight: Var | None,
                bias: Var | None, eps: float) -> tuple[Var, Var, Var]:
    d = ctx.out_dtype
    x = x.cast(d)
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    mean = x.mean(axes, keepdims=True)
    dev = x - mean
    rstd = ((dev * dev).mean(axes, keepdims=True) + float(eps)).rsqrt()
    y = dev * rstd
    if weight is not None:
        y = y * weight.cast(d)
    if bias is not None:
        y = y + bias.cast(d)
    stat_shape = ctx.out[1].shape
    return y, mean.reshape(stat_shape), rstd.reshape(stat_shape)


def _layer_norm_backward(ctx: Ctx, grad_out: Var, x: Var, normalized_shape: Sequence[int],
                         mean: Var, rstd: Var, weight: Var | None, bias: Var | None,
                         output_mask: Sequence[bool]) -> tuple[Var | None, ...]:
    d = _isa_dtype(next(i for i in ctx.out if isinstance(i, TInfo)).dtype)
    g, x = grad_out.cast(d), x.cast(d)
    k = len(normalized_shape)
    axes = tuple(range(x.ndim - k, x.ndim))
    lead = tuple(range(x.ndim - k))
    keep = tuple(x.shape[: x.ndim - k]) + (1,) * k
    mean, rstd = mean.cast(d).reshape(keep), rstd.cast(d).reshape(keep)
    x_hat = (x - mean) * rstd
    n = float(math.prod(normalized_shape))
    results: list[Var | None] = [None, None, None]
    if output_mask[0]:
        gw = g * weight.cast(d) if weight is not None else g
        s1 = gw.sum(axes, keepdims=True)
        s2 = (gw * x_hat).sum(axes, keepdims=True)
        results[0] = (rstd / n) * (n * gw - s1 - x_hat * s2)
    if output_mask[1] and weight is not None:
        results[1] = (g * x_hat).sum(lead).reshape(tuple(normalized_shape)) if lead else \
            (g * x_hat).reshape(tuple(normalized_shape))
    if output_mask[2] and bias is not None:
        results[2] = g.sum(lead).reshape(tuple(normalized_shape)) if lead else \
            g.reshape(tuple(normalized_shape))
    return tuple(results)


def _mm(ctx: Ctx, a: Var, b: Var) -> Var:
    d = ctx.out_dtype
    return a.cast(d) @ b.cast(d)


def _addmm(ctx: Ctx, bias: Var, a: Var, b: Var, *, beta: Any = 1, alpha: Any = 1) -> Var:
    d = ctx.out_dtype
    r = a.cast(d) @ b.cast(d)
    if alpha != 1:
        r = r * float(alpha)
    if beta == 0:
        return r
    c = _var(bias, d)
    return r + (c * float(beta) if beta != 1 else c)


def _unmerged(v: Value) -> Value | None:
    """``v`` (shape [B, r, c]) as the value ``u`` of shape [*batch, r, c] it was
    flattened from (prod(batch) == B), or None when it was not.

    ``torch.matmul`` on 4-D operands (attention's ``q @ k.transpose(-2, -1)``) reaches
    the graph as bmm of ``_unsafe_view(expand(transpose(...)), [B, r, c])``: a reshape
    that merges batch axes. Merging a head axis into the batch axis of a permuted
    tensor is not a strided view, so a GEMM reading it would need a copy; the
    unmerged operand is one (a permute over a buffer), which a strided-batch GEMM
    reads in place. A transpose of the last two axes on top of the reshape (the
    backward graph's ``bmm(transpose(view), ...)``) is looked through as well.
    """
    if v.op is Op.PERMUTE and v.attr("perm") == (0, 2, 1):
        u = _unmerged(v.srcs[0])
        if u is None:
            return None
        return make(Op.PERMUTE, (u,), {"perm": (*range(u.ndim - 2), u.ndim - 1, u.ndim - 2)})
    if v.op is Op.RESHAPE:
        u = v.srcs[0]
        if u.ndim > 3 and u.shape[-2:] == v.shape[-2:] and math.prod(u.shape[:-2]) == v.shape[0]:
            return u
    return None


def _batched_gemm(a: Var, b: Var) -> Var:
    """``a [B, m, k] @ b [B, k, n]`` as one batched GEMM, over the operands' unmerged
    batch axes where their reshapes merged some (see :func:`_unmerged`): splitting an
    axis is always a view, merging one may not be."""
    (bs, m, _), n = a.shape, b.shape[2]
    ua, ub = _unmerged(a.v), _unmerged(b.v)
    batch = next((u.shape[:-2] for u in (ua, ub) if u is not None), None)
    if batch is None or any(u is not None and u.shape[:-2] != batch for u in (ua, ub)):
        return a @ b  # nothing to unmerge, or two different splits: the 3-D product
    pa = Var(ua) if ua is not None else a.reshape((*batch, *a.shape[1:]))
    pb = Var(ub) if ub is not None else b.reshape((*batch, *b.shape[1:]))
    return (pa @ pb).reshape(bs, m, n)


def _bmm(ctx: Ctx, a: Var, b: Var) -> Var:
    d = ctx.out_dtype
    return _batched_gemm(a.cast(d), b.cast(d))


def _matmul(ctx: Ctx, a: Var, b: Var) -> Var:
    """``torch.matmul``: NumPy's rules (1-D operands, broadcast batch dims), which the
    builder spells as RESHAPE/EXPAND before one GEMM. AOT autograd normally decomposes
    matmul into mm/bmm before the graph reaches us; this row covers graphs that keep it."""
    d = ctx.out_dtype
    return a.cast(d) @ b.cast(d)


def _reshape_to_out(ctx: Ctx, x: Var, *args: Any, **kwargs: Any) -> Var:
    return x.reshape(ctx.out_shape)


def _expand(ctx: Ctx, x: Var, *args: Any, **kwargs: Any) -> Var:
    return x.expand(ctx.out_shape)


def _t(ctx: Ctx, x: Var) -> Var:
    return x.T if x.ndim == 2 else x


def _transpose(ctx: Ctx, x: Var, d0: int, d1: int) -> Var:
    if x.ndim < 2:
        return x
    perm = list(range(x.ndim))
    perm[d0 % x.ndim], perm[d1 % x.ndim] = perm[d1 % x.ndim], perm[d0 % x.ndim]
    return x.permute(tuple(perm))


def _permute(ctx: Ctx, x: Var, dims: Sequence[int]) -> Var:
    return x.permute(tuple(d % x.ndim for d in dims)) if x.ndim else x


def _axis(x: Var, dim: int) -> int:
    if x.ndim == 0:
        raise Unsupported("slicing a 0-d tensor")
    return dim % x.ndim


def _window(ctx: Ctx, x: Var, dim: int, start: int) -> Var:
    """``x`` narrowed along ``dim`` to ATen's result size from ``start`` (Python's
    rules: a negative start counts from the end, out-of-range starts clamp)."""
    d = _axis(x, dim)
    n = x.shape[d]
    lo = min(max(start + n if start < 0 else start, 0), n)
    return x.slice(tuple(lo if a == d else 0 for a in range(x.ndim)), ctx.out_shape)


def _slice(ctx: Ctx, x: Var, dim: int = 0, start: int | None = None, end: int | None = None,
           step: int = 1) -> Var:
    if step != 1:
        raise Unsupported(f"slice with step {step} (the ISA's SLICE takes step 1)")
    return _window(ctx, x, dim, 0 if start is None else start)


def _narrow(ctx: Ctx, x: Var, dim: int, start: Any, length: int) -> Var:
    if not isinstance(start, int):
        raise Unsupported("narrow with a tensor start (a data-dependent slice)")
    return _window(ctx, x, dim, start)


def _split(ctx: Ctx, x: Var, _sizes: Any, dim: int = 0) -> tuple[Var, ...]:
    """split, split_with_sizes and chunk: consecutive slices, sized as ATen's results
    are (which settles chunk's and split's rounding once, in PyTorch)."""
    d = _axis(x, dim)
    return tuple(x.split([o.shape[d] for o in ctx.out], d))


def _cat(ctx: Ctx, tensors: Sequence[Any], dim: int = 0) -> Var:
    """``torch.cat``, in the result's dtype; PyTorch's legacy 1-D empty operands (shape
    [0] beside higher-rank tensors) are skipped as it skips them."""
    out_ndim = len(ctx.out_shape)
    parts = [_var(t, ctx.out_dtype).v for t in tensors
             if not (isinstance(t, Var) and t.shape == (0,) and out_ndim != 1)]
    if not parts:
        raise Unsupported("cat of nothing but legacy empty tensors")
    return Var(concat(parts, dim % out_ndim))


def _slice_backward(ctx: Ctx, grad: Var, input_sizes: Sequence[int], dim: int, start: int,
                    end: int, step: int) -> Var:
    """The gradient of a slice: ``grad`` in its window, zeros around it (a CONCAT with
    constant parts, which read no memory)."""
    if step != 1:
        raise Unsupported(f"slice_backward with step {step} (the ISA's SLICE takes step 1)")
    shape = tuple(input_sizes)
    d = dim % len(shape)
    n = shape[d]
    lo = min(max(start + n if start < 0 else start, 0), n)
    g = _var(grad, ctx.out_dtype)

    def zeros(size: int) -> Value:
        return const(0, g.dtype, (*shape[:d], size, *shape[d + 1:]))

    parts = [p for p in (zeros(lo), g.v, zeros(n - lo - g.shape[d])) if p.shape[d]]
    return Var(concat(parts or [g.v], d))


def _identity(ctx: Ctx, x: Var, *args: Any, **kwargs: Any) -> Var:
    return x


def _copy(ctx: Ctx, x: Any, src: Any, non_blocking: bool = False) -> Var:
    """The functional ``copy``: ``src``'s values in ``x``'s dtype and shape (what
    functionalization makes of an in-place update of a temporary, e.g. ``addcmul_``)."""
    return _var(src, ctx.out_dtype).expand(ctx.out_shape)


def _fma(ctx: Ctx, a: Any, b: Any, c: Any) -> Var:
    """Inductor's ``prims.fma`` (from its ``addcmul`` decomposition): ``a * b + c``
    rounded once, as eager's vectorised ``addcmul`` computes it."""
    d = ctx.out_dtype
    x, y, z = (_var(v, d) for v in (a, b, c))
    return Var(elementwise(Op.FMA, x.v, y.v, z.v))


def _to_copy(ctx: Ctx, x: Var, *args: Any, dtype: Any = None, device: Any = None,
             **kwargs: Any) -> Var:
    if device is not None and torch.device(device).type != "cpu":
        raise Unsupported(f"_to_copy to device {device} leaves host memory")
    return x.cast(_isa_dtype(ctx.out.dtype))


def _convert_element_type(ctx: Ctx, x: Var, dtype: Any) -> Var:
    return x.cast(_isa_dtype(ctx.out.dtype))


def _fill_from(pos: int | None) -> Callable[..., Var]:
    """Constant fills; ``pos`` is where the fill value sits in the arguments."""

    def tr(ctx: Ctx, *args: Any, **kwargs: Any) -> Var:
        value = kwargs.get("fill_value", args[pos] if pos is not None else None)
        if isinstance(value, Var):
            raise Unsupported("fill value is a tensor")
        return _var(value, ctx.out_dtype).expand(ctx.out_shape)

    return tr


def _const_fill(value: float) -> Callable[..., Var]:
    def tr(ctx: Ctx, *args: Any, **kwargs: Any) -> Var:
        return _var(value, ctx.out_dtype).expand(ctx.out_shape)

    return tr


def _mse_loss(ctx: Ctx, x: Var, t: Var, reduction: int = 1) -> Var:
    d = ctx.out_dtype
    return _loss_reduce(composites.squared_error(x.cast(d), t.cast(d)), reduction)


def _mse_loss_backward(ctx: Ctx, grad: Var, x: Var, t: Var, reduction: int) -> Var:
    d = ctx.out_dtype
    x, t = x.cast(d), t.cast(d)
    g = 2.0 * (x - t) * _var(grad, d)
    return g / float(x.v.size) if int(reduction) == 1 else g


def _bce(ctx: Ctx, x: Var, t: Var, weight: Var | None = None, reduction: int = 1) -> Var:
    d = ctx.out_dtype
    loss = composites.binary_cross_entropy(x.cast(d), t.cast(d))
    if weight is not None:
        loss = loss * weight.cast(d)
    return _loss_reduce(loss, reduction)


def _bce_backward(ctx: Ctx, grad: Var, x: Var, t: Var, weight: Var | None = None,
                  reduction: int = 1) -> Var:
    d = ctx.out_dtype
    x, t = x.cast(d), t.cast(d)
    # PyTorch's formula, with its 1e-12 floor on x(1-x).
    g = _var(grad, d) * (x - t) / ((1.0 - x) * x).maximum(1e-12)
    if weight is not None:
        g = g * weight.cast(d)
    return g / float(x.v.size) if int(reduction) == 1 else g


def _bce_logits(ctx: Ctx, x: Var, t: Var, weight: Var | None = None,
                pos_weight: Var | None = None, reduction: int = 1) -> Var:
    d = ctx.out_dtype
    x, t = x.cast(d), t.cast(d)
    softplus_neg = ((-abs(x)).exp() + 1.0).log() + (-x).maximum(0.0)  # log(1 + e^-x)
    if pos_weight is not None:
        loss = (1.0 - t) * x + (1.0 + (pos_weight.cast(d) - 1.0) * t) * softplus_neg
    else:
        loss = (1.0 - t) * x + softplus_neg
    if weight is not None:
        loss = loss * weight.cast(d)
    return _loss_reduce(loss, reduction)


def _nll_parts(ctx: Ctx, x: Var, target: Var, weight: Var | None,
               ignore_index: int) -> tuple[Var, Var, tuple[int, int]]:
    """(one-hot mask, effective per-row weight, (rows, classes)) of a class-index target."""
    d = x.dtype
    if x.ndim not in (1, 2):
        raise Unsupported(f"nll_loss over {x.ndim}-D input (only 1-D or 2-D)")
    n, c = (1, x.shape[0]) if x.ndim == 1 else x.shape
    ctx.check_index(target, c, int(ignore_index))
    tgt = target.reshape(n, 1)
    onehot = ctx.iota(c, target.dtype).reshape(1, c).eq(tgt)  # (n, c) bool
    valid = _not(tgt.eq(float(ignore_index)))  # (n, 1)
    if weight is not None:
        w_row = onehot.where(weight.cast(d).reshape(1, c), 0.0).sum(1, keepdims=True)
    else:
        w_row = Var(const(1.0, d, (n, 1)))
    w_eff = valid.where(w_row, 0.0)  # (n, 1)
    return onehot, w_eff, (n, c)


def _nll_loss_forward(ctx: Ctx, x: Var, target: Var, weight: Var | None, reduction: int,
                      ignore_index: int) -> tuple[Var, Var]:
    d = ctx.out_dtype
    x = x.cast(d)
    onehot, w_eff, (n, c) = _nll_parts(ctx, x.reshape(-1, x.shape[-1]) if x.ndim else x,
                                       target, weight, ignore_index)
    x2 = x.reshape(n, c)
    picked = onehot.where(x2, 0.0).sum(1, keepdims=True)  # (n, 1)
    per_row = -(picked * w_eff)
    total = w_eff.sum()
    red = int(reduction)
    if red == 0:
        out = per_row.reshape(ctx.out[0].shape)
    elif red == 2:
        out = per_row.sum()
    else:
        out = per_row.sum() / total
    tw = total.reshape(ctx.out[1].shape) if ctx.out[1].numel == 1 else \
        Var(const(0.0, d, ctx.out[1].shape))
    return out, tw


def _nll_loss_backward(ctx: Ctx, grad: Var, x: Var, target: Var, weight: Var | None,
                       reduction: int, ignore_index: int, total_weight: Var) -> Var:
    d = ctx.out_dtype
    x = x.cast(d)
    onehot, w_eff, (n, c) = _nll_parts(ctx, x, target, weight, ignore_index)
    g = _var(grad, d)
    red = int(reduction)
    if red == 0 and g.ndim > 0:
        g = g.reshape(n, 1)
    elif red == 1:
        g = g / total_weight.cast(d)
    # d loss / d x[i, c] = -g_i * w[target_i] where c == target_i (and the row counts).
    gi = onehot.where(-(g * w_eff), 0.0)
    return gi.reshape(ctx.out_shape)


# One row per ATen op (overload packet): the op -> a function over Vars.
ATEN_TABLE: dict[Any, Callable[..., Any]] = {
    aten.add: _binary(lambda x, y: x + y),
    aten.sub: _binary(lambda x, y: x - y),
    aten.rsub: _rsub,
    aten.mul: _binary(lambda x, y: x * y),
    aten.div: _div,
    aten.pow: _binary(lambda x, y: x ** y),
    aten.maximum: _binary(lambda x, y: x.maximum(y)),
    aten.minimum: _binary(lambda x, y: x.minimum(y)),
    aten.neg: _unary("__neg__"),
    aten.abs: _unary("__abs__"),
    aten.exp: _unary("exp"),
    aten.log: _unary("log"),
    aten.tanh: _unary("tanh"),
    aten.sigmoid: _unary("sigmoid"),
    aten.sqrt: _unary("sqrt"),
    aten.rsqrt: _unary("rsqrt"),
    aten.reciprocal: _unary("recip"),
    aten.erf: _unary("erf"),
    aten.sin: _unary("sin"),
    aten.cos: _unary("cos"),
    aten.sign: _sign,
    aten.relu: lambda ctx, x: composites.relu(x.cast(ctx.out_dtype)),
    aten.gelu: _gelu,
    aten.gelu_backward: _gelu_backward,
    aten.threshold_backward: _threshold_backward,
    aten.tanh_backward: lambda ctx, g, y: _var(g, ctx.out_dtype) * (1.0 - y * y),
    aten.sigmoid_backward: lambda ctx, g, y: _var(g, ctx.out_dtype) * (y * (1.0 - y)),
    aten.clamp: _clamp,
    aten.clamp_min: lambda ctx, x, lo: _clamp(ctx, x, lo, None),
    aten.clamp_max: lambda ctx, x, hi: _clamp(ctx, x, None, hi),
    aten.where: _where,
    aten.gt: lambda ctx, a, b: _cmp("gt", a, b),
    aten.lt: lambda ctx, a, b: _cmp("lt", a, b),
    aten.ge: lambda ctx, a, b: _cmp("ge", a, b),
    aten.le: lambda ctx, a, b: _cmp("le", a, b),
    aten.eq: lambda ctx, a, b: _cmp("eq", a, b),
    aten.ne: lambda ctx, a, b: _cmp("ne", a, b),
    aten.logical_and: _logical("and"),
    aten.logical_or: _logical("or"),
    aten.logical_not: _logical("not"),
    aten.bitwise_and: _logical("and"),
    aten.bitwise_or: _logical("or"),
    aten.bitwise_not: _logical("not"),
    aten.sum: _reduce_as("sum"),
    aten.mean: _reduce_as("mean"),
    aten.amax: _reduce_as("max"),
    aten.amin: _reduce_as("min"),
    aten.var: _var_correction,
    aten.var_mean: _var_mean_correction,
    aten._softmax: _softmax,
    aten._log_softmax: _log_softmax,
    aten._softmax_backward_data: _softmax_backward,
    aten._log_softmax_backward_data: _log_softmax_backward,
    aten.native_layer_norm: _layer_norm,
    aten.native_layer_norm_backward: _layer_norm_backward,
    aten.mm: _mm,
    aten.addmm: _addmm,
    aten.bmm: _bmm,
    aten.matmul: _matmul,
    aten.t: _t,
    aten.transpose: _transpose,
    aten.permute: _permute,
    aten.view: _reshape_to_out,
    aten.reshape: _reshape_to_out,
    aten._unsafe_view: _reshape_to_out,
    aten.unsqueeze: _reshape_to_out,
    aten.squeeze: _reshape_to_out,
    aten.expand: _expand,
    aten.slice: _slice,
    aten.narrow: _narrow,
    aten.split: _split,
    aten.split_with_sizes: _split,
    aten.chunk: _split,
    aten.cat: _cat,
    aten.slice_backward: _slice_backward,
    aten.detach: _identity,
    aten.clone: _identity,
    aten.alias: _identity,
    aten.lift_fresh_copy: _identity,
    aten.copy: _copy,
    aten._to_copy: _to_copy,
    torch.ops.prims.convert_element_type: _convert_element_type,
    aten.full: _fill_from(1),
    aten.full_like: _fill_from(1),
    aten.fill: _fill_from(1),  # the functional fill.Scalar (a tensor value: Unsupported)
    # Contents unspecified: zeros are as valid as any (AOT's joint export writes
    # full_like as empty_like + fill).
    aten.empty_like: _const_fill(0.0),
    aten.new_full: _fill_from(2),
    aten.scalar_tensor: _fill_from(0),
    aten.zeros: _const_fill(0.0),
    aten.zeros_like: _const_fill(0.0),
    aten.new_zeros: _const_fill(0.0),
    aten.ones: _const_fill(1.0),
    aten.ones_like: _const_fill(1.0),
    aten.new_ones: _const_fill(1.0),
    aten.mse_loss: _mse_loss,
    aten.mse_loss_backward: _mse_loss_backward,
    aten.binary_cross_entropy: _bce,
    aten.binary_cross_entropy_backward: _bce_backward,
    aten.binary_cross_entropy_with_logits: _bce_logits,
    aten.nll_loss_forward: _nll_loss_forward,
    aten.nll_loss_backward: _nll_loss_backward,
}
# Rows for ops that exist only once another module registers them (Inductor's
# prims), looked up by name.
NAMED_ROWS: dict[str, Callable[..., Any]] = {
    "prims.fma": _fma,
}
# Ops that take integer class indices (loaded as f64: exact below 2**53).
# Ops that only re-index: a region of nothing but these is left to PyTorch (a view
# there is free, a kernel would copy).
VIEW_OPS = frozenset({aten.t, aten.transpose, aten.permute, aten.view, aten.reshape,
                      aten._unsafe_view, aten.unsqueeze, aten.squeeze, aten.expand,
                      aten.slice, aten.narrow, aten.split, aten.split_with_sizes, aten.chunk,
                      aten.detach, aten.alias, aten.clone, aten.lift_fresh_copy})
# Ops eager PyTorch runs without launching work (views and aliases).
FREE_IN_EAGER = VIEW_OPS - {aten.clone, aten.lift_fresh_copy}
# Ops whose decompositions (into ops above) AOT autograd should apply.
DECOMPOSE = ("silu", "silu_backward", "hardtanh", "hardtanh_backward", "leaky_relu",
             "leaky_relu_backward", "elu", "elu_backward", "softplus", "softplus_backward",
             "hardsigmoid", "hardswish", "mish", "logsumexp", "addcmul", "addcdiv", "lerp",
             "square", "std", "std_mean", "norm", "frobenius_norm", "linalg_vector_norm",
             "log_sigmoid_forward", "log_sigmoid_backward", "huber_loss",
             "huber_loss_backward", "smooth_l1_loss", "smooth_l1_loss_backward", "soft_margin_loss",
             "sgn", "expand_as", "masked_fill", "baddbmm", "addmv", "native_dropout_backward")


def supported_ops() -> list[str]:
    """Names of the ATen ops the backend translates (the rows of ATEN_TABLE and
    NAMED_ROWS)."""
    return sorted({*(str(k) for k in ATEN_TABLE), *NAMED_ROWS})


def _decompositions() -> dict[Any, Callable[..., Any]]:
    from torch._decomp import get_decompositions

    ops = [getattr(aten, n) for n in DECOMPOSE if hasattr(aten, n)]
    return get_decompositions(ops)


def _op_name(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return str(target.overloadpacket) if target.overloadpacket else str(target)
    return getattr(target, "__name__", str(target))


def _table_row(target: Any) -> Callable[..., Any] | None:
    if isinstance(target, torch._ops.OpOverload):
        return (ATEN_TABLE.get(target) or ATEN_TABLE.get(target.overloadpacket)
                or NAMED_ROWS.get(str(target.overloadpacket)))
    return None
