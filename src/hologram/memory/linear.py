"""The linear pool: a caching allocator with size bins for buffers too big for the arena.

Why cache: a training or inference loop allocates the same sizes over and
over; asking the system for fresh memory each time costs page faults and
zeroing, so freed blocks are kept on a per-bin free list and handed out
again (the scheme of CuPy's and PyTorch's memory pools).

Why bins: reuse only works if a request matches a cached block. Sizes are
rounded up to a bin: multiples of 512 bytes below 64 KiB (at most 511 bytes
wasted), then the next of ``2**k`` and ``1.5 * 2**k`` (at most a third
wasted), so the number of distinct bins, and hence the memory a cache can
strand, stays small.

Why a limit: a user can cap what the pool holds. When a request would pass
the limit the cache is emptied first (cached blocks are not in use), and
only if that is not enough does allocation fail, with OutOfMemoryError
saying what was asked, what is in use and the limit. The pool's state is
untouched by a failed request, so it keeps working.

Blocks are 64-byte aligned (cache line, widest vector loads). The bytes come
from an allocator: host memory by default, or a device's (then each block is
one device buffer and the pool, its bins, limit and statistics are the same).
Not thread-safe on its own; the Executor serialises calls under its lock.
"""

from __future__ import annotations

import operator
from typing import Any

from ..errors import ArgumentTypeError, ArgumentValueError, BufferStateError, OutOfMemoryError
from .boundary import ALIGNMENT, Allocator, aligned_empty

SMALL_GRANULARITY: int = 512
SMALL_LIMIT: int = 64 * 1024


