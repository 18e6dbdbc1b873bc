"""Sharing memory between torch tensors and hologram buffers, and picking executors.

Both directions go through DLPack, so a buffer made from a contiguous tensor
and a tensor made from a buffer view the same bytes: a kernel that writes the
buffer changes the tensor. Nothing here copies unless the tensor is strided
(a DLPack consumer needs one dense block), and then the copy is returned too,
so the caller can see which memory the buffer really holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hologram.buffer import Buffer
from hologram.executor import Executor
from hologram.interop import from_dlpack

from ._ops import CUDA_MESSAGE, TORCH_TO_ISA, check_device, executor_for

__all__ = [
    "HOST_BACKENDS",
    "backend_name",
    "buffer_to_tensor",
    "create_executor_for_tensor",
    "default_executor",
    "tensor_to_buffer",
    "validate_tensor_compatible",
]


def default_executor(device: torch.device | str | torch.Tensor = "cpu") -> Executor:
    """The shared executor for tensors on ``device`` (a device, its name, or a tensor).

    CPU tensors get hologram's shared 'cpu' executor (native C kernels, or the
    reference interpreter where no C compiler exists). CUDA tensors raise
    NotImplementedError: hologram's CUDA backend cannot use torch's CUDA memory yet.
    """
    dev = device.device if isinstance(device, torch.Tensor) else torch.device(device)
    if dev.type == "cuda":
        raise NotImplementedError(CUDA_MESSAGE)
    if dev.type != "cpu":
        raise NotImplementedError(f"hologram_torch: no executor for device {dev}")
    return executor_for("", dev)


def create_executor_for_tensor(tensor: torch.Tensor) -> Executor:
    """The executor matching ``tensor``'s device (the seeds' name for ``default_executor``)."""
    return default_executor(tensor)


#: Backends that compute on host memory, so they can run on torch CPU tensors in place.
HOST_BACKENDS = ("cpu", "reference")


def backend_name(executor: Executor | str | None) -> str:
    """The backend name the custom ops carry for ``executor`` ('' = the device default).

    ``executor`` is a hologram Executor, a backend name ('cpu', 'reference') or None.
    Ops pass a string rather than the executor object so that torch.compile can
    put them in a graph (and modules can be deep-copied and pickled); the launch
    then uses the shared executor of that backend, which computes exactly what
    ``executor`` would, since torch owns all the memory.
    """
    if executor is None or executor == "":
        return ""
    if isinstance(executor, str):
        if executor in HOST_BACKENDS:
            return executor
        if executor == "cuda":
            raise NotImplementedError(CUDA_MESSAGE)
        raise ValueError(f"executor: backend {executor!r} cannot run on torch CPU tensors "
                         f"(expected one of {HOST_BACKENDS})")
    if not isinstance(executor, Executor):
        raise TypeError(f"executor: expected a hologram Executor, got {type(executor).__name__}")
    executor._check_open()
    if executor.backend.device_type != "cpu":
        raise NotImplementedError(CUDA_MESSAGE if executor.backend.device_type == "cuda" else
                                  f"hologram_torch: backend {executor.backend_name!r} does not "
                                  "compute on host memory")
    return executor.backend_name


def validate_tensor_compatible(tensor: Any, name: str = "tensor") -> None:
    """Raise unless ``tensor`` is a CPU float32/float64 tensor hologram can share."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(tensor).__name__}")
    check_device(tensor, name)
    if tensor.dtype not in TORCH_TO_ISA:
        raise TypeError(f"{name}: dtype {tensor.dtype} is not supported "
                        f"(supported: {', '.join(map(str, TORCH_TO_ISA))})")


def tensor_to_buffer(executor: Executor | torch.Tensor | None,
                     tensor: torch.Tensor | None = None) -> tuple[Buffer, torch.Tensor]:
    """A hologram Buffer over ``tensor``'s memory, and the tensor that memory belongs to.

    Called as ``tensor_to_buffer(exec, t)`` (the seeds' order) or ``tensor_to_buffer(t)``
    (the default executor of t's device). For a contiguous tensor the returned tensor
    is ``t`` itself and writes to the buffer show in ``t``; a strided tensor is copied
    first (DLPack shares dense blocks only) and the copy is returned. Tensors that
    require grad are detached: hologram writes are invisible to autograd.
    """
    if isinstance(executor, torch.Tensor) and tensor is None:
        executor, tensor = None, executor
    if tensor is None:
        raise TypeError("tensor_to_buffer: missing the tensor argument")
    validate_tensor_compatible(tensor)
    ex = executor if executor is not None else default_executor(tensor)
    if not isinstance(ex, Executor):
        raise TypeError(f"executor: expected a hologram Executor, got {type(ex).__name__}")
    owner = tensor.detach()
    if not owner.is_contiguous():
        owner = owner.contiguous()
    return from_dlpack(owner, ex, copy=False), owner


def buffer_to_tensor(buffer: Buffer, shape: Sequence[int] | None = None) -> torch.Tensor:
    """A torch tensor viewing ``buffer``'s memory (no copy), optionally reshaped.

    The tensor keeps the buffer's memory alive only as long as the buffer is not
    freed: freeing the buffer (or closing its executor) invalidates the tensor.
    """
    if not isinstance(buffer, Buffer):
        raise TypeError(f"buffer: expected a hologram Buffer, got {type(buffer).__name__}")
    t = torch.from_dlpack(buffer)
    if shape is not None:
        t = t.view(tuple(int(s) for s in shape))
    return t
