"""The standard's functions where NumPy's own differ, or where a traced value needs
them spelled with calls the tracer knows.

Every function here is written with ``np.*`` calls that work on NumPy arrays (run
eagerly) and on traced values inside ``@hg.jit`` (NumPy's protocols hand them to the
tracer), so one body serves both. What differs from NumPy:

- ``astype``/``asarray`` take ``copy=`` and ``device=`` (only ``"cpu"``);
- ``std``/``var`` take ``correction=`` (NumPy's ``ddof``);
- ``clip`` keeps ``x``'s dtype, and with neither bound is ``x`` itself;
- ``sort``/``argsort`` take ``descending=`` (stable: equal elements keep their order);
- ``cumulative_sum``/``cumulative_prod`` take ``include_initial=``;
- ``concat`` with ``axis=None`` joins the flattened arrays;
- ``vecdot`` takes ``axis=``; ``matrix_transpose``, ``unstack`` and ``broadcast_arrays``
  are spelled with calls the tracer has.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import ArgumentTypeError, ShapeError
from ..npjit.traced import Traced


def _device(device: Any, func: str) -> None:
    if device not in (None, "cpu"):
        raise ArgumentTypeError(f"hg.numpy.{func}: device: only 'cpu' is supported, "
                                f"got {device!r}")


def _dtype_of(x: Any) -> np.dtype:
    return np.dtype(x.dtype) if hasattr(x, "dtype") else np.result_type(x)


def asarray(obj: Any, /, *, dtype: Any = None, device: Any = None, copy: bool | None = None
            ) -> Any:
    _device(device, "asarray")
    if isinstance(obj, Traced):
        if copy is False and dtype is not None and np.dtype(dtype) != _dtype_of(obj):
            raise ValueError("hg.numpy.asarray: copy=False but the dtype needs a copy")
        return obj if dtype is None else np.astype(obj, dtype)
    return np.asarray(obj, dtype=dtype, copy=copy)


def astype(x: Any, dtype: Any, /, *, copy: bool = True, device: Any = None) -> Any:
    _device(device, "astype")
    if isinstance(x, Traced):
        return np.astype(x, dtype)
    return np.astype(x, dtype, copy=copy)


def std(x: Any, /, *, axis: int | tuple[int, ...] | None = None, correction: float = 0.0,
        keepdims: bool = False) -> Any:
    return np.std(x, axis=axis, ddof=correction, keepdims=keepdims)


def var(x: Any, /, *, axis: int | tuple[int, ...] | None = None, correction: float = 0.0,
        keepdims: bool = False) -> Any:
    return np.var(x, axis=axis, ddof=correction, keepdims=keepdims)


def clip(x: Any, /, min: Any = None, max: Any = None) -> Any:  # noqa: A002 - the standard's names
    if min is None and max is None:
        return x
    r = np.clip(x, min, max)
    return r if _dtype_of(r) == _dtype_of(x) else np.astype(r, _dtype_of(x))


def sort(x: Any, /, *, axis: int = -1, descending: bool = False, stable: bool = True) -> Any:
    kind = "stable" if stable else None
    if not descending:
        return np.sort(x, axis=axis, kind=kind)
    # a stable ascending sort of the reversed array, reversed: equal elements keep order
    return np.flip(np.sort(np.flip(x, axis=axis), axis=axis, kind=kind), axis=axis)


def argsort(x: Any, /, *, axis: int = -1, descending: bool = False, stable: bool = True
            ) -> Any:
    kind = "stable" if stable else None
    if not descending:
        return np.argsort(x, axis=axis, kind=kind)
    n = np.shape(x)[axis]
    return (n - 1) - np.flip(np.argsort(np.flip(x, axis=axis), axis=axis, kind=kind),
                             axis=axis)


def _cumulative(x: Any, axis: int | None, dtype: Any, include_initial: bool, func: str,
                scan: Any, initial: int) -> Any:
    ndim = np.ndim(x)
    if axis is None:
        if ndim > 1:
            raise ShapeError(f"hg.numpy.{func}: axis: required for a {ndim}-d array")
        axis = 0
    if ndim == 0:
        raise ShapeError(f"hg.numpy.{func}: x: needs at least one dimension")
    axis = axis + ndim if axis < 0 else axis
    if dtype is None and np.issubdtype(_dtype_of(x), np.integer):
        dtype = np.int64 if np.issubdtype(_dtype_of(x), np.signedinteger) else np.uint64
    r = scan(x, axis=axis, dtype=dtype)
    if not include_initial:
        return r
    shape = list(np.shape(r))
    shape[axis] = 1
    first = np.full(tuple(shape), initial, dtype=_dtype_of(r))
    return np.concatenate([first, r], axis=axis)


def cumulative_sum(x: Any, /, *, axis: int | None = None, dtype: Any = None,
                   include_initial: bool = False) -> Any:
    return _cumulative(x, axis, dtype, include_initial, "cumulative_sum", np.cumsum, 0)


def cumulative_prod(x: Any, /, *, axis: int | None = None, dtype: Any = None,
                    include_initial: bool = False) -> Any:
    return _cumulative(x, axis, dtype, include_initial, "cumulative_prod", np.cumprod, 1)


def concat(arrays: Sequence[Any], /, *, axis: int | None = 0) -> Any:
    if axis is None:
        return np.concatenate([np.reshape(a, (-1,)) for a in arrays], axis=0)
    return np.concatenate(list(arrays), axis=axis)


def stack(arrays: Sequence[Any], /, *, axis: int = 0) -> Any:
    return np.stack(list(arrays), axis=axis)


def matrix_transpose(x: Any, /) -> Any:
    if np.ndim(x) < 2:
        raise ShapeError(f"hg.numpy.matrix_transpose: x: needs at least 2 dimensions, got "
                         f"{np.ndim(x)}")
    return np.swapaxes(x, -1, -2)


def vecdot(x1: Any, x2: Any, /, *, axis: int = -1) -> Any:
    if axis != -1:
        x1, x2 = np.moveaxis(x1, axis, -1), np.moveaxis(x2, axis, -1)
    return np.vecdot(x1, x2)


def unstack(x: Any, /, *, axis: int = 0) -> tuple[Any, ...]:
    moved = np.moveaxis(x, axis, 0)
    return tuple(moved[i] for i in range(np.shape(moved)[0]))


def broadcast_arrays(*arrays: Any) -> list[Any]:
    shape = np.broadcast_shapes(*(np.shape(a) for a in arrays))
    return [np.broadcast_to(a, shape) for a in arrays]


def reshape(x: Any, /, shape: tuple[int, ...], *, copy: bool | None = None) -> Any:
    if copy is None or isinstance(x, Traced):
        return np.reshape(x, shape)
    return np.reshape(x, shape, copy=copy)


def squeeze(x: Any, /, axis: int | tuple[int, ...]) -> Any:
    return np.squeeze(x, axis=axis)


def expand_dims(x: Any, /, axis: int = 0) -> Any:
    return np.expand_dims(x, axis)


def vector_norm(x: Any, /, *, axis: int | tuple[int, ...] | None = None,
                keepdims: bool = False, ord: float = 2) -> Any:  # noqa: A002
    if axis is None:
        r = np.linalg.norm(np.reshape(x, (-1,)), ord)
        return np.reshape(r, (1,) * np.ndim(x)) if keepdims else r
    if isinstance(axis, tuple) and len(axis) != 1:
        # norms over several axes: the standard's vector norm of the flattened fibers
        a = np.abs(x)
        if ord == np.inf:
            return np.max(a, axis=axis, keepdims=keepdims)
        if ord == -np.inf:
            return np.min(a, axis=axis, keepdims=keepdims)
        return np.sum(a ** ord, axis=axis, keepdims=keepdims) ** (1.0 / ord)
    ax = axis[0] if isinstance(axis, tuple) else axis
    return np.linalg.norm(x, ord, axis=ax, keepdims=keepdims)


#: standard name -> implementation (the rest are NumPy's own functions)
OVERRIDES = {f.__name__: f for f in (
    asarray, astype, std, var, clip, sort, argsort, cumulative_sum, cumulative_prod, concat,
    stack, matrix_transpose, vecdot, unstack, broadcast_arrays, reshape, squeeze, expand_dims)}
LINALG_OVERRIDES = {"vector_norm": vector_norm, "matrix_transpose": matrix_transpose,
                    "vecdot": vecdot}
