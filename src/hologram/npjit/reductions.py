"""NumPy's reductions and scans on traced values: sum, mean, var, std, min, max, prod,
argmax, argmin, any, all, ptp, median, the nan-variants, cumsum and cumprod.

Result dtypes are NumPy's own, read off a one-element array of the input's dtype
(``np.sum(int32)`` is int64, ``np.mean(int)`` float64), so no table of NumPy's
accumulator rules is copied here. argmax is a max, a compare and a min over IOTA's
positions: the first position holding the maximum, or the first NaN, as in NumPy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..isa import builder as B
from ..isa import dtypes as D
from ..isa.opcodes import Op
from ..isa.value import Value
from . import logic as L
from .dtypes import to_isa
from .errors import unsupported
from .lift import value


def axes_of(axis: Any, ndim: int, func: str) -> tuple[int, ...]:
    """``axis`` (None, an int or a tuple of ints) as sorted non-negative axes."""
    if axis is None:
        return tuple(range(ndim))
    items = axis if isinstance(axis, tuple) else (axis,)
    out = []
    for a in items:
        if isinstance(a, bool) or not isinstance(a, (int, np.integer)):
            raise unsupported(func, "axis", f"{axis!r} is not an integer or a tuple of them")
        if not -ndim <= int(a) < ndim:
            raise unsupported(func, "axis", f"{a} is out of bounds for an array of "
                                            f"dimension {ndim}")
        out.append(int(a) % ndim)
    if len(set(out)) != len(out):
        raise unsupported(func, "axis", f"{axis!r} repeats an axis")
    return tuple(sorted(out))


def _result(numpy_fn: Callable[..., Any], d: D.DType, func: str, **kw: Any) -> D.DType:
    """The dtype NumPy's ``numpy_fn`` gives for input dtype ``d`` and keywords ``kw``."""
    probe = np.ones(2, dtype=d.np_dtype)
    try:
        r = np.asarray(numpy_fn(probe, **kw)).dtype
    except TypeError as e:
        raise unsupported(func, "dtype", str(e)) from None
    return to_isa(r, func, "result")


def _keep(r: Value, x: Value, axes: tuple[int, ...], keepdims: bool) -> Value:
    """A reduction kept with size-1 axes, shaped as NumPy returns it."""
    if keepdims:
        return r
    return B.reshape(r, tuple(n for i, n in enumerate(x.shape) if i not in axes))


def _reduce(op: Op, x: Value, axes: tuple[int, ...], keepdims: bool) -> Value:
    if not axes:
        return x
    return _keep(B.make(op, (x,), {"axes": axes}), x, axes, keepdims)


def _count(x: Value, axes: tuple[int, ...]) -> int:
    n = 1
    for a in axes:
        n *= x.shape[a]
    return n


def _masked(x: Value, where: Any, fill: float | int | bool, func: str) -> Value:
    if where is None or where is True:
        return x
    m = value(where, func, "where", np.dtype(bool))
    return L.where(m, x, L.k(fill, x))


def total(x: Value, axis: Any = None, dtype: Any = None, keepdims: bool = False,
          initial: Any = None, where: Any = None, func: str = "sum", op: Op = Op.RSUM,
          ) -> Value:
    """``np.sum`` (``op=RPROD``: ``np.prod``)."""
    numpy_fn = np.sum if op is Op.RSUM else np.prod
    d = _result(numpy_fn, x.dtype, func, dtype=dtype)
    axes = axes_of(axis, x.ndim, func)
    x = B.cast(x, d)
    x = _masked(x, where, 0 if op is Op.RSUM else 1, func)
    r = _reduce(op, x, axes, keepdims)
    if initial is not None:
        r = L.ew(Op.ADD if op is Op.RSUM else Op.MUL, r, value(initial, func, "initial",
                                                               d.np_dtype))
    return r


def mean(x: Value, axis: Any = None, dtype: Any = None, keepdims: bool = False,
         where: Any = None, func: str = "mean") -> Value:
    d = _result(np.mean, x.dtype, func, dtype=dtype)
    axes = axes_of(axis, x.ndim, func)
    xs = _masked(B.cast(x, d), where, 0, func)
    s = _reduce(Op.RSUM, xs, axes, keepdims)
    if where is None or where is True:
        return L.ew(Op.DIV, s, L.k(float(_count(x, axes)), d))
    m = B.cast(B.expand(value(where, func, "where", np.dtype(bool)), x.shape), d)
    return L.ew(Op.DIV, s, _reduce(Op.RSUM, m, axes, keepdims))


