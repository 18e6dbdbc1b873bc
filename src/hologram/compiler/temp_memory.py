"""Where a program's temps live: one block per launch, temps that are never in use at
the same time sharing its bytes.

Why: the scheduler gives every materialized intermediate its own temp, and a launch
used to allocate each one. A transformer's program holds hundreds (ViT-B/16 at batch
8: 170 temps, 1118 MB), far past what the output cache keeps (256 MiB), so every
call took fresh pages from the system and the kernels paid a page fault (and the
kernel's zeroing) per page they first wrote: 60-75 ms of a 918 ms call (docs/perf.md,
session 11). Most temps live for a step or two (a layer's activations), so laid out
by lifetime they fit in a small fraction of that, which the cache then keeps mapped
from one call to the next, and the memory a step writes was recently written by an
earlier step (warm in cache) instead of never touched.

The rule: steps run one after another, in schedule order (``hg_run``, or the
launcher's loop), and each reads and writes only the buffers under its expressions
(:func:`step_temps`). A temp is in use from the first step that touches it to the
last; two temps may overlap in memory only when those spans are disjoint. A kernel
fused into the GEMM before it (its epilogue, run per tile while the GEMM still
reads its operands) counts as running at that GEMM's step: ``fused`` maps it there.
So no step ever sees two temps that share bytes, and ``restrict`` and the kernels'
no-aliasing assumptions hold as they did with one allocation per temp.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .schedule import AttentionPlan, BufRef, GemmPlan, KernelPlan, Schedule, Step, step_operands

#: Every temp starts on a cache line (and an AVX-512 vector): the block itself is
#: 64-byte aligned (``memory.boundary.ALIGNMENT``).
TEMP_ALIGNMENT = 64


@dataclass(frozen=True)
class TempLayout:
    """Byte offset of each temp (in ``Schedule.temps`` order) in one block of ``nbytes``."""

    offsets: tuple[int, ...]
    nbytes: int
    separate_nbytes: int  # what one allocation per temp would take (for reports)


def _nbytes(ref: BufRef) -> int:
    return ref.size * ref.dtype.itemsize


def step_temps(step: Step, sched: Schedule) -> set[int]:
    """Indices of the temps ``step`` reads or writes: its destinations, its scratch, and
    the buffers under its expressions (a GEMM's: under its operands' views), as
    ``schedule.step_operands`` finds them."""
    bufs = sched.buffers
    refs = [bufs[id(x)] for x in step_operands(step, sched) if id(x) in bufs]
    if isinstance(step, GemmPlan):
        refs.append(step.out)
    else:
        refs.extend(d for _, d in (step.all_sinks if isinstance(step, KernelPlan)
                                   else step.sinks))
        if isinstance(step, KernelPlan):
            refs.extend(step.scratch)
        elif isinstance(step, AttentionPlan) and step.scratch:
            refs.append(step.scratch)
    return {r.index for r in refs if r.kind == "tmp"}


def lifetimes(sched: Schedule, fused: Iterable[int] = ()) -> list[tuple[int, int] | None]:
    """(first, last) step each temp is in use, in ``Schedule.temps`` order (None: no
    step touches it). A step in ``fused`` runs inside the step before it, so it counts
    as that step (the nearest earlier one not fused)."""
    fused = set(fused)
    spans: list[tuple[int, int] | None] = [None] * len(sched.temps)
    at = 0
    for i, step in enumerate(sched.steps):
        if i not in fused:
            at = i
        for t in step_temps(step, sched):
            span = spans[t]
            spans[t] = (at, at) if span is None else (min(span[0], at), max(span[1], at))
    return spans


def _align(n: int) -> int:
    return -(-n // TEMP_ALIGNMENT) * TEMP_ALIGNMENT


def plan_temps(sched: Schedule, fused: Iterable[int] = ()) -> TempLayout:
    """Offsets for the temps of ``sched`` in one block: largest first, each at the lowest
    offset that overlaps no temp already placed whose lifetime meets its own."""
    spans = lifetimes(sched, fused)
    sizes = [_align(_nbytes(t)) for t in sched.temps]
    offsets = [0] * len(sizes)
    placed: list[tuple[int, int, int, int]] = []  # (offset, end, first, last)
    order = sorted(range(len(sizes)), key=lambda t: (-sizes[t], t))
    for t in order:
        span = spans[t]
        if span is None or sizes[t] == 0:
            continue  # never read or written: any address will do
        lo, hi = span
        busy = sorted((o, e) for o, e, a, b in placed if a <= hi and lo <= b)
        off = 0
        for o, e in busy:
            if off + sizes[t] <= o:
                break
            off = max(off, e)
        offsets[t] = off
        placed.append((off, off + sizes[t], lo, hi))
    total = max((e for _, e, _, _ in placed), default=0)
    return TempLayout(tuple(offsets), total, sum(sizes))


__all__ = ["TEMP_ALIGNMENT", "TempLayout", "lifetimes", "plan_temps", "step_temps"]
