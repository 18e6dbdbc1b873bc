"""hologram's counter-based random numbers (``hologram.ops.random_bits``): programs of
u32 instructions that draw the same bits on every backend.

The words are checked bit for bit against an independent NumPy transcription of the
documented hash on the reference interpreter, the native CPU backend, the emulated
CUDA device and WebGPU (where an adapter exists), and compiled by NVRTC; then the
numbers' distributions, the independence of seeds and streams, and the errors.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hologram as hg
from hologram.backends import registry
from hologram.backends.reference import evaluate
from hologram.compiler import nvrtc
from hologram.isa import dtypes
from hologram.isa.builder import Var, const, program
from hologram.ops import random_bits as rb

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

SHAPES = [(), (1,), (7,), (3, 1, 5), (2, 3, 4, 5), (0, 3), (33, 65)]


def _mix(x: np.ndarray) -> np.ndarray:
    """lowbias32, written out from its published constants (not from the module)."""
    x = x.astype(np.uint32)
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x21F0AAAD)
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x735A2D97)
    x ^= x >> np.uint32(15)
    return x


def np_words(seed: int, shape: tuple[int, ...], stream: int) -> tuple[np.ndarray, np.ndarray]:
    golden = np.uint32(0x9E3779B9)
    k1 = _mix(np.array([seed ^ ((stream * 0x9E3779B9) & 0xFFFFFFFF)], np.uint32))
    k2 = _mix(k1 + golden)
    k3 = _mix(k2 + golden)
    pos = np.arange(math.prod(shape), dtype=np.uint32).reshape(shape)
    h = _mix(pos + k1)
    return _mix(h ^ k2), _mix(h ^ k3)


def np_uniform(seed: int, shape: tuple[int, ...], stream: int, name: str) -> np.ndarray:
    w1, w2 = np_words(seed, shape, stream)
    if name == "f64":
        return ((w1 >> 5).astype(np.float64) * 2.0 ** 26 + (w2 >> 6)) * 2.0 ** -53
    bits = {"f32": 24, "f16": 11}[name]
    np_dtype = {"f32": np.float32, "f16": np.float16}[name]
    return ((w1 >> (32 - bits)).astype(np.float64) * 2.0 ** -bits).astype(np_dtype)


def _uniform_program(shape: tuple[int, ...], d: dtypes.DType, stream: int):
    return program(lambda s: rb.uniform(s, shape, d, stream), [("i32", ())])


def _run(ex: hg.Executor, p, ins: list[np.ndarray]) -> list[np.ndarray]:
    outs = [np.empty(s, d.np_dtype) for d, s in p.output_specs]
    ex.launch(p, ins, outs)
    return outs


def _seed(s: int) -> np.ndarray:
    return np.array(s, np.int32)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", ["f32", "f64", "f16"])
def test_reference_draws_the_documented_bits(shape, name):
    p = _uniform_program(shape, dtypes.BY_NAME[name], 3)
    got = evaluate(p, [_seed(12345)])[0][0]
    np.testing.assert_array_equal(got, np_uniform(12345, shape, 3, name))


@pytest.mark.parametrize("name", ["f32", "f64", "f16"])
def test_native_cpu_draws_the_reference_bits(native_cpu, name):
    for shape in SHAPES:
        for seed in (0, 1, 2**31 - 2):
            p = _uniform_program(shape, dtypes.BY_NAME[name], 1)
            np.testing.assert_array_equal(_run(native_cpu, p, [_seed(seed)])[0],
                                          np_uniform(seed, shape, 1, name))


def _dropout(shape: tuple[int, ...], mask: dtypes.DType = dtypes.boolean):
    """A dropout of ``x``: its output and its mask (stored as ``mask``: WGSL has no
    bool buffers), the numbers drawn inside the loop."""
    def fn(s: Var, x: Var) -> tuple[Var, Var]:
        keep = rb.uniform(s, shape, dtypes.f32, 7) < 0.75
        return (x * keep.cast(dtypes.f32)) * (1 / 0.75), keep.cast(mask)
    return program(fn, [("i32", ()), ("f32", shape)])


def _transposed(shape: tuple[int, ...]):
    """The numbers read through a permute: positions are of the draw's own shape,
    whatever order a consumer reads it in."""
    return program(lambda s: rb.uniform(s, shape, dtypes.f32, 7).permute(1, 0) + 1.0,
                   [("i32", ())])


def _fused_check(ex: hg.Executor, mask: dtypes.DType = dtypes.boolean) -> None:
    shape = (37, 130)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    out, keep = _run(ex, _dropout(shape, mask), [_seed(99), x])
    u = np_uniform(99, shape, 7, "f32")
    np.testing.assert_array_equal(keep, (u < np.float32(0.75)).astype(mask.np_dtype))
    np.testing.assert_array_equal(out, (x * keep.astype(np.float32)) * np.float32(1 / 0.75))
    np.testing.assert_array_equal(_run(ex, _transposed(shape), [_seed(99)])[0],
                                  u.T + np.float32(1))


def test_native_cpu_fuses_the_draw_into_its_consumer(native_cpu):
    """The hash's rounds each read a value twice (``x ^ (x >> 16)``), which the sharing
    rules counted as two readers: a dropout whose output a row sum reads (a residual
    and a layer norm's first phase) stored its rounds in 4 kernels and 2 temporaries.
    Now the mask's kernel draws and compares, the sum's reads the mask and x."""
    _fused_check(native_cpu)
    shape = (256, 512)

    def fn(s: Var, x: Var) -> tuple[Var, Var]:
        keep = rb.uniform(s, shape, dtypes.f32, 0) < 0.75
        return ((x * keep.cast(dtypes.f32)) * (1 / 0.75) + x).sum(1), keep

    p = program(fn, [("i32", ()), ("f32", shape)])
    compiled = native_cpu.backend.compile(p)
    assert compiled.temps == []
    assert compiled.stats.launches_after == 2
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    got, keep = _run(native_cpu, p, [_seed(3), x])
    np.testing.assert_array_equal(keep, np_uniform(3, shape, 0, "f32") < np.float32(0.75))
    np.testing.assert_allclose(got, evaluate(p, [_seed(3), x])[0][0], rtol=1e-5, atol=1e-4)


def test_emulated_cuda_draws_the_reference_bits(emulated_cuda):
    for shape in [(), (7,), (3, 1, 5), (0, 3), (33, 65)]:
        for name in ("f32", "f64"):
            p = _uniform_program(shape, dtypes.BY_NAME[name], 2)
            np.testing.assert_array_equal(_run(emulated_cuda, p, [_seed(5)])[0],
                                          np_uniform(5, shape, 2, name))
    _fused_check(emulated_cuda)


@pytest.mark.skipif(registry.why_unavailable("webgpu") is not None,
                    reason=f"webgpu unavailable: {registry.why_unavailable('webgpu')}")
def test_webgpu_draws_the_reference_bits(webgpu_ex):
    for shape in [(), (7,), (3, 1, 5), (33, 65)]:
        p = _uniform_program(shape, dtypes.f32, 4)
        np.testing.assert_array_equal(_run(webgpu_ex, p, [_seed(77)])[0],
                                      np_uniform(77, shape, 4, "f32"))
    _fused_check(webgpu_ex, dtypes.f32)


@pytest.mark.skipif(not nvrtc.available(), reason="NVRTC is not installed")
def test_cuda_kernels_compile():
    from .test_cuda_compile import compile_for_gpu

    compile_for_gpu(_dropout((37, 130)))
    compile_for_gpu(_transposed((37, 130)))
    compile_for_gpu(program(lambda s: rb.normal(s, (9, 4), dtypes.f32, 0), [("i32", ())]))


def test_normal_is_box_muller_of_two_words(native_cpu):
    shape = (64, 33)
    for name, tol in (("f32", 2e-6), ("f64", 1e-14)):
        d = dtypes.BY_NAME[name]
        p = program(lambda s, d=d: rb.normal(s, shape, d, 0), [("i32", ())])
        got = _run(native_cpu, p, [_seed(8)])[0]
        if name == "f64":
            a = np_uniform(8, shape, 0, "f64")
            b = np_uniform(8, shape, 2**31, "f64")
        else:
            w1, w2 = np_words(8, shape, 0)
            a = (w1 >> 8) * 2.0 ** -24
            b = (w2 >> 8) * 2.0 ** -24
        want = np.sqrt(-2 * np.log(1 - a)) * np.cos(2 * np.pi * b)
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, evaluate(p, [_seed(8)])[0][0], rtol=tol, atol=tol)


def test_uniform_numbers_are_uniform_and_below_one(native_cpu):
    n = 1 << 20
    p = _uniform_program((n,), dtypes.f32, 0)
    u = _run(native_cpu, p, [_seed(2024)])[0].astype(np.float64)
    assert 0.0 <= u.min() and u.max() < 1.0
    assert abs(u.mean() - 0.5) < 5 * math.sqrt(1 / 12 / n)
    assert abs(u.var() - 1 / 12) < 0.002
    counts = np.bincount((u * 256).astype(np.int64), minlength=256)
    chi2 = float((((counts - n / 256) ** 2) / (n / 256)).sum())
    assert chi2 < 255 + 6 * math.sqrt(2 * 255), chi2  # 255 degrees of freedom, 6 sigma
    # neighbours are not correlated (a weak hash of consecutive counters would be)
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 5 / math.sqrt(n)


def test_normal_numbers_are_standard_normal(native_cpu):
    n = 1 << 19
    p = program(lambda s: rb.normal(s, (n,), dtypes.f32, 0), [("i32", ())])
    z = _run(native_cpu, p, [_seed(31)])[0].astype(np.float64)
    assert abs(z.mean()) < 5 / math.sqrt(n)
    assert abs(z.std() - 1) < 0.005
    assert abs((np.abs(z) < 1).mean() - 0.682689) < 0.003


def test_seeds_and_streams_draw_unrelated_numbers(native_cpu):
    """Consecutive seeds (the per-call draws) and the streams of one program give
    uncorrelated numbers; the same pair gives the same numbers."""
    n = 1 << 16

    def corr(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.corrcoef(a, b)[0, 1])

    p0 = _uniform_program((n,), dtypes.f32, 0)
    p1 = _uniform_program((n,), dtypes.f32, 1)
    a = _run(native_cpu, p0, [_seed(10)])[0]
    for other in (_run(native_cpu, p0, [_seed(11)])[0], _run(native_cpu, p1, [_seed(10)])[0]):
        assert abs(corr(a, other)) < 5 / math.sqrt(n)
        assert (a == other).mean() < 0.01
    np.testing.assert_array_equal(a, _run(native_cpu, p0, [_seed(10)])[0])


def test_bad_requests_raise_clear_errors():
    s = Var(const(1, dtypes.i32, ()))
    with pytest.raises(ValueError, match="seed"):
        rb.uniform(Var(const(1, dtypes.i32, (2,))), (3,), dtypes.f32)
    with pytest.raises(ValueError, match="seed"):
        rb.uniform(Var(const(1.0, dtypes.f32, ())), (3,), dtypes.f32)
    with pytest.raises(ValueError, match="dtype"):
        rb.uniform(s, (3,), dtypes.i32)
    with pytest.raises(ValueError, match="2\\*\\*32"):
        rb.uniform(s, (1 << 16, 1 << 16, 2), dtypes.f32)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.lists(st.integers(0, 9), max_size=3).map(tuple),
       seed=st.integers(0, 2**31 - 2), stream=st.integers(0, 2**20),
       name=st.sampled_from(["f32", "f64", "f16", "bf16"]))
def test_random_draws_match_the_reference_on_the_cpu(native_cpu, shape, seed, stream, name):
    """Differential: uniform numbers (exact) and normal ones (libm's log and cos may
    differ in the last place) of random shapes, seeds, streams and dtypes."""
    d = dtypes.BY_NAME[name]
    p = program(lambda s: (rb.uniform(s, shape, d, stream), rb.normal(s, shape, d, stream)),
                [("i32", ())])
    want = evaluate(p, [_seed(seed)])[0]
    got = _run(native_cpu, p, [_seed(seed)])
    np.testing.assert_array_equal(got[0], want[0])
    tol = {"f64": 1e-13, "f32": 1e-5, "f16": 2e-3, "bf16": 2e-2}[name]
    np.testing.assert_allclose(got[1].astype(np.float64), want[1].astype(np.float64),
                               rtol=tol, atol=tol)
