"""Fused attention in the ISA (ATTN, ATTN_LSE, ATTN_DQ/DK/DV): verifier, text form, the
reference against ATen and float64 PyTorch, the CPU driver against the reference
(forward and backward, shapes across block boundaries, GQA, masks, causal with L < S
and L > S, NaN/inf, empty, non-contiguous operands), one step per computation, the
WGSL kernels on lavapipe and the CUDA kernels through NVRTC."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hologram as hg
from hologram.backends import registry
from hologram.backends.reference import evaluate
from hologram.compiler import attention, nvrtc
from hologram.compiler.lower import lower
from hologram.compiler.render_cuda import render_cuda
from hologram.compiler.schedule import AttentionPlan, KernelPlan
from hologram.errors import DTypeError, ParseError, VerifyError
from hologram.isa import Op, Program
from hologram.isa import builder as b

from .programs import compiled_and_reference, programs, random_inputs

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
NP = {"f32": np.float32, "f64": np.float64}
TOL = {"f32": (2e-5, 2e-5), "f64": (1e-11, 1e-12)}


def _cpu() -> hg.Executor:
    ex = hg.default_executor("cpu")
    if "C via" not in ex.backend.describe():
        pytest.skip("no C compiler: the cpu backend is the reference interpreter")
    return ex


# --- building programs --------------------------------------------------------------------
def attention_program(batch: tuple[int, ...], n_q: int, n_k: int, e: int, ev: int,
                      dtype: str = "f32", *, groups: int = 1, causal: bool = False,
                      mask: bool = False, scale: float | None = None,
                      parts: tuple[str, ...] = ("out", "lse", "dq", "dk", "dv"),
                      q_layout: str = "plain") -> Program:
    """Forward and backward of one attention over ``[*batch, G, L, E]`` queries, keys and
    values ``[*batch, S, *]`` shared by the G query groups (an EXPAND, GQA's layout), the
    parts listed stored (dk, dv summed over G as the torch translation does). Inputs:
    q, k, v, dout, [mask [L, S] broadcast over batch and groups]. ``q_layout='permuted'``
    stores q as [*batch, L, G, E] (a model's [B, L, H, E]) and permutes it."""
    g = groups
    qs = (*batch, g, n_q, e)
    specs = [(dtype, (*batch, n_q, g, e) if q_layout == "permuted" else qs),
             (dtype, (*batch, n_k, e)), (dtype, (*batch, n_k, ev)),
             (dtype, (*batch, g, n_q, ev))]
    if mask:
        specs.append((dtype, (n_q, n_k)))

    def fn(q, k, v, dout, *rest):
        nb = len(batch)
        if q_layout == "permuted":
            q = q.permute((*range(nb), nb + 1, nb, nb + 2))
        kk = k.reshape((*batch, 1, n_k, e)).expand((*batch, g, n_k, e))
        vv = v.reshape((*batch, 1, n_k, ev)).expand((*batch, g, n_k, ev))
        m = None
        if rest:
            m = rest[0].reshape((1,) * (nb + 1) + (n_q, n_k)).expand((*batch, g, n_q, n_k)).v
        out, lse = b.attention(q.v, kk.v, vv.v, m, scale=scale, causal=causal)
        dq, dk, dv = b.attention_grads(dout.v, q.v, kk.v, vv.v, out, lse, m, scale=scale,
                                       causal=causal)
        got = {"out": out, "lse": lse, "dq": dq,
               "dk": b.reduce(Op.RSUM, dk, len(batch)), "dv": b.reduce(Op.RSUM, dv, len(batch))}
        return tuple(hg.isa.Var(got[p]) for p in parts)

    return b.program(fn, specs)


def inputs_for(p: Program, seed: int, *, special: bool = False,
               dead_rows: bool = True) -> list[np.ndarray]:
    """Random inputs; a mask input ([L, S], the last when there are five) hides ~30% of
    the keys and (``dead_rows``) every key of query row 1; ``special`` puts NaN, inf and
    -inf into q, k and v."""
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal(s).astype(d.np_dtype) for d, s in p.inputs]
    if len(xs) == 5 and xs[4].size:
        m = xs[4]
        m[rng.random(m.shape) < 0.3] = -np.inf
        if dead_rows and m.shape[0] > 1:
            m[1, :] = -np.inf
    if special:
        for x in xs[:3]:
            if x.size >= 3:
                flat = x.reshape(-1)
                flat[rng.choice(flat.size, 3, replace=False)] = [np.nan, np.inf, -np.inf]
    return xs


def assert_matches(got: list[np.ndarray], want: list[np.ndarray], rtol: float,
                   atol: float) -> None:
    """Close where finite (relative to each output's largest finite entry), NaN and
    +-inf in the same places."""
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.shape == w.shape, (i, g.shape, w.shape)
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=f"output {i}: NaN")
        np.testing.assert_array_equal(np.isposinf(g), np.isposinf(w), err_msg=f"output {i}")
        np.testing.assert_array_equal(np.isneginf(g), np.isneginf(w), err_msg=f"output {i}")
        fin = np.isfinite(w)
        if fin.any():
            scale = max(1.0, float(np.abs(w[fin]).max()))
            np.testing.assert_allclose(g[fin], w[fin], rtol=rtol, atol=atol * scale,
                                       err_msg=f"output {i}")


