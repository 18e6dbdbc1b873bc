"""The special functions LGAMMA, DIGAMMA and ZETA in C (CPU and CUDA) and WGSL.

Neither C nor WGSL has them all, so each backend gets a definition here, emitted
only into sources whose kernels call it (``needed``):

- **LGAMMA** is libm's ``lgamma`` on the CPU, through ``lgamma_r``: plain ``lgamma``
  writes the global ``signgam``, a data race when OpenMP threads call it. CUDA has a
  thread-safe ``lgamma`` of its own. WGSL has none: the helper shifts ``x`` up to 8
  with the recurrence and uses Stirling's series there, with the reflection formula
  below 0.5 (f32 throughout: the result is close in absolute terms near its zeros at
  1 and 2, not in relative ones).
- **DIGAMMA** follows ATen's ``calc_digamma`` (Cephes): reflection for ``x < 0``
  (``pi / tan(pi r)`` with ``r`` the fractional part), the recurrence up to 10, then
  the asymptotic series; ``digamma(+-0) = -+inf``, NaN at negative integers and -inf.
  The C form computes in double for every dtype (f32 results are the double result
  rounded once, so they are at least as accurate as ATen's float version).
- **ZETA** is the Hurwitz zeta function ``zeta(x, q) = sum_k (q + k)^-x`` as ATen's
  ``zeta`` (Cephes): the sum up to ``q + k > 9`` (at least 9 terms, stopping once a
  term is below double's epsilon of the sum), then the Euler-Maclaurin tail with 12
  Bernoulli terms. ``x == 1`` gives inf, ``x < 1`` NaN, ``q`` a non-positive integer
  inf, a negative non-integer ``q`` with a non-integer ``x`` NaN. One change from
  ATen: below ``q = -64`` ATen sums the ``|q|`` terms at ``q, q + 1, ...`` one by one
  (a loop of 10^15 steps for ``q = -1e15 + 0.5`` in double, a hang); here the terms
  under 0 are ``(-1)^x (r + j)^-x`` with ``r`` the fraction of ``-q``, so they are
  ``(-1)^x (zeta(x, r) - zeta(x, 1 - q))``, and the rest is ``zeta(x, 1 - r)``: three
  sums over positive arguments, each as short as any. The results agree with ATen's to
  rounding (ATen's long sum rounds more).
  PyTorch's ``polygamma(n, x)`` for ``n >= 1`` is ``(-1)^(n+1) n! zeta(n + 1, x)``.
"""

from __future__ import annotations

from ..isa.opcodes import Op

#: The C function each op calls (a ``{f}`` suffix is the dtype's libm suffix).
C_NAMES: dict[Op, str] = {Op.LGAMMA: "hg_lgamma", Op.DIGAMMA: "hg_digamma",
                          Op.ZETA: "hg_zeta"}

