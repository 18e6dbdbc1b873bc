"""hologram_torch.functional against torch.nn.functional: values, gradients, compile.

Every op is checked forward and backward against torch's own implementation in
float32 and float64, on several shapes (0-d, 0-size, non-contiguous, batched,
other dims), with NaN/inf where they mean something, under both calling
conventions, with gradcheck in float64, and inside torch.compile(fullgraph=True).
Shapes are reused across tests on purpose: each distinct (op, shape) is one
compiled kernel, and reusing them keeps the suite fast on the C backend.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as TF  # noqa: E402

import hologram as hg  # noqa: E402
import hologram_torch as ht  # noqa: E402
from hologram_torch import _ops  # noqa: E402
from hologram_torch import functional as F  # noqa: E402

warnings.filterwarnings("ignore", message="hologram: no C compiler found")

DTYPES = [torch.float32, torch.float64]
TOL = {torch.float32: dict(rtol=2e-5, atol=2e-5), torch.float64: dict(rtol=1e-9, atol=1e-11)}


def close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype = torch.float64,
          scale: float = 1.0) -> None:
    tol = {k: v * scale for k, v in TOL[dtype].items()}
    torch.testing.assert_close(a, b, equal_nan=True, **tol)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def rand(*shape: int, dtype: torch.dtype = torch.float64, seed: int = 0,
         lo: float = -2.0, hi: float = 2.0) -> torch.Tensor:
    return torch.rand(shape, generator=gen(seed), dtype=dtype) * (hi - lo) + lo


def transposed(*shape: int, dtype: torch.dtype = torch.float64, seed: int = 0,
               lo: float = -2.0, hi: float = 2.0) -> torch.Tensor:
    """A non-contiguous tensor of ``shape`` (the transpose of a contiguous one)."""
    t = rand(*reversed(shape), dtype=dtype, seed=seed, lo=lo, hi=hi).permute(
        *reversed(range(len(shape))))
    assert not t.is_contiguous() or t.numel() <= 1
    return t


def compare(hfn: Callable, tfn: Callable, inputs: Sequence[torch.Tensor], dtype: torch.dtype,
            grad: bool = True, scale: float = 1.0, seed: int = 1) -> None:
    """Forward (and backward for every floating input) of hfn against tfn."""
    h_in = [t.detach().clone().requires_grad_(grad and t.is_floating_point()) for t in inputs]
    t_in = [t.detach().clone().requires_grad_(grad and t.is_floating_point()) for t in inputs]
    yh, yt = hfn(*h_in), tfn(*t_in)
    assert yh.shape == yt.shape and yh.dtype == yt.dtype
    close(yh, yt, dtype, scale)
    if not grad:
        return
    wrt_h = [t for t in h_in if t.requires_grad]
    wrt_t = [t for t in t_in if t.requires_grad]
    g = torch.randn(yt.shape, generator=gen(seed), dtype=yt.dtype)
    gh = torch.autograd.grad(yh, wrt_h, g, allow_unused=True)
    gt = torch.autograd.grad(yt, wrt_t, g, allow_unused=True)
    for a, b in zip(gh, gt, strict=True):
        if b is None:
            assert a is None or not a.any()
        else:
            close(a, b, dtype, scale)


SPECIAL = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-30, 30.0, -30.0, 1.0,
           -1.0, 5.0, -5.0]


def special(dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(SPECIAL, dtype=dtype)


def shape_cases(dtype: torch.dtype) -> list[torch.Tensor]:
    """0-d, 0-size, contiguous, transposed and sliced: flat sizes 1 and 12 only (kernels
    are shared by size), float32 on the 12-element ones."""
    cases = [rand(3, 4, dtype=dtype), transposed(3, 4, dtype=dtype),
             rand(3, 8, dtype=dtype)[:, ::2], rand(0, 4, dtype=dtype)]
    return cases + [rand(dtype=dtype)] if dtype == torch.float64 else cases


# ----------------------------------------------------------------------------------------
# element-wise activations
# ----------------------------------------------------------------------------------------
UNARY: dict[str, tuple[Callable, Callable]] = {
    "relu": (F.relu, TF.relu),
    "sigmoid": (F.sigmoid, torch.sigmoid),
    "tanh": (F.tanh, torch.tanh),
    "gelu": (F.gelu, TF.gelu),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"),
                  lambda x: TF.gelu(x, approximate="tanh")),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(UNARY))
def test_unary_matches_torch_on_shapes(name, dtype):
    hfn, tfn = UNARY[name]
    for x in shape_cases(dtype):
        compare(hfn, tfn, [x], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(UNARY))
def test_unary_special_values(name, dtype):
    hfn, tfn = UNARY[name]
    x = special(dtype)
    y, ref = hfn(x), tfn(x)
    if name == "gelu":
        # torch's vectorised CPU erf-GELU returns NaN at +inf; the limit (and ours) is +inf.
        assert y[1].item() == float("inf")
        y, ref = y[2:], ref[2:]
    close(y, ref, dtype)


def test_relu_gradient_at_nan_and_zero_matches_torch():
    compare(F.relu, TF.relu, [torch.tensor([float("nan"), 0.0, -0.0, 2.0, -2.0])],
            torch.float32)


def test_relu_inplace():
    x = rand(3, 4, dtype=torch.float32)
    ref = TF.relu(x)
    y = F.relu(x, inplace=True)
    assert y is x
    close(x, ref, torch.float32)


def test_gelu_rejects_unknown_approximation():
    with pytest.raises(RuntimeError, match="approximate"):
        F.gelu(rand(3), approximate="fast")


# ----------------------------------------------------------------------------------------
# add, sub, mul
# ----------------------------------------------------------------------------------------
BINARY = {
    "add": (F.add, torch.add),
    "sub": (F.sub, torch.sub),
    "mul": (F.mul, torch.mul),
}


def binary_cases(dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
    same = [(rand(3, 4, dtype=dtype), rand(3, 4, dtype=dtype, seed=1)),
            (transposed(3, 4, dtype=dtype), rand(3, 4, dtype=dtype, seed=1))]
    if dtype == torch.float32:
        return same
    return same + [
        (rand(2, 1, 4), rand(3, 1, seed=1)),  # both broadcast
        (rand(3, 4), rand(seed=1)),  # 0-d operand
        (rand(0, 4), rand(4, seed=1)),
    ]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(BINARY))
def test_binary_matches_torch_with_broadcasting(name, dtype):
    hfn, tfn = BINARY[name]
    for a, b in binary_cases(dtype):
        compare(hfn, tfn, [a, b], dtype)
        compare(hfn, tfn, [b, a], dtype)


@pytest.mark.parametrize("name", list(BINARY))
def test_binary_special_values(name):
    hfn, tfn = BINARY[name]
    x = special(torch.float32)
    close(hfn(x, x.flip(0)), tfn(x, x.flip(0)), torch.float32)


@pytest.mark.parametrize("name", ["add", "sub"])
def test_alpha(name):
    hfn, tfn = BINARY[name]
    a, b = rand(3, 4), rand(4, seed=1)
    compare(lambda x, y: hfn(x, y, alpha=2.5), lambda x, y: tfn(x, y, alpha=2.5), [a, b],
            torch.float64)


@pytest.mark.parametrize("name", list(BINARY))
def test_python_scalars_and_promotion(name):
    hfn, tfn = BINARY[name]
    a32 = rand(3, 4, dtype=torch.float32)
    a64 = rand(3, 4, seed=1)
    close(hfn(a32, 2.5), tfn(a32, 2.5), torch.float32)
    close(hfn(2.5, a32), tfn(2.5, a32), torch.float32)
    assert hfn(a32, 2.5).dtype == torch.float32
    r = hfn(a32, a64)
    assert r.dtype == torch.float64
    close(r, tfn(a32, a64))
    ints = torch.arange(12).reshape(3, 4)
    close(hfn(a32, ints), tfn(a32, ints), torch.float32)


def test_binary_rejects_integer_results():
    ints = torch.arange(4)
    with pytest.raises(TypeError, match="int64"):
        F.add(ints, ints)


# ----------------------------------------------------------------------------------------
# calling conventions and executors
# ----------------------------------------------------------------------------------------
def test_seed_calling_convention_with_leading_executor():
    a, b = rand(3, 4, dtype=torch.float32), rand(3, 4, dtype=torch.float32, seed=1)
    with hg.Executor("cpu") as ex:
        close(F.add(ex, a, b), a + b, torch.float32)
        close(F.mul(ex, a, b), a * b, torch.float32)
        close(F.relu(ex, a, inplace=False), TF.relu(a), torch.float32)
        close(F.softmax(ex, a, dim=1), TF.softmax(a, 1), torch.float32)
        close(F.linear(ex, a, b), TF.linear(a, b), torch.float32)
        close(F.mse_loss(ex, a, b, reduction="mean"), TF.mse_loss(a, b), torch.float32)
    close(F.add(a, b, executor=hg.default_executor("cpu")), a + b, torch.float32)


def test_reference_executor_gives_the_same_result():
    x = rand(3, 4)
    with hg.Executor("reference") as ref:
        close(F.gelu(ref, x), F.gelu(x))
        close(F.log_softmax(ref, x, 0), F.log_softmax(x, 0))


def test_closed_or_foreign_executor_is_rejected():
    ex = hg.Executor("cpu")
    ex.close()
    with pytest.raises(ValueError, match="closed"):
        F.add(ex, rand(3), rand(3))
    with pytest.raises(TypeError, match="Executor"):
        F.add(rand(3), rand(3), executor=3)
    with pytest.raises(ValueError, match="backend"):
        F.add(rand(3), rand(3), executor="webgpu")
    with pytest.raises(NotImplementedError, match="CUDA"):
        F.add(rand(3), rand(3), executor="cuda")
    close(F.add(rand(3), rand(3), executor="reference"), rand(3) * 2)


def test_unsupported_dtype_is_a_clear_type_error():
    with pytest.raises(TypeError, match="float16"):
        F.relu(torch.ones(3, dtype=torch.float16))


def test_cuda_is_not_implemented_with_a_clear_message():
    with pytest.raises(NotImplementedError, match="CUDA"):
        ht.default_executor("cuda")
    with pytest.raises(NotImplementedError, match="CUDA"):
        _ops.executor_for("", "cuda")


def test_programs_are_shared_across_shapes_of_one_size():
    before = _ops.cached_programs()
    for shape in [(37,), (1, 37), (37, 1, 1)]:
        F.sigmoid(rand(*shape))
    assert _ops.cached_programs() - before <= 1


# ----------------------------------------------------------------------------------------
# softmax, log_softmax
# ----------------------------------------------------------------------------------------
SOFTMAX = {"softmax": (F.softmax, TF.softmax), "log_softmax": (F.log_softmax, TF.log_softmax)}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(SOFTMAX))
def test_softmax_matches_torch_over_dims(name, dtype):
    hfn, tfn = SOFTMAX[name]
    cases = [(transposed(3, 4, dtype=dtype), 1), (rand(3, 4, dtype=dtype), 1)]
    if dtype == torch.float64:
        x3 = rand(2, 3, 4)
        cases += [(x3, 0), (x3, 1), (x3, 2), (x3, -1), (rand(7), 0), (rand(), 0), (rand(), -1),
                  (rand(0, 4), 1), (rand(3, 0), 1)]
    for x, dim in cases:
        compare(lambda v, d=dim: hfn(v, d), lambda v, d=dim: tfn(v, d), [x], dtype)


@pytest.mark.parametrize("name", list(SOFTMAX))
def test_softmax_with_masked_and_large_logits(name):
    hfn, tfn = SOFTMAX[name]
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([[1.0, -inf, 2.0, 3.0], [1000.0, 1001.0, -1000.0, 0.0],
                      [-inf, -inf, 0.0, 1.0]])
    compare(lambda v: hfn(v, 1), lambda v: tfn(v, 1), [x], torch.float32)
    x[2] = torch.tensor([inf, 1.0, nan, 3.0])
    close(hfn(x, 1), tfn(x, 1), torch.float32)


@pytest.mark.parametrize("name", list(SOFTMAX))
def test_softmax_implicit_dim_and_dtype(name):
    hfn, tfn = SOFTMAX[name]
    x = rand(3, 4, dtype=torch.float32)
    with pytest.warns(UserWarning, match="Implicit dimension"):
        y = hfn(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        close(y, tfn(x), torch.float32)
    y64 = hfn(x, 1, dtype=torch.float64)
    assert y64.dtype == torch.float64
    close(y64, tfn(x, 1, dtype=torch.float64))
    with pytest.raises(IndexError, match="range"):
        hfn(x, 2)


# ----------------------------------------------------------------------------------------
# linear
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_matches_torch(dtype):
    w, b = rand(5, 4, dtype=dtype, seed=2), rand(5, dtype=dtype, seed=3)
    wt = transposed(5, 4, dtype=dtype, seed=2)  # strided weight storage
    cases = [rand(6, 4, dtype=dtype), transposed(6, 4, dtype=dtype)]
    if dtype == torch.float64:
        cases += [rand(2, 3, 4), rand(4), rand(0, 4)]
    for x in cases:
        compare(F.linear, TF.linear, [x, w, b], dtype)
        compare(F.linear, TF.linear, [x, wt], dtype)


def test_linear_gemm_agrees_with_torch_at_a_realistic_size():
    x = torch.randn(64, 128, generator=gen(4))
    w = torch.randn(96, 128, generator=gen(5)) / 11
    b = torch.randn(96, generator=gen(6))
    compare(F.linear, TF.linear, [x, w, b], torch.float32, scale=5.0)


def test_linear_errors():
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        F.linear(rand(3, 4), rand(5, 3))
    with pytest.raises(RuntimeError, match="dtype"):
        F.linear(rand(3, 4), rand(5, 4, dtype=torch.float32))


# ----------------------------------------------------------------------------------------
# layer_norm
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_matches_torch(dtype):
    x = rand(2, 3, 4, dtype=dtype) * 3 + 1
    w, b = rand(4, dtype=dtype, seed=2), rand(4, dtype=dtype, seed=3)
    compare(lambda v, ww, bb: F.layer_norm(v, [4], ww, bb),
            lambda v, ww, bb: TF.layer_norm(v, [4], ww, bb), [x, w, b], dtype)
    if dtype == torch.float32:
        return
    w2, b2 = rand(3, 4, seed=2), rand(3, 4, seed=3)
    compare(lambda v, ww, bb: F.layer_norm(v, (3, 4), ww, bb, eps=1e-3),
            lambda v, ww, bb: TF.layer_norm(v, (3, 4), ww, bb, eps=1e-3), [x, w2, b2], dtype)
    compare(lambda v: F.layer_norm(v, 4), lambda v: TF.layer_norm(v, (4,)), [x], dtype)
    compare(lambda v, ww: F.layer_norm(v, [4], ww), lambda v, ww: TF.layer_norm(v, [4], ww),
            [transposed(6, 4), w], dtype)
    compare(lambda v, bb: F.layer_norm(v, [4], None, bb),
            lambda v, bb: TF.layer_norm(v, [4], None, bb), [rand(0, 4), b], dtype)


def test_layer_norm_shape_error():
    with pytest.raises(RuntimeError, match="normalized_shape"):
        F.layer_norm(rand(3, 4), [3])


# ----------------------------------------------------------------------------------------
# losses: every reduction in float64; float32 on the common 'mean' case
# ----------------------------------------------------------------------------------------
REDUCTIONS = ["mean", "sum", "none"]


def loss_compare(hfn: Callable, tfn: Callable, inputs: Sequence[torch.Tensor],
                 reduction: str, dtype: torch.dtype = torch.float64, **kw) -> None:
    compare(lambda *a: hfn(*a, reduction=reduction, **kw),
            lambda *a: tfn(*a, reduction=reduction, **kw), inputs, dtype)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_mse_loss(reduction):
    x, t = rand(3, 4), rand(3, 4, seed=1)
    for a, b in [(x, t), (transposed(3, 4), t), (rand(0, 4), rand(0, 4, seed=1))]:
        loss_compare(F.mse_loss, TF.mse_loss, [a, b], reduction)
    w = rand(3, 4, seed=2, lo=0.1, hi=1.0)
    loss_compare(F.mse_loss, TF.mse_loss, [x, t], reduction, weight=w)
    if reduction == "mean":
        loss_compare(F.mse_loss, TF.mse_loss, [x.float(), t.float()], reduction, torch.float32)


def test_mse_loss_broadcasting_warns_like_torch_and_legacy_args():
    x, t = rand(3, 4), rand(4, seed=1)
    with pytest.warns(UserWarning, match="target size"):
        y = F.mse_loss(x, t)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        close(y, TF.mse_loss(x, t))
        close(F.mse_loss(x, x * 2, size_average=False), TF.mse_loss(x, x * 2, size_average=False))
        close(F.mse_loss(x, t.expand(3, 4), reduce=False),
              TF.mse_loss(x, t.expand(3, 4), reduce=False))
    with pytest.raises(ValueError, match="reduction"):
        F.mse_loss(x, x, reduction="avg")


def ce_cases(dtype: torch.dtype = torch.float64):
    """(input, target): batched, (N, C, d1, d2), unbatched, strided, empty; some ignored."""
    x2 = rand(6, 5, dtype=dtype) * 3
    t2 = torch.tensor([0, 4, 2, -100, 1, 3])
    x4 = rand(2, 5, 3, 2, dtype=dtype) * 3
    t4 = torch.randint(0, 5, (2, 3, 2), generator=gen(7))
    t4[0, 1, 1] = -100
    return [(x2, t2), (x4, t4), (rand(5, dtype=dtype), torch.tensor(3)),
            (transposed(6, 5, dtype=dtype), torch.tensor([1, 1, 0, 2, 4, 3])),
            (rand(0, 5, dtype=dtype), torch.zeros(0, dtype=torch.long))]


CE_W = rand(5, seed=9, lo=0.2, hi=2.0)
BOTH = {"weight": CE_W, "label_smoothing": 0.25}


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cross_entropy_class_indices(reduction):
    cases = ce_cases()
    if reduction == "mean":
        for x, t in cases:
            for kw in ({}, BOTH):
                loss_compare(F.cross_entropy, TF.cross_entropy, [x, t], reduction, **kw)
        for kw in ({"weight": CE_W}, {"label_smoothing": 0.25}):
            loss_compare(F.cross_entropy, TF.cross_entropy, list(cases[0]), reduction, **kw)
        for kw in ({}, {"weight": CE_W.float(), "label_smoothing": 0.25}):
            x, t = ce_cases(torch.float32)[0]
            loss_compare(F.cross_entropy, TF.cross_entropy, [x, t], reduction, torch.float32,
                         **kw)
    else:
        loss_compare(F.cross_entropy, TF.cross_entropy, list(cases[0]), reduction)
        loss_compare(F.cross_entropy, TF.cross_entropy, list(cases[1]), reduction, **BOTH)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cross_entropy_probability_targets(reduction):
    def probs(x):
        return TF.softmax(rand(*x.shape, dtype=x.dtype, seed=11), dim=0 if x.dim() == 1 else 1)

    cases = ce_cases()
    if reduction == "mean":
        for x, _ in cases[:2]:
            for kw in ({}, {"weight": CE_W}, {"label_smoothing": 0.2}):
                loss_compare(F.cross_entropy, TF.cross_entropy, [x, probs(x)], reduction, **kw)
        x = ce_cases(torch.float32)[0][0]
        loss_compare(F.cross_entropy, TF.cross_entropy, [x, probs(x)], reduction, torch.float32)
    else:
        x = cases[1][0]
        loss_compare(F.cross_entropy, TF.cross_entropy, [x, probs(x)], reduction, **BOTH)


def test_cross_entropy_ignore_index_in_range_and_masked_logits():
    x = rand(6, 5, dtype=torch.float32)
    x[0, 1] = -float("inf")
    x[2, 0] = -float("inf")
    t = torch.tensor([0, 2, 1, 2, 4, 3])
    for kw in ({"ignore_index": 2}, {}):
        compare(lambda a, b, kw=kw: F.cross_entropy(a, b, **kw),
                lambda a, b, kw=kw: TF.cross_entropy(a, b, **kw), [x, t], torch.float32)
    all_ignored = torch.full((6,), -100)
    close(F.cross_entropy(x, all_ignored), TF.cross_entropy(x, all_ignored), torch.float32)


def test_cross_entropy_errors():
    with pytest.raises(IndexError, match="out of bounds"):
        F.cross_entropy(rand(6, 5), torch.tensor([0, 5, 1, 1, 1, 1]))
    with pytest.raises(RuntimeError, match="target"):
        F.cross_entropy(rand(3, 5), torch.tensor([0, 1]))
    with pytest.raises(RuntimeError, match="integers"):
        F.cross_entropy(rand(3, 5), rand(3))
    with pytest.raises(RuntimeError, match="floating point"):
        F.cross_entropy(rand(3, 5), torch.zeros(3, 5, dtype=torch.long))
    with pytest.raises(RuntimeError, match="ignore_index"):
        F.cross_entropy(rand(3, 5), rand(3, 5), ignore_index=1)
    with pytest.raises(ValueError, match="label_smoothing"):
        F.cross_entropy(rand(3, 5), torch.tensor([0, 1, 2]), label_smoothing=1.5)
    with pytest.raises(NotImplementedError, match="weight"):
        F.cross_entropy(rand(3, 5), torch.tensor([0, 1, 2]),
                        weight=torch.ones(5, dtype=torch.float64, requires_grad=True))


BCE_P = rand(3, 4, lo=0.02, hi=0.98)
BCE_T = rand(3, 4, seed=1, lo=0.0, hi=1.0)
BCE_W = rand(4, seed=2, lo=0.1, hi=2.0)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_binary_cross_entropy(reduction):
    args = [BCE_P, BCE_T]
    if reduction == "mean":
        for kw in ({}, {"weight": BCE_W}, {"weight": BCE_W.expand(3, 4).contiguous()}):
            loss_compare(F.binary_cross_entropy, TF.binary_cross_entropy, args, reduction, **kw)
        loss_compare(F.binary_cross_entropy, TF.binary_cross_entropy,
                     [transposed(3, 4, lo=0.02, hi=0.98), BCE_T], reduction)
        loss_compare(F.binary_cross_entropy, TF.binary_cross_entropy,
                     [BCE_P.float(), BCE_T.float()], reduction, torch.float32)
    else:
        loss_compare(F.binary_cross_entropy, TF.binary_cross_entropy, args, reduction,
                     weight=BCE_W)


def test_binary_cross_entropy_edges_and_errors():
    p = torch.tensor([0.0, 1.0, 0.0, 1.0, 0.5])
    t = torch.tensor([0.0, 1.0, 1.0, 0.0, 0.5])
    close(F.binary_cross_entropy(p, t, reduction="none"),
          TF.binary_cross_entropy(p, t, reduction="none"), torch.float32)
    with pytest.raises(RuntimeError, match="between 0 and 1"):
        F.binary_cross_entropy(torch.tensor([1.5]), torch.tensor([1.0]))
    with pytest.raises(ValueError, match="target size"):
        F.binary_cross_entropy(torch.tensor([0.5, 0.5]), torch.tensor([1.0]))


BCEL_PW = rand(4, seed=3, lo=0.5, hi=3.0)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_binary_cross_entropy_with_logits(reduction):
    x = rand(3, 4) * 10
    fn, tfn = F.binary_cross_entropy_with_logits, TF.binary_cross_entropy_with_logits
    if reduction == "mean":
        for kw in ({}, {"weight": BCE_W}, {"pos_weight": BCEL_PW}):
            loss_compare(fn, tfn, [x, BCE_T], reduction, **kw)
        loss_compare(fn, tfn, [x.float(), BCE_T.float()], reduction, torch.float32)
    else:
        loss_compare(fn, tfn, [x, BCE_T], reduction, weight=BCE_W, pos_weight=BCEL_PW)


def test_binary_cross_entropy_with_logits_extremes():
    x = torch.tensor([-200.0, -30.0, 0.0, 30.0, 200.0, float("inf"), -float("inf")])
    t = torch.tensor([1.0, 0.0, 0.5, 1.0, 0.0, 1.0, 0.0])
    close(F.binary_cross_entropy_with_logits(x, t, reduction="none"),
          TF.binary_cross_entropy_with_logits(x, t, reduction="none"), torch.float32)


def test_large_tensors_match_torch():
    """Large enough for the native kernels' threaded paths (and long reductions)."""
    x = torch.randn(512, 640, generator=gen(12))
    w, b = torch.randn(640, generator=gen(13)), torch.randn(640, generator=gen(14))
    t = torch.randint(0, 640, (512,), generator=gen(15))
    cases = [
        (F.gelu, TF.gelu, [x]),
        (lambda v: F.softmax(v, 0), lambda v: TF.softmax(v, 0), [x]),
        (lambda v, ww, bb: F.layer_norm(v, [640], ww, bb),
         lambda v, ww, bb: TF.layer_norm(v, [640], ww, bb), [x, w, b]),
        (F.cross_entropy, TF.cross_entropy, [x, t]),
    ]
    for hfn, tfn, ins in cases:
        compare(hfn, tfn, ins, torch.float32, scale=10.0)


