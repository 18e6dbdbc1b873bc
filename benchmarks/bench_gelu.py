"""Fused GELU (tanh form) over 10M float32: hologram jit vs NumPy, numexpr, torch
eager, torch.compile (Inductor), and the memory floor (np.copyto of the same bytes).

    .venv/bin/python benchmarks/bench_gelu.py [--json out.json] [--n 10000000]

Targets: hologram >= 10x NumPy, faster than numexpr, torch eager and Inductor,
and within 1.3x of the copy floor.

The copy floor is ``np.copyto(dst, x)`` into a preallocated ``dst``: the same bytes
read and written, into memory that is already mapped. ``hologram jit`` is the
allocating call ``f(x)``: its 40 MB output comes from the output cache
(``hologram.output_cache``), so when the previous output has died, as in this
loop, the kernel writes into mapped pages too. The diagnostic row with the cache
off (``output_cache.limit = 0``: a fresh ``np.empty`` per call, as when every
output is kept alive) shows what the page faults cost; ``x.copy()`` is the
allocating copy for comparison.

The rows the targets compare (copy floor, NumPy, numexpr, torch eager, Inductor and
hologram jit) are sampled interleaved, round by round; the diagnostic rows are timed
each on its own.
"""

from __future__ import annotations

import math
import os
import sys

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

C0 = math.sqrt(2.0 / math.pi)
C1 = 0.044715


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=10_000_000)
    args = p.parse_args()
    common.fresh_inductor_cache()

    import numpy as np

    rep = Report("gelu", f"GELU tanh form over {args.n:,} float32")
    rng = np.random.default_rng(0)
    x = rng.standard_normal(args.n, dtype=np.float32) * 3
    repeat = 5 if args.quick else 15
    t = rep.table(f"GELU tanh, {args.n:,} f32 ({x.nbytes / 2**20:.0f} MiB in, same out)",
                  baseline="numpy", unit="ms", vs={"x copy floor": "copy floor"},
                  extra_cols=("max err",))

    def np_gelu(x):
        return 0.5 * x * (1.0 + np.tanh(C0 * (x + C1 * (x * x * x))))

    ref = np_gelu(x.astype(np.float64)).astype(np.float32)

    # Every row a target compares is sampled interleaved with the others (common.
    # add_interleaved); the diagnostic rows after them are timed on their own.
    rows: dict[str, Candidate] = {}
    errors: dict[str, str] = {}

    # --- memory floor: read n*4 bytes, write n*4 bytes
    dst = np.empty_like(x)
    rows["copy floor"] = Candidate(lambda: np.copyto(dst, x),
                                   "np.copyto(dst, src), preallocated dst")

    def err(y):
        return f"{max_abs_err(y, ref):.1e}"

    # --- NumPy with temporaries
    rows["numpy"] = Candidate(lambda: np_gelu(x), "temporaries", {"max err": err(np_gelu(x))})

    # --- numexpr
    try:
        import numexpr as ne

        out = np.empty_like(x)
        # constants as float32 variables: a Python float literal would make numexpr
        # compute the whole expression in float64
        expr = "h * x * (one + tanh(c0 * (x + c1 * (x * x * x))))"
        env = {"x": x, "h": np.float32(0.5), "one": np.float32(1.0), "c0": np.float32(C0),
               "c1": np.float32(C1)}

        def ne_gelu():
            return ne.evaluate(expr, local_dict=env, out=out)

        ne_gelu()
        rows["numexpr"] = Candidate(ne_gelu, f"{ne.get_num_threads()} threads, out=",
                                    {"max err": err(out)})
    except ImportError:
        errors["numexpr"] = "numexpr not installed (pip install 'hologram[bench]')"

    # --- torch eager and torch.compile
    try:
        import torch
        import torch.nn.functional as F

        xt = torch.from_numpy(x)

        def t_eager():
            return F.gelu(xt, approximate="tanh")

        rows["torch eager"] = Candidate(
            t_eager, f"F.gelu(approximate='tanh'), {torch.get_num_threads()} threads",
            {"max err": err(t_eager().numpy())})
        try:
            fc = torch.compile(lambda v: F.gelu(v, approximate="tanh"))
            first, yc = once(lambda: fc(xt))
            rep.data["inductor_first_call_s"] = first
            rows["torch.compile"] = Candidate(lambda: fc(xt),
                                              f"Inductor; first call (compile) {first:.2f} s",
                                              {"max err": err(yc.numpy())})
        except Exception as e:  # noqa: BLE001
            errors["torch.compile"] = f"{type(e).__name__}: {e}"
    except ImportError:
        errors["torch eager"] = "torch not installed"

    # --- hologram
    hg = common.quiet_hologram()
    from hologram.ops.composites import gelu_tanh

    f = hg.jit(lambda v: gelu_tanh(v))
    try:
        first, yh = once(lambda: f(x))
        rep.data["hologram_first_call_s"] = first
        rows["hologram jit"] = Candidate(
            lambda: f(x), f"first call (trace + compile or disk-cache load) {first * 1e3:.0f} "
            "ms; allocates its output (output cache)", {"max err": err(yh)})
        del yh
    except Exception as e:  # noqa: BLE001
        errors["hologram jit"] = f"{type(e).__name__}: {e}"

    add_interleaved(t, rows, repeat=repeat, failed=errors)

    # --- diagnostics, each timed on its own
    guarded(t, "copy, allocating", lambda: measure(lambda: x.copy(), repeat=repeat),
            note="x.copy(): the floor for any op that returns a new array (page faults)")
    if "hologram jit" in rows:
        try:
            rep.data["output_cache"] = hg.output_cache.stats()
            # the same allocating call with the output cache off: np.empty each call, so
            # the kernel pays a page fault per fresh page (what a caller keeping every
            # output alive gets)
            saved = hg.output_cache.limit
            hg.output_cache.limit = 0
            try:
                guarded(t, "hologram jit (cache off)",
                        lambda: measure(lambda: f(x), repeat=repeat, max_s=10),
                        note="output_cache.limit = 0: a fresh np.empty output per call "
                        "(diagnostic)")
            finally:
                hg.output_cache.limit = saved
            # the same kernel writing into a preallocated output: the kernel alone,
            # without jit's argument handling and output allocation
            prog, arrays = f.program_for(x)
            ex = f.executor
            outh = np.empty_like(x)

            def pre():
                ex.launch(prog, arrays, [outh])

            guarded(t, "hologram (prealloc out)",
                    lambda: measure(pre, repeat=repeat, max_s=10),
                    note="executor.launch into a preallocated array (diagnostic)")
            rep.note(f"hologram GELU program: {ex.compile(prog).stats}")
        except Exception as e:  # noqa: BLE001
            t.add("hologram (prealloc out)", None, error=f"{type(e).__name__}: {e}")

    # --- targets
    h = "hologram jit"
    rep.check(target("GELU vs NumPy", ">= 10x NumPy", t.ratio(h), lambda v: v >= 10,
                     lambda v: f"{v:.1f}x"), t, h)
    for peer in ("numexpr", "torch eager", "torch.compile"):
        r = t.ratio_to(peer, h)
        rep.check(target(f"GELU vs {peer}", f"ahead of {peer}", r, lambda v: v > 1,
                         lambda v: f"{v:.2f}x faster" if v >= 1 else f"{1 / v:.2f}x slower"),
                  t, h)
    rep.check(target("GELU vs copy floor", "<= 1.3x copy", t.ratio_to(h, "copy floor"),
                     lambda v: v <= 1.3, lambda v: f"{v:.2f}x copy"), t, h)
    rep.finish(args)


if __name__ == "__main__":
    main()
