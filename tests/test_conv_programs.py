"""The convolution and pool programs of ``hologram_torch.lowering`` on every backend:
the reference interpreter, the compiled CPU backend, WebGPU (lavapipe in CI; float32)
and CUDA C (compiled to sm_90 by NVRTC, no GPU needed), against ``F.conv2d`` and
``F.avg_pool2d``. They use no instruction of their own (views, CONCAT, element-wise
ops, reductions, GEMM), so this checks that those renderers agree on them."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import hologram as hg  # noqa: E402
from hologram.backends import registry  # noqa: E402
from hologram.isa import builder as b  # noqa: E402
from hologram_torch.lowering.convolution import (  # noqa: E402
    FOLD_MAX_POSITIONS,
    conv_input_grad,
    conv_nd,
    conv_weight_grad,
)
from hologram_torch.lowering.reductions import staged_sum  # noqa: E402

F = torch.nn.functional

#: (input shape, weight shape, stride, padding, dilation, groups)
CASES = {
    "dense 3x3 pad": ((2, 4, 7, 6), (5, 4, 3, 3), (1, 1), (1, 1), (1, 1), 1),
    "strided grouped dilated": ((1, 4, 9, 8), (6, 2, 3, 2), (2, 1), (1, 2), (2, 1), 2),
    "depthwise 5x5 s2": ((2, 3, 8, 8), (6, 1, 5, 5), (2, 2), (2, 2), (1, 1), 3),
    # narrow output rows: computed over the flat padded plane (_depthwise_flat), a
    # channel multiplier of 2, a non-square plane, and padding wider than the kernel's
    "depthwise flat 5x5": ((2, 3, 7, 6), (6, 1, 5, 5), (1, 1), (2, 2), (1, 1), 3),
    "depthwise flat 7x7 pad 4": ((1, 2, 9, 5), (2, 1, 7, 7), (1, 1), (4, 3), (1, 1), 2),
    # strided: over flat phase planes (_depthwise_flat_phases), odd sizes, unequal strides
    "depthwise flat 5x5 s2": ((2, 3, 14, 13), (3, 1, 5, 5), (2, 2), (2, 2), (1, 1), 3),
    "depthwise flat 5x5 s(3,2) pad (1,3)": ((1, 2, 11, 9), (4, 1, 5, 5), (3, 2), (1, 3),
                                            (1, 1), 2),
    "pointwise": ((1, 3, 5, 4), (2, 3, 1, 1), (1, 1), (0, 0), (1, 1), 1),
    "dense per image": ((2, 3, 17, 16), (4, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1),
    # a stem (7x7, stride 2, padding 3) with more positions than a folded batch: the
    # im2col's taps are windows of phase planes (im2col_taps), odd input sizes
    "stem 7x7 s2": ((2, 3, 35, 33), (4, 3, 7, 7), (2, 2), (3, 3), (1, 1), 1),
    # a batch with few positions: one GEMM over the batch (folded), padded windows
    "folded 3x3 s2": ((3, 4, 7, 6), (5, 4, 3, 3), (2, 2), (1, 2), (1, 1), 1),
    "folded 1x1 s2": ((2, 3, 5, 6), (4, 3, 1, 1), (2, 2), (0, 0), (1, 1), 1),
    "folded dilated": ((2, 2, 9, 8), (3, 2, 3, 2), (1, 3), (2, 1), (2, 2), 1),
}


def _arrays(name: str, dtype: type) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    xs, ws, *_ = CASES[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    x = rng.standard_normal(xs).astype(dtype)
    x.reshape(-1)[3] = np.nan  # NaN stays in the windows that read it
    return x, rng.standard_normal(ws).astype(dtype), rng.standard_normal(ws[0]).astype(dtype)


def _want(name: str, x: np.ndarray, w: np.ndarray, bias: np.ndarray) -> np.ndarray:
    _, _, s, p, d, g = CASES[name]
    return F.conv2d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(bias),
                    s, p, d, g).numpy()


def _forward(name: str, outs: tuple[int, ...]):
    _, _, s, p, d, g = CASES[name]
    return lambda x, w, bias: conv_nd(x, w, bias, s, p, d, g, outs)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("name", list(CASES))
def test_convolution_forward_and_backward_float64(backend, name):
    xs, ws, s, p, d, g = CASES[name]
    x, w, bias = _arrays(name, np.float64)
    want = _want(name, x, w, bias)
    got = hg.jit(_forward(name, want.shape[2:]), backend=backend)(x, w, bias)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    # backward against autograd, on inputs without NaN
    x = np.nan_to_num(x)
    gy = np.random.default_rng(1).standard_normal(want.shape)
    tx, tw = torch.from_numpy(x).requires_grad_(), torch.from_numpy(w).requires_grad_()
    F.conv2d(tx, tw, None, s, p, d, g).backward(torch.from_numpy(gy))
    dx = hg.jit(lambda gy, w: conv_input_grad(gy, w, xs[2:], s, p, d, g),
                backend=backend)(gy, w)
    dw = hg.jit(lambda gy, x: conv_weight_grad(gy, x, ws, s, p, d, g), backend=backend)(gy, x)
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(dw, tw.grad.numpy(), rtol=1e-11, atol=1e-11)


@pytest.mark.skipif(registry.why_unavailable("webgpu") is not None,
                    reason=f"webgpu unavailable: {registry.why_unavailable('webgpu')}")
@pytest.mark.parametrize("name", list(CASES))
def test_convolution_on_webgpu_float32(name):
    x, w, bias = _arrays(name, np.float32)
    want = _want(name, x, w, bias)
    got = hg.jit(_forward(name, want.shape[2:]), backend="webgpu")(x, w, bias)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def _backward(name: str, outs: tuple[int, ...]):
    """The input and weight gradients of case ``name`` in one program (col2im, the
    GEMM over the batch where the case is folded) and the bias gradient (a staged sum
    over the batch and positions)."""
    xs, ws, s, p, d, g = CASES[name]

    def grads(gy, x, w):
        return (conv_input_grad(gy, w, xs[2:], s, p, d, g),
                conv_weight_grad(gy, x, ws, s, p, d, g),
                staged_sum(gy, (0, 2, 3)))
    return grads


def _backward_arrays(name: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(gy, x, w) in float32 and autograd's (dx, dw, db) from them in float64."""
    xs, ws, s, p, d, g = CASES[name]
    x, w, bias = _arrays(name, np.float32)
    x = np.nan_to_num(x)
    outs = _want(name, x, w, bias).shape
    gy = np.random.default_rng(2).standard_normal(outs).astype(np.float32)
    tx, tw, tb = (torch.from_numpy(a.astype(np.float64)).requires_grad_() for a in (x, w, bias))
    F.conv2d(tx, tw, tb, s, p, d, g).backward(torch.from_numpy(gy.astype(np.float64)))
    return [gy, x, w], [tx.grad.numpy(), tw.grad.numpy(), tb.grad.numpy()]


