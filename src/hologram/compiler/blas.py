"""GEMM on a BLAS loaded at run time (MKL or NumPy's OpenBLAS), called from hologram's
OpenMP threads.

Why not ``np.matmul``: OpenBLAS (what NumPy's wheels ship) runs its own pthread
pool, and its threads spin for a while after each call, as OpenMP's do after
each of our kernels. On a small machine the two pools then fight for the
cores: a fused GEMM+bias+GELU ran 20 ms against 11 ms unfused in NumPy, and a
small MLP training step under torch.compile ran 8x slower than eager (2-core
box, docs/perf.md). So GEMMs run in the one pool our kernels (and PyTorch, when
it is loaded: it ships the same libgomp) already use: the C driver below splits
each product (or batch of products) into row or column tiles, runs the tiles on
OpenMP threads, and each tile calls the library's single-threaded ``?gemm``.

Which library (``provider()``): with both MKL (the ``mkl`` wheel, ``pip install
hologram[mkl]``) and NumPy's OpenBLAS usable, the faster one on this machine, measured
once and remembered (``blas_choice``): MKL won every model shape on this project's
AVX-512 machine (single thread, 768-wide products at M=128: 191-195 GFLOP/s against
OpenBLAS's 153-155; an 8-row product 68 against 29; docs/perf.md, session 9), OpenBLAS
the wide products on an AVX2 Zen 3 (session 15). The choice is per operand layout
(``second_provider``, ``hg_gemm_second``): on the Zen 4 of session 22 MKL kept
``x @ W.T`` and OpenBLAS took the products whose B is read plainly. Else whichever is
usable; ``HOLOGRAM_BLAS=mkl|openblas`` chooses (one library for every layout). hologram
links MKL's ILP64 interface, sequential and core layers from the wheel's directory into
a small library of its own and loads that with RTLD_LOCAL (``mkl_blas`` says why not
``libmkl_rt``): MKL starts no threads of its own (our OpenMP threads do the splitting),
never loads Intel's OpenMP runtime beside GNU's, and no MKL symbol enters the process's
global scope, where PyTorch's own MKL would bind to it. The MKL that PyTorch links
statically is not used: its symbols are not a documented interface. OpenBLAS is found
in the process's loaded libraries (NumPy loaded it) and told to use one thread while
hologram's GEMMs run; the count is process-wide, so a NumPy matmul running in another
Python thread meanwhile uses one thread, and the user's count is restored when the
last hologram GEMM ends.

MKL also packs a B operand once for many products (``cblas_?gemm_pack``/``_compute``):
against MKL's plain product on the models' shapes, 1.84x at 8 rows, 1.10-1.28x at 128,
1.0-1.05x at 1024 (two threads, docs/perf.md, session 9). ``pack`` makes such a copy
for a GEMM descriptor, column tiles in two rounds (``hg_edge``); a GEMM step is handed it at
launch (its own slot of the pointer table) and the driver checks that it matches the
product. Keeping a packed copy in step with the original is the caller's job:
``hologram_torch`` does it for the constant weights of inference graphs
(``hologram_torch/packed_weights.py``).

Where no library is found (macOS's Accelerate, a NumPy without OpenBLAS, no ``/proc``)
or ``HOLOGRAM_GEMM=numpy`` is set, GEMM steps stay ``np.matmul`` calls.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import importlib.metadata
import os
import re
import sys
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .cc import THREADS_C
from .gemm_layout import MAX_BATCH_DIMS, GemmDesc

#: The descriptor both the runtime and the kernels' GEMM steps are compiled with.
GEMM_DESC_C = f"#define HG_GEMM_MAX_BATCH {MAX_BATCH_DIMS}\n" + r"""
typedef struct {
  int64_t nb, m, n, k, lda, ldb, ldc, oa, ob, oc;
  int32_t ta, tb, f64, nbd;
  int32_t narrow;  /* A and B hold 16-bit floats (1: bf16), C float; 0: A, B, C alike */
  int64_t bshape[HG_GEMM_MAX_BATCH], bsa[HG_GEMM_MAX_BATCH], bsb[HG_GEMM_MAX_BATCH],
      bsc[HG_GEMM_MAX_BATCH];
} hg_gemm_desc;
typedef void (*hg_epilogue_fn)(void **, int64_t, int64_t);  /* a kernel over rows lo..hi */
/* the last argument: B packed by hg_gemm_pack for this product, or NULL */
typedef void (*hg_gemm_fn)(const hg_gemm_desc *, const void *, const void *, void *,
                           hg_epilogue_fn, void **, const void *);
"""

#: Products below this many flops run on the calling thread (an OpenMP region and
#: split tiles cost more than they save; ~10 us of one core). 1 MFLOP, not 2: a
#: one-off sweep on the 2-core VM (session 5, docs/perf.md) found the MLP step's
#: 256x10x256-sized products (1.3 MFLOP) faster split in two tiles.
PARALLEL_MIN_FLOPS = 1 << 20
#: Tiles thinner than this many rows (or columns) make BLAS's packing dominate.
MIN_TILE = 16
#: Products from this many flops are cut into two rounds of tiles (``hg_edge``), smaller
#: ones into one tile per thread. Two rounds hold a product to 1.2-1.46x its quiet time
#: with a core busy (docs/perf.md, session 15), but a product under ~60 MFLOP is over
#: before the scheduler moves a thread (38 MFLOP stayed 2.2-2.8x either way), and its
#: extra tiles each pay BLAS's packing: the README demo's MLP step (products of 2-4
#: MFLOP) ran 1.20x eager's time with two rounds everywhere.
TWO_ROUNDS_MIN_FLOPS = 1 << 26
#: A BLAS call computes at most this many columns of C; a wider tile's columns are cut
#: into equal blocks no wider (``hg_call``), and a packed copy of B gets column tiles no
#: wider. MKL slows down once B is wide: single-threaded, 128 x 512 x 32128 (T5's LM head,
#: ``x @ W.T``) ran 75 GFLOP/s in one call against 87-89 in calls of 512-2048 columns,
#: 128 x 768 x 50257 (GPT-2's) 62 against 86-90, 1024 x 768 x 3072 83 against 92-98
#: (session 18, Zen 4); OpenBLAS stayed 79-100 at every width (docs/perf.md).
CALL_MAX_COLS = 1024
#: Products of this many rows or more are exempt from both rules above: one tile per
#: thread, each tile one BLAS call however wide. What MKL prefers flips with the rows:
#: at 128 rows one call over a wide B is slow (above), at 1024 rows it is the fast way.
#: Through the driver, calls alternated in one process (session 20, Zen 4), one round of
#: single calls took 0.78-0.94x the two rounds of <= 1024-column calls on the LM heads at
#: 1024 rows (1024 x 768 x 32000, 50257; 1024 x 512 x 32128) and 1.26-1.55x at 128 rows;
#: whole models at batch 8 (seq 128: 1024-row products), in-process A/Bs: LLaMA 0.84,
#: 0.87, 0.94, 0.95, T5-small 0.90, 0.92, ViT 0.94, GPT-2 0.96, BERT 0.98 (docs/perf.md).
#: What it gives up: a product this tall no longer has a second round for a thread
#: the OS descheduled (``TWO_ROUNDS_MIN_FLOPS``); none of ``bench_busy``'s rows has one.
WIDE_MIN_ROWS = 1024
#: Gram products (``x @ x.T``) from this size compute the lower triangle in strips and
#: mirror it (``hg_gemm_symmetric``); smaller ones stay one plain product.
SYMMETRIC_MIN = 128
#: The symmetric path's strips have at least this many rows (BLAS packing per call).
SYMMETRIC_MIN_STRIP = 64
#: Packed copies of B (MKL) pay from 2 rows up: at 1 row (a matrix-vector product) the
#: packed product ran slower than the plain one (84 against 148 GFLOP/s, 1 x 768 x 768,
#: two threads), at 2 rows faster (225 against 207), at 4 rows 343 against 235
#: (``bench_gemm_split.py``, docs/perf.md, session 9).
PACK_MIN_M = 2
#: Column tiles a packed copy may have (the C header's room).
PACK_MAX_TILES = 256
#: A packed copy is made only when MKL asks for at most this many times B's own bytes.
#: MKL reserves a block per packed tile whatever its width (MKL 2026.2 on Zen 4: 5.6 MB
#: for one tile of a 512x512 f32 weight, 1 MB of data, and ~2 MB of it resident; a
#: 128-column tile 1.9 MB resident for 0.26 MB), so the two-round column tiles of the
#: models' weights made copies 3.8-22x their weights' size: T5-small took 1.8 GB more
#: resident memory for 240 MB of weights, GPT-2 1.45 GB. For 0.92-1.04x the unpacked
#: time there (in-process A/Bs: T5 b1 0.99, BERT b1 1.02, GPT-2 b1 0.92 and 0.98, b8
#: 1.04; docs/perf.md, session 19), so a copy that costs more memory than this is not
#: made; where MKL's layout is compact (wide tiles) it still is.
PACK_MAX_GROWTH = 1.5

#: Products whose A and B hold 16-bit floats and whose C is float, by the operands' ISA
#: dtype: MKL's symbol, and the driver's ``narrow`` code (GEMM_DESC_C). A bf16 graph's
#: linear layers multiply bf16 weights and activations: read as they are, no float copy
#: of either is made per call, and MKL's bf16 product runs 1.6-1.9x its sgemm on the
#: models' shapes on a CPU with AVX-512 BF16 (Zen 4, one thread, GFLOP/s: 128x768x3072
#: 153 against 90, 1024x768x768 188 against 97, 8x768x768 72 against 57) and 1.3-2.0x
#: on an AVX2 Zen 3 (docs/perf.md, sessions 35 and 36). The products of two bf16 values
#: are exact in float and the sums are float's, as in sgemm over widened copies. MKL's
#: f16 product is not taken: on the Zen 4 (no AVX-512 FP16) it ran 105 and 149 GFLOP/s
#: against sgemm's 89 and 100 at 128 and 1024 rows but 19 against 56 at 8 rows.
NARROW_SYMBOLS = {"bf16": "cblas_gemm_bf16bf16f32"}
NARROW_CODES = {"bf16": 1}

#: The CBLAS ?gemm signatures (LP64 and ILP64) every driver that calls BLAS declares.
GEMM_TYPES_C = r"""
typedef void (*sgemm64_t)(int, int, int, int64_t, int64_t, int64_t, float, const float *,
                          int64_t, const float *, int64_t, float, float *, int64_t);
