"""Which backends exist, which can run here, and why the others cannot.

Each backend has a probe (returns None when it can run, else the reason) and a
factory; 'auto' takes the first available in PREFERENCE order. Nothing is probed
on import, so ``import hologram`` stays fast and NumPy-only; the WebGPU probe
requests an adapter (about a second) once per process, when first asked.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import BackendUnavailableError
from .base import Backend


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _probe_cuda() -> str | None:
    # HOLOGRAM_CUDA_DEVICE=emulated: the emulated device (CPU), else a GPU with a driver.
    from .cuda_device import why_unavailable as cuda_problem

    return cuda_problem()


def _auto_cuda() -> bool:
    """'auto' never picks the emulated device: it is no GPU, and slower than the CPU."""
    from .cuda_device import emulated_requested

    return not emulated_requested()


def _probe_webgpu() -> str | None:
    # Cheap checks first; the adapter request (about a second on lavapipe) runs once
    # per process and only when a WebGPU backend is asked about, never on import.
    if not _has_module("wgpu"):
        return "wgpu is not installed (pip install 'hologram[webgpu]')"
    if not _has_module("hologram.backends.webgpu"):
        return "the WebGPU backend is not part of this build yet"
    from . import webgpu

    return webgpu.adapter_problem()


def _probe_metal() -> str | None:
    if sys.platform != "darwin":
        return f"Metal needs macOS (this is {sys.platform})"
    if not _has_module("wgpu"):
        return "wgpu is not installed (pip install 'hologram[webgpu]')"
    from . import webgpu

    return webgpu.metal_problem()


def _probe_always() -> str | None:
    return None


@dataclass(frozen=True)
class BackendInfo:
    name: str
    probe: Callable[[], str | None]
    factory: str  # "module:Class", imported only when the backend is created
    summary: str


REGISTRY: dict[str, BackendInfo] = {
    info.name: info
    for info in (
        BackendInfo("cuda", _probe_cuda, "hologram.backends.cuda:CudaBackend",
                    "NVIDIA GPUs: CUDA C through NVRTC, cuBLAS"),
        BackendInfo("metal", _probe_metal, "hologram.backends.webgpu:MetalBackend",
                    "Apple GPUs: WebGPU on a Metal adapter"),
        BackendInfo("webgpu", _probe_webgpu, "hologram.backends.webgpu:WebGPUBackend",
                    "WebGPU (Vulkan, Metal, D3D12) through wgpu"),
        BackendInfo("cpu", _probe_always, "hologram.backends.cpu:CPUBackend",
                    "the host CPU"),
        BackendInfo("reference", _probe_always, "hologram.backends.reference:ReferenceBackend",
                    "NumPy interpreter of the ISA: slow, always correct, the test oracle"),
    )
}
# 'auto' order. WebGPU/Metal are chosen only by name: their buffers are host memory
# copied in and out on every launch, which is slower than the cpu backend.
PREFERENCE: tuple[str, ...] = ("cuda", "cpu")


def why_unavailable(name: str) -> str | None:
    """None if backend ``name`` can run here, else the reason it cannot."""
    if name not in REGISTRY:
        raise BackendUnavailableError(
            f"backend: unknown backend {name!r} (expected 'auto' or one of "
            f"{', '.join(map(repr, REGISTRY))})"
        )
    return REGISTRY[name].probe()


def available_backends() -> list[str]:
    return [n for n in REGISTRY if why_unavailable(n) is None]


def is_cuda_available() -> bool:
    return why_unavailable("cuda") is None


def is_metal_available() -> bool:
    return why_unavailable("metal") is None


def get_default_backend() -> str:
    """The backend 'auto' picks: the first available in PREFERENCE order."""
    for name in PREFERENCE:
        if name == "cuda" and not _auto_cuda():
            continue
        if why_unavailable(name) is None:
            return name
    return "reference"  # pragma: no cover - cpu is always available


def create(name: str) -> Backend:
    """Instantiate backend ``name`` ('auto' resolves first); raise with the reason if absent."""
    if not isinstance(name, str):
        raise BackendUnavailableError(f"backend: expected a string, got {type(name).__name__}")
    name = str(getattr(name, "value", name)).lower()  # a BackendType is its value
    if name == "auto":
        name = get_default_backend()
    reason = why_unavailable(name)
    if reason is not None:
        raise BackendUnavailableError(f"backend {name!r} is not available: {reason}")
    module, cls = REGISTRY[name].factory.split(":")
    return getattr(importlib.import_module(module), cls)()
