"""Sorting and order statistics: sort, topk, kthvalue, median and nanmedian, through the
ISA's ARGSORT (each fiber's positions in stable sorted order: NaN last ascending,
first descending, as PyTorch sorts) and GATHER.

The indices PyTorch returns ride in programs as f64 (``context.isa_dtype``). Where
several elements tie, sort's stable order is PyTorch's; topk, kthvalue and median pick
among ties by a selection algorithm whose choice PyTorch does not document, and here
the tie that comes first in the stable order is picked (the values agree either way).

One translator per ATen op, ``ROWS`` maps each op to it (see
:mod:`hologram_torch.lowering` for how a translator is written)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hologram.isa import dtypes
from hologram.isa.builder import Var
from hologram.isa.opcodes import Op

from .context import Ctx, Unsupported, as_var, not_, or_, wider
from .elementwise import isnan, unary_op

aten = torch.ops.aten
I64 = dtypes.i64


def _axis(x: Var, dim: int) -> tuple[Var, int]:
    """``x`` as at least 1-D (a 0-d tensor sorts as one element) and ``dim`` normalized."""
    if x.ndim == 0:
        return x.reshape(1), 0
    return x, dim % x.ndim


def _window(p: Var, axis: int, start: int, size: int) -> Var:
    """``p[..., start:start + size, ...]`` along ``axis`` (a view)."""
    return p.slice(tuple(start if a == axis else 0 for a in range(p.ndim)),
                   tuple(size if a == axis else s for a, s in enumerate(p.shape)))


def _picked(ctx: Ctx, x: Var, p: Var, axis: int) -> tuple[Var, Var]:
    """(the values at positions ``p`` (i64) along ``axis``, the positions as PyTorch's
    indices), shaped as the node's two results."""
    values = x.gather(p, axis).cast(x.dtype)
    return (values.reshape(tuple(ctx.out[0].shape)),
            p.cast(dtypes.f64).reshape(tuple(ctx.out[1].shape)))


def _sort(ctx: Ctx, x: Var, dim: int = -1, descending: bool = False, *,
          stable: bool | None = None) -> tuple[Var, Var]:
    """sort and sort.stable: ARGSORT, then the values gathered at its positions."""
    x = x.cast(ctx.out_dtype)
    x1, axis = _axis(x, dim)
    return _picked(ctx, x1, x1.argsort(axis, bool(descending)), axis)


def _topk(ctx: Ctx, x: Var, k: int, dim: int = -1, largest: bool = True,
          sorted: bool = True) -> tuple[Var, Var]:
    """The first ``k`` positions of the descending (``largest``) or ascending order."""
    if not sorted:
        raise Unsupported("topk with sorted=False (PyTorch's order of the k is its own)")
    x = x.cast(ctx.out_dtype)
    x1, axis = _axis(x, dim)
    return _picked(ctx, x1, _window(x1.argsort(axis, bool(largest)), axis, 0, k), axis)


def _kthvalue(ctx: Ctx, x: Var, k: int, dim: int = -1, keepdim: bool = False
              ) -> tuple[Var, Var]:
    """The ``k``-th smallest (1-based): position ``k - 1`` of the ascending order."""
    x = x.cast(ctx.out_dtype)
    x1, axis = _axis(x, dim)
    if not 1 <= k <= x1.shape[axis]:
        raise Unsupported(f"kthvalue k={k} out of range (an error PyTorch reports)")
    return _picked(ctx, x1, _window(x1.argsort(axis, False), axis, k - 1, 1), axis)


