"""The emulated CUDA device: every CUDA kernel hologram renders, run on the CPU.

Chosen only by ``HOLOGRAM_CUDA_DEVICE=emulated`` (never by ``'auto'``, never shown
as a GPU): it exists so that CI without a GPU executes the CUDA backend's kernels
and logic, and so that anyone can debug a kernel on a laptop.

* Code: the same CUDA C source NVRTC compiles, between the host prelude and
  launcher of ``compiler/cuda_host.py``, built by the host C++ compiler and cached
  on disk through the CPU backend's kernel cache (its own key kind).
* Launch: blocks one after another, each block's threads as fibers, so
  ``__syncthreads`` and warp operations truly hold; ``order`` picks the thread and
  block order (forward, reverse, shuffled) and ``seed`` the shuffle, so tests can
  show a kernel's result does not depend on the order. A barrier some threads never
  reach raises :class:`CudaDeviceError` naming the kernel.
* Memory: host memory stands in for device memory (device addresses are host
  addresses); cuBLAS is NumPy's matmul on strided views of it.
* Streams and events exist and order nothing: every call finishes before it returns.

Launches are serialised by one lock (a module's fiber state and its ``__shared__``
arrays are process-wide statics).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import shutil
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..compiler.cuda_host import MAX_THREADS, STACK_BYTES, HostCudaCompiler, host_source
from ..memory.boundary import aligned_empty
from .cuda_device import Allocation, CudaDeviceError, DeviceProperties

ORDERS = {"forward": 0, "reverse": 1, "shuffled": 2}
#: GEMM dtype -> (the element as NumPy sees it, to float32, from float32 rounded to
#: nearest even): f16 and bf16 products are computed in float32, as cuBLAS's
#: CUBLAS_COMPUTE_32F does, and rounded once (bf16 as raw bits: no ml_dtypes needed).
_GEMM: dict[str, tuple[Any, Any, Any]] = {
    "f32": (np.float32, None, None),
    "f64": (np.float64, None, None),
    "f16": (np.float16, lambda a: a.astype(np.float32), lambda a: a.astype(np.float16)),
    "bf16": (np.uint16, lambda a: (a.astype(np.uint32) << 16).view(np.float32),
             lambda a: _bf16_bits(a)),
}


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 ``x`` rounded to bfloat16, nearest even, as raw bits (NaN stays NaN)."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & 1)) >> 16
    return np.where(np.isnan(x), (bits >> 16) | 0x40, rounded).astype(np.uint16)


def _compiler_command() -> list[str] | None:
    cxx = os.environ.get("CXX")
    if cxx:
        return cxx.split()
    for name in ("g++", "c++", "clang++"):
        path = shutil.which(name)
        if path:
            return [path]
    return None


def problem() -> str | None:
    """None when the emulated device can run here, else why not."""
    if _compiler_command() is None:
        return "the emulated CUDA device needs a C++ compiler (set CXX or install g++)"
    if os.name != "posix":
        return "the emulated CUDA device needs POSIX ucontext fibers"
    return None


@dataclass
class EmulatedModule:
    lib: Any
    launcher: Any


@dataclass
class EmulatedKernel:
    module: EmulatedModule
    name: str
    address: int


class _Stream:
    """A stream on a device where everything finishes at once: it only has a name (and,
    for an external one, the handle it was made from)."""

    def __init__(self, handle: int | None = None) -> None:
        self.handle = handle

    def __repr__(self) -> str:
        return ("<emulated stream>" if self.handle is None else
                f"<emulated external stream {self.handle:#x}>")


class EmulatedDevice:
    """The ``CudaDevice`` interface (``backends/cuda_device.py``) on the host CPU."""

    def __init__(self) -> None:
        cmd = _compiler_command()
        assert cmd is not None  # problem() was checked by open_device
        self.compiler = HostCudaCompiler(cmd)
        self.properties = DeviceProperties(
            name=f"emulated CUDA device on the host CPU ({self.compiler.version})",
            arch="host", multiprocessors=max(1, min(4, os.cpu_count() or 1)),
            max_threads_per_block=MAX_THREADS, emulated=True)
        self.order = "forward"
        self.seed = 0
        self.lock = threading.RLock()
        self._stacks: mmap.mmap | None = None
        self._stack_addr = 0
        self.launches = 0
        self.allocations = 0  # device allocations made (tests count them per call)

    # --- memory ---------------------------------------------------------------------
    def alloc(self, nbytes: int) -> Allocation:
        raw = aligned_empty(max(int(nbytes), 1), 256)
        raw.fill(0)
        self.allocations += 1
        return Allocation(raw.ctypes.data, int(nbytes), raw)

    def free(self, allocation: Allocation) -> None:
        """Host memory goes when the allocation's owner does."""

    def copy_h2d(self, dst: int, src: np.ndarray, stream: Any = None) -> None:
        if src.nbytes:
            ctypes.memmove(dst, np.ascontiguousarray(src).ctypes.data, src.nbytes)

    def copy_d2h(self, dst: np.ndarray, src: int, stream: Any = None) -> None:
        if not dst.flags.c_contiguous:
            raise ValueError("dst: copy_d2h needs a C-contiguous host array")
        if dst.nbytes:
            ctypes.memmove(dst.ctypes.data, src, dst.nbytes)

    def copy_d2d(self, dst: int, src: int, nbytes: int, stream: Any = None) -> None:
        if nbytes:
            ctypes.memmove(dst, src, nbytes)

    def memset(self, dst: int, value: int, nbytes: int, stream: Any = None) -> None:
        if nbytes:
            ctypes.memset(dst, value, nbytes)

    # --- code -----------------------------------------------------------------------
    def cache_key(self) -> dict[str, str]:
        return {"device": "emulated", "arch": "host"}

    def compile(self, source: str, key: dict[str, str]) -> EmulatedModule:
        lib = self.compiler.compile(host_source(source), {**key, **self.cache_key()})
        launcher = lib.hg_emu_launch
        launcher.restype = ctypes.c_int
        launcher.argtypes = [ctypes.c_void_p, ctypes.c_void_p, *[ctypes.c_uint] * 6,
                             ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_ulonglong]
        lib.hg_emu_error.restype = ctypes.c_char_p
        return EmulatedModule(lib, launcher)

    def function(self, module: EmulatedModule, name: str) -> EmulatedKernel:
        try:
            fn = module.lib[name]
        except AttributeError:
            raise CudaDeviceError(f"kernel {name!r} is not in the module") from None
        return EmulatedKernel(module, name, ctypes.cast(fn, ctypes.c_void_p).value or 0)

    def global_address(self, module: EmulatedModule, name: str) -> int:
        try:
            return ctypes.addressof(ctypes.c_char.in_dll(module.lib, name))
        except ValueError:
            raise CudaDeviceError(f"__device__ variable {name!r} is not in the module") from None

    def _stack_area(self, threads: int) -> int:
        need = threads * STACK_BYTES
        if self._stacks is None or len(self._stacks) < need:
            if self._stacks is not None:
                self._stacks.close()
            self._stacks = mmap.mmap(-1, max(need, 256 * STACK_BYTES))
            self._stack_addr = ctypes.addressof(ctypes.c_char.from_buffer(self._stacks))
        return self._stack_addr

    def launch(self, kernel: EmulatedKernel, grid: tuple[int, int, int],
               block: tuple[int, int, int], shared_bytes: int, args: bytes,
               stream: Any = None) -> None:
        """Run ``kernel`` to its end. ``shared_bytes`` must be 0: hologram's kernels
        declare their shared memory statically."""
        threads = block[0] * block[1] * block[2]
        if not 1 <= threads <= MAX_THREADS or min(block) < 1 or min(grid) < 1:
            raise CudaDeviceError(f"launch of {kernel.name}: block {block} / grid {grid} out "
                                  f"of range (1 to {MAX_THREADS} threads per block)")
        if shared_bytes:
            raise CudaDeviceError(f"launch of {kernel.name}: dynamic shared memory is not "
                                  "emulated")
        if self.order not in ORDERS:
            raise ValueError(f"order: expected one of {', '.join(ORDERS)}, got {self.order!r}")
        argbuf = ctypes.create_string_buffer(bytes(args), len(args))
        with self.lock:
            stacks = self._stack_area(threads)
            rc = kernel.module.launcher(kernel.address, argbuf, *grid, *block, stacks,
                                        STACK_BYTES, ORDERS[self.order], self.seed)
            self.launches += 1
            if rc:
                msg = kernel.module.lib.hg_emu_error().decode(errors="replace")
                raise CudaDeviceError(
                    f"kernel {kernel.name} (grid {grid}, block {block}, {self.order} thread "
                    f"order): {msg}")

    # --- libraries ------------------------------------------------------------------
    def gemm_strided_batched(self, dtype: str, trans_a: bool, trans_b: bool, m: int, n: int,
                             k: int, a: int, lda: int, stride_a: int, b: int, ldb: int,
                             stride_b: int, c: int, ldc: int, stride_c: int, batch: int,
                             stream: Any = None, tf32: bool = False) -> None:
        """cuBLAS's column-major strided-batched GEMM as NumPy matmul on strided views;
        with ``tf32`` the inputs are first rounded to tf32 (10 mantissa bits), as tensor
        cores read them."""
        raw, widen, narrow = _GEMM[dtype]
        t = np.dtype(raw)
        A = _colmajor(a, t, batch, stride_a, *((k, m) if trans_a else (m, k)), lda)  # noqa: N806
        B = _colmajor(b, t, batch, stride_b, *((n, k) if trans_b else (k, n)), ldb)  # noqa: N806
        if tf32 and dtype == "f32":
            A, B = _tf32(A), _tf32(B)  # noqa: N806
        C = _colmajor(c, t, batch, stride_c, m, n, ldc)  # noqa: N806
        if widen is not None:
            A, B = widen(A), widen(B)  # noqa: N806
        product = np.matmul(A.swapaxes(1, 2) if trans_a else A,
                            B.swapaxes(1, 2) if trans_b else B, out=None if narrow else C)
        if narrow is not None:
            C[...] = narrow(product)

    # --- ordering -------------------------------------------------------------------
    def stream(self) -> _Stream:
        return _Stream()

    def external_stream(self, handle: int) -> _Stream:
        return _Stream(handle)

    def stream_handle(self, stream: _Stream) -> int:
        """An external stream's handle, else a name unique while the stream lives."""
        return stream.handle if stream.handle is not None else id(stream)

    def event(self) -> object:
        return object()

    def record(self, event: Any, stream: Any = None) -> None:
        """Everything before the event has already happened."""

    def wait(self, stream: Any, event: Any) -> None:
        """The event has already happened."""

    def synchronize(self, stream: Any = None) -> None:
        """Every call finished before it returned."""


def _tf32(x: np.ndarray) -> np.ndarray:
    """A copy of float32 ``x`` rounded to tf32 (nearest, ties away from zero; NaN kept)."""
    bits = np.ascontiguousarray(x).view(np.uint32)
    rounded = ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)
    return np.where(np.isnan(x), x, rounded)


def _colmajor(ptr: int, t: np.dtype, batch: int, stride: int, rows: int, cols: int,
              ld: int) -> np.ndarray:
    """``[batch, rows, cols]`` view of column-major matrices at ``ptr`` (element [b, i, j]
    at ``ptr + (b * stride + i + j * ld) * itemsize``)."""
    extent = (batch - 1) * stride + (cols - 1) * ld + rows
    flat = np.ctypeslib.as_array((ctypes.c_char * (extent * t.itemsize)).from_address(ptr))
    base = flat.view(t)
    s = t.itemsize
    return np.lib.stride_tricks.as_strided(base, (batch, rows, cols), (stride * s, s, ld * s))
