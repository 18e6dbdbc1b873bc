"""``torch.compile(backend="hologram")`` against eager PyTorch, forward and backward.

Every model family the backend claims (MLP, transformer block, the losses) is
trained one step both ways from the same weights; outputs and every parameter's
gradient must agree within float32 tolerance. The fallback path (an ATen op with
no translation) must log its reason and still match, since a silently wrong or
silently slow graph is the failure users could not see.
"""

from __future__ import annotations

import copy
import importlib.metadata
import logging
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from hologram_torch import compile_backend as cb  # noqa: E402
from hologram_torch.explain import explain  # noqa: E402

ATOL, RTOL = 2e-5, 1e-4


class Block(nn.Module):
    """A pre-norm transformer block: multi-head attention written with matmul/softmax."""

    def __init__(self, d: int = 16, heads: int = 2, approximate: str = "none") -> None:
        super().__init__()
        self.heads, self.approximate = heads, approximate
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        hd = d // self.heads
        h = self.ln1(x)
        q, k, v = (f(h).view(b, t, self.heads, hd).transpose(1, 2)
                   for f in (self.q, self.k, self.v))
        att = torch.softmax(q @ k.transpose(-2, -1) / hd ** 0.5, dim=-1)
        x = x + self.o((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.ln2(x)), approximate=self.approximate))


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(),
                         nn.Linear(32, 16), nn.Sigmoid(), nn.Linear(16, 5))


def _check_train_step(model: nn.Module, loss_fn, *inputs, atol: float = ATOL) -> list:
    """One forward+backward eager and compiled from the same weights; returns graphs."""
    twin = copy.deepcopy(model)
    ref = loss_fn(model, *inputs)
    ref.backward()
    compiled = torch.compile(twin, backend="hologram")
    with cb.collect_graphs() as graphs:
        got = loss_fn(compiled, *inputs)
        got.backward()
    torch.testing.assert_close(got, ref, atol=atol, rtol=RTOL)
    for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, atol=atol, rtol=RTOL, msg=f"grad of {name}")
    return graphs


def _no_fallback(graphs) -> None:
    assert graphs, "the hologram backend compiled no graph"
    for g in graphs:
        assert g.torch_ops == [], f"{g.kind} graph ran ops in PyTorch: {g.torch_ops}"


def test_mlp_forward_backward_in_one_program_per_graph():
    torch.manual_seed(0)
    x = torch.randn(7, 12)
    graphs = _check_train_step(_mlp(), lambda m, x: (m(x) ** 2).mean(), x)
    _no_fallback(graphs)
    assert {g.kind for g in graphs} == {"forward", "backward"}
    assert all(len(g.regions) == 1 for g in graphs)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_transformer_block_forward_backward(approximate):
    torch.manual_seed(1)
    x = torch.randn(2, 5, 16)
    graphs = _check_train_step(Block(approximate=approximate),
                               lambda m, x: (m(x) * torch.linspace(-1, 1, 16)).sum(), x)
    _no_fallback(graphs)
    ops = set().union(*(g.hologram_ops for g in graphs))
    assert {"aten.native_layer_norm", "aten.native_layer_norm_backward", "aten._softmax",
            "aten._softmax_backward_data", "aten.gelu", "aten.gelu_backward",
            "aten.bmm"} <= ops


@pytest.mark.parametrize("loss", ["mse", "cross_entropy", "cross_entropy_weighted_ignore",
                                  "bce", "bce_logits"])
def test_losses_forward_backward(loss):
    torch.manual_seed(2)
    x = torch.randn(6, 10)
    classes = torch.tensor([0, 3, 2, 3, 1, 0])
    probs = torch.rand(6, 4)
    dense = torch.randn(6, 4)
    weight = torch.tensor([1.0, 2.0, 0.5, 3.0])
    losses = {
        "mse": lambda z: F.mse_loss(z, dense),
        "cross_entropy": lambda z: F.cross_entropy(z, classes),
        "cross_entropy_weighted_ignore": lambda z: F.cross_entropy(z, classes, weight=weight,
                                                                   ignore_index=3),
        "bce": lambda z: F.binary_cross_entropy(torch.sigmoid(z), probs),
        "bce_logits": lambda z: F.binary_cross_entropy_with_logits(z, probs, reduction="sum"),
    }
    fn = losses[loss]

    class WithLoss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(10, 4)

        def forward(self, x):
            return fn(self.lin(x))

    graphs = _check_train_step(WithLoss(), lambda m, x: m(x), x)
    _no_fallback(graphs)


