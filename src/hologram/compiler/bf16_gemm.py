"""hologram's own bf16 GEMM kernel (AVX-512 BF16), called by the GEMM driver's tiles.

A bf16 graph's linear layers multiply bf16 weights and activations. MKL's bf16 product
(``cblas_gemm_bf16bf16f32``) converts its operands to float and runs its float kernel on
AMD CPUs (a profile on Zen 4 shows ``mkl_blas_def_xgemm_bf16bf16f32`` feeding
``sgemm_kernel_0_zen``): 86-96 GFLOP/s on one thread, no faster than its sgemm, while
the CPU's ``vdpbf16ps`` multiplies bf16 pairs at twice float's rate. This kernel uses
it: one thread, Zen 4, GFLOP/s against MKL's sgemm and PyTorch's bf16 ``F.linear``
(oneDNN), docs/perf.md session 36: 128x3072x768 ``x @ W.T`` 207 / 91 / 211,
128x768x3072 220 / 95 / 213, 1024x768x768 207 / 97 / 214, 8x768x768 198 / 60 / 101.

``vdpbf16ps`` treats subnormal bf16 inputs as zero and flushes subnormal results (as
oneDNN's kernels, which use it, do): a product smaller than float's normal range is 0.

Its library is built apart from the GEMM driver's (1 s of gcc against the driver's 0.4 s
here), when the first program with a bf16 product is planned (``blas.narrow_dtypes``), so
float models' cold calls never wait for it; the driver calls it through a pointer. Where
the compiler does not target AVX-512 BF16 (``-march=native`` on another CPU) the source
compiles to a portable loop that is never called: ``kernel`` answers None and MKL's
product, or none, runs bf16 products.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

#: ``void hg_bgemm(ta, tb, m, n, k, A, lda, B, ldb, C, ldc)``: C (float, row-major) =
#: op(A) @ op(B) of bf16 operands (``uint16_t`` bits), CBLAS's row-major transposes,
#: beta 0, one thread (scratch is per thread).
BF16_GEMM_C = r"""
/* hg_bgemm: C[m x n] (float, row-major, leading dim ldc) = op(A) @ op(B), where A and B
 * hold bf16 bit patterns (uint16_t = top half of a float), row-major.  ta/tb: 1 means
 * transposed like CblasTrans with CblasRowMajor.  beta = 0 (C overwritten).  Single
 * threaded; all scratch is static __thread, so several threads may call it at once.
 *
 * Numerics: every bf16*bf16 product is exact in float and sums are float (vdpbf16ps,
 * or plain float in the fallback).  Wherever a tile or the odd last k element has to be
 * padded, the padding is a zero in *both* operands or a zero against discarded output,
 * never real data against garbage, so NaN/inf propagate like IEEE float arithmetic.
 *
 * AVX-512 BF16 design.  vdpbf16ps works on bf16 *pairs* along k: 32-bit lane j gets
 * a[2q]*b[2q][j] + a[2q+1]*b[2q+1][j].  Peak on Zen 4 is one zmm vdpbf16ps per cycle
 * (64 flop/cycle, ~230 GFLOP/s measured in L1).  Three kernels, picked per layout:
 *
 *  1. ta=0, tb=1 (x @ W.T, the common case): dot kernel, no packing at all.  Both A
 *     rows and W rows are contiguous along k, so accumulator (r, c) collects
 *     dpbf16(A row r, W row c) 32 k-elements at a time and is summed horizontally once
 *     at the end.  4x4 tiles (6x4 for long k), W blocked to stay in L2.  Measured
 *     ~215-225 GFLOP/s at 128/1024 rows and also at 4..32 rows, where any packing
 *     scheme is dominated by its packing cost.  For short k (< HG_KDOT) with many
 *     rows the final horizontal sums dominate, so that case uses kernel 3.
 *  2. tb=0: A strips are packed into pair words; B rows 2q and 2q+1 are read directly
 *     and paired with vpunpck{l,h}wd (cheap, in-lane), leaving a fixed column
 *     permutation inside each 32-column group that is undone once at the store.
 *     Measured faster than packing B at every m (no B pack/store/reload).
 *  3. otherwise (tb=1 with ta=1, or short k): classic GotoBLAS: pack A strips of 8
 *     rows and B panels of 48 columns (16x16 32-bit transposes) in pair layout; 8x48
 *     micro-kernel = 24 zmm accumulators, 3 loads + 8 broadcasts per 24 vdpbf16ps.
 *
 *  Blocking: K in blocks of <= HG_KC (C stored on the first block, added on later
 *  ones), A in blocks of HG_MC rows (packed A lives in L2: 256 x 768 bf16 = 384 KB).
 *  Alternatives measured and rejected: 6x64 / 12x32 / 14x32 / 4x96 packed kernels
 *  (all <= 8x48), KC 128..512 (768 best once the B panel may live in L2), software
 *  prefetch of the next B panel (no gain; hurt small m), dot tiles 4x6 / 3x8 / 8x3 /
 *  5x5 (<= 4x4/6x4).
 */
