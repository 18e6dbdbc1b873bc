"""Products of 16-bit values read in place (compiler/schedule.py ``narrow_operands``).

A bf16 graph multiplies widened values: ``gemm(cvt.f32(x_bf16), cvt.f32(w_bf16))``.
Where the CPU's GEMM driver has a bf16 product (``blas.narrow_dtypes``), the planner
stores the bf16 values, not float copies, and the driver reads them in place. Each case
runs through the compiled CPU backend and the reference interpreter, with NaN and inf
among the inputs, and checks which products read 16-bit operands: every operand
layout, batches, windows, Gram products, rounded activations read by several products,
a copying chain above the widening (an attention output's projection), a mixed pair and
f16 (not read narrow), and a bf16 table gathered without a float copy of it.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hologram as hg
from hologram.compiler import blas
from hologram.compiler.schedule import GemmPlan, KernelPlan
from hologram.isa import builder as b

from .programs import compiled_and_reference, without_finite_overflow

ml_dtypes = pytest.importorskip("ml_dtypes")
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

NP = {"bf16": ml_dtypes.bfloat16, "f16": np.float16, "f32": np.float32}


def _executor() -> hg.Executor:
    ex = hg.default_executor("cpu")
    if "C via" not in ex.backend.describe():
        pytest.skip("no C compiler: the cpu backend is the reference interpreter")
    return ex


def _narrow_here(ex: hg.Executor) -> frozenset[str]:
    return blas.narrow_dtypes(ex.backend.cc) if blas.runtime(ex.backend.cc) else frozenset()


def _inputs(specs, seed: int) -> list[np.ndarray]:
    """Random values of each spec's dtype (16-bit ones rounded from float), NaN and inf
    among them, finite extremes brought in (``without_finite_overflow``)."""
    rng = np.random.default_rng(seed)
    out = []
    for d, shape in specs:
        a = (rng.standard_normal(shape) * 3).astype(np.float32)
        if a.size:
            special = rng.random(shape) < 0.03
            a[special] = rng.choice(np.array([np.nan, np.inf, -np.inf], np.float32),
                                    int(special.sum()))
        out.append(without_finite_overflow([a])[0].astype(NP[d]))
    return out


def _check(fn, specs, seed: int = 0, k: int = 64):
    """Compiled CPU against the reference interpreter (1e-5 relative, and 1e-5 of the
    largest finite result per term of a ``k``-term sum; NaN where the reference has
    one); returns the compiled program."""
    ex = _executor()
    p = b.program(fn, specs)
    got, want = compiled_and_reference(ex, p, _inputs(specs, seed))
    for g, w in zip(got, want, strict=True):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        scale = max(1.0, float(np.nanmax(np.abs(np.where(np.isinf(w), 0, w)), initial=0)))
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * scale * k, equal_nan=True)
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
    return ex, ex.compile(p)


def _gemms(c) -> list[GemmPlan]:
    return [s for s in c.lowered.schedule.steps if isinstance(s, GemmPlan)]


def _kernels(c) -> list[KernelPlan]:
    return [s for s in c.lowered.schedule.steps if isinstance(s, KernelPlan)]


def _expect_narrow(ex, c, count: int | None = None) -> None:
    """Every product read bf16 operands (where this machine's driver can)."""
    if "bf16" not in _narrow_here(ex):
        return
    gemms = _gemms(c)
    assert gemms and all(g.narrow == "bf16" for g in gemms), [g.narrow for g in gemms]
    if count is not None:
        assert len(gemms) == count


def _w(x):
    return x.cast("f32")


LAYOUTS = {  # (A's stored shape, B's stored shape, how the product reads them)
    "NN": ((20, 33), (33, 18), lambda x, w: _w(x) @ _w(w)),
    "NT": ((20, 33), (18, 33), lambda x, w: _w(x) @ _w(w).T),
    "TN": ((33, 20), (33, 18), lambda x, w: _w(x).T @ _w(w)),
    "TT": ((33, 20), (18, 33), lambda x, w: _w(x).T @ _w(w).T),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_every_operand_layout_reads_the_bf16_inputs(layout):
    sa, sb, fn = LAYOUTS[layout]
    ex, c = _check(fn, [("bf16", sa), ("bf16", sb)], k=33)
    _expect_narrow(ex, c, 1)
    if "bf16" in _narrow_here(ex):
        assert not _kernels(c)  # no float copy of either input is written
        assert c.temps == []


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize("m,n,k", [(300, 130, 1600), (5, 2100, 777), (40, 50, 2)])
def test_products_across_the_kernels_blocks(m, n, k, ta, tb):
    # past the bf16 kernel's K blocks (768), row blocks (256), the 6-row dot tiles
    # (k >= 1536) and its L2 blocks of W; k = 2 is one pair
    def fn(x, w):
        a = _w(x).T if ta else _w(x)
        return a @ (_w(w).T if tb else _w(w))

    ex, c = _check(fn, [("bf16", (k, m) if ta else (m, k)), ("bf16", (n, k) if tb else (k, n))],
                   k=k)
    _expect_narrow(ex, c, 1)


def test_batched_and_broadcast_products():
    def fn(x, w, y):
        h = _w(x) @ _w(w).T  # [3, 20, 33] @ [33, 18]: the weight broadcast over the batch
        g = _w(y).permute(1, 0, 2) @ _w(x)  # a permuted batch axis
        return h, g

    ex, c = _check(fn, [("bf16", (3, 20, 33)), ("bf16", (18, 33)), ("bf16", (7, 3, 20))])
    _expect_narrow(ex, c, 2)


def test_windows_read_at_an_offset():
    def fn(x, w):
        return _w(x).slice((2, 1), (22, 29)) @ _w(w).slice((3, 0), (18, 29)).T

    ex, c = _check(fn, [("bf16", (24, 33)), ("bf16", (21, 33))])
    _expect_narrow(ex, c, 1)


def test_gram_product_reads_one_operand_twice():
    # x @ x.T from 128 rows takes the driver's symmetric strips (blas.SYMMETRIC_MIN)
    ex, c = _check(lambda x: _w(x) @ _w(x).T, [("bf16", (160, 40))], k=40)
    _expect_narrow(ex, c, 1)


def test_a_rounded_activation_is_stored_in_bf16_for_its_products():
    def fn(x, w1, w2):
        h = _w(x.tanh().cast("bf16"))  # a half graph's rounded result, read three times
        return h @ _w(w1).T, h @ _w(w2).T, h * 2.0

    ex, c = _check(fn, [("f32", (96, 700)), ("bf16", (40, 700)), ("bf16", (24, 700))],
                   k=700)
    _expect_narrow(ex, c, 2)
    if "bf16" in _narrow_here(ex):
        stored = [d.dtype.name for k in _kernels(c) for _, d in k.all_sinks
                  if d.kind == "tmp"]
        assert stored == ["bf16"], stored  # the activation once, in bf16


def test_a_copying_chain_above_the_widening_is_stored_in_the_products_layout():
    # attention's output [B, H, L, E] read as [B * L, H * E] by its projection: the
    # permute and merge copy; the bf16 value is stored in the GEMM's layout
    def fn(o, w):
        h = _w((o * 1.5).cast("bf16")).permute(0, 2, 1, 3).reshape(2 * 10, 4 * 8)
        return h @ _w(w).T

    ex, c = _check(fn, [("f32", (2, 4, 10, 8)), ("bf16", (12, 32))], k=32)
    _expect_narrow(ex, c, 1)
    if "bf16" in _narrow_here(ex):
        assert [d.dtype.name for k in _kernels(c) for _, d in k.all_sinks] == ["bf16"]


def test_a_mixed_pair_multiplies_in_float():
    ex, c = _check(lambda x, w: _w(x) @ w.T, [("bf16", (20, 33)), ("f32", (18, 33))], k=33)
    assert [g.narrow for g in _gemms(c)] == [None]


def test_f16_operands_multiply_in_float():
    ex, c = _check(lambda x, w: _w(x) @ _w(w).T, [("f16", (20, 33)), ("f16", (18, 33))],
                   k=33)
    assert [g.narrow for g in _gemms(c)] == [None]


def test_a_bf16_table_is_gathered_without_a_float_copy():
    def fn(table, idx):
        rows = _w(table).take(idx, 0)  # an embedding
        h = _w((rows * 2.0).cast("bf16"))  # the layers between, rounded to bf16
        return h @ _w(table).T  # GPT-2's tied head reads the same table

    ex = _executor()
    p = b.program(fn, [("bf16", (50, 24)), ("i64", (6,))])
    table = _inputs([("bf16", (50, 24))], 0)[0]
    idx = np.array([0, 49, 7, 7, 12, 3], np.int64)
    got, want = compiled_and_reference(ex, p, [table, idx])
    g, w = np.asarray(got[0], np.float64), np.asarray(want[0], np.float64)
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-3, equal_nan=True)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
    c = ex.compile(p)
    table_copies = [d for k in _kernels(c) for _, d in k.all_sinks if d.shape == (50, 24)]
    assert table_copies == []  # gathered through the widening, row by row
    _expect_narrow(ex, c, 1)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(m=st.integers(1, 70), n=st.integers(1, 70), k=st.integers(1, 90),
       ta=st.booleans(), tb=st.booleans(), batch=st.sampled_from([(), (2,), (3, 1)]),
       seed=st.integers(0, 2**16))
def test_random_products_match_the_reference(m, n, k, ta, tb, batch, seed):
    sa = (*batch, k, m) if ta else (*batch, m, k)
    sb = (n, k) if tb else (k, n)

    def fn(x, w):
        a = _w(x)
        a = a.permute(*range(len(batch)), len(batch) + 1, len(batch)) if ta else a
        bb = _w(w).T if tb else _w(w)
        return a @ bb

    ex, c = _check(fn, [("bf16", sa), ("bf16", sb)], seed, k=k)
    _expect_narrow(ex, c)


def test_the_own_bf16_kernel_is_used_where_the_cpu_has_avx512_bf16():
    from hologram.compiler import bf16_gemm

    ex = _executor()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = f.read()
    except OSError:
        pytest.skip("no /proc/cpuinfo")
    native = " avx512_bf16" in flags and "-march=native" in " ".join(ex.backend.cc.flags)
    assert (bf16_gemm.kernel(ex.backend.cc) is not None) == native
    if native and blas.runtime(ex.backend.cc):
        assert "bf16" in blas.narrow_dtypes(ex.backend.cc)