@pytest.mark.skipif(registry.why_unavailable("webgpu") is not None,
                    reason=f"webgpu unavailable: {registry.why_unavailable('webgpu')}")
@pytest.mark.parametrize("name", ["dense 3x3 pad", "strided grouped dilated", "dense per image",
                                  "folded 3x3 s2", "folded 1x1 s2"])
def test_convolution_backward_on_webgpu_float32(name):
    ins, want = _backward_arrays(name)
    got = hg.jit(_backward(name, ins[0].shape[2:]), backend="webgpu")(*ins)
    for gv, wv in zip(got, want, strict=True):
        np.testing.assert_allclose(gv, wv, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["dense 3x3 pad", "folded 3x3 s2", "folded 1x1 s2",
                                  "folded dilated"])
def test_convolution_runs_on_emulated_cuda(emulated_cuda, name):
    """The windowed taps (zero padding as CONCAT parts around each tap) and the GEMM over
    the batch, run as CUDA C, against ``F.conv2d``; outputs between canaries."""
    from .programs import compiled_and_reference

    xs, ws, *_ = CASES[name]
    x, w, bias = _arrays(name, np.float32)
    want = _want(name, x, w, bias)
    p = b.program(_forward(name, want.shape[2:]),
                  [("f32", xs), ("f32", ws), ("f32", (ws[0],))])
    (got,), (ref,) = compiled_and_reference(emulated_cuda, p, [x, w, bias])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ref, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["strided grouped dilated", "dense per image",
                                  "folded 3x3 s2", "folded dilated"])
