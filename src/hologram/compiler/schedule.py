"""Scheduling: which values live in memory, and which kernels compute them.

A value is *materialized* (has a buffer) when it is a program input, a Φ load,
an output, a GEMM result, or something a kernel cannot recompute cheaply (a
reduction whose result is needed at coordinates the consuming kernel does not
iterate once per outer index). Everything else is inlined into the kernels that
use it, so element-wise chains, and reductions with the element-wise work that
feeds and follows them, become one loop nest that reads each input once.

The renderer decides whether a reduction can be hoisted; when it cannot it asks
for the value to be materialized (``NeedsMaterialize``) and scheduling retries,
so the rule lives in one place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..isa.dtypes import DType
from ..isa.opcodes import ELEMENTWISE, MOVEMENT, Op, group
from ..isa.program import Program
from ..isa.value import Shape, Value


@dataclass(frozen=True)
class BufRef:
    """Where a materialized value lives: input i, output i, temp i, or the arena."""

    kind: str  # 'in' | 'out' | 'tmp' | 'arena'
    index: int
    dtype: DType
    shape: Shape
    offset: int = 0  # byte offset (arena only)

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


@dataclass
class KernelPlan:
    """One loop nest computing ``sinks`` (value, destination) over ``value.shape``."""

    name: str
    sinks: list[tuple[Value, BufRef]]


@dataclass
class GemmPlan:
    """A library matrix product into ``out``; operands are read through NumPy views."""

    value: Value
    out: BufRef


@dataclass
class Schedule:
    program: Program
    steps: list[KernelPlan | GemmPlan] = field(default_factory=list)
    buffers: dict[int, BufRef] = field(default_factory=dict)  # id(value) -> where it lives
    temps: list[BufRef] = field(default_factory=list)

    @property
    def kernel_count(self) -> int:
        return len(self.steps)


class NeedsMaterialize(Exception):
    """Raised by the renderer: this value must be computed into a buffer first."""

    def __init__(self, value: Value) -> None:
        super().__init__(f"{value.op} needs its own buffer")
        self.value = value


def view_chain(v: Value, buffers: dict[int, BufRef]) -> tuple[Value, list[Value]]:
    """(root, views): the first value under ``v``'s movement ops that is computed or
    materialized, and those ops from the root up to ``v`` (innermost first). Movement
    ops are strided views (a GEMM reads them in place); a CONCAT is not one: its parts
    live in different buffers, so a kernel computes it."""
    chain = []
    while id(v) not in buffers and v.op in MOVEMENT:  # views: read through, never copied
        chain.append(v)
        v = v.srcs[0]
    return v, chain[::-1]


def view_root(v: Value, buffers: dict[int, BufRef]) -> Value:
    """The first value under ``v``'s movement ops that is computed (or materialized)."""
    return view_chain(v, buffers)[0]


def is_view_chain(v: Value, buffers: dict[int, BufRef]) -> bool:
    """True if ``v`` is movement ops over a materialized value (a NumPy view suffices)."""
    return id(view_root(v, buffers)) in buffers


def storage_root(v: Value, buffers: dict[int, BufRef]) -> Value:
    """Follow RESHAPEs of computed values: a reshape's bytes are its source's bytes."""
    while v.op is Op.RESHAPE and id(v.srcs[0]) not in buffers:
        v = v.srcs[0]
    return v


