"""Operands into ISA values: traced values as they are, Python and NumPy scalars as
constants, captured NumPy arrays as constants (small ones) or hidden inputs.

A captured array of at most ``SMALL_CONSTANT`` elements is baked into the program, its
elements constants (``constant_array``): the canonicalizer folds what it can (a
uniform array is one CONST, arithmetic on constants is done at compile time), the
program's hash covers the contents, so two functions capturing equal arrays share a
compiled program, and nothing is read per call. The trace keeps a snapshot of each
baked array (``Baked``); the jit retraces when one's contents, dtype or shape change,
in place or not. A larger array is read by the program at every call (an extra LDG
after the function's own arguments): changing it in place needs no new trace and it
costs one pointer. The jit's guards (``guards``) retrace when a scalar or array the
function reads from a closure cell or a global is rebound.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..isa import builder as B
from ..isa import dtypes
from ..isa.builder import Var
from ..isa.dtypes import DType
from ..isa.value import Value
from .dtypes import TRACEABLE, to_isa
from .errors import unsupported
from .random import SEED_SLOT

#: Captured arrays of at most this many elements are constants of the program; larger
#: ones are hidden inputs. A non-uniform constant array is a CONCAT of its elements,
#: which a kernel reads as a chain of selects on the index (render_c.concat). For
#: ``x * w + 1`` over 2M float32 elements (one-off, interleaved medians of 30 on the
#: 2-core box) baked against hidden ``w`` took 1.01x at 3 elements, 1.06x at 16 and
#: 1.9x at 32: 16 covers stencil taps, small weight vectors, 3x3 and 4x4 matrices and
#: short index lists at about the cost of the load it replaces.
SMALL_CONSTANT = 16


@dataclass(frozen=True)
class Baked:
    """A captured array baked into a trace as constants, with the bytes it had then."""

    array: np.ndarray
    dtype: np.dtype
    shape: tuple[int, ...]
    data: bytes

    @classmethod
    def of(cls, a: np.ndarray) -> Baked:
        return cls(a, a.dtype, a.shape, a.tobytes())

    def holds(self) -> bool:
        """Whether the array still has the contents the trace baked in (bit for bit:
        -0.0 for 0.0 or another NaN is a change too)."""
        a = self.array
        return a.dtype == self.dtype and a.shape == self.shape and a.tobytes() == self.data


def constant_array(a: np.ndarray, d: DType) -> Value:
    """``a``'s contents as ISA constants of dtype ``d``: one CONST when every element is
    the same (or there are none), else the elements joined (CONCAT) and reshaped."""
    flat = a.reshape(-1)
    if flat.size == 0:
        return B.const(False if d.kind == "b" else 0, d, a.shape)
    items = flat.tolist()  # Python scalars: float32's exact value as a float
    if flat.tobytes() == flat[:1].tobytes() * flat.size:
        return B.const(items[0], d, a.shape)
    parts = [B.const(x, d, (1,)) for x in items]
    return B.reshape(B.concat(parts, 0), a.shape)


class Trace:
    """One trace in progress: the arrays it captured, as hidden inputs or constants."""

    def __init__(self, first_index: int) -> None:
        self.first_index = first_index
        self.arrays: list[np.ndarray] = []  # hidden inputs, in input order
        self.baked: list[Baked] = []  # arrays baked in as constants
        self._by_id: dict[int, tuple[np.ndarray, Value]] = {}
        self._seed: Value | None = None

    def seed(self) -> Var:
        """The trace's seed (``npjit.random``): a 0-d int32 input after the hidden
        arrays met so far, its slot marked by ``SEED_SLOT`` (the jit draws it per call)."""
        if self._seed is None:
            self._seed = B.ldg(self.first_index + len(self.arrays), dtypes.i32, ())
            self.arrays.append(SEED_SLOT)
        return Var(self._seed)

    def capture(self, a: np.ndarray, func: str, arg: str) -> Value:
        """Captured array ``a`` as a value (one per array object): its constants when
        it is small (``SMALL_CONSTANT``), else the LDG of a hidden input."""
        hit = self._by_id.get(id(a))
        if hit is not None and hit[0] is a:
            return hit[1]
        d = to_isa(a.dtype, func, arg)
        if a.size <= SMALL_CONSTANT:
            v = constant_array(a, d)
            self.baked.append(Baked.of(a))
        else:
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


def watch(a: np.ndarray) -> None:
    """Record that the trace in progress read ``a``'s contents on the host (an index
    array or mask, which decide shapes and positions at trace time): the trace holds
    only while they stay as they are."""
    t = getattr(_state, "trace", None)
    if t is not None:
        t.baked.append(Baked.of(a))


def _array(a: np.ndarray, func: str, arg: str) -> Value:
    t = getattr(_state, "trace", None)
    if t is None:
        raise unsupported(func, arg, "a NumPy array can join traced values only inside "
                                     "@hg.jit (where it becomes a hidden input)")
    return t.capture(a, func, arg)


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


__all__ = ["SMALL_CONSTANT", "Baked", "Trace", "constant_array", "tracing", "value", "watch"]
