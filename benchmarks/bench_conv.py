"""How a convolution should run inside a hologram program: the alternatives measured for
``hologram_torch/lowering/convolution.py`` (issue 19), against ``F.conv2d`` (oneDNN).

    .venv/bin/python benchmarks/bench_conv.py [--json out.json] [--quick]

Dense convolutions (ResNet-18's layers, batch 1 and 8): the taps (SLICE views of the
padded input) stacked with a CONCAT (``columns``, what the lowering does) against the
column matrix built as one GATHER at IOTA-computed indices (:func:`gather_columns`,
here), each feeding the same batched GEMM; plus each column matrix alone, a copy of
the same size (the floor of any im2col) and the GEMM alone on ready columns.
Depthwise convolutions (MobileNet's 3x3, ConvNeXt's 7x7): the direct form (taps
times weights summed, one fused kernel: what the lowering does) against the GATHERed
columns reduced over the kernel axis. Backward (ResNet-18's shapes, batch 8): the
lowering's input gradient (col2im) and weight gradient (a GEMM per image, summed)
against ATen's ``convolution_backward`` (oneDNN). Samples interleaved, medians.
"""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
from common import Candidate, Report, add_interleaved  # noqa: E402

#: (batch, channels in, size, channels out, kernel, stride, padding)
DENSE = ((1, 64, 56, 64, 3, 1, 1), (8, 64, 56, 64, 3, 1, 1), (8, 128, 28, 128, 3, 1, 1),
         (1, 256, 14, 256, 3, 1, 1), (1, 3, 224, 64, 7, 2, 3), (8, 3, 224, 64, 7, 2, 3))
#: (batch, channels, size, kernel): stride 1, "same" padding
DEPTHWISE = ((1, 96, 28, 3), (8, 96, 28, 3), (1, 40, 56, 7), (8, 40, 56, 7))


def gather_columns(x: Any, kernel: tuple[int, ...], stride: tuple[int, ...],
                   padding: tuple[int, ...], dilation: tuple[int, ...],
                   outs: tuple[int, ...]) -> Any:
    """The column matrix ``[B, 1, C * K, L]`` of ``x [B, C, *P]`` as one GATHER from the
    input flattened over its spatial dims, at an index computed from IOTAs, with a zero
    where a window reaches into the padding (the alternative to the lowering's CONCAT
    of taps)."""
    import math

    from hologram.isa import dtypes
    from hologram.isa.builder import Var, const, iota
    from hologram_torch.lowering.context import and_, not_

    i64 = dtypes.i64
    b, c = x.shape[:2]
    sizes = x.shape[2:]
    nd = len(kernel)
    grid = (1, 1, *kernel, *outs)
    flat = inside = None
    for i in range(nd):
        pos = (Var(iota(grid, 2 + nd + i, i64)) * stride[i]
               + Var(iota(grid, 2 + i, i64)) * dilation[i] - padding[i])
        ok = and_(not_(pos < 0), pos < sizes[i])
        inside = ok if inside is None else and_(inside, ok)
        term = pos * math.prod(sizes[i + 1:])
        flat = term if flat is None else flat + term
    tl = math.prod(kernel) * math.prod(outs)
    inside = inside.reshape((1, 1, tl))
    idx = inside.where(flat.reshape((1, 1, tl)), 0).expand((b, c, tl))
    vals = x.reshape((b, c, math.prod(sizes))).gather(idx, 2)
    cols = inside.where(vals, Var(const(0, x.dtype, ())))
    return cols.reshape((b, 1, c * math.prod(kernel), math.prod(outs)))


def _dense(rep: Report, case: tuple[int, ...], repeat: int) -> None:
    import numpy as np
    import torch

    import hologram as hg
    from hologram_torch.lowering.convolution import columns, taps

    b, c, h, o, k, s, p = case
    ho = (h + 2 * p - k) // s + 1
    geo = ((k, k), (s, s), (p, p), (1, 1), (ho, ho))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((b, c, h, h), dtype=np.float32)
    w = rng.standard_normal((o, c, k, k), dtype=np.float32)
    ready = rng.standard_normal((b, 1, c * k * k, ho * ho), dtype=np.float32)

    def w_mat(w: Any) -> Any:
        return w.reshape((1, 1, o, c * k * k))

    gather_conv = hg.jit(lambda x, w: w_mat(w) @ gather_columns(x, *geo))
    concat_conv = hg.jit(lambda x, w: w_mat(w) @ columns(taps(x, *geo), 1))
    concat_only = hg.jit(lambda x: columns(taps(x, *geo), 1))
    gather_only = hg.jit(lambda x: gather_columns(x, *geo))
    copy = hg.jit(lambda r: r * 1.0001)
    gemm = hg.jit(lambda r, w: w_mat(w) @ r)
    tx, tw = torch.from_numpy(x), torch.from_numpy(w)
    want = torch.nn.functional.conv2d(tx, tw, None, s, p).numpy().reshape(b, 1, o, -1)
    for f in (gather_conv, concat_conv):
        np.testing.assert_allclose(f(x, w), want, rtol=1e-3, atol=1e-3 * np.sqrt(c * k * k))
    title = f"dense conv {c}->{o} {k}x{k} stride {s}, {h}x{h}, batch {b}"
    t = rep.table(title, baseline="F.conv2d", unit="ms")
    cands: dict[str, Any] = {
        "F.conv2d": lambda: torch.nn.functional.conv2d(tx, tw, None, s, p),
        "GATHER columns + GEMM": lambda: gather_conv(x, w),
        "CONCAT of taps + GEMM": lambda: concat_conv(x, w),
        "CONCAT columns alone": lambda: concat_only(x),
        "GATHER columns alone": lambda: gather_only(x),
        "copy of the columns' size": lambda: copy(ready),
        "GEMM alone": lambda: gemm(ready, w),
    }
    add_interleaved(t, {n: Candidate(f) for n, f in cands.items()}, repeat=repeat)