def run_cpu(p: Program, xs: list[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    return compiled_and_reference(_cpu(), p, xs)


# --- the instructions ---------------------------------------------------------------------
def test_builder_types_the_parts():
    q, k, v = b.ldg(0, "f32", (2, 5, 8)), b.ldg(1, "f32", (2, 7, 8)), b.ldg(2, "f32", (2, 7, 3))
    out, lse = b.attention(q, k, v)
    assert (out.op, out.shape, lse.op, lse.shape) == (Op.ATTN, (2, 5, 3), Op.ATTN_LSE, (2, 5))
    assert out.attr("scale") == 1 / math.sqrt(8) and out.attr("causal") is False
    dq, dk, dv = b.attention_grads(b.ldg(3, "f32", (2, 5, 3)), q, k, v, out, lse, causal=True)
    assert (dq.shape, dk.shape, dv.shape) == ((2, 5, 8), (2, 7, 8), (2, 7, 3))
    assert b.attention(q, k, v)[0] is out  # hash-consed: the same instruction
    assert b.default_attention_scale(0) == math.inf


@pytest.mark.parametrize("make, match", [
    (lambda q, k, v, m: b.make(Op.ATTN, (q, k), {"scale": 1.0, "causal": False}),
     "takes 3 operands"),
    (lambda q, k, v, m: b.make(Op.ATTN, (q, k, v, m, m), {"scale": 1.0, "causal": False}),
     "optional mask"),
    (lambda q, k, v, m: b.attention(q, b.ldg(5, "f32", (2, 7, 4)), v), "operand k"),
    (lambda q, k, v, m: b.attention(q, k, b.ldg(5, "f32", (2, 6, 3))), "operand v"),
    (lambda q, k, v, m: b.attention(q, k, v, b.ldg(5, "f32", (2, 5, 6))), "operand mask"),
    (lambda q, k, v, m: b.attention(q, k, v, b.ldg(5, "f32", (1, 5, 7))), "expand broadcast"),
    (lambda q, k, v, m: b.attention(q, b.ldg(5, "f64", (2, 7, 8)), v), "is f64, q is f32"),
    (lambda q, k, v, m: b.attention(*(b.ldg(i, "i32", s) for i, s in
                                      enumerate([(5, 8), (7, 8), (7, 3)]))), "floating"),
    (lambda q, k, v, m: b.attention(b.ldg(5, "f32", (8,)), b.ldg(6, "f32", (8,)),
                                    b.ldg(7, "f32", (8,))), "rank >= 2"),
    (lambda q, k, v, m: b.make(Op.ATTN, (q, k, v), {"scale": 1, "causal": False}),
     "scale= a float"),
    (lambda q, k, v, m: b.make(Op.ATTN, (q, k, v), {"scale": 1.0, "causal": 1}),
     "causal= True or False"),
    (lambda q, k, v, m: b.make(Op.ATTN, (q, k, v), {"scale": 1.0, "causal": True, "axis": 0}),
     "attributes"),
    (lambda q, k, v, m: b.make(Op.ATTN_DQ, (q, k, v), {"scale": 1.0, "causal": True}),
     "takes 6 operands"),
    (lambda q, k, v, m: b.attention_grads(q, q, k, v, q, b.ldg(5, "f32", (2, 5))),
     "operand dout"),
])
def test_verifier_rejects_bad_operands(make, match):
    q, k, v = b.ldg(0, "f32", (2, 5, 8)), b.ldg(1, "f32", (2, 7, 8)), b.ldg(2, "f32", (2, 7, 3))
    m = b.ldg(3, "f32", (2, 5, 7))
    with pytest.raises(VerifyError, match=match):
        make(q, k, v, m)


def test_text_form_round_trips_and_parsed_programs_are_checked():
    p = attention_program((2,), 5, 7, 8, 3, causal=True, mask=True, scale=0.125)
    text = str(p)
    assert "attn.f32[2,1,5,3]" in text and "causal=True" in text and "scale=0.125" in text
    q = Program.parse(text)
    assert q == p and q.hash == p.hash
    bad = text.replace("scale=0.125", "scale=1", 1)
    with pytest.raises((VerifyError, ParseError)):
        Program.parse(bad).verify()


# --- the reference against ATen and float64 PyTorch ---------------------------------------
def test_reference_matches_aten_flash_attention():
    """The reference is ATen's CPU op: scale, top-left causal alignment with L < S and
    L > S, additive masks with fully masked rows (out 0, logsumexp 0), and the backward."""
    torch = pytest.importorskip("torch")
    fwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    bwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default
    for n_q, n_k, causal in ((5, 9, True), (9, 5, True), (6, 6, False)):
        p = attention_program((2,), n_q, n_k, 8, 8, "f64", causal=causal, mask=True,
                              scale=0.3)
        xs = inputs_for(p, n_q * 10 + n_k)
        want, _ = evaluate(p, xs)
        q, k, v, dout, mask = (torch.from_numpy(x) for x in xs)
        out, lse = fwd(q, k[:, None], v[:, None], 0.0, causal, attn_mask=mask, scale=0.3)
        dq, dk, dv = bwd(dout, q, k[:, None], v[:, None], out, lse, 0.0, causal,
                         attn_mask=mask, scale=0.3)
        for got, ref in zip(want, (out, lse, dq, dk[:, 0], dv[:, 0]), strict=True):
            np.testing.assert_allclose(got, ref.numpy(), rtol=1e-12, atol=1e-12)
        assert np.all(want[0][:, :, 1] == 0) and np.all(want[1][:, :, 1] == 0)  # dead row


def test_reference_matches_float64_autograd_with_e_not_ev():
    """E != Ev (ATen's op refuses it): against softmax(q k^T s + m) v and its autograd
    gradients in float64."""
    torch = pytest.importorskip("torch")
    p = attention_program((3,), 4, 6, 5, 3, "f64", causal=True, mask=True,
                          parts=("out", "dq", "dk", "dv"))
    xs = inputs_for(p, 1, dead_rows=False)
    xs[4][np.isinf(xs[4])] = -7.0  # every row keeps a key: no 0/0 in PyTorch's softmax
    want, _ = evaluate(p, xs)
    q, k, v, dout, mask = (torch.from_numpy(x).requires_grad_(True) for x in xs)
    hidden = torch.ones(4, 6, dtype=torch.bool).triu(1)
    s = (q @ k[:, None].transpose(-1, -2)) / math.sqrt(5) + mask
    out = torch.softmax(s.masked_fill(hidden, -math.inf), -1) @ v[:, None]
    out.backward(dout)
    for got, ref in zip(want, (out, q.grad, k.grad, v.grad), strict=True):
        np.testing.assert_allclose(got, ref.detach().numpy(), rtol=1e-12, atol=1e-12)


# --- the CPU driver ------------------------------------------------------------------------
CASES = [  # batch, L, S, E, Ev, groups, causal, mask, q layout
    ((2,), 5, 7, 8, 6, 1, False, False, "plain"),
    ((), 1, 1, 1, 1, 1, False, False, "plain"),
    ((2, 3), 70, 300, 16, 8, 1, True, False, "plain"),  # L < S, not multiples of the blocks
    ((2,), 300, 70, 16, 24, 2, True, True, "permuted"),  # L > S, GQA, model layout
    ((1,), 130, 257, 33, 7, 3, False, True, "permuted"),
    ((2,), 64, 256, 64, 64, 1, True, False, "plain"),  # exactly one block each way
]


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c[:8])))
def test_cpu_matches_reference(case, dtype):
    batch, n_q, n_k, e, ev, g, causal, mask, layout = case
    p = attention_program(batch, n_q, n_k, e, ev, dtype, groups=g, causal=causal, mask=mask,
                          q_layout=layout)
    got, want = run_cpu(p, inputs_for(p, n_q + n_k))
    assert_matches(got, want, *TOL[dtype])


