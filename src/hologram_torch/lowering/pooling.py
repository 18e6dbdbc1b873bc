"""Average pooling (fixed and adaptive windows) forward and backward.

An average pool is a depthwise convolution whose weight is all ones, divided by each
window's count: the taps of :mod:`.convolution` (views), summed in one fused kernel,
and its backward that convolution's input gradient. The divisor of each output
position follows ATen's CPU kernel: the window clipped to the padded input
(``count_include_pad``) or to the input itself, or ``divisor_override``; it is
separable, a product of one IOTA expression per spatial dim.

Max pooling runs as PyTorch's own decomposition (``lowering.DECOMPOSE``): a GATHER of
the windows, a max with indices, and a SCATTER_ADD for its backward.

One translator per ATen op, ``ROWS`` maps each op to it (see
:mod:`hologram_torch.lowering` for how a translator is written)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from hologram.isa import builder as b
from hologram.isa import dtypes
from hologram.isa.builder import Var, const

from .context import Ctx, Unsupported
from .convolution import conv_input_grad, conv_nd

aten = torch.ops.aten


def _args(nd: int, kernel: Sequence[int], stride: Sequence[int],
          padding: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    def full(v: Sequence[int] | int, default: tuple[int, ...] | None = None) -> tuple[int, ...]:
        t = (int(v),) * nd if isinstance(v, int) else tuple(int(i) for i in v)
        if not t and default is not None:
            return default
        return t * nd if len(t) == 1 else t

    k = full(kernel)
    s = full(stride, k)
    p = full(padding)
    if not (len(k) == len(s) == len(p) == nd):
        raise Unsupported(f"pool arguments kernel={kernel} stride={stride} padding={padding}")
    return k, s, p


def _divisor(shape: tuple[int, ...], sizes: Sequence[int], k: Sequence[int],
             s: Sequence[int], p: Sequence[int], include_pad: bool,
             override: int | None, d: dtypes.DType) -> Var:
    """Each output position's divisor ``[1, 1, *outs]`` (ATen's avg_pool CPU rule)."""
    if override:
        return Var(const(float(override), d, ()))
    outs = shape[2:]
    div: Var | None = None
    for i, (n, ki, si, pi) in enumerate(zip(sizes, k, s, p, strict=True)):
        o = Var(b.iota((1, 1, *outs), 2 + i, d))
        start = o * float(si) - float(pi)
        end = (start + float(ki)).minimum(float(n + pi))
        if not include_pad:
            start, end = start.maximum(0.0), end.minimum(float(n))
        cnt = end - start
        div = cnt if div is None else div * cnt
    assert div is not None
    return div


def _ones(c: int, k: Sequence[int], d: dtypes.DType) -> Var:
    return Var(const(1.0, d, (c, 1, *k)))


def _batched(x: Var, nd: int) -> Var:
    """A pool's input with its optional batch dim made explicit: ``[B, C, *P]``."""
    if x.ndim == nd + 1:
        return x.reshape((1, *x.shape))
    if x.ndim != nd + 2:
        raise Unsupported(f"a {nd}-D pool of a {x.ndim}-D input")
    return x


def _avg_pool(nd: int) -> Callable[..., Var]:
    def run(ctx: Ctx, x: Var, kernel_size: Sequence[int], stride: Sequence[int] = (),
            padding: Sequence[int] = (0,), ceil_mode: bool = False,
            count_include_pad: bool = True, divisor_override: int | None = None) -> Var:
        d = ctx.out_dtype
        k, s, p = _args(nd, kernel_size, stride, padding)
        xb = _batched(x.cast(d), nd)
        out = ctx.out_shape if len(ctx.out_shape) == nd + 2 else (1, *ctx.out_shape)
        c = xb.shape[1]
        total = conv_nd(xb, _ones(c, k, d), None, s, p, (1,) * nd, c, tuple(out[2:]))
        y = total / _divisor(tuple(out), xb.shape[2:], k, s, p, count_include_pad,
                             divisor_override, d)
        return y.reshape(ctx.out_shape)
    return run


def _avg_pool_backward(nd: int) -> Callable[..., Var]:
    def run(ctx: Ctx, grad: Var, x: Var, kernel_size: Sequence[int], stride: Sequence[int],
            padding: Sequence[int], ceil_mode: bool, count_include_pad: bool,
            divisor_override: int | None) -> Var:
        d = ctx.out_dtype
        k, s, p = _args(nd, kernel_size, stride, padding)
        xb = _batched(x, nd)
        gb = _batched(grad.cast(d), nd)
        c = xb.shape[1]
        if 0 in gb.shape or 0 in xb.shape:
            raise Unsupported("avg_pool backward of an empty tensor")
        g = gb / _divisor(gb.shape, xb.shape[2:], k, s, p, count_include_pad,
                          divisor_override, d)
        return conv_input_grad(g, _ones(c, k, d), xb.shape[2:], s, p, (1,) * nd,
                               c).reshape(ctx.out_shape)
    return run


def _adaptive_window(x: Var, out: Sequence[int]) -> tuple[int, ...]:
    """The fixed window of an adaptive pool whose input sizes are multiples of its
    output sizes (then it is an average pool); other sizes stay in PyTorch."""
    sizes = x.shape[-len(out):]
    if any(o == 0 or n % o for n, o in zip(sizes, out, strict=True)):
        raise Unsupported(f"adaptive pool from {list(sizes)} to {list(out)} (not a multiple)")
    return tuple(n // o for n, o in zip(sizes, out, strict=True))


def _adaptive_avg_pool_backward(nd: int) -> Callable[..., Var]:
    def run(ctx: Ctx, grad: Var, x: Var) -> Var:
        out = grad.shape[-nd:]
        k = _adaptive_window(x, out)
        return _avg_pool_backward(nd)(ctx, grad, x, k, k, (0,) * nd, False, True, None)
    return run


# One row per ATen op (overload packet).
ROWS: dict[Any, Callable[..., Any]] = {
    aten.avg_pool2d: _avg_pool(2),
    aten.avg_pool3d: _avg_pool(3),
    aten.avg_pool2d_backward: _avg_pool_backward(2),
    aten.avg_pool3d_backward: _avg_pool_backward(3),
    aten._adaptive_avg_pool2d_backward: _adaptive_avg_pool_backward(2),
    aten._adaptive_avg_pool3d_backward: _adaptive_avg_pool_backward(3),
}
