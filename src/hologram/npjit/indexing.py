"""NumPy indexing of traced values: reads (``x[key]``) and writes (``x[key] = v``).

Basic indices (ints, slices with any step, None, ...) are views or IOTA-positioned
GATHERs. Advanced indices (integer arrays, traced or captured, and boolean NumPy
arrays, whose True positions are known when tracing) follow NumPy's placement rule
and become one GATHER over the advanced axes flattened together. A traced boolean
mask selects a data-dependent number of elements, so it is refused unless it is the
whole key of a write (``x[mask] = v`` is ``np.where(mask, v, x)``). A write is a
SCATTER of the value at the positions the same key reads, so every key that reads
also writes.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import TracedIndexError
from ..isa import builder as B
from ..isa import dtypes as D
from ..isa.builder import Var
from ..isa.opcodes import Op
from ..isa.value import Value
from . import logic as L
from .dtypes import to_numpy
from .errors import unsupported
from .lift import value, watch
from .shapes import take_positions


def _is_advanced(k: Any) -> bool:
    return isinstance(k, (Var, np.ndarray, list)) and not isinstance(k, bool)


def _normalize(key: Any) -> list[Any]:
    items = list(key) if isinstance(key, tuple) else [key]
    out = []
    for k in items:
        if isinstance(k, np.ndarray):
            watch(k)  # read here, on the host: changing it must retrace
        if isinstance(k, list):
            if any(isinstance(e, Var) for e in k):
                raise unsupported("__getitem__", "key", "a list holding traced values; use "
                                                        "np.stack(...) as the index")
            k = np.asarray(k)
            if k.dtype == object or (k.size == 0 and k.dtype.kind == "f"):
                k = k.astype(np.int64)
        if isinstance(k, np.ndarray) and k.dtype.kind not in "iub":
            raise unsupported("__getitem__", "key", f"arrays used as indices must be of "
                                                    f"integer or boolean type, got {k.dtype}")
        if isinstance(k, Var) and k.v.dtype.kind == "f":
            raise unsupported("__getitem__", "key", "a float traced value is not an index")
        if isinstance(k, np.generic) and not isinstance(k, np.bool_):
            k = int(k)
        if not (k is None or k is Ellipsis or isinstance(k, (int, slice, np.ndarray, Var))):
            raise unsupported("__getitem__", "key", f"{type(k).__name__} is not a valid index")
        if isinstance(k, (bool, np.bool_)):
            raise unsupported("__getitem__", "key", "a scalar boolean index is not traced")
        out.append(k)
    return out


def is_basic(key: Any) -> bool:
    """Whether NumPy's result for ``key`` is a view (no advanced index in it)."""
    items = key if isinstance(key, tuple) else (key,)
    return not any(_is_advanced(k) for k in items)


def _consumes(k: Any) -> int:
    if k is None or k is Ellipsis:
        return 0
    if isinstance(k, np.ndarray) and k.dtype == bool:
        return k.ndim
    if isinstance(k, Var) and k.v.dtype is D.boolean:
        return k.v.ndim
    return 1


def _expand_ellipsis(items: list[Any], ndim: int) -> list[Any]:
    n_ell = sum(k is Ellipsis for k in items)
    if n_ell > 1:
        raise unsupported("__getitem__", "key", "an index can only have a single ellipsis")
    used = sum(_consumes(k) for k in items)
    if used > ndim:
        raise TracedIndexError(f"@hg.jit: np.__getitem__: key: too many indices for array: "
                               f"array is {ndim}-dimensional, but {used} were indexed")
    if n_ell:
        i = items.index(Ellipsis)
        items = items[:i] + [slice(None)] * (ndim - used) + items[i + 1:]
    else:
        items = items + [slice(None)] * (ndim - used)
    return items


def _int_index(i: int, n: int, axis: int) -> int:
    if not -n <= i < n:
        raise TracedIndexError(f"@hg.jit: np.__getitem__: key: index {i} is out of bounds "
                               f"for axis {axis} with size {n}")
    return i % n