#include <stdint.h>
#include <string.h>

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>

/* Tunables (#define before this file to override; defaults measured on Zen 4). */
#define HG_MR 8                  /* packed-A strip height (fixed: kernels assume 8) */
#define HG_NR 48                 /* packed-B panel width, 3 zmm (fixed) */
#ifndef HG_KC
#define HG_KC 768                /* max k elements per K block (even) */
#endif
#ifndef HG_MC
#define HG_MC 256                /* rows of A per packed block (multiple of 8) */
#endif
#ifndef HG_BDL2
#define HG_BDL2 (384 * 1024)     /* tb=0: bytes of B (one K block) kept in L2 */
#endif
#ifndef HG_DOTL2
#define HG_DOTL2 (384 * 1024)    /* dot kernel: bytes of W kept in L2 */
#endif
#ifndef HG_KDOT
#define HG_KDOT 320              /* x @ W.T with k >= this: dot kernel */
#endif
#ifndef HG_DOTM
#define HG_DOTM 24               /* ... and also with m <= this, whatever k */
#endif
#ifndef HG_DOT6K
#define HG_DOT6K 1536            /* dot kernel: 6-row tiles from this k on */
#endif

/* 384 KB + 72 KB per thread */
static __thread uint32_t hg_Ap[HG_MC * (HG_KC / 2)] __attribute__((aligned(64)));
static __thread uint32_t hg_Bp[(HG_KC / 2) * HG_NR] __attribute__((aligned(64)));

/* mask of the first c (0..32) 16-bit elements */
static inline __mmask32 m16(int64_t c) { return c >= 32 ? 0xffffffffu : ((1u << c) - 1u); }
static inline __mmask16 m32(int64_t c) { return c >= 16 ? 0xffff : (__mmask16)((1u << c) - 1u); }

/* In-register transpose of 16x16 32-bit words: r[i] lane j -> r[j] lane i. */
static inline void tr16x16(__m512i r[16])
{
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i]     = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i]     = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    /* now r[4g+s] holds, in 128-bit lane L, rows 4g..4g+3 of column 4L+s */
    for (int i = 0; i < 4; i++) {
        t[i]      = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);       /* lanes 0,2 | 0,2 */
        t[i + 4]  = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xdd);       /* lanes 1,3 | 1,3 */
        t[i + 8]  = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 4; i++) {
        r[i]      = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
        r[i + 8]  = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
        r[i + 4]  = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
        r[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xdd);
    }
}

/* Pack a panel of w lines x kc elements where the pair of line l at pair q is
 * adjacent in memory: src[l*ld + 2q], src[l*ld + 2q + 1]  (A with ta=0, B with tb=1).
 * Output dst[q*W + l], W = panel width (multiple of 16), lines >= w are zero.
 * Done as 16x16 word transposes; masked 16-bit loads zero the odd tail element and
 * never touch memory past the row. */
