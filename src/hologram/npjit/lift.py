"""Operands into ISA values: traced values as they are, Python and NumPy scalars as
constants, captured NumPy arrays as hidden inputs of the program.

A captured array is read by the program at every call (an extra LDG after the
function's own arguments), never baked into the program text: changing its contents
in place needs no new trace, and an array of any size costs one pointer. Scalars
are baked in as constants; the jit's guards (``guards``) retrace when a scalar or
array the function reads from a closure cell or a global is rebound.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from ..isa import builder as B
from ..isa.builder import Var
from ..isa.value import Value
from .dtypes import TRACEABLE, to_isa
from .errors import unsupported


class Trace:
    """One trace in progress: the arrays it captured and the hidden inputs they are."""

    def __init__(self, first_index: int) -> None:
        self.first_index = first_index
        self.arrays: list[np.ndarray] = []
        self._by_id: dict[int, tuple[np.ndarray, Value]] = {}

    def hidden(self, a: np.ndarray, func: str, arg: str) -> Value:
        """The LDG that reads captured array ``a`` (one per array object)."""
        hit = self._by_id.get(id(a))
        if hit is not None and hit[0] is a:
            return hit[1]
        d = to_isa(a.dtype, func, arg)
        v = B.ldg(self.first_index + len(self.arrays), d, a.shape)
        self.arrays.append(a)
        self._by_id[id(a)] = (a, v)
        return v


_state = threading.local()


@contextmanager
def tracing(first_index: int) -> Iterator[Trace]:
    """Capture NumPy arrays met while tracing as hidden inputs from ``first_index`` on."""
    outer = getattr(_state, "trace", None)
    _state.trace = t = Trace(first_index)
    try:
        yield t
    finally:
        _state.trace = outer


def _array(a: np.ndarray, func: str, arg: str) -> Value:
    t = getattr(_state, "trace", None)
    if t is None:
        raise unsupported(func, arg, "a NumPy array can join traced values only inside "
                                     "@hg.jit (where it becomes a hidden input)")
    return t.hidden(a, func, arg)


def _const(x: Any, d: np.dtype, func: str, arg: str) -> Value:
    row = to_isa(d, func, arg)
    if row.kind == "i":
        info = np.iinfo(d)
        if isinstance(x, float) and not math.isfinite(x):
            raise unsupported(func, arg, f"{x!r} cannot be an integer constant of {d}")
        if not info.min <= int(x) <= info.max:
            raise unsupported(func, arg, f"{x!r} is out of bounds for {d}")
    return B.const(x, row, ())


def value(x: Any, func: str, arg: str, dtype: np.dtype | None = None) -> Value:
    """``x`` as an ISA value, cast to ``dtype`` when given (NumPy's unsafe cast)."""
    if isinstance(x, Var):
        v = x.v
    elif isinstance(x, np.generic):  # before float: np.float64 is a Python float too
        if dtype is not None and np.dtype(dtype) in TRACEABLE:
            with np.errstate(all="ignore"):
                return _const(np.asarray(x).astype(dtype).item(), np.dtype(dtype), func, arg)
        return _const(x.item(), x.dtype, func, arg)
    elif isinstance(x, (bool, int, float)):
        d = np.dtype(dtype) if dtype is not None else np.asarray(x).dtype
        return _const(x, d, func, arg)
    elif isinstance(x, np.ndarray):
        v = _array(x, func, arg)
    elif isinstance(x, (list, tuple)):
        if any(isinstance(e, Var) for e in _flat(x)):
            return B.reshape(value(_stack_nested(x, func, arg), func, arg, dtype), _shape(x))
        try:
            a = np.asarray(x)
        except ValueError as e:
            raise unsupported(func, arg, f"cannot be read as an array ({e})") from None
        v = _array(a, func, arg)
    else:
        raise unsupported(func, arg, f"a {type(x).__name__} is not an array, a scalar or "
                                     "a traced value")
    return v if dtype is None else B.cast(v, to_isa(dtype, func, arg))


def _flat(x: Any) -> Iterator[Any]:
    for e in x:
        if isinstance(e, (list, tuple)):
            yield from _flat(e)
        else:
            yield e


def _shape(x: Any) -> tuple[int, ...]:
    if isinstance(x, (list, tuple)):
        return (len(x), *(_shape(x[0]) if x else ()))
    return tuple(x.shape) if isinstance(x, Var) else ()


def _stack_nested(x: Any, func: str, arg: str) -> Any:
    """A nested list holding traced values, as one traced value (``np.array([a, b])``)."""
    from ..isa.dtypes import DType  # noqa: F401  (typing only)
    from .dtypes import result_type

    leaves = list(_flat(x))
    d = result_type(*leaves)
    parts = [B.reshape(value(e, func, arg, d), (1, *_leaf_shape(e))) for e in leaves]
    shapes = {p.shape for p in parts}
    if len(shapes) != 1:
        raise unsupported(func, arg, "a nested list of traced values of different shapes")
    return Var(B.concat(parts, 0))


def _leaf_shape(e: Any) -> tuple[int, ...]:
    return tuple(e.shape) if isinstance(e, Var) else ()


__all__ = ["Trace", "tracing", "value"]
