"""f16 and bf16 on the CUDA backend (emulated device) against the reference interpreter.

The CUDA C stores them as cuda_fp16.h's ``__half`` and cuda_bf16.h's ``__nv_bfloat16``
and computes in float, rounding every instruction's result to the dtype (as NumPy's
float16 ufuncs do); the emulated device's prelude gives those types host meanings. The
conversions are checked bit for bit (round to nearest even, subnormals, overflow, ties)
and the composite suite and random programs against the reference interpreter at two
block sizes and thread orders. bf16 needs ml_dtypes (NumPy has no bfloat16).
"""

from __future__ import annotations

import os
import zlib
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import hologram as hg
from hologram.isa import builder as b
from hologram.isa.dtypes import bf16

from .cuda_env import cuda_device, cuda_executors
from .programs import (
    HALF_SETTINGS,
    compiled_and_reference,
    near_ties,
    programs,
    random_inputs,
    without_finite_overflow,
)
from .test_differential import assert_close
from .test_fusion import CASES

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

#: (threads per block, thread order)
CONFIGS = [(32, "reverse"), (128, "shuffled")]
DTYPES = ["f16", pytest.param("bf16", marks=pytest.mark.skipif(
    bf16.np_dtype is None, reason="bf16 needs ml_dtypes"))]
#: Significand bits (with the implicit one) of each dtype: its unit roundoff is 2**-p.
BITS = {"f16": 11, "bf16": 8}


#: scripts/gpu_check.sh runs this file on a GPU with HOLOGRAM_CUDA_TEST_DEVICE=gpu.
KIND = os.environ.get("HOLOGRAM_CUDA_TEST_DEVICE", "emulated")


@pytest.fixture(scope="module")
def executors():
    with cuda_device(KIND), cuda_executors(CONFIGS) as exs:
        yield exs


def _run_each(executors, p, inputs, seed=0):
    """(got, want) under every configuration."""
    for ex, order in executors:
        dev = ex.backend.device
        dev.order, dev.seed = order, seed
        try:
            yield compiled_and_reference(ex, p, inputs)
        finally:
            dev.order, dev.seed = "forward", 0


def _np(dtype: str) -> np.dtype:
    return np.dtype(hg.isa.dtypes.to_dtype(dtype).np_dtype)