@pytest.mark.parametrize("causal", [False, True])
def test_cpu_special_values_match_reference(causal):
    """NaN and +-inf in q, k, v: the same NaN/inf positions as the reference in every
    output (the causal block skip is off where it could hide a NaN)."""
    for seed in range(3):
        p = attention_program((2,), 40, 90, 8, 8, "f32", groups=2, causal=causal, mask=True)
        got, want = run_cpu(p, inputs_for(p, seed, special=True))
        assert_matches(got, want, *TOL["f32"])


def test_cpu_small_blocks_cross_every_boundary(monkeypatch):
    """With 3-row query blocks and 5-key blocks, the online softmax rescales across many
    blocks, causal blocks are skipped and partial, and dead rows span blocks."""
    monkeypatch.setattr(attention, "BLOCK_Q", 3)
    monkeypatch.setattr(attention, "BLOCK_K", 5)
    for causal in (False, True):
        for n_q, n_k in ((11, 23), (23, 11)):
            p = attention_program((2,), n_q, n_k, 4, 3, "f64", groups=2, causal=causal,
                                  mask=True)
            got, want = run_cpu(p, inputs_for(p, n_q))
            assert_matches(got, want, *TOL["f64"])
            got, want = run_cpu(p, inputs_for(p, n_q, special=True))
            assert_matches(got, want, *TOL["f64"])


