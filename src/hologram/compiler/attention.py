"""Fused attention on the CPU: a C driver, compiled once per process, over NumPy's BLAS.

Why a driver and not a kernel of ISA primitives: the plain formula stores the ``L x S``
score matrix (and, for backward, its probabilities), which at a sequence of 2048 is 16
MiB per head; ATen's CPU kernel and FlashAttention never store it. This driver does
what they do: per task (a batch index and a block of queries) it streams the keys and
values in blocks, computes each block of scores with BLAS (``Q_blk K_blk^T * scale``),
adds the mask and the causal ``-inf``, keeps a running row maximum and sum (the online
softmax: earlier partial sums are rescaled by ``exp(m_old - m_new)``) and accumulates
``P V_blk`` with BLAS. Only per-thread scratch of ``bq x bk`` scores and ``bq x Ev``
accumulators exists. The backward is FlashAttention-2's recurrence: ``D =
rowsum(dO * O)``; per key block and query block the probabilities are recomputed from
the saved log-sum-exp (``P = exp(S - lse)``), then ``dV += P^T dO``, ``dP = dO V^T``,
``dS = P (dP - D)``, ``dQ += scale dS K``, ``dK += scale dS^T Q``. A task owns one
batch index's ``dq``, ``dk`` and ``dv`` (no races); GQA's shared key heads are a
stride-0 batch axis of the operands, and the program sums ``dk``/``dv`` over it.

The semantics are the reference's (``backends/attention_reference.py``), NaN and inf
included: a causal block of keys no query of the task can see is skipped only where
skipping cannot change a bit (the values it would multiply by ``p = 0`` are finite,
and, backward, no product there can overflow), else it is computed like any other.

Operands are read in place through their view chains (``gemm_layout.strided``): a
permuted q/k/v from a model (``[B, L, H, E]`` memory viewed as ``[B, H, L, E]``) is a
BLAS matrix with a leading dimension and batch strides, a GQA expand is a stride-0
batch axis. An operand BLAS cannot read (neither of its last two axes unit-stride)
is copied first (``NeedsMaterialize``). The step calls the driver with a constant
descriptor, like a GEMM step (``compiler/blas.py``): threads are hologram's team
threads, each calling single-threaded BLAS (the GEMM driver's thread guard); without
NumPy's OpenBLAS the same driver uses its own plain C products.
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
from dataclasses import dataclass
from string import Template
from typing import Any

from ..errors import DTypeError, ShapeError
from ..isa.opcodes import ATTENTION_OPERANDS, ATTENTION_PART
from ..isa.value import Value, contiguous_strides
from .blas import GEMM_TYPES_C
from .gemm_layout import MAX_BATCH_DIMS, _element_offset, _matrix, _merge_batch, strided
from .schedule import AttentionPlan, BufRef, NeedsMaterialize

#: Query rows per task and keys per block. Measured on the 2-core AVX-512 VM (docs/perf.md,
#: session 9): larger query blocks pack each key/value block for BLAS once per more rows
#: (64x256 ran 1.3x slower than 256x512 at L = S = 2048), and 256 x 512 f32 scores (512
#: KiB) plus the blocks of K and V stay in the 2 MiB L2.
BLOCK_Q = 256
BLOCK_K = 512
#: The smallest query block a task is cut to so that every thread gets a task.
MIN_BLOCK_Q = 16
#: Work (flops) below which a call runs on the calling thread (as the GEMM driver's).
PARALLEL_MIN_FLOPS = 1 << 20
#: Operand roles, in the order of the descriptor's ``a`` array and the pointer array.
ROLES = ("q", "k", "v", "mask", "dout", "out", "lse", "dq", "dk", "dv", "scratch")
_INT32_MAX = 2**31 - 1

#: The descriptor both the runtime and the programs' attention steps are compiled with.
DESC_C = f"#define HG_ATTN_MAX_BATCH {MAX_BATCH_DIMS}\n#define HG_ATTN_ROLES {len(ROLES)}\n" + r"""
typedef struct {
  int64_t off;                   /* first element, counted from the pointer */
  int64_t rs, cs;                /* row and column strides, in elements (a vector: rs) */
  int64_t ld;                    /* leading dimension as BLAS reads the matrix */
  int32_t trans;                 /* 1: BLAS reads it transposed (column-major) */
  int32_t used;                  /* 0: absent (no mask; a part the program does not use) */
  int64_t bs[HG_ATTN_MAX_BATCH]; /* stride of each batch axis */
} hg_attn_arg;
typedef struct {
  int64_t nb, L, S, E, Ev, bq, bk, scratch, threads;
  int32_t f64, causal, backward, nbd;
  double scale;
  int64_t bshape[HG_ATTN_MAX_BATCH];
  hg_attn_arg a[HG_ATTN_ROLES];  /* q k v mask dout out lse dq dk dv scratch */
} hg_attn_desc;
typedef void (*hg_attn_fn)(const hg_attn_desc *, void *const *);
"""

_HEAD = r"""
#include <stdlib.h>
#include <string.h>
#include <float.h>
#ifdef _OPENMP
#include <omp.h>
#endif
enum { HG_Q, HG_K, HG_V, HG_MASK, HG_DOUT, HG_OUT, HG_LSE, HG_DQ, HG_DK, HG_DV, HG_SCR };
typedef void (*hg_void_fn)(void);
""" + GEMM_TYPES_C + r"""
static void *hg_sgemm, *hg_dgemm;
static hg_void_fn hg_enter, hg_leave;
static int hg_ilp64;

