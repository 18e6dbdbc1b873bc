"""hologram's own ``hg_expf`` (compiler/c_math.py): as accurate as libm over the whole
float32 range, NumPy's special values, vectorised inline (no libm call), and the ops
built on it (softmax, sigmoid) stay right where glibc's vector expf took its slow path."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from hologram.compiler.c_math import C_MATH
from hologram.compiler.cc import C_PRELUDE, CCompiler

from .test_cc import call_unary, unary_kernels

#: error bound in units of float32 spacing of the exact result (measured: 1.95 over
#: every float32 in [-104, 89]; glibc's libmvec expf 2.64 by the same count)
MAX_UNITS = 2.0


@pytest.fixture(autouse=True)
def private_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("HOLOGRAM_CACHE_DIR", str(d))
    return d


@pytest.fixture(scope="module")
def cc() -> CCompiler:
    found = CCompiler.find()
    if found is None:
        pytest.skip("no working C compiler on this machine")
    return found


def sample_range(lo: float, hi: float, step: int) -> np.ndarray:
    """Every ``step``-th float32 bit pattern from ``lo`` to ``hi`` (both signs), so every
    binade, the subnormal results and both overflow edges are covered."""
    neg = np.arange(0, np.float32(-lo).view(np.uint32), step, dtype=np.uint32)
    pos = np.arange(0, np.float32(hi).view(np.uint32), step, dtype=np.uint32)
    return np.concatenate([-neg.view(np.float32), pos.view(np.float32)])


def error_units(y: np.ndarray, x: np.ndarray) -> np.ndarray:
    """|y - exp(x)| in units of the float32 spacing at exp(x), exact exp in float64."""
    with np.errstate(over="ignore"):
        ref = np.exp(x.astype(np.float64))
    with np.errstate(over="ignore"):
        r32 = ref.astype(np.float32)  # inf where float32 overflows
    fin = np.isfinite(r32)
    assert np.array_equal(np.isinf(y), ~fin), x[np.isinf(y) != ~fin][:5]
    spacing = np.maximum(np.spacing(np.abs(r32[fin])).astype(np.float64), 2.0 ** -149)
    return np.abs(y[fin].astype(np.float64) - ref[fin]) / spacing


def build(cc: CCompiler, prelude: str, tag: str):
    src = unary_kernels({"k_exp": ("float", "hg_expf(x[i])")}).replace(C_PRELUDE, prelude)
    return cc.compile(src, {"program": tag})


def test_hg_expf_is_as_accurate_as_libm(cc: CCompiler) -> None:
    x = np.concatenate([sample_range(-110.0, 95.0, 331),
                        np.random.default_rng(0).uniform(-1, 1, 200_000).astype(np.float32)])
    y = call_unary(build(cc, C_PRELUDE, "c-math"), "k_exp", x)
    assert error_units(y, x).max() <= MAX_UNITS


def test_hg_expf_without_fma_stays_accurate(cc: CCompiler) -> None:
    """A target without FMA gets ``a*b+c`` (two roundings) instead of a libm fmaf call."""
    prelude = C_PRELUDE.replace(C_MATH, "#undef FP_FAST_FMAF\n" + C_MATH)
    x = sample_range(-110.0, 95.0, 997)
    y = call_unary(build(cc, prelude, "c-math-nofma"), "k_exp", x)
    assert error_units(y, x).max() <= 3.0


def test_hg_expf_special_values_match_numpy(cc: CCompiler) -> None:
    x = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 88.72283,
                  88.72284, 88.7, -87.33, -87.34, -103.97, -103.98, -104.0, 1e30, -1e30,
                  float.fromhex("0x1.62e42ep6"), -float.fromhex("0x1.9fe368p6")], np.float32)
    y = call_unary(build(cc, C_PRELUDE, "c-math-special"), "k_exp", x)
    with np.errstate(over="ignore"):
        want = np.exp(x)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(want))
    np.testing.assert_array_equal(y[np.isinf(want)], want[np.isinf(want)])
    np.testing.assert_array_equal(y[want == 0], want[want == 0])
    assert error_units(y[~np.isnan(x)], x[~np.isnan(x)]).max() <= MAX_UNITS


def test_hg_expf_is_inline_vector_code(cc: CCompiler, private_cache: Path) -> None:
    """No call to libm's or libmvec's expf: the loop is hologram's own vector code."""
    build(cc, C_PRELUDE, "c-math-inline")
    so = next(p for p in private_cache.glob("*.so") if b"k_exp" in p.read_bytes()).read_bytes()
    assert not re.search(rb"_ZGV\w*_expf|\bexpf\b", so)


def test_cpu_kernels_use_hg_expf_for_f32_only() -> None:
    import hologram
    from hologram.isa import builder as b

    ex = hologram.Executor(backend="cpu")
    if ex.backend.name != "cpu":
        pytest.skip("no C compiler: the reference backend runs")
    for dtype, own in (("f32", True), ("f64", False)):
        p = b.program(lambda x: x.exp() + x.sigmoid(), [(dtype, (64,))])
        src = ex.backend.compile(p).source.split("void k0")[1]
        assert ("hg_expf(" in src) is own and ("exp(" in src) is not own, src


@pytest.mark.parametrize("case", ["half_masked", "wide", "nan_row", "all_masked"])
def test_softmax_where_vector_expf_was_slow(case: str) -> None:
    """Rows half -inf (causal masks) and logits spread over hundreds (x - max < -87.3):
    the inputs that sent glibc's vector expf to its scalar path now give NumPy's
    softmax in float64, including a NaN row and an all -inf row (NaN)."""
    import hologram
    from hologram.ops import composites as HC

    rng = np.random.default_rng(7)
    x = rng.standard_normal((33, 300)).astype(np.float32)
    if case == "half_masked":
        x[:, 150:] = -np.inf
    elif case == "wide":
        x *= 100
    elif case == "nan_row":
        x[3, 17] = np.nan
    else:
        x[5] = -np.inf
    f = hologram.jit(lambda v: HC.softmax(v, axis=1))
    x64 = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        e = np.exp(x64 - x64.max(axis=1, keepdims=True))
        want = e / e.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(f(x), want, rtol=2e-6, atol=1e-37, equal_nan=True)


def test_sigmoid_over_the_whole_range() -> None:
    """Below x = -88.7, exp(-x) overflows float32 and 1/(1+inf) is 0 where the exact
    value is subnormal: NumPy's float32 formula does the same, hence atol = FLT_MIN."""
    import hologram

    x = np.concatenate([np.linspace(-120, 120, 10_001, dtype=np.float32),
                        np.array([np.nan, np.inf, -np.inf, -0.0], np.float32)])
    f = hologram.jit(lambda v: v.sigmoid())
    with np.errstate(over="ignore"):
        want = 1 / (1 + np.exp(-x.astype(np.float64)))
    np.testing.assert_allclose(f(x), want, rtol=1e-6, atol=np.finfo(np.float32).tiny,
                               equal_nan=True)
