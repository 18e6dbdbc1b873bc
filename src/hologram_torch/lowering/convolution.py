"""Convolution (1-D, 2-D and up) forward and backward, and the pools built the same way.

Every convolution here is made of existing ISA instructions (views, GATHER, IOTA,
element-wise ops and the library GEMM), no instruction of its own:

* **Patches.** Where the stride equals a kernel larger than 1x1 (no padding, dilation
  or groups: a vision transformer's patch embedding) every input element falls in one window, so
  the column matrix is a RESHAPE and PERMUTE of the input (no copy before the GEMM).
* **Taps** (depthwise, average pools). The input, zero-padded (a CONCAT of constant
  parts, which read no memory) and cropped or extended so each spatial size is a
  multiple of the stride, is reshaped ``[B, C, Q, s]`` per spatial dim; the elements
  kernel position ``k`` meets are then the window ``[k*d // s, +O)`` of ``Q`` at
  ``k*d % s`` of ``s``: a SLICE, a view. So a strided, dilated, padded convolution's
  ``prod(kernel)`` taps are views of the input.
* **im2col + GEMM** (groups with more than one input channel each): the taps stacked
  (one CONCAT; for a 1x1 kernel the one tap, a view) are the column matrix ``[B, g,
  C/g * K, L]`` (:func:`columns`; a strided kernel's many taps are windows of phase
  planes, :func:`im2col_taps`); the weight ``[g, O/g, C/g * K]`` times it is one
  batched GEMM whose result is already channels-first ``[B, O, L]``. The bias and what
  follows element-wise (batch norm at inference, the activation) run as the GEMM's
  epilogue, per tile while it is in cache, so batch norm costs no pass of its own
  without being folded into the weight (which would need the weight to be a constant:
  hologram does not assume that).
* **Positions as rows** (a 1x1 convolution of channels-last data, ConvNeXt's MLP):
  ``[B*L, C] @ W^T``, one GEMM over the batch, its result viewed channels-first
  (:func:`_pixel_major_conv`, ``PIXEL_MAJOR_MIN_OUT`` says when).
* **Winograd** (dense 3x3 stride-1 float32 with >= 49 output positions per image):
  F(4x4 or 2x2, 3x3) in :mod:`.winograd`, one GEMM batched over the tile positions with
  4x or 2.25x fewer multiply-adds; the im2col GEMM above already ran near one core's
  peak, so only fewer products could pass Inductor (docs/perf.md, "Session 13").
* **Direct** (one input channel per group: depthwise): the sum over taps of tap times
  weight is element-wise over views, so the scheduler fuses it into one kernel that
  reads the input ``prod(kernel)`` times from cache and writes the output once; a GEMM
  per channel with an inner size of ``prod(kernel)`` would not pay for its calls, and
  the GATHERed columns reduced over the kernel axis ran 6-13x slower (measured). The
  taps are added as a balanced tree (:func:`tree_sum`), and the zero-padded input they
  read is stored once (the scheduler's ``CONCAT_PART_WORK``), so the kernel's inner loop
  is plain vector loads and multiply-adds.

Which path a convolution takes was measured (docs/perf.md, "Convolution").

The backward ops are the same pieces: the input gradient is col2im (the columns'
gradient, one GEMM, each kernel position's part put back where its tap came from and
summed: views and one fused kernel); for depthwise, a direct stride-1 convolution of
the output gradient dilated by the stride (zeros interleaved: a CONCAT and RESHAPE),
with the weight flipped and its channel axes swapped. The weight gradient is one GEMM
over the batch, the output gradient against every image's columns side by side (read
transposed), or for depthwise a product of taps reduced; the bias gradient a sum.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hologram.compiler.rules import ELEMENTWISE_OPS
from hologram.isa.builder import Var, concat, const
from hologram.isa.opcodes import Op
from hologram.isa.value import Value

from . import winograd
from .context import Ctx, Unsupported, inline, isa_dtype
from .movement import pad_with
from .reductions import staged_sum

aten = torch.ops.aten


def _expand_arg(v: Sequence[int] | int, nd: int, what: str) -> tuple[int, ...]:
    t = (int(v),) * nd if isinstance(v, int) else tuple(int(i) for i in v)
    if len(t) == 1 and nd > 1:
        t = t * nd
    if len(t) != nd:
        raise Unsupported(f"{what} {list(t)} for a {nd}-D convolution")
    return t


def out_size(n: int, k: int, s: int, p: int, d: int, ceil: bool = False) -> int:
    """ATen's output size of a window op along one dim."""
    span = n + 2 * p - d * (k - 1) - 1
    o = (-(-span // s) if ceil else span // s) + 1
    if ceil and (o - 1) * s >= n + p:  # the last window must start inside input or left pad
        o -= 1
    return o


def _grid(x: Var, kernel: Sequence[int], stride: Sequence[int], padding: Sequence[int],
          dilation: Sequence[int], outs: Sequence[int], fill: float
          ) -> tuple[Var, tuple[int, ...]]:
    """``x`` padded with ``fill`` (or cropped) to ``q * stride`` per spatial dim, ``q``
    rows of ``stride``: enough for every tap's window; viewed ``[B, C, q1, s1, q2, s2,
    ...]``. Returns the view and the ``q``s."""
    pads: list[int] = []
    split: list[int] = [*x.shape[:2]]
    qs: list[int] = []
    for n, k, st, p, d, o in zip(x.shape[2:], kernel, stride, padding, dilation, outs,
                                 strict=True):
        q = -(-((k - 1) * d + st * o) // st)
        pads[:0] = [p, q * st - n - p]  # F.pad order: last dim first
        split += [q, st]
        qs.append(q)
    return pad_with(x, pads, const(fill, x.dtype, ())).reshape(tuple(split)), tuple(qs)


def taps(x: Var, kernel: Sequence[int], stride: Sequence[int], padding: Sequence[int],
         dilation: Sequence[int], outs: Sequence[int], fill: float = 0.0) -> list[Var]:
    """``x [B, C, *P]``: for each kernel position (row-major), the view ``[B, C, *outs]``
    of the (``fill``-padded) input elements that position meets. Views only: one
    pad/crop per spatial dim, a RESHAPE and a SLICE per tap."""
    lead = x.shape[:2]
    nd = len(kernel)
    grid, _ = _grid(x, kernel, stride, padding, dilation, outs, fill)
    views = []
    for pos in itertools.product(*(range(k) for k in kernel)):
        starts, sizes = [0, 0], [*lead]
        for i in range(nd):
            off = pos[i] * dilation[i]
            starts += [off // stride[i], off % stride[i]]
            sizes += [outs[i], 1]
        views.append(grid.slice(tuple(starts), tuple(sizes)).reshape((*lead, *outs)))
    return views


#: Whether a strided depthwise convolution's taps read phase-major planes
#: (:func:`phase_taps`) rather than the padded input with a stride.
PHASE_TAPS = True


def _phase_planes(x: Var, kernel: Sequence[int], stride: Sequence[int],
                  padding: Sequence[int], dilation: Sequence[int], outs: Sequence[int],
                  fill: float) -> tuple[Var, tuple[int, ...], list[tuple[int, ...]]]:
    """The padded input laid out phase-major, ``[B, C, prod(stride), *q]`` (plane
    ``(a, b)`` holds the elements at rows ``a::s``, columns ``b::s``: a CONCAT of
    strided views, stored once), the ``q``s, and the phases in plane order."""
    lead = x.shape[:2]
    # the padded input as rows of `stride` (taps' grid), each phase a strided view of
    # it; the padded input is stored once and the planes copied from it (built from
    # strided windows of x straight away, the planes' copy ran 2.2x slower)
    grid, qs = _grid(x, kernel, stride, padding, dilation, outs, fill)
    phases = list(itertools.product(*(range(st) for st in stride)))
    planes = []
    for ph in phases:
        starts, sizes = [0, 0], [*lead]
        for i in range(len(kernel)):
            starts += [0, ph[i]]
            sizes += [qs[i], 1]
        planes.append(grid.slice(tuple(starts), tuple(sizes)).reshape((*lead, 1, *qs)).v)
    return Var(concat(planes, 2)), qs, phases


def phase_taps(x: Var, kernel: Sequence[int], stride: Sequence[int],
               padding: Sequence[int], dilation: Sequence[int], outs: Sequence[int],
               fill: float = 0.0) -> list[Var]:
    """The taps of :func:`taps` for a strided window, each a contiguous window of one
    phase plane (:func:`_phase_planes`), so every tap reads unit-stride runs. Read in
    place, a stride-2 tap loads every other element: GCC vectorized those loads with
    permutes, and MobileNetV3's stride-2 depthwise convolutions (and the pools of their
    squeeze-excitation blocks, which recompute them) ran at a fraction of the stride-1
    ones' pace."""
    lead = x.shape[:2]
    nd = len(kernel)
    stacked, _, phases = _phase_planes(x, kernel, stride, padding, dilation, outs, fill)
    views = []
    for pos in itertools.product(*(range(k) for k in kernel)):
        offs = [pos[i] * dilation[i] for i in range(nd)]
        ph = phases.index(tuple(off % st for off, st in zip(offs, stride, strict=True)))
        starts = (0, 0, ph, *(off // st for off, st in zip(offs, stride, strict=True)))
        views.append(stacked.slice(starts, (*lead, 1, *outs)).reshape((*lead, *outs)))
    return views


def window_views(x: Var, kernel: Sequence[int], stride: Sequence[int],
                 padding: Sequence[int], dilation: Sequence[int], outs: Sequence[int],
                 fill: float = 0.0) -> list[Var]:
    """The taps a direct kernel sums or compares (depthwise convolutions, max pools):
    :func:`phase_taps` for a strided window (``PHASE_TAPS``), else :func:`taps`."""
    strided = PHASE_TAPS and any(st > 1 for st in stride)
    return (phase_taps if strided else taps)(x, kernel, stride, padding, dilation, outs,
                                             fill)


def _window(x: Var, axis: int, n_out: int, stride: int, off: int,
            fill: Value) -> tuple[Var, int, int] | None:
    """Along ``axis``: the elements ``x[o * stride + off]`` that lie inside ``x`` for
    outputs ``o`` in ``[0, n_out)``, as a view ``[..., hi - lo, ...]``, with ``lo, hi``:
    the outputs they are (the rest fall in the padding). None: no output reads ``x``."""
    n = x.shape[axis]
    lo = max(0, -(off // stride))  # ceil(-off / stride)
    hi = min(n_out, (n - 1 - off) // stride + 1)
    if hi <= lo:
        return None
    cnt, start = hi - lo, lo * stride + off
    shape = x.shape

    def cut(v: Var, first: int, size: int) -> Var:
        return v.slice(tuple(first if a == axis else 0 for a in range(v.ndim)),
                       tuple(size if a == axis else s for a, s in enumerate(v.shape)))

    if stride == 1:
        return cut(x, start, cnt), lo, hi
    span = cnt * stride  # rows of ``stride``: the first of each is an output's element
    w = cut(x, start, min(span, n - start))
    if w.shape[axis] < span:  # the last row runs past the end: elements never read
        w = pad_with(w, [0, 0] * (x.ndim - 1 - axis) + [0, span - w.shape[axis]], fill)
    w = w.reshape((*shape[:axis], cnt, stride, *shape[axis + 1:]))
    w = w.slice((0,) * w.ndim, (*shape[:axis], cnt, 1, *shape[axis + 1:]))
    return w.reshape((*shape[:axis], cnt, *shape[axis + 1:])), lo, hi


def window_taps(x: Var, kernel: Sequence[int], stride: Sequence[int],
                padding: Sequence[int], dilation: Sequence[int], outs: Sequence[int],
                fill: float = 0.0) -> list[Var]:
    """The same taps as :func:`taps`, each built the other way round: the window of the
    unpadded input that the kernel position reads (a view), padded with ``fill`` where
    it falls outside (a CONCAT of constants around it). No padded copy of the input is
    needed: a stored CONCAT of these taps (an im2col) renders each tap as a copy of its
    window and stores of ``fill`` around it (``render_c.concat_kernel``), where the
    padded input used to be a pass of its own and the taps read it again
    (docs/perf.md, "Session 12, CNN")."""
    nd = len(kernel)
    fv = const(fill, x.dtype, ())
    out: list[Var] = []
    for pos in itertools.product(*(range(k) for k in kernel)):
        w: Var | None = x
        pads: list[int] = []
        for i in range(nd):
            got = _window(w, 2 + i, outs[i], stride[i], pos[i] * dilation[i] - padding[i], fv)
            if got is None:
                w = None
                break
            w, lo, hi = got
            pads[:0] = [lo, outs[i] - hi]
        if w is None:  # the kernel position never meets the input
            out.append(Var(const(fill, x.dtype, (*x.shape[:2], *outs))))
        else:
            out.append(pad_with(w, pads, fv) if any(pads) else w)
    return out


#: Whether a strided im2col takes its taps from phase planes (:func:`im2col_taps`;
#: ``benchmarks/ab_lowering.py`` A/Bs it).
IM2COL_PHASE_TAPS = True
#: ... when its kernel has at least this many positions per phase plane: the planes are
#: a pass of their own over the input, paid back by plain copies only when many taps
#: read each plane (ResNet-18's 7x7 stride-2 stem: 49 taps over 4 planes;
#: MobileNetV3-small's 3x3 stride-2 stem, 9 over 4, ran 1.03-1.06x slower with them).
PHASE_TAPS_PER_PLANE = 4


def im2col_taps(x: Var, kernel: Sequence[int], stride: Sequence[int],
                padding: Sequence[int], dilation: Sequence[int], outs: Sequence[int]
                ) -> list[Var]:
    """The taps an im2col stacks: :func:`phase_taps` for a strided window with many
    kernel positions per phase plane (``PHASE_TAPS_PER_PLANE``), else
    :func:`window_taps`. A strided tap of :func:`window_taps` renders as its own
    padded window (up to five loop nests: the copy and the padding's bands, each
    different), so ResNet-18's 7x7 stride-2 stem was 239 loops that gcc took 1.6 s of
    a cold first call to compile. As windows of the phase planes the taps differ only
    in where they start, and the renderer folds them into one loop nest over a table
    of starts (``render_c.folded_parts``): the model's library 755 -> 519 loops, 6.5
    -> 4.6 s of gcc. Run time unchanged on ResNet-18 (``ab_lowering.py``: b8 1.004x
    and 0.976x the time, b1 1.040x and 0.986x, its training step 1.017x and 0.999x;
    docs/perf.md, session 31). Stride 1 keeps :func:`window_taps` (the planes would be
    a padded copy of the input for nothing), and so does a 1x1 kernel (its one tap is
    a strided view, no copy). Every strided im2col takes its taps here, the folded
    batch's too (:func:`_folded_columns`)."""
    strided = (IM2COL_PHASE_TAPS and any(st > 1 for st in stride)
               and math.prod(kernel) >= PHASE_TAPS_PER_PLANE * math.prod(stride))
    return (phase_taps if strided else window_taps)(x, kernel, stride, padding, dilation,
                                                    outs)


def _windows(x: Var, kernel: tuple[int, ...], out_sizes: tuple[int, ...]) -> Var:
    """``x [B, C, *spatial]`` viewed as ``[B, C, o1, k1, o2, k2, ...]``: its
    non-overlapping windows of ``kernel``. A window that would run past the end (ATen
    drops it) is sliced off first."""
    b, c = x.shape[:2]
    used = tuple(o * k for o, k in zip(out_sizes, kernel, strict=True))
    if used != x.shape[2:]:
        x = x.slice((0,) * x.ndim, (b, c, *used))
    split = [b, c]
    for o, k in zip(out_sizes, kernel, strict=True):
        split += [o, k]
    return x.reshape(tuple(split))


def _patches(x: Var, kernel: tuple[int, ...], out_sizes: tuple[int, ...]) -> Var:
    """The windows of :func:`_windows` as ``[B, *out_sizes, C * prod(kernel)]``,
    windows in row-major order of their position, each window's elements ordered
    (C, *kernel) as the weight's are."""
    b, c = x.shape[:2]
    nd = len(kernel)
    # [B, C, o1, k1, o2, k2, ...] -> [B, o1, o2, ..., C, k1, k2, ...]
    perm = (0, *(2 + 2 * i for i in range(nd)), 1, *(3 + 2 * i for i in range(nd)))
    return _windows(x, kernel, out_sizes).permute(perm).reshape(
        (b, *out_sizes, c * math.prod(kernel)))


def _patch_columns(x: Var, kernel: tuple[int, ...], out_sizes: tuple[int, ...]) -> Var:
    """The windows as the column matrix of every image side by side, ``[C *
    prod(kernel), B * L]`` (rows ordered (C, *kernel) as the weight's, columns (image,
    position)): one view, whose copy runs along output rows (reading every
    ``kernel[-1]``-th input element) where ``_patches``' runs along a window's row."""
    b, c = x.shape[:2]
    nd = len(kernel)
    # [B, C, o1, k1, o2, k2, ...] -> [C, k1, k2, ..., B, o1, o2, ...]
    perm = (1, *(3 + 2 * i for i in range(nd)), 0, *(2 + 2 * i for i in range(nd)))
    return _windows(x, kernel, out_sizes).permute(perm).reshape(
        (c * math.prod(kernel), b * math.prod(out_sizes)))


def _patch_conv(x: Var, weight: Var, outs: tuple[int, ...]) -> Var:
    """A convolution whose windows do not overlap (stride = kernel, no padding: a
    patch embedding, ConvNeXt's stem and downsampling layers) as ONE GEMM over the
    whole batch, ``[B, O, *outs]``. Its operand is a copy of the input in window order;
    that copy runs along whichever is longer, a window's row or an output row: ViT's
    16-wide windows over 14 outputs per row give ``[B * L, C * K]`` (rows of 16
    contiguous elements), ConvNeXt's 2x2 windows over 28 outputs give ``[C * K, B * L]``
    (rows of 28). Batched per output row instead (``[B, oh, ow, C*K] @ W.T``), the
    GEMMs had m = ow (7 on ConvNeXt's last stage) and ran at a third of BLAS's pace."""
    b = x.shape[0]
    o = weight.shape[0]
    kernel = tuple(weight.shape[2:])
    nd = len(kernel)
    w = weight.reshape((o, -1))
    if outs[-1] > kernel[-1]:
        y = (w @ _patch_columns(x, kernel, outs)).reshape((o, b, *outs))
        return y.permute((1, 0, *range(2, nd + 2)))
    pt = _patches(x, kernel, outs)
    y = (pt.reshape((b * math.prod(outs), pt.shape[-1])) @ w.T).reshape((b, *outs, o))
    return y.permute((0, nd + 1, *range(1, nd + 1)))


def columns(tp: list[Var], groups: int) -> Var:
    """Taps ``[B, C, *outs]`` stacked to the column matrix ``[B, g, C/g * K, L]`` (per
    group, rows ordered (channel, kernel position) as a weight's are): one CONCAT of
    views, whose parts are each one loop nest reading the input contiguously along
    the output's rows. A GATHER at IOTA-computed indices (one loop nest for all) ran
    1.7-3.5x slower on a quiet machine: its index arithmetic per element costs more than
    the copy (docs/perf.md, "Convolution"; ``benchmarks/bench_conv.py``)."""
    b, c = tp[0].shape[:2]
    outs = tp[0].shape[2:]
    if len(tp) == 1:  # a 1x1 kernel: the tap itself (a view)
        return tp[0].reshape((b, groups, c // groups, math.prod(outs)))
    stacked = Var(concat([t.reshape((b, c, 1, *outs)).v for t in tp], 2))
    return stacked.reshape((b, groups, (c // groups) * len(tp), math.prod(outs)))


#: Output positions per image up to which a dense convolution of a batch is one GEMM
#: over the whole batch (columns ``[C*K, B*L]``) instead of one per image. With few
#: positions each per-image product is thin (n = 49 on ResNet-18's last stage) and BLAS
#: packs the whole weight again for each image: one thread, MKL, 512x4608 weight, batch
#: 8 took 14.4 ms per image-wise batch and 9.7 ms folded; 256x2304 at 196 positions 11.9
#: and 10.4 ms; at 784 positions both 9.6-9.7 ms; at 12544 folding lost (10.5 against
#: 15.3 ms) (docs/perf.md, "Session 12, CNN").
FOLD_MAX_POSITIONS = 256


def _batch_folded(x: Var, weight: Var, stride: Sequence[int], padding: Sequence[int],
                  dilation: Sequence[int], outs: Sequence[int]) -> Var:
    """A dense (``groups == 1``) convolution of a batch as ONE GEMM: the weight ``[O,
    C*K]`` times the columns of every image side by side, ``[C*K, B*L]`` (taps of the
    input read with its batch and channel axes swapped: views), giving ``[O, B, L]``,
    returned as the view ``[B, O, *outs]``."""
    b, c = x.shape[:2]
    o = weight.shape[0]
    kernel = tuple(weight.shape[2:])
    ck = c * math.prod(kernel)
    cols = _folded_columns(x, kernel, stride, padding, dilation, outs, 1).reshape(
        (ck, b * math.prod(outs)))
    y = (weight.reshape((o, ck)) @ cols).reshape((o, b, *outs))
    return y.permute((1, 0, *range(2, y.ndim)))


def conv_nd(x: Var, weight: Var, bias: Var | None, stride: Sequence[int],
            padding: Sequence[int], dilation: Sequence[int], groups: int,
            outs: Sequence[int],
            derive: Callable[[Var, str, Callable[[Var], Var]], Var] = inline) -> Var:
    """``F.conv{n}d`` of ``x [B, C, *P]`` and ``weight [O, C/g, *K]``: ``[B, O, *outs]``.
    ``derive``: ``Ctx.derive``, for values of the weight alone (Winograd's transform)."""
    b, c = x.shape[:2]
    o, cg = weight.shape[:2]
    kernel = tuple(weight.shape[2:])
    kk = math.prod(kernel)
    og = o // groups
    if b * o * math.prod(outs) == 0:
        return Var(const(0, x.dtype, (b, o, *outs)))
    if c * kk == 0:  # nothing to sum: the bias alone
        y = Var(const(0, x.dtype, (b, o, *outs)))
        return y + bias.reshape((o, *(1,) * len(outs))) if bias is not None else y
    if tuple(stride) == kernel and kk > 1 and not any(padding) \
            and all(d == 1 for d in dilation) and groups == 1:
        # windows that do not overlap (a patch embedding): one GEMM over the batch. Not a
        # 1x1 kernel: the dense form below serves it (one GEMM per image).
        y = _patch_conv(x, weight, tuple(outs))
        return y + bias.reshape((o, *(1,) * len(outs))) if bias is not None else y
    if _pixel_major(x, weight, stride, padding, groups):
        y = _pixel_major_conv(x, weight)
    elif cg == 1 and _flat_plane(kernel, stride, dilation, outs):
        y = (_depthwise_flat(x, weight, padding, outs) if tuple(stride) == (1, 1)
             else _depthwise_flat_phases(x, weight, stride, padding, outs))
    elif cg == 1:  # direct: one input channel per group (depthwise)
        tp = window_views(x, kernel, stride, padding, dilation, outs)
        y = _weighted_taps(tp, weight).reshape((b, o, *outs))
    elif winograd.applies(x, weight, tuple(stride), tuple(dilation), groups, tuple(outs)):
        y = winograd.conv3x3(x, weight, tuple(padding), tuple(outs), derive)
    elif groups == 1 and b > 1 and math.prod(outs) <= FOLD_MAX_POSITIONS:
        y = _batch_folded(x, weight, stride, padding, dilation, outs)
    else:
        cols = columns(im2col_taps(x, kernel, stride, padding, dilation, outs), groups)
        w = weight.reshape((1, groups, og, cg * kk))
        y = (w @ cols).reshape((b, o, *outs))
    if bias is not None:
        y = y + bias.reshape((o, *(1,) * len(outs)))
    return y


#: A 1x1 convolution whose input is channels-last data viewed channels-first (ConvNeXt's
#: MLP after its channels-last layer norm) is one GEMM with the positions as rows,
#: ``[B*L, C] @ W^T``, when its output has at least this many channels and no more
#: than the positions; otherwise the weight times the columns, as for every other
#: convolution. Through the GEMM driver here, a row-major product is faster with the
#: longer side as its rows, until the other gets narrow: ConvNeXt-atto at batch 8,
#: 640x160x1568 (channels x ... x positions) 1.91 ms, as 1568x160x640 1.60; 160 -> 40
#: channels over 25088 positions 2.6 ms per image against 3.4 as one [25088, 40]
#: product; the whole model 0.970-0.991x the time at batch 8, 0.994x at batch 1
#: (in-process A/Bs, docs/perf.md, session 23). The result is pixel-major: GELU and
#: the bias run on it in its layout, and the second 1x1 convolution takes it as is.
PIXEL_MAJOR_MIN_OUT = 64


def _channels_last_source(v: Value, ndim: int) -> bool:
    """Whether ``v`` (``[B, C, *spatial]``) is channels-last data permuted to
    channels-first, possibly under element-wise ops (a GELU, a bias, a layer norm's
    affine) whose every full-size operand leads back to such a permute."""
    channels_first = (0, ndim - 1, *range(1, ndim - 1))
    seen: dict[int, bool] = {}
    budget = 256  # values looked at, at most

    def ok(u: Value) -> bool:
        nonlocal budget
        if id(u) in seen:
            return seen[id(u)]
        budget -= 1
        if budget < 0:
            return False
        if u.op is Op.PERMUTE:
            r = tuple(u.attr("perm")) == channels_first
        elif u.op in ELEMENTWISE_OPS:
            big = [x for x in u.srcs if x.op not in (Op.CONST, Op.EXPAND)]
            r = bool(big) and all(ok(x) for x in big)
        else:
            r = False
        seen[id(u)] = r
        return r

    return ok(v)


def _pixel_major(x: Var, weight: Var, stride: Sequence[int], padding: Sequence[int],
                 groups: int) -> bool:
    """Whether a convolution runs as :func:`_pixel_major_conv` (see
    ``PIXEL_MAJOR_MIN_OUT``): 1x1, stride 1, unpadded, dense, its input channels-last
    data viewed channels-first."""
    o, positions = weight.shape[0], x.shape[0] * math.prod(x.shape[2:])
    return (groups == 1 and all(k == 1 for k in weight.shape[2:])
            and all(s == 1 for s in stride) and not any(padding)
            and PIXEL_MAJOR_MIN_OUT <= o <= positions
            and _channels_last_source(x.v, x.ndim))


def _pixel_major_conv(x: Var, weight: Var) -> Var:
    """A 1x1 convolution of channels-last data (ConvNeXt's MLP, whose layer norm runs
    channels-last) as ONE GEMM over the batch with the positions as rows: ``[B*L, C]
    @ W^T``, returned as the view ``[B, O, *spatial]``."""
    b, c = x.shape[:2]
    o = weight.shape[0]
    nd = x.ndim
    spatial = x.shape[2:]
    rows = x.permute((0, *range(2, nd), 1)).reshape((b * math.prod(spatial), c))
    y = (rows @ weight.reshape((o, c)).T).reshape((b, *spatial, o))
    return y.permute((0, nd - 1, *range(1, nd - 1)))


#: A 2-D depthwise convolution whose output rows are at most this wide is computed over
#: its padded plane flattened (``_depthwise_flat``). Rows of 7, 14 or 28 fill no whole
#: number of AVX-512 vectors: MobileNetV3's and ConvNeXt's later stages ran their taps
#: largely in remainders. Over the flat plane each tap is one shifted run of ``H * Wp``
#: elements; the ``Wp - W`` columns of each row computed past the edge are thrown away.
#: Session 18 (Zen 4, AVX-512; the whole program: padding, sum, bias; batch 8,
#: interleaved in one process, one and two threads; docs/perf.md), the flat form's time
#: over the rows': 7x7 planes 0.69-0.82, 14x14 0.72-0.95, 28x28 0.75-0.81, 56x56
#: 0.95-0.97 (rows of 56 nearly fill vectors; not taken then). Session 15 (Zen 3, one
#: thread): 7x7 and 14x14 planes 0.68-0.80, 28x28 with a 3x3 kernel 1.0. Session 23
#: took 56: each row of the tap loop began by setting up its 49 taps again (GCC keeps a
#: pointer per tap and spills them), which one 3472-long row per channel pays once:
#: ConvNeXt-atto's 7x7 on 56x56 planes 1.34 -> 1.11 ms per call at batch 8, the whole
#: model 0.987x the time (twice) at batch 8 and 0.981x at batch 1 (in-process A/Bs).
FLAT_MAX_WIDTH = 56
#: ... and has at least this many taps: the measured 5x5 and 7x7 kernels, whose sums are
#: work enough for the scheduler to store (``schedule.SHARED_MIN_WORK``).
FLAT_MIN_TAPS = 25


#: Whether a strided depthwise convolution with narrow output rows runs over its flat
#: phase planes (``_depthwise_flat_phases``) too: MobileNetV3-small's 5x5 stride-2
#: convolution to 7x7 planes 0.207 -> 0.127 ms, the model at batch 8 0.972x the time
#: and 0.978x at batch 1 (in-process A/Bs, docs/perf.md, session 25).
FLAT_PHASES = True


def _flat_plane(kernel: Sequence[int], stride: Sequence[int], dilation: Sequence[int],
                outs: Sequence[int]) -> bool:
    """Whether a depthwise convolution runs over its flat padded plane: 2-D, dilation 1
    and stride 1 (each tap is then a shift of the flat index) or, with ``FLAT_PHASES``,
    any stride (each tap a shift within one flat phase plane), narrow output rows, and
    ``FLAT_MIN_TAPS`` taps or more."""
    strided = tuple(stride) != (1, 1)
    return (len(kernel) == 2 and tuple(dilation) == (1, 1)
            and (not strided or (FLAT_PHASES and PHASE_TAPS))
            and outs[1] <= FLAT_MAX_WIDTH and math.prod(kernel) >= FLAT_MIN_TAPS)


def _depthwise_flat(x: Var, weight: Var, padding: Sequence[int], outs: Sequence[int]) -> Var:
    """A stride-1 2-D depthwise convolution of ``x [B, C, H, W]`` computed over the
    padded plane flattened: ``Wp = Wo + kw - 1`` columns per row and one spare row, so
    tap ``(i, j)`` is the run of ``Ho * Wp`` elements from ``i * Wp + j``. The result
    ``[B, O, Ho * Wp]`` is viewed as ``[B, O, Ho, Wp]`` and its first ``Wo`` columns
    taken; the scheduler stores such a sum (``schedule._narrowed``), so its loop runs
    over whole flat planes, not the ``Wo``-wide rows of its readers."""
    b, c, h, w_in = x.shape
    o = weight.shape[0]
    kh, kw = weight.shape[2:]
    ho, wo = outs
    wp, hp = wo + kw - 1, ho + kh  # the spare row keeps the last taps' runs in bounds
    pads = [padding[1], wp - w_in - padding[1], padding[0], hp - h - padding[0]]
    flat = pad_with(x, pads, const(0.0, x.dtype, ())).reshape((b, c, hp * wp))
    runs = [flat.slice((0, 0, i * wp + j), (b, c, ho * wp))
            for i in range(kh) for j in range(kw)]
    y = _weighted_taps(runs, weight).reshape((b, o, ho, wp))
    return y.slice((0, 0, 0, 0), (b, o, ho, wo))


def _depthwise_flat_phases(x: Var, weight: Var, stride: Sequence[int],
                           padding: Sequence[int], outs: Sequence[int]) -> Var:
    """A strided 2-D depthwise convolution over flat phase planes: the padded input laid
    out phase-major (:func:`_phase_planes`: plane ``(a, b)`` holds rows ``a::sh``,
    columns ``b::sw``), each plane ``qh x qw`` flattened with a spare row, so tap
    ``(i, j)`` is the run of ``Ho * qw`` elements of plane ``(i % sh, j % sw)`` from
    ``(i // sh) * qw + j // sw``. As :func:`_depthwise_flat`: the result is viewed
    ``[B, O, Ho, qw]`` and its first ``Wo`` columns taken. MobileNetV3-small's 5x5
    stride-2 convolution to 7x7 ran its taps over rows of 7."""
    b, c = x.shape[:2]
    o = weight.shape[0]
    kh, kw = weight.shape[2:]
    sh, sw = stride
    ho, wo = outs
    # one output row more than needed: a spare row of each plane keeps the last taps'
    # runs (which go on past their row's end) inside the plane
    planes, (qh, qw), _ = _phase_planes(x, (kh, kw), stride, padding, (1, 1),
                                        (ho + 1, wo), 0.0)
    # stacked as planes, flattened after: a plane flattened before its copy divides
    # every element's index by the row length
    stacked = planes.reshape((b, c, sh * sw, qh * qw))
    runs = [stacked.slice((0, 0, (i % sh) * sw + j % sw, (i // sh) * qw + j // sw),
                          (b, c, 1, ho * qw)).reshape((b, c, ho * qw))
            for i in range(kh) for j in range(kw)]
    y = _weighted_taps(runs, weight).reshape((b, o, ho, qw))
    return y.slice((0, 0, 0, 0), (b, o, ho, wo))


def _weighted_taps(tp: list[Var], weight: Var) -> Var:
    """A depthwise convolution's sum: tap ``i`` (``[B, C, *P]``, kernel positions
    row-major) times each of its channel's ``O / C`` weights at position ``i``, added
    as a tree; ``[B, C, O / C, *P]``. One function for the row form and the flat
    plane, so both sum the same terms in the same order (the same bits)."""
    b, c, *spatial = tp[0].shape
    og = weight.shape[0] // c
    w = weight.reshape((c, og, len(tp)))
    ones = (1,) * len(spatial)
    return tree_sum([t.reshape((b, c, 1, *spatial))
                     * w.slice((0, 0, i), (c, og, 1)).reshape((c, og, *ones))
                     for i, t in enumerate(tp)])


def tree_sum(terms: list[Var]) -> Var:
    """``terms`` added pairwise, a balanced tree: a fused kernel's sum of 49 taps is a
    chain of depth 6 instead of 49. A chain is latency-bound (each multiply-add waits
    4 cycles for the one before; the loop over a row overlaps only two or three rows'
    chains), a tree is not: a 7x7 depthwise convolution over [8, 40, 56, 56] took 6.0
    ms as a chain and 4.8 as a tree, one thread (docs/perf.md, session 15). The order is
    fixed, so results do not depend on the thread count."""
    while len(terms) > 1:
        terms = [terms[i] + terms[i + 1] if i + 1 < len(terms) else terms[i]
                 for i in range(0, len(terms), 2)]
    return terms[0]


def _check(x: Var, weight: Var) -> int:
    nd = x.ndim - 2
    if nd < 1 or x.ndim != weight.ndim:
        raise Unsupported(f"convolution of a {x.ndim}-D input with a {weight.ndim}-D weight")
    return nd


def _convolution(ctx: Ctx, x: Var, weight: Var, bias: Var | None, stride: Sequence[int],
                 padding: Sequence[int], dilation: Sequence[int], transposed: bool,
                 output_padding: Sequence[int], groups: int) -> Var:
    nd = _check(x, weight)
    d = ctx.out_dtype
    st, pa, di = (_expand_arg(v, nd, n) for v, n in ((stride, "stride"), (padding, "padding"),
                                                      (dilation, "dilation")))
    x, weight = x.cast(d), weight.cast(d)
    bias = bias.cast(d) if bias is not None else None
    outs = tuple(ctx.out_shape[2:])
    if not transposed:
        return conv_nd(x, weight, bias, st, pa, di, int(groups), outs, ctx.derive)
    return conv_transpose_nd(x, weight, bias, st, pa, di, int(groups), outs)


def conv_transpose_nd(x: Var, weight: Var, bias: Var | None, stride: Sequence[int],
                      padding: Sequence[int], dilation: Sequence[int], groups: int,
                      outs: Sequence[int]) -> Var:
    """``F.conv_transpose{n}d`` of ``x [B, C, *P]`` and ``weight [C, O/g, *K]``:
    ``[B, O, *outs]``. A transposed convolution is the adjoint of the convolution with
    the same weight, stride, padding and dilation from ``outs`` to ``P`` (that is what
    its weight's layout says: ``C`` is the forward's output channels), so it is that
    convolution's input gradient with ``x`` as the gradient, whichever way
    :func:`conv_input_grad` computes it. ``outs`` carries ``output_padding`` (the rows
    past the last window, which no input reaches: zeros plus the bias)."""
    b, c = x.shape[:2]
    o = weight.shape[1] * groups
    if b * o * math.prod(outs) == 0:
        return Var(const(0, x.dtype, (b, o, *outs)))
    if c * math.prod(x.shape[2:]) * math.prod(weight.shape[2:]) == 0:
        y = Var(const(0, x.dtype, (b, o, *outs)))  # nothing to sum: the bias alone
    else:
        y = conv_input_grad(x, weight, outs, stride, padding, dilation, groups)
    if bias is not None:
        y = y + bias.reshape((o, *(1,) * len(outs)))
    return y


def _dilate(g: Var, stride: Sequence[int]) -> Var:
    """``g [B, O, *outs]`` with ``stride - 1`` zeros after each element along each
    spatial dim: a CONCAT with a constant and a RESHAPE per strided dim (no scatter)."""
    lead = g.ndim - len(stride)
    for i, s in enumerate(stride):
        ax = lead + i
        if s > 1:
            shp = g.shape
            col = g.reshape((*shp[:ax + 1], 1, *shp[ax + 1:]))
            zeros = const(0, g.dtype, (*shp[:ax + 1], s - 1, *shp[ax + 1:]))
            g = Var(concat([col.v, zeros], ax + 1)).reshape(
                (*shp[:ax], shp[ax] * s, *shp[ax + 1:]))
    return g


def _flip_kernel(w: Var, nd: int) -> Var:
    """``w [..., *K]`` reversed along its last ``nd`` axes (CONCATs of one-wide windows;
    a weight is small)."""
    for ax in range(w.ndim - nd, w.ndim):
        n = w.shape[ax]
        if n > 1:
            parts = [w.slice(tuple(j if a == ax else 0 for a in range(w.ndim)),
                             tuple(1 if a == ax else s for a, s in enumerate(w.shape))).v
                     for j in reversed(range(n))]
            w = Var(concat(parts, ax))
    return w


def conv_input_grad(g: Var, weight: Var, in_sizes: Sequence[int], stride: Sequence[int],
                    padding: Sequence[int], dilation: Sequence[int], groups: int) -> Var:
    """The gradient of ``conv_nd`` with respect to its input: ``[B, C, *in_sizes]``."""
    nd = len(in_sizes)
    o, cg = weight.shape[:2]
    kernel = weight.shape[2:]
    og = o // groups
    full = [(k - 1) * d for k, d in zip(kernel, dilation, strict=True)]
    # a full correlation, less the forward's padding (negative: cropped); taps extends
    # the dilated gradient with zeros on the right as far as in_sizes needs
    pads = [f - p for f, p in zip(full, padding, strict=True)]
    dense_winograd = (og > 1 and INPUT_GRAD_WINOGRAD and pads == list(padding)
                      and winograd.applies(g, weight, tuple(stride), tuple(dilation), groups,
                                           tuple(in_sizes)))
    if og > 1 and not dense_winograd:
        # dense: col2im; a depthwise-like one stays a direct (fused) convolution
        return _col2im_input_grad(g, weight, in_sizes, stride, padding, dilation, groups)
    gd = _dilate(g, stride)
    wt = weight.reshape((groups, og, cg, *kernel)).permute(
        (0, 2, 1, *range(3, 3 + nd))).reshape((groups * cg, og, *kernel))
    wt = _flip_kernel(wt, nd)
    return conv_nd(gd, wt, None, (1,) * nd, pads, dilation, groups, tuple(in_sizes))


#: Dense stride-1 input gradients that Winograd takes (a 3x3 kernel, padding 1, the
#: conditions of ``winograd.applies``) run as the transposed convolution of the
#: gradient, through Winograd as the forward does, instead of col2im: 2.25-4x fewer
#: multiply-adds and no column matrix nine times the gradient's size.
INPUT_GRAD_WINOGRAD = True


def _folded_columns(x: Var, kernel: Sequence[int], stride: Sequence[int],
                    padding: Sequence[int], dilation: Sequence[int], outs: Sequence[int],
                    groups: int) -> Var:
    """The column matrix of every image side by side: ``[g, C/g * K, B * L]`` (rows
    ordered (channel, kernel position) as a weight's are, columns (image, position)):
    the windowed taps of the input read with its batch and channel axes swapped
    (views), stacked in one CONCAT. The forward's GEMM over the batch reads it
    (:func:`_batch_folded`), the weight gradient reads it transposed."""
    b, c = x.shape[:2]
    kk = math.prod(kernel)
    n = b * math.prod(outs)
    xt = x.permute((1, 0, *range(2, x.ndim)))  # [C, B, *P]
    tp = im2col_taps(xt, kernel, stride, padding, dilation, outs)  # each [C, B, *outs]
    if kk == 1:
        return tp[0].reshape((groups, c // groups, n))
    stacked = Var(concat([t.reshape((c, 1, b, *outs)).v for t in tp], 1))
    return stacked.reshape((groups, (c // groups) * kk, n))


def _batch_major(g: Var, groups: int) -> Var:
    """The output gradient ``[B, O, *outs]`` as ``[g, O/g, B * L]``: one GEMM operand
    over the whole batch (a permuted copy the size of the gradient)."""
    b, o = g.shape[:2]
    n = b * math.prod(g.shape[2:])
    return g.permute((1, 0, *range(2, g.ndim))).reshape((groups, o // groups, n))


def _col2im_input_grad(g: Var, weight: Var, in_sizes: Sequence[int], stride: Sequence[int],
                       padding: Sequence[int], dilation: Sequence[int], groups: int) -> Var:
    """The input gradient of a strided convolution as col2im: the columns' gradient is
    one batched GEMM (the weight transposed times the output gradient), and each kernel
    position's slice of it goes back where its tap came from (dilated by the stride,
    shifted: views), all of them summed in one fused kernel. Measured against the
    transposed convolution of the dilated gradient (im2col of it and a GEMM): 1.7-2.5x
    faster at stride 2, which multiplies ``prod(stride)`` times as many zeros there,
    and 1.0-1.4x at stride 1 (ResNet-18's shapes, batch 1 and 8).

    Up to ``FOLD_MAX_POSITIONS`` positions per image the columns' gradient is one GEMM
    over the batch (``[C*K, O] x [O, B*L]``), as the forward's product is: per image its
    ``n`` was the positions alone (16 on ResNet-18's last stage at 112x112), and BLAS
    packed the whole weight again for each image (docs/perf.md, "Session 13")."""
    b, o = g.shape[:2]
    outs = g.shape[2:]
    _, cg = weight.shape[:2]
    kernel = tuple(weight.shape[2:])
    og = o // groups
    kk = math.prod(kernel)
    c = groups * cg
    wt = weight.reshape((groups, og, cg * kk)).permute((0, 2, 1))  # [g, CK, O/g]
    folded = b > 1 and math.prod(outs) <= FOLD_MAX_POSITIONS
    if folded:  # [C, K, B, *outs]: each tap read with its batch and channel axes swapped
        dcols = (wt @ _batch_major(g, groups)).reshape((c, kk, b, *outs))
    else:
        dcols = (wt.reshape((1, groups, cg * kk, og)) @ g.reshape(
            (b, groups, og, math.prod(outs)))).reshape((b, c, kk, *outs))
    zero = const(0, g.dtype, ())
    tap_list: list[tuple[tuple[int, ...], Var]] = []
    for t, pos in enumerate(itertools.product(*(range(k) for k in kernel))):
        if folded:
            tap = dcols.slice((0, t, 0, *(0,) * len(outs)), (c, 1, b, *outs)).reshape(
                (c, b, *outs)).permute((1, 0, *range(2, 2 + len(outs))))
        else:
            tap = dcols.slice((0, 0, t, *(0,) * len(outs)), (b, c, 1, *outs)).reshape(
                (b, c, *outs))
        tap_list.append((pos, tap))
    if COL2IM_PHASES and any(st > 1 for st in stride):
        return _phases_input_grad(tap_list, in_sizes, stride, padding, dilation)
    dx: Var | None = None
    for pos, tap in tap_list:
        placed = _dilate(tap, stride)
        pads: list[int] = []
        for i, n in enumerate(in_sizes):
            lo = pos[i] * dilation[i] - padding[i]
            pads[:0] = [lo, n - lo - placed.shape[2 + i]]
        placed = pad_with(placed, pads, zero)
        dx = placed if dx is None else dx + placed
    assert dx is not None
    return dx


#: A strided convolution's col2im sums its taps per output phase
#: (:func:`_phases_input_grad`), not as taps dilated with zeros.
COL2IM_PHASES = True


def _phases_input_grad(taps_: list[tuple[tuple[int, ...], Var]], in_sizes: Sequence[int],
                       stride: Sequence[int], padding: Sequence[int],
                       dilation: Sequence[int]) -> Var:
    """col2im of a strided convolution by output phase: input position ``s * a + r``
    (phase ``r`` along each dim) receives only the taps whose offset ``pos * d - p`` is
    ``r`` modulo the stride, each shifted by a whole number of positions. So each
    phase is a dense sum of shifted windows (contiguous along rows, which the compiler
    vectorizes), and the phases are interleaved at the end, where the dilated taps
    were each read at ``j / s`` with masks (ResNet-18's stride-2 layers: scalar loops,
    ~5 ms of a 100 ms backward at batch 8, docs/perf.md, session 21)."""
    from .winograd import stack

    nd = len(in_sizes)
    b, c = taps_[0][1].shape[:2]
    outs = taps_[0][1].shape[2:]
    dtype = taps_[0][1].dtype
    zero = const(0, dtype, ())
    size = [-(-n // st) for n, st in zip(in_sizes, stride, strict=True)]  # per phase
    phases: dict[tuple[int, ...], Var] = {}
    for r in itertools.product(*(range(st) for st in stride)):
        acc: Var | None = None
        for pos, tap in taps_:
            lo = [pos[i] * dilation[i] - padding[i] for i in range(nd)]
            if any((r[i] - lo[i]) % stride[i] for i in range(nd)):
                continue
            q = [(r[i] - lo[i]) // stride[i] for i in range(nd)]  # phase[a] = tap[a + q]
            if any(max(0, -q[i]) >= min(size[i], outs[i] - q[i]) for i in range(nd)):
                continue  # no a in [0, size) with a + q in [0, outs): outside this phase
            pads: list[int] = []
            for i in range(nd):
                pads[:0] = [-q[i], size[i] - outs[i] + q[i]]
            shifted = pad_with(tap, pads, zero)
            acc = shifted if acc is None else acc + shifted
        phases[r] = acc if acc is not None else Var(const(0, dtype, (b, c, *size)))

    def interleave(level: int, prefix: tuple[int, ...]) -> Var:
        if level == nd:
            return phases[prefix]
        parts = [interleave(level + 1, (*prefix, r)) for r in range(stride[level])]
        if len(parts) == 1:
            return parts[0]
        ax = 2 + level
        y = stack(parts, ax + 1)  # [..., size, stride, ...]
        shp = y.shape
        return y.reshape((*shp[:ax], shp[ax] * shp[ax + 1], *shp[ax + 2:]))

    dx = interleave(0, ())
    if tuple(dx.shape[2:]) != tuple(in_sizes):
        dx = dx.slice((0,) * dx.ndim, (b, c, *in_sizes))
    return dx


def conv_weight_grad(g: Var, x: Var, wshape: Sequence[int], stride: Sequence[int],
                     padding: Sequence[int], dilation: Sequence[int], groups: int) -> Var:
    """The gradient of ``conv_nd`` with respect to its weight ``[O, C/g, *K]``.

    A dense or grouped one is ONE GEMM over the batch: the output gradient ``[O, B*L]``
    times the columns of every image side by side, read transposed (``[C*K, B*L]``,
    :func:`_folded_columns`), so the sum over images and positions is the GEMM's inner
    dimension. The former GEMM per image, summed over the batch after, wrote ``B``
    weight-sized products and summed them in a pass that read them with the batch axis
    innermost (24 ms of a 300 ms backward for each 512x512x3x3 weight at batch 8), and
    its ``k`` was one image's positions (16 on ResNet-18's last stage at 112x112)."""
    b, o = g.shape[:2]
    outs = g.shape[2:]
    cg = wshape[1]
    kernel = tuple(wshape[2:])
    og = o // groups
    if cg == 1:  # depthwise: one product of tap and gradient reduced per kernel position
        tp = taps(x, kernel, stride, padding, dilation, outs)
        gg = g.reshape((b, groups, og, *outs))
        red = (0, *range(3, 3 + len(outs)))
        parts = [(gg * t.reshape((b, groups, 1, *outs))).sum(red).reshape((groups, og, 1)).v
                 for t in tp]
        return Var(concat(parts, 2)).reshape(tuple(wshape))
    if (WEIGHT_GRAD_WINOGRAD and list(padding) == [1] * len(outs)
            and winograd.applies(x, tuple(wshape), tuple(stride), tuple(dilation), groups,
                                 tuple(outs))):
        return winograd.weight_grad3x3(g, x, tuple(padding))
    cols = _folded_columns(x, kernel, stride, padding, dilation, outs, groups)
    return (_batch_major(g, groups) @ cols.permute((0, 2, 1))).reshape(tuple(wshape))


#: Dense stride-1 3x3 weight gradients that Winograd takes (padding 1, the conditions
#: of ``winograd.applies``) run through F(m x m, 3 x 3) (``winograd.weight_grad3x3``)
#: instead of the column matrix's GEMM.
WEIGHT_GRAD_WINOGRAD = True


def _convolution_backward(ctx: Ctx, grad: Var, x: Var, weight: Var,
                          bias_sizes: Sequence[int] | None, stride: Sequence[int],
                          padding: Sequence[int], dilation: Sequence[int], transposed: bool,
                          output_padding: Sequence[int], groups: int,
                          output_mask: Sequence[bool]) -> tuple[Var | None, ...]:
    nd = _check(x, weight)
    st, pa, di = (_expand_arg(v, nd, n) for v, n in ((stride, "stride"), (padding, "padding"),
                                                      (dilation, "dilation")))
    info = next(i for i in ctx.out if i is not None)
    d = isa_dtype(info.dtype)
    g, x, w = grad.cast(d), x.cast(d), weight.cast(d)
    if 0 in g.shape or 0 in x.shape or 0 in w.shape:
        raise Unsupported("convolution backward of an empty tensor")
    res: list[Var | None] = [None, None, None]
    if transposed:
        # y = conv_input_grad(x, w) (conv_transpose_nd): its adjoint in x is the
        # convolution of the output gradient with w, and its weight gradient is the
        # forward's, with the output gradient as that convolution's input and x as its
        # output gradient
        if output_mask[0]:
            res[0] = conv_nd(g, w, None, st, pa, di, int(groups), x.shape[2:])
        if output_mask[1]:
            res[1] = conv_weight_grad(x, g, w.shape, st, pa, di, int(groups))
    else:
        if output_mask[0]:
            res[0] = conv_input_grad(g, w, x.shape[2:], st, pa, di, int(groups))
        if output_mask[1]:
            res[1] = conv_weight_grad(g, x, w.shape, st, pa, di, int(groups))
    if output_mask[2]:
        res[2] = staged_sum(g, (0, *range(2, g.ndim)))
    return tuple(res)


# One row per ATen op (overload packet).
ROWS: dict[Any, Callable[..., Any]] = {
    aten.convolution: _convolution,
    aten.convolution_backward: _convolution_backward,
}
