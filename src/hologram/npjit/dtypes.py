"""NumPy dtypes of traced values and NumPy's own promotion rules.

Which dtype a ufunc computes in is NumPy's decision (``ufunc.resolve_dtypes``, with
Python scalars passed as their type: NEP 50's weak scalars), so ``x32 * 2.0`` stays
float32, ``i32 + 1`` int32 and ``np.sqrt(i32)`` float64, exactly as NumPy does it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..isa import dtypes as isa_dtypes
from ..isa.builder import Var
from ..isa.dtypes import DType
from .errors import unsupported

#: NumPy dtype -> the ISA dtype a traced value of it has.
TRACEABLE: dict[np.dtype, DType] = {
    np.dtype(np.float16): isa_dtypes.f16,
    np.dtype(np.float32): isa_dtypes.f32,
    np.dtype(np.float64): isa_dtypes.f64,
    **{np.dtype(d.np_dtype): d for d in isa_dtypes.INTEGERS},  # int8..int64, uint8..uint64
    np.dtype(np.bool_): isa_dtypes.boolean,
}
NAMES = ", ".join(str(d) for d in TRACEABLE)
F64 = np.dtype(np.float64)
I64 = np.dtype(np.int64)
BOOL = np.dtype(np.bool_)


def to_isa(d: Any, func: str, arg: str) -> DType:
    """The ISA dtype of NumPy dtype ``d``; another dtype is a clear error."""
    try:
        npd = np.dtype(d)
    except TypeError:
        raise unsupported(func, arg, f"{d!r} is not a dtype") from None
    row = TRACEABLE.get(npd)
    if row is None:
        raise unsupported(func, arg, f"dtype {npd} cannot be traced (traced values are "
                                     f"{NAMES})")
    return row


def to_numpy(d: DType) -> np.dtype:
    return np.dtype(d.np_dtype)


def of(x: Any) -> Any:
    """What ``resolve_dtypes`` takes for operand ``x``: a traced value's or an array's
    dtype, or the Python type of a Python scalar (a weak scalar)."""
    if isinstance(x, Var):
        return to_numpy(x.v.dtype)
    if isinstance(x, (np.ndarray, np.generic)):  # np.float64 is also a Python float
        return x.dtype
    if isinstance(x, bool):
        return bool
    if isinstance(x, int):
        return int
    if isinstance(x, float):
        return float
    if isinstance(x, (np.ndarray, np.generic)):
        return x.dtype
    return np.asarray(x).dtype


def result_type(*operands: Any) -> np.dtype:
    """``np.result_type`` with NEP 50's weak Python scalars."""
    return np.result_type(*(o if isinstance(o, (bool, int, float))
                            and not isinstance(o, np.generic) else of(o) for o in operands))


def default_float(d: np.dtype) -> np.dtype:
    """The float dtype NumPy's mean and var compute integer and bool input in."""
    return d if d.kind == "f" else F64
