"""WebGPU backend vs CPU backend on this machine: GELU 1M, softmax 1024x1024, GEMM 256^3.

    .venv/bin/python benchmarks/bench_webgpu.py [--json out.json] [--quick]

Read the figures for what they are. On Mesa's lavapipe (the CI adapter, and the only
one on a GPU-less box) the "GPU" is an LLVM-compiled SIMD emulation running on the
same CPU cores as the cpu backend, so this measures that the WebGPU path works end
to end and what it costs, not GPU speed. Every WebGPU launch also copies its inputs
to device buffers and its outputs back (the executor's buffers are host memory), so
the "copy only" row (a program that only copies its input) is that floor.
"""

from __future__ import annotations

import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
from common import Report, guarded, max_abs_err, measure, once  # noqa: E402


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    args = p.parse_args()
    import numpy as np

    hg = common.quiet_hologram()
    from hologram import ops
    from hologram.isa import builder as b

    rep = Report("webgpu", "WebGPU backend vs CPU backend (same machine, same data)")
    reason = hg.backend.why_unavailable("webgpu")
    if reason is not None:
        rep.note(f"webgpu unavailable here: {reason}")
        rep.finish(args)
        return
    cpu = hg.Executor("cpu")
    wg = hg.Executor("webgpu")
    rep.data["adapter"] = wg.backend.describe()
    rep.note(f"adapter: {wg.backend.describe()}")
    if "cpu adapter" in wg.backend.describe():
        rep.note("this adapter is a CPU (lavapipe/llvmpipe): the figures measure that the "
                 "WebGPU path is correct and what it costs here, not GPU speed")
    rep.note("each WebGPU launch uploads its inputs and reads its outputs back (host "
             "buffers are the source of truth); 'copy only' is that round trip alone")
    repeat = 5 if args.quick else 15
    rng = np.random.default_rng(0)

    def put(ex, a):
        buf = ex.allocate(a.shape)
        buf.from_numpy(a)
        return buf

    def gelu_ref(x):
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))

    def softmax_ref(x):
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    x1 = (rng.standard_normal(1_000_000) * 3).astype(np.float32)
    xs = rng.standard_normal((1024, 1024)).astype(np.float32)
    ga = rng.standard_normal((256, 256)).astype(np.float32)
    gb = rng.standard_normal((256, 256)).astype(np.float32)
    cases = [
        ("gelu, 1M f32", [x1], x1.shape, lambda e, i, o: ops.gelu(e, *i, o),
         gelu_ref(x1.astype(np.float64))),
        ("softmax, 1024x1024 f32", [xs], xs.shape, lambda e, i, o: ops.softmax(e, *i, o),
         softmax_ref(xs.astype(np.float64))),
        ("gemm, 256x256 @ 256x256 f32", [ga, gb], (256, 256),
         lambda e, i, o: ops.gemm(e, *i, o), ga.astype(np.float64) @ gb),
    ]
    summary = rep.grid("summary: webgpu time / cpu time (lower is better)",
                       ["op", "cpu ms", "webgpu ms", "webgpu / cpu", "copy-only ms",
                        "webgpu first call s"])
    for title, arrays, out_shape, call, want in cases:
        t = rep.table(title, baseline="cpu", unit="ms", extra_cols=("max err",))
        times: dict[str, float] = {}
        first = "-"
        for name, ex in (("cpu", cpu), ("webgpu", wg)):
            ins = [put(ex, a) for a in arrays]
            out = ex.allocate(out_shape)
            secs, _ = once(lambda ex=ex, ins=ins, out=out, call=call: call(ex, ins, out))
            if name == "webgpu":
                first = f"{secs:.2f}"
            err = f"{max_abs_err(out.to_numpy(), want):.1e}"
            tm = guarded(t, name, lambda ex=ex, ins=ins, out=out, call=call: measure(
                lambda: call(ex, ins, out), repeat=repeat, max_s=10),
                note="first call (compile) excluded", **{"max err": err})
            if tm is not None:
                times[name] = tm.median
        # the host<->device round trip of the same bytes, with a kernel that only copies
        copy = b.program(lambda v: v * 1.0, [("f32", arrays[0].shape)])
        src, dst = arrays[0], np.empty(arrays[0].shape, np.float32)
        wg.launch(copy, [src], [dst])
        tc = guarded(t, "webgpu copy only", lambda copy=copy, src=src, dst=dst: measure(
            lambda: wg.launch(copy, [src], [dst]), repeat=repeat, max_s=10),
            note="upload + copy kernel + read back of the first input's bytes")
        ratio = (times["webgpu"] / times["cpu"]) if {"cpu", "webgpu"} <= set(times) else None
        summary.add(title, common.fmt_time(times.get("cpu"), "ms"),
                    common.fmt_time(times.get("webgpu"), "ms"),
                    f"{ratio:.2f}" if ratio else "-",
                    common.fmt_time(tc.median if tc else None, "ms"), first)
    rep.data["device_memory"] = wg.backend.memory_stats()
    rep.note(f"device buffers cached after the run: {wg.backend.memory_stats()}")
    rep.finish(args)


if __name__ == "__main__":
    main()
