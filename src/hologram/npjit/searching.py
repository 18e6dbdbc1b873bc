"""``np.searchsorted``, ``np.digitize`` and ``np.interp`` on traced values.

The sorted array's length is known at trace time, so a search is a fixed number of
steps: binary lifting over powers of two (``lo + step`` taken when the element before
it comes before the key), each step one GATHER of the sorted array at computed
positions and a select, all element-wise over the keys. ``ceil(log2(n + 1))`` steps,
fused into one kernel: NumPy's binary search, without branches. "Before" is NumPy's
sort order, in which NaN comes last.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..isa import builder as B
from ..isa import dtypes as D
from ..isa.builder import Var
from ..isa.opcodes import Op
from ..isa.value import Value
from . import logic as L
from .dtypes import result_type
from .errors import unsupported
from .lift import value

F64 = np.dtype(np.float64)


def _before(a: Value, b: Value) -> Value:
    """``a`` sorts before ``b`` in NumPy's order (NaN last)."""
    lt = L.lt(a, b)
    if not a.dtype.is_float:
        return lt
    return L.or_(lt, L.and_(L.isnan(b), L.not_(L.isnan(a))))


def search(a: Value, keys: Value, side: str) -> Value:
    """``np.searchsorted(a, keys, side)`` of a sorted 1-D ``a``: int64 of ``keys``'
    shape, each the count of ``a``'s elements before the key (``left``) or not after
    it (``right``)."""
    if a.shape[0] == 0 or keys.size == 0:
        return B.const(0, D.i64, keys.shape)
    return B.reshape(_search_rows(a, _rows(keys), side), keys.shape)


