"""Element-wise ATen ops: arithmetic, comparisons, logic, activations and their
backward formulas, casts and copies; rounding and remainders (ATen's own formulas over
the ISA's FLOOR/TRUNC/RINT/FMOD, so they agree bit for bit), the libm functions, the
IEEE class tests (comparisons: NaN is the value unequal to itself), and the tril/triu
masks (IOTA comparisons).

Integers ride in f64 inside a program, so a conversion to an integer dtype truncates
explicitly (:func:`convert`).

One translator per ATen op, ``ROWS`` maps each op to it (see
:mod:`hologram_torch.lowering` for how a translator is written)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from hologram.isa import dtypes
from hologram.isa.builder import Var, elementwise, iota
from hologram.isa.opcodes import MATH_UNARY, Op
from hologram.ops import composites

from ..fx_info import INT_DTYPES
from .context import Ctx, Unsupported, and_, as_var, isa_dtype, not_, or_, wider

aten = torch.ops.aten


def _logical(kind: str) -> Callable[..., Var]:
    """logical_and/or/not: over the operands' truth (torch gives bool whatever they are)."""

    def tr(ctx: Ctx, a: Any, b: Any = None) -> Var:
        if ctx.out.dtype is not torch.bool:
            raise Unsupported(f"bitwise {kind} on {ctx.out.dtype} (only bool is translated)")
        p = as_var(a, dtypes.boolean)
        if kind == "not":
            return not_(p)
        q = as_var(b, dtypes.boolean)
        return or_(p, q) if kind == "or" else and_(p, q)

    return tr


#: The dtypes bitwise ops and shifts compute in. Integer tensors ride in f64 between
#: ops (exact to 2**53); a bitwise op casts them to their own width first, so ~, the
#: shifts' wrap-around and their saturation are int32's or int64's. Narrower integers
#: (whose shifts wrap at 8 or 16 bits) are left to PyTorch, but for the ops whose bits
#: do not depend on the width (:data:`_NARROW_OPS`).
_BITWISE_DTYPES: dict[torch.dtype, dtypes.DType] = {
    torch.int32: dtypes.i32, torch.int64: dtypes.i64, torch.bool: dtypes.boolean}
#: Narrower integers' bitwise ops that computed in int32 give the narrow result: and,
#: or and xor of sign- (or zero-) extended values keep the narrow value's range, as
#: does ~ of a signed one (PyTorch's grid_sample decomposition reflects coordinates
#: with an int8 ``& 1``); ~ of uint8 (255 - x, not -x - 1) and the shifts are not.
_NARROW_OPS: dict[torch.dtype, frozenset[Op]] = {
    torch.int8: frozenset({Op.AND, Op.OR, Op.XOR, Op.NOT}),
    torch.int16: frozenset({Op.AND, Op.OR, Op.XOR, Op.NOT}),
    torch.uint8: frozenset({Op.AND, Op.OR, Op.XOR})}


def _bitwise(op: Op) -> Callable[..., Var]:
    """An ATen bitwise op or shift: one ISA opcode in the tensor's integer dtype (see
    _BITWISE_DTYPES). On bool the and/or/xor/not opcodes are the logical ops; shift
    counts outside [0, bits) saturate as ATen's CPU kernels do (0 for <<, the sign for
    >>)."""

    def tr(ctx: Ctx, a: Any, b: Any = None) -> Var:
        info = ctx.first_out
        d = _BITWISE_DTYPES.get(info.dtype)
        if d is None and op in _NARROW_OPS.get(info.dtype, ()):
            d = dtypes.i32
        if d is None:
            raise Unsupported(f"bitwise {op} on {info.dtype} (int32, int64 and bool are "
                              "translated; int8, int16 and uint8 for and, or, xor and "
                              "the signed ones' not)")
        x = as_var(a, d)
        r = unary_op(op, x) if b is None else binary_op(op, x, as_var(b, d))
        return r.cast(ctx.out_dtype)

    return tr


def _sign(ctx: Ctx, x: Var) -> Var:
    x = x.cast(ctx.out_dtype)
    # x * 0 keeps NaN as NaN (and 0 as 0) where neither comparison holds.
    return (0.0 < x).where(1.0, (x < 0.0).where(-1.0, x * 0.0))


def compare(kind: str, a: Any, b: Any) -> Var:
    d = wider(a, b)
    x, y = as_var(a, d), as_var(b, d)
    # Written with < and == only (the ISA's compares), keeping IEEE NaN behaviour:
    # every comparison with NaN is false except !=.
    forms: dict[str, Callable[[], Var]] = {
        "lt": lambda: x < y,
        "gt": lambda: y < x,
        "eq": lambda: x.eq(y),
        "ne": lambda: not_(x.eq(y)),
        "le": lambda: or_(x < y, x.eq(y)),
        "ge": lambda: or_(y < x, x.eq(y)),
    }
    return forms[kind]()


