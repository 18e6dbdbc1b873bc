"""Element-wise building blocks over ISA values that NumPy's semantics need.

The ISA has no bool arithmetic and no NOT, AND, OR, LE or NE instruction: they are
written with CMPEQ, CMPLT and SEL here (``a <= b`` as ``a < b or a == b`` so that a
NaN compares false, as in NumPy), so no instruction was added for them.
"""

from __future__ import annotations

import numpy as np

from ..isa import builder as B
from ..isa import dtypes as D
from ..isa.opcodes import Op
from ..isa.value import Value


def k(x: float | int | bool, like: Value | D.DType) -> Value:
    """A scalar constant of ``like``'s dtype (a 0-d value: element-wise ops broadcast it)."""
    return B.const(x, like if isinstance(like, D.DType) else like.dtype, ())


def ew(op: Op, *xs: Value) -> Value:
    return B.elementwise(op, *xs)


def full(x: float | int | bool, dtype: D.DType, shape: tuple[int, ...]) -> Value:
    return B.const(x, dtype, shape)


def _comparable(x: Value) -> Value:
    """bool compares as 0/1 (backends order integers, not C's _Bool in every language)."""
    return B.cast(x, D.i32) if x.dtype is D.boolean else x


def eq(a: Value, b: Value) -> Value:
    return ew(Op.CMPEQ, _comparable(a), _comparable(b))


def lt(a: Value, b: Value) -> Value:
    return ew(Op.CMPLT, _comparable(a), _comparable(b))


def not_(b: Value) -> Value:
    return ew(Op.CMPEQ, b, k(False, D.boolean))


def and_(a: Value, b: Value) -> Value:
    return where(a, b, k(False, D.boolean))


def or_(a: Value, b: Value) -> Value:
    return where(a, k(True, D.boolean), b)


def xor(a: Value, b: Value) -> Value:
    return not_(ew(Op.CMPEQ, a, b))


def ne(a: Value, b: Value) -> Value:
    return not_(eq(a, b))


def le(a: Value, b: Value) -> Value:
    return or_(lt(a, b), eq(a, b))


def truth(x: Value) -> Value:
    """``x != 0`` as bool (NaN is true, as in NumPy)."""
    return x if x.dtype is D.boolean else ne(x, k(0, x))


def where(c: Value, a: Value, b: Value) -> Value:
    """``np.where(c, a, b)`` for values of one dtype, broadcast together."""
    shape = B.broadcast_shape(c.shape, a.shape, b.shape)
    return B.make(Op.SEL, (B.expand(c, shape), B.expand(a, shape), B.expand(b, shape)))


def isnan(x: Value) -> Value:
    if not x.dtype.is_float:
        return full(False, D.boolean, x.shape)
    return not_(ew(Op.CMPEQ, x, x))


def isinf(x: Value) -> Value:
    if not x.dtype.is_float:
        return full(False, D.boolean, x.shape)
    return eq(ew(Op.ABS, x), k(np.inf, x))


def isfinite(x: Value) -> Value:
    if not x.dtype.is_float:
        return full(True, D.boolean, x.shape)
    return lt(ew(Op.ABS, x), k(np.inf, x))


__all__ = ["and_", "eq", "ew", "full", "isfinite", "isinf", "isnan", "k", "le", "lt", "ne",
           "not_", "or_", "truth", "where", "xor"]