# --- the conversions, bit for bit ------------------------------------------------------
def _tricky_f32(dtype: str) -> np.ndarray:
    """Every value of ``dtype`` (as f32), the midpoints between neighbours (ties) and
    one f32 ulp either side of them, overflow edges, subnormals, NaN, infinities and
    random bit patterns."""
    t = _np(dtype)
    every = np.arange(2**16, dtype=np.uint16).view(t).astype(np.float32)
    finite = np.unique(every[np.isfinite(every)].astype(np.float64))
    mids = ((finite[:-1] + finite[1:]) / 2).astype(np.float32)  # exact in f32
    near = np.concatenate([np.nextafter(mids, np.float32(np.inf)),
                           np.nextafter(mids, np.float32(-np.inf))])
    rng = np.random.default_rng(zlib.crc32(dtype.encode()))
    noise = rng.integers(0, 2**32, 20_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return np.concatenate([every, mids, near, noise]).astype(np.float32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_f32_conversions_are_bit_exact(executors, dtype):
    x = _tricky_f32(dtype)
    p = b.program(lambda v: (v.cast(dtype), v.cast(dtype).cast("f32")), [("f32", x.shape)])
    ex, _ = executors[0]
    half = np.zeros(x.shape, _np(dtype))
    back = np.zeros(x.shape, np.float32)
    ex.launch(p, [x], [half, back])
    want = x.astype(_np(dtype))  # NumPy's (ml_dtypes') rounding: to nearest even
    nan = np.isnan(x)
    assert np.isnan(half.astype(np.float32)[nan]).all() and np.isnan(back[nan]).all()
    np.testing.assert_array_equal(half.view(np.uint16)[~nan], want.view(np.uint16)[~nan])
    np.testing.assert_array_equal(back[~nan].view(np.uint32),
                                  want.astype(np.float32)[~nan].view(np.uint32))


def _nearest_even(x: float, dtype: str) -> float:
    """``x`` rounded to ``dtype`` exactly (fractions): the nearer neighbour, the even one
    on a tie; beyond the largest finite value's rounding edge, an infinity."""
    t = _np(dtype)
    c = float(np.float32(x).astype(t))  # a neighbour, or next to one
    steps = np.arange(-2, 3)
    bits = np.int64(np.asarray(c, t).view(np.uint16)) + np.where(c < 0, -steps, steps)
    cands = [float(v) for v in np.asarray(bits % 2**16, np.uint16).view(t).astype(np.float64)
             if np.isfinite(v)]
    every = np.arange(2**16, dtype=np.uint16).view(t).astype(np.float64)
    top = np.sort(every[np.isfinite(every)])[-2:]
    big, ulp = float(top[1]), float(top[1] - top[0])
    if abs(x) >= big + ulp / 2:
        return float(np.copysign(np.inf, x))
    best = min(cands, key=lambda v: (abs(Fraction(v) - Fraction(x)),
                                     int(np.asarray(v, t).view(np.uint16)) & 1))
    return best


@pytest.mark.parametrize("dtype", DTYPES)
def test_f64_conversions_round_once(executors, dtype):
    """f64 -> dtype rounds once (``__double2half``/``__double2bfloat16``), not through
    f32: values a hair past a tie, which a detour through f32 would round to the tie
    and then to even, go to the far neighbour."""
    t = _np(dtype)
    x = np.concatenate([near_ties(t), [0.0, -0.0, 1e300, -1e-300, 65520.0]])
    p = b.program(lambda v: v.cast(dtype).cast("f64"), [("f64", x.shape)])
    ex, _ = executors[0]
    out = np.zeros(x.shape)
    ex.launch(p, [x], [out])
    want = np.array([_nearest_even(float(v), dtype) for v in x])
    np.testing.assert_array_equal(out, want)
    assert (np.float32(x[400:800]).astype(t).astype(np.float64) != want[400:800]).any(), \
        "no value here tells one rounding from two"


# --- programs against the reference interpreter ---------------------------------------
def _inputs(specs, seed: int, special: bool = True) -> list[np.ndarray]:
    """random_inputs' values (NaN, infinities, zeros included) in each spec's dtype."""
    f32 = random_inputs([("f32", s) for _, s in specs], seed, special)
    return [a.astype(_np(d)) for a, (d, _) in zip(f32, specs, strict=True)]


def _tolerance(dtype: str, ulps: int) -> float:
    return ulps * 2.0 ** -BITS[dtype]


def _check(executors, p, inputs, dtype: str, ulps: int, seed: int = 0) -> None:
    tol = _tolerance(dtype, ulps)
    for got, want in _run_each(executors, p, inputs, seed):
        for g, w in zip(got, want, strict=True):
            g64, w64 = g.astype(np.float64), w.astype(np.float64)
            assert_close(g64, w64, rtol=tol, atol=tol), str(p)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_composites_match_reference(executors, name, dtype):
    fn, specs, _ = CASES[name]
    small = [(dtype, tuple(min(n, 24) for n in s) if not name.startswith("gemm") else s)
             for _, s in specs]  # a GEMM's inner sizes stay equal
    p = b.program(fn, small)
    # sums of hundreds of elements: the reference adds bf16 in bf16 (ml_dtypes), the
    # kernels in float; their difference grows with the sum's length
    ulps = 8 if dtype == "f16" else 64 if name in ("sum_all", "mse", "bce") else 32
    inputs = _inputs(small, zlib.crc32(name.encode()))
    if name.startswith("gemm"):  # the emulated cuBLAS adds in float, in its own order
        inputs = without_finite_overflow(inputs)
    _check(executors, p, inputs, dtype, ulps)


@pytest.mark.parametrize("dtype", DTYPES)
def test_half_gemms_run_on_cublas_in_float(executors, dtype):
    """f16/bf16 products (2-D, and batched over permuted views: strided cuBLAS calls) are
    computed in float and rounded once, as cuBLAS's CUBLAS_COMPUTE_32F and NumPy's own
    float16 matmul do."""
    def fn(x, y, w):
        q = x.reshape((2, 6, 4, 8)).permute((0, 2, 1, 3))
        k = y.reshape((2, 5, 4, 8)).permute((0, 2, 3, 1))
        return (q @ k).tanh(), x.reshape((12, 32)) @ w

    specs = [(dtype, (2, 6, 32)), (dtype, (2, 5, 32)), (dtype, (32, 7))]
    p = b.program(fn, specs)
    calls = [s for s in executors[0][0].compile(p).steps if hasattr(s, "trans_a")]
    assert {c.dtype for c in calls} == {dtype}
    # no specials: +-3e38 products overflow float32 (inf - inf: NaN) where the
    # reference's bf16 dot (ml_dtypes) sums in a wider type
    inputs = _inputs(specs, 3, special=False)
    inputs[0][0, 0, :3] = [np.nan, np.inf, 0.0]
    _check(executors, p, inputs, dtype, 16)


SETTINGS = HALF_SETTINGS


@SETTINGS
@given(programs(dtype="f16", max_ops=5), st.integers(0, 2**32 - 1))
def test_random_programs_f16(executors, case, seed):
    fn, specs = case
    _check(executors, b.program(fn, specs), _inputs(specs, seed), "f16", 8, seed)


@pytest.mark.skipif(bf16.np_dtype is None, reason="bf16 needs ml_dtypes")
@SETTINGS
@given(programs(dtype="bf16", max_ops=5), st.integers(0, 2**32 - 1))
def test_random_programs_bf16(executors, case, seed):
    fn, specs = case
    _check(executors, b.program(fn, specs), _inputs(specs, seed), "bf16", 16, seed)


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_instruction_rounds_as_numpy_does(executors, dtype):
    """+, -, *, / of 16-bit floats, each computed in float and rounded to the dtype, are
    NumPy's float16 (ml_dtypes' bfloat16) results bit for bit; rounding only on the
    store (float all the way through) would differ from them."""
    specs = [(dtype, (500,))] * 3
    p = b.program(lambda x, y, z: ((x * y + z) / 7.0 - x) * 3.0, specs)
    inputs = _inputs(specs, 11)
    for got, want in _run_each(executors, p, inputs):
        np.testing.assert_array_equal(got[0].view(np.uint16), want[0].view(np.uint16))
    x, y, z = (a.astype(np.float64) for a in inputs)
    unrounded = (((x * y + z) / 7.0 - x) * 3.0).astype(_np(dtype))
    assert (unrounded.view(np.uint16) != want[0].view(np.uint16)).any()
