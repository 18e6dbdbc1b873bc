"""Convolutions whose windows do not overlap (a patch embedding) run as one GEMM inside a
hologram program; the others stay in PyTorch, with a reason."""

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


@pytest.mark.parametrize("kw", [dict(stride=1), dict(stride=4, padding=1),
                                dict(stride=4, groups=3), dict(stride=4, dilation=2)])
def test_other_convolutions_stay_in_pytorch(kw):
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 6, 4, **kw)
    x = torch.randn(2, 3, 17, 17)
    y, fell_back = _run(conv, x)
    assert fell_back == ["aten.convolution"]
    torch.testing.assert_close(y, conv(x))