def test_mask_rows_with_no_visible_key_give_zero():
    p = attention_program((1,), 4, 6, 8, 8, "f32", mask=True)
    xs = inputs_for(p, 0)
    xs[4][2, :] = -np.inf
    got, want = run_cpu(p, xs)
    assert_matches(got, want, *TOL["f32"])
    out, lse, dq = got[:3]
    assert np.all(out[0, 0, 2] == 0) and lse[0, 0, 2] == 0 and np.all(dq[0, 0, 2] == 0)


@pytest.mark.parametrize("shape", [(0, 4, 6, 8, 8), (2, 0, 6, 8, 8), (2, 4, 0, 8, 8),
                                   (2, 4, 6, 0, 8), (2, 4, 6, 8, 0), (2, 4, 6, 0, 0)],
                         ids=["batch0", "L0", "S0", "E0", "Ev0", "E0Ev0"])
def test_empty_operands(shape):
    """Empty batch, no queries, no keys (every row dead: 0), no features (a dot product
    of nothing is 0): the reference's values, and no step reads or writes an empty
    buffer (the canonical rules fold these, the CPU backend checks it)."""
    nb, n_q, n_k, e, ev = shape
    p = attention_program((nb,), n_q, n_k, e, ev, "f32", causal=True, mask=True)
    got, want = run_cpu(p, inputs_for(p, 3))
    assert_matches(got, want, *TOL["f32"])
    low = _cpu().compile(p).lowered
    for step in low.schedule.steps:
        if isinstance(step, AttentionPlan):
            assert all(s.size for s in step.srcs)


def test_operands_are_read_in_place_and_parts_share_one_step():
    """A permuted q, an expanded (GQA) k/v and a broadcast mask are views the driver
    reads in place: the forward and backward program has exactly two attention steps
    (all five parts) and no copy kernel for an operand."""
    p = attention_program((2,), 9, 11, 8, 8, "f32", groups=2, mask=True, q_layout="permuted")
    steps = _cpu().compile(p).lowered.schedule.steps
    att = [s for s in steps if isinstance(s, AttentionPlan)]
    assert [s.kind for s in att] == ["forward", "backward"]
    assert sorted(len(s.sinks) for s in att) == [2, 3]
    # the other steps are the two sums over G (dk, dv): nothing copies q, k, v or the mask
    assert sum(isinstance(s, KernelPlan) for s in steps) == 2