typedef void (*dgemm64_t)(int, int, int, int64_t, int64_t, int64_t, double, const double *,
                          int64_t, const double *, int64_t, double, double *, int64_t);
typedef void (*sgemm32_t)(int, int, int, int32_t, int32_t, int32_t, float, const float *,
                          int32_t, const float *, int32_t, float, float *, int32_t);
typedef void (*dgemm32_t)(int, int, int, int32_t, int32_t, int32_t, double, const double *,
                          int32_t, const double *, int32_t, double, double *, int32_t);
/* MKL's products of 16-bit operands into float (cblas_gemm_bf16bf16f32), ILP64 */
typedef void (*ngemm64_t)(int, int, int, int64_t, int64_t, int64_t, float, const void *,
                          int64_t, const void *, int64_t, float, float *, int64_t);
/* hologram's own (bf16_gemm.py's hg_bgemm): (ta, tb, m, n, k, A, lda, B, ldb, C, ldc) */
typedef void (*own_ngemm_t)(int, int, int64_t, int64_t, int64_t, const void *, int64_t,
                            const void *, int64_t, float *, int64_t);
"""

RUNTIME_C = r"""
#include <stdint.h>
#include <string.h>
#include <pthread.h>
""" + THREADS_C + GEMM_DESC_C + GEMM_TYPES_C + r"""
/* Bytes of one element of A and B, and of C. */
static inline int64_t hg_es_ab(const hg_gemm_desc *d) { return d->narrow ? 2 : d->f64 ? 8 : 4; }
static inline int64_t hg_es_c(const hg_gemm_desc *d) { return d->f64 ? 8 : 4; }
/* MKL's packed GEMM, ILP64 (cblas_?gemm_pack_get_size_64, _pack_64, _compute_64) */
typedef size_t (*pack_size_t)(int, int64_t, int64_t, int64_t);
typedef void (*spack_t)(int, int, int, int64_t, int64_t, int64_t, float, const float *, int64_t,
                        float *);
typedef void (*dpack_t)(int, int, int, int64_t, int64_t, int64_t, double, const double *,
                        int64_t, double *);
typedef void (*scompute_t)(int, int64_t, int64_t, int64_t, int64_t, int64_t, const float *,
                           int64_t, const float *, int64_t, float, float *, int64_t);
typedef void (*dcompute_t)(int, int64_t, int64_t, int64_t, int64_t, int64_t, const double *,
                           int64_t, const double *, int64_t, double, double *, int64_t);
typedef int (*set_threads_t)(int);

static void *hg_sgemm, *hg_dgemm;
static void *hg_pack_size[2], *hg_pack[2], *hg_compute[2];  /* [f64]; NULL: no packing */
/* [narrow]: the product reading 16-bit A and B into float C: hologram's own where bound
   (hg_narrow_own), else MKL's (ILP64). Whichever library the layout chose, a narrow
   product calls one of these. */
static void *hg_narrow_fn[2], *hg_narrow_own[2];
static set_threads_t hg_set_threads;  /* returns the previous count; NULL: nothing to set */
static int hg_ilp64;
/* A BLAS library's ?gemm entry points and integer width. */
typedef struct { void *s, *d; int ilp64; } hg_blas_lib;
/* The library each operand layout calls ([2 ta + tb]): the first bound (hg_gemm_init)
   or a second one (hg_gemm_second) where blas_choice measured it faster for that layout.
   Packed products always call the first (its pack API made the copy). */
static hg_blas_lib hg_lib_of[4];
static pthread_mutex_t hg_mu = PTHREAD_MUTEX_INITIALIZER;
static int hg_users, hg_saved;

/* A fork copies the mutex as another thread may hold it, and that thread's GEMM never
   ends in the child: give the child a fresh mutex and the user's BLAS thread count. */
static void hg_after_fork_in_child(void) {
  pthread_mutex_init(&hg_mu, NULL);
  if (hg_users && hg_set_threads) hg_set_threads(hg_saved);
  hg_users = 0;
}

void hg_gemm_init(void *s, void *d, void *set_threads, int ilp64, void *const *pack) {
  static int registered;
  hg_sgemm = s; hg_dgemm = d; hg_set_threads = (set_threads_t)set_threads; hg_ilp64 = ilp64;
  for (int i = 0; i < 4; i++) hg_lib_of[i] = (hg_blas_lib){s, d, ilp64};
  for (int i = 0; i < 2; i++) {  /* pack: s size, s pack, s compute, then the same for d */
    hg_pack_size[i] = pack ? pack[3 * i] : 0;
    hg_pack[i] = pack ? pack[3 * i + 1] : 0;
    hg_compute[i] = pack ? pack[3 * i + 2] : 0;
  }
  if (!registered) pthread_atfork(0, 0, hg_after_fork_in_child);
  registered = 1;
}

/* The products of 16-bit operands (blas.py narrow_dtypes): MKL's (NARROW_SYMBOLS) and
   hologram's own, [bf16]. */
void hg_gemm_narrow(void *bf16, void *own_bf16) {
  hg_narrow_fn[1] = bf16;
  hg_narrow_own[1] = own_bf16;
}

/* A second library for the operand layouts whose bit (1 << (2 ta + tb)) is set in
   `layouts`; call after hg_gemm_init (hg_gemm_init's `set_threads` names OpenBLAS's
   thread-count setter whichever library is first, when it is loaded). A product running
   meanwhile may call either library for its blocks: the same product, other rounding. */
void hg_gemm_second(void *s, void *d, int ilp64, int layouts) {
  for (int i = 0; i < 4; i++)
    hg_lib_of[i] = ((layouts >> i) & 1) ? (hg_blas_lib){s, d, ilp64}
                                        : (hg_blas_lib){hg_sgemm, hg_dgemm, hg_ilp64};
}

/* The library a product of d's operand layout calls. */
static const hg_blas_lib *hg_layout_lib(const hg_gemm_desc *d) {
  return &hg_lib_of[2 * (d->ta != 0) + (d->tb != 0)];
}

/* One BLAS thread while any hologram GEMM runs; the user's count comes back after. */
static void hg_enter(void) {
  if (!hg_set_threads) return;
  pthread_mutex_lock(&hg_mu);
  if (hg_users++ == 0) hg_saved = hg_set_threads(1);
  pthread_mutex_unlock(&hg_mu);
}
static void hg_leave(void) {
  if (!hg_set_threads) return;
  pthread_mutex_lock(&hg_mu);
  if (--hg_users == 0) hg_set_threads(hg_saved);
  pthread_mutex_unlock(&hg_mu);
}
/* The same guard for other drivers that call BLAS from our threads (attention.py): one
   count, so the user's thread count comes back only after the last of them ends. */
