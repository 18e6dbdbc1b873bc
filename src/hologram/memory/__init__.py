"""Memory for an Executor: the boundary pool for small buffers, the linear pool for the rest.

Why two pools: small buffers (up to 48 classes, 576 KiB) go to the fixed
boundary arena, which stays in L2 and which programs can address by
``Φ(class, page, byte)``; anything larger, or anything that does not find a
free run, goes to the linear pool, a caching allocator with a limit. The
:class:`MemoryManager` hides the choice: callers get a :class:`Block` and
give it back with :meth:`MemoryManager.free`.

Only the linear pool counts against the limit: the arena is allocated once
at a fixed size, so limiting it would only make allocation fail while
memory that is already paid for sits unused.

Host or device: the pools only ask an allocator for bytes. By default that is
host memory (64-byte-aligned NumPy arrays); an executor whose backend has its
own memory (WebGPU) passes ``device_allocator(memory)``, and the same pools,
limit and statistics then manage device buffers, as ``DeviceArray`` windows
(:mod:`hologram.memory.device`).
"""

from __future__ import annotations

import operator
from typing import Any

from ..errors import BufferStateError
from .boundary import (
    ALIGNMENT,
    CLASS_BYTES,
    MAX_RUN,
    NUM_CLASSES,
    PAGE_BYTES,
    PAGES,
    Allocator,
    BoundaryPool,
    aligned_empty,
)
from .device import DeviceArray, DeviceMemory, device_allocator
from .linear import LinearPool, bin_size, check_nbytes


class Block:
    """One allocation: a uint8 array (host ndarray or DeviceArray) of exactly ``nbytes``
    and where it came from.

    ``pool`` is 'boundary', 'linear' or 'none' (zero bytes); ``start_class`` is
    the first boundary class for boundary blocks, else None. A Block is a
    receipt: give it back to the manager that issued it, exactly once.
    """

    __slots__ = ("array", "nbytes", "pool", "start_class")

    def __init__(self, array: Any, nbytes: int, pool: str,
                 start_class: int | None = None) -> None:
        self.array = array
        self.nbytes = nbytes
        self.pool = pool
        self.start_class = start_class

    def __repr__(self) -> str:
        where = f", start_class={self.start_class}" if self.start_class is not None else ""
        return f"Block(nbytes={self.nbytes}, pool={self.pool!r}{where})"




