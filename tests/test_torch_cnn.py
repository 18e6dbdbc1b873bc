"""CNNs through ``torch.compile(backend="hologram")``: pools (forward, backward,
gradcheck), and torchvision's ResNet-18 and MobileNetV3-small and timm's ConvNeXt-atto
(random weights, nothing downloaded) wholly inside hologram: inference at batch 1 and
8, and a ResNet-18 training step (forward, backward, SGD with momentum, batch norm's
running statistics) against eager."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

import hologram_torch  # noqa: E402,F401  (registers backend="hologram")
from hologram_torch.compile_backend import collect_graphs  # noqa: E402
from hologram_torch.torchvision_import import import_torchvision  # noqa: E402

F = torch.nn.functional


def _ran_in_pytorch(graphs: list) -> list[str]:
    return sorted({op for g in graphs for op, _ in g.torch_ops})


POOLS = {
    "avg 3 s2 p1": lambda x: F.avg_pool2d(x, 3, 2, 1),
    "avg ceil, pad not counted": lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True,
                                                        count_include_pad=False),
    "avg divisor_override": lambda x: F.avg_pool2d(x, 2, divisor_override=3),
    "adaptive avg to 1": lambda x: F.adaptive_avg_pool2d(x, 1),
    "adaptive avg to 2": lambda x: F.adaptive_avg_pool2d(x, (2, 3)),
    "adaptive avg, overlapping windows": lambda x: F.adaptive_avg_pool2d(x, (3, 5)),
    "max 3 s2 p1": lambda x: F.max_pool2d(x, 3, 2, 1),
    "max dilated ceil": lambda x: F.max_pool2d(x, 2, 2, 0, 2, ceil_mode=True),
    "avg unbatched": lambda x: F.avg_pool2d(x[0], 3, 2, 1),
    "adaptive max to 1": lambda x: F.adaptive_max_pool2d(x, 1),
    "adaptive max, overlapping windows": lambda x: F.adaptive_max_pool2d(x, (3, 5)),
    "adaptive max 1-D, windows of two lengths": lambda x: F.adaptive_max_pool1d(
        x.reshape(2, 3, 72), 7),
    "adaptive max 3-D": lambda x: F.adaptive_max_pool3d(x.reshape(2, 3, 2, 4, 9), (1, 3, 4)),
    "max 3-D 2 s1 p1": lambda x: F.max_pool3d(x.reshape(2, 3, 2, 4, 9), 2, 1, 1),
    "adaptive avg 3-D, overlapping windows": lambda x: F.adaptive_avg_pool3d(
        x.reshape(2, 3, 2, 4, 9), (2, 3, 4)),
}


@pytest.mark.parametrize("name", list(POOLS))
def test_pool_forward_backward_in_hologram(name):
    """Each pool and its backward in hologram: eager's values (NaN and inf included)
    and a float64 gradcheck."""
    f = POOLS[name]
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 8, 9, dtype=torch.float64, generator=gen)
    xs = x.clone()
    xs[0, 0, 2, 3], xs[1, 2, 5, 5] = float("nan"), float("inf")
    cf = torch.compile(f, backend="hologram")
    with collect_graphs() as graphs:
        torch.testing.assert_close(cf(xs), f(xs), rtol=1e-12, atol=1e-12, equal_nan=True)
        assert torch.autograd.gradcheck(cf, (x.requires_grad_(),))
    assert "backward" in {g.kind for g in graphs}
    assert _ran_in_pytorch(graphs) == []


MAX_POOLS_WITH_INDICES = {
    "3 s2 p1": lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True),
    "2 dilated 2, ceil": lambda x: F.max_pool2d(x, 2, 2, 0, 2, ceil_mode=True,
                                                return_indices=True),
    "3 s3 p1 dilated 2, ceil": lambda x: F.max_pool2d(x, 3, 3, 1, 2, ceil_mode=True,
                                                      return_indices=True),
    "3-D 2 s1 p1": lambda x: F.max_pool3d(x.reshape(2, 3, 2, 4, 9), 2, 1, 1,
                                          return_indices=True),
    "adaptive, overlapping windows": lambda x: F.adaptive_max_pool2d(
        x, (3, 5), return_indices=True),
    "adaptive 3-D": lambda x: F.adaptive_max_pool3d(x.reshape(2, 3, 2, 4, 9), (2, 3, 2),
                                                    return_indices=True),
}


@pytest.mark.parametrize("name", list(MAX_POOLS_WITH_INDICES))
def test_max_pool_values_and_indices_match_eager(name):
    """Max pooling's taps and select chain give ATen's values and indices exactly: ties
    keep the first, NaN wins (the last NaN's index), a window of -inf keeps its first
    element inside the input; the index is read (so not dead code) and both results
    come from hologram."""
    f = MAX_POOLS_WITH_INDICES[name]
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 8, 9, generator=gen)
    x[0, 0, 2, 3], x[0, 0, 2, 4], x[1, 2, 5, 5] = float("nan"), float("nan"), float("inf")
    x[1, 0] = -float("inf")
    x[0, 1, :4, :4] = 0.5  # ties
    x = x.transpose(2, 3).contiguous().transpose(2, 3)  # a non-contiguous input
    cf = torch.compile(f, backend="hologram")
    with collect_graphs() as graphs:
        got = cf(x)
    want = f(x)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0, equal_nan=True)
    assert torch.equal(got[1], want[1])
    assert _ran_in_pytorch(graphs) == []


def test_max_pool_backward_at_its_own_indices_matches_eager():
    """OpInfo's ``max_pool2d_with_indices_backward`` sample 18 (forward, indices, and
    the backward scattered at them, one program): a coordinate split off a reduction's
    flat index reached a dim of another size, which ``render_c.offset`` once took for
    its group's and put the gradient at the wrong elements (session 15)."""
    torch._dynamo.reset()
    x = torch.randn(1, 2, 3, 6, generator=torch.Generator().manual_seed(18))
    kw = {"kernel_size": 3, "stride": 2, "padding": 1, "dilation": (1, 2)}

    def f(v):
        out, idx = F.max_pool2d_with_indices(v, **kw)
        return torch.ops.aten.max_pool2d_with_indices_backward.default(
            torch.ones_like(out), v, kw["kernel_size"], kw["stride"], kw["padding"],
            kw["dilation"], False, idx)

    with collect_graphs() as graphs:
        got = torch.compile(f, backend="hologram")(x)
    assert torch.equal(got, f(x))
    assert _ran_in_pytorch(graphs) == []


