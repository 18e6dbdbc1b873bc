"""Which BLAS runs hologram's GEMMs by default on this machine: MKL or NumPy's OpenBLAS,
whichever is faster here, measured once per machine and remembered in the kernel cache.

Why measure: neither library is faster everywhere. On the AVX-512 EPYC of sessions 1-13
MKL won every model shape (single thread, 191-195 GFLOP/s against OpenBLAS's 153-155 at
128 x 768 x 768; docs/perf.md, session 9). On session 15's Zen 3 (AVX2) MKL's products
with a wide B fell to 34-47 GFLOP/s where OpenBLAS kept 55-80 (128 x 768 x 8192, 1024 x
768 x 25000), and GPT-2 at batch 8 ran 1.20x eager's speed on MKL against 1.44x on
OpenBLAS. A rule by CPU vendor or instruction set would be a guess from two machines;
a few milliseconds of measurement is not.

What is timed: products in float32 through hologram's GEMM driver (its tiles on
hologram's threads, each tile one single-threaded BLAS call; ``hg_gemm_on`` names the
library per call, so timing never rebinds the driver), on one library and then the
other, alternated, the median of ``REPEATS`` rounds each. Not one thread alone: alone,
the libraries ran ResNet-18's convolution products within 3-5% of each other; on two
threads at once MKL's took 1.08-1.35x OpenBLAS's time (session 22). First ``x @ W.T``
(the layout of every linear layer) on ``SHAPES``: OpenBLAS must beat MKL there by
``MARGIN`` (MKL also packs constant weights, which OpenBLAS cannot) to be the library
hologram's GEMMs run on (about 0.2 s, when the first program with a GEMM is compiled).
Then, when a program first has a product in another operand layout (``LAYOUTS``: B read
plainly, or A transposed), those layouts on ``LAYOUT_SHAPES`` (another 0.2 s; a
transformer's inference, all ``x @ W.T``, never pays it): a layout for which the other
library is faster by ``LAYOUT_MARGIN`` runs on that one. Why per layout: on the Zen 4 of
sessions 18-22 MKL won ``x @ W.T`` and lost the products whose B is read plainly, a
convolution's ``W @ columns`` above all; whole models in-process, NN and TN products on
OpenBLAS over all on MKL: ResNet-18 0.91x the time at batch 1, 0.89x at batch 8,
MobileNetV3-small 0.93x, ConvNeXt-atto 0.97x, the ResNet-18 training step 0.95x,
transformers unchanged (docs/perf.md, session 22). The result is written to the kernel
cache directory, keyed by the CPU and both libraries' versions, so every later process
(and every test subprocess sharing the cache) reads it instead of timing again, and the
choice, hence the rounding of every product, does not move between runs on one machine.
``HOLOGRAM_BLAS`` overrides it (one library for every layout).
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
from typing import TYPE_CHECKING, Any

import numpy as np

from ..cache import CacheError, cache_key

if TYPE_CHECKING:
    from .blas import Blas

#: (M, K, N) of the timed ``x @ W.T`` products: a 768-wide projection at 128 rows and a
#: larger product, where the libraries were measured to part ways.
SHAPES = ((128, 768, 768), (256, 768, 1536))
#: The operand layouts other than ``x @ W.T`` ("NT"), by (A transposed, B transposed):
#: the GEMM driver's layout index is ``2 * ta + tb``. Not "TT" (both transposed): no
#: model's graph had one, and it runs on the main library.
LAYOUTS = {"NN": (False, False), "TN": (True, False)}
#: (M, K, N) of the products timed per layout: two of ResNet-18's convolutions at batch 1
#: (the first stage's and the third's), where the libraries part ways; a linear layer's
#: products in these layouts ran within 6% on either (session 22).
LAYOUT_SHAPES = ((64, 576, 3136), (256, 2304, 196))
#: The library not chosen by ``SHAPES`` runs a layout when it is this much faster there.
LAYOUT_MARGIN = 1.03
#: Alternated rounds per library and shape, one timed call each after a first round
#: that warms caches and loads kernels; the median over rounds counts (the best of
#: three single calls chose differently from run to run, session 22). Nine single calls
#: spread less than session 22's five rounds of a warm-up call and the best of two, in
#: 0.6 of the time (12 measurements each on the Zen 4: x @ W.T 0.89-0.95 against
#: 0.91-0.94, NN 1.11-1.17 against 1.06-1.24; docs/perf.md, session 23).
REPEATS = 9
#: OpenBLAS is chosen only when its geometric-mean speed is this much above MKL's.
MARGIN = 1.10
#: Bump when what is measured changes, so old records are not trusted.
VERSION = "3"


@dataclass(frozen=True)
class Choice:
    """The library the measurement chose, the speed ratio (OpenBLAS over MKL, geometric
    mean over SHAPES), the same ratio per other layout (``LAYOUTS``, over
    ``LAYOUT_SHAPES``) and whether it was read from the cache rather than measured now."""

    name: str
    ratio: float
    cached: bool
    layouts: tuple[tuple[str, float], ...] = ()

    def other_layouts(self) -> tuple[str, ...]:
        """The layouts that run on the library other than ``name``."""
        if self.name == "mkl":
            return tuple(lay for lay, r in self.layouts if r >= LAYOUT_MARGIN)
        return tuple(lay for lay, r in self.layouts if r <= 1 / LAYOUT_MARGIN)

    def why(self) -> str:
        where = "remembered from" if self.cached else "measured now, kept in"
        other = self.other_layouts()
        per = "; ".join(f"{lay} {r:.2f}x" for lay, r in self.layouts)
        moved = (f", {' and '.join(other)} products on "
                 f"{'OpenBLAS' if self.name == 'mkl' else 'MKL'}" if other else "")
        return (f"measured on this CPU: OpenBLAS at {self.ratio:.2f}x MKL's speed "
                f"(x @ W.T through the GEMM driver; other layouts: {per or 'not measured'})"
                f"{moved}, {where} the kernel cache; HOLOGRAM_BLAS overrides")


def _cpu_name() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8",
                                            errors="replace") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _driver() -> Any:
    """hologram's GEMM driver, for timing: the very library GEMMs run on (the same source
    and cache key, so one build); None without a C compiler. Timing goes through
    ``hg_gemm_on``, which names the library per call and leaves the driver's binding
    alone, so layouts can be timed while programs run."""
    from .blas import RUNTIME_KEY, runtime_source
    from .cc import CCompiler, CompileError

    cc = CCompiler.find()
    if cc is None:
        return None
    try:
        lib = cc.compile(runtime_source(), RUNTIME_KEY)
    except CompileError:
        return None
    lib.hg_gemm_on.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int, ctypes.c_void_p]
    lib.hg_gemm_on.restype = None
    return lib


def _ratio(lib: Any, libs: dict[str, Blas], shapes: tuple[tuple[int, int, int], ...],
           ta: bool, tb: bool) -> float:
    """OpenBLAS's speed over MKL's on ``shapes`` in one layout (geometric mean), each
    product cut into tiles on hologram's threads as the driver cuts it, run on one
    library and then the other."""
    from .blas import DescStruct

    rng = np.random.default_rng(0)
    logs = []
    for m, k, n in shapes:
        x = rng.standard_normal((k, m) if ta else (m, k), dtype=np.float32)
        w = rng.standard_normal((n, k) if tb else (k, n), dtype=np.float32)
        c = np.empty((m, n), np.float32)
        d = DescStruct()
        d.nb, d.m, d.n, d.k = 1, m, n, k
        d.lda, d.ldb, d.ldc = m if ta else k, k if tb else n, n
        d.ta, d.tb, d.f64, d.nbd = int(ta), int(tb), 0, 0
        times: dict[str, list[float]] = {name: [] for name in libs}
        for r in range(REPEATS + 1):  # the first round warms caches and loads kernels
            for name in (list(libs) if r % 2 else list(libs)[::-1]):
                found = libs[name]
                t = time.perf_counter()
                lib.hg_gemm_on(ctypes.byref(d), x.ctypes.data, w.ctypes.data,
                               c.ctypes.data, found.sgemm, found.dgemm, int(found.ilp64),
                               found.set_threads or None)
                if r:
                    times[name].append(time.perf_counter() - t)
        logs.append(np.log(np.median(times["mkl"]) / np.median(times["openblas"])))
    return float(np.exp(np.mean(logs)))


def measure(mkl: Blas, openblas: Blas) -> float:
    """OpenBLAS's speed over MKL's on ``x @ W.T`` over SHAPES, through hologram's GEMM
    driver. Without a C compiler (no driver, GEMMs stay np.matmul) nothing is timed:
    1.0, so MKL."""
    lib = _driver()
    if lib is None:
        return 1.0
    return _ratio(lib, {"mkl": mkl, "openblas": openblas}, SHAPES, False, True)


def measure_layouts(mkl: Blas, openblas: Blas) -> dict[str, float]:
    """The same ratio per other operand layout (LAYOUTS) over LAYOUT_SHAPES."""
    lib = _driver()
    if lib is None:
        return dict.fromkeys(LAYOUTS, 1.0)
    libs = {"mkl": mkl, "openblas": openblas}
    return {lay: _ratio(lib, libs, LAYOUT_SHAPES, *t) for lay, t in LAYOUTS.items()}


def _record_path(mkl: Blas, openblas: Blas) -> str | None:
    from .cc import KERNEL_CACHE

    try:
        d = KERNEL_CACHE.ensure_directory()
    except (CacheError, OSError):
        return None
    from .. import threads

    key = cache_key({"kind": "blas-choice", "version": VERSION, "cpu": _cpu_name(),
                     "threads": str(threads.get_num_threads()),
                     "mkl": mkl.config, "openblas": openblas.config,
                     "shapes": repr((SHAPES, LAYOUTS, LAYOUT_SHAPES))}, "", ".json")
    return os.path.join(d, f"blas-choice-{key[:32]}.json")


def _read(path: str) -> tuple[float, dict[str, float] | None] | None:
    """(x @ W.T's ratio, the layouts' ratios or None where not measured yet), or None."""
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError, AttributeError):
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
        ratio = float(record["openblas_over_mkl"])
        if not (np.isfinite(ratio) and ratio > 0):
            return None
        layouts = None
        if record.get("layouts") is not None:
            layouts = {lay: float(record["layouts"][lay]) for lay in LAYOUTS}
            if not all(np.isfinite(r) and r > 0 for r in layouts.values()):
                layouts = None  # damaged: measured again when asked for
        return ratio, layouts
    return None  # missing or damaged: measure again


def _write(path: str, ratio: float, layouts: dict[str, float] | None) -> None:
    with contextlib.suppress(OSError):
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"openblas_over_mkl": ratio, "layouts": layouts, "cpu": _cpu_name(),
                       "shapes": SHAPES, "layout_shapes": LAYOUT_SHAPES}, f)
        os.replace(tmp, path)


def choose(mkl: Blas, openblas: Blas, layouts: bool = False) -> Choice:
    """The faster library on this machine (remembered, else measured and remembered);
    with ``layouts``, also the ratio per other operand layout (measured the first time
    a program has such a product: a program of ``x @ W.T`` products alone never pays
    for it)."""
    path = _record_path(mkl, openblas)
    found = _read(path) if path else None
    cached = found is not None
    ratio, per = found if found is not None else (measure(mkl, openblas), None)
    if layouts and per is None:
        per = measure_layouts(mkl, openblas)
        cached = False
    if path and (found is None or (layouts and found[1] is None)):
        _write(path, ratio, per)
    return Choice("openblas" if ratio >= MARGIN else "mkl", ratio, cached,
                  tuple(sorted((per or {}).items())))
