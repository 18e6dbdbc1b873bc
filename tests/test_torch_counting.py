"""Counting ops under ``torch.compile(backend="hologram")``: searchsorted, bucketize,
histc, histogram, nonzero_static and segment_reduce (with its backward), against eager
on inputs with NaN, +-inf, values on bin edges and outside the range, empty and
non-contiguous tensors, each inside a hologram program (no PyTorch fallback)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from .test_torch_index import _check, _randint, _randn  # noqa: E402
from .test_torch_scatter_reduce import _specials  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_dynamo")

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("right", [False, True])
def test_searchsorted_and_bucketize(right):
    edges = torch.tensor([-1.0, 0.0, 0.0, 0.5, 2.0])
    x = torch.tensor([[-2.0, -1.0, 0.0, 0.25], [0.5, 2.0, 3.0, NAN], [INF, -INF, -0.0, 1.0]])
    rows = torch.sort(_randn(3, 6, seed=1), dim=1).values  # one set of edges per row
    perm = torch.argsort(_randn(5, seed=2))
    shuffled = torch.tensor([-0.2, 0.0, 0.3, 1.0, 1.5])[perm]  # shuffled[sorter] is sorted
    sorter = torch.argsort(perm)
    _check(lambda x: torch.searchsorted(edges, x, right=right)
           + torch.bucketize(x, edges, right=right)
           + torch.searchsorted(rows, x.t().contiguous().t().repeat(1, 2), right=right)[:, :4]
           + torch.searchsorted(shuffled, x, sorter=sorter, side="right" if right else "left")
           + torch.searchsorted(edges, 0.0, right=right, out_int32=True),
           x, ops={"aten.searchsorted", "aten.bucketize"}, grad=False)


def test_histc():
    x = torch.cat([_specials(_randn(40, seed=3) * 4, 4), torch.tensor([-3.0, 3.0, 1.5])])
    _check(lambda x: torch.histc(x, bins=7, min=-3, max=3) + torch.histc(x.reshape(43, 1).t(),
           bins=1, min=0, max=10) + torch.histc(x[:0], bins=7, min=-3, max=3), x,
           ops={"aten.histc"}, grad=False)


@pytest.mark.parametrize("density", [False, True])
def test_histogram_with_edges(density):
    x = _specials(_randn(5, 6, seed=5), 6)
    x[0, 0], x[0, 1] = -1.0, 1.5  # on the first and the last edge
    edges = torch.tensor([-1.0, -0.2, 0.0, 0.7, 1.5])
    w = _randn(5, 6, seed=7).abs()

    def fn(x, w):
        h, e = torch.histogram(x, edges, weight=w, density=density)
        return h.sum() * 0 + h, e

    eager, compiled = fn(x, w), torch.compile(fn, backend="hologram", dynamic=False)(x, w)
    for g, want in zip(compiled, eager, strict=True):
        torch.testing.assert_close(g, want, equal_nan=True)


@pytest.mark.parametrize("size", [0, 3, 9])
def test_nonzero_static(size):
    x = _randn(3, 4, seed=8)
    x[x.abs() < 0.5] = 0.0
    x[1, 2] = NAN  # NaN is not zero
    _check(lambda x: torch.nonzero_static(x, size=size, fill_value=-3)
           + torch.nonzero_static(x.t(), size=size)
           + torch.nonzero_static(torch.zeros(2, 2), size=size), x,
           ops={"aten.nonzero_static"}, grad=False)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
@pytest.mark.parametrize("initial", [None, 1.5])
def test_segment_reduce_forward_and_backward(reduce, initial):
    data = _randn(7, 3, seed=9)
    data[2, 1] = 0.0  # prod's backward: a zero in a segment
    lengths = torch.tensor([2, 0, 3, 1])  # an empty segment; one position in none
    kw = {"initial": initial} if initial is not None else {}
    _check(lambda x: torch.segment_reduce(x, reduce, lengths=lengths, unsafe=True, **kw)
           * 2.0, data, ops={"aten.segment_reduce", "aten._segment_reduce_backward"})
    torch._dynamo.reset()
    offsets = torch.tensor([[0, 1, 1, 4], [0, 2, 2, 3]])  # per row, along axis 1
    x = _specials(_randn(2, 5, seed=10), 11)
    _check(lambda x: torch.segment_reduce(x, reduce, offsets=offsets, axis=1, unsafe=True,
                                          **kw), x, ops={"aten.segment_reduce"}, grad=False)


def test_segment_reduce_ties_share_the_gradient():
    data = torch.tensor([2.0, 5.0, 5.0, 1.0, 1.0, 1.0])
    lengths = torch.tensor([3, 3])
    _check(lambda x: torch.segment_reduce(x, "max", lengths=lengths)
           + torch.segment_reduce(x, "min", lengths=lengths), data,
           ops={"aten._segment_reduce_backward"})


def test_bucketize_of_integers():
    x = _randint(10, 4, 5, low=-10, seed=12)
    b = torch.tensor([-5, 0, 0, 3])
    _check(lambda x: torch.bucketize(x, b) * 2, x, ops={"aten.bucketize"}, grad=False)
