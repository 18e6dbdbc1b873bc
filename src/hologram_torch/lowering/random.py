"""Random ops: native_dropout, bernoulli, rand/randn and their ``_like`` forms, uniform,
normal.

Each draws from hologram's counter-based generator (:mod:`hologram.ops.random_bits`),
keyed by ``ctx.random_key()``: a seed the backend draws from torch's default generator
at every call (so ``torch.manual_seed`` makes a compiled model repeat itself) and a
stream of the node's own. The generator is a hash of each element's position, so
fusion computes it inside the kernel that uses it: a training step's dropout stays in
the program around it instead of splitting it in two around a PyTorch op.

The numbers are not eager's: the same distributions, other draws (Inductor's differ
from eager's too). A dropout's mask is one of its results, so its backward
(``native_dropout_backward``, decomposed to a product with the mask) uses the same
draw. An explicit ``generator=`` runs in PyTorch: that generator's state is the
caller's, and only PyTorch advances it.

One translator per ATen op, ``ROWS`` maps each op to it (see
:mod:`hologram_torch.lowering` for how a translator is written).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hologram.isa import dtypes
from hologram.isa.builder import Var
from hologram.isa.dtypes import DType
from hologram.ops import random_bits

from ..fx_info import HALF
from .context import Ctx, Unsupported, as_var, isa_dtype

aten = torch.ops.aten


def _key(ctx: Ctx, generator: Any, shape: tuple[int, ...]) -> tuple[Var, int]:
    if generator is not None:
        raise Unsupported("an explicit generator= (its state is advanced by PyTorch only)")
    try:
        random_bits.check_size(shape)
    except ValueError as e:
        raise Unsupported(str(e)) from None
    return ctx.random_key()


def _float_out(ctx: Ctx) -> DType:
    """The dtype of a random op's draws. 16-bit floats are refused: their values ride
    in f32 and are rounded at the op's end, which would carry a uniform draw just below
    1 up to 1 (eager keeps ``rand`` in [0, 1)); dropout's mask is a comparison, not a
    drawn value, and stays."""
    td = ctx.first_out.dtype
    if not td.is_floating_point or td in HALF:
        raise Unsupported(f"random numbers of dtype {td}")
    return ctx.out_dtype


def _work(d: DType) -> DType:
    """The dtype numbers are drawn and compared in: f64 for f64, else f32 (half floats'
    few bits would make probabilities coarse)."""
    return dtypes.f64 if d is dtypes.f64 else dtypes.f32


def _uniform01(ctx: Ctx, d: DType, generator: Any = None) -> Var:
    shape = ctx.out_shape
    seed, stream = _key(ctx, generator, shape)
    return random_bits.uniform(seed, shape, d, stream)


def _native_dropout(ctx: Ctx, x: Var, p: float, train: bool | None = None) -> tuple[Var, Var]:
    """ATen's CPU dropout: ``mask = bernoulli(1 - p)``, ``out = x * mask * scale`` with
    ``scale = 1 / (1 - p)`` (0 when p is 1), the products in ``x``'s dtype."""
    if train is False:
        return x, as_var(True, isa_dtype(ctx.out[1].dtype)).expand(x.shape)
    if not 0.0 <= p <= 1.0:
        raise Unsupported(f"dropout probability {p} is not in [0, 1]")
    keep_p = 1.0 - p
    u = _uniform01(ctx, dtypes.f32)
    keep = u < float(keep_p)
    scale = 0.0 if keep_p == 0 else 1.0 / keep_p
    out = (x * keep.cast(x.dtype)) * scale
    mask_dtype = isa_dtype(ctx.out[1].dtype)  # bool; f32 when x is empty (ATen's quirk)
    return out, keep.cast(mask_dtype) if mask_dtype is not dtypes.boolean else keep


def _bernoulli(ctx: Ctx, x: Var, p: Any = None, *, generator: Any = None) -> Var:
    """bernoulli (the probabilities are ``x``), bernoulli.p (a number) and
    bernoulli.Tensor (a tensor of them, broadcast to ``x``)."""
    d = _float_out(ctx)
    w = _work(d)
    probs = x if p is None else p
    u = _uniform01(ctx, w, generator)
    return (u < as_var(probs, w)).cast(d)


def _rand(ctx: Ctx, *args: Any, generator: Any = None, **kwargs: Any) -> Var:
    """rand, rand_like: uniform in [0, 1), every value exact in the result's dtype."""
    return _uniform01(ctx, _float_out(ctx), generator)


def _randn(ctx: Ctx, *args: Any, generator: Any = None, **kwargs: Any) -> Var:
    """randn, randn_like: standard normal (Box-Muller)."""
    d = _float_out(ctx)
    seed, stream = _key(ctx, generator, ctx.out_shape)
    return random_bits.normal(seed, ctx.out_shape, d, stream)


def _uniform(ctx: Ctx, x: Var, low: float = 0.0, high: float = 1.0, *,
             generator: Any = None) -> Var:
    """The functional uniform_: ``low + (high - low) * u``."""
    d = _float_out(ctx)
    u = _uniform01(ctx, _work(d), generator)
    return (u * float(high - low) + float(low)).cast(d)


def _normal(ctx: Ctx, mean: Any = 0.0, std: Any = 1.0, *args: Any, generator: Any = None,
            **kwargs: Any) -> Var:
    """normal's overloads (mean and std numbers or tensors; float_float's size is the
    result's shape): ``mean + std * z``."""
    d = _float_out(ctx)
    w = _work(d)
    seed, stream = _key(ctx, generator, ctx.out_shape)
    z = random_bits.normal(seed, ctx.out_shape, w, stream)
    return (z * as_var(std, w) + as_var(mean, w)).cast(d)


def _normal_functional(ctx: Ctx, x: Var, mean: float = 0.0, std: float = 1.0, *,
                       generator: Any = None) -> Var:
    """The functional normal_ (``x`` gives only the shape and dtype)."""
    return _normal(ctx, mean, std, generator=generator)


ROWS: dict[Any, Callable[..., Any]] = {
    aten.native_dropout: _native_dropout,
    aten.bernoulli: _bernoulli,
    aten.rand: _rand,
    aten.rand_like: _rand,
    aten.randn: _randn,
    aten.randn_like: _randn,
    aten.uniform: _uniform,
    aten.normal: _normal,
    aten.normal_functional: _normal_functional,
}
