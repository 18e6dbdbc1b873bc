"""NVRTC through ctypes: CUDA C source to a cubin for a named GPU architecture.

NVRTC needs no GPU and no driver, so CI compiles every CUDA kernel to sm_90
(Hopper) on a CPU-only machine. We bind its small C API directly instead of
pulling in a binding package: five calls cover it. The library comes from the
``nvidia-cuda-nvrtc`` wheel (the ``hologram[cuda]`` extra) or the system.

f16 and bf16 kernels include ``cuda_fp16.h``/``cuda_bf16.h``, which NVRTC does not
find on its own: NVRTC 13.3 and later carry them (``nvrtcInstallBundledHeaders``
writes them, once, under hologram's cache directory), older ones take them from a
CUDA toolkit (``$CUDA_PATH/include``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys
from functools import lru_cache
from pathlib import Path

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


#: Headers found through header_dir(), by the include line that needs them.
HEADERS = ("cuda_fp16.h", "cuda_bf16.h")


@lru_cache(maxsize=1)
def header_dir() -> Path:
    """A directory with ``cuda_fp16.h`` and ``cuda_bf16.h`` for this NVRTC: its own
    bundled copy where it has one (written once under hologram's cache directory, by
    NVRTC version), else a CUDA toolkit's."""
    lib = library()
    install = getattr(lib, "nvrtcInstallBundledHeaders", None)  # NVRTC 13.3+
    if install is not None:
        from ..cache import cache_dir, check_directory

        root = cache_dir()
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        check_directory(root)  # headers become code: only a private directory will do
        major, minor = version()
        path = root / f"nvrtc-headers-{major}.{minor}"
        err = ctypes.c_char_p()
        rc = install(str(path).encode(), ctypes.c_uint(0), ctypes.byref(err))
        if rc == 0 and all((path / h).is_file() for h in HEADERS):
            return path
    for base in (os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if base and all((Path(base) / "include" / h).is_file() for h in HEADERS):
            return Path(base) / "include"
    raise NVRTCError("f16/bf16 kernels need cuda_fp16.h and cuda_bf16.h: this NVRTC does "
                     "not bundle them (NVRTC 13.3+ does) and no CUDA toolkit was found "
                     "(set CUDA_PATH)")


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
        if any(f"#include <{h}>" in source for h in HEADERS):
            opts.append(f"--include-path={header_dir()}")
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
