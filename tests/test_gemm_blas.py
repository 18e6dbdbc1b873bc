"""GEMM through NumPy's BLAS called from hologram's OpenMP tiles (compiler/blas.py).

Every case runs the compiled program against NumPy in float64; the layouts cover
what BLAS can read in place (row-major, transposed, offset into the arena) and
what it cannot (broadcast rows), which must fall back to np.matmul and still agree.
"""

from __future__ import annotations

import ctypes
import math
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hologram
from hologram.compiler import blas
from hologram.compiler.gemm_layout import contiguous_strides, gemm_desc
from hologram.isa.builder import program
from hologram.isa.dtypes import f32

needs_blas = pytest.mark.skipif(blas.provider()[0] is None,
                                reason=f"no BLAS driver: {blas.provider()[1]}")


def _check(fn, *arrays, rtol=None, ref=None):
    got = hologram.jit(fn)(*arrays)
    want = (ref or fn)(*[a.astype(np.float64) for a in arrays])
    assert got.shape == want.shape
    tol = rtol if rtol is not None else (1e-5 if arrays[0].dtype == np.float32 else 1e-12)
    scale = max(1.0, float(np.abs(want).max(initial=0)))
    np.testing.assert_allclose(got, want, rtol=0, atol=tol * scale * max(1, arrays[0].shape[-1]))


SHAPES = [(3, 4, 5), (1, 7, 1), (0, 3, 4), (5, 0, 6), (4, 3, 0), (256, 256, 256),
          (1024, 40, 8), (8, 40, 1024), (33, 17, 65)]


@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_plain_and_transposed(m, k, n, dt):
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    a = rng.standard_normal((m, k)).astype(dt)
    b = rng.standard_normal((k, n)).astype(dt)
    _check(lambda x, y: x @ y, a, b)
    _check(lambda x, y: (x @ y) * 2 + 1, a, b)  # with an epilogue kernel after it
    _check(lambda x, y: x.T @ y, np.ascontiguousarray(a.T), b)
    _check(lambda x, y: x @ y.T, a, np.ascontiguousarray(b.T))
    _check(lambda x, y: x.T @ y.T, np.ascontiguousarray(a.T), np.ascontiguousarray(b.T))


@needs_blas
@pytest.mark.parametrize("m,k,n,two", [(1030, 64, 520, False), (1000, 64, 530, True),
                                       (520, 64, 1030, True),
                                       (700, 97, 530, True), (50, 640, 1100, True),
                                       (300, 17, 310, False), (100, 3400, 100, True)])
def test_tiles_at_every_thread_count(m, k, n, two):
    """A product's tiles cover its longer side exactly once at 1 to 5 threads: two
    rounds (``hg_edge``: half the tiles share two thirds of the side) from
    ``TWO_ROUNDS_MIN_FLOPS`` up where each second-round tile is still ``MIN_TILE`` wide
    and the product has fewer than ``WIDE_MIN_ROWS`` rows, else equal tiles (``two``
    False), and equal tiles too where the second round's tiles
    would be too thin (100 rows at 4 threads: four equal tiles, which ``rounds`` keeps
    from being cut as two rounds of two).
    Each output starts as NaN, so a block of C that no tile wrote shows (a plain GEMM,
    and an epilogue fused per tile). Every shape is above ``PARALLEL_MIN_FLOPS``, which
    runs smaller ones whole."""
    assert 2 * m * k * n >= blas.PARALLEL_MIN_FLOPS
    assert (2 * m * k * n >= blas.TWO_ROUNDS_MIN_FLOPS and m < blas.WIDE_MIN_ROWS) == two
    rng = np.random.default_rng(m + n)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    want = a.astype(np.float64) @ b.astype(np.float64)
    plain = hologram.jit(lambda x, y: x @ y)
    fused = hologram.jit(lambda x, y: (x @ y) * 2.0 + 1.0)
    try:
        for nt in (1, 2, 3, 4, 5):
            hologram.set_num_threads(nt)
            for f, ref in ((plain, want), (fused, want * 2.0 + 1.0)):
                out = np.full((m, n), np.nan, np.float32)
                f(a, b, out=out)
                np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * k)
    finally:
        hologram.set_num_threads(None)


