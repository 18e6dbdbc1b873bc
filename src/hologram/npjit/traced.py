"""``Traced``: the stand-in ``@hg.jit`` passes for each array argument.

It is a ``Var`` (so the composites and ``hologram.ops`` take it) that also speaks
NumPy: ``__array_ufunc__`` and ``__array_function__`` route ``np.*`` calls to
``ufuncs`` and ``functions``; operators, indexing, ``.T``, ``.dtype`` (a NumPy
dtype), ``.astype``, ``.sum(axis=...)`` and the other ndarray methods behave as
NumPy's do. A value has no data while it is traced, so converting it to a Python
number or a NumPy array (``float(x)``, ``if x > 0:``, ``np.asarray(x)``) is a
clear error instead of a wrong constant.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ..isa import builder as B
from ..isa.builder import Var
from ..isa.dtypes import DType, to_dtype
from ..isa.program import Program
from ..isa.value import Value
from . import functions, indexing, ufuncs
from .dtypes import to_numpy
from .errors import NumpyUnsupportedError, unsupported
from .lift import Baked, Trace, tracing, value
from .random import drawing, generators_unchanged


def wrap(r: Any) -> Any:
    """ISA values (in lists and tuples too) as ``Traced``; anything else as it is."""
    if isinstance(r, Value):
        return Traced(r)
    if isinstance(r, Var):
        return r if isinstance(r, Traced) else Traced(r.v)
    if isinstance(r, (list, tuple)) and any(isinstance(e, (Value, Var)) for e in r):
        return type(r)(wrap(e) for e in r)
    return r


def _ufunc(u: np.ufunc) -> Callable[..., Any]:
    def op(self: Traced, other: Any) -> Any:
        return self._apply(u, (self, other))

    def rop(self: Traced, other: Any) -> Any:
        return self._apply(u, (other, self))
    return op, rop


def _inplace(name: str) -> Callable[..., Any]:
    u = getattr(np, name)

    def iop(self: Traced, other: Any) -> Any:
        r = self._apply(u, (self, other))
        if r is NotImplemented:
            return r
        self._write(r.v, f"{name} (in place)")
        return self
    return iop


#: What a traced value is a view of: ARG (a jit argument, or a view of one: writing
#: would change the caller's array), OPAQUE (a reshape or transpose of a value: not
#: written through), or (parent, key) for a basic-index view, written through.
ARG, OPAQUE = "argument", "opaque"


class Traced(Var):
    """A traced array with NumPy's semantics (see the module docstring)."""

    __slots__ = ("_view",)
    __array_priority__ = 1000

    def __init__(self, v: Value, view: Any = None) -> None:
        super().__init__(v)
        self._view = view

    def __array_namespace__(self, *, api_version: str | None = None) -> Any:
        """The Array API namespace of traced values: ``hg.numpy``."""
        from .. import array_api

        if api_version not in (None, array_api.__array_api_version__):
            raise ValueError(f"__array_namespace__: api_version: hg.numpy implements "
                             f"{array_api.__array_api_version__}, not {api_version!r}")
        return array_api

    def _write(self, new: Value, what: str) -> None:
        """Replace this value by ``new``; a basic-index view writes through to the
        value it views (NumPy's ``y[1:3] += 1``)."""
        if self._view == ARG:
            raise unsupported(what, "self", "this traced value is an argument or a view "
                              "of one; NumPy would write into the caller's array. Copy "
                              "it first (y = x.copy()) or write y = np.where(...)")
        if self._view == OPAQUE:
            raise unsupported(what, "self", "writing through a reshape or transpose view "
                              "is not traced; write into the array it views")
        if new.dtype is not self.v.dtype or new.shape != self.v.shape:
            new = B.cast(B.expand(new, self.v.shape), self.v.dtype)
        self.v = new
        if isinstance(self._view, tuple):
            parent, key = self._view
            parent._write(indexing.setitem(parent.v, key, self), what)

    # --- NumPy protocols -------------------------------------------------------
    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kw: Any) -> Any:
        name = ufunc.__name__
        out = kw.pop("out", None)
        if out is not None and any(o is not None for o in out):
            raise unsupported(name, "out", "traced results are new values; drop out= and "
                                           "use the result")
        where = kw.pop("where", True)
        if where is not True:
            raise unsupported(name, "where", "without out= the unselected elements are "
                                             "undefined in NumPy; use np.where(mask, "
                                             f"np.{name}(...), fallback)")
        dtype = kw.pop("dtype", None)
        for k, v in kw.items():
            if not (k == "casting" and v == "same_kind") and not (k == "subok" and v) \
                    and not (k == "order" and v == "K") and not (k == "signature" and
                                                                  v is None):
                raise unsupported(name, k, f"{k}={v!r} is not traced")
        if method == "__call__":
            return wrap(ufuncs.apply(ufunc, inputs, dtype))
        return wrap(_ufunc_method(ufunc, method, inputs, dtype))

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        return wrap(functions.call(func, args, kwargs))

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        raise NumpyUnsupportedError(
            "@hg.jit: np.asarray: a traced value has no data while the function is traced, "
            "so it cannot become a NumPy array (a NumPy function without traced support, "
            "or indexing a NumPy array with a traced index: pass the array as an argument "
            "of the jitted function, where array[index] is traced, or use "
            "np.take_along_axis(array, index, axis))")

    def _no_data(self, what: str) -> NumpyUnsupportedError:
        return NumpyUnsupportedError(
            f"@hg.jit: {what}: a traced value has no data while the function is traced "
            "(Python control flow on array values cannot be traced; use np.where)")

    def __bool__(self) -> bool:
        raise self._no_data("bool()")

    def __float__(self) -> float:
        raise self._no_data("float()")

    def __int__(self) -> int:
        raise self._no_data("int()")

    def __index__(self) -> int:
        raise self._no_data("operator.index()")

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __iter__(self) -> Iterator[Traced]:
        if not self.shape:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(self.shape[0]))

    __hash__ = object.__hash__

    def _apply(self, u: np.ufunc, inputs: tuple[Any, ...]) -> Any:
        for x in inputs:
            if not isinstance(x, (Var, np.ndarray, np.generic, bool, int, float, list,
                                  tuple)):
                return NotImplemented
        return wrap(ufuncs.apply(u, inputs))

    # --- operators: NumPy's ufuncs ---------------------------------------------
    __add__, __radd__ = _ufunc(np.add)
    __sub__, __rsub__ = _ufunc(np.subtract)
    __mul__, __rmul__ = _ufunc(np.multiply)
    __truediv__, __rtruediv__ = _ufunc(np.divide)
    __floordiv__, __rfloordiv__ = _ufunc(np.floor_divide)
    __mod__, __rmod__ = _ufunc(np.remainder)
    __pow__, __rpow__ = _ufunc(np.power)
    __matmul__, __rmatmul__ = _ufunc(np.matmul)
    __and__, __rand__ = _ufunc(np.bitwise_and)
    __or__, __ror__ = _ufunc(np.bitwise_or)
    __xor__, __rxor__ = _ufunc(np.bitwise_xor)
    __lshift__, __rlshift__ = _ufunc(np.left_shift)
    __rshift__, __rrshift__ = _ufunc(np.right_shift)
    __lt__, _ = _ufunc(np.less)
    __le__, _ = _ufunc(np.less_equal)
    __gt__, _ = _ufunc(np.greater)
    __ge__, _ = _ufunc(np.greater_equal)
    __eq__, _ = _ufunc(np.equal)  # type: ignore[assignment]
    __ne__, _ = _ufunc(np.not_equal)  # type: ignore[assignment]
    __iadd__ = _inplace("add")
    __isub__ = _inplace("subtract")
    __imul__ = _inplace("multiply")
    __itruediv__ = _inplace("divide")
    __ifloordiv__ = _inplace("floor_divide")
    __imod__ = _inplace("remainder")
    __ipow__ = _inplace("power")
    __iand__ = _inplace("bitwise_and")
    __ior__ = _inplace("bitwise_or")
    __ixor__ = _inplace("bitwise_xor")
    __ilshift__ = _inplace("left_shift")
    __irshift__ = _inplace("right_shift")
    del _

    def __divmod__(self, o: Any) -> Any:
        return self._apply(np.divmod, (self, o))

    def __neg__(self) -> Any:
        return self._apply(np.negative, (self,))

    def __pos__(self) -> Any:
        return self._apply(np.positive, (self,))

    def __abs__(self) -> Any:
        return self._apply(np.absolute, (self,))

    def __invert__(self) -> Any:
        return self._apply(np.invert, (self,))

    # --- indexing -----------------------------------------------------------------
    def __getitem__(self, key: Any) -> Traced:
        r = Traced(indexing.getitem(self.v, key))
        if indexing.is_basic(key):  # NumPy returns a view; advanced indexing a copy
            r._view = ARG if self._view == ARG else OPAQUE if self._view == OPAQUE \
                else (self, key)
        return r

    def __setitem__(self, key: Any, v: Any) -> None:
        if self._view in (ARG, OPAQUE):
            self._write(self.v, "__setitem__")  # raises the clear error
        self._write(indexing.setitem(self.v, key, v), "__setitem__")

    # --- ndarray attributes -------------------------------------------------------
    @property
    def dtype(self) -> np.dtype:  # type: ignore[override]
        return to_numpy(self.v.dtype)

    @property
    def size(self) -> int:
        return self.v.size

    @property
    def itemsize(self) -> int:
        return self.v.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.v.size * self.v.dtype.itemsize

    @property
    def T(self) -> Traced:
        return self._call(np.transpose)

    @property
    def mT(self) -> Traced:
        if self.ndim < 2:
            raise unsupported("mT", "self", "matrix transpose needs at least 2 dimensions")
        return self._call(np.swapaxes, -1, -2)

    @property
    def real(self) -> Traced:
        return self

    def _call(self, func: Any, *args: Any, **kw: Any) -> Any:
        r = wrap(functions.call(func, (self, *args), kw))
        if isinstance(r, Traced) and func in _VIEWS:
            r._view = ARG if self._view == ARG else OPAQUE
        return r

    # --- ndarray methods (NumPy's functions with self first) ------------------------
    def sum(self, *a: Any, **k: Any) -> Any: return self._call(np.sum, *a, **k)
    def prod(self, *a: Any, **k: Any) -> Any: return self._call(np.prod, *a, **k)
    def mean(self, *a: Any, **k: Any) -> Any: return self._call(np.mean, *a, **k)
    def var(self, *a: Any, **k: Any) -> Any: return self._call(np.var, *a, **k)
    def std(self, *a: Any, **k: Any) -> Any: return self._call(np.std, *a, **k)
    def max(self, *a: Any, **k: Any) -> Any: return self._call(np.max, *a, **k)
    def min(self, *a: Any, **k: Any) -> Any: return self._call(np.min, *a, **k)
    def ptp(self, *a: Any, **k: Any) -> Any: return self._call(np.ptp, *a, **k)
    def argmax(self, *a: Any, **k: Any) -> Any: return self._call(np.argmax, *a, **k)
    def argmin(self, *a: Any, **k: Any) -> Any: return self._call(np.argmin, *a, **k)
    def any(self, *a: Any, **k: Any) -> Any: return self._call(np.any, *a, **k)
    def all(self, *a: Any, **k: Any) -> Any: return self._call(np.all, *a, **k)
    def cumsum(self, *a: Any, **k: Any) -> Any: return self._call(np.cumsum, *a, **k)
    def cumprod(self, *a: Any, **k: Any) -> Any: return self._call(np.cumprod, *a, **k)
    def clip(self, *a: Any, **k: Any) -> Any: return self._call(np.clip, *a, **k)
    def round(self, *a: Any, **k: Any) -> Any: return self._call(np.round, *a, **k)
    def transpose(self, *axes: Any) -> Any:
        axes = axes[0] if len(axes) == 1 and not isinstance(axes[0], int) else axes
        return self._call(np.transpose, axes or None)
    def swapaxes(self, a: int, b: int) -> Any: return self._call(np.swapaxes, a, b)
    def squeeze(self, *a: Any, **k: Any) -> Any: return self._call(np.squeeze, *a, **k)
    def ravel(self, *a: Any, **k: Any) -> Any: return self._call(np.ravel, *a, **k)
    def flatten(self, order: str = "C") -> Any: return wrap(functions.call(np.ravel, (self,),
                                                                            {"order": order}))
    def repeat(self, *a: Any, **k: Any) -> Any: return self._call(np.repeat, *a, **k)
    def take(self, *a: Any, **k: Any) -> Any: return self._call(np.take, *a, **k)
    def dot(self, *a: Any, **k: Any) -> Any: return self._call(np.dot, *a, **k)
    def diagonal(self, *a: Any, **k: Any) -> Any: return self._call(np.diagonal, *a, **k)
    def trace(self, *a: Any, **k: Any) -> Any: return self._call(np.trace, *a, **k)
    def nonzero(self) -> Any: return self._call(np.nonzero)
    def argsort(self, *a: Any, **k: Any) -> Any: return self._call(np.argsort, *a, **k)
    def copy(self, order: str = "K") -> Traced: return Traced(self.v)
    def conj(self) -> Traced: return self
    def conjugate(self) -> Traced: return self
    def item(self, *a: Any) -> Any: raise self._no_data("item()")
    def tolist(self) -> Any: raise self._no_data("tolist()")

    def sort(self, *a: Any, **k: Any) -> None:
        raise unsupported("ndarray.sort", "self", "sorts in place; use y = np.sort(x)")

    def fill(self, value: Any) -> None:
        raise unsupported("ndarray.fill", "self", "fills in place; use np.full_like(x, v)")

    def reshape(self, *shape: Any, order: str = "C", copy: Any = None) -> Any:
        shape = shape[0] if len(shape) == 1 and not isinstance(shape[0], int) else shape
        return self._call(np.reshape, shape, order=order)

    def astype(self, dtype: Any, order: str = "K", casting: str = "unsafe",
               subok: bool = True, copy: bool = True) -> Traced:
        return Traced(functions._astype(self.v, dtype))

    def cast(self, dtype: DType | str) -> Traced:  # the Var method, as NumPy's astype
        return Traced(B.cast(self.v, to_dtype(dtype)))

    def __repr__(self) -> str:
        return f"Traced({self.v.dtype}{list(self.v.shape)})"