# ----------------------------------------------------------------------------------------
# gradcheck (float64) for every op, on the shapes above (their kernels are already built)
# ----------------------------------------------------------------------------------------
def _gc(fn: Callable, *inputs: torch.Tensor) -> None:
    ins = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
    assert torch.autograd.gradcheck(fn, ins, eps=1e-6, atol=1e-6, rtol=1e-5)


GRADCHECKS: dict[str, Callable[[], None]] = {
    "add": lambda: _gc(lambda a, b: F.add(a, b, alpha=2.5), rand(3, 4), rand(4, seed=1)),
    "sub": lambda: _gc(F.sub, rand(2, 1, 4), rand(3, 1, seed=1)),
    "mul": lambda: _gc(F.mul, rand(3, 4), rand(seed=1)),
    "relu": lambda: _gc(F.relu, rand(3, 4) + 0.05),
    "sigmoid": lambda: _gc(F.sigmoid, rand(3, 4)),
    "tanh": lambda: _gc(F.tanh, rand(3, 4)),
    "gelu": lambda: _gc(F.gelu, rand(3, 4)),
    "gelu_tanh": lambda: _gc(lambda x: F.gelu(x, approximate="tanh"), rand(3, 4)),
    "softmax": lambda: _gc(lambda x: F.softmax(x, 1), rand(3, 4)),
    "log_softmax": lambda: _gc(lambda x: F.log_softmax(x, -1), rand(3, 4)),
    "linear": lambda: _gc(F.linear, rand(6, 4), rand(5, 4, seed=1), rand(5, seed=2)),
    "layer_norm": lambda: _gc(lambda x, w, b: F.layer_norm(x, [4], w, b), rand(2, 3, 4),
                              rand(4, seed=1), rand(4, seed=2)),
    "mse_loss": lambda: _gc(F.mse_loss, rand(3, 4), rand(3, 4, seed=1)),
    "cross_entropy": lambda: _gc(lambda x: F.cross_entropy(x, ce_cases()[0][1], **BOTH),
                                 rand(6, 5)),
    "cross_entropy_probs": lambda: _gc(F.cross_entropy, rand(6, 5),
                                       rand(6, 5, seed=1, lo=0.0, hi=1.0)),
    "binary_cross_entropy": lambda: _gc(F.binary_cross_entropy, BCE_P, BCE_T),
    "binary_cross_entropy_with_logits": lambda: _gc(
        lambda x, t: F.binary_cross_entropy_with_logits(x, t, pos_weight=BCEL_PW),
        rand(3, 4), BCE_T),
}


