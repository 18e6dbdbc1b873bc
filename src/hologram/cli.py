"""The ``hologram`` command: ``hologram info`` and ``hologram demo``.

``info`` answers the first question of every bug report and every "why is it
slow here": which version, which backends can run on this machine and why the
others cannot, which one 'auto' picks, where compiled kernels are cached, and
what the CPU backend's C compiler will have to work with. ``demo`` is a
one-minute proof that the install works: it runs a few ops on the default
backend, checks each against NumPy and times both, and exits non-zero on a wrong
result, so it doubles as a smoke test.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from . import __version__
from .backends import registry
from .backends.cuda_device import emulated_requested
from .cache import cache_dir
from .errors import HologramError

EMULATED_SUMMARY = ("EMULATED CUDA device (HOLOGRAM_CUDA_DEVICE=emulated): CUDA C run on the "
                    "CPU through the host C++ compiler, not a GPU; 'auto' never picks it")

if TYPE_CHECKING:
    from .executor import Executor

# CPU flags (as /proc/cpuinfo names them) that decide how fast vector math can be.
CPU_FLAGS: tuple[str, ...] = ("sse4_2", "avx", "avx2", "fma", "avx512f")
C_COMPILERS: tuple[str, ...] = ("cc", "gcc", "clang")


# --- info ---------------------------------------------------------------------------
def cpu_features(cpuinfo: str | Path = "/proc/cpuinfo") -> dict[str, bool] | None:
    """Which of CPU_FLAGS the CPU has, from the first ``flags`` line of /proc/cpuinfo;
    None where that file does not exist or has no flags line (macOS, Windows, ARM)."""
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            have = set(value.split())
            return {flag: flag in have for flag in CPU_FLAGS}
    return None


def c_compiler() -> str | None:
    """The C compiler the CPU backend builds kernels with (its path and version), or None."""
    from .compiler.cc import CCompiler

    found = CCompiler.find()
    return found.id if found is not None else None


def collect_info() -> dict[str, Any]:
    """Everything ``hologram info`` prints, as plain data (what ``--json`` emits)."""
    backends = {}
    for name, entry in registry.REGISTRY.items():
        reason = registry.why_unavailable(name)
        backends[name] = {"available": reason is None, "reason": reason,
                          "summary": entry.summary}
    if backends["cuda"]["available"] and emulated_requested():
        # Never presented as a GPU: say which device the cuda backend would run on.
        backends["cuda"]["summary"] = EMULATED_SUMMARY
        backends["cuda"]["device"] = "emulated"
    directory = cache_dir()
    return {
        "version": __version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "platform": platform.platform(),
        "backends": backends,
        "default_backend": registry.get_default_backend(),
        "cache_dir": str(directory),
        "cache_dir_exists": directory.is_dir(),
        "cpu_features": cpu_features(),
        "c_compiler": c_compiler(),
        "gemm": gemm_route(),
        "threads": thread_route(),
    }


def gemm_route() -> str:
    """How the CPU backend runs GEMM (MKL or OpenBLAS in hologram's threads, or np.matmul)."""
    from .compiler import blas

    try:
        return blas.describe()
    except ValueError as e:  # a bad HOLOGRAM_BLAS: info still prints, and says so
        return f"not decided: {e}"


def thread_route() -> str:
    """How many threads the CPU kernels use and why (hologram.threads)."""
    from . import threads

    t = threads.detect()
    mode, why = threads.threading()
    who = "hologram's thread team" if mode == "team" else "OpenMP's threads"
    from .compiler import cc, team

    busy = (f"; while a region waits {cc.LATE_US / 1000:g} ms or more for a late thread, "
            f"on the team for {cc.BUSY_US / 1e6:g} s" if mode == "openmp" and team.WHEN_BUSY
            else "")
    aside = (f"; stood aside {team.asides()} time(s) so far" if mode == "team"
             and team.asides() else "")
    return (f"{t.count} ({t.source})" + "".join(f"; {w}" for w in t.ignored)
            + f", on {who} ({why}){busy}{aside}")


def format_info(info: dict[str, Any]) -> str:
    lines = [
        f"hologram {info['version']} (Python {info['python']}, NumPy {info['numpy']})",
        f"platform: {info['platform']}",
        "backends:",
    ]
    width = max(len(n) for n in info["backends"])
    for name, b in info["backends"].items():
        state = "yes" if b["available"] else "no "
        detail = b["summary"] if b["available"] else b["reason"]
        lines.append(f"  {name:<{width}}  {state}  {detail}")
    lines.append(f"default backend: {info['default_backend']}")
    exists = "" if info["cache_dir_exists"] else " (not created yet)"
    lines.append(f"cache directory: {info['cache_dir']}{exists}")
    feats = info["cpu_features"]
    if feats is None:
        lines.append("CPU features: unknown (no /proc/cpuinfo flags)")
    else:
        have = [f for f, ok in feats.items() if ok]
        missing = [f for f, ok in feats.items() if not ok]
        text = " ".join(have) or "none"
        lines.append(f"CPU features: {text}" + (f" (missing: {' '.join(missing)})"
                                                if missing else ""))
    cc = info["c_compiler"] or f"none found (looked for {', '.join(C_COMPILERS)})"
    lines.append(f"C compiler: {cc}")
    lines.append(f"GEMM: {info['gemm']}")
    lines.append(f"CPU kernel threads: {info['threads']}")
    return "\n".join(lines)


def cmd_info(args: argparse.Namespace) -> int:
    info = collect_info()
    print(json.dumps(info, indent=2) if args.json else format_info(info))
    return 0


# --- demo ---------------------------------------------------------------------------
@dataclass
class DemoCase:
    """One row of the demo: a hologram op, its NumPy equivalent, and how close they must be.

    ``run`` calls the op on buffers prepared beforehand and ``result`` reads its output,
    so timing measures the op, not allocation or transfer. ``tol`` bounds the normwise
    relative error max|h - n| / max|n|, which stays meaningful for outputs of any scale
    (softmax values are ~1e-6 each at 1M elements).
    """

    name: str
    shape: str
    run: Callable[[], Any]
    result: Callable[[], np.ndarray]
    numpy: Callable[[], Any]
    tol: float


def _median_time(fn: Callable[[], Any], repeat: int) -> float:
    """Median of ``repeat`` timed calls, after a pause and one untimed call: the other
    side's thread pool (OpenBLAS spins ~0.1 s after a NumPy matmul) goes idle first,
    so each side is timed as it runs on its own (benchmarks/README.md, "settled")."""
    time.sleep(0.2)
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _fmt_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def _gelu_np(x: np.ndarray) -> np.ndarray:
    c = np.float32(np.sqrt(2 / np.pi))
    inner = c * (x + np.float32(0.044715) * (x * x * x))  # x*x*x: NumPy's x**3 is a slow pow
    return np.float32(0.5) * x * (np.float32(1) + np.tanh(inner))


def _softmax_np(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    e /= e.sum()
    return e


def demo_cases(ex: Executor, size: int, dim: int, seed: int = 0) -> list[DemoCase]:
    """The demo's ops on ``size``-element vectors and ``dim`` x ``dim`` matrices."""
    from . import ops

    rng = np.random.default_rng(seed)
    x = rng.standard_normal(size, dtype=np.float32)
    y = rng.standard_normal(size, dtype=np.float32)
    u = rng.random(size, dtype=np.float32)  # positive: a sum without cancellation
    A = rng.standard_normal((dim, dim), dtype=np.float32)
    B = rng.standard_normal((dim, dim), dtype=np.float32)

    bx, by, bu = (ex.allocate(size).from_numpy(v) for v in (x, y, u))
    bz, scalar = ex.allocate(size), ex.allocate(1)
    bA, bB, bC = ex.allocate((dim, dim)).from_numpy(A), ex.allocate((dim, dim)).from_numpy(B), \
        ex.allocate((dim, dim))
    z = np.empty_like(x)
    C = np.empty_like(A)

    def out() -> np.ndarray:
        return bz.to_numpy().copy()

    def first() -> np.ndarray:
        return scalar.to_numpy().reshape(-1)[:1].copy()

    vec, mat = f"{size:,}", f"{dim}x{dim}"
    return [
        DemoCase("vector_add", vec, lambda: ops.vector_add(ex, bx, by, bz), out,
                 lambda: np.add(x, y, out=z), 1e-6),
        DemoCase("gelu", vec, lambda: ops.gelu(ex, bx, bz), out, lambda: _gelu_np(x), 1e-5),
        DemoCase("softmax", vec, lambda: ops.softmax(ex, bx, bz), out,
                 lambda: _softmax_np(x), 1e-5),
        DemoCase("reduce_sum", vec, lambda: ops.reduce_sum(ex, bu, scalar), first,
                 lambda: np.atleast_1d(u.sum()), 1e-5),
        DemoCase("mse_loss", vec, lambda: ops.mse_loss(ex, bx, by, scalar), first,
                 lambda: np.atleast_1d(np.mean(np.square(x - y))), 1e-5),
        DemoCase("gemm", mat, lambda: ops.gemm(ex, bA, bB, bC), lambda: bC.to_numpy().copy(),
                 lambda: np.matmul(A, B, out=C), 1e-5),
    ]


def run_demo(ex: Executor, size: int, dim: int, repeat: int) -> tuple[list[list[str]], bool]:
    """Run every demo case on executor ``ex``; the table rows and whether all checks passed."""
    rows = [["op", "size", "first call", "hologram", "numpy", "speedup", "check"]]
    all_ok = True
    for case in demo_cases(ex, size, dim):
        try:
            t0 = time.perf_counter()
            case.run()  # first call: builds, compiles and caches the program
            first = time.perf_counter() - t0
            got = case.result()
            want = np.asarray(case.numpy())
            err = float(np.max(np.abs(got.astype(np.float64) - want)) /
                        max(float(np.max(np.abs(want))), np.finfo(np.float32).tiny))
            ok = bool(np.isfinite(err) and err <= case.tol)
            t_holo = _median_time(case.run, repeat)
            t_np = _median_time(case.numpy, repeat)
            check = f"{'OK' if ok else 'FAIL'} (max rel err {err:.1e})"
            rows.append([case.name, case.shape, _fmt_time(first), _fmt_time(t_holo),
                         _fmt_time(t_np), f"{t_np / t_holo:.2f}x", check])
        except HologramError as e:
            ok = False
            rows.append([case.name, case.shape, "-", "-", "-", "-", f"FAIL ({e})"])
        all_ok &= ok
    return rows, all_ok


def format_table(rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned text columns, right-aligned numbers, a rule under the header."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    right = {1, 2, 3, 4, 5}  # size, times, speedup

    def line(r: Sequence[str]) -> str:
        cells = [c.rjust(w) if i in right else c.ljust(w)
                 for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        return "  ".join(cells).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(rows[0]), rule, *(line(r) for r in rows[1:])])


def cmd_demo(args: argparse.Namespace) -> int:
    """The main job: train a classifier through torch.compile(backend='hologram'); with
    --ops, or without the torch extra installed, the op-by-op showcase instead."""
    if not args.ops:
        missing = [m for m in ("torch", "sklearn", "tqdm") if not _importable(m)]
        if not missing:
            from .demo_train import main as train_main

            return train_main(args.extra)
        print(f"(the training demo needs {', '.join(missing)}: pip install 'hologram[torch]'; "
              "showing the op demo instead)\n")
    elif args.extra:
        print(f"hologram demo --ops: unknown arguments {args.extra}", file=sys.stderr)
        return 2
    return cmd_demo_ops(args)


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def cmd_demo_ops(args: argparse.Namespace) -> int:
    from .executor import Executor  # not at import time: `hologram info` needs no executor

    with Executor(args.backend) as ex:  # an unavailable backend raises before any output
        name = ex.backend_name
        print(f"hologram {__version__} demo on backend {name!r} "
              f"({registry.REGISTRY[name].summary})")
        print(f"median of {args.repeat} runs, each side after a 0.2 s pause (so neither "
              "pays for the other's idle threads); speedup = numpy time / hologram time; "
              "first call includes building and compiling the program\n")
        rows, ok = run_demo(ex, args.size, args.dim, args.repeat)
    print(format_table(rows))
    print("\nall checks passed" if ok else "\nSOME CHECKS FAILED")
    return 0 if ok else 1


# --- entry point --------------------------------------------------------------------
def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hologram", description="hologram compute runtime: diagnostics and a demo.")
    parser.add_argument("--version", action="version", version=f"hologram {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="command")

    p_info = sub.add_parser("info", help="version, backends, cache directory, CPU and compiler")
    p_info.add_argument("--json", action="store_true", help="print the same as JSON")
    p_info.set_defaults(func=cmd_info)

    p_demo = sub.add_parser(
        "demo", help="train an MLP through torch.compile(backend='hologram') beside eager "
        "PyTorch (--ops: run a few ops, check them against NumPy, time both); other "
        "arguments go to the training demo (--epochs N, --no-progress, --explain)")
    p_demo.add_argument("--ops", action="store_true", help="the op-by-op showcase")
    p_demo.add_argument("--backend", default="auto",
                        help="backend to run on (default: auto, the best available)")
    p_demo.add_argument("--size", type=_positive, default=1 << 20,
                        help="elements per vector (default: 1048576)")
    p_demo.add_argument("--dim", type=_positive, default=512,
                        help="GEMM matrices are dim x dim (default: 512)")
    p_demo.add_argument("--repeat", type=_positive, default=5,
                        help="timed runs per op; the median is shown (default: 5)")
    p_demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 failure, 2 usage error)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "demo":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra = extra
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(args.func(args))
    except HologramError as e:  # e.g. an unavailable backend: its reason, not a traceback
        print(f"hologram: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
