"""The element-wise, mask and reduction translations against eager PyTorch in float64,
on the inputs OpInfo's samples rarely hold: NaN, +-inf, +-0, exact halves, huge and
tiny values, zero divisors, ties, empty tensors and non-contiguous views.

Rounding, remainders, class tests, masks, padding, selections and index reductions are
exact in IEEE arithmetic, so they must equal eager bit for bit (the sign of a zero
included); log1p and expm1 within 2 ulp of NumPy's. Every case must also run wholly in
hologram: no compute op of its graphs is left to PyTorch.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch import _dynamo as dynamo  # noqa: E402

from hologram_torch import compile_backend as cb  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NumPy on NaN and inf

SPECIAL = [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 0.5, -0.5, 1.5, -2.5, 2.5,
           3.0, -7.0, 1e300, -1e300, 5e-324, -1e-310, 4503599627370495.5, 2.0 ** 53 + 2]


def _data(shape: tuple[int, ...], seed: int, specials: bool = True) -> torch.Tensor:
    """Random float64 values (normal * 4, a third of them whole or half) with the
    special values scattered in."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * 4
    halves = rng.random(shape) < 0.3
    x[halves] = np.round(x[halves] * 2) / 2
    if specials and x.size:
        flat = x.reshape(-1)
        k = min(flat.size // 3, len(SPECIAL))
        flat[rng.choice(flat.size, k, replace=False)] = rng.choice(SPECIAL, k, replace=False)
    return torch.from_numpy(x)


def _layouts(shape: tuple[int, int], seed: int) -> dict[str, torch.Tensor]:
    """The same kind of data contiguous, transposed, strided (every other column) and
    empty."""
    r, c = shape
    return {
        "contiguous": _data(shape, seed),
        "transposed": _data((c, r), seed + 1).t(),
        "strided": _data((r, 2 * c), seed + 2)[:, ::2],
        "empty": _data((0, c), seed + 3),
    }


def _run(fn: Callable[..., object], *args: object) -> tuple[object, object]:
    """(eager result, compiled result); the compiled graphs must leave no compute op
    to PyTorch."""
    want = fn(*args)
    dynamo.reset()
    with cb.collect_graphs() as graphs:
        got = torch.compile(fn, backend="hologram", dynamic=False)(*args)
    left = [(op, why) for g in graphs for op, why in g.torch_ops]
    assert not left, f"ran in PyTorch: {left}"
    return want, got


def _same(got: object, want: object) -> None:
    """Bit-exact: equal values, NaN where eager has NaN, and the same signs of zero."""
    if isinstance(want, (tuple, list)):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            _same(g, w)
        return
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    if want.dtype.is_floating_point:
        zero = want == 0
        assert torch.equal(torch.signbit(got[zero]), torch.signbit(want[zero])), \
            "signs of zero differ"


UNARY_EXACT: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "floor": torch.floor,
    "ceil": torch.ceil,
    "trunc": torch.trunc,
    "round": torch.round,
    "round_decimals_2": lambda x: torch.round(x, decimals=2),
    "round_decimals_-1": lambda x: torch.round(x, decimals=-1),
    "frac": torch.frac,
    "isnan": torch.isnan,
    "isinf": torch.isinf,
    "isfinite": torch.isfinite,
    "isposinf": torch.isposinf,
    "isneginf": torch.isneginf,
    "nan_to_num": torch.nan_to_num,
    "nan_to_num_values": lambda x: torch.nan_to_num(x, nan=1.5, posinf=2.0, neginf=-3.0),
    "tril": torch.tril,
    "tril_-1": lambda x: torch.tril(x, -1),
    "triu_2": lambda x: torch.triu(x, 2),
    "pad": lambda x: torch.nn.functional.pad(x, (1, 2, 0, 1), value=-0.0),
    "pad_crop": lambda x: torch.nn.functional.pad(x, (-1, 2, 1, 2), value=float("nan")),
    "pad_crop_rows": lambda x: torch.nn.functional.pad(  # eager refuses to crop empty
        x, (0, 0, -2 if len(x) >= 2 else 0, 1)),
    "repeat": lambda x: x.repeat(2, 1, 3),
    "roll": lambda x: torch.roll(x, (2, -1), (0, 1)),
    "roll_flat": lambda x: torch.roll(x, 5),
    "stack": lambda x: torch.stack([x, -x, x * 2], dim=1),
    "unbind": lambda x: [t * 1.0 for t in torch.unbind(x, 1)],
    "diagonal": lambda x: torch.diagonal(x, 1) * 1.0,
    "diagonal_neg": lambda x: torch.diagonal(x.reshape(1, *x.shape), -2, 1, 2) * 1.0,
    "diag_embed": lambda x: torch.diag_embed(x, offset=-1),
    "diagonal_scatter": lambda x: torch.diagonal_scatter(
        x, torch.full_like(torch.diagonal(x, 1), -0.0), 1),
    "as_strided": lambda x: (x * 1.0).contiguous().as_strided((3, 4), (2, 1), 1)
    if x.numel() >= 12 else (x * 1.0).as_strided((0, 2), (1, 1)),  # overlapping windows
    "masked_fill": lambda x: x.masked_fill(x > 1, -1.25),
    "masked_fill_0d": lambda x: x.masked_fill(x < 0, torch.tensor(7.0, dtype=x.dtype)),
}
LAYOUTS = ("contiguous", "transposed", "strided", "empty")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", sorted(UNARY_EXACT))
def test_unary_exact(name, layout):
    x = _layouts((6, 7), 10)[layout]
    _same(*reversed(_run(UNARY_EXACT[name], x)))


