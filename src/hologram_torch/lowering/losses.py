"""Losses and their backward: MSE, binary cross-entropy (with logits), NLL.

One translator per ATen op, ``ROWS`` maps each op to it (see
:mod:`hologram_torch.lowering` for how a translator is written)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hologram.isa import dtypes
from hologram.isa.builder import Var, const
from hologram.ops import composites

from .context import Ctx, Unsupported, as_var, not_

aten = torch.ops.aten


def loss_reduce(per_elem: Var, reduction: int) -> Var:
    # ATen encodes reduction as an int: 0 none, 1 mean, 2 sum.
    return composites.reduce_loss(per_elem, {0: "none", 1: "mean", 2: "sum"}[int(reduction)])


def _mse_loss(ctx: Ctx, x: Var, t: Var, reduction: int = 1) -> Var:
    d = ctx.out_dtype
    return loss_reduce(composites.squared_error(x.cast(d), t.cast(d)), reduction)


def _mse_loss_backward(ctx: Ctx, grad: Var, x: Var, t: Var, reduction: int) -> Var:
    d = ctx.out_dtype
    x, t = x.cast(d), t.cast(d)
    g = 2.0 * (x - t) * as_var(grad, d)
    return g / float(x.v.size) if int(reduction) == 1 else g


def _bce(ctx: Ctx, x: Var, t: Var, weight: Var | None = None, reduction: int = 1) -> Var:
    d = ctx.out_dtype
    loss = composites.binary_cross_entropy(x.cast(d), t.cast(d))
    if weight is not None:
        loss = loss * weight.cast(d)
    return loss_reduce(loss, reduction)


def _bce_backward(ctx: Ctx, grad: Var, x: Var, t: Var, weight: Var | None = None,
                  reduction: int = 1) -> Var:
    d = ctx.out_dtype
    x, t = x.cast(d), t.cast(d)
    # PyTorch's formula, with its 1e-12 floor on x(1-x).
    g = as_var(grad, d) * (x - t) / ((1.0 - x) * x).maximum(1e-12)
    if weight is not None:
        g = g * weight.cast(d)
    return g / float(x.v.size) if int(reduction) == 1 else g


def _bce_logits(ctx: Ctx, x: Var, t: Var, weight: Var | None = None,
                pos_weight: Var | None = None, reduction: int = 1) -> Var:
    d = ctx.out_dtype
    x, t = x.cast(d), t.cast(d)
    softplus_neg = ((-abs(x)).exp() + 1.0).log() + (-x).maximum(0.0)  # log(1 + e^-x)
    if pos_weight is not None:
        loss = (1.0 - t) * x + (1.0 + (pos_weight.cast(d) - 1.0) * t) * softplus_neg
    else:
        loss = (1.0 - t) * x + softplus_neg
    if weight is not None:
        loss = loss * weight.cast(d)
    return loss_reduce(loss, reduction)


def _nll_parts(x: Var, target: Var, weight: Var | None,
               ignore_index: int) -> tuple[Var, Var, tuple[int, int]]:
    """(class index per row as i64 [n, 1], effective per-row weight [n, 1], (rows,
    classes)) of a class-index target.

    Ignored rows index class 0 (their weight is 0); every other target is read by a
    GATHER or SCATTER, which raises IndexError for a class outside ``[0, classes)`` as
    PyTorch does, so no check runs before the program and targets computed inside it
    (the shifted labels of a language model's loss) are checked too."""
    d = x.dtype
    if x.ndim not in (1, 2):
        raise Unsupported(f"nll_loss over {x.ndim}-D input (only 1-D or 2-D)")
    n, c = (1, x.shape[0]) if x.ndim == 1 else x.shape
    tgt = target.reshape(n, 1)
    valid = not_(tgt.eq(float(ignore_index)))  # (n, 1)
    idx = valid.where(tgt, 0.0).cast(dtypes.i64)
    if weight is not None:
        w_row = weight.cast(d).reshape(1, c).expand((n, c)).gather(idx, 1)
    else:
        w_row = Var(const(1.0, d, (n, 1)))
    w_eff = valid.where(w_row, 0.0)  # (n, 1)
    return idx, w_eff, (n, c)


def _nll_loss_forward(ctx: Ctx, x: Var, target: Var, weight: Var | None, reduction: int,
                      ignore_index: int) -> tuple[Var, Var]:
    d = ctx.out_dtype
    x = x.cast(d)
    idx, w_eff, (n, c) = _nll_parts(x.reshape(-1, x.shape[-1]) if x.ndim else x,
                                    target, weight, ignore_index)
    picked = x.reshape(n, c).gather(idx, 1)  # (n, 1): one read per row, not a row sum
    per_row = -(picked * w_eff)
    total = w_eff.sum()
    red = int(reduction)
    if red == 0:
        out = per_row.reshape(ctx.out[0].shape)
    elif red == 2:
        out = per_row.sum()
    else:
        out = per_row.sum() / total
    tw = total.reshape(ctx.out[1].shape) if ctx.out[1].numel == 1 else \
        Var(const(0.0, d, ctx.out[1].shape))
    return out, tw


def _nll_loss_backward(ctx: Ctx, grad: Var, x: Var, target: Var, weight: Var | None,
                       reduction: int, ignore_index: int, total_weight: Var) -> Var:
    d = ctx.out_dtype
    x = x.cast(d)
    idx, w_eff, (n, c) = _nll_parts(x, target, weight, ignore_index)
    g = as_var(grad, d)
    red = int(reduction)
    if red == 0 and g.ndim > 0:
        g = g.reshape(n, 1)
    elif red == 1:
        g = g / total_weight.cast(d)
    # d loss / d x[i, c] = -g_i * w[target_i] where c == target_i, zero elsewhere.
    zeros = Var(const(0.0, d, (n, c)))
    gi = zeros.scatter(idx, (-(g * w_eff)).expand((n, 1)), 1)
    return gi.reshape(ctx.out_shape)


# One row per ATen op (overload packet).
ROWS: dict[Any, Callable[..., Any]] = {
    aten.mse_loss: _mse_loss,
    aten.mse_loss_backward: _mse_loss_backward,
    aten.binary_cross_entropy: _bce,
    aten.binary_cross_entropy_backward: _bce_backward,
    aten.binary_cross_entropy_with_logits: _bce_logits,
    aten.nll_loss_forward: _nll_loss_forward,
    aten.nll_loss_backward: _nll_loss_backward,
}
