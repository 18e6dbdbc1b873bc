"""The direct training path (``hologram_torch.direct_autograd``): which graphs take it,
which fall back to AOT autograd's runtime, and that both give eager PyTorch's
outputs, gradients and requires_grad flags."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from hologram_torch import compile_backend as cb  # noqa: E402
from hologram_torch import direct_autograd  # noqa: E402

ATOL, RTOL = 2e-5, 1e-4


@pytest.fixture
def paths(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records, per graph the backend compiles, 'direct' or 'aot'. Dynamo starts afresh:
    after earlier tests compiled the same nn code at other shapes, its automatic
    dynamic shapes would make these graphs symbolic (and send them to AOT)."""
    torch._dynamo.reset()
    seen: list[str] = []
    real = cb.compile_training

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        seen.append("aot" if out is None else "direct")
        return out

    monkeypatch.setattr(cb, "compile_training", spy)
    return seen


def _mlp() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 5))


@pytest.mark.parametrize("mode", ["direct", "aot"])
def test_training_step_matches_eager_on_both_paths(mode: str, paths: list[str]) -> None:
    model = _mlp()
    twin = copy.deepcopy(model)
    x, y = torch.randn(16, 12), torch.randint(0, 5, (16,))
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    compiled = torch.compile(twin, backend="hologram", options={"autograd": mode})
    for _ in range(2):  # the second call reuses the compiled pair
        twin.zero_grad()
        got = nn.functional.cross_entropy(compiled(x), y)
        got.backward()
    torch.testing.assert_close(got, loss, atol=ATOL, rtol=RTOL)
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, atol=ATOL, rtol=RTOL)
    assert paths == (["direct"] if mode == "direct" else [])


def test_input_mutation_falls_back_to_aot(paths: list[str]) -> None:
    def fn(w, buf):
        buf.add_(1.0)  # mutates an input: only AOT's runtime replays that
        return (w * buf).sum()

    w = torch.randn(8, requires_grad=True)
    buf, buf2 = torch.zeros(8), torch.zeros(8)
    w2 = w.detach().clone().requires_grad_()
    ref = fn(w, buf)
    ref.backward()
    got = torch.compile(fn, backend="hologram")(w2, buf2)
    got.backward()
    torch.testing.assert_close(got, ref)
    torch.testing.assert_close(w2.grad, w.grad)
    torch.testing.assert_close(buf2, buf)
    assert paths == ["aot"]


def test_outputs_keep_eager_requires_grad(paths: list[str]) -> None:
    """An output computed only from inputs without grad is not differentiable in eager;
    the direct path marks it so, instead of every output requiring grad."""

    def fn(w, x):
        return (x @ w).tanh().sum(), x * 2.0

    w = torch.randn(4, 3, requires_grad=True)
    x = torch.randn(5, 4)
    loss, side = torch.compile(fn, backend="hologram")(w, x)
    assert loss.requires_grad and not side.requires_grad
    torch.testing.assert_close(side, x * 2.0)
    loss.backward()
    torch.testing.assert_close(w.grad, (1 - torch.tanh(x @ w) ** 2).T.matmul(x).T)
    assert paths == ["direct"]


def test_unused_output_gets_zero_gradient(paths: list[str]) -> None:
    """Backward through one of two outputs: the other's gradient is materialised as zeros."""

    def fn(w):
        return (w * 3.0).sum(), (w * w).sum()

    w = torch.randn(6, requires_grad=True)
    a, _ = torch.compile(fn, backend="hologram")(w)
    a.backward()
    torch.testing.assert_close(w.grad, torch.full((6,), 3.0))
    assert paths == ["direct"]


def test_integer_output_falls_back(paths: list[str]) -> None:
    def fn(w):
        return (w * w).sum(), (w > 0).sum()

    w = torch.randn(6, requires_grad=True)
    s, n = torch.compile(fn, backend="hologram")(w)
    s.backward()
    assert int(n) == int((w > 0).sum())
    torch.testing.assert_close(w.grad, 2 * w.detach())
    assert paths == ["aot"]


def test_symbolic_shapes_fall_back(paths: list[str]) -> None:
    """A graph dynamo made dynamic (here: a second batch size) runs through AOT."""
    model = _mlp()
    compiled = torch.compile(model, backend="hologram")
    for batch in (16, 9):
        x = torch.randn(batch, 12)
        model.zero_grad()
        compiled(x).sum().backward()
        got = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        model(x).sum().backward()
        for g, p in zip(got, model.parameters(), strict=True):
            torch.testing.assert_close(g, p.grad, atol=ATOL, rtol=RTOL)
    assert paths == ["direct", "aot"]


def test_eligibility() -> None:
    w = torch.randn(3, requires_grad=True)
    assert direct_autograd.eligible([w, torch.randn(3)])
    assert not direct_autograd.eligible([torch.randn(3)])  # nothing to differentiate
    assert not direct_autograd.eligible([w, 2])  # a non-tensor input
    with torch.no_grad():
        assert not direct_autograd.eligible([w])


def test_bad_autograd_option() -> None:
    f = torch.compile(lambda x: x * 2, backend="hologram", options={"autograd": "fast"})
    with pytest.raises(Exception, match="autograd must be 'direct' or 'aot'"):
        f(torch.randn(3, requires_grad=True))


