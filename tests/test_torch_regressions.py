"""Regression tests for the ``torch.compile`` backend's bugs (issue 17), one per report.

Zero-size inputs used to crash the process (SIGSEGV: a kernel stored element 0 of an
empty output, a null pointer from torch), so those cases each run in a subprocess: a
segfault is a failed test, not a dead test run. Every case compares with eager PyTorch
in float64 where it can.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest

torch = pytest.importorskip("torch")

_PRELUDE = """
import torch, hologram_torch  # noqa: F401
torch.manual_seed(0)
def check(fn, *xs, grad=False):
    ys = [x.detach().clone().requires_grad_(grad) for x in xs]
    want = fn(*ys)
    got_in = [x.detach().clone().requires_grad_(grad) for x in xs]
    got = torch.compile(fn, backend="hologram", fullgraph=False)(*got_in)
    torch.testing.assert_close(got, want, equal_nan=True)
    if grad:
        want.sum().backward()
        got.sum().backward()
        for a, b in zip(got_in, ys):
            torch.testing.assert_close(a.grad, b.grad, equal_nan=True)
    print("ok", tuple(got.shape))
"""

# name -> the body run after _PRELUDE: one per report (its reproducer, then its
# neighbours), each compared with eager; float64 so the comparison is tight
ZERO_SIZE_CASES = {
    "sum": ("check(lambda x: x.sum(1), torch.randn(0, 3, dtype=torch.float64))\n"
            "check(lambda x: x.sum(0) + 1, torch.randn(0, 3, dtype=torch.float64))"),
    "layer_norm": (
        "check(lambda x: torch.nn.functional.layer_norm(x, [1]),"
        " torch.randn(0, 1, dtype=torch.float64), grad=True)\n"
        "w, b = torch.randn(4, dtype=torch.float64), torch.randn(4, dtype=torch.float64)\n"
        "check(lambda x: torch.nn.functional.layer_norm(x, [4], w, b),"
        " torch.randn(2, 0, 4, dtype=torch.float64), grad=True)\n"
        "check(lambda x: torch.softmax(x, -1), torch.randn(4, 0, dtype=torch.float64),"
        " grad=True)"),
    "vecdot": ("check(lambda x, y: torch.linalg.vecdot(x, y),"
               " torch.randn(0, 0, dtype=torch.float64), torch.randn(0, 0, dtype=torch.float64))\n"
               "check(lambda x, y: torch.relu(x @ y + 1), torch.randn(3, 0, dtype=torch.float64),"
               " torch.randn(0, 4, dtype=torch.float64), grad=True)"),
    "repeat_backward": ("check(lambda x: x.repeat(2) * 2,"
                        " torch.randn(0, dtype=torch.float64), grad=True)\n"
                        "check(lambda x: torch.tile(x, (2, 3)).exp(),"
                        " torch.randn(0, dtype=torch.float64), grad=True)"),
    "group_norm_backward": ("check(lambda x: torch.nn.functional.group_norm(x, 1),"
                            " torch.randn(0, 2, dtype=torch.float64), grad=True)"),
    "jit_sum": ("import hologram as hg, numpy as np\n"
                "out = hg.jit(lambda x: x.sum(1))(np.zeros((0, 3), np.float32))\n"
                "assert out.shape == (0,)\n"
                "print('ok', out.shape)"),
}


def run_isolated(body: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """``body`` after the prelude in a fresh interpreter (a crash cannot take pytest
    down with it)."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", TORCHDYNAMO_VERBOSE="0")
    code = _PRELUDE + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.fixture(scope="module")
def zero_size_runs(request):
    """The selected cases' subprocesses, two at a time (each is mostly importing torch),
    started together: name -> a future of its CompletedProcess."""
    names = [item.callspec.params["name"] for item in request.session.items
             if getattr(item, "originalname", "") == "test_zero_size_inputs_do_not_crash"]
    pool = ThreadPoolExecutor(max_workers=2)
    try:
        yield {n: pool.submit(run_isolated, ZERO_SIZE_CASES[n]) for n in names}
    finally:
        pool.shutdown(cancel_futures=True)


@pytest.mark.parametrize("name", sorted(ZERO_SIZE_CASES))
def test_zero_size_inputs_do_not_crash(name, zero_size_runs):
    r = zero_size_runs[name].result()
    assert r.returncode == 0, (f"exit code {r.returncode} (-11 is SIGSEGV)\n"
                               f"stdout:\n{r.stdout[-2000:]}\nstderr:\n{r.stderr[-4000:]}")
    assert "ok" in r.stdout


# --------------------------------------------------------------------------- effect tokens

def _spd(w):
    """A well-conditioned symmetric positive definite matrix from ``w``."""
    return w @ w.mT + 4 * torch.eye(w.shape[-1], dtype=w.dtype)


