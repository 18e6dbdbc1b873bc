"""How many threads hologram's kernels use, and where that number came from.

OpenMP on its own starts one thread per CPU in the process's affinity mask. That is
too many in a container whose CPU quota is smaller than the machine (a runner with
"2 CPUs" of a 64-core host): the threads then share the quota, every kernel waits
for its slowest thread, and each is descheduled in turn. So the count follows what
the process may actually use, in this order:

0. :func:`set_num_threads`, when called,
1. ``HOLOGRAM_NUM_THREADS`` (hologram's own kernels only),
2. ``OMP_NUM_THREADS`` (its first entry: the outermost level),
3. the CPUs in ``os.sched_getaffinity(0)``, capped by the cgroup's CPU quota
   (``cpu.max`` in cgroup v2, ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` in v1),
   rounded up.

Each kernel library has a thread count of its own (``hg_num_threads``, written when
it is loaded and by :func:`set_num_threads`), which its parallel loops ask for with a
``num_threads`` clause. OpenMP's process-wide default is left alone: the OpenMP
runtime may be the one PyTorch loaded, and its thread count is PyTorch's.
"""

from __future__ import annotations

import ctypes
import math
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV = "HOLOGRAM_NUM_THREADS"
CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class ThreadCount:
    """The thread count, a short phrase saying where it came from, and any setting
    that was ignored (as libgomp ignores a malformed OMP_NUM_THREADS, with a warning)."""

    count: int
    source: str
    ignored: tuple[str, ...] = ()


def _from_env(name: str) -> int | str | None:
    """The variable's count, None when unset, or why its value is ignored."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    first = raw.split(",")[0].strip()
    if not first.isdigit() or int(first) < 1:
        return f"{name}={raw!r} ignored: expected a positive integer thread count"
    return int(first)


def cgroup_quota(root: Path = CGROUP_ROOT) -> float | None:
    """CPUs the cgroup quota allows (e.g. 1.5), or None when there is no quota."""
    v2 = root / "cpu.max"
    try:
        quota, period = v2.read_text().split()[:2]
        if quota == "max":
            return None
        return int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    if quota_us <= 0 or period_us <= 0:
        return None
    return quota_us / period_us


def affinity() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def detect(root: Path = CGROUP_ROOT) -> ThreadCount:
    """The count hologram's kernels run with (see the module doc for the order)."""
    if _OVERRIDE is not None:
        return ThreadCount(_OVERRIDE, "hologram.set_num_threads")
    ignored: list[str] = []
    for name in (ENV, "OMP_NUM_THREADS"):
        n = _from_env(name)
        if isinstance(n, int):
            return ThreadCount(n, name, tuple(ignored))
        if n is not None:
            ignored.append(n)
    cpus = affinity()
    quota = cgroup_quota(root)
    if quota is not None and math.ceil(quota) < cpus:
        return ThreadCount(max(1, math.ceil(quota)),
                           f"cgroup CPU quota {quota:g} of {cpus} CPUs in the affinity mask",
                           tuple(ignored))
    return ThreadCount(cpus, "CPUs in the affinity mask (os.sched_getaffinity)", tuple(ignored))


_OVERRIDE: int | None = None
_LIBS: list[Any] = []  # every loaded library with a thread count of its own


def _write(lib: Any, n: int) -> None:
    ctypes.c_int.in_dll(lib, "hg_num_threads").value = n


def apply(lib: Any) -> None:
    """Give a newly loaded kernel library the current thread count."""
    try:
        ctypes.c_int.in_dll(lib, "hg_num_threads")
    except ValueError:  # no parallel loops of hologram's own in it
        return
    t = detect()
    _write(lib, t.count)
    _LIBS.append(lib)
    if len(_LIBS) == 1:
        for why in t.ignored:
            warnings.warn(f"hologram: {why}; using {t.count} threads ({t.source})",
                          stacklevel=2)


def set_num_threads(n: int | None) -> None:
    """Run hologram's CPU kernels on ``n`` threads from now on (``None``: back to the
    environment's count). Only hologram's own loops change: PyTorch's or NumPy's
    thread counts are theirs."""
    global _OVERRIDE
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"set_num_threads: n must be a positive int or None, got {n!r}")
    _OVERRIDE = n
    count = detect().count
    for lib in _LIBS:
        _write(lib, count)


def get_num_threads() -> int:
    """The thread count hologram's CPU kernels run with."""
    return detect().count


