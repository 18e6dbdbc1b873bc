"""``F.grid_sample`` in hologram programs: its forward as PyTorch's decomposition
(GATHERed corners, weights, sums), and, for bilinear and bicubic sampling, its backward
too, from the decomposition's parts (``hologram_torch/autograd_decompositions.py``)."""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")

import hologram_torch  # noqa: E402,F401  (registers backend="hologram")
from hologram_torch.compile_backend import collect_graphs  # noqa: E402

F = torch.nn.functional


def _inputs(seed: int, contiguous: bool = True):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, 5, 6, dtype=torch.float64, generator=gen)
    if not contiguous:
        x = x.transpose(2, 3).contiguous().transpose(2, 3)
    # positions inside, on the border and past it (padding modes differ there)
    g = torch.rand(2, 4, 3, 2, dtype=torch.float64, generator=gen) * 2.4 - 1.2
    return x.requires_grad_(), g.requires_grad_()


@pytest.mark.parametrize("mode,padding,align_corners", list(itertools.product(
    ("bilinear", "bicubic"), ("zeros", "border", "reflection"), (False, True))))
def test_grid_sample_forward_and_backward_in_hologram(mode, padding, align_corners):
    """Values and both gradients (input and grid) are eager's in float64 (the input
    contiguous, or transposed in memory where ``align_corners``), and no op runs in
    PyTorch."""
    def f(x, g):
        return F.grid_sample(x, g, mode, padding, align_corners)

    _check_in_hologram(f, *_inputs(len(mode) + len(padding) + align_corners,
                                   not align_corners))


def _check_in_hologram(f, x, g) -> None:
    """``f(x, g)`` compiled: its values and both gradients are eager's in float64, and
    it ran forward and backward with no op in PyTorch."""
    torch._dynamo.reset()
    with collect_graphs() as graphs:
        y = torch.compile(f, backend="hologram")(x, g)
        gy = torch.randn_like(y)
        got = torch.autograd.grad(y, (x, g), gy)
    want_y = f(x, g)
    want = torch.autograd.grad(want_y, (x, g), gy)
    assert [op for gr in graphs for op, _ in gr.torch_ops] == []
    assert {gr.kind for gr in graphs} >= {"forward", "backward"}
    torch.testing.assert_close(y, want_y, rtol=1e-12, atol=1e-12)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-11)


def test_grid_sample_keeps_nan_and_inf_of_the_input():
    x, g = _inputs(3)
    x = x.detach().clone()
    x[0, 0, 1, 1], x[1, 2, 3, 4] = float("nan"), float("inf")
    torch._dynamo.reset()
    f = torch.compile(lambda x, g: F.grid_sample(x, g, align_corners=True),
                      backend="hologram")
    with torch.no_grad():
        torch.testing.assert_close(f(x, g.detach()), F.grid_sample(x, g.detach(),
                                                                   align_corners=True),
                                   rtol=1e-12, atol=1e-12, equal_nan=True)


def test_nearest_grid_sample_keeps_the_op_backward():
    """Nearest sampling's grid has a zero gradient in eager, not None: its forward runs
    in hologram (AOT autograd's decomposition), its backward stays ATen's op."""
    x, g = _inputs(4)
    torch._dynamo.reset()
    with collect_graphs() as graphs:
        y = torch.compile(lambda x, g: F.grid_sample(x, g, "nearest", align_corners=False),
                          backend="hologram")(x, g)
        y.sum().backward()
    assert g.grad is not None and not g.grad.any()
    ran = {gr.kind: [op for op, _ in gr.torch_ops] for gr in graphs}
    assert ran["forward"] == [] and ran["backward"] == ["aten.grid_sampler_2d_backward"]
    torch.testing.assert_close(y, F.grid_sample(x, g, "nearest", align_corners=False),
                               rtol=0, atol=0)


def _volume(seed: int, contiguous: bool = True):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, 4, 5, 6, dtype=torch.float64, generator=gen)
    if not contiguous:
        x = x.transpose(2, 4).contiguous().transpose(2, 4)
    g = torch.rand(2, 3, 4, 2, 3, dtype=torch.float64, generator=gen) * 2.6 - 1.3
    return x.requires_grad_(), g.requires_grad_()