void hg_blas_enter(void) { hg_enter(); }
void hg_blas_leave(void) { hg_leave(); }

static void hg_call_block(const hg_blas_lib *L, const hg_gemm_desc *d, int64_t m, int64_t n,
                          const char *a, const char *b, char *c) {
  int ta = d->ta ? 112 : 111, tb = d->tb ? 112 : 111;
  void *const dgemm = L->d, *const sgemm = L->s;
  if (d->narrow && hg_narrow_own[d->narrow]) {
    ((own_ngemm_t)hg_narrow_own[d->narrow])(d->ta != 0, d->tb != 0, m, n, d->k, a, d->lda,
                                            b, d->ldb, (float *)c, d->ldc);
  } else if (d->narrow) {
    ((ngemm64_t)hg_narrow_fn[d->narrow])(101, ta, tb, m, n, d->k, 1.0f, a, d->lda, b,
                                          d->ldb, 0.0f, (float *)c, d->ldc);
  } else if (d->f64) {
    if (L->ilp64) ((dgemm64_t)dgemm)(101, ta, tb, m, n, d->k, 1.0,
        (const double *)a, d->lda, (const double *)b, d->ldb, 0.0, (double *)c, d->ldc);
    else ((dgemm32_t)dgemm)(101, ta, tb, (int32_t)m, (int32_t)n, (int32_t)d->k, 1.0,
        (const double *)a, (int32_t)d->lda, (const double *)b, (int32_t)d->ldb, 0.0,
        (double *)c, (int32_t)d->ldc);
  } else {
    if (L->ilp64) ((sgemm64_t)sgemm)(101, ta, tb, m, n, d->k, 1.0f,
        (const float *)a, d->lda, (const float *)b, d->ldb, 0.0f, (float *)c, d->ldc);
    else ((sgemm32_t)sgemm)(101, ta, tb, (int32_t)m, (int32_t)n, (int32_t)d->k, 1.0f,
        (const float *)a, (int32_t)d->lda, (const float *)b, (int32_t)d->ldb, 0.0f,
        (float *)c, (int32_t)d->ldc);
  }
}

/* How many equal blocks of at most HG_CALL_COLS columns n columns are cut into. */
static int64_t hg_col_blocks(int64_t n) { return (n + HG_CALL_COLS - 1) / HG_CALL_COLS; }

/* Whether `d` is tall enough for one tile per thread and one BLAS call per tile
   (WIDE_MIN_ROWS in blas.py says why). */
static int hg_wide(const hg_gemm_desc *d) { return d->m >= HG_WIDE_ROWS; }

/* C (m x n, at c) = op(A) op(B) for the rows at a and the columns at b: one BLAS call per
   block of at most HG_CALL_COLS columns, the blocks equal (HG_CALL_COLS: MKL slows down
   on a wide B), or one call for a tall product (hg_wide). The blocks depend on the
   product's shape alone, so its result does not depend on timing. */
static void hg_call(const hg_blas_lib *L, const hg_gemm_desc *d, int64_t m, int64_t n,
                    const char *a, const char *b, char *c) {
  const int64_t es = hg_es_ab(d), esc = hg_es_c(d);
  if (d->k == 0) {  /* an empty sum: BLAS may leave C alone */
    for (int64_t i = 0; i < m; i++) memset(c + i * d->ldc * esc, 0, (size_t)(n * esc));
    return;
  }
  const int64_t blocks = hg_wide(d) ? 1 : hg_col_blocks(n);
  for (int64_t t = 0; t < blocks; t++) {
    const int64_t lo = n * t / blocks, hi = n * (t + 1) / blocks;
    hg_call_block(L, d, m, hi - lo, a, b + (d->tb ? lo * d->ldb : lo) * es, c + lo * esc);
  }
}

static int64_t hg_gcd(int64_t a, int64_t b) {
  while (b) { int64_t t = a % b; a = b; b = t; }
  return a;
}

/* Where tile t of `tiles` starts along `len` (t = tiles: len), in `rounds` rounds (from
   hg_tiles_for; one: equal tiles). Two rounds (an even count of 4 or more): the first
   tiles/2 (one per thread, claimed first) share two thirds of len, the rest the last
   third. Quiet, every thread runs one of each; with a core
   shared by another process (its thread at half speed), the others run the second
   round while it finishes its first tile: 2/3 of the product on the full-speed thread,
   what perfect balance would give, from tiles no more than twice as many as threads.
   Equal tiles need three or four per thread for that, and every column tile packs A
   again (docs/perf.md, session 15). */
static int64_t hg_edge(int64_t len, int64_t t, int64_t tiles, int rounds) {
  if (rounds != 2 || tiles < 4 || tiles % 2) return len * t / tiles;
  const int64_t half = tiles / 2, first = 2 * len / 3;
  return t <= half ? first * t / half : first + (len - first) * (t - half) / half;
}

static double hg_flops(const hg_gemm_desc *d) {
  return 2.0 * (double)d->nb * (double)d->m * (double)d->n * (double)d->k;
}

static int64_t hg_threads_for(const hg_gemm_desc *d) {
  int64_t nt = 1;
#ifdef _OPENMP
  if (hg_flops(d) >= HG_PAR_FLOPS) nt = HG_NT;
#endif
  return nt;
}

/* Tiles of `d` for `nt` threads along `len`, and in how many rounds (`*rounds`, for
   hg_edge): two (2 nt tiles) for a product of at least HG_TWO_ROUNDS_FLOPS whose second
   round's tiles are at least HG_MIN_TILE and that is not tall (hg_wide), else one tile
   per thread, none thinner than HG_MIN_TILE. */
static int64_t hg_tiles_for(const hg_gemm_desc *d, int64_t len, int64_t nt, int *rounds) {
  *rounds = 1;
  if (nt > 1 && hg_flops(d) >= HG_TWO_ROUNDS_FLOPS && len / (3 * nt) >= HG_MIN_TILE &&
      !hg_wide(d)) {
    *rounds = 2;
    return 2 * nt;
  }
  if (nt > len / HG_MIN_TILE) nt = len / HG_MIN_TILE;
  return nt < 1 ? 1 : nt;
}

/* An element-wise epilogue over rows 0..R, after column tiles (no row is complete
   before every tile has run). */
typedef struct { hg_epilogue_fn epi; void **table; } hg_epi_ctx;
static void hg_epi_chunk(void *ctx, int64_t lo, int64_t hi, int tid) {
  const hg_epi_ctx *x = (const hg_epi_ctx *)ctx;
  (void)tid;
  x->epi(x->table, lo, hi);
}
static void hg_epilogue_after(hg_epilogue_fn epi, void **table, int64_t R, int64_t nt) {
  hg_epi_ctx x = {epi, table};
  int64_t parts = nt * 4;  /* element-wise rows: chunks are cheap, a late thread holds few */
  hg_par_nt(hg_epi_chunk, &x, R, (R + parts - 1) / parts, nt);
}

/* --- packed B (MKL) -----------------------------------------------------------------
   A packed copy of one product's B: column tile t (columns hg_edge(n, t, tiles, rounds)
   .. hg_edge(n, t + 1, tiles, rounds), the rounds chosen when it was packed)
   packed by cblas_?gemm_pack for exactly that tile's (m, columns, k), so each tile is a
   documented pack/compute pair; MKL's packed data must not move, so the caller keeps
   the buffer where it was packed. */
#define HG_PACK_MAGIC 0x4b434150474848LL  /* "HHGPACK" */
typedef struct {
  int64_t magic, f64, m, n, k, ta, tb, ldb, tiles, rounds;
  int64_t off[HG_PACK_MAX_TILES + 1];  /* byte offset of each tile; off[tiles]: the size */
} hg_packed;

static int hg_packable(const hg_gemm_desc *d) {
  return hg_ilp64 && hg_pack[d->f64] && !d->narrow && d->nb == 1 && d->m > 0 && d->n > 0
         && d->k > 0;
}

/* Column tiles for a packed copy made now (hg_tiles_for); 0 when this product cannot
   be packed. */
