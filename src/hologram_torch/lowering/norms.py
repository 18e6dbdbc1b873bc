"""Normalizations: softmax and log-softmax, layer norm, forward and backward.

One translator per ATen op, ``ROWS`` maps each op to it (see
:mod:`hologram_torch.lowering` for how a translator is written)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hologram.isa.builder import Var
from hologram.ops import composites

from ..fx_info import TInfo
from .context import Ctx, isa_dtype

aten = torch.ops.aten


def _rows(*xs: Var) -> tuple[Var, ...]:
    """A 0-d operand as one row of one element (ATen's softmax of a scalar is over that
    element; the ISA's reductions need an axis)."""
    return tuple(x.reshape(1) if x.ndim == 0 else x for x in xs)


def _softmax(ctx: Ctx, x: Var, dim: int, half_to_float: bool = False) -> Var:
    (x1,) = _rows(x.cast(ctx.out_dtype))
    return composites.softmax(x1, dim % x1.ndim).reshape(ctx.out_shape)


def _log_softmax(ctx: Ctx, x: Var, dim: int, half_to_float: bool = False) -> Var:
    (x1,) = _rows(x.cast(ctx.out_dtype))
    return composites.log_softmax(x1, dim % x1.ndim).reshape(ctx.out_shape)


def _softmax_backward(ctx: Ctx, grad: Var, out: Var, dim: int, input_dtype: Any = None) -> Var:
    d = ctx.out_dtype
    g, y = _rows(grad.cast(d), out.cast(d))
    return (y * (g - (g * y).sum(dim % g.ndim, keepdims=True))).reshape(ctx.out_shape)


def _log_softmax_backward(ctx: Ctx, grad: Var, out: Var, dim: int,
                          input_dtype: Any = None) -> Var:
    d = ctx.out_dtype
    g, y = _rows(grad.cast(d), out.cast(d))
    return (g - y.exp() * g.sum(dim % g.ndim, keepdims=True)).reshape(ctx.out_shape)


def _layer_norm(ctx: Ctx, x: Var, normalized_shape: Sequence[int], weight: Var | None,
                bias: Var | None, eps: float) -> tuple[Var, Var, Var]:
    d = ctx.out_dtype
    x = x.cast(d)
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    mean = x.mean(axes, keepdims=True)
    dev = x - mean
    rstd = ((dev * dev).mean(axes, keepdims=True) + float(eps)).rsqrt()
    y = dev * rstd
    if weight is not None:
        y = y * weight.cast(d)
    if bias is not None:
        y = y + bias.cast(d)
    stat_shape = ctx.out[1].shape
    return y, mean.reshape(stat_shape), rstd.reshape(stat_shape)


def _layer_norm_backward(ctx: Ctx, grad_out: Var, x: Var, normalized_shape: Sequence[int],
                         mean: Var, rstd: Var, weight: Var | None, bias: Var | None,
                         output_mask: Sequence[bool]) -> tuple[Var | None, ...]:
    d = isa_dtype(next(i for i in ctx.out if isinstance(i, TInfo)).dtype)
    g, x = grad_out.cast(d), x.cast(d)
    k = len(normalized_shape)
    axes = tuple(range(x.ndim - k, x.ndim))
    lead = tuple(range(x.ndim - k))
    keep = tuple(x.shape[: x.ndim - k]) + (1,) * k
    mean, rstd = mean.cast(d).reshape(keep), rstd.cast(d).reshape(keep)
    x_hat = (x - mean) * rstd
    n = float(math.prod(normalized_shape))
    results: list[Var | None] = [None, None, None]
    if output_mask[0]:
        gw = g * weight.cast(d) if weight is not None else g
        s1 = gw.sum(axes, keepdims=True)
        s2 = (gw * x_hat).sum(axes, keepdims=True)
        results[0] = (rstd / n) * (n * gw - s1 - x_hat * s2)
    if output_mask[1] and weight is not None:
        results[1] = (g * x_hat).sum(lead).reshape(tuple(normalized_shape)) if lead else \
            (g * x_hat).reshape(tuple(normalized_shape))
    if output_mask[2] and bias is not None:
        results[2] = g.sum(lead).reshape(tuple(normalized_shape)) if lead else \
            g.reshape(tuple(normalized_shape))
    return tuple(results)


# One row per ATen op (overload packet).
ROWS: dict[Any, Callable[..., Any]] = {
    aten._softmax: _softmax,
    aten._log_softmax: _log_softmax,
    aten._softmax_backward_data: _softmax_backward,
    aten._log_softmax_backward_data: _log_softmax_backward,
    aten.native_layer_norm: _layer_norm,
    aten.native_layer_norm_backward: _layer_norm_backward,
}
