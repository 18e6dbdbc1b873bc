"""``hg.numpy``, the Array API namespace: every standard name is there; each case runs
on NumPy arrays (eagerly) and inside ``@hg.jit`` (traced), and both match
``array-api-strict`` (the standard's reference namespace) in values and dtype, on
fresh random inputs with NaN, inf, zero-size and non-contiguous arrays."""

from __future__ import annotations

import numpy as np
import pytest

import hologram as hg
from hologram.array_api import standard
from hologram.npjit.errors import NumpyUnsupportedError

xp = hg.numpy
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

try:
    import array_api_strict as strict
except ImportError:  # the strict comparison needs the dev extra; the rest runs anyway
    strict = None


def _data(kind: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "f32" or kind == "f64":
        a = (rng.standard_normal((5, 7)) * 3).astype(np.float32 if kind == "f32" else np.float64)
        a[0, :3] = [np.nan, np.inf, -np.inf]
        a[1, 1] = 0.0
        return a
    if kind == "pos":  # positive floats (roots and logs without NaN)
        return rng.uniform(0.1, 4.0, (5, 7)).astype(np.float32)
    if kind == "i32" or kind == "i64":
        return rng.integers(-9, 10, (5, 7)).astype(np.int32 if kind == "i32" else np.int64)
    if kind == "bool":
        return rng.random((5, 7)) > 0.5
    if kind == "strided":  # a non-contiguous view
        return (rng.standard_normal((10, 14)).astype(np.float32))[::2, ::2]
    if kind == "empty":
        return np.zeros((0, 7), np.float32)
    raise AssertionError(kind)


# name -> (function of (namespace, *arrays), input kinds)
CASES = {
    "abs": (lambda m, a: m.abs(a), ["f32", "i32"]),
    "acos": (lambda m, a: m.acos(m.clip(a, min=-1.0, max=1.0)), ["f32"]),
    "add_scalar": (lambda m, a: m.add(a, 2), ["f32", "i64"]),
    "atan2": (lambda m, a, b: m.atan2(a, b), ["f32", "f32"]),
    "copysign": (lambda m, a, b: m.copysign(a, b), ["f64", "f64"]),
    "hypot": (lambda m, a, b: m.hypot(a, b), ["f32", "f32"]),
    "logaddexp": (lambda m, a, b: m.logaddexp(a, b), ["f32", "f32"]),
    "pow": (lambda m, a: m.pow(a, 2.0), ["f32"]),
    "sqrt_log": (lambda m, a: m.log1p(m.sqrt(a)) + m.log2(a) - m.log10(a), ["pos"]),
    "floor_int": (lambda m, a: m.floor(a), ["i32"]),
    "trunc_round": (lambda m, a: m.trunc(a) + m.round(a) + m.ceil(a), ["f32"]),
    "sign": (lambda m, a: m.sign(a), ["f32"]),
    "signbit": (lambda m, a: m.signbit(a), ["f64"]),
    "compare": (lambda m, a, b: m.logical_and(m.less(a, b), m.not_equal(a, 0.0)),
                ["f32", "f32"]),
    "logical": (lambda m, a, b: m.logical_xor(a, m.logical_not(b)), ["bool", "bool"]),
    "bitwise": (lambda m, a: m.bitwise_xor(m.bitwise_and(a, m.flip(a, axis=1)),
                                           m.bitwise_or(a, m.bitwise_invert(m.flip(a, axis=0)))),
                ["i32", "i64", "bool"]),
    # the standard leaves negative counts undefined: counts here are in [0, 7]
    "shifts": (lambda m, a: m.bitwise_left_shift(a, m.bitwise_and(m.flip(a, axis=0), 7))
               + m.bitwise_right_shift(a, m.bitwise_and(a, 3)), ["i32", "i64"]),
    "shift_scalar": (lambda m, a: m.bitwise_right_shift(m.bitwise_left_shift(a, 29), 1),
                     ["i32", "i64"]),
    "isfinite": (lambda m, a: m.logical_or(m.isnan(a), m.isinf(a)), ["f32"]),
    "divide_int": (lambda m, a: m.divide(a, 4), ["i32"]),
    "maximum": (lambda m, a, b: m.maximum(a, b), ["f32", "f32"]),
    "clip": (lambda m, a: m.clip(a, min=-1.0, max=2.0), ["f32", "strided"]),
    "clip_min_only": (lambda m, a: m.clip(a, min=0.5), ["f64"]),
    "clip_int": (lambda m, a: m.clip(a, min=-3, max=4), ["i32"]),
    "astype": (lambda m, a: m.astype(a, m.int32), ["pos"]),
    "astype_bool": (lambda m, a: m.astype(a, m.float64), ["bool"]),
    "where": (lambda m, a, b: m.where(m.greater(a, 0.0), a, b), ["f32", "f32"]),
    "sum": (lambda m, a: m.sum(a, axis=1), ["f32", "i32", "empty"]),
    "sum_int_dtype": (lambda m, a: m.sum(a), ["i32"]),
    "prod_keepdims": (lambda m, a: m.prod(a, axis=0, keepdims=True), ["pos"]),
    "mean": (lambda m, a: m.mean(a, axis=0), ["f64", "strided"]),
    "std_correction": (lambda m, a: m.std(a, axis=1, correction=1), ["pos"]),
    "var": (lambda m, a: m.var(a, axis=(0, 1)), ["pos"]),
    "max_min": (lambda m, a: m.max(a, axis=1) - m.min(a, axis=1), ["f32", "i64"]),
    "argmax": (lambda m, a: m.argmax(a, axis=1), ["pos"]),
    "argmin_keepdims": (lambda m, a: m.argmin(a, axis=0, keepdims=True), ["pos"]),
    "all_any": (lambda m, a: m.logical_and(m.all(a, axis=0), m.any(a, axis=0)), ["bool"]),
    "cumulative_sum": (lambda m, a: m.cumulative_sum(a, axis=1), ["pos", "i32"]),
    "cumulative_sum_initial": (lambda m, a: m.cumulative_sum(a, axis=0, include_initial=True),
                               ["pos"]),
    "cumulative_prod": (lambda m, a: m.cumulative_prod(a, axis=1, include_initial=True),
                        ["pos"]),
    "sort_descending": (lambda m, a: m.sort(a, axis=1, descending=True), ["pos"]),
    "argsort_descending_ties": (lambda m, a: m.argsort(a, axis=1, descending=True), ["i32"]),
    "argsort": (lambda m, a: m.argsort(a, axis=0), ["i32"]),
    "matmul": (lambda m, a, b: m.matmul(a, m.matrix_transpose(b)), ["pos", "pos"]),
    "tensordot": (lambda m, a, b: m.tensordot(a, b, axes=([1], [1])), ["pos", "pos"]),
    "vecdot": (lambda m, a, b: m.vecdot(a, b), ["pos", "pos"]),
    "vecdot_axis": (lambda m, a, b: m.vecdot(a, b, axis=-2), ["pos", "pos"]),
    "vector_norm": (lambda m, a: m.linalg.vector_norm(a, axis=1), ["pos"]),
    "vector_norm_all": (lambda m, a: m.linalg.vector_norm(a, keepdims=True), ["pos"]),
    "concat": (lambda m, a, b: m.concat([a, b], axis=1), ["f32", "f32"]),
    "concat_flat": (lambda m, a, b: m.concat((a, b), axis=None), ["f32", "f32"]),
    "stack": (lambda m, a, b: m.stack((a, b), axis=1), ["f32", "f32"]),
    "unstack": (lambda m, a: m.unstack(a, axis=1)[2], ["f32"]),
    "permute_dims": (lambda m, a: m.permute_dims(m.reshape(a, (7, 5, 1)), (2, 0, 1)),
                     ["f32"]),
    "expand_squeeze": (lambda m, a: m.squeeze(m.expand_dims(a, axis=0), axis=0), ["f32"]),
    "broadcast_arrays": (lambda m, a, b: m.add(*m.broadcast_arrays(a[:1, :], b)),
                         ["f32", "f32"]),
    "broadcast_to": (lambda m, a: m.broadcast_to(a[:, :1], (5, 7)), ["f32"]),
    "flip_roll": (lambda m, a: m.roll(m.flip(a, axis=0), 2, axis=1), ["f32"]),
    "moveaxis": (lambda m, a: m.moveaxis(m.reshape(a, (5, 7, 1)), 0, 2), ["f32"]),
    "repeat_tile": (lambda m, a: m.tile(m.repeat(a, 2, axis=0), (1, 2)), ["f32"]),
    "take": (lambda m, a: m.take(a, m.asarray([4, 0, 2]), axis=0), ["f32"]),
    "take_along_axis": (lambda m, a: m.take_along_axis(a, m.argsort(a, axis=1), axis=1),
                        ["pos"]),
    "tril_triu": (lambda m, a: m.tril(a) + m.triu(a, k=1), ["f32"]),
    "zeros_like": (lambda m, a: m.add(m.zeros_like(a), m.ones_like(a)), ["f32"]),
    "full_like": (lambda m, a: m.full_like(a, 3), ["i32"]),
    "diff": (lambda m, a: m.diff(a, axis=1), ["f32"]),
    "count_nonzero": (lambda m, a: m.count_nonzero(a, axis=1), ["bool"]),
}


#: cases the standard leaves undefined (array-api-strict refuses them): NumPy's result
NOT_IN_STANDARD = {"divide_int"}


def _args(kinds: list[str], seed: int) -> list[np.ndarray]:
    return [_data(k, seed + i) for i, k in enumerate(kinds)]


def _cases():
    for name, (fn, kinds) in CASES.items():
        if len(set(kinds)) == 1 or len(kinds) > 1 and kinds[0] == kinds[1]:
            yield pytest.param(name, fn, kinds, id=name)
        else:  # one input each of several kinds: one case per kind
            for k in kinds:
                yield pytest.param(name, fn, [k], id=f"{name}-{k}")


def _same(got, want) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    if want.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=2e-5 if want.dtype == np.float32 else 1e-12,
                                   atol=1e-5, equal_nan=True)
    else:
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(("name", "fn", "kinds"), list(_cases()))
def test_case_eager_traced_and_strict(name, fn, kinds):
    args = _args(kinds, seed=len(name))
    eager = fn(xp, *args)
    assert isinstance(eager, np.ndarray | np.generic)
    traced = hg.jit(lambda *a: fn(a[0].__array_namespace__(), *a))(*args)
    _same(traced, eager)
    if strict is not None and name not in NOT_IN_STANDARD:
        want = fn(strict, *(strict.asarray(a) for a in args))
        _same(eager, np.asarray(want))


