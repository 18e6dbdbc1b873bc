"""The op library's one path from a call to a launch.

An op names its program by a key (op name, shapes, dtype, parameters); the
program is built once per key, compiled once per executor, and every later call
is a dict lookup, argument checks, and a launch on views of the caller's buffers.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..buffer import Buffer
from ..errors import ArgumentTypeError, DTypeError, ShapeError
from ..executor import Executor
from ..isa.builder import program as build_program
from ..isa.dtypes import DType
from ..isa.program import Program
from ..isa.value import _attr_key

_PROGRAMS: dict[tuple, Program] = {}
_LOCK = threading.Lock()


def cached_program(key: tuple, fn: Callable, specs: Sequence[tuple[DType, tuple[int, ...]]]
                   ) -> Program:
    """The program for ``key``, built from ``fn`` over inputs ``specs`` the first time."""
    key = _attr_key(key)  # -0.0 and 0.0 name different programs
    p = _PROGRAMS.get(key)
    if p is None:
        with _LOCK:
            p = _PROGRAMS.get(key)
            if p is None:
                p = build_program(fn, specs, name=str(key[0]))
                _PROGRAMS[key] = p
    return p


def check_executor(executor: Any) -> Executor:
    if not isinstance(executor, Executor):
        raise ArgumentTypeError(
            f"exec: expected a hologram Executor, got {type(executor).__name__}"
        )
    executor._check_open()
    return executor


def resolve_n(n: Any, first: Buffer, name: str = "n") -> int | None:
    """``n`` defaults to the first buffer's size; None keeps the buffer's own shape."""
    if n is None:
        return None
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise ArgumentTypeError(f"{name}: expected an int, got {type(n).__name__}")
    if n < 0:
        raise ShapeError(f"{name}: must be >= 0, got {n}")
    return int(n)


def operand(executor: Executor, buf: Any, name: str, count: int | None = None,
            dtype: DType | None = None, write: bool = False,
            shape: tuple[int, ...] | None = None) -> np.ndarray:
    """Check ``buf`` and return the array view the kernel reads or writes.

    ``count``: the first ``count`` elements, flat. ``shape``: exactly that many
    elements in that shape (the buffer may hold more; the leading ones are used).
    """
    if not isinstance(buf, Buffer):
        raise ArgumentTypeError(f"{name}: expected a hologram Buffer, got {type(buf).__name__}")
    buf._check(executor, name)
    if dtype is not None and buf.isa_dtype is not dtype:
        raise DTypeError(f"{name}: expected dtype {dtype}, got {buf.isa_dtype}")
    if write and not buf.writable:
        from ..errors import BufferStateError

        raise BufferStateError(f"{name}: the buffer is read-only")
    a = buf.view()
    if shape is not None:
        need = math.prod(shape)  # exact: np.prod would overflow on a huge n
        if buf.size < need:
            raise ShapeError(f"{name}: has {buf.size} elements, needs {need} {list(shape)}")
        return a.reshape(-1)[:need].reshape(shape) if a.shape != shape else a
    if count is None:
        return a
    if buf.size < count:
        raise ShapeError(f"{name}: has {buf.size} elements, n={count} needs at least {count}")
    return a.reshape(-1)[:count]


def float_dtype(buf: Any, name: str) -> DType:
    if isinstance(buf, Buffer) and not buf.isa_dtype.is_float:
        raise DTypeError(f"{name}: expected a floating-point buffer, got {buf.isa_dtype}")
    if not isinstance(buf, Buffer):
        raise ArgumentTypeError(f"{name}: expected a hologram Buffer, got {type(buf).__name__}")
    return buf.isa_dtype


BOUND_LIMIT = 256  # bound launches kept per executor (oldest dropped first)


def fast_call(executor: Any, key: tuple, bufs: tuple) -> bool:
    """Repeat a launch bound earlier for exactly these buffer objects; False if none.

    This is the hot path of repeated eager calls: one dict lookup, identity and
    liveness checks, and the native call. Everything else was checked at binding.
    """
    bound = getattr(executor, "_bound", None)
    if bound is None:
        return False
    entry = bound.get(key)
    if entry is None:
        return False
    refs, call = entry
    for r, buf in zip(refs, bufs, strict=True):
        if r() is not buf or buf._freed:
            bound.pop(key, None)  # another thread may have dropped it already
            return False
    call()
    return True


def launch(executor: Executor, program: Program, ins: Sequence[np.ndarray],
           outs: Sequence[np.ndarray], key: tuple | None = None,
           bufs: tuple[Buffer, ...] = ()) -> None:
    """Launch now; with ``key``, also remember the bound launch for ``fast_call``."""
    if key is None:
        executor.launch(program, ins, outs)
        return
    call = executor.bind(program, ins, outs)
    bound = executor._bound
    if len(bound) >= BOUND_LIMIT:
        try:  # drop the oldest; another thread may be changing the dict meanwhile
            bound.pop(next(iter(bound)), None)
        except (RuntimeError, StopIteration):
            pass
    bound[key] = (tuple(weakref.ref(b) for b in bufs), call)
    call()