# --- who runs the parallel loops: hologram's team or OpenMP -------------------------------
#: ``HOLOGRAM_THREADING``: ``team`` (hologram's own thread team, ``compiler/team.py``) or
#: ``openmp`` (the process's OpenMP runtime). Unset: the team. The team never waits for
#: a thread the OS has not started, so it holds up better on a busy machine (bench_busy,
#: session 27: 1.18-1.49x slower with a core taken, OpenMP up to 2.08x). In a process
#: that has imported PyTorch, whose eager ops run on OpenMP's threads, two pools of
#: spinning threads on the same cores slow each other (a kernel right after a torch op
#: ran 1.5-3x slower on the team, docs/perf.md, session 11; an MLP step with its Adam
#: eager 1.4-1.5x, session 27), so there the team steps aside to OpenMP's threads while
#: the process's other threads keep a CPU busy (``team.set_aside``); until session 27
#: hologram used OpenMP there throughout.
THREADING_ENV = "HOLOGRAM_THREADING"
THREADING_MODES = ("team", "openmp")
_MODE: str | None = None
_TEAM_LIBS: list[tuple[Any, Any]] = []  # (library, () -> the team's address)


def threading() -> tuple[str, str]:
    """Who runs hologram's parallel loops, and why (see ``set_threading``)."""
    if _MODE is not None:
        return _MODE, "hologram.set_threading"
    raw = _env_mode()
    if raw in THREADING_MODES:
        return raw, THREADING_ENV
    why = (f"{THREADING_ENV}={raw!r} ignored: expected one of {', '.join(THREADING_MODES)}; "
           if raw else "")
    if "torch" in sys.modules:
        return "team", why + ("PyTorch is loaded: the team, which hands its loops to "
                              "OpenMP's threads (PyTorch's) while PyTorch's eager ops "
                              "keep them busy")
    return "team", why + "default"


def _env_mode() -> str:
    """``HOLOGRAM_THREADING`` as written, normalized ("" when unset)."""
    return os.environ.get(THREADING_ENV, "").strip().lower()


def _beside_torch() -> bool:
    """Whether the team steps aside for PyTorch's eager ops (``compiler/team.py``,
    "Beside PyTorch"): the default in a process that has imported PyTorch, not a
    mode the user chose."""
    return (_MODE is None and "torch" in sys.modules
            and _env_mode() not in THREADING_MODES)


def _point(lib: Any, address: Any, mode: str) -> None:
    from .compiler import team
    from .compiler.cc import CompileError

    ctypes.c_void_p.in_dll(lib, "hg_team").value = address() if mode == "team" else None
    team.set_aside(mode == "team" and _beside_torch())
    try:  # OpenMP's loops under load go to the team for a while (compiler/team.py)
        busy = ctypes.c_void_p.in_dll(lib, "hg_team_busy")
        load = ctypes.c_void_p.in_dll(lib, "hg_load")
    except ValueError:  # not Linux, or no OpenMP
        pass
    else:
        on = mode == "openmp" and team.WHEN_BUSY
        try:
            busy.value = address() if on else None
        except CompileError as e:  # no team to go to: OpenMP throughout, as before
            first = (str(e).splitlines() or [""])[0]
            _warn_once(f"hologram: the thread team does not build here ({first}); parallel "
                       "loops stay on OpenMP's threads on a busy machine")
            busy.value = None
            on = False
        load.value = team.load_address() if on else None
    try:  # OpenMP's workers move off the caller's CPU when the team's would
        ctypes.c_int.in_dll(lib, "hg_omp_spreads").value = int(team.SPREAD)
    except ValueError:  # not Linux, or no OpenMP: nothing to move
        pass


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def bind_team(lib: Any, address: Any) -> None:
    """Point a newly loaded kernel library's ``hg_team`` at the team (``address()``
    builds it on first use) or at nothing (its loops then open OpenMP regions)."""
    _TEAM_LIBS.append((lib, address))
    _point(lib, address, threading()[0])


def rebind() -> None:
    """Point every loaded library again, as ``threading()`` now says (``hologram_torch``
    calls this once it has imported PyTorch)."""
    mode = threading()[0]
    for lib, address in _TEAM_LIBS:
        _point(lib, address, mode)


def set_threading(mode: str | None) -> None:
    """Run hologram's parallel loops on its own thread team (``"team"``) or on OpenMP's
    (``"openmp"``); ``None``: back to ``HOLOGRAM_THREADING`` or the default.

    The team never waits for a thread the OS has not scheduled (a machine whose other
    cores are busy); OpenMP shares its threads with PyTorch's eager ops in the same
    process, whose threads otherwise spin for a while after each op and take cores
    from the team."""
    global _MODE
    if mode is not None and mode not in THREADING_MODES:
        raise ValueError(f"set_threading: mode must be one of {THREADING_MODES} or None, "
                         f"got {mode!r}")
    _MODE = mode
    rebind()