void hg_attn_init(void *s, void *d, void *enter, void *leave, int ilp64) {
  hg_sgemm = s; hg_dgemm = d; hg_enter = (hg_void_fn)enter; hg_leave = (hg_void_fn)leave;
  hg_ilp64 = ilp64;
}

static int hg_fits(int64_t m, int64_t n, int64_t k, int64_t a, int64_t b, int64_t c) {
  return hg_ilp64 || (m <= INT32_MAX && n <= INT32_MAX && k <= INT32_MAX && a <= INT32_MAX
                      && b <= INT32_MAX && c <= INT32_MAX);
}

/* The element offset of batch index b of argument x. */
static int64_t hg_boff(const hg_attn_desc *d, const hg_attn_arg *x, int64_t b) {
  int64_t off = x->off;
  for (int i = d->nbd - 1; i >= 0; i--) {
    off += (b % d->bshape[i]) * x->bs[i];
    b /= d->bshape[i];
  }
  return off;
}
"""

# One copy per dtype: $T the C type, $S the suffix, $EXP/$LOG the functions, $BLAS the
# BLAS routine's name, $MAX the largest finite value.
_TYPED = Template(r"""
/* C[m x n] = alpha op(A) op(B) + beta C, row-major; t = 1 reads the operand transposed. */
static void hg_mm_$S(int ta, int tb, int64_t m, int64_t n, int64_t k, $T alpha, const $T *A,
                     int64_t lda, const $T *B, int64_t ldb, $T beta, $T *C, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {  /* an empty sum (BLAS may leave C alone) */
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) C[i * ldc + j] = beta == 0 ? 0 : beta * C[i * ldc + j];
    return;
  }
  if ($BLAS && hg_fits(m, n, k, lda, ldb, ldc)) {
    int cta = ta ? 112 : 111, ctb = tb ? 112 : 111;
    if (hg_ilp64) (($BLAS64)$BLAS)(101, cta, ctb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
    else (($BLAS32)$BLAS)(101, cta, ctb, (int32_t)m, (int32_t)n, (int32_t)k, alpha, A,
                          (int32_t)lda, B, (int32_t)ldb, beta, C, (int32_t)ldc);
    return;
  }
  for (int64_t i = 0; i < m; i++) {  /* no BLAS in the process: plain products */
    for (int64_t j = 0; j < n; j++) {
      $T acc = 0;
      for (int64_t l = 0; l < k; l++)
        acc += (ta ? A[l * lda + i] : A[i * lda + l]) * (tb ? B[j * ldb + l] : B[l * ldb + j]);
      C[i * ldc + j] = alpha * acc + (beta == 0 ? 0 : beta * C[i * ldc + j]);
    }
  }
}

