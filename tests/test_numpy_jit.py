"""``@hg.jit`` on plain NumPy code, checked against NumPy itself.

Every idiom of ``numpy_idioms.IDIOMS`` runs over float16, float32, float64, every integer dtype
(int8 to int64, uint8 to uint64) and bool (those NumPy accepts), on a 5x7 array holding
NaN, inf and -0.0 (or an 8/16-bit dtype's maximum), a 0x7 array and a non-contiguous
view, and for two-operand idioms also against a broadcast operand.
The reference backend (NumPy's own interpreter of the ISA) checks the tracing of
each; the compiled CPU backend runs every idiom too, all of one dtype in one program
(one compile each). Unsupported idioms must raise NumpyUnsupportedError naming the
NumPy function at trace time.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hologram as hg
from hologram.errors import DTypeError, NumpyUnsupportedError
from hologram.npjit.dtypes import TRACEABLE

from .numpy_idioms import BINARY_UFUNCS, IDIOMS, UNARY_UFUNCS, UNSUPPORTED, Idiom

DTYPES = [np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8,
          np.uint16, np.uint32, np.uint64, np.bool_]


def _data(dtype: type, shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    d = np.dtype(dtype)
    if d.kind == "f":
        x = rng.standard_normal(shape).astype(d)
        flat = x.reshape(-1)
        specials = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0]
        for i, v in enumerate(specials[: flat.size // 4]):
            flat[(7 * i + 3) % flat.size] = v
        return x
    if d.kind == "b":
        return rng.random(shape) > 0.5
    # small values (unsigned: 0..10), and for 8- and 16-bit dtypes the maximum too, where
    # NumPy's arithmetic wraps (x + x, x * x, x ** 2); the random integer programs of
    # test_differential cover the whole range of every integer dtype
    x = rng.integers(-5 if d.kind == "i" else 0, 6 if d.kind == "i" else 11, shape).astype(d)
    if d.itemsize <= 2 and x.size:
        x.reshape(-1)[x.size // 2] = np.iinfo(d).max
    return x


def _cases(idiom: Idiom, dtype: type) -> list[tuple[str, tuple[np.ndarray, ...]]]:
    x = _data(dtype, (5, 7), 1)
    nc = _data(dtype, (5, 14), 2)[:, ::2]  # non-contiguous
    zero = _data(dtype, (0, 7), 3)
    if idiom.arity == 1:
        cases = [("5x7", (x,)), ("view", (nc,)), ("0x7", (zero,))]
    else:
        y = _data(dtype, (5, 7), 4)
        cases = [("5x7", (x, y)), ("bcast", (x, _data(dtype, (7,), 5))),
                 ("col", (_data(dtype, (5, 1), 6), nc)), ("0x7", (zero, zero))]
    return [(n, a) for n, a in cases if a[0].shape[0] >= idiom.min_rows]


def _expected(idiom: Idiom, args: tuple[np.ndarray, ...]):
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return idiom.fn(*(a.copy() for a in args))
        except (TypeError, ValueError, IndexError, OverflowError, np.exceptions.AxisError):
            return None  # NumPy itself rejects this dtype or shape


def _leaves(r):
    return list(r) if isinstance(r, (tuple, list)) else [r]


def _traceable(exp) -> bool:
    return all(np.asarray(e).dtype in TRACEABLE for e in _leaves(exp))


def _check(got, exp, what: str) -> None:
    gl, el = _leaves(got), _leaves(exp)
    assert len(gl) == len(el), what
    for g, e in zip(gl, el, strict=True):
        e = np.asarray(e)
        assert g.shape == e.shape, f"{what}: shape {g.shape} != {e.shape}"
        assert g.dtype == e.dtype, f"{what}: dtype {g.dtype} != {e.dtype}"
        if e.dtype.kind == "f":
            # float16: hologram's sums and scans accumulate in float32, where NumPy
            # rounds partial sums to float16 in some layouts (np.sum over axis 0) and in
            # every cumulative op; element-wise ops match bit for bit (below)
            tol = {np.float16: 1e-2, np.float32: 2e-5}.get(e.dtype.type, 1e-9)
            np.testing.assert_allclose(g, e, rtol=tol, atol=tol, equal_nan=True, err_msg=what)
        else:
            np.testing.assert_array_equal(g, e, err_msg=what)


@pytest.mark.parametrize("idiom", IDIOMS, ids=[i.name for i in IDIOMS])
def test_idiom_matches_numpy(idiom: Idiom) -> None:
    ran = 0
    for dtype in DTYPES:
        if np.dtype(dtype).kind in idiom.skip:
            continue
        for case, args in _cases(idiom, dtype):
            exp = _expected(idiom, args)
            if exp is None:
                continue
            what = f"{idiom.name} {np.dtype(dtype)} {case}"
            f = hg.jit(idiom.fn, backend="reference")
            if not _traceable(exp) or np.dtype(dtype).kind in idiom.refuses:
                with pytest.raises(NumpyUnsupportedError):
                    f(*args)
                continue
            with np.errstate(all="ignore"):
                _check(f(*args), exp, what)
            ran += 1
    assert ran, f"{idiom.name}: NumPy accepted no dtype"


def test_idiom_table_is_large() -> None:
    assert len({i.name for i in IDIOMS}) >= 150


def _group(dtype: type, shape: tuple[int, ...]) -> list[tuple[Idiom, tuple, object]]:
    out = []
    for idiom in IDIOMS:
        args = (_data(dtype, shape, 1),) if idiom.arity == 1 else (
            _data(dtype, shape, 1), _data(dtype, shape[1:], 5))
        if args[0].shape[0] < idiom.min_rows:
            continue
        kind = np.dtype(dtype).kind
        if kind in idiom.skip or kind in idiom.refuses:
            continue
        exp = _expected(idiom, args)
        if exp is not None and _traceable(exp):
            out.append((idiom, args, exp))
    return out


@pytest.mark.parametrize("shape", [(5, 7), (0, 7)], ids=["5x7", "0x7"])
@pytest.mark.parametrize("dtype", DTYPES, ids=[np.dtype(d).name for d in DTYPES])
def test_idioms_compiled_cpu(dtype: type, shape: tuple[int, ...]) -> None:
    """All idioms of one dtype in ONE compiled program: fused, rendered as C, run."""
    group = _group(dtype, shape)
    x, y = _data(dtype, shape, 1), _data(dtype, shape[1:], 5)

    def all_idioms(x, y):
        outs = []
        for idiom, _, _ in group:
            r = idiom.fn(x) if idiom.arity == 1 else idiom.fn(x, y)
            outs.extend(_leaves(r))
        return tuple(outs)

    got = iter(hg.jit(all_idioms)(x, y))
    for idiom, _, exp in group:
        el = _leaves(exp)
        with np.errstate(all="ignore"):
            _check([next(got) for _ in el], el, f"{idiom.name} {np.dtype(dtype)} cpu")


@pytest.mark.parametrize("name,fn,needle", UNSUPPORTED, ids=[u[0] for u in UNSUPPORTED])
def test_unsupported_idiom_raises_clear_error(name, fn, needle) -> None:
    x = _data(np.float32, (5, 7), 1)
    with pytest.raises(NumpyUnsupportedError, match=None) as info:
        hg.jit(fn, backend="reference")(x)
    msg = str(info.value)
    assert "@hg.jit" in msg and needle in msg, msg


# --- captured constants and the cache key --------------------------------------------
SCALE = 2.0
TABLE = np.arange(7, dtype=np.float32)


def test_captured_scalar_rebound_retraces() -> None:
    global SCALE
    f = hg.jit(lambda x: x * SCALE)
    x = np.ones((2, 7), np.float32)
    np.testing.assert_array_equal(f(x), 2 * x)
    SCALE = 3.0
    try:
        np.testing.assert_array_equal(f(x), 3 * x)
    finally:
        SCALE = 2.0


def test_captured_array_mutation_and_rebinding() -> None:
    global TABLE
    f = hg.jit(lambda x: x + TABLE)
    x = np.zeros((2, 7), np.float32)
    np.testing.assert_array_equal(f(x)[0], np.arange(7))
    prog, arrays = f.program_for(x)
    assert len(prog.inputs) == 1 and len(arrays) == 1  # 7 elements: constants, no input
    TABLE[0] = 100  # in place: the baked contents changed, so a new trace
    saved = TABLE
    try:
        np.testing.assert_array_equal(f(x)[0, 0], 100)
        TABLE = np.full(7, -1, np.float32)  # rebound: a new trace
        np.testing.assert_array_equal(f(x)[0], -np.ones(7))
    finally:
        TABLE = saved
        TABLE[0] = 0
    np.testing.assert_array_equal(f(x)[0], np.arange(7))


class _Model:
    def __init__(self) -> None:
        self.taps = np.array([0.25, 0.5, 0.25])


def test_small_captured_array_changed_in_place_gives_the_new_result() -> None:
    """A stencil's taps reached through an attribute (no guard watches ``self.taps``):
    the baked contents are compared at each call, so changing them retraces."""
    m = _Model()
    f = hg.jit(lambda x: x[:-2] * m.taps[0] + x[1:-1] * m.taps[1] + np.sum(
        x[:, None] * m.taps, axis=1)[2:])
    x = np.random.default_rng(0).standard_normal(12)

    def want(x):
        return x[:-2] * m.taps[0] + x[1:-1] * m.taps[1] + np.sum(x[:, None] * m.taps,
                                                                   axis=1)[2:]
    np.testing.assert_allclose(f(x), want(x), rtol=1e-12)
    m.taps[1] = -3.0
    m.taps[2] = np.nan
    np.testing.assert_allclose(f(x), want(x), rtol=1e-12)
    m.taps[2] = -0.0  # NaN -> -0.0 and 0.0 -> -0.0 are changes too
    np.testing.assert_allclose(f(x), want(x), rtol=1e-12)


def test_equal_small_captured_arrays_share_one_compiled_program() -> None:
    """The constants are the program's: equal contents, equal program, one compile."""
    w1 = np.array([1.0, -2.0, 3.5], np.float32)
    w2 = w1.copy()
    f = hg.jit(lambda x: np.tanh(x * w1))
    g = hg.jit(lambda x: np.tanh(x * w2))
    x = np.ones((4, 3), np.float32)
    pf, pg = f.program_for(x)[0], g.program_for(x)[0]
    assert pf.hash == pg.hash and len(pf.inputs) == 1
    ex = hg.default_executor("cpu")
    assert ex.compile(pf) is ex.compile(pg)
    np.testing.assert_allclose(g(x), np.tanh(x * w2), rtol=1e-6)
    w3 = np.array([1.0, -2.0, 3.25], np.float32)  # other contents: another program
    assert hg.jit(lambda x: np.tanh(x * w3)).program_for(x)[0].hash != pf.hash


