"""Compile-time costs: a cold compile of a new fused kernel, loading a compiled
kernel from the disk cache in a fresh process, and ``import hologram``.

    .venv/bin/python benchmarks/bench_compile.py [--json out.json] [--runs 5]

Each kernel is new: its program carries a random constant, and HOLOGRAM_CACHE_DIR
points at a fresh temporary directory, so nothing is reused from earlier runs.

- cold compile, fresh process: a new process imports hologram, traces the kernel
  and times ``executor.compile(program)`` (canonicalize, schedule, render C, run
  the C compiler, load the library): what a user's first call of a new function
  pays on top of import.
- cold compile, warm process: the same for further new kernels in one process
  (one-time costs such as finding the compiler are already paid).
- disk cache: process A compiles kernel K; a later process B (same cache dir)
  times ``executor.compile`` of K again, which must come from the disk cache.
- import: median wall time of ``python -c 'import hologram'`` minus that of
  ``python -c pass`` in fresh processes; ``-X importtime`` gives the breakdown.

Targets: cold compile <= 0.3 s, disk-cache load <= 5 ms, import <= 0.3 s.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import common  # noqa: E402
from common import Report, from_samples, target  # noqa: E402

N_ELEMS = 1 << 16


# ------------------------------------------------------------------------ child side
def child(mode: str, consts: list[float], count: int) -> None:
    """Runs in a fresh process; prints one JSON line with its timings."""
    t0 = time.perf_counter()
    import warnings

    import numpy as np

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import hologram as hg
        from hologram.isa.builder import program as build_program
        from hologram.ops.composites import gelu_tanh

        t_import = time.perf_counter() - t0
        ex = hg.Executor("cpu")
    cache = os.environ.get("HOLOGRAM_CACHE_DIR", "")

    def files() -> int:
        return sum(len(fs) for _, _, fs in os.walk(cache)) if cache else -1

    phases = instrument(ex)
    out = {"import_s": t_import, "describe": ex.backend.describe(), "runs": []}
    consts = consts + [random.random() for _ in range(count - len(consts))]
    for c in consts:
        def kernel(x, c=c):  # a fused element-wise kernel that no cache has seen
            return (gelu_tanh(x * c) + c).tanh() * x

        before = files()
        phases.clear()
        t1 = time.perf_counter()
        p = build_program(kernel, [("f32", (N_ELEMS,))], name="bench_compile")
        t2 = time.perf_counter()
        compiled = ex.compile(p)
        t3 = time.perf_counter()
        x = np.linspace(-3, 3, N_ELEMS, dtype=np.float32)
        y = np.empty_like(x)
        ex.launch(p, [x], [y])
        t4 = time.perf_counter()
        ref = (0.5 * (x * c) * (1 + np.tanh(0.7978845608 * ((x * c) + 0.044715 * (x * c) ** 3)))
               + c)
        ref = np.tanh(ref) * x
        stats = getattr(compiled, "stats", None)
        phases["other (verify, first-use imports, binding)"] = (t3 - t2) - sum(phases.values())
        out["runs"].append({
            "const": c, "trace_s": t2 - t1, "compile_s": t3 - t2, "first_launch_s": t4 - t3,
            "new_cache_files": files() - before if cache else None,
            "max_err": float(np.max(np.abs(y - ref))), "stats": str(stats) if stats else None,
            "phases_s": dict(phases),
        })
    print("RESULT " + json.dumps(out), flush=True)


def instrument(ex) -> dict[str, float]:
    """Time the phases of the cpu backend's compile by wrapping its internal steps
    (canonicalize, lower+render, C compiler or disk cache + load); whichever of them
    exist in this version of hologram."""
    import hologram.backends.cpu as cpu

    phases: dict[str, float] = {}

    def wrap(owner, attr: str, label: str) -> None:
        fn = getattr(owner, attr, None)
        if fn is None:
            return

        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                phases[label] = phases.get(label, 0.0) + time.perf_counter() - t0

        setattr(owner, attr, timed)

    wrap(cpu, "canonical_form", "canonicalize")
    wrap(cpu, "lower", "schedule+render")
    cc = getattr(ex.backend, "cc", None)
    if cc is not None:
        wrap(cc, "compile", "cc or disk cache, dlopen")
    return phases


def run_child(mode: str, consts: list[float], cache: str, count: int = 1) -> dict:
    env = dict(os.environ, HOLOGRAM_CACHE_DIR=cache)
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", mode,
                        "--consts", ",".join(map(repr, consts)), "--count", str(count)],
                       capture_output=True, text=True, env=env, timeout=300)
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"child {mode} failed (rc={r.returncode}):\n{r.stderr[-3000:]}")


# ----------------------------------------------------------------------- import time
def wall(cmd: list[str], env: dict) -> float:
    t0 = time.perf_counter_ns()
    subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=120)
    return (time.perf_counter_ns() - t0) / 1e9


def import_times(runs: int) -> dict:
    env = dict(os.environ)
    py = sys.executable
    for _ in range(2):  # warm the OS file cache
        wall([py, "-c", "import hologram"], env)
    res: dict[str, list[float]] = {"pass": [], "numpy": [], "hologram": []}
    for _ in range(runs):  # interleaved, so drift affects all three alike
        res["pass"].append(wall([py, "-c", "pass"], env))
        res["numpy"].append(wall([py, "-c", "import numpy"], env))
        res["hologram"].append(wall([py, "-c", "import hologram"], env))
    r = subprocess.run([py, "-X", "importtime", "-c", "import hologram"], env=env,
                       capture_output=True, text=True, timeout=120)
    top: dict[str, int] = {}
    for line in r.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)", line)
        if m and len(m.group(3)) <= 3:  # top-level imports only
            top[m.group(4)] = int(m.group(2))
    heavy = {k: v for k, v in top.items() if k.split(".")[0] not in ("encodings", "site")}
    return {"samples": res, "importtime_top_us": dict(sorted(heavy.items(),
                                                             key=lambda kv: -kv[1])[:12])}


# ------------------------------------------------------------------------------ main
def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5, help="fresh processes / kernels per figure")
    p.add_argument("--child", help=argparse_hidden())
    p.add_argument("--consts", default="0.5", help=argparse_hidden())
    p.add_argument("--count", type=int, default=1, help=argparse_hidden())
    args = p.parse_args()
    if args.child:
        child(args.child, [float(c) for c in args.consts.split(",")], args.count)
        return

    runs = 3 if args.quick else args.runs
    rep = Report("compile", "cold compile, disk-cache load and import time")
    t = rep.table("compile and import (time per event)", baseline=None, unit="ms",
                  extra_cols=("n",))
    root = tempfile.mkdtemp(prefix="bench-hgcache-")
    try:
        # cold compile in fresh processes (one new kernel each), and the disk-cache load of
        # each kernel in a second fresh process sharing its cache directory
        cold, warm_proc, disk, disk_warm, trace, detail = [], [], [], [], [], []
        for i in range(runs):
            cache = os.path.join(root, f"run{i}")
            os.makedirs(cache, mode=0o700)
            a = run_child("cold", [random.random()], cache, count=3)
            consts = [r["const"] for r in a["runs"]]
            b = run_child("disk", consts, cache, count=len(consts))
            cold.append(a["runs"][0]["compile_s"])
            trace.append(a["runs"][0]["trace_s"])
            warm_proc += [r["compile_s"] for r in a["runs"][1:]]
            disk.append(b["runs"][0]["compile_s"])
            disk_warm += [r["compile_s"] for r in b["runs"][1:]]
            detail.append({"cold": a, "disk": b})
            new = sum(r["new_cache_files"] or 0 for r in b["runs"])
            if new:
                rep.note(f"run {i}: the second process wrote {new} new cache file(s): it did "
                         "not load everything from the disk cache")
        rep.data["compile_detail"] = detail
        for label, key, sl in (("cold compile, fresh process", "cold", slice(0, 1)),
                               ("cold compile, warm process", "cold", slice(1, None)),
                               ("disk cache load, fresh process", "disk", slice(0, 1)),
                               ("disk cache load, warm process", "disk", slice(1, None))):
            ph: dict[str, list[float]] = {}
            for d in detail:
                for run in d[key]["runs"][sl]:
                    for k, v in run.get("phases_s", {}).items():
                        ph.setdefault(k, []).append(v)
            if ph:
                rep.note(f"{label}, phases (median ms): " + ", ".join(
                    f"{k} {statistics.median(v) * 1e3:.2f}" for k, v in ph.items()))
        first = detail[0]["cold"]
        rep.note(f"backend in the child processes: {first['describe']}")
        if first["runs"][0]["stats"]:
            rep.note(f"kernel: {first['runs'][0]['stats']}")
        errs = [r["max_err"] for d in detail for k in ("cold", "disk") for r in d[k]["runs"]]
        rep.note(f"max abs error of the compiled kernels vs NumPy: {max(errs):.1e}")
        t.add("cold compile, fresh process", from_samples(cold), n=len(cold),
              note="executor.compile of a new kernel, first in its process")
        t.add("cold compile, warm process", from_samples(warm_proc), n=len(warm_proc),
              note="further new kernels in the same process")
        t.add("disk cache load, fresh process", from_samples(disk), n=len(disk),
              note="executor.compile of a kernel an earlier process compiled, first in its "
              "process")
        t.add("disk cache load, warm process", from_samples(disk_warm), n=len(disk_warm),
              note="further cached kernels in the same process")
        t.add("trace (build program)", from_samples(trace), n=len(trace),
              note="Python tracing of the kernel, before compile")
    except Exception as e:  # noqa: BLE001
        t.add("cold compile, fresh process", None, error=f"{type(e).__name__}: {e}")
    finally:
        shutil.rmtree(root, ignore_errors=True)

    try:
        imp = import_times(max(runs, 7) if not args.quick else 5)
        s = imp["samples"]
        base = statistics.median(s["pass"])
        t.add("import hologram", from_samples([h - base for h in s["hologram"]]),
              n=len(s["hologram"]), note="python -c 'import hologram' minus python -c pass "
              "(includes NumPy)")
        t.add("import numpy", from_samples([h - base for h in s["numpy"]]), n=len(s["numpy"]),
              note="for scale: what NumPy alone costs")
        t.add("python -c pass", from_samples(s["pass"]), n=len(s["pass"]),
              note="interpreter start (subtracted above)")
        rep.data["importtime_top_us"] = imp["importtime_top_us"]
        rep.note("-X importtime, top-level cumulative (ms): " + ", ".join(
            f"{k} {v / 1e3:.1f}" for k, v in imp["importtime_top_us"].items()))
    except Exception as e:  # noqa: BLE001
        t.add("import hologram", None, error=f"{type(e).__name__}: {e}")

    ms = lambda v: f"{v * 1e3:.1f} ms"  # noqa: E731
    # without the native backend nothing is compiled: those figures say nothing
    native = rep.env["hologram"].get("native", False)

    def compiled(v):
        return v if native else None

    for name, row, goal, ok in (
            ("cold compile (fresh process)", "cold compile, fresh process", "<= 0.3 s",
             lambda v: v <= 0.3),
            ("cold compile (warm process)", "cold compile, warm process", "<= 0.3 s",
             lambda v: v <= 0.3),
            ("disk cache load (fresh process)", "disk cache load, fresh process", "<= 5 ms",
             lambda v: v <= 0.005),
            ("disk cache load (warm process)", "disk cache load, warm process", "<= 5 ms",
             lambda v: v <= 0.005)):
        tg = rep.check(target(name, goal, compiled(t.median(row)), ok, ms), t, row)
        if not native:
            tg.measured = "not measured: reference backend compiles nothing"
    rep.check(target("import hologram", "<= 0.3 s", t.median("import hologram"),
                     lambda v: v <= 0.3, ms), t, "import hologram")
    rep.finish(args)


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