/* Whether rows [r0, r1) of x (cols columns) are all finite; *amax gets their max |x|. */
static int hg_finite_$S(const $T *x, const hg_attn_arg *a, int64_t r0, int64_t r1,
                        int64_t cols, double *amax) {
  double big = 0;
  for (int64_t r = r0; r < r1; r++) {
    const $T *row = x + r * a->rs;
    for (int64_t c = 0; c < cols; c++) {
      $T v = row[c * a->cs];
      if (!(v - v == 0)) return 0;  /* NaN or inf */
      double av = v < 0 ? -(double)v : (double)v;
      big = av > big ? av : big;
    }
  }
  if (amax) *amax = big > *amax ? big : *amax;
  return 1;
}

/* Forward: rows m0..m0+bq of batch b. sc: bq x bk scores, acc: bq x Ev, mx/sm: bq. */
static void hg_fwd_$S(const hg_attn_desc *d, void *const *P, int64_t b, int64_t m0,
                      int64_t bq, $T *sc, $T *acc, $T *mx, $T *sm) {
  const hg_attn_arg *A = d->a;
  const int64_t S = d->S, Ev = d->Ev, E = d->E, L = d->L;
  const $T *Q = (const $T *)P[HG_Q] + hg_boff(d, &A[HG_Q], b) + m0 * A[HG_Q].rs;
  const $T *K = (const $T *)P[HG_K] + hg_boff(d, &A[HG_K], b);
  const $T *V = (const $T *)P[HG_V] + hg_boff(d, &A[HG_V], b);
  const $T *M = A[HG_MASK].used ? (const $T *)P[HG_MASK] + hg_boff(d, &A[HG_MASK], b)
                                  + m0 * A[HG_MASK].rs : 0;
  const $T scale = ($T)d->scale, NEG = -($T)INFINITY;
  const int64_t mrs = A[HG_MASK].rs, mcs = A[HG_MASK].cs;
  for (int64_t r = 0; r < bq; r++) {
    mx[r] = NEG;
    sm[r] = 0;
  }
  memset(acc, 0, (size_t)(bq * Ev) * sizeof($T));
  int64_t nkeys = S;
  /* Keys past the block's last query are hidden from all its rows (p = 0): skip them
     when 0 * v is 0 for each of them, i.e. v is finite there. */
  if (d->causal && m0 + bq < S && hg_finite_$S(V, &A[HG_V], m0 + bq, S, Ev, 0))
    nkeys = m0 + bq;
  for (int64_t n0 = 0; n0 < nkeys; n0 += d->bk) {
    const int64_t nk = d->bk < nkeys - n0 ? d->bk : nkeys - n0;
    hg_mm_$S(A[HG_Q].trans, !A[HG_K].trans, bq, nk, E, scale, Q, A[HG_Q].ld,
             K + n0 * A[HG_K].rs, A[HG_K].ld, 0, sc, nk);
    for (int64_t r = 0; r < bq; r++) {
      $T *s = sc + r * nk;
      if (M) {
        const $T *mr = M + r * mrs + n0 * mcs;
        for (int64_t j = 0; j < nk; j++) s[j] += mr[j * mcs];
      }
      if (d->causal) {
        int64_t lim = m0 + r - n0 + 1;  /* keys j <= i stay */
        for (int64_t j = lim < 0 ? 0 : lim; j < nk; j++) s[j] = NEG;
      }
      $T bm = NEG;
      int nan = 0;
#pragma omp simd reduction(max:bm) reduction(|:nan)
      for (int64_t j = 0; j < nk; j++) {
        bm = s[j] > bm ? s[j] : bm;
        nan |= s[j] != s[j];
      }
      const $T mold = mx[r];
      const $T mnew = (nan || mold != mold) ? ($T)NAN : (bm > mold ? bm : mold);
      if (mnew == NEG) {  /* every score so far is -inf: p = 0, nothing to rescale */
        for (int64_t j = 0; j < nk; j++) s[j] = 0;
        continue;
      }
      const $T alpha = $EXP(mold - mnew);
      $T sum = 0;
#pragma omp simd reduction(+:sum)
      for (int64_t j = 0; j < nk; j++) {
        $T p = $EXP(s[j] - mnew);
        s[j] = p;
        sum += p;
      }
      sm[r] = sm[r] * alpha + sum;
      mx[r] = mnew;
      if (!(alpha == 1)) {
        $T *ar = acc + r * Ev;
        for (int64_t c = 0; c < Ev; c++) ar[c] *= alpha;
      }
    }
    hg_mm_$S(0, A[HG_V].trans, bq, Ev, nk, 1, sc, nk, V + n0 * A[HG_V].rs, A[HG_V].ld, 1,
             acc, Ev);
  }
  if (A[HG_OUT].used) {
    $T *O = ($T *)P[HG_OUT] + hg_boff(d, &A[HG_OUT], b) + m0 * A[HG_OUT].rs;
    for (int64_t r = 0; r < bq; r++) {
      $T *orow = O + r * A[HG_OUT].rs;
      const $T *ar = acc + r * Ev;
      const int dead = mx[r] == NEG;
      const $T l = sm[r];
      for (int64_t c = 0; c < Ev; c++) orow[c * A[HG_OUT].cs] = dead ? 0 : ar[c] / l;
    }
  }
  if (A[HG_LSE].used) {
    $T *lse = ($T *)P[HG_LSE] + hg_boff(d, &A[HG_LSE], b) + m0 * A[HG_LSE].rs;
    for (int64_t r = 0; r < bq; r++)
      lse[r * A[HG_LSE].rs] = mx[r] == NEG ? 0 : mx[r] + $LOG(sm[r]);
  }
  (void)L;
}

