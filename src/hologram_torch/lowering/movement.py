"""Views and re-indexing: reshape, transpose, permute, expand, slices, split and
cat, and the identity-like ops (detach, clone, alias).

One translator per ATen op, ``ROWS`` maps each op to it (see
:mod:`hologram_torch.lowering` for how a translator is written)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hologram.isa import dtypes
from hologram.isa.builder import Var, concat, const, iota
from hologram.isa.value import Value

from .context import Ctx, Unsupported, as_var
from .index import strided_place, strided_slice

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
    if step != 1:  # not a view in the ISA: a GATHER at start + step * k
        d = _axis(x, dim)
        n, s = x.shape[d], 0 if start is None else start
        return strided_slice(x, d, min(max(s + n if s < 0 else s, 0), n), step, ctx.out_shape)
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
    shape = tuple(input_sizes)
    d = dim % len(shape)
    n = shape[d]
    lo = min(max(start + n if start < 0 else start, 0), n)
    g = as_var(grad, ctx.out_dtype)
    if step != 1:  # a SCATTER at start + step * k
        return strided_place(g, shape, d, lo, step)

    def zeros(size: int) -> Value:
        return const(0, g.dtype, (*shape[:d], size, *shape[d + 1:]))

    parts = [p for p in (zeros(lo), g.v, zeros(n - lo - g.shape[d])) if p.shape[d]]
    return Var(concat(parts or [g.v], d))


def pad_with(y: Var, pads: Sequence[int], fill: Value) -> Var:
    """``y`` padded with ``fill`` (a 0-d CONST of ``y``'s dtype): pairs (before, after)
    from the last dim back, as ``F.pad``. A negative pad crops (a SLICE window); a
    positive one is a constant part of a CONCAT (computed where it is read, no memory)."""
    for k in range(len(pads) // 2):
        axis = y.ndim - 1 - k
        lo, hi = int(pads[2 * k]), int(pads[2 * k + 1])
        n = y.shape[axis]
        start, stop = max(0, -lo), n - max(0, -hi)
        if (start, stop) != (0, n):
            y = y.slice(tuple(start if a == axis else 0 for a in range(y.ndim)),
                        tuple(stop - start if a == axis else s for a, s in enumerate(y.shape)))

        def part(size: int, shape: tuple[int, ...] = y.shape, axis: int = axis) -> Value:
            return const(fill.attr("value"), fill.dtype, (*shape[:axis], size, *shape[axis + 1:]))

        parts = [p for p in (part(max(0, lo)), y.v, part(max(0, hi))) if p.shape[axis]]
        y = Var(concat(parts or [y.v], axis))
    return y


def _constant_pad_nd(ctx: Ctx, x: Var, pad: Sequence[int], value: Any = 0) -> Var:
    """``F.pad(x, pad, value=value)`` (see :func:`pad_with`)."""
    d = ctx.out_dtype
    y = x.cast(d)
    if len(pad) % 2 or len(pad) // 2 > y.ndim:
        raise Unsupported(f"pad {list(pad)} for a {y.ndim}-d tensor")
    if 0 in ctx.out_shape:
        return as_var(value, d).expand(ctx.out_shape)
    return pad_with(y, pad, as_var(value, d).v)


def _repeat(ctx: Ctx, x: Var, repeats: Sequence[int]) -> Var:
    """``x.repeat(*repeats)``: each dim of size s as (1, s) expanded to (r, s), then the
    pairs merged: one EXPAND and two RESHAPEs, no copy until a kernel reads it."""
    reps = [int(r) for r in repeats]
    shape = (1,) * (len(reps) - x.ndim) + tuple(x.shape)
    if 0 in ctx.out_shape:
        return as_var(0, ctx.out_dtype).expand(ctx.out_shape)
    pairs = [k for s in shape for k in (1, s)]
    tiled = [k for r, s in zip(reps, shape, strict=True) for k in (r, s)]
    return x.cast(ctx.out_dtype).reshape(pairs).expand(tiled).reshape(ctx.out_shape)


def _roll(ctx: Ctx, x: Var, shifts: Sequence[int], dims: Sequence[int] = ()) -> Var:
    """``torch.roll``: per dim, the last ``shift`` elements then the rest (a CONCAT of two
    SLICE windows); no dims rolls the flattened tensor."""
    y = x.cast(ctx.out_dtype)
    if not dims:
        return _roll(ctx, y.reshape((y.v.size,)), shifts, (0,)).reshape(ctx.out_shape)
    for shift, dim in zip(shifts, dims, strict=True):
        axis = _axis(y, dim)
        n = y.shape[axis]
        s = int(shift) % n if n else 0
        if s == 0:
            continue
        head, tail = y.split([n - s, s], axis)
        y = Var(concat([tail.v, head.v], axis))
    return y


def _stack(ctx: Ctx, tensors: Sequence[Any], dim: int = 0) -> Var:
    """``torch.stack``: each tensor with a unit axis put in at ``dim``, joined along it."""
    n = len(ctx.out_shape)
    axis = dim % n
    parts = []
    for t in tensors:
        v = as_var(t, ctx.out_dtype)
        parts.append(v.reshape((*v.shape[:axis], 1, *v.shape[axis:])).v)
    return Var(concat(parts, axis))


def _unbind(ctx: Ctx, x: Var, dim: int = 0) -> tuple[Var, ...]:
    """``torch.unbind``: the unit windows along ``dim``, that axis dropped (views)."""
    axis = _axis(x, dim)
    rest = tuple(s for a, s in enumerate(x.shape) if a != axis)
    return tuple(p.reshape(rest) for p in x.split([1] * x.shape[axis], axis))


def _as_strided(ctx: Ctx, x: Var, size: Sequence[int], stride: Sequence[int],
                storage_offset: int | None = None) -> Var:
    """``x.as_strided(size, stride, offset)``: element i of the result is element
    ``offset + sum(i_k * stride_k)`` of ``x``'s storage, a GATHER from the flattened
    ``x`` at an index made of IOTAs. Only where that storage is ``x``'s own elements in
    order (the traced tensor is contiguous from offset 0) and every index falls in it."""
    n = x.v.size
    index = _strided_positions(ctx, n, size, stride, storage_offset)
    if index is None:
        return as_var(0, ctx.out_dtype).expand(ctx.out_shape)
    flat = x.cast(ctx.out_dtype).reshape((n,))
    count = max(1, math.prod(index.shape))
    return flat.gather(index.reshape((count,)), 0).reshape(ctx.out_shape)


def _strided_positions(ctx: Ctx, n: int, size: Sequence[int], stride: Sequence[int],
                       storage_offset: int | None) -> Var | None:
    """The flat positions (i64, ``size``) of ``as_strided(size, stride, offset)`` in a
    tensor of ``n`` elements that is its own storage in order (the traced tensor is
    contiguous from offset 0); Unsupported otherwise or where a position falls outside;
    None when ``size`` has no elements."""
    val = ctx.node.args[0].meta.get("val") if ctx.node.args else None
    if not isinstance(val, torch.Tensor) or not val.is_contiguous() \
            or val.storage_offset() != 0:
        raise Unsupported("as_strided of a tensor that is not contiguous from offset 0")
    shape, strides = tuple(int(s) for s in size), tuple(int(s) for s in stride)
    base = int(storage_offset or 0)
    if 0 in shape:
        return None
    last = base + sum((s - 1) * st for s, st in zip(shape, strides, strict=True))
    if base < 0 or last >= n or any(st < 0 for st in strides):
        raise Unsupported("as_strided reaches outside the tensor's elements")
    index = as_var(base, dtypes.i64).expand(shape)
    for axis, st in enumerate(strides):
        if st and shape[axis] > 1:
            index = index + Var(iota(shape, axis, dtypes.i64)) * st
    return index


def _overlaps(size: Sequence[int], stride: Sequence[int]) -> bool:
    """Whether two elements of the strided view may share a position: the dims sorted
    by stride, each stride must pass the extent of the smaller ones."""
    reach = 0
    for st, s in sorted((st, s) for s, st in zip(size, stride, strict=True) if s > 1):
        if st <= reach:
            return True
        reach += (s - 1) * st
    return False


def _as_strided_scatter(ctx: Ctx, x: Var, src: Var, size: Sequence[int],
                        stride: Sequence[int], storage_offset: int | None = None) -> Var:
    """``x`` with its strided view (as_strided) replaced by ``src``: a SCATTER into the
    flattened ``x`` at the view's positions (refused where positions overlap: which
    write wins there is undefined)."""
    n = x.v.size
    if _overlaps(size, stride):
        raise Unsupported("as_strided_scatter into overlapping positions")
    index = _strided_positions(ctx, n, size, stride, storage_offset)
    flat = x.cast(ctx.out_dtype).reshape((n,))
    if index is None or n == 0:
        return flat.reshape(ctx.out_shape)
    count = max(1, math.prod(index.shape))
    values = src.cast(ctx.out_dtype).reshape((count,))
    return flat.scatter(index.reshape((count,)), values, 0).reshape(ctx.out_shape)


def _identity(ctx: Ctx, x: Var, *args: Any, **kwargs: Any) -> Var:
    return x


def _view_copy(ctx: Ctx, x: Var, size: Any) -> Var:
    """view_copy(x, shape); view_copy(x, dtype) reinterprets bits, which the ISA's casts
    do not."""
    if isinstance(size, torch.dtype):
        raise Unsupported("view_copy as another dtype (a reinterpretation of bits)")
    return x.reshape(ctx.out_shape)


def _pixel_shuffle(ctx: Ctx, x: Var, r: int) -> Var:
    """``[*, C r^2, H, W] -> [*, C, H r, W r]``: a reshape, a permute and a reshape."""
    *lead, c, h, w = x.shape
    n = len(lead)
    y = x.reshape((*lead, c // (r * r), r, r, h, w))
    return y.permute((*range(n), n, n + 3, n + 1, n + 4, n + 2)).reshape(ctx.out_shape)


def _pixel_unshuffle(ctx: Ctx, x: Var, r: int) -> Var:
    """``[*, C, H r, W r] -> [*, C r^2, H, W]``: pixel_shuffle's inverse."""
    *lead, c, h, w = x.shape
    n = len(lead)
    y = x.reshape((*lead, c, h // r, r, w // r, r))
    return y.permute((*range(n), n, n + 2, n + 4, n + 1, n + 3)).reshape(ctx.out_shape)


def _channel_shuffle(ctx: Ctx, x: Var, groups: int) -> Var:
    """``[N, C, *] -> [N, C, *]`` with channels taken as ``[g, C/g]`` and transposed."""
    n, c, *rest = x.shape
    y = x.reshape((n, groups, c // groups, *rest))
    return y.permute((0, 2, 1, *range(3, y.ndim))).reshape(ctx.out_shape)


def _replication_pad_backward(ctx: Ctx, grad: Var, x: Var, padding: Sequence[int]) -> Var:
    """The gradient of replication padding: along each padded dim (the last ones, pairs
    of ``padding`` from the last dim on), output position ``i`` read input position
    ``clamp(i - before, 0, n - 1)``, so each input element gets the sum of the
    gradients read from it: one SCATTER_ADD per dim, in ascending output order."""
    d = ctx.out_dtype
    g = grad.cast(d)
    for k in range(len(padding) // 2):
        axis = x.ndim - 1 - k
        n = x.shape[axis]
        before = int(padding[2 * k])
        src = Var(iota(g.shape, axis, dtypes.i64)) - before
        idx = src.maximum(0).minimum(n - 1)
        base = Var(const(0, d, tuple(n if a == axis else s for a, s in enumerate(g.shape))))
        g = base.scatter_add(idx, g, axis) if g.v.size else base
    return g


# The ``*_copy`` forms of views: the same re-indexing, but a new tensor, so they are not
# in VIEW_OPS and a region stores them (a copy kernel, where eager copies too).
COPIES: dict[Any, Callable[..., Any]] = {
    aten.view_copy: _view_copy,
    aten.unsqueeze_copy: _reshape_to_out,
    aten.squeeze_copy: _reshape_to_out,
    aten.t_copy: _t,
    aten.transpose_copy: _transpose,
    aten.permute_copy: _permute,
    aten.narrow_copy: _narrow,
    aten.split_with_sizes_copy: _split,
    aten.split_copy: _split,
    aten.unsafe_split: _split,
    aten.unsafe_split_with_sizes: _split,
    aten.unsafe_chunk: _split,
    aten.unbind_copy: _unbind,
    aten.alias_copy: _identity,
    aten.detach_copy: _identity,
    aten.pixel_shuffle: _pixel_shuffle,
    aten.pixel_unshuffle: _pixel_unshuffle,
    aten.channel_shuffle: _channel_shuffle,
    aten.native_channel_shuffle: _channel_shuffle,
}


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
    aten.constant_pad_nd: _constant_pad_nd,
    aten.repeat: _repeat,
    aten.as_strided: _as_strided,
    aten.as_strided_copy: _as_strided,
    aten.roll: _roll,
    aten.stack: _stack,
    aten.unbind: _unbind,
    aten.detach: _identity,
    aten.clone: _identity,
    aten.alias: _identity,
    aten.lift_fresh_copy: _identity,
    **COPIES,
    aten.as_strided_scatter: _as_strided_scatter,
    aten.replication_pad1d_backward: _replication_pad_backward,
    aten.replication_pad2d_backward: _replication_pad_backward,
    aten.replication_pad3d_backward: _replication_pad_backward,
}