@pytest.mark.parametrize("padding,align_corners", list(itertools.product(
    ("zeros", "border", "reflection"), (False, True))))
def test_trilinear_grid_sample_forward_and_backward_in_hologram(padding, align_corners):
    """A 5-D input (PyTorch has no decomposition of ``grid_sampler_3d``; hologram's
    ``_grid_sampler_3d``): values and both gradients are eager's in float64, and no op
    runs in PyTorch."""
    def f(x, g):
        return F.grid_sample(x, g, "bilinear", padding, align_corners)

    _check_in_hologram(f, *_volume(len(padding) + align_corners, not align_corners))


@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
def test_trilinear_grid_sample_at_nan_and_inf(padding):
    """NaN and inf in the volume reach the outputs that read them, as in eager; a NaN
    grid point reads nothing with zeros padding (a zero output and zero gradients, as
    eager's) and the last position with the others (eager's forward clips NaN there)."""
    x, g = _volume(9)
    x, g = x.detach().clone(), g.detach().clone()
    x[0, 0, 1, 1, 1], x[1, 2, 3, 4, 5] = float("nan"), float("inf")
    g[0, 0, 0, 0] = float("nan")
    g[1, 2, 3, 1] = torch.tensor([0.3, float("inf"), -0.2], dtype=torch.float64)
    torch._dynamo.reset()
    f = torch.compile(lambda x, g: F.grid_sample(x, g, padding_mode=padding,
                                                 align_corners=False), backend="hologram")
    with torch.no_grad():
        want = F.grid_sample(x, g, padding_mode=padding, align_corners=False)
        torch.testing.assert_close(f(x, g), want, rtol=1e-12, atol=1e-12, equal_nan=True)
    if padding == "zeros":
        xr, gr = x.clone().nan_to_num(0, 0, 0).requires_grad_(), g.clone().requires_grad_()
        f(xr, gr).sum().backward()
        xe, ge = xr.detach().clone().requires_grad_(), gr.detach().clone().requires_grad_()
        F.grid_sample(xe, ge, align_corners=False).sum().backward()
        torch.testing.assert_close(gr.grad, ge.grad, rtol=1e-11, atol=1e-11, equal_nan=True)
        torch.testing.assert_close(xr.grad, xe.grad, rtol=1e-11, atol=1e-11, equal_nan=True)


@pytest.mark.parametrize("dims,mode", [(2, 0), (2, 2), (3, 0)])
def test_grid_sampler_called_directly(dims, mode):
    """``torch.grid_sampler_2d``/``_3d`` (ATen's enums, as OpInfo's samples call them):
    the same decompositions, every padding mode, forward and backward in hologram."""
    gen = torch.Generator().manual_seed(dims * 10 + mode)
    for padding in (0, 1, 2):
        x = torch.randn(2, 3, *(4,) * dims, dtype=torch.float64, generator=gen)
        g = torch.rand(2, *(3,) * dims, dims, dtype=torch.float64, generator=gen) * 2.4 - 1.2
        x.requires_grad_(), g.requires_grad_()
        fn = torch.grid_sampler_2d if dims == 2 else torch.grid_sampler_3d

        def f(x, g, fn=fn, padding=padding):
            return fn(x, g, mode, padding, padding == 1)

        _check_in_hologram(f, x, g)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_trilinear_grid_sample_in_half_precision(dtype):
    """A volume of more positions than the half dtype holds integers exactly (2184;
    bf16: 256): positions are int64 and the sampling is computed in float, as ATen's
    kernel computes it, so the values are eager's within the dtype's rounding (the
    bf16 OpInfo sweep found positions computed in bf16 reading out of range)."""
    dt = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 12, 13, 14, generator=gen).to(dt)
    g = (torch.rand(2, 5, 6, 7, 3, generator=gen) * 2.4 - 1.2).to(dt)
    torch._dynamo.reset()
    f = torch.compile(lambda x, g: F.grid_sample(x, g, align_corners=False),
                      backend="hologram")
    with torch.no_grad():
        got = f(x, g)
        want = F.grid_sample(x.double(), g.double(), align_corners=False)
    assert got.dtype == dt
    torch.testing.assert_close(got.double(), want, rtol=0, atol=0.05)
