"""The rounding, remainder and libm opcodes (FLOOR ... ERFC, FMOD, ATAN2, HYPOT) and the
special functions (LGAMMA, DIGAMMA, ZETA) on every backend that runs here, against the
reference interpreter, over their whole domains; the special functions' reference
against PyTorch in float64.

Random programs (test_differential, test_webgpu) draw these ops among others on
normal inputs; here each op meets thousands of values at once: normal and small ones,
values near 1 (log1p, acosh, atanh, asin), whole and half numbers (the rounding ops),
the branch points of the WGSL helpers (0.3-0.7, 20, 89.4), every exponent down to the
subnormals, NaN, +-inf and +-0. Rounding and remainders are exact; the functions are
within a few units in the last place (tolerances below), with NaN, infinities and the
signs of zeros where the reference has them.
"""

from __future__ import annotations

import numpy as np
import pytest

import hologram as hg
from hologram.backends import registry
from hologram.backends.reference import evaluate
from hologram.isa.program import Program

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

EXACT = ["floor", "ceil", "trunc", "rint"]
FUNCTIONS = ["log1p", "expm1", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh",
             "acosh", "atanh", "log2", "log10", "exp2", "erfc"]
BINARY = ["fmod", "atan2", "hypot", "copysign"]
# Relative error allowed where the reference is a normal number, in units of 2^-24 (f32)
# and 2^-53 (f64): glibc's libmvec promises 4 ulp (erfc reaches 4.5 of these units);
# the WGSL helpers stay within 10 on lavapipe (erfc 9.9, expm1 7.5, the rest below 6).
ULPS = {"f32": 12, "f64": 6}


def _values(dtype: np.dtype, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    tiny = np.finfo(np.float32).tiny
    parts = [
        rng.standard_normal(2000) * 3, rng.standard_normal(1000) * 0.3,
        rng.random(1000) * 2 - 1, 1 + rng.random(300) * 0.01, 1 - rng.random(300) * 0.01,
        np.arange(-40, 40) * 0.5, rng.integers(-2**24, 2**24, 200) + 0.5,
        np.ldexp(rng.random(1500) * 2 - 1, rng.integers(-149, 128, 1500)),
        [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.3, -0.3, 0.4, 0.7, -0.7, 20.0,
         19.99, 89.4, -89.4, 89.5, 127.9, 128.0, -149.5, -150.5, 10.1, 9.3, 1e30, -1e30,
         67108865.0, tiny, -tiny, tiny / 8, 3e38, -3e38],
    ]
    return np.concatenate(parts).astype(dtype)


def _executors() -> list[str]:
    names = ["cpu"]
    if registry.why_unavailable("webgpu") is None:
        names.append("webgpu")
    return names


@pytest.fixture(scope="module", params=_executors())
def ex(request):
    with hg.Executor(request.param) as e:
        if request.param == "cpu" and "C via" not in e.backend.describe():
            pytest.skip("no C compiler: the cpu backend is the reference interpreter")
        yield e


def _dtypes(ex: hg.Executor) -> list[str]:
    return ["f32"] if ex.backend_name == "webgpu" else ["f32", "f64"]


def _run(ex: hg.Executor, op: str, dt: str, *arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    n = arrays[0].size
    head = "".join(f".in {i} {dt}[{n}]\n" for i in range(len(arrays)))
    loads = "".join(f"%{i} = ldg.{dt}[{n}] in={i}\n" for i in range(len(arrays)))
    k = len(arrays)
    args = ", ".join(f"%{i}" for i in range(k))
    p = Program.parse(f"{head}{loads}%{k} = {op}.{dt}[{n}] {args}\nstg.{dt}[{n}] %{k} out=0")
    out = np.empty_like(arrays[0])
    ex.launch(p, list(arrays), [out])
    return out, evaluate(p, list(arrays))[0][0]


def _check(got: np.ndarray, want: np.ndarray, ulps: int, what: str) -> None:
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), what + ": NaN places")
    inf = np.isinf(want) | np.isinf(got)
    np.testing.assert_array_equal(got[inf], want[inf], what + ": infinities")
    zero = want == 0
    np.testing.assert_array_equal(np.signbit(got[zero]), np.signbit(want[zero]),
                                  what + ": signs of zeros")
    normal = np.isfinite(want) & (np.abs(want) >= np.finfo(want.dtype).tiny)
    eps = np.finfo(want.dtype).eps / 2
    with np.errstate(all="ignore"):
        rel = np.abs(got[normal].astype(np.float64) - want[normal]) / np.abs(want[normal])
    worst = int(np.argmax(rel)) if rel.size else 0
    assert not rel.size or rel[worst] <= ulps * eps, (
        f"{what}: {rel[worst] / eps:.1f} units at x = {got[normal][worst]!r} "
        f"(want {want[normal][worst]!r})")


