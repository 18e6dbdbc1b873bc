"""Indexing ATen ops under ``torch.compile(backend="hologram")``: embedding, advanced
indexing, index_select, gather, select, take_along_dim, flip, scatter(_add), index_put,
index_add, slice/select_scatter, arange, cumsum and cumprod, forward and backward
against eager on random inputs (duplicates, negative indices where PyTorch allows them,
empty index tensors, non-contiguous inputs), each inside a hologram program (no
PyTorch fallback), and out-of-range indices raising IndexError."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from hologram_torch import compile_backend as cb  # noqa: E402

ATOL, RTOL = 1e-5, 1e-5


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _leaves(args, grad: bool):
    """Fresh copies of the arguments; with ``grad`` float tensors require grad (leaves)."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            a = a.detach().clone()
            if grad and a.dtype.is_floating_point:
                a.requires_grad_(True)
        out.append(a)
    return out


def _check(fn, *args, ops: set[str], grad: bool = True, seed: int = 0):
    """``fn`` eager and compiled on the same inputs: results equal, gradients of every
    float input equal (through a random cotangent), the ``ops`` inside a program and
    nothing in PyTorch. Returns the graphs' summaries."""
    eager_args, comp_args = _leaves(args, grad), _leaves(args, grad)
    want = fn(*eager_args)
    compiled = torch.compile(fn, backend="hologram", dynamic=False)
    with cb.collect_graphs() as graphs:
        got = compiled(*comp_args)
        if want.requires_grad:
            w = torch.randn(want.shape, generator=torch.Generator().manual_seed(seed))
            (want * w).sum().backward()
            (got * w).sum().backward()
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL, equal_nan=True)
    for a, b in zip(comp_args, eager_args, strict=True):
        if isinstance(a, torch.Tensor) and a.requires_grad and b.grad is not None:
            torch.testing.assert_close(a.grad, b.grad, atol=ATOL, rtol=RTOL, equal_nan=True)
    assert graphs, "the hologram backend compiled no graph"
    for g in graphs:
        assert g.torch_ops == [], f"{g.kind} graph ran ops in PyTorch: {g.torch_ops}"
    ran = set().union(*(g.hologram_ops for g in graphs))
    assert ops <= ran, f"expected {ops} in hologram programs, ran {ran}"
    return graphs


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _randint(high, *shape, low=0, seed=0):
    return torch.randint(low, high, shape, generator=torch.Generator().manual_seed(seed))


# --- reads ---------------------------------------------------------------------------------
def test_embedding_forward_and_backward_with_duplicates():
    w = _randn(11, 6)
    i = torch.tensor([[0, 3, 3, 10], [7, 0, 3, 1], [2, 2, 2, 9]])  # repeated rows add up
    _check(lambda w, i: F.embedding(i, w) * 2.0, w, i,
           ops={"aten.embedding", "aten.embedding_dense_backward"})


@pytest.mark.parametrize("kw", [{"padding_idx": 3}, {"scale_grad_by_freq": True},
                                {"padding_idx": 0, "scale_grad_by_freq": True}])
def test_embedding_backward_options(kw):
    w = _randn(9, 5, seed=1)
    i = torch.tensor([3, 0, 3, 8, 1, 3, 0])
    _check(lambda w, i: F.embedding(i, w, **kw).tanh(), w, i,
           ops={"aten.embedding", "aten.embedding_dense_backward"})


def test_embedding_noncontiguous_and_empty_indices():
    w = _randn(10, 4, seed=2)
    i = _randint(10, 5, 3, seed=2).t()  # non-contiguous index tensor
    _check(lambda w, i: F.embedding(i, w).sum(-1), w, i, ops={"aten.embedding"})
    torch._dynamo.reset()
    _check(lambda w, i: F.embedding(i, w) + 1.0, w, torch.zeros(0, 3, dtype=torch.long),
           ops=set(), grad=False)


@pytest.mark.parametrize("case", ["single", "negative", "columns", "pair", "pair_apart",
                                  "broadcast", "middle"])
def test_advanced_indexing_forward_and_backward(case):
    x = _randn(5, 6, 7, seed=3)
    i = torch.tensor([[0, 4, 4], [1, 0, 2]])
    j = torch.tensor([6, -7, 3])  # -7 wraps to 0 on a dim of 7
    fns = {
        "single": lambda x: x[i],
        "negative": lambda x: x[torch.tensor([-1, -5, 2, -1])],
        "columns": lambda x: x[:, torch.tensor([5, -6, 1])],
        "pair": lambda x: x[i, torch.tensor([1, 5, 5])],  # adjacent: B replaces dims 0, 1
        "pair_apart": lambda x: x[i, :, j],  # not adjacent: B goes first
        "broadcast": lambda x: x[torch.tensor([[0], [4]]), torch.tensor([1, 2, 3])],
        "middle": lambda x: x[:, i, j],
    }
    _check(lambda x: fns[case](x).exp(), x, ops={"aten.index", "aten.index_put"}
           if case != "negative" else {"aten.index"})