def bin_size(nbytes: int) -> int:
    """The size of the bin a request of ``nbytes`` is served from (>= nbytes)."""
    if nbytes <= SMALL_LIMIT:
        return max(SMALL_GRANULARITY, -(-nbytes // SMALL_GRANULARITY) * SMALL_GRANULARITY)
    p = 1 << (nbytes - 1).bit_length()  # smallest power of two >= nbytes
    three_quarters = (p >> 2) * 3  # 1.5 * 2**(k-1)
    return three_quarters if nbytes <= three_quarters else p


def _check_limit(limit: Any) -> int | None:
    if limit is None:
        return None
    if isinstance(limit, bool):
        raise ArgumentTypeError("limit: expected an int or None, got bool")
    try:
        limit = operator.index(limit)
    except TypeError:
        raise ArgumentTypeError(
            f"limit: expected an int or None, got {type(limit).__name__}"
        ) from None
    if limit < 0:
        raise ArgumentValueError(f"limit: must be >= 0 or None, got {limit}")
    return limit


def check_nbytes(nbytes: Any, name: str = "nbytes") -> int:
    """``nbytes`` as an int >= 0 (NumPy integers welcome), or an error naming ``name``."""
    if isinstance(nbytes, bool):
        raise ArgumentTypeError(f"{name}: expected an int, got bool")
    try:
        nbytes = operator.index(nbytes)
    except TypeError:
        raise ArgumentTypeError(f"{name}: expected an int, got {type(nbytes).__name__}") from None
    if nbytes < 0:
        raise ArgumentValueError(f"{name}: must be >= 0, got {nbytes}")
    return nbytes


class LinearPool:
    """A caching allocator: ``alloc`` returns uint8 arrays, ``free`` caches their blocks.

    ``allocator`` (``(nbytes, alignment) -> uint8 array``) provides new blocks;
    a MemoryError from it means the memory itself is exhausted.
    """

    __slots__ = ("_limit", "_cache", "_live", "_allocated", "_cached", "_peak",
                 "_num_allocs", "_num_hits", "_allocator")

    def __init__(self, limit: int | None = None, allocator: Allocator = aligned_empty) -> None:
        self._limit: int | None = _check_limit(limit)
        self._allocator = allocator
        self._cache: dict[int, list[Any]] = {}  # bin size -> free blocks
        # id(handed-out array) -> (that array, its block). Keeping the array in the
        # entry stops its id being reused while it is live, and keying by the
        # handed-out object (not the address) catches a stale array freed after its
        # block went to someone else.
        self._live: dict[int, tuple[Any, Any]] = {}
        self._allocated: int = 0  # bin bytes of live blocks
        self._cached: int = 0  # bin bytes of cached blocks
        self._peak: int = 0
        self._num_allocs: int = 0
        self._num_hits: int = 0

    # --- limit --------------------------------------------------------------------
    @property
    def limit(self) -> int | None:
        """Most bytes (live + cached) the pool may hold; None for no limit."""
        return self._limit

    @limit.setter
    def limit(self, value: int | None) -> None:
        self._limit = _check_limit(value)
        if self._limit is not None and self._allocated + self._cached > self._limit:
            self.empty_cache()

    @property
    def allocated_bytes(self) -> int:
        """Bin bytes of live blocks (cheaper than ``stats()`` on hot paths)."""
        return self._allocated

    # --- allocation ---------------------------------------------------------------
    def alloc(self, nbytes: int) -> Any:
        """A uint8 array of exactly ``nbytes`` (a view of a bin-sized, aligned block)."""
        nbytes = check_nbytes(nbytes)
        size = bin_size(nbytes)
        free_list = self._cache.get(size)
        if free_list:
            block = free_list.pop()
            self._cached -= size
            self._num_hits += 1
        else:
            limit = self._limit
            if limit is not None and self._allocated + self._cached + size > limit:
                self.empty_cache()
                if self._allocated + size > limit:
                    raise OutOfMemoryError(
                        f"linear pool: cannot allocate {nbytes} bytes (bin {size}): "
                        f"{self._allocated} bytes in use, limit {limit} bytes"
                    )
            try:
                block = self._allocator(size, ALIGNMENT)
            except MemoryError as e:  # the system (or device) itself is out of memory
                self.empty_cache()
                try:
                    block = self._allocator(size, ALIGNMENT)
                except MemoryError as e2:
                    why = f": {e2}" if str(e2) else ""
                    raise OutOfMemoryError(
                        f"linear pool: the system could not provide {nbytes} bytes "
                        f"({self._allocated} bytes in use){why}"
                    ) from e
        self._allocated += size
        if self._allocated > self._peak:
            self._peak = self._allocated
        self._num_allocs += 1
        arr = block[:nbytes]
        self._live[id(arr)] = (arr, block)
        return arr

    def free(self, arr: Any) -> None:
        """Return the block of ``arr`` (an array ``alloc`` returned) to the cache."""
        entry = self._live.get(id(arr))
        if entry is None or entry[0] is not arr:
            raise BufferStateError(
                "linear pool: array was not allocated by this pool or was already freed"
            )
        del self._live[id(arr)]
        block = entry[1]
        size = block.nbytes
        self._allocated -= size
        self._cache.setdefault(size, []).append(block)
        self._cached += size

    def empty_cache(self) -> None:
        """Drop every cached block so its memory goes back to the system."""
        self._cache.clear()
        self._cached = 0

    def owns(self, arr: Any) -> bool:
        """Whether ``arr`` is a live array handed out by this pool."""
        entry = self._live.get(id(arr))
        return entry is not None and entry[0] is arr

    # --- statistics ---------------------------------------------------------------
    def stats(self) -> dict[str, int | None]:
        """Bytes (bin-rounded) live, cached and at peak; counts of allocations and cache hits."""
        return {
            "allocated_bytes": self._allocated,
            "cached_bytes": self._cached,
            "peak_allocated_bytes": self._peak,
            "num_allocs": self._num_allocs,
            "num_cache_hits": self._num_hits,
            "num_live_blocks": len(self._live),
            "limit": self._limit,
        }

    def __repr__(self) -> str:
        return (f"LinearPool(allocated={self._allocated}, cached={self._cached}, "
                f"limit={self._limit})")
