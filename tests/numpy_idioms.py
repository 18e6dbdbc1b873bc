"""The table of NumPy idioms ``@hg.jit`` traces (tests/test_numpy_jit.py checks each
against NumPy itself).

Each idiom is a function of one or two arrays written in plain NumPy; it runs
unchanged on NumPy arrays (the expected value) and on traced values. Which dtypes
an idiom accepts is NumPy's call: the tests run it over every traceable dtype and
skip those NumPy itself rejects.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

W = np.linspace(-1.0, 1.0, 21).reshape(7, 3)  # a captured constant (hidden input)
IDX = np.array([0, 2, -1, 1])
MASK7 = np.array([True, False, True, True, False, False, True])
SORTED = np.array([-2.0, -0.5, 0.0, 0.0, 1.0, 3.0, np.nan])  # ties, and NaN (sorted last)


@dataclass(frozen=True)
class Idiom:
    name: str
    fn: Callable
    arity: int = 1
    min_rows: int = 0  # rows the first input needs (indexing idioms)
    skip: str = ""  # dtype kinds not run (NumPy's operator and ufunc disagree there)
    refuses: str = ""  # dtype kinds hologram refuses (with NumpyUnsupportedError)


UNARY_UFUNCS = [
    "negative", "positive", "absolute", "fabs", "sign", "sqrt", "cbrt", "square",
    "reciprocal", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos",
    "tan", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh", "arcsinh", "arccosh",
    "arctanh", "deg2rad", "rad2deg", "degrees", "radians", "floor", "ceil", "trunc", "rint",
    "isnan", "isinf", "isfinite", "signbit", "logical_not", "invert", "conjugate",
]
BINARY_UFUNCS = [
    "add", "subtract", "multiply", "divide", "floor_divide", "remainder", "fmod", "power",
    "float_power", "maximum", "minimum", "fmax", "fmin", "arctan2", "hypot", "copysign",
    "logaddexp", "logaddexp2", "heaviside", "equal", "not_equal", "less", "less_equal",
    "greater", "greater_equal", "logical_and", "logical_or", "logical_xor", "bitwise_and",
    "bitwise_or", "bitwise_xor", "left_shift", "right_shift",
]


def _u(name: str) -> Idiom:
    f = getattr(np, name)
    return Idiom(f"np.{name}", lambda x: f(x))


def _b(name: str) -> Idiom:
    f = getattr(np, name)
    return Idiom(f"np.{name}", lambda x, y: f(x, y), 2)


IDIOMS: list[Idiom] = [
    *(_u(n) for n in UNARY_UFUNCS),
    *(_b(n) for n in BINARY_UFUNCS),
    Idiom("np.modf", lambda x: np.modf(x)),
    Idiom("np.divmod", lambda x, y: np.divmod(x, y), 2),
    Idiom("np.ldexp", lambda x: np.ldexp(x, 3)),
    # operators and Python scalars
    Idiom("x + 1.5", lambda x: x + 1.5),
    Idiom("2 * x - 1", lambda x: 2 * x - 1),
    Idiom("x / 3", lambda x: x / 3),
    Idiom("x // 2", lambda x: x // 2),
    Idiom("x % 3", lambda x: x % 3),
    Idiom("x ** 2", lambda x: x ** 2, skip="b"),  # bool ** 2: int8 here, int64 in np.power
    Idiom("-x", lambda x: -x),
    Idiom("abs(x)", lambda x: abs(x)),
    Idiom("~(x > 0)", lambda x: ~(x > 0)),
    Idiom("(x > 0) & (x < 1)", lambda x: (x > 0) & (x < 1)),
    Idiom("(x < 0) | (x > 1)", lambda x: (x < 0) | (x > 1)),
    Idiom("(x > 0) ^ (x > 1)", lambda x: (x > 0) ^ (x > 1)),
    # bitwise operators and shifts (integers; bool's &, |, ^, ~ are logical; NumPy shifts
    # bool as int8, which hologram refuses clearly)
    Idiom("x & y", lambda x, y: x & y, 2),
    Idiom("x | 6", lambda x: x | 6),
    Idiom("np.left_shift(bool)", lambda x: np.left_shift(x > 0, x > 1)),  # int8 shifts
    Idiom("x ^ y", lambda x, y: x ^ y, 2),
    Idiom("~x", lambda x: ~x),
    Idiom("3 & ~x", lambda x: 3 & ~x),
    Idiom("x << 3", lambda x: x << 3),
    Idiom("x >> 1", lambda x: x >> 1),
    Idiom("x << y", lambda x, y: x << y, 2),  # counts in [-5, 5]: negatives saturate
    Idiom("x >> y", lambda x, y: x >> y, 2),
    Idiom("1 << (x & 7)", lambda x: 1 << (x & 7)),
    Idiom("x >> 40", lambda x: x >> 40),  # past int32's width: the sign fill
    Idiom("np.invert", lambda x: np.invert(x)),
    Idiom("np.bitwise_not", lambda x: np.bitwise_not(x)),
    Idiom("(x & 1) == 0", lambda x: (x & 1) == 0),
    Idiom("x == 0", lambda x: x == 0),
    Idiom("x != y", lambda x, y: x != y, 2),
    Idiom("x >= 0.5", lambda x: x >= 0.5),
    Idiom("x <= y", lambda x, y: x <= y, 2),
    Idiom("x @ W", lambda x: x @ W),
    Idiom("np.float32(2) * x", lambda x: np.float32(2) * x),
    Idiom("x * np.float64(0.5)", lambda x: x * np.float64(0.5)),
    # where/select/clip
    Idiom("np.where", lambda x: np.where(x > 0, x, 0)),
    Idiom("np.where(c, x, y)", lambda x, y: np.where(x > y, x, y), 2),
    Idiom("np.select", lambda x: np.select([x < 0, x > 1], [-x, x * 2], default=7)),
    Idiom("np.clip", lambda x: np.clip(x, -0.5, 0.75)),
    Idiom("x.clip(min=0)", lambda x: x.clip(min=0)),
    Idiom("np.maximum(x, 0.1)", lambda x: np.maximum(x, 0.1)),
    Idiom("np.minimum(x, 2)", lambda x: np.minimum(x, 2)),
    Idiom("np.nan_to_num", lambda x: np.nan_to_num(x)),
    Idiom("np.isclose", lambda x, y: np.isclose(x, y), 2),
    Idiom("np.round", lambda x: np.round(x, 2)),
    Idiom("np.around", lambda x: np.around(x)),
    # reductions
    Idiom("np.sum", lambda x: np.sum(x)),
    Idiom("np.sum axis=0", lambda x: np.sum(x, axis=0)),
    Idiom("x.sum(axis=1, keepdims)", lambda x: x.sum(axis=1, keepdims=True)),
    Idiom("np.sum dtype=f64", lambda x: np.sum(x, axis=-1, dtype=np.float64)),
    Idiom("np.sum where", lambda x: np.sum(x, axis=0, where=MASK7[None, :7][:, :x.shape[1]]
                                           if x.ndim == 2 and x.shape[1] == 7 else True)),
    Idiom("np.sum initial", lambda x: np.sum(x, axis=0, initial=1)),
    Idiom("np.mean", lambda x: np.mean(x, axis=0)),
    Idiom("x.mean()", lambda x: x.mean()),
    Idiom("np.var", lambda x: np.var(x, axis=0)),
    Idiom("np.var ddof=1", lambda x: np.var(x, axis=1, ddof=1)),
    Idiom("np.std", lambda x: np.std(x)),
    Idiom("x.std(axis=0, keepdims)", lambda x: x.std(axis=0, keepdims=True)),
    Idiom("np.max", lambda x: np.max(x, axis=1, initial=-5)),
    Idiom("np.min", lambda x: np.min(x, axis=1, initial=5)),
    Idiom("np.amax axis=(0,1)", lambda x: np.amax(x, axis=(0, 1), initial=-9)),
    Idiom("np.prod", lambda x: np.prod(x, axis=0)),
    Idiom("np.argmax", lambda x: np.argmax(x, axis=1) if x.shape[1] else np.argmax(x.T, 1)),
    Idiom("np.argmin", lambda x: np.argmin(x, axis=0) if x.shape[0] else np.argmin(x, 1)),
    Idiom("x.argmax() flat", lambda x: x.argmax() if x.size else x.sum()),
    Idiom("np.any", lambda x: np.any(x > 0.5, axis=0)),
    Idiom("np.all", lambda x: np.all(x, axis=1)),
    Idiom("x.any()", lambda x: x.any()),
    Idiom("np.count_nonzero", lambda x: np.count_nonzero(x, axis=0)),
    Idiom("np.ptp", lambda x: np.ptp(x, axis=1) if x.shape[1] else x.sum(1)),
    Idiom("np.cumsum", lambda x: np.cumsum(x, axis=1)),
    Idiom("np.cumsum flat", lambda x: np.cumsum(x)),
    Idiom("np.cumprod", lambda x: np.cumprod(x, axis=0)),
    Idiom("np.nansum", lambda x: np.nansum(x, axis=0)),
    Idiom("np.nanmax", lambda x: np.nanmax(x, axis=1) if x.shape[1] else x.sum(1)),
    Idiom("np.nanmin", lambda x: np.nanmin(x, axis=1) if x.shape[1] else x.sum(1)),
    Idiom("np.nanmean", lambda x: np.nanmean(x, axis=0)),
    Idiom("np.median", lambda x: np.median(x, axis=1) if x.shape[1] else x.sum(1)),
    Idiom("np.average", lambda x: np.average(x, axis=0)),
    Idiom("np.add.reduce", lambda x: np.add.reduce(x)),
    Idiom("np.maximum.reduce", lambda x: np.maximum.reduce(x) if x.shape[0] else x.sum(0)),
    Idiom("np.multiply.accumulate", lambda x: np.multiply.accumulate(x)),
    Idiom("np.subtract.outer", lambda x: np.subtract.outer(x[:, 0], x[0]) if x.size
          else x.sum()),
    Idiom("np.linalg.norm", lambda x: np.linalg.norm(x, axis=1)),
    Idiom("np.linalg.norm fro", lambda x: np.linalg.norm(x)),
    Idiom("np.linalg.norm ord=1", lambda x: np.linalg.norm(x, ord=1, axis=0)),
    # indexing
    Idiom("x[:, :5]", lambda x: x[:, :5]),
    Idiom("x[1:4]", lambda x: x[1:4]),
    Idiom("x[::2, ::-1]", lambda x: x[::2, ::-1]),
    Idiom("x[-1]", lambda x: x[-1], min_rows=1),
    Idiom("x[2, 3]", lambda x: x[2, 3], min_rows=3),
    Idiom("x[None, ..., 0]", lambda x: x[None, ..., 0]),
    Idiom("x[..., None]", lambda x: x[..., None]),
    Idiom("x[[0, 2, 4]]", lambda x: x[[0, 2, 4]], min_rows=5),
    Idiom("x[IDX]", lambda x: x[IDX], min_rows=3),
    Idiom("x[:, [1, 0]]", lambda x: x[:, [1, 0]]),
    Idiom("x[[0, 1], [1, 2]]", lambda x: x[[0, 1], [1, 2]], min_rows=2),
    Idiom("x[0, :, None][[1, 3]]", lambda x: x[0, :, None][[1, 3]], min_rows=1),
    Idiom("x[:, MASK7]", lambda x: x[:, MASK7]),
    Idiom("x[x.argmax(0), arange]", lambda x: x[np.argmax(x, 0), np.arange(x.shape[1])],
          min_rows=1),
    Idiom("np.take", lambda x: np.take(x, [3, 0], axis=1)),
    Idiom("np.take_along_axis", lambda x: np.take_along_axis(x, np.argsort(x, axis=1), 1)),
    Idiom("np.sort", lambda x: np.sort(x, axis=1)),
    Idiom("np.argsort", lambda x: np.argsort(x, axis=0, kind="stable")),
    Idiom("setitem mask", lambda x: _set_mask(x)),
    Idiom("setitem slice", lambda x: _set_slice(x)),
    Idiom("setitem fancy", lambda x: _set_fancy(x), min_rows=3),
    # shapes
    Idiom("x.T", lambda x: x.T),
    Idiom("x.astype(f64)", lambda x: x.astype(np.float64)),
    Idiom("x.astype(i32)", lambda x: np.nan_to_num(x).clip(-9, 9).astype(np.int32)),
    # integer casts keep the low bits (NumPy's astype); a float is clipped into range first
    Idiom("x.astype(u8)", lambda x: (np.nan_to_num(x).clip(0, 200) if x.dtype.kind == "f"
                                     else x).astype(np.uint8)),
    Idiom("x.astype(i8) round trip", lambda x: x.astype(np.int8).astype(x.dtype),
          skip="f"),
    Idiom("x.astype(u16) * 300", lambda x: x.astype(np.uint16) * np.uint16(300), skip="f"),
    Idiom("x.astype(i16) - x.astype(u32)", lambda x: x.astype(np.int16) - x.astype(np.uint32),
          skip="f"),
    Idiom("(x > 0).astype(f32)", lambda x: (x > 0).astype(np.float32)),
    Idiom("np.reshape", lambda x: np.reshape(x, (-1,))),
    Idiom("x.reshape(7, -1)", lambda x: x.reshape(7, -1)),
    Idiom("np.transpose", lambda x: np.transpose(x[:, :, None], (2, 0, 1))),
    Idiom("np.swapaxes", lambda x: np.swapaxes(x, 0, 1)),
    Idiom("np.moveaxis", lambda x: np.moveaxis(x[None], 0, -1)),
    Idiom("np.squeeze", lambda x: np.squeeze(x[:, None], axis=1)),
    Idiom("np.expand_dims", lambda x: np.expand_dims(x, (0, 2))),
    Idiom("np.broadcast_to", lambda x: np.broadcast_to(x[:, :1], (x.shape[0], 4))),
    Idiom("np.concatenate", lambda x: np.concatenate([x, x * 2], axis=1)),
    Idiom("np.concatenate axis=None", lambda x: np.concatenate([x, x[:1]], axis=None)),
    Idiom("np.stack", lambda x: np.stack([x, -x], axis=-1)),
    Idiom("np.hstack", lambda x: np.hstack([x, x])),
    Idiom("np.vstack", lambda x: np.vstack([x, x[:1]])),
    Idiom("np.split", lambda x: np.split(x, [2, 5], axis=1)),
    Idiom("np.array_split", lambda x: np.array_split(x, 3, axis=1)),
    Idiom("np.ravel", lambda x: np.ravel(x)),
    Idiom("x.flatten()", lambda x: x.flatten()),
    Idiom("np.flip", lambda x: np.flip(x)),
    Idiom("np.roll", lambda x: np.roll(x, 2, axis=1)),
    Idiom("np.repeat", lambda x: np.repeat(x, 2, axis=0)),
    Idiom("np.tile", lambda x: np.tile(x, (2, 1))),
    Idiom("np.diff", lambda x: np.diff(x, axis=1)),
    Idiom("np.tril", lambda x: np.tril(x)),
    Idiom("np.triu", lambda x: np.triu(x, 1)),
    Idiom("np.atleast_3d", lambda x: np.atleast_3d(x)),
    Idiom("np.zeros_like", lambda x: np.zeros_like(x) + x),
    Idiom("np.ones_like", lambda x: np.ones_like(x, dtype=np.float32)),
    Idiom("np.full_like", lambda x: np.full_like(x, 3)),
    Idiom("np.copy", lambda x: np.copy(x)),
    Idiom("np.diagonal", lambda x: np.diagonal(x)),
    Idiom("np.trace", lambda x: np.trace(x)),
    # linear algebra
    Idiom("np.matmul", lambda x: np.matmul(x, x.T)),
    Idiom("np.dot", lambda x: np.dot(x, W)),
    Idiom("np.dot 1-D", lambda x: np.dot(x[0], x[0]) if x.shape[0] else x.sum()),
    Idiom("np.einsum ij,jk", lambda x: np.einsum("ij,jk->ik", x, W)),
    Idiom("np.einsum ij->j", lambda x: np.einsum("ij->j", x)),
    Idiom("np.einsum ij,ij->i", lambda x: np.einsum("ij,ij->i", x, x)),
    Idiom("np.einsum bij,bjk", lambda x: np.einsum("bij,bjk->bik", x[None], x.T[None])),
    # (min_rows: NumPy's 'ii->i' of a 0x5 array returns 5 uninitialized values)
    Idiom("np.einsum ii->i", lambda x: np.einsum("ii->i", x[:, :5]), min_rows=5),
    Idiom("np.einsum ii (trace)", lambda x: np.einsum("ii", x[:, :5]), min_rows=5),
    Idiom("np.einsum ...j->...", lambda x: np.einsum("...j->...", x)),
    Idiom("np.einsum ...ij,jk", lambda x: np.einsum("...ij,jk->...ik", x[None], W)),
    Idiom("np.einsum ... broadcast", lambda x: np.einsum("...j,...j", x, x[:1])),
    Idiom("np.outer", lambda x: np.outer(x[:, 0] if x.shape[1] else x.sum(1), x[0]
                                         if x.shape[0] else x.sum(0))),
    Idiom("np.inner", lambda x: np.inner(x, x)),
    Idiom("np.tensordot", lambda x: np.tensordot(x, W, axes=1)),
    Idiom("np.vdot", lambda x: np.vdot(x, x)),
    Idiom("np.cross", lambda x: np.cross(x[:, :3], x[:, 3:6])),
    # composites a user writes
    Idiom("softmax", lambda x: np.exp(x - x.max(axis=1, keepdims=True))
          / np.exp(x - x.max(axis=1, keepdims=True)).sum(axis=1, keepdims=True)),
    Idiom("logsumexp", lambda x: np.log(np.sum(np.exp(x), axis=1))),
    Idiom("standardize", lambda x: (x - x.mean(0)) / (x.std(0) + 1e-6)),
    Idiom("relu", lambda x: np.maximum(x, 0)),
    # np.pad: each mode, widths beyond the axis (NumPy reflects and wraps again)
    Idiom("np.pad constant", lambda x: np.pad(x, ((1, 2), (0, 3)), constant_values=(3, -1))),
    Idiom("np.pad edge", lambda x: np.pad(x, 2, mode="edge")),
    Idiom("np.pad reflect", lambda x: np.pad(x, ((1, 9), (8, 1)), mode="reflect")),
    Idiom("np.pad symmetric", lambda x: np.pad(x, (3, 1), mode="symmetric")),
    Idiom("np.pad wrap", lambda x: np.pad(x, ((6, 0), (2, 15)), mode="wrap")),
    Idiom("stencil on np.pad edge", lambda x: _padded_stencil(x)),
    # searching sorted arrays: captured ones, and one sorted in the trace
    Idiom("np.searchsorted", lambda x: np.searchsorted(SORTED, x)),
    Idiom("np.searchsorted right", lambda x: np.searchsorted(SORTED, x, side="right")),
    Idiom("np.searchsorted traced", lambda x: np.searchsorted(np.sort(x[0]), x), min_rows=1),
    Idiom("np.digitize", lambda x: np.digitize(x, SORTED)),
    Idiom("np.digitize right, decreasing", lambda x: np.digitize(x, SORTED[::-1], right=True)),
    Idiom("np.interp", lambda x: np.interp(x, SORTED, np.arange(7.0) ** 2, left=-1.0)),
    # float16 results from other dtypes, as NumPy chooses them
    Idiom("np.exp(bool)", lambda x: np.exp(x > 0)),
    Idiom("x.astype(f16)", lambda x: x.astype(np.float16)),
    Idiom("np.float16 scalar", lambda x: x + np.float16(1) * (x > 0).astype(np.int8)),
    Idiom("np.round(bool)", lambda x: np.round(x > 0)),
]


def _set_mask(x):
    y = x.copy()
    y[y > 0.5] = 0
    return y


def _set_slice(x):
    y = x.copy()
    y[:, 1:3] = 7
    y[0] = -1 if y.shape[0] else y[0]
    return y


def _set_fancy(x):
    y = x.copy()
    y[[0, 2]] = x[1]
    y[1, [0, 3]] += 5
    return y


#: Idioms ``@hg.jit`` refuses, each with the text its error must contain.
UNSUPPORTED: list[tuple[str, Callable, str]] = [
    ("np.nonzero", lambda x: np.nonzero(x), "np.nonzero"),
    ("np.unique", lambda x: np.unique(x), "np.unique"),
    ("np.where(cond)", lambda x: np.where(x > 0), "np.where"),
    ("x[x > 0]", lambda x: x[x > 0], "__getitem__"),
    ("float(x.sum())", lambda x: x * float(x.sum()), "float()"),
    ("if x.sum() > 0", lambda x: x if x.sum() > 0 else -x, "bool()"),
    ("np.linalg.inv", lambda x: np.linalg.inv(x), "linalg.inv"),
    ("np.fft.fft", lambda x: np.fft.fft(x), "fft"),
    ("np.frexp", lambda x: np.frexp(x)[0], "np.frexp"),
    ("np.spacing", lambda x: np.spacing(x), "np.spacing"),
    ("np.sum(out=)", lambda x: np.sum(x, axis=0, out=np.empty(x.shape[1], x.dtype)), "out"),
    ("np.add(where=)", lambda x: np.add(x, 1, where=x > 0), "where"),
    ("x += 1 on an argument", lambda x: _iadd(x), "argument"),
    ("x[0] = 1 on an argument", lambda x: _setarg(x), "argument"),
    ("np.asarray(x)", lambda x: np.asarray(x), "np.asarray"),
    ("np.digitize traced bins", lambda x: np.digitize(x, x[0]), "bins"),
    ("np.interp period", lambda x: np.interp(x, SORTED, SORTED, period=2.0), "period"),
    ("np.searchsorted sorter", lambda x: np.searchsorted(x[0], x, sorter=np.arange(7)),
     "sorter"),
    ("np.pad mean", lambda x: np.pad(x, 1, mode="mean"), "mode"),
    ("np.pad odd reflect", lambda x: np.pad(x, 1, mode="reflect", reflect_type="odd"),
     "reflect_type"),
    ("np.pad traced width", lambda x: np.pad(x, x.shape[0] * 0 + x[0, 0].astype(int)),
     "pad_width"),
    ("np.einsum ii non-square", lambda x: np.einsum("ii->i", x), "einsum"),
    ("np.bitwise_count", lambda x: np.bitwise_count(x.astype(np.int32)), "np.bitwise_count"),
    ("x.reshape(5, 5)", lambda x: x.reshape(5, 5), "reshape"),
    ("np.concatenate mismatch", lambda x: np.concatenate([x, x.T], axis=0), "concatenate"),
    ("x[9]", lambda x: x[9], "out of bounds"),
    ("x[:, 0, 0]", lambda x: x[:, 0, 0], "too many indices"),
    ("np.sum(axis=3)", lambda x: np.sum(x, axis=3), "axis"),
    ("np.max of empty", lambda x: np.max(x[:0], axis=0), "np.max"),
    ("np.argmax of empty", lambda x: np.argmax(x[:, :0], axis=1), "argmax"),
    ("np.sort(order=)", lambda x: np.sort(x, order="f"), "np.sort"),
    ("np.apply_along_axis", lambda x: np.apply_along_axis(np.sum, 0, x), "apply_along_axis"),
    ("np.allclose", lambda x: x * np.allclose(x, 0), "np.allclose"),
    ("x.sort()", lambda x: x.sort(), "sort"),
    ("np.clip()", lambda x: np.clip(x), "clip"),
    ("np.repeat(x, counts)", lambda x: np.repeat(x, np.array([1, 2, 3, 1, 2, 3, 1]),
                                                 axis=1), "repeat"),
    ("x.sum(bogus=)", lambda x: x.sum(bogus=1), "np.sum"),
    ("return a constant", lambda x: np.ones(3), "return"),
    ("np.matvec", lambda x: np.matvec(x, x[0]), "np.matvec"),
]


def _padded_stencil(x):
    u = np.pad(x, 1, mode="edge")
    return 0.25 * (u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:]) - x


def _iadd(x):
    x += 1
    return x


def _setarg(x):
    x[0] = 1
    return x