#: Arithmetic on bool tensors is logic (PyTorch: True + True is True, x * y is x and y).
_BOOL_FORMS: dict[str, Callable[[Var, Var], Var]] = {"add": or_, "mul": and_}


def _binary(fn: Callable[[Var, Var], Var], name: str = "") -> Callable[..., Var]:
    def tr(ctx: Ctx, a: Any, b: Any, *, alpha: Any = 1) -> Var:
        d = ctx.out_dtype
        x, y = as_var(a, d), as_var(b, d)
        if d is dtypes.boolean and name in _BOOL_FORMS and alpha in (1, True):
            return _BOOL_FORMS[name](x, y)
        if alpha != 1:
            y = y * float(alpha)
        return fn(x, y)

    return tr


#: ATen's CPU kernels for a float tensor to a scalar power special-case these exponents
#: (PowKernel.cpp): computing them the same way gives eager's bits, and GPT-2's GELU
#: (``pow(x, 3.0)``) multiplies instead of calling a vector pow per element.
_POW_FORMS: dict[float, Callable[[Var], Var]] = {
    2.0: lambda x: x * x,
    3.0: lambda x: x * x * x,
    -2.0: lambda x: 1.0 / (x * x),
    -0.5: lambda x: x.rsqrt(),
    -1.0: lambda x: x.recip(),
}


def _pow(ctx: Ctx, a: Any, b: Any) -> Var:
    d = ctx.out_dtype
    form = _POW_FORMS.get(float(b)) if isinstance(b, (int, float)) and isinstance(a, Var) \
        and d.is_float else None
    if form is not None:
        return form(as_var(a, d))
    return as_var(a, d) ** as_var(b, d)


def _rsub(ctx: Ctx, a: Any, b: Any, *, alpha: Any = 1) -> Var:
    d = ctx.out_dtype
    x, y = as_var(a, d), as_var(b, d)
    return y - (x * float(alpha) if alpha != 1 else x)


def unary_op(op: Op, x: Var) -> Var:
    return Var(elementwise(op, x.v))


def binary_op(op: Op, x: Var, y: Var) -> Var:
    return Var(elementwise(op, x.v, y.v))


def fmod(x: Var, y: Var) -> Var:
    return binary_op(Op.FMOD, x, y)


def remainder(x: Var, y: Var) -> Var:
    """Python's ``%`` (the divisor's sign), as ATen computes it: C fmod, then ``+ y`` where
    the remainder is nonzero and its sign differs from ``y``'s."""
    mod = fmod(x, y)
    fix = and_(not_(mod.eq(0.0)), not_((y < 0.0).eq(mod < 0.0)))
    return fix.where(mod + y, mod)


def floor_div(x: Var, y: Var) -> Var:
    """``x // y`` as ATen's ``div_floor_floating``: ``(x - fmod(x, y)) / y`` corrected by
    one where the remainder's sign differs from ``y``'s, floored and rounded to the
    nearer integer; a zero quotient keeps the sign of ``x / y``; ``y == 0`` gives
    ``x / y``."""
    mod = fmod(x, y)
    div = (x - mod) / y
    div = and_(not_(mod.eq(0.0)), not_((y < 0.0).eq(mod < 0.0))).where(div - 1.0, div)
    fl = unary_op(Op.FLOOR, div)
    fl = ((div - fl) > 0.5).where(fl + 1.0, fl)
    q = x / y
    # copysign(0, x / y): 1 / -0 is -inf
    zero = (q.recip() < 0.0).where(as_var(-0.0, q.dtype), as_var(0.0, q.dtype))
    return y.eq(0.0).where(q, div.eq(0.0).where(zero, fl))


#: div's rounding modes (ATen: no mode divides; "trunc" truncates the quotient).
_DIV_MODES: dict[str | None, Callable[[Var, Var], Var]] = {
    None: lambda x, y: x / y,
    "trunc": lambda x, y: unary_op(Op.TRUNC, x / y),
    "floor": floor_div,
}


def _div(ctx: Ctx, a: Any, b: Any, *, rounding_mode: str | None = None) -> Var:
    if rounding_mode not in _DIV_MODES:
        raise Unsupported(f"div rounding_mode={rounding_mode!r}")
    d = ctx.out_dtype
    return _DIV_MODES[rounding_mode](as_var(a, d), as_var(b, d))