def var(x: Value, axis: Any = None, dtype: Any = None, ddof: Any = 0, keepdims: bool = False,
        func: str = "var", mean_: Any = None, correction: Any = None) -> Value:
    if correction is not None:
        ddof = correction
    d = _result(np.var, x.dtype, func, dtype=dtype)
    axes = axes_of(axis, x.ndim, func)
    xd = B.cast(x, d)
    m = mean(xd, axes, keepdims=True, func=func) if mean_ is None else value(mean_, func,
                                                                            "mean", d.np_dtype)
    dev = L.ew(Op.SUB, xd, m)
    s = _reduce(Op.RSUM, L.ew(Op.MUL, dev, dev), axes, keepdims)
    return L.ew(Op.DIV, s, L.k(float(max(_count(x, axes) - float(ddof), 0)), d))


def std(x: Value, *args: Any, func: str = "std", **kw: Any) -> Value:
    return B.unary(Op.SQRT, var(x, *args, func=func, **kw))


def extreme(x: Value, axis: Any = None, keepdims: bool = False, initial: Any = None,
            where: Any = None, func: str = "max", op: Op = Op.RMAX) -> Value:
    """``np.max`` / ``np.min`` (NaN wins, as in NumPy); an empty reduction needs
    ``initial``, as in NumPy."""
    axes = axes_of(axis, x.ndim, func)
    if _count(x, axes) == 0 and initial is None:
        raise unsupported(func, "a", "zero-size array to reduction operation which has no "
                                     "identity (pass initial=)")
    if where is not None and initial is None:
        raise unsupported(func, "where", "needs initial= (as in NumPy)")
    work = B.cast(x, D.i32) if x.dtype is D.boolean else x
    step = Op.MAX if op is Op.RMAX else Op.MIN
    if where is not None:
        work = _masked(work, where, -np.inf if op is Op.RMAX else np.inf, func) \
            if work.dtype.is_float else _masked(work, where, initial, func)
    r = _reduce(op, work, axes, keepdims)
    if initial is not None:
        r = L.ew(step, r, value(initial, func, "initial", work.dtype.np_dtype))
    return B.cast(r, x.dtype)


def ptp(x: Value, axis: Any = None, keepdims: bool = False) -> Value:
    return L.ew(Op.SUB, extreme(x, axis, keepdims, func="ptp"),
                extreme(x, axis, keepdims, func="ptp", op=Op.RMIN))


def arg_extreme(x: Value, axis: Any = None, keepdims: bool = False,
                func: str = "argmax") -> Value:
    """The first position of the maximum (minimum) along ``axis``, or of the first NaN."""
    if axis is None:
        if keepdims:
            r = arg_extreme(B.reshape(x, (x.size,)), 0, False, func)
            return B.reshape(r, (1,) * x.ndim)
        x, axis = B.reshape(x, (x.size,)), 0
    (a,) = axes_of(axis, x.ndim, func)
    if x.shape[a] == 0:
        raise unsupported(func, "a", "attempt to get argmax of an empty sequence")
    work = B.cast(x, D.i32) if x.dtype is D.boolean else x
    best = B.make(Op.RMAX if func == "argmax" else Op.RMIN, (work,), {"axes": (a,)})
    hit = L.or_(L.eq(work, B.expand(best, work.shape)), L.isnan(work))
    pos = B.iota(x.shape, a, D.i64)
    first = B.make(Op.RMIN, (L.where(hit, pos, L.k(x.shape[a], D.i64)),), {"axes": (a,)})
    return _keep(first, x, (a,), keepdims)


def truth_reduce(x: Value, axis: Any = None, keepdims: bool = False, where: Any = None,
                 func: str = "any") -> Value:
    """``np.any`` / ``np.all``: over 0/1 as i32 (the ISA reduces no bool), empty axes
    giving False / True as NumPy's do."""
    axes = axes_of(axis, x.ndim, func)
    t = B.cast(L.truth(x), D.i32)
    if where is not None:
        t = _masked(t, where, 0 if func == "any" else 1, func)
    r = _reduce(Op.RMAX if func == "any" else Op.RMIN, t, axes, keepdims)
    return L.lt(L.k(0, D.i32), r)


