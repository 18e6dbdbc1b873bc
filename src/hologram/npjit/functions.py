"""NumPy functions on traced values (``__array_function__``): one table row each.

``call`` binds the arguments to the NumPy function's own signature first, so a
wrong keyword is the TypeError NumPy itself would raise, and every row reads its
arguments by NumPy's parameter names. ``out=`` (and anything else that would write
into an existing array) is refused with a message: traced results are new values.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np

from ..isa import builder as B
from ..isa import dtypes as D
from ..isa.builder import Var
from ..isa.opcodes import Op
from ..isa.value import Value
from . import indexing, linalg, padding, searching
from . import logic as L
from . import reductions as R
from . import shapes as S
from .dtypes import result_type, to_isa, to_numpy
from .errors import unsupported
from .lift import value
from .ufuncs import apply

Row = Callable[[dict[str, Any]], Any]


def _a(p: dict[str, Any], name: str = "a", func: str = "", dtype: Any = None) -> Value:
    return value(p[name], func or name, name, dtype)


def _kd(p: dict[str, Any]) -> bool:
    return bool(p.get("keepdims") or False)


def _where(p: dict[str, Any]) -> Any:
    w = p.get("where")
    return None if w is None or w is True else w


def _where3(p: dict[str, Any]) -> Value:
    c, x, y = p["condition"], p["x"], p["y"]
    if x is None and y is None:
        raise unsupported("where", "condition", "np.where(condition) gives data-dependent "
                                                "indices; pass x and y")
    if x is None or y is None:
        raise unsupported("where", "x" if x is None else "y", "either both or neither of "
                                                             "x and y should be given")
    d = result_type(x, y)
    x, y = _wrapped(x, d), _wrapped(y, d)
    return L.where(value(c, "where", "condition", np.dtype(bool)), value(x, "where", "x", d),
                   value(y, "where", "y", d))


def _wrapped(v: Any, d: np.dtype) -> Any:
    """A Python int np.where puts into integer dtype ``d`` as NumPy does: by a C cast,
    keeping the low bits (-1 into uint8 is 255), not by ufuncs' range check."""
    if not _py_int(v) or d.kind not in "iu":
        return v
    bits = 8 * d.itemsize
    r = v % 2**bits
    return r - 2**bits if d.kind == "i" and r >= 2**(bits - 1) else r


def _select(p: dict[str, Any]) -> Value:
    conds, choices, default = p["condlist"], p["choicelist"], p["default"]
    if len(conds) != len(choices) or not conds:
        raise unsupported("select", "condlist", "needs as many conditions as choices (>= 1)")
    d = result_type(*choices, default)
    out = value(default, "select", "default", d)
    for i in reversed(range(len(conds))):
        out = L.where(value(conds[i], "select", f"condlist[{i}]", np.dtype(bool)),
                      value(choices[i], "select", f"choicelist[{i}]", d), out)
    return out


def _py_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _clip(p: dict[str, Any]) -> Value:
    lo = p.get("a_min") if p.get("a_min") is not None else p.get("min")
    hi = p.get("a_max") if p.get("a_max") is not None else p.get("max")
    if lo is None and hi is None:
        raise unsupported("clip", "a_min", "one of a_min and a_max must be given")
    x = p["a"]
    r: Any = x
    d = x.dtype if isinstance(x, Value) else getattr(getattr(x, "v", None), "dtype", None)
    if d is not None and d.kind == "i":
        # NumPy clips an integer array by Python int bounds its dtype cannot hold (uint8
        # by -9) as if by the dtype's own limits: a bound past them changes nothing
        info = np.iinfo(d.np_dtype)
        lo = None if _py_int(lo) and lo < info.min else lo
        hi = None if _py_int(hi) and hi > info.max else hi
        if lo is None and hi is None:
            return x if isinstance(x, Value) else x.v
    if lo is not None:
        r = Var(apply(np.maximum, (r, lo)))
    if hi is not None:
        r = Var(apply(np.minimum, (r, hi)))
    return r.v