static void pack_pairs_contig(const uint16_t *src, int64_t ld, int64_t w, int64_t kc,
                              uint32_t *dst, int W)
{
    int64_t kp = (kc + 1) / 2;
    for (int l0 = 0; l0 < W; l0 += 16) {
        for (int64_t q0 = 0; q0 < kp; q0 += 16) {
            __m512i r[16];
            const uint16_t *s = src + l0 * ld + 2 * q0;
            if (l0 + 16 <= w && 2 * q0 + 32 <= kc) {   /* common case: no masking */
                for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512(s + i * ld);
            } else {
                __mmask32 km = m16(kc - 2 * q0);
                for (int i = 0; i < 16; i++)
                    r[i] = l0 + i < w ? _mm512_maskz_loadu_epi16(km, s + i * ld)
                                      : _mm512_setzero_si512();
            }
            tr16x16(r);
            int64_t nq = kp - q0 < 16 ? kp - q0 : 16;
            for (int i = 0; i < nq; i++)
                _mm512_store_si512((__m512i *)(dst + (q0 + i) * W + l0), r[i]);
        }
    }
}

/* Pack an A strip of 8 rows for ta=0 into Ap[q][8]: rows r >= mr are zero.  Scalar is
 * fine: each packed A word is reused across all n columns. */
static void pack_a_strip_contig(const uint16_t *src, int64_t ld, int64_t mr, int64_t kc,
                                uint32_t *dst)
{
    int64_t kp = (kc + 1) / 2, kf = kc / 2;
    for (int r = 0; r < HG_MR; r++) {
        if (r < mr) {
            const uint16_t *s = src + r * ld;
            for (int64_t q = 0; q < kf; q++) {
                uint32_t v;
                memcpy(&v, s + 2 * q, 4);
                dst[q * HG_MR + r] = v;
            }
            if (kp > kf) dst[kf * HG_MR + r] = s[2 * kf];
        } else {
            for (int64_t q = 0; q < kp; q++) dst[q * HG_MR + r] = 0;
        }
    }
}

/* Pack an A strip for ta=1: pair q of row r = src[2q*ld + r], src[(2q+1)*ld + r]. */
static void pack_a_strip_rows(const uint16_t *src, int64_t ld, int64_t mr, int64_t kc,
                              uint32_t *dst)
{
    int64_t kp = (kc + 1) / 2;
    __mmask16 rm = (__mmask16)((1u << mr) - 1u);
    __mmask16 wm = (__mmask16)((1u << HG_MR) - 1u);
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9,
                                         24, 8,
                                         23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (int64_t q = 0; q < kp; q++) {
        __m256i a = _mm256_maskz_loadu_epi16(rm, src + 2 * q * ld);
        __m256i b = (2 * q + 1 < kc) ? _mm256_maskz_loadu_epi16(rm, src + (2 * q + 1) * ld)
                                     : _mm256_setzero_si256();
        __m512i ab = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
        _mm512_mask_storeu_epi32(dst + q * HG_MR, wm, _mm512_permutexvar_epi16(idx, ab));
    }
}

/* ---- kernel 3: packed A and B ----
 * 8 x 48 micro-kernel over kp pair steps (HG_NV = 3 zmm per row).
 * acc=0: C = result, acc=1: C += result.  Edge tiles use masked C access. */
#define HG_NV (HG_NR / 16)
static inline void kernel_packed(int64_t kp, const uint32_t *a, const uint32_t *b,
                          float *C, int64_t ldc, int64_t mr, int64_t nr, int acc)
{
    __m512 c[HG_MR][HG_NV];
    for (int r = 0; r < HG_MR; r++)
        for (int v = 0; v < HG_NV; v++) c[r][v] = _mm512_setzero_ps();
    for (int64_t q = 0; q < kp; q++) {
        __m512bh bv[HG_NV];
        for (int v = 0; v < HG_NV; v++) bv[v] = (__m512bh)_mm512_load_si512(b + q * HG_NR + 16 * v);
        for (int r = 0; r < HG_MR; r++) {
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)a[q * HG_MR + r]);
            for (int v = 0; v < HG_NV; v++) c[r][v] = _mm512_dpbf16_ps(c[r][v], av, bv[v]);
        }
    }
    if (mr == HG_MR && nr == HG_NR) {
        for (int r = 0; r < HG_MR; r++)
            for (int v = 0; v < HG_NV; v++) {
                float *p = C + r * ldc + 16 * v;
                _mm512_storeu_ps(p, acc ? _mm512_add_ps(_mm512_loadu_ps(p), c[r][v]) : c[r][v]);
            }
    } else {
        for (int r = 0; r < HG_MR; r++) {
            if (r >= mr) break;
            for (int v = 0; v < HG_NV; v++) {
                int64_t cols = nr - 16 * v;
                if (cols <= 0) break;
                __mmask16 mk = m32(cols);
                float *p = C + r * ldc + 16 * v;
                __m512 x = c[r][v];
                if (acc) x = _mm512_add_ps(_mm512_maskz_loadu_ps(mk, p), x);
                _mm512_mask_storeu_ps(p, mk, x);
            }
        }
    }
}