def test_unsupported_op_falls_back_logs_reason_and_matches(caplog, monkeypatch):
    torch.manual_seed(3)
    monkeypatch.setattr(cb, "_LOGGED", set())  # reasons are logged once per process

    class Odd(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(6, 6)

        def forward(self, x):
            return torch.logcumsumexp(self.lin(x), dim=1).tanh()  # not translated: PyTorch

    with caplog.at_level(logging.WARNING, logger="hologram_torch"):
        graphs = _check_train_step(Odd(), lambda m, x: m(x).sum(), torch.randn(4, 6))
    reasons = dict(op_reason for g in graphs for op_reason in g.torch_ops)
    assert "aten.logcumsumexp" in reasons
    assert "no hologram translation" in reasons["aten.logcumsumexp"]
    assert any("aten.logcumsumexp" in r.getMessage() for r in caplog.records)
    # The ops around the fallback still ran as hologram programs.
    assert any(g.regions for g in graphs)


def test_multiple_outputs_views_noncontiguous_bool_and_f64():
    def fn(x, y):
        mask = x > 0.25
        z = torch.where(mask, x.t() @ y, -y.sum(0))  # t() of a non-contiguous input
        return z.relu(), mask, x.t(), mask.sum(1)  # bool and int64 results too

    x = torch.randn(5, 3, dtype=torch.float64).t()  # (3, 5), not contiguous
    x = x[:, :3]  # (3, 3): strided view
    y = torch.randn(3, 3, dtype=torch.float64)
    compiled = torch.compile(fn, backend="hologram")
    for got, want in zip(compiled(x, y), fn(x, y), strict=True):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want)