@pytest.fixture
def plans(monkeypatch: pytest.MonkeyPatch) -> list[cb._Plan]:
    """Every plan the backend builds, forward first."""
    seen: list[cb._Plan] = []
    real = cb._Plan.__init__

    def spy(self, *args, **kwargs):
        real(self, *args, **kwargs)
        seen.append(self)

    monkeypatch.setattr(cb._Plan, "__init__", spy)
    return seen


def test_saved_views_are_recomputed_in_backward(paths: list[str], plans: list) -> None:
    """AOT's partitioner saves t(weight) and detach(relu); the direct path saves the
    weight and relu and lets the backward program take the views, so the forward runs
    its one program and no PyTorch steps, with eager's gradients."""
    model = _mlp()
    twin = copy.deepcopy(model)
    x, y = torch.randn(16, 12), torch.randint(0, 5, (16,))
    nn.functional.cross_entropy(model(x), y).backward()
    compiled = torch.compile(twin, backend="hologram")
    for _ in range(2):
        twin.zero_grad()
        nn.functional.cross_entropy(compiled(x), y).backward()
    assert paths == ["direct"]
    forward, backward = (p for p in plans if p.kind in ("forward", "backward"))
    assert [kind for kind, _ in forward.steps] == ["region"]
    assert [kind for kind, _ in backward.steps] == ["region"]
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, atol=ATOL, rtol=RTOL)


def test_view_pass_on_chains_and_outputs() -> None:
    """Views of a user output and a view of a view, through the whole backend: the
    edited graphs give eager's outputs and gradients."""
    def fn(w, x):
        h = torch.tanh(x @ w)      # user output and base of views
        v = h.t()                  # a view whose base is an output
        return h, (v.detach().t() * h).sum()

    w = torch.randn(6, 6, requires_grad=True)
    x = torch.randn(4, 6)
    w2 = w.detach().clone().requires_grad_()
    h, s = fn(w, x)
    (h.sum() + s).backward()
    torch._dynamo.reset()
    got_h, got_s = torch.compile(fn, backend="hologram")(w2, x)
    (got_h.sum() + got_s).backward()
    torch.testing.assert_close(got_h, h, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(got_s, s, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(w2.grad, w.grad, atol=ATOL, rtol=RTOL)


def test_view_pass_edits_graphs_consistently() -> None:
    """On a hand-made pair: the moved view's base is saved in its place, the backward
    gets the view op, and a saved view of a moved view stays saved."""
    import torch.fx as fx

    fw, bw = fx.Graph(), fx.Graph()
    a = fw.placeholder("a")
    a.meta["val"] = torch.empty(3, 2)
    t = fw.call_function(torch.ops.aten.t.default, (a,))
    tt = fw.call_function(torch.ops.aten.t.default, (t,))  # view of a moved view: stays
    out = fw.call_function(torch.ops.aten.relu.default, (a,))
    # A view of an intermediate that is not saved stays: moving it would make the
    # forward save (materialise) the intermediate.
    ot = fw.call_function(torch.ops.aten.t.default, (out,))
    for n, shape in ((t, (2, 3)), (tt, (3, 2)), (out, (3, 2)), (ot, (2, 3))):
        n.meta["val"] = torch.empty(shape)
    fw.output((out, t, tt, ot))
    pt, ptt, pot, g = (bw.placeholder(n) for n in ("t", "tt", "ot", "g"))
    for n, shape in ((pt, (2, 3)), (ptt, (3, 2)), (pot, (2, 3)), (g, (3, 2))):
        n.meta["val"] = torch.empty(shape)
    s = bw.call_function(torch.ops.aten.add.Tensor, (bw.call_function(
        torch.ops.aten.t.default, (pt,)), ptt))
    s = bw.call_function(torch.ops.aten.add.Tensor, (s, bw.call_function(
        torch.ops.aten.t.default, (pot,))))
    bw.output((bw.call_function(torch.ops.aten.mul.Tensor, (s, g)),))
    fw_gm, bw_gm = fx.GraphModule({}, fw), fx.GraphModule({}, bw)
    assert direct_autograd._views_to_backward(fw_gm, bw_gm, n_out=1) == 1
    outs = fw_gm.graph.output_node().args[0]
    assert outs == (out, tt, ot, a)  # t moved: its base a is saved in its place
    names = [n.name for n in bw_gm.graph.find_nodes(op="placeholder")]
    assert names == ["tt", "ot", "a_base", "g"]
    av, gv = torch.randn(3, 2), torch.randn(3, 2)
    ref = (av.t().t() + av.t().t() + av.relu()) * gv
    fw_res = fw_gm(av)
    torch.testing.assert_close(bw_gm(*fw_res[1:], gv)[0], ref)


def test_arg_reader_rebuilds_structures() -> None:
    import torch.fx as fx

    g = fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    structure = (a, [a, 2, (b, None)], {"k": b, "n": 1.5}, slice(None, a, 2), "s")
    env = {a: 10, b: 20}
    got = cb._arg_reader(structure)(env)
    assert got == (10, [10, 2, (20, None)], {"k": 20, "n": 1.5}, slice(None, 10, 2), "s")
    assert type(got[1]) is list and type(got[1][2]) is tuple
    assert cb._arg_reader([a, b])(env) == [10, 20]
    assert cb._arg_reader(a)(env) == 10
