"""The one interface the CUDA backend talks to a device through, and how one is chosen.

Why an interface this small: no GPU is lent to the project's CI, so everything
that can be decided without one (launch planning, argument packing, memory
pools, GEMM layout, stream ordering, the disk cache) lives in the shared backend
(``backends/cuda.py``) and runs on every CI machine against the *emulated*
device (``cuda_emulated.py``: the same CUDA C compiled by the host C++ compiler,
each CUDA thread a fiber). The real device (``cuda_cupy.py``) implements the same
few calls on CuPy and decides nothing, so the code that has not run on NVIDIA
hardware is as little as possible.

Addresses are plain integers (device pointers; on the emulated device, host
addresses). A device may be asynchronous: work on one stream runs in order, and
only ``copy_d2h`` and ``synchronize`` wait.
"""

from __future__ import annotations

import ctypes.util
import os
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..errors import BackendUnavailableError, HologramError

#: The environment variable choosing the device: 'emulated', or unset/'gpu' for the GPU.
DEVICE_ENV = "HOLOGRAM_CUDA_DEVICE"
_KINDS = ("gpu", "emulated")

NO_DRIVER = ("no NVIDIA driver (libcuda not found); set HOLOGRAM_CUDA_DEVICE=emulated to run "
             "the CUDA backend on the emulated device (CPU, for tests and debugging)")


class CudaDeviceError(HologramError, RuntimeError):
    """The device refused a call (a kernel fault, a barrier some threads never reach)."""


@dataclass(frozen=True)
class DeviceProperties:
    """What launch planning needs to know about a device."""

    name: str
    arch: str  # 'sm_90'; 'host' on the emulated device
    multiprocessors: int
    max_threads_per_block: int
    warp_size: int = 32
    emulated: bool = False


@dataclass(frozen=True)
class Allocation:
    """One device allocation: its address and size (``owner`` keeps it alive)."""

    ptr: int
    nbytes: int
    owner: Any = None


class CudaDevice(Protocol):
    """Memory, modules, launches, GEMM, streams: all the backend asks of a device."""

    properties: DeviceProperties

    # --- memory ---------------------------------------------------------------------
    def alloc(self, nbytes: int) -> Allocation:
        """``nbytes`` of device memory (zero-filled); MemoryError when there is none."""

    def free(self, allocation: Allocation) -> None:
        """Give ``allocation`` back (after work queued on it has finished)."""

    def copy_h2d(self, dst: int, src: np.ndarray, stream: Any = None) -> None:
        """Copy the contiguous host array ``src`` to device address ``dst``."""

    def copy_d2h(self, dst: np.ndarray, src: int, stream: Any = None) -> None:
        """Copy into the contiguous host array ``dst``; waits for ``stream``'s work."""

    def copy_d2d(self, dst: int, src: int, nbytes: int, stream: Any = None) -> None:
        """Copy ``nbytes`` between device addresses (ranges may overlap)."""

    def memset(self, dst: int, value: int, nbytes: int, stream: Any = None) -> None:
        """Set ``nbytes`` bytes at ``dst`` to ``value``."""

    # --- code -----------------------------------------------------------------------
    def compile(self, source: str, key: dict[str, str]) -> Any:
        """A module from CUDA C ``source`` (cached on disk; ``key`` names the program)."""

    def function(self, module: Any, name: str) -> Any:
        """The kernel ``name`` of ``module``."""

    def global_address(self, module: Any, name: str) -> int:
        """The device address of the ``__device__`` variable ``name`` of ``module``."""

    def launch(self, kernel: Any, grid: tuple[int, int, int], block: tuple[int, int, int],
               shared_bytes: int, args: bytes, stream: Any = None) -> None:
        """Launch ``kernel``; ``args`` is its one parameter's bytes (``HgArgs``)."""

    # --- libraries ------------------------------------------------------------------
    def gemm_strided_batched(self, dtype: str, trans_a: bool, trans_b: bool, m: int, n: int,
                             k: int, a: int, lda: int, stride_a: int, b: int, ldb: int,
                             stride_b: int, c: int, ldc: int, stride_c: int, batch: int,
                             stream: Any = None, tf32: bool = False) -> None:
        """cuBLAS's column-major ``C[i] = op(A[i]) @ op(B[i])`` (alpha 1, beta 0) for
        ``i < batch``; addresses and strides in elements of ``dtype``."""

    def export_dlpack(self, ptr: int, nbytes: int, dtype: np.dtype, shape: tuple[int, ...],
                      owner: Any, stream: Any, consumer_stream: Any) -> Any:
        """A DLPack capsule of the C-contiguous device array at ``ptr`` (kept alive by
        ``owner``); the consumer's stream waits for the work queued on ``stream``. Only a
        GPU exports device memory (the emulated device's buffers export host copies)."""

    # --- ordering -------------------------------------------------------------------
    def stream(self) -> Any:
        """A new stream (work on it runs in order)."""

    def stream_handle(self, stream: Any) -> int:
        """``stream`` as the int DLPack's ``__dlpack__(stream=...)`` takes."""

    def external_stream(self, handle: int) -> Any:
        """The stream ``handle`` (a ``cudaStream_t`` another library made, as an int) as a
        stream of this device; it stays its owner's."""

    def event(self) -> Any:
        """A new event, to record on one stream and wait for on another."""

    def record(self, event: Any, stream: Any = None) -> None: ...

    def wait(self, stream: Any, event: Any) -> None:
        """Make ``stream``'s later work wait until ``event`` has happened."""

    def synchronize(self, stream: Any = None) -> None:
        """Wait for ``stream``'s work (all work when None)."""

    def cache_key(self) -> dict[str, str]:
        """What decides a compiled module besides the source (architecture, versions)."""


def requested_kind() -> str:
    """The device ``HOLOGRAM_CUDA_DEVICE`` asks for: 'gpu' (the default) or 'emulated'."""
    value = os.environ.get(DEVICE_ENV, "").strip().lower() or "gpu"
    if value not in _KINDS:
        raise BackendUnavailableError(
            f"{DEVICE_ENV}: expected one of {', '.join(map(repr, _KINDS))} (or unset), got "
            f"{os.environ.get(DEVICE_ENV)!r}")
    return value


def emulated_requested() -> bool:
    try:
        return requested_kind() == "emulated"
    except BackendUnavailableError:
        return False


def why_unavailable() -> str | None:
    """None when ``Executor(backend='cuda')`` can run here, else why not."""
    try:
        kind = requested_kind()
    except BackendUnavailableError as e:
        return str(e)
    if kind == "emulated":
        from .cuda_emulated import problem

        return problem()
    if ctypes.util.find_library("cuda") is None:
        return NO_DRIVER
    from .cuda_cupy import problem as gpu_problem

    return gpu_problem()


_DEVICES: dict[str, CudaDevice] = {}


def open_device() -> CudaDevice:
    """The process's device of the requested kind (one per process, shared)."""
    kind = requested_kind()
    dev = _DEVICES.get(kind)
    if dev is None:
        reason = why_unavailable()
        if reason is not None:
            raise BackendUnavailableError(f"backend 'cuda' is not available: {reason}")
        if kind == "emulated":
            from .cuda_emulated import EmulatedDevice

            dev = EmulatedDevice()
        else:
            from .cuda_cupy import CupyDevice

            dev = CupyDevice()
        _DEVICES[kind] = dev
    return dev
