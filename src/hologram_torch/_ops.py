"""The one path from torch tensors to a hologram launch.

Every op in ``hologram_torch`` (forward and backward) is an Atlas ISA program
built from ``Var`` expressions. ``run`` builds that program once per key (op
name, parameters, input dtypes and shapes), views the inputs through DLPack
(zero-copy for contiguous tensors), allocates the outputs with torch and hands
their NumPy views to the executor, which writes the results in place. Keeping
this in one function means device checks, dtype checks and the program cache
are written once, not once per op.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from hologram.executor import Executor
from hologram.interop import default_executor
from hologram.isa.builder import program as build_program
from hologram.isa.dtypes import DType
from hologram.isa.dtypes import f32 as _F32
from hologram.isa.dtypes import f64 as _F64
from hologram.isa.program import Program

#: torch dtypes hologram executors run today, and their Atlas ISA names.
TORCH_TO_ISA: dict[torch.dtype, DType] = {torch.float32: _F32, torch.float64: _F64}
ISA_TO_TORCH: dict[DType, torch.dtype] = {v: k for k, v in TORCH_TO_ISA.items()}

CUDA_MESSAGE = (
    "hologram_torch: CUDA tensors are not supported yet; hologram's CUDA backend cannot "
    "run on torch's CUDA memory from here. Move the tensors to the CPU (tensor.cpu()) "
    "or use torch's own ops on the GPU."
)

_PROGRAMS: dict[tuple, Program] = {}
_LOCK = threading.Lock()


def freeze(key: Any) -> Any:
    """A hashable cache key in which 0.0 and -0.0 (and NaN) stay distinct.

    Python's ``0.0 == -0.0`` would otherwise let two programs with different
    constants share one cache slot.
    """
    if isinstance(key, float):
        return ("float", key.hex())
    if isinstance(key, (tuple, list)):
        return tuple(freeze(k) for k in key)
    return key


def check_dtype(t: torch.Tensor, name: str) -> DType:
    """The ISA dtype of a floating-point tensor; a clear TypeError for the rest."""
    d = TORCH_TO_ISA.get(t.dtype)
    if d is None:
        names = ", ".join(str(x) for x in TORCH_TO_ISA)
        raise TypeError(f"hologram_torch: {name} has dtype {t.dtype}; supported dtypes are "
                        f"{names}")
    return d


def check_device(t: torch.Tensor, name: str = "input") -> None:
    """Only host tensors can be shared with the CPU backends without a copy."""
    if t.device.type == "cuda":
        raise NotImplementedError(CUDA_MESSAGE)
    if t.device.type not in ("cpu", "meta"):
        raise NotImplementedError(
            f"hologram_torch: {name} is on device {t.device}; only CPU tensors are supported")


def executor_for(backend: str, device: torch.device | str = "cpu") -> Executor:
    """The shared executor that runs ``backend`` ('' means the device's default).

    Torch owns the memory of every tensor here, so an executor contributes only
    its backend (and its compiled-kernel cache); one shared executor per backend
    keeps that cache warm across calls.
    """
    dev = torch.device(device)
    if dev.type == "cuda":
        raise NotImplementedError(CUDA_MESSAGE)
    ex = default_executor(backend or "cpu")
    if ex.backend.device_type != "cpu":
        raise NotImplementedError(
            f"hologram_torch: backend {ex.backend_name!r} computes on {ex.backend.device_type} "
            "memory; torch CPU tensors need a host backend ('cpu' or 'reference')")
    return ex


def as_array(t: torch.Tensor) -> np.ndarray:
    """A NumPy view of ``t`` (a contiguous copy first if it is strided)."""
    return np.from_dlpack(t.detach().contiguous())


def get_program(key: tuple, fn: Callable[..., Any],
                specs: Sequence[tuple[DType, tuple[int, ...]]]) -> Program:
    """The program for ``key`` over inputs ``specs``, built from ``fn`` the first time."""
    full = freeze((key, tuple((d.name, tuple(s)) for d, s in specs)))
    p = _PROGRAMS.get(full)
    if p is None:
        with _LOCK:
            p = _PROGRAMS.get(full)
            if p is None:
                p = build_program(fn, specs, name="hologram_torch." + str(key[0]))
                _PROGRAMS[full] = p
    return p


def run(key: tuple, fn: Callable[..., Any], inputs: Sequence[torch.Tensor],
        backend: str = "") -> list[torch.Tensor]:
    """Run the program ``fn`` (over one ``Var`` per input) on ``inputs``; return its outputs.

    ``key`` names the program together with the inputs' dtypes and shapes, so it
    must contain every parameter ``fn`` closes over. Inputs must be CPU f32/f64
    tensors; strided ones are made contiguous, contiguous ones are shared.
    """
    specs = []
    for i, t in enumerate(inputs):
        check_device(t, f"input {i}")
        specs.append((check_dtype(t, f"input {i}"), tuple(t.shape)))
    ex = executor_for(backend)
    p = get_program(key, fn, specs)
    arrays = [as_array(t) for t in inputs]
    outs = [torch.empty(s, dtype=ISA_TO_TORCH[d]) for d, s in p.output_specs]
    if all(o.numel() == 0 for o in outs):
        return outs  # nothing to compute: skip compiling a kernel that would write nothing
    ex.launch(p, arrays, [o.numpy() for o in outs], fresh_outputs=True)
    return outs


def program_for(key: tuple, fn: Callable[..., Any], inputs: Sequence[torch.Tensor]) -> Program:
    """The program ``run`` would launch for these inputs (for inspection and tests)."""
    specs = [(check_dtype(t, f"input {i}"), tuple(t.shape)) for i, t in enumerate(inputs)]
    return get_program(key, fn, specs)


def cached_programs() -> int:
    """How many distinct programs have been built (tests check shape sharing with it)."""
    return len(_PROGRAMS)
