"""Reductions over dims: sum, mean, amax/amin, var and var_mean.

One translator per ATen op, ``ROWS`` maps each op to it (see
:mod:`hologram_torch.lowering` for how a translator is written)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from hologram.isa.builder import Var

from .context import Ctx, dims

aten = torch.ops.aten


def _reduce_as(method: str) -> Callable[..., Var]:
    def fn(ctx: Ctx, x: Var, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Var:
        x = x.cast(ctx.out_dtype)  # a bool count sums in the (integer, so f64) result
        if x.ndim == 0:
            return x
        r = getattr(x, method)(dims(x, dim), keepdims=bool(keepdim))
        return r.reshape(ctx.out_shape)

    return fn


def _var_of(x: Var, dims: tuple[int, ...], correction: float, keepdim: bool) -> tuple[Var, Var]:
    n = math.prod(x.shape[d] for d in dims)
    mean = x.mean(dims, keepdims=True)
    dev = x - mean
    var = (dev * dev).sum(dims, keepdims=True) / float(max(n - correction, 0))
    if not keepdim:
        keep = tuple(s for i, s in enumerate(x.shape) if i not in dims)
        var, mean = var.reshape(keep), mean.reshape(keep)
    return var, mean


def _var_correction(ctx: Ctx, x: Var, dim: Any = None, *, correction: Any = None,
                    keepdim: bool = False) -> Var:
    x = x.cast(ctx.out_dtype)
    return _var_of(x, dims(x, dim), 1.0 if correction is None else float(correction),
                   keepdim)[0]


def _var_mean_correction(ctx: Ctx, x: Var, dim: Any = None, *, correction: Any = None,
                         keepdim: bool = False) -> tuple[Var, Var]:
    x = x.cast(ctx.out_dtype)
    return _var_of(x, dims(x, dim), 1.0 if correction is None else float(correction), keepdim)


# One row per ATen op (overload packet).
ROWS: dict[Any, Callable[..., Any]] = {
    aten.sum: _reduce_as("sum"),
    aten.mean: _reduce_as("mean"),
    aten.amax: _reduce_as("max"),
    aten.amin: _reduce_as("min"),
    aten.var: _var_correction,
    aten.var_mean: _var_mean_correction,
}
