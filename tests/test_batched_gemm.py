"""Batched GEMM (``[*batch, m, k] @ [*batch, k, n]``) on every backend.

The reference interpreter is checked against an independent float64 sum of
products (NaN and inf included, sizes 0 and 1, empty batches); the compiled CPU
backend and the WebGPU backend are checked against the reference on operands that
are views (permuted, reshaped, broadcast batch axes), and the CUDA renderer must
leave batched GEMMs to the library like 2-D ones and still compile the kernels
around them.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hologram as hg
from hologram.backends.reference import evaluate
from hologram.compiler import nvrtc
from hologram.compiler.lower import lower
from hologram.compiler.render_cuda import render_cuda
from hologram.compiler.render_wgsl import BLOCK
from hologram.compiler.schedule import GemmPlan, KernelPlan
from hologram.isa import Op
from hologram.isa import builder as b

from .programs import SPECIAL, compiled_and_reference, programs, random_inputs

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _sum_of_products(a: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``a @ c`` without BLAS: every product formed, then summed in float64."""
    return (a[..., :, :, None].astype(np.float64) * c[..., None, :, :]).sum(-2)


def _inputs(rng: np.random.Generator, shapes, dtype=np.float64, special: float = 0.0):
    out = []
    for s in shapes:
        x = (rng.standard_normal(s) * 2).astype(dtype)
        if special and x.size:
            mask = rng.random(s) < special
            x[mask] = rng.choice(np.array(SPECIAL, dtype), int(mask.sum()))
        out.append(x)
    return out


def assert_same(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> None:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want))
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))


def _sop_matmul(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """NumPy's matmul broadcasting, products summed without BLAS."""
    batch = np.broadcast_shapes(x.shape[:-2], y.shape[:-2])
    return _sum_of_products(np.broadcast_to(x, (*batch, *x.shape[-2:])),
                            np.broadcast_to(y, (*batch, *y.shape[-2:])))


# name: (a shape, b shape, ISA program over Vars, the same in NumPy without BLAS);
# operands as inputs and as views of them.
CASES = {
    "plain": ((3, 5, 4), (3, 4, 6), lambda x, y: x @ y, _sop_matmul),
    "two_batch_dims": ((2, 3, 5, 4), (2, 3, 4, 6), lambda x, y: x @ y, _sop_matmul),
    "empty_batch": ((0, 5, 4), (0, 4, 6), lambda x, y: x @ y, _sop_matmul),
    "empty_batch_dim": ((2, 0, 5, 4), (2, 0, 4, 6), lambda x, y: x @ y, _sop_matmul),
    "k0": ((3, 5, 0), (3, 0, 6), lambda x, y: x @ y, _sop_matmul),
    "m0_n0": ((3, 0, 4), (3, 4, 0), lambda x, y: x @ y, _sop_matmul),
    "ones": ((1, 1, 1), (1, 1, 1), lambda x, y: x @ y, _sop_matmul),
    # attention's q @ k^T: heads split out of the feature axis, then permuted
    "heads": ((2, 7, 12), (2, 7, 12),
              lambda x, y: x.reshape(2, 7, 3, 4).permute(0, 2, 1, 3)
              @ y.reshape(2, 7, 3, 4).permute(0, 2, 3, 1),
              lambda x, y: _sop_matmul(x.reshape(2, 7, 3, 4).transpose(0, 2, 1, 3),
                                       y.reshape(2, 7, 3, 4).transpose(0, 2, 3, 1))),
    # a batch axis broadcast by EXPAND (stride 0), and the builder's matmul broadcast
    "broadcast_batch": ((1, 5, 4), (3, 4, 6), lambda x, y: x.expand((3, 5, 4)) @ y,
                        _sop_matmul),
    "matmul_broadcast": ((2, 1, 5, 4), (3, 4, 6), lambda x, y: x @ y, _sop_matmul),
    "transposed_both": ((3, 4, 5), (3, 6, 4),
                        lambda x, y: x.permute(0, 2, 1) @ y.permute(0, 2, 1),
                        lambda x, y: _sop_matmul(x.transpose(0, 2, 1), y.transpose(0, 2, 1))),
    "batch_permuted": ((5, 3, 4), (3, 4, 6), lambda x, y: x.permute(1, 0, 2) @ y,
                       lambda x, y: _sop_matmul(x.transpose(1, 0, 2), y)),
    "epilogue": ((2, 5, 4), (2, 4, 6), lambda x, y: (x @ y).tanh() * 0.5 + 1.0,
                 lambda x, y: np.tanh(_sop_matmul(x, y)) * 0.5 + 1.0),
    # a product of products: the inner result is a temp the outer GEMM reads
    "chained": ((2, 5, 4), (2, 4, 5), lambda x, y: (x @ y) @ (x @ y).exp(),
                lambda x, y: _sop_matmul(_sop_matmul(x, y), np.exp(_sop_matmul(x, y)))),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_matches_numpy_sum_of_products(name):
    sa, sb, fn, np_fn = CASES[name]
    x, y = _inputs(np.random.default_rng(7), (sa, sb))
    p = b.program(fn, [("f64", sa), ("f64", sb)])
    (got,), _ = evaluate(p, [x, y])
    assert_same(got, np_fn(x, y), rtol=1e-12, atol=1e-12)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from([0, 1, 2, 3]), max_size=2),
       st.tuples(*[st.sampled_from([0, 1, 2, 5, 9])] * 3), st.integers(0, 2**32 - 1))