def test_more_ops_and_decompositions_match_without_fallback():
    def fn(x, w):
        h = F.silu(x @ w) + F.leaky_relu(x, 0.1) @ w - F.hardtanh(x).abs().pow(1.5) @ w
        h = h.clamp(-2.0, 2.0) + torch.where(h > 0.2, h, 0.5 * h).masked_fill(h < -1.5, -1.0)
        keep = torch.logical_and(h > -1.0, ~(h > 1.0)) | (h.sign() == 0)
        h = torch.where(keep, h, h * 0.25) + h.var(1, keepdim=True) + h.amax(0) - h.amin(1, True)
        att = torch.bmm(h.view(2, 3, 4), h.view(2, 3, 4).transpose(1, 2)).softmax(-1)
        return (att.view(6, 3).sum(1, keepdim=True) * h).mean() + torch.rsqrt(h.abs() + 1).sum()

    torch.manual_seed(6)
    x = torch.randn(6, 5, requires_grad=True)
    w = torch.randn(5, 4, requires_grad=True)
    x2, w2 = (t.detach().clone().requires_grad_() for t in (x, w))
    ref = fn(x, w)
    ref.backward()
    with cb.collect_graphs() as graphs:
        got = torch.compile(fn, backend="hologram")(x2, w2)
        got.backward()
    torch.testing.assert_close(got, ref, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(x2.grad, x.grad, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(w2.grad, w.grad, atol=ATOL, rtol=RTOL)
    _no_fallback(graphs)


def _gemm_lines(graphs) -> list[str]:
    """The GEMM instructions of every program the graphs compiled to."""
    return [ln.split(" = ", 1)[1].split(" ")[0] for g in graphs for r in g.regions
            for ln in r.program_text.splitlines() if " = gemm." in ln]


def test_transformer_block_attention_is_batched_gemm():
    """q @ k^T and att @ v (and their backward products) are each ONE GEMM over the
    (batch, head) axes, with the heads read through permuted views: no broadcast
    multiply-reduce, no flattening of a permuted tensor into the batch axis."""
    torch.manual_seed(2)
    report = explain(lambda x: Block()(x).sum(), torch.randn(2, 5, 16))
    gemms = _gemm_lines(report.graphs)
    batched = sorted(g for g in gemms if g.count(",") == 3)
    # forward: scores q @ k^T and att @ v; backward: d(att), d(v), d(q) and d(k)^T
    assert batched == ["gemm.f32[2,2,5,5]"] * 2 + ["gemm.f32[2,2,5,8]"] * 3 + \
        ["gemm.f32[2,2,8,5]"], gemms
    assert not [g for g in gemms if g.count(",") == 2], gemms  # no 3-D (flattened) batch
    assert report.torch_ops == {}


@pytest.mark.parametrize("shapes", [((12, 64, 96), (12, 96, 64)), ((3, 0, 4), (3, 4, 5)),
                                    ((1, 7, 3), (1, 3, 2))])
def test_bmm_forward_backward_is_one_batched_gemm(shapes):
    """Sizes the old multiply-then-sum lowering left to PyTorch run as one GEMM each."""
    torch.manual_seed(3)
    a, c = (torch.randn(s, requires_grad=True) for s in shapes)
    a2, c2 = (t.detach().clone().requires_grad_() for t in (a, c))
    w = torch.randn(shapes[0][0], shapes[0][1], shapes[1][2])

    def fn(x, y):
        return (torch.bmm(x, y).tanh() * w).sum()

    ref = fn(a, c)
    ref.backward()
    with cb.collect_graphs() as graphs:
        got = torch.compile(fn, backend="hologram")(a2, c2)
        got.backward()
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=RTOL)
    torch.testing.assert_close(a2.grad, a.grad, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(c2.grad, c.grad, atol=ATOL, rtol=RTOL)
    _no_fallback(graphs)
    assert len(_gemm_lines(graphs)) == 3  # forward, and one per operand's gradient
    assert all(g.startswith(f"gemm.f32[{shapes[0][0]},") for g in _gemm_lines(graphs))


def test_baddbmm_and_broadcast_matmul_match_without_fallback():
    def fn(x, y, z, bias):
        h = torch.baddbmm(bias, x, y, beta=0.5, alpha=2.0)  # decomposed to bmm
        return (h.unsqueeze(0) @ z).sin().sum()  # [1, 4, 3, 5] @ [2, 1, 5, 6]: broadcast

    torch.manual_seed(5)
    args = [torch.randn(4, 3, 7), torch.randn(4, 7, 5), torch.randn(2, 1, 5, 6),
            torch.randn(4, 3, 5)]
    args = [t.requires_grad_() for t in args]
    twins = [t.detach().clone().requires_grad_() for t in args]
    ref = fn(*args)
    ref.backward()
    with cb.collect_graphs() as graphs:
        got = torch.compile(fn, backend="hologram")(*twins)
        got.backward()
    torch.testing.assert_close(got, ref, atol=ATOL, rtol=RTOL)
    for t, u in zip(twins, args, strict=True):
        torch.testing.assert_close(t.grad, u.grad, atol=ATOL, rtol=RTOL)
    _no_fallback(graphs)


def test_matmul_row_follows_torch_broadcasting():
    """aten.matmul rarely survives AOT autograd, but a graph that keeps it gets
    torch.matmul's rules (1-D operands, broadcast batch) through the builder."""
    from hologram.backends.reference import evaluate
    from hologram.isa import builder as b

    row = cb.ATEN_TABLE[torch.ops.aten.matmul]
    for sa, sb in [((2, 1, 3, 4), (5, 4, 2)), ((4,), (3, 4, 2)), ((3, 4), (4,))]:
        x, y = torch.randn(sa, dtype=torch.float64), torch.randn(sb, dtype=torch.float64)
        want = torch.matmul(x, y)
        ctx = cb.Ctx(None, cb.TInfo(torch.float64, tuple(want.shape)))
        p = b.program(lambda u, v, ctx=ctx: row(ctx, u, v), [("f64", sa), ("f64", sb)])
        (got,), _ = evaluate(p, [x.numpy(), y.numpy()])
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-12, atol=1e-12)


def test_unmerging_batch_axes_of_bmm_operands():
    from hologram.isa import Op
    from hologram.isa import builder as b

    def gemm_of(fn, specs):
        p = b.program(fn, specs)
        (g,) = [v for v in p.instructions if v.op is Op.GEMM]
        return g

    # merged (2, 3) batch on both sides -> a [2, 3, ...] GEMM over the permuted views
    g = gemm_of(lambda x, y: cb.batched_gemm(x.permute(0, 2, 1, 3).reshape(6, 4, 5),
                                              y.permute(0, 2, 1, 3).reshape(6, 4, 5)
                                              .permute(0, 2, 1)),
                [("f32", (2, 4, 3, 5)), ("f32", (2, 4, 3, 5))])
    assert g.shape == (2, 3, 4, 4)
    # one side merged, the other a plain [6, 5, 7]: that one is split (a view)
    g = gemm_of(lambda x, y: cb.batched_gemm(x.permute(0, 2, 1, 3).reshape(6, 4, 5), y),
                [("f32", (2, 4, 3, 5)), ("f32", (6, 5, 7))])
    assert g.shape == (2, 3, 4, 7)
    # two different splits: the 3-D product
    g = gemm_of(lambda x, y: cb.batched_gemm(x.reshape(6, 4, 5), y.reshape(6, 5, 2)),
                [("f32", (2, 3, 4, 5)), ("f32", (3, 2, 5, 2))])
    assert g.shape == (6, 4, 2)


def test_blas_thread_cap_counts_one_matrix_of_a_batch():
    """BLAS runs (and threads) per matrix of a batch: a batch of small products is
    small, a big 2-D product is not, whatever the batch multiplies up to."""
    from hologram.compiler import blas
    from hologram.isa import builder as b

    small = b.program(lambda x, y: x @ y, [("f32", (256, 32, 64)), ("f32", (256, 64, 32))])
    big = b.program(lambda x, y: x @ y, [("f32", (2, 256, 256)), ("f32", (2, 256, 256))])
    assert cb._blas_threads_for(big, 3) == 3
    assert cb._blas_threads_for(big, "auto") is None
    # With hologram's own GEMM driver there is no BLAS pool to cap; without it, small
    # products run on one BLAS thread.
    driver = blas.provider()[0] is not None
    assert cb._blas_threads_for(small, "auto") == (None if driver else 1)
    assert cb._matrix_macs(next(v for v in small.instructions if v.op.name == "GEMM")) \
        == 32 * 64 * 32


def test_changing_batch_size_replans_and_matches():
    torch.manual_seed(4)
    model, twin = _mlp(), None
    twin = copy.deepcopy(model)
    compiled = torch.compile(twin, backend="hologram")
    for bs in (3, 5, 8, 5):
        x = torch.randn(bs, 12)
        torch.testing.assert_close(compiled(x), model(x), atol=ATOL, rtol=RTOL)


def test_class_index_out_of_range_raises_like_torch():
    z = torch.randn(3, 4)
    bad = torch.tensor([0, 4, 1])
    with pytest.raises(IndexError):
        F.cross_entropy(z, bad)
    compiled = torch.compile(lambda z, t: F.cross_entropy(z, t), backend="hologram")
    compiled(z, torch.tensor([0, 3, 1]))
    with pytest.raises(IndexError, match="out of range"):
        compiled(z, bad)


def test_explain_reports_ops_programs_kernels_and_reduction():
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 3))
    x, t = torch.randn(4, 8), torch.tensor([0, 2, 1, 0])
    grads_before = [p.grad for p in model.parameters()]

    report = explain(lambda x, t: F.cross_entropy(model(x), t), x, t)
    text = str(report)
    assert [g.kind for g in report.graphs] == ["forward", "backward"]
    assert report.hologram_ops["aten.addmm"] == 2 and report.torch_ops == {}
    assert report.programs == 2 and report.kernels >= 2
    assert report.launches_before >= report.launches_after > 0
    for needle in ("forward graph", "backward graph", "aten.addmm", "aten.nll_loss_forward",
                   "launches", "operation reduction"):
        assert needle in text
    assert [p.grad for p in model.parameters()] == grads_before  # explain has no side effects

    odd = explain(lambda x: torch.logcumsumexp(x, 0).exp(), x)
    assert "aten.logcumsumexp" in odd.torch_ops
    assert "in PyTorch: aten.logcumsumexp" in str(odd)