int64_t hg_gemm_pack_tiles(const hg_gemm_desc *d) {
  if (!hg_packable(d)) return 0;
  int rounds;
  int64_t tiles = hg_tiles_for(d, d->n, hg_threads_for(d), &rounds);
  if (tiles < hg_col_blocks(d->n)) tiles = hg_col_blocks(d->n);  /* equal tiles, then */
  return tiles > HG_PACK_MAX_TILES ? HG_PACK_MAX_TILES : tiles;
}

/* The rounds a copy packed now with `tiles` tiles is cut in: two where hg_tiles_for
   chooses two rounds of that many tiles now, else one. */
static int hg_pack_rounds(const hg_gemm_desc *d, int64_t tiles) {
  int rounds;
  return hg_tiles_for(d, d->n, hg_threads_for(d), &rounds) == tiles ? rounds : 1;
}

static size_t hg_layout_bytes(const hg_gemm_desc *d, int64_t tiles, int rounds);

static size_t hg_tile_bytes(const hg_gemm_desc *d, int64_t cols) {
  size_t b = ((pack_size_t)hg_pack_size[d->f64])(162, d->m, cols, d->k);  /* CblasBMatrix */
  return (b + 63) / 64 * 64;
}

static size_t hg_layout_bytes(const hg_gemm_desc *d, int64_t tiles, int rounds) {
  size_t total = (sizeof(hg_packed) + 63) / 64 * 64;
  for (int64_t t = 0; t < tiles; t++)
    total += hg_tile_bytes(d, hg_edge(d->n, t + 1, tiles, rounds)
                              - hg_edge(d->n, t, tiles, rounds));
  return total;
}

/* Bytes of a packed copy with `tiles` column tiles (0: not packable): room for either
   cut, so the copy fits whichever hg_gemm_pack chooses when it runs. */
int64_t hg_gemm_pack_size(const hg_gemm_desc *d, int64_t tiles) {
  if (!hg_packable(d) || tiles < 1 || tiles > HG_PACK_MAX_TILES || tiles > d->n) return 0;
  const size_t one = hg_layout_bytes(d, tiles, 1), two = hg_layout_bytes(d, tiles, 2);
  return (int64_t)(one > two ? one : two);
}

/* Pack B (the operand at `B`, as `d` reads it) into `dst` (64-byte aligned, of
   hg_gemm_pack_size(d, tiles) bytes). Returns 0, or -1 when it cannot. */
int hg_gemm_pack(const hg_gemm_desc *d, const void *B, void *dst, int64_t tiles) {
  if (hg_gemm_pack_size(d, tiles) == 0 || ((uintptr_t)dst & 63)) return -1;
  hg_packed *p = (hg_packed *)dst;
  memset(p, 0, sizeof *p);
  p->f64 = d->f64; p->m = d->m; p->n = d->n; p->k = d->k; p->ta = d->ta; p->tb = d->tb;
  p->ldb = d->ldb; p->tiles = tiles;
  const int rounds = hg_pack_rounds(d, tiles);
  p->rounds = rounds;
  int64_t off = (sizeof(hg_packed) + 63) / 64 * 64;
  for (int64_t t = 0; t < tiles; t++) {
    p->off[t] = off;
    off += hg_tile_bytes(d, hg_edge(d->n, t + 1, tiles, rounds)
                            - hg_edge(d->n, t, tiles, rounds));
  }
  p->off[tiles] = off;
  const int64_t es = d->f64 ? 8 : 4;
  const char *b0 = (const char *)B + d->ob * es;
  const int tb = d->tb ? 112 : 111;
#pragma omp parallel for num_threads(HG_NT) schedule(static) if(tiles > 1)
  for (int64_t t = 0; t < tiles; t++) {
    int64_t lo = hg_edge(d->n, t, tiles, rounds), hi = hg_edge(d->n, t + 1, tiles, rounds);
    const char *b = b0 + (d->tb ? lo * d->ldb : lo) * es;  /* columns lo..hi of op(B) */
    char *out = (char *)dst + p->off[t];
    if (d->f64) ((dpack_t)hg_pack[1])(101, 162, tb, d->m, hi - lo, d->k, 1.0,
                                      (const double *)b, d->ldb, (double *)out);
    else ((spack_t)hg_pack[0])(101, 162, tb, d->m, hi - lo, d->k, 1.0f, (const float *)b,
                               d->ldb, (float *)out);
  }
  p->magic = HG_PACK_MAGIC;
  return 0;
}

/* Whether `p` is a packed copy made for this very product. */
static int hg_pack_matches(const hg_gemm_desc *d, const hg_packed *p) {
  return hg_packable(d) && p->magic == HG_PACK_MAGIC && p->f64 == d->f64 && p->m == d->m
         && p->n == d->n && p->k == d->k && p->ta == d->ta && p->tb == d->tb
         && p->ldb == d->ldb && p->tiles >= 1 && p->tiles <= HG_PACK_MAX_TILES
         && (p->rounds == 1 || p->rounds == 2);
}

typedef struct { const hg_gemm_desc *d; const char *a; const hg_packed *p; char *c0; } hg_pk_ctx;
static void hg_packed_chunk(void *ctx, int64_t t0, int64_t t1, int tid) {
  const hg_pk_ctx *x = (const hg_pk_ctx *)ctx;
  const hg_gemm_desc *d = x->d;
  const int64_t es = d->f64 ? 8 : 4, tiles = x->p->tiles, ta = d->ta ? 112 : 111;
  (void)tid;
  for (int64_t t = t0; t < t1; t++) {
    const int rounds = (int)x->p->rounds;
    int64_t lo = hg_edge(d->n, t, tiles, rounds), hi = hg_edge(d->n, t + 1, tiles, rounds);
    const char *b = (const char *)x->p + x->p->off[t];
    char *c = x->c0 + lo * es;
    if (d->f64) ((dcompute_t)hg_compute[1])(101, ta, 151, d->m, hi - lo, d->k,  /* Packed */
        (const double *)x->a, d->lda, (const double *)b, d->ldb, 0.0, (double *)c, d->ldc);
    else ((scompute_t)hg_compute[0])(101, ta, 151, d->m, hi - lo, d->k, (const float *)x->a,
        d->lda, (const float *)b, d->ldb, 0.0f, (float *)c, d->ldc);
  }
}

static void hg_gemm_packed(const hg_gemm_desc *d, const void *A, const hg_packed *p, void *C,
                           hg_epilogue_fn epi, void **table) {
  const int64_t es = d->f64 ? 8 : 4;
  hg_pk_ctx x = {d, (const char *)A + d->oa * es, p, (char *)C + d->oc * es};
  hg_enter();
  hg_par_nt(hg_packed_chunk, &x, p->tiles, 1, HG_NT);
  hg_leave();
  if (epi) hg_epilogue_after(epi, table, d->m, HG_NT);
}

typedef struct {
  const hg_gemm_desc *d;
  const char *a0, *b0;
  char *c0;
  int64_t per, len;
  int rows, rounds;
  hg_epilogue_fn epi;
  void **table;
  const hg_blas_lib *lib;
} hg_tiles_ctx;

/* Tiles t0..t1: product t / per, its rows (or columns) part t % per. */
static void hg_tiles_chunk(void *ctx, int64_t t0, int64_t t1, int tid) {
  const hg_tiles_ctx *x = (const hg_tiles_ctx *)ctx;
  const hg_gemm_desc *d = x->d;
  const int64_t es = hg_es_ab(d), esc = hg_es_c(d), per = x->per, len = x->len;
  (void)tid;
  for (int64_t t = t0; t < t1; t++) {
    int64_t bi = t / per, r = t % per, rest = bi, oa = 0, ob = 0, oc = 0;
    for (int i = d->nbd - 1; i >= 0; i--) {
      int64_t v = rest % d->bshape[i];
      rest /= d->bshape[i];
      oa += v * d->bsa[i]; ob += v * d->bsb[i]; oc += v * d->bsc[i];
    }
    int64_t lo = hg_edge(len, r, per, x->rounds), hi = hg_edge(len, r + 1, per, x->rounds);
    const char *a = x->a0 + oa * es, *b = x->b0 + ob * es;
    char *c = x->c0 + oc * esc;
    if (x->rows) {  /* rows lo..hi of A (row i of A^T is column i of the stored matrix) */
      a += (d->ta ? lo : lo * d->lda) * es;
      c += lo * d->ldc * esc;
      hg_call(x->lib, d, hi - lo, d->n, a, b, c);
      if (x->epi) x->epi(x->table, bi * d->m + lo, bi * d->m + hi);  /* tile in cache */
    } else {  /* columns lo..hi of B and C */
      b += (d->tb ? lo * d->ldb : lo) * es;
      c += lo * esc;
      hg_call(x->lib, d, d->m, hi - lo, a, b, c);
    }
  }
}

