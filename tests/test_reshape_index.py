"""Reshapes of views (permuted, expanded) read through render_c.reshape_index, which
maps only the dims a reshape splits or merges; checked against NumPy on every pairing
of a few factorizations (a precedence slip there once passed the random programs)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import hologram

SHAPES = {24: [(4, 6), (6, 4), (2, 3, 4), (24,), (1, 24), (2, 12, 1), (3, 8), (6, 2, 2),
               (4, 2, 3)],
          36: [(6, 6), (4, 9), (3, 3, 4), (36, 1), (2, 18)]}
CASES = [(a, b) for shapes in SHAPES.values() for a, b in itertools.product(shapes, shapes)]


@pytest.mark.parametrize("a,b", CASES)
def test_reshape_of_permuted_view(a, b):
    x = np.random.default_rng(len(a) * 10 + len(b)).standard_normal(a).astype(np.float32)
    perm = tuple(reversed(range(len(a))))
    got = hologram.jit(lambda v: (v.permute(perm) * 2).reshape(b) + 1)(x)
    want = (x.transpose(perm) * 2).reshape(b) + 1
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("a,b", CASES[::3])
def test_reshape_then_reduce(a, b):
    x = np.random.default_rng(3).standard_normal(a).astype(np.float32)
    got = hologram.jit(lambda v: v.permute(tuple(reversed(range(len(a))))).reshape(b)
                       .sum(axis=0, keepdims=True))(x)
    want = x.transpose(tuple(reversed(range(len(a))))).reshape(b).sum(axis=0, keepdims=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shift", [0, 5, 17])
def test_flattened_buffer_read_at_a_shift_needs_no_division(shift):
    """A buffer ``[4, 6, 10, 12]`` read through ``reshape`` to ``[4, 6, 120]`` and a
    window of that flat axis (a depthwise convolution's taps over a padded plane): the
    split coordinates recombine to the flat index itself, so the load is linear in the
    loop variable (vectorizable), not a division and remainder per element; a reshape
    that is not contiguous in the buffer (a permuted view in between) keeps them."""
    import re

    x = np.random.default_rng(shift).standard_normal((4, 6, 10, 12)).astype(np.float32)
    n = 120 - shift

    def f(v):
        return v.reshape((4, 6, 120)).slice((0, 0, shift), (4, 6, n)) * 2.0

    fn = hologram.jit(f)
    got = fn(x)
    np.testing.assert_array_equal(got, x.reshape(4, 6, 120)[:, :, shift:] * 2)
    src = fn.explain(x)
    loads = re.findall(r"p0_f32\[([^\]]*)\]", src[src.index("== kernels =="):])
    assert loads and not any("/ 12" in s or "% 12" in s for s in loads), loads

    def g(v):
        return v.permute((0, 1, 3, 2)).reshape((4, 6, 120)) * 2.0

    got = hologram.jit(g)(x)
    np.testing.assert_array_equal(got, x.transpose(0, 1, 3, 2).reshape(4, 6, 120) * 2)
