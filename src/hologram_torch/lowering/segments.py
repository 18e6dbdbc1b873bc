"""Segment reductions: ``segment_reduce`` and ``_segment_reduce_backward``, as ATen's CPU
kernels define them (``aten/src/ATen/native/SegmentReduce.cpp``).

The data's axis (``lengths.ndim - 1``) is cut into consecutive segments of the given
lengths (or between the given offsets), per index of the dims before it. Each position's
segment is the number of segment ends at or before it (a broadcast compare and a sum
over the segments: O(positions x segments)); positions past the last segment belong to
none. The reduction is the ISA's combining SCATTER into the segments, starting from
``initial`` or the reduction's identity, in ascending position order (ATen's order, so
sums agree bit for bit). Mean divides by the length (an empty segment is ``initial``,
or NaN without one); max and min let NaN win.

One translator per ATen op, ``ROWS`` maps each op to it (see
:mod:`hologram_torch.lowering` for how a translator is written)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from hologram.isa import dtypes
from hologram.isa.builder import Var, const, iota
from hologram.isa.opcodes import Op

from .context import Ctx, Unsupported, and_, not_, or_
from .elementwise import isnan

aten = torch.ops.aten

#: reduction -> (the scatter's step, its identity: where a segment starts without initial)
STEPS: dict[str, tuple[Op, float]] = {
    "sum": (Op.ADD, 0.0), "mean": (Op.ADD, 0.0), "prod": (Op.MUL, 1.0),
    "max": (Op.MAX, -math.inf), "min": (Op.MIN, math.inf),
}


def _lengths(lengths: Var | None, offsets: Var | None) -> Var:
    """The segments' lengths, from ``lengths`` or from consecutive ``offsets``."""
    if lengths is not None:
        return lengths.cast(dtypes.f64)
    if offsets is None:
        raise Unsupported("segment_reduce without lengths or offsets")
    o = offsets.cast(dtypes.f64)
    n = o.shape[-1] - 1
    lead = (0,) * (o.ndim - 1)
    return o.slice((*lead, 1), (*o.shape[:-1], n)) - o.slice((*lead, 0), (*o.shape[:-1], n))


class _Segments:
    """Where each position of the data's axis goes: its segment (i64, clamped) and
    whether it is in one, both shaped as the data; and the lengths, shaped as the
    output."""

    def __init__(self, lengths: Var, data_shape: tuple[int, ...]) -> None:
        self.axis = axis = lengths.ndim - 1
        n, s = data_shape[axis], lengths.shape[-1]
        self.count = s
        inner = data_shape[axis + 1:]
        ends = lengths.cumsum(axis) if s else lengths
        pos = Var(iota((*lengths.shape[:-1], n, s), axis, dtypes.f64))
        passed = ends.reshape((*lengths.shape[:-1], 1, s)).expand(pos.shape)
        seg = not_(pos < passed).cast(dtypes.f64).sum(axis + 1)  # [outer..., N]
        spread = (*seg.shape, *(1,) * len(inner))
        self.inside = (seg < float(s)).reshape(spread).expand(data_shape)
        self.index = seg.minimum(float(max(s - 1, 0))).cast(dtypes.i64).reshape(
            spread).expand(data_shape)
        self.lengths = lengths.reshape((*lengths.shape, *(1,) * len(inner)))

    def gather(self, x: Var) -> Var:
        """Each position's value of its segment in ``x`` (shaped as the output)."""
        return x.gather(self.index, self.axis)


def _segment_reduce(ctx: Ctx, data: Var, reduce: str, *, lengths: Var | None = None,
                    indices: Var | None = None, offsets: Var | None = None, axis: int = 0,
                    unsafe: bool = False, initial: Any = None) -> Var:
    if reduce not in STEPS:
        raise Unsupported(f"segment_reduce reduce={reduce!r}")
    if indices is not None:
        raise Unsupported("segment_reduce with indices (unsupported by ATen too)")
    d = ctx.out_dtype
    x = data.cast(d)
    step, ident = STEPS[reduce]
    seg = _Segments(_lengths(lengths, offsets), tuple(x.shape))
    start = ident if initial is None else float(initial)
    out = Var(const(start, d, ctx.out_shape))
    if x.v.size and seg.count:
        src = seg.inside.where(x, ident)
        out = out.scatter_combine(seg.index, src, seg.axis, step)
    if reduce != "mean":
        return out
    n = seg.lengths.expand(ctx.out_shape).cast(d)
    mean = and_(n > 0.0, not_(isnan(out))).where(out / n, out)
    if initial is None:
        mean = n.eq(0.0).where(math.nan, mean)
    return mean


def _segment_reduce_backward(ctx: Ctx, grad: Var, output: Var, data: Var, reduce: str, *,
                             lengths: Var | None = None, offsets: Var | None = None,
                             axis: int = 0, initial: Any = None) -> Var:
    """ATen's gradients: sum and mean spread the segment's gradient (mean divided by the
    length); max and min give it to each element equal to the result (or NaN), divided
    by their count where there are several and the gradient is positive (ATen's
    rule); prod gives ``grad * out / x``, or for a zero or NaN ``x`` the gradient times
    the product of the segment's other elements and ``initial``."""
    if reduce not in STEPS:
        raise Unsupported(f"segment_reduce reduce={reduce!r}")
    d = ctx.out_dtype
    x = data.cast(d)
    seg = _Segments(_lengths(lengths, offsets), tuple(x.shape))
    if not x.v.size or not seg.count:
        return Var(const(0, d, ctx.out_shape))
    g, out = seg.gather(grad.cast(d)), seg.gather(output.cast(d))
    if reduce == "sum":
        gi = g
    elif reduce == "mean":
        gi = g / seg.gather(seg.lengths.cast(d).expand(grad.shape))
    elif reduce in ("max", "min"):
        hit = and_(seg.inside, or_(isnan(x), x.eq(out)))
        gi = hit.where(g, 0.0)
        base = Var(const(0, d, tuple(grad.shape)))
        count = seg.gather(base.scatter_add(seg.index, hit.cast(d), seg.axis))
        gi = and_(count > 1.0, gi > 0.0).where(gi / count, gi)
    else:  # prod
        special = or_(isnan(x), x.eq(0.0))
        ones = Var(const(1, d, tuple(grad.shape)))
        plain = ones.scatter_combine(seg.index, or_(special, not_(seg.inside)).where(1.0, x),
                                     seg.axis, Op.MUL)
        base = Var(const(0, d, tuple(grad.shape)))
        nans = seg.gather(base.scatter_add(seg.index, and_(seg.inside, isnan(x)).cast(d),
                                           seg.axis)) - isnan(x).cast(d)
        zeros = seg.gather(base.scatter_add(seg.index, and_(seg.inside, x.eq(0.0)).cast(d),
                                            seg.axis)) - x.eq(0.0).cast(d)
        one = Var(const(1, d, tuple(x.shape)))
        others = (nans > 0.0).where(math.nan, (zeros > 0.0).where(0.0, one))
        init = 1.0 if initial is None else float(initial)
        gi = special.where(g * (seg.gather(plain) * init) * others, g * out / x)
    return seg.inside.where(gi, 0.0).reshape(ctx.out_shape)


# One row per ATen op (overload packet).
ROWS: dict[Any, Callable[..., Any]] = {
    aten.segment_reduce: _segment_reduce,
    aten._segment_reduce_backward: _segment_reduce_backward,
}
