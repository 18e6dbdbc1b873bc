"""Diagonals of two dims: diagonal (and diagonal_copy) read one with a GATHER (trace sums
one); diag_embed,
diagonal_backward and diagonal_scatter write one with a select against an IOTA mask
(column - row == offset), so no index or mask lives in memory and every value passes
through unrounded (a -0.0 or NaN on the diagonal stays one).

Each works on a canonical layout: the two dims moved last, ``[*batch, rows, cols]``
(a PERMUTE, a view), then moved back where the op puts them.

One translator per ATen op, ``ROWS`` maps each op to it (see
:mod:`hologram_torch.lowering` for how a translator is written)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hologram.isa import dtypes
from hologram.isa.builder import Var, concat, const, iota

from .context import Ctx, as_var

aten = torch.ops.aten


def _canonical_perm(ndim: int, d1: int, d2: int) -> tuple[int, ...]:
    """The axis order that moves dims d1, d2 last (the others keep their order)."""
    return (*(a for a in range(ndim) if a not in (d1, d2)), d1, d2)


def _inverse(perm: tuple[int, ...]) -> tuple[int, ...]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return tuple(inv)


def _mask(shape: tuple[int, ...], offset: int) -> Var:
    """True where column - row == offset over the last two axes of ``shape``."""
    rows, cols = Var(iota(shape, len(shape) - 2, dtypes.f64)), Var(iota(shape, len(shape) - 1,
                                                                        dtypes.f64))
    return (cols - rows).eq(float(offset))


def _placed(values: Var, shape: tuple[int, ...], offset: int) -> Var:
    """``values [*batch, L]`` spread over ``shape [*batch, R, C]``: row i holds the
    diagonal element of that row (value ``i - max(0, -offset)``), the other rows 0, as
    ``[*batch, R, 1]`` expanded along the columns (the mask picks the diagonal)."""
    *batch, rows, cols = shape
    n = values.shape[-1]
    r0 = max(0, -offset)
    col = values.reshape((*batch, n, 1))

    def zeros(k: int):
        return const(0, values.dtype, (*batch, k, 1))

    parts = [p for p in (zeros(r0), col.v, zeros(rows - r0 - n)) if p.shape[-2]]
    return Var(concat(parts, len(shape) - 2) if parts else zeros(rows)).expand(shape)


def _diagonal(ctx: Ctx, x: Var, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Var:
    """``torch.diagonal``: element k of the result is ``y[..., r0 + k, c0 + k]`` of the
    canonical ``y``, read as a GATHER of column k from rows r0.. (columns from c0)."""
    d = ctx.out_dtype
    n = x.ndim
    d1, d2 = dim1 % n, dim2 % n
    y = x.cast(d).permute(_canonical_perm(n, d1, d2))
    *batch, rows, cols = y.shape
    length = ctx.out_shape[-1]
    if length == 0 or 0 in batch:
        return as_var(0, d).expand(ctx.out_shape)
    r0, c0 = max(0, -offset), max(0, offset)
    window = y.slice((*(0 for _ in batch), r0, c0), (*batch, length, cols - c0))
    k = Var(iota((*batch, length, 1), len(batch), dtypes.i64))
    return window.gather(k, len(batch) + 1).reshape(ctx.out_shape)


def _trace(ctx: Ctx, x: Var) -> Var:
    """The sum of the main diagonal (an empty one sums to 0)."""
    d = ctx.out_dtype
    n = min(x.shape)
    if n == 0:
        return as_var(0, d)
    y = x.cast(d).slice((0, 0), (n, n))
    diag = y.gather(Var(iota((n, 1), 0, dtypes.i64)), 1)
    return diag.sum().reshape(())


def _write(ctx: Ctx, values: Any, offset: int, d1: int, d2: int, base: Var | None) -> Var:
    """``values`` on the diagonal (offset, d1, d2) of the result, ``base`` (or 0) off it."""
    d = ctx.out_dtype
    shape = ctx.out_shape
    perm = _canonical_perm(len(shape), d1, d2)
    canon = tuple(shape[p] for p in perm)
    if 0 in canon:
        return as_var(0, d).expand(shape) if base is None else base.cast(d)
    on = _placed(as_var(values, d), canon, offset)
    off = as_var(0, d).expand(canon) if base is None else base.cast(d).permute(perm)
    return _mask(canon, offset).where(on, off).permute(_inverse(perm))


def _diag_embed(ctx: Ctx, x: Var, offset: int = 0, dim1: int = -2, dim2: int = -1) -> Var:
    n = len(ctx.out_shape)
    return _write(ctx, x, offset, dim1 % n, dim2 % n, None)


def _diagonal_backward(ctx: Ctx, grad: Var, input_sizes: Any, offset: int, dim1: int,
                       dim2: int) -> Var:
    n = len(ctx.out_shape)
    return _write(ctx, grad, offset, dim1 % n, dim2 % n, None)


def _diagonal_scatter(ctx: Ctx, x: Var, src: Var, offset: int = 0, dim1: int = 0,
                      dim2: int = 1) -> Var:
    n = len(ctx.out_shape)
    return _write(ctx, src, offset, dim1 % n, dim2 % n, x)


# One row per ATen op (overload packet).
ROWS: dict[Any, Callable[..., Any]] = {
    aten.diagonal: _diagonal,
    aten.diagonal_copy: _diagonal,
    aten.diag_embed: _diag_embed,
    aten.diagonal_backward: _diagonal_backward,
    aten.diagonal_scatter: _diagonal_scatter,
    aten.trace: _trace,
}