def _host_index(a: np.ndarray, n: int, axis: int) -> np.ndarray:
    """A captured integer index array checked and made non-negative when tracing."""
    a = a.astype(np.int64)
    bad = (a < -n) | (a >= n)
    if bad.any():
        raise TracedIndexError(f"@hg.jit: np.__getitem__: key: index {int(a[bad].flat[0])} "
                               f"is out of bounds for axis {axis} with size {n}")
    return np.where(a < 0, a + n, a)


def _traced_index(v: Value, n: int) -> Value:
    """A traced index, negatives wrapped; one outside [-n, n) stays out of range, so the
    GATHER's run-time check raises IndexError."""
    v = B.cast(v, D.i64)
    return L.where(L.lt(v, L.k(0, D.i64)), L.ew(Op.ADD, v, L.k(n, D.i64)), v)


def getitem(x: Value, key: Any) -> Value:
    items = _expand_ellipsis(_normalize(key), x.ndim)
    advanced = any(_is_advanced(k) for k in items)
    # pass 1: basic indices; advanced ones (ints too, when any exists) keep their axis
    y = x
    axis = 0
    adv: list[tuple[int, Any]] = []  # (axis of y, index: np.ndarray | Value)
    drop: list[int] = []
    for k in items:
        if k is None:
            y = B.reshape(y, (*y.shape[:axis], 1, *y.shape[axis:]))
            axis += 1
        elif isinstance(k, int):
            i = _int_index(k, y.shape[axis], axis)
            if advanced:
                adv.append((axis, np.asarray(i, dtype=np.int64)))
            else:
                y = take_positions(y, axis, i, 1, 1)
                drop.append(axis)
            axis += 1
        elif isinstance(k, slice):
            start, stop, step = k.indices(y.shape[axis])
            count = len(range(start, stop, step))
            y = take_positions(y, axis, start, step, count)
            axis += 1
        elif isinstance(k, np.ndarray) and k.dtype == bool:
            if k.shape != y.shape[axis:axis + k.ndim]:
                raise TracedIndexError(f"@hg.jit: np.__getitem__: key: boolean index of "
                                       f"shape {list(k.shape)} does not match the indexed "
                                       f"axes {list(y.shape[axis:axis + k.ndim])}")
            for j, nz in enumerate(np.nonzero(k)):
                adv.append((axis + j, nz.astype(np.int64)))
            axis += k.ndim
        elif isinstance(k, Var) and k.v.dtype is D.boolean:
            raise unsupported("__getitem__", "key", "a traced boolean mask selects a "
                                                    "data-dependent number of elements; use "
                                                    "np.where(mask, x, fill) or a NumPy mask")
        else:
            adv.append((axis, k))
            axis += 1
    if drop:
        y = B.reshape(y, tuple(n for i, n in enumerate(y.shape) if i not in drop))
    if not adv:
        return y
    return _advanced(y, adv)