/* ---- kernel 2: tb=0 ----
 * R (<= 8) rows of a packed A strip x 32*G columns read straight from the B rows
 * (no B packing: cheaper than pack + store + reload, and for few rows a packed B word
 * would be used only once).  Rows 2q and 2q+1 of B are
 * paired on the fly with vpunpck{l,h}wd, which leaves the columns of each 32-column
 * group in the order {0-3,8-11,16-19,24-27 | 4-7,12-15,20-23,28-31}; the accumulators
 * are put back in order once, at the store (two vpermt2ps). */
static inline __attribute__((always_inline)) void
bdirect_tile(const int R, const int G, int64_t kc, const uint32_t *a, const uint16_t *B,
             int64_t ldb, float *C, int64_t ldc, int64_t nr, int acc)
{
    __m512 c[16];   /* R * 2G <= 16; flat and small so gcc keeps it in registers */
    __mmask32 lm[4];
    for (int g = 0; g < G; g++) lm[g] = m16(nr - 32 * g > 0 ? nr - 32 * g : 0);
    for (int r = 0; r < R; r++)
        for (int v = 0; v < 2 * G; v++) c[r * 2 * G + v] = _mm512_setzero_ps();
    int64_t kp = (kc + 1) / 2;
    for (int64_t q = 0; q < kp; q++) {
        const uint16_t *s0 = B + 2 * q * ldb;
        int has1 = 2 * q + 1 < kc;                 /* odd tail: second element is 0 */
        __m512bh b[8];
        for (int g = 0; g < G; g++) {
            __m512i r0 = _mm512_maskz_loadu_epi16(lm[g], s0 + 32 * g);
            __m512i r1 = has1 ? _mm512_maskz_loadu_epi16(lm[g], s0 + ldb + 32 * g)
                              : _mm512_setzero_si512();
            b[2 * g] = (__m512bh)_mm512_unpacklo_epi16(r0, r1);
            b[2 * g + 1] = (__m512bh)_mm512_unpackhi_epi16(r0, r1);
        }
        for (int r = 0; r < R; r++) {
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)a[q * HG_MR + r]);
            for (int v = 0; v < 2 * G; v++)
                c[r * 2 * G + v] = _mm512_dpbf16_ps(c[r * 2 * G + v], av, b[v]);
        }
    }
    const __m512i i0 = _mm512_set_epi32(23, 22, 21, 20, 7, 6, 5, 4, 19, 18, 17, 16, 3, 2, 1, 0);
    const __m512i i1 = _mm512_set_epi32(31, 30, 29, 28, 15, 14, 13, 12, 27, 26, 25, 24, 11, 10,
                                        9, 8);
    /* fully unrolled so that c[] never needs to live in memory (else gcc spills it
     * every k step) */
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int g = 0; g < G; g++) {
            __m512 o[2];
            o[0] = _mm512_permutex2var_ps(c[r * 2 * G + 2 * g], i0, c[r * 2 * G + 2 * g + 1]);
            o[1] = _mm512_permutex2var_ps(c[r * 2 * G + 2 * g], i1, c[r * 2 * G + 2 * g + 1]);
#pragma GCC unroll 2
            for (int v = 0; v < 2; v++) {
                int64_t cols = nr - 32 * g - 16 * v;
                if (cols <= 0) break;
                __mmask16 mk = m32(cols);
                float *p = C + r * ldc + 32 * g + 16 * v;
                __m512 x = o[v];
                if (acc) x = _mm512_add_ps(_mm512_maskz_loadu_ps(mk, p), x);
                _mm512_mask_storeu_ps(p, mk, x);
            }
        }
}

