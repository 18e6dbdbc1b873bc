"""Zero-copy import of CUDA device memory through DLPack: ``torch.cuda`` tensors, CuPy
arrays, anything whose ``__dlpack_device__()`` is kDLCUDA on the executor's GPU.

Why here and not in NumPy: NumPy imports host memory only. A CUDA tensor's capsule
holds a ``DLManagedTensor`` whose ``data`` is a device pointer; the cuda backend's
buffers are windows of device allocations (``DeviceArray`` over an ``Allocation``),
so the tensor becomes a Buffer by wrapping that pointer, with the capsule's owner
kept alive and its deleter called when the buffer's last reference goes (the DLPack
consumer's duty). Nothing is copied.

Stream semantics: the consumer passes its stream to ``__dlpack__(stream=...)`` and the
producer makes that stream wait for the work it queued on the tensor. We pass the
stream this thread's work goes on (the executor's own, or the one ``use_stream``
named), so our kernels see the tensor's data.

Only C-contiguous tensors of an Atlas ISA dtype are taken (kernels index raw
pointers row-major); others raise :class:`~hologram.errors.DLPackError` naming why.
The parsing is plain ctypes over the DLPack ABI and runs in CPU-only CI; what a GPU
must confirm (PyTorch's and CuPy's capsules of real device memory, their stream
handshake) is listed in the README.
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

import numpy as np

from ..errors import DLPackError, DTypeError
from ..isa.dtypes import DType, from_dlpack_code
from ..isa.value import contiguous_strides
from ..memory.device import DeviceArray
from .cuda_device import Allocation

DLPACK_CUDA = 2
_NAME, _USED = b"dltensor", b"used_dltensor"


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", _DELETER)]


_capsule_get = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get.restype, _capsule_get.argtypes = ctypes.c_void_p, [ctypes.py_object,
                                                                ctypes.c_char_p]
_capsule_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_valid.restype, _capsule_valid.argtypes = ctypes.c_int, [ctypes.py_object,
                                                                 ctypes.c_char_p]
_capsule_rename = ctypes.pythonapi.PyCapsule_SetName
_capsule_rename.restype, _capsule_rename.argtypes = ctypes.c_int, [ctypes.py_object,
                                                                   ctypes.c_char_p]


class ManagedTensor:
    """A consumed capsule's ``DLManagedTensor``: its deleter runs exactly once, when this
    object goes (the buffer over its memory holds it)."""

    def __init__(self, address: int, producer: Any) -> None:
        self.address = address
        self.producer = producer  # the tensor stays alive with its memory
        self.tensor = DLManagedTensor.from_address(address)

    def __del__(self) -> None:
        address, self.address = self.address, 0
        if address and self.tensor.deleter:
            self.tensor.deleter(address)


def consume(capsule: Any, producer: Any = None) -> ManagedTensor:
    """Take ownership of a legacy DLPack capsule ("dltensor"; renamed "used_dltensor",
    so its own destructor no longer frees it)."""
    if not _capsule_valid(capsule, _NAME):
        raise DLPackError("x: __dlpack__ did not return an unused 'dltensor' capsule")
    address = _capsule_get(capsule, _NAME)
    if _capsule_rename(capsule, _USED) != 0:  # pragma: no cover - CPython never fails here
        raise DLPackError("x: the DLPack capsule could not be marked used")
    return ManagedTensor(address, producer)


def _layout(t: DLTensor) -> tuple[DType, tuple[int, ...]]:
    """The tensor's dtype and shape, refusing what kernels cannot index in place."""
    if t.dtype.lanes != 1:
        raise DLPackError(f"x: vector dtypes (lanes={t.dtype.lanes}) cannot be shared")
    try:
        d = from_dlpack_code(t.dtype.code, t.dtype.bits)
    except DTypeError as e:
        raise DLPackError(f"x: {e}") from None
    shape = tuple(int(t.shape[i]) for i in range(t.ndim))
    if t.strides and math.prod(shape):
        strides = tuple(int(t.strides[i]) for i in range(t.ndim))
        want = contiguous_strides(shape)
        if any(s != w and n != 1 for s, w, n in zip(strides, want, shape, strict=True)):
            raise DLPackError(f"x: strides {list(strides)} (in elements) are not C-contiguous "
                              f"for shape {list(shape)}; kernels index device memory row-major: "
                              "pass a contiguous tensor (.contiguous())")
    return d, shape


def import_device_array(x: Any, memory: Any, consumer_stream: int | None
                        ) -> tuple[DeviceArray, DType, ManagedTensor]:
    """``x``'s device memory as a ``DeviceArray`` of ``memory`` (a ``CudaMemory`` whose
    ``dlpack_device`` is kDLCUDA), sharing it: (the array, its dtype, the managed tensor
    that must outlive it). ``consumer_stream``: our stream's handle, for the producer to
    order its work before ours."""
    where = tuple(int(v) for v in x.__dlpack_device__())
    if where != tuple(memory.dlpack_device):
        raise DLPackError(f"x: is on DLPack device {where}; this executor's memory is "
                          f"{tuple(memory.dlpack_device)} (kDLCUDA = 2, by device id)")
    managed = consume(x.__dlpack__(stream=consumer_stream), x)
    t = managed.tensor.dl_tensor
    got = (t.device.device_type, t.device.device_id)
    if got != where:
        raise DLPackError(f"x: its capsule is on DLPack device {got}, not the {where} its "
                          "__dlpack_device__ reported")
    d, shape = _layout(t)
    nbytes = math.prod(shape) * d.itemsize
    ptr = (t.data or 0) + t.byte_offset if nbytes else 0
    if ptr % d.itemsize:
        raise DLPackError(f"x: its data at {ptr:#x} is not aligned to its {d} elements")
    np_dtype = d.np_dtype if d.np_dtype is not None else np.dtype(f"V{d.itemsize}")
    handle = Allocation(ptr, nbytes, managed) if nbytes else None
    return DeviceArray(memory, handle, 0, np_dtype, shape), d, managed


__all__ = ["DLManagedTensor", "DLTensor", "ManagedTensor", "consume", "import_device_array"]
