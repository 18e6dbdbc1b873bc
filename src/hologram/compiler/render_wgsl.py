"""Render scheduled kernels as WGSL: the C renderer's loop nests for WebGPU compute.

The mapping to the GPU is the CUDA renderer's: a flat element-wise kernel is a
grid-stride loop, a kernel with an outer loop gives each workgroup one outer
index at a time and spreads the inner (row) loops over its invocations, and a
row's reductions become workgroup reductions through ``var<workgroup>`` memory
and ``workgroupBarrier()``. What differs from C is spelled here:

* WGSL has no pointer casts, so every buffer slot the kernel touches is its own
  ``var<storage, read_write> bN: array<T>`` binding (binding N = slot N). The
  boundary arena is bound as ``array<f32>`` over the byte range the program
  uses, so Φ-addressed values are indices into it.
* Each kernel becomes its own shader module (only its bindings, only the
  helpers it calls), so pipelines get exactly the bind-group layout they use.
* WGSL compilers may assume finite math (WGSL leaves NaN/inf behaviour to the
  implementation, and Naga emits SPIR-V without float-controls, so Mesa folds
  ``x * 0.0`` to ``0.0``, ``x - x`` to ``0.0``, ``x != x`` to ``false``,
  ``(a + b) - b`` to ``a`` and ``log(exp(x))`` to ``x``; measured on lavapipe).
  The ISA promises NumPy's IEEE results, so every literal goes through ``hg_k``,
  and every second use of a value and every math function's result through
  ``hg_o`` (bits XOR a salted runtime zero): the driver never sees a constant, or
  one value twice in an expression, which is what those rewrites need. NaN tests
  look at bits, and math functions are helpers that handle their own domain
  edges (log/sqrt of negatives, denormals, pow of negative bases, sin/cos
  outside [-pi, pi] through Payne-Hanek reduction, tanh and log near their
  cancellation points) instead of trusting each driver's intrinsic there.
* Products reduce with their own exponent (``hg_prod``), as the C backend's
  double accumulator does; sums use Kahan compensation per invocation.
* WGSL has no erf: ``hg_erf`` is a Taylor series below 0.5 and the Numerical
  Recipes erfc fit (fractional error < 1.2e-7) above.
* WGSL has no f64 or i64 (and no 1-byte bool in storage): those raise
  DTypeError naming the dtype; f16 needs the adapter's ``shader-f16``.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field

import numpy as np

from ..errors import DTypeError, ShapeError
from ..isa.dtypes import DType
from ..isa.dtypes import f32 as F32
from ..isa.opcodes import MATH_UNARY, SPECIAL, Group, Op, group
from ..isa.value import Value
from . import attention_gpu, special_math
from .render_c import Expr, Scope
from .render_gpu import GPURenderer
from .schedule import AttentionPlan, BufRef, GemmPlan, KernelPlan, NeedsMaterialize, Schedule

WORKGROUP = 256  # invocations per workgroup for element-wise and row kernels
TILE = 16  # GEMM: TILE x TILE invocations per workgroup, K staged TILE at a time
BLOCK = 64  # GEMM: each workgroup computes a BLOCK x BLOCK block of C (4x4 per invocation)
MAX_GROUPS = 65535  # WebGPU's guaranteed maxComputeWorkgroupsPerDimension

WGSL_TYPES = {"f32": "f32", "f16": "f16", "i32": "i32", "u32": "u32", "bool": "bool"}
#: Why the integer dtypes WGSL lacks are refused (wgsl_type's error names the dtype).
_NO_INT = {8: "WGSL storage has no 8-bit integers", 16: "WGSL storage has no 16-bit "
           "integers", 64: "WGSL has no 64-bit integers"}

# Helper functions: name -> (WGSL source, helpers it calls). Emitted only when used.
_HELPERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "hg_bits": ("""
// A special value (NaN, inf) the compiler cannot constant-fold: hg_z is a runtime zero.
fn hg_bits(bits: u32) -> f32 { return bitcast<f32>(bits ^ hg_z); }""", ()),
    "hg_k": ("""
// A literal the compiler cannot see: s salts each occurrence (hg_z * s is a runtime
// zero the compiler cannot prove), so finite-math folds such as x * 0 -> 0 or
// (x + k) - k -> x cannot fire, and two uses of one literal stay two values.
fn hg_k(bits: u32, s: u32) -> f32 { return bitcast<f32>(bits ^ (hg_z * s)); }""", ()),
    "hg_o": ("""
// An opaque copy of x (salted like hg_k): a value used twice reaches the compiler as
// two values, so x - x, x / x, x == x, (a + b) - b, a * b + a ... are computed, not
// simplified (those rewrites are wrong for NaN and inf).
fn hg_o(x: f32, s: u32) -> f32 { return bitcast<f32>(bitcast<u32>(x) ^ (hg_z * s)); }""",
             ()),
    "hg_isnan": ("""
fn hg_isnan(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }""", ()),
    "hg_isinf": ("""
fn hg_isinf(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) == 0x7f800000u; }""", ()),
    "hg_isfinite": ("""
fn hg_isfinite(x: f32) -> bool { return (bitcast<u32>(x) & 0x7f800000u) != 0x7f800000u; }""",
                    ()),
    "hg_neg": ("""
fn hg_neg(x: f32) -> f32 { return bitcast<f32>(bitcast<u32>(x) ^ (0x80000000u ^ hg_z)); }""",
               ()),
    "hg_min": ("""
// NumPy's minimum: NaN wins; a tie (0.0 vs -0.0) gives the second operand.
fn hg_min(a: f32, b: f32) -> f32 { return select(b, a, a < b || hg_isnan(a)); }""",
               ("hg_isnan",)),
    "hg_max": ("""
fn hg_max(a: f32, b: f32) -> f32 { return select(b, a, a > b || hg_isnan(a)); }""",
               ("hg_isnan",)),
    "hg_sqrt": ("""
fn hg_sqrt(x: f32) -> f32 {
  if (x < 0.0) { return hg_bits(0x7fc00000u); }
  return sqrt(x);
}""", ("hg_bits",)),
    "hg_log": ("""
// log with IEEE edges, denormals scaled into range, and a series near 1
// (log(x) = 2 atanh((x-1)/(x+1))) where drivers' log loses relative accuracy.
fn hg_log(x: f32) -> f32 {
  if (hg_isnan(x) || x < 0.0) { return hg_bits(0x7fc00000u); }
  if (x == 0.0) { return hg_bits(0xff800000u); }
  if (x < 1.17549435e-38) { return log(x * 16777216.0) - 16.635532333438686; }
  if (x > 0.7 && x < 1.4) {
    let u = (x - 1.0) / (x + 1.0);
    let u2 = u * u;
    return 2.0 * u * (1.0 + u2 * (1.0 / 3.0 + u2 * (0.2 + u2 * (1.0 / 7.0 + u2 * (1.0 / 9.0
        + u2 * (1.0 / 11.0 + u2 * (1.0 / 13.0 + u2 / 15.0)))))));
  }
  return log(x);
}""", ("hg_isnan", "hg_bits")),
    "hg_log2": ("""
fn hg_log2(x: f32) -> f32 { return hg_log(x) * 1.4426950408889634; }""", ("hg_log",)),
    "hg_tanh": ("""
// tanh: a series near 0 (drivers compute (e^2x-1)/(e^2x+1), which cancels there),
// (1-t)/(1+t) with t = e^-2|x| elsewhere (no overflow for large |x|).
fn hg_tanh(x: f32) -> f32 {
  let a = abs(x);
  if (a < 0.25) {
    let x2 = x * x;
    return x * (1.0 + x2 * (-0.3333333333333333 + x2 * (0.13333333333333333
        + x2 * (-0.05396825396825397 + x2 * (0.021869488536155203
        + x2 * (-0.008863235529902197 + x2 * 0.003592128036572481))))));
  }
  let t = exp(-2.0 * a);
  let r = (1.0 - t) / (1.0 + t);
  return select(r, -r, x < 0.0);
}""", ()),
    "hg_sigmoid": ("""
fn hg_sigmoid(x: f32) -> f32 { return 1.0 / (1.0 + exp(hg_neg(x))); }""", ("hg_neg",)),
    "hg_erf": ("""
