"""Differential tests: the compiled CPU backend agrees with the reference interpreter
on random programs (shapes with 0 and 1, broadcasting, reductions, NaN/inf)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hologram as hg
from hologram.isa import builder as b

from .programs import (
    INT_DTYPES,
    compiled_and_reference,
    int_programs,
    programs,
    random_inputs,
    random_int_inputs,
)

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _compiled_executor() -> hg.Executor:
    ex = hg.default_executor("cpu")
    if "C via" not in ex.backend.describe():
        pytest.skip("no C compiler: the cpu backend is the reference interpreter")
    return ex


def assert_close(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> None:
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
    # infinities and NaN must be in the same places
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got) & (got > 0), np.isinf(want) & (want > 0))


def _check(case, seed: int, rtol: float, atol: float) -> None:
    ex = _compiled_executor()
    fn, specs = case
    p = b.program(fn, specs)
    got, want = compiled_and_reference(ex, p, random_inputs(specs, seed, special=True))
    for g, w in zip(got, want, strict=True):
        assert_close(g, w, rtol=rtol, atol=atol), str(p)


SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@SETTINGS
@given(programs(dtype="f64"), st.integers(0, 2**32 - 1))
def test_cpu_matches_reference_f64(case, seed):
    _check(case, seed, rtol=1e-9, atol=1e-12)


@SETTINGS
@given(programs(dtype="f32"), st.integers(0, 2**32 - 1))
def test_cpu_matches_reference_f32(case, seed):
    # vector libm and summation order differ from NumPy by a few ulp
    _check(case, seed, rtol=2e-4, atol=1e-5)


@SETTINGS
@given(programs(dtype="f64", gemm=True), st.integers(0, 2**32 - 1))
def test_cpu_matches_reference_with_batched_gemm_f64(case, seed):
    """(Batched) GEMMs among the steps: operands are views (permuted, broadcast batch),
    sizes include 0 and 1, inputs NaN and inf."""
    _check(case, seed, rtol=1e-9, atol=1e-12)


@SETTINGS
@given(programs(dtype="f32", gemm=True), st.integers(0, 2**32 - 1))
def test_cpu_matches_reference_with_batched_gemm_f32(case, seed):
    _check(case, seed, rtol=2e-4, atol=1e-5)


# More examples: an empty reduction stored by itself (the case that wrote element 0 of an
# empty output) comes up in most runs of 60, in nearly every run of 100.
EMPTY_SETTINGS = settings(SETTINGS, max_examples=100)


@EMPTY_SETTINGS
@given(programs(dtype="f64", gemm=True, empty=True), st.integers(0, 2**32 - 1))
def test_cpu_matches_reference_with_an_empty_axis_f64(case, seed):
    """One axis of the base shape is 0: empty values, reductions over nothing (their
    identity), products with inner size 0, concats with empty parts. Outputs sit between
    canary bytes (programs.compiled_and_reference): no kernel writes outside them."""
    _check(case, seed, rtol=1e-9, atol=1e-12)


@EMPTY_SETTINGS
@given(programs(dtype="f32", gemm=True, empty=True), st.integers(0, 2**32 - 1))
def test_cpu_matches_reference_with_an_empty_axis_f32(case, seed):
    _check(case, seed, rtol=2e-4, atol=1e-5)


# Integer programs over every integer dtype: the bitwise ops, shifts (counts out of range,
# negative values, the minimum), wrapping arithmetic and sums, casts between integer
# dtypes, bit for bit.
@settings(SETTINGS, max_examples=40)
@given(st.sampled_from(INT_DTYPES).flatmap(lambda d: int_programs(dtype=d)),
       st.integers(0, 2**32 - 1))
def test_cpu_matches_reference_int(case, seed):
    ex = _compiled_executor()
    fn, specs = case
    p = b.program(fn, specs)
    got, want = compiled_and_reference(ex, p, random_int_inputs(specs, seed))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w, err_msg=str(p))


@pytest.mark.parametrize("dtype", ["u8", "u32", "i8"])
def test_abs_of_neg_keeps_its_meaning_on_every_integer_dtype(dtype):
    """abs(neg x) is abs x for signed and float dtypes only: on unsigned ones abs is the
    identity and neg wraps (abs(neg 19) is 237 in uint8), so the rule must not fire."""
    ex = _compiled_executor()
    p = b.program(lambda x: hg.isa.builder.Var(b.unary(hg.isa.Op.ABS,
                                                       b.unary(hg.isa.Op.NEG, x.v))),
                  [(dtype, (6,))])
    info = np.iinfo(hg.isa.dtypes.to_dtype(dtype).np_dtype)
    x = np.array([0, 1, 19, 100, info.max, info.min], info.dtype)
    got, want = compiled_and_reference(ex, p, [x])
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[0], np.abs(-x))