def test_as_strided_of_a_permuted_layout_runs_in_pytorch():
    """as_strided reads storage order; a tensor laid out transposed is left to PyTorch
    (with the reason), and the result still matches."""
    x = _layouts((6, 7), 15)["transposed"]

    def fn(t):
        return (t * 1.0).as_strided((3, 4), (2, 1), 1) + 1

    want = fn(x)
    dynamo.reset()
    with cb.collect_graphs() as graphs:
        got = torch.compile(fn, backend="hologram", dynamic=False)(x)
    _same(got, want)
    reasons = dict(op for g in graphs for op in g.torch_ops)
    assert "not contiguous" in reasons["aten.as_strided"]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", ["log1p", "expm1"])
def test_log1p_expm1(name, layout):
    x = _layouts((6, 7), 20)[layout]
    x = torch.cat([x.reshape(-1), torch.tensor([-1.0, -1.5, 1e-20, -1e-20, 710.0, -800.0,
                                                0.3, -0.3, 0.69, -0.69])])
    _, got = _run(getattr(torch, name), x)
    # NumPy's (glibc's) values: eager's vectorized log1p flushes subnormal results to 0
    want = torch.from_numpy(getattr(np, name)(x.numpy()))
    torch.testing.assert_close(got, want, rtol=4e-16, atol=0, equal_nan=True)
    assert torch.equal(torch.signbit(got[want == 0]), torch.signbit(want[want == 0]))


MATH = ["tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "log2",
        "log10", "exp2", "erfc"]
NUMPY = {"asin": "arcsin", "acos": "arccos", "atan": "arctan", "asinh": "arcsinh",
         "acosh": "arccosh", "atanh": "arctanh"}


@pytest.mark.parametrize("layout", ["strided", "empty"])
@pytest.mark.parametrize("name", MATH)
def test_math_functions(name, layout):
    """Within 6 units of 2^-53 of NumPy's (math.erfc's) values, NaN and inf alike."""
    x = _layouts((6, 7), 25)[layout]
    x = torch.cat([x.reshape(-1), torch.tensor([1.0, -1.0, 0.999, 1.001, 710.0, -745.0])])
    _, got = _run(getattr(torch, name), x)
    if name == "erfc":
        import math
        want = torch.tensor([math.erfc(v) for v in x.tolist()], dtype=x.dtype)
    else:
        want = torch.from_numpy(getattr(np, NUMPY.get(name, name))(x.numpy()))
    torch.testing.assert_close(got, want, rtol=6 * 2.0 ** -53, atol=0, equal_nan=True)
    assert torch.equal(torch.signbit(got[want == 0]), torch.signbit(want[want == 0]))


BINARY_EXACT: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "fmod": torch.fmod,
    "copysign": torch.copysign,
    "fmax": torch.fmax,
    "fmin": torch.fmin,
    "remainder": torch.remainder,
    "floor_divide": torch.floor_divide,
    "div_floor": lambda x, y: torch.div(x, y, rounding_mode="floor"),
    "div_trunc": lambda x, y: torch.div(x, y, rounding_mode="trunc"),
    "heaviside": torch.heaviside,
    "logical_xor": torch.logical_xor,
    "clamp_tensors": lambda x, y: torch.clamp(x, min=y, max=y + 1.0),
    "where": lambda x, y: torch.where(x < y, x, y),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", sorted(BINARY_EXACT))
def test_binary_exact(name, layout):
    x = _layouts((6, 7), 30)[layout]
    y = _layouts((6, 7), 40)[layout]
    if x.numel():  # zero divisors of both signs, and x against its own values
        y = y.clone()
        y[0, :2] = torch.tensor([0.0, -0.0], dtype=y.dtype)
        y[1] = x[1]
    _same(*reversed(_run(BINARY_EXACT[name], x, y)))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", ["atan2", "hypot"])