/* --- symmetric products: C = op(A) op(A)^T ------------------------------------------
   A Gram matrix (x @ x.T, x.T @ x: one operand read plainly and transposed) is
   symmetric, so half its products need not run. Row strip t computes C[lo:hi, 0:hi] (its
   rows left of the diagonal and its diagonal block), then the strict upper triangle is
   copied from the lower: (T + 1) / 2T of the flops in T equal strips. Strips are claimed
   largest first (the bottom one spans every column), so a thread that finishes early
   takes the small ones. NumPy's matmul goes to ?syrk for the same case; its OpenBLAS
   ssyrk ran 1.4x *slower* than a plain product on 1024 x 256 here (docs/perf.md,
   session 15), so the strips call ?gemm. */
static int hg_symmetric(const hg_gemm_desc *d, const void *A, const void *B) {
  const int64_t es = hg_es_ab(d);
  return d->nb == 1 && d->m == d->n && d->m >= HG_SYM_MIN && d->ta != d->tb &&
         d->lda == d->ldb && d->k > 0 &&
         (const char *)A + d->oa * es == (const char *)B + d->ob * es;
}

typedef struct { const hg_gemm_desc *d; const char *a; char *c; int64_t strips; } hg_sym_ctx;
static void hg_sym_chunk(void *ctx, int64_t t0, int64_t t1, int tid) {
  const hg_sym_ctx *x = (const hg_sym_ctx *)ctx;
  const hg_gemm_desc *d = x->d;
  const int64_t es = hg_es_ab(d), esc = hg_es_c(d), T = x->strips;
  (void)tid;
  for (int64_t t = t0; t < t1; t++) {
    const int64_t s = T - 1 - t, lo = d->m * s / T, hi = d->m * (s + 1) / T;
    const char *a = x->a + (d->ta ? lo : lo * d->lda) * es;
    hg_call(hg_layout_lib(d), d, hi - lo, hi, a, x->a, x->c + lo * d->ldc * esc);  /* B: 0..hi */
  }
}

#define HG_MIRROR_BLOCK 32
/* Rows of blocks b0..b1: C[i][j] = C[j][i] for j > i, 32 x 32 blocks at a time. */
static void hg_mirror_chunk(void *ctx, int64_t b0, int64_t b1, int tid) {
  const hg_sym_ctx *x = (const hg_sym_ctx *)ctx;
  const int64_t m = x->d->m, ld = x->d->ldc, B = HG_MIRROR_BLOCK;
  (void)tid;
  for (int64_t bi = b0; bi < b1; bi++)
    for (int64_t j0 = bi * B; j0 < m; j0 += B)
      for (int64_t i = bi * B; i < (bi + 1) * B && i < m; i++) {
        const int64_t j1 = j0 + B < m ? j0 + B : m;
        if (x->d->f64) {
          double *c = (double *)x->c;
          for (int64_t j = j0 > i ? j0 : i + 1; j < j1; j++) c[i * ld + j] = c[j * ld + i];
        } else {
          float *c = (float *)x->c;
          for (int64_t j = j0 > i ? j0 : i + 1; j < j1; j++) c[i * ld + j] = c[j * ld + i];
        }
      }
}

static void hg_gemm_symmetric(const hg_gemm_desc *d, const void *A, void *C,
                              hg_epilogue_fn epi, void **table) {
  const int64_t es = hg_es_ab(d), esc = hg_es_c(d), nt = hg_threads_for(d);
  int64_t strips = 4 * nt;
  if (strips > d->m / HG_SYM_MIN_STRIP) strips = d->m / HG_SYM_MIN_STRIP;
  if (strips < 2) strips = 2;
  hg_sym_ctx x = {d, (const char *)A + d->oa * es, (char *)C + d->oc * esc, strips};
  hg_enter();
  hg_par_nt(hg_sym_chunk, &x, strips, 1, nt);
  hg_par_nt(hg_mirror_chunk, &x, (d->m + HG_MIRROR_BLOCK - 1) / HG_MIRROR_BLOCK, 1, nt);
  hg_leave();
  if (epi) hg_epilogue_after(epi, table, d->m, nt);
}

/* The tiles of d (no packed copy, no symmetric shortcut) on library L. */
static void hg_gemm_tiles(const hg_blas_lib *L, const hg_gemm_desc *d, const void *A,
                          const void *B, void *C, hg_epilogue_fn epi, void **table) {
  const int64_t es = hg_es_ab(d), esc = hg_es_c(d);
  const int64_t nt = hg_threads_for(d);
  /* Tiles along the longer side of each product; nb * per a multiple of nt (balance).
     One product: two rounds of tiles (hg_edge). Several: whole products when there
     are at least as many as threads, else each in nt / gcd(nb, nt) equal tiles. */
  const int rows = d->m >= d->n;
  const int64_t len = rows ? d->m : d->n;
  int rounds = 1;
  int64_t per = d->nb == 1 ? hg_tiles_for(d, len, nt, &rounds) : nt / hg_gcd(d->nb, nt);
  if (per > len / HG_MIN_TILE) {
    per = len / HG_MIN_TILE;
    rounds = 1;
  }
  if (per < 1) per = 1;
  hg_tiles_ctx x = {d, (const char *)A + d->oa * es, (const char *)B + d->ob * es,
                    (char *)C + d->oc * esc, per, len, rows, rounds, epi, table, L};
  hg_enter();
  hg_par_nt(hg_tiles_chunk, &x, d->nb * per, 1, nt);
  hg_leave();
  if (epi && !rows) hg_epilogue_after(epi, table, d->nb * d->m, nt);
}

void hg_gemm(const hg_gemm_desc *d, const void *A, const void *B, void *C, hg_epilogue_fn epi,
             void **table, const void *packed) {
  if (d->m == 0 || d->n == 0 || d->nb == 0) return;
  if (packed && hg_pack_matches(d, (const hg_packed *)packed)) {
    hg_gemm_packed(d, A, (const hg_packed *)packed, C, epi, table);
    return;
  }
  if (hg_symmetric(d, A, B)) {
    hg_gemm_symmetric(d, A, C, epi, table);
    return;
  }
  hg_gemm_tiles(hg_layout_lib(d), d, A, B, C, epi, table);
}

/* d's product on the library given here, as hg_gemm cuts it, whatever the driver is
   bound to: what blas_choice times, on the driver in use, without rebinding it.
   `set_threads` (OpenBLAS's, or NULL): one BLAS thread for the call. */
