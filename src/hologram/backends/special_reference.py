"""What LGAMMA, DIGAMMA and ZETA mean: NumPy in float64 (narrower floats are computed
in float64 and rounded once).

LGAMMA is the C library's ``lgamma_r`` (C99's lgamma: +inf at 0, the negative integers
and +-inf), called through ctypes: glibc's is within 2 units in the last place, where
Python's ``math.lgamma`` (used only where no C library is found) loses most of its
relative accuracy near lgamma's zeros.
DIGAMMA and ZETA follow ATen's Cephes-derived ``calc_digamma`` and ``zeta``
step by step (``compiler/special_math.py`` has the C the kernels run, and why), so
the reference, the kernels and PyTorch agree to rounding.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
from collections.abc import Callable

import numpy as np

#: digamma(10), where ATen's recurrence may land exactly.
PSI_10 = 2.25175258906672110764
#: The asymptotic series' coefficients (Cephes), highest power first.
_DIGAMMA_A = (8.33333333333333333333E-2, -2.10927960927960927961E-2,
              7.57575757575757575758E-3, -4.16666666666666666667E-3,
              3.96825396825396825397E-3, -8.33333333333333333333E-3,
              8.33333333333333333333E-2)
#: Euler-Maclaurin's Bernoulli terms for zeta (Cephes).
_ZETA_A = (12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1.8924375803183791606e9,
           7.47242496e10, -2.950130727918164224e12, 1.1646782814350067249e14,
           -4.5979787224074726105e15, 1.8152105401943546773e17, -7.1661652561756670113e18)
_MACHEP = 1.11022302462515654042E-16
#: Below this a negative ``q``'s terms under 0 are summed as two positive-argument sums.
ZETA_SPLIT = -64.0


def _libm_lgamma() -> Callable[[float], float] | None:
    """The C library's reentrant ``lgamma_r`` as a Python function, or None."""
    name = ctypes.util.find_library("m") or ctypes.util.find_library("c")
    try:
        lib = ctypes.CDLL(name)
        fn = lib.lgamma_r
    except (OSError, AttributeError, TypeError):
        return None
    fn.restype = ctypes.c_double
    fn.argtypes = [ctypes.c_double, ctypes.POINTER(ctypes.c_int)]

    def lgamma_r(x: float) -> float:
        sign = ctypes.c_int()
        return fn(x, ctypes.byref(sign))

    return lgamma_r


def _python_lgamma(x: float) -> float:
    try:
        return math.lgamma(x)
    except (ValueError, OverflowError):  # the poles, and results past double's range
        return math.inf


_lgamma64 = np.frompyfunc(_libm_lgamma() or _python_lgamma, 1, 1)


def lgamma(x: np.ndarray) -> np.ndarray:
    return np.asarray(_lgamma64(np.asarray(x, np.float64)), np.float64).astype(x.dtype)


def digamma(x: np.ndarray) -> np.ndarray:
    """ATen's calc_digamma in double, element-wise."""
    a = np.asarray(x, np.float64)
    with np.errstate(all="ignore"):
        neg = a < 0
        frac = a - np.trunc(a)  # modf's fractional part (its sign is x's)
        reflect = np.where(neg, np.pi / np.tan(np.pi * frac), 0.0)
        y = np.where(neg, 1 - a, a)
        result = np.zeros_like(a)
        for _ in range(10):  # y > 0 here: ten steps reach 10
            low = y < 10
            result = np.where(low, result - 1 / y, result)
            y = np.where(low, y + 1, y)
        z = 1.0 / (y * y)
        poly = np.zeros_like(a)
        for c in _DIGAMMA_A:
            poly = poly * z + c
        tail = np.where(y < 1.0e17, z * poly, 0.0)
        out = np.where(y == 10, result + PSI_10 - reflect,
                       result + np.log(y) - 0.5 / y - tail - reflect)
        out = np.where(neg & (a == np.trunc(a)), np.nan, out)
        out = np.where(a == 0, np.copysign(np.inf, -a), out)
    return out.astype(x.dtype)


def _zeta1(x: float, q: float) -> float:
    """ATen's zeta(x, q) for one pair, in double (NumPy scalars: C's NaN and inf); below
    q = -64 the negative terms as two sums over positive arguments (special_math)."""
    x, q = np.float64(x), np.float64(q)
    if x == 1:
        return math.inf
    if x < 1:
        return math.nan
    if q <= 0:
        if q == np.floor(q):
            return math.inf
        if x != np.floor(x):
            return math.nan
        if x == math.inf:
            return math.inf
        if q < ZETA_SPLIT:
            r = -q - np.floor(-q)
            sign = 1.0 if np.fmod(x, 2.0) == 0 else -1.0
            return float(sign * (_zeta_sum(x, r) - _zeta_sum(x, 1 - q)) + _zeta_sum(x, 1 - r))
    return _zeta_sum(x, q)


def _zeta_sum(x: np.float64, q: np.float64) -> float:
    """ATen's sum: the terms up to q + k > 9, then the Euler-Maclaurin tail."""
    s = np.power(q, -x)
    a, b, i = q, np.float64(0.0), 0
    while i < 9 or a <= 9.0:
        i += 1
        a += 1
        b = np.power(a, -x)
        s += b
        if -_MACHEP * s < b < _MACHEP * s:
            return float(s)
    w = a
    s += b * w / (x - 1)
    s -= 0.5 * b
    a, k = np.float64(1.0), np.float64(0.0)
    for c in _ZETA_A:
        a *= x + k
        b /= w
        t = a * b / c
        s = s + t
        if abs(t / s) < _MACHEP:
            return float(s)
        k += 1
        a *= x + k
        b /= w
        k += 1
    return float(s)


_zeta64 = np.frompyfunc(_zeta1, 2, 1)


def zeta(x: np.ndarray, q: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        r = _zeta64(np.asarray(x, np.float64), np.asarray(q, np.float64))
    return np.asarray(r, np.float64).astype(np.result_type(x, q))
