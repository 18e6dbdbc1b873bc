"""Training graphs without AOT autograd's runtime wrappers.

``aot_autograd`` wraps every compiled forward and backward in general-purpose
runtime code. That code handles input mutations, outputs that alias inputs,
tensor subclasses, RNG state and effect tokens. On the benchmark MLP it cost about
0.3 ms per forward+backward on this machine, more than the whole C work of
hologram's backward program. A graph that has none of those features needs none of
that code. For such graphs this module traces the joint forward-backward graph
once, with ``aot_export_joint_simple``, and splits it with AOT's default partitioner.
Both halves compile as usual, and the pair runs under one small
``torch.autograd.Function``: forward saves what the partitioner chose, backward
passes those and the incoming gradients to the backward program.

What this path refuses, so that :func:`compile_training` returns None and the caller
uses ``aot_autograd``:

- symbolic shapes;
- non-tensor inputs or outputs;
- outputs that are not floating point;
- a graph the export rejects (it mutates an input, or an output aliases an input);
- an output without dynamo's ``example_value`` (its requires_grad is unknown).

Measured with ``benchmarks/bench_torch_train.py`` (MLP step, interleaved; figures in
docs/perf.md, session 4).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from .fx_info import _info_of, _is_concrete

log = logging.getLogger("hologram_torch")

GraphCompiler = Callable[[torch.fx.GraphModule, Sequence[Any]], Callable[..., Any]]


def _outputs(gm: torch.fx.GraphModule) -> list[Any]:
    out = gm.graph.output_node().args[0]
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _differentiable_outputs(gm: torch.fx.GraphModule) -> list[bool] | None:
    """requires_grad of each output as dynamo recorded it, or None if any is unknown
    or not a floating-point tensor."""
    flags = []
    for o in _outputs(gm):
        val = o.meta.get("example_value") if isinstance(o, torch.fx.Node) else None
        if not isinstance(val, torch.Tensor) or not val.dtype.is_floating_point:
            return None
        flags.append(bool(val.requires_grad))
    return flags


def eligible(example_inputs: Sequence[Any]) -> bool:
    """Grad mode on, static shapes, tensor inputs, and something to differentiate."""
    if not torch.is_grad_enabled():
        return False
    if not all(isinstance(a, torch.Tensor) for a in example_inputs):
        return False
    if not all(_is_concrete(_info_of(a)) for a in example_inputs):
        return False  # symbolic shapes
    return any(a.requires_grad for a in example_inputs)


def compile_training(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                     fw_compiler: GraphCompiler, bw_compiler: GraphCompiler,
                     decompositions: dict[Any, Any]) -> Callable[..., Any] | None:
    """The graph as one autograd.Function over compiled halves, or None when the graph
    needs what only AOT autograd's runtime handles (see the module docstring)."""
    from torch._functorch.aot_autograd import aot_export_joint_simple
    from torch._functorch.partitioners import default_partition

    if not eligible(example_inputs):
        return None
    differentiable = _differentiable_outputs(gm)
    if differentiable is None:
        return None
    n_out = len(differentiable)
    try:
        joint = aot_export_joint_simple(gm, tuple(example_inputs), trace_joint=True,
                                        decompositions=decompositions)
        fw_gm, bw_gm = default_partition(joint, None, num_fwd_outputs=n_out)
    except Exception as e:  # noqa: BLE001  (the export's refusals are not one type)
        log.debug("hologram_torch: AOT autograd's wrappers run this graph: %s", e)
        return None
    fw_outs = _outputs(fw_gm)
    if any(not isinstance(o, torch.fx.Node) for o in fw_outs):
        return None  # a saved non-tensor value (e.g. a SymInt)
    n_bw_inputs = len(bw_gm.graph.find_nodes(op="placeholder"))
    if n_bw_inputs != len(fw_outs) - n_out + sum(differentiable):
        return None  # the export's idea of which outputs need gradients differs
    fw = fw_compiler(fw_gm, example_inputs)
    bw = bw_compiler(bw_gm, [])
    constant = [i for i, d in enumerate(differentiable) if not d]

    class HologramFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
            outs = fw(list(args))
            ctx.save_for_backward(*outs[n_out:])
            result = tuple(outs[:n_out])
            if constant:
                ctx.mark_non_differentiable(*(result[i] for i in constant))
            return result

        @staticmethod
        def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
            tangents = [g if g.is_contiguous() else g.contiguous()
                        for i, g in enumerate(grads) if differentiable[i]]
            return tuple(bw([*ctx.saved_tensors, *tangents]))

    def run(*args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return HologramFunction.apply(*args)

    return run
