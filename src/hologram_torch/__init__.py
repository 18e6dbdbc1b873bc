"""hologram_torch: PyTorch ops, modules and autograd computed by hologram programs.

    import hologram_torch as hg
    y = hg.functional.gelu(x)                 # or hg.functional.gelu(exec, x)
    layer = hg.nn.Linear(128, 64)             # a torch.nn.Linear whose forward is hologram

Ops are ``torch.library`` custom ops (``torch.ops.hologram.*``) with fake
implementations and registered backwards, so they train in eager mode and
compile under ``torch.compile(fullgraph=True)`` without graph breaks.
"""

from hologram import threads as _threads

from . import functional, nn, utils
from .compile_backend import hologram_backend
from .explain import explain
from .utils import (
    buffer_to_tensor,
    create_executor_for_tensor,
    default_executor,
    tensor_to_buffer,
    validate_tensor_compatible,
)

__all__ = [
    "buffer_to_tensor",
    "explain",
    "hologram_backend",
    "create_executor_for_tensor",
    "default_executor",
    "functional",
    "nn",
    "tensor_to_buffer",
    "utils",
    "validate_tensor_compatible",
]

# PyTorch is loaded now: kernels loaded before move to its OpenMP threads
# (hologram.threads.threading says why).
_threads.rebind()
