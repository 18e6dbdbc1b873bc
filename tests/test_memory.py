"""Tests of the boundary pool, the linear pool and the MemoryManager that combines them."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest

from hologram.errors import BufferStateError, OutOfMemoryError
from hologram.memory import (
    CLASS_BYTES,
    MAX_RUN,
    NUM_CLASSES,
    PAGE_BYTES,
    PAGES,
    Block,
    BoundaryPool,
    DeviceArray,
    LinearPool,
    MemoryManager,
    bin_size,
    device_allocator,
)


def addr(a: np.ndarray) -> int:
    return a.ctypes.data


# --- boundary pool ------------------------------------------------------------------


def test_constants() -> None:
    assert (NUM_CLASSES, CLASS_BYTES, PAGES, PAGE_BYTES, MAX_RUN) == (96, 12288, 48, 256, 48)
    assert PAGES * PAGE_BYTES == CLASS_BYTES


def test_arena_is_aligned_and_sized() -> None:
    pool = BoundaryPool()
    assert pool.arena.dtype == np.uint8
    assert pool.arena.nbytes == 96 * 12288
    assert addr(pool.arena) % 64 == 0
    assert MemoryManager().arena is not None
    assert addr(MemoryManager().arena) % 64 == 0


def test_one_class_for_small_and_runs_for_larger() -> None:
    pool = BoundaryPool()
    assert pool.alloc(1) == 0
    assert pool.alloc(CLASS_BYTES) == 1
    assert pool.alloc(CLASS_BYTES + 1) == 2  # takes classes 2, 3
    assert pool.alloc(10) == 4
    s = pool.stats()
    assert s["classes_used"] == 5 and s["classes_free"] == 91
    assert s["bytes_in_use"] == 1 + CLASS_BYTES + CLASS_BYTES + 1 + 10
    # Free the two-class run: a three-class request cannot use the hole, a two-class one can.
    pool.release(2)
    assert pool.alloc(3 * CLASS_BYTES) == 5
    assert pool.alloc(2 * CLASS_BYTES) == 2
    assert pool.stats()["peak_classes_used"] == 8


def test_largest_run_and_too_large() -> None:
    pool = BoundaryPool()
    assert pool.alloc(MAX_RUN * CLASS_BYTES) == 0
    assert pool.alloc(MAX_RUN * CLASS_BYTES + 1) is None
    assert pool.alloc(MAX_RUN * CLASS_BYTES) == 48
    assert pool.alloc(1) is None  # full
    assert pool.stats()["classes_free"] == 0
    pool.release(0)
    assert pool.alloc(1) == 0
    assert pool.alloc(0) is None


def test_first_fit_finds_run_in_fragmented_pool() -> None:
    pool = BoundaryPool()
    starts = [pool.alloc(1) for _ in range(NUM_CLASSES)]
    assert starts == list(range(NUM_CLASSES))
    for s in (10, 11, 40, 41, 42, 90, 91, 92, 93):
        pool.release(s)
    assert pool.alloc(4 * CLASS_BYTES) == 90
    assert pool.alloc(3 * CLASS_BYTES) == 40
    assert pool.alloc(3 * CLASS_BYTES) is None
    assert pool.alloc(2 * CLASS_BYTES) == 10


def test_release_errors() -> None:
    pool = BoundaryPool()
    s = pool.alloc(3 * CLASS_BYTES)
    assert s == 0
    with pytest.raises(BufferStateError, match="class 1"):
        pool.release(1)  # inside a run, not its start
    pool.release(0)
    with pytest.raises(BufferStateError, match="class 0"):
        pool.release(0)


def test_claim() -> None:
    pool = BoundaryPool()
    pool.claim(10, 2)
    assert not pool.is_free(10) and not pool.is_free(11) and pool.is_free(12)
    with pytest.raises(BufferStateError, match="class 11"):
        pool.claim(11, 1)
    with pytest.raises(BufferStateError, match="class 10"):
        pool.claim(8, 4)
    with pytest.raises(ValueError, match="class_index"):
        pool.claim(96, 1)
    with pytest.raises(ValueError, match="class_index"):
        pool.claim(-1, 1)
    with pytest.raises(ValueError, match="nclasses"):
        pool.claim(95, 2)
    with pytest.raises(ValueError, match="nclasses"):
        pool.claim(0, 0)
    # alloc skips claimed classes
    assert pool.alloc(10 * CLASS_BYTES) == 0
    assert pool.alloc(CLASS_BYTES) == 12
    pool.release(10)
    assert pool.alloc(2 * CLASS_BYTES) == 10


def test_phi_offset_and_view() -> None:
    pool = BoundaryPool()
    assert pool.phi_offset(0, 0, 0) == 0
    assert pool.phi_offset(1, 2, 3) == 12288 + 512 + 3
    assert pool.phi_offset(95, 47, 255) == 96 * 12288 - 1
    with pytest.raises(ValueError, match=r"class.*96"):
        pool.phi_offset(96, 0, 0)
    with pytest.raises(ValueError, match=r"page.*48"):
        pool.phi_offset(0, 48, 0)
    with pytest.raises(ValueError, match=r"byte.*256"):
        pool.phi_offset(0, 0, 256)
    with pytest.raises(ValueError, match="page"):
        pool.phi_offset(0, -1, 0)
    v = pool.view(3, 100)
    assert v.nbytes == 100 and np.shares_memory(v, pool.arena)
    v[:] = 7
    assert pool.arena[pool.phi_offset(3, 0, 99)] == 7
    assert addr(v) % 64 == 0  # class size is a multiple of 64
    with pytest.raises(ValueError, match="nbytes"):
        pool.view(95, CLASS_BYTES + 1)


def test_boundary_alloc_free_cycles_are_fast() -> None:
    pool = BoundaryPool()
    rng = random.Random(1)
    t = time.perf_counter()
    live: list[int] = []
    for _ in range(100_000):
        if len(live) < 8:
            # at most 7 live runs of <= 4 classes: some gap of >= 8 free classes remains
            s = pool.alloc(rng.randint(1, 4 * CLASS_BYTES))
            assert s is not None
            live.append(s)
        else:
            pool.release(live.pop(rng.randrange(len(live))))
    for s in live:
        pool.release(s)
    assert time.perf_counter() - t < 3.0
    assert pool.stats()["classes_used"] == 0 and pool.stats()["bytes_in_use"] == 0


# --- linear pool --------------------------------------------------------------------


def test_bin_size() -> None:
    assert bin_size(0) == 512
    assert bin_size(1) == 512
    assert bin_size(513) == 1024
    assert bin_size(64 * 1024) == 64 * 1024
    assert bin_size(64 * 1024 + 1) == 96 * 1024
    assert bin_size(96 * 1024 + 1) == 128 * 1024
    assert bin_size(1 << 21) == 1 << 21
    assert bin_size((1 << 21) + 1) == 3 << 20
    for n in (1, 1000, 70_000, 123_456, 2_000_000, 10**8):
        b = bin_size(n)
        assert b >= n and (n <= 65536 or b < 1.5 * n)  # at most a third of a bin wasted


def test_linear_alignment_exact_size_and_reuse() -> None:
    pool = LinearPool()
    a = pool.alloc(1000)
    assert a.dtype == np.uint8 and a.nbytes == 1000 and addr(a) % 64 == 0
    p = addr(a)
    pool.free(a)
    s = pool.stats()
    assert s["allocated_bytes"] == 0 and s["cached_bytes"] == 1024
    b = pool.alloc(900)  # same bin: reuses the block
    assert addr(b) == p and b.nbytes == 900
    assert pool.stats()["num_cache_hits"] == 1
    c = pool.alloc(200_000)
    assert addr(c) % 64 == 0 and c.nbytes == 200_000
    assert pool.stats()["peak_allocated_bytes"] == 1024 + bin_size(200_000)
    pool.free(b)
    pool.free(c)


def test_linear_free_errors() -> None:
    pool = LinearPool()
    a = pool.alloc(100)
    pool.free(a)
    with pytest.raises(BufferStateError):
        pool.free(a)
    with pytest.raises(BufferStateError):
        pool.free(np.empty(100, np.uint8))
    b = pool.alloc(100)  # reuses a's block; the stale a must still be rejected
    with pytest.raises(BufferStateError):
        pool.free(a)
    with pytest.raises(BufferStateError):
        pool.free(b[:10])  # a view is not the array the pool handed out
    pool.free(b)


def test_linear_empty_cache() -> None:
    pool = LinearPool()
    arrs = [pool.alloc(n) for n in (10, 100_000, 1 << 20)]
    for a in arrs:
        pool.free(a)
    assert pool.stats()["cached_bytes"] > 0
    pool.empty_cache()
    assert pool.stats()["cached_bytes"] == 0
    assert pool.stats()["allocated_bytes"] == 0


def test_linear_limit() -> None:
    pool = LinearPool(limit=1 << 20)
    a = pool.alloc(600_000)  # bin 768 KiB
    with pytest.raises(OutOfMemoryError) as ei:
        pool.alloc(300_000)  # bin 384 KiB: 1152 KiB > 1 MiB
    msg = str(ei.value)
    assert "300000" in msg and str(768 * 1024) in msg and str(1 << 20) in msg
    assert isinstance(ei.value, MemoryError)
    # the pool still works: small requests succeed, and after freeing so does the big one
    b = pool.alloc(1000)
    pool.free(b)
    pool.free(a)
    c = pool.alloc(300_000)  # the cache is emptied to make room
    assert pool.stats()["allocated_bytes"] == bin_size(300_000)
    pool.free(c)
    pool.limit = None
    big = pool.alloc(4 << 20)
    pool.free(big)
    with pytest.raises(ValueError, match="limit"):
        pool.limit = -1
    with pytest.raises(TypeError, match="limit"):
        pool.limit = 1.5  # type: ignore[assignment]


def test_linear_nbytes_validation() -> None:
    pool = LinearPool()
    with pytest.raises(ValueError, match="nbytes"):
        pool.alloc(-1)
    with pytest.raises(TypeError, match="nbytes"):
        pool.alloc(1.0)  # type: ignore[arg-type]


# --- memory manager -----------------------------------------------------------------


def test_manager_routes_by_size() -> None:
    mm = MemoryManager()
    small = mm.allocate(100)
    assert isinstance(small, Block)
    assert small.pool == "boundary" and small.start_class == 0 and small.array.nbytes == 100
    run = mm.allocate(3 * CLASS_BYTES)
    assert run.pool == "boundary" and run.start_class == 1
    assert np.shares_memory(run.array, mm.arena)
    assert addr(run.array) == addr(mm.arena) + mm.phi_offset(1, 0, 0)
    biggest = mm.allocate(MAX_RUN * CLASS_BYTES)
    assert biggest.pool == "boundary" and biggest.start_class == 4
    too_big = mm.allocate(49 * CLASS_BYTES)
    assert too_big.pool == "linear" and too_big.start_class is None
    assert too_big.array.nbytes == 49 * CLASS_BYTES and addr(too_big.array) % 64 == 0
    assert not np.shares_memory(too_big.array, mm.arena)
    # 44 classes left: a 45-class request does not fit and goes linear
    overflow = mm.allocate(45 * CLASS_BYTES)
    assert overflow.pool == "linear"
    empty = mm.allocate(0)
    assert empty.pool == "none" and empty.array.nbytes == 0 and empty.start_class is None
    s = mm.stats()
    assert s["boundary"]["classes_used"] == 52
    assert s["allocated_bytes"] == (100 + 3 * CLASS_BYTES + MAX_RUN * CLASS_BYTES
                                    + s["linear"]["allocated_bytes"])
    for b in (small, run, biggest, too_big, overflow, empty):
        mm.free(b)
    s = mm.stats()
    assert s["allocated_bytes"] == 0 and s["boundary"]["classes_used"] == 0
    assert s["peak_bytes"] >= 100 + 3 * CLASS_BYTES + MAX_RUN * CLASS_BYTES


def test_manager_classes_come_back() -> None:
    mm = MemoryManager()
    for _ in range(3):  # more than 96 buffers in total, the original's failure
        blocks = [mm.allocate(CLASS_BYTES) for _ in range(NUM_CLASSES)]
        assert all(b.pool == "boundary" for b in blocks)
        assert sorted(b.start_class for b in blocks) == list(range(NUM_CLASSES))  # type: ignore
        extra = mm.allocate(1)
        assert extra.pool == "linear"
        for b in blocks + [extra]:
            mm.free(b)
    assert mm.stats()["boundary"]["classes_free"] == NUM_CLASSES


def test_manager_allocate_boundary() -> None:
    mm = MemoryManager()
    b = mm.allocate_boundary(5, 48 * 256)
    assert b.pool == "boundary" and b.start_class == 5 and b.nbytes == CLASS_BYTES
    assert addr(b.array) == addr(mm.arena) + mm.phi_offset(5, 0, 0)
    with pytest.raises(BufferStateError, match="class 5"):
        mm.allocate_boundary(5, 1)
    two = mm.allocate_boundary(6, CLASS_BYTES + 1)  # classes 6, 7
    with pytest.raises(BufferStateError, match="class 7"):
        mm.allocate_boundary(7, 10)
    a = mm.allocate(1)  # first fit skips the claimed classes 5..7
    assert a.start_class == 0
    with pytest.raises(ValueError, match="class_index"):
        mm.allocate_boundary(96, 10)
    with pytest.raises(ValueError, match="nbytes"):
        mm.allocate_boundary(0, 0)
    with pytest.raises(ValueError, match="nclasses"):
        mm.allocate_boundary(90, 10 * CLASS_BYTES)
    for blk in (b, two, a):
        mm.free(blk)
    assert mm.stats()["boundary"]["classes_used"] == 0
    again = mm.allocate_boundary(5, 10)
    mm.free(again)


def test_manager_double_free_and_validation() -> None:
    mm = MemoryManager()
    for n in (0, 10, 10**6):
        b = mm.allocate(n)
        mm.free(b)
        with pytest.raises(BufferStateError):
            mm.free(b)
    foreign = MemoryManager().allocate(10)
    with pytest.raises(BufferStateError):
        mm.free(foreign)
    with pytest.raises(ValueError, match="nbytes"):
        mm.allocate(-1)
    with pytest.raises(TypeError, match="nbytes"):
        mm.allocate(1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="nbytes"):
        mm.allocate("8")  # type: ignore[arg-type]
    assert mm.allocate(np.int64(16)).nbytes == 16


def test_manager_limit_and_empty_cache() -> None:
    mm = MemoryManager(limit=4 << 20)
    assert mm.limit == 4 << 20
    # boundary buffers do not count against the limit
    small = [mm.allocate(CLASS_BYTES) for _ in range(NUM_CLASSES)]
    big = mm.allocate(3 << 20)
    with pytest.raises(OutOfMemoryError, match="limit"):
        mm.allocate(2 << 20)
    ok = mm.allocate(100_000)  # still works after the error
    mm.free(ok)
    mm.free(big)
    assert mm.stats()["cached_bytes"] > 0
    after = mm.allocate(2 << 20)  # fits once the cache is emptied
    mm.free(after)
    mm.empty_cache()
    assert mm.stats()["cached_bytes"] == 0
    mm.limit = None
    assert mm.limit is None and mm.linear.limit is None
    huge = mm.allocate(8 << 20)
    mm.free(huge)
    for b in small:
        mm.free(b)
    assert mm.stats()["allocated_bytes"] == 0


def test_manager_many_mixed_cycles_do_not_leak() -> None:
    """100,000 allocate/free cycles of mixed sizes, a few buffers live at once."""
    mm = MemoryManager()
    rng = random.Random(12345)

    def size() -> int:
        r = rng.random()
        if r < 0.05:
            return 0
        if r < 0.6:
            return rng.randint(1, 3 * CLASS_BYTES)
        if r < 0.85:
            return rng.randint(1, MAX_RUN * CLASS_BYTES + 1000)
        return rng.randint(1, 2_000_000)

    live: list[Block] = []
    max_cached = 0
    t = time.perf_counter()
    for i in range(100_000):
        n = size()
        classes_free = mm.boundary.stats()["classes_free"]
        b = mm.allocate(n)
        assert b.array.nbytes == n
        if 0 < n <= CLASS_BYTES and classes_free:
            assert b.pool == "boundary"  # any free class serves a one-class buffer
        if n:
            b.array[0] = 1
            b.array[-1] = 2
        live.append(b)
        if len(live) > 6:
            mm.free(live.pop(rng.randrange(len(live))))
        if i % 1000 == 0:
            max_cached = max(max_cached, mm.stats()["cached_bytes"])
    for b in live:
        mm.free(b)
    elapsed = time.perf_counter() - t
    s = mm.stats()
    assert s["boundary"]["classes_used"] == 0 and s["boundary"]["bytes_in_use"] == 0
    assert s["linear"]["allocated_bytes"] == 0 and s["allocated_bytes"] == 0
    assert max(max_cached, s["cached_bytes"]) <= 64 << 20
    assert s["linear"]["num_cache_hits"] > 0.5 * s["linear"]["num_allocs"]
    assert mm.num_live_blocks == 0
    assert elapsed < 8.0


# --- the pools on device memory (a host-backed stand-in device: no adapter needed) ---


class FakeDevice:
    """A DeviceMemory whose "device buffers" are host uint8 arrays: enough to test the
    pools and DeviceArray windows everywhere (the real device is tested in
    tests/test_webgpu_memory.py)."""

    name = "fake"
    dlpack_device = (15, 0)

    def __init__(self, max_buffer: int | None = None) -> None:
        self.created: list[int] = []
        self.max_buffer = max_buffer

    def create(self, nbytes: int) -> np.ndarray:
        if self.max_buffer is not None and nbytes > self.max_buffer:
            raise MemoryError(f"{nbytes} bytes is more than the fake device holds")
        self.created.append(nbytes)
        return np.zeros(nbytes, np.uint8)

    def read(self, handle: np.ndarray, offset: int, nbytes: int) -> np.ndarray:
        return handle[offset:offset + nbytes].copy()

    def write(self, handle: np.ndarray, offset: int, data: np.ndarray) -> None:
        handle[offset:offset + data.nbytes] = data

    def copy(self, src: np.ndarray, so: int, dst: np.ndarray, do: int, n: int) -> None:
        dst[do:do + n] = src[so:so + n].copy()

    def clear(self, handle: np.ndarray, offset: int, nbytes: int) -> None:
        handle[offset:offset + nbytes] = 0


def test_device_array_is_an_ndarray_like_window() -> None:
    dev = FakeDevice()
    raw = DeviceArray.empty(dev, 64)
    assert (raw.shape, raw.dtype, raw.nbytes, raw.size, raw.offset) == ((64,), np.uint8, 64, 64, 0)
    f = raw.view(np.float32)
    assert f.shape == (16,) and f.flags.c_contiguous and f.flags.aligned and f.flags.writeable
    m = f.reshape(4, -1)
    assert m.shape == (4, 4) and m.strides == (16, 4) and m.handle is raw.handle
    m.write(np.arange(16, dtype=np.float32).reshape(4, 4))
    np.testing.assert_array_equal(f.to_host(), np.arange(16))
    tail = f[4:8]
    assert tail.offset == 16 and tail.shape == (4,)
    np.testing.assert_array_equal(np.asarray(tail), [4, 5, 6, 7])
    assert float(f[5:6]) == 5.0
    tail.fill(0.0)
    f[8:12].fill(2.5)
    np.testing.assert_array_equal(f.to_host()[4:12], [0] * 4 + [2.5] * 4)
    f[:4].copy_from(f[8:12])
    np.testing.assert_array_equal(f.to_host()[:4], [2.5] * 4)
    assert f.extent() == (id(raw.handle), 0, 64) and f[2:3].extent()[1:] == (8, 12)
    host = f.to_host()
    host[0] = 99  # a copy: the device is unchanged
    assert f.to_host()[0] == 2.5
    empty = DeviceArray.empty(dev, 0)
    assert empty.handle is None and empty.to_host().size == 0
    assert f[1:2].view(np.uint8).shape == (4,)
    assert not raw[1:3].view(np.uint16).flags.aligned  # offset 1 of a 2-byte dtype


def test_device_array_refuses_what_a_window_cannot_be() -> None:
    f = DeviceArray.empty(FakeDevice(), 64).view(np.float32)
    with pytest.raises(TypeError, match="index"):
        f[3]  # noqa: B018 - indexing is the test
    with pytest.raises(TypeError, match="contiguous"):
        f[::2]  # noqa: B018
    with pytest.raises(ValueError, match="reshape"):
        f.reshape(3, 5)
    with pytest.raises(ValueError, match="whole number"):
        f[:3].view(np.float64)
    with pytest.raises(ValueError, match="copy"):
        f.__array__(copy=False)
    with pytest.raises(TypeError, match="one-element"):
        float(f)
    with pytest.raises(ValueError, match="bytes"):
        f.write(np.zeros(3, np.float32))


def test_manager_on_device_memory_has_the_host_pools_and_stats() -> None:
    """The same pools over a device allocator: blocks are DeviceArray windows, the arena
    is one device buffer, and the limit, cache and statistics work as on the host."""
    dev = FakeDevice()
    mm = MemoryManager(limit=4 << 20, allocator=device_allocator(dev))
    assert isinstance(mm.arena, DeviceArray) and mm.arena.nbytes == NUM_CLASSES * CLASS_BYTES
    assert dev.created == [NUM_CLASSES * CLASS_BYTES]  # the arena: one buffer
    small = mm.allocate(100)
    assert small.pool == "boundary" and isinstance(small.array, DeviceArray)
    assert small.array.handle is mm.arena.handle and small.array.offset % 256 == 0
    b2 = mm.allocate_boundary(9, 64)
    assert b2.array.offset == mm.phi_offset(9, 0, 0) and b2.array.handle is mm.arena.handle
    big = mm.allocate(1 << 20)
    assert big.pool == "linear" and big.array.offset == 0 and len(dev.created) == 2
    host = MemoryManager(limit=4 << 20)
    assert mm.stats().keys() == host.stats().keys()
    assert mm.stats()["linear"]["allocated_bytes"] == 1 << 20
    mm.free(big)
    assert mm.stats()["cached_bytes"] == 1 << 20
    again = mm.allocate(1 << 20)  # served from the cache: no new device buffer
    assert len(dev.created) == 2 and mm.stats()["linear"]["num_cache_hits"] == 1
    with pytest.raises(OutOfMemoryError, match="limit"):
        mm.allocate(4 << 20)
    mm.free(again)
    mm.empty_cache()
    assert mm.stats()["cached_bytes"] == 0
    zero = mm.allocate(0)
    assert zero.pool == "none" and zero.array.nbytes == 0
    for b in (small, b2, zero):
        mm.free(b)
    assert mm.stats()["allocated_bytes"] == 0


def test_device_allocation_failure_is_out_of_memory() -> None:
    mm = MemoryManager(allocator=device_allocator(FakeDevice(max_buffer=2 << 20)))
    with pytest.raises(OutOfMemoryError, match="could not provide.*fake device"):
        mm.allocate(3 << 20)
    assert mm.allocate(1 << 20).nbytes == 1 << 20


def test_data_pointer_matches_array_interface():
    """The fast address read (launch pointer tables) agrees with NumPy's own on views,
    slices, 0-d, empty, Fortran-ordered and strided arrays."""
    from hologram.memory.address import data_pointer

    base = np.arange(120, dtype=np.float64).reshape(4, 5, 6)
    arrays = [base, base[1:], base[:, 2:, 3:], base.T, np.asfortranarray(base), base[..., ::2],
              np.float64(3.0), np.ones(()), np.empty(0), np.empty((0, 3)), base.reshape(-1)[7:],
              np.arange(10, dtype=np.int8)[3:], np.ones(3, dtype=bool)]
    for a in arrays:
        assert data_pointer(a) == a.__array_interface__["data"][0]