def test_every_standard_name_is_in_the_namespace():
    for name in (*standard.FUNCTIONS, *standard.DTYPES, *standard.CONSTANTS):
        assert hasattr(xp, name), name
    for name in standard.LINALG_EXTENSION:
        assert callable(getattr(xp.linalg, name)), name
    import hologram.numpy as via_import

    assert via_import.concat is xp.concat
    if strict is not None:  # and nothing the reference namespace has is missing
        theirs = {n for n in strict.__all__ if "strictflags" not in n.replace("_", "").lower()
                  and n not in ("Device", "__version__")}
        assert theirs <= set(dir(xp)), sorted(theirs - set(dir(xp)))


def test_namespace_of_a_traced_value():
    seen = []

    @hg.jit
    def f(x):
        seen.append(x.__array_namespace__())
        return x

    f(np.ones(3, np.float32))
    assert seen == [hg.array_api]
    with pytest.raises(ValueError, match="api_version"):
        hg.jit(lambda x: x.__array_namespace__(api_version="2021.12"))(np.ones(2))


def test_data_dependent_functions_work_eagerly_and_are_refused_traced():
    a = np.array([3, 1, 3, 2], np.int64)
    np.testing.assert_array_equal(np.sort(xp.unique_values(a)), [1, 2, 3])
    np.testing.assert_array_equal(xp.nonzero(a > 2)[0], [0, 2])
    with pytest.raises(NumpyUnsupportedError, match="nonzero"):
        hg.jit(lambda x: xp.nonzero(x))(a)


def test_bad_arguments_name_the_function_and_argument():
    with pytest.raises(hg.errors.ArgumentTypeError, match="astype: device"):
        xp.astype(np.ones(2), xp.float32, device="gpu")
    with pytest.raises(ValueError, match="matrix_transpose: x"):
        xp.matrix_transpose(np.ones(3))
    with pytest.raises(ValueError, match="cumulative_sum: axis"):
        xp.cumulative_sum(np.ones((2, 2)))
    with pytest.raises(ValueError, match="copy=False"):
        hg.jit(lambda x: xp.asarray(x, dtype=xp.float64, copy=False))(np.ones(2, np.float32))


def test_asarray_and_astype_copy_semantics():
    a = np.arange(4.0)
    assert xp.asarray(a) is a
    assert xp.asarray(a, copy=True) is not a
    assert xp.astype(a, xp.float64, copy=False) is a
    b = xp.astype(a, xp.float64)
    b[0] = 9
    assert a[0] == 0
