"""Lowering: canonical program -> schedule -> rendered source, with its slot table.

Scheduling and rendering agree on what must be materialized by retrying: the
renderer raises NeedsMaterialize for a value it cannot inline, the value joins
the forced set, and planning runs again (each retry adds one buffer, so this
ends within the program's size).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..isa.opcodes import Group, Op, group
from ..isa.program import Program
from .schedule import BufRef, GemmPlan, NeedsMaterialize, Schedule, plan


@dataclass
class Lowered:
    schedule: Schedule
    slots: dict[BufRef, int]
    source: str
    n_slots: int

    @property
    def launches(self) -> int:
        return len(self.schedule.steps)


def slot_table(sched: Schedule) -> tuple[dict[BufRef, int], int]:
    """Pointer-table layout shared by every kernel of a program:
    inputs, then outputs, then temps, then the boundary arena."""
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
                                                for _, d in st.sinks]:
        if ref.kind == "arena":
            slots[ref] = arena_slot
    return slots, arena_slot + 1


def lower(program: Program, render: Callable[[Schedule, dict[BufRef, int]], str]) -> Lowered:
    forced: set[int] = set()
    for _ in range(len(program.instructions) + 2):
        try:
            sched = plan(program, forced)
            slots, n = slot_table(sched)
            return Lowered(sched, slots, render(sched, slots), n)
        except NeedsMaterialize as e:
            forced.add(id(e.value))
    raise RuntimeError("scheduling did not converge")  # pragma: no cover


def unfused_launches(program: Program) -> int:
    """Kernel launches if every primitive ran on its own (movement ops are free views)."""
    skip = {Group.MEMORY, Group.MOVEMENT, Group.CONST}
    return sum(1 for v in program.instructions if group(v.op) not in skip)


def compute_instructions(program: Program) -> int:
    return sum(1 for v in program.instructions if v.op not in (Op.LDG, Op.STG))
