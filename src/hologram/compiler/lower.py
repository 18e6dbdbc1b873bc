"""Lowering: canonical program -> schedule -> rendered source, with its slot table.

Scheduling and rendering agree on what must be materialized by retrying: the
renderer raises NeedsMaterialize for a value it cannot inline, the value joins
the forced set, and planning runs again (each retry adds one buffer, so this
ends within the program's size).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..isa.dtypes import i64
from ..isa.index_errors import index_sites, static_index_error
from ..isa.opcodes import Group, Op, group
from ..isa.program import Program
from .operand_layout import gemm_operand_layouts, narrow_operand_layouts
from .schedule import BufRef, GemmPlan, KernelPlan, NeedsMaterialize, Schedule, plan

#: The launch's index-error record (see render_index): [1 + site, bad index], int64.
ERROR_KIND = "err"
ERROR_RECORD = BufRef(ERROR_KIND, 0, i64, (2,))
#: A GEMM step's packed copy of its B operand (compiler/blas.py), passed per launch.
PACKED_KIND = "packed"


def packed_ref(step: int) -> BufRef:
    """The slot-table key of GEMM step ``step``'s packed B (bytes; NULL when not passed)."""
    return BufRef(PACKED_KIND, step, i64, ())  # an opaque blob; its header is int64s


@dataclass
class Lowered:
    schedule: Schedule
    slots: dict[BufRef, int]
    source: str
    n_slots: int
    err_slot: int | None = None  # the index-error record's slot, when the table has one

    @property
    def launches(self) -> int:
        return len(self.schedule.steps)


def slot_table(sched: Schedule, error_slot: bool = False,
               packed: Sequence[int] = ()) -> tuple[dict[BufRef, int], int]:
    """Pointer-table layout shared by every kernel of a program:
    inputs, then outputs, then temps, then the boundary arena; with ``error_slot`` and
    an instruction that indexes at run time, then the launch's index-error record;
    last, one slot per GEMM step in ``packed`` for a packed copy of its B."""
    p = sched.program
    slots: dict[BufRef, int] = {}
    for i, (d, s) in enumerate(p.inputs):
        slots[BufRef("in", i, d, s)] = i
    n_in = len(p.inputs)
    for i, (d, s) in enumerate(p.output_specs):
        slots[BufRef("out", i, d, s)] = n_in + i
    n_out = len(p.output_specs)
    for t in sched.temps:
        slots[t] = n_in + n_out + t.index
    arena_slot = n_in + n_out + len(sched.temps)
    for ref in list(sched.buffers.values()) + [d for st in sched.steps
                                                if not isinstance(st, GemmPlan)
                                                for _, d in (st.all_sinks if isinstance(
                                                    st, KernelPlan) else st.sinks)]:
        if ref.kind == "arena":
            slots[ref] = arena_slot
    n = arena_slot + 1
    if error_slot and index_sites(p.instructions):
        slots[ERROR_RECORD] = n
        n += 1
    for step in packed:
        slots[packed_ref(step)] = n
        n += 1
    return slots, n


def lower(program: Program, render: Callable[[Schedule, dict[BufRef, int]], str],
          error_slot: bool = False,
          packed: Callable[[Schedule], Sequence[int]] | None = None,
          narrow: frozenset[str] = frozenset()) -> Lowered:
    """``error_slot``: the backend passes each launch an index-error record (render_index),
    so kernels report out-of-range indices instead of only clamping them. A program
    with an index into an empty axis cannot run at all: IndexError here. ``packed``:
    the GEMM steps of a schedule that get a slot for a packed copy of B. ``narrow``: the
    16-bit dtypes the backend's GEMM reads in place (``schedule.plan``)."""
    err = static_index_error(program.instructions)
    if err is not None:
        raise err
    program = gemm_operand_layouts(narrow_operand_layouts(program, narrow))
    forced: set[int] = set()
    for _ in range(len(program.instructions) + 2):
        try:
            sched = plan(program, forced, narrow)
            slots, n = slot_table(sched, error_slot, packed(sched) if packed else ())
            return Lowered(sched, slots, render(sched, slots), n, slots.get(ERROR_RECORD))
        except NeedsMaterialize as e:
            forced.update(id(x) for x in e.values)
    raise RuntimeError("scheduling did not converge")  # pragma: no cover


def unfused_launches(program: Program) -> int:
    """Kernel launches if every primitive ran on its own (movement ops are free views)."""
    skip = {Group.MEMORY, Group.MOVEMENT, Group.CONST}
    return sum(1 for v in program.instructions if group(v.op) not in skip)


def compute_instructions(program: Program) -> int:
    return sum(1 for v in program.instructions if v.op not in (Op.LDG, Op.STG))
