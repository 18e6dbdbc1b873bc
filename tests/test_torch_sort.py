"""sort, argsort, topk, kthvalue, median, nanmedian and quantile under
``torch.compile(backend="hologram")``: the ISA's ARGSORT and GATHER, forward and backward
against eager on random inputs with NaN, +-inf, -0.0 and ties (stable sort keeps them in
order, as PyTorch's stable sort), non-contiguous and empty inputs, each inside a
hologram program (no PyTorch fallback)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from .test_torch_index import _check, _randn  # noqa: E402
from .test_torch_scatter_reduce import _specials  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _ties(seed: int, *shape: int) -> torch.Tensor:
    """Few distinct values (many ties), NaN, inf and -0.0 beside 0.0."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-2, 3, shape, generator=g).float()
    x[torch.rand(shape, generator=g) < 0.15] = float("nan")
    x[torch.rand(shape, generator=g) < 0.1] = float("inf")
    x[torch.rand(shape, generator=g) < 0.1] = -0.0
    return x


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("descending", [False, True])
def test_stable_sort_with_ties_nan_and_signed_zeros(dim, descending):
    x = _ties(dim + 3 * descending + 10, 6, 7, 5)

    def fn(x):
        v, i = torch.sort(x, dim=dim, descending=descending, stable=True)
        return v * 2.0 + i

    _check(fn, x, ops={"aten.sort"}, grad=False)


@pytest.mark.parametrize("dim", [0, 2])
def test_sort_and_argsort_backward_on_strided_input(dim):
    x = _randn(5, 4, 6, seed=1).transpose(0, 2)  # non-contiguous
    _check(lambda x: torch.sort(x, dim=dim, descending=True).values.exp()
           + torch.argsort(x, dim=dim).float(), x, ops={"aten.sort"})


def test_sort_of_scalars_and_empty_tensors():
    for x in (torch.tensor(2.5), torch.zeros(0, 3), torch.ones(1, 4)):
        torch._dynamo.reset()
        _check(lambda x: torch.sort(x, dim=-1)[0] + torch.sort(x, dim=0, descending=True)[1],
               x, ops=set(), grad=False)


@pytest.mark.parametrize("largest", [True, False])
def test_topk(largest):
    x = _specials(_randn(4, 9, 3, seed=2), 3)
    _check(lambda x: torch.topk(x, 3, dim=1, largest=largest).values.sum(-1), x,
           ops={"aten.topk"}, grad=False)
    torch._dynamo.reset()
    y = _randn(4, 9, seed=4)
    _check(lambda y: torch.topk(y, 4, largest=largest).values * 3.0
           + torch.topk(y, 2, dim=0, largest=largest).indices.sum(), y, ops={"aten.topk"})


@pytest.mark.parametrize("keepdim", [False, True])
def test_kthvalue(keepdim):
    x = _randn(5, 7, seed=5).t()
    _check(lambda x: torch.kthvalue(x, 3, dim=0, keepdim=keepdim).values.sin()
           + torch.kthvalue(x, 1, dim=1, keepdim=keepdim).indices.sum(), x,
           ops={"aten.kthvalue"})


@pytest.mark.parametrize("op", ["median", "nanmedian"])
def test_median_and_nanmedian_with_nan_rows(op):
    x = _randn(6, 8, seed=6)
    x[1, 3] = float("nan")  # median: the row's value is NaN, its index the first NaN's
    x[1, 6] = float("nan")
    x[4, :] = float("nan")  # every value NaN
    x[5, :5] = float("nan")  # nanmedian: the middle of the other three
    fn = getattr(torch, op)

    def f(x):
        v, i = fn(x, dim=1)
        w, j = fn(x, dim=0, keepdim=True)
        return v.sum() + i.sum() + w.sum() + j.sum() + fn(x) + fn(x[2:4])

    _check(f, x, ops={f"aten.{op}"}, grad=False)


@pytest.mark.parametrize("op", ["median", "nanmedian"])
def test_median_backward(op):
    x = _randn(5, 9, seed=7)  # distinct values: each median is one element
    _check(lambda x: getattr(torch, op)(x, dim=1).values * 2.0 + getattr(torch, op)(x), x,
           ops={f"aten.{op}"})


def test_quantile_through_sort():
    x = _randn(4, 10, seed=8)
    q = torch.tensor([0.1, 0.5, 0.93])
    _check(lambda x: torch.quantile(x, q, dim=1, interpolation="linear")
           + torch.nanquantile(x, 0.25, dim=1), x, ops={"aten.sort"})
