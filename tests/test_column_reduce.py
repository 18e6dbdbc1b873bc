"""Reductions that keep the innermost axis (bias gradients: sums over the batch) render
with the kept elements innermost (render_c.column_reduce_kernel); every case is checked
against NumPy in float64, with NaN and inf, and at sizes that take the threaded path."""

from __future__ import annotations

import numpy as np
import pytest

import hologram

CASES = [((256, 256), (0,)), ((7, 3), (0,)), ((1000, 700), (0,)), ((4, 5, 6), (1,)),
         ((4, 5, 6), (0, 1)), ((3, 300, 9), (0,)), ((2, 1), (0,)), ((0, 5), (0,)),
         ((600, 600), (0,)), ((512, 128), (0,)), ((2048, 17), (0,)), ((300, 200), (0,))]


# max/min of nothing has no identity in NumPy: empty shapes are summed only
PARAMS = [(shape, axes, op) for shape, axes in CASES for op in ("sum", "max", "min")
          if op == "sum" or 0 not in shape]


@pytest.mark.parametrize("shape,axes,op", PARAMS)
@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_column_reductions_match_numpy(shape, axes, op, dt):
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape).astype(dt)
    if x.size > 4:
        x.flat[3] = np.nan
        x.flat[-2] = np.inf
    f = hologram.jit(lambda v: getattr(v, op)(axis=axes, keepdims=True) * 2)
    got = f(x)
    want = getattr(np, op)(x.astype(np.float64), axis=axes, keepdims=True) * 2
    tol = 1e-5 if dt == np.float32 else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_column_kernel_is_used_and_strided_one_is_not():
    x = np.ones((64, 32), np.float32)
    src = hologram.jit(lambda v: v.sum(axis=0, keepdims=True)).explain(x)
    assert "o0 = ob * 256" in src  # accumulators per block of kept elements
    src = hologram.jit(lambda v: v.sum(axis=1, keepdims=True)).explain(x)
    assert "o0 = ob" not in src  # a row sum reads contiguously already


def test_narrow_columns_split_in_two_blocks_when_threaded():
    """A bias gradient of 128 columns over 512 rows is threaded: two blocks of 64, not
    one block read by one thread; small ones stay one block."""
    src = hologram.jit(lambda v: v.sum(axis=0, keepdims=True)).explain(
        np.ones((512, 128), np.float32))
    assert "o0 = ob * 64" in src and "hg_par(k0_chunk" in src
    src = hologram.jit(lambda v: v.sum(axis=0, keepdims=True)).explain(
        np.ones((16, 128), np.float32))
    assert "o0 = ob * 256" in src and "hg_par(k0_chunk" not in src


def test_integer_column_sum():
    x = np.arange(60, dtype=np.float32).reshape(6, 10)
    f = hologram.jit(lambda v: v.cast("i32").sum(axis=0, keepdims=True).cast("f32"))
    np.testing.assert_array_equal(f(x), x.sum(axis=0, keepdims=True))
