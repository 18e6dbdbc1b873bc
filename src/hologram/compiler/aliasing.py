"""May a program write an output over one of its inputs?

Why this exists: an in-place update (an optimizer step, ``x.add_(y)`` under
``torch.compile``) computes new values for a tensor it also reads. Written to a
fresh buffer and copied back, each update costs an allocation and a copy per call,
24 of each per Adam step of the benchmark MLP (docs/perf.md, session 8). Writing the
output straight into the input's memory is right only when no read of the input can
see a value already overwritten.

The rule, checked on a scheduled program: the output is computed by one kernel,
and every read of the input, directly or through values inlined into kernels, is
element-wise at the input's own shape and ends in that kernel. Then the kernel is
the only one to read the input, and it reads element ``i`` only to write element
``i`` (``schedule.elementwise_sink``, the walk that also puts a GEMM's product in
place of its tail). Anything else (a transposed or broadcast read, a reduction, a
GEMM operand, a second kernel, a copy to another output, Φ addressing) answers no:
the caller then copies.
"""

from __future__ import annotations

from ..isa.opcodes import ELEMENTWISE, Op, group
from ..isa.value import Value
from .schedule import GemmPlan, KernelPlan, Schedule, elementwise_sink, users_of

__all__ = ["may_overwrite"]


def _writers(sched: Schedule, out_index: int) -> list[KernelPlan | GemmPlan]:
    def writes(step: KernelPlan | GemmPlan) -> bool:
        refs = [step.out] if isinstance(step, GemmPlan) else [d for _, d in step.all_sinks]
        return any(r.kind == "out" and r.index == out_index for r in refs)

    return [s for s in sched.steps if writes(s)]


def may_overwrite(sched: Schedule, in_index: int, out_index: int) -> bool:
    """True if output ``out_index`` may share memory with input ``in_index``
    (same dtype and shape, the input's own element order)."""
    writers = _writers(sched, out_index)
    if len(writers) != 1 or not isinstance(writers[0], KernelPlan) or writers[0].siblings:
        return False  # e.g. a GEMM computed straight into the output, or several results
    sink: Value = writers[0].sinks[0][0]
    if sink.op is not Op.LDG and group(sink.op) not in ELEMENTWISE:
        return False
    loads = [v for v in sched.program.instructions
             if v.op is Op.LDG and v.attr("in") == in_index]
    if any(v.attr("phi") is not None for v in loads):
        return False
    if any(v.dtype is not sink.dtype or v.shape != sink.shape for v in loads):
        return False
    users = users_of(sched.program)
    for load in loads:
        reads = users.get(id(load), [])
        if load is sink:  # the input stored unchanged: each element onto itself
            ok = all(u.op is Op.STG for u in reads)
        else:
            ok = not reads or elementwise_sink(
                load, users, lambda u: id(u) in sched.buffers) is sink
        if not ok:
            return False
    return True
