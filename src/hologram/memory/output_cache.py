"""A caching allocator for large NumPy outputs (what ``@hologram.jit`` returns).

Why: a call that returns a fresh 40 MB array gets fresh pages from the system
(glibc mmaps allocations that large and unmaps them on free), and the kernel
that writes them then pays a page fault per 4 KiB page: for GELU over 10M f32
that more than doubled the call (4.97 ms against 2.12 ms into a preallocated
output). Keeping freed blocks and handing them out again makes a repeated call
write into memory that is already mapped.

How a block comes back: every array handed out derives from one
:class:`_BlockOwner`, a small non-array object exposing the block through
``__array_interface__``. NumPy ends a view's ``.base`` chain at the first base
that is not an ndarray, so every view, slice, reshape, ``memoryview``, DLPack
capsule or ``torch.from_numpy`` tensor of an output holds the owner (directly
or through the arrays it holds). A ``weakref.finalize`` on the owner returns
the block to the cache when the last of them dies, so a block is never handed
out while anything still views it. (An ndarray cannot be that anchor: NumPy
collapses ``.base`` chains of plain ndarrays to the array owning the memory,
so a view would skip an intermediate ndarray and outlive it.) Raw pointers
taken out of an array (``arr.ctypes.data`` as an int) are, as for any NumPy
array, only valid while the array lives.

Thread safety: finalizers run in whichever thread drops the last reference
(or the garbage collector's). A finalizer only appends the block to a deque
(atomic) and then drains the deque if it can take the lock without waiting;
allocation drains it under the lock. So a finalizer never blocks, and one
that fires while its own thread holds the lock (a reference dropped inside
the critical section) cannot deadlock.

Small outputs (below ``min_bytes``, 1 MiB by default) keep ``np.empty``:
malloc serves them from its heap without page faults, and cheaper than the
bookkeeping here. Cached bytes are capped (``limit``, 256 MiB by default);
``clear()`` (``hologram.empty_cache()``) gives every cached block back.
Sizes are rounded to the linear pool's bins, so a slightly different size
still reuses a block; blocks are 64-byte aligned.
"""

from __future__ import annotations

import collections
import math
import operator
import os
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from .boundary import ALIGNMENT, aligned_empty
from .linear import bin_size, check_nbytes

MIN_BYTES: int = 1 << 20
DEFAULT_LIMIT: int = 256 << 20


class _BlockOwner:
    """The anchor of every array made from one handout of a block: it dies when they all do."""

    __slots__ = ("__array_interface__", "_block", "__weakref__")

    def __init__(self, block: np.ndarray, nbytes: int) -> None:
        self._block = block  # keeps the memory alive even if the finalizer registry is gone
        self.__array_interface__ = {
            "data": (block.ctypes.data, False),
            "shape": (nbytes,),
            "typestr": "|u1",
            "version": 3,
        }


