"""1024^3 float32 GEMM: hologram (jit ``x @ w`` and ``ops.gemm``) vs NumPy matmul;
GEMM + bias + GELU fused in one jit vs the same three steps run separately.

    .venv/bin/python benchmarks/bench_gemm.py [--json out.json] [--n 1024]

Targets: hologram GEMM within 5% of NumPy; fused GEMM+bias+GELU ahead of unfused.
The rows each target compares are sampled interleaved and settled (a pause before
each sample lets OpenBLAS's spinning threads go idle); torch rows, for scale, are
timed on their own.
"""

from __future__ import annotations

import argparse
import json
import math
import operator
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
from common import (  # noqa: E402
    Candidate,
    Report,
    add_interleaved,
    guarded,
    max_abs_err,
    measure,
    measure_interleaved,
    once,
    target,
)

C0 = math.sqrt(2.0 / math.pi)
C1 = 0.044715


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1024)
    p.add_argument("--no-passive-check", action="store_true",
                   help="skip re-running the fused rows with OMP_WAIT_POLICY=passive")
    p.add_argument("--fused-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.fused_only:
        return fused_only(args)

    import numpy as np

    n = args.n
    flop = 2.0 * n ** 3
    rep = Report("gemm", f"{n}^3 float32 GEMM, and GEMM+bias+GELU fused vs unfused")
    repeat = 5 if args.quick else 15
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, n), dtype=np.float32)
    w = rng.standard_normal((n, n), dtype=np.float32) / np.float32(np.sqrt(n))
    bias = rng.standard_normal(n, dtype=np.float32)
    ref = x.astype(np.float64) @ w.astype(np.float64)

    def gf(tm):
        return f"{flop / tm.median / 1e9:.0f}" if tm is not None else "-"

    t = rep.table(f"GEMM {n}x{n} @ {n}x{n} f32", baseline="numpy a @ b", unit="ms",
                  extra_cols=("GFLOP/s", "max err"))

    def row(table, name, fn, y=None, ref=ref, note="", **kw):
        tm = guarded(table, name, lambda: measure(fn, repeat=repeat, max_s=15), note=note, **kw)
        r = table.row(name)
        r.extra["GFLOP/s"] = gf(tm)
        if y is not None:
            r.extra["max err"] = f"{max_abs_err(y, ref):.1e}"
        return tm

    # the GEMM rows are sampled interleaved: the claim is a 5% ratio, so a transient
    # disturbance must hit NumPy and hologram alike
    fns: dict = {"numpy a @ b": lambda: x @ w}
    c_np = np.empty((n, n), np.float32)
    fns["numpy matmul(out=)"] = lambda: np.matmul(x, w, out=c_np)
    results: dict = {"numpy a @ b": x @ w}
    notes = {"numpy a @ b": "allocates C", "numpy matmul(out=)": "into a preallocated C"}
    errors: dict = {}
    try:
        import torch

        xt, wt = torch.from_numpy(x), torch.from_numpy(w)
        results["torch.mm"] = torch.mm(xt, wt).numpy()
        notes["torch.mm"] = f"for scale; {torch.get_num_threads()} threads; timed on its own"
    except ImportError:
        torch = None

    hg = common.quiet_hologram()
    from hologram.ops.composites import gelu_tanh

    try:
        fj = hg.jit(lambda a, b: a @ b)
        first, results["hologram jit x @ w"] = once(lambda: fj(x, w))
        fns["hologram jit x @ w"] = lambda: fj(x, w)
        notes["hologram jit x @ w"] = f"allocates C; first call {first * 1e3:.0f} ms"
    except Exception as e:  # noqa: BLE001
        errors["hologram jit x @ w"] = f"{type(e).__name__}: {e}"
    try:
        ex = hg.Executor("cpu")
        A, B, Cb = ex.allocate((n, n)), ex.allocate((n, n)), ex.allocate((n, n))
        A.from_numpy(x)
        B.from_numpy(w)
        hg.ops.gemm(ex, A, B, Cb)
        results["hologram ops.gemm"] = Cb.to_numpy()
        fns["hologram ops.gemm"] = lambda: hg.ops.gemm(ex, A, B, Cb)
        notes["hologram ops.gemm"] = "executor buffers, preallocated C"
    except Exception as e:  # noqa: BLE001
        errors["hologram ops.gemm"] = f"{type(e).__name__}: {e}"
    # torch is timed on its own: its OpenMP threads keep spinning after each call and
    # would slow whatever is sampled right after it (see the OMP passive rows below)
    # Settled: NumPy's OpenBLAS threads spin ~0.1 s after each of its calls and would
    # slow the hologram sample that follows (hologram's GEMMs run in its OpenMP pool);
    # the cost of that mix is its own diagnostic row below.
    timings = measure_interleaved(fns, repeat=repeat, settle_s=0.25)
    mixed = "hologram jit x @ w right after numpy a @ b"
    if "hologram jit x @ w" in fns:
        timings[mixed] = measure(lambda: (np.matmul(x, w, out=c_np), fj(x, w)),
                                 repeat=repeat, max_s=15)
        notes[mixed] = ("diagnostic: one NumPy GEMM then one hologram GEMM per call; "
                        "OpenBLAS's spinning threads slow the second")
    if torch is not None:
        timings["torch.mm"] = measure(lambda: torch.mm(xt, wt), repeat=repeat, max_s=15)
    for name in ("numpy a @ b", "numpy matmul(out=)", "torch.mm", "hologram jit x @ w",
                 "hologram ops.gemm", mixed):
        if name in errors:
            t.add(name, None, error=errors[name])
        elif name in timings:
            tm = timings[name]
            extra = {"GFLOP/s": gf(tm)}
            if name in results:
                extra["max err"] = f"{max_abs_err(results[name], ref):.1e}"
            how = "" if name in ("torch.mm", mixed) else " (interleaved, settled sampling)"
            t.add(name, tm, note=notes[name] + how, **extra)

    # within 5%: hologram time <= 1.05 x NumPy time, comparing like with like
    for h, base in (("hologram jit x @ w", "numpy a @ b"),
                    ("hologram ops.gemm", "numpy matmul(out=)")):
        rep.check(target(f"{h} vs {base}", f"<= 1.05x {base}", t.ratio_to(h, base),
                         lambda v: v <= 1.05, lambda v: f"{v:.3f}x NumPy time"), t, h)

    # ------------------------------------------------------------- GEMM + bias + GELU
    def np_gelu_(y):  # in place where it can, as a careful NumPy user would write it
        return 0.5 * y * (1.0 + np.tanh(C0 * (y + C1 * (y * y * y))))

    ref2 = ref + bias
    ref2 = 0.5 * ref2 * (1.0 + np.tanh(C0 * (ref2 + C1 * ref2 ** 3)))
    u = rep.table(f"GEMM {n}^3 + bias + GELU(tanh) f32", baseline="numpy unfused", unit="ms",
                  vs={"x fused": "hologram fused jit"}, extra_cols=("GFLOP/s", "max err"))

    def np_unfused():
        y = x @ w
        y += bias
        return np_gelu_(y)

    # numpy unfused and the hologram rows, which the targets compare, are sampled
    # interleaved (settled: OpenBLAS's threads spin after NumPy's GEMM); torch on its own
    rows: dict[str, Candidate] = {}
    errors: dict[str, str] = {}
    rows["numpy unfused"] = Candidate(np_unfused, "x @ w; += b; gelu temporaries",
                                      {"max err": f"{max_abs_err(np_unfused(), ref2):.1e}"})
    try:
        ff = hg.jit(lambda a, b, c: gelu_tanh(a @ b + c))
        first, yf = once(lambda: ff(x, w, bias))
        rows["hologram fused jit"] = Candidate(
            lambda: ff(x, w, bias), f"one jit: gelu_tanh(x @ w + b); first call "
            f"{first * 1e3:.0f} ms", {"max err": f"{max_abs_err(yf, ref2):.1e}"})
        try:
            prog, _ = ff.program_for(x, w, bias)
            rep.note(f"hologram fused GEMM+bias+GELU program: {ff.executor.compile(prog).stats}")
        except Exception:  # noqa: BLE001
            pass
    except Exception as e:  # noqa: BLE001
        errors["hologram fused jit"] = f"{type(e).__name__}: {e}"

    try:
        j_mm = hg.jit(lambda a, b: a @ b)
        j_bias = hg.jit(lambda y, c: y + c)
        j_gelu = hg.jit(lambda y: gelu_tanh(y))

        def h_unfused():
            return j_gelu(j_bias(j_mm(x, w), bias))

        rows["hologram unfused (3 jit calls)"] = Candidate(
            h_unfused, "jit(x @ w), jit(y + b), jit(gelu(y))",
            {"max err": f"{max_abs_err(h_unfused(), ref2):.1e}"})
    except Exception as e:  # noqa: BLE001
        errors["hologram unfused (3 jit calls)"] = f"{type(e).__name__}: {e}"

    try:
        ex2 = hg.Executor("cpu")
        A2, B2, Y2 = ex2.allocate((n, n)), ex2.allocate((n, n)), ex2.allocate((n, n))
        A2.from_numpy(x)
        B2.from_numpy(w)
        yv = Y2.view()

        def h_ops():
            hg.ops.gemm(ex2, A2, B2, Y2)
            np.copyto(yv, j_bias(yv, bias))
            hg.ops.gelu(ex2, Y2, Y2)
            return yv

        rows["hologram unfused (ops)"] = Candidate(
            h_ops, "ops.gemm; jit bias add (copied back); ops.gelu in place",
            {"max err": f"{max_abs_err(h_ops().copy(), ref2):.1e}"})
    except Exception as e:  # noqa: BLE001
        errors["hologram unfused (ops)"] = f"{type(e).__name__}: {e}"

    add_interleaved(u, rows, repeat=repeat, settle_s=0.25, failed=errors)
    for name in rows:
        u.row(name).extra["GFLOP/s"] = gf(u.row(name).timing)
    if torch is not None:
        bt = torch.from_numpy(bias)

        def t_eager():
            return torch.nn.functional.gelu(torch.addmm(bt, xt, wt), approximate="tanh")

        row(u, "torch eager", t_eager, t_eager().numpy(), ref2,
            note="gelu(addmm(b, x, w)); for scale, timed on its own")

    if not args.no_passive_check and "OMP_WAIT_POLICY" not in os.environ:
        passive_check(u, args)

    rep.check(target("fused GEMM+bias+GELU", "fused ahead of 3 unfused jit calls",
                     u.ratio_to("hologram unfused (3 jit calls)", "hologram fused jit"),
                     lambda v: v > 1,
                     lambda v: f"{v:.2f}x faster" if v >= 1 else f"{1 / v:.2f}x slower"),
              u, "hologram fused jit")
    rep.check(target("fused GEMM+bias+GELU vs NumPy", "fused ahead of NumPy unfused",
                     u.ratio_to("numpy unfused", "hologram fused jit"), lambda v: v > 1,
                     lambda v: f"{v:.2f}x faster" if v >= 1 else f"{1 / v:.2f}x slower"),
              u, "hologram fused jit")
    small_gemms(rep, hg, torch, repeat)
    rep.finish(args)


