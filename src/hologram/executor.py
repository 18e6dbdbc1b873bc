"""Executor: owns a backend, its memory pools, its buffers and its compiled kernels.

Everything a user runs goes through ``Executor.run`` (or the op library, which
builds programs and calls it), so swapping the backend never changes callers.

Memory: the pools take their bytes from the backend's ``device_memory`` when it
has one (WebGPU), else from host memory. On a device, buffers are
``DeviceBuffer``s over ``DeviceArray`` windows and launches take those windows
where host executors take NumPy views; the checks below accept both.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
from numpy.lib.array_utils import byte_bounds

from .backends import registry
from .backends.base import Backend
from .buffer import Buffer, DeviceBuffer, normalize_shape
from .compiler import team
from .errors import (
    AliasError,
    ArgumentTypeError,
    BufferStateError,
    DTypeError,
    OutOfMemoryError,
    ShapeError,
)
from .isa.dtypes import DType, numpy_dtype, to_dtype
from .isa.opcodes import ELEMENTWISE, group
from .isa.program import Program
from .memory import DeviceArray, DeviceMemory, MemoryManager, aligned_empty, device_allocator
from .memory.address import data_pointer

_MAX_NBYTES = int(np.iinfo(np.intp).max) - 4096  # NumPy's limit on one array, less slack


def elementwise_only(program: Program) -> bool:
    """True when each output element depends only on the same element of each input,
    which is what makes exact in-place aliasing safe."""
    from .isa.opcodes import Group

    ok = ELEMENTWISE | {Group.MEMORY}
    return all(group(v.op) in ok for v in program.instructions)


class Executor:
    """Run Atlas ISA programs on one backend.

    ``backend``: 'auto' (the best available, see ``get_default_backend``), 'cpu',
    'cuda', 'metal', 'webgpu' or 'reference'. ``memory_limit``: bytes the linear
    pool may hold before allocation raises OutOfMemoryError (None: no limit).
    On a backend with its own memory (webgpu, metal) both pools live there.
    """

    def __init__(self, backend: str = "auto", *, memory_limit: int | None = None) -> None:
        self.requested_backend = backend
        self.backend: Backend = registry.create(backend)
        # A backend with device memory says so with ``device_memory``; host backends
        # have none and the pools use host memory.
        self._device: DeviceMemory | None = getattr(self.backend, "device_memory", None)
        allocator = aligned_empty if self._device is None else device_allocator(self._device)
        self._buffer_type = Buffer if self._device is None else getattr(
            self.backend, "buffer_type", DeviceBuffer)
        self._memory = MemoryManager(limit=memory_limit, allocator=allocator)
        self._lock = threading.RLock()
        # The pools are not thread-safe: the backend takes this lock around its use.
        self.backend.attach_memory(self._memory, self._lock)
        self._buffers: weakref.WeakValueDictionary[int, Buffer] = weakref.WeakValueDictionary()
        self._kernels: dict[str, Any] = {}
        self._building: dict[str, Future] = {}  # background builds in flight, by content
        # Bound launches of the op library's fast path: key -> (buffer weakrefs, call).
        self._bound: dict[tuple, tuple[tuple[weakref.ref, ...], Any]] = {}
        self.closed = False

    @property
    def backend_name(self) -> str:
        return self.backend.name

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self._buffers)} buffers"
        return f"<hologram.Executor backend={self.backend_name!r} {state}>"

    # --- lifetime -----------------------------------------------------------------
    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Free every buffer and cached kernel; the executor cannot be used afterwards."""
        if self.closed:
            return
        with self._lock:
            for buf in list(self._buffers.values()):
                buf.free()
            self._kernels.clear()
            self._bound.clear()
        # Outside our lock: the backend takes its own lock, then ours (launch order).
        self.backend.release_scratch()
        with self._lock:
            self._memory.empty_cache()
            self.closed = True

    def _check_open(self) -> None:
        if self.closed:
            raise BufferStateError("executor: it is closed")

    # --- memory -----------------------------------------------------------------
    def allocate(self, size_or_shape: int | Sequence[int], dtype: Any = np.float32) -> Buffer:
        """A new buffer of ``size_or_shape`` elements (contents undefined)."""
        self._check_open()
        shape = normalize_shape(size_or_shape)
        d = self._dtype(dtype)
        nbytes = math.prod(shape) * d.itemsize  # exact: np.prod would wrap around
        if nbytes > _MAX_NBYTES:
            raise OutOfMemoryError(f"allocate: {list(shape)} {d} is {nbytes} bytes, more "
                                   "than one array can address")
        with self._lock:
            block = self._memory.allocate(nbytes)
            return self._adopt(block, shape, d)

    def allocate_boundary(self, class_index: int, width: int = 48, height: int = 256,
                          dtype: Any = np.float32) -> Buffer:
        """A buffer at Φ(class_index, 0, 0) spanning ``width`` pages of ``height`` bytes.

        Pages are 256 bytes and a class holds 48 of them, so width<=48, height<=256;
        the buffer is then addressable from programs as ``ldg ... phi=(class, page, byte)``.
        """
        self._check_open()
        for name, v, hi in (("class_index", class_index, 95), ("width", width, 48),
                            ("height", height, 256)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise ArgumentTypeError(f"{name}: expected an int, got {type(v).__name__}")
            lo = 0 if name == "class_index" else 1
            if not lo <= v <= hi:
                raise ShapeError(f"{name}: must be in [{lo}, {hi}], got {v}")
        d = self._dtype(dtype)
        nbytes = int(width) * int(height)
        if nbytes % d.itemsize:
            raise ShapeError(f"width*height = {nbytes} bytes is not a whole number of {d}")
        with self._lock:
            block = self._memory.allocate_boundary(int(class_index), nbytes)
            return self._adopt(block, (nbytes // d.itemsize,), d)

    def _adopt(self, block: Any, shape: tuple[int, ...], d: DType) -> Buffer:
        arr = block.array.view(d.np_dtype).reshape(shape)
        buf = self._buffer_type(self, arr, shape, d, block)
        self._buffers[id(buf)] = buf
        return buf

    def wrap(self, array: np.ndarray, owner: Any = None) -> Buffer:
        """A Buffer over existing host memory (zero-copy); ``owner`` is kept alive.

        Only on host backends: a device executor's buffers are device memory, which
        host memory cannot become (``hologram.from_dlpack`` copies in instead).
        """
        self._check_open()
        if self._device is not None or self.backend.device_type != "cpu":
            raise BufferStateError(f"wrap: backend {self.backend_name!r} keeps buffers in "
                                   f"{self.backend.device_type} device memory, not host "
                                   "memory (allocate a buffer and copy in with from_numpy)")
        if not isinstance(array, np.ndarray):
            raise ArgumentTypeError(f"array: expected a NumPy array, got {type(array).__name__}")
        if not array.flags.c_contiguous:
            raise ShapeError("array: must be C-contiguous to be shared without a copy")
        if not array.flags.aligned:
            raise ShapeError(f"array: its data is not aligned to its {array.dtype} elements; "
                             "kernels need aligned memory (pass a copy)")
        d = self._dtype(array.dtype)
        buf = Buffer(self, array, tuple(array.shape), d, None, external=owner)
        self._buffers[id(buf)] = buf
        return buf

    def wrap_device(self, array: DeviceArray, dtype: Any, owner: Any = None) -> Buffer:
        """A Buffer over ``array``, device memory this executor's backend did not allocate
        (a DLPack import: ``hologram.from_dlpack``), zero-copy; ``owner`` is kept alive
        with it. The memory stays its producer's: ``free`` only drops the reference."""
        self._check_open()
        if self._device is None or not isinstance(array, DeviceArray) \
                or array.memory is not self._device:
            raise ArgumentTypeError("array: expected a DeviceArray of this executor's device "
                                    "memory")
        d = self._dtype(dtype)
        buf = self._buffer_type(self, array, tuple(array.shape), d, None, external=owner)
        self._buffers[id(buf)] = buf
        return buf

    def _release(self, buf: Buffer) -> None:
        with self._lock:
            self._buffers.pop(id(buf), None)
            if buf._block is not None:
                self._memory.free(buf._block)
            buf._array = np.empty(0, dtype=buf._array.dtype)  # drop our view of the pool

    def memory_stats(self) -> dict[str, Any]:
        """Bytes allocated, cached and at peak, in total and per pool (device pools on a
        device backend: the same keys)."""
        return self._memory.stats()

    def empty_cache(self) -> None:
        """Return cached (free) blocks of the linear pool to the system, with the scratch
        the backend keeps between launches (the CUDA backend's temp blocks)."""
        self.backend.release_scratch()  # takes its lock, then ours: not under ours
        with self._lock:
            self._memory.empty_cache()

    @property
    def memory_limit(self) -> int | None:
        return self._memory.limit

    @memory_limit.setter
    def memory_limit(self, value: int | None) -> None:
        self._memory.limit = value

    @property
    def boundary_arena(self) -> Any:
        """The boundary arena Φ addresses index: a uint8 ndarray on the host, a
        ``DeviceArray`` (copy out with ``to_host()``/``np.asarray``) on a device."""
        return self._memory.arena

    # --- running programs ---------------------------------------------------------
    def compile(self, program: Program) -> Any:
        """The backend's compiled form of ``program``, built once per program content."""
        self._check_open()
        key = program.hash
        k = self._kernels.get(key)
        if k is None and (pending := self._building.get(key)) is not None:
            return pending.result()  # a background build of the same content
        if k is None:
            with self._lock:
                k = self._kernels.get(key)
                if k is None:
                    k = self.backend.compile(program)
                    self._kernels[key] = k
        return k

    def compile_in_background(self, program: Program) -> Future:
        """Start compiling ``program``: the backend's Python work now, on this thread
        (:meth:`Backend.prepare`), its native build on a daemon thread. The future
        holds what :meth:`compile` returns (kept, so a later :meth:`compile` finds it)
        or the compile's error. For callers with Python work of their own to do
        meanwhile: the torch.compile backend, while AOT autograd finishes a graph."""
        self._check_open()
        done: Future = Future()
        key = program.hash
        k = self._kernels.get(key)
        if k is not None:
            done.set_result(k)
            return done
        pending = self._building.get(key)
        if pending is not None:  # the same content is building: one build serves both
            return pending  # (ResNet-18's stage-1 weights: four transforms, one program)
        try:
            finish = self.backend.prepare(program)
        except BaseException as e:
            done.set_exception(e)
            return done
        self._building[key] = done

        def build() -> None:
            try:
                with team.compiling():  # (its CPU time is not PyTorch's: team.py)
                    built = finish()
                with self._lock:
                    done.set_result(self._kernels.setdefault(key, built))
            except BaseException as e:  # raised where the caller waits for it
                done.set_exception(e)
            finally:
                self._building.pop(key, None)

        threading.Thread(target=build, name="hologram-compile", daemon=True).start()
        return done

    def run(self, program: Program, inputs: Sequence[Buffer], outputs: Sequence[Buffer]) -> None:
        """Run ``program`` reading ``inputs`` and writing ``outputs`` in place.

        Buffers must belong to this executor and hold exactly the elements and dtype
        of the program's inputs and outputs (shapes may differ: data is row-major).
        """
        self._check_open()
        inputs, outputs = _as_list(inputs, "inputs"), _as_list(outputs, "outputs")
        _check_program(program)
        in_arrays = [self._operand(b, spec, f"inputs[{i}]")
                     for i, (b, spec) in enumerate(zip(inputs, program.inputs, strict=False))]
        if len(inputs) != len(program.inputs):
            raise ShapeError(f"inputs: program takes {len(program.inputs)}, got {len(inputs)}")
        specs = program.output_specs
        if len(outputs) != len(specs):
            raise ShapeError(f"outputs: program writes {len(specs)}, got {len(outputs)}")
        out_arrays = [self._operand(b, spec, f"outputs[{i}]", write=True)
                      for i, (b, spec) in enumerate(zip(outputs, specs, strict=True))]
        self.launch(program, in_arrays, out_arrays)

    def launch(self, program: Program, in_arrays: Sequence[Any],
               out_arrays: Sequence[Any], fresh_outputs: bool = False) -> None:
        """Run on NumPy arrays (the op library's path; on a device backend also this
        executor's ``DeviceArray`` windows, mixed freely). They are checked against the
        program (count, dtype, element count, C-contiguous and aligned, outputs writable)
        before any kernel runs, since kernels index raw pointers.

        ``fresh_outputs``: the caller just allocated the outputs, so nothing can alias
        them and the overlap check (microseconds per operand pair) is skipped.
        """
        check_arrays(program, in_arrays, out_arrays, self._device)
        if not fresh_outputs:
            check_aliasing(program, in_arrays, out_arrays)
        compiled = self.compile(program)
        self.backend.launch(compiled, in_arrays, out_arrays, self._memory.arena)

    def bind(self, program: Program, in_arrays: Sequence[Any],
             out_arrays: Sequence[Any]) -> Any:
        """A zero-argument callable that launches ``program`` on these arrays again.

        Checks (aliasing, compilation) happen once here, so a repeated call with the
        same buffers costs only the launch itself.
        """
        check_arrays(program, in_arrays, out_arrays, self._device)
        check_aliasing(program, in_arrays, out_arrays)
        compiled = self.compile(program)
        return self.backend.bind(compiled, in_arrays, out_arrays, self._memory.arena)

    def _operand(self, buf: Any, spec: tuple[DType, tuple[int, ...]], what: str,
                 write: bool = False) -> np.ndarray:
        if not isinstance(buf, Buffer):
            raise ArgumentTypeError(f"{what}: expected a hologram Buffer, got {type(buf).__name__}")
        buf._check(self, what)
        d, shape = spec
        if buf.isa_dtype is not d:
            raise DTypeError(f"{what}: expected dtype {d}, got {buf.isa_dtype}")
        size = math.prod(shape)
        if buf.size != size:
            raise ShapeError(f"{what}: expected {size} elements {list(shape)}, got {buf.size}")
        if write and not buf.writable:
            raise BufferStateError(f"{what}: the buffer is read-only")
        return buf.view().reshape(shape)

    def synchronize(self) -> None:
        self.backend.synchronize()

    def use_stream(self, handle: int | None) -> Any:
        """A context manager: this thread's launches and copies go on the external
        stream ``handle`` while it is open (the cuda backend: a ``cudaStream_t`` as an
        int, such as ``torch.cuda.current_stream().cuda_stream``; ordered against the
        executor's own stream both ways). None: the backend's own stream. Backends
        without streams take only None."""
        self._check_open()
        return self.backend.use_stream(handle)

    def _dtype(self, dtype: Any) -> DType:
        """Every dtype of the ISA's table, where NumPy has it (bf16 needs ml_dtypes) and
        the backend can store it (``Backend.check_buffer_dtype``: WGSL has no f64, i64,
        8- or 16-bit integers)."""
        d = to_dtype(dtype)
        numpy_dtype(d)
        self.backend.check_buffer_dtype(d)
        return d


def _check_program(program: Any) -> None:
    if not isinstance(program, Program):
        raise ArgumentTypeError(f"program: expected a hologram Program, got "
                                f"{type(program).__name__}")


def _as_list(items: Any, what: str) -> list[Any]:
    if isinstance(items, (list, tuple)):
        return list(items)
    raise ArgumentTypeError(f"{what}: expected a list or tuple, got {type(items).__name__}")


def check_arrays(program: Program, ins: Sequence[Any], outs: Sequence[Any],
                 device: DeviceMemory | None = None) -> None:
    """Raise unless the arrays fit the program: count, dtype, element count, C-contiguous,
    aligned, outputs writable. Kernels index raw pointers, so a launch on arrays that do
    not fit would read or write out of bounds instead of raising.

    ``device``: the executor's device memory; its ``DeviceArray`` windows are accepted
    beside NumPy arrays (anything else's are not: a host kernel cannot read them)."""
    _check_program(program)
    ins, outs = _as_list(ins, "inputs"), _as_list(outs, "outputs")
    for what, arrays, specs in (("inputs", ins, program.inputs),
                                ("outputs", outs, program.output_specs)):
        if len(arrays) != len(specs):
            raise ShapeError(f"{what}: program has {len(specs)}, got {len(arrays)}")
        for i, (a, (d, shape)) in enumerate(zip(arrays, specs, strict=True)):
            if not isinstance(a, np.ndarray) and not (
                    isinstance(a, DeviceArray) and device is not None and a.memory is device):
                where = (f" ({a.memory.name} device memory this executor cannot use)"
                         if isinstance(a, DeviceArray) else "")
                raise ArgumentTypeError(
                    f"{what}[{i}]: expected a NumPy array, got {type(a).__name__}{where}")
            if a.dtype != d.np_dtype:
                raise DTypeError(f"{what}[{i}]: expected dtype {d}, got {a.dtype}")
            if a.size != math.prod(shape):
                raise ShapeError(f"{what}[{i}]: expected {math.prod(shape)} elements "
                                 f"{list(shape)}, got {a.size}")
            flags = a.flags
            if not (flags.c_contiguous and flags.aligned):
                raise ShapeError(f"{what}[{i}]: must be C-contiguous and aligned")
            if what == "outputs" and not flags.writeable:
                raise BufferStateError(f"{what}[{i}]: the array is read-only")


_EMPTY = (0, 0, 0)


def _extent(a: Any) -> tuple[int, int, int]:
    """(address space, lo, hi): the byte range [lo, hi) an array can touch (exact for
    contiguous arrays, a bound for strided ones). Host memory is space 0; a device
    window's space is its device buffer, so ranges compare only within one buffer."""
    if not a.size:
        return _EMPTY
    if isinstance(a, DeviceArray):
        return a.extent()
    if a.flags.c_contiguous:  # what check_arrays lets through: exact, and 8x cheaper
        lo = data_pointer(a)
        return 0, lo, lo + a.nbytes
    lo, hi = byte_bounds(a)
    return 0, lo, hi


def _shares(a: Any, b: Any) -> bool:
    """Whether two arrays whose ranges intersect share memory (device windows are
    contiguous, so for them intersecting is sharing)."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return bool(np.shares_memory(a, b))
    return True


def check_aliasing(program: Program, ins: Sequence[Any], outs: Sequence[Any]) -> None:
    """Outputs may not overlap each other; an output may overlap an input only exactly
    (same memory, same layout) and only in an element-wise program.

    Byte ranges are compared first (cheap); only intersecting ranges are looked at
    more closely, so a launch with many operands costs microseconds, not tens of them.
    """
    in_ext = [_extent(x) for x in ins]
    out_ext = [_extent(o) for o in outs]
    for i, (o, (space, lo, hi)) in enumerate(zip(outs, out_ext, strict=True)):
        if lo == hi:
            continue
        for j, (space2, lo2, hi2) in enumerate(out_ext[:i]):
            if space == space2 and lo < hi2 and lo2 < hi and _shares(o, outs[j]):
                raise AliasError(f"outputs[{i}] overlaps outputs[{j}]")
        for j, (space2, lo2, hi2) in enumerate(in_ext):
            if not (space == space2 and lo < hi2 and lo2 < hi):
                continue
            x = ins[j]
            same = lo == lo2 and o.shape == x.shape and o.strides == x.strides
            if not same:
                if _shares(o, x):
                    raise AliasError(f"outputs[{i}] partly overlaps inputs[{j}]")
                continue
            if not elementwise_only(program):
                raise AliasError(
                    f"outputs[{i}] is inputs[{j}]: in-place is only allowed for element-wise ops"
                )
