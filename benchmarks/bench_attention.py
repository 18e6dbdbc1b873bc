"""Scaled-dot-product attention: time and peak memory of ``F.scaled_dot_product_attention``
in eager PyTorch (ATen's fused CPU flash kernel), under ``torch.compile(backend=
"hologram")`` (the ISA's fused attention step) and under Inductor, at sequence 512 and
2048 (B=1, H=8, E=64, f32, causal: LLaMA's case), inference (forward, no grad) and
training (forward + backward).

    .venv/bin/python benchmarks/bench_attention.py [--json out.json] [--quick]
    .venv/bin/python benchmarks/bench_attention.py --blocks [64x256 256x512 ...]

Time: the three implementations interleaved (``common.add_interleaved``), after each
has compiled and warmed up. Peak memory: each (implementation, sequence, mode) in a
fresh subprocess (``--probe``), which warms up, frees what it can (``gc``,
``hologram.empty_cache()``, glibc ``malloc_trim``), resets the kernel's peak-RSS counter
(``/proc/self/clear_refs``) and runs one call: the figure is VmHWM minus VmRSS just
before, the memory that call needs on top of what the process holds (its outputs
included, the inputs and each compiler's resident code not). Every process imports the
same libraries. Targets (issue 17): at sequence 2048 hologram's peak memory is below
eager's, inference and training. Time is reported, not targeted: ATen's kernel
uses MKL, hologram NumPy's OpenBLAS.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import Candidate, Report, add_interleaved, max_abs_err, parser, target  # noqa: E402

B, H, E = 1, 8, 64
IMPLS = ("eager", "hologram", "inductor")
MODES = ("inference", "training")


def _setup(impl: str, n: int, mode: str, causal: bool = True):
    """(step function, inputs): one call of ``impl`` on fresh inputs; ``step()`` returns
    the output and, in training, the three input gradients."""
    import torch

    import hologram_torch  # noqa: F401 - registers the backend (imported everywhere alike)

    F = torch.nn.functional
    g = torch.Generator().manual_seed(n)
    train = mode == "training"
    q, k, v = (torch.randn(B, H, n, E, generator=g).requires_grad_(train) for _ in range(3))
    grad = torch.randn(B, H, n, E, generator=g)

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    # Static shapes: one graph per (sequence, mode). With dynamo's automatic dynamic
    # shapes, the second sequence length would make a symbolic graph, whose first call per
    # shape runs eagerly (and the recompile limit counts every table's compile).
    for name in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 64)
    fn = {"eager": attend,
          "hologram": lambda: torch.compile(attend, backend="hologram", dynamic=False),
          "inductor": lambda: torch.compile(attend, dynamic=False)}[impl]
    if impl != "eager":
        fn = fn()

    def step():
        if train:
            out = fn(q, k, v)
            out.backward(grad)
            result = (out.detach(), q.grad, k.grad, v.grad)
            for x in (q, k, v):
                x.grad = None
            return result
        with torch.no_grad():
            return (fn(q, k, v),)

    return step


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def probe(impl: str, n: int, mode: str) -> dict:
    """Run in a fresh process: the extra peak RSS of one warmed-up call."""
    import hologram

    step = _setup(impl, n, mode)
    for _ in range(2):
        step()
    gc.collect()
    hologram.empty_cache()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # not glibc: the figure may include memory the allocator kept
        pass
    before = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    result = step()
    peak = _status("VmHWM")
    del result
    return {"impl": impl, "n": n, "mode": mode, "rss_before": before, "peak": peak,
            "extra": peak - before}


def measure_memory(n: int, mode: str) -> dict[str, dict]:
    out = {}
    for impl in IMPLS:
        cmd = [sys.executable, os.path.abspath(__file__), "--probe", f"{impl},{n},{mode}"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        line = [x for x in r.stdout.splitlines() if x.startswith("{")]
        out[impl] = json.loads(line[-1]) if r.returncode == 0 and line else {
            "error": (r.stderr.strip().splitlines() or ["no output"])[-1]}
    return out


def block_sweep(rep: Report, repeat: int, configs: list[tuple[int, int]]) -> None:
    """The driver's block sizes (``compiler/attention.py`` BLOCK_Q x BLOCK_K), each a
    program launched on the executor (no torch in the loop), interleaved with ATen's
    kernel: sequence 2048, forward and backward, full and causal."""
    import numpy as np
    import torch

    import hologram as hg
    from hologram.compiler import attention as A
    from hologram.isa import Program
    from hologram.isa import builder as b

    ex = hg.default_executor("cpu")
    n = 2048
    shape = (B, H, n, E)
    rng = np.random.default_rng(0)
    q, k, v, do = (rng.standard_normal(shape).astype(np.float32) for _ in range(4))
    tq, tk, tv, tdo = (torch.from_numpy(x) for x in (q, k, v, do))
    fwd_op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    bwd_op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default
    saved = A.BLOCK_Q, A.BLOCK_K
    for causal in (False, True):
        for mode in ("forward", "backward"):
            t = rep.table(f"driver blocks, {mode}, sequence {n}, causal={causal}", "ATen",
                          unit="ms")
            cands = {}
            for bq, bk in configs:
                A.BLOCK_Q, A.BLOCK_K = bq, bk
                ld = [b.ldg(i, "f32", shape) for i in range(3)]
                out, lse = b.attention(*ld, causal=causal)
                fwd = ex.backend.compile(Program([b.stg(out, 0), b.stg(lse, 1)],
                                                 [("f32", shape)] * 3))
                o, l_ = np.empty(shape, np.float32), np.empty(shape[:-1], np.float32)
                ex.backend.launch(fwd, [q, k, v], [o, l_])
                if mode == "forward":
                    def run(c=fwd, o=o, l_=l_):
                        ex.backend.launch(c, [q, k, v], [o, l_])
                else:
                    grads = b.attention_grads(b.ldg(3, "f32", shape), *ld,
                                              b.ldg(4, "f32", shape),
                                              b.ldg(5, "f32", shape[:-1]), causal=causal)
                    bwd = ex.backend.compile(Program(
                        [b.stg(x, i) for i, x in enumerate(grads)],
                        [("f32", shape)] * 5 + [("f32", shape[:-1])]))
                    outs = [np.empty(shape, np.float32) for _ in range(3)]

                    def run(c=bwd, o=o, l_=l_, outs=outs):
                        ex.backend.launch(c, [q, k, v, do, o, l_], outs)
                cands[f"{bq}x{bk}"] = Candidate(run)
            to, tl = fwd_op(tq, tk, tv, 0.0, causal)
            cands["ATen"] = Candidate(
                (lambda c=causal: fwd_op(tq, tk, tv, 0.0, c)) if mode == "forward" else
                (lambda c=causal, to=to, tl=tl: bwd_op(tdo, tq, tk, tv, to, tl, 0.0, c)))
            add_interleaved(t, cands, repeat=repeat)
    A.BLOCK_Q, A.BLOCK_K = saved


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--blocks", nargs="*", metavar="QxK",
                   help="instead: time the driver's block sizes (e.g. 64x256 256x512)")
    p.add_argument("--probe", metavar="IMPL,N,MODE",
                   help="(internal) print one memory probe as JSON")
    args = p.parse_args()
    if args.probe:
        impl, n, mode = args.probe.split(",")
        print(json.dumps(probe(impl, int(n), mode)))
        return
    repeat = 3 if args.quick else 7
    if args.blocks is not None:
        rep = Report("attention blocks", "the CPU driver's block sizes vs ATen's kernel")
        block_sweep(rep, repeat, [tuple(map(int, c.split("x"))) for c in args.blocks
                                  or ("64x256", "128x256", "128x512", "256x256", "256x512")])
        rep.finish(args)
        return
    rep = Report("attention", "F.scaled_dot_product_attention (B=1, H=8, E=64, f32, causal): "
                 "eager (ATen's fused CPU kernel) vs hologram vs Inductor, time and peak "
                 "memory")
    mem = rep.grid("peak memory of one call (MiB over the RSS before it; fresh process each)",
                   ["sequence", "mode", *IMPLS])
    values = []
    for n in (512, 2048):
        for mode in MODES:
            r = measure_memory(n, mode)
            rep.data[f"memory_{n}_{mode}"] = r
            cells = [f"{r[i]['extra'] / 2**20:.1f}" if "extra" in r[i] else "ERROR"
                     for i in IMPLS]
            mem.add(n, mode, *cells)
            values += [(n, mode, r)]
    for n, mode, r in values:
        if n != 2048:
            continue
        h, e = r["hologram"].get("extra"), r["eager"].get("extra")
        rep.check(target(f"peak memory, {mode}, seq 2048", "hologram below eager",
                         None if h is None or e is None else h / e, lambda x: x < 1.0,
                         lambda x, h=h, e=e: f"{x:.2f}x eager ({h / 2**20:.1f} vs "
                         f"{e / 2**20:.1f} MiB)"))
    for n in (512, 2048):
        for mode in MODES:
            t = rep.table(f"{mode}, sequence {n}", "eager", unit="ms",
                          extra_cols=("max err",))
            steps = {impl: _setup(impl, n, mode) for impl in IMPLS}
            ref = steps["eager"]()
            cands = {}
            for impl, step in steps.items():
                got = step()
                err = max(max_abs_err(a.detach().numpy(), b.detach().numpy())
                          for a, b in zip(got, ref, strict=True))
                cands[impl] = Candidate(step, extra={"max err": f"{err:.1e}"})
            add_interleaved(t, cands, repeat=repeat)
    rep.note("eager runs ATen's own fused flash-attention kernel on the CPU (MKL GEMMs); "
             "hologram's step streams key blocks through NumPy's OpenBLAS with the online "
             "softmax (compiler/attention.py), so neither stores the L x S scores.")
    rep.note("training memory includes AccumulateGrad's copies: ATen's backward (and so the "
             "traced layout hologram hands back) gives gradients in [B, L, H, E] memory, and "
             "autograd copies each into the contiguous parameter's layout.")
    rep.finish(args)


if __name__ == "__main__":
    main()