#: C definitions shared by the CPU and CUDA sources. ``HG_SPECIAL`` is ``static`` in C
#: and ``static __device__`` in CUDA.
_C_BODIES: dict[Op, str] = {
    Op.LGAMMA: r"""
#ifdef __CUDACC_RTC__
HG_SPECIAL double hg_lgamma(double x) { return lgamma(x); }
HG_SPECIAL float hg_lgammaf(float x) { return lgammaf(x); }
#else
HG_SPECIAL double hg_lgamma(double x) { int s; return lgamma_r(x, &s); }
HG_SPECIAL float hg_lgammaf(float x) { int s; return lgammaf_r(x, &s); }
#endif""",
    Op.DIGAMMA: r"""
HG_SPECIAL double hg_digamma(double x) {
  if (x == 0) return copysign((double)INFINITY, -x);
  double reflect = 0;
  if (x < 0) {
    if (x == trunc(x)) return (double)NAN;
    double whole, r = modf(x, &whole);
    reflect = 3.14159265358979323846 / tan(3.14159265358979323846 * r);
    x = 1 - x;
  }
  double result = 0;
  while (x < 10) { result -= 1 / x; x += 1; }
  if (x == 10) return result + 2.25175258906672110764 - reflect;
  double y = 0;
  if (x < 1.0e17) {
    double z = 1.0 / (x * x);
    y = z * ((((((8.33333333333333333333E-2 * z - 2.10927960927960927961E-2) * z
          + 7.57575757575757575758E-3) * z - 4.16666666666666666667E-3) * z
          + 3.96825396825396825397E-3) * z - 8.33333333333333333333E-3) * z
          + 8.33333333333333333333E-2);
  }
  return result + log(x) - (0.5 / x) - y - reflect;
}""",
    Op.ZETA: r"""
HG_SPECIAL double hg_zeta_sum(double x, double q) {
  const double A[12] = {12.0, -720.0, 30240.0, -1209600.0, 47900160.0,
      -1.8924375803183791606e9, 7.47242496e10, -2.950130727918164224e12,
      1.1646782814350067249e14, -4.5979787224074726105e15, 1.8152105401943546773e17,
      -7.1661652561756670113e18};
  const double MACHEP = 1.11022302462515654042E-16;
  double s = pow(q, -x), a = q, b = 0;
  int i = 0;
  while (i < 9 || a <= 9.0) {
    i += 1;
    a += 1;
    b = pow(a, -x);
    s += b;
    if (-MACHEP * s < b && b < MACHEP * s) return s;
  }
  double w = a, k = 0;
  s += b * w / (x - 1);
  s -= 0.5 * b;
  a = 1;
  for (i = 0; i < 12; i++) {
    a *= x + k;
    b /= w;
    double t = a * b / A[i];
    s = s + t;
    t = fabs(t / s);
    if (t < MACHEP) return s;
    k += 1;
    a *= x + k;
    b /= w;
    k += 1;
  }
  return s;
}
HG_SPECIAL double hg_zeta(double x, double q) {
  if (x == 1) return (double)INFINITY;
  if (x < 1) return (double)NAN;
  if (q <= 0) {
    if (q == floor(q)) return (double)INFINITY;
    if (x != floor(x)) return (double)NAN;
    if (x == (double)INFINITY) return x;
    if (q < -64) {
      /* the terms at q, q+1, ... below 0 are (-1)^x (r + j)^-x, r = frac(-q): two sums
         over positive arguments, not |q| terms one by one */
      double r = -q - floor(-q), sign = fmod(x, 2.0) == 0 ? 1.0 : -1.0;
      return sign * (hg_zeta_sum(x, r) - hg_zeta_sum(x, 1 - q)) + hg_zeta_sum(x, 1 - r);
    }
  }
  return hg_zeta_sum(x, q);
}""",
}


def c_source(ops: set[Op], device: bool = False) -> str:
    """The C definitions of the special functions in ``ops`` (empty if none), for the
    CPU (``static``) or CUDA (``static __device__``)."""
    used = [op for op in _C_BODIES if op in ops]
    if not used:
        return ""
    qual = "static __device__" if device else "static __attribute__((unused))"
    return "\n".join([f"#define HG_SPECIAL {qual}",
                      *(_C_BODIES[op].strip("\n") for op in used)])