class MemoryManager:
    """Both pools behind one ``allocate``/``free`` interface, with combined statistics.

    ``limit``: bytes the linear pool may hold (live + cached) before allocation
    raises OutOfMemoryError; None for no limit. ``allocator``: where both pools'
    bytes come from (host memory by default; see :func:`device_allocator`).
    """

    __slots__ = ("_boundary", "_linear", "_live", "_peak", "_allocator")

    def __init__(self, limit: int | None = None, allocator: Allocator = aligned_empty) -> None:
        self._allocator = allocator
        self._boundary = BoundaryPool(allocator)
        self._linear = LinearPool(limit=limit, allocator=allocator)
        # id(block) -> block for every live block; holding the block keeps its id
        # unique, and a block that is missing here has been freed (or is foreign).
        self._live: dict[int, Block] = {}
        self._peak: int = 0

    # --- allocation ---------------------------------------------------------------
    def allocate(self, nbytes: int) -> Block:
        """A block of ``nbytes``: in the boundary pool when it fits a free run, else linear."""
        nbytes = check_nbytes(nbytes)
        if nbytes == 0:
            # A fresh (writable) empty array per block: a shared read-only one would
            # make writes of zero elements and DLPack export fail.
            block = Block(self._allocator(0, ALIGNMENT), 0, "none")
        else:
            start = self._boundary.alloc(nbytes)
            if start is not None:
                block = Block(self._boundary.view(start, nbytes), nbytes, "boundary", start)
            else:
                block = Block(self._linear.alloc(nbytes), nbytes, "linear")
        self._adopt(block)
        return block

    def allocate_scratch(self, nbytes: int) -> Block:
        """A block of ``nbytes`` from the linear pool only: a backend's scratch (a
        program's temps), counted in the statistics and the limit like any buffer but
        never taking boundary classes, which Φ addresses and ``allocate_boundary`` own."""
        nbytes = check_nbytes(nbytes)
        block = (Block(self._allocator(0, ALIGNMENT), 0, "none") if nbytes == 0 else
                 Block(self._linear.alloc(nbytes), nbytes, "linear"))
        self._adopt(block)
        return block

    def allocate_boundary(self, class_index: int, nbytes: int) -> Block:
        """A block at class ``class_index`` (Φ(class_index, 0, 0)) spanning ``nbytes``.

        Raises BufferStateError if any class the block needs is taken, and
        ValueError if the run would not fit the arena.
        """
        nbytes = check_nbytes(nbytes)
        if not 0 < nbytes <= BoundaryPool.MAX_BYTES:
            raise ValueError(f"nbytes: must be in [1, {BoundaryPool.MAX_BYTES}], got {nbytes}")
        nclasses = BoundaryPool.classes_for(nbytes)
        self._boundary.claim(class_index, nclasses, nbytes)
        start = operator.index(class_index)
        block = Block(self._boundary.view(start, nbytes), nbytes, "boundary", start)
        self._adopt(block)
        return block

    def _adopt(self, block: Block) -> None:
        self._live[id(block)] = block
        total = self._boundary.bytes_in_use + self._linear.allocated_bytes
        if total > self._peak:
            self._peak = total

    def free(self, block: Block) -> None:
        """Give ``block`` back to its pool; a second free raises BufferStateError."""
        if self._live.get(id(block)) is not block:
            raise BufferStateError(
                f"free: {block!r} was already freed or was not allocated by this manager"
            )
        del self._live[id(block)]
        if block.pool == "boundary":
            assert block.start_class is not None
            self._boundary.release(block.start_class)
        elif block.pool == "linear":
            self._linear.free(block.array)

    def empty_cache(self) -> None:
        """Return the linear pool's cached (free) blocks to the system."""
        self._linear.empty_cache()

    # --- properties ---------------------------------------------------------------
    @property
    def limit(self) -> int | None:
        """Byte limit of the linear pool (the boundary arena does not count); None: none."""
        return self._linear.limit

    @limit.setter
    def limit(self, value: int | None) -> None:
        self._linear.limit = value

    @property
    def arena(self) -> Any:
        """The boundary arena as a uint8 array (host ndarray or DeviceArray): what Φ
        addresses index."""
        return self._boundary.arena

    @property
    def boundary(self) -> BoundaryPool:
        return self._boundary

    @property
    def linear(self) -> LinearPool:
        return self._linear

    def phi_offset(self, cls: int, page: int, byte: int) -> int:
        """The arena byte offset of ``Φ(cls, page, byte)``."""
        return self._boundary.phi_offset(cls, page, byte)

    @property
    def num_live_blocks(self) -> int:
        return len(self._live)

    # --- statistics ---------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Per-pool statistics under 'boundary' and 'linear', plus totals.

        ``allocated_bytes``: boundary bytes requested by live buffers plus the
        linear pool's (bin-rounded) live bytes; ``peak_bytes``: its maximum so
        far; ``cached_bytes``: free blocks the linear pool keeps for reuse.
        """
        b = self._boundary.stats()
        lin = self._linear.stats()
        return {
            "boundary": b,
            "linear": lin,
            "allocated_bytes": b["bytes_in_use"] + lin["allocated_bytes"],
            "peak_bytes": self._peak,
            "cached_bytes": lin["cached_bytes"],
        }


__all__ = [
    "ALIGNMENT",
    "CLASS_BYTES",
    "MAX_RUN",
    "NUM_CLASSES",
    "PAGES",
    "PAGE_BYTES",
    "Allocator",
    "Block",
    "BoundaryPool",
    "DeviceArray",
    "DeviceMemory",
    "LinearPool",
    "MemoryManager",
    "aligned_empty",
    "bin_size",
    "device_allocator",
]
