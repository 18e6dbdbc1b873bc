"""The one IndexError an out-of-range index gets, whichever backend finds it.

GATHER, SCATTER and SCATTER_ADD index at coordinates a program computes, so their
range can only be checked as they run. The reference interpreter raises as soon as
it sees a bad index; compiled kernels clamp (never reading or writing outside a
buffer) and record the first bad index, which the backend turns into this same
exception after the launch. Both name the instruction, the axis, its size and the
index, so a user sees one message for one mistake.
"""

from __future__ import annotations

from .opcodes import INDEXED, Op
from .value import Value

__all__ = ["index_sites", "indexed_size", "out_of_range", "static_index_error"]


def indexed_size(v: Value) -> int:
    """The size of the axis ``v``'s index selects along (the table's or the base's)."""
    return v.srcs[0].shape[v.attr("axis")]


def out_of_range(v: Value, bad: int) -> IndexError:
    """The error for index ``bad`` of instruction ``v``."""
    axis, n = v.attr("axis"), indexed_size(v)
    what = "table" if v.op is Op.GATHER else "base"
    return IndexError(f"{v.op}: index {bad} is out of range for axis {axis} of size {n} "
                      f"(the {what} is {v.srcs[0].dtype}{list(v.srcs[0].shape)}, the index "
                      f"{v.srcs[1].dtype}{list(v.srcs[1].shape)}; valid: 0 <= index < {n})")


def index_sites(instructions: tuple[Value, ...] | list[Value]) -> list[Value]:
    """The instructions that index at run time, in program order: a compiled kernel
    reports a bad index by its position in this list."""
    return [v for v in instructions if v.op in INDEXED]


def static_index_error(instructions: tuple[Value, ...] | list[Value]) -> IndexError | None:
    """The error of an instruction every index of which is out of range, known before
    running: the indexed axis is empty while the index has elements. Such a program
    cannot run at all, and a kernel for it would read a buffer with no elements."""
    for v in index_sites(instructions):
        if indexed_size(v) == 0 and v.srcs[1].size:
            return IndexError(f"{v.op}: axis {v.attr('axis')} of the "
                              f"{'table' if v.op is Op.GATHER else 'base'} "
                              f"{list(v.srcs[0].shape)} is empty, so each of the "
                              f"{v.srcs[1].size} indices is out of range")
    return None
