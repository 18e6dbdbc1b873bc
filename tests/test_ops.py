"""The op library against independent float64 NumPy references.

Every op in ``hologram.ops.__all__`` (``composites`` aside) is run on random inputs
(one fixed seed per test) in f32 and f64 on both host backends and compared with
a float64 reference written here, plus special values (NaN, +-inf, -0.0), prefix
(``n``) semantics, in-place calls, and the errors each argument can raise.
"""

from __future__ import annotations

import itertools
import math
import zlib

import numpy as np
import pytest

import hologram as hg
from hologram import ops
from hologram.errors import AliasError, BufferStateError, DTypeError, ShapeError

pytestmark = [
    pytest.mark.filterwarnings("ignore:hologram. no C compiler:UserWarning"),
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
]

BACKENDS = ["cpu", "reference"]
DTYPES = [np.float32, np.float64]
SIZES = [0, 1, 3, 1024, 3072, 3073]
MILLION = 1_000_000
SENTINEL = 1234.5
TOL = {np.float32: (1e-5, 1e-6), np.float64: (1e-12, 1e-13)}  # (rtol, atol)
SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 2.5, -3.75, 1e30, -1e30, 1e-30,
            -1e-30]


# --- fixtures and helpers ---------------------------------------------------------------
@pytest.fixture(params=BACKENDS)
def ex(request):
    with hg.Executor(request.param) as e:
        yield e


@pytest.fixture
def rng(request):
    """A generator seeded from the test's id: fixed per test, different across tests."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def tol(dtype) -> tuple[float, float]:
    return TOL[np.dtype(dtype).type]


def put(ex, arr, dtype=None):
    """A new buffer holding ``arr`` (cast to ``dtype``)."""
    arr = np.asarray(arr)
    dtype = arr.dtype if dtype is None else dtype
    buf = ex.allocate(arr.shape, dtype=dtype)
    buf.from_numpy(arr.astype(dtype))
    return buf


def sentinel(ex, shape, dtype):
    return ex.allocate(shape, dtype=dtype).fill(SENTINEL)


def values(buf) -> np.ndarray:
    """A float64 copy of the buffer's contents."""
    return buf.to_numpy().astype(np.float64)


def as_dtype(ref, dtype) -> np.ndarray:
    """The float64 reference rounded to ``dtype`` (so overflow/underflow happen as there)."""
    with np.errstate(all="ignore"):
        return np.asarray(ref, np.float64).astype(dtype).astype(np.float64)


def assert_close(got, ref, dtype, rtol=None, atol=None) -> None:
    r, a = tol(dtype)
    got = np.asarray(got, np.float64)
    want = as_dtype(ref, dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=r if rtol is None else rtol,
                               atol=a if atol is None else atol, equal_nan=True)
    # NaN and infinities exactly where the reference has them
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want))
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))


def assert_signed_zeros(got, ref, dtype) -> None:
    want = as_dtype(ref, dtype)
    zero = want == 0
    np.testing.assert_array_equal(np.signbit(np.asarray(got)[zero]), np.signbit(want[zero]))


def assert_sum_close(got: float, x: np.ndarray, ref: float, dtype, rtol=None) -> None:
    """Summation error is relative to sum(|x|), not to the (possibly cancelling) sum."""
    r = tol(dtype)[0] if rtol is None else rtol
    scale = float(np.abs(x).sum()) if x.size else 0.0
    assert abs(got - ref) <= r * scale + tol(dtype)[1], (got, ref, scale)


def random_data(rng, shape, scale=3.0, specials=False) -> np.ndarray:
    x = rng.standard_normal(shape) * scale
    if specials and x.size >= 16:
        flat = x.reshape(-1)
        pos = rng.choice(flat.size, 4, replace=False)
        flat[pos] = [np.nan, np.inf, -np.inf, -0.0]
    return x


# --- float64 references, written independently of hologram's composites ---------------
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_erf = np.frompyfunc(math.erf, 1, 1)


def erf(x: np.ndarray) -> np.ndarray:
    return _erf(np.asarray(x, np.float64)).astype(np.float64)


def ref_relu(x):
    return np.where(np.isnan(x), x, np.where(x > 0, x, 0.0))


def ref_sigmoid(x):
    with np.errstate(all="ignore"):
        e = np.exp(-np.abs(x))
        return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def ref_gelu_tanh(x):
    with np.errstate(all="ignore"):
        return 0.5 * x * (1.0 + np.tanh(SQRT_2_OVER_PI * (x + 0.044715 * x ** 3)))


def ref_gelu_erf(x):
    with np.errstate(all="ignore"):
        return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def ref_log_softmax(x, axis):
    if x.size == 0:
        return np.array(x, np.float64)
    with np.errstate(all="ignore"):
        shifted = x - np.max(x, axis=axis, keepdims=True)
        return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


def ref_softmax(x, axis):
    if x.size == 0:
        return np.array(x, np.float64)
    with np.errstate(all="ignore"):
        e = np.exp(x - np.max(x, axis=axis, keepdims=True))
        return e / np.sum(e, axis=axis, keepdims=True)


def ref_mean(v: np.ndarray) -> float:
    return float(v.sum() / v.size) if v.size else math.nan


def ref_reduce(per_element: np.ndarray, reduction: str):
    if reduction == "none":
        return per_element
    return float(per_element.sum()) if reduction == "sum" else ref_mean(per_element)


def ref_mse(p, t):
    return (p - t) ** 2


def ref_bce(p, t):
    with np.errstate(all="ignore"):
        log_p = np.maximum(np.log(p), -100.0)
        log_1mp = np.maximum(np.log(1.0 - p), -100.0)
    return -(t * log_p + (1.0 - t) * log_1mp)


def ref_cross_entropy_rows(logits, target):
    with np.errstate(all="ignore"):
        return -(target * ref_log_softmax(logits, -1)).sum(-1)


# name -> (call(ex, a, c, n), float64 reference, must keep the sign of zero)
UNARY = {
    "vector_abs": (lambda ex, a, c, n: ops.vector_abs(ex, a, c, n=n), np.abs, True),
    "vector_neg": (lambda ex, a, c, n: ops.vector_neg(ex, a, c, n=n), np.negative, True),
    "vector_relu": (lambda ex, a, c, n: ops.vector_relu(ex, a, c, n=n), ref_relu, False),
    "sigmoid": (lambda ex, a, c, n: ops.sigmoid(ex, a, c, n=n), ref_sigmoid, False),
    "tanh": (lambda ex, a, c, n: ops.tanh(ex, a, c, n=n), np.tanh, True),
    "gelu_tanh": (lambda ex, a, c, n: ops.gelu(ex, a, c, n=n), ref_gelu_tanh, True),
    "gelu_erf": (lambda ex, a, c, n: ops.gelu(ex, a, c, n=n, approximate="none"),
                 ref_gelu_erf, True),
    "vector_clip": (lambda ex, a, c, n: ops.vector_clip(ex, a, c, -0.5, 1.25, n=n),
                    lambda x: np.clip(x, -0.5, 1.25), True),
    "scalar_add": (lambda ex, a, c, n: ops.scalar_add(ex, a, c, 0.75, n=n),
                   lambda x: x + 0.75, True),
    "scalar_mul": (lambda ex, a, c, n: ops.scalar_mul(ex, a, c, -1.5, n=n),
                   lambda x: x * -1.5, True),
}

# name -> (op, float64 reference, must keep the sign of zero)
BINARY = {
    "vector_add": (ops.vector_add, np.add, True),
    "vector_sub": (ops.vector_sub, np.subtract, True),
    "vector_mul": (ops.vector_mul, np.multiply, True),
    "vector_div": (ops.vector_div, np.divide, True),
    "vector_min": (ops.vector_min, np.minimum, False),  # NaN propagates, as np.minimum
    "vector_max": (ops.vector_max, np.maximum, False),
}