@needs_blas
@pytest.mark.parametrize("m,k,n,dt", [(40, 33, 2500, np.float32), (3000, 8, 2049, np.float32),
                                      (blas.WIDE_MIN_ROWS, 8, 2 * blas.CALL_MAX_COLS + 3,
                                       np.float32),
                                      (24, 70, 2 * blas.CALL_MAX_COLS + 1, np.float64),
                                      (5, 16, blas.CALL_MAX_COLS + 1, np.float32)])
def test_wide_products_are_cut_into_column_blocks(m, k, n, dt):
    """A tile wider than ``CALL_MAX_COLS`` columns is computed by several BLAS calls of
    equal column blocks (MKL slows down on a wide B), and a product of at least
    ``WIDE_MIN_ROWS`` rows (3000 x 8 x 2049 and the 1024-row one) by one call per tile
    however wide: row tiles and column tiles, B read plainly and transposed, with a
    fused epilogue, at 1 to 3 threads. Each output starts as NaN, so a block no call
    wrote shows."""
    rng = np.random.default_rng(m + k + n)
    a = rng.standard_normal((m, k)).astype(dt)
    b = rng.standard_normal((k, n)).astype(dt)
    a[0, 0], b[-1, -1] = np.nan, np.inf
    want = a.astype(np.float64) @ b.astype(np.float64)
    bt = np.ascontiguousarray(b.T)
    plain = hologram.jit(lambda x, y: x @ y * 2.0 - 1.0)
    trans = hologram.jit(lambda x, y: x @ y.T * 2.0 - 1.0)
    tol = 1e-4 if dt == np.float32 else 1e-10
    try:
        for nt in (1, 2, 3):
            hologram.set_num_threads(nt)
            for f, other in ((plain, b), (trans, bt)):
                out = np.full((m, n), np.nan, dt)
                f(a, other, out=out)
                np.testing.assert_allclose(out, want * 2.0 - 1.0, rtol=tol, atol=tol * k)
    finally:
        hologram.set_num_threads(None)


@needs_blas
@pytest.mark.parametrize("m,k", [(127, 40), (128, 40), (300, 17), (1000, 64), (130, 0),
                                 (40, 200)])
@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_gram_products_are_symmetric_and_right_at_every_thread_count(m, k, dt):
    """``x @ x.T`` and ``x.T @ x`` (one operand read plainly and transposed) compute the
    lower triangle in strips and mirror it (``hg_gemm_symmetric``, from
    ``SYMMETRIC_MIN`` rows): every element written (outputs start as NaN), the result
    exactly symmetric, right against float64 with and without a fused epilogue, on a
    strided operand (a column slice: its rows keep the parent's stride), at 1-5 threads.
    127 rows and k = 0 take the plain path; they must agree all the same."""
    rng = np.random.default_rng(m + k)
    parent = rng.standard_normal((m, k + 5)).astype(dt)
    x = parent[:, 2:2 + k]  # non-contiguous rows
    want = x.astype(np.float64) @ x.T.astype(np.float64)
    want_t = x.T.astype(np.float64) @ x.astype(np.float64)
    gram = hologram.jit(lambda a: a @ a.T)
    gram_t = hologram.jit(lambda a: a.T @ a)
    fused = hologram.jit(lambda a: np.tanh(a @ a.T) * 2.0)
    tol = (1e-5 if dt == np.float32 else 1e-12) * max(k, 1)
    try:
        for nt in (1, 2, 3, 4, 5):
            hologram.set_num_threads(nt)
            out = np.full((m, m), np.nan, dt)
            gram(x, out=out)
            np.testing.assert_allclose(out, want, rtol=0, atol=tol * 10)
            # mirrored: exactly symmetric (a plain product, as at 127 rows, is not: its
            # two triangles differ in the last bit)
            if m >= blas.SYMMETRIC_MIN and k > 0:
                np.testing.assert_array_equal(out, out.T)
            out_t = np.full((k, k), np.nan, dt)
            gram_t(x, out=out_t)
            np.testing.assert_allclose(out_t, want_t, rtol=0, atol=tol * 10 * m / max(k, 1))
            if k >= blas.SYMMETRIC_MIN:
                np.testing.assert_array_equal(out_t, out_t.T)
            out = np.full((m, m), np.nan, dt)
            fused(x, out=out)
            np.testing.assert_allclose(out, np.tanh(want) * 2.0, rtol=0, atol=tol * 10)
    finally:
        hologram.set_num_threads(None)


@needs_blas
def test_gram_product_propagates_nan_and_inf_like_numpy():
    x = np.random.default_rng(1).standard_normal((200, 30)).astype(np.float32)
    x[3, 5], x[150, 7], x[60, 2] = np.nan, np.inf, -np.inf
    got = hologram.jit(lambda a: a @ a.T)(x)
    want = x.astype(np.float64) @ x.T.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want))
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))