def test_binary_functions(name, layout):
    """libm's (vector) atan2 and hypot: within 6 units of 2^-53 of eager's, the special
    cases (signed zeros, infinities, NaN) exact."""
    x = _layouts((6, 7), 35)[layout]
    y = _layouts((6, 7), 45)[layout]
    want, got = _run(getattr(torch, name), x, y)
    torch.testing.assert_close(got, want, rtol=6 * 2.0 ** -53, atol=0, equal_nan=True)
    assert torch.equal(torch.signbit(got[want == 0]), torch.signbit(want[want == 0]))


@pytest.mark.parametrize("name", ["remainder", "floor_divide", "fmod", "div_trunc"])
def test_binary_integers(name):
    g = torch.Generator().manual_seed(5)
    x = torch.randint(-50, 50, (5, 8), generator=g)
    y = torch.randint(1, 9, (5, 8), generator=g) * torch.where(x % 2 == 0, 1, -1)
    _same(*reversed(_run(BINARY_EXACT[name], x, y)))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("steps", [0, 1, 2, 7, 50])
def test_linspace_logspace_eye(dtype, steps):
    """ATen's two-sided linspace (its vectorized path groups elements by SIMD width, so
    a few differ by an ulp), logspace as pow of it, and eye."""
    def fn(t):
        lin = torch.linspace(-3.5, 7.25, steps, dtype=dtype)
        log = torch.logspace(-2.0, 1.5, steps, base=3.0, dtype=dtype)
        return lin + t.to(dtype), log, torch.eye(steps, 3, dtype=dtype)

    want, got = _run(fn, torch.tensor(1.0))
    eps = torch.finfo(dtype).eps
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=4 * eps, atol=4 * eps)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_integer_linspace_truncates_its_bounds(dtype):
    """ATen converts the bounds to the integer dtype first (-3.5 is -3), then steps in
    double and truncates each value."""
    fn = lambda t: (torch.linspace(-3.5, 7.25, 6, dtype=dtype) + t,  # noqa: E731
                    torch.linspace(10, -2, 5, dtype=dtype) * t)
    _same(*reversed(_run(fn, torch.tensor(2, dtype=dtype))))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16])
def test_float_to_integer_truncates_toward_zero(dtype):
    """An integer dtype rides in f64 inside a program; converting a float to it must still
    drop the fraction as PyTorch does (toward zero), or an index computed from floats
    (interpolate's, quantile's) points past its row."""
    x = _data((6, 7), 70, specials=False) * 3.3
    x[0, :4] = torch.tensor([-0.5, 0.5, -2.999, 2.999], dtype=x.dtype)
    _same(*reversed(_run(lambda t: (t * 1.7).to(dtype) + 1, x)))
    _same(*reversed(_run(lambda t: t.t().to(dtype), x.float())))


def _rows(seed: int) -> torch.Tensor:
    """Rows with ties, a NaN row, a row of -inf, a row of zeros: the index rules."""
    x = _data((6, 5), seed, specials=False).round()
    x[1] = torch.tensor([2.0, float("nan"), 5.0, float("nan"), 5.0])
    x[2] = float("-inf")
    x[3] = 0.0
    x[4, 3] = float("inf")
    return x


REDUCTIONS: dict[str, Callable[[torch.Tensor], object]] = {
    "argmax": torch.argmax,
    "argmax_dim": lambda x: torch.argmax(x, dim=1),
    "argmin_dim0_keep": lambda x: torch.argmin(x, dim=0, keepdim=True),
    "max_dim": lambda x: torch.max(x, dim=1),
    "min_dim_keep": lambda x: torch.min(x, dim=0, keepdim=True),
    "max": torch.max,
    "aminmax": lambda x: torch.aminmax(x, dim=1),
    "amax": lambda x: torch.amax(x, dim=(0, 1)),
    "any": torch.any,
    "any_dim": lambda x: torch.any(x, dim=1),
    "all_dim_keep": lambda x: torch.all(x, dim=0, keepdim=True),
    "count_nonzero": lambda x: torch.count_nonzero(x, dim=1),
    "nansum": lambda x: torch.nansum(x, dim=1),
    "prod": lambda x: torch.prod(x, dim=1),
}


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reductions(name, layout):
    x = _rows(50)
    x = x if layout == "contiguous" else x.t().contiguous().t()
    _same(*reversed(_run(REDUCTIONS[name], x)))


@pytest.mark.parametrize("name", ["any_dim", "all_dim_keep", "count_nonzero", "nansum",
                                  "prod", "amax"])
def test_reductions_over_empty_axis(name):
    """The empty reduction's identity: any False, all True, counts and sums 0, prod 1."""
    x = torch.empty((3, 0), dtype=torch.float64) if name != "amax" else \
        torch.empty((0, 4), dtype=torch.float64)
    fn = REDUCTIONS[name] if name != "amax" else (lambda t: torch.amax(t, dim=1))
    _same(*reversed(_run(fn, x)))


