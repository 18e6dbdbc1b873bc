"""Average pooling (fixed and adaptive windows) forward and backward.

An average pool is a depthwise convolution whose weight is all ones, divided by each
window's count: the taps of :mod:`.convolution` (views), summed in one fused kernel,
and its backward that convolution's input gradient. The divisor of each output
position follows ATen's CPU kernel: the window clipped to the padded input
(``count_include_pad``) or to the input itself, or ``divisor_override``; it is
separable, a product of one IOTA expression per spatial dim.

The adaptive pool's backward multiplies the gradient by a window-membership matrix per
spatial dim (its windows may overlap and differ in length). Its forward runs as
PyTorch's decomposition (``lowering.DECOMPOSE``): avg_pool2d where the sizes divide,
GATHERs otherwise. Max pooling forward is the taps too (the input padded with -inf; a
strided pool reads them from phase-major planes, ``convolution.phase_taps``: ResNet-18
0.98x the time at batch 1, its training step 0.98x, batch 8 level), a chain of selects
over them that keeps each window's maximum and its index, ATen's CPU
rule: a later element wins when it is greater or NaN, and a window of -inf alone keeps
its first element inside the input. The index chain is dead code where nothing reads
the indices (inference), so a pool there is one fused kernel of taps. PyTorch's
decomposition (a GATHER of the windows at IOTA-computed indices, in f64) ran ResNet-18's
stem pool 5-7x slower (docs/perf.md, "Session 11, CNN"). Its backward stays PyTorch's
decomposition: a SCATTER_ADD; the 3-D pool's and the adaptive max pools' backward is
the same SCATTER_ADD written here (:func:`_max_pool_backward`); an adaptive max pool's
forward, and the 3-D adaptive average pool's, are GATHERed taps of their windows
(:func:`_adaptive_taps`).

One translator per ATen op, ``ROWS`` maps each op to it (see
:mod:`hologram_torch.lowering` for how a translator is written)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hologram.isa import builder as b
from hologram.isa import dtypes
from hologram.isa.builder import Var, const
from hologram.isa.opcodes import Op

from .context import Ctx, Unsupported, and_, not_, or_
from .convolution import conv_input_grad, conv_nd, window_views

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
        if 0 in gb.shape or 0 in xb.shape:  # nothing flows back
            return Var(const(0, d, ctx.out_shape))
        g = gb / _divisor(gb.shape, xb.shape[2:], k, s, p, count_include_pad,
                          divisor_override, d)
        return conv_input_grad(g, _ones(c, k, d), xb.shape[2:], s, p, (1,) * nd,
                               c).reshape(ctx.out_shape)
    return run


def _max_pool_with_indices(nd: int) -> Callable[..., tuple[Var, Var]]:
    def run(ctx: Ctx, x: Var, kernel_size: Sequence[int], stride: Sequence[int] = (),
            padding: Sequence[int] = (0,), dilation: Sequence[int] = (1,),
            ceil_mode: bool = False) -> tuple[Var, Var]:
        d = ctx.out_dtype
        k, s, p = _args(nd, kernel_size, stride, padding)
        dl = _args(nd, kernel_size, (), dilation)[2]
        xb = _batched(x.cast(d), nd)
        shape = tuple(ctx.out[0].shape)
        out = shape if len(shape) == nd + 2 else (1, *shape)
        ishape = tuple(ctx.out[1].shape)
        if math.prod(out) == 0:  # nothing to pool: ATen's empty results
            return Var(const(0, d, shape)), Var(const(0, dtypes.f64, ishape))
        sizes = xb.shape[2:]
        outs = tuple(out[2:])
        inner = [math.prod(sizes[i + 1:]) for i in range(nd)]  # the index's place values
        start = [Var(b.iota((1, 1, *outs), 2 + i, dtypes.f64)) * float(s[i]) - float(p[i])
                 for i in range(nd)]
        # ATen's initial index: the window's first element inside the input
        first: Var | None = None
        for i in range(nd):
            lo = start[i] + Var(b.unary(Op.CEIL, (start[i] * -1.0 / float(dl[i])).v)).maximum(
                0.0) * float(dl[i])
            first = lo * float(inner[i]) if first is None else first + lo * float(inner[i])
        best: Var | None = None
        idx = first
        assert idx is not None
        for t, pos in zip(window_views(xb, k, s, p, dl, outs, fill=-math.inf),
                          itertools.product(*(range(ki) for ki in k)), strict=True):
            at: Var | None = None
            for i in range(nd):
                c = (start[i] + float(pos[i] * dl[i])) * float(inner[i])
                at = c if at is None else at + c
            assert at is not None
            if best is None:
                win = or_(t > -math.inf, not_(t.eq(t)))
                best = t
            else:
                # ATen's rule, a later element wins when greater or NaN, is the ISA's MAX
                # with that element first: one instruction per tap, one reader of the
                # running maximum, so an inference pool (its index chain dead) stays one
                # kernel; a select reading it twice per tap made the scheduler's work rule
                # store the chain every few taps (six passes on ResNet-18's stem pool)
                win = or_(t > best, not_(t.eq(t)))
                best = t.maximum(best)
            idx = win.where(at, idx)
        assert best is not None
        return best.reshape(shape), idx.reshape(ishape)
    return run


def _window(j: Var, n: int, o: int) -> tuple[Var, Var]:
    """(start, end) of adaptive window ``j`` (a float IOTA) of ``o`` over ``n`` inputs:
    ATen's ``[floor(j n / o), ceil((j + 1) n / o))``."""
    start = Var(b.unary(Op.FLOOR, (j * float(n) / float(o)).v))
    end = Var(b.unary(Op.CEIL, ((j + 1.0) * float(n) / float(o)).v))
    return start, end


