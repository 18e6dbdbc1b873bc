"""``np.searchsorted``, ``np.digitize`` and ``np.interp`` under ``@hg.jit`` beyond the
idiom table: large key sets (the search runs as one fused pass: each step's position
is read by the next step's GATHER and its select, which the scheduler's rejoin rule
counts as one reader), search lengths around each power of two, and interp's corner
cases."""

from __future__ import annotations

import numpy as np
import pytest

import hologram as hg


@pytest.fixture(scope="module")
def cpu(native_cpu: hg.Executor) -> hg.Executor:
    return native_cpu


def test_a_search_over_many_keys_is_one_kernel(cpu) -> None:
    rng = np.random.default_rng(0)
    bins = np.sort(rng.standard_normal(1000))
    keys = rng.standard_normal((300, 256))
    f = hg.jit(lambda k: np.searchsorted(bins, k, side="right"))
    np.testing.assert_array_equal(f(keys), np.searchsorted(bins, keys, side="right"))
    p, _ = f.program_for(keys)
    assert cpu.compile(p).stats.launches_after == 1


@pytest.mark.parametrize("side", ["left", "right"])
def test_every_sorted_length(side: str) -> None:
    """Lengths 0 to 9 and each power of two to 64 with its neighbours, with ties, NaN
    last, keys equal to elements, between them, beyond both ends, NaN and inf."""
    rng = np.random.default_rng(1)
    for n in [*range(10), 15, 16, 17, 31, 32, 33, 63, 64, 65]:
        a = np.sort(rng.integers(-20, 20, n).astype(np.float64))
        if n > 4:
            a[-2:] = np.nan
        keys = np.concatenate([a, a + 0.5, [-np.inf, np.inf, np.nan, -100, 100]])
        got = hg.jit(lambda a, k: np.searchsorted(a, k, side))(a, keys)
        np.testing.assert_array_equal(got, np.searchsorted(a, keys, side), err_msg=str(n))


def test_interp_corner_cases() -> None:
    xp = np.array([-1.0, 0.0, 0.0, 2.0, 3.0, np.inf])
    fp = np.array([1.0, 2.0, 5.0, np.inf, np.inf, 7.0])
    x = np.array([-2.0, -1.0, -0.5, 0.0, 1.0, 2.0, 2.5, 3.0, 10.0, np.inf, -np.inf, np.nan])
    for kw in ({}, {"left": np.nan, "right": -3.0}):
        got = hg.jit(lambda x, kw=kw: np.interp(x, xp, fp, **kw))(x)
        np.testing.assert_array_equal(got, np.interp(x, xp, fp, **kw))
    for n in (1, 2):
        got = hg.jit(lambda x, n=n: np.interp(x, xp[:n], fp[:n]))(x)
        np.testing.assert_array_equal(got, np.interp(x, xp[:n], fp[:n]))
    got = hg.jit(lambda x: np.interp(x, xp, fp))(np.zeros((0, 3)))
    assert got.shape == (0, 3) and got.dtype == np.float64


def test_a_captured_table_indexed_by_a_traced_index_says_what_works() -> None:
    """``table[idx]`` with a captured NumPy table cannot be traced (NumPy converts the
    index itself); the error names the two forms that work, and both do."""
    table = np.linspace(0.0, 1.0, 50)
    x = np.arange(12).reshape(3, 4) * 4
    with pytest.raises(hg.errors.NumpyUnsupportedError, match="take_along_axis"):
        hg.jit(lambda i: table[i])(x)
    want = table[x]
    np.testing.assert_array_equal(hg.jit(lambda t, i: t[i])(table, x), want)
    got = hg.jit(lambda i: np.take_along_axis(table, i.reshape(-1), 0).reshape(i.shape))(x)
    np.testing.assert_array_equal(got, want)
