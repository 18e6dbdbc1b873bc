"""GEMM on NumPy's own BLAS, called from hologram's OpenMP threads.

Why not ``np.matmul``: OpenBLAS (what NumPy's wheels ship) runs its own pthread
pool, and its threads spin for a while after each call, as OpenMP's do after
each of our kernels. On a small machine the two pools then fight for the
cores: a fused GEMM+bias+GELU ran 20 ms against 11 ms unfused in NumPy, and a
small MLP training step under torch.compile ran 8x slower than eager (2-core
box, docs/perf.md). So GEMMs run in the one pool our kernels (and PyTorch, when
it is loaded: it ships the same libgomp) already use: the C driver below splits
each product (or batch of products) into row or column tiles, runs the tiles on
OpenMP threads, and each tile calls the library's single-threaded ``?gemm``
(OpenBLAS told to use one thread while hologram's GEMMs run). NumPy's BLAS is
found at run time in the process's loaded libraries, so hologram adds no BLAS
of its own and computes what ``np.matmul`` computes.

Where no such library is found (macOS's Accelerate, a NumPy without OpenBLAS,
no ``/proc``), or ``HOLOGRAM_GEMM=numpy`` is set, GEMM steps stay ``np.matmul``
calls. OpenBLAS's thread count is process-wide, so a NumPy matmul running in
another Python thread while a hologram GEMM runs uses one thread; the count is
restored when the last hologram GEMM ends.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import warnings
from dataclasses import dataclass
from typing import Any

from .gemm_layout import MAX_BATCH_DIMS

#: The descriptor both the runtime and the kernels' GEMM steps are compiled with.
GEMM_DESC_C = f"#define HG_GEMM_MAX_BATCH {MAX_BATCH_DIMS}\n" + r"""
typedef struct {
  int64_t nb, m, n, k, lda, ldb, ldc, oa, ob, oc;
  int32_t ta, tb, f64, nbd;
  int64_t bshape[HG_GEMM_MAX_BATCH], bsa[HG_GEMM_MAX_BATCH], bsb[HG_GEMM_MAX_BATCH],
      bsc[HG_GEMM_MAX_BATCH];
} hg_gemm_desc;
typedef void (*hg_epilogue_fn)(void **, int64_t, int64_t);  /* a kernel over rows lo..hi */
typedef void (*hg_gemm_fn)(const hg_gemm_desc *, const void *, const void *, void *,
                           hg_epilogue_fn, void **);
"""

#: Products below this many flops run on the calling thread (an OpenMP region and
#: split tiles cost more than they save; ~10 us of one core). 1 MFLOP, not 2: a
#: one-off sweep on the 2-core VM (session 5, docs/perf.md) found the MLP step's
#: 256x10x256-sized products (1.3 MFLOP) faster split in two tiles.
PARALLEL_MIN_FLOPS = 1 << 20
#: Tiles thinner than this many rows (or columns) make BLAS's packing dominate.
MIN_TILE = 16

RUNTIME_C = r"""
#include <stdint.h>
#include <string.h>
#include <pthread.h>
#ifdef _OPENMP
#include <omp.h>
#endif
""" + GEMM_DESC_C + r"""
typedef void (*sgemm64_t)(int, int, int, int64_t, int64_t, int64_t, float, const float *,
                          int64_t, const float *, int64_t, float, float *, int64_t);
typedef void (*dgemm64_t)(int, int, int, int64_t, int64_t, int64_t, double, const double *,
                          int64_t, const double *, int64_t, double, double *, int64_t);
typedef void (*sgemm32_t)(int, int, int, int32_t, int32_t, int32_t, float, const float *,
                          int32_t, const float *, int32_t, float, float *, int32_t);
typedef void (*dgemm32_t)(int, int, int, int32_t, int32_t, int32_t, double, const double *,
                          int32_t, const double *, int32_t, double, double *, int32_t);
typedef int (*set_threads_t)(int);

static void *hg_sgemm, *hg_dgemm;
static set_threads_t hg_set_threads;  /* returns the previous count */
static int hg_ilp64;
static pthread_mutex_t hg_mu = PTHREAD_MUTEX_INITIALIZER;
static int hg_users, hg_saved;

/* A fork copies the mutex as another thread may hold it, and that thread's GEMM never
   ends in the child: give the child a fresh mutex and the user's BLAS thread count. */
static void hg_after_fork_in_child(void) {
  pthread_mutex_init(&hg_mu, NULL);
  if (hg_users) hg_set_threads(hg_saved);
  hg_users = 0;
}