REDUCE = {"reduce_sum": np.sum, "reduce_max": np.max, "reduce_min": np.min}


def run_unary(name, ex, a, c, n=None):
    return UNARY[name][0](ex, a, c, n)


def unary_ref(name, x):
    with np.errstate(all="ignore"):
        return UNARY[name][1](np.asarray(x, np.float64))


def binary_ref(name, x, y):
    with np.errstate(all="ignore"):
        return BINARY[name][1](np.asarray(x, np.float64), np.asarray(y, np.float64))


# --- coverage ---------------------------------------------------------------------------
TESTED_OPS = {
    *(n for n in UNARY if not n.startswith("gelu")), "gelu", *BINARY, *REDUCE,
    "softmax", "log_softmax", "mse_loss", "binary_cross_entropy_loss", "cross_entropy_loss",
    "gemm", "matvec",
}


def test_every_op_is_tested():
    assert set(ops.__all__) - {"composites"} == TESTED_OPS
    assert set(ERROR_CASES) == TESTED_OPS


# --- element-wise: random inputs --------------------------------------------------------
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(UNARY))
def test_unary_matches_numpy(ex, rng, name, dtype, size):
    x = random_data(rng, size, specials=True).astype(dtype)
    a, c = put(ex, x), sentinel(ex, size, dtype)
    assert run_unary(name, ex, a, c) is c
    assert_close(values(c), unary_ref(name, x), dtype)
    np.testing.assert_array_equal(a.to_numpy(), x)  # the input is untouched


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(BINARY))
def test_binary_matches_numpy(ex, rng, name, dtype, size):
    x = random_data(rng, size, specials=True).astype(dtype)
    y = random_data(rng, size, specials=True).astype(dtype)
    a, b, c = put(ex, x), put(ex, y), sentinel(ex, size, dtype)
    assert BINARY[name][0](ex, a, b, c) is c
    assert_close(values(c), binary_ref(name, x, y), dtype)
    np.testing.assert_array_equal(a.to_numpy(), x)
    np.testing.assert_array_equal(b.to_numpy(), y)


@pytest.mark.parametrize(("name", "dtype"), [
    ("vector_add", np.float32), ("vector_div", np.float64), ("gelu_tanh", np.float32),
    ("gelu_erf", np.float32),
])
def test_elementwise_million(name, dtype):
    rng = np.random.default_rng(zlib.crc32(f"million-{name}".encode()))
    x = random_data(rng, MILLION, specials=True).astype(dtype)
    with hg.Executor("cpu") as ex:
        a, c = put(ex, x), sentinel(ex, MILLION, dtype)
        if name in BINARY:
            y = random_data(rng, MILLION, specials=True).astype(dtype)
            BINARY[name][0](ex, a, put(ex, y), c)
            ref = binary_ref(name, x, y)
        else:
            run_unary(name, ex, a, c)
            ref = unary_ref(name, x)
        assert_close(values(c), ref, dtype)


# --- element-wise: special values -------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(UNARY))
def test_unary_special_values(ex, name, dtype):
    x = np.array(SPECIALS, dtype=dtype)
    a, c = put(ex, x), sentinel(ex, x.size, dtype)
    run_unary(name, ex, a, c)
    ref = unary_ref(name, x)
    assert_close(values(c), ref, dtype)
    if UNARY[name][2]:
        assert_signed_zeros(c.to_numpy(), ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(BINARY))
def test_binary_special_values(ex, name, dtype):
    pairs = np.array(list(itertools.product(SPECIALS, SPECIALS)), dtype=dtype)
    x, y = pairs[:, 0].copy(), pairs[:, 1].copy()
    a, b, c = put(ex, x), put(ex, y), sentinel(ex, x.size, dtype)
    BINARY[name][0](ex, a, b, c)
    ref = binary_ref(name, x, y)
    assert_close(values(c), ref, dtype)
    if BINARY[name][2]:
        assert_signed_zeros(c.to_numpy(), ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sign_of_zero(ex, dtype):
    z = put(ex, np.array([-0.0, 0.0], dtype=dtype))
    c = sentinel(ex, 2, dtype)
    ops.vector_neg(ex, z, c)
    np.testing.assert_array_equal(np.signbit(c.to_numpy()), [False, True])
    ops.vector_abs(ex, z, c)
    np.testing.assert_array_equal(np.signbit(c.to_numpy()), [False, False])
    ops.vector_clip(ex, z, c, -1.0, 1.0)
    np.testing.assert_array_equal(np.signbit(c.to_numpy()), [True, False])
    ops.scalar_mul(ex, put(ex, np.array([1.0, -1.0], dtype)), c, -0.0)
    np.testing.assert_array_equal(np.signbit(c.to_numpy()), [True, False])


@pytest.mark.parametrize("dtype", DTYPES)
def test_scalar_ops_with_special_scalars(ex, rng, dtype):
    x = np.array([1.0, -2.0, 0.0, np.inf, np.nan], dtype=dtype)
    a, c = put(ex, x), sentinel(ex, x.size, dtype)
    for s in (-np.inf, np.nan, np.float32(0.1), 3):
        with np.errstate(all="ignore"):
            s_as_dtype = np.float64(np.asarray(s, dtype))
        ops.scalar_add(ex, a, c, s)
        assert_close(values(c), x.astype(np.float64) + s_as_dtype, dtype)
        ops.scalar_mul(ex, a, c, s)
        with np.errstate(all="ignore"):
            assert_close(values(c), x.astype(np.float64) * s_as_dtype, dtype)


# --- element-wise: prefix, in-place, repeated calls -------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", [*UNARY, *BINARY])
def test_elementwise_prefix_n(ex, rng, name, dtype):
    """With n, only the first n elements are read and written; buffers may be larger."""
    x = random_data(rng, 37).astype(dtype)
    y = random_data(rng, 25).astype(dtype)
    a, b = put(ex, x), put(ex, y)
    for n in (25,) if name not in ("vector_add", "gelu_tanh") else (0, 25):
        c = sentinel(ex, 41, dtype)
        if name in BINARY:
            BINARY[name][0](ex, a, b, c, n=n)
            ref = binary_ref(name, x[:n], y[:n])
        else:
            run_unary(name, ex, a, c, n=n)
            ref = unary_ref(name, x[:n])
        got = values(c)
        assert_close(got[:n], ref, dtype)
        assert (got[n:] == SENTINEL).all()
        np.testing.assert_array_equal(a.to_numpy(), x)
        np.testing.assert_array_equal(b.to_numpy(), y)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(UNARY))
def test_unary_in_place(ex, rng, name, dtype):
    a = ex.allocate(3073, dtype=dtype)
    for _ in range(2):  # the second call repeats a bound launch on new data
        x = random_data(rng, 3073, specials=True).astype(dtype)
        a.from_numpy(x)
        assert run_unary(name, ex, a, a) is a
        assert_close(values(a), unary_ref(name, x), dtype)


