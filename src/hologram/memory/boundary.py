"""The boundary pool: a fixed arena of 96 classes x 12,288 bytes with Φ addressing.

Why a fixed arena: the Atlas ISA addresses small buffers as ``Φ(class, page,
byte)``; that only works if every class sits at a known offset of one block
of memory, so the arena is allocated once and never moves. At 1.125 MiB it
stays in L2, which is where small, hot buffers should live.

Why a bitmap: the original pool handed classes out and never took them back,
so an executor died after 96 buffers. Here a free bitmap (a Python int, bit
``i`` set when class ``i`` is free) records which classes are free, and a
run of ``k`` consecutive free classes is found with a few shift-and-AND
steps, so allocation and release are O(log k) big-int operations on 96
bits: fast enough for hundreds of thousands of cycles per second.

The pool is not thread-safe on its own; its owner (the Executor) serialises
calls under its lock.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import BufferStateError

NUM_CLASSES: int = 96
CLASS_BYTES: int = 12288
PAGES: int = 48
PAGE_BYTES: int = 256
MAX_RUN: int = NUM_CLASSES // 2  # the largest run one request may take, in classes
ALIGNMENT: int = 64  # cache line and AVX-512 vector width: kernels may use aligned loads

assert PAGES * PAGE_BYTES == CLASS_BYTES

_ALL_FREE: int = (1 << NUM_CLASSES) - 1

# ``(nbytes, alignment) -> uint8 array``: where the pools get their bytes. The host's
# is ``aligned_empty``; a device's is ``memory.device.device_allocator(memory)``.
Allocator = Callable[[int, int], Any]


def aligned_empty(nbytes: int, alignment: int = ALIGNMENT) -> np.ndarray:
    """An uninitialised uint8 array of ``nbytes`` whose data pointer is ``alignment``-aligned.

    NumPy only guarantees 16-byte alignment, so we over-allocate by
    ``alignment`` bytes and slice; the slice keeps the raw block alive.
    """
    raw = np.empty(nbytes + alignment, dtype=np.uint8)
    off = (-raw.ctypes.data) % alignment
    return raw[off:off + nbytes]


def _as_int(name: str, value: Any) -> int:
    """``value`` as a plain int; bools and non-integers raise TypeError naming ``name``."""
    if isinstance(value, bool):
        raise TypeError(f"{name}: expected an int, got bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}") from None


class BoundaryPool:
    """96 classes of 12,288 bytes in one 64-byte-aligned arena, given out in runs.

    A buffer takes one class, or a run of consecutive classes when it is
    larger than a class (up to ``MAX_RUN`` classes), so its bytes are
    contiguous and one Φ address plus an offset reaches all of them.

    ``allocator`` provides the arena (host memory by default; a device allocator
    makes the arena one device buffer, addressed the same way).
    """

    NUM_CLASSES = NUM_CLASSES
    CLASS_BYTES = CLASS_BYTES
    PAGES = PAGES
    PAGE_BYTES = PAGE_BYTES
    MAX_RUN = MAX_RUN
    MAX_BYTES = MAX_RUN * CLASS_BYTES

    __slots__ = ("_arena", "_free", "_runs", "_bytes_in_use", "_classes_used", "_peak_classes")

    def __init__(self, allocator: Allocator = aligned_empty) -> None:
        self._arena: Any = allocator(NUM_CLASSES * CLASS_BYTES, ALIGNMENT)
        self._arena.fill(0)  # touch the pages once so first use does not fault
        self._free: int = _ALL_FREE
        # start class -> (number of classes, requested bytes)
        self._runs: dict[int, tuple[int, int]] = {}
        self._bytes_in_use: int = 0
        self._classes_used: int = 0
        self._peak_classes: int = 0

    # --- properties ---------------------------------------------------------------
    @property
    def arena(self) -> Any:
        """The whole arena as a uint8 array (what Φ addresses index): an ndarray on the
        host, a ``DeviceArray`` on a device."""
        return self._arena

    @property
    def capacity_bytes(self) -> int:
        return NUM_CLASSES * CLASS_BYTES

    @property
    def bytes_in_use(self) -> int:
        """Bytes requested by live runs (cheaper than ``stats()`` on hot paths)."""
        return self._bytes_in_use

    # --- allocation ---------------------------------------------------------------
    @staticmethod
    def classes_for(nbytes: int) -> int:
        """How many classes ``nbytes`` needs (at least one)."""
        return max(1, -(-nbytes // CLASS_BYTES))

    def _find_run(self, k: int) -> int | None:
        """Lowest start of ``k`` consecutive free classes, or None (first fit)."""
        m = self._free
        # After the loop, bit i of m is set iff classes i .. i+k-1 are all free.
        covered = 1
        while covered < k and m:
            shift = min(covered, k - covered)
            m &= m >> shift
            covered += shift
        if not m:
            return None
        return (m & -m).bit_length() - 1

    def _take(self, start: int, k: int, nbytes: int) -> None:
        mask = ((1 << k) - 1) << start
        self._free &= ~mask
        self._runs[start] = (k, nbytes)
        self._bytes_in_use += nbytes
        self._classes_used += k
        if self._classes_used > self._peak_classes:
            self._peak_classes = self._classes_used

    def alloc(self, nbytes: int) -> int | None:
        """Take the first free run big enough for ``nbytes``; its start class, or None.

        None (not an error) when ``nbytes`` is 0, above ``MAX_BYTES``, or no run
        is free: the caller then falls back to the linear pool.
        """
        nbytes = _as_int("nbytes", nbytes)
        if nbytes < 0:
            raise ValueError(f"nbytes: must be >= 0, got {nbytes}")
        if nbytes == 0 or nbytes > self.MAX_BYTES:
            return None
        k = -(-nbytes // CLASS_BYTES)
        start = self._find_run(k)
        if start is None:
            return None
        self._take(start, k, nbytes)
        return start

    def claim(self, class_index: int, nclasses: int, nbytes: int | None = None) -> None:
        """Take the specific run ``class_index .. class_index+nclasses-1``.

        Used when a program addresses a buffer by Φ and so needs it at a known
        class. ``nbytes`` (default: the whole run) is what ``stats`` reports as
        in use. Raises BufferStateError naming the first class already taken.
        """
        class_index = _as_int("class_index", class_index)
        nclasses = _as_int("nclasses", nclasses)
        if not 0 <= class_index < NUM_CLASSES:
            raise ValueError(f"class_index: must be in [0, {NUM_CLASSES - 1}], got {class_index}")
        if not 1 <= nclasses <= MAX_RUN:
            raise ValueError(f"nclasses: must be in [1, {MAX_RUN}], got {nclasses}")
        if class_index + nclasses > NUM_CLASSES:
            raise ValueError(
                f"nclasses: {nclasses} classes from class {class_index} run past the last "
                f"class ({NUM_CLASSES - 1})"
            )
        if nbytes is None:
            nbytes = nclasses * CLASS_BYTES
        nbytes = _as_int("nbytes", nbytes)
        if not 0 <= nbytes <= nclasses * CLASS_BYTES:
            raise ValueError(
                f"nbytes: must be in [0, {nclasses * CLASS_BYTES}] for {nclasses} classes, "
                f"got {nbytes}"
            )
        mask = ((1 << nclasses) - 1) << class_index
        taken = mask & ~self._free
        if taken:
            first = (taken & -taken).bit_length() - 1
            raise BufferStateError(
                f"boundary class {first} is already in use (claiming classes "
                f"{class_index}..{class_index + nclasses - 1})"
            )
        self._take(class_index, nclasses, nbytes)

    def release(self, start: int) -> None:
        """Give back the run that starts at class ``start``."""
        start = _as_int("start", start)
        run = self._runs.pop(start, None)
        if run is None:
            raise BufferStateError(
                f"boundary class {start} is not the start of an allocated run "
                "(already freed, or never allocated)"
            )
        k, nbytes = run
        self._free |= ((1 << k) - 1) << start
        self._bytes_in_use -= nbytes
        self._classes_used -= k

    def is_free(self, cls: int) -> bool:
        """Whether class ``cls`` is free."""
        cls = _as_int("cls", cls)
        if not 0 <= cls < NUM_CLASSES:
            raise ValueError(f"cls: must be in [0, {NUM_CLASSES - 1}], got {cls}")
        return bool(self._free >> cls & 1)

    # --- addressing ---------------------------------------------------------------
    def view(self, start: int, nbytes: int) -> Any:
        """``nbytes`` of the arena from class ``start`` as a uint8 view (no copy)."""
        start = _as_int("start", start)
        nbytes = _as_int("nbytes", nbytes)
        if not 0 <= start < NUM_CLASSES:
            raise ValueError(f"start: must be in [0, {NUM_CLASSES - 1}], got {start}")
        off = start * CLASS_BYTES
        if not 0 <= nbytes <= self.capacity_bytes - off:
            raise ValueError(
                f"nbytes: must be in [0, {self.capacity_bytes - off}] from class {start}, "
                f"got {nbytes}"
            )
        return self._arena[off:off + nbytes]

    @staticmethod
    def phi_offset(cls: int, page: int, byte: int) -> int:
        """The arena byte offset of ``Φ(cls, page, byte)``."""
        for name, v, bound in (("class", cls, NUM_CLASSES), ("page", page, PAGES),
                               ("byte", byte, PAGE_BYTES)):
            v = _as_int(name, v)
            if not 0 <= v < bound:
                raise ValueError(f"Φ {name}: must be in [0, {bound}), got {v}")
        return int(cls) * CLASS_BYTES + int(page) * PAGE_BYTES + int(byte)

    # --- statistics ---------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        """Classes used and free, bytes requested by live buffers, peak classes, capacity."""
        return {
            "classes_used": self._classes_used,
            "classes_free": NUM_CLASSES - self._classes_used,
            "bytes_in_use": self._bytes_in_use,
            "peak_classes_used": self._peak_classes,
            "capacity_bytes": self.capacity_bytes,
            "num_runs": len(self._runs),
        }

    def __repr__(self) -> str:
        return f"BoundaryPool({self._classes_used}/{NUM_CLASSES} classes used)"
