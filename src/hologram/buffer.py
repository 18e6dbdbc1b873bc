"""Buffer: a typed, shaped block of an executor's memory.

Host buffers view the executor's pools directly, so ``to_numpy`` and DLPack
export hand out the same memory the kernels write (zero-copy), and
``from_numpy``/``fill``/``copy_from`` write in place.

Device buffers (``DeviceBuffer``, on webgpu/metal executors) hold a window of
device memory, which the host cannot view: ``to_numpy``/``to_bytes`` return
copies, ``from_numpy``/``from_bytes``/``fill`` upload, ``copy_from`` copies on
the device, and DLPack exports only host copies. Every check (shapes, dtypes,
casts, read-only, freed) is the same code for both: the subclass only replaces
how bytes move.
"""

from __future__ import annotations

import math
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import ArgumentTypeError, BufferStateError, DLPackError, DTypeError, ShapeError
from .isa.dtypes import DType

if TYPE_CHECKING:
    from .executor import Executor
    from .memory import Block


def normalize_shape(size_or_shape: Any, what: str = "size_or_shape") -> tuple[int, ...]:
    if isinstance(size_or_shape, (bool, np.bool_)):
        raise ArgumentTypeError(f"{what}: expected an int or a tuple of ints, got bool")
    if isinstance(size_or_shape, (int, np.integer)):
        shape = (int(size_or_shape),)
    elif isinstance(size_or_shape, (tuple, list)):
        if not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool)
                   for s in size_or_shape):
            raise ArgumentTypeError(f"{what}: expected a tuple of ints, got {size_or_shape!r}")
        shape = tuple(int(s) for s in size_or_shape)
    else:
        raise ArgumentTypeError(
            f"{what}: expected an int or a tuple of ints, got {type(size_or_shape).__name__}"
        )
    if any(s < 0 for s in shape):
        raise ShapeError(f"{what}: sizes must be >= 0, got {shape}")
    return shape


