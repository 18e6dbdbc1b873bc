"""Real transformer models through ``torch.compile`` backends on the CPU: eager PyTorch,
Inductor, OpenVINO (f32) and hologram, side by side.

    .venv/bin/python benchmarks/bench_models.py [--json out.json] [--quick]
        [--models gpt2,bert,llama,t5,vit] [--batches 1,8] [--no-train] [--no-gemm] [--no-cold]
        [--backends eager,inductor,openvino,hologram[,hologram-nopack]]
    .venv/bin/python benchmarks/bench_models.py --cnn [--train-size 112] ...
    .venv/bin/python benchmarks/bench_models.py --dtype bfloat16 --no-train --no-gemm ...

``--cnn`` runs the CNN rows instead (issue 19): torchvision's ResNet-18 and
MobileNetV3-small and timm's ConvNeXt-atto (random weights) at 224x224, batch 1 and 8,
and a ResNet-18 training step (forward, cross-entropy, backward, SGD with momentum) at
batch 8 and ``--train-size`` (default 112: 224 makes each interleaved sample several
seconds on two cores). torchvision and timm come from the dev extra
(``hologram_torch/torchvision_import.py`` loads a torchvision whose C++ ops do not).
``--cnn --models dcgan --no-train`` times DCGAN's generator (transposed convolutions,
a 64x64 image from a latent vector; :func:`build_dcgan`).

Models are transformers' own classes built from configs with random weights (nothing
is downloaded): GPT-2 124M (``GPT2Config()``), BERT-base (``BertConfig()``), a small
LLaMA with grouped KV heads (6 layers, hidden 768, 12 heads over 4 KV heads,
intermediate 2048, vocabulary 32000), T5-small (encoder and decoder, 6 layers each,
d_model 512) and ViT-B/16 at 224x224. Inference at batch 1 and 8, sequence 128 (ViT:
its 197 patches), under ``torch.no_grad()``; a GPT-2 training step (forward, backward
with labels, AdamW) at batch 2, sequence 128.

Every backend's output is compared with eager's first (max relative error) and its
first call in this process (trace + compile, "first call s") is timed; then the rows
are timed with their samples interleaved. At each model's first batch, each backend's
cold first call is timed in a new process with empty kernel caches (hologram's and
Inductor's): a user's very first run (``--no-cold`` skips it). OpenVINO runs with
``aot_autograd`` (without it the backend fails on most of these models here) and
``INFERENCE_PRECISION_HINT=f32`` (without it this CPU computes in bf16, and results do
not match eager). A GEMM table times hologram's GEMM on the
models' ``x @ W.T`` shapes against ``torch.mm`` (MKL) and NumPy's matmul (OpenBLAS):
hologram's own row runs on the BLAS ``hologram info`` names (MKL when the ``mkl`` wheel
is installed; ``HOLOGRAM_BLAS=openblas`` for NumPy's), plus a row with the weight
packed once (MKL only), as the torch.compile backend runs constant weights in
inference graphs.

``--dtype bfloat16`` (or ``float16``) runs the inference rows with the models' weights
and float inputs in that dtype (``model.to(dtype)``), as a user who loads a model in
half precision does; the training rows stay float32. With ``bfloat16`` the GEMM table
is the bf16 one: a program of ``bf16(x @ W.T)`` on bf16 operands (its product reads them
in place, on hologram's AVX-512 BF16 kernel where the CPU has one) against ``torch.mm``
in bf16 (oneDNN).

Targets (issue 17): hologram ahead of eager and of Inductor on every row; hologram's
cold first call at most a fifth of Inductor's.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
from common import Candidate, Report, add_interleaved, target  # noqa: E402

SEQ = 128
#: The CNN rows (--cnn): name -> how to build it (random weights).
CNNS = ("resnet18", "mobilenet_v3_small", "convnext_atto")
#: Models --models may name beside CNNS and the transformers (not in the default rows):
#: DCGAN's generator (transposed convolutions; a 64x64 image from a 100-wide latent).
GENERATORS = ("dcgan",)
CNN_SIZE = 224
BACKENDS = ("eager", "inductor", "openvino", "hologram")
#: Rows --backends may add: hologram without packed constant weights (the A/B of
#: hologram_torch/packed_weights.py; the same as "hologram" where the BLAS cannot pack).
EXTRA_BACKENDS = {"hologram-nopack": {"pack_weights": False}}
#: Before each timed sample: a pause, then one untimed call of the same backend. The
#: runtimes leave their thread pools spinning after a call (Intel OpenMP's 200 ms block
#: time, OpenVINO's TBB workers), which slowed whichever backend ran next by up to 25%
#: (ViT-B/16 at batch 8, session 10); settled, each is timed as it runs on its own.
SETTLE_S = 0.3
OPENVINO_OPTIONS = {"aot_autograd": True, "config": {"INFERENCE_PRECISION_HINT": "f32"}}


def build(name: str) -> tuple[Any, Callable[[int], dict[str, Any]]]:
    """(model in eval mode, inputs(batch) -> kwargs) for one of the benchmark models."""
    import torch

    from hologram_torch.torchvision_import import import_torchvision

    import_torchvision()  # before transformers, which imports torchvision when installed
    import transformers as tf

    torch.manual_seed(0)
    if name in CNNS:
        return build_cnn(name)
    if name in GENERATORS:
        return build_dcgan()
    vocab = 32000
    if name == "gpt2":
        model = tf.GPT2LMHeadModel(tf.GPT2Config())
        vocab = model.config.vocab_size
    elif name == "bert":
        model = tf.BertModel(tf.BertConfig())
        vocab = model.config.vocab_size
    elif name == "llama":
        model = tf.LlamaForCausalLM(tf.LlamaConfig(
            hidden_size=768, intermediate_size=2048, num_hidden_layers=6,
            num_attention_heads=12, num_key_value_heads=4, vocab_size=vocab))
    elif name == "t5":
        model = tf.T5ForConditionalGeneration(tf.T5Config(
            d_model=512, d_ff=2048, num_layers=6, num_heads=8, d_kv=64, vocab_size=32128))
        vocab = 32128
    elif name == "vit":
        model = tf.ViTModel(tf.ViTConfig(), add_pooling_layer=False)
    else:
        raise ValueError(f"unknown model {name!r}")
    model.eval()

    def inputs(batch: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(batch)
        if name == "vit":
            return {"pixel_values": torch.randn(batch, 3, 224, 224, generator=g)}
        ids = torch.randint(0, vocab, (batch, SEQ), generator=g)
        kw: dict[str, Any] = {"input_ids": ids}
        if name == "bert":
            kw["attention_mask"] = torch.ones(batch, SEQ, dtype=torch.long)
        if name == "t5":
            kw["decoder_input_ids"] = torch.randint(0, vocab, (batch, SEQ), generator=g)
        return kw

    return model, inputs


def build_cnn(name: str, num_classes: int = 1000) -> tuple[Any, Callable[[int], dict[str, Any]]]:
    """(CNN in eval mode, inputs(batch) -> {"x": images at CNN_SIZE})."""
    import torch

    from hologram_torch.torchvision_import import import_torchvision

    tv = import_torchvision()
    torch.manual_seed(0)
    if name == "convnext_atto":
        import timm

        model = timm.create_model(name, pretrained=False, num_classes=num_classes)
    else:
        model = getattr(tv.models, name)(num_classes=num_classes)
    model.eval()

    def inputs(batch: int, size: int = CNN_SIZE) -> dict[str, Any]:
        g = torch.Generator().manual_seed(batch)
        return {"x": torch.randn(batch, 3, size, size, generator=g)}

    return model, inputs


def build_dcgan(nz: int = 100, ngf: int = 64) -> tuple[Any, Callable[[int], dict[str, Any]]]:
    """(DCGAN's generator as PyTorch's examples write it, in eval mode, inputs(batch) ->
    {"x": latent vectors [batch, nz, 1, 1]}): five transposed convolutions with batch
    norm and ReLU up to a 64x64 RGB image."""
    import torch

    nn = torch.nn
    torch.manual_seed(0)
    layers: list[Any] = []
    chans = [nz, ngf * 8, ngf * 4, ngf * 2, ngf]
    for i, (a, b) in enumerate(zip(chans, chans[1:], strict=False)):
        layers += [nn.ConvTranspose2d(a, b, 4, 1 if i == 0 else 2, 0 if i == 0 else 1,
                                      bias=False), nn.BatchNorm2d(b), nn.ReLU(True)]
    layers += [nn.ConvTranspose2d(ngf, 3, 4, 2, 1, bias=False), nn.Tanh()]

    class Generator(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.main = nn.Sequential(*layers)

        def forward(self, x: Any) -> Any:  # the rows call model(x=...)
            return self.main(x)

    model = Generator().eval()

    def inputs(batch: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(batch)
        return {"x": torch.randn(batch, nz, 1, 1, generator=g)}

    return model, inputs


#: The inference rows' dtype (``--dtype``): weights and float inputs are converted to
#: it; float32 leaves the models as built.
DTYPE = "float32"


def in_dtype(model: Any, make_inputs: Callable[[int], dict[str, Any]], dtype: str
             ) -> tuple[Any, Callable[[int], dict[str, Any]]]:
    """``model`` and its inputs in ``dtype`` (integer inputs, token ids and masks, stay)."""
    import torch

    if dtype == "float32":
        return model, make_inputs
    td = getattr(torch, dtype)

    def inputs(batch: int) -> dict[str, Any]:
        return {k: v.to(td) if v.is_floating_point() else v
                for k, v in make_inputs(batch).items()}

    return model.to(td), inputs


def main_output(out: Any) -> Any:
    import torch

    if isinstance(out, torch.Tensor):
        return out
    for key in ("logits", "last_hidden_state"):
        v = getattr(out, key, None)
        if v is not None:
            return v
    return out[0]


def compiled(model: Any, backend: str) -> Callable[..., Any]:
    import torch

    if backend == "eager":
        return model
    if backend == "openvino":
        import openvino.torch  # noqa: F401  (registers backend="openvino")

        return torch.compile(model, backend="openvino", options=OPENVINO_OPTIONS)
    if backend == "hologram" or backend in EXTRA_BACKENDS:
        import hologram_torch  # noqa: F401  (registers backend="hologram")

        return torch.compile(model, backend="hologram", options=EXTRA_BACKENDS.get(backend))
    return torch.compile(model, backend=backend)


def rel_err(a: Any, b: Any) -> float:
    d = (a.double() - b.double()).abs().max().item()
    return d / max(b.double().abs().max().item(), 1e-30)


def fallbacks(fn: Callable[[], Any]) -> str:
    """The ATen ops that ran in PyTorch during ``fn()`` (hologram's first call)."""
    from collections import Counter

    from hologram_torch.compile_backend import collect_graphs

    with collect_graphs() as graphs:
        fn()
    ops = Counter(op for g in graphs for op, _ in g.torch_ops)
    return ", ".join(f"{op} x{n}" for op, n in sorted(ops.items())) or "none"


def speed(v: float) -> str:
    return f"{v:.2f}x faster" if v >= 1 else f"{1 / v:.2f}x slower"


def check_ahead(rep: Report, t: common.Table, title: str) -> None:
    """The two speed targets of every row: hologram ahead of eager and of Inductor."""
    rep.check(target(f"{title}: hologram vs eager", "ahead of eager", t.ratio("hologram"),
                     lambda v: v > 1, speed), t, "hologram")
    rep.check(target(f"{title}: hologram vs inductor", "ahead of inductor",
                     t.ratio_to("inductor", "hologram"), lambda v: v > 1, speed), t, "hologram")


def inference_table(rep: Report, name: str, batch: int, repeat: int,
                    backends: tuple[str, ...] = BACKENDS, cold: bool = False) -> None:
    """One model's latency table; ``cold``: then its cold-first-call row
    (:func:`cold_table`). "first call s" is this process's first call, with the kernel
    caches as earlier rows left them."""
    import torch

    model, make_inputs = in_dtype(*build(name), DTYPE)
    kw = make_inputs(batch)
    title = f"{name} inference, batch {batch}" + (
        "" if name == "vit" else f", {CNN_SIZE}x{CNN_SIZE}" if name in CNNS
        else ", 64x64 output" if name in GENERATORS else f", seq {SEQ}") + (
        "" if DTYPE == "float32" else f", {DTYPE}")
    t = rep.table(title, baseline="eager", unit="ms", extra_cols=("first call s", "rel err"))
    with torch.no_grad():
        ref = main_output(model(**kw))
        candidates: dict[str, Candidate] = {}
        failed: dict[str, str] = {}
        firsts: dict[str, float] = {}
        for backend in backends:
            try:
                fn = compiled(model, backend)
                t0 = time.perf_counter()
                if backend == "hologram":
                    rep.note(f"{title}: ops hologram left to PyTorch: "
                             f"{fallbacks(lambda fn=fn: fn(**kw))}")
                else:
                    fn(**kw)
                firsts[backend] = time.perf_counter() - t0
                err = rel_err(main_output(fn(**kw)), ref)
                candidates[backend] = Candidate(lambda fn=fn: fn(**kw), extra={
                    "first call s": f"{firsts[backend]:.1f}", "rel err": f"{err:.1e}"})
            except Exception as e:  # noqa: BLE001 - a failing backend is a result too
                failed[backend] = f"{type(e).__name__}: {str(e)[:300]}"
        add_interleaved(t, candidates, repeat=repeat, settle_s=SETTLE_S, failed=failed)
    rep.data.setdefault("first_call_s", {})[title] = firsts
    check_ahead(rep, t, title)
    torch._dynamo.reset()
    if cold:
        cold_table(rep, name, batch, [b for b in backends if b in candidates])


def cold_first_call(name: str, backend: str, batch: int) -> float:
    """Seconds from ``torch.compile`` to the first result, in a new process whose
    kernel caches are empty (hologram's and Inductor's): what a user's very first run
    costs. Imports and the model's construction come before the clock starts."""
    import json
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bench-cold-") as d:
        env = {**os.environ, "HOLOGRAM_CACHE_DIR": os.path.join(d, "hologram"),
               "TORCHINDUCTOR_CACHE_DIR": os.path.join(d, "inductor")}
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--cold-one",
                            f"{name},{backend},{batch},{DTYPE}"], env=env, capture_output=True,
                           text=True, timeout=1800)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode != 0 or not lines:
        raise RuntimeError(f"cold run of {name} on {backend} failed: {r.stderr[-600:]}")
    return float(json.loads(lines[-1])["s"])