void hg_gemm_on(const hg_gemm_desc *d, const void *A, const void *B, void *C, void *s,
                void *dg, int ilp64, void *set_threads) {
  if (d->m == 0 || d->n == 0 || d->nb == 0) return;
  const hg_blas_lib L = {s, dg, ilp64};
  const int saved = set_threads ? ((set_threads_t)set_threads)(1) : 0;
  hg_gemm_tiles(&L, d, A, B, C, 0, 0);
  if (set_threads) ((set_threads_t)set_threads)(saved);
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
    set_threads: int  # int f(int): set the thread count, return the previous one; 0: none
    name: str = "openblas"
    # MKL's packed GEMM (ILP64): s pack_get_size, s pack, s compute, then the same for d
    pack: tuple[int, int, int, int, int, int] | None = None
    # (dtype, address) of each product of 16-bit operands into float (NARROW_SYMBOLS)
    narrow: tuple[tuple[str, int], ...] = ()


def _loaded_libraries() -> list[str]:
    return _loaded(r"(/\S*openblas\S*\.so[\w.]*)")


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


def _numpy_gemm() -> bool:
    """``HOLOGRAM_GEMM=numpy``: GEMM steps stay ``np.matmul`` calls, no BLAS is bound."""
    return os.environ.get("HOLOGRAM_GEMM", "").lower() == "numpy"


def _asked_blas() -> str:
    """The library ``HOLOGRAM_BLAS`` names, normalized ("" when unset)."""
    return os.environ.get("HOLOGRAM_BLAS", "").strip().lower()


@functools.cache
def numpy_blas() -> tuple[Blas | None, str]:
    """(NumPy's OpenBLAS, how it was found) or (None, why not). ``HOLOGRAM_GEMM=numpy``
    answers None too (kept for callers that ask this directly); ``provider()`` is the
    choice GEMM runs on."""
    if _numpy_gemm():
        return None, "HOLOGRAM_GEMM=numpy"

    paths = _loaded_libraries()
    if not paths:
        return None, "no OpenBLAS loaded by NumPy was found in this process"
    for p in paths:
        found = _probe(p)
        if found is not None:
            return found, f"{os.path.basename(p)} ({found.config.strip()})"
    return None, f"{', '.join(paths)}: no cblas_?gemm and openblas_set_num_threads_local"


#: MKL's layers hologram links, by file-name stem: the ILP64 interface (64-bit sizes),
#: the sequential threading layer (no threads of its own: ours split the work), the core.
MKL_LAYERS = ("libmkl_intel_ilp64", "libmkl_sequential", "libmkl_core")
#: The library hologram builds to hold MKL: no code, only its links (DT_NEEDED) to the
#: three layers and where they are (rpath), so that loading it with RTLD_LOCAL keeps
#: every MKL symbol out of the process's global scope.
MKL_SHIM_C = "/* hologram's private handle on MKL (compiler/blas.py) */\nint hg_mkl_shim = 1;\n"


def _mkl_dirs() -> list[str]:
    """Where the ``mkl`` wheel put its libraries: the directories of its recorded files,
    then ``sys.prefix/lib`` (where the wheel installs them; a conda environment too)."""
    dirs: list[str] = []
    try:
        files = importlib.metadata.distribution("mkl").files or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for f in files:
        if f.name.startswith("libmkl_core.so"):
            dirs.append(os.path.dirname(os.path.realpath(str(f.locate()))))
    dirs.append(os.path.realpath(os.path.join(sys.prefix, "lib")))
    return [d for i, d in enumerate(dirs) if d not in dirs[:i]]


def _mkl_layers(d: str) -> list[str] | None:
    """The file names of the three layers in ``d`` (one soname version), or None."""
    for core in sorted(glob.glob(os.path.join(d, "libmkl_core.so.*")), reverse=True):
        version = core[len(os.path.join(d, "libmkl_core.so")):]
        names = [f"{stem}.so{version}" for stem in MKL_LAYERS]
        if all(os.path.isfile(os.path.join(d, n)) for n in names):
            return names
    return None


def _loaded(pattern: str) -> list[str]:
    """Loaded libraries whose path matches ``pattern`` (``/proc/self/maps``)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return []
    return sorted(set(re.findall(pattern, text)))


def _address(lib: ctypes.CDLL, *names: str) -> int:
    fn = _symbol(lib, list(names))
    return 0 if fn is None else ctypes.cast(fn, ctypes.c_void_p).value or 0


def _mkl_shim(d: str, names: list[str]) -> str:
    """Build (once; then from hologram's disk cache) the shim linked to MKL's layers."""
    import subprocess

    from .cc import KERNEL_CACHE, CCompiler, CompileError

    cc = CCompiler.find()
    if cc is None:
        raise CompileError("no C compiler to link MKL with", source=MKL_SHIM_C)
    link = ["-L", d, "-Wl,--no-as-needed", *(f"-l:{n}" for n in names), f"-Wl,-rpath,{d}"]

    def build(src: Any, out: Any) -> None:
        cmd = [*cc.command, "-shared", "-fPIC", "-o", str(out), str(src), *link]
        r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=120,
                           env={**os.environ, "LC_ALL": "C"})
        if r.returncode != 0:
            raise CompileError(f"linking MKL failed: {' '.join(cmd)}\n{r.stderr}",
                               source=MKL_SHIM_C)

    sizes = ",".join(str(os.path.getsize(os.path.join(d, n))) for n in names)
    parts = {"kind": "mkl-shim", "compiler": cc.id, "dir": d, "layers": " ".join(names),
             "sizes": sizes}
    return str(KERNEL_CACHE.get_or_build(parts, MKL_SHIM_C, build))


#: A loaded MKL layer's path in ``/proc/self/maps``.
_MKL_LOADED = r"(/\S*libmkl_\S*\.so[\w.]*)"


def _mkl_found() -> tuple[str, list[str]] | None:
    """(the directory of the ``mkl`` wheel's layers, their file names), or None."""
    return next(((d, n) for d in _mkl_dirs() if (n := _mkl_layers(d))), None)


def mkl_shim_prewarm() -> None:
    """Build MKL's shim into the kernel cache (``prewarm``: on a cold cache its link was
    0.15 s of a first call's critical path), without loading it: :func:`mkl_blas`, on the
    thread that needs MKL, loads and binds it. Nothing is built where MKL is absent, not
    wanted, or loaded already (``mkl_blas`` then leaves MKL alone)."""
    if not sys.platform.startswith("linux") or _numpy_gemm() or _asked_blas() == "openblas":
        return
    found = _mkl_found()
    if found is not None and not _loaded(_MKL_LOADED):
        _mkl_shim(*found)


@functools.cache
def mkl_blas() -> tuple[Blas | None, str]:
    """(MKL from the ``mkl`` wheel, sequential and private to hologram, how) or (None, why).

    Not ``libmkl_rt``: it loads its layers into the process's global scope, where
    PyTorch's libtorch_cpu (which carries its own MKL, symbols exported) binds to them:
    imported after it, PyTorch asked the sequential layer for its thread count and set
    OpenMP (ours too) to one thread. So hologram links a shim of its own to the
    ILP64 interface, sequential and core layers and loads it with RTLD_LOCAL and
    RTLD_DEEPBIND: MKL's symbols stay in that shim's scope, and MKL binds to its own.
    """
    if not sys.platform.startswith("linux"):
        return None, "MKL is used on Linux only"
    found_dir = _mkl_found()
    if found_dir is None:
        return None, "MKL is not installed (pip install hologram[mkl])"
    d, names = found_dir
    already = _loaded(_MKL_LOADED)
    if already:  # its layers are bound already, to a threading layer that is not ours
        return None, f"{already[0]} was loaded by another library; MKL is left to it"
    from .cc import CompileError

    try:
        shim = _mkl_shim(d, names)
        lib = ctypes.CDLL(shim, mode=ctypes.RTLD_LOCAL | getattr(os, "RTLD_DEEPBIND", 0))
    except (CompileError, OSError) as e:
        return None, f"MKL in {d} could not be linked: {str(e).splitlines()[0]}"
    sgemm = _address(lib, "cblas_sgemm_64", "cblas_sgemm")  # ILP64 either way here
    dgemm = _address(lib, "cblas_dgemm_64", "cblas_dgemm")
    if not (sgemm and dgemm):
        return None, f"{d}: no cblas_sgemm and cblas_dgemm"
    pack = tuple(_address(lib, f"cblas_{t}gemm_{op}_64", f"cblas_{t}gemm_{op}") for t in "sd"
                 for op in ("pack_get_size", "pack", "compute"))
    wrong = _mkl_warm_up(sgemm, dgemm)
    if wrong:
        return None, f"{d}: {wrong}"
    narrow = tuple((t, a) for t, sym in NARROW_SYMBOLS.items()
                   if (a := _address(lib, f"{sym}_64", sym)) and _narrow_warm_up(a))
    version = ctypes.create_string_buffer(256)
    get_version = _symbol(lib, ["MKL_Get_Version_String"])
    if get_version is not None:
        get_version(version, len(version))
    short = re.search(r"Version (\d[\d.]*)", version.value.decode(errors="replace"))
    found = Blas(os.path.join(d, names[-1]), version.value.decode(errors="replace"), True,
                 sgemm, dgemm, 0, "mkl", pack if all(pack) else None,  # type: ignore[arg-type]
                 narrow)
    how = (f"MKL {short.group(1) if short else '?'} ({d}: sequential, ILP64"
           f"{', packed B' if found.pack else ''})")
    return found, how


def cblas_gemm(address: int, ct: Any, ilp64: bool) -> Any:
    """A Python callable for the ``cblas_?gemm`` at ``address`` (``ct``: ``c_float`` or
    ``c_double``; ``ilp64``: 64-bit sizes): (layout, transA, transB, m, n, k, alpha, A,
    lda, B, ldb, beta, C, ldc), addresses as ints."""
    i = ctypes.c_int64 if ilp64 else ctypes.c_int32
    return ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_int, ctypes.c_int, i, i, i, ct,
                            ctypes.c_void_p, i, ctypes.c_void_p, i, ct, ctypes.c_void_p,
                            i)(address)


def _mkl_warm_up(sgemm: int, dgemm: int) -> str:
    """One tiny product of each type now: MKL loads its CPU-specific kernels at its
    first call, and they bind while only MKL's own scope can answer. Returns what went
    wrong, or ""."""
    for addr, ct in ((sgemm, ctypes.c_float), (dgemm, ctypes.c_double)):
        fn = cblas_gemm(addr, ct, ilp64=True)
        a, b, c = (ct * 4)(1, 2, 3, 4), (ct * 4)(1, 0, 0, 1), (ct * 4)()
        fn(101, 111, 111, 2, 2, 2, 1.0, a, 2, b, 2, 0.0, c, 2)
        if list(c) != [1, 2, 3, 4]:
            return f"a 2x2 product gave {list(c)}, not [1, 2, 3, 4]"
    return ""


def _narrow_warm_up(address: int) -> bool:
    """One tiny bf16 product on MKL's ``cblas_gemm_bf16bf16f32`` (ILP64) now, as
    ``_mkl_warm_up`` does for the float ones; True if it gave the right result."""
    fn = cblas_gemm(address, ctypes.c_float, ilp64=True)  # sgemm's signature, 16-bit A, B
    a = (ctypes.c_uint16 * 4)(0x3F80, 0x4000, 0x4040, 0x4080)  # 1, 2, 3, 4
    b = (ctypes.c_uint16 * 4)(0x3F80, 0, 0, 0x3F80)  # the identity
    c = (ctypes.c_float * 4)()
    fn(101, 111, 111, 2, 2, 2, 1.0, a, 2, b, 2, 0.0, c, 2)
    return list(c) == [1.0, 2.0, 3.0, 4.0]


#: The BLAS libraries GEMM can run on, by the name ``HOLOGRAM_BLAS`` takes.
PROVIDERS: dict[str, Callable[[], tuple[Blas | None, str]]] = {
    "mkl": mkl_blas, "openblas": numpy_blas}
#: Tried in this order when ``HOLOGRAM_BLAS`` is unset and only one is usable (with both,
#: ``blas_choice`` measures which is faster on this machine): MKL measured faster than
#: OpenBLAS on every model shape, packed or not, on the AVX-512 machine (docs/perf.md,
#: session 9).
DEFAULT_ORDER = ("mkl", "openblas")


_CHOICE_LOCK = threading.Lock()


def _both() -> dict[str, Blas] | None:
    """MKL and OpenBLAS by name when both are usable here, else None."""
    both = {name: PROVIDERS[name]()[0] for name in DEFAULT_ORDER}
    return None if any(found is None for found in both.values()) else both  # type: ignore[return-value]


@functools.cache
def _measured_choice() -> Any:
    """``blas_choice.Choice`` when both libraries are usable and neither ``HOLOGRAM_BLAS``
    nor ``HOLOGRAM_GEMM`` decides; else None. One thread measures (two at once would
    time each other's products); the others wait and read its record."""
    if _numpy_gemm() or _asked_blas():
        return None
    both = _both()
    if both is None:
        return None
    from .blas_choice import choose

    with _CHOICE_LOCK:
        return choose(both["mkl"], both["openblas"])


#: The GEMM driver's layout index (``2 * ta + tb``) of each ``blas_choice`` layout name.
LAYOUT_INDEX = {"NN": 0, "NT": 1, "TN": 2, "TT": 3}


@functools.cache
def second_provider() -> tuple[Blas | None, int]:
    """(the library ``provider()`` did not choose, the layouts it runs as the driver's
    bit mask ``1 << (2 ta + tb)``), where ``blas_choice`` measured it faster for some
    operand layouts; else (None, 0). Measured on first call, when a program first has
    a product in another layout than ``x @ W.T`` (``bind_layouts``)."""
    both = _both()
    if _measured_choice() is None or both is None:
        return None, 0
    from .blas_choice import choose

    with _CHOICE_LOCK:
        choice = choose(both["mkl"], both["openblas"], layouts=True)
    if not choice.other_layouts():
        return None, 0
    other = "openblas" if choice.name == "mkl" else "mkl"
    mask = sum(1 << LAYOUT_INDEX[lay] for lay in choice.other_layouts())
    return PROVIDERS[other]()[0], mask


@functools.cache
def bind_layouts(cc: Any) -> None:
    """Give ``cc``'s GEMM driver (``_runtime_lib``) its second library for the layouts
    measured faster on it (``second_provider``; measured now if not yet), once: called
    when a program about to be compiled has a product whose operands are not read as
    ``x @ W.T``."""
    lib = _runtime_lib(cc)
    second, mask = second_provider() if lib is not None else (None, 0)
    if second is not None:
        bind_second(lib, second, mask)


def bind_second(lib: Any, second: Blas, layouts: int) -> None:
    """Route the operand layouts in the bit mask ``layouts`` (``1 << (2 ta + tb)``) of a
    GEMM driver bound by ``bind_runtime`` to ``second``; the others to its first
    library."""
    lib.hg_gemm_second(second.sgemm, second.dgemm, int(second.ilp64), layouts)


def int64_sizes() -> bool:
    """Whether every library the GEMM driver may call takes 64-bit sizes (ILP64): else a
    product any of whose sizes exceeds 2^31 - 1 stays np.matmul. Both usable libraries
    count where the choice is measured (the second is bound only later)."""
    found, _ = provider()
    if found is None or not found.ilp64:
        return False
    both = _both()
    return _measured_choice() is None or both is None or all(b.ilp64 for b in both.values())


@functools.cache
def provider() -> tuple[Blas | None, str]:
    """(the BLAS hologram's GEMMs and attention call, which one and why), or (None, why
    GEMM stays ``np.matmul``). ``HOLOGRAM_GEMM=numpy`` means np.matmul; ``HOLOGRAM_BLAS``
    names the library (one that is not found falls back to the other, with a warning)."""
    if _numpy_gemm():
        return None, "HOLOGRAM_GEMM=numpy"
    asked = _asked_blas()
    if asked and asked not in PROVIDERS:
        raise ValueError(f"HOLOGRAM_BLAS must be one of {', '.join(PROVIDERS)} (or unset), "
                         f"got {asked!r}")
    if not asked:
        choice = _measured_choice()
        if choice is not None:
            found, how = PROVIDERS[choice.name]()
            return found, f"{how} [{choice.why()}]"
    order = [asked, *(p for p in DEFAULT_ORDER if p != asked)] if asked else DEFAULT_ORDER
    missing: list[str] = []
    for name in order:
        found, how = PROVIDERS[name]()
        if found is None:
            missing.append(f"{name}: {how}")
            continue
        if name == asked:
            why = f"HOLOGRAM_BLAS={asked}"
        elif asked:
            warnings.warn(f"hologram: HOLOGRAM_BLAS={asked} asked for a BLAS that is not "
                          f"usable ({missing[0]}); GEMM runs on {name}", stacklevel=2)
            why = f"HOLOGRAM_BLAS={asked} not usable: {missing[0]}"
        else:
            why = "default: MKL first" + (f"; {'; '.join(missing)}" if missing else "")
        return found, f"{how} [{why}]"
    return None, "; ".join(missing)


def _mkl_narrow() -> dict[str, int]:
    """MKL's products of 16-bit operands (the only library with them) by operand dtype,
    addresses the GEMM driver calls whichever library runs the float products; none where
    MKL is absent or not wanted (``HOLOGRAM_BLAS=openblas``, ``HOLOGRAM_GEMM=numpy``)."""
    if _numpy_gemm() or _asked_blas() == "openblas":
        return {}
    found = mkl_blas()[0]
    return dict(found.narrow) if found is not None else {}


@functools.cache
def narrow_dtypes(cc: Any) -> frozenset[str]:
    """The operand dtypes whose products ``cc``'s GEMM driver runs reading the 16-bit
    operands in place: bf16 on hologram's own kernel where the CPU has AVX-512 BF16
    (``bf16_gemm``: built and bound now, on the first program that has such a product),
    else on MKL's (``NARROW_SYMBOLS``). The planner then stores a widened value's 16-bit
    source for a GEMM instead of a float copy (``schedule.plan``)."""
    from . import bf16_gemm

    lib = _runtime_lib(cc)
    if lib is None:
        return frozenset()
    own = bf16_gemm.kernel(cc)
    if own is not None:
        lib.hg_gemm_narrow(_mkl_narrow().get("bf16"), own)
        return frozenset({"bf16"})
    return frozenset(_mkl_narrow())


@functools.cache
def runtime(cc: Any) -> int | None:
    """The address of ``hg_gemm`` compiled by ``cc`` and bound to the chosen BLAS, or None."""
    lib = _runtime_lib(cc)
    return None if lib is None else ctypes.cast(lib.hg_gemm, ctypes.c_void_p).value


def thread_guard(cc: Any) -> tuple[int, int] | None:
    """Addresses of ``void hg_blas_enter(void)`` and ``hg_blas_leave(void)``: what another
    driver calling the chosen BLAS from OpenMP threads brackets its calls with (one BLAS
    thread meanwhile, counted with the GEMM driver's own calls), or None without BLAS."""
    lib = _runtime_lib(cc)
    if lib is None:
        return None
    return (ctypes.cast(lib.hg_blas_enter, ctypes.c_void_p).value or 0,
            ctypes.cast(lib.hg_blas_leave, ctypes.c_void_p).value or 0)


RUNTIME_KEY = {"runtime": "gemm"}


def runtime_source() -> str:
    """The GEMM driver's C source."""
    return (f"#define HG_PAR_FLOPS {PARALLEL_MIN_FLOPS}.0\n#define HG_MIN_TILE {MIN_TILE}\n"
            f"#define HG_PACK_MAX_TILES {PACK_MAX_TILES}\n"
            f"#define HG_TWO_ROUNDS_FLOPS {TWO_ROUNDS_MIN_FLOPS}.0\n"
            f"#define HG_CALL_COLS {CALL_MAX_COLS}\n#define HG_WIDE_ROWS {WIDE_MIN_ROWS}\n"
            f"#define HG_SYM_MIN {SYMMETRIC_MIN}\n#define HG_SYM_MIN_STRIP {SYMMETRIC_MIN_STRIP}\n"
            + RUNTIME_C)


@functools.cache
def _runtime_lib(cc: Any) -> Any:
    """The GEMM driver compiled by ``cc`` and bound to the chosen BLAS (once), or None."""
    blas, _ = provider()
    if blas is None or cc is None:
        return None
    from .cc import CompileError

    try:
        lib = cc.compile(runtime_source(), RUNTIME_KEY)
    except CompileError as e:  # e.g. no pthread.h: np.matmul still works
        warnings.warn(f"hologram: GEMM runs through np.matmul: the BLAS driver did not "
                      f"build: {str(e).splitlines()[0]}", stacklevel=2)
        return None
    return bind_runtime(lib, blas)


def bind_runtime(lib: Any, blas: Blas, second: Blas | None = None, layouts: int = 0) -> Any:
    """Bind a loaded GEMM driver (``runtime_source``, or a variant of it: the benchmarks'
    ``ab_gemm_driver.py``) to ``blas``, and to ``second`` for the operand layouts in the
    bit mask ``layouts`` (``second_provider``), and declare its pack calls; returns
    ``lib``. OpenBLAS's thread-count setter is passed whenever OpenBLAS is usable, so
    that it runs one thread per tile on whichever layouts it is given later."""
    init = lib.hg_gemm_init
    init.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                     ctypes.c_void_p]
    init.restype = None
    pack = (ctypes.c_void_p * 6)(*blas.pack) if blas.pack else None
    openblas = blas if blas.set_threads else (
        numpy_blas()[0] if _measured_choice() is not None else None)
    init(blas.sgemm, blas.dgemm, (openblas.set_threads if openblas else 0) or None,
         int(blas.ilp64), pack)
    lib.hg_gemm_second.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                                   ctypes.c_int]
    lib.hg_gemm_second.restype = None
    if second is not None and layouts:
        bind_second(lib, second, layouts)
    lib.hg_gemm_narrow.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.hg_gemm_narrow.restype = None
    lib.hg_gemm_narrow(_mkl_narrow().get("bf16"), None)  # hologram's own: when first needed
    for name, args, res in (("hg_gemm_pack_tiles", [ctypes.c_void_p], ctypes.c_int64),
                            ("hg_gemm_pack_size", [ctypes.c_void_p, ctypes.c_int64],
                             ctypes.c_int64),
                            ("hg_gemm_pack", [ctypes.c_void_p] * 3 + [ctypes.c_int64],
                             ctypes.c_int)):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
    return lib


