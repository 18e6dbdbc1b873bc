"""Convolutions inside hologram programs: a patch embedding (windows that do not
overlap) as one GEMM over views of the input, every other one (stride, padding,
dilation, groups, depthwise, 1-D) as taps feeding a GEMM or a direct kernel, forward
and backward."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import hologram_torch  # noqa: E402,F401  (registers backend="hologram")
from hologram_torch.compile_backend import collect_graphs  # noqa: E402


def _run(module: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list]:
    torch._dynamo.reset()
    f = torch.compile(module, backend="hologram")
    with torch.no_grad(), collect_graphs() as graphs:
        y = f(x)
    return y, [op for g in graphs for op, _ in g.torch_ops]


@pytest.mark.parametrize("shape,kernel,bias,contiguous", [
    ((2, 3, 64, 64), 16, True, True),       # ViT's patch embedding, scaled down
    ((1, 3, 66, 70), (16, 8), False, True),  # windows past the end are dropped, as ATen does
    ((3, 4, 10), 5, True, True),             # 1-D
    ((2, 3, 32, 32), 8, True, False),        # a non-contiguous (channels-last) input
    ((0, 3, 16, 16), 8, True, True),         # an empty batch
    ((2, 4, 12, 12), 2, True, True),         # ConvNeXt's downsampling: outputs per row > window
    ((1, 5, 13, 14), (3, 2), False, False),  # the same, channels-last, a row past the end
    ((2, 4, 13), 3, True, True),             # 1-D, 4 outputs of 3-wide windows
])
def test_patch_embedding_is_a_gemm_in_hologram(shape, kernel, bias, contiguous):
    torch.manual_seed(0)
    conv_cls = torch.nn.Conv2d if len(shape) == 4 else torch.nn.Conv1d
    conv = conv_cls(shape[1], 6, kernel, stride=kernel, bias=bias).double()
    x = torch.randn(shape, dtype=torch.float64)
    if not contiguous:
        x = x.to(memory_format=torch.channels_last)
    x[..., 0] = float("nan") if x.numel() else 0.0  # NaN stays in its own windows
    y, fell_back = _run(conv, x)
    want = conv(x)
    assert fell_back == []
    assert y.shape == want.shape
    torch.testing.assert_close(y, want, rtol=1e-12, atol=1e-12, equal_nan=True)


CASES = [  # (input shape, out channels, kernel, stride, padding, dilation, groups)
    ((2, 3, 9, 9), 4, 3, 1, 1, 1, 1),          # ResNet's 3x3
    ((2, 4, 10, 11), 6, 3, 2, 1, 1, 2),        # strided, grouped, odd sizes
    ((1, 8, 8, 8), 8, 3, 1, 1, 1, 8),          # depthwise
    ((2, 8, 9, 9), 16, 5, 2, 2, 1, 8),         # depthwise with a channel multiplier
    ((2, 3, 12, 12), 5, 7, 2, 3, 1, 1),        # ResNet's stem
    ((2, 4, 9, 9), 4, 3, 1, 2, 2, 1),          # dilated
    ((1, 4, 7, 7), 4, 1, 1, 0, 1, 1),          # pointwise
    ((1, 3, 5, 5), 2, 3, 3, 4, 2, 1),          # padding wider than the input
    ((2, 4, 13), 6, 3, 2, 1, 2, 2),            # 1-D
    ((2, 4, 10, 12), 6, (3, 1), (2, 1), (1, 0), 1, 1),  # asymmetric kernel
    ((2, 6, 7, 9), 12, 5, 1, 2, 1, 6),         # depthwise over a narrow plane: flat form
    ((1, 3, 5, 40), 3, 5, 1, 2, 1, 3),         # flat form, rows wider than a vector
    ((1, 4, 11, 10), 4, 3, (3, 2), 1, 2, 4),   # depthwise, strided and dilated: phase taps
]


@pytest.mark.parametrize("shape,o,k,s,p,d,g", CASES)
def test_convolution_runs_in_hologram(shape, o, k, s, p, d, g):
    """Every convolution (stride, padding, dilation, groups) runs in hologram: eager's
    result in float64 on fresh inputs, with NaN and inf in their windows, for a
    contiguous and a non-contiguous (channels-last or transposed) input."""
    torch.manual_seed(0)
    conv_cls = torch.nn.Conv2d if len(shape) == 4 else torch.nn.Conv1d
    conv = conv_cls(shape[1], o, k, stride=s, padding=p, dilation=d, groups=g).double()
    x = torch.randn(shape, dtype=torch.float64)
    x[0, 0, 1] = float("nan")
    x[-1, -1, -1] = float("inf")
    for inp in (x, x.to(memory_format=torch.channels_last) if x.ndim == 4
                else x.transpose(1, 2).contiguous().transpose(1, 2)):
        y, fell_back = _run(conv, inp)
        assert fell_back == []
        torch.testing.assert_close(y, conv(inp), rtol=1e-12, atol=1e-12, equal_nan=True)


def test_convolution_of_an_empty_batch():
    conv = torch.nn.Conv2d(3, 4, 3, padding=1).double()
    x = torch.randn(0, 3, 8, 8, dtype=torch.float64)
    y, fell_back = _run(conv, x)
    assert y.shape == (0, 4, 8, 8) and fell_back == []


@pytest.mark.parametrize("shape,o,k,s,p,d,g", CASES[:5] + CASES[7:])
def test_convolution_backward_gradcheck(shape, o, k, s, p, d, g):
    """convolution_backward's input, weight and bias gradients (float64 gradcheck of
    the compiled function, whose backward graph runs in hologram)."""
    from hologram_torch.compile_backend import collect_graphs

    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(shape, dtype=torch.float64, generator=gen, requires_grad=True)
    ks = (k,) * (len(shape) - 2) if isinstance(k, int) else k
    w = torch.randn(o, shape[1] // g, *ks, dtype=torch.float64, generator=gen,
                    requires_grad=True)
    b = torch.randn(o, dtype=torch.float64, generator=gen, requires_grad=True)
    conv = torch.nn.functional.conv2d if len(shape) == 4 else torch.nn.functional.conv1d
    f = torch.compile(lambda x, w, b: conv(x, w, b, s, p, d, g), backend="hologram")
    with collect_graphs() as graphs:
        assert torch.autograd.gradcheck(f, (x, w, b))
    assert {gr.kind for gr in graphs} >= {"forward", "backward"}
    assert [op for gr in graphs for op, _ in gr.torch_ops] == []


TRANSPOSED = [  # (input shape, out channels, kernel, stride, padding, output padding,
    #              dilation, groups)
    ((2, 4, 5, 6), 6, 4, 2, 1, 0, 1, 1),          # DCGAN's upsampling (k4 s2 p1)
    ((2, 8, 7, 7), 3, 2, 2, 0, 0, 1, 1),          # U-Net's up-convolution (k2 s2)
    ((2, 4, 5, 6), 6, 3, 2, 1, 1, 1, 1),          # output padding
    ((1, 4, 3, 3), 4, 3, 1, 0, 0, 1, 1),          # stride 1: a full correlation
    ((2, 4, 4, 5), 8, 3, 2, 0, 1, 2, 2),          # grouped, dilated
    ((2, 6, 4, 4), 6, 3, 2, 1, 1, 1, 6),          # depthwise
    ((2, 3, 9), 5, 5, 3, 2, 2, 1, 1),             # 1-D
    ((1, 2, 3, 4, 3), 3, 3, 2, 1, 1, 1, 1),       # 3-D
    ((2, 4, 5, 6), 6, (3, 2), (2, 1), (1, 0), (1, 0), (1, 2), 1),  # per-axis arguments
]


def _conv_transpose(nd: int):
    return getattr(torch.nn.functional, f"conv_transpose{nd}d")


def _transposed_inputs(shape, o, k, g, requires_grad=False):
    gen = torch.Generator().manual_seed(2)
    nd = len(shape) - 2
    ks = (k,) * nd if isinstance(k, int) else k
    x = torch.randn(shape, dtype=torch.float64, generator=gen, requires_grad=requires_grad)
    w = torch.randn(shape[1], o // g, *ks, dtype=torch.float64, generator=gen,
                    requires_grad=requires_grad)
    b = torch.randn(o, dtype=torch.float64, generator=gen, requires_grad=requires_grad)
    return x, w, b


@pytest.mark.parametrize("shape,o,k,s,p,op,d,g", TRANSPOSED)
def test_transposed_convolution_runs_in_hologram(shape, o, k, s, p, op, d, g):
    """``conv_transpose{1,2,3}d`` (the adjoint of a convolution: that convolution's
    input gradient, ``convolution.conv_transpose_nd``) runs in hologram: eager's result
    in float64, with NaN and inf in the input, contiguous and transposed in memory."""
    x, w, b = _transposed_inputs(shape, o, k, g)
    x[0, 0, 1] = float("nan")
    x[-1, -1, -1] = float("inf")
    f = _conv_transpose(len(shape) - 2)

    def fn(x, w, b):
        return f(x, w, b, stride=s, padding=p, output_padding=op, groups=g, dilation=d)

    for inp in (x, x.transpose(-1, -2).contiguous().transpose(-1, -2)):
        torch._dynamo.reset()
        with torch.no_grad(), collect_graphs() as graphs:
            y = torch.compile(fn, backend="hologram")(inp, w, b)
        assert [op_ for gr in graphs for op_, _ in gr.torch_ops] == []
        torch.testing.assert_close(y, fn(inp, w, b), rtol=1e-12, atol=1e-12,
                                   equal_nan=True)


@pytest.mark.parametrize("shape,o,k,s,p,op,d,g", TRANSPOSED[:3] + TRANSPOSED[4:7])
def test_transposed_convolution_backward_gradcheck(shape, o, k, s, p, op, d, g):
    """The transposed convolution's input gradient (a convolution), weight gradient
    (the forward's, the roles of input and gradient swapped) and bias gradient: float64
    gradcheck of the compiled function, both graphs wholly in hologram."""
    x, w, b = _transposed_inputs(shape, o, k, g, requires_grad=True)
    f = _conv_transpose(len(shape) - 2)
    torch._dynamo.reset()
    fn = torch.compile(lambda x, w, b: f(x, w, b, stride=s, padding=p, output_padding=op,
                                         groups=g, dilation=d), backend="hologram")
    with collect_graphs() as graphs:
        assert torch.autograd.gradcheck(fn, (x, w, b))
    assert {gr.kind for gr in graphs} >= {"forward", "backward"}
    assert [op_ for gr in graphs for op_, _ in gr.torch_ops] == []


def test_transposed_convolution_of_an_empty_batch():
    f = torch.nn.functional.conv_transpose2d
    x = torch.randn(0, 3, 4, 4, dtype=torch.float64)
    w = torch.randn(3, 5, 3, 3, dtype=torch.float64)
    b = torch.randn(5, dtype=torch.float64)
    torch._dynamo.reset()
    with torch.no_grad(), collect_graphs() as graphs:
        y = torch.compile(lambda x, w, b: f(x, w, b, stride=2), backend="hologram")(x, w, b)
    assert [op_ for gr in graphs for op_, _ in gr.torch_ops] == []
    assert y.shape == (0, 5, 9, 9)


class _ConvMlp(torch.nn.Module):
    """ConvNeXt's block MLP as timm writes it with ``conv_mlp``: a layer norm run
    channels-last (permute, layer_norm, permute back), then two 1x1 convolutions with
    GELU between, added to the input."""

    def __init__(self, c: int, hidden: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(c)
        self.fc1 = torch.nn.Conv2d(c, hidden, 1)
        self.fc2 = torch.nn.Conv2d(hidden, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(y)))


@pytest.mark.parametrize("shape,hidden,fires", [
    ((2, 8, 8, 8), 64, 1),    # fc1 (64 of 128 positions)
    ((1, 64, 9, 9), 72, 2),   # both: fc2 reads fc1's pixel-major result
    ((2, 4, 5, 6), 80, 0),    # too few positions and channels: the batched products
])
def test_a_1x1_convolution_of_channels_last_data_is_one_gemm_over_positions(shape, hidden,
                                                                            fires):
    """A 1x1 convolution whose input is channels-last data permuted back (ConvNeXt's
    MLP) is one GEMM with the positions as rows (``convolution._pixel_major_conv``)
    where the output has ``PIXEL_MAJOR_MIN_OUT`` channels or more and no more than the
    positions; eager's result in float64, NaN kept in its position, forward and
    backward."""
    from hologram_torch.lowering import convolution

    calls = []
    orig = convolution._pixel_major_conv
    torch.manual_seed(0)
    m = _ConvMlp(shape[1], hidden).double()
    x = torch.randn(shape, dtype=torch.float64)
    x[0, :, 1, 2] = float("nan")
    try:
        convolution._pixel_major_conv = lambda *a: calls.append(a) or orig(*a)
        y, fell_back = _run(m, x)
    finally:
        convolution._pixel_major_conv = orig
    b, c, h, w = shape
    assert sum(convolution.PIXEL_MAJOR_MIN_OUT <= o <= b * h * w for o in (hidden, c)) == fires
    assert fell_back == [] and len(calls) == fires
    torch.testing.assert_close(y, m(x), rtol=1e-12, atol=1e-12, equal_nan=True)
    # backward through it: the input's and the weights' gradients are eager's
    x.nan_to_num_()
    torch._dynamo.reset()
    f = torch.compile(m, backend="hologram")
    g = torch.randn(shape, dtype=torch.float64)
    grads = []
    for fn in (f, m):
        xg = x.clone().requires_grad_(True)
        m.zero_grad()
        (fn(xg) * g).sum().backward()
        grads.append([xg.grad, m.fc1.weight.grad.clone(), m.fc2.weight.grad.clone()])
    for got, want in zip(*grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def _dcgan_generator(nz: int = 16, ngf: int = 8) -> torch.nn.Module:
    """DCGAN's generator (the PyTorch examples' layout), scaled down: a latent vector
    upsampled by transposed convolutions with batch norm and ReLU to a 32x32 image."""
    nn = torch.nn
    return nn.Sequential(
        nn.ConvTranspose2d(nz, ngf * 4, 4, 1, 0, bias=False), nn.BatchNorm2d(ngf * 4),
        nn.ReLU(True),
        nn.ConvTranspose2d(ngf * 4, ngf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf * 2),
        nn.ReLU(True),
        nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf),
        nn.ReLU(True),
        nn.ConvTranspose2d(ngf, 3, 4, 2, 1, bias=False), nn.Tanh())


def test_dcgan_generator_trains_wholly_in_hologram():
    """A model built on transposed convolutions: DCGAN's generator, inference and a
    training step (forward, backward, SGD), eager's results and gradients in float64
    with no op left to PyTorch."""
    torch.manual_seed(0)
    gen = _dcgan_generator().double()
    ref = _dcgan_generator().double()
    ref.load_state_dict(gen.state_dict())
    z = torch.randn(4, 16, 1, 1, dtype=torch.float64)
    torch._dynamo.reset()
    f = torch.compile(gen, backend="hologram")
    with collect_graphs() as graphs:
        y = f(z)
        y.square().mean().backward()
    want = ref(z)
    want.square().mean().backward()
    assert [op_ for gr in graphs for op_, _ in gr.torch_ops] == []
    torch.testing.assert_close(y, want, rtol=1e-10, atol=1e-10)
    for (name, p), q in zip(gen.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-9, atol=1e-10, msg=name)
    gen.eval()
    ref.eval()
    torch._dynamo.reset()
    with torch.no_grad(), collect_graphs() as graphs:
        y = torch.compile(gen, backend="hologram")(z)
    assert [op_ for gr in graphs for op_, _ in gr.torch_ops] == []
    torch.testing.assert_close(y, ref(z), rtol=1e-10, atol=1e-10)