def _cold_one(spec: str) -> None:
    """The child of :func:`cold_first_call`: prints {"s": seconds}."""
    import json

    import torch

    name, backend, batch, dtype = spec.split(",")
    model, make_inputs = in_dtype(*build(name), dtype)
    kw = make_inputs(int(batch))
    if backend == "openvino":
        import openvino.torch  # noqa: F401
    elif backend != "eager":
        import hologram_torch  # noqa: F401
    with torch.no_grad():
        t0 = time.perf_counter()
        compiled(model, backend)(**kw)
        print(json.dumps({"s": time.perf_counter() - t0}))


def cold_table(rep: Report, name: str, batch: int, backends: list[str]) -> None:
    """Each backend's cold first call (:func:`cold_first_call`); the target: hologram's
    at most a fifth of Inductor's."""
    title = f"{name} cold first call, batch {batch} (new process, empty kernel caches)"
    secs: dict[str, float] = {}
    lines = []
    for backend in backends:
        if backend == "eager":
            continue
        try:
            secs[backend] = cold_first_call(name, backend, batch)
            lines.append(f"{backend}: {secs[backend]:.1f} s")
        except Exception as e:  # noqa: BLE001 - a failing backend is a result too
            lines.append(f"{backend}: failed ({str(e)[:200]})")
    rep.note(f"{title}: " + ", ".join(lines))
    rep.data.setdefault("cold_first_call_s", {})[title] = secs
    if "hologram" in secs and "inductor" in secs:
        share = secs["hologram"] / secs["inductor"]
        rep.check(target(f"{name} b{batch}: cold first call", "<= 1/5 of inductor's", share,
                         lambda v: v <= 0.2,
                         lambda v: f"{v:.2f} of inductor's ({secs['hologram']:.1f} s vs "
                                   f"{secs['inductor']:.1f} s)"))