def test_argmax_of_integers_and_max_of_bool():
    g = torch.Generator().manual_seed(7)
    ints = torch.randint(-3, 3, (4, 6), generator=g)
    _same(*reversed(_run(lambda t: (torch.argmax(t, 1), torch.argmin(t, 0)), ints)))
    _same(*reversed(_run(lambda t: torch.max(t > 0, 1), ints)))


def test_backward_of_masks_padding_and_max_dim():
    """The gradients flow through tril, pad and max.dim's values as eager's do."""
    x = _data((5, 6), 60, specials=False).requires_grad_()

    def fn(t):
        v, _ = torch.max(torch.tril(t, 1), dim=1)
        return torch.nn.functional.pad(t, (2, -1)).sum(0) * 2 + v.sum()

    want = torch.autograd.grad(fn(x).sum(), x)[0]
    dynamo.reset()
    with cb.collect_graphs() as graphs:
        out = torch.compile(fn, backend="hologram", dynamic=False)(x)
        got = torch.autograd.grad(out.sum(), x)[0]
    assert not [op for g in graphs for op, _ in g.torch_ops]
    torch.testing.assert_close(got, want, rtol=0, atol=0)


# --- integer bitwise ops and shifts -------------------------------------------------------
BITWISE: dict[str, Callable[..., torch.Tensor]] = {
    "and_or_xor": lambda a, b: ((a & b) | (a ^ 5), torch.bitwise_xor(a, b)),
    "not": lambda a, b: (~a, torch.bitwise_not(b)),
    "shifts": lambda a, b: (a << b, a >> b, torch.bitwise_left_shift(b, 3)),
    "shift_scalar": lambda a, b: (a >> 70, torch.bitwise_right_shift(a, 1), (a & 7) << 29),
    "bool": lambda a, b: ((a > 0) & (b < 0), (a > 0) | ~(b > 0), (a > b) ^ (b > 0)),
}


def _int_data(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Small integers (shift counts in and out of range, negative ones) and, for int32,
    the whole range and its edges. int64 tensors ride in f64 between the ops of a
    program (README), exact to 2**53: their values and results stay below it here."""
    rng = np.random.default_rng(seed)
    npd = {torch.int32: np.int32, torch.int64: np.int64}[dtype]
    small = rng.integers(-70, 71, shape).astype(npd)
    if dtype is torch.int64:
        return torch.from_numpy(small)
    info = np.iinfo(npd)
    x = rng.integers(info.min, info.max, shape, dtype=npd, endpoint=True)
    x = np.where(rng.random(shape) < 0.5, small, x)
    x.reshape(-1)[:4] = [info.min, info.max, -1, 0]
    return torch.from_numpy(x)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.uint8],
                         ids=["int8", "int16", "uint8"])
def test_narrow_integer_and_or_xor_not_match_eager(dtype):
    """int8, int16 and uint8 and/or/xor (and ~ of the signed ones) compute in int32:
    their bits are the narrow ones, over each type's whole range."""
    info = torch.iinfo(dtype)
    gen = torch.Generator().manual_seed(3)
    a = torch.randint(info.min, info.max + 1, (6, 14), generator=gen, dtype=torch.int64)
    b = torch.randint(info.min, info.max + 1, (6, 14), generator=gen, dtype=torch.int64)
    a.view(-1)[:3] = torch.tensor([info.min, info.max, 0])
    a, b = a.to(dtype), b.to(dtype)

    def fn(a, b):
        out = ((a & b) | (a ^ b), torch.bitwise_xor(a, 5))
        return (*out, ~a) if dtype.is_signed else out

    _same(*reversed(_run(fn, a, b)))


def test_uint8_not_is_left_to_pytorch():
    """~ of a uint8 is 255 - x, not int32's -x - 1: PyTorch computes it."""
    a = torch.arange(0, 250, 10, dtype=torch.uint8)
    dynamo.reset()
    with cb.collect_graphs() as graphs:
        got = torch.compile(lambda a: ~a + 1, backend="hologram", dynamic=False)(a)
    assert torch.equal(got, ~a + 1)
    assert [op for g in graphs for op, _ in g.torch_ops] == ["aten.bitwise_not"]


@pytest.mark.parametrize("layout", ["contiguous", "strided", "empty"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
@pytest.mark.parametrize("name", sorted(BITWISE))
def test_bitwise_and_shifts_match_eager(name, dtype, layout):
    a, b = _int_data((6, 14), dtype, 1), _int_data((6, 14), dtype, 2)
    if layout == "strided":
        a, b = a[:, ::2], b[:, 1::2]
    elif layout == "empty":
        a, b = a[:0], b[:0]
    _same(*reversed(_run(BITWISE[name], a, b)))