def test_uniform_small_captured_array_folds_away() -> None:
    """A captured array of ones is one constant: x * ones is x after canonicalization."""
    from hologram.compiler.canonicalize import canonicalize

    ones = np.ones(5, np.float32)
    f = hg.jit(lambda x: x * ones + 1)
    x = np.zeros((2, 5), np.float32)
    canon = canonicalize(f.program_for(x)[0])[0]
    assert "mul" not in str(canon) and "concat" not in str(canon)
    np.testing.assert_array_equal(f(x), x * ones + 1)


def test_small_captured_index_and_bool_arrays_are_constants() -> None:
    idx = np.array([3, 0, 2])
    mask = np.array([True, False, True, True, False, False, True])
    f = hg.jit(lambda x: (x[:, idx], np.where(mask, x, -x)))
    x = np.arange(14, dtype=np.int64).reshape(2, 7)
    prog, _ = f.program_for(x)
    assert len(prog.inputs) == 1
    for g, e in zip(f(x), (x[:, idx], np.where(mask, x, -x)), strict=True):
        np.testing.assert_array_equal(g, e)
    idx[0] = 6
    np.testing.assert_array_equal(f(x)[0], x[:, idx])


def test_closure_cell_rebound_retraces() -> None:
    bias = np.float32(1)

    def g(x):
        return x + bias

    f = hg.jit(g)
    x = np.zeros(3, np.float32)
    assert f(x)[0] == 1
    bias = np.float32(5)  # noqa: F841  (rebinds the cell g reads)
    assert f(x)[0] == 5


