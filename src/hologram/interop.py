"""Taking arrays from other libraries without copying them.

Anything that speaks DLPack (NumPy, PyTorch, JAX, CuPy on the host) becomes a
Buffer that views the producer's memory; results written to it are visible to
the producer. NumPy's ``from_dlpack`` does the protocol work.

An executor whose buffers are device memory (webgpu, metal) cannot view host
memory, so there ``from_dlpack`` copies the data into a new device buffer
(``copy=False`` raises instead). A device Buffer as the source is read back to
the host first (DLPack cannot share device memory).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from .buffer import Buffer, DeviceBuffer
from .errors import ArgumentTypeError, DLPackError, ShapeError
from .executor import Executor

KDL_CUDA = 2  # DLPack's device type of CUDA device memory (dlpack.h, DLDeviceType)

_DEFAULT: dict[str, Executor] = {}
_LOCK = threading.Lock()


def default_executor(backend: str = "cpu") -> Executor:
    """One shared executor per backend for calls that name none (created on first use)."""
    ex = _DEFAULT.get(backend)
    if ex is None or ex.closed:
        with _LOCK:
            ex = _DEFAULT.get(backend)
            if ex is None or ex.closed:
                ex = Executor(backend)
                _DEFAULT[backend] = ex
    return ex


def from_dlpack(x: Any, executor: Executor | None = None, copy: bool | None = None) -> Buffer:
    """Wrap a DLPack-capable host array as a Buffer, sharing its memory.

    ``copy=None`` shares when it can and copies a non-contiguous array;
    ``copy=False`` raises instead of copying; ``copy=True`` always copies. On an
    executor with device memory sharing is impossible: the data is copied in.
    """
    ex = executor if executor is not None else default_executor("cpu")
    imported = _device_import(ex, x)
    if imported is not None:  # kDLCUDA memory on the executor's GPU: shared, not copied
        if copy:
            buf = ex.allocate(imported.shape, imported.isa_dtype)
            buf.copy_from(imported)
            imported.free()
            return buf
        return imported
    owner = x  # what the new buffer keeps alive when it shares x's memory
    if isinstance(x, DeviceBuffer):  # device memory: only a host copy can leave it
        if copy is False:
            raise DLPackError(f"x: is in {x.device} device memory, which cannot be shared; "
                              "taking it needs a copy (copy=False given)")
        arr, copy, owner = x.to_numpy(), None, None  # already a fresh copy
    elif isinstance(x, np.ndarray):
        arr = x
    else:
        if not hasattr(x, "__dlpack__"):
            raise ArgumentTypeError(
                f"x: expected an object with __dlpack__, got {type(x).__name__}"
            )
        try:
            arr = np.from_dlpack(x)
        except (BufferError, RuntimeError, TypeError) as e:
            raise ArgumentTypeError(f"x: cannot be shared through DLPack: {e}") from e
    if ex._device is not None:
        return _copy_to_device(ex, arr, copy)
    if copy:
        arr = np.ascontiguousarray(arr).copy()
    elif not (arr.flags.c_contiguous and arr.flags.aligned):
        if copy is False:
            raise ShapeError("x: is not contiguous and aligned; sharing it needs a copy "
                             "(copy=False given)")
        arr = np.array(arr, order="C")  # a fresh array: contiguous and aligned
    return ex.wrap(arr, owner=owner)


def _device_import(ex: Executor, x: Any) -> Buffer | None:
    """``x`` as a zero-copy Buffer when it is device memory the executor's backend
    imports (a CUDA tensor on a cuda executor's GPU), else None."""
    take = getattr(ex.backend, "import_dlpack", None)
    where = getattr(x, "__dlpack_device__", None)
    if take is None or where is None or isinstance(x, Buffer):
        return None
    if int(where()[0]) != KDL_CUDA:  # host memory (or another device's): the host path
        return None
    array, dtype, owner = take(x)
    return ex.wrap_device(array, dtype, owner)


def _copy_to_device(ex: Executor, arr: np.ndarray, copy: bool | None) -> Buffer:
    """A new buffer of ``ex`` (device memory) holding a copy of host ``arr``."""
    if copy is False:
        raise DLPackError(f"x: executor backend {ex.backend_name!r} keeps buffers in "
                          f"{ex.backend.device_type} device memory, which cannot share host "
                          "memory; taking x needs a copy (copy=False given)")
    buf = ex.allocate(arr.shape, arr.dtype)
    buf.from_numpy(arr)
    return buf
