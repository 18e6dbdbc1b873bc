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

The count is applied with ``omp_set_num_threads`` when a kernel library is loaded,
from the loading thread; it sets that thread's OpenMP default, which every
library of the process shares (one libgomp). Kernels launched from another Python
thread run with OpenMP's own default there.
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

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


_APPLIED: int | None = None
_OVERRIDE: int | None = None
_SET: object = None  # omp_set_num_threads of the first OpenMP kernel library loaded


def apply(lib: object) -> None:
    """Set the OpenMP thread count through ``lib``'s OpenMP runtime (once per count)."""
    global _APPLIED, _SET
    try:
        set_threads = lib.omp_set_num_threads  # type: ignore[attr-defined]
    except AttributeError:  # built without OpenMP: nothing to set
        return
    if _SET is None:
        import ctypes

        set_threads.argtypes, set_threads.restype = [ctypes.c_int], None
        _SET = set_threads
    t = detect()
    if _APPLIED == t.count:
        return
    _SET(t.count)  # type: ignore[operator]
    _APPLIED = t.count
    for why in t.ignored:
        warnings.warn(f"hologram: {why}; using {t.count} threads ({t.source})", stacklevel=2)


def set_num_threads(n: int | None) -> None:
    """Run hologram's CPU kernels on ``n`` threads from now on (``None``: back to the
    environment's count). Like ``torch.set_num_threads``, it sets the calling thread's
    OpenMP default."""
    global _OVERRIDE, _APPLIED
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"set_num_threads: n must be a positive int or None, got {n!r}")
    _OVERRIDE = n
    if _SET is not None:
        count = detect().count
        _SET(count)  # type: ignore[operator]
        _APPLIED = count


def get_num_threads() -> int:
    """The thread count hologram's CPU kernels run with."""
    return detect().count