/* Backward of batch index b: this task owns its dq, dk, dv. pb, dpb: bq x bk; D: L. */
static void hg_bwd_$S(const hg_attn_desc *d, void *const *P, int64_t b, $T *pb, $T *dpb,
                      $T *D) {
  const hg_attn_arg *A = d->a;
  const int64_t L = d->L, S = d->S, E = d->E, Ev = d->Ev, bq = d->bq, bk = d->bk;
  const $T *Q = (const $T *)P[HG_Q] + hg_boff(d, &A[HG_Q], b);
  const $T *K = (const $T *)P[HG_K] + hg_boff(d, &A[HG_K], b);
  const $T *V = (const $T *)P[HG_V] + hg_boff(d, &A[HG_V], b);
  const $T *DO = (const $T *)P[HG_DOUT] + hg_boff(d, &A[HG_DOUT], b);
  const $T *O = (const $T *)P[HG_OUT] + hg_boff(d, &A[HG_OUT], b);
  const $T *LSE = (const $T *)P[HG_LSE] + hg_boff(d, &A[HG_LSE], b);
  const $T *M = A[HG_MASK].used ? (const $T *)P[HG_MASK] + hg_boff(d, &A[HG_MASK], b) : 0;
  $T *dQ = A[HG_DQ].used ? ($T *)P[HG_DQ] + hg_boff(d, &A[HG_DQ], b) : 0;
  $T *dK = A[HG_DK].used ? ($T *)P[HG_DK] + hg_boff(d, &A[HG_DK], b) : 0;
  $T *dV = A[HG_DV].used ? ($T *)P[HG_DV] + hg_boff(d, &A[HG_DV], b) : 0;
  const $T scale = ($T)d->scale, NEG = -($T)INFINITY;
  /* the outputs' rows are unit-stride (a program buffer, or a stored permutation of one) */
  const int64_t qr = A[HG_DQ].rs, kr = A[HG_DK].rs, vr = A[HG_DV].rs;
  for (int64_t i = 0; dQ && i < L; i++) memset(dQ + i * qr, 0, (size_t)E * sizeof($T));
  for (int64_t j = 0; dK && j < S; j++) memset(dK + j * kr, 0, (size_t)E * sizeof($T));
  for (int64_t j = 0; dV && j < S; j++) memset(dV + j * vr, 0, (size_t)Ev * sizeof($T));
  for (int64_t i = 0; i < L; i++) {
    const $T *g = DO + i * A[HG_DOUT].rs, *o = O + i * A[HG_OUT].rs;
    $T acc = 0;
    for (int64_t c = 0; c < Ev; c++) acc += g[c * A[HG_DOUT].cs] * o[c * A[HG_OUT].cs];
    D[i] = acc;
  }
  /* Skip query blocks that see none of a key block only if every product there is an
     exact 0: all operands finite, and dO.v and D = rowsum(dO o) cannot overflow. */
  int skip = 0;
  if (d->causal) {
    double mdo = 0, mv = 0, mo = 0, other = 0;
    skip = hg_finite_$S(DO, &A[HG_DOUT], 0, L, Ev, &mdo)
        && hg_finite_$S(V, &A[HG_V], 0, S, Ev, &mv) && hg_finite_$S(O, &A[HG_OUT], 0, L, Ev, &mo)
        && hg_finite_$S(Q, &A[HG_Q], 0, L, E, &other) && hg_finite_$S(K, &A[HG_K], 0, S, E, &other)
        && 4.0 * (double)Ev * mdo * (mv > mo ? mv : mo) < (double)$MAX;
  }
  for (int64_t n0 = 0; n0 < S; n0 += bk) {
    const int64_t nk = bk < S - n0 ? bk : S - n0;
    const int64_t start = skip ? n0 / bq * bq : 0;
    for (int64_t m0 = start; m0 < L; m0 += bq) {
      const int64_t nq = bq < L - m0 ? bq : L - m0;
      hg_mm_$S(A[HG_Q].trans, !A[HG_K].trans, nq, nk, E, scale, Q + m0 * A[HG_Q].rs,
               A[HG_Q].ld, K + n0 * A[HG_K].rs, A[HG_K].ld, 0, pb, nk);
      for (int64_t r = 0; r < nq; r++) {
        $T *s = pb + r * nk;
        const int64_t i = m0 + r;
        if (M) {
          const $T *mr = M + i * A[HG_MASK].rs + n0 * A[HG_MASK].cs;
          for (int64_t j = 0; j < nk; j++) s[j] += mr[j * A[HG_MASK].cs];
        }
        if (d->causal) {
          int64_t lim = i - n0 + 1;
          for (int64_t j = lim < 0 ? 0 : lim; j < nk; j++) s[j] = NEG;
        }
        const $T l = LSE[i * A[HG_LSE].rs];
#pragma omp simd
        for (int64_t j = 0; j < nk; j++) s[j] = s[j] == NEG ? 0 : $EXP(s[j] - l);
      }
      if (dV)
        hg_mm_$S(1, A[HG_DOUT].trans, nk, Ev, nq, 1, pb, nk, DO + m0 * A[HG_DOUT].rs,
                 A[HG_DOUT].ld, 1, dV + n0 * vr, vr);
      if (!dQ && !dK) continue;
      hg_mm_$S(A[HG_DOUT].trans, !A[HG_V].trans, nq, nk, Ev, 1, DO + m0 * A[HG_DOUT].rs,
               A[HG_DOUT].ld, V + n0 * A[HG_V].rs, A[HG_V].ld, 0, dpb, nk);
      for (int64_t r = 0; r < nq; r++) {
        const $T di = D[m0 + r];
        $T *dp = dpb + r * nk;
        const $T *p = pb + r * nk;
#pragma omp simd
        for (int64_t j = 0; j < nk; j++) dp[j] = p[j] * (dp[j] - di);
      }
      if (dQ)
        hg_mm_$S(0, A[HG_K].trans, nq, E, nk, scale, dpb, nk, K + n0 * A[HG_K].rs, A[HG_K].ld,
                 1, dQ + m0 * qr, qr);
      if (dK)
        hg_mm_$S(1, A[HG_Q].trans, nk, E, nq, scale, dpb, nk, Q + m0 * A[HG_Q].rs, A[HG_Q].ld,
                 1, dK + n0 * kr, kr);
    }
  }
}