class OutputCache:
    """Hands out NumPy arrays for outputs; large ones come from cached, aligned blocks.

    ``limit``: most bytes (bin-rounded) kept in the cache while no array uses
    them; 0 turns caching off. ``min_bytes``: outputs smaller than this use
    ``np.empty``.
    """

    def __init__(self, limit: int = DEFAULT_LIMIT, min_bytes: int = MIN_BYTES) -> None:
        self._limit = check_nbytes(limit, "limit")
        self._min_bytes = max(1, check_nbytes(min_bytes, "min_bytes"))
        self._lock = threading.Lock()
        self._bins: dict[int, list[np.ndarray]] = {}  # bin size -> free blocks (LIFO)
        self._cached = 0  # bytes in _bins
        self._returned: collections.deque[np.ndarray] = collections.deque()  # not yet binned
        self._live = 0  # blocks handed out and not yet binned or dropped
        self._hits = 0
        self._misses = 0
        _INSTANCES.add(self)

    # --- configuration ----------------------------------------------------------------
    @property
    def limit(self) -> int:
        """Most bytes the cache keeps for reuse; lowering it drops blocks at once."""
        return self._limit

    @limit.setter
    def limit(self, value: int) -> None:
        value = check_nbytes(value, "limit")
        with self._lock:
            self._limit = value
            self._drain_locked()
            self._shrink_locked(value)

    @property
    def min_bytes(self) -> int:
        """Outputs of fewer bytes use ``np.empty`` instead of the cache."""
        return self._min_bytes

    @min_bytes.setter
    def min_bytes(self, value: int) -> None:
        self._min_bytes = max(1, check_nbytes(value, "min_bytes"))

    def clear(self) -> None:
        """Give every cached block back to the system (blocks in use are not affected)."""
        with self._lock:
            self._drain_locked()
            self._shrink_locked(0)

    # --- allocation -------------------------------------------------------------------
    def empty(self, shape: int | Sequence[int], dtype: Any) -> np.ndarray:
        """An uninitialised C-contiguous array of ``shape`` and ``dtype``, like ``np.empty``."""
        dt = np.dtype(dtype)
        shape = tuple(shape) if hasattr(shape, "__len__") else (operator.index(shape),)
        nbytes = math.prod(shape) * dt.itemsize
        if nbytes < self._min_bytes or self._limit == 0 or dt.hasobject:
            return np.empty(shape, dt)  # (object arrays must start as None, not garbage)
        size = bin_size(nbytes)
        block = None
        with self._lock:
            self._drain_locked()
            free = self._bins.get(size)
            if free:
                block = free.pop()
                self._cached -= size
                self._hits += 1
            else:
                self._misses += 1
            self._live += 1
        try:
            if block is None:
                try:
                    block = aligned_empty(size, ALIGNMENT)
                except MemoryError:  # cached blocks are not in use: give them back, retry
                    self.clear()
                    block = aligned_empty(size, ALIGNMENT)
            owner = _BlockOwner(block, nbytes)
            fin = weakref.finalize(owner, self._give_back, block)
        except BaseException:
            with self._lock:
                self._live -= 1
            raise
        fin.atexit = False  # nothing to give back at interpreter exit
        return np.asarray(owner).view(dt).reshape(shape)

    def _give_back(self, block: np.ndarray) -> None:
        """Finalizer of a handout: queue the block, bin it now if the lock is free."""
        self._returned.append(block)
        if self._lock.acquire(blocking=False):
            try:
                self._drain_locked()
            finally:
                self._lock.release()

    def _drain_locked(self) -> None:
        """Move returned blocks into their bins, within the limit (lock held)."""
        returned = self._returned
        while True:
            try:
                block = returned.popleft()
            except IndexError:
                return
            self._live -= 1
            size = block.nbytes
            if self._cached + size > self._limit:
                # Make room from other sizes (older work); never evict a block of this
                # size for another of the same size, and drop this one if room cannot
                # be made: its memory goes back to the system.
                if size > self._limit:
                    continue
                self._shrink_locked(self._limit - size, spare=size)
                if self._cached + size > self._limit:
                    continue
            self._bins.setdefault(size, []).append(block)
            self._cached += size

    def _shrink_locked(self, target: int, spare: int | None = None) -> None:
        """Drop cached blocks, largest bins first and the oldest block of a bin first,
        until at most ``target`` bytes stay; bin ``spare`` is left alone (lock held)."""
        for size in sorted(self._bins, reverse=True):
            if size == spare:
                continue
            free = self._bins[size]
            while free and self._cached > target:
                free.pop(0)  # oldest first
                self._cached -= size
            if not free:
                del self._bins[size]
            if self._cached <= target:
                return

    # --- statistics -------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        """Cached bytes and blocks, blocks in use, hits and misses, and the limit."""
        with self._lock:
            self._drain_locked()
            return {
                "cached_bytes": self._cached,
                "cached_blocks": sum(len(v) for v in self._bins.values()),
                "live_blocks": self._live,
                "hits": self._hits,
                "misses": self._misses,
                "limit": self._limit,
                "min_bytes": self._min_bytes,
            }

    def __repr__(self) -> str:
        return (f"OutputCache(cached_bytes={self._cached}, live_blocks={self._live}, "
                f"limit={self._limit}, min_bytes={self._min_bytes})")


_INSTANCES: weakref.WeakSet[OutputCache] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A fork copies a lock another thread may hold; the child's only thread would then
    wait on it forever. Give every cache a fresh lock in the child."""
    for cache in list(_INSTANCES):
        cache._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

# The process-wide cache that jit outputs come from.
output_cache = OutputCache()


def empty_cache() -> None:
    """Give the memory of cached (unused) output blocks back to the system."""
    output_cache.clear()


__all__ = ["DEFAULT_LIMIT", "MIN_BYTES", "OutputCache", "empty_cache", "output_cache"]