@needs_blas
def test_same_values_in_two_buffers_is_a_plain_product():
    """Only one operand read twice is known symmetric; equal contents in two buffers run
    the plain product, and a different ``ld`` or an offset view is not mistaken for it."""
    x = np.random.default_rng(2).standard_normal((256, 48)).astype(np.float32)
    got = hologram.jit(lambda a, b: a @ b.T)(x, x.copy())
    np.testing.assert_allclose(got, x.astype(np.float64) @ x.T.astype(np.float64),
                               rtol=0, atol=1e-4)
    # rows 0..255 against rows 1..256 of one buffer: same pointer base, not symmetric
    big = np.random.default_rng(3).standard_normal((257, 48)).astype(np.float32)
    got = hologram.jit(lambda a: a[:-1] @ a[1:].T)(big)
    want = big[:-1].astype(np.float64) @ big[1:].T.astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)


def test_nan_inf_propagate():
    a = np.ones((64, 64), np.float32)
    b = np.ones((64, 64), np.float32)
    a[3, 5] = np.nan
    b[7, 9] = np.inf
    got = hologram.jit(lambda x, y: x @ y)(a, b)
    want = a @ b
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))


def test_broadcast_operand_is_copied_for_blas_and_agrees():
    """An expanded (stride-0) matrix is no BLAS layout: the planner copies it into a
    buffer of its own (a kernel) and the driver runs the product, not np.matmul."""
    rng = np.random.default_rng(1)
    row = rng.standard_normal((1, 16)).astype(np.float32)
    b = rng.standard_normal((16, 8)).astype(np.float32)
    _check(lambda x, y: x.expand((32, 16)) @ y, row, b,
           ref=lambda x, y: np.broadcast_to(x, (32, 16)) @ y)
    if blas.provider()[0] is not None:
        src = hologram.jit(lambda x, y: x.expand((32, 16)) @ y).explain(row, b)
        assert "hg_gemm_rt(&d" in src and "void hg_run(void **B)" in src


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_permuted_heads_reshaped_for_a_product_run_on_the_driver(dt):
    """Attention's output ``[B, H, L, E]`` viewed as ``[B * L, H * E]`` for the output
    projection is no view BLAS reads (the reshape needs a copy): it is copied once on
    hologram's threads and every step of the program is C (one call), NaN and inf kept."""
    rng = np.random.default_rng(4)
    heads = rng.standard_normal((2, 3, 5, 4)).astype(dt)
    heads[0, 1, 2, 3], heads[1, 2, 0, 0] = np.nan, np.inf
    w = rng.standard_normal((12, 7)).astype(dt)

    def f(h, w):
        return (h * 2.0).permute((0, 2, 1, 3)).reshape((10, 12)) @ w

    def ref(h, w):
        with np.errstate(invalid="ignore"):  # inf * 0 in the sums: NaN, as in hologram
            return (h * 2.0).transpose(0, 2, 1, 3).reshape(10, 12) @ w

    got = hologram.jit(f)(heads, w)
    want = ref(heads.astype(np.float64), w.astype(np.float64))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = np.isfinite(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=1e-5 if dt == np.float32 else 1e-12,
                               atol=1e-5 if dt == np.float32 else 1e-12)
    if blas.provider()[0] is not None:
        assert "void hg_run(void **B)" in hologram.jit(f).explain(heads, w)


def test_desc_layouts():
    p = program(lambda x, y: x.T @ y, [(f32, (8, 4)), (f32, (8, 6))])
    from hologram.compiler.canonicalize import canonicalize
    from hologram.compiler.schedule import GemmPlan, plan

    canon, _ = canonicalize(p)
    sched = plan(canon, set())
    step = next(s for s in sched.steps if isinstance(s, GemmPlan))
    d = gemm_desc(step.value, sched.buffers, step.out, True)
    assert d is not None
    assert (d.m, d.n, d.k) == (4, 6, 8)
    assert d.a.trans and d.a.ld == 4 and not d.b.trans and d.b.ld == 6
    assert contiguous_strides((2, 3, 4)) == (12, 4, 1)