def _rank(x: Var, axis: int, ignore_nan: bool) -> Var:
    """The position in the ascending order of each fiber's median, [..., 1, ...] i64:
    the lower middle ``(n - 1) // 2``; a fiber holding NaN has its first NaN (median's
    value then is NaN) or, ignoring NaN (nanmedian), the lower middle of the ``m``
    numbers, ``(m - 1) // 2`` (all NaN: ``(n - 1) // 2``). NaN sorts last, so the
    first NaN is at ``m``."""
    n = x.shape[axis]
    m = not_(isnan(x)).cast(dtypes.f64).sum(axis, keepdims=True)
    middle = float((n - 1) // 2)
    if ignore_nan:
        lower = unary_op(Op.FLOOR, (m - 1.0) * 0.5)
        pos = (m > 0.0).where(lower, middle)
    else:
        pos = (m < float(n)).where(m, middle)
    return pos.cast(I64)


def _median_of(ignore_nan: bool) -> Callable[..., Any]:
    """median / nanmedian: ``(x)`` the value over all elements, ``(x, dim, keepdim)``
    values and indices along ``dim``."""

    def tr(ctx: Ctx, x: Var, dim: int | None = None, keepdim: bool = False) -> Any:
        x = x.cast(ctx.out_dtype)
        whole = dim is None
        x1, axis = (x.reshape(max(1, x.v.size)), 0) if whole else _axis(x, dim)
        if x1.shape[axis] == 0:
            raise Unsupported("the median of nothing (an error PyTorch reports)")
        p = x1.argsort(axis, False)
        at = p.gather(_rank(x1, axis, ignore_nan), axis)
        values, indices = _picked(ctx, x1, at, axis) if not whole else (
            x1.gather(at, axis).reshape(ctx.out_shape), None)
        return values if whole else (values, indices)

    return tr


def _count_below(boundaries: Var, x: Var, right: bool) -> Var:
    """How many boundaries (the last axis of ``boundaries``, which is 1-D or shares
    ``x``'s leading dims) sort before each value: ``not (b >= x)`` (left) or ``not (b >
    x)`` (right), ATen's binary-search predicates, so a NaN value counts every boundary.
    A broadcast compare and a sum: O(values x boundaries) work, in one fused kernel
    (the sizes these ops see; a binary search would be O(values x log boundaries))."""
    m = boundaries.shape[-1]
    if boundaries.ndim == 1:
        b = boundaries.reshape((1,) * x.ndim + (m,))
    else:
        b = boundaries.reshape((*boundaries.shape[:-1], 1, m))
    xs = x.reshape((*x.shape, 1))
    shape = (*x.shape, m)
    b, xs = b.expand(shape), xs.expand(shape)
    above = xs < b  # b > x
    before = not_(above) if right else not_(or_(above, b.eq(xs)))
    return before.cast(dtypes.f64).sum(len(shape) - 1)


def _searchsorted(ctx: Ctx, boundaries: Var, x: Any, *, out_int32: bool = False,
                  right: bool = False, side: str | None = None,
                  sorter: Var | None = None) -> Var:
    """torch.searchsorted (Tensor and Scalar values; ``sorter`` gathers the boundaries
    into order first)."""
    d = wider(boundaries, x)
    b = boundaries.cast(d)
    if sorter is not None:
        b = b.gather(sorter.cast(I64), b.ndim - 1)
    xs = as_var(x, d)
    right = side == "right" if side is not None else bool(right)
    if b.ndim > 1 and tuple(b.shape[:-1]) != tuple(xs.shape[:-1]):
        raise Unsupported("searchsorted with boundaries whose leading dims are not the "
                          "values' (an error PyTorch reports)")
    return _count_below(b, xs, right).reshape(ctx.out_shape)


def _bucketize(ctx: Ctx, x: Any, boundaries: Var, *, out_int32: bool = False,
               right: bool = False) -> Var:
    """torch.bucketize: searchsorted over 1-D boundaries (its ``right`` is searchsorted's
    left side: ``boundaries[i-1] < x <= boundaries[i]`` is index i)."""
    d = wider(boundaries, x)
    return _count_below(boundaries.cast(d), as_var(x, d), bool(right)).reshape(ctx.out_shape)


# One row per ATen op (overload packet).
ROWS: dict[Any, Callable[..., Any]] = {
    aten.searchsorted: _searchsorted,
    aten.bucketize: _bucketize,
    aten.sort: _sort,
    aten.topk: _topk,
    aten.kthvalue: _kthvalue,
    aten.median: _median_of(False),
    aten.nanmedian: _median_of(True),
}
