"""Pairwise distances: ``_cdist_forward``, ``_cdist_backward`` (torch.cdist) and
``_pdist_forward``, ``_pdist_backward`` (torch.pdist: the pairs i < j of one set), as ATen's
CPU kernels define them (``aten/src/ATen/native/cpu/DistanceOpsKernel.cpp``).

The forward is one reduction over the feature axis of a broadcast difference
``x1[..., p, None, :] - x2[..., None, r, :]``, fused (no ``[P, R, M]`` temporary): p = 0
counts the differing features, 1 sums ``|d|``, 2 is ``sqrt(sum d^2)``, inf the largest
``|d|``, any other p ``(sum |d|^p)^(1/p)``. For p = 2 with more than 25 rows ATen
computes through a matrix product (``|x1|^2 + |x2|^2 - 2 x1 x2^T``), which cancels;
the direct sum here is at least as accurate. The backward is ATen's per-p formula,
summed over the other operand's rows.

One translator per ATen op, ``ROWS`` maps each op to it (see
:mod:`hologram_torch.lowering` for how a translator is written)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from hologram.isa import dtypes
from hologram.isa.builder import Var, broadcast_shape, const, iota
from hologram.isa.opcodes import Op

from .context import Ctx, Unsupported, not_
from .elementwise import unary_op

aten = torch.ops.aten


def _pairs(x1: Var, x2: Var) -> tuple[Var, Var, tuple[int, ...]]:
    """(x1 as [*B, P, 1, M], x2 as [*B, 1, R, M], both expanded to [*B, P, R, M])."""
    batch = broadcast_shape(tuple(x1.shape[:-2]), tuple(x2.shape[:-2]))
    (p, m), r = x1.shape[-2:], x2.shape[-2]
    shape = (*batch, p, r, m)
    a = x1.reshape((*x1.shape[:-1], 1, m)).expand(shape)
    b = x2.reshape((*x2.shape[:-2], 1, r, m)).expand(shape)
    return a, b, shape


def _sign(d: Var) -> Var:
    """-1, 0 or 1 (0 for NaN: ATen's vectorized sign of min/max of ceil and floor)."""
    return (d > 0.0).cast(d.dtype) - (d < 0.0).cast(d.dtype)


def _cdist_forward(ctx: Ctx, x1: Var, x2: Var, p: float,
                   compute_mode: int | None = None) -> Var:
    d = ctx.out_dtype
    if x1.shape[-1] == 0:  # no features: every distance is 0 (ATen's sums of nothing)
        return _zeros(ctx)
    a, b, _ = _pairs(x1.cast(d), x2.cast(d))
    diff = abs(a - b)
    axis = diff.ndim - 1
    if p == 0:
        out = not_(diff.eq(0.0)).cast(d).sum(axis)
    elif p == 1:
        out = diff.sum(axis)
    elif p == 2:
        out = (diff * diff).sum(axis).sqrt()
    elif math.isinf(p):
        out = diff.max(axis)
    else:
        out = (diff ** float(p)).sum(axis) ** (1.0 / float(p))
    return out.reshape(ctx.out_shape)


def _zeros(ctx: Ctx) -> Var:
    return Var(const(0, ctx.out_dtype, ctx.out_shape))


def _cdist_backward(ctx: Ctx, grad: Var, x1: Var, x2: Var, p: float, cdist: Var) -> Var:
    """The gradient for x1: per pair of rows ATen's ``backward(x1_p - x2_r, grad_pr,
    dist_pr)``, summed over r (the rows of x2)."""
    d = ctx.out_dtype
    if p == 0 or 0 in x1.shape or x2.shape[-2] == 0:
        return _zeros(ctx)
    a, b, shape = _pairs(x1.cast(d), x2.cast(d))
    out = _pair_grads(a - b, grad.cast(d), cdist.cast(d), float(p), shape)
    if tuple(out.shape) != tuple(ctx.out_shape):  # x1's batch dims were broadcast
        extra = out.ndim - len(ctx.out_shape)
        axes = [k for k in range(out.ndim) if k < extra or (
            out.shape[k] != 1 and ctx.out_shape[k - extra] == 1)]
        if not axes:
            raise Unsupported("cdist backward with batch dims it cannot reduce")
        out = out.sum(axes, keepdims=True)
    return out.reshape(ctx.out_shape)


def _pair_grads(diff: Var, grad: Var, dist: Var, p: float, shape: tuple[int, ...]) -> Var:
    """ATen's per-p backward of each pair's distance ([*B, P, R, M] differences; grad and
    dist [*B, P, R]), summed over the R rows: [*B, P, M]."""
    g = grad.reshape((*grad.shape, 1)).expand(shape)
    dist = dist.reshape((*dist.shape, 1)).expand(shape)
    zero = dist.eq(0.0)
    if p == 1:
        term = g * _sign(diff)
    elif p < 2:
        t = _sign(diff) * abs(diff) ** (p - 1.0) * g / dist ** (p - 1.0)
        term = zero.where(0.0, t)
        if p < 1:
            term = diff.eq(0.0).where(0.0, term)
    elif p == 2:
        term = zero.where(0.0, g * diff / dist)
    elif math.isinf(p):
        gap = unary_op(Op.CEIL, abs(abs(diff) - dist)).minimum(1.0)
        term = g * _sign(diff) * (1.0 - gap)
    else:
        t = diff * abs(diff) ** (p - 2.0) * g / dist ** (p - 1.0)
        term = zero.where(0.0, t)
    return term.sum(len(shape) - 2)  # over x2's rows: [*B, P, M]


def _pair_slots(n: int) -> tuple[Var, Var]:
    """For the [n, n] pairs (i, j): pdist's slot ``i n - i (i + 1) / 2 + j - i - 1`` of
    each pair with i < j (f64, exact), and the mask i < j."""
    i = Var(iota((n, n), 0, dtypes.f64))
    j = Var(iota((n, n), 1, dtypes.f64))
    slot = i * float(n) - i * (i + 1.0) * 0.5 + j - i - 1.0
    return slot, i < j


def _pdist_forward(ctx: Ctx, x: Var, p: float = 2.0) -> Var:
    """torch.pdist: cdist of the rows with themselves, the pairs i < j written in order
    (a SCATTER of the [n, n] distances to their slots; the others go to one extra slot
    dropped afterwards)."""
    d = ctx.out_dtype
    n = x.shape[0]
    k = n * (n - 1) // 2
    if k == 0:
        return _zeros(ctx)
    full = _cdist_forward(_Shaped(ctx, d, (n, n)), x, x, p)
    slot, upper = _pair_slots(n)
    idx = upper.where(slot, float(k)).cast(dtypes.i64).reshape(n * n)
    out = Var(const(0, d, (k + 1,))).scatter(idx, full.reshape(n * n), 0)
    return out.slice((0,), (k,))


def _pdist_backward(ctx: Ctx, grad: Var, x: Var, p: float, pdist: Var) -> Var:
    """Each row's gradient from every pair it is in: the pair's gradient and distance
    read back at its slot for both (i, j) and (j, i), ATen's per-p formula (odd in the
    difference, so row j's share is the negated one), the diagonal zero."""
    d = ctx.out_dtype
    n = x.shape[0]
    if p == 0 or n < 2 or x.shape[1] == 0:
        return _zeros(ctx)
    slot, upper = _pair_slots(n)
    sym = upper.where(slot, slot.permute((1, 0))).maximum(0.0).cast(dtypes.i64)
    off = not_(Var(iota((n, n), 0, dtypes.f64)).eq(Var(iota((n, n), 1, dtypes.f64))))
    g = off.where(grad.cast(d).take(sym.reshape(n * n), 0).reshape((n, n)), 0.0)
    dist = off.where(pdist.cast(d).take(sym.reshape(n * n), 0).reshape((n, n)), 0.0)
    a, b, shape = _pairs(x.cast(d), x.cast(d))
    return _pair_grads(a - b, g, dist, float(p), shape).reshape(ctx.out_shape)


class _Shaped:
    """A context whose result dtype and shape are given (to reuse a translator)."""

    def __init__(self, ctx: Ctx, dtype: Any, shape: tuple[int, ...]) -> None:
        self.out_dtype, self.out_shape = dtype, shape


# One row per ATen op (overload packet).
ROWS: dict[Any, Callable[..., Any]] = {
    aten._cdist_forward: _cdist_forward,
    aten._cdist_backward: _cdist_backward,
    aten._pdist_forward: _pdist_forward,
    aten._pdist_backward: _pdist_backward,
}
