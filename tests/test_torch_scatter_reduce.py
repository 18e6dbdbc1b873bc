"""scatter_reduce, index_reduce, put and take under ``torch.compile(backend="hologram")``:
the ISA's SCATTER_ADD/MUL/MAX/MIN with ATen's include_self and mean rules, forward and
backward against eager on random inputs with duplicates, NaN and inf, non-contiguous
inputs and empty indices, each inside a hologram program (no PyTorch fallback)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from .test_torch_index import _check, _randint, _randn  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_dynamo")

REDUCES = ["sum", "prod", "mean", "amax", "amin"]


def _specials(x: torch.Tensor, seed: int) -> torch.Tensor:
    """``x`` with a few NaN and +-inf (and one -0.0) in fixed random places."""
    g = torch.Generator().manual_seed(seed)
    x = x.clone()
    pick = torch.rand(x.shape, generator=g)
    x[pick < 0.06] = float("nan")
    x[(pick >= 0.06) & (pick < 0.1)] = float("inf")
    x[(pick >= 0.1) & (pick < 0.13)] = float("-inf")
    x.view(-1)[0] = -0.0
    return x


@pytest.mark.parametrize("reduce", REDUCES)
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dim", [0, 1])
def test_scatter_reduce_forward_and_backward(reduce, include_self, dim):
    x = _randn(5, 6, seed=1)
    src = _randn(4, 5, seed=2)
    idx = _randint(x.shape[dim], 4, 5, seed=3 + dim)  # duplicates along dim
    _check(lambda x, s: x.scatter_reduce(dim, idx, s, reduce, include_self=include_self)
           * 1.5, x, src, ops={"aten.scatter_reduce"})
    torch._dynamo.reset()
    big = _randn(7, 8, seed=2)  # larger than the index: torch reads it where the index is
    _check(lambda x, s: x.scatter_reduce(dim, idx, s, reduce, include_self=include_self),
           x, big, ops={"aten.scatter_reduce"}, grad=False)  # (eager's backward rejects it)


@pytest.mark.parametrize("reduce", REDUCES)
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_nan_inf_and_strided_input(reduce, include_self):
    x = _specials(_randn(6, 5, seed=4), 5).t()  # [5, 6], non-contiguous
    src = _specials(_randn(5, 4, seed=6), 7)
    idx = _randint(6, 5, 4, seed=8)
    _check(lambda x, s: x.scatter_reduce(1, idx, s, reduce, include_self=include_self),
           x, src, ops={"aten.scatter_reduce"}, grad=False)


@pytest.mark.parametrize("reduce", REDUCES)
def test_scatter_reduce_integers_and_empty_index(reduce):
    x = _randint(50, 4, 5, low=-50, seed=9)
    src = _randint(50, 4, 5, low=-50, seed=10)
    idx = _randint(4, 3, 5, seed=11)
    # integer mean is floor division (ATen's), and the int64 values ride as f64
    _check(lambda x, s: x.scatter_reduce(0, idx, s, reduce, include_self=False) * 2, x, src,
           ops={"aten.scatter_reduce"}, grad=False)
    torch._dynamo.reset()
    empty = torch.zeros(0, 5, dtype=torch.long)
    _check(lambda x: x.scatter_reduce(0, empty, x[:0], reduce) + 1, _randn(3, 5, seed=12),
           ops=set(), grad=False)


@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_index_reduce(reduce, include_self):
    x = _randn(6, 4, seed=13)
    src = _specials(_randn(5, 4, seed=14), 15)
    idx = torch.tensor([0, 5, 5, 2, 0])
    _check(lambda x, s: x.index_reduce(0, idx, s, reduce, include_self=include_self) + x,
           x, src, ops={"aten.index_reduce"}, grad=False)
    torch._dynamo.reset()
    _check(lambda x, s: x.index_reduce(1, torch.tensor([3, 3, 0]), s[:3].t()[:, :3], reduce,
                                       include_self=include_self), _randn(5, 4, seed=16),
           _randn(6, 5, seed=17), ops={"aten.index_reduce"})


@pytest.mark.parametrize("accumulate", [False, True])
def test_put_and_take(accumulate):
    x = _randn(4, 5, seed=18)
    v = _randn(6, seed=19)
    # negative indices count from the end; duplicates only where they accumulate
    idx = torch.tensor([3, -1, 7, 19, -20, 0]) if not accumulate else \
        torch.tensor([3, 3, -1, 19, 0, 0])
    _check(lambda x, v: x.put(idx, v * 2.0, accumulate=accumulate).take(
        torch.tensor([[0, -1], [7, 3]])), x, v, ops={"aten.put", "aten.index"})


def test_put_out_of_range_is_an_index_error():
    f = torch.compile(lambda x, i: x.put(i, torch.ones(2)), backend="hologram", dynamic=False)
    with pytest.raises(IndexError, match="out of range"):
        f(torch.zeros(3, 2), torch.tensor([1, 6]))