# --- packed B ---------------------------------------------------------------------------
class DescStruct(ctypes.Structure):
    """``hg_gemm_desc`` (GEMM_DESC_C) as ctypes, for the pack calls made from Python."""

    _fields_ = ([(n, ctypes.c_int64) for n in
                 ("nb", "m", "n", "k", "lda", "ldb", "ldc", "oa", "ob", "oc")]
                + [(n, ctypes.c_int32) for n in ("ta", "tb", "f64", "nbd", "narrow")]
                + [(n, ctypes.c_int64 * MAX_BATCH_DIMS)
                   for n in ("bshape", "bsa", "bsb", "bsc")])


def desc_fields(d: GemmDesc) -> dict[str, Any]:
    """The C descriptor's fields for ``d``: what a GEMM step's constant holds
    (``render_c.render_gemm``) and what a pack call passes (``DescStruct``)."""
    pad = (0,) * (MAX_BATCH_DIMS - len(d.batch))
    nb = 1
    for s in d.batch:
        nb *= s
    return {"nb": nb, "m": d.m, "n": d.n, "k": d.k, "lda": d.a.ld, "ldb": d.b.ld,
            "ldc": d.c.ld, "oa": d.a.offset, "ob": d.b.offset, "oc": d.c.offset,
            "ta": int(d.a.trans), "tb": int(d.b.trans), "f64": int(d.dtype == "f64"),
            "nbd": len(d.batch), "narrow": NARROW_CODES.get(d.narrow or "", 0),
            "bshape": (*d.batch, *pad),
            "bsa": (*d.a.batch_strides, *pad), "bsb": (*d.b.batch_strides, *pad),
            "bsc": (*d.c.batch_strides, *pad)}