def _signbit(ctx: Ctx, x: Var) -> Var:
    """The sign bit (set for -0.0): copysign(1, x) < 0. False for every NaN: a NaN's sign
    is no ISA value (see Op.COPYSIGN), where eager reads it (-nan gives True)."""
    x = as_float(x)
    return binary_op(Op.COPYSIGN, as_var(1.0, x.dtype).expand(x.shape), x) < 0.0


def _nan_ignoring(x: Var, y: Var, method: str) -> Var:
    """fmax/fmin: the other operand where one is NaN (NaN only where both are)."""
    return isnan(x).where(y, isnan(y).where(x, getattr(x, method)(y)))


def _binary_of(fn: Callable[[Var, Var], Var]) -> Callable[..., Var]:
    """A binary ATen op computed by ``fn`` on both operands in the result's dtype."""

    def tr(ctx: Ctx, a: Any, b: Any) -> Var:
        d = ctx.out_dtype
        return fn(as_var(a, d), as_var(b, d))

    return tr


def _binary_opcode(op: Op) -> Callable[..., Var]:
    """A binary ATen op that is one ISA binary opcode."""
    return _binary_of(lambda x, y: binary_op(op, x, y))


#: Rounding of an integer is the integer itself.
_INTEGRAL = frozenset({Op.FLOOR, Op.CEIL, Op.TRUNC, Op.RINT})


def _unary_opcode(op: Op) -> Callable[..., Var]:
    """An ATen op that is one ISA unary opcode (integers: floor/ceil/trunc/round of an
    integer is itself)."""

    def tr(ctx: Ctx, x: Var) -> Var:
        d = ctx.out_dtype
        if op in _INTEGRAL and ctx.out.dtype in INT_DTYPES:
            return x.cast(d)
        return unary_op(op, x.cast(d))

    return tr


def _round(ctx: Ctx, x: Var, *, decimals: int = 0) -> Var:
    """torch.round: half to even; with ``decimals``, ATen's ``rint(x * 10^d) / 10^d``
    (``rint(x / 10^-d) * 10^-d`` for negative d), in the tensor's dtype."""
    d = ctx.out_dtype
    x = x.cast(d)
    if ctx.out.dtype in INT_DTYPES:
        return x
    if decimals == 0:
        return unary_op(Op.RINT, x)
    scale = float(10.0 ** abs(decimals))
    if decimals > 0:
        return unary_op(Op.RINT, x * scale) / scale
    return unary_op(Op.RINT, x / scale) * scale


def _frac(ctx: Ctx, x: Var) -> Var:
    x = x.cast(ctx.out_dtype)
    return x - unary_op(Op.TRUNC, x)


def _polygamma(ctx: Ctx, n: int, x: Var) -> Var:
    """The n-th derivative of digamma: DIGAMMA for n = 0, else ATen's formula
    ``(-1)^(n+1) n! zeta(n + 1, x)`` (n! exact here, where ATen rounds exp(lgamma))."""
    x = x.cast(ctx.out_dtype)
    if not isinstance(n, int) or n < 0:
        raise Unsupported(f"polygamma of order {n!r}")
    if n == 0:
        return unary_op(Op.DIGAMMA, x)
    order = as_var(float(n + 1), x.dtype).expand(x.shape)
    scale = float(math.factorial(n)) * (1.0 if n % 2 else -1.0)
    return binary_op(Op.ZETA, order, x) * scale


def _unary(method: str) -> Callable[..., Var]:
    def tr(ctx: Ctx, x: Var) -> Var:
        return getattr(x.cast(ctx.out_dtype), method)()

    return tr


def _where(ctx: Ctx, cond: Any, a: Any, b: Any) -> Var:
    d = ctx.out_dtype
    c = as_var(cond, dtypes.boolean)
    return c.where(as_var(a, d), as_var(b, d))


def _clamp(ctx: Ctx, x: Var, min: Any = None, max: Any = None) -> Var:  # noqa: A002
    d = ctx.out_dtype
    y = x.cast(d)
    if min is not None:
        y = y.maximum(as_var(min, d))
    if max is not None:
        y = y.minimum(as_var(max, d))
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
    return compare("le", x, threshold).where(0.0, as_var(grad, ctx.out_dtype))


def _copy(ctx: Ctx, x: Any, src: Any, non_blocking: bool = False) -> Var:
    """The functional ``copy``: ``src``'s values in ``x``'s dtype and shape (what
    functionalization makes of an in-place update of a temporary, e.g. ``addcmul_``)."""
    value = convert(src, ctx.out.dtype) if isinstance(src, Var) else as_var(src, ctx.out_dtype)
    return value.expand(ctx.out_shape)


