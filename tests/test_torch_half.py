"""16-bit float graphs (bf16, f16) under ``torch.compile(backend="hologram")``: tensors
read and written in their own dtype, values carried as f32 inside programs, and every
ATen op's result rounded to the dtype as eager rounds it (``hologram_torch.fx_info.HALF``).

Eager computes each op of a half tensor in float and rounds its result, so a chain of
correctly rounded ops (+, -, *, /, sqrt) must come out bit for bit; elsewhere (GEMMs,
reductions, transcendental functions) the sums and libraries differ, and the compiled
result must be as close to a float64 run as eager's is (the OpInfo sweep's float64 rule,
``tests/opinfo_sweep.py``; ``tools/opinfo_sweep.py --dtype bfloat16`` runs every op's
samples the same way)."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

import hologram_torch  # noqa: E402,F401  (registers backend="hologram")
from hologram_torch.compile_backend import collect_graphs  # noqa: E402

HALVES = [torch.bfloat16, torch.float16]
ids = ["bf16", "f16"]


def _in_hologram(graphs) -> None:
    assert graphs, "the hologram backend compiled no graph"
    for g in graphs:
        assert g.torch_ops == [], f"{g.kind} graph ran ops in PyTorch: {g.torch_ops}"


def _err(a, ref) -> float:
    """Root mean square of ``a - ref`` over the finite elements, in float64."""
    a, ref = a.double(), ref.double()
    fin = a.isfinite() & ref.isfinite()
    return float(((a - ref)[fin] ** 2).mean().sqrt())


def _as_close_as_eager(got, want, exact) -> None:
    """``got`` (compiled) is no further from the float64 result ``exact`` than twice
    eager's ``want`` is (plus a hair for results eager gets exactly)."""
    assert got.dtype is want.dtype and got.shape == want.shape
    e_got, e_want = _err(got, exact), _err(want, exact)
    scale = float(exact.double().abs().max())
    assert e_got <= 2 * e_want + 1e-6 * scale, (e_got, e_want)


def _chain(x, w):
    """Correctly rounded ops only (eager's vectorized sqrt is not: 1 ulp off in f32),
    a scalar eager rounds to the dtype first (+ 0.1, > 0.1) and one it does not (* 0.3)."""
    return ((x * w + 0.1) / (w.abs() + 1.5)) * x - w * 0.3 + (x > 0.1)


@pytest.mark.parametrize("dt", HALVES, ids=ids)
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "empty"])
def test_every_op_rounds_its_result_as_eager(dt, layout, fresh_dynamo):
    """Eager rounds each op's result to the dtype; the compiled chain must be equal bit
    for bit, NaN and inf included. The same chain in f32 rounded once at the end is
    not (so the test can tell a missing rounding), and neither is one with 0.1 kept in
    float (``compile_backend._half_scalars``: eager rounds it for ``+`` and ``>``)."""
    g = torch.Generator().manual_seed(0)
    shape = (0, 33) if layout == "empty" else (64, 33)
    x = torch.randn(shape, generator=g).to(dt)
    w = (torch.randn(shape, generator=g) * 3).to(dt)
    if layout == "transposed":
        x, w = x.t(), w.t()  # the host copy of a non-contiguous tensor
    if layout != "empty":
        x[0, 0], x[1, 1], w[2, 2] = float("nan"), float("inf"), float("-inf")
    want = _chain(x, w)
    with collect_graphs() as graphs:
        got = torch.compile(_chain, backend="hologram")(x, w)
    _in_hologram(graphs)
    assert got.dtype is dt and got.shape == want.shape
    torch.testing.assert_close(got, want, atol=0, rtol=0, equal_nan=True)
    if layout != "empty":
        once = _chain(x.float(), w.float()).to(dt)
        assert not torch.equal(once.nan_to_num(), want.nan_to_num())
        unrounded = ((x * w).float() + 0.1).to(dt)
        assert not torch.equal(unrounded.nan_to_num(), (x * w + 0.1).nan_to_num())


