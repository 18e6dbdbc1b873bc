"""Reading an array's data address fast: pointer tables are built on every launch."""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable

import numpy as np


def _data_pointer_reader() -> Callable[[np.ndarray], int]:
    """The fastest correct way to read an array's data address.

    ``a.__array_interface__`` builds a dict per call (1.7 us measured); a launch with
    20 operands spent 24 us on its pointer table. CPython's ``id`` is the object's
    address and NumPy's array struct starts with the data pointer right after the
    object header, so reading that word costs 0.2 us. The layout is checked here on
    a view (whose data pointer is not its base's) before it is trusted.
    """
    def portable(a: np.ndarray) -> int:
        return a.__array_interface__["data"][0]

    if sys.implementation.name != "cpython":
        return portable
    offset = 2 * ctypes.sizeof(ctypes.c_void_p)  # PyObject_HEAD: refcount, type
    read = ctypes.c_void_p.from_address
    probes = [np.arange(16, dtype=np.float32)[5:], np.zeros((3, 4))[1:, 2:], np.empty(0)]
    if not all(read(id(p) + offset).value == portable(p) for p in probes):
        return portable
    nd = np.ndarray

    def fast(a: np.ndarray) -> int:  # exact ndarrays only: a NumPy scalar has no pointer
        return read(id(a) + offset).value if type(a) is nd else portable(a)

    return fast


data_pointer = _data_pointer_reader()


__all__ = ["data_pointer"]