def _fma(ctx: Ctx, a: Any, b: Any, c: Any) -> Var:
    """Inductor's ``prims.fma`` (from its ``addcmul`` decomposition): ``a * b + c``
    rounded once, as eager's vectorised ``addcmul`` computes it."""
    d = ctx.out_dtype
    x, y, z = (as_var(v, d) for v in (a, b, c))
    return Var(elementwise(Op.FMA, x.v, y.v, z.v))


def convert(x: Var, dst: torch.dtype) -> Var:
    """``x`` converted to torch dtype ``dst`` as PyTorch converts: a float becomes an
    integer by truncation toward zero. Integers ride in f64 inside a program, so the
    cast alone would keep the fraction (an index ``2.7`` would stay ``2.7``); TRUNC of a
    value that is already whole is the value itself."""
    if dst in INT_DTYPES and x.dtype.is_float:
        x = unary_op(Op.TRUNC, x)
    return x.cast(isa_dtype(dst))


def _to_copy(ctx: Ctx, x: Var, *args: Any, dtype: Any = None, device: Any = None,
             **kwargs: Any) -> Var:
    if device is not None and torch.device(device).type != "cpu":
        raise Unsupported(f"_to_copy to device {device} leaves host memory")
    return convert(x, ctx.out.dtype)


def _convert_element_type(ctx: Ctx, x: Var, dtype: Any) -> Var:
    return convert(x, ctx.out.dtype)


def as_float(x: Var) -> Var:
    """``x`` as a float (bool and integer tensors compare and test as f32/f64)."""
    return x if x.dtype.is_float else x.cast(dtypes.f32)


def isnan(x: Var) -> Var:
    """NaN is the one value not equal to itself (integers and bools never are)."""
    return not_(x.eq(x)) if x.dtype.is_float else as_var(False, dtypes.boolean).expand(x.shape)


#: The IEEE class tests as comparisons, exact for every value (NaN compares false).
_CLASS_TESTS: dict[str, Callable[[Var], Var]] = {
    "isnan": isnan,
    "isinf": lambda x: abs(as_float(x)).eq(math.inf),
    "isposinf": lambda x: as_float(x).eq(math.inf),
    "isneginf": lambda x: as_float(x).eq(-math.inf),
    "isfinite": lambda x: abs(as_float(x)) < math.inf,
}


def _class_test(kind: str) -> Callable[..., Var]:
    def tr(ctx: Ctx, x: Var) -> Var:
        return _CLASS_TESTS[kind](x)

    return tr


def _logical_xor(ctx: Ctx, a: Any, b: Any) -> Var:
    p, q = as_var(a, dtypes.boolean), as_var(b, dtypes.boolean)
    return Var(elementwise(Op.SEL, p.v, not_(q).v, q.v))


def _nan_to_num(ctx: Ctx, x: Var, nan: float | None = 0.0, posinf: float | None = None,
                neginf: float | None = None) -> Var:
    d = ctx.out_dtype
    x = x.cast(d)
    if not d.is_float:
        return x
    info = torch.finfo(ctx.out.dtype)
    hi = info.max if posinf is None else posinf
    lo = info.min if neginf is None else neginf
    y = x.eq(math.inf).where(float(hi), x.eq(-math.inf).where(float(lo), x))
    return isnan(x).where(0.0 if nan is None else float(nan), y)


def _heaviside(ctx: Ctx, x: Any, values: Any) -> Var:
    """ATen's kernel: ``x == 0 ? values : x > 0`` (so NaN gives 0)."""
    d = ctx.out_dtype
    x, v = as_var(x, d), as_var(values, d)
    return x.eq(0.0).where(v, (0.0 < x).cast(d))


def _triangle(lower: bool) -> Callable[..., Var]:
    """tril/triu: ``x`` where column - row <= diagonal (tril) or >= diagonal (triu) over
    the last two dims, else 0. The coordinates are IOTA: no mask in memory."""

    def tr(ctx: Ctx, x: Var, diagonal: int = 0) -> Var:
        x = x.cast(ctx.out_dtype)
        if x.ndim < 2:
            raise Unsupported(f"{'tril' if lower else 'triu'} of a {x.ndim}-d tensor")
        rows, cols = x.shape[-2:]
        shape = (rows, cols)
        offset = Var(iota(shape, 1, dtypes.f64)) - Var(iota(shape, 0, dtypes.f64))
        keep = compare("le" if lower else "ge", offset, float(diagonal))
        return keep.where(x, 0.0)

    return tr


