"""Matrix products: mm, addmm, addbmm, bmm, matmul, mv and dot, as (batched) GEMMs;
_trilinear (F.bilinear) as a fused product and sum.

One translator per ATen op, ``ROWS`` maps each op to it (see
:mod:`hologram_torch.lowering` for how a translator is written)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hologram.isa.builder import Var, broadcast_shape, make
from hologram.isa.opcodes import Op
from hologram.isa.value import Value

from .context import Ctx, as_var

aten = torch.ops.aten


def _mm(ctx: Ctx, a: Var, b: Var) -> Var:
    d = ctx.out_dtype
    return a.cast(d) @ b.cast(d)


def _addmm(ctx: Ctx, bias: Var, a: Var, b: Var, *, beta: Any = 1, alpha: Any = 1) -> Var:
    d = ctx.out_dtype
    r = a.cast(d) @ b.cast(d)
    if alpha != 1:
        r = r * float(alpha)
    if beta == 0:
        return r
    c = as_var(bias, d)
    return r + (c * float(beta) if beta != 1 else c)


def _unmerged(v: Value) -> Value | None:
    """``v`` (shape [B, r, c]) as the value ``u`` of shape [*batch, r, c] it was
    flattened from (prod(batch) == B), or None when it was not.

    ``torch.matmul`` on 4-D operands (attention's ``q @ k.transpose(-2, -1)``) reaches
    the graph as bmm of ``_unsafe_view(expand(transpose(...)), [B, r, c])``: a reshape
    that merges batch axes. Merging a head axis into the batch axis of a permuted
    tensor is not a strided view, so a GEMM reading it would need a copy; the
    unmerged operand is one (a permute over a buffer), which a strided-batch GEMM
    reads in place. A transpose of the last two axes on top of the reshape (the
    backward graph's ``bmm(transpose(view), ...)``) is looked through as well.
    """
    if v.op is Op.PERMUTE and v.attr("perm") == (0, 2, 1):
        u = _unmerged(v.srcs[0])
        if u is None:
            return None
        return make(Op.PERMUTE, (u,), {"perm": (*range(u.ndim - 2), u.ndim - 1, u.ndim - 2)})
    if v.op is Op.RESHAPE:
        u = v.srcs[0]
        if u.ndim > 3 and u.shape[-2:] == v.shape[-2:] and math.prod(u.shape[:-2]) == v.shape[0]:
            return u
    return None


def batched_gemm(a: Var, b: Var) -> Var:
    """``a [B, m, k] @ b [B, k, n]`` as one batched GEMM, over the operands' unmerged
    batch axes where their reshapes merged some (see :func:`_unmerged`): splitting an
    axis is always a view, merging one may not be."""
    (bs, m, _), n = a.shape, b.shape[2]
    ua, ub = _unmerged(a.v), _unmerged(b.v)
    batch = next((u.shape[:-2] for u in (ua, ub) if u is not None), None)
    if batch is None or any(u is not None and u.shape[:-2] != batch for u in (ua, ub)):
        return a @ b  # nothing to unmerge, or two different splits: the 3-D product
    pa = Var(ua) if ua is not None else a.reshape((*batch, *a.shape[1:]))
    pb = Var(ub) if ub is not None else b.reshape((*batch, *b.shape[1:]))
    return (pa @ pb).reshape(bs, m, n)


def _bmm(ctx: Ctx, a: Var, b: Var) -> Var:
    d = ctx.out_dtype
    return batched_gemm(a.cast(d), b.cast(d))


def _matmul(ctx: Ctx, a: Var, b: Var) -> Var:
    """``torch.matmul``: NumPy's rules (1-D operands, broadcast batch dims), which the
    builder spells as RESHAPE/EXPAND before one GEMM. AOT autograd normally decomposes
    matmul into mm/bmm before the graph reaches us; this row covers graphs that keep it."""
    d = ctx.out_dtype
    return a.cast(d) @ b.cast(d)


def _addbmm(ctx: Ctx, bias: Any, b1: Var, b2: Var, *, beta: Any = 1, alpha: Any = 1) -> Var:
    """``beta * input + alpha * sum_b b1[b] @ b2[b]``: one GEMM over the batch and inner
    dims merged (``[n, B m] @ [B m, p]``)."""
    d = ctx.out_dtype
    nb, n, m = b1.shape
    p = b2.shape[-1]
    lhs = b1.cast(d).permute((1, 0, 2)).reshape((n, nb * m))
    r = lhs @ b2.cast(d).reshape((nb * m, p))
    if alpha != 1:
        r = r * float(alpha)
    if beta == 0:
        return r
    c = as_var(bias, d).expand(ctx.out_shape)
    return r + (c * float(beta) if beta != 1 else c)


def _trilinear(ctx: Ctx, i1: Var, i2: Var, i3: Var, expand1: Sequence[int],
               expand2: Sequence[int], expand3: Sequence[int], sumdim: Sequence[int],
               unroll_dim: int = 1) -> Var:
    """ATen's ``_trilinear`` (F.bilinear and its backward): each operand with unit dims
    put in at its ``expand`` positions, the broadcast product summed over ``sumdim``:
    one fused reduction (no GEMM; the product is never stored)."""
    d = ctx.out_dtype
    total = i1.ndim + len(expand1)

    def spread(x: Var, expand: Sequence[int]) -> Var:
        shape, it = [], iter(x.shape)
        for k in range(total):
            shape.append(1 if k in set(expand) else next(it))
        return x.cast(d).reshape(tuple(shape))

    a, b, c = spread(i1, expand1), spread(i2, expand2), spread(i3, expand3)
    full = broadcast_shape(a.shape, b.shape, c.shape)
    prod = a.expand(full) * b.expand(full) * c.expand(full)
    if sumdim:
        prod = prod.sum(tuple(sumdim))
    return prod.reshape(ctx.out_shape)


# One row per ATen op (overload packet).
ROWS: dict[Any, Callable[..., Any]] = {
    aten.addbmm: _addbmm,
    aten._trilinear: _trilinear,
    aten.mm: _mm,
    aten.addmm: _addmm,
    aten.bmm: _bmm,
    aten.matmul: _matmul,
    # vector products: the same GEMM with a 1-D operand (real dtypes: vdot is dot)
    aten.mv: _matmul,
    aten.dot: _matmul,
    aten.vdot: _matmul,
}
