"""Which BLAS runs hologram's GEMMs by default on this machine: MKL or NumPy's OpenBLAS,
whichever is faster here, measured once per machine and remembered in the kernel cache.

Why measure: neither library is faster everywhere. On the AVX-512 EPYC of sessions 1-13
MKL won every model shape (single thread, 191-195 GFLOP/s against OpenBLAS's 153-155 at
128 x 768 x 768; docs/perf.md, session 9). On session 15's Zen 3 (AVX2) MKL's products
with a wide B fell to 34-47 GFLOP/s where OpenBLAS kept 55-80 (128 x 768 x 8192, 1024 x
768 x 25000), and GPT-2 at batch 8 ran 1.20x eager's speed on MKL against 1.44x on
OpenBLAS. A rule by CPU vendor or instruction set would be a guess from two machines;
a few milliseconds of measurement is not.

What is timed: what a tile of hologram's GEMM driver asks a BLAS, a single-threaded
``x @ W.T`` in float32, on ``SHAPES`` (a narrow and a wide B), both libraries
alternated, the best of ``REPEATS`` each. OpenBLAS must beat MKL by ``MARGIN`` (MKL also
packs constant weights, which OpenBLAS cannot) to be chosen. The result is written to
the kernel cache directory, keyed by the CPU and both libraries' versions, so every
later process (and every test subprocess sharing the cache) reads it instead of timing
again, and the choice, hence the rounding of every product, does not move between runs
on one machine. ``HOLOGRAM_BLAS`` overrides it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import platform
import tempfile
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..cache import CacheError, cache_key

if TYPE_CHECKING:
    from .blas import Blas

#: (M, K, N) of the timed ``x @ W.T`` products: a narrow B (a tile of a 768-wide
#: projection) and a larger one (a row tile of a 1024 x 768 x 3072 MLP product), where the
#: libraries were measured to part ways.
SHAPES = ((128, 768, 384), (512, 768, 1536))
#: Alternated timings per library and shape; the best counts (noise only adds time).
REPEATS = 3
#: OpenBLAS is chosen only when its geometric-mean speed is this much above MKL's.
MARGIN = 1.10
#: Bump when what is measured changes, so old records are not trusted.
VERSION = "1"


@dataclass(frozen=True)
class Choice:
    """The library the measurement chose, the speed ratio (OpenBLAS over MKL, geometric
    mean over SHAPES) and whether it was read from the cache rather than measured now."""

    name: str
    ratio: float
    cached: bool

    def why(self) -> str:
        where = "remembered from" if self.cached else "measured now, kept in"
        return (f"measured on this CPU: OpenBLAS at {self.ratio:.2f}x MKL's speed "
                f"(single-thread tiles), {where} the kernel cache; HOLOGRAM_BLAS overrides")


def _cpu_name() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8",
                                            errors="replace") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def measure(mkl: Blas, openblas: Blas) -> float:
    """OpenBLAS's speed over MKL's (geometric mean over SHAPES), each single-threaded."""
    from .blas import cblas_gemm

    fns = {name: cblas_gemm(b.sgemm, ctypes.c_float, b.ilp64)
           for name, b in (("mkl", mkl), ("openblas", openblas))}
    set_threads = (ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)(openblas.set_threads)
                   if openblas.set_threads else None)
    rng = np.random.default_rng(0)
    logs = []
    for m, k, n in SHAPES:
        x = rng.standard_normal((m, k), dtype=np.float32)
        w = rng.standard_normal((n, k), dtype=np.float32)
        c = np.empty((m, n), np.float32)
        best = {name: float("inf") for name in fns}
        for _ in range(REPEATS + 1):  # the first round warms caches and loads kernels
            for name, fn in fns.items():
                old = set_threads(1) if set_threads and name == "openblas" else None
                t = time.perf_counter()
                fn(101, 111, 112, m, n, k, 1.0, x.ctypes.data, k, w.ctypes.data, k, 0.0,
                   c.ctypes.data, n)  # row-major, x @ W.T
                best[name] = min(best[name], time.perf_counter() - t)
                if old is not None:
                    set_threads(old)
        logs.append(np.log(best["mkl"] / best["openblas"]))
    return float(np.exp(np.mean(logs)))


def _record_path(mkl: Blas, openblas: Blas) -> str | None:
    from .cc import KERNEL_CACHE

    try:
        d = KERNEL_CACHE.ensure_directory()
    except (CacheError, OSError):
        return None
    key = cache_key({"kind": "blas-choice", "version": VERSION, "cpu": _cpu_name(),
                     "mkl": mkl.config, "openblas": openblas.config,
                     "shapes": repr(SHAPES)}, "", ".json")
    return os.path.join(d, f"blas-choice-{key[:32]}.json")


def _read(path: str) -> float | None:
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
        with open(path, encoding="utf-8") as f:
            ratio = float(json.load(f)["openblas_over_mkl"])
        if np.isfinite(ratio) and ratio > 0:
            return ratio
    return None  # missing or damaged: measure again


def _write(path: str, ratio: float) -> None:
    with contextlib.suppress(OSError):
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"openblas_over_mkl": ratio, "cpu": _cpu_name(), "shapes": SHAPES}, f)
        os.replace(tmp, path)


def choose(mkl: Blas, openblas: Blas) -> Choice:
    """The faster library on this machine (remembered, else measured and remembered)."""
    path = _record_path(mkl, openblas)
    ratio = _read(path) if path else None
    cached = ratio is not None
    if ratio is None:
        ratio = measure(mkl, openblas)
        if path:
            _write(path, ratio)
    return Choice("openblas" if ratio >= MARGIN else "mkl", ratio, cached)