def _model_layout_programs(dtype: str = "f32") -> tuple[Program, Program]:
    """Forward and backward programs over [B, H, L, E] whose parts leave as a model's
    tensors do: out, dq, dk, dv as [B, L, H, E] memory, lse as [B, L, H] (stored
    permutations); the backward reads out and lse in those layouts."""
    t4 = (0, 2, 1, 3)
    qkv = [(dtype, (2, 3, 70, 8)), (dtype, (2, 3, 90, 8)), (dtype, (2, 3, 90, 5))]

    def fwd(q, k, v):
        out, lse = b.attention(q.v, k.v, v.v, causal=True)
        return hg.isa.Var(out).permute(t4), hg.isa.Var(lse).permute((0, 2, 1))

    def bwd(q, k, v, dout, out, lse):
        dq, dk, dv = b.attention_grads(dout.v, q.v, k.v, v.v, out.permute(t4).v,
                                       lse.permute((0, 2, 1)).v, causal=True)
        return tuple(hg.isa.Var(x).reshape((2, 3, 1, *x.shape[-2:])).permute((0, 3, 1, 2, 4))
                     for x in (dq, dk, dv))

    return (b.program(fwd, qkv),
            b.program(bwd, [*qkv, (dtype, (2, 3, 70, 5)), (dtype, (2, 70, 3, 5)),
                            (dtype, (2, 70, 3))]))


def test_parts_are_written_into_stored_permutations():
    """A part whose only reader is a stored permutation of it (a model's [B, L, H, E]
    output, the [B, L, H] logsumexp, gradients) is written there in place: no temp, no
    copy kernel."""
    fwd, bwd = _model_layout_programs()
    got, want = run_cpu(fwd, inputs_for(fwd, 4, special=True))
    assert_matches(got, want, *TOL["f32"])
    xs = inputs_for(bwd, 5)
    xs[4], xs[5] = map(np.ascontiguousarray, want)  # the forward's out and lse as stored
    got, want = run_cpu(bwd, xs)
    assert_matches(got, want, *TOL["f32"])
    for p in (fwd, bwd):
        (step,) = _cpu().compile(p).lowered.schedule.steps
        assert isinstance(step, AttentionPlan) and len(step.layouts) == len(step.sinks)


def test_an_operand_blas_cannot_read_is_copied_first():
    """q whose last axis has stride 2 (every other element of a wider array) is neither
    row- nor column-major: the scheduler gives it a buffer, the result is unchanged."""
    def fn(x, k, v):
        q = x.reshape((2, 5, 4, 2)).slice((0, 0, 0, 0), (2, 5, 4, 1)).reshape((2, 5, 4))
        return hg.isa.Var(b.attention(q.v, k.v, v.v)[0])

    p = b.program(fn, [("f32", (2, 5, 8)), ("f32", (2, 6, 4)), ("f32", (2, 6, 3))])
    steps = _cpu().compile(p).lowered.schedule.steps
    assert isinstance(steps[0], KernelPlan) and isinstance(steps[1], AttentionPlan)
    got, want = run_cpu(p, inputs_for(p, 5))
    assert_matches(got, want, *TOL["f32"])


def test_only_the_parts_used_are_written():
    """A backward program that stores dk alone still runs one step; inference stores
    the output alone."""
    for parts in (("dk",), ("out",), ("lse", "dv")):
        p = attention_program((2,), 6, 9, 4, 5, "f32", causal=True, parts=parts)
        got, want = run_cpu(p, inputs_for(p, 2))
        assert_matches(got, want, *TOL["f32"])


def test_cpu_refuses_dtypes_the_driver_lacks():
    q, k, v = (b.ldg(i, "f16", (2, 3, 4)) for i in range(3))
    p = Program([b.stg(b.attention(q, k, v)[0], 0)], [("f16", (2, 3, 4))] * 3)
    with pytest.raises(DTypeError, match="f16"):
        _cpu().compile(p)


