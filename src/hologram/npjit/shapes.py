"""NumPy's shape functions on traced values: views (RESHAPE, EXPAND, PERMUTE, SLICE)
where NumPy's result is a view, CONCAT for joins, and GATHER over IOTA-computed
positions for flips, strides and repeats (each element's source is index arithmetic,
so these fuse into the kernel that reads them)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..isa import builder as B
from ..isa import dtypes as D
from ..isa.opcodes import Op
from ..isa.value import Value
from . import logic as L
from .dtypes import result_type
from .errors import unsupported
from .lift import value
from .reductions import axes_of


def shape_arg(shape: Any, func: str, arg: str = "shape") -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        return (int(shape),)
    try:
        out = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        raise unsupported(func, arg, f"{shape!r} is not a shape (a tuple of ints)") from None
    return out


def reshape(x: Value, shape: Any, order: str = "C", func: str = "reshape") -> Value:
    if order != "C":
        raise unsupported(func, "order", f"order={order!r}: only 'C' order is traced")
    s = shape_arg(shape, func)
    if s.count(-1) > 1:
        raise unsupported(func, "shape", "can only specify one unknown dimension")
    if -1 in s:
        known = math.prod(n for n in s if n != -1)
        if known == 0 or x.size % known:
            raise unsupported(func, "shape", f"cannot reshape {list(x.shape)} into {list(s)}")
        s = tuple(x.size // known if n == -1 else n for n in s)
    if any(n < 0 for n in s) or math.prod(s) != x.size:
        raise unsupported(func, "shape", f"cannot reshape array of size {x.size} into "
                                         f"shape {list(s)}")
    return B.reshape(x, s)


def transpose(x: Value, axes: Any = None, func: str = "transpose") -> Value:
    if axes is None:
        return B.permute(x, tuple(reversed(range(x.ndim))))
    perm = [int(a) % x.ndim if x.ndim else 0 for a in axes]
    if sorted(perm) != list(range(x.ndim)):
        raise unsupported(func, "axes", f"{tuple(axes)} is not a permutation of "
                                        f"{x.ndim} axes")
    return B.permute(x, perm)


def swapaxes(x: Value, a: int, b: int) -> Value:
    (i,), (j,) = axes_of(a, x.ndim, "swapaxes"), axes_of(b, x.ndim, "swapaxes")
    perm = list(range(x.ndim))
    perm[i], perm[j] = perm[j], perm[i]
    return B.permute(x, perm)


def moveaxis(x: Value, source: Any, destination: Any) -> Value:
    src = [axes_of(a, x.ndim, "moveaxis")[0] for a in np.atleast_1d(source).tolist()]
    dst = [axes_of(a, x.ndim, "moveaxis")[0] for a in np.atleast_1d(destination).tolist()]
    if len(src) != len(dst):
        raise unsupported("moveaxis", "destination", "needs as many axes as source")
    order = [n for n in range(x.ndim) if n not in src]
    for d, s in sorted(zip(dst, src, strict=True)):
        order.insert(d, s)
    return B.permute(x, order)


def squeeze(x: Value, axis: Any = None) -> Value:
    if axis is None:
        axes = tuple(i for i, n in enumerate(x.shape) if n == 1)
    else:
        axes = axes_of(axis, x.ndim, "squeeze")
        for a in axes:
            if x.shape[a] != 1:
                raise unsupported("squeeze", "axis", f"cannot select an axis to squeeze out "
                                                     f"which has size {x.shape[a]} != 1")
    return B.reshape(x, tuple(n for i, n in enumerate(x.shape) if i not in axes))


def expand_dims(x: Value, axis: Any) -> Value:
    items = axis if isinstance(axis, (tuple, list)) else (axis,)
    nd = x.ndim + len(items)
    axes = axes_of(tuple(items), nd, "expand_dims")
    it = iter(x.shape)
    return B.reshape(x, tuple(1 if i in axes else next(it) for i in range(nd)))


def broadcast_to(x: Value, shape: Any) -> Value:
    s = shape_arg(shape, "broadcast_to")
    try:
        if tuple(np.broadcast_shapes(x.shape, s)) != s:
            raise ValueError
    except ValueError:
        raise unsupported("broadcast_to", "shape", f"cannot broadcast {list(x.shape)} to "
                                                   f"{list(s)}") from None
    return B.expand(x, s)


def ravel(x: Value, order: str = "C") -> Value:
    return reshape(x, (x.size,), order, "ravel")


def _seq(arrays: Any, func: str, dtype: Any = None) -> list[Value]:
    if not isinstance(arrays, (list, tuple)) or not arrays:
        raise unsupported(func, "arrays", "needs a non-empty list or tuple of arrays")
    d = np.dtype(dtype) if dtype is not None else result_type(*arrays)
    return [value(a, func, f"arrays[{i}]", d) for i, a in enumerate(arrays)]


def concatenate(arrays: Any, axis: Any = 0, out: Any = None, dtype: Any = None,
                casting: str = "same_kind", func: str = "concatenate") -> Value:
    if out is not None:
        raise unsupported(func, "out", "traced results are new values; drop out=")
    parts = _seq(arrays, func, dtype)
    if axis is None:
        parts = [B.reshape(p, (p.size,)) for p in parts]
        axis = 0
    nd = parts[0].ndim
    if nd == 0 or any(p.ndim != nd for p in parts):
        raise unsupported(func, "arrays", "all the input arrays must have the same number "
                                          "of dimensions (at least 1)")
    (a,) = axes_of(axis, nd, func)
    for i, p in enumerate(parts):
        if any(m != n for d, (m, n) in enumerate(zip(p.shape, parts[0].shape, strict=True))
               if d != a):
            raise unsupported(func, f"arrays[{i}]", f"shape {list(p.shape)} differs from "
                                                    f"{list(parts[0].shape)} off axis {a}")
    parts = [p for p in parts if p.shape[a]] or parts[:1]
    return B.concat(parts, a)


def stack(arrays: Any, axis: int = 0, out: Any = None, dtype: Any = None,
          casting: str = "same_kind") -> Value:
    parts = _seq(arrays, "stack", dtype)
    if any(p.shape != parts[0].shape for p in parts):
        raise unsupported("stack", "arrays", "all input arrays must have the same shape")
    (a,) = axes_of(axis, parts[0].ndim + 1, "stack")
    return concatenate([_var(expand_dims(p, a)) for p in parts], a, out, func="stack")


def _var(v: Value) -> Any:
    from ..isa.builder import Var
    return Var(v)


def _atleast(v: Value, n: int) -> Value:
    if v.ndim >= n:
        return v
    if n == 3 and v.ndim == 2:
        return B.reshape(v, (*v.shape, 1))
    if n == 3 and v.ndim == 1:
        return B.reshape(v, (1, *v.shape, 1))
    return B.reshape(v, (1,) * (n - v.ndim) + v.shape)


def hstack(arrays: Any, dtype: Any = None, casting: str = "same_kind") -> Value:
    parts = [_atleast(p, 1) for p in _seq(arrays, "hstack", dtype)]
    return concatenate([_var(p) for p in parts], 0 if parts[0].ndim == 1 else 1,
                       func="hstack")


def vstack(arrays: Any, dtype: Any = None, casting: str = "same_kind") -> Value:
    parts = [_atleast(p, 2) for p in _seq(arrays, "vstack", dtype)]
    return concatenate([_var(p) for p in parts], 0, func="vstack")


def column_stack(arrays: Any) -> Value:
    parts = [B.reshape(p, (p.size, 1)) if p.ndim < 2 else p for p in _seq(arrays,
                                                                         "column_stack")]
    return concatenate([_var(p) for p in parts], 1, func="column_stack")


def split(x: Value, indices_or_sections: Any, axis: int = 0, func: str = "split",
          even: bool = True) -> list[Value]:
    (a,) = axes_of(axis, x.ndim, func)
    n = x.shape[a]
    if isinstance(indices_or_sections, (int, np.integer)):
        k = int(indices_or_sections)
        if k <= 0:
            raise unsupported(func, "indices_or_sections", "number sections must be larger "
                                                           "than 0")
        if even and n % k:
            raise unsupported(func, "indices_or_sections", "array split does not result in "
                                                           "an equal division")
        q, r = divmod(n, k)
        sizes = [q + 1] * r + [q] * (k - r)
    else:
        cuts = [min(max(int(i) + (n if int(i) < 0 else 0), 0), n)
                for i in indices_or_sections]
        bounds = [0, *cuts, n]
        sizes = [max(hi - lo, 0) for lo, hi in zip(bounds, bounds[1:], strict=False)]
        starts = bounds[:-1]
        return [B.slice(x, tuple(s if d == a else 0 for d in range(x.ndim)),
                        tuple(m if d == a else e for d, e in enumerate(x.shape)))
                for s, m in zip([min(s, n) for s in starts], sizes, strict=True)]
    return B.split(x, sizes, a)


def positions(start: int, step: int, count: int) -> Value:
    """``start + step * arange(count)`` as i64, computed from IOTA (no memory read)."""
    i = B.iota((count,), 0, D.i64)
    if step != 1:
        i = L.ew(Op.MUL, i, L.k(step, D.i64))
    return L.ew(Op.ADD, i, L.k(start, D.i64)) if start else i


def take_positions(x: Value, axis: int, start: int, step: int, count: int) -> Value:
    """``x`` along ``axis`` at ``start, start + step, ...`` (``count`` of them)."""
    if count == 0 or x.size == 0:
        return B.const(0, x.dtype, tuple(count if d == axis else n
                                         for d, n in enumerate(x.shape)))
    if step == 1:
        return B.slice(x, tuple(start if d == axis else 0 for d in range(x.ndim)),
                       tuple(count if d == axis else n for d, n in enumerate(x.shape)))
    return B.take(x, positions(start, step, count), axis)


def diagonal(x: Value, a1: int, a2: int, offset: int = 0) -> Value:
    """NumPy's ``diagonal``: axes ``a1`` and ``a2`` (distinct, normalized) replaced by
    one last axis holding the diagonal at ``offset``."""
    rest = [d for d in range(x.ndim) if d not in (a1, a2)]
    y = B.permute(x, [*rest, a1, a2])
    n1, n2 = x.shape[a1], x.shape[a2]
    r0, c0 = (0, offset) if offset >= 0 else (-offset, 0)
    count = max(0, min(n1 - r0, n2 - c0))
    lead = tuple(x.shape[d] for d in rest)
    if count == 0 or y.size == 0:
        return B.const(0, x.dtype, (*lead, count))
    flat = B.reshape(y, (*lead, n1 * n2))
    return B.take(flat, positions(r0 * n2 + c0, n2 + 1, count), len(lead))


def flip(x: Value, axis: Any = None) -> Value:
    for a in axes_of(axis, x.ndim, "flip"):
        x = take_positions(x, a, x.shape[a] - 1, -1, x.shape[a])
    return x


def roll(x: Value, shift: Any, axis: Any = None) -> Value:
    if axis is None:
        return B.reshape(roll(B.reshape(x, (x.size,)), shift, 0), x.shape)
    shifts = np.broadcast_to(np.atleast_1d(shift), np.atleast_1d(axis).shape).tolist()
    for s, ax in zip(shifts, np.atleast_1d(axis).tolist(), strict=True):
        (a,) = axes_of(int(ax), x.ndim, "roll")
        n = x.shape[a]
        if n == 0:
            continue
        s = int(s) % n
        if s:
            head, tail = split(x, [n - s], a, "roll")
            x = B.concat([tail, head], a)
    return x


def repeat(x: Value, repeats: Any, axis: Any = None) -> Value:
    if not isinstance(repeats, (int, np.integer)):
        raise unsupported("repeat", "repeats", "only an integer count is traced (a "
                                               "per-element count makes a data-dependent "
                                               "shape unless it is a NumPy array)")
    if axis is None:
        x, axis = B.reshape(x, (x.size,)), 0
    (a,) = axes_of(axis, x.ndim, "repeat")
    r, n = int(repeats), x.shape[a]
    if r * n == 0:
        return B.const(0, x.dtype, tuple(0 if d == a else m for d, m in enumerate(x.shape)))
    idx = B.cast(L.ew(Op.FLOOR, L.ew(Op.DIV, B.cast(positions(0, 1, n * r), D.f64),
                                     L.k(float(r), D.f64))), D.i64)
    return B.take(x, idx, a)


def tile(x: Value, reps: Any) -> Value:
    reps = shape_arg(reps, "tile", "reps")
    nd = max(x.ndim, len(reps))
    reps = (1,) * (nd - len(reps)) + reps
    xs = (1,) * (nd - x.ndim) + x.shape
    v = B.reshape(x, tuple(s for n in xs for s in (1, n)))
    v = B.expand(v, tuple(s for r, n in zip(reps, xs, strict=True) for s in (r, n)))
    return B.reshape(v, tuple(r * n for r, n in zip(reps, xs, strict=True)))


def diff(x: Value, n: int = 1, axis: int = -1) -> Value:
    (a,) = axes_of(axis, x.ndim, "diff")
    for _ in range(n):
        m = x.shape[a]
        if m == 0:
            break
        hi = take_positions(x, a, 1, 1, m - 1)
        lo = take_positions(x, a, 0, 1, m - 1)
        x = L.not_(L.eq(hi, lo)) if x.dtype is D.boolean else L.ew(Op.SUB, hi, lo)
    return x


def tri_mask(shape: Sequence[int], k: int, lower: bool) -> Value:
    """``j - i <= k`` (lower) or ``j - i >= k`` over the last two axes."""
    i = B.iota(tuple(shape), len(shape) - 2, D.i64)
    j = B.iota(tuple(shape), len(shape) - 1, D.i64)
    d = L.ew(Op.SUB, j, i)
    return L.le(d, L.k(k, D.i64)) if lower else L.le(L.k(k, D.i64), d)


def tril(x: Value, k: int = 0, lower: bool = True) -> Value:
    if x.ndim < 2:
        raise unsupported("tril" if lower else "triu", "m", "needs at least 2 dimensions")
    return L.where(tri_mask(x.shape, int(k), lower), x, L.k(0, x))


__all__ = ["broadcast_to", "column_stack", "concatenate", "diagonal", "diff", "expand_dims",
           "flip", "hstack", "moveaxis", "positions", "ravel", "repeat", "reshape", "roll",
           "shape_arg", "split", "squeeze", "stack", "swapaxes", "take_positions", "tile",
           "transpose", "tril", "tri_mask", "vstack"]
