"""The real CUDA device, on CuPy: the ``CudaDevice`` interface and nothing more.

NOT RUN ON NVIDIA HARDWARE YET: no GPU is lent to this project's CI. The backend
logic above this layer (launch planning, argument packing, GEMM layout, pools) ran on
the emulated device; this file is kept thin so that what has not run is little, and
``scripts/gpu_check.sh`` runs the CUDA tests and benchmarks on a GPU in one command.

* Memory: ``cupy.cuda.alloc`` (CuPy's memory pool); hologram's pools sit on top and
  keep their own statistics and limit, as on the CPU.
* Code: NVRTC (``compiler/nvrtc.py``) straight to a cubin for the device's own
  architecture, cached on disk with the architecture, the driver, the runtime and
  NVRTC versions in the key, so a cubin for one GPU generation is never served to
  another; loaded with ``cuModuleLoadData``.
* Launch: ``cuLaunchKernel`` with the one ``HgArgs`` parameter.
* GEMM: cuBLAS strided-batched through CuPy's bindings, on our stream.
* Streams and events: CuPy's; copies to the host wait for the stream.

CuPy is imported lazily: ``import hologram`` works with NumPy alone.
"""

from __future__ import annotations

import ctypes
import importlib.util
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from ..compiler import nvrtc
from ..compiler.cc import KERNEL_CACHE
from .cuda_device import Allocation, CudaDeviceError, DeviceProperties

_MEMCPY_H2D, _MEMCPY_D2H, _MEMCPY_D2D = 1, 2, 3  # cudaMemcpyKind
_OP_N, _OP_T = 0, 1  # cublasOperation_t
_TF32_MATH, _DEFAULT_MATH = 3, 0  # cublasMath_t
#: cudaDataType_t of the 16-bit products (cublasGemmStridedBatchedEx), computed in float.
_HALF_TYPES = {"f16": 2, "bf16": 14}  # CUDA_R_16F, CUDA_R_16BF
_COMPUTE_32F, _GEMM_DEFAULT = 68, -1  # cublasComputeType_t, cublasGemmAlgo_t


def problem() -> str | None:
    """None when CuPy can reach a GPU here, else why not."""
    if importlib.util.find_spec("cupy") is None:
        return "CuPy is not installed (pip install 'hologram[cuda]' installs cupy-cuda13x)"
    if not nvrtc.available():
        return "NVRTC is not installed (pip install 'hologram[cuda]')"
    try:
        import cupy

        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - a broken driver surfaces as various errors
        return f"CuPy cannot reach a GPU: {type(e).__name__}: {e}"
    return None if n else "the NVIDIA driver reports no GPU"


@cache
def _cupy() -> Any:
    import cupy

    return cupy