def test_large_captured_array_is_a_hidden_input() -> None:
    from hologram.npjit.lift import SMALL_CONSTANT

    w = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    assert w.size > SMALL_CONSTANT
    f = hg.jit(lambda x: x @ w)
    a = np.random.default_rng(1).standard_normal((8, 64)).astype(np.float32)
    prog, arrays = f.program_for(a)
    assert len(prog.inputs) == 2 and arrays[1] is w
    assert "const" not in str(prog).split("gemm")[0].split("ldg")[-1]
    np.testing.assert_allclose(f(a), a @ w, rtol=1e-5, atol=1e-5)


def test_integer_and_bool_arguments_and_results() -> None:
    f = hg.jit(lambda i, m: (np.where(m, i * 2, -i), np.cumsum(i), i.argmax(), ~m))
    i = np.arange(-3, 5, dtype=np.int64)
    m = i % 2 == 0
    got = f(i, m)
    exp = (np.where(m, i * 2, -i), np.cumsum(i), i.argmax(), ~m)
    for g, e in zip(got, exp, strict=True):
        assert g.dtype == np.asarray(e).dtype
        np.testing.assert_array_equal(g, e)


def test_composites_keep_numpy_semantics() -> None:
    from hologram.ops import composites as F

    f = hg.jit(lambda x: np.log1p(F.gelu_tanh(x) ** 2) + np.float64(0))
    x = np.linspace(-3, 3, 12, dtype=np.float32)
    r = f(x)
    assert r.dtype == np.float64  # NumPy's rule: a float64 scalar promotes


