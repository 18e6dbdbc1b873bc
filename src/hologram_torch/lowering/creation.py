"""Tensors made from nothing but a value and a shape: full, zeros, ones, fill, arange,
linspace, logspace, eye.

One translator per ATen op, ``ROWS`` maps each op to it (see
:mod:`hologram_torch.lowering` for how a translator is written)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hologram.isa import dtypes
from hologram.isa.builder import Var, iota

from .context import Ctx, Unsupported, as_var, isa_dtype
from .elementwise import convert

aten = torch.ops.aten


def _fill_from(pos: int | None) -> Callable[..., Var]:
    """Constant fills; ``pos`` is where the fill value sits in the arguments."""

    def tr(ctx: Ctx, *args: Any, **kwargs: Any) -> Var:
        value = kwargs.get("fill_value", args[pos] if pos is not None else None)
        if isinstance(value, Var):
            # fill.Tensor: ATen requires a 0-d value (an indexed assignment of a
            # Python number, e.g. torchvision's Swin attention mask, traces to one).
            if value.shape != ():
                raise Unsupported(f"fill value of shape {value.shape}")
            return convert(value, ctx.out.dtype).expand(ctx.out_shape)
        return as_var(value, ctx.out_dtype).expand(ctx.out_shape)

    return tr


def _const_fill(value: float) -> Callable[..., Var]:
    def tr(ctx: Ctx, *args: Any, **kwargs: Any) -> Var:
        return as_var(value, ctx.out_dtype).expand(ctx.out_shape)

    return tr


def _arange(ctx: Ctx, *args: Any, **kwargs: Any) -> Var:
    """arange(end), arange(start, end) and arange(start, end, step): ``start + step * i``
    in f64 (ATen's CPU accumulator for float results), rounded to the result's dtype;
    integer results ride as f64 and are exact. The length is ATen's (the node's)."""
    overload = getattr(ctx.node.target, "_overloadname", "default")
    given = [a for a in args if not isinstance(a, torch.dtype)]
    if overload == "default":
        start, step = 0, 1
    elif overload == "start":
        start, step = given[0], 1
    elif overload == "start_step":
        start, step = given[0], given[2] if len(given) > 2 else kwargs.get("step", 1)
    else:
        raise Unsupported(f"arange.{overload}")
    if any(isinstance(v, Var) for v in (start, step, *given)):
        raise Unsupported("arange with tensor bounds")
    (n,) = ctx.out_shape
    i = Var(iota((n,), 0, dtypes.f64))
    return (i * float(step) + float(start)).cast(ctx.out_dtype)


def _ramp(ctx: Ctx, start: Any, end: Any, steps: int) -> Var:
    """ATen's linspace values in the result's precision (f64 for integer results, where
    ATen steps in double): ``start + step * i`` for the first half, ``end - step *
    (steps - 1 - i)`` for the rest, ``step = (end - start) / (steps - 1)``; one step is
    ``start``. Bounds may be 0-d tensors (linspace.Tensor_Tensor and friends); for an
    integer result ATen first converts them to it (truncation)."""
    td = ctx.out.dtype
    d = isa_dtype(td) if td.is_floating_point else dtypes.f64
    lo, hi = (as_var(v, d) if td.is_floating_point else convert(as_var(v, d), td)
              for v in (start, end))
    i = Var(iota((steps,), 0, d))
    if steps == 1:
        return lo.expand((1,))
    step = (hi - lo) / float(steps - 1)
    return (i < float(steps // 2)).where(lo + step * i, hi - step * (float(steps - 1) - i))


def _linspace(ctx: Ctx, start: Any, end: Any, steps: int, **kwargs: Any) -> Var:
    return convert(_ramp(ctx, start, end, steps), ctx.out.dtype)


def _logspace(ctx: Ctx, start: Any, end: Any, steps: int, base: float = 10.0,
              **kwargs: Any) -> Var:
    """``base ** linspace(start, end, steps)`` as ATen computes it (pow per element)."""
    ramp = _ramp(ctx, start, end, steps)
    return convert(as_var(float(base), ramp.dtype).expand(ramp.shape) ** ramp, ctx.out.dtype)


def _eye(ctx: Ctx, n: int, m: int | None = None, **kwargs: Any) -> Var:
    """Ones where the row and column coordinates (IOTA) agree."""
    shape = ctx.out_shape
    diag = Var(iota(shape, 0, dtypes.f64)).eq(Var(iota(shape, 1, dtypes.f64)))
    return diag.cast(ctx.out_dtype)


# One row per ATen op (overload packet).
ROWS: dict[Any, Callable[..., Any]] = {
    aten.full: _fill_from(1),
    aten.full_like: _fill_from(1),
    aten.fill: _fill_from(1),  # the functional fill.Scalar and fill.Tensor (a 0-d value)
    # Contents unspecified: zeros are as valid as any (AOT's joint export writes
    # full_like as empty_like + fill).
    aten.empty_like: _const_fill(0.0),
    aten.empty: _const_fill(0.0),  # empty.memory_format: contiguous, like the program's
    aten.new_empty: _const_fill(0.0),
    aten.new_empty_strided: _const_fill(0.0),  # the traced strides: the layout step's
    aten.empty_permuted: _const_fill(0.0),
    aten.zero: _const_fill(0.0),  # the functional zero_
    aten._efficientzerotensor: _const_fill(0.0),
    aten.new_full: _fill_from(2),
    aten.scalar_tensor: _fill_from(0),
    aten.zeros: _const_fill(0.0),
    aten.zeros_like: _const_fill(0.0),
    aten.new_zeros: _const_fill(0.0),
    aten.ones: _const_fill(1.0),
    aten.ones_like: _const_fill(1.0),
    aten.new_ones: _const_fill(1.0),
    aten.arange: _arange,
    aten.linspace: _linspace,
    aten.logspace: _logspace,
    aten.eye: _eye,
}
