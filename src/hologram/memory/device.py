"""Device memory for the pools: ``DeviceArray``, an ndarray-like window of a device buffer.

Why a window class: the pools, the executor and the op library pass NumPy arrays
around and only use a handful of their features (``view(dtype)``, ``reshape``,
``[:n]``, ``nbytes``, ``size``, ``shape``, ``dtype``, ``flags``). A device buffer
cannot be a NumPy array (its bytes are not in host memory), so a ``DeviceArray``
is those features over ``(device buffer, byte offset, dtype, shape)``: the same
pools then serve device memory by taking :func:`device_allocator` instead of
:func:`~hologram.memory.boundary.aligned_empty`, and a backend that understands
``DeviceArray`` binds it directly instead of copying.

Data moves only through the :class:`DeviceMemory` the window belongs to
(``to_host`` reads a copy back, ``write`` uploads, ``copy_from`` copies on the
device): there is no pointer to hand out, so nothing can view device memory
from the host by accident. Windows are always C-contiguous.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import numpy as np

from ..errors import ArgumentTypeError, ShapeError
from ..isa.value import contiguous_strides


class DeviceMemory(Protocol):
    """What a device offers the pools: buffers, and bytes in, out and across.

    Offsets and sizes are in bytes and may be unaligned; the implementation does
    whatever its API needs (WebGPU copies whole 4-byte words) to honour them.
    """

    name: str  # the device kind a Buffer reports ('webgpu')
    dlpack_device: tuple[int, int]  # (DLPack device type, id)

    def create(self, nbytes: int) -> Any:
        """A new device buffer of at least ``nbytes``; MemoryError if the device has none."""

    def read(self, handle: Any, offset: int, nbytes: int) -> np.ndarray:
        """A host copy (a fresh uint8 array) of ``nbytes`` from ``offset``."""

    def write(self, handle: Any, offset: int, data: np.ndarray) -> None:
        """Upload the contiguous uint8 array ``data`` to ``offset``."""

    def copy(self, src: Any, src_offset: int, dst: Any, dst_offset: int, nbytes: int) -> None:
        """Copy ``nbytes`` between (or within) device buffers, ordered after earlier work."""

    def clear(self, handle: Any, offset: int, nbytes: int) -> None:
        """Set ``nbytes`` from ``offset`` to zero."""


class Flags(NamedTuple):
    """The subset of ``ndarray.flags`` the executor checks."""

    c_contiguous: bool
    aligned: bool
    writeable: bool


def _shape(shape: tuple[Any, ...], size: int) -> tuple[int, ...]:
    """``reshape``'s argument as a tuple, with one -1 inferred (NumPy's rules)."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    try:
        dims = [operator.index(s) for s in shape]
    except TypeError:
        raise ArgumentTypeError(f"shape: expected ints, got {shape!r}") from None
    if dims.count(-1) > 1 or any(d < -1 for d in dims):
        raise ShapeError(f"shape: {tuple(dims)} is not a valid shape")
    if -1 in dims:
        known = math.prod(d for d in dims if d != -1)
        if known == 0 or size % known:
            raise ShapeError(f"shape: cannot reshape {size} elements into {tuple(dims)}")
        dims[dims.index(-1)] = size // known
    if math.prod(dims) != size:
        raise ShapeError(f"shape: cannot reshape {size} elements into {tuple(dims)}")
    return tuple(dims)