#: WGSL helpers (f32): name -> (source, helpers it calls), merged into the WGSL
#: renderer's helper table.
WGSL_HELPERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "hg_lgamma": ("""
// lgamma: Stirling's series from 8 on (the recurrence lgamma(x) = lgamma(x + n) -
// log(x (x+1) ... (x+n-1)) shifts smaller x there), the reflection formula
// log(pi / |sin(pi x)|) - lgamma(1 - x) below 0.5; +inf at 0 and the negative integers.
fn hg_lgamma_pos(x0: f32) -> f32 {
  var x = x0;
  var prod = 1.0;
  var shift = 0.0;
  for (var i = 0; i < 8 && x < 8.0; i++) {
    prod = prod * x;
    x = x + 1.0;
    if (prod > 1e30) { shift = shift + log(prod); prod = 1.0; }
  }
  let r = 1.0 / x;
  let r2 = r * r;
  let series = r * (0.083333333333 - r2 * (0.0027777777778 - r2 * (0.00079365079365
      - r2 * 0.00059523809524)));
  return (x - 0.5) * log(x) - x + 0.91893853320467 + series - shift - log(prod);
}
fn hg_lgamma(x: f32) -> f32 {
  if (hg_isnan(x)) { return x; }
  let ax = bitcast<f32>(bitcast<u32>(x) & 0x7fffffffu);  // |x| by bits: subnormals too
  if (hg_isinf(x) || bitcast<u32>(ax) == 0u) { return hg_bits(0x7f800000u); }
  // below 2^-24, lgamma(x) = -log|x| - 0.577 x + ... rounds to -log|x| (also for
  // subnormals, which drivers may flush in arithmetic: hg_log scales them first)
  if (bitcast<u32>(ax) < 0x33800000u) { return -hg_log(ax); }
  if (x <= 0.0 && x == floor(x)) { return hg_bits(0x7f800000u); }
  if (x < 0.5) {
    let r = x - round(x);  // |sin(pi x)| = |sin(pi r)|, |r| <= 1/2: exact reduction
    let s = abs(sin(3.14159265358979 * r));
    return log(3.14159265358979 / s) - hg_lgamma_pos(1.0 - x);
  }
  return hg_lgamma_pos(x);
}""", ("hg_isnan", "hg_isinf", "hg_bits", "hg_log")),
    "hg_digamma": ("""
// digamma as ATen's calc_digamma (float): reflection below 0, the recurrence up to 10,
// the asymptotic series from there.
fn hg_digamma(x0: f32) -> f32 {
  var x = x0;
  if (x == 0.0) { return select(hg_bits(0xff800000u), hg_bits(0x7f800000u),
                                (bitcast<u32>(x) & 0x80000000u) != 0u); }
  if (hg_isnan(x)) { return x; }
  var reflect = 0.0;
  if (x < 0.0) {
    if (x == trunc(x)) { return hg_bits(0x7fc00000u); }
    let r = x - round(x);  // tan has period pi: |r| <= 1/2 keeps pi r accurate
    reflect = 3.14159265358979 / tan(3.14159265358979 * r);
    x = 1.0 - x;
  }
  if (hg_isinf(x)) { return x; }
  var result = 0.0;
  for (var i = 0; i < 10 && x < 10.0; i++) {
    result = result - 1.0 / x;
    x = x + 1.0;
  }
  if (x == 10.0) { return result + 2.25175258906672 - reflect; }
  let z = 1.0 / (x * x);
  let y = z * ((((((0.0833333333333 * z - 0.0210927960928) * z + 0.00757575757576) * z
      - 0.00416666666667) * z + 0.00396825396825) * z - 0.00833333333333) * z
      + 0.0833333333333);
  return result + log(x) - 0.5 / x - y - reflect;
}""", ("hg_isnan", "hg_isinf", "hg_bits")),
    "hg_zeta_sum": ("""
// The sum of zeta(x, q) as ATen's (Cephes) zeta, in f32: the terms up to q + k > 9,
// then the Euler-Maclaurin tail with 12 Bernoulli terms.
fn hg_zeta_sum(x: f32, q: f32) -> f32 {
  var A = array<f32, 12>(12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1.8924375803e9,
      7.47242496e10, -2.9501307279e12, 1.1646782814e14, -4.5979787224e15, 1.8152105402e17,
      -7.1661652562e18);
  var s = hg_pow(q, -x);
  var a = q;
  var b = 0.0;
  var i = 0;
  loop {
    if (!(i < 9 || a <= 9.0)) { break; }
    i = i + 1;
    a = a + 1.0;
    b = hg_pow(a, -x);
    s = s + b;
    if (-5.96e-8 * s < b && b < 5.96e-8 * s) { return s; }
  }
  let w = a;
  s = s + b * w / (x - 1.0);
  s = s - 0.5 * b;
  a = 1.0;
  var k = 0.0;
  for (var j = 0; j < 12; j++) {
    a = a * (x + k);
    b = b / w;
    let t = a * b / A[j];
    s = s + t;
    if (abs(t / s) < 5.96e-8) { return s; }
    k = k + 1.0;
    a = a * (x + k);
    b = b / w;
    k = k + 1.0;
  }
  return s;
}""", ("hg_pow",)),
    "hg_zeta": ("""
// Hurwitz zeta(x, q): the domain's edges, then hg_zeta_sum; below q = -64 the terms
// under 0 as two sums over positive arguments (the C form's comment says how).
fn hg_zeta(x: f32, q: f32) -> f32 {
  if (hg_isnan(x) || hg_isnan(q)) { return hg_bits(0x7fc00000u); }
  if (x == 1.0) { return hg_bits(0x7f800000u); }
  if (x < 1.0) { return hg_bits(0x7fc00000u); }
  if (q <= 0.0) {
    if (q == floor(q)) { return hg_bits(0x7f800000u); }
    if (x != floor(x)) { return hg_bits(0x7fc00000u); }
    if (hg_isinf(x)) { return x; }
    if (q < -64.0) {
      let r = -q - floor(-q);
      let sign = select(-1.0, 1.0, x - 2.0 * floor(x * 0.5) == 0.0);
      return sign * (hg_zeta_sum(x, r) - hg_zeta_sum(x, 1.0 - q)) + hg_zeta_sum(x, 1.0 - r);
    }
  }
  return hg_zeta_sum(x, q);
}""", ("hg_isnan", "hg_isinf", "hg_bits", "hg_zeta_sum")),
}
