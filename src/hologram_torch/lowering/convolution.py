"""Convolution, for now only where it is a matrix product: windows that do not overlap.

A vision transformer's patch embedding is a convolution whose stride equals its kernel
(no padding, no dilation, one group): every input element falls in at most one window,
so cutting the input into patches is a reshape and a permute (a view), and the
convolution is one GEMM of the patches against the kernel flattened to a matrix, with
the bias added in its epilogue. Other convolutions (overlapping windows, padding,
groups) stay in PyTorch until the convolution issue gives them kernels of their own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hologram.isa.builder import Var

from .context import Ctx, Unsupported

aten = torch.ops.aten


def _patches(x: Var, kernel: tuple[int, ...], out_sizes: tuple[int, ...]) -> Var:
    """``x [B, C, *spatial]`` cut into non-overlapping windows of ``kernel``:
    ``[B, *out_sizes, C * prod(kernel)]``, windows in row-major order of their position,
    each window's elements ordered (C, *kernel) as the weight's are. A window that would
    run past the end (ATen drops it) is sliced off first."""
    b, c = x.shape[:2]
    nd = len(kernel)
    used = tuple(o * k for o, k in zip(out_sizes, kernel, strict=True))
    if used != x.shape[2:]:
        x = x.slice((0,) * x.ndim, (b, c, *used))
    split = [b, c]
    for o, k in zip(out_sizes, kernel, strict=True):
        split += [o, k]
    # [B, C, o1, k1, o2, k2, ...] -> [B, o1, o2, ..., C, k1, k2, ...]
    perm = (0, *(2 + 2 * i for i in range(nd)), 1, *(3 + 2 * i for i in range(nd)))
    windows = x.reshape(tuple(split)).permute(perm)
    return windows.reshape((b, *out_sizes, c * math.prod(kernel)))


def _convolution(ctx: Ctx, x: Var, weight: Var, bias: Var | None, stride: Sequence[int],
                 padding: Sequence[int], dilation: Sequence[int], transposed: bool,
                 output_padding: Sequence[int], groups: int) -> Var:
    nd = x.ndim - 2
    kernel = tuple(weight.shape[2:])
    if transposed:
        raise Unsupported("transposed convolution")
    if tuple(stride) != kernel or any(padding) or any(d != 1 for d in dilation) \
            or groups != 1:
        raise Unsupported("convolution with overlapping windows, padding, dilation or groups "
                          "(only stride == kernel, a patch embedding, is a GEMM here)")
    if nd < 1 or x.ndim != weight.ndim:
        raise Unsupported(f"convolution of a {x.ndim}-D input")
    d = ctx.out_dtype
    out_shape = ctx.out_shape  # [B, O, *out_sizes]
    out_sizes = tuple(out_shape[2:])
    o = weight.shape[0]
    patches = _patches(x.cast(d), kernel, out_sizes)
    w = weight.cast(d).reshape((o, -1))
    y = patches @ w.T  # [B, *out_sizes, O]
    if bias is not None:
        y = y + bias.cast(d)
    # back to channels first: [B, O, *out_sizes]
    return y.permute((0, nd + 1, *range(1, nd + 1)))


# One row per ATen op (overload packet).
ROWS: dict[Any, Callable[..., Any]] = {
    aten.convolution: _convolution,
}
