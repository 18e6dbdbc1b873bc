"""NVRTC through ctypes: CUDA C source to a cubin for a named GPU architecture.

NVRTC needs no GPU and no driver, so CI compiles every CUDA kernel to sm_90
(Hopper) on a CPU-only machine. We bind its small C API directly instead of
pulling in a binding package: five calls cover it. The library comes from the
``nvidia-cuda-nvrtc`` wheel (the ``hologram[cuda]`` extra) or the system.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys
from functools import lru_cache

from ..errors import HologramError


class NVRTCError(HologramError, RuntimeError):
    """NVRTC is missing, or a kernel did not compile (the message has the log and source)."""


def _candidates() -> list[str]:
    out = []
    for base in sys.path:
        for sub in ("nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib", "nvidia/cu12/lib"):
            out += sorted(glob.glob(os.path.join(base, sub, "libnvrtc.so*")), reverse=True)
    found = ctypes.util.find_library("nvrtc")
    if found:
        out.append(found)
    return [p for p in out if "builtins" not in p]


@lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    errors = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            errors.append(f"{path}: {e}")
            continue
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        return lib
    raise NVRTCError("NVRTC not found (pip install 'hologram[cuda]' installs nvidia-cuda-nvrtc)"
                     + ("; tried " + "; ".join(errors) if errors else ""))


def available() -> bool:
    try:
        library()
        return True
    except NVRTCError:
        return False


def version() -> tuple[int, int]:
    lib = library()
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value


def numbered(source: str) -> str:
    return "\n".join(f"{i:4d} | {ln}" for i, ln in enumerate(source.splitlines(), 1))


def compile_cubin(source: str, arch: str = "sm_90", name: str = "kernel.cu",
                  options: tuple[str, ...] = ()) -> bytes:
    """Compile ``source`` straight to a cubin for ``arch`` (no PTX: a PTX from a newer
    NVRTC would not load on an older driver)."""
    lib = library()
    prog = ctypes.c_void_p()
    _check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(),
                                       0, None, None), "nvrtcCreateProgram")
    try:
        opts = [f"--gpu-architecture={arch}", "--std=c++17", "--fmad=false", *options]
        arr = (ctypes.c_char_p * len(opts))(*(o.encode() for o in opts))
        rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
        if rc != 0:
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(prog, log)
            raise NVRTCError(
                f"NVRTC failed to compile {name} for {arch} ({' '.join(opts)}):\n"
                f"{log.value.decode(errors='replace')}\n{numbered(source)}"
            )
        size = ctypes.c_size_t()
        _check(lib, lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
        buf = ctypes.create_string_buffer(size.value)
        _check(lib, lib.nvrtcGetCUBIN(prog, buf), "nvrtcGetCUBIN")
        return buf.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _check(lib: ctypes.CDLL, rc: int, what: str) -> None:
    if rc != 0:
        raise NVRTCError(f"{what} failed: {lib.nvrtcGetErrorString(rc).decode()}")
