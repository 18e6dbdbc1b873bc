"""hologram's own C math functions for the CPU backend (``hg_expf``).

Why not glibc's vector ``expf`` (libmvec), which the other transcendentals use:

- **Range cliff.** libmvec computes any lane whose result is zero or subnormal
  (x below about -87.3, and -inf) in a scalar fallback. Softmax over rows half
  masked with -inf (causal attention) took 3.3x as long as over unmasked rows, and
  ``sigmoid`` of large logits (``exp(-x)``, x > 87) hit the same path. ``hg_expf``
  handles every lane with the same vector code.
- **Call cost.** A libmvec call clobbers every vector register, so the loop around
  it spills its live values. Inlined, exp stops being the larger half of softmax's
  row loop (docs/perf.md, session 4, has the interleaved comparisons).

Accuracy is libmvec's: over every float32 in [-104, 89], the largest error against
float64 ``exp`` is 1.95 units of float32 spacing (libmvec: 2.64 by the same count;
``benchmarks/exp_accuracy.py`` measures both).
NaN gives NaN, +inf and any x > 88.72 give +inf, -inf and any x below -103.98 give
+0.0, exactly like ``numpy.exp`` on float32.

The method is ARM optimized-routines' ``v_expf`` (MIT/Apache-2.0): Cody-Waite
reduction ``x = n*ln2 + r`` with ``n`` taken from the mantissa of
``x/ln2 + 1.5*2^23``, and a degree-5 polynomial for ``exp(r) - 1`` on
``|r| <= ln2/2``. One change: ``2^n`` is always built as two factors
``s1 * s2`` (``s1`` = 2^64 or 2^-64, ``s2`` normal), so results near FLT_MAX or
in the subnormal range need no intermediate overflow and no second path. ARM
computes a one-factor result and selects the two-factor one for ``|n| > 126``;
both give the same bits for normal results (multiplying by a power of two is
exact), and dropping the select saves five vector operations per 16 lanes.

``HG_FMAF`` is a fused multiply-add where the target has one (``FP_FAST_FMAF``,
as with ``-march=native`` on any x86-64 since Haswell) and a plain ``a*b+c``
otherwise, so a build without FMA stays inline instead of calling libm's
software ``fmaf``.
"""

from __future__ import annotations

#: C definitions the CPU prelude includes; static inline so GCC vectorises each use.
C_MATH = r"""
#include <string.h>
#ifdef FP_FAST_FMAF
#define HG_FMAF(a, b, c) fmaf((a), (b), (c))
#else
#define HG_FMAF(a, b, c) ((a) * (b) + (c))
#endif
static inline float hg_asf(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t hg_asu(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float hg_expf(float x) {
  float z = HG_FMAF(x, 0x1.715476p+0f, 0x1.8p23f);   /* x/ln2 + 1.5*2^23 */
  float n = z - 0x1.8p23f;                            /* round(x/ln2) */
  float r = HG_FMAF(n, -0x1.62e4p-1f, x);             /* x - n*ln2, two parts */
  r = HG_FMAF(n, -0x1.7f7d1cp-20f, r);
  uint32_t e = hg_asu(z) << 23;                       /* n in the exponent field */
  float r2 = r * r;
  float p = HG_FMAF(0x1.0e4020p-7f, r, 0x1.573e2ep-5f);
  float q = HG_FMAF(0x1.555e66p-3f, r, 0x1.fffdb6p-2f);
  q = HG_FMAF(p, r2, q);
  float poly = HG_FMAF(q, r2, 0x1.ffffecp-1f * r);    /* exp(r) - 1 */
  uint32_t k = n > 0.0f ? 0x5f800000u : 0x1f800000u;  /* s1 = 2^64 or 2^-64 */
  float s1 = hg_asf(k);
  float s2 = hg_asf(e + 0x7f000000u - k);             /* 2^n / s1: always normal */
  float y = HG_FMAF(poly, s2, s2) * s1;               /* * s1 is exact unless subnormal */
  y = x > 0x1.62e42ep6f ? (float)INFINITY : y;        /* overflow, +inf */
  y = x < -0x1.9fe368p6f ? 0.0f : y;                  /* underflow, -inf */
  return y;                                           /* NaN falls through as NaN */
}
"""

__all__ = ["C_MATH"]