def _adaptive_weights(n: int, o: int, d: dtypes.DType) -> Var:
    """``A [o, n]``: ``A[j, i] = 1 / len_j`` where input ``i`` is in adaptive window ``j``
    (:func:`_window`), else 0; from IOTAs."""
    start, end = _window(Var(b.iota((o, n), 0, d)), n, o)
    i = Var(b.iota((o, n), 1, d))
    inside = and_(not_(i < start), i < end)
    return inside.where((end - start).recip(), 0.0)


def _adaptive_avg_pool_backward(nd: int) -> Callable[..., Var]:
    """The gradient of an adaptive average pool: per spatial dim, a product with the
    window-membership matrix over each window's length (:func:`_adaptive_weights`);
    small GEMMs, since windows of an adaptive pool may overlap and differ in size."""
    def run(ctx: Ctx, grad: Var, x: Var) -> Var:
        d = ctx.out_dtype
        if 0 in grad.shape or 0 in x.shape:
            return Var(const(0, d, ctx.out_shape))
        g = grad.cast(d)
        lead = g.ndim - nd
        for k in range(nd):
            ax = lead + k
            n, o = x.shape[ax], g.shape[ax]
            a = _adaptive_weights(n, o, d)  # [o, n]
            perm = [*range(ax), *range(ax + 1, g.ndim), ax]
            moved = g.permute(perm) @ a  # the pooled axis last, now of size n
            inv = [perm.index(q) for q in range(g.ndim)]
            g = moved.permute(inv)
        return g
    return run