class DeviceArray:
    """A C-contiguous window ``(handle, offset, dtype, shape)`` of a device buffer.

    ``handle`` is the device's buffer object (None for a zero-byte window, which
    owns no buffer). Holding a window keeps its buffer alive.
    """

    __slots__ = ("memory", "handle", "offset", "dtype", "shape", "writeable", "__weakref__")

    def __init__(self, memory: DeviceMemory, handle: Any, offset: int, dtype: Any,
                 shape: tuple[int, ...], writeable: bool = True) -> None:
        self.memory = memory
        self.handle = handle
        self.offset = offset
        self.dtype = np.dtype(dtype)
        self.shape = shape
        self.writeable = writeable

    @classmethod
    def empty(cls, memory: DeviceMemory, nbytes: int) -> DeviceArray:
        """A uint8 window over a fresh device buffer of ``nbytes`` (contents zero)."""
        handle = memory.create(nbytes) if nbytes else None
        return cls(memory, handle, 0, np.uint8, (nbytes,))

    # --- what NumPy arrays have ---------------------------------------------------------
    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def strides(self) -> tuple[int, ...]:
        """C-contiguous strides (what the aliasing check compares)."""
        return tuple(s * self.dtype.itemsize for s in contiguous_strides(self.shape))

    @property
    def flags(self) -> Flags:
        return Flags(True, self.offset % self.dtype.itemsize == 0, self.writeable)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d DeviceArray")
        return self.shape[0]

    def _like(self, offset: int, dtype: Any, shape: tuple[int, ...]) -> DeviceArray:
        return DeviceArray(self.memory, self.handle, offset, dtype, shape, self.writeable)

    def view(self, dtype: Any) -> DeviceArray:
        """The same bytes as ``dtype`` (the last axis rescales, as ``ndarray.view``)."""
        dtype = np.dtype(dtype)
        if dtype.itemsize == self.dtype.itemsize:
            return self._like(self.offset, dtype, self.shape)
        last = self.shape[-1] * self.dtype.itemsize if self.shape else self.dtype.itemsize
        if last % dtype.itemsize:
            raise ShapeError(f"dtype: the last axis ({last} bytes) is not a whole number "
                             f"of {dtype} elements")
        return self._like(self.offset, dtype, (*self.shape[:-1], last // dtype.itemsize))

    def reshape(self, *shape: Any) -> DeviceArray:
        """The same window in another shape (never a copy: windows are contiguous)."""
        return self._like(self.offset, self.dtype, _shape(shape, self.size))

    def __getitem__(self, key: Any) -> DeviceArray:
        """``a[i:j]`` of a 1-D window: a narrower window (contiguous slices only)."""
        if self.ndim != 1 or not isinstance(key, slice):
            raise ArgumentTypeError(f"index: a DeviceArray takes [start:stop] of a 1-D window, "
                                    f"got {key!r} on shape {self.shape}")
        start, stop, step = key.indices(self.shape[0])
        if step != 1:
            raise ArgumentTypeError("index: device windows are contiguous; no step slicing")
        n = max(0, stop - start)
        return self._like(self.offset + start * self.dtype.itemsize, self.dtype, (n,))

    # --- data in and out ----------------------------------------------------------------
    def to_host(self) -> np.ndarray:
        """A host copy, shaped and typed like the window (device memory cannot be viewed)."""
        if not self.nbytes:
            return np.zeros(self.shape, self.dtype)
        raw = self.memory.read(self.handle, self.offset, self.nbytes)
        return raw.view(self.dtype).reshape(self.shape)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        if copy is False:
            raise ValueError("a DeviceArray is in device memory: reading it needs a copy")
        a = self.to_host()
        return a if dtype is None else a.astype(dtype, copy=False)

    def __float__(self) -> float:
        """The value of a one-element window (what ops returning a scalar read)."""
        if self.size != 1:
            raise TypeError(f"only one-element DeviceArrays convert to float, not {self.shape}")
        return float(self.to_host().reshape(()))

    def write(self, data: np.ndarray) -> None:
        """Upload ``data`` (a host array of exactly ``nbytes``) over the window."""
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        if raw.nbytes != self.nbytes:
            raise ShapeError(f"data: has {raw.nbytes} bytes, the window holds {self.nbytes}")
        if raw.nbytes:
            self.memory.write(self.handle, self.offset, raw)

    def fill(self, value: Any) -> None:
        """Set every element to ``value`` (a device clear when its bytes are all zero)."""
        one = np.array([value], dtype=self.dtype)
        if not self.nbytes:
            return
        if not one.view(np.uint8).any():
            self.memory.clear(self.handle, self.offset, self.nbytes)
        else:
            self.memory.write(self.handle, self.offset,
                              np.full(self.size, one[0], self.dtype).view(np.uint8))

    def copy_from(self, other: DeviceArray) -> None:
        """Copy ``other``'s bytes (same byte count) on the device."""
        if other.nbytes != self.nbytes:
            raise ShapeError(f"other: has {other.nbytes} bytes, the window holds {self.nbytes}")
        if other.memory is not self.memory:
            self.write(other.to_host())
        elif self.nbytes:
            self.memory.copy(other.handle, other.offset, self.handle, self.offset, self.nbytes)

    def extent(self) -> tuple[int, int, int]:
        """(id of the device buffer, first byte, end byte): what overlap checks compare."""
        return id(self.handle), self.offset, self.offset + self.nbytes

    def __repr__(self) -> str:
        return (f"DeviceArray({self.memory.name}, offset={self.offset}, dtype={self.dtype}, "
                f"shape={self.shape})")


def device_allocator(memory: DeviceMemory) -> Callable[[int, int], DeviceArray]:
    """An allocator for the pools (``(nbytes, alignment) -> uint8 array``) on ``memory``.

    Each call is one new device buffer, at offset 0, so any alignment holds.
    """
    def allocate(nbytes: int, alignment: int = 0) -> DeviceArray:
        return DeviceArray.empty(memory, nbytes)

    return allocate


__all__ = ["DeviceArray", "DeviceMemory", "Flags", "device_allocator"]
