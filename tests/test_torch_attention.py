"""``F.scaled_dot_product_attention`` under ``torch.compile(backend="hologram")`` against
eager, forward and backward: causal, bool and float masks (fully masked rows included),
scale, GQA, non-contiguous q/k/v, float64; ATen's fused CPU ops run inside a hologram
program (never handed back to PyTorch); dropout and unpaired heads are refused; a
LLaMA-style model (GQA, causal) trains one step to eager's gradients."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from hologram_torch.compile_backend import collect_graphs  # noqa: E402

ATTENTION_OPS = {"aten._scaled_dot_product_flash_attention_for_cpu",
                 "aten._scaled_dot_product_flash_attention_for_cpu_backward",
                 "aten.scaled_dot_product_attention"}


def _leaves(*xs: torch.Tensor) -> list[torch.Tensor]:
    return [x.detach().clone().requires_grad_(True) for x in xs]


def check_sdpa(fn, *inputs: torch.Tensor, atol: float = 2e-5) -> list:
    """``fn(*inputs)`` eager and compiled, then backward with one random grad: outputs and
    every input gradient agree; returns the graphs the backend planned."""
    torch._dynamo.reset()
    eager, comp = _leaves(*inputs), _leaves(*inputs)
    want = fn(*eager)
    with collect_graphs() as graphs:
        got = torch.compile(fn, backend="hologram")(*comp)
        grad = torch.randn_like(want)
        want.backward(grad)
        got.backward(grad)
    torch.testing.assert_close(got, want, atol=atol, rtol=1e-4)
    for a, b in zip(comp, eager, strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=atol, rtol=1e-4)
    ran = {op for g in graphs for op in g.hologram_ops}
    assert "aten._scaled_dot_product_flash_attention_for_cpu" in ran, ran
    assert "aten._scaled_dot_product_flash_attention_for_cpu_backward" in ran, ran
    assert not ATTENTION_OPS & {op for g in graphs for op, _ in g.torch_ops}
    return graphs


def qkv(b: int = 2, h: int = 4, n_q: int = 9, n_k: int = 13, e: int = 16, hkv: int | None = None,
        dtype=torch.float32) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(n_q * 100 + n_k)
    hkv = hkv or h
    return (torch.randn(b, h, n_q, e, generator=g, dtype=dtype),
            torch.randn(b, hkv, n_k, e, generator=g, dtype=dtype),
            torch.randn(b, hkv, n_k, e, generator=g, dtype=dtype))


def test_plain_and_scaled():
    check_sdpa(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), *qkv())
    check_sdpa(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=0.3), *qkv())


@pytest.mark.parametrize("n_q, n_k", [(9, 13), (13, 9), (70, 70)])
def test_causal_with_fewer_or_more_queries_than_keys(n_q, n_k):
    check_sdpa(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
               *qkv(n_q=n_q, n_k=n_k))


def test_bool_mask_with_a_fully_masked_row():
    """A bool mask (keep where True) with one query row that sees no key: eager's fused
    CPU kernel gives that row 0 and no gradient; so does hologram."""
    mask = torch.rand(9, 13, generator=torch.Generator().manual_seed(1)) > 0.3
    mask[4] = False
    check_sdpa(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask), *qkv())


def test_float_mask_broadcast_over_heads():
    mask = torch.randn(2, 1, 9, 13, generator=torch.Generator().manual_seed(2))
    mask[:, :, 2, 5:] = -math.inf
    check_sdpa(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                              scale=0.2), *qkv())


def test_gqa_shared_key_heads():
    """LLaMA's grouped KV heads: 4 query heads over 2 key/value heads (query head h reads
    key head h // 2), causal; dk and dv sum over the group."""
    check_sdpa(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                              enable_gqa=True),
               *qkv(hkv=2))


def test_non_contiguous_inputs():
    """q, k, v as models make them: [B, L, H, E] memory viewed as [B, H, L, E]."""
    q, k, v = (x.transpose(1, 2).contiguous() for x in qkv())
    check_sdpa(lambda q, k, v: F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True), q, k, v)