typedef struct { const hg_attn_desc *d; void *const *P; int64_t per_b; } hg_attn_ctx_$S;

/* Tasks t0..t1 on team thread `tid`, in that thread's block of the scratch. */
static void hg_attn_chunk_$S(void *ctx, int64_t t0, int64_t t1, int tid) {
  const hg_attn_ctx_$S *x = (const hg_attn_ctx_$S *)ctx;
  const hg_attn_desc *d = x->d;
  void *const *P = x->P;
  const int64_t bq = d->bq, L = d->L, per_b = x->per_b;
  $T *mine = ($T *)P[HG_SCR] + tid * d->scratch;
  for (int64_t t = t0; t < t1; t++) {
    const int64_t b = t / per_b;
    if (d->backward) {
      hg_bwd_$S(d, P, b, mine, mine + bq * d->bk, mine + 2 * bq * d->bk);
    } else {
      const int64_t m0 = (t % per_b) * bq;
      const int64_t n = bq < L - m0 ? bq : L - m0;
      hg_fwd_$S(d, P, b, m0, n, mine, mine + bq * d->bk, mine + bq * (d->bk + d->Ev),
                mine + bq * (d->bk + d->Ev + 1));
    }
  }
}

static void hg_attn_$S(const hg_attn_desc *d, void *const *P) {
  const int64_t per_b = d->backward ? 1 : (d->L + d->bq - 1) / d->bq;
  const int64_t total = d->nb * per_b;
  const double flops = 4.0 * (double)d->nb * (double)d->L * (double)d->S
                       * (double)(d->E + d->Ev) * (d->backward ? 2.0 : 1.0);
  int64_t nt = 1;
  if (flops >= HG_ATTN_PAR_FLOPS) nt = HG_NT;
  if (nt > d->threads) nt = d->threads;  /* the scratch holds this many threads' blocks */
  if (nt > total) nt = total;
  if (nt < 1) nt = 1;
  hg_attn_ctx_$S x = {d, P, per_b};
  hg_par_nt(hg_attn_chunk_$S, &x, total, 1, nt);  /* one task per claim (dynamic) */
}
""")

_TAIL = Template(r"""
void hg_attn(const hg_attn_desc *d, void *const *P) {
  if (d->nb <= 0 || d->L <= 0 || d->S <= 0) return;  /* the rules fold these away */
  if (hg_enter) hg_enter();
  $CALL
  if (hg_leave) hg_leave();
}
""")
#: The C type, exp, log, BLAS routine and its two prototypes, and largest value of each
#: dtype the driver is built for.
_DTYPES = {
    "f32": ("float", "hg_expf", "logf", "hg_sgemm", "sgemm64_t", "sgemm32_t", "FLT_MAX"),
    "f64": ("double", "exp", "log", "hg_dgemm", "dgemm64_t", "dgemm32_t", "DBL_MAX"),
}


def runtime_source(dtypes: tuple[str, ...] = ("f32", "f64")) -> str:
    """The driver's C source for ``dtypes`` (a program binds a library holding every
    dtype its attention steps use), after the CPU kernels' prelude."""
    from .cc import C_PRELUDE

    typed = [_TYPED.substitute(T=t, S=s, EXP=e, LOG=lg, BLAS=bl, BLAS64=b64, BLAS32=b32,
                               MAX=mx)
             for s in dtypes for t, e, lg, bl, b64, b32, mx in [_DTYPES[s]]]
    call = (f"hg_attn_{dtypes[0]}(d, P);" if len(dtypes) == 1
            else "if (d->f64) hg_attn_f64(d, P);\n  else hg_attn_f32(d, P);")
    defines = f"#define HG_ATTN_PAR_FLOPS {PARALLEL_MIN_FLOPS}.0\n"
    return "\n".join([C_PRELUDE, defines, DESC_C, _HEAD, *typed, _TAIL.substitute(CALL=call)])