void hg_gemm_init(void *s, void *d, void *set_threads, int ilp64) {
  static int registered;
  hg_sgemm = s; hg_dgemm = d; hg_set_threads = (set_threads_t)set_threads; hg_ilp64 = ilp64;
  if (!registered) pthread_atfork(0, 0, hg_after_fork_in_child);
  registered = 1;
}

/* One BLAS thread while any hologram GEMM runs; the user's count comes back after. */
static void hg_enter(void) {
  pthread_mutex_lock(&hg_mu);
  if (hg_users++ == 0) hg_saved = hg_set_threads(1);
  pthread_mutex_unlock(&hg_mu);
}
static void hg_leave(void) {
  pthread_mutex_lock(&hg_mu);
  if (--hg_users == 0) hg_set_threads(hg_saved);
  pthread_mutex_unlock(&hg_mu);
}

static void hg_call(const hg_gemm_desc *d, int64_t m, int64_t n, const char *a,
                    const char *b, char *c) {
  int ta = d->ta ? 112 : 111, tb = d->tb ? 112 : 111;
  if (d->k == 0) {  /* an empty sum: BLAS may leave C alone */
    size_t es = d->f64 ? 8 : 4;
    for (int64_t i = 0; i < m; i++) memset(c + i * d->ldc * es, 0, (size_t)n * es);
    return;
  }
  if (d->f64) {
    if (hg_ilp64) ((dgemm64_t)hg_dgemm)(101, ta, tb, m, n, d->k, 1.0, (const double *)a,
        d->lda, (const double *)b, d->ldb, 0.0, (double *)c, d->ldc);
    else ((dgemm32_t)hg_dgemm)(101, ta, tb, (int32_t)m, (int32_t)n, (int32_t)d->k, 1.0,
        (const double *)a, (int32_t)d->lda, (const double *)b, (int32_t)d->ldb, 0.0,
        (double *)c, (int32_t)d->ldc);
  } else {
    if (hg_ilp64) ((sgemm64_t)hg_sgemm)(101, ta, tb, m, n, d->k, 1.0f, (const float *)a,
        d->lda, (const float *)b, d->ldb, 0.0f, (float *)c, d->ldc);
    else ((sgemm32_t)hg_sgemm)(101, ta, tb, (int32_t)m, (int32_t)n, (int32_t)d->k, 1.0f,
        (const float *)a, (int32_t)d->lda, (const float *)b, (int32_t)d->ldb, 0.0f,
        (float *)c, (int32_t)d->ldc);
  }
}

static int64_t hg_gcd(int64_t a, int64_t b) {
  while (b) { int64_t t = a % b; a = b; b = t; }
  return a;
}

