"""NumPy's ufuncs on traced values: one table row per ufunc.

``apply`` lets NumPy pick the loop (``ufunc.resolve_dtypes``: the input and output
dtypes NumPy itself would compute in), casts the operands to it and calls the row's
builder with ISA values of those dtypes. Rows are written with the ISA's own
instructions where one exists and otherwise as NumPy defines the function (its C
source's formula: ``logaddexp``, ``floor_divide``, ``remainder``), so NaN, inf and
signed zeros come out as NumPy's do.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..isa import builder as B
from ..isa import dtypes as D
from ..isa.opcodes import Op
from ..isa.value import Value
from . import logic as L
from .dtypes import of as dtype_of
from .dtypes import to_isa, to_numpy
from .errors import unsupported
from .lift import value

Impl = Callable[..., Any]


def _unary(op: Op) -> Impl:
    """An ISA unary op; on an integer loop (NumPy 2's floor/ceil/trunc of ints) the
    value itself."""
    def f(x: Value) -> Value:
        return B.unary(op, x) if x.dtype.is_float or op in (Op.NEG, Op.ABS) else x
    return f


def _binary(op: Op, on_bool: Callable[[Value, Value], Value] | None = None) -> Impl:
    def f(a: Value, b: Value) -> Value:
        if a.dtype is D.boolean and on_bool is not None:
            return on_bool(a, b)
        return L.ew(op, a, b)
    return f


def _abs(x: Value) -> Value:
    return x if x.dtype is D.boolean else L.ew(Op.ABS, x)


def _sign(x: Value) -> Value:
    one = L.k(1, x)
    if x.dtype.kind == "i" and not x.dtype.signed:  # no negative values: 0 or 1
        return L.where(L.lt(L.k(0, x), x), one, x)
    # NumPy's sign of -0.0 is +0.0 (x + 0 gives it; NaN stays NaN)
    rest = L.ew(Op.ADD, x, L.k(0, x)) if x.dtype.is_float else x
    return L.where(L.lt(L.k(0, x), x), one, L.where(L.lt(x, L.k(0, x)), L.k(-1, x), rest))


def _cbrt(x: Value) -> Value:
    r = L.ew(Op.POW, L.ew(Op.ABS, x), L.k(1.0 / 3.0, x))
    r = L.ew(Op.MUL, r, L.where(L.lt(x, L.k(0, x)), L.k(-1.0, x), L.k(1.0, x)))
    return L.where(L.eq(x, L.k(0, x)), x, r)  # keeps -0.0


def _reciprocal(x: Value) -> Value:
    if not x.dtype.is_float:  # C's 1 / x: 1 and -1 keep, 0 gives the minimum (NumPy's)
        lo = int(np.iinfo(x.dtype.np_dtype).min)
        unit = L.eq(L.ew(Op.ABS, x), L.k(1, x))
        return L.where(L.eq(x, L.k(0, x)), L.k(lo, x), L.where(unit, x, L.k(0, x)))
    return L.ew(Op.DIV, L.k(1.0, x), x)


def _signbit(x: Value) -> Value:
    if not x.dtype.is_float:
        return L.lt(x, L.k(0, x))
    return L.lt(L.ew(Op.COPYSIGN, L.k(1.0, x), x), L.k(0.0, x))


def _invert(x: Value) -> Value:
    return B.unary(Op.NOT, x)  # ~x on integers, logical not on bool (NumPy's invert)


def _logical(f: Callable[[Value, Value], Value]) -> Impl:
    return lambda a, b: f(L.truth(a), L.truth(b))


def _float_via_f64(f: Callable[[Value, Value], Value]) -> Impl:
    """An integer loop computed in float64 (exact for integers below 2**53) and cast
    back; a zero divisor gives 0, as NumPy's integer loops do."""
    def g(a: Value, b: Value) -> Value:
        if a.dtype.is_float:
            return f(a, b)
        r = B.cast(f(B.cast(a, D.f64), B.cast(b, D.f64)), a.dtype)
        return L.where(L.eq(b, L.k(0, b)), L.k(0, a), r)
    return g


def _fmod_float(a: Value, b: Value) -> Value:
    return L.ew(Op.FMOD, a, b)


def _divmod_float(a: Value, b: Value) -> tuple[Value, Value]:
    """NumPy's npy_divmod: floor division and Python's remainder from C's fmod."""
    mod = L.ew(Op.FMOD, a, b)
    zero = L.k(0.0, a)
    div = L.ew(Op.DIV, L.ew(Op.SUB, a, mod), b)
    fix = L.and_(L.ne(mod, zero), L.ne(L.lt(b, zero), L.lt(mod, zero)))
    mod = L.where(fix, L.ew(Op.ADD, mod, b), L.where(L.ne(mod, zero), mod,
                                                     L.ew(Op.COPYSIGN, zero, b)))
    div = L.where(fix, L.ew(Op.SUB, div, L.k(1.0, a)), div)
    floordiv = L.ew(Op.FLOOR, div)
    floordiv = L.where(L.lt(L.k(0.5, a), L.ew(Op.SUB, div, floordiv)),
                       L.ew(Op.ADD, floordiv, L.k(1.0, a)), floordiv)
    floordiv = L.where(L.ne(div, zero), floordiv,
                       L.ew(Op.COPYSIGN, zero, L.ew(Op.DIV, a, b)))
    plain = L.ew(Op.DIV, a, b)  # b == 0: NumPy gives a / b (inf or nan), mod nan
    bz = L.eq(b, zero)
    return L.where(bz, plain, floordiv), L.where(bz, L.ew(Op.FMOD, a, b), mod)


def _floor_divide(a: Value, b: Value) -> Value:
    return _divmod_float(a, b)[0]


def _remainder(a: Value, b: Value) -> Value:
    return _divmod_float(a, b)[1]


def _divmod(a: Value, b: Value) -> tuple[Value, Value]:
    return (_float_via_f64(_floor_divide)(a, b), _float_via_f64(_remainder)(a, b))


def _power(a: Value, b: Value) -> Value:
    if a.dtype.is_float:
        return L.ew(Op.POW, a, b)
    return _int_power(a, b)


def _const_scalar(v: Value) -> int | None:
    """The value of a CONST (a broadcast Python scalar), else None."""
    while v.op in (Op.EXPAND, Op.RESHAPE):
        v = v.srcs[0]
    return int(v.attr("value")) if v.op is Op.CONST else None


def _int_power(a: Value, b: Value) -> Value:
    """NumPy's integer power: repeated squaring in the dtype, so the result wraps as
    NumPy's does (a float pow rounded back would not). A constant exponent unrolls into
    its multiplications; an array exponent takes one conditional product per bit. A
    negative exponent (NumPy raises at run time) gives 1/a truncated: 1, -1 or 0."""
    one = L.k(1, a)
    c = _const_scalar(b)
    if c is not None and c >= 0:
        r, base = one, a
        while c:
            if c & 1:
                r = base if r is one else L.ew(Op.MUL, r, base)
            c >>= 1
            if c:
                base = L.ew(Op.MUL, base, base)
        return B.expand(r, B.broadcast_shape(a.shape, b.shape))
    d = a.dtype
    r, base = one, a
    for i in range(d.bits - 1 if d.signed else d.bits):
        bit = L.ne(L.ew(Op.AND, L.ew(Op.SHR, b, L.k(i, b)), L.k(1, b)), L.k(0, b))
        r = L.where(bit, L.ew(Op.MUL, r, base), r)
        base = L.ew(Op.MUL, base, base)
    if d.signed:
        odd = L.ne(L.ew(Op.AND, b, L.k(1, b)), L.k(0, b))
        neg = L.where(L.eq(a, one), one, L.where(L.eq(a, L.k(-1, a)),
                                                 L.where(odd, a, one), L.k(0, a)))
        r = L.where(L.lt(b, L.k(0, b)), neg, r)
    return r


def _fmax(op: Op) -> Impl:
    def f(a: Value, b: Value) -> Value:
        if not a.dtype.is_float:
            return _binary(op, L.or_ if op is Op.MAX else L.and_)(a, b)
        m = L.ew(op, a, b)
        return L.where(L.isnan(b), a, L.where(L.isnan(a), b, m))
    return f


def _logaddexp(base2: bool) -> Impl:
    def f(a: Value, b: Value) -> Value:
        same = L.ew(Op.ADD, a, L.k(1.0 if base2 else math.log(2.0), a))
        d = L.ew(Op.NEG, L.ew(Op.ABS, L.ew(Op.SUB, a, b)))
        if base2:
            tail = L.ew(Op.MUL, L.ew(Op.LOG1P, L.ew(Op.EXP2, d)), L.k(1.0 / math.log(2.0), a))
        else:
            tail = L.ew(Op.LOG1P, L.ew(Op.EXP, d))
        return L.where(L.eq(a, b), same, L.ew(Op.ADD, L.ew(Op.MAX, a, b), tail))
    return f


def _heaviside(x: Value, h0: Value) -> Value:
    zero = L.k(0, x)
    return L.where(L.lt(x, zero), zero, L.where(L.lt(zero, x), L.k(1, x),
                                                L.where(L.eq(x, zero), h0, x)))


def _ldexp(x: Value, e: Value) -> Value:
    return L.ew(Op.MUL, x, L.ew(Op.EXP2, B.cast(e, x.dtype)))


def _modf(x: Value) -> tuple[Value, Value]:
    t = L.ew(Op.TRUNC, x)
    frac = L.where(L.isinf(x), L.ew(Op.COPYSIGN, L.k(0.0, x), x), L.ew(Op.SUB, x, t))
    return frac, t


def _scaled(c: float) -> Impl:
    return lambda x: L.ew(Op.MUL, x, L.k(c, x))


def _identity(x: Value) -> Value:
    return x


def _compare(f: Callable[[Value, Value], Value]) -> Impl:
    return f


def _matmul(a: Value, b: Value) -> Value:
    from .linalg import matmul
    return matmul(a, b)


def _vecdot(a: Value, b: Value) -> Value:
    from .linalg import vecdot
    return vecdot(a, b)


def _add(a: Value, b: Value) -> Value:
    return L.or_(a, b) if a.dtype is D.boolean else L.ew(Op.ADD, a, b)


def _mul(a: Value, b: Value) -> Value:
    return L.and_(a, b) if a.dtype is D.boolean else L.ew(Op.MUL, a, b)


#: ufunc name -> builder over ISA values of the loop's input dtypes.
UFUNCS: dict[str, Impl] = {
    "negative": _unary(Op.NEG), "positive": _identity, "absolute": _abs, "fabs": _abs,
    "sign": _sign, "sqrt": _unary(Op.SQRT), "cbrt": _cbrt,
    "square": lambda x: L.ew(Op.MUL, x, x) if x.dtype is not D.boolean else x,
    "reciprocal": _reciprocal, "exp": _unary(Op.EXP), "exp2": _unary(Op.EXP2),
    "expm1": _unary(Op.EXPM1), "log": _unary(Op.LOG), "log2": _unary(Op.LOG2),
    "log10": _unary(Op.LOG10), "log1p": _unary(Op.LOG1P), "sin": _unary(Op.SIN),
    "cos": _unary(Op.COS), "tan": _unary(Op.TAN), "arcsin": _unary(Op.ASIN),
    "arccos": _unary(Op.ACOS), "arctan": _unary(Op.ATAN), "sinh": _unary(Op.SINH),
    "cosh": _unary(Op.COSH), "tanh": _unary(Op.TANH), "arcsinh": _unary(Op.ASINH),
    "arccosh": _unary(Op.ACOSH), "arctanh": _unary(Op.ATANH),
    "deg2rad": _scaled(math.pi / 180.0), "radians": _scaled(math.pi / 180.0),
    "rad2deg": _scaled(180.0 / math.pi), "degrees": _scaled(180.0 / math.pi),
    "floor": _unary(Op.FLOOR), "ceil": _unary(Op.CEIL), "trunc": _unary(Op.TRUNC),
    "rint": _unary(Op.RINT), "isnan": L.isnan, "isinf": L.isinf, "isfinite": L.isfinite,
    "signbit": _signbit, "logical_not": lambda x: L.not_(L.truth(x)), "invert": _invert,
    "conjugate": _identity, "modf": _modf,
    "add": _add, "subtract": _binary(Op.SUB), "multiply": _mul, "divide": _binary(Op.DIV),
    "floor_divide": _float_via_f64(_floor_divide), "remainder": _float_via_f64(_remainder),
    "divmod": _divmod, "fmod": _float_via_f64(_fmod_float), "power": _power,
    "float_power": _power, "maximum": _binary(Op.MAX, L.or_),
    "minimum": _binary(Op.MIN, L.and_), "fmax": _fmax(Op.MAX), "fmin": _fmax(Op.MIN),
    "arctan2": _binary(Op.ATAN2), "hypot": _binary(Op.HYPOT),
    "copysign": _binary(Op.COPYSIGN), "logaddexp": _logaddexp(False),
    "logaddexp2": _logaddexp(True), "heaviside": _heaviside, "ldexp": _ldexp,
    "equal": L.eq, "not_equal": L.ne, "less": L.lt, "less_equal": L.le,
    "greater": lambda a, b: L.lt(b, a), "greater_equal": lambda a, b: L.le(b, a),
    "logical_and": _logical(L.and_), "logical_or": _logical(L.or_),
    "logical_xor": _logical(L.xor), "bitwise_and": _binary(Op.AND),
    "bitwise_or": _binary(Op.OR), "bitwise_xor": _binary(Op.XOR),
    # NumPy's loops are integer-only (bool shifts as int8): the ISA's shifts saturate
    # counts outside [0, bits) as NumPy's do
    "left_shift": _binary(Op.SHL), "right_shift": _binary(Op.SHR),
    "matmul": _matmul, "vecdot": _vecdot,
}

#: Why a ufunc NumPy has is not traced.
REFUSED: dict[str, str] = {
    "frexp": "its integer exponent output has no ISA instruction",
    "spacing": "ulp spacing has no ISA instruction",
    "nextafter": "nextafter has no ISA instruction",
    "gcd": "integer gcd has no ISA instruction", "lcm": "integer lcm has no ISA instruction",
    "bitwise_count": "popcount has no ISA instruction",
    "isnat": "datetimes cannot be traced",
    "matvec": "use np.matmul(A, v[..., None])[..., 0]",
    "vecmat": "use np.matmul(v[..., None, :], A)[..., 0, :]",
}


#: Loop dtypes hologram cannot hold, computed in one that holds all their values.
WIDER: dict[np.dtype, np.dtype] = {np.dtype(np.float16): np.dtype(np.float32),
                                   np.dtype(np.int8): np.dtype(np.int32),
                                   np.dtype(np.int16): np.dtype(np.int32)}


def loop_dtypes(ufunc: np.ufunc, inputs: tuple[Any, ...], dtype: Any) -> tuple[np.dtype, ...]:
    """The dtypes NumPy computes ``ufunc(*inputs)`` in: inputs then outputs."""
    kw = {} if dtype is None else {"signature": (None,) * ufunc.nin
                                   + (np.dtype(dtype),) * ufunc.nout}
    try:
        return ufunc.resolve_dtypes(tuple(dtype_of(x) for x in inputs) + (None,) * ufunc.nout,
                                    **kw)
    except TypeError as e:
        raise unsupported(ufunc.__name__, "dtypes", str(e)) from None


def apply(ufunc: np.ufunc, inputs: tuple[Any, ...], dtype: Any = None) -> Value | tuple:
    """``ufunc(*inputs)`` on traced values: ISA values of NumPy's result dtypes."""
    name = ufunc.__name__
    impl = UFUNCS.get(name)
    if impl is None:
        why = REFUSED.get(name, "this ufunc is not traced")
        raise unsupported(name, "ufunc", why)
    dts = loop_dtypes(ufunc, inputs, dtype)
    # NumPy runs bool through float16 or int8 loops; where only the inputs have such
    # a dtype (np.signbit(bool) is bool), compute in the traceable dtype holding them
    ins = [WIDER.get(d, d) for d in dts[:ufunc.nin]]
    vals = [value(x, name, f"x{i + 1}", ins[i]) for i, x in enumerate(inputs)]
    outs = [to_isa(d, name, "result") for d in dts[ufunc.nin:]]
    r = impl(*vals)
    rs = r if isinstance(r, tuple) else (r,)
    rs = tuple(B.cast(v, d) for v, d in zip(rs, outs, strict=True))
    return rs if isinstance(r, tuple) else rs[0]


__all__ = ["REFUSED", "UFUNCS", "apply", "loop_dtypes", "to_numpy"]