def test_index_select_and_non_contiguous_input():
    x = _randn(6, 8, seed=4).t()  # [8, 6], strided
    idx = torch.tensor([5, 0, 5, 2])
    _check(lambda x, i: x.index_select(1, i) * x.index_select(0, i).t()[:, :4].sum(), x, idx,
           ops={"aten.index_select", "aten.index_add"})


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_gather_forward_and_backward(dim):
    x = _randn(5, 4, 3, seed=5)
    n = x.shape[dim]
    idx = _randint(n, 4, 3, 2, seed=dim)  # smaller than x off the gathered dim
    _check(lambda x: torch.gather(x, dim, idx).sin(), x, ops={"aten.gather",
                                                            "aten.scatter_add"})


def test_take_along_dim_and_flip():
    x = _randn(4, 5, seed=6)
    idx = torch.argsort(_randn(4, 5, seed=7), dim=1)
    _check(lambda x: torch.take_along_dim(x, idx, dim=1) + torch.flip(x, [0, 1]), x,
           ops={"aten.gather", "aten.flip"})


def test_select_views_and_backward():
    x = _randn(3, 4, 5, seed=8)
    _check(lambda x: x.select(1, -1) * x[2, 0] + x[:, 0, 3].sum(), x,
           ops={"aten.select", "aten.select_backward"})


# --- writes --------------------------------------------------------------------------------
def test_scatter_src_value_and_scatter_add_with_duplicates():
    x = _randn(4, 6, seed=9)
    src = _randn(5, 6, seed=10)
    perm = torch.stack([torch.randperm(6, generator=torch.Generator().manual_seed(k))[:3]
                        for k in range(4)])  # scatter (set): no duplicates (PyTorch's rule)
    dup = torch.tensor([[0, 5, 5, 0], [2, 2, 2, 1], [3, 0, 3, 0]])  # scatter_add: duplicates
    _check(lambda x, s: (x.scatter(1, perm, s[:4, :3] * 2.0), x.scatter(1, perm, -1.5),
                         x.scatter_add(1, dup, s[:3, :4]))[0].sum(0) +
           x.scatter(1, perm, -1.5).sum(0) + x.scatter_add(1, dup, s[:3, :4]).sum(0), x, src,
           ops={"aten.scatter", "aten.scatter_add"})


@pytest.mark.filterwarnings("ignore:The reduce argument of torch.scatter")
def test_scatter_reduce_add_form():
    x, s = _randn(3, 4, seed=11), _randn(3, 4, seed=12)
    idx = torch.tensor([[1, 1, 0, 1], [2, 0, 0, 2]])
    _check(lambda x, s: x.scatter(0, idx, s, reduce="add"), x, s, ops={"aten.scatter"},
           grad=False)


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put(accumulate):
    x, v = _randn(6, 3, 4, seed=13), _randn(2, 3, 4, seed=14)
    rows = torch.tensor([4, -1]) if not accumulate else torch.tensor([4, 4])  # dup: +=

    def fn(x, v):
        y = x.index_put((rows,), v * 3.0, accumulate=accumulate)
        return y.index_put((torch.tensor([0, -6]), torch.tensor([2, 2])),
                           torch.full((2, 1), 7.0), accumulate=accumulate)

    _check(fn, x, v, ops={"aten.index_put"})


def test_index_put_bool_mask_and_setitem():
    x = _randn(5, 3, seed=15)

    def fn(x):
        y = x.clone()
        y[y > 0.5] = 0.0
        y[torch.tensor([1, 3, -1])] += 1.0
        return y

    _check(fn, x, ops={"aten.index_put"})


def test_index_add_with_duplicates_and_alpha():
    x, s = _randn(5, 4, seed=16), _randn(5, 6, seed=17)
    idx = torch.tensor([0, 3, 3, 3, 1, 0])
    _check(lambda x, s: x.index_add(1, idx, s[:, :6], alpha=-0.5), x, s,
           ops={"aten.index_add"})


