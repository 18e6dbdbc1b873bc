"""In-place updates of graph inputs under ``torch.compile(backend="hologram")``.

A compiled optimizer step (PyTorch's recipe: ``torch.compile(opt.step)``) updates
every parameter and every optimizer state tensor in place. AOT autograd keeps those
updates in the graph as ``copy_(input, value)``; the backend writes ``value``
straight into the input where the CPU backend proves it safe
(``Backend.may_overwrite``), and copies otherwise. Checked here: optimizer states
and parameters equal eager's after steps on the same gradients, the updates really
happen in place, and the patterns that must not go in place (a transposed read, a
non-contiguous input, a mutated input read after the update) still compute right.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from hologram_torch import compile_backend as cb  # noqa: E402

OPTIMIZERS = {
    "Adam": (torch.optim.Adam, {"lr": 1e-2}),
    "AdamW": (torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1}),
    "SGD momentum nesterov": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9,
                                                "nesterov": True}),
    "RMSprop": (torch.optim.RMSprop, {"lr": 1e-2}),
}


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(7, 16), nn.Tanh(), nn.Linear(16, 3))


def _states(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_compiled_optimizer_step_matches_eager_and_updates_in_place(name):
    cls, kw = OPTIMIZERS[name]
    torch.manual_seed(0)
    eager = _model()
    comp = _model()
    comp.load_state_dict(eager.state_dict())
    opt_e, opt_c = cls(eager.parameters(), **kw), cls(comp.parameters(), **kw)
    step = torch.compile(opt_c.step, backend="hologram")
    with cb.collect_graphs() as graphs:
        for i in range(4):
            x = torch.randn(9, 7)
            for m, opt in ((eager, opt_e), (comp, opt_c)):
                opt.zero_grad()
                m(x).square().mean().backward()
            for p, q in zip(eager.parameters(), comp.parameters(), strict=True):
                q.grad.copy_(p.grad)  # both optimizers see the same gradients
            ptrs = [p.data_ptr() for p in comp.parameters()]
            opt_e.step()
            step()
            assert [p.data_ptr() for p in comp.parameters()] == ptrs
            for p, q in zip(eager.parameters(), comp.parameters(), strict=True):
                torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6, msg=f"step {i}")
            for a, b in zip(_states(opt_e), _states(opt_c), strict=True):
                torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=f"step {i}")
    updates = [r.in_place_updates for g in graphs for r in g.regions]
    mutated = len(list(comp.parameters())) + len(_states(opt_c))
    # The steady-state graph (after the first step created the state) writes every
    # parameter and state tensor in place.
    assert max(updates) == mutated, updates
    assert not [op for g in graphs for op, _ in g.torch_ops]


def _compiled_matches(fn, *make_inputs):
    """fn compiled (no_grad) and eager on equal fresh inputs: results and the mutated
    inputs agree."""
    compiled = torch.compile(fn, backend="hologram")
    for seed in range(2):
        torch.manual_seed(seed)
        a = [m() for m in make_inputs]
        b = [t.clone() if t.is_contiguous() else t.clone().t().contiguous().t() for t in a]
        with torch.no_grad():
            want = fn(*a)
            got = compiled(*b)
        torch.testing.assert_close(got, want)
        for x, y in zip(a, b, strict=True):
            torch.testing.assert_close(y, x)


def test_transposed_update_is_copied_not_written_in_place():
    with cb.collect_graphs() as graphs:
        _compiled_matches(lambda x: x.copy_(x.t() * 2 + 1).sum(), lambda: torch.randn(33, 33))
    assert [r.in_place_updates for g in graphs for r in g.regions] == [0]


def test_update_read_after_in_the_graph():
    def fn(x, y):
        x.add_(y)
        return x * 3 - y

    _compiled_matches(fn, lambda: torch.randn(40, 17), lambda: torch.randn(40, 17))


def test_reduction_of_the_updated_input():
    def fn(x):
        x.sub_(x.mean(dim=1, keepdim=True))
        return x.abs().sum()

    _compiled_matches(fn, lambda: torch.randn(64, 50))


def test_non_contiguous_input_is_updated_through_a_copy():
    def fn(x, y):
        x.mul_(y).add_(1)
        return x.sum()

    _compiled_matches(fn, lambda: torch.randn(12, 20).t(), lambda: torch.randn(20, 12))


def test_explain_counts_in_place_updates():
    from hologram_torch.explain import explain

    def fn(x, y):
        x.mul_(0.5).add_(y)
        return x

    with torch.no_grad():
        report = explain(fn, torch.randn(30, 4), torch.randn(30, 4))
    assert "in-place updates: 1 graph inputs" in str(report)


def test_a_planned_in_place_update_copies_when_the_input_arrives_in_another_layout():
    """The region finishes its updates itself (no update step of their own): where the
    graph input it planned to write into comes with other strides than traced (which
    dynamo's guards prevent, but a graph called directly allows), the value is computed
    into a new tensor and copied into the input, as the update step did."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from hologram.interop import default_executor

    aten = torch.ops.aten

    def f(x, y):
        aten.copy_.default(x, aten.add.Tensor(aten.mul.Tensor(x, 2.0), y))
        return (aten.sum.default(y),)

    x0, y0 = torch.randn(6, 6), torch.randn(6, 6)
    gm = make_fx(f)(x0.clone(), y0)
    graph = cb.HologramGraph(gm, "inference", default_executor("cpu"))
    with cb.collect_graphs() as graphs:
        x = x0.clone()
        graph([x, y0])
        torch.testing.assert_close(x, x0 * 2 + y0)
        assert graph._static.regions[0].in_place == [0]
        # the regions' runners only: the update is no step of its own
        assert len(graph._static._resolve()) == len(graph._static.regions)
        xt = x0.clone().t().contiguous().t()  # same values, transposed strides
        ptr = xt.data_ptr()
        graph([xt, y0])
        torch.testing.assert_close(xt, x0 * 2 + y0)
        assert xt.data_ptr() == ptr
    assert not graphs or all(not g.torch_ops for g in graphs)
