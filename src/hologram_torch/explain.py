"""``hologram_torch.explain(model, *inputs)``: what the hologram backend made of a model.

A user who switches to ``backend="hologram"`` needs to know what actually runs
where: which ATen ops became Atlas ISA programs and which stayed in PyTorch (and
why), what kernels the programs compiled to, and how many launches fusion saved.
Guessing from timings is misleading, so this compiles the model afresh with the
hologram backend, runs it once (and its backward, when it has one), and reports
what the backend recorded while planning.
"""

from __future__ import annotations

import itertools
import types
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .compile_backend import BACKEND_NAME, GraphSummary, collect_graphs

__all__ = ["ExplainReport", "explain"]

_fresh_names = itertools.count()


#: Why every op of a graph ran in PyTorch on the explained call (GraphSummary.ran_in_pytorch).
EAGER_FIRST_CALL = ("dynamic shapes: the graph's first call with these shapes ran wholly in "
                    "PyTorch to record them; its programs run from the next call")


@dataclass
class ExplainReport:
    """The backend's record of one explained call; ``str()`` gives a readable report.

    Counts are of what ran on that call: a graph that ran wholly in PyTorch (the first
    call with new shapes under dynamic shapes) adds its ATen ops to ``torch_ops`` and
    its planned programs to nothing but ``planned_programs``."""

    graphs: list[GraphSummary] = field(default_factory=list)
    eager_ops: int = 0  # ATen ops that launch work in eager PyTorch (views excluded)

    @property
    def ran(self) -> list[GraphSummary]:
        """The graphs whose programs ran on the explained call."""
        return [g for g in self.graphs if not g.ran_in_pytorch]

    @property
    def eager_graphs(self) -> list[GraphSummary]:
        """The graphs that ran wholly in PyTorch on the explained call."""
        return [g for g in self.graphs if g.ran_in_pytorch]

    @property
    def hologram_ops(self) -> Counter:
        """ATen op -> how many nodes ran inside hologram programs."""
        total: Counter = Counter()
        for g in self.ran:
            total.update(g.hologram_ops)
        return total

    @property
    def torch_ops(self) -> dict[str, str]:
        """ATen op -> why it ran in PyTorch (the first reason seen)."""
        out: dict[str, str] = {}
        for g in self.graphs:
            if g.ran_in_pytorch:
                for op in (*g.hologram_ops, *(op for op, _ in g.torch_ops)):
                    out.setdefault(op, EAGER_FIRST_CALL)
                continue
            for op, why in g.torch_ops:
                out.setdefault(op, why)
        return out

    @property
    def programs(self) -> int:
        """Programs that ran on the explained call."""
        return sum(len(g.regions) for g in self.ran)

    @property
    def planned_programs(self) -> int:
        """Programs planned for later calls by graphs that ran in PyTorch this time."""
        return sum(len(g.regions) for g in self.eager_graphs)

    @property
    def kernels(self) -> int:
        """Kernel launches the compiled programs make per call (after fusion)."""
        return sum(r.launches_after for g in self.ran for r in g.regions)

    @property
    def launches_before(self) -> int:
        """Launches the same programs would make with one kernel per ISA instruction."""
        return sum(r.launches_before for g in self.ran for r in g.regions)

    @property
    def launches_after(self) -> int:
        return self.kernels

    @property
    def instructions_before(self) -> int:
        return sum(r.instructions_before for g in self.ran for r in g.regions)

    @property
    def instructions_after(self) -> int:
        return sum(r.instructions_after for g in self.ran for r in g.regions)

    @property
    def torch_nodes(self) -> int:
        """ATen nodes that ran in PyTorch (every one of a graph that ran eagerly)."""
        return sum(g.aten_nodes if g.ran_in_pytorch else len(g.torch_ops)
                   for g in self.graphs)

    @property
    def fused(self) -> bool:
        """False when the executor interprets programs (no fusion to report)."""
        return all(r.fused for g in self.ran for r in g.regions)

    def summary_line(self) -> str:
        """One line on the operation reduction, for demos and logs."""
        if not self.launches_before:
            if self.planned_programs:
                return (f"no hologram programs ran: {len(self.eager_graphs)} graph(s) ran in "
                        f"PyTorch ({EAGER_FIRST_CALL})")
            return "no hologram programs were made"
        pct = 100.0 * (1.0 - self.launches_after / self.launches_before)
        eager = (f"; {len(self.eager_graphs)} graph(s) ran wholly in PyTorch (dynamic shapes, "
                 "first call)" if self.eager_graphs else "")
        return (f"{self.eager_ops} eager ATen kernel ops -> {self.programs} hologram program(s) "
                f"+ {self.torch_nodes} PyTorch op(s); ISA launches {self.launches_before} -> "
                f"{self.launches_after} ({pct:.0f}% fewer), instructions "
                f"{self.instructions_before} -> {self.instructions_after}{eager}")

    def __str__(self) -> str:
        lines = [f"hologram explain: {len(self.graphs)} graph(s), "
                 f"executor {self.graphs[0].executor if self.graphs else '-'}"]
        for g in self.graphs:
            if g.ran_in_pytorch:
                lines.append(f"== {g.kind} graph: {g.aten_nodes} ATen nodes, all ran in "
                             f"PyTorch on this call ({EAGER_FIRST_CALL}); planned: "
                             f"{len(g.regions)} program(s), {len(g.torch_ops)} in PyTorch ==")
            else:
                lines.append(f"== {g.kind} graph: {g.aten_nodes} ATen nodes, "
                             f"{len(g.regions)} program(s), {len(g.torch_ops)} in PyTorch ==")
            for r in g.regions:
                ops = ", ".join(f"{op} x{n}" for op, n in sorted(r.aten_ops.items()))
                planned = " (planned, not run on this call)" if g.ran_in_pytorch else ""
                lines.append(f"  program {r.number}{planned}: {sum(r.aten_ops.values())} "
                             f"ATen ops [{ops}]")
                note = "" if r.fused else " (interpreted: this executor does not fuse)"
                lines.append(f"    instructions {r.instructions_before} -> "
                             f"{r.instructions_after}, launches {r.launches_before} -> "
                             f"{r.launches_after}{note}")
                if r.kernels:
                    lines.append(f"    kernels: {', '.join(r.kernels)}")
                if r.in_place_updates:
                    lines.append(f"    in-place updates: {r.in_place_updates} graph inputs "
                                 f"written by the program (no copy)")
            for (op, why), n in Counter(g.torch_ops).items():
                times = f" x{n}" if n > 1 else ""
                lines.append(f"  in PyTorch: {op}{times}: {why}")
        lines.append("operation reduction: " + self.summary_line())
        return "\n".join(lines)