@needs_blas
def test_kernels_call_the_driver():
    a = np.ones((8, 8), np.float32)
    src = hologram.jit(lambda x, y: x @ y + 1).explain(a, a)
    assert "hg_gemm_rt(&d" in src and "(hg_epilogue_fn)k1_rows" in src
    assert "kernel launches 2 -> 1" in src  # the epilogue runs inside the GEMM, per tile
    src = hologram.jit(lambda x, y: (x @ y).sum(axis=1) + 1).explain(a, a)
    assert "void hg_run(void **B)" in src and "_rows" not in src


def _gelu(v):
    return 0.5 * v * (1 + (0.7978845608 * (v + 0.044715 * v * v * v)).tanh())


def _np_gelu(v):
    return 0.5 * v * (1 + np.tanh(0.7978845608 * (v + 0.044715 * v * v * v)))


@pytest.mark.parametrize("m,k,n", [(300, 70, 90), (20, 64, 700), (1, 5, 3), (257, 33, 1)])
def test_epilogues_fused_or_not_agree(m, k, n):
    """Row tiles (m >= n), column tiles (m < n: the epilogue runs after all tiles), and
    epilogues that must not run per tile (reductions over, or permutes of, the product)."""
    rng = np.random.default_rng(m + n)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    _check(lambda x, y, z: _gelu(x @ y + z), a, b, bias,
           ref=lambda x, y, z: _np_gelu(x @ y + z))
    _check(lambda x, y, z: (x @ y + z) * (x @ y), a, b, bias)
    _check(lambda x, y, z: ((x @ y) * 2).T + 1, a, b, bias,
           ref=lambda x, y, z: ((x @ y) * 2).T + 1)
    _check(lambda x, y, z: (x @ y) - (x @ y).max(axis=1, keepdims=True), a, b, bias,
           ref=lambda x, y, z: (x @ y) - (x @ y).max(axis=1, keepdims=True))


def _blas_threads() -> int:
    """NumPy's OpenBLAS thread count (the one the driver sets to 1 while it runs on it)."""
    found = blas.numpy_blas()[0]
    if found is None:
        pytest.skip("NumPy has no OpenBLAS here")
    lib = ctypes.CDLL(found.path)
    for name in ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_",
                 "openblas_get_num_threads"):
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.restype = ctypes.c_int
            return fn()
    pytest.skip("no openblas_get_num_threads")


@needs_blas
def test_blas_thread_count_restored_under_concurrency():
    before = _blas_threads()
    rng = np.random.default_rng(2)
    a = rng.standard_normal((192, 160)).astype(np.float32)
    b = rng.standard_normal((160, 176)).astype(np.float32)
    want = a.astype(np.float64) @ b
    f = hologram.jit(lambda x, y: x @ y)
    errors: list[BaseException] = []

    def work():
        try:
            for _ in range(20):
                np.testing.assert_allclose(f(a, b), want, rtol=1e-4, atol=1e-3)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert _blas_threads() == before


def test_numpy_fallback_env_gives_same_results():
    code = ("import numpy as np, hologram\n"
            "from hologram.compiler import blas\n"
            "print(blas.describe())\n"
            "a = np.arange(12, dtype=np.float32).reshape(3, 4)\n"
            "print(hologram.jit(lambda x, y: x @ y.T)(a, a).sum())\n")
    env = {**os.environ, "HOLOGRAM_GEMM": "numpy"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=120, check=True).stdout.split("\n")
    assert out[0].startswith("np.matmul (HOLOGRAM_GEMM=numpy)")
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert float(out[1]) == float((a @ a.T).sum())


@pytest.mark.parametrize("ashape,bshape", [((4, 8, 16), (4, 16, 5)), ((2, 3, 33, 7), (2, 3, 7, 40)),
                                           ((3, 1, 6), (3, 6, 1)), ((0, 4, 5), (0, 5, 6)),
                                           ((5, 64, 64), (5, 64, 64))])
def test_batched(ashape, bshape):
    rng = np.random.default_rng(len(ashape))
    a = rng.standard_normal(ashape).astype(np.float32)
    b = rng.standard_normal(bshape).astype(np.float32)
    _check(lambda x, y: x @ y, a, b)
    _check(lambda x, y: (x @ y) * 0.5 + 1, a, b)


def test_batched_transposed_and_broadcast():
    rng = np.random.default_rng(7)
    q = rng.standard_normal((2, 3, 10, 8)).astype(np.float32)  # attention-like
    k = rng.standard_normal((2, 3, 12, 8)).astype(np.float32)
    w = rng.standard_normal((8, 6)).astype(np.float32)
    _check(lambda x, y: x @ y.permute((0, 1, 3, 2)), q, k,
           ref=lambda x, y: x @ y.transpose(0, 1, 3, 2))
    _check(lambda x, y: x @ y.expand((2, 3, 8, 6)), q, w,
           ref=lambda x, y: x @ y)


