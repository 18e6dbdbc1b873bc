"""3x3 stride-1 float32 convolutions by Winograd's F(m x m, 3 x 3)
(``hologram_torch.lowering.winograd``): the transform tables exact, the path taken where
it should be and not elsewhere, eager's values on every backend (reference
interpreter, CPU, WebGPU, CUDA C), and non-finite inputs confined to their tiles."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import hologram as hg  # noqa: E402
from hologram.backends import registry  # noqa: E402
from hologram.isa import builder as b  # noqa: E402
from hologram.isa.opcodes import Op  # noqa: E402
from hologram_torch.lowering import winograd  # noqa: E402
from hologram_torch.lowering.convolution import conv_nd  # noqa: E402

F = torch.nn.functional

#: (input shape, output channels, padding): m = 4 where the output divides by 4
CASES = {
    "m4 pad 1": ((2, 3, 16, 16), 4, 1),
    "m4 no padding": ((2, 2, 18, 22), 3, 0),
    "m2 overhanging tiles": ((3, 4, 15, 17), 5, 1),
    "m2 pad 2": ((2, 2, 14, 15), 3, 2),
}


def _matmul(x: list, y: list) -> list:
    return [[sum((x[i][k] * y[k][j] for k in range(len(y))), Fraction(0))
             for j in range(len(y[0]))] for i in range(len(x))]


def _t(x: list) -> list:
    return [list(r) for r in zip(*x, strict=True)]


@pytest.mark.parametrize("m", sorted(winograd.TRANSFORMS))
def test_transform_tables_give_the_correlation_exactly(m):
    """``AT [(G g GT) * (BT d B)] A`` is the 3x3 correlation of an (m+2)-square tile,
    in exact rational arithmetic, on random integer tiles and kernels."""
    bt, g, at = winograd.TRANSFORMS[m]
    bt, g, at = ([[Fraction(v) for v in r] for r in t] for t in (bt, g, at))
    rng = np.random.default_rng(m)
    for _ in range(3):
        d = [[Fraction(int(v)) for v in r] for r in rng.integers(-9, 10, (m + 2, m + 2))]
        k = [[Fraction(int(v)) for v in r] for r in rng.integers(-9, 10, (3, 3))]
        u = _matmul(_matmul(g, k), _t(g))
        v = _matmul(_matmul(bt, d), _t(bt))
        prod = [[u[i][j] * v[i][j] for j in range(m + 2)] for i in range(m + 2)]
        y = _matmul(_matmul(at, prod), _t(at))
        want = [[sum(d[i + p][j + q] * k[p][q] for p in range(3) for q in range(3))
                 for j in range(m)] for i in range(m)]
        assert y == want


def _arrays(name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    xs, o, _ = CASES[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    return (rng.standard_normal(xs).astype(np.float32),
            rng.standard_normal((o, xs[1], 3, 3)).astype(np.float32),
            rng.standard_normal(o).astype(np.float32))


def _want(name: str, x: np.ndarray, w: np.ndarray, bias: np.ndarray) -> np.ndarray:
    p = CASES[name][2]
    return F.conv2d(*(torch.from_numpy(a).double() for a in (x, w, bias)), padding=p).numpy()


def _forward(name: str, outs: tuple[int, ...]):
    p = CASES[name][2]
    return lambda x, w, bias: conv_nd(x, w, bias, (1, 1), (p, p), (1, 1), 1, outs)


def _specs(name: str) -> list:
    xs, o, _ = CASES[name]
    return [("f32", xs), ("f32", (o, xs[1], 3, 3)), ("f32", (o,))]


def _close(got: np.ndarray, want: np.ndarray) -> None:
    """float32 against float64: within 1e-5 of the largest magnitude (F(4, 3) rounds
    ~10x more than the direct sum; docs/perf.md, "Session 13, CNN inference")."""
    assert got.shape == want.shape
    assert np.all(np.isfinite(got))
    err = np.abs(got.astype(np.float64) - want).max() / np.abs(want).max()
    assert err <= 1e-5, err


@pytest.mark.parametrize("name", list(CASES))
def test_the_winograd_path_is_one_gemm_per_tile_position(name):
    """Each case is one GEMM batched over the ``(m+2)^2`` tile positions; float64 and
    ``HOLOGRAM_CONV=direct`` keep the im2col path (a GEMM over ``9 C`` rows)."""
    xs, o, p = CASES[name]
    outs = (xs[2] + 2 * p - 2, xs[3] + 2 * p - 2)
    m = winograd.tile_size(outs)
    (g,) = [v for v in b.program(_forward(name, outs), _specs(name)).instructions
            if v.op is Op.GEMM]
    assert g.shape[0] == (m + 2) ** 2 and g.shape[1] == o
    f64 = [(d.replace("f32", "f64"), s) for d, s in _specs(name)]
    for specs in (f64, None):
        if specs is None:
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("HOLOGRAM_CONV", "direct")
                prog = b.program(_forward(name, outs), _specs(name))
        else:
            prog = b.program(_forward(name, outs), specs)
        (g,) = [v for v in prog.instructions if v.op is Op.GEMM]
        assert 9 * xs[1] in g.srcs[0].shape[-1:]


def test_small_or_strided_convolutions_stay_direct():
    x, w = b.ldg(0, "f32", (2, 8, 6, 6)), b.ldg(1, "f32", (8, 8, 3, 3))
    assert not winograd.applies(b.Var(x), b.Var(w), (1, 1), (1, 1), 1, (6, 6))  # 36 < 49
    x = b.ldg(0, "f32", (2, 8, 7, 7))  # ResNet-18's last stage: Winograd since session 23
    assert winograd.applies(b.Var(x), b.Var(w), (1, 1), (1, 1), 1, (7, 7))
    x = b.ldg(0, "f32", (2, 8, 32, 32))
    assert not winograd.applies(b.Var(x), b.Var(w), (2, 2), (1, 1), 1, (16, 16))
    assert not winograd.applies(b.Var(x), b.Var(w), (1, 1), (2, 2), 1, (28, 28))
    assert winograd.applies(b.Var(x), b.Var(w), (1, 1), (1, 1), 1, (32, 32))
    # batch 1 too since session 24: inference graphs keep the transformed weight
    one = b.ldg(0, "f32", (1, 8, 34, 34))
    assert winograd.applies(b.Var(one), b.Var(w), (1, 1), (1, 1), 1, (32, 32))


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("name", list(CASES))
def test_winograd_matches_conv2d(backend, name):
    x, w, bias = _arrays(name)
    want = _want(name, x, w, bias)
    got = hg.jit(_forward(name, want.shape[2:]), backend=backend)(x, w, bias)
    _close(np.asarray(got), want)


@pytest.mark.skipif(registry.why_unavailable("webgpu") is not None,
                    reason=f"webgpu unavailable: {registry.why_unavailable('webgpu')}")
@pytest.mark.parametrize("name", ["m4 pad 1", "m2 overhanging tiles"])
def test_winograd_on_webgpu(name):
    x, w, bias = _arrays(name)
    want = _want(name, x, w, bias)
    got = hg.jit(_forward(name, want.shape[2:]), backend="webgpu")(x, w, bias)
    _close(np.asarray(got), want)


@pytest.mark.parametrize("name", ["m4 no padding", "m2 pad 2"])
def test_winograd_on_emulated_cuda(emulated_cuda, name):
    from .programs import compiled_and_reference

    x, w, bias = _arrays(name)
    want = _want(name, x, w, bias)
    p = b.program(_forward(name, want.shape[2:]), _specs(name))
    (got,), (ref,) = compiled_and_reference(emulated_cuda, p, [x, w, bias])
    _close(got, want)
    _close(ref, want)


def test_winograd_kernels_compile_for_cuda():
    from hologram.compiler import nvrtc

    if not nvrtc.available():
        pytest.skip("NVRTC is not installed")
    from .test_cuda_compile import compile_for_gpu

    for name in ("m4 pad 1", "m2 overhanging tiles"):
        x, w, bias = _arrays(name)
        p = b.program(_forward(name, _want(name, x, w, bias).shape[2:]), _specs(name))
        compile_for_gpu(p)


@pytest.mark.parametrize("m,bad", [(4, float("inf")), (2, float("nan")), (4, -float("inf"))])
def test_a_non_finite_input_stays_in_its_tiles(m, bad):
    """The documented difference from the direct sum: a non-finite input element may
    turn every output of the tiles whose input window holds it non-finite (inf - inf),
    but no other output, and an output the direct sum makes non-finite stays so."""
    name = "m4 pad 1" if m == 4 else "m2 overhanging tiles"
    x, w, bias = _arrays(name)
    p = CASES[name][2]
    at = (0, 1, 6, 9)
    x[at] = bad
    want = _want(name, x, w, bias)
    got = np.asarray(hg.jit(_forward(name, want.shape[2:]), backend="cpu")(x, w, bias))
    assert winograd.tile_size(want.shape[2:]) == m
    row, col = at[2] + p, at[3] + p  # in the padded input
    near = np.zeros(want.shape[2:], bool)
    for ty, tx in itertools.product(range(-(-want.shape[2] // m)),
                                    range(-(-want.shape[3] // m))):
        if ty * m <= row < ty * m + m + 2 and tx * m <= col < tx * m + m + 2:
            near[ty * m:(ty + 1) * m, tx * m:(tx + 1) * m] = True
    far = np.broadcast_to(~near, want.shape)
    scale = np.abs(want[far]).max()
    assert np.all(np.isfinite(got[far]))
    assert np.abs(got[far] - want[far]).max() <= 1e-5 * scale
    assert np.all(~np.isfinite(got[~np.isfinite(want)]))
    assert near.sum() < near.size  # the tiles are a part of the output, not all of it


def test_compiled_block_matches_eager():
    """A ResNet block's convolution, batch norm and ReLU at float32 through
    ``torch.compile``: eager's values (relative 1e-5) on a non-contiguous input."""
    import hologram_torch  # noqa: F401  (registers backend="hologram")

    torch._dynamo.reset()
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, padding=1),
                                torch.nn.BatchNorm2d(8), torch.nn.ReLU()).eval()
    for bn in block[1:2]:
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    x = torch.randn(2, 8, 16, 20).to(memory_format=torch.channels_last)
    f = torch.compile(block, backend="hologram")
    with torch.no_grad():
        got, want = f(x), block(x)
    err = (got.double() - want.double()).abs().max().item() / want.abs().max().item()
    assert err <= 1e-5, err


