"""Soak: allocate, run, free, over and over, across both pools, with flat resident memory;
and a memory limit that raises OutOfMemoryError and leaves the executor working.

Cycles: HOLOGRAM_SOAK_CYCLES, else 1,000,000 under HYPOTHESIS_PROFILE=long, else 50,000
(the CI default). Run with -s to see the figures docs/reliability.md records.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import hologram as hg
from hologram.memory import BoundaryPool

LONG = os.environ.get("HYPOTHESIS_PROFILE") == "long"
CYCLES = int(os.environ.get("HOLOGRAM_SOAK_CYCLES") or (1_000_000 if LONG else 50_000))
BOUNDARY_N = 1000  # 4 KB: one boundary class
LINEAR_N = BoundaryPool.MAX_BYTES // 4 + 1024  # just past the largest boundary run


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux /proc")
def test_allocate_run_free_keeps_memory_flat() -> None:
    x = np.arange(16, dtype=np.float32)
    warm = max(CYCLES // 10, 1000)
    with hg.Executor("cpu") as ex:
        pools = set()
        before = 0
        for i in range(CYCLES + warm):
            n = BOUNDARY_N if i % 2 else LINEAR_N + (i % 7) * 256  # several linear bins
            a, c = ex.allocate(n), ex.allocate(n)
            pools.add(a.pool)
            a.to_numpy()[:16] = x
            hg.ops.scalar_add(ex, a, c, 1.0, n=16)
            if c.to_numpy()[15] != 16.0:
                raise AssertionError(f"cycle {i}: wrong result {c.to_numpy()[:16]}")
            a.free()
            c.free()
            if i == warm:
                before = rss_bytes()
        after = rss_bytes()
        stats = ex.memory_stats()
    print(f"\nsoak: {CYCLES} cycles after {warm} warm-up, pools {sorted(pools)}, "
          f"RSS {before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB "
          f"({(after - before) / 2**20:+.2f} MiB); linear allocs "
          f"{stats['linear']['num_allocs']}, cache hits {stats['linear']['num_cache_hits']}")
    assert pools == {"boundary", "linear"}
    assert stats["allocated_bytes"] == 0
    assert after - before < 10 * 2**20


def test_memory_limit_raises_and_the_executor_keeps_working() -> None:
    limit = 8 * 2**20
    with hg.Executor("cpu", memory_limit=limit) as ex:
        n = 2**20  # 4 MiB of f32: exactly one bin
        a, b = ex.allocate(n), ex.allocate(n)
        with pytest.raises(hg.OutOfMemoryError, match=r"linear pool: cannot allocate 4194304 "
                           r"bytes \(bin 4194304\): 8388608 bytes in use, limit 8388608 bytes"):
            ex.allocate(n)
        with pytest.raises(MemoryError):  # and it is a MemoryError for generic handlers
            ex.allocate(n)
        assert ex.memory_stats()["linear"]["allocated_bytes"] == 2 * n * 4  # untouched
        small = ex.allocate(1000)  # the boundary pool does not count against the limit
        assert small.pool == "boundary"
        a.fill(1.0)
        b.fill(2.0)
        hg.ops.vector_add(ex, a, b, b)
        assert float(b.to_numpy()[-1]) == 3.0
        b.free()
        c = ex.allocate(n)  # freed memory is usable again
        hg.ops.vector_mul(ex, a, a, c)
        assert float(c.to_numpy()[0]) == 1.0
        ex.memory_limit = None
        d = ex.allocate(n)  # no limit now
        for buf in (a, c, d, small):
            buf.free()
        ex.memory_limit = 0
        with pytest.raises(hg.OutOfMemoryError):
            ex.allocate(n)
        assert ex.allocate(16).pool == "boundary"
