"""The dtype table of the Atlas ISA.

One row per dtype: every backend (C renderer, DLPack, NumPy interop) reads the
same row instead of keeping its own ``if dtype == ...`` chain.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import DTypeError

try:  # bfloat16 has no NumPy dtype of its own; ml_dtypes provides one if installed.
    import ml_dtypes as _ml_dtypes

    _BF16 = np.dtype(_ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the environment
    _BF16 = None

# DLPack type codes (dlpack.h, DLDataTypeCode).
DL_INT, DL_UINT, DL_FLOAT, DL_BFLOAT, DL_BOOL = 0, 1, 2, 4, 6


@dataclass(frozen=True)
class DType:
    """A row of the dtype table."""

    name: str
    np_dtype: np.dtype | None
    itemsize: int
    ctype: str
    dlpack_code: int
    kind: str  # 'f' float, 'i' integer (signed or unsigned: see ``signed``), 'b' bool
    signed: bool = True  # integers only: whether the range holds negative values
    #: Integers only: the unsigned C type their +, -, * and shifts are computed in, so an
    #: overflow wraps modulo 2**bits as NumPy's does, never C's undefined behaviour
    #: (signed overflow; and int promotion makes uint16 * uint16 a signed int product).
    #: At least 32 bits: narrower operands promote to int before the operation anyway.
    wrap: str = ""

    @property
    def bits(self) -> int:
        return self.itemsize * 8

    @property
    def is_float(self) -> bool:
        return self.kind == "f"

    def __repr__(self) -> str:
        return f"dtypes.{self.name}"

    def __str__(self) -> str:
        return self.name


f16 = DType("f16", np.dtype(np.float16), 2, "_Float16", DL_FLOAT, "f")
bf16 = DType("bf16", _BF16, 2, "__bf16", DL_BFLOAT, "f")
f32 = DType("f32", np.dtype(np.float32), 4, "float", DL_FLOAT, "f")
f64 = DType("f64", np.dtype(np.float64), 8, "double", DL_FLOAT, "f")
i8 = DType("i8", np.dtype(np.int8), 1, "int8_t", DL_INT, "i", True, "uint32_t")
i16 = DType("i16", np.dtype(np.int16), 2, "int16_t", DL_INT, "i", True, "uint32_t")
i32 = DType("i32", np.dtype(np.int32), 4, "int32_t", DL_INT, "i", True, "uint32_t")
i64 = DType("i64", np.dtype(np.int64), 8, "int64_t", DL_INT, "i", True, "uint64_t")
u8 = DType("u8", np.dtype(np.uint8), 1, "uint8_t", DL_UINT, "i", False, "uint32_t")
u16 = DType("u16", np.dtype(np.uint16), 2, "uint16_t", DL_UINT, "i", False, "uint32_t")
u32 = DType("u32", np.dtype(np.uint32), 4, "uint32_t", DL_UINT, "i", False, "uint32_t")
u64 = DType("u64", np.dtype(np.uint64), 8, "uint64_t", DL_UINT, "i", False, "uint64_t")
boolean = DType("bool", np.dtype(np.bool_), 1, "_Bool", DL_BOOL, "b")

ALL: tuple[DType, ...] = (f16, bf16, f32, f64, i8, i16, i32, i64, u8, u16, u32, u64, boolean)
#: The integer dtypes, narrowest first within each signedness.
INTEGERS: tuple[DType, ...] = tuple(d for d in ALL if d.kind == "i")
BY_NAME: dict[str, DType] = {d.name: d for d in ALL}
BY_NUMPY: dict[np.dtype, DType] = {d.np_dtype: d for d in ALL if d.np_dtype is not None}
#: What to install for a dtype NumPy lacks (its ``np_dtype`` is None without it).
NEEDS: dict[str, str] = {"bf16": "ml_dtypes (pip install ml-dtypes, or hologram's "
                                 "'bf16' extra)"}


def numpy_dtype(d: DType, what: str = "dtype") -> np.dtype:
    """``d``'s NumPy dtype, or a DTypeError naming the package that provides it."""
    if d.np_dtype is None:
        raise DTypeError(f"{what}: {d} has no NumPy dtype here; install "
                         f"{NEEDS.get(d.name, 'a package that provides it')}")
    return d.np_dtype


def to_dtype(x: object) -> DType:
    """Turn a DType, a name ('f32', 'float32') or anything NumPy accepts into a DType."""
    if isinstance(x, DType):
        return x
    if isinstance(x, str) and x in BY_NAME:
        return BY_NAME[x]
    try:
        npd = np.dtype(x)  # type: ignore[arg-type]
    except TypeError as e:
        raise DTypeError(f"dtype: {x!r} is not a dtype") from e
    if npd not in BY_NUMPY:
        names = ", ".join(d.name for d in ALL)
        raise DTypeError(f"dtype: {npd} is not an Atlas ISA dtype (expected one of {names})")
    return BY_NUMPY[npd]


def from_dlpack_code(code: int, bits: int) -> DType:
    """The dtype a DLPack (code, bits) pair names."""
    for d in ALL:
        if d.dlpack_code == code and d.bits == bits:
            return d
    raise DTypeError(f"DLPack dtype (code={code}, bits={bits}) has no Atlas ISA dtype")