@pytest.mark.parametrize("name", list(GRADCHECKS))
def test_gradcheck_float64(name):
    GRADCHECKS[name]()


# ----------------------------------------------------------------------------------------
# torch.library registration and torch.compile
# ----------------------------------------------------------------------------------------
def test_ops_are_registered_in_the_hologram_namespace():
    for name in ["add", "sub", "mul", "relu", "sigmoid", "tanh", "gelu", "softmax",
                 "log_softmax", "linear", "layer_norm", "mse_loss", "cross_entropy",
                 "binary_cross_entropy", "binary_cross_entropy_with_logits", "gelu_backward",
                 "softmax_backward", "layer_norm_backward"]:
        assert hasattr(torch.ops.hologram, name), name


OPCHECKS = [
    (F.add_op, (rand(3, 4), rand(4), 2.5, "")),
    (F.mul_op, (rand(3, 4), rand(), "")),
    (F.gelu_op, (rand(3, 4), "tanh", "")),
    (F.softmax_op, (rand(3, 4), 1, "")),
    (F.linear_op, (rand(6, 4), rand(5, 4), rand(5), "")),
    (F.layer_norm_op, (rand(2, 3, 4), [4], rand(4), rand(4), 1e-5, "")),
    (F.cross_entropy_op, (rand(6, 5), ce_cases()[0][1], None, -100, 0.0, "mean", "")),
    (F.bce_with_logits_op, (rand(3, 4), BCE_T, None, BCEL_PW, "mean", "")),
    (F.sub_op, (rand(2, 1, 4), rand(3, 1), 1.0, "")),
    (F.relu_op, (rand(3, 4), "")),
    (F.sigmoid_op, (rand(3, 4), "")),
    (F.tanh_op, (rand(3, 4), "")),
    (F.log_softmax_op, (rand(3, 4), 1, "")),
    (F.mse_loss_op, (rand(3, 4), rand(3, 4, seed=1), None, "none", "")),
    (F.binary_cross_entropy_op, (BCE_P, BCE_T, BCE_W, "sum", "")),
]