@pytest.mark.parametrize("op", EXACT + FUNCTIONS)
def test_unary(ex, op):
    for dt in _dtypes(ex):
        x = _values(np.dtype({"f32": np.float32, "f64": np.float64}[dt]), 1)
        got, want = _run(ex, op, dt, x)
        _check(got, want, 0 if op in EXACT else ULPS[dt], f"{ex.backend_name} {op}.{dt}")


@pytest.mark.parametrize("op", BINARY)
def test_binary(ex, op):
    for dt in _dtypes(ex):
        npd = np.dtype({"f32": np.float32, "f64": np.float64}[dt])
        x = _values(npd, 2)
        y = _values(npd, 3)[np.random.default_rng(4).permutation(x.size)]
        y[:100] = x[:100] * npd.type(3)  # fmod: quotients near small integers
        specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -3.0, 1e-40, 2.5], npd)
        x = np.concatenate([x, np.repeat(specials, specials.size)])
        y = np.concatenate([y, np.tile(specials, specials.size)])
        got, want = _run(ex, op, dt, x, y)
        exact = op in ("fmod", "copysign")
        _check(got, want, 0 if exact else ULPS[dt], f"{ex.backend_name} {op}.{dt}")


def test_every_op_here_compiles_for_cuda():
    """One program with all of them, f32 and f64, rendered as CUDA C and compiled by NVRTC
    for sm_90 (the random programs draw only some ops per run)."""
    from hologram.compiler import nvrtc

    if not nvrtc.available():
        pytest.skip("NVRTC is not installed")
    from .test_cuda_compile import compile_for_gpu

    for dt in ("f32", "f64"):
        n = 64
        lines = [f".in 0 {dt}[{n}]", f".in 1 {dt}[{n}]", f"%0 = ldg.{dt}[{n}] in=0",
                 f"%1 = ldg.{dt}[{n}] in=1"]
        ops = [(op, "%0") for op in EXACT + FUNCTIONS + SPECIAL_UNARY] + \
            [(op, "%0, %1") for op in [*BINARY, "zeta"]]
        for k, (op, args) in enumerate(ops):
            lines.append(f"%{k + 2} = {op}.{dt}[{n}] {args}")
            lines.append(f"stg.{dt}[{n}] %{k + 2} out={k}")
        compile_for_gpu(Program.parse("\n".join(lines)))


# --- the special functions: LGAMMA, DIGAMMA, ZETA (compiler/special_math.py) --------------
SPECIAL_UNARY = ["lgamma", "digamma"]
#: WGSL's f32 helpers: absolute error in units of 2^-24 (1 + |result|) (lgamma near its
#: zeros at 1 and 2 loses relative accuracy, digamma near its poles).
WGSL_SPECIAL_UNITS = 128


def _zeta_args(npd: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """(x, q) pairs over zeta's domain: x from 1 (a pole) to 12, whole and fractional,
    below 1 (NaN); q positive, negative (fractional: defined for whole x), the poles at
    0 and the negative integers, huge, tiny, NaN and inf."""
    rng = np.random.default_rng(7)
    x = np.concatenate([1 + rng.random(400) * 11, rng.integers(1, 13, 400).astype(float),
                        rng.random(50), [1.0, 2.0, np.nan, np.inf]])
    q = np.concatenate([rng.standard_normal(300) * 5, rng.random(200) * 0.01,
                        -rng.integers(0, 30, 200) - rng.random(200),
                        [0.0, -0.0, -1.0, -7.0, 1e6, 1e-30, np.nan, np.inf, -np.inf,
                         -20000.5, 3.0, 0.5]])
    n = min(x.size, q.size)
    return x[:n].astype(npd), q[rng.permutation(q.size)[:n]].astype(npd)


def _close_absolute(got: np.ndarray, want: np.ndarray, units: int, what: str) -> None:
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), what + ": NaN places")
    inf = np.isinf(want) | np.isinf(got)
    np.testing.assert_array_equal(got[inf], want[inf], what + ": infinities")
    fin = ~np.isnan(want) & ~inf
    w = want[fin].astype(np.float64)
    err = np.abs(got[fin] - w) / (1 + np.abs(w)) / np.finfo(np.float32).eps * 2
    assert not err.size or err.max() <= units, (
        f"{what}: {err.max():.1f} units at x = {np.flatnonzero(fin)[np.argmax(err)]}")