/* One packed A strip of mr (<= 8) rows against all n columns of row-major B. */
static void bdirect_strip(int64_t mr, int64_t n, int64_t kc, const uint32_t *a,
                          const uint16_t *B, int64_t ldb, float *C, int64_t ldc, int acc)
{
    int G = mr > 4 ? 1 : mr > 2 ? 2 : 4;          /* 32*G columns per tile, <= 16 accumulators */
    for (int64_t j0 = 0; j0 < n; j0 += 32 * G) {
        int64_t nr = n - j0 < 32 * G ? n - j0 : 32 * G;
        const uint16_t *b = B + j0;
        float *c = C + j0;
        switch (mr) {
        case 1: bdirect_tile(1, 4, kc, a, b, ldb, c, ldc, nr, acc); break;
        case 2: bdirect_tile(2, 4, kc, a, b, ldb, c, ldc, nr, acc); break;
        case 3: bdirect_tile(3, 2, kc, a, b, ldb, c, ldc, nr, acc); break;
        case 4: bdirect_tile(4, 2, kc, a, b, ldb, c, ldc, nr, acc); break;
        case 5: bdirect_tile(5, 1, kc, a, b, ldb, c, ldc, nr, acc); break;
        case 6: bdirect_tile(6, 1, kc, a, b, ldb, c, ldc, nr, acc); break;
        case 7: bdirect_tile(7, 1, kc, a, b, ldb, c, ldc, nr, acc); break;
        default: bdirect_tile(8, 1, kc, a, b, ldb, c, ldc, nr, acc); break;
        }
    }
}

/* ---- kernel 1: dot kernel for ta=0, tb=1 (x @ W.T) ----
 * Accumulator (r,c) gets dpbf16(A row r [32 bf16], W row c [32 bf16]) over k, then one
 * horizontal sum.  No packing; the k tail uses zero-masked loads on *both* operands
 * (0*0 padding), which also never reads past a row. */

/* Horizontal sums of 4 vectors -> [sum v0, sum v1, sum v2, sum v3]. */
static inline __m128 hsum4(__m512 v0, __m512 v1, __m512 v2, __m512 v3)
{
    __m512 a = _mm512_add_ps(_mm512_shuffle_f32x4(v0, v1, 0x44),
                             _mm512_shuffle_f32x4(v0, v1, 0xee));
    __m512 b = _mm512_add_ps(_mm512_shuffle_f32x4(v2, v3, 0x44),
                             _mm512_shuffle_f32x4(v2, v3, 0xee));
    /* 128-bit lane L of c holds 4 partial sums of v_L */
    __m512 c = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xdd));
    c = _mm512_add_ps(c, _mm512_permute_ps(c, 0x4e));
    c = _mm512_add_ps(c, _mm512_permute_ps(c, 0xb1));
    const __m512i first = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0);
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(first, c));
}

/* R rows of A x NC rows of W (R*NC accumulators); nc <= NC valid columns. */
static inline __attribute__((always_inline)) void
dot_tile(const int R, const int NC, int64_t k, const uint16_t *A, int64_t lda,
         const uint16_t *W, int64_t ldb, int64_t nc, float *C, int64_t ldc)
{
    __m512 acc[24];   /* R * NC <= 24; flat and small so gcc keeps it in registers */
    for (int r = 0; r < R; r++)
        for (int c = 0; c < NC; c++) acc[r * NC + c] = _mm512_setzero_ps();
    const uint16_t *wr[8];
    /* columns past nc re-read a valid row (results discarded), so no out-of-range access */
    for (int c = 0; c < NC; c++) wr[c] = W + (c < nc ? c : 0) * ldb;
    int64_t p = 0;
    for (; p + 32 <= k; p += 32) {
        __m512bh a[6];
        for (int r = 0; r < R; r++) a[r] = (__m512bh)_mm512_loadu_si512(A + r * lda + p);
        for (int c = 0; c < NC; c++) {
            __m512bh w = (__m512bh)_mm512_loadu_si512(wr[c] + p);
            for (int r = 0; r < R; r++)
                acc[r * NC + c] = _mm512_dpbf16_ps(acc[r * NC + c], a[r], w);
        }
    }
    if (p < k) {
        __mmask32 km = m16(k - p);
        __m512bh a[6];
        for (int r = 0; r < R; r++) a[r] = (__m512bh)_mm512_maskz_loadu_epi16(km, A + r * lda + p);
        for (int c = 0; c < NC; c++) {
            __m512bh w = (__m512bh)_mm512_maskz_loadu_epi16(km, wr[c] + p);
            for (int r = 0; r < R; r++)
                acc[r * NC + c] = _mm512_dpbf16_ps(acc[r * NC + c], a[r], w);
        }
    }
    const __m512 z = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int c = 0; c < NC; c += 4) {
            __m128 s = hsum4(acc[r * NC + c], c + 1 < NC ? acc[r * NC + c + 1] : z,
                             c + 2 < NC ? acc[r * NC + c + 2] : z,
                             c + 3 < NC ? acc[r * NC + c + 3] : z);
            int64_t cols = nc - c;
            if (cols >= 4) _mm_storeu_ps(C + r * ldc + c, s);
            else if (cols > 0)
                _mm_mask_storeu_ps(C + r * ldc + c, (__mmask8)((1u << cols) - 1u), s);
        }
}