@pytest.mark.parametrize("op,args", OPCHECKS, ids=[op._name for op, _ in OPCHECKS])
def test_opcheck(op, args):
    args = tuple(a.clone().requires_grad_(a.is_floating_point()) if isinstance(a, torch.Tensor)
                 else a for a in args)
    torch.library.opcheck(op, args)  # schema, autograd registration, fake, aot (dynamic)


def test_torch_compile_fullgraph_forward_and_backward_match_eager():
    torch._dynamo.reset()

    def fn(x, w, b, t, lt):
        h = F.linear(x, w, b)
        h = F.layer_norm(F.gelu(h, approximate="tanh"), [5])
        h = F.add(F.mul(F.tanh(h), 2.0), F.sigmoid(h))
        loss = F.cross_entropy(h, lt, weight=CE_W.float(), label_smoothing=0.25)
        loss = loss + F.mse_loss(F.softmax(h, -1), t) + F.binary_cross_entropy(
            F.sigmoid(h), F.relu(t) * 0 + 0.5, weight=BCE_W[:1].float())
        return loss + F.binary_cross_entropy_with_logits(h, F.sub(t, 0.5).abs(),
                                                         pos_weight=CE_W.float())

    args = [rand(6, 4, dtype=torch.float32), rand(5, 4, dtype=torch.float32, seed=1),
            rand(5, dtype=torch.float32, seed=2), rand(6, 5, dtype=torch.float32, seed=3),
            ce_cases()[0][1]]
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    outs = []
    for f in (fn, compiled):
        ins = [a.clone().requires_grad_(a.is_floating_point()) for a in args]
        y = f(*ins)
        y.backward()
        outs.append([y, *(a.grad for a in ins[:3])])
    for a, b in zip(*outs, strict=True):
        close(a, b, torch.float32)