def _cnns() -> dict:
    tv = import_torchvision()
    timm = pytest.importorskip("timm")
    if tv is None:
        pytest.skip("torchvision is not installed")
    return {
        "resnet18": lambda: tv.models.resnet18(num_classes=10),
        "mobilenet_v3_small": lambda: tv.models.mobilenet_v3_small(num_classes=10),
        "convnext_atto": lambda: timm.create_model("convnext_atto", pretrained=False,
                                                   num_classes=10),
    }


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v3_small", "convnext_atto"])
def test_cnn_inference_matches_eager_wholly_in_hologram(name, batch):
    """Inference at a small input: eager's logits (relative error <= 1e-5 of the
    largest) and no compute op left to PyTorch."""
    make = _cnns()[name]
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = make().eval()
    x = torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(batch))
    f = torch.compile(model, backend="hologram")
    with torch.no_grad():
        want = model(x)
        with collect_graphs() as graphs:
            got = f(x)
    assert got.shape == want.shape
    err = (got.double() - want.double()).abs().max().item() / want.abs().max().item()
    assert err <= 1e-5, err
    assert graphs and _ran_in_pytorch(graphs) == []


def _train_step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                compiled: bool) -> dict:
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    f = torch.compile(model, backend="hologram") if compiled else model
    out: dict = {"loss": [], "grads": []}
    for _ in range(2):  # the second step reads the momentum buffers
        opt.zero_grad()
        loss = F.cross_entropy(f(x), y)
        loss.backward()
        out["loss"].append(loss.detach())
        out["grads"].append([p.grad.clone() for p in model.parameters()])
        opt.step()
    out["params"] = [p.detach().clone() for p in model.parameters()]
    out["buffers"] = [b.clone() for b in model.buffers()]
    return out


def test_resnet18_training_step_matches_eager():
    """Forward (batch norm in training mode), backward and two SGD-momentum steps in
    float64: losses, gradients, updated weights and the running statistics batch norm
    writes in place match eager's; no op of the forward or backward graphs runs in
    PyTorch."""
    tv = import_torchvision()
    if tv is None:
        pytest.skip("torchvision is not installed")
    torch._dynamo.reset()
    torch.manual_seed(0)
    base = tv.models.resnet18(num_classes=10).double().train()
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(4, 3, 32, 32, dtype=torch.float64, generator=gen)
    y = torch.randint(0, 10, (4,), generator=gen)
    eager = _train_step(copy.deepcopy(base), x, y, compiled=False)
    with collect_graphs() as graphs:
        comp = _train_step(copy.deepcopy(base), x, y, compiled=True)
    assert {g.kind for g in graphs} >= {"forward", "backward"}
    assert _ran_in_pytorch(graphs) == []
    torch.testing.assert_close(torch.stack(comp["loss"]), torch.stack(eager["loss"]),
                               rtol=1e-10, atol=0)
    for step in range(2):
        for ge, gc in zip(eager["grads"][step], comp["grads"][step], strict=True):
            torch.testing.assert_close(gc, ge, rtol=1e-8, atol=1e-10 * float(ge.abs().max()))
    for key in ("params", "buffers"):
        for e, c in zip(eager[key], comp[key], strict=True):
            torch.testing.assert_close(c, e, rtol=1e-8, atol=1e-10)