def _like(fill: Any) -> Row:
    def row(p: dict[str, Any]) -> Value:
        x = _a(p, next(iter(p)), "zeros_like")
        d = to_isa(p["dtype"], "zeros_like", "dtype") if p.get("dtype") is not None \
            else x.dtype
        shape = S.shape_arg(p["shape"], "zeros_like") if p.get("shape") is not None \
            else x.shape
        f = p["fill_value"] if fill is _FILL else fill
        if isinstance(f, (Var, np.ndarray)):
            return B.expand(value(f, "full_like", "fill_value", to_numpy(d)), shape)
        return B.const(np.asarray(f).astype(d.np_dtype).item(), d, shape)
    return row


_FILL = object()


def _astype(x: Value, dtype: Any, func: str = "astype") -> Value:
    return B.cast(x, to_isa(dtype, func, "dtype"))


def _round(p: dict[str, Any]) -> Value:
    x, dec = _a(p, "a", "round"), int(p["decimals"])
    if x.dtype is D.boolean:  # NumPy rounds bool to float16 (0.0 and 1.0)
        return B.cast(x, D.f16)
    if not x.dtype.is_float:
        if dec >= 0:
            return x
        raise unsupported("round", "decimals", "negative decimals of integers are not traced")
    if dec == 0:
        return B.unary(Op.RINT, x)
    f = L.k(10.0 ** abs(dec), x)
    if dec > 0:
        return L.ew(Op.DIV, B.unary(Op.RINT, L.ew(Op.MUL, x, f)), f)
    return L.ew(Op.MUL, B.unary(Op.RINT, L.ew(Op.DIV, x, f)), f)


def _isclose(p: dict[str, Any]) -> Value:
    d = result_type(p["a"], p["b"], 1.0)
    a, b = value(p["a"], "isclose", "a", d), value(p["b"], "isclose", "b", d)
    rtol, atol = float(p["rtol"]), float(p["atol"])
    diff = B.unary(Op.ABS, L.ew(Op.SUB, a, b))
    tol = L.ew(Op.ADD, L.k(atol, a), L.ew(Op.MUL, L.k(rtol, a), B.unary(Op.ABS, b)))
    close = L.le(diff, tol)
    close = L.or_(close, L.eq(a, b))  # equal infinities
    if p["equal_nan"]:
        close = L.or_(close, L.and_(L.isnan(a), L.isnan(b)))
    return L.and_(close, L.not_(L.and_(L.isinf(L.ew(Op.SUB, a, b)), L.ne(a, b))))


def _take(p: dict[str, Any]) -> Value:
    if p.get("mode", "raise") != "raise":
        raise unsupported("take", "mode", f"mode={p['mode']!r}: only 'raise' is traced")
    x = _a(p, "a", "take")
    axis = p["axis"]
    if axis is None:
        x, axis = B.reshape(x, (x.size,)), 0
    (ax,) = R.axes_of(axis, x.ndim, "take")
    key = [slice(None)] * ax + [p["indices"]]
    idx = p["indices"]
    if isinstance(idx, (int, np.integer)):
        key[-1] = int(idx)
    return indexing.getitem(x, tuple(key))


def _take_along_axis(p: dict[str, Any]) -> Value:
    x = _a(p, "arr", "take_along_axis")
    idx = value(p["indices"], "take_along_axis", "indices")
    if idx.dtype.kind != "i":
        raise unsupported("take_along_axis", "indices", f"must be integers, got {idx.dtype}")
    axis = p["axis"]
    if axis is None:
        x, axis = B.reshape(x, (x.size,)), 0
    (ax,) = R.axes_of(axis, x.ndim, "take_along_axis")
    if idx.ndim != x.ndim:
        raise unsupported("take_along_axis", "indices", "must have the array's rank")
    shape = tuple(i if d == ax else B.broadcast_shape((a,), (i,))[0]
                  for d, (a, i) in enumerate(zip(x.shape, idx.shape, strict=True)))
    xs = B.expand(x, tuple(a if d == ax else s for d, (a, s) in enumerate(zip(x.shape, shape,
                                                                               strict=True))))
    n = x.shape[ax]
    i = B.expand(B.cast(idx, D.i64), shape)
    i = L.where(L.lt(i, L.k(0, D.i64)), L.ew(Op.ADD, i, L.k(n, D.i64)), i)
    if xs.size == 0 or i.size == 0:
        return B.const(0, x.dtype, shape)
    return B.gather(xs, i, ax)