// erf: Taylor series for |x| < 0.5; above, 1 - erfc with the Numerical Recipes
// Chebyshev fit (fractional error < 1.2e-7). WGSL has no erf of its own.
fn hg_erf(x: f32) -> f32 {
  let a = abs(x);
  if (a < 0.5) {
    let x2 = x * x;
    return x * 1.1283791670955126 * (1.0 + x2 * (-0.3333333333333333 + x2 * (0.1
        + x2 * (-0.023809523809523808 + x2 * (0.004629629629629629
        + x2 * (-0.0007575757575757576 + x2 * (0.00010683760683760684
        + x2 * -1.3227513227513228e-05)))))));
  }
  let t = 1.0 / (1.0 + 0.5 * a);
  let p = -a * a - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418
      + t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587
      + t * (-0.82215223 + t * 0.17087277))))))));
  let r = 1.0 - t * exp(p);
  return select(r, -r, x < 0.0);
}""", ()),
    "hg_log1p": ("""
// log1p: 2 atanh(u), u = x / (2 + x), for x in (-0.3, 0.4) (no 1 + x, so no bits of x
// lost; |u| < 0.18, the series to u^15 is exact in f32), hg_log(1 + x) elsewhere (no
// cancellation there). Denormals and +-0 are their own log1p (drivers may flush them).
fn hg_log1p(x: f32) -> f32 {
  if (abs(x) < 1.17549435e-38) { return x; }
  if (x > -0.3 && x < 0.4) {
    let u = x / (2.0 + x);
    let u2 = u * u;
    return 2.0 * u * (1.0 + u2 * (1.0 / 3.0 + u2 * (0.2 + u2 * (1.0 / 7.0 + u2 * (1.0 / 9.0
        + u2 * (1.0 / 11.0 + u2 * (1.0 / 13.0 + u2 / 15.0)))))));
  }
  return hg_log(1.0 + x);
}""", ("hg_log",)),
    "hg_expm1": ("""
// expm1: the Taylor series for |x| < 0.7 (exp(x) - 1 cancels there; the terms to x^13
// leave < 1e-13 relative), e^x - 1 elsewhere (at most twice exp's relative error: the
// scaled exponential's, not the driver's); -1 below -18 (also at -inf), inf above 89.
// Subnormals and +-0 are their own expm1.
fn hg_expm1(x: f32) -> f32 {
  if (hg_isnan(x) || abs(x) < 1.17549435e-38) { return x; }
  if (x < -18.0) { return -1.0; }
  if (x > 89.0) { return hg_bits(0x7f800000u); }
  if (abs(x) < 0.7) {
    return x * (1.0 + x * (0.5 + x * (1.6666666666666666e-01 + x * (4.1666666666666664e-02
        + x * (8.3333333333333332e-03 + x * (1.3888888888888889e-03 + x * (1.9841269841269841e-04
        + x * (2.4801587301587302e-05 + x * (2.7557319223985893e-06
        + x * (2.7557319223985888e-07 + x * (2.5052108385441720e-08
        + x * (2.0876756987868100e-09 + x * 1.6059043836821613e-10))))))))))));
  }
  return hg_exp_scaled(x, 0) - 1.0;
}""", ("hg_isnan", "hg_bits", "hg_exp_scaled")),
    "hg_fmod": ("""
// C fmod, exact: the remainder of |x| by |y| by long division on the 24-bit integer
// significands (subnormals normalized first), with x's sign. WGSL's % on floats is
// x - y * trunc(x / y), which rounds.
fn hg_fmod(x: f32, y: f32) -> f32 {
  if (hg_isnan(x) || hg_isnan(y) || hg_isinf(x) || y == 0.0) { return hg_bits(0x7fc00000u); }
  let bx = bitcast<u32>(x) & 0x7fffffffu;
  let by = bitcast<u32>(y) & 0x7fffffffu;
  if (hg_isinf(y) || bx < by) { return x; }
  var ex = i32(bx >> 23u);
  var ey = i32(by >> 23u);
  var mx = bx & 0x7fffffu;
  var my = by & 0x7fffffu;
  if (ex == 0) { ex = 1; while (mx < 0x800000u) { mx = mx << 1u; ex = ex - 1; } }
  else { mx = mx | 0x800000u; }
  if (ey == 0) { ey = 1; while (my < 0x800000u) { my = my << 1u; ey = ey - 1; } }
  else { my = my | 0x800000u; }
  var r = mx;
  for (var e = ex; e > ey; e--) {
    if (r >= my) { r = r - my; }
    r = r << 1u;
  }
  if (r >= my) { r = r - my; }
  // r * 2^(ey - 150) is exact in f32 (a multiple of y's last bit, below |y|): built
  // from bits, so a subnormal result stays one (drivers flush subnormal arithmetic)
  var bits = 0u;
  if (r != 0u) {
    var e = ey;
    while (r < 0x800000u) { r = r << 1u; e = e - 1; }
    bits = select(r >> u32(1 - e), (u32(e) << 23u) | (r & 0x7fffffu), e >= 1);
  }
  return bitcast<f32>(bits | (bitcast<u32>(x) & 0x80000000u));
}""", ("hg_isnan", "hg_isinf", "hg_bits")),
    "hg_tan": ("""
// tan as sin / cos of the exactly reduced argument (hg_sin/hg_cos): drivers' tan is bounded
// only near 0.
fn hg_tan(x: f32) -> f32 { return hg_sin(x) / hg_cos(x); }""", ("hg_sin", "hg_cos")),
    "hg_asin_core": ("""
// asin on [-0.5, 0.5]: Cephes' asinf polynomial in x^2 (relative error < 2.5e-7).
fn hg_asin_core(x: f32) -> f32 {
  let z = x * x;
  return ((((4.2163199048e-2 * z + 2.4181311049e-2) * z + 4.5470025998e-2) * z
      + 7.4953002686e-2) * z + 1.6666752422e-1) * z * x + x;
}""", ()),
    "hg_asin": ("""
// asin: the core on |x| <= 0.5, pi/2 - 2 asin(sqrt((1 - |x|) / 2)) above (Cephes' asinf);
// NaN outside [-1, 1].
fn hg_asin(x: f32) -> f32 {
  let a = abs(x);
  if (!(a <= 1.0)) { return hg_bits(0x7fc00000u); }
  if (a <= 0.5) { return hg_asin_core(x); }
  let r = 1.5707963267948966 - 2.0 * hg_asin_core(sqrt(0.5 * (1.0 - a)));
  return select(r, -r, x < 0.0);
}""", ("hg_asin_core", "hg_bits")),
    "hg_acos": ("""
// acos (Cephes' acosf): 2 asin(sqrt((1 - x) / 2)) for x > 0.5, pi - that of -x for
// x < -0.5, pi/2 - asin(x) between.
fn hg_acos(x: f32) -> f32 {
  if (!(abs(x) <= 1.0)) { return hg_bits(0x7fc00000u); }
  if (x > 0.5) { return 2.0 * hg_asin_core(sqrt(0.5 * (1.0 - x))); }
  if (x < -0.5) { return 3.141592653589793 - 2.0 * hg_asin_core(sqrt(0.5 * (1.0 + x))); }
  return 1.5707963267948966 - hg_asin_core(x);
}""", ("hg_asin_core", "hg_bits")),
    "hg_atan": ("""
// atan (Cephes' atanf): |x| reduced to [0, tan(pi/8)] by pi/2 - atan(1/x) and
// pi/4 + atan((x - 1) / (x + 1)), then an odd polynomial (relative error < 2e-7).
fn hg_atan(x: f32) -> f32 {
  if (hg_isnan(x)) { return x; }
  var a = abs(x);
  var y = 0.0;
  if (a > 2.414213562373095) {
    y = 1.5707963267948966;
    a = -1.0 / a;
  } else if (a > 0.4142135623730950) {
    y = 0.7853981633974483;
    a = (a - 1.0) / (a + 1.0);
  }
  let z = a * a;
  y = y + ((((8.05374449538e-2 * z - 1.38776856032e-1) * z + 1.99777106478e-1) * z
      - 3.33329491539e-1) * z * a + a);
  return select(y, -y, (bitcast<u32>(x) & 0x80000000u) != 0u);  // atan(-0) is -0
}""", ("hg_isnan",)),
    "hg_atan2": ("""
