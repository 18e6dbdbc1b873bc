"""``torch.compile(backend="hologram", options={"executor": "cuda"})`` on the emulated
CUDA device: the benchmark MLP trains and the benchmark transformer block runs forward
and backward, matching eager PyTorch (bench_torch_train.py's models, smaller batches:
every CUDA thread of an emulated kernel is a fiber)."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from hologram.backends import registry  # noqa: E402
from hologram.backends.cuda_device import DEVICE_ENV  # noqa: E402
from hologram_torch import compile_backend as cb  # noqa: E402

ATOL, RTOL = 2e-5, 1e-4


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.setenv(DEVICE_ENV, "emulated")
    reason = registry.why_unavailable("cuda")
    if reason is not None:
        pytest.skip(f"emulated cuda unavailable: {reason}")
    path = Path(__file__).parents[1] / "benchmarks" / "bench_torch_train.py"
    spec = importlib.util.spec_from_file_location("bench_torch_train", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _on_cuda(graphs) -> None:
    assert graphs, "the hologram backend compiled no graph"
    for g in graphs:
        assert g.executor == "cuda", g.executor
        assert g.torch_ops == [], f"{g.kind} graph ran ops in PyTorch: {g.torch_ops}"


def test_benchmark_mlp_trains_on_emulated_cuda_like_eager(bench):
    torch.manual_seed(0)
    model = bench.mlp()
    twin = copy.deepcopy(model)
    compiled = torch.compile(twin, backend="hologram", options={"executor": "cuda"})
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    opt2 = torch.optim.SGD(twin.parameters(), lr=0.05)
    loss_fn = torch.nn.CrossEntropyLoss()
    with cb.collect_graphs() as graphs:
        for _ in range(3):
            x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
            for m, o in ((model, opt), (compiled, opt2)):
                o.zero_grad()
                loss = loss_fn(m(x), y)
                loss.backward()
                o.step()
                if m is model:
                    want = loss.detach()
            torch.testing.assert_close(loss.detach(), want, atol=ATOL, rtol=RTOL)
    _on_cuda(graphs)
    assert {g.kind for g in graphs} >= {"forward", "backward"}
    for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(q, p, atol=ATOL, rtol=RTOL, msg=f"parameter {name}")


def test_benchmark_transformer_block_on_emulated_cuda_like_eager(bench):
    torch.manual_seed(1)
    model = bench.block(d=64, heads=4)
    twin = copy.deepcopy(model)
    x = torch.randn(2, 6, 64)
    w = torch.linspace(-1, 1, 64)
    ref = (model(x) * w).sum()
    ref.backward()
    compiled = torch.compile(twin, backend="hologram", options={"executor": "cuda"})
    with cb.collect_graphs() as graphs:
        got = (compiled(x) * w).sum()
        got.backward()
    _on_cuda(graphs)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=RTOL)
    for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-4, rtol=RTOL, msg=f"grad of {name}")
