"""Whole models from ``transformers`` trained under ``torch.compile(backend="hologram")``.

Models are built from small configs (nothing is downloaded). GPT-2's training step
used to fail with "view size is not compatible with input tensor's size and stride":
a program handed q, k and v to PyTorch's attention as contiguous tensors where the
trace recorded views of one projection, and a later ``view`` of the attention output's
transpose then met other strides than traced (``hologram_torch/layouts.py``).
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

LR = 1e-3


def _gpt2() -> torch.nn.Module:
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=96,
                                  n_positions=32, resid_pdrop=0.0, embd_pdrop=0.0,
                                  attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg).train()


def _train(model: torch.nn.Module, ids: torch.Tensor, compiled: bool, steps: int,
           grads_in: list[list[torch.Tensor]] | None = None) -> dict:
    """``steps`` forward+backward+AdamW steps; with ``grads_in``, only the optimizer
    steps, on those gradients (the reference for the compiled parameter update)."""
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=LR, weight_decay=0.01)
    fwd = torch.compile(model, backend="hologram") if compiled else model
    step = torch.compile(opt.step, backend="hologram") if compiled else opt.step
    out: dict = {"loss": [], "grads": [], "params": []}
    for i in range(steps):
        opt.zero_grad()
        if grads_in is None:
            loss = fwd(input_ids=ids, labels=ids).loss
            loss.backward()
            out["loss"].append(loss.detach())
        else:
            for p, g in zip(params, grads_in[i], strict=True):
                p.grad = g.clone()
        out["grads"].append([p.grad.clone() for p in params])
        step()
        out["params"].append([p.detach().clone() for p in params])
    return out


def test_gpt2_training_step_matches_eager():
    """Forward, backward and AdamW, eager against compiled (model and optimizer step):
    losses, gradients, and the parameter updates."""
    torch._dynamo.reset()
    base = _gpt2()
    ids = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(1))
    eager = _train(copy.deepcopy(base), ids, compiled=False, steps=2)
    comp = _train(copy.deepcopy(base), ids, compiled=True, steps=2)
    # the loss of each step (the second one after a compiled update)
    torch.testing.assert_close(torch.stack(comp["loss"]), torch.stack(eager["loss"]),
                               rtol=1e-4, atol=0)
    # gradients from the same weights: f32, relative to each tensor's largest entry
    for ge, gc in zip(eager["grads"][0], comp["grads"][0], strict=True):
        torch.testing.assert_close(gc, ge, rtol=1e-4, atol=1e-5 * float(ge.abs().max()))
    # the compiled update is AdamW's on the compiled gradients...
    ref = _train(copy.deepcopy(base), ids, compiled=False, steps=2, grads_in=comp["grads"])
    for step in range(2):
        for pr, pc in zip(ref["params"][step], comp["params"][step], strict=True):
            torch.testing.assert_close(pc, pr, rtol=1e-5, atol=1e-7)
    # ...and close to eager's: Adam divides by |g|, so where a gradient is ~0 (GPT-2's
    # key bias) f32 rounding moves an update by a fraction of the learning rate
    p0 = [p.detach() for p in base.parameters()]
    for pe, pc, q in zip(eager["params"][0], comp["params"][0], p0, strict=True):
        torch.testing.assert_close(pc - q, pe - q, rtol=1e-4, atol=0.05 * LR)


def _ran_in_pytorch(graphs: list) -> list[str]:
    """Compute ops any of ``graphs`` ran in PyTorch (views are not compute)."""
    return sorted({op for g in graphs for op, _ in g.torch_ops})


def test_gpt2_training_step_runs_wholly_in_hologram():
    """The training step's forward and backward graphs hand no op to PyTorch: embedding
    and its backward, attention and its backward, the loss and its backward."""
    from hologram_torch.compile_backend import collect_graphs

    torch._dynamo.reset()
    model = _gpt2()
    ids = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(1))
    f = torch.compile(model, backend="hologram")
    with collect_graphs() as graphs:
        f(input_ids=ids, labels=ids).loss.backward()
    assert {g.kind for g in graphs} >= {"forward", "backward"}
    assert _ran_in_pytorch(graphs) == []


def test_gpt2_training_with_dropout_runs_wholly_in_hologram():
    """GPT-2's default dropouts (embeddings, residuals, attention) in training: every op
    in programs, hologram's own draws (so the loss is near eager's, not equal), a fresh
    draw per call, and ``torch.manual_seed`` repeats a step."""
    from hologram_torch.compile_backend import collect_graphs

    torch._dynamo.reset()
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=96,
                                  n_positions=32, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).train()
    assert cfg.resid_pdrop == cfg.embd_pdrop == cfg.attn_pdrop == 0.1
    ids = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(1))
    f = torch.compile(model, backend="hologram")
    with collect_graphs() as graphs:
        loss = f(input_ids=ids, labels=ids).loss
        loss.backward()
    assert _ran_in_pytorch(graphs) == []
    assert any("aten.native_dropout" in r.aten_ops for g in graphs for r in g.regions)
    eager = model(input_ids=ids, labels=ids).loss
    torch.testing.assert_close(loss, eager, rtol=0.02, atol=0)
    with torch.no_grad():
        torch.manual_seed(3)
        a = f(input_ids=ids, labels=ids).loss
        b = f(input_ids=ids, labels=ids).loss
        torch.manual_seed(3)
        torch.testing.assert_close(f(input_ids=ids, labels=ids).loss, a, rtol=0, atol=0)
    assert a != b


def _small_models() -> dict:
    """The five model families of issue 17 at small configs: (model, inputs(batch))."""
    tf = transformers
    vocab = 128

    def ids(batch: int, seed: int = 0) -> torch.Tensor:
        return torch.randint(0, vocab, (batch, 12), generator=torch.Generator().manual_seed(seed))

    return {
        "gpt2": (lambda: tf.GPT2LMHeadModel(tf.GPT2Config(
            n_layer=2, n_embd=64, n_head=4, vocab_size=vocab, n_positions=32,
            bos_token_id=0, eos_token_id=0)),
            lambda b: {"input_ids": ids(b)}),
        "bert": (lambda: tf.BertModel(tf.BertConfig(
            num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
            vocab_size=vocab, max_position_embeddings=32)),
            lambda b: {"input_ids": ids(b),
                       # the last two tokens of each sequence padded out
                       "attention_mask": torch.cat([torch.ones(b, 10, dtype=torch.long),
                                                    torch.zeros(b, 2, dtype=torch.long)], 1)}),
        "llama": (lambda: tf.LlamaForCausalLM(tf.LlamaConfig(
            num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=vocab, max_position_embeddings=32)),
            lambda b: {"input_ids": ids(b)}),
        "t5": (lambda: tf.T5ForConditionalGeneration(tf.T5Config(
            num_layers=2, num_decoder_layers=2, d_model=64, d_kv=16, num_heads=4, d_ff=128,
            vocab_size=vocab)),
            lambda b: {"input_ids": ids(b), "decoder_input_ids": ids(b, 1)}),
        "vit": (lambda: tf.ViTModel(tf.ViTConfig(
            num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
            image_size=32, patch_size=8)),
            lambda b: {"pixel_values": torch.randn(b, 3, 32, 32,
                                                   generator=torch.Generator().manual_seed(0))}),
    }


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("name", ["gpt2", "bert", "llama", "t5", "vit"])
def test_model_inference_matches_eager_wholly_in_hologram(name, batch):
    """Inference of each model family: eager's result (relative error <= 1e-5 of the
    output's largest entry) and no compute op left to PyTorch."""
    from hologram_torch.compile_backend import collect_graphs

    make, inputs = _small_models()[name]
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = make().eval()
    kw = inputs(batch)
    f = torch.compile(model, backend="hologram")
    with torch.no_grad():
        want = model(**kw)
        with collect_graphs() as graphs:
            got = f(**kw)
    key = "logits" if getattr(want, "logits", None) is not None else "last_hidden_state"
    g, w = getattr(got, key), getattr(want, key)
    assert g.shape == w.shape
    err = (g.double() - w.double()).abs().max().item() / w.abs().max().item()
    assert err <= 1e-5, err
    assert graphs and _ran_in_pytorch(graphs) == []