/* Tile shape per number of A rows R: R x NC accumulators, NC chosen so there are
 * >= 8 independent accumulator chains (vdpbf16ps latency) and <= 24 accumulators. */
static void dot_rows(int R, int64_t n, int64_t k, const uint16_t *A, int64_t lda,
                     const uint16_t *W, int64_t ldb, float *C, int64_t ldc)
{
    int NC = R <= 2 ? 8 : 4;   /* must match the calls below */
    for (int64_t j = 0; j < n; j += NC) {
        int64_t nc = n - j < NC ? n - j : NC;
        const uint16_t *w = W + j * ldb;
        float *c = C + j;
        switch (R) {
        case 1: dot_tile(1, 8, k, A, lda, w, ldb, nc, c, ldc); break;
        case 2: dot_tile(2, 8, k, A, lda, w, ldb, nc, c, ldc); break;
        case 3: dot_tile(3, 4, k, A, lda, w, ldb, nc, c, ldc); break;
        case 4: dot_tile(4, 4, k, A, lda, w, ldb, nc, c, ldc); break;
        case 5: dot_tile(5, 4, k, A, lda, w, ldb, nc, c, ldc); break;
        default: dot_tile(6, 4, k, A, lda, w, ldb, nc, c, ldc); break;
        }
    }
}

static void dot_gemm(int64_t m, int64_t n, int64_t k, const uint16_t *A, int64_t lda,
                     const uint16_t *W, int64_t ldb, float *C, int64_t ldc)
{
    /* 4x4 tiles measured best for k ~ 768; for long k (A/W rows no longer fit L1)
     * 6x4 (fewer loads per vdpbf16ps) is better. */
    int dr = k >= HG_DOT6K ? 6 : 4;
    int64_t nb = HG_DOTL2 / (2 * k);
    nb = nb < 8 ? 8 : nb & ~(int64_t)7;
    for (int64_t j0 = 0; j0 < n; j0 += nb) {
        int64_t nbb = n - j0 < nb ? n - j0 : nb;
        for (int64_t i = 0; i < m; i += dr) {
            int R = m - i < dr ? (int)(m - i) : dr;
            dot_rows(R, nbb, k, A + i * lda, lda, W + j0 * ldb, ldb, C + i * ldc + j0, ldc);
        }
    }
}