// atan2(y, x) with C99's special cases (signed zeros, infinities) decided on bits, then
// atan(|y / x|) placed in the quadrant (y / x overflowing or underflowing is harmless).
fn hg_atan2(y: f32, x: f32) -> f32 {
  if (hg_isnan(x) || hg_isnan(y)) { return hg_bits(0x7fc00000u); }
  let yneg = (bitcast<u32>(y) & 0x80000000u) != 0u;
  let xneg = (bitcast<u32>(x) & 0x80000000u) != 0u;
  var r: f32;
  if (y == 0.0) {
    r = select(0.0, 3.141592653589793, xneg);
  } else if (hg_isinf(y)) {
    r = select(select(1.5707963267948966, 0.7853981633974483, hg_isinf(x) && !xneg),
               2.356194490192345, hg_isinf(x) && xneg);
  } else if (x == 0.0) {
    r = 1.5707963267948966;
  } else if (hg_isinf(x)) {
    r = select(0.0, 3.141592653589793, xneg);
  } else {
    let a = hg_atan(abs(y) / abs(x));
    r = select(a, 3.141592653589793 - a, xneg);
  }
  return select(r, -r, yneg);
}""", ("hg_isnan", "hg_isinf", "hg_atan", "hg_bits")),
    "hg_exp_scaled": ("""
// e^x * 2^s for |x| <= 170: x = k ln2 + r with |r| <= ln2/2 (Cody-Waite: ln2 in two
// parts, k ln2_hi exact), exp(r) by the intrinsic, 2^(k + s) as two exact powers built
// from bits. Drivers' exp(x) is exp2(x log2 e), whose rounded product costs |x| * 6e-8
// of relative error (4e-6 at 60), and their exp2 is not exact at integers; this keeps
// exp's error of a small argument. s lets e^x / 2 stay finite where e^x overflows.
fn hg_exp_scaled(x: f32, s: i32) -> f32 {
  let k = round(x * 1.4426950408889634);
  // the first difference is opaque (hg_z) so no reassociation merges ln2's two parts
  let r = bitcast<f32>(bitcast<u32>(x - k * 0.693145751953125) ^ hg_z)
      - k * 1.4286068203094172e-06;
  let e = i32(k) + s;
  let h = e / 2;
  return (exp(r) * bitcast<f32>(u32(h + 127) << 23u)) * bitcast<f32>(u32(e - h + 127) << 23u);
}""", ()),
    "hg_sinh": ("""
// sinh: an odd series for |x| < 1 (the exponentials cancel there), (e - 1/e) / 2 up to
// |x| = 20, e^|x| / 2 above (computed as one scaled exponential: finite up to sinh's own
// overflow, which comes after e^|x|'s).
fn hg_sinh(x: f32) -> f32 {
  let a = abs(x);
  if (a < 1.0) {
    let z = x * x;
    return x + x * z * (1.6666666666666666e-01 + z * (8.3333333333333332e-03
        + z * (1.9841269841269841e-04 + z * (2.7557319223985893e-06
        + z * (2.5052108385441720e-08 + z * 1.6059043836821613e-10)))));
  }
  var r: f32;
  if (!(a < 90.0)) {  // sinh overflows from 89.42 on
    r = a * hg_bits(0x7f800000u);  // inf, or NaN for NaN
  } else if (a < 20.0) {
    let e = hg_exp_scaled(a, 0);
    r = 0.5 * (e - 1.0 / e);
  } else {
    r = hg_exp_scaled(a, -1);
  }
  return select(r, -r, x < 0.0);
}""", ("hg_exp_scaled", "hg_bits")),
    "hg_cosh": ("""
// cosh: (e + 1/e) / 2 up to |x| = 20, e^|x| / 2 above (one scaled exponential).
fn hg_cosh(x: f32) -> f32 {
  let a = abs(x);
  if (!(a < 90.0)) { return a * hg_bits(0x7f800000u); }  // cosh overflows from 89.42 on
  if (a < 20.0) {
    let e = hg_exp_scaled(a, 0);
    return 0.5 * (e + 1.0 / e);
  }
  return hg_exp_scaled(a, -1);
}""", ("hg_exp_scaled", "hg_bits")),
    "hg_asinh": ("""
// asinh: log1p(a + a^2 / (1 + sqrt(1 + a^2))) (no cancellation near 0), log(a) + ln 2 for
// a > 2^26 (a^2 would overflow), odd.
fn hg_asinh(x: f32) -> f32 {
  if (hg_isnan(x)) { return x; }
  let a = abs(x);
  var r: f32;
  if (a > 67108864.0) {
    r = hg_log(a) + 0.6931471805599453;
  } else {
    r = hg_log1p(a + a * a / (1.0 + sqrt(1.0 + a * a)));
  }
  return select(r, -r, (bitcast<u32>(x) & 0x80000000u) != 0u);
}""", ("hg_isnan", "hg_log", "hg_log1p")),
    "hg_acosh": ("""
// acosh: log1p(t + sqrt(2t + t^2)) with t = x - 1 (exact near 1), log(x) + ln 2 for
// x > 2^26; NaN below 1.
fn hg_acosh(x: f32) -> f32 {
  if (!(x >= 1.0)) { return hg_bits(0x7fc00000u); }
  if (x > 67108864.0) { return hg_log(x) + 0.6931471805599453; }
  let t = x - 1.0;
  return hg_log1p(t + sqrt(2.0 * t + t * t));
}""", ("hg_bits", "hg_log", "hg_log1p")),
    "hg_atanh": ("""
// atanh: log1p(2a / (1 - a)) / 2 (no cancellation near 0), odd; +-inf at +-1, NaN beyond.
fn hg_atanh(x: f32) -> f32 {
  let a = abs(x);
  if (!(a <= 1.0)) { return hg_bits(0x7fc00000u); }
  if (a < 1.17549435e-38) { return x; }
  let r = 0.5 * hg_log1p(2.0 * a / (1.0 - a));
  return select(r, -r, x < 0.0);
}""", ("hg_bits", "hg_log1p")),
    "hg_log2x": ("""
// log2 with hg_log's edges: the intrinsic (exact at powers of two) outside [0.7, 1.4],
// hg_log's series times log2(e) inside, where drivers bound log2 only absolutely.
fn hg_log2x(x: f32) -> f32 {
  if (hg_isnan(x) || x < 0.0) { return hg_bits(0x7fc00000u); }
  if (x == 0.0) { return hg_bits(0xff800000u); }
  if (x < 1.17549435e-38) { return log2(x * 16777216.0) - 24.0; }
  if (x > 0.7 && x < 1.4) { return hg_log(x) * 1.4426950408889634; }
  return log2(x);
}""", ("hg_isnan", "hg_bits", "hg_log")),
    "hg_log10": ("""
fn hg_log10(x: f32) -> f32 { return hg_log(x) * 0.4342944819032518; }""", ("hg_log",)),
    "hg_exp2": ("""
// exp2 with the edges spelled out: 0 below -150, inf from 128 (drivers' may differ there).
fn hg_exp2(x: f32) -> f32 {
  if (x < -150.0) { return 0.0; }
  if (x >= 128.0) { return hg_bits(0x7f800000u); }
  return exp2(x);
}""", ("hg_bits",)),
    "hg_erfc": ("""
// erfc: 1 - erf(x) below 0.5 (erf < 0.53 there: no cancellation), the Numerical Recipes
// fit t exp(p) above (fractional error < 1.2e-7: the small tail keeps its digits),
// 2 - erfc(-x) below -0.5.
fn hg_erfc(x: f32) -> f32 {
  if (hg_isnan(x)) { return x; }
  let a = abs(x);
  if (a < 0.5) { return 1.0 - hg_erf(x); }
  if (a > 10.1) { return select(0.0, 2.0, x < 0.0); }  // erfc(10.1) is below f32's least
  let t = 1.0 / (1.0 + 0.5 * a);
  // e^(-a^2) as e^(-h^2) e^(-(a - h)(a + h)), h = a to 12 bits: h^2 is exact, so the
  // rounding of a^2 (5e-6 relative at a = 9) does not reach the result
  let h = bitcast<f32>(bitcast<u32>(a) & 0xfffff000u);
  let p = -(a - h) * (a + h) - 1.26551223 + t * (1.00002368 + t * (0.37409196
      + t * (0.09678418 + t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398
      + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))));
  let r = t * hg_exp_scaled(-h * h, 0) * exp(p);
  return select(r, 2.0 - r, x < 0.0);
}""", ("hg_isnan", "hg_erf", "hg_exp_scaled")),
    "hg_hypot": ("""