def test_float64():
    check_sdpa(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
               *qkv(dtype=torch.float64), atol=1e-10)


def test_the_forward_program_has_one_attention_step():
    """out and logsumexp (saved for backward) come from one step of one program."""
    graphs = check_sdpa(lambda q, k, v: F.scaled_dot_product_attention(q, k, v) * 2.0,
                        *qkv())
    forward = next(g for g in graphs if "aten._scaled_dot_product_flash_attention_for_cpu"
                   in g.hologram_ops)
    (region,) = [r for r in forward.regions
                 if "aten._scaled_dot_product_flash_attention_for_cpu" in r.aten_ops]
    assert region.program_text.count(" = attn.") == 1
    assert region.program_text.count(" = attn_lse.") == 1
    assert sum(1 for k in region.kernels if k.startswith("a")) == 1


def test_translator_refuses_dropout_and_ungrouped_heads():
    """dropout_p != 0 (on the CPU sdpa decomposes such graphs into bmm, softmax and
    native_dropout anyway) and head counts GQA cannot pair are handed back, with why."""
    from hologram.isa import builder as b
    from hologram_torch.lowering import Unsupported, attention

    q, k = (b.Var(b.ldg(i, "f32", s)) for i, s in enumerate([(1, 4, 3, 8), (1, 3, 5, 8)]))
    with pytest.raises(Unsupported, match="dropout"):
        attention._check(q, q, q, 0.1)
    with pytest.raises(Unsupported, match="multiple"):
        attention._check(q, k, k, 0.0)


def test_llama_trains_one_step_like_eager():
    """A two-layer LLaMA (GQA: 4 query heads, 2 KV heads; causal): loss and every
    parameter gradient match eager, and attention ran in hologram both ways."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=128,
                                   vocab_size=100, attn_implementation="sdpa")
    eager = transformers.LlamaForCausalLM(cfg)
    comp = transformers.LlamaForCausalLM(cfg)
    comp.load_state_dict(eager.state_dict())
    ids = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(3))
    torch._dynamo.reset()
    with collect_graphs() as graphs:
        loss_c = torch.compile(comp, backend="hologram")(input_ids=ids, labels=ids).loss
        loss_c.backward()
    loss_e = eager(input_ids=ids, labels=ids).loss
    loss_e.backward()
    torch.testing.assert_close(loss_c, loss_e, atol=1e-5, rtol=1e-5)
    for (name, pc), pe in zip(comp.named_parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(pc.grad, pe.grad, atol=5e-5, rtol=1e-3, msg=name)
    ran = {op for g in graphs for op in g.hologram_ops}
    assert {"aten._scaled_dot_product_flash_attention_for_cpu",
            "aten._scaled_dot_product_flash_attention_for_cpu_backward"} <= ran
    assert not ATTENTION_OPS & {op for g in graphs for op, _ in g.torch_ops}


def test_a_graph_that_keeps_sdpa_itself():
    """A graph holding ``aten.scaled_dot_product_attention`` (not decomposed into ATen's
    CPU op) runs it in hologram too: GQA and causal through the same row."""
    from hologram.interop import default_executor
    from hologram_torch import compile_backend as cb

    g = torch.fx.Graph()
    q, k, v = (g.placeholder(n) for n in "qkv")
    node = g.call_function(torch.ops.aten.scaled_dot_product_attention.default, (q, k, v),
                           {"is_causal": True, "enable_gqa": True})
    g.output((node,))
    graph = cb.HologramGraph(torch.fx.GraphModule({}, g), "inference", default_executor("cpu"))
    xs = qkv(n_q=5, n_k=7, e=8, hkv=2)
    with collect_graphs() as graphs:
        graph(list(xs))  # no recorded shapes: the first call runs eagerly and plans
        (got,) = graph(list(xs))
    want = F.scaled_dot_product_attention(*xs, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    assert graphs[0].hologram_ops["aten.scaled_dot_product_attention"] == 1
    assert not graphs[0].torch_ops
