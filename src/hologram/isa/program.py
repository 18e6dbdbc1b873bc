"""Program: the unit hologram compiles, caches and runs.

A program is its outputs (STG instructions) plus the dtypes and shapes of its
inputs; its instruction list is derived by walking back from the outputs, so
dead code is never part of a program and two programs built from the same
values are equal.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import cached_property

from ..errors import ArgumentTypeError
from .dtypes import DType, to_dtype
from .opcodes import Op, group
from .text import format_program  # at import: every compile hashes the text form
from .value import Shape, Value


class Program:
    """Inputs, outputs and instructions in SSA (definition) order."""

    def __init__(
        self,
        outputs: Sequence[Value],
        inputs: Sequence[tuple[DType | str, Shape]] = (),
        name: str = "",
    ) -> None:
        for o in outputs:
            if not isinstance(o, Value) or o.op is not Op.STG:
                raise ArgumentTypeError(f"outputs: expected stg instructions, got {o!r}")
        self.outputs: tuple[Value, ...] = tuple(outputs)
        self.inputs: tuple[tuple[DType, Shape], ...] = tuple(
            (to_dtype(d), tuple(int(x) for x in s)) for d, s in inputs
        )
        self.name = name

    @cached_property
    def instructions(self) -> tuple[Value, ...]:
        seen: set[int] = set()
        order: list[Value] = []
        for out in self.outputs:
            for v in out.walk():
                if id(v) not in seen:
                    seen.add(id(v))
                    order.append(v)
        return tuple(order)

    @cached_property
    def text(self) -> str:
        return format_program(self)

    @cached_property
    def hash(self) -> str:
        """A stable content hash (of the text form, which names nothing by address)."""
        body = self.text.partition("\n")[2] if self.text.startswith(".name") else self.text
        return hashlib.sha256(body.encode()).hexdigest()

    @property
    def output_specs(self) -> list[tuple[DType, Shape]]:
        by_index = sorted(self.outputs, key=lambda v: v.attr("out", -1))
        return [(v.dtype, v.shape) for v in by_index if v.attr("out") is not None]

    @cached_property
    def uses_arena(self) -> bool:
        """Whether a load or store is Φ-addressed (reads or writes the boundary arena)."""
        return any(v.op in (Op.LDG, Op.STG) and v.attr("phi") is not None
                   for v in self.instructions)

    def count(self) -> dict[str, int]:
        """Instructions by group, for reduction statistics."""
        counts: dict[str, int] = {}
        for v in self.instructions:
            g = group(v.op).value
            counts[g] = counts.get(g, 0) + 1
        return counts

    def verify(self) -> Program:
        from .verify import verify

        verify(self)
        return self

    @classmethod
    def parse(cls, text: str) -> Program:
        from .text import parse_program

        return parse_program(text)

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        n = len(self.instructions)
        return f"<Program {self.name or self.hash[:12]}: {n} instructions>"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Program)
            and self.inputs == other.inputs
            and set(map(id, self.outputs)) == set(map(id, other.outputs))
        )

    def __hash__(self) -> int:
        return hash((self.inputs, frozenset(map(id, self.outputs))))