def test_reference_gemm_is_the_sum_of_products_f64(batch, mkn, seed):
    """Every NaN/inf the products make reaches the sums as IEEE says (inf * 0 is NaN,
    inf - inf is NaN), k = 0 gives zeros, an empty batch an empty result."""
    m, k, n = mkn
    sa, sb = (*batch, m, k), (*batch, k, n)
    x, y = _inputs(np.random.default_rng(seed), (sa, sb), special=0.2)
    p = b.program(lambda u, v: u @ v, [("f64", sa), ("f64", sb)])
    (got,), _ = evaluate(p, [x, y])
    want = _sum_of_products(x, y)
    # a sum's rounding error is relative to the sum of |terms| (the specials include
    # +-3e38, whose products cancel), not to the result
    scale = _sum_of_products(np.abs(x), np.abs(y))
    assert got.shape == want.shape
    finite = np.isfinite(want) & np.isfinite(scale)
    assert np.all(np.abs(got - want)[finite] <= 1e-13 * (k + 1) * scale[finite])
    assert_same(np.where(finite, 0, got), np.where(finite, 0, want), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_cpu_matches_reference(name, dtype):
    ex = hg.default_executor("cpu")
    sa, sb, fn, _ = CASES[name]
    npd = np.float32 if dtype == "f32" else np.float64
    x, y = _inputs(np.random.default_rng(11), (sa, sb), npd)
    p = b.program(fn, [(dtype, sa), (dtype, sb)])
    want, _ = evaluate(p, [x, y])
    got = [np.full(s, 7.0, d.np_dtype) for d, s in p.output_specs]
    ex.launch(p, [x, y], got)
    tol = 2e-5 if dtype == "f32" else 1e-12
    assert_same(got[0], want[0], rtol=tol, atol=tol)


def test_cpu_gemm_nan_stays_in_its_matrix_row_and_column():
    """A NaN in A[b, i, :] spoils C[b, i, :] only: batches do not bleed into each other."""
    ex = hg.default_executor("cpu")
    x = np.ones((3, 4, 5), np.float32)
    y = np.ones((3, 5, 6), np.float32)
    x[1, 2, 3] = np.nan
    y[2, 0, 4] = np.inf
    p = b.program(lambda u, v: u @ v, [("f32", x.shape), ("f32", y.shape)])
    got = np.empty((3, 4, 6), np.float32)
    ex.launch(p, [x, y], [got])
    want = np.full((3, 4, 6), 5.0, np.float32)
    want[1, 2, :] = np.nan
    want[2, :, 4] = np.inf
    np.testing.assert_array_equal(got, want)


# --- WebGPU -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def wg(webgpu_ex: hg.Executor) -> hg.Executor:
    return webgpu_ex


WGPU_CASES = {
    **CASES,
    # several 64x64 tiles per matrix and a ragged edge, over a batch of 3 (the batch and
    # the tile rows share the y grid-stride loop)
    "tiles": ((3, BLOCK + 7, 20), (3, 20, BLOCK * 2 + 1), lambda x, y: x @ y, _sop_matmul),
}


@pytest.mark.parametrize("name", sorted(WGPU_CASES))
def test_webgpu_matches_reference(wg, name):
    sa, sb, fn, _ = WGPU_CASES[name]
    x, y = _inputs(np.random.default_rng(3), (sa, sb), np.float32)
    p = b.program(fn, [("f32", sa), ("f32", sb)])
    want, _ = evaluate(p, [x, y])
    got = [np.full(s, 7.0, d.np_dtype) for d, s in p.output_specs]
    wg.launch(p, [x, y], got)
    assert_same(got[0], want[0], rtol=1e-4, atol=1e-4)


def test_webgpu_nan_and_inf_stay_in_their_matrix(wg):
    x = np.ones((4, 3, 5), np.float32)
    y = np.ones((4, 5, 2), np.float32)
    x[1, 2, 0] = np.nan
    y[3, 4, 1] = -np.inf
    p = b.program(lambda u, v: u @ v, [("f32", x.shape), ("f32", y.shape)])
    got = np.empty((4, 3, 2), np.float32)
    wg.launch(p, [x, y], [got])
    want = np.full((4, 3, 2), 5.0, np.float32)
    want[1, 2, :] = np.nan
    want[3, :, 1] = -np.inf
    np.testing.assert_array_equal(got, want)


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
# Without the index ops (WGSL: tests/test_index_ops.py).
@given(programs(dtype="f32", gemm=True, scans=False, index_dtypes=()),
       st.integers(0, 2**32 - 1))
def test_webgpu_random_programs_with_gemm_match_reference(wg, case, seed):
    """GEMMs inside random programs: their operands are the fused values before them
    (materialized) and views of those, their results feed fused kernels after them."""
    fn, specs = case
    p = b.program(fn, specs)
    got, want = compiled_and_reference(wg, p, random_inputs(specs, seed, special=True))
    for g, w in zip(got, want, strict=True):
        assert_same(g, w, rtol=1e-4, atol=1e-5)


def test_wgsl_gemm_folds_the_batch_into_y_and_keeps_z_for_the_salt():
    """Rendering needs no adapter: the dispatch covers batch x tile rows in y, z is 1."""
    from hologram.compiler.render_wgsl import render_wgsl

    p = b.program(lambda u, v: u @ v, [("f32", (6, BLOCK + 1, 8)), ("f32", (6, 8, 3))])
    low = lower(p, lambda s, sl: "")
    prog = render_wgsl(low.schedule, low.slots)
    (k,) = [k for k in prog.kernels if k.name.startswith("gemm")]
    assert k.groups == (1, 6 * 2, 1)
    assert "fn hg_ga(gb: i32, gr: i32, gc: i32)" in k.source


# --- CUDA -------------------------------------------------------------------------------------
def test_cuda_leaves_batched_gemm_to_the_library_and_renders_the_rest():
    """Like a 2-D GEMM, a batched one is a schedule step for cuBLAS (strided batched),
    not a rendered kernel; the kernels around it render, and compile where NVRTC is."""
    p = b.program(lambda u, v: ((u @ v) * 2.0).exp(), [("f32", (4, 3, 5)), ("f32", (4, 5, 6))])
    launch: dict = {}

    def render(s, sl):
        src, lm = render_cuda(s, sl)
        launch.update(lm)
        return src

    low = lower(p, render)
    steps = low.schedule.steps
    gemms = [s for s in steps if isinstance(s, GemmPlan)]
    assert [g.value.shape for g in gemms] == [(4, 3, 6)]
    assert set(launch) == {s.name for s in steps if isinstance(s, KernelPlan)}
    assert "gemm" not in low.source
    if nvrtc.available():
        assert nvrtc.compile_cubin(low.source, "sm_90")[:4] == b"\x7fELF"


def test_batched_gemm_is_one_instruction_not_a_broadcast_reduce():
    p = b.program(lambda u, v: u @ v, [("f32", (8, 64, 32)), ("f32", (8, 32, 64))])
    assert [v.op for v in p.instructions].count(Op.GEMM) == 1
    assert not any(v.op is Op.RSUM for v in p.instructions)