class CupyDevice:
    """GPU 0 through CuPy (see the module docstring for what has and has not run)."""

    def __init__(self) -> None:
        cp = _cupy()
        self.cp = cp
        self.rt = cp.cuda.runtime
        self.driver = cp.cuda.driver
        from cupy_backends.cuda.libs import cublas  # CuPy's own cuBLAS bindings

        self.cublas = cublas
        dev = cp.cuda.Device(0)
        attrs = dev.attributes
        cc = dev.compute_capability  # '90'
        self.properties = DeviceProperties(
            name=self.rt.getDeviceProperties(0)["name"].decode(), arch=f"sm_{cc}",
            multiprocessors=int(attrs["MultiProcessorCount"]),
            max_threads_per_block=int(attrs["MaxThreadsPerBlock"]))
        self._modules: dict[str, Any] = {}

    # --- memory ---------------------------------------------------------------------
    def alloc(self, nbytes: int) -> Allocation:
        try:
            mem = self.cp.cuda.alloc(max(int(nbytes), 1))
        except self.cp.cuda.memory.OutOfMemoryError as e:
            raise MemoryError(str(e)) from None
        self.rt.memset(mem.ptr, 0, max(int(nbytes), 1))
        return Allocation(int(mem.ptr), int(nbytes), mem)

    def free(self, allocation: Allocation) -> None:
        """CuPy frees the memory when its owner goes (stream-ordered in its pool)."""

    @staticmethod
    def _stream_ptr(stream: Any) -> int:
        return 0 if stream is None else int(stream.ptr)

    def copy_h2d(self, dst: int, src: np.ndarray, stream: Any = None) -> None:
        if src.nbytes:
            # Synchronous from pageable memory: the host array may go right after.
            self.synchronize(stream)
            self.rt.memcpy(dst, np.ascontiguousarray(src).ctypes.data, src.nbytes, _MEMCPY_H2D)

    def copy_d2h(self, dst: np.ndarray, src: int, stream: Any = None) -> None:
        if dst.nbytes:
            self.synchronize(stream)
            self.rt.memcpy(dst.ctypes.data, src, dst.nbytes, _MEMCPY_D2H)

    def copy_d2d(self, dst: int, src: int, nbytes: int, stream: Any = None) -> None:
        if nbytes:
            self.rt.memcpyAsync(dst, src, nbytes, _MEMCPY_D2D, self._stream_ptr(stream))

    def memset(self, dst: int, value: int, nbytes: int, stream: Any = None) -> None:
        if nbytes:
            self.rt.memsetAsync(dst, value, nbytes, self._stream_ptr(stream))

    # --- code -----------------------------------------------------------------------
    def cache_key(self) -> dict[str, str]:
        """A cubin is for one architecture and is loaded by one driver: both, and the
        versions that made it, are in the key."""
        major, minor = nvrtc.version()
        return {"device": "gpu", "arch": self.properties.arch,
                "driver": str(self.rt.driverGetVersion()),
                "runtime": str(self.rt.runtimeGetVersion()), "nvrtc": f"{major}.{minor}"}

    def compile(self, source: str, key: dict[str, str]) -> Any:
        parts = {**key, **self.cache_key(), "kind": "cuda-cubin"}
        arch = self.properties.arch

        def build(src: Path, out: Path) -> None:
            out.write_bytes(nvrtc.compile_cubin(source, arch))

        path = KERNEL_CACHE.get_or_build(parts, source, build, ".cubin", source_suffix=".cu")
        cached = self._modules.get(str(path))
        if cached is None:
            cached = self.driver.moduleLoadData(path.read_bytes())
            self._modules[str(path)] = cached
        return cached

    def function(self, module: Any, name: str) -> Any:
        return self.driver.moduleGetFunction(module, name)

    def global_address(self, module: Any, name: str) -> int:
        return int(self.driver.moduleGetGlobal(module, name))

    def launch(self, kernel: Any, grid: tuple[int, int, int], block: tuple[int, int, int],
               shared_bytes: int, args: bytes, stream: Any = None) -> None:
        buf = ctypes.create_string_buffer(args, len(args))
        params = (ctypes.c_void_p * 1)(ctypes.addressof(buf))
        try:
            self.driver.launchKernel(kernel, *grid, *block, shared_bytes,
                                     self._stream_ptr(stream), ctypes.addressof(params), 0)
        except self.driver.CUDADriverError as e:
            raise CudaDeviceError(f"cuLaunchKernel failed: {e}") from None

    # --- libraries ------------------------------------------------------------------
    def gemm_strided_batched(self, dtype: str, trans_a: bool, trans_b: bool, m: int, n: int,
                             k: int, a: int, lda: int, stride_a: int, b: int, ldb: int,
                             stride_b: int, c: int, ldc: int, stride_c: int, batch: int,
                             stream: Any = None, tf32: bool = False) -> None:
        cb = self.cublas
        handle = self.cp.cuda.device.get_cublas_handle()
        t = np.float64 if dtype == "f64" else np.float32  # alpha, beta: float for 16 bits
        one, zero = np.ones(1, t), np.zeros(1, t)
        ta, tb = _OP_T if trans_a else _OP_N, _OP_T if trans_b else _OP_N
        with self.cp.cuda.ExternalStream(self._stream_ptr(stream)):
            cb.setStream(handle, self._stream_ptr(stream))
            cb.setMathMode(handle, _TF32_MATH if tf32 and dtype == "f32" else _DEFAULT_MATH)
            half = _HALF_TYPES.get(dtype)
            if half is not None:
                cb.gemmStridedBatchedEx(handle, ta, tb, m, n, k, one.ctypes.data, a, half,
                                        lda, stride_a, b, half, ldb, stride_b,
                                        zero.ctypes.data, c, half, ldc, stride_c, batch,
                                        _COMPUTE_32F, _GEMM_DEFAULT)
                return
            fn = cb.dgemmStridedBatched if dtype == "f64" else cb.sgemmStridedBatched
            fn(handle, ta, tb, m, n, k, one.ctypes.data, a, lda, stride_a, b, ldb, stride_b,
               zero.ctypes.data, c, ldc, stride_c, batch)

    def export_dlpack(self, ptr: int, nbytes: int, dtype: np.dtype, shape: tuple[int, ...],
                      owner: Any, stream: Any, consumer_stream: Any) -> Any:
        """Through a CuPy array over the memory: CuPy's ``__dlpack__`` makes the
        consumer's stream wait on the current one, which is ours here."""
        cp = self.cp
        mem = cp.cuda.UnownedMemory(ptr, max(nbytes, 1), owner)
        arr = cp.ndarray(shape, dtype, cp.cuda.MemoryPointer(mem, 0))
        with cp.cuda.ExternalStream(self._stream_ptr(stream)):
            return arr.__dlpack__(stream=consumer_stream)

    # --- ordering -------------------------------------------------------------------
    def stream(self) -> Any:
        return self.cp.cuda.Stream(non_blocking=True)

    def external_stream(self, handle: int) -> Any:
        return self.cp.cuda.ExternalStream(handle)

    def stream_handle(self, stream: Any) -> int:
        return int(stream.ptr)

    def event(self) -> Any:
        return self.cp.cuda.Event(disable_timing=True)

    def record(self, event: Any, stream: Any = None) -> None:
        event.record(stream)

    def wait(self, stream: Any, event: Any) -> None:
        stream.wait_event(event)

    def synchronize(self, stream: Any = None) -> None:
        if stream is None:
            self.rt.deviceSynchronize()
        else:
            stream.synchronize()
