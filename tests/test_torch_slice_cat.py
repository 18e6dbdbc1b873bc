"""split, chunk, slice, narrow and cat under ``torch.compile(backend="hologram")``: the
ISA's SLICE and CONCAT, forward and backward against eager, with no PyTorch fallback
(a fused-qkv transformer block is one program per graph)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from hologram_torch import compile_backend as cb  # noqa: E402
from hologram_torch.explain import explain  # noqa: E402

from .test_torch_compile import ATOL, RTOL, _check_train_step, _no_fallback  # noqa: E402


class FusedQKVBlock(nn.Module):
    """The benchmark's block: one qkv Linear split into q, k, v (forward: aten.split;
    backward: aten.cat of their gradients)."""

    def __init__(self, d: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.d, self.heads = d, heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        hd = d // self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, hd).transpose(1, 2) for z in (q, k, v))
        att = torch.softmax(q @ k.transpose(-1, -2) / hd ** 0.5, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def test_fused_qkv_block_is_one_program_per_graph():
    torch.manual_seed(4)
    x = torch.randn(2, 5, 16)
    graphs = _check_train_step(FusedQKVBlock(), lambda m, x: (m(x) ** 2).mean(), x)
    _no_fallback(graphs)
    assert {g.kind for g in graphs} == {"forward", "backward"}
    assert all(len(g.regions) == 1 for g in graphs)
    ops = set().union(*(g.hologram_ops for g in graphs))
    assert {"aten.split", "aten.cat"} <= ops
    text = str(explain(lambda x: FusedQKVBlock()(x).sum(), x))
    assert text.count("1 program(s), 0 in PyTorch") == 2, text


class Pieces(nn.Module):
    """One way of taking a tensor apart and putting it back, between two Linears."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.a, self.b = nn.Linear(6, 12), nn.Linear(12, 5)

    def forward(self, x):
        h = self.a(x)
        how = self.how
        if how == "split":
            p, q, r = h.split(5, dim=1)  # 5, 5, 2: the last piece is shorter
            h = torch.cat([r.exp(), p * q, p], dim=1) @ torch.ones(12, 12)
        elif how == "split_with_sizes":
            p, q = h.split([3, 9], dim=-1)
            h = torch.cat([q.tanh(), p.sigmoid()], dim=-1)
        elif how == "chunk":
            p, q, r = h.chunk(3, dim=1)
            h = torch.cat([r, q.relu(), p], 1)
        elif how == "slice":
            h = torch.cat([h[:, 2:7].exp(), h[:, -5:], h[:, :2]], dim=1)
        elif how == "slice_rows":
            h = torch.cat([h[1:], h[:1] * 3.0], dim=0)
        elif how == "narrow":
            h = torch.cat([h.narrow(1, 4, 8), h.narrow(-1, -4, 4).square()], 1)
        elif how == "cat_rows_of_sums":
            h = torch.cat([h, h.sum(0, keepdim=True), h.amax(0, keepdim=True)], 0)
            h = h[1:-1]
        elif how == "unbind_like":
            h = torch.cat([h[:, i:i + 1] * float(i) for i in range(12)], dim=1)
        return self.b(h)


@pytest.mark.parametrize("how", ["split", "split_with_sizes", "chunk", "slice", "slice_rows",
                                 "narrow", "cat_rows_of_sums", "unbind_like"])
def test_pieces_forward_backward_match_without_fallback(how):
    torch.manual_seed(5)
    graphs = _check_train_step(Pieces(how), lambda m, x: (m(x) * m(x).detach()).sum(),
                               torch.randn(4, 6))
    _no_fallback(graphs)


def test_cat_promotes_dtypes_and_skips_legacy_empty():
    def fn(x, y, n):
        return torch.cat([x, y.double(), torch.zeros(0)]), torch.cat([x > 0, n > 1], 0)

    x, y, n = torch.randn(3, 2), torch.randn(1, 2), torch.arange(4).reshape(2, 2)
    with cb.collect_graphs() as graphs:
        got = torch.compile(fn, backend="hologram")(x, y, n)
    for g, w in zip(got, fn(x, y, n), strict=True):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w)
    _no_fallback(graphs)


def test_strided_slice_is_a_gather_and_its_backward_a_scatter():
    """The ISA's SLICE has step 1: a step-2 slice reads at 2k (GATHER), its gradient is
    written at 2k (SCATTER into zeros), both inside the programs."""
    def fn(x):
        return (x.exp()[:, 1::2] + 1.0).sum(1) + x[::3, -5::2].sum()

    x = torch.randn(7, 8, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    ref = fn(x)
    ref.sum().backward()
    with cb.collect_graphs() as graphs:
        got = torch.compile(fn, backend="hologram")(x2)
        got.sum().backward()
    torch.testing.assert_close(got, ref, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(x2.grad, x.grad, atol=ATOL, rtol=RTOL)
    _no_fallback(graphs)
    ops = set().union(*(g.hologram_ops for g in graphs))
    assert {"aten.slice", "aten.slice_backward"} <= ops
    text = "".join(r.program_text for g in graphs for r in g.regions)
    assert "gather" in text and "scatter" in text