class Buffer:
    """Memory owned by one Executor; freed by ``free()`` or when the executor closes."""

    __slots__ = ("_executor", "_block", "_array", "shape", "isa_dtype", "_freed", "_external",
                 "_views",
                 "__weakref__")

    def __init__(
        self,
        executor: Executor,
        array: np.ndarray,
        shape: tuple[int, ...],
        dtype: DType,
        block: Block | None = None,
        external: Any = None,
    ) -> None:
        self._executor = executor
        self._block = block
        self._array = array  # the buffer's bytes, viewed as its dtype and shape
        self.shape = shape
        self.isa_dtype = dtype
        self._freed = False
        self._external = external  # keeps a foreign owner (DLPack producer) alive
        self._views: list[weakref.ref[Buffer]] = []  # reshape() views, freed with this buffer

    # --- properties -------------------------------------------------------------
    @property
    def dtype(self) -> np.dtype:
        """The NumPy dtype (what NumPy users compare against); ``isa_dtype`` is hologram's."""
        return self.isa_dtype.np_dtype

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.isa_dtype.itemsize

    @property
    def device(self) -> str:
        return self._executor.backend.device_type

    @property
    def executor(self) -> Executor:
        return self._executor

    @property
    def pool(self) -> str:
        """Which memory holds the buffer: 'boundary', 'linear', 'none' or 'external'."""
        return self._block.pool if self._block is not None else "external"

    @property
    def is_freed(self) -> bool:
        return self._freed

    @property
    def writable(self) -> bool:
        return bool(self._array.flags.writeable)

    def __len__(self) -> int:
        return self.shape[0] if self.shape else 1

    def __repr__(self) -> str:
        state = "freed" if self._freed else f"{self.pool} pool"
        return f"<hologram.Buffer shape={self.shape} dtype={self.isa_dtype} {self.device} {state}>"

    # --- checks -----------------------------------------------------------------
    def _check(self, executor: Executor | None = None, what: str = "buffer") -> None:
        if self._freed:
            raise BufferStateError(f"{what}: the buffer was freed")
        if executor is not None and executor is not self._executor:
            raise BufferStateError(f"{what}: the buffer belongs to another executor")
        if self._executor.closed:
            raise BufferStateError(f"{what}: the buffer's executor is closed")

    def view(self) -> np.ndarray:
        """The backing array, shaped and typed, for the executor and the op library: a
        NumPy view on host backends, a ``DeviceArray`` window on a device."""
        self._check()
        return self._array

    # --- data in and out --------------------------------------------------------
    def to_numpy(self) -> np.ndarray:
        """A NumPy view of the buffer (no copy): writes through it change the buffer."""
        self._check()
        self._executor.synchronize()
        return self._array

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        a = self.to_numpy()
        if dtype is not None:
            try:
                dtype = np.dtype(dtype)
            except TypeError as e:
                raise ArgumentTypeError(f"dtype: {e}") from None
        if dtype is not None and dtype != a.dtype:
            return a.astype(dtype)
        return a.copy() if copy else a

    def from_numpy(self, array: Any) -> Buffer:
        """Copy ``array`` in (same number of elements; same-kind casts like f64->f32)."""
        self._check()
        self._require_writable("from_numpy")
        try:
            a = np.asarray(array)
        except ValueError as e:  # ragged nested lists
            raise ShapeError(f"array: cannot be read as an array: {e}") from None
        if a.size != self.size:
            raise ShapeError(
                f"array: has {a.size} elements, the buffer holds {self.size} {self.shape}"
            )
        try:
            self._store(a.reshape(self.shape))
        except TypeError:
            raise DTypeError(
                f"array: cannot cast {a.dtype} to the buffer's {self.isa_dtype} safely"
            ) from None
        return self

    def _store(self, a: np.ndarray) -> None:
        """Write ``a`` (the buffer's shape, any same-kind dtype) over the buffer."""
        np.copyto(self._array, a, casting="same_kind")

    def to_bytes(self) -> bytes:
        self._check()
        self._executor.synchronize()
        return self._array.tobytes()

    def from_bytes(self, data: bytes | bytearray | memoryview) -> Buffer:
        self._check()
        self._require_writable("from_bytes")
        try:
            mv = memoryview(data).cast("B")
        except TypeError:
            raise ArgumentTypeError(
                f"data: expected bytes-like, got {type(data).__name__}"
            ) from None
        if mv.nbytes != self.nbytes:
            raise ShapeError(f"data: has {mv.nbytes} bytes, the buffer holds {self.nbytes}")
        self._store_bytes(np.frombuffer(mv, dtype=np.uint8))
        return self

    def _store_bytes(self, raw: np.ndarray) -> None:
        self._array.reshape(-1).view(np.uint8)[:] = raw

    def fill(self, value: float) -> Buffer:
        self._check()
        self._require_writable("fill")
        if not isinstance(value, (int, float, np.number, bool)):
            raise ArgumentTypeError(f"value: expected a number, got {type(value).__name__}")
        self._array.fill(value)
        return self

    def copy_from(self, other: Buffer) -> Buffer:
        self._check()
        self._require_writable("copy_from")
        if not isinstance(other, Buffer):
            raise ArgumentTypeError(f"other: expected a Buffer, got {type(other).__name__}")
        other._check(self._executor, "other")
        if other.size != self.size or other.isa_dtype is not self.isa_dtype:
            raise ShapeError(
                f"other: is {other.isa_dtype}{list(other.shape)}, this buffer is "
                f"{self.isa_dtype}{list(self.shape)}"
            )
        self._copy(other)
        return self

    def _copy(self, other: Buffer) -> None:
        np.copyto(self._array, other._array.reshape(self.shape))

    def reshape(self, *shape: Any) -> Buffer:
        """A new Buffer over the same memory with another shape (the original stays valid)."""
        self._check()
        shape_ = normalize_shape(shape[0] if len(shape) == 1 else tuple(shape), "shape")
        if math.prod(shape_) != self.size:
            raise ShapeError(f"shape: {shape_} does not hold {self.size} elements")
        view = type(self)(self._executor, self._array.reshape(shape_), shape_,
                          self.isa_dtype, None, external=self)
        self._views.append(weakref.ref(view))
        return view

    def _require_writable(self, what: str) -> None:
        if not self.writable:
            raise BufferStateError(f"{what}: the buffer is read-only")

    def free(self) -> None:
        """Give the memory back to the pool. Using the buffer afterwards raises."""
        if self._freed:
            return
        self._freed = True
        for ref in self._views:  # views share this memory: they end with it
            view = ref()
            if view is not None:
                view.free()
        self._views.clear()
        self._executor._release(self)

    # --- DLPack -----------------------------------------------------------------
    def __dlpack__(self, *, stream: Any = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> Any:
        """Export as a DLPack capsule (versioned when ``max_version`` >= (1, 0) is asked).

        Host memory is exported through NumPy's implementation, which follows the
        DLPack protocol exactly; the capsule keeps this buffer's memory alive.
        """
        self._check()
        self._executor.synchronize()
        kwargs: dict[str, Any] = {}
        if max_version is not None:
            kwargs["max_version"] = max_version
        if dl_device is not None:
            kwargs["dl_device"] = dl_device
        if copy is not None:
            kwargs["copy"] = copy
        if stream is not None and not (isinstance(stream, (int, np.integer)) and stream == -1):
            raise DLPackError(f"stream: a CPU buffer takes stream=None, got {stream!r}")
        try:
            return self._array.__dlpack__(**kwargs)
        except (BufferError, TypeError, ValueError, OverflowError) as e:  # NumPy refuses
            raise DLPackError(f"__dlpack__: {e}") from None

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._array.__dlpack_device__()



class DeviceBuffer(Buffer):
    """A Buffer in device memory (webgpu/metal executors): the same API, other semantics
    where the host cannot see the bytes.

    ``_array`` is a :class:`~hologram.memory.device.DeviceArray`. Device memory cannot
    be viewed from the host, so ``to_numpy`` returns a *copy* (writes to it do not
    reach the buffer: use ``from_numpy``), and DLPack exports only a host copy, when
    the consumer asks for one (``np.from_dlpack(buf, device="cpu", copy=True)``).
    """

    __slots__ = ()

    # --- data in and out --------------------------------------------------------
    def to_numpy(self) -> np.ndarray:
        """A host copy of the buffer (device memory cannot be viewed; waits for the
        launches that write it)."""
        self._check()
        return self._array.to_host()

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        if copy is False:  # NumPy's protocol: copy=False must not copy, so it must fail
            raise ValueError("a device buffer cannot be viewed as a NumPy array without a "
                             "copy (copy=False given)")
        return super().__array__(dtype, None)

    def to_bytes(self) -> bytes:
        self._check()
        return self._array.to_host().tobytes()

    def _store(self, a: np.ndarray) -> None:
        host = np.empty(self.shape, self.dtype)
        np.copyto(host, a, casting="same_kind")
        self._array.write(host)

    def _store_bytes(self, raw: np.ndarray) -> None:
        self._array.write(raw)

    # fill: Buffer.fill calls DeviceArray.fill (a device clear for zeros, else an upload)

    def _copy(self, other: Buffer) -> None:
        self._array.copy_from(other._array)  # on the device

    # --- DLPack -----------------------------------------------------------------
    def __dlpack__(self, *, stream: Any = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> Any:
        """Export a host copy, and only when asked for one.

        DLPack cannot hand out WebGPU memory (there is no pointer a consumer could
        use), so the consumer must ask for the CPU (``dl_device=(1, 0)``) without
        forbidding a copy (``copy`` True or None); it then gets a host copy.
        """
        self._check()
        dev = self.device
        if stream is not None and not (isinstance(stream, (int, np.integer)) and stream == -1):
            raise DLPackError(f"stream: a {dev} buffer exports host copies, which take "
                              f"stream=None, got {stream!r}")
        try:
            wanted = None if dl_device is None else (int(dl_device[0]), int(dl_device[1]))
        except (TypeError, ValueError, IndexError):
            raise DLPackError(f"dl_device: expected a (device type, id) pair, got "
                              f"{dl_device!r}") from None
        if wanted != (1, 0):
            raise DLPackError(
                f"__dlpack__: the buffer is in {dev} device memory, which DLPack cannot "
                f"share; ask for a host copy with dl_device=(1, 0) (e.g. "
                f"np.from_dlpack(buf, device='cpu', copy=True)) or use to_numpy()"
                + ("" if wanted is None else f" (dl_device={wanted} given)"))
        if copy is False:
            raise DLPackError(f"copy: the buffer is in {dev} device memory; exporting it to "
                              "the CPU needs a copy, and copy=False was given")
        host = self._array.to_host()
        kwargs: dict[str, Any] = {} if max_version is None else {"max_version": max_version}
        try:
            return host.__dlpack__(**kwargs)
        except (BufferError, TypeError, ValueError, OverflowError) as e:  # NumPy refuses
            raise DLPackError(f"__dlpack__: {e}") from None

    def __dlpack_device__(self) -> tuple[int, int]:
        """``(15, 0)``: DLPack's kDLWebGPU (where the buffer is, not where exports go)."""
        return self._executor._device.dlpack_device