# ----------------------------------------------------------------------------------------
# utils: zero-copy tensors <-> buffers
# ----------------------------------------------------------------------------------------
def test_tensor_to_buffer_shares_memory_both_ways():
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    ex = ht.default_executor(t)
    buf, owner = ht.tensor_to_buffer(ex, t)
    assert owner.data_ptr() == t.data_ptr()
    buf.view()[0, 0] = 42.0
    assert t[0, 0].item() == 42.0
    buf2, _ = ht.tensor_to_buffer(t)  # executor optional
    back = ht.buffer_to_tensor(buf2, (3, 2))
    assert back.data_ptr() == t.data_ptr() and back.shape == (3, 2)
    assert np.shares_memory(buf2.view(), t.numpy())


def test_tensor_to_buffer_copies_only_strided_tensors():
    t = torch.arange(6, dtype=torch.float64).reshape(2, 3).T
    buf, owner = ht.tensor_to_buffer(t)
    assert owner.is_contiguous() and owner.data_ptr() != t.data_ptr()
    assert np.array_equal(buf.view(), t.numpy())


def test_buffer_to_tensor_from_an_executor_allocation():
    with hg.Executor("cpu") as ex:
        buf = ex.allocate(8).fill(3.0)
        t = ht.buffer_to_tensor(buf)
        t[1] = 5.0
        assert buf.to_numpy()[1] == 5.0


def test_validate_tensor_compatible():
    ht.validate_tensor_compatible(torch.zeros(3))
    with pytest.raises(TypeError, match="int32"):
        ht.validate_tensor_compatible(torch.zeros(3, dtype=torch.int32))
    with pytest.raises(TypeError, match="Tensor"):
        ht.validate_tensor_compatible(np.zeros(3))
    assert ht.create_executor_for_tensor(torch.zeros(1)) is ht.default_executor("cpu")


def test_result_type_matches_torch():
    i1, i0 = torch.arange(3), torch.tensor(2)
    f1, f0 = torch.ones(3), torch.tensor(1.0)
    d1, d0 = torch.ones(3, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64)
    b1 = torch.ones(3, dtype=torch.bool)
    values = [i1, i0, f1, f0, d1, d0, b1, 2, 2.5, True]
    for a in values:
        for b in values:
            if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
                assert F._result_type(a, b) == torch.result_type(a, b), (a, b)
