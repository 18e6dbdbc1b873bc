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


def _prewarm_runtime() -> None:
    """Build hologram's runtime libraries (GEMM driver, MKL's shim, thread team, attention
    driver) on one background thread now, where the kernel cache does not hold them yet:
    a model's first ``torch.compile`` call then finds them built by the core dynamo's
    tracing left idle (``hologram.compiler.prewarm``). Cached libraries cost a lookup
    each. ``HOLOGRAM_PREWARM=0`` turns it off."""
    import os

    if os.environ.get("HOLOGRAM_PREWARM", "").strip().lower() in ("0", "false", "no", "off"):
        return
    from hologram.compiler import prewarm
    from hologram.compiler.cc import CCompiler

    prewarm.start_in_order(CCompiler.find)


_prewarm_runtime()
