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

from hologram_torch import compile_backend as cb  # noqa: E402

from .cuda_env import use_emulated  # noqa: E402

ATOL, RTOL = 2e-5, 1e-4


@pytest.fixture
def bench(monkeypatch):
    use_emulated(monkeypatch)
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


# --- PyTorch's current stream ------------------------------------------------------------
def test_launch_stream_is_torchs_current_stream_for_cuda_tensors(monkeypatch):
    """Host tensors: no stream (the executor's own). A CUDA tensor: the handle of
    PyTorch's current stream on that tensor's device (no GPU here: a stand-in tensor
    and a stand-in current_stream)."""
    from types import SimpleNamespace

    from hologram_torch.streams import launch_stream

    asked = []

    def current_stream(device):
        asked.append(device)
        return SimpleNamespace(cuda_stream=0xBEEF)

    monkeypatch.setattr(torch.cuda, "current_stream", current_stream)
    assert launch_stream([torch.ones(2), None, 3.0]) is None
    gpu = SimpleNamespace(is_cuda=True, device="cuda:1")
    assert launch_stream([torch.ones(2), gpu]) == 0xBEEF
    assert asked == ["cuda:1"]


def test_compiled_graphs_launch_on_the_stream_torch_names(bench, monkeypatch):
    """The runner hands Executor.use_stream what launch_stream returns: every kernel and
    GEMM of the graph goes on that external stream; with host tensors (None), on the
    executor's own."""
    from hologram.interop import default_executor

    from .test_cuda_memory import StreamLog

    torch.manual_seed(2)
    model = bench.mlp()
    x = torch.randn(8, 64)
    want = model(x)
    ex = default_executor("cuda")
    log = StreamLog(monkeypatch, ex.backend.device)
    compiled = torch.compile(copy.deepcopy(model), backend="hologram",
                             options={"executor": "cuda"})
    with torch.no_grad():
        # the first call may run eagerly (a shape seen before other batch sizes is
        # symbolic: the plan learns the concrete shapes); the second runs the plan
        for _ in range(2):
            log.calls.clear()
            torch.testing.assert_close(compiled(x), want.detach(), atol=ATOL, rtol=RTOL)
    own = {id(ex.backend.stream)}
    assert log.streams("launch") and {id(s) for s in log.streams("launch")} == own
    log.calls.clear()
    monkeypatch.setattr(cb, "launch_stream", lambda tensors: 0xC0FFEE)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), want.detach(), atol=ATOL, rtol=RTOL)
    handles = {getattr(s, "handle", None) for s in log.streams("launch")}
    handles |= {getattr(s, "handle", None) for s in log.streams("gemm_strided_batched")}
    assert handles == {0xC0FFEE}
