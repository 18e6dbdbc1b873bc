"""f16 and bf16 on the CPU backend against the reference interpreter.

The CPU's C stores f16 and bf16 as their 16 bits (GCC 12 has no ``__bf16`` on x86, and
its ``_Float16`` conversions do not vectorize there), computes both in float and rounds
every instruction's result to the dtype, to nearest even: the reference's meaning, and
the CUDA backend's (compiler/half_floats.py).
Conversions are checked bit for bit, the per-instruction rounding bit for bit, and the
composite suite and random programs within a few units of the dtype's roundoff.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hologram.isa import builder as b
from hologram.isa.dtypes import bf16

from .programs import HALF_SETTINGS, compiled_and_reference, near_ties, programs
from .test_cuda_half import DTYPES, _inputs, _nearest_even, _np, _tolerance, _tricky_f32
from .test_differential import assert_close
from .test_fusion import CASES

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _check(ex, p, inputs, dtype: str, ulps: int) -> None:
    tol = _tolerance(dtype, ulps)
    got, want = compiled_and_reference(ex, p, inputs)
    for g, w in zip(got, want, strict=True):
        assert_close(g.astype(np.float64), w.astype(np.float64), rtol=tol, atol=tol), str(p)


@pytest.mark.parametrize("dtype", DTYPES)
def test_f32_conversions_are_bit_exact(native_cpu, dtype):
    x = _tricky_f32(dtype)
    p = b.program(lambda v: (v.cast(dtype), v.cast(dtype).cast("f32")), [("f32", x.shape)])
    half, back = np.zeros(x.shape, _np(dtype)), np.zeros(x.shape, np.float32)
    native_cpu.launch(p, [x], [half, back])
    want = x.astype(_np(dtype))
    nan = np.isnan(x)
    assert np.isnan(half.astype(np.float32)[nan]).all() and np.isnan(back[nan]).all()
    np.testing.assert_array_equal(half.view(np.uint16)[~nan], want.view(np.uint16)[~nan])
    np.testing.assert_array_equal(back[~nan].view(np.uint32),
                                  want.astype(np.float32)[~nan].view(np.uint32))


@pytest.mark.parametrize("dtype", DTYPES)
def test_f64_and_integer_conversions_round_once(native_cpu, dtype):
    """f64 -> dtype rounds once (bf16: through float rounded to odd), not twice through
    f32; an i64 above 2**24 too."""
    t = _np(dtype)
    x = np.concatenate([near_ties(t), [0.0, -0.0, 1e300, -1e-300, 65520.0, 3.3961e38, -1e-45]])
    p = b.program(lambda v: v.cast(dtype).cast("f64"), [("f64", x.shape)])
    out = np.zeros(x.shape)
    native_cpu.launch(p, [x], [out])
    want = np.array([_nearest_even(float(v), dtype) for v in x])
    np.testing.assert_array_equal(out, want)
    assert (np.float32(x[400:800]).astype(t).astype(np.float64) != want[400:800]).any()
    ints = np.array([2**24 + 1, 2**30 + 2**22 + 1, -(2**40) - 2**33 - 1, 7, 0], np.int64)
    p = b.program(lambda v: v.cast(dtype).cast("f64"), [("i64", ints.shape)])
    out = np.zeros(ints.shape)
    native_cpu.launch(p, [ints], [out])
    np.testing.assert_array_equal(out, [_nearest_even(float(v), dtype) for v in ints])


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_instruction_rounds_as_numpy_does(native_cpu, dtype):
    specs = [(dtype, (2000,))] * 3
    p = b.program(lambda x, y, z: ((x * y + z) / 7.0 - x) * 3.0, specs)
    inputs = _inputs(specs, 11)
    got, want = compiled_and_reference(native_cpu, p, inputs)
    g, w = got[0], want[0]
    nan = np.isnan(w.astype(np.float32))
    assert (np.isnan(g.astype(np.float32)) == nan).all()
    np.testing.assert_array_equal(g.view(np.uint16)[~nan], w.view(np.uint16)[~nan])
    x, y, z = (a.astype(np.float64) for a in inputs)
    unrounded = (((x * y + z) / 7.0 - x) * 3.0).astype(_np(dtype))
    assert (unrounded.view(np.uint16)[~nan] != w.view(np.uint16)[~nan]).any()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_composites_match_reference(native_cpu, name, dtype):
    fn, specs, _ = CASES[name]
    small = [(dtype, tuple(min(n, 24) for n in s) if not name.startswith("gemm") else s)
             for _, s in specs]
    p = b.program(fn, small)
    ulps = 8 if dtype == "f16" else 64 if name in ("sum_all", "mse", "bce") else 32
    _check(native_cpu, p, _inputs(small, zlib.crc32(name.encode())), dtype, ulps)


SETTINGS = HALF_SETTINGS


@SETTINGS
@given(programs(dtype="f16", max_ops=5), st.integers(0, 2**32 - 1))
def test_random_programs_f16(native_cpu, case, seed):
    fn, specs = case
    _check(native_cpu, b.program(fn, specs), _inputs(specs, seed), "f16", 8)


@pytest.mark.skipif(bf16.np_dtype is None, reason="bf16 needs ml_dtypes")
@SETTINGS
@given(programs(dtype="bf16", max_ops=5), st.integers(0, 2**32 - 1))
def test_random_programs_bf16(native_cpu, case, seed):
    fn, specs = case
    _check(native_cpu, b.program(fn, specs), _inputs(specs, seed), "bf16", 16)