@pytest.mark.parametrize("dt", HALVES, ids=ids)
def test_mixed_dtypes_and_casts(dt, fresh_dynamo):
    """A half input mixed with an f32 one promotes to f32 (no rounding of the sum), an
    explicit ``.to(dt)`` rounds, an f32 result leaves as f32 and an integer as int64."""
    def f(x, y):
        s = x + y  # f32
        h = (s * 3).to(dt)  # rounded
        return s, h + x, (h > 0).sum()

    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(40, 7, generator=g).to(dt), torch.randn(40, 7, generator=g)
    want = f(x, y)
    with collect_graphs() as graphs:
        got = torch.compile(f, backend="hologram")(x, y)
    _in_hologram(graphs)
    for a, b in zip(got, want, strict=True):
        assert a.dtype is b.dtype
        torch.testing.assert_close(a, b, atol=0, rtol=0)


class _Block(torch.nn.Module):
    """A transformer-like block: linear layers (GEMMs), layer norm, softmax, GELU."""

    def __init__(self, d: int = 48) -> None:
        super().__init__()
        self.qkv, self.out = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.norm = torch.nn.LayerNorm(d)
        self.ff = torch.nn.Sequential(torch.nn.Linear(d, 2 * d), torch.nn.GELU(),
                                      torch.nn.Linear(2 * d, d))

    def forward(self, x):
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        a = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1) @ v
        x = x + self.out(a)
        return x + self.ff(self.norm(x))


@pytest.mark.parametrize("dt", HALVES, ids=ids)
def test_block_forward_and_backward_as_close_as_eager(dt, fresh_dynamo):
    """Forward and every parameter's gradient of a half block: wholly in hologram, as
    close to the float64 run of the same (half) weights and inputs as eager is."""
    torch.manual_seed(2)
    base = _Block().to(dt)
    x = torch.randn(3, 10, 48).to(dt)
    wt = torch.randn(3, 10, 48).to(dt)

    def run(model, fn, inp, weights):
        out = fn(inp)
        (out * weights).sum().backward()
        return out.detach(), [p.grad for p in model.parameters()]

    eager, comp, exact = copy.deepcopy(base), copy.deepcopy(base), copy.deepcopy(base).double()
    want, want_g = run(eager, eager, x, wt)
    with collect_graphs() as graphs:
        got, got_g = run(comp, torch.compile(comp, backend="hologram"), x, wt)
    ref, ref_g = run(exact, exact, x.double(), wt.double())
    _in_hologram(graphs)
    assert {g.kind for g in graphs} >= {"forward", "backward"}
    _as_close_as_eager(got, want, ref)
    for a, b, c in zip(got_g, want_g, ref_g, strict=True):
        _as_close_as_eager(a, b, c)


def _small_cnn() -> torch.nn.Module:
    """A ResNet stem (7x7 stride 2: its im2col's taps fold into one loop, the load a
    bf16 build once rendered wrongly), batch norm, pooling and a classifier."""
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(3, 16, 7, 2, 3, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        nn.MaxPool2d(3, 2, 1), nn.Conv2d(16, 16, 3, 1, 1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))


@pytest.mark.parametrize("dt", HALVES, ids=ids)
def test_cnn_training_step_as_close_as_eager(dt, fresh_dynamo):
    """A convolutional training step (batch norm in training mode, SGD with momentum)
    in half precision: the loss, every gradient and the updated weights as close to the
    float64 step as eager's are."""
    torch.manual_seed(3)
    base = _small_cnn().to(dt)
    x = torch.randn(8, 3, 64, 64).to(dt)
    y = torch.randint(0, 10, (8,))

    def step(model, fn, inp):
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        loss = torch.nn.functional.cross_entropy(fn(inp), y)
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        opt.step()
        return loss.detach(), grads, [p.detach() for p in model.parameters()]

    eager, comp, exact = copy.deepcopy(base), copy.deepcopy(base), copy.deepcopy(base).double()
    want = step(eager, eager, x)
    with collect_graphs() as graphs:
        got = step(comp, torch.compile(comp, backend="hologram"), x)
    ref = step(exact, exact, x.double())
    _in_hologram(graphs)
    _as_close_as_eager(got[0], want[0], ref[0])
    for part in (1, 2):
        for a, b, c in zip(got[part], want[part], ref[part], strict=True):
            _as_close_as_eager(a, b, c)


