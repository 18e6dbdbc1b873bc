"""Reductions and softmax, over the whole buffer or one axis.

Whole-buffer reductions write one element to ``out`` and also return it as a
Python float (the seeds' API returned the value). Axis reductions write the
reduced array (the input shape without that axis) and return ``out``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..buffer import Buffer
from ..errors import ArgumentTypeError, ShapeError
from ..isa.verify import RuleError, normalize_axes
from . import composites as C
from ._run import cached_program, check_executor, float_dtype, launch, operand, resolve_n


def _in_shape(a: Buffer, n: Any) -> tuple[int, ...]:
    count = resolve_n(n, a)
    return a.shape if count is None else (count,)


def _axis(axis: Any, ndim: int) -> int:
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise ArgumentTypeError(f"axis: expected an int, got {type(axis).__name__}")
    axis = int(axis)
    try:
        return normalize_axes((axis,), ndim)[0]
    except RuleError as e:
        raise ShapeError(f"axis: {e}") from None


_FN = {
    "reduce_sum": lambda x, ax: x.sum(ax),
    "reduce_max": lambda x, ax: x.max(ax),
    "reduce_min": lambda x, ax: x.min(ax),
}


def _reduce(name: str, exec: Any, a: Buffer, out: Buffer, n: Any, axis: Any) -> Any:
    ex = check_executor(exec)
    d = float_dtype(a, "a")
    shape = _in_shape(a, n)
    size = int(_prod(shape))
    if axis is None:
        if size == 0 and name != "reduce_sum":
            raise ShapeError(f"a: {name} of an empty buffer has no identity")
        out_shape: tuple[int, ...] = ()
        ax = None
    else:
        ax = _axis(axis, len(shape))
        if shape[ax] == 0 and name != "reduce_sum":
            raise ShapeError(f"a: {name} over an empty axis has no identity")
        out_shape = shape[:ax] + shape[ax + 1:]
    x = operand(ex, a, "a", dtype=d, shape=shape)
    o = operand(ex, out, "out", dtype=d, shape=out_shape, write=True)
    fn = _FN[name]
    program = cached_program((name, shape, d.name, ax), lambda v: fn(v, ax), [(d, shape)])
    launch(ex, program, [x], [o])
    return float(o) if axis is None else out


def _prod(shape: tuple[int, ...]) -> int:
    r = 1
    for s in shape:
        r *= s
    return r


def reduce_sum(exec: Any, a: Buffer, out: Buffer, n: int | None = None,
               axis: int | None = None) -> Any:
    """Sum of the first n elements (or of the buffer, or along ``axis``)."""
    return _reduce("reduce_sum", exec, a, out, n, axis)


def reduce_max(exec: Any, a: Buffer, out: Buffer, n: int | None = None,
               axis: int | None = None) -> Any:
    """Maximum; NaN if any element is NaN (as NumPy). Empty input raises."""
    return _reduce("reduce_max", exec, a, out, n, axis)


def reduce_min(exec: Any, a: Buffer, out: Buffer, n: int | None = None,
               axis: int | None = None) -> Any:
    """Minimum; NaN if any element is NaN (as NumPy). Empty input raises."""
    return _reduce("reduce_min", exec, a, out, n, axis)


def _softmax_like(name: str, fn: Any, exec: Any, a: Buffer, c: Buffer, n: Any,
                  axis: int) -> Buffer:
    ex = check_executor(exec)
    d = float_dtype(a, "a")
    shape = _in_shape(a, n)
    if len(shape) == 0:
        shape = (1,)
    ax = _axis(axis, len(shape))
    x = operand(ex, a, "a", dtype=d, shape=shape)
    o = operand(ex, c, "c", dtype=d, shape=shape, write=True)
    program = cached_program((name, shape, d.name, ax), lambda v: fn(v, ax), [(d, shape)])
    launch(ex, program, [x], [o])
    return c


def softmax(exec: Any, a: Buffer, c: Buffer, n: int | None = None, axis: int = -1) -> Buffer:
    """Numerically stable softmax along ``axis`` (a flat prefix of n elements is one row)."""
    return _softmax_like("softmax", C.softmax, exec, a, c, n, axis)


def log_softmax(exec: Any, a: Buffer, c: Buffer, n: int | None = None,
                axis: int = -1) -> Buffer:
    """log(softmax(a)) computed stably as (a - max) - log(sum(exp(a - max)))."""
    return _softmax_like("log_softmax", C.log_softmax, exec, a, c, n, axis)


__all__ = ["log_softmax", "reduce_max", "reduce_min", "reduce_sum", "softmax"]
