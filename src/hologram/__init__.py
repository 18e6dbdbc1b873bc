"""hologram: a compute runtime for Python.

Arrays come in (NumPy, PyTorch, DLPack); each request becomes an Atlas ISA
program that is canonicalized, compiled for the chosen backend, cached and run
in place on the caller's memory.

    import hologram as hg
    with hg.Executor() as ex:
        a, b, c = (ex.allocate(1024) for _ in range(3))
        a.from_numpy(x); b.from_numpy(y)
        hg.ops.vector_add(ex, a, b, c)
        c.to_numpy()
"""

__version__ = "0.2.0"

from . import backend, errors, isa, numpy, ops  # noqa: E402  (numpy: the Array API namespace)
from .backend import BackendType, validate_backend  # noqa: E402
from .backends.registry import (  # noqa: E402
    available_backends,
    get_default_backend,
    is_cuda_available,
    is_metal_available,
)
from .buffer import Buffer  # noqa: E402
from .errors import (  # noqa: E402
    BackendUnavailableError,
    HologramError,
    OutOfMemoryError,
    VerifyError,
)
from .executor import Executor  # noqa: E402
from .interop import default_executor, from_dlpack  # noqa: E402
from .isa import Program  # noqa: E402
from .jit import explain, jit  # noqa: E402
from .memory.output_cache import empty_cache, output_cache  # noqa: E402
from .threads import get_num_threads, set_num_threads, set_threading  # noqa: E402

__all__ = [
    "BackendType", "BackendUnavailableError", "Buffer", "Executor", "HologramError",
    "OutOfMemoryError",
    "Program", "VerifyError", "__version__", "available_backends", "backend",
    "default_executor", "empty_cache", "errors", "explain", "from_dlpack",
    "get_default_backend", "get_num_threads", "is_cuda_available", "is_metal_available",
    "isa", "jit", "numpy", "ops", "output_cache", "set_num_threads", "set_threading",
    "validate_backend",
]