def test_autocast_region_runs_in_hologram(fresh_dynamo):
    """``torch.autocast`` on the CPU: the linear layers in bf16, softmax and the loss in
    f32 (autocast's casts are nodes of the graph), all of it in programs."""
    torch.manual_seed(4)
    lin = torch.nn.Linear(32, 16)
    x = torch.randn(20, 32)

    def f(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = lin(x)
            return h, torch.log_softmax(h, dim=-1)

    want = f(x)
    with collect_graphs() as graphs:
        got = torch.compile(f, backend="hologram")(x)
    _in_hologram(graphs)
    exact = torch.nn.functional.linear(x.double(), lin.weight.double(), lin.bias.double())
    assert got[0].dtype is want[0].dtype is torch.bfloat16
    _as_close_as_eager(got[0], want[0], exact)
    assert got[1].dtype is want[1].dtype
    _as_close_as_eager(got[1], want[1], torch.log_softmax(want[0].double(), -1))


@pytest.mark.parametrize("executor", ["reference", "cuda"])
def test_other_executors_round_alike(executor, fresh_dynamo, monkeypatch):
    """The array path (the reference interpreter: bf16 tensors viewed as ml_dtypes
    arrays) and the emulated CUDA device give eager's bits too."""
    pytest.importorskip("ml_dtypes")
    if executor == "cuda":
        from .cuda_env import use_emulated

        use_emulated(monkeypatch)
    g = torch.Generator().manual_seed(5)
    x, w = (torch.randn(9, 13, generator=g).to(torch.bfloat16) for _ in range(2))
    want = _chain(x, w)
    with collect_graphs() as graphs:
        got = torch.compile(_chain, backend="hologram", options={"executor": executor})(x, w)
    _in_hologram(graphs)
    assert {g.executor for g in graphs} == {executor}
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_random_draws_in_half_precision_stay_in_pytorch(fresh_dynamo):
    """``rand`` of a half dtype runs in PyTorch (a draw rounded at the op's end could
    reach 1); dropout's mask is a comparison of f32 draws, and its output is rounded
    as any op's, so a half dropout runs in the program."""
    x = torch.ones(64, 64, dtype=torch.bfloat16)

    def f(x):
        return torch.rand_like(x) * x, torch.nn.functional.dropout(x, 0.5, training=True)

    with collect_graphs() as graphs:
        u, d = torch.compile(f, backend="hologram")(x)
    ran = [op for g in graphs for op, why in g.torch_ops]
    assert ran and all("rand" in op for op in ran), ran
    assert u.dtype is d.dtype is torch.bfloat16
    assert bool(((u >= 0) & (u < 1)).all())
    assert set(d.unique().tolist()) <= {0.0, 2.0} and 0.3 < float((d == 2).float().mean()) < 0.7


@pytest.mark.parametrize("dtype", HALVES, ids=ids)
def test_a_bf16_graph_prewarms_the_bf16_kernel(monkeypatch, dtype):
    """The backend starts building the bf16 GEMM kernel beside AOT autograd when a
    graph's inputs hold bf16 (``prewarm.start(..., bf16=True)``), and not otherwise."""
    from hologram.interop import default_executor

    backend = default_executor("cpu").backend
    asked = []
    monkeypatch.setattr(type(backend), "prewarm",
                        lambda self, attention=False, bf16=False: asked.append(bf16))
    torch._dynamo.reset()
    lin = torch.nn.Linear(8, 4).to(dtype)
    with torch.no_grad():
        torch.compile(lin, backend="hologram")(torch.randn(3, 8, dtype=dtype))
    assert asked == [dtype == torch.bfloat16]