def _training_rows(rep: Report, repeat: int, title: str,
                   make_step: Callable[[str], Callable[[], Any]]) -> None:
    """One training-step table: ``make_step(backend)`` builds a fresh model, its optimizer
    and a step returning the loss; the first step is timed cold, its loss compared with
    eager's, then the steps are timed interleaved and settled."""
    import torch

    t = rep.table(title, baseline="eager", unit="ms", extra_cols=("first call s", "loss err"))
    steps: dict[str, Candidate] = {}
    failed: dict[str, str] = {}
    ref_loss = None
    for backend in ("eager", "inductor", "hologram"):
        try:
            step = make_step(backend)
            t0 = time.perf_counter()
            loss = step()
            first = time.perf_counter() - t0
            if ref_loss is None:
                ref_loss = loss
            err = abs(loss.item() - ref_loss.item()) / abs(ref_loss.item())
            steps[backend] = Candidate(step, extra={"first call s": f"{first:.1f}",
                                                    "loss err": f"{err:.1e}"})
        except Exception as e:  # noqa: BLE001
            failed[backend] = f"{type(e).__name__}: {str(e)[:300]}"
    add_interleaved(t, steps, repeat=repeat, settle_s=SETTLE_S, failed=failed)
    check_ahead(rep, t, title)
    torch._dynamo.reset()