@pytest.mark.parametrize("op", SPECIAL_UNARY)
def test_special_unary(ex, op):
    for dt in _dtypes(ex):
        x = _values(np.dtype({"f32": np.float32, "f64": np.float64}[dt]), 5)
        x = np.concatenate([x, np.arange(-30, 31, dtype=x.dtype) * x.dtype.type(0.25),
                            x.dtype.type(1.4616321) + np.arange(-5, 6, dtype=x.dtype) * 1e-6])
        got, want = _run(ex, op, dt, x)
        what = f"{ex.backend_name} {op}.{dt}"
        if ex.backend_name == "webgpu":
            _close_absolute(got, want, WGSL_SPECIAL_UNITS, what)
        else:
            _close_absolute(got, want, 8, what)  # near digamma's root: absolute terms
            # away from the zeros, relative: a few ulp (digamma sums terms that partly
            # cancel, so libm's and NumPy's log and tan show through in f64)
            far = np.abs(want) > 0.05
            _check(got[far], want[far], ULPS[dt] * (3 if dt == "f64" else 1), what)


def test_special_zeta(ex):
    for dt in _dtypes(ex):
        x, q = _zeta_args(np.dtype({"f32": np.float32, "f64": np.float64}[dt]))
        got, want = _run(ex, "zeta", dt, x, q)
        what = f"{ex.backend_name} zeta.{dt}"
        if ex.backend_name == "webgpu":
            # the sums add in f32 there; relative to the result (its terms share a sign
            # for x whole and q < 0 only far from the poles)
            fin = np.isfinite(want) & np.isfinite(got)
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want), what)
            np.testing.assert_allclose(got[fin], want[fin], rtol=2e-5, err_msg=what)
        else:
            _check(got, want, ULPS[dt], what)


def test_special_reference_is_pytorchs_in_float64():
    """The reference (backends/special_reference.py) against PyTorch in float64:
    lgamma, digamma, zeta and the polygammas built from it (the torch translation's
    formula), NaN, infinities, poles and negative arguments included."""
    torch = pytest.importorskip("torch")
    from hologram.backends import special_reference as sr

    x = np.concatenate([_values(np.dtype(np.float64), 6), np.arange(-40, 41) * 0.25])
    t = torch.from_numpy(x)
    # lgamma: C libraries (ATen may vectorize); digamma: ATen's steps, NumPy's log and tan
    for mine, theirs, rtol in ((sr.lgamma, torch.lgamma, 1e-15),
                               (sr.digamma, torch.digamma, 1e-14)):
        got, want = mine(x), theirs(t).numpy()
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-14)
    zx, zq = _zeta_args(np.dtype(np.float64))
    got = sr.zeta(zx, zq)
    want = torch.special.zeta(torch.from_numpy(zx), torch.from_numpy(zq)).numpy()
    # pow's last bit; below ZETA_SPLIT ATen's long sum rounds more than the split sums
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
    import math

    # polygamma(n, x) = (-1)^(n+1) n! zeta(n + 1, x); ATen sums |x| terms for x < 0 (its
    # zeta takes seconds at -2^24), and its n = 1 is trigamma, which differs at +-inf
    # and at its poles (0 and the negative integers: zeta says inf, trigamma ~1e30)
    x = x[np.isfinite(x) & (x > -1e4)]
    for n in range(1, 5):
        if n == 1:
            x = x[(x > 0) | (x != np.floor(x))]
        pg = (1.0 if n % 2 else -1.0) * math.factorial(n) * sr.zeta(np.full_like(x, n + 1), x)
        want = torch.polygamma(n, torch.from_numpy(x)).numpy()
        np.testing.assert_array_equal(np.isnan(pg), np.isnan(want))
        np.testing.assert_allclose(pg, want, rtol=1e-9, atol=1e-12)
