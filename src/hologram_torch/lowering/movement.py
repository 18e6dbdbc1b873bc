"""Views and re-indexing: reshape, transpose, permute, expand, slices, split and
cat, and the identity-like ops (detach, clone, alias).

One translator per ATen op, ``ROWS`` maps each op to it (see
:mod:`hologram_torch.lowering` for how a translator is written)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from hologram.isa.builder import Var, concat, const
from hologram.isa.value import Value

from .context import Ctx, Unsupported, as_var

aten = torch.ops.aten


def _reshape_to_out(ctx: Ctx, x: Var, *args: Any, **kwargs: Any) -> Var:
    return x.reshape(ctx.out_shape)


def _expand(ctx: Ctx, x: Var, *args: Any, **kwargs: Any) -> Var:
    return x.expand(ctx.out_shape)


def _t(ctx: Ctx, x: Var) -> Var:
    return x.T if x.ndim == 2 else x


def _transpose(ctx: Ctx, x: Var, d0: int, d1: int) -> Var:
    if x.ndim < 2:
        return x
    perm = list(range(x.ndim))
    perm[d0 % x.ndim], perm[d1 % x.ndim] = perm[d1 % x.ndim], perm[d0 % x.ndim]
    return x.permute(tuple(perm))


def _permute(ctx: Ctx, x: Var, dims: Sequence[int]) -> Var:
    return x.permute(tuple(d % x.ndim for d in dims)) if x.ndim else x


def _axis(x: Var, dim: int) -> int:
    if x.ndim == 0:
        raise Unsupported("slicing a 0-d tensor")
    return dim % x.ndim


def _window(ctx: Ctx, x: Var, dim: int, start: int) -> Var:
    """``x`` narrowed along ``dim`` to ATen's result size from ``start`` (Python's
    rules: a negative start counts from the end, out-of-range starts clamp)."""
    d = _axis(x, dim)
    n = x.shape[d]
    lo = min(max(start + n if start < 0 else start, 0), n)
    return x.slice(tuple(lo if a == d else 0 for a in range(x.ndim)), ctx.out_shape)


def _slice(ctx: Ctx, x: Var, dim: int = 0, start: int | None = None, end: int | None = None,
           step: int = 1) -> Var:
    if step != 1:
        raise Unsupported(f"slice with step {step} (the ISA's SLICE takes step 1)")
    return _window(ctx, x, dim, 0 if start is None else start)


def _narrow(ctx: Ctx, x: Var, dim: int, start: Any, length: int) -> Var:
    if not isinstance(start, int):
        raise Unsupported("narrow with a tensor start (a data-dependent slice)")
    return _window(ctx, x, dim, start)


def _split(ctx: Ctx, x: Var, _sizes: Any, dim: int = 0) -> tuple[Var, ...]:
    """split, split_with_sizes and chunk: consecutive slices, sized as ATen's results
    are (which settles chunk's and split's rounding once, in PyTorch)."""
    d = _axis(x, dim)
    return tuple(x.split([o.shape[d] for o in ctx.out], d))


def _cat(ctx: Ctx, tensors: Sequence[Any], dim: int = 0) -> Var:
    """``torch.cat``, in the result's dtype; PyTorch's legacy 1-D empty operands (shape
    [0] beside higher-rank tensors) are skipped as it skips them."""
    out_ndim = len(ctx.out_shape)
    parts = [as_var(t, ctx.out_dtype).v for t in tensors
             if not (isinstance(t, Var) and t.shape == (0,) and out_ndim != 1)]
    if not parts:
        raise Unsupported("cat of nothing but legacy empty tensors")
    return Var(concat(parts, dim % out_ndim))


def _slice_backward(ctx: Ctx, grad: Var, input_sizes: Sequence[int], dim: int, start: int,
                    end: int, step: int) -> Var:
    """The gradient of a slice: ``grad`` in its window, zeros around it (a CONCAT with
    constant parts, which read no memory)."""
    if step != 1:
        raise Unsupported(f"slice_backward with step {step} (the ISA's SLICE takes step 1)")
    shape = tuple(input_sizes)
    d = dim % len(shape)
    n = shape[d]
    lo = min(max(start + n if start < 0 else start, 0), n)
    g = as_var(grad, ctx.out_dtype)

    def zeros(size: int) -> Value:
        return const(0, g.dtype, (*shape[:d], size, *shape[d + 1:]))

    parts = [p for p in (zeros(lo), g.v, zeros(n - lo - g.shape[d])) if p.shape[d]]
    return Var(concat(parts or [g.v], d))


def _identity(ctx: Ctx, x: Var, *args: Any, **kwargs: Any) -> Var:
    return x


# One row per ATen op (overload packet).
ROWS: dict[Any, Callable[..., Any]] = {
    aten.t: _t,
    aten.transpose: _transpose,
    aten.permute: _permute,
    aten.view: _reshape_to_out,
    aten.reshape: _reshape_to_out,
    aten._unsafe_view: _reshape_to_out,
    aten.unsqueeze: _reshape_to_out,
    aten.squeeze: _reshape_to_out,
    aten.expand: _expand,
    aten.slice: _slice,
    aten.narrow: _narrow,
    aten.split: _split,
    aten.split_with_sizes: _split,
    aten.chunk: _split,
    aten.cat: _cat,
    aten.slice_backward: _slice_backward,
    aten.detach: _identity,
    aten.clone: _identity,
    aten.alias: _identity,
    aten.lift_fresh_copy: _identity,
}