// hypot: the larger magnitude times sqrt(1 + r^2), r = smaller / larger (no overflow or
// underflow of the squares); an infinite operand gives inf even beside NaN (C99).
fn hg_hypot(x: f32, y: f32) -> f32 {
  let a = abs(x);
  let b = abs(y);
  if (hg_isinf(a) || hg_isinf(b)) { return hg_bits(0x7f800000u); }
  if (hg_isnan(a) || hg_isnan(b)) { return hg_bits(0x7fc00000u); }
  let hi = max(a, b);
  let lo = min(a, b);
  if (hi == 0.0) { return 0.0; }
  let r = lo / hi;
  return hi * sqrt(1.0 + r * r);
}""", ("hg_isnan", "hg_isinf", "hg_bits")),
    "hg_copysign": ("""
fn hg_copysign(x: f32, y: f32) -> f32 {
  let s = select(bitcast<u32>(y) & 0x80000000u, 0u, hg_isnan(y));  // a NaN's sign: none
  return bitcast<f32>((bitcast<u32>(x) & 0x7fffffffu) | s);
}""", ("hg_isnan",)),
    "hg_mulhi": ("""
fn hg_mulhi(a: u32, b: u32) -> u32 {
  let a0 = a & 0xffffu; let a1 = a >> 16u; let b0 = b & 0xffffu; let b1 = b >> 16u;
  let m1 = a1 * b0; let m2 = a0 * b1;
  let t = ((a0 * b0) >> 16u) + (m1 & 0xffffu) + (m2 & 0xffffu);
  return a1 * b1 + (m1 >> 16u) + (m2 >> 16u) + (t >> 16u);
}""", ()),
    "hg_trig_reduce": ("""
// Payne-Hanek reduction of a huge finite x: x = (q + r / (pi/2)) * pi/2, |r| <= pi/4.
// After N. Juffa's 32-bit formulation; 64-bit products emulated with u32 halves.
const HG_2_OVER_PI = array<u32, 8>(0x00000000u, 0x28be60dbu, 0x9391054au, 0x7f09d5f4u,
                                   0x7d4d3770u, 0x36d8a566u, 0x4f10e410u, 0x7f9458eau);
fn hg_trig_reduce(x: f32) -> vec2<f32> {
  let bits = bitcast<u32>(x);
  let e = i32((bits >> 23u) & 0xffu) - 126;
  let ia = (bits << 8u) | 0x80000000u;
  let i = u32(e >> 5u);
  let s = u32(e & 31);
  var hi = HG_2_OVER_PI[i];
  var mid = HG_2_OVER_PI[i + 1u];
  var lo = HG_2_OVER_PI[i + 2u];
  let tmp = HG_2_OVER_PI[min(i + 3u, 7u)];
  if (s != 0u) {
    hi = (hi << s) | (mid >> (32u - s));
    mid = (mid << s) | (lo >> (32u - s));
    lo = (lo << s) | (tmp >> (32u - s));
  }
  // p = ia * (hi:mid:lo), keeping bits 0..63 of the 96-bit product's top part
  let c1 = hg_mulhi(ia, lo);
  var plo = ia * mid + c1;
  var phi = hg_mulhi(ia, mid) + select(0u, 1u, plo < c1);
  phi = phi + ia * hi;
  var q = i32(phi >> 30u);
  phi = phi & 0x3fffffffu;
  var neg = false;
  if ((phi & 0x20000000u) != 0u) {  // fraction >= 1/2: round the quadrant up
    q = q + 1;
    phi = phi | 0xc0000000u;  // p - 2^62, as a negative 64-bit number
    neg = true;
    phi = ~phi; plo = ~plo; plo = plo + 1u; phi = phi + select(0u, 1u, plo == 0u);
  }
  var r = (f32(phi) * 4294967296.0 + f32(plo)) * 3.4061215800865545e-19;
  if (neg) { r = -r; }
  if (x < 0.0) { r = -r; q = -q; }
  return vec2<f32>(r, f32(q & 3));
}""", ("hg_mulhi",)),
    "hg_sin": ("""
// WGSL bounds sin/cos error only inside [-pi, pi] (lavapipe's is off by 2e-2 at 3e7):
// outside, reduce exactly first, then the intrinsic runs on |r| <= pi/4.
fn hg_sin(x: f32) -> f32 {
  if (!(abs(x) > 3.140625) || !hg_isfinite(x)) { return sin(x); }
  let rq = hg_trig_reduce(x);
  let q = u32(rq.y);
  let v = select(sin(rq.x), cos(rq.x), (q & 1u) == 1u);
  return select(v, -v, q >= 2u);
}""", ("hg_trig_reduce", "hg_isfinite")),
    "hg_cos": ("""
fn hg_cos(x: f32) -> f32 {
  if (!(abs(x) > 3.140625) || !hg_isfinite(x)) { return cos(x); }
  let rq = hg_trig_reduce(x);
  let q = (u32(rq.y) + 1u) & 3u;
  let v = select(sin(rq.x), cos(rq.x), (q & 1u) == 1u);
  return select(v, -v, q >= 2u);
}""", ("hg_trig_reduce", "hg_isfinite")),
    "hg_pow": ("""
// C99/NumPy pow: exact edges (x == 1, y == 0, NaN, +-0, +-inf, negative bases with
// integer exponents), exp2(y log2|x|) otherwise.
fn hg_pow(x: f32, y: f32) -> f32 {
  if (y == 0.0 || x == 1.0) { return 1.0; }
  if (hg_isnan(x) || hg_isnan(y)) { return hg_bits(0x7fc00000u); }
  let ax = abs(x);
  if (ax == 1.0 && hg_isinf(y)) { return 1.0; }
  let yint = floor(y) == y;
  let yodd = yint && abs(y) < 16777216.0 && (y - 2.0 * floor(y * 0.5)) == 1.0;
  if (x < 0.0 && hg_isfinite(x) && !yint) { return hg_bits(0x7fc00000u); }
  var r: f32;
  if (ax == 0.0) {
    r = select(0.0, hg_bits(0x7f800000u), y < 0.0);
  } else if (hg_isinf(ax)) {
    r = select(hg_bits(0x7f800000u), 0.0, y < 0.0);
  } else if (hg_isinf(y)) {
    r = select(0.0, hg_bits(0x7f800000u), (ax > 1.0) == (y > 0.0));
  } else {
    r = exp2(y * hg_log2(ax));
  }
  if (yodd && (bitcast<u32>(x) & 0x80000000u) != 0u) { r = -r; }
  return r;
}""", ("hg_isnan", "hg_isinf", "hg_isfinite", "hg_log2", "hg_bits")),
    "hg_prod": ("""