def count_nonzero(x: Value, axis: Any = None, keepdims: bool = False) -> Value:
    axes = axes_of(axis, x.ndim, "count_nonzero")
    return _reduce(Op.RSUM, B.cast(L.truth(x), D.i64), axes, keepdims)


def scan(x: Value, axis: Any = None, dtype: Any = None, func: str = "cumsum") -> Value:
    """``np.cumsum`` / ``np.cumprod`` (axis None: over the flattened array)."""
    d = _result(np.cumsum if func == "cumsum" else np.cumprod, x.dtype, func, dtype=dtype)
    if axis is None:
        x, axis = B.reshape(x, (x.size,)), 0
    if x.ndim == 0:
        x = B.reshape(x, (1,))
    (a,) = axes_of(axis, x.ndim, func)
    x = B.cast(x, d)
    if x.size == 0:
        return x
    return B.cumsum(x, a) if func == "cumsum" else B.cumprod(x, a)


def nan_total(x: Value, axis: Any = None, dtype: Any = None, keepdims: bool = False,
              func: str = "nansum", op: Op = Op.RSUM) -> Value:
    fill = 0 if op is Op.RSUM else 1
    return total(L.where(L.isnan(x), L.k(fill, x), x), axis, dtype, keepdims, func=func, op=op)


def nan_extreme(x: Value, axis: Any = None, keepdims: bool = False, func: str = "nanmax",
                op: Op = Op.RMAX) -> Value:
    """NaNs ignored; a slice of NaNs only gives NaN (NumPy warns and does the same)."""
    if not x.dtype.is_float:
        return extreme(x, axis, keepdims, func=func, op=op)
    nan = L.isnan(x)
    fill = -np.inf if op is Op.RMAX else np.inf
    r = extreme(L.where(nan, L.k(fill, x), x), axis, keepdims, func=func, op=op)
    allnan = truth_reduce(nan, axis, keepdims, func="all")
    return L.where(allnan, L.k(np.nan, x), r)


def nan_mean(x: Value, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> Value:
    keep = L.not_(L.isnan(x))
    return mean(x, axis, dtype, keepdims, where=_wrap(keep), func="nanmean")


def _wrap(v: Value) -> Any:
    from ..isa.builder import Var
    return Var(v)


def median(x: Value, axis: Any = None, keepdims: bool = False) -> Value:
    """The middle of each fiber sorted by ARGSORT (NaN sorts last: any NaN gives NaN)."""
    if axis is None:
        flat = B.reshape(x, (x.size,))
        r = median(flat, 0)
        return B.reshape(r, (1,) * x.ndim) if keepdims else r
    (a,) = axes_of(axis, x.ndim, "median")
    n = x.shape[a]
    if n == 0:
        raise unsupported("median", "a", "the median of an empty axis is NaN with a warning "
                                         "in NumPy; not traced")
    xf = B.cast(x, D.f64) if not x.dtype.is_float else x
    s = B.gather(xf, B.argsort(xf, a), a)
    lo, hi = (n - 1) // 2, n // 2
    pick = [B.slice(s, tuple(i if d == a else 0 for d in range(x.ndim)),
                    tuple(1 if d == a else m for d, m in enumerate(x.shape))) for i in (lo, hi)]
    last = B.slice(s, tuple(n - 1 if d == a else 0 for d in range(x.ndim)),
                   tuple(1 if d == a else m for d, m in enumerate(x.shape)))
    m = L.ew(Op.MUL, L.ew(Op.ADD, pick[0], pick[1]), L.k(0.5, xf)) if lo != hi else pick[0]
    m = L.where(L.isnan(last), last, m)
    return _keep(m, x, (a,), keepdims)


__all__ = ["arg_extreme", "axes_of", "count_nonzero", "extreme", "mean", "median",
           "nan_extreme", "nan_mean", "nan_total", "ptp", "scan", "std", "total",
           "truth_reduce", "var"]