def _sort_args(p: dict[str, Any], func: str) -> tuple[Value, int]:
    if p.get("order") is not None:
        raise unsupported(func, "order", "structured sorts are not traced")
    x = _a(p, "a", func)
    axis = p["axis"]
    if axis is None:
        x, axis = B.reshape(x, (x.size,)), 0
    (ax,) = R.axes_of(axis, x.ndim, func)
    return x, ax


def _argsort(p: dict[str, Any]) -> Value:
    x, ax = _sort_args(p, "argsort")
    if x.size == 0:
        return B.const(0, D.i64, x.shape)
    return B.argsort(B.cast(x, D.i32) if x.dtype is D.boolean else x, ax)


def _sort(p: dict[str, Any]) -> Value:
    x, ax = _sort_args(p, "sort")
    if x.size == 0:
        return x
    return B.gather(x, B.argsort(B.cast(x, D.i32) if x.dtype is D.boolean else x, ax), ax)


def _nan_to_num(p: dict[str, Any]) -> Value:
    x = _a(p, "x", "nan_to_num")
    if not x.dtype.is_float:
        return x
    info = np.finfo(x.dtype.np_dtype)
    pos = float(info.max) if p["posinf"] is None else float(p["posinf"])
    neg = float(info.min) if p["neginf"] is None else float(p["neginf"])
    r = L.where(L.isnan(x), L.k(float(p["nan"]), x), x)
    r = L.where(L.eq(x, L.k(np.inf, x)), L.k(pos, x), r)
    return L.where(L.eq(x, L.k(-np.inf, x)), L.k(neg, x), r)


def _average(p: dict[str, Any]) -> Value:
    x, w = p["a"], p["weights"]
    if p["returned"]:
        raise unsupported("average", "returned", "returned=True is not traced")
    if w is None:
        return R.mean(_a(p, "a", "average"), p["axis"], keepdims=_kd(p), func="average")
    d = result_type(x, w, 1.0)
    xv, wv = value(x, "average", "a", d), value(w, "average", "weights", d)
    axis = p["axis"]
    if wv.shape != xv.shape:
        if axis is None or wv.ndim != 1:
            raise unsupported("average", "weights", "1-D weights need an integer axis; "
                                                    "others must have a's shape")
        (ax,) = R.axes_of(axis, xv.ndim, "average")
        wv = B.expand(B.reshape(wv, tuple(wv.size if d == ax else 1 for d in range(xv.ndim))),
                      xv.shape)
    s = R.total(L.ew(Op.MUL, xv, wv), axis, keepdims=_kd(p), func="average")
    return L.ew(Op.DIV, s, R.total(wv, axis, keepdims=_kd(p), func="average"))


def _diff(p: dict[str, Any]) -> Value:
    x = _a(p, "a", "diff")
    (ax,) = R.axes_of(p["axis"], x.ndim, "diff")
    parts = []
    for name in ("prepend", "append"):
        if p.get(name) is not None:
            v = value(p[name], "diff", name, to_numpy(x.dtype))
            shape = tuple(1 if d == ax else n for d, n in enumerate(x.shape))
            parts.append((name, B.expand(v, shape) if v.ndim == 0 else v))
    seq = [v for n, v in parts if n == "prepend"] + [x] + [v for n, v in parts if n == "append"]
    if len(seq) > 1:
        x = B.concat(seq, ax)
    return S.diff(x, int(p["n"]), ax)


def _trace(p: dict[str, Any]) -> Value:
    d = _diagonal(p)
    return R.total(d, -1, dtype=p.get("dtype"), func="trace")