def test_supported_ops_table_covers_the_brief():
    names = set(cb.supported_ops())
    for op in ("add", "sub", "mul", "div", "neg", "exp", "log", "tanh", "sigmoid", "relu", "gelu",
               "sqrt", "rsqrt", "pow", "abs", "maximum", "minimum", "where", "gt", "lt", "eq",
               "ge", "le", "sum", "mean", "amax", "amin", "_softmax", "_log_softmax",
               "_softmax_backward_data", "_log_softmax_backward_data", "native_layer_norm",
               "native_layer_norm_backward", "mm", "addmm", "bmm", "t", "transpose", "permute",
               "view", "reshape", "_unsafe_view", "expand", "unsqueeze", "squeeze", "detach",
               "clone", "alias", "threshold_backward", "gelu_backward", "tanh_backward",
               "sigmoid_backward", "mse_loss", "mse_loss_backward", "nll_loss_forward",
               "nll_loss_backward", "full", "scalar_tensor", "zeros_like", "ones_like",
               "_to_copy"):
        assert f"aten.{op}" in names, op


def test_tensors_off_the_cpu_run_in_pytorch_with_a_reason():
    # The meta device stands in for one no executor takes (a cpu executor takes host
    # tensors only; a cuda one CUDA tensors too: test_torch_compile_cuda.py).
    f = torch.compile(lambda x: (x * 2.0).exp().sum(), backend="hologram")
    with cb.collect_graphs() as graphs:
        out = f(torch.ones(3, device="meta"))
    assert out.device.type == "meta"
    assert all(not g.regions for g in graphs)
    assert all("graph tensors are on meta; this executor takes tensors on one of cpu" in why
               for g in graphs for _, why in g.torch_ops)