RUNTIME_KEY = {"runtime": "attention"}


@functools.cache
def runtime(cc: Any, dtypes: tuple[str, ...] = ("f32",)) -> int:
    """The address of ``hg_attn`` for ``dtypes`` (sorted names, e.g. ``("f32",)``)
    compiled by ``cc`` (once per process), bound to the BLAS GEMM runs on
    (``blas.provider()``) and the GEMM driver's thread guard when there is one. One
    dtype per library unless a program needs both: a model's first call waits for it,
    and each dtype is half of its compile time."""
    from . import blas

    if not dtypes or any(d not in _DTYPES for d in dtypes):
        raise ValueError(f"attention runtime: dtypes must be among {sorted(_DTYPES)}, "
                         f"got {dtypes!r}")
    lib = cc.compile(runtime_source(dtypes), RUNTIME_KEY)
    found, _ = blas.provider()
    guard = blas.thread_guard(cc) if found is not None else None
    init = lib.hg_attn_init
    init.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int]
    init.restype = None
    if found is None or guard is None:  # plain C products, no thread count to guard
        init(None, None, None, None, 0)
    else:
        init(found.sgemm, found.dgemm, guard[0], guard[1], int(found.ilp64))
    return ctypes.cast(lib.hg_attn, ctypes.c_void_p).value or 0