void hg_bgemm(int ta, int tb, int64_t m, int64_t n, int64_t k,
              const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb,
              float *C, int64_t ldc)
{
    if (m <= 0 || n <= 0) return;
    if (k <= 0) {
        for (int64_t i = 0; i < m; i++) memset(C + i * ldc, 0, (size_t)n * sizeof(float));
        return;
    }
    /* x @ W.T: dot kernel unless k is short and m large (then the per-tile
     * horizontal sums cost more than packing B for the outer-product kernel). */
    if (!ta && tb && (k >= HG_KDOT || m <= HG_DOTM)) {
        dot_gemm(m, n, k, A, lda, B, ldb, C, ldc);
        return;
    }
    uint32_t *Ap = hg_Ap, *Bp = hg_Bp;
    /* K blocks of (nearly) equal even size <= HG_KC, e.g. k = 800 -> 400 + 400 rather
     * than 768 + 32 (a short last block would pay the full C read/write). */
    int64_t nkb = (k + HG_KC - 1) / HG_KC, kb = (k + nkb - 1) / nkb;
    kb += kb & 1;
    for (int64_t p0 = 0; p0 < k; p0 += kb) {
        int64_t kc = k - p0 < kb ? k - p0 : kb;
        int64_t kp = (kc + 1) / 2;
        int acc = p0 > 0;
        for (int64_t i0 = 0; i0 < m; i0 += HG_MC) {
            int64_t mc = m - i0 < HG_MC ? m - i0 : HG_MC;
            for (int64_t ir = 0; ir < mc; ir += HG_MR) {
                int64_t mr = mc - ir < HG_MR ? mc - ir : HG_MR;
                uint32_t *dst = Ap + ir * kp;
                if (!ta) pack_a_strip_contig(A + (i0 + ir) * lda + p0, lda, mr, kc, dst);
                else     pack_a_strip_rows(A + p0 * lda + i0 + ir, lda, mr, kc, dst);
            }
            if (!tb) {
                /* column blocks of B small enough to stay in L2 while all strips pass */
                int64_t nbd = HG_BDL2 / (2 * kc);
                nbd = nbd < 128 ? 128 : nbd & ~(int64_t)127;
                for (int64_t j0 = 0; j0 < n; j0 += nbd) {
                    int64_t nb = n - j0 < nbd ? n - j0 : nbd;
                    for (int64_t ir = 0; ir < mc; ir += HG_MR) {
                        int64_t mr = mc - ir < HG_MR ? mc - ir : HG_MR;
                        bdirect_strip(mr, nb, kc, Ap + ir * kp, B + p0 * ldb + j0, ldb,
                                      C + (i0 + ir) * ldc + j0, ldc, acc);
                    }
                }
                continue;
            }
            for (int64_t j0 = 0; j0 < n; j0 += HG_NR) {
                int64_t nr = n - j0 < HG_NR ? n - j0 : HG_NR;
                pack_pairs_contig(B + j0 * ldb + p0, ldb, nr, kc, Bp, HG_NR);
                for (int64_t ir = 0; ir < mc; ir += HG_MR) {
                    int64_t mr = mc - ir < HG_MR ? mc - ir : HG_MR;
                    kernel_packed(kp, Ap + ir * kp, Bp, C + (i0 + ir) * ldc + j0, ldc, mr, nr, acc);
                }
            }
        }
    }
}

#else  /* portable fallback: correct, not fast */

static inline float hg_bf2f(uint16_t h)
{
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)h << 16;
    return v.f;
}

void hg_bgemm(int ta, int tb, int64_t m, int64_t n, int64_t k,
              const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb,
              float *C, int64_t ldc)
{
    for (int64_t i = 0; i < m; i++) {
        float *c = C + i * ldc;
        for (int64_t j = 0; j < n; j++) c[j] = 0.0f;
        for (int64_t p = 0; p < k; p++) {
            float a = hg_bf2f(ta ? A[p * lda + i] : A[i * lda + p]);
            if (tb) {
                for (int64_t j = 0; j < n; j++) c[j] += a * hg_bf2f(B[j * ldb + p]);
            } else {
                const uint16_t *b = B + p * ldb;
                for (int64_t j = 0; j < n; j++) c[j] += a * hg_bf2f(b[j]);
            }
        }
    }
}
#endif
int hg_bgemm_native(void) {
#if defined(__AVX512BF16__) && defined(__AVX512F__)
  return 1;
#else
  return 0;
#endif
}
"""

KERNEL_KEY = {"runtime": "bf16-gemm"}


@functools.cache
def kernel(cc: Any) -> int | None:
    """The address of ``hg_bgemm`` built by ``cc`` (once per process), or None where it
    would not use AVX-512 BF16 (or does not build)."""
    from .cc import CompileError

    try:
        lib = cc.compile(BF16_GEMM_C, KERNEL_KEY, team=False)
    except CompileError:
        return None
    lib.hg_bgemm_native.restype = ctypes.c_int
    if not lib.hg_bgemm_native():
        return None
    return ctypes.cast(lib.hg_bgemm, ctypes.c_void_p).value or None