# name -> loss of (weight, input); each graph holds an op whose error check is effectful
# (aten._linalg_check_errors under with_effects); matrix_power's negative powers invert
# (a positive power is a chain of mm, checked too)
LINALG_STEPS = {
    "cholesky": lambda w, x: (torch.linalg.cholesky(_spd(w)) @ x).tanh().sum(),
    "inv": lambda w, x: (torch.linalg.inv(_spd(w)) @ x).exp().mean(),
    "solve": lambda w, x: torch.linalg.solve(_spd(w), x).square().sum(),
    "matrix_power_neg": lambda w, x: (torch.linalg.matrix_power(_spd(w), -2) @ x).sum(),
    "matrix_power": lambda w, x: (torch.linalg.matrix_power(w, 3) @ x).sigmoid().sum(),
}


@pytest.mark.parametrize("name", sorted(LINALG_STEPS))
def test_training_through_linalg_matches_eager(name):
    """Forward + backward + an SGD step through cholesky/inv/solve/matrix_power: graphs
    with effect tokens go to AOT autograd's runtime (they used to reach the direct
    training path and fail with 'zip() argument 2 is shorter than argument 1')."""
    torch._dynamo.reset()
    loss_fn = LINALG_STEPS[name]
    gen = torch.Generator().manual_seed(len(name))
    w0 = torch.randn(2, 5, 5, dtype=torch.float64, generator=gen) * 0.5
    x = torch.randn(2, 5, 3, dtype=torch.float64, generator=gen)
    results = []
    for fn in (loss_fn, torch.compile(loss_fn, backend="hologram")):
        w = torch.nn.Parameter(w0.clone())
        opt = torch.optim.SGD([w], lr=0.1)
        losses = []
        for _ in range(2):  # the second step reuses the compiled graphs
            opt.zero_grad()
            loss = fn(w, x)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        results.append((torch.stack(losses), w.grad.clone(), w.detach().clone()))
    (l0, g0, w_eager), (l1, g1, w_comp) = results
    torch.testing.assert_close(l1, l0, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(g1, g0, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(w_comp, w_eager, rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------------- metadata checks

def _to_f64_loss(x):
    return ((x.to(torch.float64) * 2).exp() + x.type_as(torch.ones((), dtype=torch.float64))
            ).sum(1)


def test_assert_tensor_metadata_keeps_the_plan_static_and_runs_in_hologram():
    """``x.to(float64)`` on an input that needs a gradient leaves
    ``aten._assert_tensor_metadata`` (no value, no recorded shape) in the forward graph.
    It used to make the graph 'dynamic', so its first call ran wholly in PyTorch while
    explain reported programs. Now the plan is static and the check is a no-op row."""
    from hologram_torch.explain import explain

    gen = torch.Generator().manual_seed(3)
    x = torch.randn(6, 5, generator=gen).requires_grad_()
    report = explain(lambda x: _to_f64_loss(x).sum(), x)
    fw = next(g for g in report.graphs if g.kind == "forward")
    assert fw.hologram_ops["aten._assert_tensor_metadata"] >= 1  # the node is there
    assert not report.eager_graphs, str(report)
    assert report.programs >= 2 and "aten._assert_tensor_metadata" not in report.torch_ops
    # and the values: forward and gradient against eager (float64 compute)
    torch._dynamo.reset()
    xc = x.detach().clone().requires_grad_()
    got = torch.compile(_to_f64_loss, backend="hologram")(xc)
    want = _to_f64_loss(x)
    torch.testing.assert_close(got, want)
    got.sum().backward()
    want.sum().backward()
    torch.testing.assert_close(xc.grad, x.grad)


def test_metadata_check_that_fails_is_left_to_pytorch():
    """The row checks the traced metadata; a mismatch goes back to PyTorch (which raises
    as eager does), never silently dropped."""
    from hologram.isa.builder import Var, ldg
    from hologram_torch.lowering import ATEN_TABLE, Ctx, Unsupported

    row = ATEN_TABLE[torch.ops.aten._assert_tensor_metadata]
    g = torch.fx.Graph()
    a = g.placeholder("a")
    a.meta["val"] = torch.empty(2, 3, dtype=torch.float32)
    node = g.call_function(torch.ops.aten._assert_tensor_metadata.default, (a,),
                           {"dtype": torch.float64})
    var = Var(ldg(0, "f32", (2, 3)))
    ctx = Ctx(node, None)
    with pytest.raises(Unsupported, match="dtype"):
        row(ctx, var, dtype=torch.float64)
    with pytest.raises(Unsupported, match="size"):
        row(ctx, var, size=[3, 2])
    with pytest.raises(Unsupported, match="stride"):
        row(ctx, var, stride=[1, 2])
    assert row(ctx, var, size=[2, 3], stride=[3, 1], dtype=torch.float32) is None


def test_explain_says_when_a_call_ran_in_pytorch():
    """Dynamic shapes: the first call with new shapes runs eagerly to record them.
    explain reports that call as PyTorch, with the programs only as planned."""
    from hologram_torch.explain import explain

    x = torch.randn(7, 4, dtype=torch.float64)
    torch._dynamo.mark_dynamic(x, 0)
    report = explain(lambda x: (x * 2).exp().sum(1), x)
    assert report.eager_graphs and report.programs == 0 and report.kernels == 0
    assert report.planned_programs >= 1
    assert set(report.torch_ops) >= {"aten.mul", "aten.exp", "aten.sum"}
    assert all("dynamic shapes" in why for why in report.torch_ops.values())
    text = str(report)
    assert "all ran in PyTorch on this call" in text and "planned, not run" in text
    assert "no hologram programs ran" in report.summary_line()


# --------------------------------------------------------------------------- traced strides

@torch.library.custom_op("hologram_test::echo", mutates_args=())
def _echo(x: torch.Tensor) -> torch.Tensor:
    """A copy with x's own strides (clone keeps a dense layout), so a later ``view`` of
    it works only where x has the traced strides. No hologram translation: it always
    runs in PyTorch, on what a program handed over."""
    return x.clone()


@_echo.register_fake
def _echo_fake(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


_echo.register_autograd(lambda ctx, grad: grad)  # the identity's gradient


@torch.library.custom_op("hologram_test::strides_of", mutates_args=())
def _strides_of(x: torch.Tensor) -> torch.Tensor:
    """The strides PyTorch code sees on x."""
    return torch.tensor(x.stride(), dtype=torch.int64)


@_strides_of.register_fake
def _strides_of_fake(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty((x.dim(),), dtype=torch.int64)


def _view_chain(kind: int, a: int, b: int):
    """A view of a 3-D value whose traced strides are not row-major (or, for the last
    kinds, not even dense): transposes, permutes, permutes of reshapes, windows."""
    def f(y):
        if kind == 0:
            return y.transpose(a % 3, (a + 1 + b % 2) % 3)
        if kind == 1:
            perms = [(2, 0, 1), (1, 2, 0), (0, 2, 1), (2, 1, 0)]
            return y.permute(perms[(a + b) % 4])
        if kind == 2:  # a permute of a reshape: the attention head split
            n0, n1, n2 = y.shape
            return y.reshape(n0, n1, 2, n2 // 2).permute(0, 2, 1, 3)
        if kind == 3:  # windows of one value (q, k, v of one projection), transposed
            q, k, v = y.split(y.shape[-1] // 3, dim=-1)
            return (q, k, v)[a % 3].transpose(0, 1)
        return y.narrow(b % 3, 1, y.shape[b % 3] - 1).transpose(0, 2)  # a strided window
    return f


@pytest.mark.parametrize("kind", range(5))
@pytest.mark.parametrize("a, b", [(0, 1), (1, 0), (2, 3)])
def test_pytorch_reads_program_outputs_with_traced_strides(kind, a, b):
    """A program's output read by ops that run in PyTorch (custom ops with no
    translation) and returned from the graph has eager's strides, so a ``view`` after
    the fallback works and the results match eager (float64)."""
    torch._dynamo.reset()
    view = _view_chain(kind, a, b)

    def fn(x, w):
        h = (x * 2 + w).tanh()  # computed in a program
        v = view(h)
        e = torch.ops.hologram_test.echo(v)  # PyTorch reads the program's output
        flat = e.view(-1) if e.is_contiguous() else e.transpose(0, -1).reshape(-1)
        return torch.ops.hologram_test.strides_of(v), flat.exp(), v, e.sum(0)

    gen = torch.Generator().manual_seed(kind * 7 + a)
    x = torch.randn(4, 6, 12, dtype=torch.float64, generator=gen)
    w = torch.randn(12, dtype=torch.float64, generator=gen)
    x[0, 0, 0], x[1, 2, 3] = float("nan"), float("inf")
    want = fn(x, w)
    got = torch.compile(fn, backend="hologram")(x, w)
    for g, e in zip(got, want, strict=True):
        torch.testing.assert_close(g, e, equal_nan=True)
        assert g.stride() == e.stride(), (g.stride(), e.stride())


def test_traced_stride_views_feed_a_fallback_in_training():
    """The same under autograd (the direct training path): saved values and gradients
    go through the fallback op with eager's strides."""
    torch._dynamo.reset()

    def fn(x, w):  # GPT-2's attention, with the fallback where its SDPA is
        q, k, v = (x @ w).tanh().split(8, dim=-1)
        q, k, v = (t.reshape(2, 5, 2, 4).transpose(1, 2) for t in (q, k, v))
        # echo keeps q's layout: its transpose is viewable only if q had eager's strides
        heads = torch.ops.hologram_test.echo(q).transpose(1, 2).view(2, 5, 8)
        att = (q @ k.transpose(-2, -1)).softmax(-1) @ v
        return (heads * att.transpose(1, 2).reshape(2, 5, 8)).view(10, 8).sum(0)

    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 5, 8, dtype=torch.float64, generator=gen)
    w0 = torch.randn(8, 24, dtype=torch.float64, generator=gen)
    w_e, w_c = w0.clone().requires_grad_(), w0.clone().requires_grad_()
    want = fn(x, w_e)
    got = torch.compile(fn, backend="hologram")(x, w_c)
    torch.testing.assert_close(got, want)
    want.square().sum().backward()
    got.square().sum().backward()
    torch.testing.assert_close(w_c.grad, w_e.grad)