def test_training_demo_runs_and_agrees_with_eager(capsys):
    pytest.importorskip("sklearn")
    pytest.importorskip("tqdm")
    from hologram.demo_train import main

    assert main(["--epochs", "2", "--no-progress"]) == 0
    out = capsys.readouterr().out
    for needle in ("eager", "hologram", "test acc", "median step", "operation reduction"):
        assert needle in out


def _has_entry_point() -> bool:
    eps = importlib.metadata.entry_points(group="torch_dynamo_backends")
    return any(ep.name == "hologram" for ep in eps)


@pytest.mark.skipif(not _has_entry_point(),
                    reason="hologram is not installed with its entry points (pip install -e .)")
def test_entry_point_registers_backend_without_import():
    code = textwrap.dedent("""
        import sys, warnings
        warnings.simplefilter("ignore")
        import torch, torch._dynamo
        assert "hologram" in torch._dynamo.list_backends(), torch._dynamo.list_backends()
        assert "hologram_torch" not in sys.modules
        f = torch.compile(lambda x: (x * 2.0).exp().sum(), backend="hologram")
        x = torch.arange(4.0)
        torch.testing.assert_close(f(x), (x * 2.0).exp().sum())
        assert "hologram_torch.compile_backend" in sys.modules
        print("ok")
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=env, cwd=os.path.dirname(__file__) or ".")
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_permuted_inputs_are_read_in_their_traced_layout():
    """A transposed saved tensor (the MLP's weights in backward) is read as laid out,
    with the permute inside the program, instead of copied to contiguous per call."""
    import torch.fx

    g = torch.fx.Graph()
    n = g.placeholder("w")
    for t, want in ((torch.zeros(3, 4).t(), (1, 0)), (torch.zeros(3, 4), None),
                    (torch.zeros(2, 3, 4).permute(2, 0, 1), (1, 2, 0)),
                    (torch.zeros(4, 6)[:, ::2], None), (torch.zeros(5), None),
                    (torch.zeros(1, 4).t(), None)):
        n.meta["val"] = t
        order = cb._physical_order(n)
        assert order == want, (t.shape, t.stride(), order)
        if order is not None:
            assert t.permute(order).is_contiguous()
    # end to end: gradients through a transposed weight match eager
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 8)
    x = torch.randn(32, 16)
    ref = copy.deepcopy(lin)
    torch.compile(lin, backend="hologram")(x).square().sum().backward()
    ref(x).square().sum().backward()
    torch.testing.assert_close(lin.weight.grad, ref.weight.grad, rtol=1e-5, atol=1e-5)


def _stored_values(program_text: str) -> list[str]:
    return [line.split()[1] for line in program_text.splitlines() if line.startswith("stg")]


def test_views_of_stored_values_are_aliases_not_second_outputs():
    """AOT autograd saves both ``relu`` and ``detach(relu)``: the detach is made by
    PyTorch from the stored tensor (an alias, as in eager), not stored twice."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                          nn.Linear(16, 4))
    graphs = _check_train_step(model, lambda m, x: (m(x) ** 2).mean(), torch.randn(6, 8))
    _no_fallback(graphs)
    for g in graphs:
        for r in g.regions:
            stored = _stored_values(r.program_text)
            assert len(stored) == len(set(stored)), (g.kind, r.program_text)
    fw = next(g for g in graphs if g.kind == "forward")
    assert len(_stored_values(fw.regions[0].program_text)) == 3  # relu, relu_1, logits


class _Attention(nn.Module):
    """Scores, softmax and the weighted sum: AOT autograd saves the softmax for the
    backward twice, as ``detach(softmax)`` and as ``view(expand(softmax))``."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, x):
        q, k, v = self.qkv(x).split(8, dim=-1)
        att = torch.softmax(q @ k.transpose(-1, -2) / 8 ** 0.5, dim=-1)
        return att @ v


def test_several_views_of_one_value_are_stored_once():
    torch.manual_seed(0)
    x = torch.randn(3, 5, 8)
    graphs = _check_train_step(_Attention(), lambda m, x: (m(x) ** 2).mean(), x)
    _no_fallback(graphs)
    fw = next(g for g in graphs if g.kind == "forward")
    text = fw.regions[0].program_text
    # The softmax (3x5x5) leaves the forward program once, whatever views it is saved as.
    softmax_stores = [line for line in text.splitlines()
                      if line.startswith("stg") and ("[3,5,5]" in line or "[15,5]" in line)]
    assert len(softmax_stores) == 1, text


def test_region_reads_tensors_in_place_and_copies_other_layouts():
    """The per-call path hands tensors' addresses to the program when dtype, shape and
    strides are the planned ones, and views or copies anything else first."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from hologram.interop import default_executor

    def f(x, w):
        return torch.relu(x @ w.t() + 1.0) * x.sum()

    x, w = torch.randn(5, 4), torch.randn(3, 4)
    gm = make_fx(f)(x, w)
    graph = cb.HologramGraph(gm, "inference", default_executor("cpu"))
    plan = graph.plans[0]
    assert len(plan.regions) == 1
    region = plan.regions[0]
    compiled = graph.executor.compile(region.program)
    assert graph.executor.backend.pointer_launcher(compiled) is not None
    want = f(x, w)
    copied = []
    real_host_array = cb._host_array

    def host_array(t, spec):
        copied.append(t)
        return real_host_array(t, spec)

    cases = {  # name: (x, copies made)
        "contiguous": (x, 0),
        "requires grad": (x.clone().requires_grad_(), 0),
        "offset view": (torch.randn(6, 4)[1:].copy_(x), 0),
        "transposed storage": (torch.randn(4, 5).t().copy_(x), 1),
        "strided": (torch.randn(5, 8)[:, ::2].copy_(x), 1),
    }
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cb, "_host_array", host_array)
        for name, (a, n_copies) in cases.items():
            copied.clear()
            out = graph([a, w])
            got = out[0] if isinstance(out, (list, tuple)) else out
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=name)
            assert len(copied) == n_copies, name