def training_table(rep: Report, repeat: int, batch: int = 2, dropout: float = 0.0) -> None:
    """A GPT-2 124M training step: forward with labels, backward, AdamW. Every dropout
    at ``dropout`` (the config's default is 0.1; with dropout, each backend draws its own
    masks, so the loss column differs from eager's by the draw)."""
    import torch

    ids = build("gpt2")[1](batch)["input_ids"]

    def make_step(backend: str) -> Callable[[], Any]:
        model, _ = build("gpt2")
        model.train()
        model.config.attn_pdrop = model.config.resid_pdrop = dropout
        model.config.embd_pdrop = dropout
        for m in model.modules():
            if isinstance(m, torch.nn.Dropout):
                m.p = dropout
        fn = compiled(model, backend)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step() -> Any:
            opt.zero_grad(set_to_none=True)
            loss = fn(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            return loss.detach()
        return step

    _training_rows(rep, repeat, f"gpt2 training step (forward, backward, AdamW), batch "
                   f"{batch}, seq {SEQ}" + (f", dropout {dropout}" if dropout else ""),
                   make_step)


def cnn_training_data(name: str, batch: int, size: int) -> tuple[Any, Any]:
    """(images, labels) of a CNN training step: random, seeded."""
    import torch

    x = build_cnn(name)[1](batch, size)["x"]
    y = torch.randint(0, 1000, (batch,), generator=torch.Generator().manual_seed(0))
    return x, y


def cnn_training_step(model: Any, fn: Callable[[Any], Any], x: Any, y: Any
                      ) -> Callable[[], Any]:
    """One training step of ``model`` run through ``fn`` (``model`` itself, or it
    compiled): forward in training mode (batch norm's running statistics updated),
    cross-entropy, backward, SGD with momentum; returns the loss. Shared by this table,
    ``ab_lowering.py --train`` and ``profile_steps.py --train``."""
    import torch

    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def step() -> Any:
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(fn(x), y)
        loss.backward()
        opt.step()
        return loss.detach()
    return step


def cnn_training_table(rep: Report, repeat: int, batch: int = 8, size: int = 112) -> None:
    """A ResNet-18 training step: forward (batch norm in training mode, its running
    statistics updated), cross-entropy, backward, SGD with momentum."""
    x, y = cnn_training_data("resnet18", batch, size)

    def make_step(backend: str) -> Callable[[], Any]:
        model, _ = build_cnn("resnet18")
        model.train()
        return cnn_training_step(model, compiled(model, backend), x, y)

    _training_rows(rep, repeat, f"resnet18 training step (forward, backward, SGD momentum), "
                   f"batch {batch}, {size}x{size}", make_step)


#: (M, K, N) of the models' ``x @ W.T`` products at batch 1 and 8, seq 128: BERT/GPT-2/
#: ViT (768: qkv, projection, MLP), T5-small (512), GPT-2's LM head (50257).
GEMM_SHAPES = ((128, 768, 768), (128, 768, 2304), (128, 768, 3072), (128, 3072, 768),
               (1024, 768, 768), (1024, 768, 3072), (1024, 3072, 768), (128, 512, 2048),
               (128, 2048, 512), (8, 768, 768), (128, 768, 50257))


def packed_gemm(x: Any, w: Any, out: Any) -> Callable[[], None] | None:
    """``out = x @ w.T`` as the torch.compile backend runs it for a constant weight: the
    compiled program's pointer launch with a packed copy of ``w`` made once (None where
    the BLAS cannot pack: OpenBLAS, or MKL not installed)."""
    import hologram as hg
    from hologram.isa.builder import program
    from hologram.memory.address import data_pointer

    ex = hg.default_executor("cpu")
    p = program(lambda a, b: a @ b.T, [("f32", x.shape), ("f32", w.shape)])
    compiled = ex.compile(p)
    launch = ex.backend.pointer_launcher(compiled)
    sites = ex.backend.pack_sites(compiled)
    if launch is None or len(sites) != 1:
        return None
    packed = ex.backend.pack(compiled, 0, data_pointer(w))
    if packed is None:
        return None
    ptrs = [data_pointer(x), data_pointer(w), data_pointer(out)]
    return lambda: launch(ptrs, [data_pointer(packed)])  # packed: alive in the closure


def gemm_table(rep: Report, repeat: int) -> None:
    """hologram's GEMM (a jit of ``x @ w.T`` through its BLAS driver; and the same product
    with ``w`` packed once, as constant weights run in inference graphs) against torch.mm
    (MKL inside torch) and NumPy's matmul (OpenBLAS), samples interleaved."""
    import numpy as np
    import torch

    import hologram as hg
    from hologram.compiler import blas

    rep.note(f"GEMM table: hologram's GEMM runs {blas.describe()}; HOLOGRAM_BLAS=openblas "
             "or =mkl chooses")
    t = rep.grid("GEMM x @ W.T on the models' shapes (interleaved medians; GFLOP/s)",
                 ["M x K x N", "torch.mm", "numpy (OpenBLAS)", "hologram", "hologram packed",
                  "hologram / torch.mm", "packed / torch.mm"])
    ratios, packed_ratios = [], []
    for m, k, n in GEMM_SHAPES:
        rng = np.random.default_rng(0)
        x = rng.standard_normal((m, k), dtype=np.float32)
        w = rng.standard_normal((n, k), dtype=np.float32)
        out = np.empty((m, n), np.float32)
        out_np = np.empty((m, n), np.float32)
        f = hg.jit(lambda x, w: x @ w.T)
        tx, tw, tout = torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(out.copy())
        fns = {"torch": lambda tx=tx, tw=tw, tout=tout: torch.mm(tx, tw.t(), out=tout),
               "numpy": lambda x=x, w=w, o=out_np: np.matmul(x, w.T, out=o),
               "hologram": lambda f=f, x=x, w=w, out=out: f(x, w, out=out)}
        out_p = np.empty((m, n), np.float32)
        packed = packed_gemm(x, w, out_p)
        if packed is not None:
            packed()
            np.testing.assert_allclose(out_p, x @ w.T, rtol=1e-4, atol=1e-3 * np.sqrt(k))
            fns["packed"] = packed
        # settle: OpenBLAS's threads spin ~0.1 s after NumPy's call (docs/perf.md); the
        # next sample must not share the cores with them
        timings = common.measure_interleaved(fns, repeat=repeat, settle_s=0.12)
        flops = 2 * m * k * n
        g = {name: flops / tm.median / 1e9 for name, tm in timings.items()}
        ratios.append(g["hologram"] / g["torch"])
        if "packed" in g:
            packed_ratios.append(g["packed"] / g["torch"])
        t.add(f"{m} x {k} x {n}", f"{g['torch']:.0f}", f"{g['numpy']:.0f}",
              f"{g['hologram']:.0f}", f"{g['packed']:.0f}" if "packed" in g else "-",
              f"{g['hologram'] / g['torch']:.2f}",
              f"{g['packed'] / g['torch']:.2f}" if "packed" in g else "-")
    rep.data["gemm_provider"] = blas.describe()
    rep.data["gemm_ratio_vs_torch"] = ratios
    rep.data["gemm_packed_ratio_vs_torch"] = packed_ratios


def bf16_gemm(x: Any, w: Any, out: Any) -> Callable[[], None]:
    """``out = bf16(x @ w.T)`` of bf16 tensors as the torch.compile backend runs a bf16
    ``linear`` without bias: the compiled program's pointer launch, its product reading
    the bf16 operands in place (``blas.narrow_dtypes``) where the CPU can."""
    import hologram as hg
    from hologram.isa.builder import program

    ex = hg.default_executor("cpu")
    p = program(lambda a, b: (a.cast("f32") @ b.cast("f32").T).cast("bf16"),
                [("bf16", tuple(x.shape)), ("bf16", tuple(w.shape))])
    launch = ex.backend.pointer_launcher(ex.compile(p))
    if launch is None:
        raise RuntimeError("bf16 GEMM table: the cpu backend has no pointer launch here")
    ptrs = [x.data_ptr(), w.data_ptr(), out.data_ptr()]
    return lambda: launch(ptrs, [])


def gemm_table_bf16(rep: Report, repeat: int) -> None:
    """hologram's bf16 product (a program of ``bf16(x @ w.T)`` on bf16 operands) against
    torch.mm in bf16 (oneDNN), samples interleaved; the models' shapes."""
    import torch

    from hologram.compiler import blas

    rep.note(f"bf16 GEMM table: hologram's GEMM runs {blas.describe()}")
    t = rep.grid("bf16 GEMM x @ W.T on the models' shapes (interleaved medians; GFLOP/s)",
                 ["M x K x N", "torch.mm bf16", "hologram bf16", "hologram / torch.mm"])
    ratios = []
    for m, k, n in GEMM_SHAPES:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(m, k, generator=g).to(torch.bfloat16)
        w = torch.randn(n, k, generator=g).to(torch.bfloat16)
        out = torch.empty(m, n, dtype=torch.bfloat16)
        out_t = torch.empty_like(out)
        fn = bf16_gemm(x, w, out)
        fn()
        want = x.double() @ w.double().t()
        tol = 2.0 ** -7 * want.abs().max().item() + 1e-2  # one bf16 rounding of the result
        assert (out.double() - want).abs().max().item() <= tol, (m, k, n)
        timings = common.measure_interleaved(
            {"torch": lambda x=x, w=w, o=out_t: torch.mm(x, w.t(), out=o), "hologram": fn},
            repeat=repeat)
        flops = 2 * m * k * n
        rate = {name: flops / tm.median / 1e9 for name, tm in timings.items()}
        ratios.append(rate["hologram"] / rate["torch"])
        t.add(f"{m} x {k} x {n}", f"{rate['torch']:.0f}", f"{rate['hologram']:.0f}",
              f"{rate['hologram'] / rate['torch']:.2f}")
    rep.data["bf16_gemm_ratio_vs_torch"] = ratios


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--models", default="gpt2,bert,llama,t5,vit")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--no-train", action="store_true")
    p.add_argument("--no-gemm", action="store_true")
    p.add_argument("--cnn", action="store_true",
                   help=f"the CNN rows ({', '.join(CNNS)}; a ResNet-18 training step) "
                        "instead of the transformers'; no GEMM table")
    p.add_argument("--train-dropout", type=float, default=0.0,
                   help="dropout of the GPT-2 training step (the config's default is 0.1)")
    p.add_argument("--train-size", type=int, default=112,
                   help="image size of the ResNet-18 training step (--cnn)")
    p.add_argument("--backends", default=",".join(BACKENDS),
                   help=f"inference rows, of {', '.join((*BACKENDS, *EXTRA_BACKENDS))}")
    p.add_argument("--no-cold", action="store_true",
                   help="skip the cold first calls (a new process per backend and model, "
                        "empty kernel caches), measured at the first of --batches")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                   help="the inference rows' weights and float inputs (default float32)")
    p.add_argument("--cold-one", help=argparse.SUPPRESS)
    args = p.parse_args()
    global DTYPE
    DTYPE = args.dtype
    if args.cold_one:
        from hologram_torch.torchvision_import import import_torchvision

        import_torchvision()
        return _cold_one(args.cold_one)
    common.fresh_inductor_cache()
    import torch  # noqa: F401

    from hologram_torch.torchvision_import import import_torchvision

    import_torchvision()  # before transformers, which imports torchvision when installed

    common.quiet_hologram()
    import logging

    logging.getLogger("hologram_torch").setLevel(logging.ERROR)
    if args.cnn and args.models == p.get_default("models"):
        args.models = ",".join(CNNS)
    rep = Report("models", ("CNNs" if args.cnn else "transformer models")
                 + " through torch.compile backends on the CPU")
    repeat = 3 if args.quick else 7
    backends = tuple(filter(None, args.backends.split(",")))
    unknown = set(backends) - {*BACKENDS, *EXTRA_BACKENDS}
    if unknown or "eager" not in backends:
        raise SystemExit(f"--backends: eager (the baseline) and any of "
                         f"{', '.join((*BACKENDS, *EXTRA_BACKENDS))}; got {args.backends!r}")
    for name in filter(None, args.models.split(",")):  # --models '': the GEMM table only
        for i, batch in enumerate(int(b) for b in args.batches.split(",")):
            inference_table(rep, name, batch, repeat, backends,
                            cold=i == 0 and not args.no_cold)
    if not args.no_train:
        if args.cnn:
            cnn_training_table(rep, repeat, size=args.train_size)
        else:
            training_table(rep, repeat, dropout=args.train_dropout)
    if not args.no_gemm and not args.cnn:
        (gemm_table_bf16 if DTYPE == "bfloat16" else gemm_table)(rep, repeat)
    rep.finish(args)


if __name__ == "__main__":
    main()
