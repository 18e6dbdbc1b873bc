"""Random ops under ``torch.compile(backend="hologram")``: dropout, bernoulli, rand,
randn, uniform_, normal_ run inside programs (``hologram_torch/lowering/random.py``).

Their numbers are hologram's, not eager's, so each test checks what must hold for any
draw: dropout's output is eager's formula over its own mask, its gradient is the same
mask, the keep fraction and the moments are within a few standard errors, every call
draws afresh, and ``torch.manual_seed`` repeats a run.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from hologram_torch.compile_backend import collect_graphs  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _compiled(fn):
    return torch.compile(fn, backend="hologram", dynamic=False)


def _in_pytorch(graphs: list) -> list[tuple[str, str]]:
    return [(op, why) for g in graphs for op, why in g.torch_ops]


def _ran(graphs: list) -> set[str]:
    return {op for g in graphs for r in g.regions for op in r.aten_ops}


def _within(value: float, want: float, sd: float, n: int) -> None:
    """``value`` (a mean of ``n`` draws with standard deviation ``sd``) is within six
    standard errors of ``want``."""
    assert abs(value - want) <= 6 * sd / math.sqrt(n), (value, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_is_eagers_formula_over_its_own_mask(dtype, p):
    """Forward: ``(x * mask) * (1 / (1 - p))`` exactly, in one program with its mask;
    backward: the gradient is the upstream one times the same mask and scale."""
    x = torch.randn(64, 300, dtype=dtype)
    x[0, :4] = torch.tensor([math.inf, -math.inf, math.nan, 0.0], dtype=dtype)
    w = torch.randn(64, 300, dtype=dtype)
    xg = x.clone().requires_grad_()
    f = _compiled(lambda a: torch.nn.functional.dropout(a, p, True))
    with collect_graphs() as graphs:
        out = f(xg)
        (out * w).sum().backward()
    assert _in_pytorch(graphs) == []
    assert "aten.native_dropout" in _ran(graphs)
    scale = 1.0 / (1.0 - p)
    finite = torch.isfinite(x) & (x != 0)
    mask = (out != 0) & finite  # a kept finite nonzero x is nonzero
    torch.testing.assert_close(out[finite], (x * mask.to(dtype) * scale)[finite], rtol=0,
                               atol=0)
    assert torch.isnan(out[0, 2])  # NaN * 0 and NaN * scale are NaN, as in eager
    _within(mask[finite].double().mean().item(), 1 - p, math.sqrt(p * (1 - p)),
            int(finite.sum()))
    torch.testing.assert_close(xg.grad[finite], (w * mask.to(dtype) * scale)[finite],
                               rtol=0, atol=0)


def test_each_call_draws_afresh_and_manual_seed_repeats():
    x = torch.randn(128, 256)
    f = _compiled(lambda a: torch.nn.functional.dropout(a, 0.3, True))
    a, b = f(x) != 0, f(x) != 0
    # two independent masks differ where one keeps and the other drops: 2 p (1 - p)
    _within(float((a != b).float().mean()), 2 * 0.3 * 0.7, math.sqrt(0.42 * 0.58), a.numel())
    torch.manual_seed(7)
    first = f(x)
    torch.manual_seed(7)
    torch.testing.assert_close(f(x), first, rtol=0, atol=0)


def test_two_dropouts_of_one_program_draw_different_masks():
    x = torch.randn(64, 512)
    f = _compiled(lambda a: torch.stack([torch.nn.functional.dropout(a, 0.5, True),
                                         torch.nn.functional.dropout(a, 0.5, True)]))
    with collect_graphs() as graphs:
        out = f(x)
    assert _in_pytorch(graphs) == []
    assert len([r for g in graphs for r in g.regions]) == 1
    same = ((out[0] != 0) == (out[1] != 0)).float().mean().item()
    _within(same, 0.5, 0.5, x.numel())


def test_dropout_edge_cases_match_eager():
    """p = 0 keeps everything, p = 1 drops everything (ATen's scale 0), eval mode is
    the identity, an empty tensor gives empty results."""
    x = torch.randn(16, 8)
    for p in (0.0, 1.0):
        f = _compiled(lambda a, p=p: torch.nn.functional.dropout(a, p, True))
        torch.testing.assert_close(f(x), torch.nn.functional.dropout(x, p, True))
        torch._dynamo.reset()
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5)).eval()
    torch.testing.assert_close(_compiled(m)(x), m(x))
    torch._dynamo.reset()
    empty = _compiled(lambda a: torch.nn.functional.dropout(a, 0.5, True))(torch.randn(0, 5))
    assert empty.shape == (0, 5)
    torch._dynamo.reset()
    # a non-contiguous input (a transposed view, then a strided slice)
    base = torch.randn(40, 64)
    for view in (base.t(), base[::2, 1::3]):
        out = _compiled(lambda a: torch.nn.functional.dropout(a, 0.25, True))(view)
        assert out.shape == view.shape
        kept = out != 0
        torch.testing.assert_close(out[kept], view[kept] * (1 / 0.75), rtol=0, atol=0)
        _within(kept.float().mean().item(), 0.75, math.sqrt(0.75 * 0.25), view.numel())
        torch._dynamo.reset()


def _moments(t: torch.Tensor) -> tuple[float, float]:
    d = t.double()
    return d.mean().item(), d.std().item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_creation_ops_draw_their_distributions_in_a_program(dtype):
    x = torch.zeros(200, 300, dtype=dtype)
    probs = torch.rand(200, 300, dtype=dtype)

    def fn(x: torch.Tensor, probs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.rand(200, 300, dtype=dtype), torch.randn_like(x),
                torch.empty_like(x).uniform_(-2.0, 3.0), torch.empty_like(x).normal_(1.5, 0.5),
                torch.bernoulli(probs), torch.empty_like(x).bernoulli_(0.25),
                torch.rand_like(x), torch.randn(200, 300, dtype=dtype))

    with collect_graphs() as graphs:
        outs = _compiled(fn)(x, probs)
    assert _in_pytorch(graphs) == []
    assert {"aten.rand", "aten.randn_like", "aten.uniform", "aten.normal_functional",
            "aten.bernoulli", "aten.rand_like", "aten.randn"} <= _ran(graphs)
    n = x.numel()
    rand, randn, unif, norm, bern, bern_p, rand_like, randn2 = outs
    for t in outs:
        assert t.dtype is dtype and t.shape == x.shape
    for u in (rand, rand_like):
        assert 0.0 <= u.min().item() and u.max().item() < 1.0
        _within(_moments(u)[0], 0.5, math.sqrt(1 / 12), n)
    assert -2.0 <= unif.min().item() and unif.max().item() < 3.0
    _within(_moments(unif)[0], 0.5, 5 / math.sqrt(12), n)
    for z, mean, sd in ((randn, 0.0, 1.0), (randn2, 0.0, 1.0), (norm, 1.5, 0.5)):
        m, s = _moments(z)
        _within(m, mean, sd, n)
        assert abs(s - sd) < 0.02 * sd
    assert set(bern.unique().tolist()) <= {0.0, 1.0}
    _within(_moments(bern - probs)[0], 0.0, 0.5, n)  # E[bernoulli(p) - p] = 0
    _within(_moments(bern_p)[0], 0.25, math.sqrt(0.25 * 0.75), n)
    # the draws of one program are not each other's
    assert abs(torch.corrcoef(torch.stack([rand.flatten(), rand_like.flatten()]))[0, 1]) < 0.02


def test_an_explicit_generator_draws_its_own_numbers():
    """A caller's generator is the caller's to advance: its numbers are PyTorch's
    (dynamo leaves the draw to PyTorch; the translator refuses one too)."""
    g = torch.Generator().manual_seed(3)
    out = _compiled(lambda a: a + torch.rand(4, 5, generator=g))(torch.zeros(4, 5))
    torch.testing.assert_close(out, torch.rand(4, 5, generator=torch.Generator().manual_seed(3)))
    from hologram_torch.lowering import random as lowering_random
    from hologram_torch.lowering.context import Unsupported

    with pytest.raises(Unsupported, match="generator"):
        lowering_random._key(None, g, (4, 5))


def test_training_with_dropout_stays_in_hologram_and_learns():
    """An MLP with dropout trained for a few steps: every op in programs, the loss
    falls as eager's does (their draws differ, their expectations do not)."""
    torch.manual_seed(0)
    x = torch.randn(256, 16)
    y = (x[:, :4].sum(1, keepdim=True) > 0).float()

    def model() -> torch.nn.Module:
        torch.manual_seed(1)
        return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(),
                                   torch.nn.Dropout(0.2), torch.nn.Linear(64, 1))

    losses = {}
    for name in ("eager", "hologram"):
        m = model().train()
        f = m if name == "eager" else _compiled(m)
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
        with collect_graphs() as graphs:
            for _ in range(60):
                opt.zero_grad()
                loss = torch.nn.functional.binary_cross_entropy_with_logits(f(x), y)
                loss.backward()
                opt.step()
        losses[name] = loss.item()
        if name == "hologram":
            assert _in_pytorch(graphs) == []
            assert "aten.native_dropout" in _ran(graphs)
    assert losses["hologram"] < 0.45 and losses["eager"] < 0.45, losses


def test_dropout_on_the_emulated_cuda_device(monkeypatch):
    """The seed input reaches a cuda executor's program (emulated device)."""
    from .cuda_env import use_emulated

    use_emulated(monkeypatch)
    x = torch.randn(64, 100)
    xg = x.clone().requires_grad_()
    f = torch.compile(lambda a: torch.nn.functional.dropout(a, 0.25, True),
                      backend="hologram", options={"executor": "cuda"})
    with collect_graphs() as graphs:
        out = f(xg)
        out.sum().backward()
    assert {g.executor for g in graphs} == {"cuda"} and _in_pytorch(graphs) == []
    kept = out != 0
    torch.testing.assert_close(out[kept], x[kept] * (1 / 0.75), rtol=0, atol=0)
    torch.testing.assert_close(xg.grad, kept.float() * (1 / 0.75), rtol=0, atol=0)
    _within(kept.float().mean().item(), 0.75, math.sqrt(0.75 * 0.25), x.numel())
