"""Pairwise distances and bilinear products under ``torch.compile(backend="hologram")``:
cdist and pdist for p = 0, 1, 1.5, 2, 3 and inf (forward and backward, ATen's per-p
gradient formulas, equal rows where the distance is 0), F.bilinear (_trilinear) and
addbmm, against eager on random, non-contiguous and empty inputs."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from .test_torch_index import _check, _randn  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_dynamo")

PS = [0.0, 1.0, 1.5, 2.0, 3.0, float("inf")]


@pytest.mark.parametrize("p", PS)
def test_cdist(p):
    x1 = _randn(2, 4, 3, seed=1)
    x2 = _randn(2, 5, 3, seed=2)
    x2[0, 1] = x1[0, 2]  # a zero distance: ATen's gradient is 0 there
    _check(lambda a, b: torch.cdist(a, b, p=p) * 1.5, x1, x2,
           ops={"aten._cdist_forward"} | ({"aten._cdist_backward"} if p else set()))


def test_cdist_broadcast_strided_and_empty():
    a = _randn(3, 1, 6, 4, seed=3).transpose(-1, -2)  # [3, 1, 4, 6], strided
    b = _randn(2, 7, 6, seed=4)
    _check(lambda a, b: torch.cdist(a, b), a, b, ops={"aten._cdist_forward"})
    torch._dynamo.reset()
    _check(lambda a, b: torch.cdist(a, b) + 1.0, _randn(4, 0, seed=5), _randn(3, 0, seed=6),
           ops=set(), grad=False)


@pytest.mark.parametrize("p", PS)
def test_pdist(p):
    x = _randn(6, 4, seed=7)
    x[4] = x[1]  # two equal rows
    _check(lambda x: torch.nn.functional.pdist(x, p=p).exp(), x,
           ops={"aten._pdist_forward"} | ({"aten._pdist_backward"} if p else set()))


def test_bilinear_and_addbmm():
    x1, x2 = _randn(5, 3, seed=8), _randn(5, 4, seed=9)
    w, bias = _randn(2, 3, 4, seed=10), _randn(2, seed=11)
    _check(lambda x1, x2, w, bias: torch.nn.functional.bilinear(x1, x2, w, bias), x1, x2, w,
           bias, ops={"aten._trilinear"})
    torch._dynamo.reset()
    m, b1, b2 = _randn(3, 5, seed=12), _randn(4, 3, 2, seed=13), _randn(4, 2, 5, seed=14)
    _check(lambda m, b1, b2: torch.addbmm(m, b1, b2, beta=0.5, alpha=-2.0), m, b1, b2,
           ops={"aten.addbmm"})