# --- descriptors --------------------------------------------------------------------------
@dataclass(frozen=True)
class Arg:
    """One operand or result as the driver reads it (see ``DESC_C``)."""

    ref: BufRef
    off: int
    rs: int
    cs: int
    ld: int
    trans: bool
    bs: tuple[int, ...]


@dataclass(frozen=True)
class AttentionDesc:
    """Everything the driver needs for one attention step."""

    dtype: str
    backward: bool
    batch: tuple[int, ...]
    L: int
    S: int
    E: int
    Ev: int
    scale: float
    causal: bool
    bq: int
    bk: int
    scratch: int  # elements per thread
    threads: int
    args: dict[str, Arg]


def max_threads() -> int:
    """Threads the scratch is sized for: the CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def blocks(n_q: int, n_k: int, nb: int) -> tuple[int, int]:
    """(query rows per task, keys per block), never larger than the sequences; query
    blocks shrink (down to MIN_BLOCK_Q) until the ``nb`` batch entries make a task per
    thread (one head of 256 queries would otherwise run on one thread)."""
    bq = max(1, min(BLOCK_Q, n_q))
    per_batch = -(-max_threads() // max(1, nb))
    if per_batch > 1:
        bq = min(bq, max(MIN_BLOCK_Q, -(-n_q // per_batch)))
    return bq, max(1, min(BLOCK_K, n_k))


def scratch_elements(backward: bool, n_q: int, n_k: int, ev: int, nb: int) -> int:
    """Per-thread scratch: forward scores bq x bk, accumulators bq x Ev, row max and sum;
    backward probabilities and their gradients (2 x bq x bk) and D for every query."""
    bq, bk = blocks(n_q, n_k, nb)
    return 2 * bq * bk + n_q if backward else bq * bk + bq * ev + 2 * bq


def operands(step: AttentionPlan) -> dict[str, Value]:
    """The step's operands by role (q, k, v, mask, and backward's dout, out, lse)."""
    names = ATTENTION_OPERANDS[step.kind]
    got = dict(zip(names, step.srcs, strict=False))
    if len(step.srcs) > len(names):
        got["mask"] = step.srcs[-1]
    return got


def _contiguous(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    want = contiguous_strides(shape)
    return all(n == 1 or s == w for n, s, w in zip(shape, strides, want, strict=True))


def describe(step: AttentionPlan, buffers: dict[int, BufRef]) -> AttentionDesc:
    """The driver's descriptor for ``step``; raises NeedsMaterialize for an operand BLAS
    cannot read in place (the scheduler then copies it into a buffer of its own)."""
    ops = operands(step)
    d = step.srcs[0].dtype
    if d.name not in ("f32", "f64"):
        raise DTypeError(f"{step.sinks[0][0].op}.{d}: the cpu backend's attention runs f32 "
                         f"and f64, not {d} (cast the operands first)")
    scratch = step.scratch
    assert scratch is not None, "the scheduler gives every attention step its scratch"
    q, k, v = ops["q"], ops["k"], ops["v"]
    *batch, n_q, e = q.shape
    n_k, ev = k.shape[-2], v.shape[-1]
    nbd = len(batch)
    views: dict[str, tuple[BufRef, int, tuple[int, ...], tuple[int, ...]]] = {}
    for role, x in ops.items():
        sv = strided(x, buffers)
        if sv is None:
            raise NeedsMaterialize(x)
        views[role] = (sv.ref, sv.offset, sv.shape, sv.strides)
    for x, ref in step.sinks:  # the parts: the program's own contiguous buffers
        role = _part_role(step, x)
        off = _element_offset(ref)
        if off is None:
            raise ShapeError(f"{x.op}: its Φ-addressed result at byte {ref.offset} is not "
                             f"aligned to {x.dtype}")
        views[role] = (ref, off, x.shape, step.layouts.get(id(x), contiguous_strides(x.shape)))
    views["scratch"] = (scratch, 0, scratch.shape, contiguous_strides(scratch.shape))
    lay: dict[str, tuple[bool, int]] = {}
    for role, rows, cols in (("q", n_q, e), ("k", n_k, e), ("v", n_k, ev), ("dout", n_q, ev)):
        if role not in views:
            continue
        ref, off, shape, strides = views[role]
        m = _matrix(_Strided(strides), rows, cols)
        if m is None:
            raise NeedsMaterialize(ops[role])
        lay[role] = m
    roles = [r for r in views if r != "scratch"]
    merged, per = _merge_batch(tuple(batch), [views[r][3][:nbd] for r in roles])
    if len(merged) > MAX_BATCH_DIMS:
        for role in ("q", "k", "v", "mask", "dout", "out", "lse"):
            if role in ops and not _contiguous(views[role][2], views[role][3]):
                raise NeedsMaterialize(ops[role])
    args: dict[str, Arg] = {}
    for role, bs in zip(roles, per, strict=True):
        ref, off, shape, strides = views[role]
        rs = strides[nbd] if len(strides) > nbd else 0
        cs = strides[nbd + 1] if len(strides) > nbd + 1 else 0
        trans, ld = lay.get(role, (False, max(1, rs)))
        args[role] = Arg(ref, off, rs, cs, ld, trans, bs)
    args["scratch"] = Arg(scratch, 0, 0, 0, 0, False, (0,) * len(merged))
    nb = math.prod(batch)
    bq, bk = blocks(n_q, n_k, nb)
    backward = step.kind == "backward"
    per_thread = scratch_elements(backward, n_q, n_k, ev, nb)
    first = step.sinks[0][0]
    return AttentionDesc(q.dtype.name, backward, merged, n_q, n_k, e, ev, first.attr("scale"),
                         first.attr("causal"), bq, bk, per_thread, scratch.size // per_thread,
                         args)


@dataclass(frozen=True)
class _Strided:
    """Just the strides, for gemm_layout's matrix test."""

    strides: tuple[int, ...]