#: The eight products of one MLP training step in bench_torch_train.py (64-256-256-10,
#: batch 256) as its forward and backward programs run them: (m, n, k, A stored
#: transposed, B stored transposed).
MLP_GEMMS = ((256, 256, 64, False, True), (256, 256, 256, False, True),
             (256, 10, 256, False, True), (10, 256, 256, True, False),
             (256, 256, 10, False, False), (256, 256, 256, True, False),
             (256, 256, 256, False, False), (256, 64, 256, True, False))


def small_gemms(rep, hg, torch, repeat: int) -> None:
    """Diagnostic, no target: the eight small products of an MLP training step, each
    run once per sample (hologram jit, NumPy's OpenBLAS with its own threads, PyTorch's
    mm), interleaved. These sizes are where hologram's choice of when to split a
    product over threads (``blas.PARALLEL_MIN_FLOPS``) shows."""
    import numpy as np

    rng = np.random.default_rng(1)
    cases = []
    for m, n, k, ta, tb in MLP_GEMMS:
        a = rng.standard_normal((k, m) if ta else (m, k), dtype=np.float32)
        b = rng.standard_normal((n, k) if tb else (k, n), dtype=np.float32)
        cases.append((a, b, ta, tb))

    def operands(a, b, ta, tb):
        return (a.T if ta else a), (b.T if tb else b)

    def product(ta, tb):
        return hg.jit(lambda a, b: operator.matmul(*operands(a, b, ta, tb)))

    jits = [(product(ta, tb), a, b) for a, b, ta, tb in cases]
    views = [operands(*c) for c in cases]
    fns = {"numpy a @ b": lambda: [a @ b for a, b in views],
           "hologram jit": lambda: [f(a, b) for f, a, b in jits]}
    if torch is not None:
        tviews = [(torch.from_numpy(a), torch.from_numpy(b)) for a, b in views]
        fns["torch mm"] = lambda: [torch.mm(a, b) for a, b in tviews]
    for (f, a, b), (va, vb) in zip(jits, views, strict=True):  # compiles each once
        ref = va.astype(np.float64) @ vb.astype(np.float64)
        np.testing.assert_allclose(f(a, b), ref, rtol=1e-4, atol=1e-3 * np.sqrt(va.shape[1]))
    t = rep.table("the MLP training step's 8 GEMMs (256-wide), one pass", baseline="numpy a @ b",
                  unit="us")
    add_interleaved(t, {k: Candidate(f, "diagnostic (no target)") for k, f in fns.items()},
                    repeat=3 * repeat)