def plan(program: Program, forced: set[int]) -> Schedule:
    """Assign buffers and order the steps; ``forced`` are ids the renderer asked for.

    Steps come out in program order, which is topological, so every buffer is
    written before a later step reads it.
    """
    sched = Schedule(program)
    bufs = sched.buffers

    stored: dict[int, list[BufRef]] = {}
    for v in program.instructions:
        if v.op is Op.STG:
            src = v.srcs[0]
            phi = v.attr("phi")
            if phi is None:
                dst = BufRef("out", v.attr("out"), src.dtype, src.shape)
            else:
                dst = BufRef("arena", 0, src.dtype, src.shape, _phi_bytes(phi))
            stored.setdefault(id(src), []).append(dst)

    homes: dict[int, BufRef] = {}

    def home(v: Value) -> BufRef:
        if id(v) in homes:
            return homes[id(v)]
        dsts = stored.get(id(v))
        if dsts:
            ref = dsts[0]
        else:
            ref = BufRef("tmp", len(sched.temps), v.dtype, v.shape)
            sched.temps.append(ref)
        homes[id(v)] = ref
        return ref

    users = users_of(program)
    claimed: set[int] = set()  # values a GEMM result is already computed in place of

    for v in program.instructions:
        if v.op is Op.STG:
            continue
        if v.op is Op.LDG:
            phi = v.attr("phi")
            bufs[id(v)] = (BufRef("in", v.attr("in"), v.dtype, v.shape) if phi is None else
                           BufRef("arena", 0, v.dtype, v.shape, _phi_bytes(phi)))
            copies = stored.get(id(v), [])
        elif v.op is Op.GEMM:
            for s in v.srcs:
                if not is_view_chain(s, bufs):
                    # Materialize the computed value under the view chain, not the view:
                    # BLAS reads a transposed or batched view in place, while
                    # materializing the view would copy it through a strided loop.
                    root = view_root(s, bufs)
                    forced.add(id(root))
                    raise NeedsMaterialize(root)
            into = None if id(v) in stored else _in_place_target(v, users, stored, forced)
            # One product per buffer: the tail of x @ a + y @ b has two in-place candidates,
            # and the second GEMM would overwrite the first before the tail reads both.
            if into is not None and id(into) not in claimed:
                ref = home(into)
                if ref.kind in ("out", "tmp"):
                    claimed.add(id(into))
                    homes[id(v)] = ref
            bufs[id(v)] = home(v)
            sched.steps.append(GemmPlan(v, bufs[id(v)]))
            copies = stored.get(id(v), [])[1:]
        elif id(v) in forced or id(v) in stored:
            bufs[id(v)] = home(v)
            copies = stored.get(id(v), [bufs[id(v)]])
        else:
            continue
        if copies:
            sched.steps.append(KernelPlan(f"k{len(sched.steps)}", [(v, d) for d in copies]))
    return sched


def users_of(program: Program) -> dict[int, list[Value]]:
    """id(value) -> the distinct instructions that read it (STG included)."""
    users: dict[int, list[Value]] = {}
    for v in program.instructions:
        for s in {id(x): x for x in v.srcs}.values():
            users.setdefault(id(s), []).append(v)
    return users


def elementwise_sink(v: Value, users: dict[int, list[Value]],
                     materialized: Callable[[Value], bool]) -> Value | None:
    """The one materialized value every read of ``v`` ends in, or None.

    Every reader of ``v``, directly or through readers that are inlined (not
    ``materialized``), must be element-wise at ``v``'s shape, and all of them must end
    in the same materialized value. That value's kernel is then the only one to read
    ``v``, and it reads ``v[i]`` only to write element ``i``. A store, a movement op,
    a reduction, a GEMM, another shape or a second materialized reader gives None, as
    does a ``v`` nothing reads.
    """
    sink: Value | None = None
    seen = {id(v)}
    stack = [v]
    while stack:
        for u in users.get(id(stack.pop()), []):
            if id(u) in seen:
                continue
            seen.add(id(u))
            if u.op is Op.STG or group(u.op) not in ELEMENTWISE or u.shape != v.shape:
                return None
            if materialized(u):
                if sink is not None:
                    return None  # two kernels would read v
                sink = u
            else:
                stack.append(u)
    return sink


def _in_place_target(g: Value, users: dict[int, list[Value]], stored: dict[int, list[BufRef]],
                     forced: set[int]) -> Value | None:
    """The value a GEMM result ``g`` may be computed in place of, or None.

    The common shape after a GEMM is an element-wise tail into one materialized value:
    ``gelu(x @ w + b)`` stored, or a ReLU backward's mask applied to the product.
    Written into the tail's buffer, the product needs no temp of its own, and the tail
    reads and writes the same element (in the GEMM's epilogue, on the tile in cache).
    That is right when ``g``'s reads all end in one materialized value (stored or
    ``forced``) of ``g``'s dtype (:func:`elementwise_sink`).
    """
    sink = elementwise_sink(g, users, lambda u: id(u) in stored or id(u) in forced)
    return sink if sink is not None and sink.dtype == g.dtype else None


def _phi_bytes(phi: tuple[int, int, int]) -> int:
    c, p, b = phi
    return (c * 48 + p) * 256 + b
