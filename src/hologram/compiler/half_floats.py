"""16-bit floats (f16, bf16) in the C dialects: stored narrow, computed in float.

The ISA's meaning of an f16/bf16 instruction is the reference interpreter's, which is
NumPy's (ml_dtypes' for bf16): each instruction computes in float and rounds its result
to the dtype, to nearest even. A dialect that computed in the narrow type itself (C's
``_Float16`` with GCC's excess precision) or only rounded on the store would give other
bits, so both C dialects render these dtypes the same way:

* a local of the dtype is a ``float`` holding a value of the dtype: every declaration
  rounds (``round``), except a load, whose value is the dtype's already;
* buffers hold the storage type; ``load`` and ``store`` convert between it and float
  (CUDA's ``__half``/``__nv_bfloat16`` convert implicitly; the CPU's f16 and bf16
  storage is a struct over the uint16 bits, so a load or store the renderer forgot to
  convert is a compile error rather than an integer read as a number);
* literals are rounded to the dtype in Python; reductions accumulate in float.

The tables of spellings (``HalfType``) are the dialects' own (render_c.C_HALF,
render_cuda.HALF); the rules above are :class:`HalfFloats`, mixed into both renderers.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..isa.dtypes import DType
from ..isa.opcodes import Op
from ..isa.value import Value


@dataclass(frozen=True)
class HalfType:
    """How one dialect spells a 16-bit float dtype."""

    storage: str  # the element type of buffers
    round: str  # float or double (C: a macro or overload) -> the nearest dtype value, a float
    load: str  # storage element {0} -> float
    store: str  # float {0} (a value of the dtype) -> storage element
    prelude: str  # definitions the kernels need, emitted once per source when used


#: A load of one element of a 16-bit float buffer (``ptr()``'s names: p<slot>_<dtype>);
#: its index may read a table (a folded CONCAT's ``t3[tap][0]``: ``render_c.folded_parts``).
LOAD = re.compile(r"p\d+_b?f16(?:_\d+)?\[(?:[^\[\]]|\[[^\[\]]*\])*\]")
#: Element-wise templates of 16-bit floats that round inside the instruction, as the
#: ISA's meaning does: MAD is a product rounded to the dtype, then a sum ({R}: round).
HALF_TEMPLATES = {Op.MAD: "({R}({0} * {1}) + {2})"}


def rounded(value: float, d: DType) -> float | None:
    """``value`` rounded to ``d`` (None where NumPy has no such dtype here)."""
    if d.np_dtype is None:
        return None
    return float(np.asarray(value, dtype=np.float64).astype(d.np_dtype))


def _whole_call(code: str, fn: str) -> bool:
    """Whether ``code`` is one call ``fn(...)``: its first parenthesis closes at its end
    (``f(a) + f(b)`` is not)."""
    if not code.startswith(fn + "(") or not code.endswith(")"):
        return False
    depth = 0
    for i, ch in enumerate(code[len(fn):]):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0:
            return i == len(code) - len(fn) - 1
    return False


class HalfFloats:
    """The renderer hooks for 16-bit floats (see the module docstring); a dialect sets
    ``HALF`` (dtype name -> its spelling) and mixes this in before its base renderer."""

    HALF: ClassVar[dict[str, HalfType]] = {}
    halves: set[str]

    def half(self, d: DType) -> HalfType | None:
        """``d``'s spelling if it is a 16-bit float (its prelude is then emitted)."""
        half = self.HALF.get(d.name)
        if half is not None:
            if not hasattr(self, "halves"):
                self.halves = set()
            self.halves.add(d.name)
        return half

    def half_preludes(self) -> list[str]:
        """The preludes of the 16-bit floats the kernels used, in a fixed order."""
        return [self.HALF[n].prelude for n in sorted(getattr(self, "halves", ()), reverse=True)]

    def ctype(self, d: DType) -> str:
        if self.half(d) is not None:
            return "float"
        return super().ctype(d)  # type: ignore[misc]

    def storage_type(self, d: DType) -> str:
        half = self.half(d)
        return self.ctype(d) if half is None else half.storage

    def accumulator_type(self, d: DType) -> str:
        return "float" if d.name in self.HALF else super().accumulator_type(d)  # type: ignore[misc]

    def template(self, op: Op, d: DType) -> str:
        half = self.half(d)
        if half is not None and op in HALF_TEMPLATES:
            return HALF_TEMPLATES[op].replace("{R}", half.round)
        return super().template(op, d)  # type: ignore[misc]

    def load_element(self, d: DType, code: str) -> str:
        """A buffer element ``code`` read as a computing value."""
        half = self.half(d)
        return code if half is None else half.load.format(code)

    def store_value(self, d: DType, code: str) -> str:
        """A computed value ``code`` of ``d`` as a buffer element."""
        half = self.half(d)
        return code if half is None else half.store.format(code)

    def combine_code(self, step: Op, a: str, b: str, d: DType) -> str:
        """A scatter's update reads the element (``a``) as a float."""
        if self.half(d) is not None:
            a = self.load_element(d, a)
        return super().combine_code(step, a, b, d)  # type: ignore[misc]

    def declare(self, name: str, d: DType, code: str) -> str:
        half = self.half(d)
        if half is None:
            return super().declare(name, d, code)  # type: ignore[misc]
        if LOAD.fullmatch(code):  # a stored value is the dtype's already: no rounding
            return f"float {name} = {half.load.format(code)};"
        if _whole_call(code, half.round):  # a CVT's value (cast_code) is rounded already
            return f"float {name} = {code};"
        return f"float {name} = {half.round}({code});"

    def cast_code(self, v: Value, code: str) -> str:
        half = self.half(v.dtype)
        if half is None:
            return super().cast_code(v, code)  # type: ignore[misc]
        if v.srcs[0].dtype.name in ("f32", *self.HALF):
            return f"{half.round}((float)({code}))"
        return f"{half.round}((double)({code}))"  # one rounding, from f64 or an integer

    def narrow(self, code: str, wide: str, d: DType) -> str:
        half = self.half(d)
        return super().narrow(code, wide, d) if half is None else f"{half.round}({code})"  # type: ignore[misc]

    def literal(self, value: float | int | bool, d: DType) -> str:
        if d.name not in self.HALF:
            return super().literal(value, d)  # type: ignore[misc]
        v = float(value)
        if math.isnan(v):
            return "NAN"
        r = rounded(v, d)
        if r is None and not math.isinf(v):  # no NumPy dtype to round with here:
            return f"{self.half(d).round}({v.hex()})"  # type: ignore[union-attr]
        r = v if r is None else r
        if math.isinf(r):
            return "(-INFINITY)" if r < 0 else "INFINITY"
        return f"({r.hex()}f)"