def _setting_run(setting: str, on: bool, fn, specs: list, args: list, backend: str):
    """(the program's one GEMM, ``fn``'s result on ``backend``) with
    ``lowering.convolution.<setting>`` set to ``on`` while the program is built."""
    from hologram_torch.lowering import convolution as conv

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conv, setting, on)
        prog = b.program(fn, specs)
        got = hg.jit(fn, backend=backend)(*args)
    (gemm,) = [v for v in prog.instructions if v.op is Op.GEMM]
    return gemm, np.asarray(got)


@pytest.mark.parametrize("shape", [(2, 6, 16, 16), (3, 4, 15, 17)])
def test_input_gradient_runs_winograd(shape):
    """A dense stride-1 3x3 convolution's input gradient (padding 1) is the transposed
    convolution of the output gradient through Winograd (one GEMM batched over the tile
    positions, no column matrix); with ``INPUT_GRAD_WINOGRAD`` off it is col2im (a GEMM
    over the output channels into ``9 C`` rows). Both match float64 on the CPU."""
    from hologram_torch.lowering import convolution as conv

    bsz, c, h, w = shape
    o = 5
    rng = np.random.default_rng(sum(shape))
    g = rng.standard_normal((bsz, o, h, w)).astype(np.float32)
    wt = rng.standard_normal((o, c, 3, 3)).astype(np.float32)

    def grad(gv, wv):
        return conv.conv_input_grad(gv, wv, (h, w), (1, 1), (1, 1), (1, 1), 1)

    specs = [("f32", g.shape), ("f32", wt.shape)]
    x = torch.zeros(shape, dtype=torch.float64, requires_grad=True)
    F.conv2d(x, torch.from_numpy(wt).double(), padding=1).backward(
        torch.from_numpy(g).double())
    want = x.grad.numpy()
    m = winograd.tile_size((h, w))
    for on in (True, False):
        gemm, got = _setting_run("INPUT_GRAD_WINOGRAD", on, grad, specs, [g, wt], "cpu")
        if on:
            assert gemm.shape[0] == (m + 2) ** 2 and gemm.shape[1] == c
        else:
            assert 9 * c in gemm.shape
        _close(got, want)