# One row per ATen op (overload packet).
ROWS: dict[Any, Callable[..., Any]] = {
    aten.add: _binary(lambda x, y: x + y, "add"),
    aten.sub: _binary(lambda x, y: x - y),
    aten.rsub: _rsub,
    aten.mul: _binary(lambda x, y: x * y, "mul"),
    aten.div: _div,
    aten.pow: _pow,
    aten.maximum: _binary(lambda x, y: x.maximum(y)),
    aten.minimum: _binary(lambda x, y: x.minimum(y)),
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
    aten.gelu: _gelu,
    aten.gelu_backward: _gelu_backward,
    aten.threshold_backward: _threshold_backward,
    aten.clamp: _clamp,
    aten.clamp_min: lambda ctx, x, lo: _clamp(ctx, x, lo, None),
    aten.clamp_max: lambda ctx, x, hi: _clamp(ctx, x, None, hi),
    aten.where: _where,
    aten.logical_and: _logical("and"),
    aten.logical_or: _logical("or"),
    aten.logical_not: _logical("not"),
    **{getattr(aten, name): _bitwise(op) for name, op in (
        ("bitwise_and", Op.AND), ("bitwise_or", Op.OR), ("bitwise_xor", Op.XOR),
        ("bitwise_not", Op.NOT), ("bitwise_left_shift", Op.SHL),
        ("bitwise_right_shift", Op.SHR), ("__and__", Op.AND), ("__or__", Op.OR),
        ("__xor__", Op.XOR), ("__lshift__", Op.SHL), ("__rshift__", Op.SHR))},
    aten.copy: _copy,
    aten._to_copy: _to_copy,
    torch.ops.prims.convert_element_type: _convert_element_type,
    aten.neg: _unary("__neg__"),
    aten.abs: _unary("__abs__"),
    aten.relu: lambda ctx, x: composites.relu(x.cast(ctx.out_dtype)),
    aten.tanh_backward: lambda ctx, g, y: as_var(g, ctx.out_dtype) * (1.0 - y * y),
    aten.sigmoid_backward: lambda ctx, g, y: as_var(g, ctx.out_dtype) * (y * (1.0 - y)),
    aten.gt: lambda ctx, a, b: compare("gt", a, b),
    aten.lt: lambda ctx, a, b: compare("lt", a, b),
    aten.ge: lambda ctx, a, b: compare("ge", a, b),
    aten.le: lambda ctx, a, b: compare("le", a, b),
    aten.eq: lambda ctx, a, b: compare("eq", a, b),
    aten.ne: lambda ctx, a, b: compare("ne", a, b),
    **{getattr(aten, kind): _class_test(kind) for kind in _CLASS_TESTS},
    aten.logical_xor: _logical_xor,
    aten.nan_to_num: _nan_to_num,
    aten.heaviside: _heaviside,
    aten.floor: _unary_opcode(Op.FLOOR),
    aten.ceil: _unary_opcode(Op.CEIL),
    aten.trunc: _unary_opcode(Op.TRUNC),
    aten.fix: _unary_opcode(Op.TRUNC),
    aten.round: _round,
    aten.frac: _frac,
    aten.log1p: _unary_opcode(Op.LOG1P),
    aten.expm1: _unary_opcode(Op.EXPM1),
    **{getattr(aten, op.value): _unary_opcode(op) for op in MATH_UNARY},  # tan ... erfc
    aten.lgamma: _unary_opcode(Op.LGAMMA),
    aten.digamma: _unary_opcode(Op.DIGAMMA),
    aten.special_psi: _unary_opcode(Op.DIGAMMA),
    aten.polygamma: _polygamma,
    aten.special_zeta: _binary_opcode(Op.ZETA),
    aten.atan2: _binary_opcode(Op.ATAN2),
    aten.arctan2: _binary_opcode(Op.ATAN2),
    aten.hypot: _binary_opcode(Op.HYPOT),
    aten.copysign: _binary_opcode(Op.COPYSIGN),
    aten.signbit: _signbit,
    aten.fmax: _binary_of(lambda x, y: _nan_ignoring(x, y, "maximum")),
    aten.fmin: _binary_of(lambda x, y: _nan_ignoring(x, y, "minimum")),
    aten.fmod: _binary_of(fmod),
    aten.remainder: _binary_of(remainder),
    aten.floor_divide: _binary_of(floor_div),
    aten.tril: _triangle(True),
    aten.triu: _triangle(False),
}

# Rows for ops that exist only once another module registers them (Inductor's prims).
NAMED_ROWS: dict[str, Callable[..., Any]] = {
    "prims.fma": _fma,
}