// Products carry their own binary exponent, as the C backend's double accumulator
// does: (m, e, s) stands for m * 2^e * s, m in [0.5, 1) from the finite nonzero
// factors, s the product of the zero/inf/NaN ones. No partial product over- or
// underflows, so the result does not depend on the order the workgroup combines in.
fn hg_prod_push(a: vec3<f32>, x: f32) -> vec3<f32> {
  if (x == 0.0 || !hg_isfinite(x)) { return vec3<f32>(a.x, a.y, a.z * x); }
  let tiny = abs(x) < 1.17549435e-38;  // denormal: scale up first (drivers may flush)
  let fx = frexp(select(x, x * 16777216.0, tiny));
  let g = frexp(a.x * fx.fract);
  return vec3<f32>(g.fract, a.y + f32(fx.exp + g.exp) - select(0.0, 24.0, tiny), a.z);
}
fn hg_prod_merge(a: vec3<f32>, b: vec3<f32>) -> vec3<f32> {
  let g = frexp(a.x * b.x);
  return vec3<f32>(g.fract, a.y + b.y + f32(g.exp), a.z * b.z);
}
fn hg_prod_value(a: vec3<f32>) -> f32 {
  // a zero, inf or NaN factor decides alone (as in double, where the finite part
  // cannot overflow): finite * 0 is 0, not inf * 0
  if (a.z == 0.0 || !hg_isfinite(a.z)) { return select(a.z, -a.z, a.x < 0.0); }
  var r = a.x;
  var e = clamp(a.y, -400.0, 400.0);
  for (var i = 0; i < 4; i++) {  // exact powers of two, at most 2^+-120 a step
    let k = clamp(e, -120.0, 120.0);
    r = r * bitcast<f32>(u32(i32(k) + 127) << 23u);
    e = e - k;
  }
  return r * a.z;
}""", ("hg_isfinite",)),
    **special_math.WGSL_HELPERS,  # lgamma, digamma, zeta
}

# Element-wise templates: {0},{1},{2} operands. f32 spellings; f16 runs the helpers
# in f32 (see _f16_wrap) and i32 has its own rows.
TEMPLATES: dict[Op, str] = {
    Op.NEG: "hg_neg({0})",
    Op.ABS: "abs({0})",
    Op.EXP: "exp({0})",
    Op.LOG: "hg_log({0})",
    Op.SQRT: "hg_sqrt({0})",
    Op.RSQRT: "({one} / hg_sqrt({0}))",
    Op.RECIP: "({one} / {0})",
    Op.TANH: "hg_tanh({0})",
    Op.SIGMOID: "hg_sigmoid({0})",
    Op.ERF: "hg_erf({0})",
    Op.SIN: "hg_sin({0})",
    Op.COS: "hg_cos({0})",
    Op.FLOOR: "floor({0})",
    Op.CEIL: "ceil({0})",
    Op.TRUNC: "trunc({0})",
    Op.RINT: "round({0})",  # WGSL's round breaks ties to even, as rint does
    Op.LOG1P: "hg_log1p({0})",
    Op.EXPM1: "hg_expm1({0})",
    Op.TAN: "hg_tan({0})",
    Op.ASIN: "hg_asin({0})",
    Op.ACOS: "hg_acos({0})",
    Op.ATAN: "hg_atan({0})",
    Op.SINH: "hg_sinh({0})",
    Op.COSH: "hg_cosh({0})",
    Op.ASINH: "hg_asinh({0})",
    Op.ACOSH: "hg_acosh({0})",
    Op.ATANH: "hg_atanh({0})",
    Op.LOG2: "hg_log2x({0})",
    Op.LOG10: "hg_log10({0})",
    Op.EXP2: "hg_exp2({0})",
    Op.ERFC: "hg_erfc({0})",
    Op.LGAMMA: "hg_lgamma({0})",
    Op.DIGAMMA: "hg_digamma({0})",
    Op.ADD: "({0} + {1})",
    Op.SUB: "({0} - {1})",
    Op.MUL: "({0} * {1})",
    Op.DIV: "({0} / {1})",
    Op.MIN: "hg_min({0}, {1})",
    Op.MAX: "hg_max({0}, {1})",
    Op.POW: "hg_pow({0}, {1})",
    Op.FMOD: "hg_fmod({0}, {1})",
    Op.ATAN2: "hg_atan2({0}, {1})",
    Op.HYPOT: "hg_hypot({0}, {1})",
    Op.COPYSIGN: "hg_copysign({0}, {1})",
    Op.ZETA: "hg_zeta({0}, {1})",
    Op.CMPLT: "({0} < {1})",
    Op.CMPEQ: "({0} == {1})",
    Op.MAD: "({0} * {1} + {2})",
    Op.FMA: "fma({0}, {1}, {2})",
    Op.SEL: "select({2}, {1}, {0})",
}
INT_TEMPLATES: dict[Op, str] = {
    Op.NEG: "(-{0})",
    Op.MIN: "min({0}, {1})",
    Op.MAX: "max({0}, {1})",
    Op.MAD: "({0} * {1} + {2})",
    Op.FMA: "({0} * {1} + {2})",
    Op.RECIP: "({one} / {0})",
    Op.AND: "({0} & {1})",
    Op.OR: "({0} | {1})",
    Op.XOR: "({0} ^ {1})",
    Op.NOT: "(~{0})",
    # WGSL shifts by the count modulo 32: a count outside [0, 32) (u32() keeps a
    # negative count's bits, so it is one too) saturates instead, as NumPy's does. The
    # count is masked all the same: a constant count >= 32 is a shader-creation error
    # even in select's unused arm. >> on i32 is arithmetic.
    Op.SHL: "select(0i, ({0} << (u32({1}) & 31u)), u32({1}) < 32u)",
    Op.SHR: "select(select(0i, -1i, {0} < 0i), ({0} >> (u32({1}) & 31u)), u32({1}) < 32u)",
}
# u32: WGSL has no unary minus on u32 (0u - x wraps), and its >> is the logical shift.
UINT_TEMPLATES: dict[Op, str] = {
    **INT_TEMPLATES,
    Op.NEG: "(0u - {0})",
    Op.SHL: "select(0u, ({0} << (u32({1}) & 31u)), u32({1}) < 32u)",
    Op.SHR: "select(0u, ({0} >> (u32({1}) & 31u)), u32({1}) < 32u)",
}
# bool: the logical ops (WGSL has & and | on bool, but no ^ or ~).
BOOL_TEMPLATES: dict[Op, str] = {
    Op.AND: "({0} & {1})",
    Op.OR: "({0} | {1})",
    Op.XOR: "({0} != {1})",
    Op.NOT: "(!{0})",
}
# Ops whose f16 form is computed by the f32 helper and rounded back.
_F32_ONLY = {Op.LOG, Op.SQRT, Op.RSQRT, Op.TANH, Op.SIGMOID, Op.ERF, Op.SIN, Op.COS, Op.POW,
             Op.MIN, Op.MAX, Op.NEG, Op.LOG1P, Op.EXPM1, Op.FMOD, Op.ATAN2, Op.HYPOT,
             Op.COPYSIGN, *MATH_UNARY, *SPECIAL}

# How two partial results combine. Float max/min propagate NaN in the combine itself
# (a NaN partial wins), so no separate NaN flag has to be reduced over the workgroup.
# Math functions whose results are hidden from the driver's algebraic simplifier.
_OPAQUE_RESULT = {Op.EXP, Op.LOG, Op.SQRT, Op.RSQRT, Op.TANH, Op.SIGMOID, Op.ERF, Op.SIN,
                  Op.COS, Op.POW, Op.FLOOR, Op.CEIL, Op.TRUNC, Op.RINT, Op.LOG1P, Op.EXPM1,
                  Op.FMOD, Op.ATAN2, Op.HYPOT, Op.COPYSIGN, *MATH_UNARY, *SPECIAL}

_COMBINE = {Op.RSUM: "{a} + {b}", Op.RPROD: "{a} * {b}",
            Op.RMAX: "select({a}, {b}, {b} > {a})", Op.RMIN: "select({a}, {b}, {b} < {a})"}
_COMBINE_NAN = {Op.RMAX: "select({a}, {b}, {b} > {a} || hg_isnan({b}))",
                Op.RMIN: "select({a}, {b}, {b} < {a} || hg_isnan({b}))"}


PROD = "vec3<f32>"  # the float product accumulator (see hg_prod)


def _combine(op: Op, wide: str) -> str:
    if wide == PROD:
        return "hg_prod_merge({a}, {b})"
    return _COMBINE_NAN.get(op, _COMBINE[op]) if wide == "f32" else _COMBINE[op]


def _tag(wide: str) -> str:
    """An identifier-safe name for an accumulator type."""
    return "p3" if wide == PROD else wide


def wgsl_type(d: DType, backend: str = "webgpu") -> str:
    """The WGSL spelling of ``d``; DTypeError for dtypes WGSL lacks."""
    t = WGSL_TYPES.get(d.name)
    if t is None and d.kind == "i":
        raise DTypeError(f"{d}: the {backend} backend cannot run {d} ({_NO_INT[d.bits]}; "
                         "cast to i32 or u32 first, or use the cpu or cuda backend)")
    if t is None:
        raise DTypeError(f"{d}: the {backend} backend cannot run {d} (WGSL has no {d} type; "
                         "use f32, or f16 where the adapter has shader-f16)")
    return t


def f32_bits(value: float) -> int:
    return struct.unpack("<I", struct.pack("<f", np.float32(value)))[0]


@dataclass
class WGSLKernel:
    """One compute entry point in its own shader module, and how to dispatch it."""

    name: str
    source: str
    bindings: list[int]  # the slots it binds (binding index = slot)
    groups: tuple[int, int, int]  # workgroups to dispatch


@dataclass
class WGSLProgram:
    kernels: list[WGSLKernel] = field(default_factory=list)
    arena_range: tuple[int, int] | None = None  # bytes of the boundary pool bound [lo, hi)

    @property
    def source(self) -> str:
        return "\n\n".join(f"// --- {k.name} ---\n{k.source}" for k in self.kernels)


class WGSLRenderer(GPURenderer):
    """WGSL for wgpu. Records per kernel the bindings it uses and its dispatch size."""

    LOOPS = {
        "flat": ("for (var {var}: i32 = i32(hg_gid.x); {var} < {count}; "
                 "{var} += i32(hg_nwg.x) * " + str(WORKGROUP) + ") {{"),
        "outer": "for (var {var}: i32 = i32(hg_wid.x); {var} < {count}; {var} += i32(hg_nwg.x)) {{",
        "inner": ("for (var {var}: i32 = i32(hg_lid.x); {var} < {count}; {var} += "
                  + str(WORKGROUP) + ") {{"),
    }
    FIRST_THREAD = "hg_lid.x == 0u"

    def __init__(self, sched: Schedule, slots: dict[BufRef, int], f16: bool = False,
                 backend: str = "webgpu") -> None:
        super().__init__(sched, slots)
        self.f16 = f16
        self.backend = backend
        self.launch: dict[str, tuple[str, int]] = {}
        self._kernel = ""
        self.salts = 0  # literal and reuse salts, unique within the renderer
        self.uses: dict[str, int] = {}  # float value name -> uses so far
        # per kernel: slot -> element type bound, helpers called, workgroup reductions
        self.used: dict[int, str] = {}
        self.helpers: dict[str, None] = {}
        self.wg_reduce: dict[str, tuple[Op, str]] = {}
        self.arena_range = self._arena_range()

    # --- types, literals, buffers -------------------------------------------------------
    def ctype(self, d: DType) -> str:
        t = wgsl_type(d, self.backend)
        if t == "f16" and not self.f16:
            raise DTypeError(f"f16: the {self.backend} backend needs the adapter feature "
                             "'shader-f16', which this adapter lacks")
        return t

    def literal(self, value: float | int | bool, d: DType) -> str:
        if d.kind == "b":
            return "true" if value else "false"
        if d.kind == "i":
            v = int(value)
            if not d.signed:
                return f"{v}u"
            return f"i32({v + 1} - 1)" if v == -(2**31) else f"{v}i"
        self.need("hg_k")
        code = f"hg_k(0x{f32_bits(float(value)):08x}u, {self.salt()})"
        return f"f16({code})" if d.name == "f16" else code

    def _arena_range(self) -> tuple[int, int] | None:
        refs = [r for r in self.slots if r.kind == "arena"]
        if not refs:
            return None
        for r in refs:
            if r.dtype.name != "f32":
                raise DTypeError(f"{r.dtype}: the {self.backend} backend binds the boundary "
                                 "pool as f32; Φ-addressed values must be f32")
            if r.offset % 4:
                raise ShapeError(f"Φ-addressed f32 at byte {r.offset} is not 4-byte aligned")
        lo = min(r.offset for r in refs)
        hi = max(r.offset + r.size * 4 for r in refs)
        return lo, max(hi, lo + 4)

    def ptr(self, ref: BufRef) -> str:
        """The binding's name; the kernel's module declares it (no typed locals in WGSL)."""
        slot = self.slots[ref]
        t = "f32" if ref.kind == "arena" else self.ctype(ref.dtype)
        if ref.kind != "arena" and ref.dtype.kind == "b":
            raise DTypeError(f"bool: the {self.backend} backend cannot keep bool buffers "
                             "(WGSL storage has no 1-byte bool)")
        self.used[slot] = t
        return f"b{slot}"

    def at(self, ref: BufRef, off: str) -> str:
        """The storage element ``off`` of ``ref`` (arena refs are f32 indices past lo)."""
        name = self.ptr(ref)
        if ref.kind == "arena":
            assert self.arena_range is not None
            base = (ref.offset - self.arena_range[0]) // 4
            return f"{name}[{base} + {off}]" if base else f"{name}[{off}]"
        return f"{name}[{off}]"

    def need(self, helper: str) -> None:
        if helper in self.helpers:
            return
        for dep in _HELPERS[helper][1]:
            self.need(dep)
        self.helpers[helper] = None

    # --- emission ---------------------------------------------------------------------
    def declare(self, name: str, d: DType, code: str) -> str:
        return f"let {name}: {self.ctype(d)} = {code};"

    def index_decl(self, name: str, code: str) -> str:
        return f"let {name}: i32 = {code};"

    def _emit(self, v: Value, idx: tuple[Expr, ...], cur: Scope, flat: bool,
              key: tuple) -> Expr:
        """Loads and element-wise ops in WGSL; movement and reductions as in C."""
        g = group(v.op)
        elementwise = g in (Group.UNARY, Group.BINARY, Group.COMPARE, Group.TERNARY,
                            Group.SELECT, Group.CAST)
        ref = self.sched.buffers.get(id(v))
        if ref is not None and id(v) not in self.computing:
            off = idx[0] if flat else self.offset(v.shape, idx)
            return self.bind(self.at(ref, off.code), v.dtype, off.vars, cur, key)
        if not elementwise:
            return super()._emit(v, idx, cur, flat, key)
        args = [self.emit(s, idx, cur, flat) for s in v.srcs]
        vars_ = frozenset().union(*(a.vars for a in args))
        codes = [self.use(a.code, s.dtype) for a, s in zip(args, v.srcs, strict=True)]
        if g is Group.CAST:
            return self.bind(self.cast(codes[0], v.srcs[0].dtype, v.dtype), v.dtype,
                             vars_, cur, key)
        code = self.apply(v.op, v.srcs[-1].dtype, codes)
        if v.op in _OPAQUE_RESULT and v.dtype.kind == "f":
            # log(exp(x)) -> x and exp(log(x) * y) -> pow(x, y) are driver rewrites too
            # (wrong where exp overflows): the result of a math function is opaque.
            self.need("hg_o")
            code = (f"f16(hg_o(f32({code}), {self.salt()}))" if v.dtype.name == "f16" else
                    f"hg_o({code}, {self.salt()})")
        return self.bind(code, v.dtype, vars_, cur, key)

    def select_code(self, cond: str, a: str, b: str) -> str:
        return f"select({b}, {a}, {cond})"

    def salt(self) -> str:
        self.salts += 1
        return f"{self.salts}u"

    def use(self, code: str, d: DType) -> str:
        """``code`` as an operand: a float value's second and later uses go through a
        salted ``hg_o``, so the driver never sees one value twice in an expression."""
        if d.kind != "f" or not code.isidentifier():
            return code
        n = self.uses.get(code, 0)
        self.uses[code] = n + 1
        if n == 0:
            return code
        self.need("hg_o")
        if d.name == "f16":
            return f"f16(hg_o(f32({code}), {self.salt()}))"
        return f"hg_o({code}, {self.salt()})"

    def apply(self, op: Op, d: DType, codes: list[str]) -> str:
        """The WGSL expression for element-wise ``op`` on operands of dtype ``d``."""
        if d.kind == "i":
            tmpl = (INT_TEMPLATES if d.signed else UINT_TEMPLATES).get(op) or TEMPLATES[op]
            if op in (Op.LOG, Op.EXP, Op.SQRT, Op.RSQRT, Op.TANH, Op.SIGMOID, Op.ERF, Op.SIN,
                      Op.COS, Op.POW):
                raise DTypeError(f"{op}.{d}: the {self.backend} backend has no integer {op}")
            return tmpl.format(*codes, one=self.literal(1, d))
        if d.kind == "b":
            return (BOOL_TEMPLATES.get(op) or TEMPLATES[op]).format(*codes, one="true")
        tmpl = TEMPLATES[op]
        for name in _HELPERS:
            if name + "(" in tmpl:
                self.need(name)
        one = self.literal(1.0, F32) if "{one}" in tmpl else ""
        if d.name == "f16":
            if op in _F32_ONLY:
                wide = tmpl.format(*(f"f32({c})" for c in codes), one=one)
                return f"f16({wide})"
            return tmpl.format(*codes, one=f"f16({one})")
        return tmpl.format(*codes, one=one)

    def cast(self, code: str, src: DType, dst: DType) -> str:
        s, t = self.ctype(src), self.ctype(dst)
        if s == t:
            return code
        if t == "bool":
            return f"({code} != {s}(0))"
        return f"{t}({code})"

    # --- index ops (render_index's hooks in WGSL) --------------------------------------
    def index_lines(self, name: str, code: str, n: int, site: int) -> list[str]:
        """The index clamped into ``[0, n)``. WGSL kernels do not report a bad index
        (a flag read back after every launch would make each launch wait): README's
        limitations say so."""
        return [f"let {name}: i32 = clamp(i32({code}), 0i, {n - 1}i);"]

    def serial_loop(self, var: str, count: int | None, simd: bool) -> str:
        return f"for (var {var}: i32 = 0; {var} < {count}; {var}++) {{"

    def element(self, ref: BufRef, off: str) -> str:
        return self.at(ref, off)

    def convert(self, code: str, d: DType) -> str:
        return f"{self.ctype(d)}({code})"

    COUNT_T = "i32"

    def sort_before(self, a: str, b: str, d: DType, descending: bool) -> str:
        if d.kind != "f":
            return super().sort_before(a, b, d, descending)
        self.need("hg_isnan")
        a, b = (a, b) if d.name == "f32" else (f"f32({a})", f"f32({b})")
        if descending:
            return f"((hg_isnan({a}) && !hg_isnan({b})) || {a} > {b})"
        return f"(!hg_isnan({a}) && (hg_isnan({b}) || {a} < {b}))"

    def mutable(self, name: str, t: str, init: str) -> str:
        return f"var {name}: {t} = {init};"

    def scan_type(self, d: DType) -> str:
        return "f32" if d.kind == "f" else self.ctype(d)  # f16 accumulates in f32

    def scan_literal(self, value: float, wide: str, d: DType) -> str:
        return self.literal(value, F32) if d.kind == "f" else self.literal(int(value), d)

    def widen(self, code: str, wide: str) -> str:
        return f"{wide}({code})"

    def narrow(self, code: str, wide: str, d: DType) -> str:
        t = self.ctype(d)
        return code if t == wide else f"{t}({code})"

    def combine_code(self, step: Op, a: str, b: str, d: DType) -> str:
        return self.apply(step, d, [a, b])  # WGSL's i32 addition and product wrap

    # --- reductions ---------------------------------------------------------------------
    def phase(self, v: Value, idx: tuple[Expr, ...], cur: Scope, key: tuple) -> Expr:
        """A reduction once per outer index: each invocation folds a strided share, then
        the workgroup combines the shares (every invocation gets the result)."""
        kept = frozenset().union(*(e.vars for e in idx))
        home = self.scope_for(kept, cur)
        if home.kind not in ("kernel", "outer"):
            raise NeedsMaterialize(v)  # would rerun per inner element: give it a buffer
        self.launch.setdefault(self._kernel, ("single", 1))
        src = v.srcs[0]
        axes = v.attr("axes")
        d = v.dtype
        t = self.ctype(d)
        wide = "f32" if d.kind == "f" else t
        if v.op is Op.RPROD and d.kind == "f":
            wide = PROD
            self.need("hg_prod")
        acc, r = self.fresh("acc"), self.fresh("r")
        sizes = [src.shape[a] for a in axes]
        count = math.prod(sizes)
        sub = list(idx)
        for a, s, st in zip(axes, sizes, self.strides(tuple(sizes)), strict=True):
            sub[a] = Expr(r if len(axes) == 1 else f"({r} / {st} % {s})", frozenset({r}))
        body = Scope("phase", r, home)
        x = self.emit(src, tuple(sub), body, False)
        xc = self.use(x.code, src.dtype)
        xw = xc if wide in (t, PROD) else f"{wide}({xc})"
        is_float = d.kind == "f"
        kahan = v.op is Op.RSUM and is_float
        if v.op in (Op.RMAX, Op.RMIN) and is_float:
            self.need("hg_isnan")
        init = {Op.RSUM: "0", Op.RPROD: "1"}.get(v.op)
        if init is None:
            if is_float:
                init = self.literal(-math.inf if v.op is Op.RMAX else math.inf, F32)
            else:
                info = np.iinfo(d.np_dtype)
                init = self.literal(int(info.min if v.op is Op.RMAX else info.max), d)
        if wide == PROD:
            init = "0.5, 1.0, 1.0"  # 0.5 * 2^1 * 1
        lines = [f"var {acc}: {wide} = {wide}({init});"]
        if kahan:
            lines.append(f"var {acc}c: f32 = 0.0;")
        lines.append(f"for (var {r}: i32 = i32(hg_lid.x); {r} < {count}; {r} += {WORKGROUP}) {{")
        lines += ["  " + ln for ln in body.lines]
        if kahan:
            # Kahan summation per invocation; the compensation only while finite, so
            # an inf term gives inf (not inf - inf = NaN). hg_o keeps the compiler from
            # simplifying (t - acc) - y to zero.
            self.need("hg_o")
            self.need("hg_isfinite")
            lines += [f"  let {acc}y = {xw} - {acc}c;",
                      f"  let {acc}t = {acc} + {acc}y;",
                      f"  {acc}c = select(0.0, (hg_o({acc}t, {self.salt()}) - {acc}) - {acc}y, "
                      f"hg_isfinite({acc}t));",
                      f"  {acc} = {acc}t;"]
        elif wide == PROD:
            lines.append(f"  {acc} = hg_prod_push({acc}, f32({xw}));")
        else:
            lines.append(f"  {acc} = {_combine(v.op, wide).format(a=acc, b=xw)};")
        lines.append("}")
        if kahan:
            lines.append(f"{acc} = {acc} - {acc}c;")
        lines.append(f"{acc} = {self.workgroup_reduce(v.op, wide)}({acc}, hg_lid.x);")
        home.lines.extend(lines)
        result = f"hg_prod_value({acc})" if wide == PROD else acc
        result = result if t == "f32" or wide == t else f"{t}({result})"
        return self.bind(result, d, kept, home, key)

    def workgroup_reduce(self, op: Op, wide: str) -> str:
        """The name of a helper reducing one value per invocation over the workgroup."""
        name = f"hg_wg_{op.name.lower()}_{_tag(wide)}"
        self.wg_reduce[name] = (op, wide)
        return name

    # --- kernels ------------------------------------------------------------------------
    def kernel(self, k: KernelPlan) -> str:
        self._kernel = k.name
        self.used, self.helpers, self.wg_reduce = {}, {}, {}
        body = super().kernel(k)
        head, rest = body.split(" {\n", 1)
        return f"{head} {{\n  hg_z = hg_nwg.z - 1u;\n{rest}"

    def signature(self, name: str) -> str:
        return (f"@compute @workgroup_size({WORKGROUP})\n"
                f"fn {name}(@builtin(global_invocation_id) hg_gid: vec3<u32>,\n"
                "    @builtin(local_invocation_id) hg_lid: vec3<u32>,\n"
                "    @builtin(workgroup_id) hg_wid: vec3<u32>,\n"
                "    @builtin(num_workgroups) hg_nwg: vec3<u32>)")

    def store_lines(self, k: KernelPlan, x: Expr, off: Expr) -> list[str]:
        return [f"{self.at(dst, off.code)} = {x.code};" for _, dst in k.sinks]

    def module(self, entry: str) -> str:
        """The shader module around one entry point: directives, bindings, helpers."""
        parts = []
        if self.f16 and "f16" in entry + "".join(self.used.values()):
            parts.append("enable f16;")
        for slot in sorted(self.used):
            parts.append(f"@group(0) @binding({slot}) var<storage, read_write> "
                         f"b{slot}: array<{self.used[slot]}>;")
        parts.append("var<private> hg_z: u32;  // a zero the compiler cannot see")
        wg_types = sorted({w for _, w in self.wg_reduce.values()})
        for w in wg_types:
            parts.append(f"var<workgroup> hg_red_{_tag(w)}: array<{w}, {WORKGROUP}>;")
        parts += [_HELPERS[h][0].strip("\n") for h in _helper_order(self.helpers)]
        for name, (op, w) in sorted(self.wg_reduce.items()):
            parts.append(_wg_reduce_fn(name, _combine(op, w), w))
        parts.append(entry)
        return "\n".join(parts) + "\n"

    def render_kernel(self, k: KernelPlan) -> WGSLKernel:
        entry = self.kernel(k)
        role, count = self.launch.get(k.name, ("single", 1))
        if role == "flat":
            groups = min(max(1, -(-count // WORKGROUP)), MAX_GROUPS)
        elif role == "outer":
            groups = min(max(1, count), MAX_GROUPS)
        else:
            groups = 1
        return WGSLKernel(k.name, self.module(entry), sorted(self.used), (groups, 1, 1))

    # --- GEMM ---------------------------------------------------------------------------
    def render_gemm(self, step: GemmPlan, name: str) -> WGSLKernel:
        """C[b] = A[b] @ B[b] for every batch index b, blocked: tiles of A and B staged in
        workgroup memory, a 4x4 block of C per invocation in registers (16 multiply-adds
        per shared-memory read pair instead of 1, which is what makes it more than
        barrier-bound).

        The batch is folded into the y grid-stride loop (tile rows of every matrix of
        the batch, one after another), so any batch size runs in one dispatch; z stays
        free for the salted runtime zero (``hg_z``). Operands are read through their
        view chains (permute, reshape, expand) by loader functions built with the same
        emitter as the fused kernels, given the flat batch index ``gb`` and the row and
        column; a broadcast (expanded) batch dim costs nothing, the index ignores it."""
        self._kernel = name
        self.used, self.helpers, self.wg_reduce = {}, {}, {}
        self.computing = set()
        self.pointers, self.pointer_decls = {}, []
        self.row, self.row_cands = None, {}
        v = step.value
        a, b = v.srcs
        *batch, m, kk = a.shape
        n = b.shape[-1]
        nb = math.prod(batch)
        t = self.ctype(v.dtype)
        loaders = [self._gemm_loader(fn, operand, tuple(batch))
                   for fn, operand in (("hg_ga", a), ("hg_gb", b))]
        tiles_m, tiles_n = -(-m // BLOCK), -(-n // BLOCK)
        loads = []
        for e in range(BLOCK * TILE // (TILE * TILE)):  # tile elements per invocation
            loads.append(f"""        {{
          let idx = lid + {e * TILE * TILE};
          let ar = idx / {TILE};
          let ak = idx % {TILE};
          var va: f32 = 0.0;
          if (row0 + ar < {m} && k0 + ak < {kk}) {{ va = hg_ga(bi, row0 + ar, k0 + ak); }}
          hg_ta[ak * {BLOCK} + ar] = va;
          let bk = idx / {BLOCK};
          let bc = idx % {BLOCK};
          var vb: f32 = 0.0;
          if (k0 + bk < {kk} && col0 + bc < {n}) {{ vb = hg_gb(bi, k0 + bk, col0 + bc); }}
          hg_tb[bk * {BLOCK} + bc] = vb;
        }}""")
        r = BLOCK // TILE  # outputs per invocation along each axis
        regs = "\n".join(
            [f"          let ra{i} = hg_ta[q * {BLOCK} + ly + {TILE * i}];" for i in range(r)]
            + [f"          let rb{j} = hg_tb[q * {BLOCK} + lx + {TILE * j}];" for j in range(r)]
            + [f"          c{i}{j} = c{i}{j} + ra{i} * rb{j};"
               for i in range(r) for j in range(r)])
        decls = "\n".join(f"      var c{i}{j}: f32 = 0.0;" for i in range(r) for j in range(r))
        stores = []
        base = f"bi * {m * n} + " if nb > 1 else ""
        for i in range(r):
            for j in range(r):
                dst = self.at(step.out, f"{base}(row0 + ly + {TILE * i}) * {n} + col0 + lx + "
                                        f"{TILE * j}")
                stores.append(f"      if (row0 + ly + {TILE * i} < {m} && "
                              f"col0 + lx + {TILE * j} < {n}) {{ {dst} = {t}(c{i}{j}); }}")
        body_loads = "\n".join(loads)
        body_stores = "\n".join(stores)
        entry = f"""var<workgroup> hg_ta: array<f32, {BLOCK * TILE}>;  // [k][row] of the A tile
