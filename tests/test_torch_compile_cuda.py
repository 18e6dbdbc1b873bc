"""``torch.compile(backend="hologram", options={"executor": "cuda"})`` on the emulated
CUDA device: the benchmark MLP trains and the benchmark transformer block runs forward
and backward, matching eager PyTorch (bench_torch_train.py's models, smaller batches:
every CUDA thread of an emulated kernel is a fiber)."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import numpy as np
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


# --- CUDA tensors through the region runner, without host copies ------------------------
class FakeTorchCuda:
    """What the runner sees of a ``torch.cuda`` tensor, over host memory (the emulated
    device's addresses are host addresses): kDLCUDA DLPack capsules of ``arr`` (NumPy's
    own, their device rewritten, as test_cuda_memory.FakeCudaTensor), recording the
    stream each export was handed. CPU PyTorch cannot make real CUDA tensors."""

    is_cuda = True
    requires_grad = False

    def __init__(self, arr: np.ndarray) -> None:
        self.arr = np.ascontiguousarray(arr)
        self.device = torch.device("cuda", 0)
        self.dtype = torch.from_numpy(self.arr[:0]).dtype
        self.shape = torch.Size(self.arr.shape)
        self.streams: list[object] = []

    def is_contiguous(self) -> bool:
        return True

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None):
        from hologram.backends.cuda_dlpack import DLManagedTensor, _capsule_get

        self.streams.append(stream)
        cap = self.arr.__dlpack__()
        m = DLManagedTensor.from_address(_capsule_get(cap, b"dltensor"))
        m.dl_tensor.device.device_type, m.dl_tensor.device.device_id = 2, 0
        return cap


def test_cuda_tensors_run_through_the_region_runner_without_host_copies(monkeypatch):
    """A graph planned over CUDA tensors (its traced devices 'cuda') runs in hologram:
    each input is read in place through DLPack (the kernel's operand is the tensor's own
    address), each output comes from PyTorch's allocator (cuda_tensors.empty, a stand-in
    here) and is written in place, nothing is copied between host and device, every
    launch goes on PyTorch's current stream, and the results are eager's."""
    import dataclasses
    from types import SimpleNamespace

    from torch.fx.experimental.proxy_tensor import make_fx

    from hologram import Executor
    from hologram_torch import cuda_tensors
    from hologram_torch.fx_info import TInfo

    from .test_cuda_memory import StreamLog

    use_emulated(monkeypatch)

    def fn(x, w, b):
        return torch.nn.functional.gelu(x @ w + b), (x * 2.0).sum(1)

    rng = np.random.default_rng(4)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((6, 16), (16, 8), (8,)))
    want = [t.numpy() for t in fn(*map(torch.from_numpy, (x, w, b)))]
    gm = make_fx(fn)(*map(torch.from_numpy, (x, w, b)))
    infos = {n: dataclasses.replace(i, device="cuda") if isinstance(i, TInfo) else i
             for n, i in cb._infos_from_meta(gm).items()}
    with Executor("cuda") as ex:
        monkeypatch.setattr(ex._device, "dlpack_device", (2, 0))  # as a GPU's memory says
        plan = cb._Plan(gm, infos, ex, "inference", None, False)
        assert plan.torch_nodes == [] and len(plan.regions) == 1
        made: list[FakeTorchCuda] = []

        def empty(shape, dtype, device):
            assert device == torch.device("cuda", 0)
            made.append(FakeTorchCuda(np.full(shape, np.nan, np.float32)))
            return made[-1]

        seen: list[tuple[int, int]] = []
        real = cuda_tensors.device_array

        def device_array(t, *args, **kw):
            a = real(t, *args, **kw)
            seen.append((a.handle.ptr + a.offset, t.arr.ctypes.data))
            return a

        monkeypatch.setattr(cuda_tensors, "empty", empty)
        monkeypatch.setattr(cuda_tensors, "device_array", device_array)
        monkeypatch.setattr(torch.cuda, "current_stream",
                            lambda device: SimpleNamespace(cuda_stream=0xBEEF))
        ins = [FakeTorchCuda(a) for a in (x, w, b)]
        ex.synchronize()
        log = StreamLog(monkeypatch, ex.backend.device)
        out = plan.run(list(ins))
        ex.synchronize()
    assert [type(o) for o in out] == [FakeTorchCuda] * 2 and list(out) == made
    for o, wnt in zip(out, want, strict=True):
        np.testing.assert_allclose(o.arr, wnt, rtol=1e-5, atol=1e-5)
    assert len(seen) == 5 and all(p == q for p, q in seen), seen  # no copy, either way
    assert not log.streams("copy_h2d") and not log.streams("copy_d2h")
    assert log.streams("launch") and all(getattr(s, "handle", None) == 0xBEEF
                                         for s in log.streams("launch")
                                         + log.streams("gemm_strided_batched"))
    assert all(t.streams == [0xBEEF] for t in ins + made)  # the producer's order first
