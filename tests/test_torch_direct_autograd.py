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
