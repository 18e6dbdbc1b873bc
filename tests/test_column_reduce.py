"""Reductions that keep the innermost axis (bias gradients: sums over the batch) render
with the kept elements innermost (render_c.column_reduce_kernel); every case is checked
against NumPy in float64, with NaN and inf, and at sizes that take the threaded path."""

from __future__ import annotations

import re

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


@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_a_row_reduction_over_a_transposed_buffer_runs_as_columns(op):
    """A reduction over the logical last axis of a permuted channels-first buffer (a
    layer norm over ConvNeXt's channels) reads each row with a stride in memory: it runs
    as a column reduction, the SIMD loop along the positions, which ``unravel`` lets
    ``offset`` read as one index (no division per element). A per-channel operand that
    is the same for every position (a bias) is no reason to keep the row form. NaN and
    inf included, against NumPy in float64."""
    from hologram.isa import builder as b

    ex = hologram.default_executor("cpu")

    def fn(x: b.Var, bias: b.Var) -> tuple[b.Var]:
        y = x.reshape(40, 3, 6, 7).permute(1, 2, 3, 0) + bias
        return (getattr(y, op)(3, keepdims=True),)

    p = b.program(fn, [("f32", (40, 126)), ("f32", (40,))])
    src = ex.compile(p).lowered.source
    kernel = src[src.index("void k0"):]
    assert "o0 = ob * " in kernel, kernel
    assert re.search(r"p0_f32\[r\d+ \* 126 \+ \(\(o\)\)\]", kernel), kernel
    rng = np.random.default_rng(40)
    x = rng.standard_normal((40, 126)).astype(np.float32)
    x[3, 5], x[17, 100] = np.nan, np.inf
    bias = rng.standard_normal(40).astype(np.float32)
    out = np.empty((3, 6, 7, 1), np.float32)
    ex.launch(p, [x, bias], [out])
    y = x.astype(np.float64).reshape(40, 3, 6, 7).transpose(1, 2, 3, 0) + bias
    # x + bias is rounded to float32 before the sum: absolute error ~ 40 ulps of the terms
    np.testing.assert_allclose(out, getattr(np, op)(y, axis=3, keepdims=True), rtol=1e-6,
                               atol=1e-5)


def test_a_row_reduction_reading_rows_contiguously_stays_a_row_reduction():
    """The same reduction over an untransposed buffer keeps its row form."""
    from hologram.isa import builder as b

    ex = hologram.default_executor("cpu")
    p = b.program(lambda x: (x.reshape(3, 6, 7, 40).sum(3, keepdims=True),),
                  [("f32", (126, 40))])
    src = ex.compile(p).lowered.source
    assert "o0 = ob" not in src[src.index("void k0"):]
