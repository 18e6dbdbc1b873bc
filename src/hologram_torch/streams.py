"""Which CUDA stream hologram's launches go on under ``torch.compile``: PyTorch's.

Why: PyTorch orders a CUDA tensor's work on the device's *current stream* (its caching
allocator reuses a freed tensor's memory for work queued on that stream). A kernel
hologram queued on a stream of its own could still be reading a tensor PyTorch
already considers free, or run before the kernel that wrote its input. Launching on
PyTorch's current stream (``Executor.use_stream``, which also orders that stream
against the executor's own) keeps the one order PyTorch assumes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


def launch_stream(tensors: Iterable[Any]) -> int | None:
    """The handle (``cudaStream_t`` as an int) of PyTorch's current stream on the device
    of the first CUDA tensor among ``tensors``; None when none is a CUDA tensor (host
    tensors: the executor's own stream)."""
    for t in tensors:
        if getattr(t, "is_cuda", False) is True:  # tensors; other graph values have none
            return int(torch.cuda.current_stream(t.device).cuda_stream)
    return None


__all__ = ["launch_stream"]