void hg_gemm(const hg_gemm_desc *d, const void *A, const void *B, void *C, hg_epilogue_fn epi,
             void **table) {
  if (d->m == 0 || d->n == 0 || d->nb == 0) return;
  const int64_t es = d->f64 ? 8 : 4;
  const char *a0 = (const char *)A + d->oa * es, *b0 = (const char *)B + d->ob * es;
  char *c0 = (char *)C + d->oc * es;
  int64_t nt = 1;
#ifdef _OPENMP
  if (2.0 * (double)d->nb * (double)d->m * (double)d->n * (double)d->k >= HG_PAR_FLOPS)
    nt = omp_get_max_threads();
#endif
  /* Tiles along the longer side of each product; nb * per a multiple of nt (balance). */
  const int rows = d->m >= d->n;
  const int64_t len = rows ? d->m : d->n;
  int64_t per = nt / hg_gcd(d->nb, nt);
  if (per > len / HG_MIN_TILE) per = len / HG_MIN_TILE;
  if (per < 1) per = 1;
  const int64_t total = d->nb * per;
  hg_enter();
#pragma omp parallel for schedule(static) if(nt > 1 && total > 1)
  for (int64_t t = 0; t < total; t++) {
    int64_t bi = t / per, r = t % per, rest = bi, oa = 0, ob = 0, oc = 0;
    for (int i = d->nbd - 1; i >= 0; i--) {
      int64_t x = rest % d->bshape[i];
      rest /= d->bshape[i];
      oa += x * d->bsa[i]; ob += x * d->bsb[i]; oc += x * d->bsc[i];
    }
    int64_t lo = len * r / per, hi = len * (r + 1) / per;
    const char *a = a0 + oa * es, *b = b0 + ob * es;
    char *c = c0 + oc * es;
    if (rows) {  /* rows lo..hi of A (row i of A^T is column i of the stored matrix) */
      a += (d->ta ? lo : lo * d->lda) * es;
      c += lo * d->ldc * es;
      hg_call(d, hi - lo, d->n, a, b, c);
      if (epi) epi(table, bi * d->m + lo, bi * d->m + hi);  /* while the tile is in cache */
    } else {  /* columns lo..hi of B and C */
      b += (d->tb ? lo * d->ldb : lo) * es;
      c += lo * es;
      hg_call(d, d->m, hi - lo, a, b, c);
    }
  }
  hg_leave();
  if (epi && !rows) {  /* column tiles: every row is complete only now */
    const int64_t R = d->nb * d->m;
#pragma omp parallel for schedule(static) if(nt > 1 && R > 1)
    for (int64_t t = 0; t < nt; t++) epi(table, R * t / nt, R * (t + 1) / nt);
  }
}
"""


@dataclass(frozen=True)
class Blas:
    """A BLAS found in this process: where, which symbols, and its integer width."""

    path: str
    config: str
    ilp64: bool
    sgemm: int
    dgemm: int
    set_threads: int  # int f(int): set the thread count, return the previous one


def _loaded_libraries() -> list[str]:
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return []
    return sorted(set(re.findall(r"(/\S*openblas\S*\.so[\w.]*)", text)))


def _symbol(lib: ctypes.CDLL, names: list[str]) -> Any:
    for n in names:
        try:
            return getattr(lib, n)
        except AttributeError:
            continue
    return None


def _probe(path: str) -> Blas | None:
    """NumPy's OpenBLAS at ``path`` (already loaded, so this opens no new library)."""
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return None
    for prefix, suffix in (("scipy_", "64_"), ("", "64_"), ("scipy_", ""), ("", "")):
        sgemm = _symbol(lib, [f"{prefix}cblas_sgemm{suffix}"])
        dgemm = _symbol(lib, [f"{prefix}cblas_dgemm{suffix}"])
        config = _symbol(lib, [f"{prefix}openblas_get_config{suffix}", "openblas_get_config"])
        if sgemm is not None and dgemm is not None and config is not None:
            break
    else:
        return None
    config.restype = ctypes.c_char_p
    text = (config() or b"").decode(errors="replace")
    local = _symbol(lib, ["openblas_set_num_threads_local"])
    if local is None:
        return None  # before OpenBLAS 0.3.27; np.matmul stays the safe path
    addr = ctypes.cast(local, ctypes.c_void_p).value
    return Blas(path, text, "USE64BITINT" in text,
                ctypes.cast(sgemm, ctypes.c_void_p).value or 0,
                ctypes.cast(dgemm, ctypes.c_void_p).value or 0, addr or 0)


@functools.cache
def numpy_blas() -> tuple[Blas | None, str]:
    """(the BLAS NumPy uses, how it was found) or (None, why GEMM stays np.matmul)."""
    if os.environ.get("HOLOGRAM_GEMM", "").lower() == "numpy":
        return None, "HOLOGRAM_GEMM=numpy"
    import numpy as np  # noqa: F401 - loads NumPy's BLAS into the process

    paths = _loaded_libraries()
    if not paths:
        return None, "no OpenBLAS loaded by NumPy was found in this process"
    for p in paths:
        found = _probe(p)
        if found is not None:
            return found, f"{os.path.basename(p)} ({found.config.strip()})"
    return None, f"{', '.join(paths)}: no cblas_?gemm and openblas_set_num_threads_local"


@functools.cache
def runtime(cc: Any) -> int | None:
    """The address of ``hg_gemm`` compiled by ``cc`` and bound to NumPy's BLAS, or None."""
    blas, _ = numpy_blas()
    if blas is None or cc is None:
        return None
    defines = f"#define HG_PAR_FLOPS {PARALLEL_MIN_FLOPS}.0\n#define HG_MIN_TILE {MIN_TILE}\n"
    from .cc import CompileError

    try:
        lib = cc.compile(defines + RUNTIME_C, {"runtime": "gemm"})
    except CompileError as e:  # e.g. no pthread.h: np.matmul still works
        warnings.warn(f"hologram: GEMM runs through np.matmul: the BLAS driver did not "
                      f"build: {str(e).splitlines()[0]}", stacklevel=2)
        return None
    init = lib.hg_gemm_init
    init.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    init.restype = None
    init(blas.sgemm, blas.dgemm, blas.set_threads, int(blas.ilp64))
    return ctypes.cast(lib.hg_gemm, ctypes.c_void_p).value


def describe() -> str:
    """One line for ``hologram info``: how GEMM runs."""
    blas, how = numpy_blas()
    if blas is None:
        return f"np.matmul ({how})"
    return f"hologram's OpenMP tiles over {how}"
