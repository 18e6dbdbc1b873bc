"""Threads sharing one executor, and processes compiling one kernel at once.

Sizes follow the hypothesis profile (tests/conftest.py): "ci" (default) runs 2,000 op
calls per thread, HYPOTHESIS_PROFILE=long the full 10,000 (override either with
HOLOGRAM_THREAD_OPS).
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import random
import threading
from pathlib import Path

import numpy as np

import hologram as hg

LONG = os.environ.get("HYPOTHESIS_PROFILE") == "long"
THREADS = 8
OPS_PER_THREAD = int(os.environ.get("HOLOGRAM_THREAD_OPS") or (10_000 if LONG else 2_000))


def _worker(ex: hg.Executor, seed: int, n_ops: int, errors: list, counts: list) -> None:
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    ops = hg.ops
    try:
        size = rng.choice([1, 7, 64, 300])
        a, b, c = (ex.allocate(size) for _ in range(3))
        out = ex.allocate(1)
        x = nrng.uniform(-2, 2, size).astype(np.float32)
        y = nrng.uniform(0.5, 2, size).astype(np.float32)
        a.from_numpy(x)
        b.from_numpy(y)
        done = 0
        for i in range(n_ops):
            k = rng.randrange(9)
            if k == 0:
                ops.vector_add(ex, a, b, c)
                want = x + y
            elif k == 1:
                ops.vector_mul(ex, a, b, c)
                want = x * y
            elif k == 2:
                ops.vector_div(ex, a, b, c)
                want = x / y
            elif k == 3:
                ops.scalar_add(ex, a, c, float(seed))
                want = x + np.float32(seed)
            elif k == 4:
                ops.vector_relu(ex, a, c)
                want = np.maximum(x, 0)
            elif k == 5:
                ops.sigmoid(ex, a, c)
                want = 1 / (1 + np.exp(-x))
            elif k == 6:
                got = ops.reduce_sum(ex, b, out)
                if not np.isclose(got, y.sum(dtype=np.float64), rtol=1e-4):
                    raise AssertionError(f"thread {seed} op {i}: reduce_sum {got}")
                done += 1
                continue
            elif k == 7:
                ops.vector_max(ex, a, b, c)
                want = np.maximum(x, y)
            else:  # churn: new buffers (both pools), fresh program bindings
                for buf in (a, c):
                    buf.free()
                size2 = rng.choice([size, size])  # same size: expectations stay valid
                a = ex.allocate(size2).from_numpy(x)
                c = ex.allocate(size2)
                big = ex.allocate(rng.choice([4000, 70_000]))  # boundary or linear
                big.fill(float(seed))
                if big.to_numpy()[-1] != seed:
                    raise AssertionError(f"thread {seed}: fill of a fresh buffer lost")
                big.free()
                done += 1
                continue
            got = c.to_numpy()
            if not np.allclose(got, want, rtol=1e-5, atol=1e-6):
                raise AssertionError(f"thread {seed} op {i} kind {k}: {got[:4]} != {want[:4]}")
            done += 1
        counts.append(done)
        for buf in (a, b, c, out):
            buf.free()
    except BaseException as e:  # reported by the main thread
        errors.append(e)


def test_threads_share_one_executor() -> None:
    with hg.Executor("cpu") as ex:
        errors: list = []
        counts: list = []
        threads = [threading.Thread(target=_worker, args=(ex, s, OPS_PER_THREAD, errors,
                                                            counts)) for s in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
            assert not t.is_alive(), "a worker thread hung"
        if errors:
            raise errors[0]
        assert sum(counts) == THREADS * OPS_PER_THREAD
        assert ex.memory_stats()["allocated_bytes"] == 0  # every buffer came back


def test_threads_share_the_handle_api() -> None:
    from hologram import ffi

    exh = ffi.new_executor_with_backend("cpu")
    errors: list = []

    def work(seed: int) -> None:
        try:
            for _ in range(OPS_PER_THREAD // 20):
                a = ffi.executor_allocate_buffer(exh, 8)
                c = ffi.executor_allocate_buffer(exh, 8)
                ffi.buffer_copy_from_slice(exh, a, json.dumps([float(seed)] * 8))
                ffi.scalar_mul_f32(exh, a, c, 2.0, 8)
                assert json.loads(ffi.buffer_to_vec(exh, c)) == [2.0 * seed] * 8
                ffi.buffer_cleanup(a)
                ffi.buffer_cleanup(c)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    ffi.executor_cleanup(exh)
    if errors:
        raise errors[0]


# --- processes compiling one new kernel at once ---------------------------------------
def _compile_worker(cache: str, constant: float, barrier, queue) -> None:
    os.environ["HOLOGRAM_CACHE_DIR"] = cache
    import numpy as np

    import hologram as hg

    ex = hg.Executor("cpu")
    f = hg.jit(lambda x: x * constant + 1.0, executor=ex)
    x = np.arange(16, dtype=np.float32)
    barrier.wait()  # everyone is past imports and the compiler probe: compile together
    y = f(x)
    queue.put((os.getpid(), y.tolist()))


def test_processes_compile_one_kernel(tmp_path: Path) -> None:
    cache = tmp_path / "kc"
    constant = float(random.Random().randrange(1, 10**6)) + 0.5  # a kernel nobody has
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_compile_worker, args=(str(cache), constant, barrier, queue))
             for _ in range(4)]
    for p in procs:
        p.start()
    got = [queue.get(timeout=180) for _ in range(4)]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    want = (np.arange(16, dtype=np.float32) * np.float32(constant) + 1).tolist()
    assert all(y == want for _, y in got)
    metas = [json.loads(p.read_text()) for p in cache.glob("*.json")]
    # besides the compiler probe and shared runtimes (the thread team's, built once
    # per cache by whichever process gets there first), one entry for the new kernel
    kernels = [m for m in metas
               if m["parts"].get("purpose") != "probe" and "runtime" not in m["parts"]]
    assert len(kernels) == 1, kernels
    m = kernels[0]
    so = cache / f"{m['key']}{m['suffix']}"
    assert hashlib.sha256(so.read_bytes()).hexdigest() == m["sha256"]
    leftovers = [p.name for p in cache.iterdir() if p.name.startswith(".build-")]
    assert leftovers == []
    assert len(list(cache.glob("*.so"))) == len(metas)  # every artifact has its sidecar


def test_bound_launch_table_survives_eviction_races(monkeypatch) -> None:
    """Threads binding fresh buffers evict each other's bound launches constantly (a tiny
    table, a tiny switch interval): neither eviction nor a stale entry may raise
    (this raised KeyError before _run.fast_call/launch tolerated concurrent removal)."""
    import sys

    from hologram.ops import _run

    monkeypatch.setattr(_run, "BOUND_LIMIT", 4)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    errors: list = []
    try:
        with hg.Executor("cpu") as ex:
            def work() -> None:
                try:
                    for _ in range(OPS_PER_THREAD // 4):
                        a, c = ex.allocate(8).fill(1.0), ex.allocate(8)
                        hg.ops.vector_add(ex, a, a, c)
                        hg.ops.vector_add(ex, a, a, c)  # the fast path, if still bound
                        assert c.to_numpy()[0] == 2.0
                        a.free()
                        c.free()
                except BaseException as e:
                    errors.append(e)

            threads = [threading.Thread(target=work) for _ in range(THREADS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=300)
    finally:
        sys.setswitchinterval(old)
    if errors:
        raise errors[0]
