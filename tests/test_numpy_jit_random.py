"""``np.random`` inside ``@hg.jit`` (``hologram/npjit/random.py``).

Before, NumPy's random functions ran at trace time and their numbers were baked into
the program: every call returned the same values. Now they draw in the program from a
seed drawn from NumPy's global state at each call: fresh numbers per call, the same
ones after ``np.random.seed``, the documented bits, NumPy's distributions and shapes,
and a clear error for the functions that are not traced.
"""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest

import hologram as hg
from hologram.errors import NumpyUnsupportedError
from hologram.npjit import random as npjit_random

from .test_random_bits import np_uniform


def test_each_call_draws_afresh_and_seed_repeats():
    f = hg.jit(lambda x: x + np.random.rand(*x.shape))
    x = np.zeros(1000)
    a, b = f(x), f(x)
    assert not np.array_equal(a, b)
    np.random.seed(11)
    first = f(x)
    np.random.seed(11)
    np.testing.assert_array_equal(f(x), first)


def test_draws_are_the_documented_bits():
    """The seed is NumPy's next ``randint(0, 2**31 - 1)``; each call site a stream."""
    f = hg.jit(lambda x: (x + np.random.random((3, 50)), x + np.random.random_sample((3, 50))))
    x = np.zeros((3, 50))
    np.random.seed(5)
    a, b = f(x)
    np.random.seed(5)
    seed = int(np.random.randint(0, 2**31 - 1))
    np.testing.assert_array_equal(a, np_uniform(seed, (3, 50), 0, "f64"))
    np.testing.assert_array_equal(b, np_uniform(seed, (3, 50), 1, "f64"))


def _within(value: float, want: float, sd: float, n: int) -> None:
    assert abs(value - want) <= 6 * sd / math.sqrt(n), (value, want)


def test_numpys_distributions_shapes_and_parameters():
    n = 200_000
    loc = np.linspace(-1, 1, 4)

    def fn(x):
        return (np.random.uniform(-2.0, 3.0, size=x.shape), np.random.normal(1.5, 0.5, x.shape),
                np.random.standard_normal(x.shape), np.random.randn(*x.shape),
                np.random.uniform(x, x + 2), np.random.normal(loc, 0.1, size=(n // 4, 4)),
                np.random.normal(x[:4], x[:4] + 1))

    outs = hg.jit(fn)(np.zeros(n))
    unif, norm, sn, rn, unif_x, norm_loc, norm_traced = outs
    assert unif.shape == norm.shape == sn.shape == rn.shape == unif_x.shape == (n,)
    assert norm_loc.shape == (n // 4, 4) and norm_traced.shape == (4,)
    assert -2.0 <= unif.min() and unif.max() < 3.0
    _within(unif.mean(), 0.5, 5 / math.sqrt(12), n)
    _within(norm.mean(), 1.5, 0.5, n)
    assert abs(norm.std() - 0.5) < 0.01
    for z in (sn, rn):
        _within(z.mean(), 0.0, 1.0, n)
        assert abs(z.std() - 1) < 0.02
    _within(unif_x.mean(), 1.0, 2 / math.sqrt(12), n)
    np.testing.assert_allclose(norm_loc.mean(0), loc, atol=6 * 0.1 / math.sqrt(n // 4))
    assert abs(np.corrcoef(sn, rn)[0, 1]) < 6 / math.sqrt(n)  # two call sites, two streams


def test_scalar_and_empty_draws():
    f = hg.jit(lambda x: (x + np.random.random(), x + np.random.rand(0, 3).sum()))
    a, b = f(np.zeros(()))
    assert a.shape == () and 0 <= a < 1
    assert b == 0


def test_monte_carlo_pi():
    """The classic: a vectorized estimate of pi, fresh samples each call."""
    @hg.jit
    def pi(scale):
        u = np.random.random(1_000_000)
        v = np.random.random(1_000_000)
        return scale * np.mean(u * u + v * v < 1)

    a, b = pi(np.array(4.0)), pi(np.array(4.0))
    assert a != b
    for r in (a, b):
        assert abs(r - math.pi) < 6 * 4 * math.sqrt(math.pi / 4 * (1 - math.pi / 4) / 1e6)


@pytest.mark.parametrize("name, call", [
    ("randint", lambda x: x + np.random.randint(0, 3, x.shape)),
    ("choice", lambda x: x + np.random.choice(3, x.shape)),
    ("permutation", lambda x: x + np.random.permutation(x.shape[0])),
    ("exponential", lambda x: x + np.random.exponential(1.0, x.shape)),
])
def test_untraced_functions_refuse_to_bake_their_numbers(name, call):
    with pytest.raises(NumpyUnsupportedError, match=f"np.random.{name}: .*trace time"):
        hg.jit(call)(np.zeros(4))
    assert getattr(np.random, name) is getattr(np.random.mtrand, name)  # patch removed


def test_bad_sizes_are_clear_errors():
    with pytest.raises(NumpyUnsupportedError, match="np.random.random: size"):
        hg.jit(lambda x: x + np.random.random("3"))(np.zeros(3))
    with pytest.raises(NumpyUnsupportedError, match="np.random.uniform: size"):
        hg.jit(lambda x: np.random.uniform(x, x + 1, size=(2,)))(np.zeros(3))


def test_other_threads_draw_numpys_own_numbers_during_a_trace():
    """The patch answers only the tracing thread: another thread's np.random calls,
    made while a trace is open, get NumPy's arrays."""
    got: list = []
    with npjit_random.drawing(lambda: pytest.fail("the other thread drew a seed")):
        assert np.random.rand is not np.random.mtrand.rand  # installed while tracing
        t = threading.Thread(target=lambda: got.append(np.random.rand(3)))
        t.start()
        t.join()
    assert isinstance(got[0], np.ndarray) and got[0].shape == (3,)
    assert np.random.rand is np.random.mtrand.rand


RNG = np.random.default_rng(0)


def test_a_generator_that_draws_while_tracing_is_an_error():
    """A Generator's (or RandomState's) methods cannot be traced: one read from a global
    or a closure that draws during the trace fails the trace, naming it, instead of
    baking numbers that would repeat at every call."""
    with pytest.raises(NumpyUnsupportedError, match="np.random.Generator: RNG: drew while"):
        hg.jit(lambda x: x + RNG.random(x.shape))(np.zeros(4))
    rs = np.random.RandomState(1)
    with pytest.raises(NumpyUnsupportedError, match="np.random.RandomState: rs: drew while"):
        hg.jit(lambda x: x + rs.standard_normal(x.shape))(np.zeros(4))
    with pytest.raises(NumpyUnsupportedError, match="np.random.default_rng: seed"):
        hg.jit(lambda x: x + np.random.default_rng().random(x.shape))(np.zeros(4))


def test_a_seeded_generator_made_inside_gives_numpys_constants():
    """``default_rng(seed)`` inside the function draws the same numbers at every call in
    NumPy too: they are the trace's constants, NumPy's own."""
    f = hg.jit(lambda x: x + np.random.default_rng(7).random(x.shape))
    want = np.random.default_rng(7).random(40)
    np.testing.assert_array_equal(f(np.zeros(40)), want)
    np.testing.assert_array_equal(f(np.zeros(40)), want)