# --- hypothesis: random expressions over the traced ufuncs ----------------------------
UNARY = ["negative", "absolute", "exp", "log1p", "tanh", "sin", "sqrt", "floor", "square",
         "expm1", "arctan", "cbrt"]
BINARY = ["add", "subtract", "multiply", "divide", "maximum", "minimum", "hypot",
          "logaddexp", "fmax", "copysign", "arctan2", "remainder"]


def _expr():
    leaf = st.sampled_from(["x", "y", "1.5", "-0.25"])
    return st.recursive(leaf, lambda inner: st.one_of(
        st.tuples(st.sampled_from(UNARY), inner).map(lambda t: f"np.{t[0]}({t[1]})"),
        st.tuples(st.sampled_from(BINARY), inner, inner).map(
            lambda t: f"np.{t[0]}({t[1]}, {t[2]})"),
        st.tuples(inner, inner).map(lambda t: f"np.where({t[0]} > {t[1]}, {t[0]}, {t[1]})"),
        inner.map(lambda e: f"np.sum({e}, axis=1, keepdims=True)"),
    ), max_leaves=6)


@settings(max_examples=40)
@given(_expr(), st.sampled_from([np.float32, np.float64]), st.integers(0, 3))
def test_random_expressions_match_numpy(expr: str, dtype: type, seed: int) -> None:
    fn = eval(f"lambda x, y: {expr} + 0 * x", {"np": np})  # noqa: S307
    x, y = _data(dtype, (3, 4), seed), _data(dtype, (4,), seed + 9)
    exp = _expected(Idiom(expr, fn, 2), (x, y))
    if exp is None:
        return
    with np.errstate(all="ignore"):
        _check(hg.jit(fn, backend="reference")(x, y), exp, expr)


# --- integer bitwise expressions ------------------------------------------------------
def _int_expr():
    leaf = st.sampled_from(["x", "y", "3", "-1", "40"])
    return st.recursive(leaf, lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(["&", "|", "^", "<<", ">>", "+", "-", "*"]),
                  inner).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})"),
        inner.map(lambda e: f"(~{e})"),
        st.tuples(inner, inner).map(lambda t: f"np.maximum({t[0]}, {t[1]})"),
        st.tuples(inner, inner).map(lambda t: f"np.where(({t[0]} & 1) == 0, {t[0]}, {t[1]})"),
    ), max_leaves=6)


@settings(max_examples=40, deadline=None)
@given(_int_expr(), st.sampled_from([np.int8, np.int16, np.int32, np.int64, np.uint8,
                                     np.uint16, np.uint32, np.uint64]),
       st.integers(0, 2**32 - 1))
def test_random_bitwise_expressions_match_numpy(expr: str, dtype: type, seed: int) -> None:
    """Compiled (C) against NumPy on values over the whole range and shift counts in and
    out of [0, bits), negative ones included; +, - and * wrap as NumPy's do (a Python
    scalar NumPy cannot convert to an unsigned dtype, -1, is an error in both)."""
    fn = eval(f"lambda x, y: {expr} + 0 * x", {"np": np})  # noqa: S307
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max, (3, 5), dtype=dtype, endpoint=True)
    y = np.where(rng.random(5) < 0.7, rng.integers(-70, 71, 5), x[0]).astype(dtype)
    exp = _expected(Idiom(expr, fn, 2), (x, y))
    if exp is None:  # NumPy refuses (-1 into an unsigned dtype): so does hologram, clearly
        with pytest.raises((NumpyUnsupportedError, ValueError)):  # (3 << ~3: Python's own)
            hg.jit(fn)(x, y)
        return
    _check(hg.jit(fn)(x, y), exp, expr)


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.uint8, np.uint16, np.uint32,
                                   np.uint64])