var<workgroup> hg_tb: array<f32, {BLOCK * TILE}>;  // [k][col] of the B tile
{loaders[0]}
{loaders[1]}
// One workgroup computes a {BLOCK}x{BLOCK} block of one matrix of C, each invocation
// {r}x{r} of it (strided by {TILE}), stepping through K in tiles of {TILE} staged in
// workgroup memory. y walks the {nb} matrices' {tiles_m} tile rows each, x the tile columns.
@compute @workgroup_size({TILE}, {TILE})
fn {name}(@builtin(local_invocation_id) hg_lid: vec3<u32>,
    @builtin(workgroup_id) hg_wid: vec3<u32>,
    @builtin(num_workgroups) hg_nwg: vec3<u32>) {{
  hg_z = hg_nwg.z - 1u;
  let lx = i32(hg_lid.x);
  let ly = i32(hg_lid.y);
  let lid = ly * {TILE} + lx;
  for (var ty: i32 = i32(hg_wid.y); ty < {nb * tiles_m}; ty += i32(hg_nwg.y)) {{
    let bi = ty / {max(tiles_m, 1)};
    let row0 = (ty % {max(tiles_m, 1)}) * {BLOCK};
    for (var tx: i32 = i32(hg_wid.x); tx < {tiles_n}; tx += i32(hg_nwg.x)) {{
      let col0 = tx * {BLOCK};
{decls}
      for (var k0: i32 = 0; k0 < {kk}; k0 += {TILE}) {{
{body_loads}
        workgroupBarrier();
        for (var q: i32 = 0; q < {TILE}; q++) {{
{regs}
        }}
        workgroupBarrier();
      }}
{body_stores}
    }}
  }}
}}"""
        groups = (min(max(1, tiles_n), MAX_GROUPS), min(max(1, nb * tiles_m), MAX_GROUPS), 1)
        return WGSLKernel(name, self.module(entry), sorted(self.used), groups)

    def _gemm_loader(self, fn: str, operand: Value, batch: tuple[int, ...]) -> str:
        """``fn(gb, gr, gc)``: element (gr, gc) of matrix ``gb`` (the flat batch index)
        of a GEMM operand, read through its view chain by the fused-kernel emitter."""
        x, body = self.matrix_element(operand, batch)
        return (f"fn {fn}(gb: i32, gr: i32, gc: i32) -> f32 {{\n"
                + "".join(f"  {ln}\n" for ln in body)
                + f"  return f32({x.code});\n}}")


def _helper_order(helpers: dict[str, None]) -> list[str]:
    """Helpers in dependency order (``need`` adds dependencies first)."""
    return list(helpers)


def _wg_reduce_fn(name: str, combine: str, w: str) -> str:
    """A workgroup tree reduction, unrolled so every barrier is in uniform control flow.

    (Measured on lavapipe, softmax 1024x1024: fewer barriers with serial folds of 16
    partials were 5-40% slower than this tree, so the tree stays.)"""
    sh = f"hg_red_{_tag(w)}"
    lines = [f"fn {name}(v: {w}, l: u32) -> {w} {{", f"  {sh}[l] = v;", "  workgroupBarrier();"]
    s = WORKGROUP // 2
    while s >= 1:
        c = combine.format(a=f"{sh}[l]", b=f"{sh}[l + {s}u]")
        lines += [f"  if (l < {s}u) {{ {sh}[l] = {c}; }}", "  workgroupBarrier();"]
        s //= 2
    lines += [f"  let r = {sh}[0];", "  workgroupBarrier();", "  return r;", "}"]
    return "\n".join(lines)


def render_wgsl(sched: Schedule, slots: dict[BufRef, int], f16: bool = False,
                backend: str = "webgpu") -> WGSLProgram:
    """Every step of ``sched`` as a WGSL kernel (GEMMs as tiled matmul kernels)."""
    r = WGSLRenderer(sched, slots, f16, backend)
    out = WGSLProgram(arena_range=r.arena_range)
    for i, step in enumerate(sched.steps):
        if isinstance(step, KernelPlan):
            out.kernels.append(r.render_kernel(step))
        elif isinstance(step, AttentionPlan):  # its own kernels (compiler/attention_gpu.py)
            out.kernels.extend(attention_gpu.render_wgsl(r, step, f"attn{i}"))
        else:
            out.kernels.append(r.render_gemm(step, f"gemm{i}"))
    return out