_VIEWS = frozenset({np.transpose, np.swapaxes, np.reshape, np.ravel, np.squeeze})


def _ufunc_method(u: np.ufunc, method: str, inputs: tuple[Any, ...], dtype: Any) -> Any:
    """``ufunc.reduce`` / ``accumulate`` / ``outer`` for the ufuncs that have a
    reduction or scan in the ISA."""
    from . import reductions as R
    from .logic import ew  # noqa: F401

    name = u.__name__
    if method == "outer" and len(inputs) == 2:
        a, b = (value(x, name, f"x{i + 1}") for i, x in enumerate(inputs))
        a = B.reshape(a, (*a.shape, *(1,) * b.ndim))
        return ufuncs.apply(u, (Var(a), Var(b)), dtype)
    if method in ("reduce", "accumulate") and len(inputs) == 1:
        x = value(inputs[0], name, "array")
        if method == "accumulate" and name in ("add", "multiply"):
            return R.scan(x, 0, dtype, "cumsum" if name == "add" else "cumprod")
        red = {"add": lambda: R.total(x, 0, dtype),
               "multiply": lambda: R.total(x, 0, dtype, func="prod", op=B.Op.RPROD),
               "maximum": lambda: R.extreme(x, 0),
               "minimum": lambda: R.extreme(x, 0, func="min", op=B.Op.RMIN),
               "logical_and": lambda: R.truth_reduce(x, 0, func="all"),
               "logical_or": lambda: R.truth_reduce(x, 0, func="any")}.get(name)
        if method == "reduce" and red is not None:
            return red()
    raise unsupported(f"{name}.{method}", "method", "this ufunc method is not traced")