@pytest.mark.parametrize("shape", [(2, 6, 16, 16), (3, 4, 15, 17)])
@pytest.mark.parametrize("backend", ["reference", "cpu", "webgpu"])
def test_weight_gradient_runs_winograd(shape, backend):
    """A dense stride-1 3x3 convolution's weight gradient (padding 1) runs through
    F(m x m, 3 x 3): one GEMM batched over the ``(m+2)^2`` tile positions whose inner
    dimension is the tiles (``[t, O, N] x [t, N, C]``); with ``WEIGHT_GRAD_WINOGRAD``
    off, the column matrix's GEMM over ``9 C`` columns. Both match float64, tiles that
    overhang the output (15 x 17) included."""
    from hologram_torch.lowering import convolution as conv

    if registry.why_unavailable(backend) is not None:
        pytest.skip(f"{backend} unavailable: {registry.why_unavailable(backend)}")
    bsz, c, h, w = shape
    o = 5
    rng = np.random.default_rng(sum(shape) + 1)
    x = rng.standard_normal(shape).astype(np.float32)
    g = rng.standard_normal((bsz, o, h, w)).astype(np.float32)

    def grad(gv, xv):
        return conv.conv_weight_grad(gv, xv, (o, c, 3, 3), (1, 1), (1, 1), (1, 1), 1)

    wt = torch.zeros((o, c, 3, 3), dtype=torch.float64, requires_grad=True)
    F.conv2d(torch.from_numpy(x).double(), wt, padding=1).backward(
        torch.from_numpy(g).double())
    want = wt.grad.numpy()
    m = winograd.tile_size((h, w))
    for on in (True, False):
        gemm, got = _setting_run("WEIGHT_GRAD_WINOGRAD", on, grad,
                                 [("f32", g.shape), ("f32", x.shape)], [g, x], backend)
        if on:
            assert gemm.shape == ((m + 2) ** 2, o, c)
        else:
            assert 9 * c in gemm.shape
        _close(got, want)


def test_compiled_training_step_matches_float64():
    """Two 3x3 convolutions trained at float32 through ``torch.compile``: the forward,
    the input gradient and the weight gradients all take Winograd (16 x 16 planes, batch
    2), and match eager float64 within 1e-5 of each gradient's largest magnitude."""
    import copy

    import hologram_torch  # noqa: F401  (registers backend="hologram")

    torch._dynamo.reset()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.Conv2d(8, 6, 3, padding=1))
    x = torch.randn(2, 4, 16, 16)
    w_out = torch.randn(2, 6, 16, 16)

    def grads(model, inp, compiled):
        inp = inp.clone().requires_grad_(True)
        f = torch.compile(model, backend="hologram") if compiled else model
        (f(inp) * w_out.to(inp.dtype)).sum().backward()
        return [inp.grad] + [p.grad for p in model.parameters()]

    want = grads(copy.deepcopy(net).double(), x.double(), False)
    got = grads(copy.deepcopy(net), x, True)
    for g, w in zip(got, want, strict=True):
        err = (g.double() - w).abs().max().item() / w.abs().max().item()
        assert err <= 1e-5, err