def _diagonal(p: dict[str, Any]) -> Value:
    x = _a(p, "a", "diagonal")
    if x.ndim < 2:
        raise unsupported("diagonal", "a", "needs at least 2 dimensions")
    a1, a2 = R.axes_of(p["axis1"], x.ndim, "diagonal")[0], R.axes_of(p["axis2"], x.ndim,
                                                                      "diagonal")[0]
    if a1 == a2:
        raise unsupported("diagonal", "axis2", "axis1 and axis2 cannot be the same")
    return S.diagonal(x, a1, a2, int(p["offset"]))


def _cross(p: dict[str, Any]) -> Value:
    if p["axis"] is not None or p["axisa"] != -1 or p["axisb"] != -1 or p["axisc"] != -1:
        raise unsupported("cross", "axis", "only the last axis is traced")
    d = result_type(p["a"], p["b"])
    a, b = value(p["a"], "cross", "a", d), value(p["b"], "cross", "b", d)
    if a.shape[-1:] != (3,) or b.shape[-1:] != (3,):
        raise unsupported("cross", "a", "only 3-vectors are traced")

    def comp(v: Value, i: int) -> Value:
        return B.reshape(S.take_positions(v, v.ndim - 1, i, 1, 1), v.shape[:-1])

    parts = []
    for i, j in ((1, 2), (2, 0), (0, 1)):
        parts.append(L.ew(Op.SUB, L.ew(Op.MUL, *_bc(comp(a, i), comp(b, j))),
                          L.ew(Op.MUL, *_bc(comp(a, j), comp(b, i)))))
    shape = B.broadcast_shape(*(q.shape for q in parts))
    return B.concat([B.reshape(B.expand(q, shape), (*shape, 1)) for q in parts], len(shape))


def _bc(a: Value, b: Value) -> tuple[Value, Value]:
    s = B.broadcast_shape(a.shape, b.shape)
    return B.expand(a, s), B.expand(b, s)


def _meta(name: str) -> Row:
    def row(p: dict[str, Any]) -> Any:
        x = value(p[next(iter(p))], name, "a")
        if name == "shape":
            return x.shape
        if name == "ndim":
            return x.ndim
        if p.get("axis") is not None:
            return x.shape[int(p["axis"])]
        return x.size
    return row


def _atleast(n: int) -> Row:
    def row(p: dict[str, Any]) -> Any:
        vals = [value(a, f"atleast_{n}d", f"arys[{i}]") for i, a in enumerate(p["arys"])]
        out = [S._atleast(v, n) for v in vals]
        return out[0] if len(out) == 1 else out
    return row


def _ravel_index(x: Value) -> Value:
    return B.reshape(x, (x.size,))