def test_pointer_launcher_checks_its_arguments():
    import numpy as np

    import hologram as hg

    ex = hg.Executor(backend="cpu")
    f = hg.jit(lambda a, b: a * b + 1.0)
    a, b = np.arange(6, dtype=np.float32), np.full(6, 2.0, np.float32)
    compiled = ex.compile(f.program_for(a, b)[0])
    run = ex.backend.pointer_launcher(compiled)
    out = np.zeros(6, np.float32)
    run([a.ctypes.data, b.ctypes.data, out.ctypes.data])
    np.testing.assert_array_equal(out, a * b + 1.0)
    with pytest.raises(ValueError, match="expected 3 addresses"):
        run([a.ctypes.data, b.ctypes.data])
    assert hg.Executor(backend="reference").backend.pointer_launcher(compiled) is None


def test_executor_without_raw_address_launch_takes_the_array_path():
    """An executor whose backend has no raw-address launch (the reference interpreter
    here, webgpu elsewhere) runs the same plans through NumPy arrays, and agrees."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    twin = copy.deepcopy(model)
    x = torch.randn(5, 6)
    (model(x) ** 2).mean().backward()
    compiled = torch.compile(twin, backend="hologram", options={"executor": "reference"})
    with cb.collect_graphs() as graphs:
        (compiled(x) ** 2).mean().backward()
    _no_fallback(graphs)
    assert graphs and all(g.executor == "reference" for g in graphs)
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, atol=ATOL, rtol=RTOL)
