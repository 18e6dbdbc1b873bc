"""Shared helpers for the benchmarks: timing, tables, targets, JSON and environment.

Timing: ``measure(fn)`` warms up, then takes ``repeat`` samples with
``time.perf_counter_ns``; each sample times a loop of ``inner`` calls and
divides, so ops far below a microsecond are not lost in timer resolution
(``inner=None`` picks a loop length that makes each sample ~``sample_s`` long).
Results are medians with the inter-quartile range.

Tables: rows of (name, Timing), one row is the baseline; the printed ratio is
``baseline median / row median`` (>1: faster than the baseline). Extra ratio
columns (e.g. "x copy floor") can be added against any other row.

Each benchmark builds a ``Report`` (tables + targets + notes + environment)
and writes it with ``--json``; ``run_all.py`` turns the JSON into report.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "src")
if SRC not in sys.path:  # runnable from a checkout without `pip install -e .`
    sys.path.insert(0, SRC)


# --------------------------------------------------------------------------- timing
@dataclass
class Timing:
    """Per-call seconds: median, quartiles, and how they were taken."""

    median: float
    q1: float
    q3: float
    repeat: int
    inner: int
    samples: list[float] = field(default_factory=list)

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["iqr"] = self.iqr
        return d


def _quartiles(xs: list[float]) -> tuple[float, float, float]:
    if len(xs) == 1:
        return xs[0], xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], statistics.median(xs), q[2]


def from_samples(samples: list[float], inner: int = 1) -> Timing:
    q1, med, q3 = _quartiles(samples)
    return Timing(med, q1, q3, len(samples), inner, list(samples))


def _loop(fn: Callable[[], Any], n: int) -> int:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn()
    return time.perf_counter_ns() - t0


def measure(fn: Callable[[], Any], *, repeat: int = 7, warmup: int = 2, inner: int | None = None,
            sample_s: float = 0.02, max_s: float | None = None,
            warmup_s: float = 0.25) -> Timing:
    """Time ``fn()``: untimed warm-up calls (at least ``warmup`` of them and at least
    ``warmup_s`` seconds: allocators and thread pools settle over the first calls), then
    ``repeat`` samples of ``inner`` calls each.

    ``inner=None`` (default): choose the loop length so a sample takes about ``sample_s``
    (one call per sample for calls longer than that).
    ``max_s``: stop taking samples (keeping at least 3) once this much time is spent.
    """
    t_end = time.perf_counter() + warmup_s
    done = 0
    while done < warmup or time.perf_counter() < t_end:
        fn()
        done += 1
    if inner is None:
        n = 1
        while True:
            dt = _loop(fn, n) / 1e9
            if dt >= sample_s / 4 or n >= 1 << 22:
                break
            n *= 4
        inner = max(1, int(n * sample_s / max(dt, 1e-9)))
    samples: list[float] = []
    start = time.perf_counter()
    for _ in range(repeat):
        samples.append(_loop(fn, inner) / 1e9 / inner)
        if max_s is not None and len(samples) >= 3 and time.perf_counter() - start > max_s:
            break
    return from_samples(samples, inner)


def measure_interleaved(fns: dict[str, Callable[[], Any]], *, repeat: int = 7,
                        warmup_s: float = 0.25, sample_s: float = 0.02,
                        settle_s: float = 0.0) -> dict[str, Timing]:
    """Time several functions with their samples interleaved (a, b, c, b, c, a, ...), so a
    transient disturbance (another process, frequency changes) hits all of them alike:
    the right method when the claim is a small ratio ("within 5% of NumPy").

    ``settle_s``: pause this long (then make one untimed call) before each sample, so
    thread pools the previous function left spinning (OpenBLAS's spin ~0.1 s after a
    call) are idle again and each function is timed as it runs in a loop of its own.
    """
    inner = {}
    for name, fn in fns.items():  # warm-up and loop length per function
        warm = measure(fn, repeat=1, warmup_s=warmup_s, sample_s=sample_s)
        inner[name] = warm.inner
    samples: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for i in range(repeat):
        order = names[i % len(names):] + names[:i % len(names)]
        for name in order:
            if settle_s:
                time.sleep(settle_s)
                fns[name]()
            samples[name].append(_loop(fns[name], inner[name]) / 1e9 / inner[name])
    return {k: from_samples(v, inner[k]) for k, v in samples.items()}


def once(fn: Callable[[], Any]) -> tuple[float, Any]:
    """(seconds, result) of one call."""
    t0 = time.perf_counter_ns()
    r = fn()
    return (time.perf_counter_ns() - t0) / 1e9, r


# ----------------------------------------------------------------------------- units
def fmt_time(s: float | None, unit: str) -> str:
    if s is None:
        return "-"
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}[unit]
    v = s * scale
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}" if v >= 1 else f"{v:.3f}"


def fmt_ratio(r: float | None) -> str:
    if r is None:
        return "-"
    if r >= 100:
        return f"{r:.0f}x"
    return f"{r:.2f}x" if r < 10 else f"{r:.1f}x"


# ----------------------------------------------------------------------------- table
@dataclass
class Row:
    name: str
    timing: Timing | None
    note: str = ""
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Table:
    """Rows of medians, with ratios against a baseline row (and optional other rows).

    ``ratio`` = baseline median / row median (higher is faster). ``vs`` adds more
    columns ``row median / reference median`` (e.g. "x copy floor": lower is better).
    """

    def __init__(self, title: str, baseline: str | None, unit: str = "ms",
                 vs: dict[str, str] | None = None, extra_cols: tuple[str, ...] = ()) -> None:
        self.title = title
        self.baseline = baseline
        self.unit = unit
        self.vs = dict(vs or {})  # column label -> reference row name
        self.extra_cols = tuple(extra_cols)
        self.rows: list[Row] = []
        self.marks: dict[str, list[str]] = {}  # row name -> target verdicts shown in the row

    def add(self, name: str, timing: Timing | None, note: str = "", error: str | None = None,
            **extra: Any) -> Row:
        r = Row(name, timing, note, error, extra)
        self.rows.append(r)
        return r

    def row(self, name: str) -> Row | None:
        for r in self.rows:
            if r.name == name:
                return r
        return None

    def median(self, name: str) -> float | None:
        r = self.row(name)
        return r.timing.median if r is not None and r.timing is not None else None

    def ratio(self, name: str) -> float | None:
        """Speedup of ``name`` over the baseline (baseline / name)."""
        if self.baseline is None:
            return None
        b, m = self.median(self.baseline), self.median(name)
        return b / m if b and m else None

    def ratio_to(self, name: str, ref: str) -> float | None:
        """``name`` / ``ref`` (e.g. times the copy floor)."""
        a, b = self.median(name), self.median(ref)
        return a / b if a and b else None

    def headers(self) -> list[str]:
        speed = [] if self.baseline is None else [f"speedup vs {self.baseline}"]
        return (["implementation", f"median {self.unit}", f"IQR {self.unit}", *speed]
                + list(self.vs) + list(self.extra_cols) + ["note", "targets"])

    def cells(self) -> list[list[str]]:
        out = []
        for r in self.rows:
            speed = self.baseline is not None
            if r.timing is None:
                cells = [r.name, "ERROR" if r.error else "-", "-"] + ["-"] * speed
                cells += ["-"] * len(self.vs)
            else:
                cells = [r.name, fmt_time(r.timing.median, self.unit),
                         fmt_time(r.timing.iqr, self.unit)]
                cells += [fmt_ratio(self.ratio(r.name))] * speed
                cells += [fmt_ratio(self.ratio_to(r.name, ref)) for ref in self.vs.values()]
            cells += [str(r.extra.get(c, "")) for c in self.extra_cols]
            note = r.note
            if r.error:
                note = (note + "; " if note else "") + r.error.splitlines()[-1][:120]
            cells.append(note)
            cells.append("; ".join(self.marks.get(r.name, [])))
            out.append(cells)
        return out

    def render(self) -> str:
        return render_grid(self.title, self.headers(), self.cells())

    def markdown(self) -> str:
        return markdown_table(self.headers(), self.cells())

    def mark(self, name: str, t: Target) -> None:
        self.marks.setdefault(name, []).append(f"{t.status} {t.goal}")

    def to_json(self) -> dict[str, Any]:
        return {
            "title": self.title, "marks": self.marks, "baseline": self.baseline,
            "unit": self.unit, "vs": self.vs,
            "extra_cols": list(self.extra_cols),
            "rows": [{"name": r.name, "timing": r.timing.to_json() if r.timing else None,
                      "note": r.note, "error": r.error, "extra": r.extra,
                      "speedup": self.ratio(r.name),
                      "vs": {k: self.ratio_to(r.name, v) for k, v in self.vs.items()}}
                     for r in self.rows],
            "headers": self.headers(), "cells": self.cells(),
        }


class Grid:
    """A table of plain cells (counts, not timings), printed like ``Table``.

    ``plot``: optional {"labels": [...], "values": [...], "ylabel": str} for run_all's charts.
    """

    def __init__(self, title: str, headers: list[str]) -> None:
        self.title = title
        self._headers = list(headers)
        self.rows: list[list[str]] = []
        self.plot: dict[str, Any] | None = None

    def add(self, *cells: Any) -> None:
        self.rows.append([str(c) for c in cells])

    def headers(self) -> list[str]:
        return self._headers

    def cells(self) -> list[list[str]]:
        return self.rows

    def render(self) -> str:
        return render_grid(self.title, self._headers, self.rows)

    def markdown(self) -> str:
        return markdown_table(self._headers, self.rows)

    def to_json(self) -> dict[str, Any]:
        return {"title": self.title, "kind": "grid", "headers": self._headers,
                "cells": self.rows, "plot": self.plot}


def render_grid(title: str, headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    out = [f"== {title} ==" if title else ""]
    out.append("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    out.append("  ".join("-" * w for w in widths))
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(x for x in out if x)


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    def esc(s: str) -> str:
        return str(s).replace("|", "\\|")

    lines = ["| " + " | ".join(esc(h) for h in headers) + " |",
             "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


# --------------------------------------------------------------------------- targets
@dataclass
class Target:
    """One of the issue's performance targets and whether this run met it."""

    name: str
    goal: str
    measured: str
    passed: bool | None  # None: could not be measured

    @property
    def status(self) -> str:
        return "N/A" if self.passed is None else ("PASS" if self.passed else "MISS")