def _autograd_leaves(outputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The leaf tensors (parameters, inputs) the outputs' gradients flow to."""
    leaves: list[torch.Tensor] = []
    seen: set[int] = set()
    stack = [o.grad_fn for o in outputs if o.grad_fn is not None]
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        var = getattr(fn, "variable", None)
        if isinstance(var, torch.Tensor):
            leaves.append(var)
        stack.extend(nxt for nxt, _ in fn.next_functions)
    return leaves


def _fresh_caller(target: Callable[..., Any]) -> Callable[..., Any]:
    """A function with a code object of its own, so dynamo compiles it anew.

    Dynamo caches compiled code per code object; explaining twice (or a model the
    user already compiled) must not reuse, or count against, that cache.
    """

    def call(*args: Any) -> Any:
        return target(*args)

    code = call.__code__.replace(co_name=f"hologram_explain_{next(_fresh_names)}")
    return types.FunctionType(code, call.__globals__, code.co_name, None, call.__closure__)


def _tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _tensors(item)]
    if isinstance(x, dict):
        return [t for item in x.values() for t in _tensors(item)]
    return []


def explain(model: Callable[..., Any], *inputs: Any, backward: bool | None = None,
            executor: Any = None) -> ExplainReport:
    """Compile ``model`` with the hologram backend, run it on ``inputs``, and report.

    ``backward``: also run the backward pass (None: when an output needs a
    gradient). Gradients are taken with ``torch.autograd.grad``, so no ``.grad``
    of the model changes. ``executor``: as in ``torch.compile(options=...)``.
    """
    options = {"executor": executor} if executor is not None else None
    compiled = torch.compile(_fresh_caller(model), backend=BACKEND_NAME, options=options)
    with collect_graphs() as graphs:
        out = compiled(*inputs)
        outs = [t for t in _tensors(out) if t.requires_grad]
        run_bw = bool(outs) if backward is None else backward
        if run_bw:
            if not outs:
                raise ValueError("explain: backward=True but no output requires a gradient")
            leaves = _autograd_leaves(outs)
            if leaves:
                torch.autograd.grad(outs, leaves, [torch.ones_like(o) for o in outs],
                                    allow_unused=True)
    if not graphs:
        raise RuntimeError("explain: dynamo compiled no graph with the hologram backend "
                           "(was the call traced? see TORCH_LOGS=graph_breaks)")
    return ExplainReport(list(graphs), sum(g.aten_compute_nodes for g in graphs))