def _adaptive_taps(x: Var, nd: int, outs: tuple[int, ...]
                   ) -> tuple[list[tuple[Var, Var, Var]], Var]:
    """The windows of an adaptive pool of ``x [..., *sizes]`` to ``outs`` as taps (ATen's
    windows, :func:`_window`). Windows differ in length, so each tap of
    the longest window is a GATHER at a position clamped to the window's last element,
    with whether the tap is inside its window. Returns (one (values ``[planes, P]``,
    flat positions ``[1, P]`` in f64, inside ``[1, P]``) per tap, each window's element
    count ``[1, P]`` in f64), ``P`` the output positions."""
    lead = x.ndim - nd
    sizes = x.shape[lead:]
    planes = math.prod(x.shape[:lead])
    p = math.prod(outs)
    flat_x = x.reshape((planes, math.prod(sizes)))
    inner = [math.prod(sizes[i + 1:]) for i in range(nd)]
    starts, ends, longest = [], [], []
    count: Var | None = None
    for i, (n, o) in enumerate(zip(sizes, outs, strict=True)):
        start, end = _window(Var(b.iota(outs, i, dtypes.f64)), n, o)
        starts.append(start)
        ends.append(end)
        longest.append(max(-(-(k + 1) * n // o) - (k * n // o) for k in range(o)))
        length = ends[i] - starts[i]
        count = length if count is None else count * length
    assert count is not None
    taps = []
    for offs in itertools.product(*(range(m) for m in longest)):
        at: Var | None = None
        inside: Var | None = None
        for i, t in enumerate(offs):
            want = starts[i] + float(t)
            pos = want.minimum(ends[i] - 1.0) * float(inner[i])
            ok = want < ends[i]
            at = pos if at is None else at + pos
            inside = ok if inside is None else and_(inside, ok)
        assert at is not None and inside is not None
        flat_at = at.reshape((1, p))
        v = flat_x.gather(flat_at.cast(dtypes.i64).expand((planes, p)), 1)
        taps.append((v, flat_at, inside.reshape((1, p))))
    return taps, count.reshape((1, p))


def _adaptive_max_pool(nd: int) -> Callable[..., tuple[Var, Var]]:
    """An adaptive max pool and its indices over :func:`_adaptive_taps` (a tap clamped
    to its window's last element repeats it, which never wins: ATen's rule, as in the
    fixed pool above, takes a later element only when greater or NaN, and a repeated
    NaN names the same index)."""
    def run(ctx: Ctx, x: Var, output_size: Sequence[int]) -> tuple[Var, Var]:
        d = ctx.out_dtype
        shape = tuple(ctx.out[0].shape)
        ishape = tuple(ctx.out[1].shape)
        if math.prod(shape) == 0:
            return Var(const(0, d, shape)), Var(const(0, dtypes.f64, ishape))
        taps, _ = _adaptive_taps(x.cast(d), nd, tuple(shape[x.ndim - nd:]))
        best, idx = taps[0][0], taps[0][1].expand(taps[0][0].shape)
        for v, at, _ in taps[1:]:
            win = or_(v > best, not_(v.eq(v)))
            best = v.maximum(best)
            idx = win.where(at.expand(v.shape), idx)
        return best.reshape(shape), idx.reshape(ishape)
    return run


def _adaptive_avg_pool(nd: int) -> Callable[..., Var]:
    """An adaptive average pool over :func:`_adaptive_taps`: the taps inside each window
    summed (selected, not multiplied by a mask, so a NaN or inf stays in its own
    windows) over its count. The 3-D pool, which PyTorch does not decompose (the 2-D
    one runs as its decomposition: an average pool where the sizes divide, GATHERs
    otherwise)."""
    def run(ctx: Ctx, x: Var, output_size: Sequence[int]) -> Var:
        d = ctx.out_dtype
        shape = tuple(ctx.out_shape)
        if 0 in x.shape or 0 in shape:
            return Var(const(0, d, shape))
        taps, count = _adaptive_taps(x.cast(d), nd, tuple(shape[x.ndim - nd:]))
        total: Var | None = None
        for v, _, inside in taps:
            term = inside.expand(v.shape).where(v, 0.0)
            total = term if total is None else total + term
        assert total is not None
        return (total / count.cast(d)).reshape(shape)
    return run


def _max_pool_backward(nd: int) -> Callable[..., Var]:
    """The gradient of a max pool that returned its indices (a fixed pool's 3-D form,
    the adaptive ones): each output's gradient added at the input position its index
    names within its plane, one SCATTER_ADD per call over ``[planes, positions]``
    (overlapping windows that chose the same element add up, as in ATen)."""
    def run(ctx: Ctx, grad: Var, x: Var, *args: Any) -> Var:
        indices = args[-1]  # every form takes the forward's indices last
        d = ctx.out_dtype
        shape = tuple(ctx.out_shape)
        if 0 in grad.shape or 0 in shape:
            return Var(const(0, d, shape))
        lead = len(shape) - nd  # 1 for an unbatched input, else 2
        planes = math.prod(shape[:lead])
        g = grad.cast(d).reshape((planes, math.prod(grad.shape[lead:])))
        idx = indices.reshape(g.shape).cast(dtypes.i64)
        base = Var(const(0, d, (planes, math.prod(shape[lead:]))))
        return base.scatter_add(idx, g, 1).reshape(shape)
    return run


# One row per ATen op (overload packet).
ROWS: dict[Any, Callable[..., Any]] = {
    aten._adaptive_avg_pool3d: _adaptive_avg_pool(3),
    aten.adaptive_max_pool2d: _adaptive_max_pool(2),
    aten.adaptive_max_pool3d: _adaptive_max_pool(3),
    aten.max_pool3d_with_indices_backward: _max_pool_backward(3),
    aten.adaptive_max_pool2d_backward: _max_pool_backward(2),
    aten.adaptive_max_pool3d_backward: _max_pool_backward(3),
    aten.max_pool2d_with_indices: _max_pool_with_indices(2),
    aten.max_pool3d_with_indices: _max_pool_with_indices(3),
    aten.avg_pool2d: _avg_pool(2),
    aten.avg_pool3d: _avg_pool(3),
    aten.avg_pool2d_backward: _avg_pool_backward(2),
    aten.avg_pool3d_backward: _avg_pool_backward(3),
    aten._adaptive_avg_pool2d_backward: _adaptive_avg_pool_backward(2),
    aten._adaptive_avg_pool3d_backward: _adaptive_avg_pool_backward(3),
}
