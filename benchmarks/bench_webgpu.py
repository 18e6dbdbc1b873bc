"""WebGPU backend vs CPU backend on this machine: GELU 1M, softmax 1024x1024, GEMM 256^3.

    .venv/bin/python benchmarks/bench_webgpu.py [--json out.json] [--quick] [--scale S]

Read the figures for what they are. On Mesa's lavapipe (the CI adapter, and the only
one on a GPU-less box) the "GPU" is an LLVM-compiled SIMD emulation running on the
same CPU cores as the cpu backend, so this measures that the WebGPU path works end
to end and what it costs, not GPU speed.

Rows: "webgpu, device buffers" runs the op on the executor's Buffers, which live in
device memory (no copies; each sample waits for the device). "webgpu, NumPy operands"
runs the same program on host arrays (``Executor.launch``), which uploads the inputs
and reads the outputs back every launch; "copy only" (a program that only copies its
input, on host arrays) is that round trip's floor. ``--scale`` shrinks every size
(0.1 for a smoke run).
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
    p.add_argument("--scale", type=float, default=1.0, help="size factor (0.1: smoke run)")
    args = p.parse_args()
    import numpy as np

    hg = common.quiet_hologram()
    from hologram import ops
    from hologram.isa import builder as b
    from hologram.ops import composites as F

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
    rep.note("'webgpu, device buffers': ops on the executor's Buffers (device memory, "
             "bound in place, synchronized per sample); 'webgpu, NumPy operands': the same "
             "program on host arrays, uploaded and read back every launch; 'copy only' is "
             "that round trip alone")
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

    def scaled(n: int) -> int:
        return max(16, int(n * args.scale))

    n1, ns, ng = scaled(1_000_000), scaled(1024), scaled(256)
    x1 = (rng.standard_normal(n1) * 3).astype(np.float32)
    xs = rng.standard_normal((ns, ns)).astype(np.float32)
    ga = rng.standard_normal((ng, ng)).astype(np.float32)
    gb = rng.standard_normal((ng, ng)).astype(np.float32)
    # (title, inputs, output shape, op on Buffers, the same as a traced program, reference)
    cases = [
        (f"gelu, {n1:,} f32", [x1], x1.shape, lambda e, i, o: ops.gelu(e, *i, o),
         lambda v: F.gelu_tanh(v), gelu_ref(x1.astype(np.float64))),
        (f"softmax, {ns}x{ns} f32", [xs], xs.shape, lambda e, i, o: ops.softmax(e, *i, o),
         lambda v: F.softmax(v, -1), softmax_ref(xs.astype(np.float64))),
        (f"gemm, {ng}x{ng} @ {ng}x{ng} f32", [ga, gb], (ng, ng),
         lambda e, i, o: ops.gemm(e, *i, o), lambda u, v: u @ v, ga.astype(np.float64) @ gb),
    ]
    summary = rep.grid("summary: webgpu time / cpu time (lower is better)",
                       ["op", "cpu ms", "webgpu device ms", "webgpu / cpu",
                        "webgpu NumPy ms", "copy-only ms", "webgpu first call s"])
    for title, arrays, out_shape, call, fn, want in cases:
        t = rep.table(title, baseline="cpu", unit="ms", extra_cols=("max err",))
        times: dict[str, float] = {}
        first = "-"
        for name, ex in (("cpu", cpu), ("webgpu, device buffers", wg)):
            ins = [put(ex, a) for a in arrays]
            out = ex.allocate(out_shape)

            def run(ex=ex, ins=ins, out=out, call=call):
                call(ex, ins, out)
                ex.synchronize()  # device launches return before the device is done

            secs, _ = once(run)
            if ex is wg:
                first = f"{secs:.2f}"
            err = f"{max_abs_err(out.to_numpy(), want):.1e}"
            tm = guarded(t, name, lambda run=run: measure(run, repeat=repeat, max_s=10),
                         note="first call (compile) excluded", **{"max err": err})
            if tm is not None:
                times[name] = tm.median
        # the same program on NumPy arrays: inputs uploaded, outputs read back per launch
        prog = b.program(fn, [("f32", a.shape) for a in arrays])
        host_out = np.empty(out_shape, np.float32)
        wg.launch(prog, arrays, [host_out])
        err = f"{max_abs_err(host_out, want):.1e}"
        tn = guarded(t, "webgpu, NumPy operands", lambda prog=prog, arrays=arrays,
                     host_out=host_out: measure(lambda: wg.launch(prog, arrays, [host_out]),
                                                repeat=repeat, max_s=10),
                     note="copy per launch: upload inputs, read outputs back",
                     **{"max err": err})
        # the host<->device round trip of the same bytes, with a kernel that only copies
        copy = b.program(lambda v: v * 1.0, [("f32", arrays[0].shape)])
        src, dst = arrays[0], np.empty(arrays[0].shape, np.float32)
        wg.launch(copy, [src], [dst])
        tc = guarded(t, "webgpu copy only", lambda copy=copy, src=src, dst=dst: measure(
            lambda: wg.launch(copy, [src], [dst]), repeat=repeat, max_s=10),
            note="upload + copy kernel + read back of the first input's bytes")
        dev = times.get("webgpu, device buffers")
        ratio = dev / times["cpu"] if dev and "cpu" in times else None
        summary.add(title, common.fmt_time(times.get("cpu"), "ms"),
                    common.fmt_time(dev, "ms"), f"{ratio:.2f}" if ratio else "-",
                    common.fmt_time(tn.median if tn else None, "ms"),
                    common.fmt_time(tc.median if tc else None, "ms"), first)
    rep.data["executor_memory"] = wg.memory_stats()
    rep.data["staging_cache"] = wg.backend.memory_stats()
    rep.note(f"webgpu executor pools (device memory): {wg.memory_stats()['allocated_bytes']} "
             f"bytes allocated; launch staging cache: {wg.backend.memory_stats()}")
    rep.finish(args)


if __name__ == "__main__":
    main()