#: NumPy function -> row over the bound arguments (by NumPy's parameter names).
FUNCTIONS: dict[Callable[..., Any], Row] = {
    np.sum: lambda p: R.total(_a(p), p["axis"], p["dtype"], _kd(p), p.get("initial"),
                              _where(p)),
    np.prod: lambda p: R.total(_a(p), p["axis"], p["dtype"], _kd(p), p.get("initial"),
                               _where(p), "prod", Op.RPROD),
    np.mean: lambda p: R.mean(_a(p), p["axis"], p["dtype"], _kd(p), _where(p)),
    np.var: lambda p: R.var(_a(p), p["axis"], p["dtype"], p["ddof"], _kd(p),
                            mean_=p.get("mean"), correction=p.get("correction")),
    np.std: lambda p: R.std(_a(p), p["axis"], p["dtype"], p["ddof"], _kd(p),
                            mean_=p.get("mean"), correction=p.get("correction")),
    np.max: lambda p: R.extreme(_a(p), p["axis"], _kd(p), p.get("initial"), _where(p)),
    np.amax: lambda p: R.extreme(_a(p), p["axis"], _kd(p), p.get("initial"), _where(p),
                                 "amax"),
    np.amin: lambda p: R.extreme(_a(p), p["axis"], _kd(p), p.get("initial"), _where(p),
                                 "amin", Op.RMIN),
    np.min: lambda p: R.extreme(_a(p), p["axis"], _kd(p), p.get("initial"), _where(p),
                                "min", Op.RMIN),
    np.ptp: lambda p: R.ptp(_a(p), p["axis"], _kd(p)),
    np.argmax: lambda p: R.arg_extreme(_a(p), p["axis"], _kd(p), "argmax"),
    np.argmin: lambda p: R.arg_extreme(_a(p), p["axis"], _kd(p), "argmin"),
    np.any: lambda p: R.truth_reduce(_a(p), p["axis"], _kd(p), _where(p), "any"),
    np.all: lambda p: R.truth_reduce(_a(p), p["axis"], _kd(p), _where(p), "all"),
    np.count_nonzero: lambda p: R.count_nonzero(_a(p), p["axis"], _kd(p)),
    np.cumsum: lambda p: R.scan(_a(p), p["axis"], p["dtype"], "cumsum"),
    np.cumprod: lambda p: R.scan(_a(p), p["axis"], p["dtype"], "cumprod"),
    np.nansum: lambda p: R.nan_total(_a(p), p["axis"], p["dtype"], _kd(p)),
    np.nanprod: lambda p: R.nan_total(_a(p), p["axis"], p["dtype"], _kd(p), "nanprod",
                                      Op.RPROD),
    np.nanmax: lambda p: R.nan_extreme(_a(p), p["axis"], _kd(p)),
    np.nanmin: lambda p: R.nan_extreme(_a(p), p["axis"], _kd(p), "nanmin", Op.RMIN),
    np.nanmean: lambda p: R.nan_mean(_a(p), p["axis"], p["dtype"], _kd(p)),
    np.median: lambda p: R.median(_a(p), p["axis"], bool(p["keepdims"])),
    np.average: _average,
    np.where: _where3,
    np.select: _select,
    np.clip: _clip,
    np.concatenate: lambda p: S.concatenate(p["arrays"], p["axis"], None, p["dtype"]),
    np.stack: lambda p: S.stack(p["arrays"], p["axis"], None, p["dtype"]),
    np.hstack: lambda p: S.hstack(p["tup"], p["dtype"]),
    np.vstack: lambda p: S.vstack(p["tup"], p["dtype"]),
    np.column_stack: lambda p: S.column_stack(p["tup"]),
    np.split: lambda p: S.split(_a(p, "ary", "split"), p["indices_or_sections"], p["axis"]),
    np.array_split: lambda p: S.split(_a(p, "ary", "array_split"), p["indices_or_sections"],
                                      p["axis"], "array_split", even=False),
    np.reshape: lambda p: S.reshape(_a(p), p["shape"], p["order"]),
    np.transpose: lambda p: S.transpose(_a(p), p["axes"]),
    np.permute_dims: lambda p: S.transpose(_a(p), p["axes"], "permute_dims"),
    np.swapaxes: lambda p: S.swapaxes(_a(p), p["axis1"], p["axis2"]),
    np.moveaxis: lambda p: S.moveaxis(_a(p), p["source"], p["destination"]),
    np.squeeze: lambda p: S.squeeze(_a(p), p["axis"]),
    np.expand_dims: lambda p: S.expand_dims(_a(p), p["axis"]),
    np.broadcast_to: lambda p: S.broadcast_to(_a(p, "array", "broadcast_to"), p["shape"]),
    np.ravel: lambda p: S.ravel(_a(p), p["order"]),
    np.flip: lambda p: S.flip(_a(p, "m", "flip"), p["axis"]),
    np.fliplr: lambda p: S.flip(_a(p, "m", "fliplr"), 1),
    np.flipud: lambda p: S.flip(_a(p, "m", "flipud"), 0),
    np.roll: lambda p: S.roll(_a(p), p["shift"], p["axis"]),
    np.repeat: lambda p: S.repeat(_a(p), p["repeats"], p["axis"]),
    np.tile: lambda p: S.tile(_a(p, "A", "tile"), p["reps"]),
    np.diff: _diff,
    np.tril: lambda p: S.tril(_a(p, "m", "tril"), p["k"], True),
    np.triu: lambda p: S.tril(_a(p, "m", "triu"), p["k"], False),
    np.atleast_1d: _atleast(1),
    np.atleast_2d: _atleast(2),
    np.atleast_3d: _atleast(3),
    np.dot: lambda p: linalg.dot(p["a"], p["b"], p["out"]),
    np.einsum: lambda p: linalg.einsum(*p["operands"], out=p["out"], **p["kwargs"]),
    np.outer: lambda p: linalg.outer(p["a"], p["b"], p["out"]),
    np.inner: lambda p: linalg.inner(p["a"], p["b"]),
    np.vdot: lambda p: linalg.vdot(p["a"], p["b"]),
    np.tensordot: lambda p: linalg.tensordot(p["a"], p["b"], p["axes"]),
    np.linalg.norm: lambda p: linalg.norm(p["x"], p["ord"], p["axis"], p["keepdims"]),
    np.trace: _trace,
    np.diagonal: _diagonal,
    np.cross: _cross,
    np.zeros_like: _like(0),
    np.ones_like: _like(1),
    np.empty_like: _like(0),
    np.full_like: _like(_FILL),
    np.copy: lambda p: _a(p),
    np.astype: lambda p: _astype(_a(p, "x", "astype"), p["dtype"]),
    np.round: _round,
    np.around: _round,
    np.isclose: _isclose,
    np.take: _take,
    np.searchsorted: lambda p: searching.searchsorted(p["a"], p["v"], p["side"], p["sorter"]),
    np.digitize: lambda p: searching.digitize(p["x"], p["bins"], bool(p["right"])),
    np.interp: lambda p: searching.interp(p["x"], p["xp"], p["fp"], p["left"], p["right"],
                                          p["period"]),
    np.pad: lambda p: padding.pad(_a(p, "array", "pad"), p["pad_width"], p["mode"],
                                  p["kwargs"]),
    np.take_along_axis: _take_along_axis,
    np.sort: _sort,
    np.argsort: _argsort,
    np.nan_to_num: _nan_to_num,
    np.real: lambda p: _a(p, "val", "real"),
    np.shape: _meta("shape"),
    np.ndim: _meta("ndim"),
    np.size: _meta("size"),
}