def test_narrow_and_unsigned_integers_wrap_as_numpy_does(dtype: type) -> None:
    """Arithmetic in the dtype wraps modulo 2**bits (NumPy's rule), on the compiled CPU
    backend; sums accumulate in NumPy's default dtype (int64 or uint64)."""
    info = np.iinfo(dtype)
    x = np.random.default_rng(3).integers(info.min, info.max, (4, 9), dtype=dtype,
                                          endpoint=True)

    def f(a):
        return a * a + (a << 3) - a, -a, a ** 3, a.sum(axis=1), a.astype(np.float32), a > 7

    with np.errstate(all="ignore"):
        _check(hg.jit(f)(x), f(x), np.dtype(dtype).name)


@pytest.mark.parametrize("dtype", [np.complex64, np.longdouble])
def test_other_dtypes_are_refused_by_name(dtype: type) -> None:
    x = np.arange(6).astype(dtype)
    with pytest.raises(DTypeError, match=f"argument 0: dtype {np.dtype(dtype).name}"):
        hg.jit(lambda a: a + a)(x)


#: Ufuncs computed by a libm function (or a formula of them): within a float32 ulp of
#: NumPy's, not always bit for bit.
LIBM = {"exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan",
        "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh", "arcsinh", "arccosh", "arctanh",
        "cbrt", "power", "float_power", "arctan2", "hypot", "logaddexp", "logaddexp2"}


def test_float16_ufuncs_match_numpy_bit_for_bit() -> None:
    """NumPy's float16 loops compute each ufunc in float32 and round its result once;
    so do hologram's programs (an f16 instruction computes in float and rounds, and a
    ufunc traced over float16 computes in float32 and is cast once). Every ufunc with a
    float16 result, compiled in one program over 4000 values with NaN, infinities,
    signed zeros, the largest and a subnormal float16: the same bits as NumPy's, signed
    zeros included, but for the maximum and minimum of +0.0 and -0.0 (IEEE leaves it
    open, and NumPy's own float16 and float32 loops pick differently). Functions of
    libm's may land on the other side of a float16 rounding boundary, where hologram's
    float32 value (libmvec's vectorized one) and NumPy's differ in the last float32
    bit: at most one float16 ulp, in under 1% of the values."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(4000) * 3).astype(np.float16)
    x[:8] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 65504.0, 6e-8, -1e-5]
    y = (rng.standard_normal(4000) * 3).astype(np.float16)
    y[:8] = [1.0, -np.inf, 2.0, -0.0, 0.0, 2.0, np.nan, 3.0]
    names = []
    with np.errstate(all="ignore"):
        for name in UNARY_UFUNCS + BINARY_UFUNCS:
            f = getattr(np, name)
            args = (x,) if f.nin == 1 else (x, y)
            try:
                if f(*args).dtype == np.float16:
                    names.append(name)
            except TypeError:  # no float16 loop (bitwise ops)
                pass

    def every_ufunc(a, b):
        return tuple(getattr(np, n)(a) if getattr(np, n).nin == 1 else getattr(np, n)(a, b)
                     for n in names)

    assert len(names) >= 50
    got = hg.jit(every_ufunc)(x, y)
    with np.errstate(all="ignore"):
        exp = every_ufunc(x, y)
    for name, g, e in zip(names, got, exp, strict=True):
        assert g.dtype == np.float16, name
        same = (g.view(np.uint16) == e.view(np.uint16)) | (np.isnan(g) & np.isnan(e))
        if name in LIBM:
            np.testing.assert_array_max_ulp(g[~same], e[~same], maxulp=1)
            assert same.mean() > 0.99, name
        elif name in ("maximum", "minimum", "fmax", "fmin"):  # +0.0 vs -0.0: either
            assert ((g == e) | (np.isnan(g) & np.isnan(e))).all(), name
        else:
            assert same.all(), f"{name}: {x[~same][:4]} -> {g[~same][:4]}, NumPy {e[~same][:4]}"
