"""The WebGPU backend (WGSL through wgpu) against the reference interpreter.

Runs on any WebGPU adapter; in CI that is Mesa's lavapipe (Vulkan on the CPU).
Without wgpu or an adapter the backend tests skip with the probe's reason, and the
renderer tests that need no adapter still run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zlib
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hologram as hg
from hologram import ops
from hologram.backends import registry
from hologram.backends.reference import evaluate
from hologram.cli import collect_info
from hologram.compiler.lower import lower
from hologram.compiler.render_wgsl import render_wgsl
from hologram.errors import BackendUnavailableError, DTypeError
from hologram.isa import Program
from hologram.isa import builder as b
from hologram.ops import composites

from .programs import (
    compiled_and_reference,
    int_programs,
    programs,
    random_inputs,
    random_int_inputs,
)
from .test_executor import check_phi_addressing

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

REASON = registry.why_unavailable("webgpu")
needs_adapter = pytest.mark.skipif(REASON is not None, reason=f"webgpu unavailable: {REASON}")
SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 2.5, -3.75, 1e30, -1e30, 1e-30,
            -1e-30, 1e-40, 3e38, 1e8, -7e9]


# --- helpers ------------------------------------------------------------------------------
def assert_close(got: np.ndarray, want: np.ndarray, rtol: float = 2e-5,
                 atol: float = 1e-6) -> None:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want))
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))


@pytest.fixture(scope="module")
def wg():
    if REASON is not None:
        pytest.skip(f"webgpu unavailable: {REASON}")
    with hg.Executor("webgpu") as e:
        yield e


@pytest.fixture(scope="module")
def ref():
    with hg.Executor("reference") as e:
        yield e


def _rng(name: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(name.encode()))


def _data(rng: np.random.Generator, shape: tuple[int, ...], specials: bool = True,
          positive: bool = False) -> np.ndarray:
    x = rng.standard_normal(shape) * 3
    if positive:
        x = rng.random(shape) * 0.98 + 0.01
    if specials and x.size >= 24:
        flat = x.reshape(-1)
        pos = rng.choice(flat.size, len(SPECIALS), replace=False)
        flat[pos] = SPECIALS
    return x.astype(np.float32)


# --- the op library: every op, on webgpu and on the reference backend ---------------------
# name -> (input shapes, output shape, call(ex, inputs, out) -> result, positive inputs)
Call = Callable[[hg.Executor, list, object], object]
OP_CASES: dict[str, tuple[list[tuple[int, ...]], tuple[int, ...], Call, bool]] = {
    "vector_abs": ([(1000,)], (1000,), lambda e, i, o: ops.vector_abs(e, *i, o), False),
    "vector_neg": ([(1000,)], (1000,), lambda e, i, o: ops.vector_neg(e, *i, o), False),
    "vector_relu": ([(1000,)], (1000,), lambda e, i, o: ops.vector_relu(e, *i, o), False),
    "sigmoid": ([(1000,)], (1000,), lambda e, i, o: ops.sigmoid(e, *i, o), False),
    "tanh": ([(1000,)], (1000,), lambda e, i, o: ops.tanh(e, *i, o), False),
    "gelu": ([(1000,)], (1000,), lambda e, i, o: ops.gelu(e, *i, o), False),
    "gelu_erf": ([(1000,)], (1000,),
                 lambda e, i, o: ops.gelu(e, *i, o, approximate="none"), False),
    "vector_clip": ([(1000,)], (1000,),
                    lambda e, i, o: ops.vector_clip(e, *i, o, -0.5, 1.25), False),
    "scalar_add": ([(1000,)], (1000,), lambda e, i, o: ops.scalar_add(e, *i, o, 0.75), False),
    "scalar_mul": ([(1000,)], (1000,), lambda e, i, o: ops.scalar_mul(e, *i, o, -1.5), False),
    "vector_add": ([(1000,)] * 2, (1000,), lambda e, i, o: ops.vector_add(e, *i, o), False),
    "vector_sub": ([(1000,)] * 2, (1000,), lambda e, i, o: ops.vector_sub(e, *i, o), False),
    "vector_mul": ([(1000,)] * 2, (1000,), lambda e, i, o: ops.vector_mul(e, *i, o), False),
    "vector_div": ([(1000,)] * 2, (1000,), lambda e, i, o: ops.vector_div(e, *i, o), False),
    "vector_min": ([(1000,)] * 2, (1000,), lambda e, i, o: ops.vector_min(e, *i, o), False),
    "vector_max": ([(1000,)] * 2, (1000,), lambda e, i, o: ops.vector_max(e, *i, o), False),
    "reduce_sum": ([(5000,)], (), lambda e, i, o: ops.reduce_sum(e, *i, o), False),
    "reduce_sum_axis0": ([(37, 300)], (300,),
                         lambda e, i, o: ops.reduce_sum(e, *i, o, axis=0), False),
    "reduce_max": ([(5000,)], (), lambda e, i, o: ops.reduce_max(e, *i, o), False),
    "reduce_max_axis1": ([(37, 300)], (37,),
                         lambda e, i, o: ops.reduce_max(e, *i, o, axis=1), False),
    "reduce_min": ([(5000,)], (), lambda e, i, o: ops.reduce_min(e, *i, o), False),
    "reduce_min_axis1": ([(37, 300)], (37,),
                         lambda e, i, o: ops.reduce_min(e, *i, o, axis=1), False),
    "softmax": ([(37, 300)], (37, 300), lambda e, i, o: ops.softmax(e, *i, o), False),
    "softmax_axis0": ([(37, 30)], (37, 30),
                      lambda e, i, o: ops.softmax(e, *i, o, axis=0), False),
    "log_softmax": ([(37, 300)], (37, 300), lambda e, i, o: ops.log_softmax(e, *i, o), False),
    "mse_loss": ([(500,)] * 2, (), lambda e, i, o: ops.mse_loss(e, *i, o), False),
    "mse_loss_none": ([(500,)] * 2, (500,),
                      lambda e, i, o: ops.mse_loss(e, *i, o, reduction="none"), False),
    "binary_cross_entropy_loss": ([(500,)] * 2, (),
                                  lambda e, i, o: ops.binary_cross_entropy_loss(e, *i, o),
                                  True),
    "cross_entropy_loss": ([(16, 10)] * 2, (),
                           lambda e, i, o: ops.cross_entropy_loss(e, *i, o), True),
    "cross_entropy_loss_none": ([(16, 10)] * 2, (16,),
                                lambda e, i, o: ops.cross_entropy_loss(e, *i, o,
                                                                       reduction="none"),
                                True),
    "gemm": ([(37, 19), (19, 23)], (37, 23), lambda e, i, o: ops.gemm(e, *i, o), False),
    "gemm_tiles": ([(64, 48), (48, 80)], (64, 80), lambda e, i, o: ops.gemm(e, *i, o), False),
    "matvec": ([(33, 70), (70,)], (33,), lambda e, i, o: ops.matvec(e, *i, o), False),
}
SPECIAL_FREE = {"gemm", "gemm_tiles", "matvec", "reduce_sum", "reduce_sum_axis0", "mse_loss"}


def test_every_op_has_a_case():
    names = set(ops.__all__) - {"composites"}
    covered = {n for n in names if any(c == n or c.startswith(n + "_") for c in OP_CASES)}
    assert covered == names


def _run_case(ex: hg.Executor, name: str, arrays: list[np.ndarray]) -> np.ndarray:
    in_shapes, out_shape, call, _ = OP_CASES[name]
    ins = []
    for a in arrays:
        buf = ex.allocate(a.shape)
        buf.from_numpy(a)
        ins.append(buf)
    out = ex.allocate(out_shape if out_shape else 1)
    out.fill(1234.5)
    call(ex, ins, out)
    return out.to_numpy().reshape(out_shape)


@needs_adapter
@pytest.mark.parametrize("name", list(OP_CASES))
def test_op_matches_reference(wg, ref, name):
    in_shapes, _, _, positive = OP_CASES[name]
    rng = _rng(name)
    specials = name not in SPECIAL_FREE and not positive
    arrays = [_data(rng, s, specials=specials, positive=positive) for s in in_shapes]
    want = _run_case(ref, name, arrays)
    got = _run_case(wg, name, arrays)
    # summation order differs (workgroup trees vs NumPy's pairwise sums)
    loose = name.startswith(("reduce_sum", "mse", "cross", "binary", "gemm", "matvec",
                             "softmax", "log_softmax"))
    assert_close(got, want, rtol=1e-4 if loose else 2e-5, atol=1e-5 if loose else 1e-6)


@needs_adapter
def test_special_values_elementwise(wg):
    """Every unary op of the ISA on NaN, +-inf, +-0, denormals and huge values."""
    x = np.array(SPECIALS + [0.1, -0.3, 0.999, 1.001, 2e-5, -7.5, 60.0, -90.0, 1e5, 3e7],
                 np.float32)
    unary = ["neg", "abs", "exp", "log", "sqrt", "rsqrt", "recip", "tanh", "sigmoid", "erf",
             "sin", "cos", "floor", "ceil", "trunc", "rint", "log1p", "expm1", "tan", "asin",
             "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "log2", "log10", "exp2",
             "erfc"]
    for op in unary:
        p = Program.parse(f".in 0 f32[{x.size}]\n%0 = ldg.f32[{x.size}] in=0\n"
                          f"%1 = {op}.f32[{x.size}] %0\nstg.f32[{x.size}] %1 out=0")
        out = np.empty_like(x)
        wg.launch(p, [x], [out])
        want = evaluate(p, [x])[0][0]
        assert_close(out, want, rtol=3e-6, atol=1e-7), op
        zero = want == 0
        np.testing.assert_array_equal(np.signbit(out[zero]), np.signbit(want[zero]), op)


@needs_adapter
def test_special_values_binary(wg):
    """Binary ops (pow with negative bases, min/max with NaN, 0*inf, x-x) on all pairs."""
    vals = np.array(SPECIALS[:13] + [3.0, -2.0, 0.5], np.float32)
    x = np.repeat(vals, vals.size)
    y = np.tile(vals, vals.size)
    n = x.size
    for op in ["add", "sub", "mul", "div", "min", "max", "pow", "fmod", "atan2", "hypot",
               "copysign", "cmplt", "cmpeq"]:
        out_t = "bool" if op.startswith("cmp") else "f32"
        body = f"%2 = {op}.{out_t}[{n}] %0, %1"
        if out_t == "bool":
            body += f"\n%3 = cvt.f32[{n}] %2"
        last = "%3" if out_t == "bool" else "%2"
        p = Program.parse(f".in 0 f32[{n}]\n.in 1 f32[{n}]\n%0 = ldg.f32[{n}] in=0\n"
                          f"%1 = ldg.f32[{n}] in=1\n{body}\nstg.f32[{n}] {last} out=0")
        out = np.empty(n, np.float32)
        wg.launch(p, [x, y], [out])
        want = evaluate(p, [x, y])[0][0]
        assert_close(out, want, rtol=2e-6, atol=1e-30), op
    # x - x and x == x with x NaN/inf: finite-math compilers fold these to 0 and true
    p = b.program(lambda v: ((v - v) + v.eq(v).where(v, v * 0.0)), [("f32", (vals.size,))])
    out = np.empty_like(vals)
    wg.launch(p, [vals], [out])
    assert_close(out, evaluate(p, [vals])[0][0])


# --- differential: random programs --------------------------------------------------------
@needs_adapter
@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
# Without the index ops, whose WGSL tests are in test_index_ops.py (no i64 in WGSL,
# and its scans add f32 in f32 where the reference adds in f64).
@given(programs(dtype="f32", scans=False, index_dtypes=()), st.integers(0, 2**32 - 1))
def test_random_programs_match_reference(wg, case, seed):
    fn, specs = case
    p = b.program(fn, specs)
    got, want = compiled_and_reference(wg, p, random_inputs(specs, seed, special=True))
    for g, w in zip(got, want, strict=True):
        # transcendental helpers are within a few ulp; sums run in a different order
        assert_close(g, w, rtol=1e-4, atol=1e-5)


@needs_adapter
@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["i32", "u32"]).flatmap(
    lambda d: int_programs(dtype=d, casts=("i32", "u32"))), st.integers(0, 2**32 - 1))
def test_random_int_programs_match_reference(wg, case, seed):
    """The bitwise ops, shifts and wrapping arithmetic in WGSL's i32 and u32 (and bool
    inside kernels) bit for bit: counts out of range and negative saturate as NumPy's
    do, not modulo 32; u32 shifts right logically and negates by 0u - x."""
    fn, specs = case
    p = b.program(fn, specs)
    got, want = compiled_and_reference(wg, p, random_int_inputs(specs, seed))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w, err_msg=str(p))


@needs_adapter
@pytest.mark.parametrize("shape", [(3, 257, 5), (700, 2), (1, 256), (255, 3), (2, 3, 600)])
@pytest.mark.parametrize("axis", [0, -1])
def test_wide_rows_and_columns(wg, shape, axis):
    """Rows longer and shorter than a workgroup, reduced along either end, with the
    results broadcast back (the random programs above use dims of at most 8)."""
    def fn(x, y):
        m = x.max(axis, keepdims=True)
        e = (x - m).exp()
        s = e.sum(axis, keepdims=True)
        return e / s * y.sigmoid() + x.min(axis, keepdims=True), (x * y).prod(axis) + s.sum()

    specs = [("f32", shape), ("f32", shape[-1:])]
    p = b.program(fn, specs)
    rng = _rng(f"wide{shape}{axis}")
    x = _data(rng, shape, specials=False)
    y = rng.uniform(0.9, 1.1, shape[-1:]).astype(np.float32)
    got = [np.empty(sh, d.np_dtype) for d, sh in p.output_specs]
    wg.launch(p, [x, y], got)
    for g, w in zip(got, evaluate(p, [x, y])[0], strict=True):
        assert_close(g, w, rtol=1e-4, atol=1e-5)


# --- the rest of the backend --------------------------------------------------------------
@needs_adapter
def test_large_reductions_and_gemm(wg):
    rng = _rng("large")
    x = rng.standard_normal(1 << 20).astype(np.float32)
    p = b.program(lambda v: v.sum(), [("f32", x.shape)])
    out = np.empty((), np.float32)
    wg.launch(p, [x], [out])
    assert abs(float(out) - float(x.astype(np.float64).sum())) < 1e-6 * np.abs(x).sum()
    a = rng.standard_normal((130, 70)).astype(np.float32)
    c = rng.standard_normal((70, 90)).astype(np.float32)
    g = b.program(lambda u, v: (u @ v.T.T).exp() * 0.5, [("f32", a.shape), ("f32", c.shape)])
    got = np.empty((130, 90), np.float32)
    wg.launch(g, [a, c], [got])
    assert_close(got, np.exp(a.astype(np.float64) @ c) * 0.5, rtol=1e-4, atol=1e-5)


@needs_adapter
def test_products_have_the_c_backends_range(wg):
    """rprod carries its own exponent (as the C backend's double accumulator), so a
    partial product never overflows: the result does not depend on combine order."""
    x = np.array([[3e38, 2.0, 0.25], [1e-30, 1e-30, 1e30], [0.0, 3e38, 3e38],
                  [np.inf, 0.5, -1.0], [np.nan, 1.0, 1.0], [-0.0, 2.0, 1e-40]], np.float32)
    p = b.program(lambda v: v.prod(1), [("f32", x.shape)])
    out = np.empty(6, np.float32)
    wg.launch(p, [x], [out])
    want = np.prod(x.astype(np.float64), axis=1).astype(np.float32)
    np.testing.assert_array_equal(out, want)
    assert np.signbit(out[5])
    big = _rng("prod").uniform(0.97, 1.03, 5000).astype(np.float32)
    p = b.program(lambda v: v.prod(), [("f32", big.shape)])
    out = np.empty((), np.float32)
    wg.launch(p, [big], [out])
    assert_close(out, np.prod(big.astype(np.float64)), rtol=1e-4, atol=0)


@needs_adapter
def test_gemm_through_views(wg):
    """GEMM operands that are permuted/broadcast views of inputs, and k = 0."""
    rng = _rng("views")
    a = rng.standard_normal((19, 37)).astype(np.float32)
    v = rng.standard_normal((1, 23)).astype(np.float32)
    p = b.program(lambda x, y: x.T @ y.expand((19, 23)), [("f32", a.shape), ("f32", v.shape)])
    out = np.empty((37, 23), np.float32)
    wg.launch(p, [a, v], [out])
    assert_close(out, evaluate(p, [a, v])[0][0], rtol=1e-5, atol=1e-5)
    z = b.program(lambda x, y: x @ y, [("f32", (3, 0)), ("f32", (0, 4))])
    out = np.full((3, 4), 7.0, np.float32)
    wg.launch(z, [np.empty((3, 0), np.float32), np.empty((0, 4), np.float32)], [out])
    np.testing.assert_array_equal(out, 0.0)


@needs_adapter
def test_boundary_pool_phi_addressing(wg):
    wg = hg.Executor("webgpu")  # a fresh pool: the shared executor's small buffers use it
    check_phi_addressing(wg)
    wg.close()


@needs_adapter
def test_in_place_elementwise(wg):
    x = np.linspace(-3, 3, 301).astype(np.float32)
    a = wg.allocate(x.shape)
    a.from_numpy(x)
    ops.gelu(wg, a, a)
    with hg.Executor("reference") as r:
        c = r.allocate(x.shape)
        c.from_numpy(x)
        ops.gelu(r, c, c)
        assert_close(a.to_numpy(), c.to_numpy())


@needs_adapter
def test_f16_where_the_adapter_has_it(wg):
    if not wg.backend.dev.f16:
        pytest.skip("this adapter has no shader-f16")
    rng = _rng("f16")
    x = (rng.standard_normal(301) * 2).astype(np.float16)
    y = (rng.standard_normal(301) * 2).astype(np.float16)
    p = b.program(lambda u, v: (u * v + u.exp()).tanh() - u.sum(), [("f16", (301,))] * 2)
    out = np.empty(301, np.float16)
    wg.launch(p, [x, y], [out])
    assert_close(out, evaluate(p, [x, y])[0][0], rtol=5e-3, atol=5e-3)


@needs_adapter
@pytest.mark.parametrize("dtype", ["f64", "i64", "i8", "i16", "u8", "u16", "u64"])
def test_dtypes_wgsl_lacks_raise(wg, dtype):
    p = b.program(lambda u: u + u, [(dtype, (8,))])
    with pytest.raises(DTypeError, match=rf"{dtype}.*webgpu"):
        wg.compile(p)


def test_renderer_rejects_what_wgsl_lacks_without_an_adapter():
    p = b.program(lambda u: u.exp(), [("f64", (8,))])
    with pytest.raises(DTypeError, match="f64.*webgpu"):
        lower(p, lambda s, sl: render_wgsl(s, sl).source)
    h = b.program(lambda u: u.exp(), [("f16", (8,))])
    with pytest.raises(DTypeError, match="shader-f16"):
        lower(h, lambda s, sl: render_wgsl(s, sl, f16=False).source)
    assert "enable f16;" in lower(h, lambda s, sl: render_wgsl(s, sl, f16=True).source).source


def test_renderer_maps_rows_to_workgroups():
    """A softmax row is one workgroup: shared-memory reductions, barriers, one binding
    per buffer slot, NaN-safe literals."""
    p = b.program(lambda v: composites.softmax(v, -1), [("f32", (4, 300))])
    src = lower(p, lambda s, sl: render_wgsl(s, sl).source).source
    assert "var<workgroup> hg_red_f32" in src and "workgroupBarrier()" in src
    assert "@group(0) @binding(0) var<storage, read_write> b0: array<f32>" in src
    assert "@binding(1)" in src and "hg_wid.x" in src
    g = b.program(lambda u, v: u @ v, [("f32", (4, 5)), ("f32", (5, 6))])
    src = lower(g, lambda s, sl: render_wgsl(s, sl).source).source
    assert "@workgroup_size(16, 16)" in src and "hg_ta" in src


@needs_adapter
def test_pipelines_are_cached_and_device_memory_is_reported(wg):
    p = b.program(lambda v: (v * 3.0).sigmoid(), [("f32", (777,))])
    dev = wg.backend.dev
    wg.compile(p)
    n = len(dev.pipelines)
    wg.backend.compile(p)  # a second compile of the same program builds nothing
    assert len(dev.pipelines) == n
    x = np.ones(777, np.float32)
    out = np.empty_like(x)
    wg.launch(p, [x], [out])
    stats = wg.backend.memory_stats()
    assert stats["device_bytes_in_use"] == 0 and stats["device_bytes_cached"] >= 2 * 777 * 4
    wg.backend.empty_cache()
    assert wg.backend.memory_stats()["device_bytes_cached"] == 0
    assert "webgpu" in wg.backend.describe()


def test_probe_says_why_and_metal_needs_a_metal_adapter():
    reason = registry.why_unavailable("webgpu")
    assert reason is None or "wgpu" in reason or "adapter" in reason
    entry = collect_info()["backends"]["webgpu"]
    assert entry["available"] is (reason is None) and entry["reason"] == reason
    metal = registry.why_unavailable("metal")
    if sys.platform != "darwin":
        assert "macOS" in metal
        with pytest.raises(BackendUnavailableError, match="macOS"):
            hg.Executor("metal")


def test_no_adapter_gives_a_reason_and_auto_skips_webgpu():
    """Without a driver the probe says why, and 'auto' falls back (a fresh process, with
    wgpu forced onto Vulkan and pointed at no Vulkan driver)."""
    pytest.importorskip("wgpu")
    code = ("import hologram as hg; r = hg.backend.why_unavailable('webgpu'); "
            "assert r and 'adapter' in r, r; assert hg.get_default_backend() != 'webgpu'")
    env = dict(os.environ, WGPU_BACKEND_TYPE="Vulkan", VK_ICD_FILENAMES="/nonexistent.json")
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def test_import_hologram_does_not_load_wgpu():
    code = "import sys, hologram; assert 'wgpu' not in sys.modules, 'wgpu imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