def _part_role(step: AttentionPlan, x: Value) -> str:
    return ATTENTION_PART[x.op][1]


def render_step(name: str, d: AttentionDesc, slots: dict[BufRef, int]) -> str:
    """An attention step as a call of the driver with a constant descriptor; the operands'
    pointers come from the slot table like any kernel's."""
    nb = math.prod(d.batch)
    pad = [0] * (MAX_BATCH_DIMS - len(d.batch))

    def arr(xs: tuple[int, ...]) -> str:
        return "{" + ", ".join(str(x) for x in (*xs, *pad)) + "}"

    entries, ptrs = [], []
    for role in ROLES:
        a = d.args.get(role)
        if a is None:
            entries.append("{.used = 0}")
            ptrs.append("0")
            continue
        entries.append(f"{{.off = {a.off}, .rs = {a.rs}, .cs = {a.cs}, .ld = {a.ld}, "
                       f".trans = {int(a.trans)}, .used = 1, .bs = {arr(a.bs)}}}")
        ptrs.append(f"B[{slots[a.ref]}]")
    scale = repr(float(d.scale)) if math.isfinite(d.scale) else (
        "NAN" if math.isnan(d.scale) else ("-" if d.scale < 0 else "") + "INFINITY")
    fields = (f".nb = {nb}, .L = {d.L}, .S = {d.S}, .E = {d.E}, .Ev = {d.Ev}, "
              f".bq = {d.bq}, .bk = {d.bk}, .scratch = {d.scratch}, .threads = {d.threads}, "
              f".f64 = {int(d.dtype == 'f64')}, .causal = {int(d.causal)}, "
              f".backward = {int(d.backward)}, .nbd = {len(d.batch)}, .scale = {scale}, "
              f".bshape = {arr(d.batch)},\n    .a = {{" + ",\n      ".join(entries) + "}")
    return (f"void {name}(void **B) {{\n"
            f"  static const hg_attn_desc d = {{{fields}}};\n"
            f"  void *p[HG_ATTN_ROLES] = {{{', '.join(ptrs)}}};\n"
            "  hg_attn_rt(&d, p);\n"
            "}")


BINDING = ("HG_GLOBAL(hg_attn_fn hg_attn_rt, 0);\n#ifndef HG_PART\n"
           "void hg_bind_attn(void *fn) { hg_attn_rt = (hg_attn_fn)fn; }\n#endif")
