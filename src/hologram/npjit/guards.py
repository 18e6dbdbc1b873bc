"""When a jitted function's trace goes stale: the scalars and arrays it reads from
closure cells and module globals.

A trace bakes Python and NumPy scalars in as constants and reads captured arrays as
hidden inputs, so rebinding either (``alpha = 0.7``, ``w = new_array``) must make a
new trace. The guard records, at trace time, every closure cell and global name the
function (and the Python functions it calls through them, one level down) reads
that holds a scalar or an array, and checks them on each call: a dict lookup each.
Changing a large captured array's contents in place needs no new trace (the program
reads it at every call); a small one's contents are constants of the program, so the
guard also compares each such array with the bytes the trace baked in
(``watch_contents``), wherever the array was reached from. Rebinding values reached
through attributes or containers (``self.w``, ``params["w"]``) is not watched: the
README says so.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import numpy as np

from .lift import Baked

_SCALARS = (bool, int, float, np.generic)
_MISSING = object()


def _watched(v: Any) -> bool:
    return isinstance(v, (np.ndarray, *_SCALARS))


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return False
    return type(a) is type(b) and (a == b or (a != a and b != b))


def _names(code: types.CodeType) -> set[str]:
    out = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out |= _names(c)
    return out


class Guard:
    """The closure cells and globals a trace depends on, with the values it saw."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.cells: list[tuple[Any, Any]] = []
        self.globals: list[tuple[dict[str, Any], str, Any]] = []
        self.baked: list[Baked] = []
        self._scan(fn, depth=0, seen=set())

    def watch_contents(self, baked: list[Baked]) -> None:
        """Also hold only while these arrays keep the contents the trace baked in."""
        self.baked.extend(baked)

    def _scan(self, fn: Any, depth: int, seen: set[int]) -> None:
        fn = getattr(fn, "__wrapped__", fn)
        code = getattr(fn, "__code__", None)
        if code is None or id(fn) in seen:
            return
        seen.add(id(fn))
        for cell in fn.__closure__ or ():
            try:
                v = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            self._record_cell(cell, v, depth, seen)
        g = fn.__globals__
        for name in sorted(_names(code)):
            v = g.get(name, _MISSING)
            if _watched(v):
                self.globals.append((g, name, v))
            elif isinstance(v, types.FunctionType) and depth < 1:
                self._scan(v, depth + 1, seen)

    def _record_cell(self, cell: Any, v: Any, depth: int, seen: set[int]) -> None:
        if _watched(v):
            self.cells.append((cell, v))
        elif isinstance(v, types.FunctionType) and depth < 1:
            self._scan(v, depth + 1, seen)

    def holds(self) -> bool:
        """Whether every watched cell and global still holds what the trace saw."""
        for cell, v in self.cells:
            try:
                now = cell.cell_contents
            except ValueError:
                return False
            if not _same(now, v):
                return False
        return (all(_same(g.get(name, _MISSING), v) for g, name, v in self.globals)
                and all(b.holds() for b in self.baked))

    def __bool__(self) -> bool:
        return bool(self.cells or self.globals or self.baked)


__all__ = ["Guard"]