def trace(fn: Callable[..., Any], specs: Sequence[tuple[DType, tuple[int, ...]]],
          name: str = "") -> tuple[Program, list[np.ndarray], list[Baked]]:
    """Trace ``fn`` on one ``Traced`` per argument spec: the program, the NumPy arrays
    it reads as hidden inputs (after the arguments, in order) and those it baked in as
    constants (with their contents then: the trace holds while they do)."""
    args = [Traced(B.ldg(i, d, s), view=ARG) for i, (d, s) in enumerate(specs)]
    with tracing(len(specs)) as t, drawing(t.seed), generators_unchanged(fn):
        result = fn(*args)
        outs = result if isinstance(result, (tuple, list)) else (result,)
        stores = [B.stg(_output(o, i, t), i) for i, o in enumerate(outs)]
    inputs = [*specs, *((to_dtype(a.dtype), a.shape) for a in t.arrays)]
    return Program(stores, inputs, name=name), list(t.arrays), list(t.baked)


def _output(o: Any, i: int, t: Trace) -> Value:
    if isinstance(o, Var):
        return o.v
    if isinstance(o, (np.ndarray, np.generic, bool, int, float)):
        raise unsupported("return", f"output {i}", f"the function returned a "
                          f"{type(o).__name__} that does not depend on its arguments; "
                          "return traced values (compute constants outside @hg.jit)")
    raise unsupported("return", f"output {i}", f"a {type(o).__name__} is not an array; "
                      "return a traced value or a tuple of them")


__all__ = ["Traced", "trace", "wrap"]
