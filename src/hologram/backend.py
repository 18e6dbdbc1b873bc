"""``hologram.backend``: which backends exist and which can run here, as the seeds' SDK
names them (``BackendType``, ``validate_backend``, ``is_cuda_available``, ...).

The probing itself lives in ``hologram.backends.registry``; this module re-exports it
and adds the enum, so ``Executor(backend=BackendType.CUDA)`` and
``Executor(backend='cuda')`` are the same call.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from .backends.registry import (
    PREFERENCE,
    REGISTRY,
    available_backends,
    create,
    get_default_backend,
    is_cuda_available,
    is_metal_available,
    why_unavailable,
)
from .errors import ArgumentTypeError, BackendUnavailableError


class BackendType(str, Enum):
    """The backends an executor can run on (a str: ``BackendType.CUDA == 'cuda'``)."""

    CPU = "cpu"
    CUDA = "cuda"
    METAL = "metal"
    WEBGPU = "webgpu"
    REFERENCE = "reference"

    def __str__(self) -> str:
        return self.value


def validate_backend(name: Any) -> str:
    """The canonical name of backend ``name`` ('auto', a name in any case, or a
    :class:`BackendType`); raises for anything else. It checks the name, not whether the
    backend can run here (``why_unavailable`` says that)."""
    if isinstance(name, BackendType):
        return name.value
    if not isinstance(name, str):
        raise ArgumentTypeError(f"backend: expected a string or BackendType, got "
                                f"{type(name).__name__}")
    low = name.strip().lower()
    if low != "auto" and low not in REGISTRY:
        raise BackendUnavailableError(
            f"backend: unknown backend {name!r} (expected 'auto' or one of "
            f"{', '.join(repr(b.value) for b in BackendType)})")
    return low


__all__ = ["PREFERENCE", "REGISTRY", "BackendType", "available_backends", "create",
           "get_default_backend", "is_cuda_available", "is_metal_available",
           "validate_backend", "why_unavailable"]
