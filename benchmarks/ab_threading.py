"""A/B of who runs hologram's loops, quiet and with one core busy, all in one process.

    .venv/bin/python benchmarks/ab_threading.py --workload softmax \\
        --variants eager,openmp,openmp+windows [--phases 3] [--json out.json]

Variants: ``eager`` (PyTorch alone, as a reference in the rotation), ``openmp``
(hologram's loops on OpenMP's threads, no busy windows), ``openmp+windows`` (the
default beside PyTorch until session 27: a late region sends the loops to the team for
a while, ``compiler/team.py``, "Under load"), ``team`` (hologram's own team
throughout), ``team-norescue`` (the team without moving a stuck holder onto the
caller's CPU) and ``default`` (what a process gets that leaves the choice to hologram:
beside PyTorch the team, stepping aside to OpenMP while PyTorch's threads work,
``compiler/team.py``, "Beside PyTorch").
Workloads are ``bench_busy.py``'s, by a substring of their names (``gelu``, ``softmax``,
``gemm``, ``mlp``, ``bert``).

Why a kept tool: ``bench_busy.py`` times one setting per process, and on this project's
shared machines a busy/quiet ratio moves 0.2-0.5x between processes. Here every variant
is timed in turn within each phase (the order alternates per round), ``--phases`` quiet
phases and as many busy ones (a busy loop this script starts and stops) are pooled, and
eager's calls share the rotation as they do in ``bench_busy.py``, so PyTorch's OpenMP
threads spin between samples as they would in a mixed program. Session 26 decided the
rescue and the busy windows with it (docs/perf.md).

Prints, per variant, the median (and quartiles) in ms quiet and busy, busy/quiet, and
how many busy windows opened in the run.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_busy import BusyCore, _workloads  # noqa: E402
from common import parser  # noqa: E402

VARIANTS = ("eager", "openmp", "openmp+windows", "team", "team-norescue", "default")
SAMPLE_S = 0.05  # each sample: calls for this long, their mean


def _setter(variant: str) -> Callable[[], None]:
    """A function that makes hologram's loops run as ``variant`` says."""
    import hologram as hg
    from hologram.compiler import team
    from hologram.compiler.cc import CCompiler

    def rescue(on: bool) -> None:
        ctypes.c_int.in_dll(team.library(CCompiler.find()), "hg_rescue").value = int(on)

    def apply() -> None:
        if variant == "eager":
            return
        mode = ("team" if variant.startswith("team") else None if variant == "default"
                else "openmp")
        team.WHEN_BUSY = variant in ("openmp+windows", "default")
        hg.set_threading(mode)  # rebinds every loaded kernel library
        rescue(variant != "team-norescue")
    return apply


def _sample(call: Callable[[], Any]) -> float:
    t = time.perf_counter()
    n = 0
    while time.perf_counter() - t < SAMPLE_S:
        call()
        n += 1
    return (time.perf_counter() - t) / n * 1e3


def main() -> None:
    p = parser(__doc__.split("\n")[0])
    p.add_argument("--workload", required=True,
                   help="a substring of one of bench_busy.py's workload names")
    p.add_argument("--variants", default="eager,openmp,openmp+windows",
                   help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--phases", type=int, default=3, help="quiet and busy phases, pooled")
    p.add_argument("--rounds", type=int, default=8, help="rounds per phase")
    args = p.parse_args()
    variants = args.variants.split(",")
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise SystemExit(f"--variants: unknown {bad}; expected some of {VARIANTS}")
    import hologram_torch  # noqa: F401  (registers backend="hologram")
    from hologram.compiler import team

    found = {n: b for n, b in _workloads(False).items() if args.workload.lower() in n.lower()}
    if len(found) != 1:
        raise SystemExit(f"--workload {args.workload!r} matches {sorted(found) or 'nothing'}")
    (name, build), = found.items()
    calls = {"eager": build("eager")}
    hologram_call = build("hologram")
    setters = {v: _setter(v) for v in variants}
    for v in variants:  # compile and warm up under each variant
        setters[v]()
        for _ in range(3):
            (calls["eager"] if v == "eager" else hologram_call)()
    opened = team.load_address()
    windows_before = (ctypes.c_double * 5).from_address(opened)[1] if opened else 0.0
    res: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.phases):
        for cond in ("quiet", "busy"):
            with BusyCore() if cond == "busy" else contextlib.nullcontext():
                for r in range(args.rounds):
                    for v in (variants if r % 2 else variants[::-1]):
                        setters[v]()
                        call = calls["eager"] if v == "eager" else hologram_call
                        call()
                        res.setdefault((cond, v), []).append(_sample(call))
    opened = team.load_address()
    windows = ((ctypes.c_double * 5).from_address(opened)[1] - windows_before
               if opened else 0.0)
    print(f"{name}: medians in ms (quartiles), {args.phases} quiet and {args.phases} busy "
          f"phases; busy windows opened: {windows:.0f}")
    out: dict[str, Any] = {"workload": name, "windows": windows, "variants": {}}
    for v in variants:
        q, b = res[("quiet", v)], res[("busy", v)]
        qs, bs = statistics.quantiles(q, n=4), statistics.quantiles(b, n=4)
        slow = statistics.median(b) / statistics.median(q)
        print(f"  {v:15s} quiet {statistics.median(q):8.3f} ({qs[0]:.3f}-{qs[2]:.3f})  "
              f"busy {statistics.median(b):8.3f} ({bs[0]:.3f}-{bs[2]:.3f})  "
              f"busy/quiet {slow:.2f}x")
        out["variants"][v] = {"quiet_ms": q, "busy_ms": b, "slowdown": slow}
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