#: NumPy functions refused with a reason (others get the generic message).
REFUSED: dict[Callable[..., Any], str] = {
    np.nonzero: "its result's shape depends on the data",
    np.argwhere: "its result's shape depends on the data",
    np.flatnonzero: "its result's shape depends on the data",
    np.unique: "its result's shape depends on the data",
    np.extract: "its result's shape depends on the data",
    np.compress: "its result's shape depends on the data",
    np.allclose: "it returns a Python bool, which a trace cannot know",
    np.array_equal: "it returns a Python bool, which a trace cannot know",
    np.linalg.inv: "matrix inversion is not traced",
    np.linalg.solve: "linear solves are not traced",
    np.linalg.svd: "SVD is not traced",
    np.linalg.eig: "eigendecompositions are not traced",
    np.fft.fft: "FFTs are not traced",
    np.apply_along_axis: "a Python callback per fiber is not traced; write it vectorised",
}


@cache
def _signature(func: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(func)


def _name(func: Callable[..., Any]) -> str:
    mod = getattr(func, "__module__", "") or ""
    sub = mod.removeprefix("numpy").strip(".")
    return f"{sub}.{func.__name__}" if sub and not sub.startswith("_") else func.__name__


def call(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``func(*args, **kwargs)`` on traced values: ISA values (or lists and tuples of
    them, or Python metadata such as a shape)."""
    name = _name(func)
    row = FUNCTIONS.get(func)
    if row is None:
        why = REFUSED.get(func, "this NumPy function is not traced")
        raise unsupported(name, "function", why)
    try:
        bound = _signature(func).bind(*args, **kwargs)
    except TypeError as e:
        raise unsupported(name, "arguments", str(e)) from None
    bound.apply_defaults()
    p = {k: (None if v is np._NoValue else v) for k, v in bound.arguments.items()}
    if p.get("out") is not None:
        raise unsupported(name, "out", "traced results are new values; drop out= and use "
                                       "the result")
    return row(p)


__all__ = ["FUNCTIONS", "REFUSED", "call"]