def _struct(d: GemmDesc) -> DescStruct:
    s = DescStruct()
    for name, v in desc_fields(d).items():
        if isinstance(v, tuple):
            getattr(s, name)[:] = v
        else:
            setattr(s, name, v)
    return s


def may_pack(d: GemmDesc) -> bool:
    """Whether a packed copy of ``d``'s B could speed it up on the chosen BLAS: MKL's pack
    API, one product (no batch), at least PACK_MIN_M rows, nothing empty."""
    found = provider()[0]
    return (found is not None and found.pack is not None and found.ilp64 and not d.batch
            and d.narrow is None and d.m >= PACK_MIN_M and d.n > 0 and d.k > 0)


def pack(cc: Any, d: GemmDesc, b_address: int) -> np.ndarray | None:
    """A packed copy of GEMM ``d``'s B operand, read at ``b_address`` (the buffer B's
    descriptor offsets count from), to pass to the GEMM step; None where the chosen BLAS
    cannot pack it or the copy would take more than ``PACK_MAX_GROWTH`` times B's bytes.
    The copy is valid while the memory at ``b_address`` is unchanged,
    and must stay where it is (MKL's packed data holds its own addresses): the caller
    keeps the returned array alive and unmoved for as long as it passes it."""
    lib = _runtime_lib(cc)
    if lib is None or not may_pack(d) or not b_address:
        return None
    s = _struct(d)
    tiles = lib.hg_gemm_pack_tiles(ctypes.byref(s))
    size = lib.hg_gemm_pack_size(ctypes.byref(s), tiles) if tiles > 0 else 0
    if size <= 0 or size > PACK_MAX_GROWTH * d.k * d.n * (8 if d.dtype == "f64" else 4):
        return None
    raw = np.empty(size + 64, np.uint8)
    start = (-raw.ctypes.data) % 64
    out = raw[start:start + size]
    if lib.hg_gemm_pack(ctypes.byref(s), b_address, out.ctypes.data, tiles) != 0:
        return None
    return out


def describe() -> str:
    """One line for ``hologram info``: how GEMM runs, on which BLAS and why."""
    blas, how = provider()
    if blas is None:
        return f"np.matmul ({how})"
    second, layouts = second_provider()
    if second is not None:
        names = [lay for lay, i in LAYOUT_INDEX.items() if layouts >> i & 1]
        how += (f"; {', '.join(names)} products on {'MKL' if second.name == 'mkl' else 'OpenBLAS'}"
                " (measured faster for those operand layouts)")
    from .bf16_gemm import kernel
    from .cc import CCompiler

    cc = CCompiler.find()
    if cc is not None and "bf16" in narrow_dtypes(cc):
        by = "hologram's AVX-512 BF16 kernel" if kernel(cc) is not None else "MKL"
        how += f"; bf16 operands read as they are by {by}"
    return f"hologram's OpenMP tiles over {how}"