@pytest.mark.parametrize("step", [1, 2])
def test_slice_and_select_scatter(step):
    x = _randn(7, 5, seed=18)
    s = _randn(7, 3 if step == 1 else 2, seed=19)
    r = _randn(5, seed=20)
    _check(lambda x, s, r: torch.select_scatter(
        torch.slice_scatter(x, s, 1, 1, 4 if step == 1 else 5, step), r, 0, -2), x, s, r,
        ops={"aten.slice_scatter", "aten.select_scatter"})


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_indexed_assignment_of_numbers_fills_in_a_program(dtype):
    """``m[a:b, c:d] = count`` in a loop, as torchvision's Swin builds its shifted-window
    mask: each number is a 0-d tensor constant and its fill is ``aten.fill.Tensor``
    (which ran in PyTorch, 45 times in Swin-T, until it was translated)."""

    def fn(x):
        m = x.new_zeros((6, 7), dtype=dtype)
        count = 0
        for h in ((0, -4), (-4, -2), (-2, None)):
            for w in ((0, -3), (-3, -1), (-1, None)):
                m[h[0]:h[1], w[0]:w[1]] = count + 0.75
                count += 1
        return x + m

    _check(fn, _randn(2, 6, 7), ops={"aten.fill", "aten.slice_scatter"}, grad=False)


# --- arange and scans ----------------------------------------------------------------------
def test_arange_forms():
    x = _randn(6, seed=21)

    def fn(x):
        a = torch.arange(6) * x
        b = torch.arange(2, 8, dtype=torch.float64).float() + x
        c = torch.arange(0.5, 3.3, 0.5) + x  # float start and step
        d = torch.arange(10, -2, -2).to(x.dtype) * x  # negative step, int
        return a + b + c + d

    _check(fn, x, ops={"aten.arange"})


def test_cumsum_cumprod_forward_and_backward():
    x = _randn(4, 5, seed=22) * 0.5 + 1.0
    _check(lambda x: x.cumsum(1) * x.cumprod(0) + x.cumsum(-1, dtype=torch.float64).float(),
           x, ops={"aten.cumsum", "aten.cumprod"})


def test_cumsum_of_integers_and_bools():
    x = _randint(50, 4, 6, low=-50, seed=23)
    _check(lambda x: x.cumsum(0) + (x > 0).cumsum(1), x, ops={"aten.cumsum"}, grad=False)


def test_empty_index_tensors():
    x = _randn(5, 4, seed=25)
    none = torch.zeros(0, dtype=torch.long)
    _check(lambda x: (x[none].sum(0) + torch.gather(x, 0, none.reshape(0, 4)).sum(0)
                      + x.scatter_add(0, none.reshape(0, 4), x[:0])[0]
                      + x.index_select(0, none).sum(0) + x.index_add(0, none, x[:0])[1]), x,
           ops=set())


def test_bool_mask_index_runs_in_pytorch_with_a_reason():
    """``x[mask]``'s size depends on the data: that node runs in PyTorch, the rest in
    hologram, and the result is eager's."""
    x = _randn(6, 3, seed=26)
    fn = torch.compile(lambda x: (x * 2.0)[x[:, 0] > 0].exp(), backend="hologram")
    with cb.collect_graphs() as graphs:
        got = fn(x)
    torch.testing.assert_close(got, (x * 2.0)[x[:, 0] > 0].exp())
    assert any(g.regions for g in graphs)


# --- errors --------------------------------------------------------------------------------
@pytest.mark.parametrize("case", ["embedding", "index", "gather", "index_put", "index_select"])
def test_out_of_range_raises_index_error(case):
    x = _randn(5, 4, seed=24)
    fns = {
        "embedding": lambda x, i: F.embedding(i, x),
        "index": lambda x, i: x[i - 11],  # -6: below -5 even after wrapping
        "gather": lambda x, i: torch.gather(x, 0, i.reshape(1, 3)),
        "index_put": lambda x, i: x.index_put((i,), torch.tensor(1.0)),
        "index_select": lambda x, i: x.index_select(0, i),
    }
    good, bad = torch.tensor([0, 2, 4]), torch.tensor([0, 7, 4])
    fn = torch.compile(fns[case], backend="hologram", dynamic=False)
    with cb.collect_graphs() as graphs:
        want = fns[case](x, good if case != "index" else good + 11)
        torch.testing.assert_close(fn(x, good if case != "index" else good + 11), want)
    assert all(g.torch_ops == [] for g in graphs), [g.torch_ops for g in graphs]
    with pytest.raises(IndexError, match="out of range"):
        fn(x, bad)
    torch.testing.assert_close(fn(x, good if case != "index" else good + 11), want)
