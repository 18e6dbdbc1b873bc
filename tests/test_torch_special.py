"""lgamma, digamma, polygamma, mvlgamma and special.zeta under
``torch.compile(backend="hologram")``: the ISA's LGAMMA, DIGAMMA and ZETA, forward and
backward against eager (and against float64 eager) on values across their domains:
poles at 0 and the negative integers, negative arguments, NaN and +-inf, large
arguments, non-contiguous inputs; each inside a hologram program."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from .test_torch_index import _check, _randn  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _domain(seed: int) -> torch.Tensor:
    """Random values, the poles, negative non-integers, edges and large values."""
    edges = torch.tensor([0.0, -0.0, -1.0, -3.0, 1.0, 2.0, 1.4616321, -2.5, -7.25, 0.5,
                          float("nan"), float("inf"), float("-inf"), 1e-30, 60.0, 1e6])
    return torch.cat([_randn(60, seed=seed) * 4, edges]).reshape(4, 19)


@pytest.mark.parametrize("op", ["lgamma", "digamma"])
def test_lgamma_and_digamma(op):
    x = _domain(1).t()  # non-contiguous
    _check(lambda x: getattr(torch, op)(x) * 0.5, x, ops={f"aten.{op}"}, grad=False)
    torch._dynamo.reset()
    y = _randn(5, 6, seed=2).abs() + 0.1  # the backward: digamma, and polygamma(1)
    _check(lambda y: getattr(torch, op)(y), y, ops={f"aten.{op}"})


@pytest.mark.parametrize("n", [0, 1, 2, 3])
def test_polygamma_against_float64(n):
    x = _domain(3)
    finite = torch.isfinite(x) & ((x > 0) | (x != x.floor()))  # trigamma's poles are not
    x = torch.where(finite, x, torch.tensor(0.75))             # inf in ATen (see below)
    f = torch.compile(lambda x: torch.polygamma(n, x), backend="hologram", dynamic=False)
    got = f(x)
    want = torch.polygamma(n, x.double())
    # relative to the float64 value, as close as float32's rounding of the input allows
    # near the poles: compare where the float64 value is moderate
    ok = want.abs() < 1e6
    torch.testing.assert_close(got[ok].double(), want[ok], rtol=2e-5, atol=1e-5)
    torch._dynamo.reset()
    y = _randn(3, 5, seed=4).abs() + 0.2
    _check(lambda y: torch.polygamma(n, y) * 0.1, y, ops={"aten.polygamma"})


def test_polygamma_poles_are_infinite():
    """At 0 and the negative integers zeta gives inf; ATen's trigamma (polygamma(1))
    gives whatever 1/sin(pi x)^2 rounds to there (~1e30): a documented difference."""
    f = torch.compile(lambda x: torch.polygamma(2, x), backend="hologram", dynamic=False)
    x = torch.tensor([0.0, -1.0, -4.0])
    assert torch.isinf(f(x)).all() and torch.equal(f(x), torch.polygamma(2, x))


def test_mvlgamma_and_zeta():
    x = _randn(4, 5, seed=5).abs() + 2.5  # mvlgamma(p=3) needs x > 1
    _check(lambda x: torch.mvlgamma(x, 3), x, ops={"aten.lgamma"})
    torch._dynamo.reset()
    s = torch.tensor([[1.0, 2.0, 3.5, 0.5, 4.0], [2.0, 2.0, 6.0, 3.0, float("nan")]])
    q = torch.tensor([[1.5, -2.5, 0.25, 3.0, 1.0], [-80.5, -3.0, 1e4, float("inf"), 2.0]])
    _check(lambda s, q: torch.special.zeta(s, q) + torch.special.zeta(s, 2.0), s, q,
           ops={"aten.special_zeta"}, grad=False)
