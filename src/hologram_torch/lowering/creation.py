"""Tensors made from nothing but a value and a shape: full, zeros, ones, fill.

One translator per ATen op, ``ROWS`` maps each op to it (see
:mod:`hologram_torch.lowering` for how a translator is written)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hologram.isa.builder import Var

from .context import Ctx, Unsupported, as_var

aten = torch.ops.aten


def _fill_from(pos: int | None) -> Callable[..., Var]:
    """Constant fills; ``pos`` is where the fill value sits in the arguments."""

    def tr(ctx: Ctx, *args: Any, **kwargs: Any) -> Var:
        value = kwargs.get("fill_value", args[pos] if pos is not None else None)
        if isinstance(value, Var):
            raise Unsupported("fill value is a tensor")
        return as_var(value, ctx.out_dtype).expand(ctx.out_shape)

    return tr


def _const_fill(value: float) -> Callable[..., Var]:
    def tr(ctx: Ctx, *args: Any, **kwargs: Any) -> Var:
        return as_var(value, ctx.out_dtype).expand(ctx.out_shape)

    return tr


# One row per ATen op (overload packet).
ROWS: dict[Any, Callable[..., Any]] = {
    aten.full: _fill_from(1),
    aten.full_like: _fill_from(1),
    aten.fill: _fill_from(1),  # the functional fill.Scalar (a tensor value: Unsupported)
    # Contents unspecified: zeros are as valid as any (AOT's joint export writes
    # full_like as empty_like + fill).
    aten.empty_like: _const_fill(0.0),
    aten.new_full: _fill_from(2),
    aten.scalar_tensor: _fill_from(0),
    aten.zeros: _const_fill(0.0),
    aten.zeros_like: _const_fill(0.0),
    aten.new_zeros: _const_fill(0.0),
    aten.ones: _const_fill(1.0),
    aten.ones_like: _const_fill(1.0),
    aten.new_ones: _const_fill(1.0),
}