def _advanced(y: Value, adv: list[tuple[int, Any]]) -> Value:
    axes = [a for a, _ in adv]
    sizes = [y.shape[a] for a in axes]
    idx = []
    for a, k in adv:
        if isinstance(k, np.ndarray):
            idx.append(_host_index(k, y.shape[a], a))
        else:
            idx.append(k.v)
    shape = B.broadcast_shape(*(np.shape(i) if isinstance(i, np.ndarray) else i.shape
                                for i in idx))
    contiguous = axes == list(range(axes[0], axes[0] + len(axes)))
    rest = [d for d in range(y.ndim) if d not in axes]
    if any(n == 0 for n in sizes) and math.prod(shape):
        raise TracedIndexError("@hg.jit: np.__getitem__: key: index into a zero-size axis")
    out_shape = [*shape, *(y.shape[d] for d in rest)]
    if math.prod(out_shape) == 0 or y.size == 0:
        res = B.const(0, y.dtype, tuple(out_shape))
    elif all(isinstance(i, np.ndarray) for i in idx):
        strides = [math.prod(sizes[j + 1:]) for j in range(len(sizes))]
        flat = sum(np.broadcast_to(i, shape) * s for i, s in zip(idx, strides, strict=True))
        res = _take_flat(y, axes, rest, value(np.ascontiguousarray(flat), "__getitem__",
                                              "key"))
    else:
        lin: Value | None = None
        bad: Value | None = None
        for j, (i, n) in enumerate(zip(idx, sizes, strict=True)):
            v = (value(i, "__getitem__", "key") if isinstance(i, np.ndarray)
                 else _traced_index(i, n))
            v = B.expand(B.cast(v, D.i64), shape)
            if len(idx) > 1:
                out = L.or_(L.lt(v, L.k(0, D.i64)), L.le(L.k(n, D.i64), v))
                bad = out if bad is None else L.or_(bad, out)
            term = L.ew(Op.MUL, v, L.k(math.prod(sizes[j + 1:]), D.i64))
            lin = term if lin is None else L.ew(Op.ADD, lin, term)
        if bad is not None:
            lin = L.where(bad, L.k(-1, D.i64), lin)
        res = _take_flat(y, axes, rest, lin)
    if contiguous and axes[0] > 0:
        k = len(shape)
        before = axes[0]
        perm = [*range(k, k + before), *range(k), *range(k + before, len(out_shape))]
        res = B.permute(res, perm)
    return res


def _take_flat(y: Value, axes: list[int], rest: list[int], lin: Value) -> Value:
    """``y`` with the advanced ``axes`` moved first and flattened, taken at ``lin``."""
    if len(axes) == 1:
        moved = B.permute(y, [axes[0], *rest])
        return B.take(moved, lin, 0)
    moved = B.permute(y, [*axes, *rest])
    flat = B.reshape(moved, (math.prod(y.shape[a] for a in axes), *(y.shape[d] for d in rest)))
    return B.take(flat, lin, 0)


def positions_of(shape: tuple[int, ...]) -> Value:
    """Each element's row-major position, as i64 (IOTAs: computed, never read)."""
    if not shape:
        return B.const(0, D.i64, ())
    lin: Value | None = None
    for a in range(len(shape)):
        term = B.iota(shape, a, D.i64)
        s = math.prod(shape[a + 1:])
        if s != 1:
            term = L.ew(Op.MUL, term, L.k(s, D.i64))
        lin = term if lin is None else L.ew(Op.ADD, lin, term)
    return lin


def setitem(x: Value, key: Any, v: Any) -> Value:
    """``x`` with ``x[key] = v`` applied, as a new value."""
    np_dtype = to_numpy(x.dtype)
    if isinstance(key, Var) and key.v.dtype is D.boolean:
        val = value(v, "__setitem__", "value", np_dtype)
        if val.size != 1:
            raise unsupported("__setitem__", "value", "with a traced boolean mask only a "
                                                      "scalar can be written (the count of "
                                                      "True is data-dependent)")
        if key.v.shape != x.shape:
            raise unsupported("__setitem__", "key", f"a traced boolean mask of shape "
                                                    f"{list(key.v.shape)} for an array of "
                                                    f"shape {list(x.shape)}")
        return L.where(key.v, B.reshape(val, ()), x)
    pos = getitem(positions_of(x.shape), key)
    if pos.size == 0 or x.size == 0:
        return x
    val = value(v, "__setitem__", "value", np_dtype)
    try:
        val = B.expand(val, pos.shape) if val.ndim <= pos.ndim else None
    except Exception:
        val = None
    if val is None or val.shape != pos.shape:
        raise unsupported("__setitem__", "value", f"could not broadcast the value to the "
                                                  f"indexing result's shape {list(pos.shape)}")
    flat = B.reshape(x, (x.size,))
    out = B.scatter(flat, B.reshape(pos, (pos.size,)), B.reshape(val, (pos.size,)), 0)
    return B.reshape(out, x.shape)


__all__ = ["TracedIndexError", "getitem", "positions_of", "setitem"]