@pytest.mark.parametrize("alias", ["c=a", "c=b", "a=b=c"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(BINARY))
def test_binary_in_place(ex, rng, name, dtype, alias):
    x = random_data(rng, 1024, specials=True).astype(dtype)
    y = random_data(rng, 1024, specials=True).astype(dtype)
    a, b = put(ex, x), put(ex, y)
    op = BINARY[name][0]
    if alias == "c=a":
        op(ex, a, b, a)
        out, ref = a, binary_ref(name, x, y)
    elif alias == "c=b":
        op(ex, a, b, b)
        out, ref = b, binary_ref(name, x, y)
    else:
        op(ex, a, a, a)
        out, ref = a, binary_ref(name, x, x)
    assert_close(values(out), ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_in_place_through_a_reshaped_view(ex, rng, dtype):
    x = random_data(rng, (4, 6)).astype(dtype)
    y = random_data(rng, (4, 6)).astype(dtype)
    a, b = put(ex, x), put(ex, y)
    ops.vector_add(ex, a, b, a.reshape(24))
    assert_close(values(a), x.astype(np.float64) + y, dtype)
    ops.vector_neg(ex, a.reshape(24), a)
    assert_close(values(a), -(x.astype(np.float64) + y), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_repeated_calls_see_new_data(ex, rng, dtype):
    a, b, c = (ex.allocate(100, dtype=dtype) for _ in range(3))
    for _ in range(3):
        x, y = random_data(rng, 100).astype(dtype), random_data(rng, 100).astype(dtype)
        a.from_numpy(x)
        b.from_numpy(y)
        ops.vector_mul(ex, a, b, c)
        assert_close(values(c), x.astype(np.float64) * y, dtype)
        ops.vector_clip(ex, a, c, -1.0, 1.0)
        assert_close(values(c), np.clip(x, -1, 1), dtype)
        ops.vector_clip(ex, a, c, -2.0, 0.5)  # other parameters, same buffers
        assert_close(values(c), np.clip(x, -2, 0.5), dtype)
    d = ex.allocate(100, dtype=dtype)  # same call with another output buffer
    ops.vector_mul(ex, a, b, d)
    assert_close(values(d), x.astype(np.float64) * y, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_elementwise_keeps_2d_shapes(ex, rng, dtype):
    x = random_data(rng, (5, 7)).astype(dtype)
    a, c = put(ex, x), sentinel(ex, (7, 5), dtype)  # same number of elements is enough
    ops.tanh(ex, a, c)
    assert c.shape == (7, 5)
    assert_close(values(c).reshape(5, 7), np.tanh(x.astype(np.float64)), dtype)


# --- whole and axis reductions ----------------------------------------------------------
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(REDUCE))
def test_reduce_whole(ex, rng, name, dtype, size):
    x = random_data(rng, size).astype(dtype)
    a, out = put(ex, x), sentinel(ex, 3, dtype)
    op = getattr(ops, name)
    if size == 0 and name != "reduce_sum":
        with pytest.raises(ShapeError, match=r"^a: .*empty"):
            op(ex, a, out)
        return
    got = op(ex, a, out)
    assert isinstance(got, float)
    o = values(out)
    assert o[0] == got and (o[1:] == SENTINEL).all()
    ref = float(REDUCE[name](x.astype(np.float64))) if size else 0.0
    if name == "reduce_sum":
        assert_sum_close(got, x, ref, dtype)
    else:
        assert got == ref  # min and max are exact


@pytest.mark.parametrize(("name", "dtype"), [
    ("reduce_sum", np.float32), ("reduce_sum", np.float64), ("reduce_max", np.float32),
    ("reduce_min", np.float64),
])
def test_reduce_million(name, dtype):
    rng = np.random.default_rng(zlib.crc32(f"million-{name}-{dtype.__name__}".encode()))
    x = random_data(rng, MILLION).astype(dtype)
    with hg.Executor("cpu") as ex:
        got = getattr(ops, name)(ex, put(ex, x), ex.allocate(1, dtype=dtype))
    ref = float(REDUCE[name](x.astype(np.float64)))
    if name == "reduce_sum":
        assert_sum_close(got, x, ref, dtype, rtol=1e-4 if dtype is np.float32 else 1e-12)
    else:
        assert got == ref


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(REDUCE))
def test_reduce_special_values(ex, rng, name, dtype):
    cases = [[1.0, np.nan, 2.0], [np.inf, 1.0], [-np.inf, 1.0], [-np.inf, np.inf],
             [np.nan], [np.inf, np.nan, -np.inf], [1e30, 1e30, -1e30]]
    big = random_data(rng, 3073)
    big[rng.integers(3073)] = np.nan
    cases.append(big)
    for case in cases:
        x = np.asarray(case, dtype=dtype)
        got = getattr(ops, name)(ex, put(ex, x), ex.allocate(1, dtype=dtype))
        with np.errstate(all="ignore"):
            ref = REDUCE[name](x)  # in the buffer's dtype: 1e30 + 1e30 overflows in f32
        assert_close(np.array([got]), np.array([ref]), dtype)


SHAPES_AXES = [((3, 4), 0), ((3, 4), -1), ((5, 1), 1), ((1, 7), 0), ((2, 3, 4), 1),
               ((2, 3, 4), -1), ((2, 3, 4), -3), ((17, 33), 0), ((0, 3), 0), ((0, 3), 1),
               ((4, 0), 1), ((3073,), 0)]


@pytest.mark.parametrize(("shape", "axis"), SHAPES_AXES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(REDUCE))
def test_reduce_axis(ex, rng, name, dtype, shape, axis):
    x = random_data(rng, shape, specials=True).astype(dtype)
    a = put(ex, x)
    out_shape = tuple(s for i, s in enumerate(shape) if i != axis % len(shape))
    out = sentinel(ex, out_shape, dtype)
    op = getattr(ops, name)
    if shape[axis] == 0 and name != "reduce_sum":
        with pytest.raises(ShapeError, match=r"^a: .*empty"):
            op(ex, a, out, axis=axis)
        return
    assert op(ex, a, out, axis=axis) is out
    x64 = x.astype(np.float64)
    if name == "reduce_sum":
        with np.errstate(all="ignore"):
            ref = x64.sum(axis=axis)
            scale = np.abs(x64).sum(axis=axis)
        rtol, atol = tol(dtype)
        got = values(out)
        finite = np.isfinite(ref)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
        np.testing.assert_array_equal(got[~finite], ref[~finite])
        assert (np.abs(got - ref)[finite] <= rtol * scale[finite] + atol).all()
    else:
        assert_close(values(out), REDUCE[name](x64, axis=axis), dtype, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(REDUCE))
def test_reduce_prefix_n(ex, rng, name, dtype):
    x = random_data(rng, 50).astype(dtype)
    a = put(ex, x.reshape(5, 10))
    op = getattr(ops, name)
    for n in (1, 20):
        out = sentinel(ex, 2, dtype)
        ref = float(REDUCE[name](x[:n].astype(np.float64)))
        got = op(ex, a, out, n=n)
        assert_sum_close(got, x[:n], ref, dtype)
        out2 = sentinel(ex, 2, dtype)
        assert op(ex, a, out2, n=n, axis=0) is out2  # a prefix is one flat axis
        assert_sum_close(float(values(out2)[0]), x[:n], ref, dtype)
        assert values(out)[1] == SENTINEL and values(out2)[1] == SENTINEL
    # a 2-D buffer without n reduces all of it
    assert_sum_close(op(ex, a, ex.allocate(1, dtype=dtype)), x,
                     float(REDUCE[name](x.astype(np.float64))), dtype)


# --- softmax and log_softmax ------------------------------------------------------------
SOFTMAX_CASES = [((1, 1), -1), ((4, 7), 0), ((4, 7), 1), ((7, 4), -1), ((1, 5), 0),
                 ((5, 1), 1), ((2, 3, 4), 0), ((2, 3, 4), 1), ((2, 3, 4), -1), ((8, 3073), 1),
                 ((8, 3073), 0), ((3073,), 0)]
SOFTMAX = {"softmax": (ops.softmax, ref_softmax), "log_softmax": (ops.log_softmax,
                                                                   ref_log_softmax)}


@pytest.mark.parametrize(("shape", "axis"), SOFTMAX_CASES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(SOFTMAX))
def test_softmax_matches_numpy(ex, rng, name, dtype, shape, axis):
    x = random_data(rng, shape, scale=4.0)
    x[0] += 1e4  # large values: only a max-shifted form stays finite
    if shape[-1] > 1:
        x[..., -1] -= 1e4
    x = x.astype(dtype)
    a, c = put(ex, x), sentinel(ex, shape, dtype)
    op, ref = SOFTMAX[name]
    assert op(ex, a, c, axis=axis) is c
    want = ref(x.astype(np.float64), axis)
    assert np.isfinite(want).all()
    assert_close(values(c), want, dtype)
    if name == "softmax":
        np.testing.assert_allclose(values(c).sum(axis=axis), 1.0, rtol=tol(dtype)[0] * 10)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(SOFTMAX))
def test_softmax_default_axis_is_last(ex, rng, name, dtype):
    x = random_data(rng, (3, 4, 5)).astype(dtype)
    c = sentinel(ex, (3, 4, 5), dtype)
    op, ref = SOFTMAX[name]
    op(ex, put(ex, x), c)
    assert_close(values(c), ref(x.astype(np.float64), -1), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(SOFTMAX))
def test_softmax_special_rows(ex, name, dtype):
    x = np.array([[np.nan, 1.0, 2.0], [-np.inf, 0.0, 1.0], [1e4, -1e4, 0.0],
                  [-np.inf, -np.inf, -np.inf], [np.inf, 0.0, 1.0], [-0.0, 0.0, 0.0],
                  [3e38, 3e38, -3e38]], dtype=dtype)
    c = sentinel(ex, x.shape, dtype)
    op, ref = SOFTMAX[name]
    op(ex, put(ex, x), c, axis=1)
    assert_close(values(c), ref(x.astype(np.float64), 1), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(SOFTMAX))
def test_softmax_prefix_n_is_one_row(ex, rng, name, dtype):
    x = random_data(rng, 30).astype(dtype)
    a = put(ex, x.reshape(5, 6))
    op, ref = SOFTMAX[name]
    for n in (0, 13):
        c = sentinel(ex, 31, dtype)
        op(ex, a, c, n=n)
        got = values(c)
        assert_close(got[:n], ref(x[:n].astype(np.float64), 0), dtype)
        assert (got[n:] == SENTINEL).all()
    with pytest.raises(ShapeError, match="^axis:"):
        op(ex, a, sentinel(ex, 30, dtype), n=13, axis=1)


@pytest.mark.parametrize("name", list(SOFTMAX))
def test_softmax_empty_shapes(ex, name):
    op = SOFTMAX[name][0]
    for shape, axis in (((0,), 0), ((0, 3), 0), ((0, 3), 1), ((3, 0), 0), ((3, 0), 1)):
        c = ex.allocate(shape)
        assert op(ex, ex.allocate(shape), c, axis=axis) is c


# --- losses -----------------------------------------------------------------------------
REDUCTIONS = ["mean", "sum", "none"]
LOSS_SIZES = [0, 1, 3, 3073]  # each (size, reduction, dtype) is a kernel to compile


def check_loss(got, out, per_element, reduction, dtype, rtol=None):
    """``got`` is what the loss returned, ``out`` its output buffer."""
    ref = ref_reduce(per_element, reduction)
    if reduction == "none":
        assert got is out
        assert_close(values(out)[:per_element.size].reshape(per_element.shape), ref, dtype,
                     rtol=rtol)
    else:
        assert isinstance(got, float)
        first = values(out).reshape(-1)[0]
        assert first == got or (math.isnan(got) and math.isnan(first))
        assert_close(np.array([got]), np.array([ref]), dtype, rtol=rtol)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("size", LOSS_SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_mse_loss(ex, rng, dtype, size, reduction):
    p = random_data(rng, size).astype(dtype)
    t = random_data(rng, size).astype(dtype)
    out = sentinel(ex, max(size, 1), dtype)
    got = ops.mse_loss(ex, put(ex, p), put(ex, t), out, reduction=reduction)
    check_loss(got, out, ref_mse(p.astype(np.float64), t), reduction, dtype)


def test_mse_loss_million():
    rng = np.random.default_rng(7)
    p, t = rng.standard_normal((2, MILLION)).astype(np.float32)
    with hg.Executor("cpu") as ex:
        out = ex.allocate(1)
        got = ops.mse_loss(ex, put(ex, p), put(ex, t), out)
        check_loss(got, out, ref_mse(p.astype(np.float64), t), "mean", np.float32, rtol=1e-4)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_mse_loss_special_values(ex, dtype, reduction):
    p = np.array([1.0, np.nan, np.inf, 2.0, -0.0], dtype=dtype)
    t = np.array([1.0, 0.0, 1.0, np.inf, 0.0], dtype=dtype)
    out = sentinel(ex, 5, dtype)
    got = ops.mse_loss(ex, put(ex, p), put(ex, t), out, reduction=reduction)
    check_loss(got, out, ref_mse(p.astype(np.float64), t), reduction, dtype)


def bce_inputs(rng, size, dtype):
    p = rng.uniform(0.0, 1.0, size)
    t = rng.uniform(0.0, 1.0, size)
    if size >= 8:  # probabilities at (and rounding to) 0 and 1, hard 0/1 targets
        p[:6] = [0.0, 1.0, 0.0, 1.0, 1e-44, 1.0 - 1e-9]
        t[:6] = [0.0, 1.0, 1.0, 0.0, 0.5, 0.25]
    return p.astype(dtype), t.astype(dtype)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("size", LOSS_SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_binary_cross_entropy_loss(ex, rng, dtype, size, reduction):
    p, t = bce_inputs(rng, size, dtype)
    out = sentinel(ex, max(size, 1), dtype)
    got = ops.binary_cross_entropy_loss(ex, put(ex, p), put(ex, t), out, reduction=reduction)
    per = ref_bce(p.astype(np.float64), t.astype(np.float64))
    assert np.isfinite(per).all()
    check_loss(got, out, per, reduction, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_binary_cross_entropy_clamps_logs_at_minus_100(ex, dtype):
    p = np.array([0.0, 1.0, 0.0, 1.0, 0.5], dtype=dtype)
    t = np.array([1.0, 0.0, 0.0, 1.0, 0.5], dtype=dtype)
    out = sentinel(ex, 5, dtype)
    ops.binary_cross_entropy_loss(ex, put(ex, p), put(ex, t), out, reduction="none")
    np.testing.assert_allclose(values(out), [100.0, 100.0, 0.0, 0.0, math.log(2.0)],
                               rtol=tol(dtype)[0], atol=tol(dtype)[1])
    assert ops.binary_cross_entropy_loss(ex, put(ex, p), put(ex, t), out,
                                         reduction="sum") == pytest.approx(200 + math.log(2))


@pytest.mark.parametrize("dtype", DTYPES)
def test_losses_match_torch(ex, rng, dtype):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional  # noqa: N806
    p, t = bce_inputs(rng, 64, dtype)
    logits = (rng.standard_normal((6, 9)) * 50).astype(dtype)
    soft = ref_softmax(rng.standard_normal((6, 9)), -1).astype(dtype)
    for reduction in REDUCTIONS:
        out = sentinel(ex, 64, dtype)
        got = ops.binary_cross_entropy_loss(ex, put(ex, p), put(ex, t), out,
                                            reduction=reduction)
        want = F.binary_cross_entropy(torch.from_numpy(p), torch.from_numpy(t),
                                      reduction=reduction).numpy()
        got = values(out)[:64] if reduction == "none" else np.array(got)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

        out = sentinel(ex, 6, dtype)
        got = ops.cross_entropy_loss(ex, put(ex, logits), put(ex, soft), out,
                                     reduction=reduction)
        want = F.cross_entropy(torch.from_numpy(logits), torch.from_numpy(soft),
                               reduction=reduction).numpy()
        got = values(out) if reduction == "none" else np.array(got)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


CE_SHAPES = [(1, 1), (4, 5), (16, 10), (2, 3, 4), (32, 1000)]


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("targets", ["one-hot", "soft"])
@pytest.mark.parametrize("shape", CE_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_loss(ex, rng, dtype, shape, targets, reduction):
    rows = shape[:-1]
    if targets == "one-hot":
        t = np.eye(shape[-1])[rng.integers(0, shape[-1], rows)]
    else:
        t = ref_softmax(rng.standard_normal(shape) * 2, -1)
    t = t.astype(dtype)
    for scale in (3.0, 1e4):  # large logits need the stable log-softmax
        x = (rng.standard_normal(shape) * scale).astype(dtype)
        out = sentinel(ex, rows, dtype)
        got = ops.cross_entropy_loss(ex, put(ex, x), put(ex, t), out, reduction=reduction)
        per_row = ref_cross_entropy_rows(x.astype(np.float64), t.astype(np.float64))
        assert np.isfinite(per_row).all()
        check_loss(got, out, per_row, reduction, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_classes_and_prefix(ex, rng, dtype):
    x = random_data(rng, 20).astype(dtype)
    t = ref_softmax(rng.standard_normal(20), -1).astype(dtype)
    a, b = put(ex, x), put(ex, t)
    x64, t64 = x.astype(np.float64), t.astype(np.float64)
    # classes splits a flat prefix into rows
    out = sentinel(ex, 5, dtype)
    got = ops.cross_entropy_loss(ex, a, b, out, n=12, reduction="none", classes=4)
    assert got is out
    want = ref_cross_entropy_rows(x64[:12].reshape(3, 4), t64[:12].reshape(3, 4))
    assert_close(values(out)[:3], want, dtype)
    assert (values(out)[3:] == SENTINEL).all()
    got = ops.cross_entropy_loss(ex, a, b, out, n=12, classes=4)
    assert_close(np.array([got]), np.array([want.mean()]), dtype)
    # without classes a flat buffer (or prefix) is one row
    got = ops.cross_entropy_loss(ex, a, b, out, n=12, reduction="sum")
    assert_close(np.array([got]), ref_cross_entropy_rows(x64[:12], t64[:12])[None], dtype)
    got = ops.cross_entropy_loss(ex, a, b, out)
    assert_close(np.array([got]), ref_cross_entropy_rows(x64, t64)[None], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_nan_row(ex, rng, dtype):
    x = random_data(rng, (4, 6)).astype(dtype)
    x[2, 3] = np.nan
    t = ref_softmax(rng.standard_normal((4, 6)), -1).astype(dtype)
    out = sentinel(ex, 4, dtype)
    ops.cross_entropy_loss(ex, put(ex, x), put(ex, t), out, reduction="none")
    assert_close(values(out), ref_cross_entropy_rows(x.astype(np.float64), t), dtype)
    assert np.isnan(values(out)[2]) and np.isfinite(values(out)[[0, 1, 3]]).all()
    assert math.isnan(ops.cross_entropy_loss(ex, put(ex, x), put(ex, t), out))


@pytest.mark.parametrize("dtype", DTYPES)
def test_losses_prefix_n(ex, rng, dtype):
    p, t = bce_inputs(rng, 40, dtype)
    a, b = put(ex, p), put(ex, np.concatenate([t, t])[:45])
    p64, t64 = p.astype(np.float64), t.astype(np.float64)
    for n in (0, 7):
        out = sentinel(ex, 50, dtype)
        got = ops.mse_loss(ex, a, b, out, n=n, reduction="none")
        assert_close(values(out)[:n], ref_mse(p64[:n], t64[:n]), dtype)
        assert (values(out)[n:] == SENTINEL).all()
        out = sentinel(ex, 3, dtype)
        got = ops.binary_cross_entropy_loss(ex, a, b, out, n=n, reduction="sum")
        assert_close(np.array([got]), np.array([ref_bce(p64[:n], t64[:n]).sum()]), dtype)
        assert (values(out)[1:] == SENTINEL).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_elementwise_losses_in_place(ex, rng, dtype):
    """reduction='none' is element-wise, so out may be pred or target."""
    p, t = bce_inputs(rng, 64, dtype)
    a, b = put(ex, p), put(ex, t)
    ops.mse_loss(ex, a, b, a, reduction="none")
    assert_close(values(a), ref_mse(p.astype(np.float64), t), dtype)
    a.from_numpy(p)
    ops.binary_cross_entropy_loss(ex, a, b, b, reduction="none")
    assert_close(values(b), ref_bce(p.astype(np.float64), t.astype(np.float64)), dtype)


# --- gemm and matvec --------------------------------------------------------------------
GEMM_DIMS = [(0, 0, 0), (0, 3, 4), (3, 0, 4), (3, 4, 0), (1, 1, 1), (1, 5, 1), (5, 1, 3),
             (7, 1, 1), (1, 1, 9), (16, 32, 8), (33, 65, 17), (64, 128, 96)]


def assert_matmul_close(got, A, B, dtype):
    A64, B64 = A.astype(np.float64), B.astype(np.float64)
    ref = A64 @ B64
    rtol, atol = tol(dtype)
    bound = rtol * (np.abs(A64) @ np.abs(B64)) + atol
    assert got.shape == ref.shape
    assert (np.abs(got - ref) <= bound).all(), np.abs(got - ref).max()


@pytest.mark.parametrize("mkn", GEMM_DIMS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm(ex, rng, dtype, mkn):
    m, k, n = mkn
    A = random_data(rng, (m, k)).astype(dtype)
    B = random_data(rng, (k, n)).astype(dtype)
    a, b = put(ex, A), put(ex, B)
    c = sentinel(ex, (m, n), dtype)
    assert ops.gemm(ex, a, b, c) is c  # sizes from the 2-D shapes
    assert_matmul_close(values(c), A, B, dtype)
    c2 = sentinel(ex, (m, n), dtype)
    ops.gemm(ex, a, b, c2, m, k, n)
    np.testing.assert_array_equal(values(c2), values(c))
    np.testing.assert_array_equal(a.to_numpy(), A)
    np.testing.assert_array_equal(b.to_numpy(), B)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm_prefix_of_flat_buffers(ex, rng, dtype):
    m, k, n = 5, 7, 3
    A = random_data(rng, m * k + 4).astype(dtype)
    B = random_data(rng, k * n + 2).astype(dtype)
    c = sentinel(ex, m * n + 6, dtype)
    ops.gemm(ex, put(ex, A), put(ex, B), c, m=m, k=k, n=n)
    got = values(c)
    assert_matmul_close(got[:m * n].reshape(m, n), A[:m * k].reshape(m, k),
                        B[:k * n].reshape(k, n), dtype)
    assert (got[m * n:] == SENTINEL).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm_nan_spreads_to_its_row_and_column(ex, rng, dtype):
    A = random_data(rng, (4, 5)).astype(dtype)
    B = random_data(rng, (5, 3)).astype(dtype)
    A[1, 2] = np.nan
    B[4, 0] = np.nan
    c = sentinel(ex, (4, 3), dtype)
    ops.gemm(ex, put(ex, A), put(ex, B), c)
    want = np.zeros((4, 3), bool)
    want[1, :] = want[:, 0] = True
    np.testing.assert_array_equal(np.isnan(values(c)), want)


MATVEC_DIMS = [(0, 0), (0, 3), (3, 0), (1, 1), (1, 7), (7, 1), (33, 65), (128, 64)]


@pytest.mark.parametrize("mn", MATVEC_DIMS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_matvec(ex, rng, dtype, mn):
    m, n = mn
    A = random_data(rng, (m, n)).astype(dtype)
    x = random_data(rng, n).astype(dtype)
    y = sentinel(ex, m, dtype)
    assert ops.matvec(ex, put(ex, A), put(ex, x), y) is y
    assert_matmul_close(values(y)[:, None], A, x[:, None], dtype)
    # flat buffers, explicit sizes, only the first m outputs written
    y2 = sentinel(ex, m + 3, dtype)
    ops.matvec(ex, put(ex, np.concatenate([A.ravel(), [1.0, 2.0]]), dtype),
               put(ex, np.concatenate([x, [5.0]]), dtype), y2, m=m, n=n)
    np.testing.assert_array_equal(values(y2)[:m], values(y))
    assert (values(y2)[m:] == SENTINEL).all()


# --- errors -----------------------------------------------------------------------------
# op name -> (op, buffer argument names, their shapes, keyword arguments)
FLAT6 = ((6,), (6,), (6,))
ERROR_CASES = {
    **{name: (getattr(ops, name), ("a", "b", "c"), FLAT6, {"n": 6}) for name in BINARY},
    **{name: (getattr(ops, name), ("a", "c"), FLAT6[:2], {"n": 6})
       for name in ("vector_abs", "vector_neg", "vector_relu", "sigmoid", "tanh", "gelu")},
    "vector_clip": (ops.vector_clip, ("a", "c"), FLAT6[:2],
                    {"n": 6, "min_val": -1.0, "max_val": 1.0}),
    "scalar_add": (ops.scalar_add, ("a", "c"), FLAT6[:2], {"n": 6, "scalar": 2.0}),
    "scalar_mul": (ops.scalar_mul, ("a", "c"), FLAT6[:2], {"n": 6, "scalar": 2.0}),
    **{name: (getattr(ops, name), ("a", "out"), ((6,), (1,)), {"n": 6}) for name in REDUCE},
    "softmax": (ops.softmax, ("a", "c"), FLAT6[:2], {"n": 6}),
    "log_softmax": (ops.log_softmax, ("a", "c"), FLAT6[:2], {"n": 6}),
    "mse_loss": (ops.mse_loss, ("pred", "target", "out"), ((6,), (6,), (1,)), {"n": 6}),
    "binary_cross_entropy_loss": (ops.binary_cross_entropy_loss, ("pred", "target", "out"),
                                  ((6,), (6,), (1,)), {"n": 6}),
    "cross_entropy_loss": (ops.cross_entropy_loss, ("logits", "target", "out"),
                           ((6,), (6,), (1,)), {"n": 6, "classes": 3}),
    "gemm": (ops.gemm, ("a", "b", "c"), ((2, 3), (3, 4), (2, 4)), {"m": 2, "k": 3, "n": 4}),
    "matvec": (ops.matvec, ("a", "x", "y"), ((2, 3), (3,), (2,)), {"m": 2, "n": 3}),
}
ERROR_OPS = sorted(ERROR_CASES)


def make_args(ex, name, dtype=np.float32):
    fn, names, shapes, kwargs = ERROR_CASES[name]
    bufs = [ex.allocate(s, dtype=dtype).fill(0.5) for s in shapes]
    return fn, list(names), bufs, dict(kwargs)


def test_error_case_names_are_the_parameter_names():
    import inspect

    for name, (fn, names, _, kwargs) in ERROR_CASES.items():
        params = list(inspect.signature(fn).parameters)
        assert params[1:1 + len(names)] == list(names), name
        assert set(kwargs) <= set(params), name


@pytest.mark.parametrize("name", ERROR_OPS)
def test_error_cases_run_when_valid(ex, name):
    fn, _, bufs, kwargs = make_args(ex, name)
    fn(ex, *bufs, **kwargs)


@pytest.mark.parametrize("name", ERROR_OPS)
def test_error_not_a_buffer(ex, name):
    fn, names, bufs, kwargs = make_args(ex, name)
    for i, arg in enumerate(names):
        args = list(bufs)
        args[i] = np.full(bufs[i].shape, 0.5, np.float32)
        with pytest.raises(TypeError, match=rf"^{arg}: expected a hologram Buffer"):
            fn(ex, *args, **kwargs)
        args[i] = None
        with pytest.raises(TypeError, match=rf"^{arg}: "):
            fn(ex, *args, **kwargs)


@pytest.mark.parametrize("name", ERROR_OPS)
def test_error_not_an_executor(ex, name):
    fn, _, bufs, kwargs = make_args(ex, name)
    with pytest.raises(TypeError, match="^exec: expected a hologram Executor"):
        fn("cpu", *bufs, **kwargs)


@pytest.mark.parametrize("name", ERROR_OPS)
def test_error_wrong_dtype(ex, name):
    fn, names, bufs, kwargs = make_args(ex, name)
    for i, arg in enumerate(names):
        args = list(bufs)
        args[i] = ex.allocate(bufs[i].shape, dtype=np.float64).fill(0.5)
        # the first buffer sets the dtype, so the next one is the mismatch then
        wrong = names[1] if i == 0 else arg
        with pytest.raises(DTypeError, match=rf"^{wrong}: expected dtype f64, got f32"
                           if i == 0 else rf"^{wrong}: expected dtype f32, got f64"):
            fn(ex, *args, **kwargs)


@pytest.mark.parametrize("name", ERROR_OPS)
def test_error_buffer_too_small(ex, name):
    fn, names, bufs, kwargs = make_args(ex, name)
    for i, arg in enumerate(names):
        args = list(bufs)
        args[i] = ex.allocate(bufs[i].size - 1).fill(0.5)
        with pytest.raises(ShapeError, match=rf"^{arg}: has {bufs[i].size - 1} elements"):
            fn(ex, *args, **kwargs)


@pytest.mark.parametrize("name", ERROR_OPS)
def test_error_freed_buffer(ex, name):
    fn, names, _, kwargs = make_args(ex, name)
    for i, arg in enumerate(names):
        fn, _, bufs, kwargs = make_args(ex, name)
        fn(ex, *bufs, **kwargs)  # a valid call first: the repeat takes the fast path
        bufs[i].free()
        with pytest.raises(BufferStateError, match=rf"^{arg}: the buffer was freed"):
            fn(ex, *bufs, **kwargs)


@pytest.mark.parametrize("name", ERROR_OPS)
def test_error_buffer_of_another_executor(ex, name):
    fn, names, bufs, kwargs = make_args(ex, name)
    with hg.Executor(ex.backend_name) as other:
        for i, arg in enumerate(names):
            args = list(bufs)
            args[i] = other.allocate(bufs[i].shape).fill(0.5)
            with pytest.raises(BufferStateError,
                               match=rf"^{arg}: the buffer belongs to another executor"):
                fn(ex, *args, **kwargs)


@pytest.mark.parametrize("name", ERROR_OPS)
def test_error_closed_executor(name):
    with hg.Executor("cpu") as ex:
        fn, _, bufs, kwargs = make_args(ex, name)
        fn(ex, *bufs, **kwargs)
    with pytest.raises(BufferStateError, match="^executor: it is closed"):
        fn(ex, *bufs, **kwargs)


@pytest.mark.parametrize("name", ERROR_OPS)
def test_error_read_only_output(ex, name):
    fn, names, bufs, kwargs = make_args(ex, name)
    arr = np.full(bufs[-1].shape, 0.5, np.float32)
    arr.flags.writeable = False
    bufs[-1] = ex.wrap(arr)
    with pytest.raises(BufferStateError, match=rf"^{names[-1]}: the buffer is read-only"):
        fn(ex, *bufs, **kwargs)


@pytest.mark.parametrize("name", ERROR_OPS)
def test_error_bad_n(ex, name):
    fn, _, bufs, kwargs = make_args(ex, name)
    with pytest.raises(ShapeError, match=r"^n: must be >= 0, got -1"):
        fn(ex, *bufs, **{**kwargs, "n": -1})
    for bad in (2.0, True, "6", [6]):
        with pytest.raises(TypeError, match=r"^n: expected an int"):
            fn(ex, *bufs, **{**kwargs, "n": bad})


def test_error_bad_n_after_a_valid_call(ex):
    a, b, c = (ex.allocate(6).fill(1.0) for _ in range(3))
    ops.vector_add(ex, a, b, c, n=1)
    for bad in (True, 1.0):
        with pytest.raises(TypeError, match=r"^n: expected an int"):
            ops.vector_add(ex, a, b, c, n=bad)


def test_error_gemm_non_buffer_b_without_dims(ex):
    with pytest.raises(TypeError, match=r"^b: expected a hologram Buffer"):
        ops.gemm(ex, ex.allocate((2, 3)), np.ones((3, 4), np.float32), ex.allocate((2, 4)))


def test_error_negative_or_bad_gemm_dims(ex):
    a, b, c = ex.allocate((2, 3)), ex.allocate((3, 4)), ex.allocate((2, 4))
    for dim in ("m", "k"):
        with pytest.raises(ShapeError, match=rf"^{dim}: must be >= 0"):
            ops.gemm(ex, a, b, c, **{"m": 2, "k": 3, "n": 4, dim: -1})
        with pytest.raises(TypeError, match=rf"^{dim}: expected an int"):
            ops.gemm(ex, a, b, c, **{"m": 2, "k": 3, "n": 4, dim: 1.5})
    with pytest.raises(ShapeError, match="^m: must be >= 0"):
        ops.matvec(ex, a, ex.allocate(3), ex.allocate(2), m=-2, n=3)
    flat = ex.allocate(6)
    with pytest.raises(ShapeError, match="^m, k, n: required"):
        ops.gemm(ex, flat, flat, flat)
    with pytest.raises(ShapeError, match="^m, n: required"):
        ops.matvec(ex, flat, flat, flat)


def test_error_sizes_without_n(ex):
    a, b5, c = ex.allocate(6), ex.allocate(5), ex.allocate(6)
    with pytest.raises(ShapeError, match="^b: has 5 elements, a has 6"):
        ops.vector_add(ex, a, b5, c)
    with pytest.raises(ShapeError, match="^c: has 5 elements, expected 6"):
        ops.vector_add(ex, a, c, b5)
    with pytest.raises(ShapeError, match="^c: has 7 elements, expected 6"):
        ops.vector_neg(ex, a, ex.allocate(7))
    with pytest.raises(ShapeError, match=r"^b: has 5 elements, needs 6 \[6\]"):
        ops.vector_add(ex, ex.allocate(10), b5, ex.allocate(10), n=6)
    with pytest.raises(ShapeError, match="^target: has 5 elements, pred has 6"):
        ops.mse_loss(ex, a, b5, ex.allocate(1))
    with pytest.raises(ShapeError, match="^target: has 5 elements, logits has 6"):
        ops.cross_entropy_loss(ex, a, b5, ex.allocate(1))
    with pytest.raises(ShapeError, match="^out: has 0 elements"):
        ops.reduce_sum(ex, a, ex.allocate(0))
    with pytest.raises(ShapeError, match="^out: has 5 elements, needs 6"):
        ops.mse_loss(ex, a, c, b5, reduction="none")
    with pytest.raises(ShapeError, match=r"^out: has 3 elements, needs 4 \[4\]"):
        ops.reduce_max(ex, ex.allocate((3, 4)), ex.allocate(3), axis=0)
    with pytest.raises(ShapeError, match=r"^out: has 1 elements, needs 2"):
        ops.cross_entropy_loss(ex, ex.allocate((2, 3)), ex.allocate((2, 3)), ex.allocate(1),
                               reduction="none")


def test_error_bad_reduction(ex):
    a, b, out = ex.allocate(4).fill(0.5), ex.allocate(4).fill(0.5), ex.allocate(4)
    for loss in (ops.mse_loss, ops.binary_cross_entropy_loss, ops.cross_entropy_loss):
        for bad in ("avg", "MEAN", None, ""):
            with pytest.raises(ValueError, match="^reduction: expected one of"):
                loss(ex, a, b, out, reduction=bad)


def test_error_unhashable_option_names_the_argument(ex):
    a, b, out = ex.allocate(4), ex.allocate(4), ex.allocate(4)
    with pytest.raises((TypeError, ValueError), match="^reduction:"):
        ops.mse_loss(ex, a, b, out, reduction=["mean"])
    with pytest.raises((TypeError, ValueError), match="^approximate:"):
        ops.gelu(ex, a, out, approximate=["tanh"])


def test_error_bad_axis(ex):
    a2, out = ex.allocate((3, 4)), ex.allocate(12)
    for op in (ops.reduce_sum, ops.reduce_max, ops.reduce_min, ops.softmax, ops.log_softmax):
        for axis in (2, -3, 100):
            with pytest.raises(ShapeError, match="^axis: .*out of range"):
                op(ex, a2, out, axis=axis)
        for axis in (0.0, "0", (0,), True):
            with pytest.raises(TypeError, match="^axis: expected an int"):
                op(ex, a2, out, axis=axis)
    with pytest.raises(ShapeError, match="^axis:"):
        ops.softmax(ex, ex.allocate(3), ex.allocate(3), axis=1)


def test_numpy_integers_for_axis_and_classes(ex):
    a = put(ex, np.arange(6.0).reshape(2, 3))
    out = ex.allocate(3, np.float64)
    ops.reduce_sum(ex, a, out, axis=np.int64(0))
    np.testing.assert_array_equal(out.to_numpy(), [3.0, 5.0, 7.0])
    ops.cross_entropy_loss(ex, a, a, ex.allocate(1, np.float64), n=np.int64(6),
                           classes=np.int64(3))


def test_error_bad_gelu_approximate(ex):
    a, c = ex.allocate(4), ex.allocate(4)
    for bad in ("exact", "TANH", None, ""):
        with pytest.raises(ValueError, match="^approximate: expected 'tanh' or 'none'"):
            ops.gelu(ex, a, c, approximate=bad)


def test_error_bad_scalars(ex):
    a, c = ex.allocate(4).fill(0.0), ex.allocate(4)
    with pytest.raises(ValueError, match="^min_val: 2.0 is greater than max_val 1.0"):
        ops.vector_clip(ex, a, c, 2.0, 1.0)
    with pytest.raises(TypeError, match="^min_val: expected a number"):
        ops.vector_clip(ex, a, c, "0", 1.0)
    with pytest.raises(TypeError, match="^max_val: expected a number"):
        ops.vector_clip(ex, a, c, 0.0, None)
    for op in (ops.scalar_add, ops.scalar_mul):
        for bad in ("1", None, True, [1.0]):
            with pytest.raises(TypeError, match="^scalar: expected a number"):
                op(ex, a, c, bad)
    ops.vector_clip(ex, a, c, 0.5, 0.5)  # min == max is fine
    np.testing.assert_array_equal(c.to_numpy(), 0.5)


def test_error_bad_classes(ex):
    a, b, out = ex.allocate(6), ex.allocate(6), ex.allocate(6)
    for bad in (0, -3, 1.5, True, "3"):
        with pytest.raises(ValueError, match="^classes: expected a positive int"):
            ops.cross_entropy_loss(ex, a, b, out, classes=bad)
    with pytest.raises(ShapeError, match="^classes: 6 elements do not split into rows of 4"):
        ops.cross_entropy_loss(ex, a, b, out, classes=4)


def test_error_empty_min_max(ex):
    empty = ex.allocate(0)
    out = ex.allocate(1)
    for op in (ops.reduce_max, ops.reduce_min):
        with pytest.raises(ShapeError, match="^a: .* of an empty buffer has no identity"):
            op(ex, empty, out)
        with pytest.raises(ShapeError, match="^a: .* of an empty buffer"):
            op(ex, ex.allocate(5), out, n=0)
        with pytest.raises(ShapeError, match="^a: .* over an empty axis"):
            op(ex, ex.allocate((0, 4)), ex.allocate(4), axis=0)
    assert ops.reduce_sum(ex, empty, out) == 0.0


def test_error_aliasing(ex):
    a = put(ex, np.arange(6.0, dtype=np.float32))
    b = put(ex, np.ones(6, np.float32))
    for op in (ops.softmax, ops.log_softmax):
        with pytest.raises(AliasError, match=r"^outputs\[0\] is inputs\[0\]: in-place is only"):
            op(ex, a, a)
        with pytest.raises(AliasError, match=r"^outputs\[0\] is inputs\[0\]"):
            op(ex, a, a.reshape(2, 3))
        with pytest.raises(AliasError, match=r"^outputs\[0\] is inputs\[0\]"):
            op(ex, a.reshape(3, 2), a.reshape(3, 2), axis=0)
    for op in (ops.reduce_sum, ops.reduce_max, ops.reduce_min):
        with pytest.raises(AliasError, match=r"^outputs\[0\] partly overlaps inputs\[0\]"):
            op(ex, a, a)
        with pytest.raises(AliasError, match=r"^outputs\[0\] partly overlaps inputs\[0\]"):
            op(ex, a.reshape(2, 3), a, axis=1)
    for loss in (ops.mse_loss, ops.binary_cross_entropy_loss, ops.cross_entropy_loss):
        with pytest.raises(AliasError, match=r"^outputs\[0\] partly overlaps inputs\[0\]"):
            loss(ex, a, b, a)
        with pytest.raises(AliasError, match=r"^outputs\[0\] partly overlaps inputs\[1\]"):
            loss(ex, a, b, b, reduction="sum")
    with pytest.raises(AliasError, match=r"^outputs\[0\] .* inputs\[0\]"):
        ops.cross_entropy_loss(ex, a, b, a, reduction="none", classes=3)
    sq = put(ex, np.eye(3, dtype=np.float32))
    with pytest.raises(AliasError, match=r"^outputs\[0\] is inputs\[0\]: in-place is only"):
        ops.gemm(ex, sq, put(ex, np.ones((3, 3), np.float32)), sq)
    with pytest.raises(AliasError, match=r"^outputs\[0\] partly overlaps inputs\[1\]"):
        ops.gemm(ex, put(ex, np.ones((2, 3), np.float32)), a.reshape(3, 2), a, 2, 3, 2)
    with pytest.raises(AliasError, match=r"^outputs\[0\] is inputs\[1\]"):
        ops.matvec(ex, sq, a, a, 3, 3)
    with pytest.raises(AliasError, match=r"^outputs\[0\] partly overlaps inputs\[0\]"):
        ops.matvec(ex, sq, b, sq.reshape(9), 3, 3)
    # nothing was written by the refused calls
    np.testing.assert_array_equal(a.to_numpy(), np.arange(6.0))
    np.testing.assert_array_equal(sq.to_numpy(), np.eye(3))


def test_view_of_a_freed_buffer_is_refused(ex):
    a = put(ex, np.arange(4.0, dtype=np.float32))
    view = a.reshape(2, 2)
    a.free()
    reused = ex.allocate(4).fill(7.0)
    c = ex.allocate(4)
    with pytest.raises(BufferStateError, match="^a: "):
        ops.vector_neg(ex, view, c)
    np.testing.assert_array_equal(reused.to_numpy(), 7.0)


# --- sigmoid as a composite -------------------------------------------------------------
SIGMOID_EDGES = [0.0, -0.0, np.inf, -np.inf, np.nan, -88.7, -89.0, -100.0, -745.0, -746.0,
                 -1e30, 30.0, 100.0, 1e30, 1e-30, -1e-30]


@pytest.mark.parametrize("dtype", DTYPES)
def test_sigmoid_is_numpy_one_over_one_plus_exp(ex, rng, dtype):
    """ops.sigmoid is the composite 1 / (1 + exp(-x)): the same bits as NumPy's
    expression of it (and as the single SIGMOID instruction), saturating to exactly 0
    and 1, NaN propagating, and -0.0 giving 0.5."""
    x = np.concatenate([np.array(SIGMOID_EDGES, dtype), (rng.standard_normal(4096) * 40)
                        .astype(dtype)])
    a, c = put(ex, x), sentinel(ex, x.size, dtype)
    ops.sigmoid(ex, a, c)
    got = c.to_numpy()
    with np.errstate(over="ignore"):
        want = dtype(1) / (dtype(1) + np.exp(-x))
    exact = ref_sigmoid(x.astype(np.float64))
    assert_close(got, exact, dtype)
    # relative accuracy holds into the tail (tiny results), where atol would hide it
    info = np.finfo(dtype)
    normal = np.isfinite(exact) & (exact >= info.tiny) & (want != 0)
    rel = np.abs(got[normal] - exact[normal]) / exact[normal]
    assert rel.max() <= 4 * info.eps, rel.max()
    np.testing.assert_array_equal(got == 0, want == 0)  # saturates where NumPy's form does
    assert got[4] != got[4]  # NaN
    np.testing.assert_array_equal(got[[0, 1, 2, 3, 8, 9, 10, 12, 13]],
                                  [0.5, 0.5, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    # the primitive instruction, through the same executor, gives the same bits
    from hologram.isa import builder as b

    p = b.program(lambda v: v.sigmoid(), [("f32" if dtype is np.float32 else "f64", x.shape)])
    prim = np.empty_like(x)
    ex.launch(p, [x], [prim])
    np.testing.assert_array_equal(got.view(f"u{x.itemsize}"), prim.view(f"u{x.itemsize}"))


def test_sigmoid_fuses_its_four_primitives_into_one_launch():
    """Written as neg, exp, add, div, sigmoid counts as a composite of 4 launches that
    fusion makes 1 (75% fewer), and the canonicalizer keeps the expression as traced
    (only the commutative add's constant moves last)."""
    from hologram.isa import builder as b
    from hologram.isa.opcodes import Op
    from hologram.ops import composites as C

    with hg.Executor("cpu") as ex:
        p = b.program(C.sigmoid, [("f32", (1000,))])
        compiled = ex.compile(p)
        st = getattr(compiled, "stats", None)
        if st is None:
            pytest.skip("no C compiler: the cpu backend is the reference interpreter")
        assert (st.launches_before, st.launches_after) == (4, 1)
        assert st.launch_reduction >= 0.75
        ops_left = [v.op for v in compiled.canonical.instructions]
        for op in (Op.NEG, Op.EXP, Op.ADD, Op.DIV):
            assert op in ops_left
