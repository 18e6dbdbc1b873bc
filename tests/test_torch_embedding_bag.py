"""``F.embedding_bag`` in hologram programs, forward and backward: rows GATHERed and
reduced into their bags (``hologram_torch/autograd_decompositions.py``), whose backward
is a SCATTER_ADD at the rows; ATen's ``_embedding_bag`` has no translation."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import hologram_torch  # noqa: E402,F401  (registers backend="hologram")
from hologram_torch.compile_backend import collect_graphs  # noqa: E402

F = torch.nn.functional

IDX = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 0, 0, 7])
OFFSETS = torch.tensor([0, 3, 3, 8])  # the second bag is empty

CASES = {
    "sum": {"mode": "sum"},
    "mean": {"mode": "mean"},
    "max": {"mode": "max"},
    "sum, per-sample weights": {"mode": "sum", "psw": True},
    "mean, padding_idx": {"mode": "mean", "padding_idx": 4},
    "max, padding_idx": {"mode": "max", "padding_idx": 0},
    "sum, include_last_offset": {"mode": "sum", "include_last_offset": True},
    "mean, 2-D input": {"mode": "mean", "two_d": True},
    "max, 2-D input, negative padding_idx": {"mode": "max", "two_d": True,
                                            "padding_idx": -18},
}


@pytest.mark.parametrize("name", list(CASES))
def test_embedding_bag_forward_and_backward_in_hologram(name):
    """Eager's values and gradients (weight and per-sample weights) in float64, an
    empty bag and a bag of padding rows zeros, inf in a row; no op runs in PyTorch."""
    case = dict(CASES[name])
    two_d, psw = case.pop("two_d", False), case.pop("psw", False)
    gen = torch.Generator().manual_seed(7)
    w0 = torch.randn(20, 5, dtype=torch.float64, generator=gen)
    w0[9, 1] = float("inf")
    if two_d:
        lead: tuple = (IDX[:10].reshape(5, 2),)
    else:
        offsets = torch.cat([OFFSETS, torch.tensor([11])]) if case.get(
            "include_last_offset") else OFFSETS
        lead = (IDX, offsets)
    p0 = torch.rand(11, dtype=torch.float64, generator=gen) if psw else None

    def run(compiled: bool):
        w = w0.clone().requires_grad_()
        kw = dict(case)
        p = None
        if p0 is not None:
            p = p0.clone().requires_grad_()
            kw["per_sample_weights"] = p

        def f(w, *rest):
            return F.embedding_bag(lead[0], w, *lead[1:], **kw)

        fn = torch.compile(f, backend="hologram") if compiled else f
        y = fn(w)
        gy = torch.linspace(-1, 1, y.numel(), dtype=y.dtype).reshape(y.shape)
        grads = torch.autograd.grad(y, (w, p) if p is not None else (w,), gy)
        return y, grads

    torch._dynamo.reset()
    with collect_graphs() as graphs:
        y, grads = run(True)
    want_y, want_grads = run(False)
    assert [op for gr in graphs for op, _ in gr.torch_ops] == []
    torch.testing.assert_close(y, want_y, rtol=1e-12, atol=1e-12, equal_nan=True)
    for a, b in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, equal_nan=True)


def test_embedding_bag_bad_indices_and_offsets_raise():
    """A row past the table and offsets that do not start at 0 (eager's RuntimeError)
    raise IndexError when the program runs, not a wrong result."""
    w = torch.randn(20, 5)
    f = torch.compile(lambda i, o: F.embedding_bag(i, w, o, mode="sum"), backend="hologram")
    with pytest.raises(IndexError, match="25"):
        f(torch.tensor([1, 25, 3]), torch.tensor([0, 2]))
    torch._dynamo.reset()
    with pytest.raises(IndexError, match="-1"):
        f(torch.tensor([1, 2, 3]), torch.tensor([1, 2]))


def test_embedding_bag_forms_left_to_the_op():
    """max_norm renormalizes the weight in place: that form stays ATen's op."""
    w = torch.randn(20, 5)
    torch._dynamo.reset()
    with collect_graphs() as graphs:
        got = torch.compile(lambda i, o: F.embedding_bag(i, w.clone(), o, max_norm=1.0),
                            backend="hologram")(IDX, OFFSETS)
    assert torch.allclose(got, F.embedding_bag(IDX, w.clone(), OFFSETS, max_norm=1.0))
    assert "aten.embedding_renorm" in {op for gr in graphs for op, _ in gr.torch_ops}