def test_without_blas_the_driver_uses_its_own_products():
    """HOLOGRAM_GEMM=numpy (no BLAS bound): the same driver, plain C products."""
    code = (
        "import numpy as np\n"
        "from tests.test_attention import attention_program, inputs_for, assert_matches\n"
        "from tests.programs import compiled_and_reference\n"
        "import hologram as hg\n"
        "from hologram.compiler import blas\n"
        "assert blas.numpy_blas()[0] is None\n"
        "p = attention_program((2,), 70, 90, 8, 6, 'f64', groups=2, causal=True, mask=True)\n"
        "got, want = compiled_and_reference(hg.default_executor('cpu'), p, inputs_for(p, 1))\n"
        "assert_matches(got, want, 1e-11, 1e-12)\n"
        "print('ok')\n")
    env = {**os.environ, "HOLOGRAM_GEMM": "numpy"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       cwd=root, timeout=300)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(programs(dtype="f64", attention=True, max_ops=6), st.integers(0, 2**32 - 1))
def test_random_programs_with_attention(case, seed):
    """Attention among random steps (shapes with 0 and 1, inputs with NaN and inf)."""
    fn, specs = case
    p = b.program(fn, specs)
    got, want = compiled_and_reference(_cpu(), p, random_inputs(specs, seed, special=True))
    assert_matches(got, want, 1e-9, 1e-12)


# --- GPU dialects ---------------------------------------------------------------------------
WEBGPU = registry.why_unavailable("webgpu")


@pytest.mark.skipif(WEBGPU is not None, reason=f"webgpu unavailable: {WEBGPU}")
@pytest.mark.parametrize("case", [
    ((2,), 5, 7, 8, 6, 1, False, False, "plain"),
    ((1,), 70, 300, 16, 8, 2, True, True, "permuted"),  # > one chunk of 256 keys
    ((2,), 300, 20, 8, 300, 1, True, False, "plain"),  # > one chunk of queries and columns
], ids=["small", "gqa-causal-mask", "long-queries"])
def test_webgpu_matches_reference(case):
    batch, n_q, n_k, e, ev, g, causal, mask, layout = case
    p = attention_program(batch, n_q, n_k, e, ev, "f32", groups=g, causal=causal, mask=mask,
                          q_layout=layout)
    with hg.Executor("webgpu") as ex:
        for special in (False, True):
            got, want = compiled_and_reference(ex, p, inputs_for(p, n_q, special=special))
            assert_matches(got, want, 1e-4, 1e-5)


@pytest.mark.skipif(WEBGPU is not None, reason=f"webgpu unavailable: {WEBGPU}")
def test_webgpu_writes_stored_permutations():
    fwd, bwd = _model_layout_programs()
    with hg.Executor("webgpu") as ex:
        got, want = compiled_and_reference(ex, fwd, inputs_for(fwd, 4))
        assert_matches(got, want, 1e-4, 1e-5)
        xs = inputs_for(bwd, 5)
        xs[4], xs[5] = map(np.ascontiguousarray, want)
        got, want = compiled_and_reference(ex, bwd, xs)
        assert_matches(got, want, 1e-4, 1e-5)


@pytest.mark.skipif(WEBGPU is not None, reason=f"webgpu unavailable: {WEBGPU}")
def test_webgpu_refuses_f64_attention():
    p = attention_program((1,), 3, 4, 2, 2, "f64")
    with hg.Executor("webgpu") as ex, pytest.raises(DTypeError, match="f64"):
        ex.compile(p)


@pytest.mark.skipif(not nvrtc.available(), reason="NVRTC is not installed")
@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("mask", [False, True])
def test_cuda_kernels_compile(dtype, mask):
    p = attention_program((2,), 70, 300, 16, 8, dtype, groups=2, causal=True, mask=mask,
                          q_layout="permuted")
    launch: dict = {}

    def render(s, sl):
        src, lm = render_cuda(s, sl)
        launch.update(lm)
        return src

    low = lower(p, render)
    assert nvrtc.compile_cubin(low.source, "sm_90")[:4] == b"\x7fELF"
    names = [s.name for s in low.schedule.steps if isinstance(s, AttentionPlan)]
    fwd, bwd = names
    assert launch[f"{fwd}_fwd"] == ("outer", 2 * 2 * 70)
    assert launch[f"{bwd}_dq"] == ("outer", 2 * 2 * 70)
    assert launch[f"{bwd}_dkv"] == ("outer", 2 * 2 * 300)