def test_nocopy_reshape_matches_numpy_views():
    """Every reshape of a transposed array: strides when NumPy makes a view, None when
    NumPy has to copy."""
    import itertools

    from hologram.compiler.gemm_layout import nocopy_reshape

    news = [(24,), (4, 6), (6, 4), (2, 12), (12, 2), (2, 3, 4), (4, 3, 2), (1, 24), (24, 1),
            (2, 2, 6), (6, 2, 2), (3, 2, 4)]
    for shape in [(4, 6), (2, 3, 4), (6, 1, 4), (3, 8), (2, 2, 6)]:
        x = np.arange(24).reshape(shape)
        for perm in itertools.permutations(range(len(shape))):
            v = x.transpose(perm)
            strides = tuple(s // v.itemsize for s in v.strides)
            for new in news:
                st = nocopy_reshape(v.shape, strides, new)
                want = v.reshape(new)
                if st is None:
                    assert not np.shares_memory(want, x), (shape, perm, new)
                else:
                    got = np.lib.stride_tricks.as_strided(x, new, [s * x.itemsize for s in st])
                    np.testing.assert_array_equal(got, want)


@needs_blas
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_gemm_in_a_forked_child():
    """The driver's lock and BLAS thread count are reset in a forked child."""
    a = np.ones((64, 64), np.float32)
    f = hologram.jit(lambda x, y: x @ y)
    f(a, a)
    pid = os.fork()
    if pid == 0:  # child: must not hang or crash
        ok = bool(np.all(f(a, a) == 64))
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0


def _launches(fn, *arrays) -> tuple[int, int]:
    import re

    text = hologram.jit(fn).explain(*arrays)
    before, after = re.search(r"kernel launches (\d+) -> (\d+)", text).groups()
    return int(before), int(after)


@needs_blas
@pytest.mark.parametrize("b,t,k,n", [(4, 16, 24, 40), (2, 3, 8, 64), (1, 1, 5, 7), (3, 50, 6, 2)])
def test_linear_on_3d_input_fuses_bias_and_activation_per_tile(b, t, k, n):
    """``linear`` on a 3-D input is a 2-D GEMM viewed back as 3-D; the bias add (stored,
    as AOT autograd saves it for backward) and the GELU after it both run on each
    tile, and agree with NumPy in float64, for row tiles and column tiles."""
    rng = np.random.default_rng(b * t + n)
    x = rng.standard_normal((b, t, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)

    def f(x, w, bias):
        h = (x.reshape((b * t, k)) @ w).reshape((b, t, n)) + bias
        return h, _gelu(h)

    def ref(x, w, bias):
        h = (x.reshape(b * t, k) @ w).reshape(b, t, n) + bias
        return h, _np_gelu(h)

    got = hologram.jit(f)(x, w, bias)
    for g, want in zip(got, ref(*(a.astype(np.float64) for a in (x, w, bias))), strict=True):
        np.testing.assert_allclose(g, want, rtol=0, atol=1e-4 * max(1.0, np.abs(want).max()))
    assert _launches(f, x, w, bias)[1] == 1  # GEMM, bias kernel and GELU kernel: one


@needs_blas
def test_epilogue_chain_stops_where_rows_would_be_read_out_of_place():
    """A reshape that changes the row length, a transpose of a value an earlier epilogue
    kernel stored, and a batched product all still agree with NumPy; the first two
    must run after the GEMM, not per tile."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal((64, 16)).astype(np.float32)
    w = rng.standard_normal((16, 32)).astype(np.float32)
    bias = rng.standard_normal(32).astype(np.float32)
    cases = [
        (lambda x, y, z: ((x @ y) + z).reshape((32, 64)) + 1.0,
         lambda x, y, z: ((x @ y) + z).reshape(32, 64) + 1.0, 2),
        (lambda x, y, z: (lambda h: (h, h.T * 2.0))((x @ y) + z),
         lambda x, y, z: (lambda h: (h, h.T * 2.0))((x @ y) + z), 2),
    ]
    for fn, ref, launches in cases:
        got = hologram.jit(fn)(a, w, bias)
        want = ref(*(v.astype(np.float64) for v in (a, w, bias)))
        got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
        for g, r in zip(got, want, strict=True):
            np.testing.assert_allclose(g, r, rtol=0, atol=1e-4 * max(1.0, np.abs(r).max()))
        assert _launches(fn, a, w, bias)[1] == launches
    xb = rng.standard_normal((3, 20, 16)).astype(np.float32)
    _check(lambda x, y, z: _gelu((x @ y) + z), xb, w, bias,
           ref=lambda x, y, z: _np_gelu((x @ y) + z))


@needs_blas
@pytest.mark.parametrize("m,k,n,r", [(600, 16, 392, 14), (40, 16, 784, 28), (300, 8, 96, 96)])
def test_epilogue_with_shorter_rows_runs_per_tile(m, k, n, r):
    """A product viewed with shorter rows that divide its own (a 1x1 convolution's
    ``[C, H*W]`` product as ``[C, H, W]``) is still read element for element where its
    tile wrote it: the bias and GELU run per tile, over ``n / r`` of their rows per
    product row, for row tiles and column tiles, at 1 to 3 threads. Outputs start as
    NaN, so a row no tile covered shows."""
    rng = np.random.default_rng(m + n + r)
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    bias = rng.standard_normal(r).astype(np.float32)

    def f(x, y, z):
        return _gelu((x @ y).reshape((m, n // r, r)) + z)

    want = _np_gelu((a.astype(np.float64) @ w).reshape(m, n // r, r) + bias)
    assert _launches(f, a, w, bias)[1] == 1
    fn = hologram.jit(f)
    try:
        for nt in (1, 2, 3):
            hologram.set_num_threads(nt)
            out = np.full((m, n // r, r), np.nan, np.float32)
            fn(a, w, bias, out=out)
            np.testing.assert_allclose(out, want, rtol=0, atol=1e-4 * np.abs(want).max())
    finally:
        hologram.set_num_threads(None)


_EPILOGUE_STEPS = {
    "bias": lambda h, bias: h + bias if h.shape[-1] == bias.shape[0] else h + 1.0,
    "gelu": lambda h, bias: _gelu(h),
    "relu": lambda h, bias: (h > 0.0).where(h, h * 0.0),
    "exp": lambda h, bias: (h * 0.125).exp(),
    "square": lambda h, bias: h * h,
}


@needs_blas
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_random_epilogue_chains_match_reference(data):
    """A GEMM, then a reshape that keeps the row length or not (or a transpose), then
    element-wise steps with some results stored on the way (a stored value is a kernel
    of its own and the next step reads it back, so the epilogue is a chain): the
    compiled program, whatever it fuses per tile, agrees with the reference
    interpreter, NaN and inf included."""
    batch = data.draw(st.sampled_from([(), (2,), (3, 2)]), "batch")
    m, k, n = (data.draw(st.sampled_from([1, 2, 7, 33, 70]), name) for name in "mkn")
    shape = data.draw(st.sampled_from(["same", "merge", "unit axis", "flat", "transpose"]),
                      "reshape")
    steps = data.draw(st.lists(st.tuples(st.sampled_from(list(_EPILOGUE_STEPS)),
                                         st.booleans()), min_size=1, max_size=4), "steps")

    def f(a, w, bias):
        h = a @ w
        if shape == "merge" and batch:
            h = h.reshape((math.prod(h.shape[:-1]), n))
        elif shape == "unit axis":
            h = h.reshape((*h.shape[:-1], 1, n))
        elif shape == "flat":
            h = h.reshape((math.prod(h.shape),))
        elif shape == "transpose" and h.ndim >= 2:
            h = h.permute((*range(h.ndim - 2), h.ndim - 1, h.ndim - 2))
        outs = []
        for step, store in steps:
            h = _EPILOGUE_STEPS[step](h, bias)
            if store:  # kept as an output too: the next step reads it back (a chain)
                outs.append(h)
        return (*outs, h)

    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), "seed"))
    a = rng.standard_normal((*batch, m, k))
    w = rng.standard_normal((k, n))
    bias = rng.standard_normal(n)
    a.flat[rng.integers(0, a.size, 2)] = [np.nan, np.inf]
    got = hologram.jit(f)(a, w, bias)
    want = hologram.jit(f, backend="reference")(a, w, bias)
    for g, r in zip(got, want, strict=True):
        np.testing.assert_allclose(g, r, rtol=1e-9, atol=1e-9, equal_nan=True)