def test_convolution_backward_runs_on_emulated_cuda(emulated_cuda, name):
    """The gradients (col2im, the weight gradient as one GEMM over the batch, the
    staged bias sum) as CUDA C, against autograd; outputs between canaries."""
    from .programs import compiled_and_reference

    ins, want = _backward_arrays(name)
    p = b.program(_backward(name, ins[0].shape[2:]), [("f32", a.shape) for a in ins])
    got, ref = compiled_and_reference(emulated_cuda, p, ins)
    for gv, rv, wv in zip(got, ref, want, strict=True):
        np.testing.assert_allclose(gv, wv, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(rv, wv, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", list(CASES))
def test_convolution_kernels_compile_for_cuda(name):
    from hologram.compiler import nvrtc

    if not nvrtc.available():
        pytest.skip("NVRTC is not installed")
    from .test_cuda_compile import compile_for_gpu

    xs, ws, *_ = CASES[name]
    x, w, bias = _arrays(name, np.float32)
    outs = _want(name, x, w, bias).shape[2:]
    p = b.program(_forward(name, outs), [("f32", xs), ("f32", ws), ("f32", (ws[0],))])
    compile_for_gpu(p)


@pytest.mark.parametrize("name", list(CASES))
def test_convolution_backward_kernels_compile_for_cuda(name):
    from hologram.compiler import nvrtc

    if not nvrtc.available():
        pytest.skip("NVRTC is not installed")
    from .test_cuda_compile import compile_for_gpu

    ins, _ = _backward_arrays(name)
    compile_for_gpu(b.program(_backward(name, ins[0].shape[2:]),
                              [("f32", a.shape) for a in ins]))


def test_a_weight_gradient_is_one_gemm_over_the_batch():
    """The weight gradient of a dense convolution is one GEMM whose inner dimension is
    the batch times the positions (the gradient ``[O, B*L]`` times the columns read
    transposed), at any number of positions: no product per image summed after.
    (Winograd's weight gradient, which 289 positions at float32 would take, is off here;
    tests/test_winograd.py covers it.)"""
    from hologram_torch.lowering import convolution

    for size in (7, 17):  # 49 and 289 positions: below and above FOLD_MAX_POSITIONS
        def grad(gy, x, size=size):
            return (conv_weight_grad(gy, x, (16, 8, 3, 3), (1, 1), (1, 1), (1, 1), 1),)

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(convolution, "WEIGHT_GRAD_WINOGRAD", False)
            (g,) = _gemms(grad, [("f32", (3, 16, size, size)),
                                 ("f32", (3, 8, size, size))])
        assert g.shape == (1, 16, 8 * 9)
        assert g.srcs[0].shape[-1] == 3 * size * size


def test_staged_sum_matches_numpy():
    """``staged_sum`` (the trailing reduced axes first) against NumPy in float64, with
    NaN, inf and zero-size axes, keepdims or not; on the reference and the CPU backend."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, 4, 5, 6))
    x[0, 1, 2, 3], x[2, 3, 0, 0] = np.nan, np.inf
    for axes in [(0, 2, 3), (0, 3), (1, 2, 3), (0, 1), (2,)]:
        for keep in (False, True):
            want = x.sum(axes, keepdims=keep)
            for backend in ("reference", "cpu"):
                got = hg.jit(lambda v, axes=axes, keep=keep: (staged_sum(v, axes, keep),),
                             backend=backend)(x)
                got = got[0] if isinstance(got, tuple) else got
                np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    empty = np.zeros((0, 4, 5, 6))
    got = hg.jit(lambda v: (staged_sum(v, (0, 2, 3)),), backend="cpu")(empty)
    np.testing.assert_array_equal(got[0] if isinstance(got, tuple) else got, np.zeros(4))


def _gemms(fn, specs) -> list:
    from hologram.isa.opcodes import Op

    return [v for v in b.program(fn, specs).instructions if v.op is Op.GEMM]


def test_a_pointwise_convolution_is_one_gemm_per_image():
    """A 1x1, stride-1 convolution is the weight times the image ``[C, H*W]``: one GEMM
    per image whose rows are the output channels (channels-first, as stored). The patch
    path, batched over output rows (m = 7 on ConvNeXt's last stage), ran its MLP's
    GEMMs at 9 GFLOP/s. A patch embedding (stride = kernel > 1) is one 2-D GEMM over
    the whole batch, oriented so its operand's copy runs along the longer of a window's
    row and an output row. A batch of images with few positions each is one GEMM over
    the batch (the next test)."""
    def pointwise(x, w):
        return (conv_nd(x, w, None, (1, 1), (0, 0), (1, 1), 1, (16, 17)),)

    (g,) = _gemms(pointwise, [("f32", (2, 320, 16, 17)), ("f32", (1280, 320, 1, 1))])
    assert g.shape == (2, 1, 1280, 16 * 17)

    def patches(x, w):
        return (conv_nd(x, w, None, (4, 4), (0, 0), (1, 1), 1, (4, 4)),)

    # ViT-like: 4-wide windows, 4 outputs per row: [B*L, C*K] @ W.T, rows of windows
    (g,) = _gemms(patches, [("f32", (2, 3, 16, 16)), ("f32", (8, 3, 4, 4))])
    assert g.shape == (2 * 16, 8)

    def downsample(x, w):
        return (conv_nd(x, w, None, (2, 2), (0, 0), (1, 1), 1, (7, 7)),)

    # ConvNeXt's downsampling: 2-wide windows, 7 outputs per row: W @ [C*K, B*L]
    (g,) = _gemms(downsample, [("f32", (3, 40, 14, 14)), ("f32", (80, 40, 2, 2))])
    assert g.shape == (80, 3 * 49)


@pytest.mark.parametrize("kernel,stride,pad", [((3, 3), (1, 1), (1, 1)), ((1, 1), (2, 2), (0, 0))])
def test_a_batch_with_few_positions_is_one_gemm(kernel, stride, pad, monkeypatch):
    """Up to ``FOLD_MAX_POSITIONS`` output positions per image, a dense convolution of a
    batch is one GEMM, the weight times every image's columns side by side (BLAS packs
    the weight once, not once per image); above, one GEMM per image. The values are
    checked against ``F.conv2d`` on every backend by the tests above ("folded" cases).
    Winograd, which takes a 3x3 stride-1 one at 7x7 since session 23, is kept out."""
    from hologram_torch.lowering import winograd

    monkeypatch.setattr(winograd, "MIN_POSITIONS", 10**9)

    def conv(x, w):
        return (conv_nd(x, w, None, stride, pad, (1, 1), 1, (7, 7)),)

    size = [6 * s + k - 2 * p for k, s, p in zip(kernel, stride, pad, strict=True)]  # 7x7 out
    (g,) = _gemms(conv, [("f32", (3, 8, *size)), ("f32", (16, 8, *kernel))])
    assert g.shape == (16, 3 * 49)
    assert FOLD_MAX_POSITIONS < 16 * 17


def test_a_strided_im2col_copies_its_taps_in_one_loop_nest():
    """A 7x7 stride-2 im2col's taps are plain windows of the input's phase planes
    (``im2col_taps``), which the renderer folds into one loop nest over a table of
    their starts: a padded strided window of the input per tap was up to five loop
    nests each, ResNet-18's stem 239 loops and most of a cold first call's compiler
    time. The values: the "stem" case above."""
    ex = hg.Executor(backend="cpu")
    if "C via" not in ex.backend.describe():
        pytest.skip("no C compiler")
    outs = (17, 17)

    def stem(x, w):
        return (conv_nd(x, w, None, (2, 2), (3, 3), (1, 1), 1, outs),)

    p = b.program(stem, [("f32", (2, 3, 33, 33)), ("f32", (4, 3, 7, 7))])
    src = ex.compile(p).lowered.source
    assert FOLD_MAX_POSITIONS < 17 * 17  # one GEMM per image: the im2col is stored
    assert "tap < 49;" in src and src.count("for (") < 30, src


#: (input, out channels, kernel, stride, padding, dilation): strided input gradients
#: summed per output phase, sizes that do and do not divide by the stride
PHASE_CASES = [((2, 3, 8, 8), 4, 3, 2, 1, 1), ((2, 3, 9, 7), 4, 3, 2, 1, 1),
               ((1, 2, 8, 8), 3, 1, 2, 0, 1), ((2, 2, 11, 10), 3, 3, 3, 1, 1),
               ((1, 2, 12, 12), 3, 3, 2, 2, 2), ((2, 3, 10, 9), 2, 5, 2, 2, 1),
               ((2, 2, 13, 6), 2, 4, 3, 1, 1),
               # a tap whose shifted window starts before the phase (q < 0) on a
               # one-wide output (OpInfo's conv2d samples 8 and 9)
               ((1, 2, 4, 3), 4, (3, 4), 2, 1, 1)]


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("case", PHASE_CASES, ids=str)
def test_strided_input_gradient_by_phase(backend, case):
    """col2im of a strided dense convolution, its taps summed per output phase and the
    phases interleaved (``convolution._phases_input_grad``): PyTorch's input gradient
    in float64, and the same values as the dilated taps (``COL2IM_PHASES`` off)."""
    from hologram_torch.lowering import convolution

    xs, o, k, s, p, d = case
    kk = k if isinstance(k, tuple) else (k, k)
    rng = np.random.default_rng(sum(xs) + sum(kk))
    w = rng.standard_normal((o, xs[1], *kk))
    x = torch.zeros(xs, dtype=torch.float64, requires_grad=True)
    y = F.conv2d(x, torch.from_numpy(w), stride=s, padding=p, dilation=d)
    g = rng.standard_normal(tuple(y.shape))
    y.backward(torch.from_numpy(g))

    def grad(gv, wv):
        return convolution.conv_input_grad(gv, wv, xs[2:], (s, s), (p, p), (d, d), 1)

    got = {}
    for on in (True, False):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(convolution, "COL2IM_PHASES", on)
            got[on] = np.asarray(hg.jit(grad, backend=backend)(g, w))
    np.testing.assert_allclose(got[True], x.grad.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got[True], got[False], rtol=1e-12, atol=1e-12)


def test_strided_input_gradient_by_phase_random_shapes():
    """Random small strided convolutions (kernel, stride, padding and dilation per dim;
    outputs one wide included) on the reference backend: the phase sum equals
    PyTorch's input gradient in float64."""
    from hologram_torch.lowering import convolution

    rng = np.random.default_rng(21)
    done = 0
    while done < 40:
        k = tuple(int(v) for v in rng.integers(1, 5, 2))
        s = tuple(int(v) for v in rng.integers(1, 4, 2))
        d = tuple(int(v) for v in rng.integers(1, 3, 2))
        p = tuple(int(rng.integers(0, ki)) for ki in k)
        hw = tuple(int(v) for v in rng.integers(1, 10, 2))
        outs = [(n + 2 * pi - di * (ki - 1) - 1) // si + 1
                for n, pi, di, ki, si in zip(hw, p, d, k, s, strict=True)]
        if max(s) == 1 or min(outs) < 1:
            continue
        w = rng.standard_normal((3, 2, *k))
        x = torch.zeros((2, 2, *hw), dtype=torch.float64, requires_grad=True)
        y = F.conv2d(x, torch.from_numpy(w), stride=s, padding=p, dilation=d)
        g = rng.standard_normal(tuple(y.shape))
        y.backward(torch.from_numpy(g))
        got = hg.jit(lambda gv, wv, hw=hw, s=s, p=p, d=d: convolution.conv_input_grad(
            gv, wv, hw, s, p, d, 1), backend="reference")(g, w)
        np.testing.assert_allclose(np.asarray(got), x.grad.numpy(), rtol=1e-12, atol=1e-12,
                                   err_msg=f"kernel {k} stride {s} padding {p} "
                                           f"dilation {d} input {hw}")
        done += 1
