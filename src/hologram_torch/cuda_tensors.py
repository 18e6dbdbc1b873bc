"""``torch.cuda`` tensors in and out of a cuda executor's programs, without host copies.

Why: under ``torch.compile(backend="hologram", options={"executor": "cuda"})`` on a GPU
the graph's tensors live in device memory, where the host-array path of the region
runner (``t.numpy()``) cannot reach. Each input is imported zero-copy through DLPack
(``hologram.from_dlpack``: the kDLCUDA import of ``backends/cuda_dlpack.py``, which
hands PyTorch our stream so its pending writes come first), and each output is a
tensor PyTorch's caching allocator hands out on the input's device, imported the same
way, so the kernels write straight into it; the launch goes on PyTorch's current stream
(``streams.launch_stream``), the order PyTorch's allocator assumes.

Everything here runs in CPU-only CI against the emulated device, with stand-ins for
CUDA tensors (host memory exporting kDLCUDA capsules) and for the allocator
(``empty``, the one place a CUDA tensor is made); a real GPU must still confirm it
(README).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from hologram.interop import from_dlpack
from hologram.isa.dtypes import DType


def cuda_device(tensors: Iterable[Any]) -> Any:
    """The device of the first CUDA tensor among ``tensors``; None when none is one
    (then the runner takes its host path)."""
    for t in tensors:
        if getattr(t, "is_cuda", False) is True:
            return t.device
    return None


def empty(shape: tuple[int, ...], dtype: torch.dtype, device: Any) -> torch.Tensor:
    """An output tensor from PyTorch's caching allocator on ``device``."""
    return torch.empty(shape, dtype=dtype, device=device)


def _torch_dtype(d: DType) -> torch.dtype:
    return torch.from_numpy(np.empty(0, d.np_dtype)).dtype


def device_array(t: Any, ex: Any, shape: tuple[int, ...], d: DType,
                 order: tuple[int, ...] | None = None, convert: bool = False) -> Any:
    """``t``'s device memory as a window of ``ex``'s device memory, shaped ``shape``
    (the program's operand), shared through DLPack: no copy, unless the tensor must be
    laid out (``order``: the traced permutation; a non-contiguous tensor) or converted
    (``convert``: bool/int tensors the program reads as f32/f64), which PyTorch does on
    the device. The window keeps the tensor alive (its DLPack capsule's owner)."""
    if t.requires_grad:
        t = t.detach()
    if order is not None:
        t = t.permute(order)
    if convert:
        t = t.to(_torch_dtype(d))
    if not t.is_contiguous():
        t = t.contiguous()
    buf = from_dlpack(t, ex)
    if buf.isa_dtype is not d:
        raise RuntimeError(f"hologram_torch: planned for {d}, got a {buf.isa_dtype} tensor")
    a = buf.view()
    if tuple(a.shape) != tuple(shape):
        if a.size != int(np.prod(shape, dtype=np.int64)):
            raise RuntimeError(f"hologram_torch: planned for shape {list(shape)}, got "
                               f"{list(a.shape)}")
        a = a.reshape(shape)
    return a


__all__ = ["cuda_device", "device_array", "empty"]
