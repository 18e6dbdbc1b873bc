"""The output cache: large jit outputs reuse blocks, and never while anything views them.

A block may only go back to the cache when the last array (view, slice,
memoryview, DLPack capsule, torch tensor) reading its memory has died; these
tests hold each kind of reference, check the block is not handed out, drop it,
and check that it then is.
"""

from __future__ import annotations

import gc
import queue
import threading

import numpy as np
import pytest

import hologram as hg
from hologram.errors import ArgumentTypeError, ArgumentValueError
from hologram.memory.output_cache import OutputCache, output_cache

MIB = 1 << 20
N = MIB // 4  # float32 elements in 1 MiB: the smallest cached output


def addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


@pytest.fixture
def cache():
    return OutputCache(limit=64 * MIB, min_bytes=MIB)


def test_a_dead_output_block_is_reused(cache):
    a = cache.empty((N,), np.float32)
    first = addr(a)
    assert first % 64 == 0
    assert a.shape == (N,) and a.dtype == np.float32 and a.flags.c_contiguous
    assert a.flags.writeable and a.flags.aligned
    del a
    b = cache.empty((512, 512), np.float32)  # another shape, same bytes: same bin
    assert addr(b) == first
    del b
    c = cache.empty((N // 2,), np.float64)  # another dtype, same bytes
    assert addr(c) == first
    st = cache.stats()
    assert (st["hits"], st["misses"], st["live_blocks"]) == (2, 1, 1)


def test_sizes_in_one_bin_share_blocks_and_others_do_not(cache):
    a = cache.empty((N + 1000,), np.float32)  # rounds up to the 1.5 MiB bin
    first = addr(a)
    del a
    assert addr(cache.empty((N + 2000,), np.float32)) == first
    b = cache.empty((3 * N,), np.float32)  # a 3 MiB bin: a new block
    assert addr(b) != first


def test_small_outputs_are_plain_numpy_arrays(cache):
    a = cache.empty((N - 1,), np.float32)
    assert a.flags.owndata and a.base is None
    assert cache.stats()["misses"] == 0
    z = cache.empty((0,), np.float32)
    assert z.shape == (0,)
    tiny = OutputCache(min_bytes=1)
    s = tiny.empty((), np.float64)  # 0-d output through the cache
    assert s.shape == () and s.dtype == np.float64 and not s.flags.owndata
    assert tiny.empty(5, np.int32).shape == (5,) and tiny.empty([2, 3], "f4").shape == (2, 3)
    o = tiny.empty(3, object)  # object arrays never come from raw memory
    assert o.flags.owndata and o.tolist() == [None] * 3


VIEWS = {
    "slice": lambda a: a[1::2],
    "reshape": lambda a: a.reshape(2, -1),
    "dtype view": lambda a: a.view(np.uint8),
    "chain": lambda a: a.reshape(4, -1)[1:].T.view(np.int32)[::3],
    "memoryview": memoryview,
    "frombuffer": lambda a: np.frombuffer(memoryview(a), np.uint8),
    "asarray of view": lambda a: np.asarray(a[:10]),
    "dlpack capsule": lambda a: a.__dlpack__(),
    "np.from_dlpack": np.from_dlpack,
    "ctypes": lambda a: a.ctypes,
    "base": lambda a: a.base,
}


@pytest.mark.parametrize("kind", list(VIEWS))
def test_no_reuse_while_a_view_or_export_lives(cache, kind):
    a = cache.empty((N,), np.float32)
    first = addr(a)
    keep = VIEWS[kind](a)
    del a
    gc.collect()
    other = cache.empty((N,), np.float32)
    assert addr(other) != first  # the block is still viewed: a new one
    del other
    del keep
    gc.collect()
    assert addr(cache.empty((N,), np.float32)) == first  # the last reader died: reused


def test_once_every_view_dies_the_block_comes_back(cache):
    a = cache.empty((N,), np.float32)
    first = addr(a)
    v1, v2 = a[::2], a.reshape(2, -1)[1]
    del a
    assert addr(cache.empty((N,), np.float32)) != first
    del v1
    assert addr(cache.empty((N,), np.float32)) != first
    del v2
    assert addr(cache.empty((N,), np.float32)) == first


def test_no_reuse_while_a_torch_tensor_shares_the_memory(cache):
    torch = pytest.importorskip("torch")
    for export in (torch.from_numpy, torch.from_dlpack, torch.as_tensor):
        a = cache.empty((N,), np.float32)
        first = addr(a)
        a[:] = 3.0
        t = export(a)
        assert t.data_ptr() == first
        del a
        gc.collect()
        b = cache.empty((N,), np.float32)
        assert addr(b) != first
        b[:] = -1.0
        assert bool((t == 3.0).all())
        t2 = t[5:]  # a torch view of the tensor keeps it too
        del t, b
        gc.collect()
        assert addr(cache.empty((N,), np.float32)) != first
        del t2
        gc.collect()
        c = cache.empty((N,), np.float32)
        assert addr(c) == first
        del c


def test_concurrent_allocation_and_cross_thread_frees_never_share_live_memory():
    """Threads allocate, fill with their own value, hand some arrays to another thread
    to drop (finalizers then run there), and check nothing they hold was handed out
    again or overwritten."""
    cache = OutputCache(limit=16 * MIB, min_bytes=MIB)
    live: dict[int, int] = {}  # address -> owner, for arrays some thread still holds
    lock = threading.Lock()
    handoff: queue.Queue = queue.Queue()
    errors: list[str] = []
    sizes = [N, N + 4096, 2 * N, 3 * N]

    def take(tag: int, k: int) -> np.ndarray:
        a = cache.empty((sizes[k % len(sizes)],), np.float32)
        with lock:
            if addr(a) in live:
                errors.append(f"{tag}: block {addr(a):#x} handed out while live")
            live[addr(a)] = tag
        a[::1024] = tag
        return a

    def give(a: np.ndarray, tag: int) -> None:
        if not (a[::1024] == tag).all():
            errors.append(f"{tag}: an array was overwritten while held")
        with lock:
            del live[addr(a)]

    def worker(tag: int) -> None:
        held = []
        for k in range(200):
            held.append(take(tag, k))
            if len(held) > 3:
                a = held.pop(0)
                give(a, tag)
                if k % 2:
                    handoff.put(a)  # dropped by the reaper thread
                del a
        for a in held:
            give(a, tag)
        held.clear()

    def reaper() -> None:
        while (a := handoff.get()) is not None:
            del a

    r = threading.Thread(target=reaper)
    r.start()
    threads = [threading.Thread(target=worker, args=(t,)) for t in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    handoff.put(None)
    r.join()
    gc.collect()
    assert not errors, errors[:5]
    st = cache.stats()
    assert st["live_blocks"] == 0
    assert st["cached_bytes"] <= st["limit"]
    assert st["hits"] > 0


def test_cached_bytes_stay_within_the_limit(cache):
    cache.limit = 4 * MIB
    arrays = [cache.empty((N,), np.float32) for _ in range(6)]
    del arrays
    st = cache.stats()
    assert st["cached_bytes"] == 4 * MIB and st["cached_blocks"] == 4
    # a returned block of another size makes room by dropping older sizes
    big = cache.empty((3 * N,), np.float32)
    del big
    st = cache.stats()
    assert st["cached_bytes"] <= 4 * MIB
    assert cache._bins.get(3 * MIB), "the newest size is kept"
    # a block bigger than the limit is never cached
    huge = cache.empty((5 * N,), np.float32)
    del huge
    assert cache.stats()["cached_bytes"] <= 4 * MIB
    # lowering the limit drops blocks at once; 0 turns caching off
    cache.limit = MIB
    assert cache.stats()["cached_bytes"] <= MIB
    cache.limit = 0
    assert cache.stats()["cached_bytes"] == 0
    a = cache.empty((N,), np.float32)
    assert a.flags.owndata


def test_clear_and_hologram_empty_cache(cache):
    a = [cache.empty((N,), np.float32) for _ in range(3)]
    del a
    assert cache.stats()["cached_blocks"] == 3
    cache.clear()
    assert cache.stats()["cached_bytes"] == 0
    b = output_cache.empty((N,), np.float32)
    del b
    assert output_cache.stats()["cached_bytes"] > 0
    hg.empty_cache()
    assert output_cache.stats()["cached_bytes"] == 0
    assert hg.output_cache is output_cache


def test_bad_settings_name_the_argument(cache):
    with pytest.raises(ArgumentValueError, match="^limit: must be >= 0"):
        cache.limit = -1
    with pytest.raises(ArgumentTypeError, match="^limit: expected an int, got str"):
        cache.limit = "1"
    with pytest.raises(ArgumentTypeError, match="^limit: expected an int, got bool"):
        OutputCache(limit=True)
    with pytest.raises(ArgumentValueError, match="^min_bytes: must be >= 0"):
        cache.min_bytes = -5
    assert cache.limit == 64 * MIB


@pytest.mark.filterwarnings("ignore:hologram. no C compiler:UserWarning")
def test_jit_outputs_come_from_the_cache_and_are_right():
    @hg.jit
    def f(x, y):
        return x * 2.0 + 1.0, (x - y).exp()

    rng = np.random.default_rng(0)
    x = rng.standard_normal(N).astype(np.float32)
    y = rng.standard_normal(N).astype(np.float32)
    a, b = f(x, y)
    np.testing.assert_allclose(a, x * 2 + 1, rtol=1e-6)
    np.testing.assert_allclose(b, np.exp(x - y), rtol=1e-5)
    assert not a.flags.owndata and addr(a) % 64 == 0
    first = {addr(a), addr(b)}
    keep = b[:10]
    del a, b
    a2, b2 = f(x, y)
    assert addr(a2) in first  # a's block came back; b's is still viewed by keep
    assert addr(b2) not in first
    np.testing.assert_allclose(a2, x * 2 + 1, rtol=1e-6)
    np.testing.assert_allclose(b2, np.exp(x - y), rtol=1e-5)
    np.testing.assert_allclose(keep, np.exp(x - y)[:10], rtol=1e-5)
    # small outputs stay plain np.empty
    s = f(x[:100], y[:100])[0]
    assert s.flags.owndata