def _depthwise(rep: Report, case: tuple[int, ...], repeat: int) -> None:
    import numpy as np
    import torch

    import hologram as hg
    from hologram_torch.lowering.convolution import conv_nd

    b, c, h, k = case
    p = k // 2
    geo = ((k, k), (1, 1), (p, p), (1, 1), (h, h))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((b, c, h, h), dtype=np.float32)
    w = rng.standard_normal((c, 1, k, k), dtype=np.float32)
    direct = hg.jit(lambda x, w: conv_nd(x, w, None, (1, 1), (p, p), (1, 1), c, (h, h)))
    reduced = hg.jit(lambda x, w: (gather_columns(x, *geo).reshape((b, c, k * k, h * h))
                                   * w.reshape((1, c, k * k, 1))).sum(2).reshape((b, c, h, h)))
    tx, tw = torch.from_numpy(x), torch.from_numpy(w)
    want = torch.nn.functional.conv2d(tx, tw, None, 1, p, 1, c).numpy()
    for f in (direct, reduced):
        np.testing.assert_allclose(f(x, w), want, rtol=1e-3, atol=1e-3 * k)
    title = f"depthwise conv {c} channels {k}x{k}, {h}x{h}, batch {b}"
    t = rep.table(title, baseline="F.conv2d", unit="ms")
    cands: dict[str, Any] = {
        "F.conv2d": lambda: torch.nn.functional.conv2d(tx, tw, None, 1, p, 1, c),
        "direct (taps summed)": lambda: direct(x, w),
        "GATHER columns reduced": lambda: reduced(x, w),
    }
    add_interleaved(t, {n: Candidate(f) for n, f in cands.items()}, repeat=repeat)


#: (batch, channels in, size, channels out, kernel, stride, padding)
BACKWARD = ((8, 64, 28, 64, 3, 1, 1), (8, 64, 28, 128, 3, 2, 1), (8, 64, 28, 128, 1, 2, 0),
            (8, 128, 14, 256, 3, 2, 1), (8, 256, 7, 256, 3, 1, 1))


def _backward(rep: Report, case: tuple[int, ...], repeat: int) -> None:
    import numpy as np
    import torch

    import hologram as hg
    from hologram_torch.lowering.convolution import conv_input_grad, conv_weight_grad

    b, c, h, o, k, s, p = case
    ho = (h + 2 * p - k) // s + 1
    rng = np.random.default_rng(0)
    x = rng.standard_normal((b, c, h, h), dtype=np.float32)
    w = rng.standard_normal((o, c, k, k), dtype=np.float32)
    gy = rng.standard_normal((b, o, ho, ho), dtype=np.float32)
    geo = ((s, s), (p, p), (1, 1), 1)
    dx = hg.jit(lambda gy, w: conv_input_grad(gy, w, (h, h), *geo))
    dw = hg.jit(lambda gy, x: conv_weight_grad(gy, x, w.shape, *geo))
    tx, tw, tg = torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(gy)

    def aten(mask: list[bool]) -> Any:
        return torch.ops.aten.convolution_backward(tg, tx, tw, None, [s, s], [p, p], [1, 1],
                                                   False, [0, 0], 1, mask)

    want_dx, want_dw = aten([True, True, False])[:2]
    np.testing.assert_allclose(dx(gy, w), want_dx.numpy(), rtol=1e-3, atol=1e-2)
    np.testing.assert_allclose(dw(gy, x), want_dw.numpy(), rtol=1e-3, atol=1e-1)
    for what, ours, mask in (("input", lambda: dx(gy, w), [True, False, False]),
                             ("weight", lambda: dw(gy, x), [False, True, False])):
        title = f"{what} gradient, conv {c}->{o} {k}x{k} stride {s}, {h}x{h}, batch {b}"
        t = rep.table(title, baseline="ATen convolution_backward", unit="ms")
        add_interleaved(t, {"ATen convolution_backward": Candidate(lambda m=mask: aten(m)),
                            "hologram": Candidate(ours)}, repeat=repeat)


def main() -> None:
    args = common.parser(__doc__.splitlines()[0]).parse_args()
    common.quiet_hologram()
    rep = Report("conv", "convolution inside hologram programs: the alternatives")
    repeat = 5 if args.quick else 15
    for case in DENSE:
        _dense(rep, case, repeat)
    for case in DEPTHWISE:
        _depthwise(rep, case, repeat)
    for case in BACKWARD:
        _backward(rep, case, repeat)
    rep.finish(args)


if __name__ == "__main__":
    main()
