"""hologram_torch.nn modules as drop-in torch.nn replacements.

Each module is built with the same constructor arguments as its torch
counterpart, exchanges state dicts with it in both directions, and must give
the same outputs, input gradients and parameter gradients. A small MLP trains
the same under both, and compiles with torch.compile(fullgraph=True).
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

import hologram as hg  # noqa: E402
import hologram_torch as ht  # noqa: E402
from hologram_torch import nn as hnn  # noqa: E402

warnings.filterwarnings("ignore", message="hologram: no C compiler found")

TOL = {torch.float32: dict(rtol=2e-5, atol=2e-5), torch.float64: dict(rtol=1e-9, atol=1e-11)}


def close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype = torch.float64) -> None:
    torch.testing.assert_close(a, b, equal_nan=True, **TOL[dtype])


def rand(*shape: int, dtype: torch.dtype = torch.float64, seed: int = 0, lo: float = -2.0,
         hi: float = 2.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g, dtype=dtype) * (hi - lo) + lo


W5 = rand(5, seed=9, lo=0.2, hi=2.0)
T5 = torch.tensor([0, 4, 2, -100, 1, 3])

# (name, our class, torch class, constructor args, kwargs, inputs)
MODULES = [
    ("linear", hnn.Linear, torch.nn.Linear, (4, 5), {}, lambda d: [rand(6, 4, dtype=d)]),
    ("linear_nobias", hnn.Linear, torch.nn.Linear, (4, 5), {"bias": False},
     lambda d: [rand(2, 3, 4, dtype=d)]),
    ("relu", hnn.ReLU, torch.nn.ReLU, (), {}, lambda d: [rand(3, 4, dtype=d)]),
    ("sigmoid", hnn.Sigmoid, torch.nn.Sigmoid, (), {}, lambda d: [rand(3, 4, dtype=d)]),
    ("tanh", hnn.Tanh, torch.nn.Tanh, (), {}, lambda d: [rand(3, 4, dtype=d)]),
    ("gelu", hnn.GELU, torch.nn.GELU, (), {}, lambda d: [rand(3, 4, dtype=d)]),
    ("gelu_tanh", hnn.GELU, torch.nn.GELU, ("tanh",), {}, lambda d: [rand(3, 4, dtype=d)]),
    ("softmax", hnn.Softmax, torch.nn.Softmax, (), {"dim": 1}, lambda d: [rand(3, 4, dtype=d)]),
    ("log_softmax", hnn.LogSoftmax, torch.nn.LogSoftmax, (1,), {},
     lambda d: [rand(3, 4, dtype=d)]),
    ("layer_norm", hnn.LayerNorm, torch.nn.LayerNorm, (4,), {},
     lambda d: [rand(2, 3, 4, dtype=d)]),
    ("layer_norm_2d_noaffine", hnn.LayerNorm, torch.nn.LayerNorm, ((3, 4),),
     {"elementwise_affine": False}, lambda d: [rand(2, 3, 4, dtype=d)]),
    ("layer_norm_nobias", hnn.LayerNorm, torch.nn.LayerNorm, (4,), {"bias": False},
     lambda d: [rand(2, 3, 4, dtype=d)]),
    ("mse", hnn.MSELoss, torch.nn.MSELoss, (), {"reduction": "sum"},
     lambda d: [rand(3, 4, dtype=d), rand(3, 4, dtype=d, seed=1)]),
    ("cross_entropy", hnn.CrossEntropyLoss, torch.nn.CrossEntropyLoss, (),
     {"weight": W5, "label_smoothing": 0.25}, lambda d: [rand(6, 5, dtype=d) * 3, T5]),
    ("bce", hnn.BCELoss, torch.nn.BCELoss, (), {},
     lambda d: [rand(3, 4, dtype=d, lo=0.02, hi=0.98), rand(3, 4, dtype=d, seed=1, lo=0, hi=1)]),
    ("bce_logits", hnn.BCEWithLogitsLoss, torch.nn.BCEWithLogitsLoss, (),
     {"pos_weight": rand(4, seed=3, lo=0.5, hi=3.0)},
     lambda d: [rand(3, 4, dtype=d) * 10, rand(3, 4, dtype=d, seed=1, lo=0, hi=1)]),
]


def build(ours, theirs, args, kwargs, dtype):
    kw = {k: (v.to(dtype) if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    if ours in (hnn.Linear, hnn.LayerNorm):
        kw["dtype"] = dtype
    torch.manual_seed(0)
    a = ours(*args, **kw)
    torch.manual_seed(0)
    b = theirs(*args, **kw)
    return a, b


# Every module in float64; the common layers in float32 too (the functional tests cover
# float32 op by op).
MODULE_CASES = [(m, torch.float64) for m in MODULES] + [
    (m, torch.float32) for m in MODULES if m[0] in ("linear", "layer_norm", "cross_entropy",
                                                    "gelu")]


@pytest.mark.parametrize("case,dtype", MODULE_CASES,
                         ids=[f"{m[0]}-{str(d)[6:]}" for m, d in MODULE_CASES])
def test_module_matches_torch(case, dtype):
    _, ours, theirs, args, kwargs, inputs = case
    a, b = build(ours, theirs, args, kwargs, dtype)
    assert isinstance(a, theirs)
    assert repr(a) == repr(b)
    # Same constructor and seed: torch's own initialisation, identical parameters.
    assert a.state_dict().keys() == b.state_dict().keys()
    for k, v in b.state_dict().items():
        assert torch.equal(a.state_dict()[k], v), k
    xs = inputs(dtype)
    xa = [x.clone().requires_grad_(x.is_floating_point()) for x in xs]
    xb = [x.clone().requires_grad_(x.is_floating_point()) for x in xs]
    ya, yb = a(*xa), b(*xb)
    close(ya, yb, dtype)
    g = rand(*yb.shape, dtype=dtype, seed=5)
    ya.backward(g)
    yb.backward(g)
    for u, v in zip(xa, xb, strict=True):
        if v.grad is not None:
            close(u.grad, v.grad, dtype)
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert p.grad is not None, n
        close(p.grad, q.grad, dtype)


@pytest.mark.parametrize("case", [m for m in MODULES if m[0] in (
    "linear", "layer_norm", "cross_entropy", "bce_logits")], ids=lambda m: m[0])
def test_state_dict_round_trips_both_ways(case):
    _, ours, theirs, args, kwargs, inputs = case
    a, b = build(ours, theirs, args, kwargs, torch.float64)
    with torch.no_grad():
        for p in b.parameters():
            p.add_(0.5)
    a.load_state_dict(b.state_dict())  # torch -> hologram
    xs = inputs(torch.float64)
    close(a(*xs), b(*xs))
    with torch.no_grad():
        for p in a.parameters():
            p.mul_(1.5)
    b.load_state_dict(a.state_dict())  # hologram -> torch
    close(a(*xs), b(*xs))


def test_seed_constructor_with_leading_executor():
    with hg.Executor("cpu") as ex:
        layer = hnn.Linear(ex, 4, 5, dtype=torch.float64)
        assert layer.hologram_backend == "cpu" and layer.executor.backend_name == "cpu"
        ref = torch.nn.Linear(4, 5, dtype=torch.float64)
        ref.load_state_dict(layer.state_dict())
        x = rand(6, 4)
        close(layer(x), ref(x))
        assert "executor" not in "".join(layer.state_dict())
        close(hnn.ReLU(executor=ex)(x), torch.relu(x))
    with pytest.raises(TypeError, match="Executor"):
        hnn.ReLU(executor=1.0)
    ref_layer = hnn.Linear(4, 5, executor="reference", dtype=torch.float64)
    assert ref_layer.executor.backend_name == "reference"
    close(ref_layer(rand(6, 4)), torch.nn.functional.linear(rand(6, 4), ref_layer.weight,
                                                            ref_layer.bias))


def test_modules_deepcopy_and_pickle_with_their_backend():
    import copy
    import io

    with hg.Executor("cpu") as ex:
        model = torch.nn.Sequential(hnn.Linear(ex, 4, 5), hnn.GELU(ex))
    twin = copy.deepcopy(model)  # the executor is closed by now; its backend name lives on
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    x = rand(6, 4, dtype=torch.float32)
    for m in (twin, loaded):
        assert m[0].hologram_backend == "cpu"
        close(m(x), model(x), torch.float32)


def test_relu_inplace_module():
    x = rand(3, 4)
    ref = torch.relu(x)
    y = hnn.ReLU(inplace=True)(x)
    assert y is x
    close(x, ref)


def test_softmax_module_implicit_dim_warns_like_torch():
    x = rand(3, 4)
    with pytest.warns(UserWarning, match="Implicit dimension"):
        y = hnn.Softmax()(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        close(y, torch.nn.Softmax()(x))


class MLP(torch.nn.Module):
    """A small classifier written once, built from either module library."""

    def __init__(self, lib) -> None:
        super().__init__()
        self.fc1 = lib.Linear(4, 5)
        self.act = lib.GELU()
        self.norm = lib.LayerNorm(5)
        self.fc2 = lib.Linear(5, 5)
        self.out = lib.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.fc2(self.norm(self.act(self.fc1(x)))))


def _pair() -> tuple[MLP, MLP]:
    torch.manual_seed(1)
    ours = MLP(hnn)
    theirs = MLP(torch.nn)
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


def test_mlp_trains_like_torch():
    ours, theirs = _pair()
    x, t = rand(6, 4, dtype=torch.float32), T5.clamp(min=0)
    losses = []
    for model, crit in ((ours, hnn.CrossEntropyLoss()), (theirs, torch.nn.CrossEntropyLoss())):
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        run = []
        for _ in range(3):
            opt.zero_grad()
            loss = crit(model(x), t)
            loss.backward()
            opt.step()
            run.append(loss.detach())
        losses.append(torch.stack(run))
    close(losses[0], losses[1], torch.float32)
    assert losses[0][-1] < losses[0][0]
    for (n, p), (_, q) in zip(ours.named_parameters(), theirs.named_parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=n)


def test_torch_compile_mlp_fullgraph_matches_eager():
    torch._dynamo.reset()
    ours, _ = _pair()
    crit = hnn.CrossEntropyLoss()
    x, t = rand(6, 4, dtype=torch.float32), T5.clamp(min=0)

    def step(model, x, t):
        return crit(model(x), t)

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    results = []
    for f in (step, compiled):
        ours.zero_grad()
        loss = f(ours, x, t)
        loss.backward()
        results.append([loss.detach(), *(p.grad.clone() for p in ours.parameters())])
    for a, b in zip(*results, strict=True):
        close(a, b, torch.float32)


def test_torch_compile_dynamic_batch_sizes():
    torch._dynamo.reset()
    ours, theirs = _pair()
    crit = hnn.CrossEntropyLoss()
    compiled = torch.compile(lambda x, t: crit(ours(x), t), backend="aot_eager",
                             fullgraph=True, dynamic=True)
    for n in (6, 3):
        x, t = rand(n, 4, dtype=torch.float32, seed=n), T5.clamp(min=0)[:n]
        close(compiled(x, t), torch.nn.functional.cross_entropy(theirs(x), t), torch.float32)


def test_compiled_graph_calls_hologram_ops():
    """The aot graph holds hologram custom ops, forward and backward (no decomposition)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    seen: list[str] = []

    def record(gm, _inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    ours, _ = _pair()
    fn = torch.compile(lambda x: ours(x).sum(), fullgraph=True,
                       backend=aot_autograd(fw_compiler=record, bw_compiler=record))
    fn(rand(6, 4, dtype=torch.float32).requires_grad_()).backward()
    for op in ("hologram.linear", "hologram.gelu", "hologram.layer_norm", "hologram.tanh",
               "hologram.gelu_backward", "hologram.layer_norm_backward",
               "hologram.linear_grad_weight"):
        assert any(op in s for s in seen), (op, seen)


def test_package_exports():
    assert ht.functional.linear is not None and ht.nn.Linear is hnn.Linear
    assert callable(ht.tensor_to_buffer) and callable(ht.buffer_to_tensor)
