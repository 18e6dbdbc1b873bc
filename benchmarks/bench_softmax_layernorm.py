"""Row softmax and layer norm (weight and bias) over a 4096x1024 float32 matrix:
hologram jit vs torch eager vs torch.compile (Inductor) vs NumPy.

    .venv/bin/python benchmarks/bench_softmax_layernorm.py [--json out.json]

Targets: hologram ahead of torch eager and of Inductor on both, judged on each
case's interleaved table (samples of all implementations alternate, so a slow minute
of the VM hits them alike); the blocked table beside it is shown for scale. A third table,
without a target, runs softmax with the second half of every row masked to -inf (a
causal attention mask): the input that sent glibc's vector expf to its slow scalar
path (3.3x the unmasked time before hologram had its own expf).
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
from common import (  # noqa: E402
    Candidate,
    Report,
    add_interleaved,
    guarded,
    max_abs_err,
    measure,
    once,
    target,
)

EPS = 1e-5


def paired_ratios(peer, mine, rounds: int) -> list[float]:
    """time(peer) / time(mine) for each round of one call each, order alternating."""
    out = []
    for i in range(rounds):
        times = {}
        for which, fn in ((0, peer), (1, mine)) if i % 2 else ((1, mine), (0, peer)):
            t0 = time.perf_counter()
            fn()
            times[which] = time.perf_counter() - t0
        out.append(times[0] / times[1])
    return out


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--cols", type=int, default=1024)
    args = p.parse_args()
    common.fresh_inductor_cache()

    import numpy as np

    R, C = args.rows, args.cols
    rep = Report("softmax_layernorm", f"softmax and layer norm over {R}x{C} float32 rows")
    repeat = 5 if args.quick else 15
    rng = np.random.default_rng(0)
    x = rng.standard_normal((R, C), dtype=np.float32) * 4
    w = rng.standard_normal(C, dtype=np.float32)
    b = rng.standard_normal(C, dtype=np.float32)

    def np_softmax(x):
        e = np.exp(x - x.max(axis=1, keepdims=True))
        e /= e.sum(axis=1, keepdims=True)
        return e

    def np_layer_norm(x, w, b):
        mean = x.mean(axis=1, keepdims=True)
        d = x - mean
        var = (d * d).mean(axis=1, keepdims=True)
        return d / np.sqrt(var + EPS) * w + b

    xm = x.copy()
    xm[:, C // 2:] = -np.inf
    x64 = x.astype(np.float64)
    refs = {"softmax": np_softmax(x64), "layer_norm": np_layer_norm(x64, w, b),
            "softmax_masked": np_softmax(xm.astype(np.float64))}

    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        torch = None

    hg = common.quiet_hologram()
    from hologram.ops import composites as HC

    cases = {
        "softmax": {
            "numpy": lambda: np_softmax(x),
            "torch": lambda t: torch.softmax(t[0], dim=1),
            "hologram": lambda v: HC.softmax(v, axis=1),
            "args": (x,),
        },
        "layer_norm": {
            "numpy": lambda: np_layer_norm(x, w, b),
            "torch": lambda t: F.layer_norm(t[0], (C,), t[1], t[2], EPS),
            "hologram": lambda v, wv, bv: HC.layer_norm(v, wv, bv, axes=(1,), eps=EPS),
            "args": (x, w, b),
        },
        "softmax_masked": {
            "numpy": lambda: np_softmax(xm),
            "torch": lambda t: torch.softmax(t[0], dim=1),
            "hologram": lambda v: HC.softmax(v, axis=1),
            "args": (xm,),
            "targets": False,  # reported, not an issue target
        },
    }

    for name, case in cases.items():
        ref = refs[name]
        t = rep.table(f"{name}, {R}x{C} f32", baseline="numpy", unit="ms",
                      vs={"x torch eager": "torch eager"}, extra_cols=("max err",))

        def err(y, ref=ref):
            return f"{max_abs_err(y, ref):.1e}"

        guarded(t, "numpy", lambda case=case: measure(case["numpy"], repeat=repeat, max_s=5),
                note="temporaries", **{"max err": err(case["numpy"]())})
        fns = {}  # for the interleaved cross-check
        if torch is not None:
            targs = tuple(torch.from_numpy(a) for a in case["args"])
            fns["torch eager"] = lambda case=case, targs=targs: case["torch"](targs)
            guarded(t, "torch eager",
                    lambda case=case, targs=targs: measure(lambda: case["torch"](targs),
                                                           repeat=repeat),
                    **{"max err": err(case["torch"](targs).numpy())})
            try:
                fc = torch.compile(case["torch"])
                first, yc = once(lambda fc=fc, targs=targs: fc(targs))
                rep.data[f"inductor_first_call_s_{name}"] = first
                m = measure(lambda fc=fc, targs=targs: fc(targs), repeat=repeat, warmup=5)
                fns["torch.compile"] = lambda fc=fc, targs=targs: fc(targs)
                t.add("torch.compile", m, note=f"Inductor; first call (compile) {first:.2f} s",
                      **{"max err": err(yc.numpy())})
            except Exception as e:  # noqa: BLE001
                t.add("torch.compile", None, error=f"{type(e).__name__}: {e}")
        else:
            t.add("torch eager", None, error="torch not installed")
        try:
            f = hg.jit(case["hologram"])
            hargs = case["args"]
            first, yh = once(lambda f=f, hargs=hargs: f(*hargs))
            rep.data[f"hologram_first_call_s_{name}"] = first
            fns["hologram jit"] = lambda f=f, hargs=hargs: f(*hargs)
            guarded(t, "hologram jit",
                    lambda f=f, hargs=hargs: measure(lambda: f(*hargs), repeat=repeat, max_s=10),
                    note=f"first call (trace + compile or disk-cache load) {first * 1e3:.0f} ms",
                    **{"max err": err(yh)})
            try:
                prog, _ = f.program_for(*hargs)
                st = f.executor.compile(prog).stats
                rep.note(f"hologram {name} program: {st}")
            except Exception:  # noqa: BLE001
                pass
        except Exception as e:  # noqa: BLE001
            t.add("hologram jit", None, error=f"{type(e).__name__}: {e}")

        # The targets' table: the same calls with their samples interleaved, so slow
        # drifts of this (virtual) machine hit every implementation alike (a ratio of two
        # blocked rows is decided by which minute each ran in; docs/perf.md).
        ti = rep.table(f"{name}, {R}x{C} f32, interleaved sampling", baseline="torch eager",
                       unit="ms")
        if len(fns) > 1:
            add_interleaved(ti, {k: Candidate(f) for k, f in fns.items()}, repeat=repeat)

        # Diagnostic: single calls alternating round by round, the ratio taken per round,
        # so a drift of the machine between rounds cancels (no target uses it).
        if "torch eager" in fns and "hologram jit" in fns:
            ratios = paired_ratios(fns["torch eager"], fns["hologram jit"], rounds=200)
            q1, med, q3 = (float(np.percentile(ratios, q)) for q in (25, 50, 75))
            rep.data[f"paired_ratio_{name}"] = {"median": med, "q25": q1, "q75": q3,
                                               "rounds": len(ratios)}
            rep.note(f"{name}: paired rounds, torch eager time / hologram time: median "
                     f"{med:.2f}x (quartiles {q1:.2f}-{q3:.2f}, {len(ratios)} rounds)")

        h = "hologram jit"
        for peer in ("torch eager", "torch.compile") if case.get("targets", True) else ():
            tg = target(f"{name} vs {peer}", f"ahead of {peer}", ti.ratio_to(peer, h),
                        lambda v: v > 1,
                        lambda v: f"{v:.2f}x faster" if v >= 1 else f"{1 / v:.2f}x slower")
            blocked = t.ratio_to(peer, h)
            if tg.passed is not None and blocked is not None:
                tg.measured += f" (interleaved; blocked table: {blocked:.2f}x)"
            rep.check(tg, ti, h)
            t.mark(h, tg)
    rep.finish(args)


if __name__ == "__main__":
    main()