def target(name: str, goal: str, value: float | None, ok: Callable[[float], bool],
           fmt: Callable[[float], str] = lambda v: f"{v:.3g}") -> Target:
    if value is None:
        return Target(name, goal, "not measured", None)
    return Target(name, goal, fmt(value), bool(ok(value)))


def render_targets(targets: list[Target]) -> str:
    if not targets:
        return ""
    return render_grid("targets", ["target", "goal", "measured", "status"],
                       [[t.name, t.goal, t.measured, t.status] for t in targets])


# ------------------------------------------------------------------------ environment
def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_jiffies() -> tuple[int, int] | None:
    """(total, idle) jiffies of all CPUs since boot, from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return sum(v), v[3] + (v[4] if len(v) > 4 else 0)


def cpu_busy(interval: float = 0.5) -> float | None:
    """Fraction of all CPUs busy over ``interval`` seconds (from /proc/stat): other work
    on the machine skews every figure, so the reports record it."""
    a = cpu_jiffies()
    time.sleep(interval)
    b = cpu_jiffies()
    if a is None or b is None or b[0] == a[0]:
        return None
    return 1.0 - (b[1] - a[1]) / (b[0] - a[0])


def cpu_features() -> dict[str, Any]:
    """SIMD level and cache sizes (what decides vector math and the memory floor)."""
    info: dict[str, Any] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    info["simd"] = [x for x in ("sse4_2", "avx", "avx2", "fma", "avx512f",
                                                "avx512bw", "avx512vl") if x in flags]
                    break
    except OSError:
        pass
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for idx in sorted(os.listdir(base)):
            if idx.startswith("index"):
                with open(f"{base}/{idx}/level") as f:
                    level = f.read().strip()
                with open(f"{base}/{idx}/size") as f:
                    info[f"L{level}"] = f.read().strip()  # L1 ends as whichever comes last
    except OSError:
        pass
    return info


def _version(mod: str) -> str | None:
    try:
        m = __import__(mod)
        return getattr(m, "__version__", "?")
    except Exception:  # noqa: BLE001 - absent or broken: report it as missing
        return None


def hologram_backend() -> dict[str, Any]:
    """describe() of the cpu backend, and whether it is the native (C) one."""
    try:
        import warnings

        import hologram as hg

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ex = hg.default_executor("cpu")
        d = ex.backend.describe()
        return {"version": hg.__version__, "describe": d, "native": "C via" in d}
    except Exception as e:  # noqa: BLE001
        return {"version": None, "describe": f"error: {type(e).__name__}: {e}", "native": False}


def environment() -> dict[str, Any]:
    import numpy as np

    env: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "cpu_features": cpu_features(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "loadavg": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "busy_at_start": cpu_busy(0.25),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "numpy": np.__version__,
        "torch": _version("torch"),
        "numexpr": _version("numexpr"),
        "hologram": hologram_backend(),
        "env": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "HOLOGRAM_CACHE_DIR", "CC",
                                           "NUMEXPR_MAX_THREADS") if k in os.environ},
    }
    try:
        import torch

        env["torch_threads"] = torch.get_num_threads()
    except Exception:  # noqa: BLE001
        pass
    try:
        import numexpr

        env["numexpr_threads"] = numexpr.get_num_threads()
    except Exception:  # noqa: BLE001
        pass
    return env


def render_env(env: dict[str, Any]) -> str:
    h = env.get("hologram", {})
    return (f"{env['cpu']} ({env['cores']} cores), Python {env['python']}, "
            f"NumPy {env['numpy']}, torch {env.get('torch')}, numexpr {env.get('numexpr')}, "
            f"hologram {h.get('version')} [{h.get('describe')}]")


# ----------------------------------------------------------------------------- report
class Report:
    """Everything one benchmark measured; printed and written as JSON."""

    def __init__(self, name: str, description: str) -> None:
        self.name = name
        self.description = description
        self.tables: list[Table | Grid] = []
        self.targets: list[Target] = []
        self.notes: list[str] = []
        self.data: dict[str, Any] = {}
        self.env = environment()
        self.t0 = time.perf_counter()

    def table(self, *args: Any, **kw: Any) -> Table:
        t = Table(*args, **kw)
        self.tables.append(t)
        return t

    def grid(self, title: str, headers: list[str]) -> Grid:
        g = Grid(title, headers)
        self.tables.append(g)
        return g

    def check(self, t: Target, table: Table | None = None, row: str | None = None) -> Target:
        """Record a target; with ``table`` and ``row``, also show its verdict in that row."""
        self.targets.append(t)
        if table is not None and row is not None:
            table.mark(row, t)
        return t

    def note(self, msg: str) -> None:
        self.notes.append(msg)

    def render(self) -> str:
        parts = [f"# {self.name}: {self.description}", render_env(self.env)]
        if not self.env.get("hologram", {}).get("native"):
            parts.append("WARNING: hologram's cpu backend is not the native C backend; "
                         "its rows measure the reference interpreter.")
        parts += [t.render() for t in self.tables]
        if self.targets:
            parts.append(render_targets(self.targets))
        if self.notes:
            parts.append("notes:\n" + "\n".join(f"- {n}" for n in self.notes))
        return "\n\n".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "benchmark": self.name, "description": self.description, "env": self.env,
            "elapsed_s": time.perf_counter() - self.t0,
            "busy_at_end": cpu_busy(0.25),
            "tables": [t.to_json() for t in self.tables],
            "targets": [asdict(t) | {"status": t.status} for t in self.targets],
            "notes": self.notes, "data": self.data,
        }

    def finish(self, args: argparse.Namespace) -> None:
        print(self.render(), flush=True)
        if args.json:
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            with open(args.json, "w") as f:
                json.dump(self.to_json(), f, indent=1, default=str)
            print(f"\nwrote {args.json}")


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--json", metavar="PATH", help="write the results as JSON here")
    p.add_argument("--quick", action="store_true", help="fewer repeats (smoke test)")
    return p


def guarded(table: Table, name: str, fn: Callable[[], Timing | None], note: str = "",
            **extra: Any) -> Timing | None:
    """Add a row from ``fn()``; an exception becomes an ERROR row, not a crash."""
    try:
        t = fn()
    except Exception as e:  # noqa: BLE001 - a failing implementation is a result too
        err = f"{type(e).__name__}: {e}"
        print(f"[{table.title}] {name} failed:\n{traceback.format_exc()}", file=sys.stderr)
        table.add(name, None, note, error=err, **extra)
        return None
    table.add(name, t, note, **extra)
    return t


@dataclass
class Candidate:
    """One implementation waiting to be timed with the others (``add_interleaved``)."""

    fn: Callable[[], Any]
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def add_interleaved(table: Table, candidates: dict[str, Candidate], *, repeat: int,
                    settle_s: float = 0.0, failed: dict[str, str] | None = None) -> None:
    """Time ``candidates`` with their samples interleaved and add one row each, in order,
    then an ERROR row for each of ``failed`` (name -> why it could not be set up).

    The rows a target compares are sampled this way: on this VM a blocked row can take
    2x its usual time for a minute (docs/perf.md), and a ratio of two blocked rows is
    then decided by which minute each ran in. Interleaved, a slow minute hits both.
    A failure becomes an ERROR row for every candidate, as ``guarded`` does for one."""
    if candidates:
        _time_interleaved(table, candidates, repeat, settle_s)
    for name, why in (failed or {}).items():
        table.add(name, None, error=why)


def _time_interleaved(table: Table, candidates: dict[str, Candidate], repeat: int,
                      settle_s: float) -> None:
    try:
        timings = measure_interleaved({k: c.fn for k, c in candidates.items()},
                                      repeat=repeat, settle_s=settle_s)
    except Exception as e:  # noqa: BLE001 - a failing implementation is a result too
        print(f"[{table.title}] interleaved sampling failed:\n{traceback.format_exc()}",
              file=sys.stderr)
        for name, c in candidates.items():
            table.add(name, None, c.note, error=f"{type(e).__name__}: {e}", **c.extra)
        return
    how = "interleaved" + (", settled" if settle_s else "") + " sampling"
    for name, c in candidates.items():
        table.add(name, timings[name], f"{c.note}; {how}" if c.note else how, **c.extra)


def quiet_hologram():
    """import hologram with its 'no C compiler' warning silenced (it is in the report)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import hologram as hg

        hg.default_executor("cpu")
    return hg


def max_abs_err(a: Any, b: Any) -> float:
    import numpy as np

    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def fresh_inductor_cache() -> str | None:
    """Point TorchInductor at a new temp cache (call before importing torch), so the
    first torch.compile call measures a cold compile, as a user's first run sees it."""
    import tempfile

    if os.environ.get("BENCH_INDUCTOR_WARM_CACHE"):
        return None
    d = tempfile.mkdtemp(prefix="bench-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = d
    return d