def _rows(x: Value) -> Value:
    """``x`` (not empty) as rows: a GATHER's output cannot be split along its gathered
    axis, so a search over 1-D keys would run on one thread. The row length is the
    largest divisor of the size up to 4096."""
    cols = next(d for d in range(min(x.size, 4096), 0, -1) if x.size % d == 0)
    return B.reshape(x, (x.size // cols, cols))


def _table(a: Value, rows: int) -> Value:
    """A 1-D value broadcast to ``rows`` rows: what a row of keys gathers from."""
    return B.expand(B.reshape(a, (1, a.shape[0])), (rows, a.shape[0]))


def _search_rows(a: Value, flat: Value, side: str) -> Value:
    """:func:`search` of 2-D keys, row by row."""
    n, rows = a.shape[0], flat.shape[0]
    table = _table(a, rows)
    lo = B.const(0, D.i64, flat.shape)
    step = 1 << (n.bit_length() - 1)  # the largest power of two <= n
    while step:
        cand = L.ew(Op.ADD, lo, L.k(step, D.i64))
        fits = L.le(cand, L.k(n, D.i64))
        at = L.ew(Op.SUB, L.where(fits, cand, L.k(n, D.i64)), L.k(1, D.i64))
        elem = B.gather(table, at, 1)
        goes = _before(elem, flat) if side == "left" else L.not_(_before(flat, elem))
        lo = L.where(L.and_(fits, goes), cand, lo)
        step >>= 1
    return lo


def searchsorted(a: Any, v: Any, side: Any = "left", sorter: Any = None) -> Value:
    if sorter is not None:
        raise unsupported("searchsorted", "sorter", "not traced; sort the array first")
    if side not in ("left", "right"):
        raise unsupported("searchsorted", "side", f"must be 'left' or 'right', got {side!r}")
    d = result_type(a, v)
    av, vv = value(a, "searchsorted", "a", d), value(v, "searchsorted", "v", d)
    if av.ndim != 1:
        raise unsupported("searchsorted", "a", f"must be 1-D, got {av.ndim}-D")
    return search(av, vv, side)


def digitize(x: Any, bins: Any, right: bool = False) -> Value:
    """NumPy checks that the bins are monotonic and searches them in that direction:
    so the bins must be known at trace time (an array, not a traced value)."""
    if isinstance(bins, (Var, Value)):
        raise unsupported("digitize", "bins", "must be known at trace time (NumPy checks "
                                              "their order); pass a NumPy array")
    b = np.asarray(bins)
    if b.ndim != 1:
        raise unsupported("digitize", "bins", "must be 1-D")
    if b.dtype.kind == "c":
        raise unsupported("digitize", "bins", "complex bins are not traced")
    direction = _monotonic(b.tolist())
    if direction == 0:
        raise unsupported("digitize", "bins", "must be monotonically increasing or "
                                              "decreasing")
    increasing = direction > 0
    side = "left" if right else "right"
    if increasing:
        return searchsorted(b, x, side)
    found = searchsorted(b[::-1].copy(), x, side)
    return L.ew(Op.SUB, L.k(len(b), D.i64), found)


def _monotonic(b: list[Any]) -> int:
    """1 increasing, -1 decreasing, 0 neither: NumPy's ``_monotonicity``, whose
    comparisons a NaN passes (bins ending in NaN are increasing, bins starting with
    one decreasing: what NumPy's own check gives)."""
    i = 1
    while i < len(b) and b[i] == b[i - 1]:
        i += 1
    if i >= len(b):
        return 1
    last, nxt = b[i - 1], b[i]
    if last < nxt:
        return 0 if any(p > q for p, q in zip(b[i:], b[i + 1:], strict=False)) else 1
    return 0 if any(p < q for p, q in zip(b[i:], b[i + 1:], strict=False)) else -1


def interp(x: Any, xp: Any, fp: Any, left: Any = None, right: Any = None,
           period: Any = None) -> Value:
    """NumPy's ``interp`` in float64, case for case as its C loop decides: NaN keys
    stay NaN (with one sample point: fp[0]); below ``xp[0]`` ``left``, above
    ``xp[-1]`` ``right``; at ``xp[-1]`` and at a sample point its ``fp``; else the
    segment's line from its left end, from its right end where that gives NaN, or
    the shared value of a flat segment."""
    if period is not None:
        raise unsupported("interp", "period", "periodic interpolation is not traced")
    for name, arg in (("x", x), ("xp", xp), ("fp", fp)):
        if result_type(arg).kind == "c":
            raise unsupported("interp", name, "complex values are not traced")
    xs = value(x, "interp", "x", F64)
    xpv, fpv = value(xp, "interp", "xp", F64), value(fp, "interp", "fp", F64)
    if xpv.ndim != 1 or fpv.ndim != 1 or xpv.shape != fpv.shape:
        raise unsupported("interp", "fp", f"xp and fp must be 1-D of one length, got "
                                          f"{list(xpv.shape)} and {list(fpv.shape)}")
    n = xpv.shape[0]
    if n == 0:
        raise unsupported("interp", "xp", "array of sample points is empty")
    if xs.size == 0:
        return B.const(0.0, D.f64, xs.shape)
    xv = _rows(xs)  # computed in rows, as the search is
    lval = value(left, "interp", "left", F64) if left is not None else _at(fpv, 0)
    rval = value(right, "interp", "right", F64) if right is not None else _at(fpv, n - 1)
    first, last = _at(xpv, 0), _at(xpv, n - 1)
    if n == 1:  # NumPy's loop for one point: a NaN key gets fp[0] too
        r = L.where(L.lt(xv, first), lval, L.where(L.lt(last, xv), rval, _at(fpv, 0)))
        return B.reshape(r, xs.shape)
    else:
        j = L.ew(Op.SUB, _search_rows(xpv, xv, "right"), L.k(1, D.i64))  # xp[j] <= x
        jc = L.where(L.lt(j, L.k(0, D.i64)), L.k(0, D.i64),
                     L.where(L.lt(j, L.k(n - 2, D.i64)), j, L.k(n - 2, D.i64)))
        x0, y0 = _gathered(xpv, jc), _gathered(fpv, jc)
        j1 = L.ew(Op.ADD, jc, L.k(1, D.i64))
        x1, y1 = _gathered(xpv, j1), _gathered(fpv, j1)
        slope = L.ew(Op.DIV, L.ew(Op.SUB, y1, y0), L.ew(Op.SUB, x1, x0))
        r = L.ew(Op.ADD, L.ew(Op.MUL, slope, L.ew(Op.SUB, xv, x0)), y0)
        again = L.ew(Op.ADD, L.ew(Op.MUL, slope, L.ew(Op.SUB, xv, x1)), y1)
        r = L.where(L.isnan(r), again, r)
        r = L.where(L.and_(L.isnan(r), L.eq(y0, y1)), y0, r)
        r = L.where(L.eq(x0, xv), y0, r)
        r = L.where(L.eq(j, L.k(n - 1, D.i64)), _at(fpv, n - 1), r)
        r = L.where(L.lt(last, xv), rval, r)
    r = L.where(L.lt(xv, first), lval, r)
    return B.reshape(L.where(L.isnan(xv), xv, r), xs.shape)


def _at(v: Value, i: int) -> Value:
    """Element ``i`` of a 1-D value, as a 0-d value."""
    return B.reshape(B.slice(v, (i,), (1,)), ())


def _gathered(v: Value, idx: Value) -> Value:
    """``v[idx]`` of a 1-D ``v`` for 2-D positions ``idx``, row by row."""
    return B.gather(_table(v, idx.shape[0]), idx, 1)


__all__ = ["digitize", "interp", "search", "searchsorted"]