PASSIVE_ROWS = ("hologram fused jit", "hologram unfused (3 jit calls)")


def passive_check(u, args) -> None:
    """Diagnostic: the hologram GEMM+epilogue rows again in a process with
    OMP_WAIT_POLICY=passive. OpenMP threads that spin after a hologram kernel compete
    with the OpenBLAS threads of the next GEMM on a 2-core box; this shows how much."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "passive.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--fused-only", "--json", path,
               "--n", str(args.n)] + (["--quick"] if args.quick else [])
        r = subprocess.run(cmd, env=dict(os.environ, OMP_WAIT_POLICY="passive"),
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0 or not os.path.exists(path):
            u.add("hologram fused jit [OMP passive]", None,
                  error=f"child failed: {r.stderr.strip()[-300:]}")
            return
        with open(path) as f:
            res = json.load(f)
    for row in res["tables"][0]["rows"]:
        t = row["timing"]
        timing = common.Timing(t["median"], t["q1"], t["q3"], t["repeat"], t["inner"],
                               t["samples"]) if t else None
        u.add(f"{row['name']} [OMP passive]", timing, error=row.get("error"),
              note="diagnostic: same, in a process with OMP_WAIT_POLICY=passive",
              **{"GFLOP/s": row["extra"].get("GFLOP/s", "-"),
                 "max err": row["extra"].get("max err", "")})


def fused_only(args) -> None:
    """Child of passive_check: only the hologram fused / 3-call rows."""
    import numpy as np

    hg = common.quiet_hologram()
    from hologram.ops.composites import gelu_tanh

    n = args.n
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, n), dtype=np.float32)
    w = rng.standard_normal((n, n), dtype=np.float32) / np.float32(np.sqrt(n))
    bias = rng.standard_normal(n, dtype=np.float32)
    rep = Report("gemm_passive", "fused rows under OMP_WAIT_POLICY=passive")
    u = rep.table("fused", baseline=None, unit="ms", extra_cols=("GFLOP/s", "max err"))
    ff = hg.jit(lambda a, b, c: gelu_tanh(a @ b + c))
    j_mm = hg.jit(lambda a, b: a @ b)
    j_bias = hg.jit(lambda y, c: y + c)
    j_gelu = hg.jit(lambda y: gelu_tanh(y))
    repeat = 5 if args.quick else 15
    for name, fn in zip(PASSIVE_ROWS, (lambda: ff(x, w, bias),
                                       lambda: j_gelu(j_bias(j_mm(x, w), bias))), strict=True):
        tm = guarded(u, name, lambda fn=fn: measure(fn, repeat=repeat, max_s=15))
        u.row(name).extra["GFLOP/s"] = (f"{2.0 * n ** 3 / tm.median / 1e9:.0f}" if tm else "-")
    with open(args.json, "w") as f:
        json.dump(rep.to_json(), f, default=str)


if __name__ == "__main__":
    main()
