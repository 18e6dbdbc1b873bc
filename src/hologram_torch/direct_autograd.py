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
- an output without dynamo's ``example_value`` (its requires_grad is unknown);
- a graph with effect tokens (``with_effects``: an op with a side effect, such as
  ``aten._linalg_check_errors`` after ``linalg.inv``/``cholesky``/``solve``): the
  export threads a token through as an extra input and output, which AOT's runtime
  creates and drops on each call.

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
from .lowering import FREE_IN_EAGER

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


#: Ops that return one view of their first argument (the rest constants). A saved
#: value made by one is recomputed in the backward instead (:func:`_views_to_backward`).
_MOVABLE_VIEWS = FREE_IN_EAGER - {torch.ops.aten.split, torch.ops.aten.split_with_sizes,
                                  torch.ops.aten.chunk, torch.ops.aten.reshape}


def _movable(node: Any) -> bool:
    target = getattr(node, "target", None)
    return (isinstance(node, torch.fx.Node) and node.op == "call_function"
            and isinstance(target, torch._ops.OpOverload)
            and target.overloadpacket in _MOVABLE_VIEWS
            and bool(node.args) and isinstance(node.args[0], torch.fx.Node)
            and not any(isinstance(a, torch.fx.Node) for a in (*node.args[1:],
                                                                *node.kwargs.values())))


def _views_to_backward(fw_gm: torch.fx.GraphModule, bw_gm: torch.fx.GraphModule,
                       n_out: int) -> int:
    """Save the bases of saved views instead of the views; return how many moved.

    AOT's partitioner saves values such as ``t(weight)`` and ``detach(relu)``. Each
    is a PyTorch step after the forward program (hologram runs only compute in
    programs) and one more saved tensor. On the benchmark MLP these steps cost
    15-50 us per training step: the first Python work after a program finds the
    caches emptied by its GEMMs (docs/perf.md, session 5). The backward recomputes
    such a view from its base for free (a view is only layout in a program), so the
    forward saves the base and the backward graph gets the view op. Bases are
    limited to forward inputs and values saved anyway; a view of a view that is
    itself moved stays saved (chains are rare; correctness is unaffected).
    """
    outs = _outputs(fw_gm)
    saved: list[Any] = outs[n_out:]
    bw_ph = list(bw_gm.graph.find_nodes(op="placeholder"))
    if len(bw_ph) < len(saved):
        return 0
    saved_ph = dict(zip(saved, bw_ph, strict=False))  # fw node -> its bw placeholder
    # Only views of what is already saved, or of a forward input: saving another
    # intermediate would make the forward program materialise a value it fused away
    # (the transformer block then ran a batched GEMM through np.matmul, 2x slower).
    moves = [i for i, n in enumerate(saved)
             if _movable(n) and isinstance(n.args[0].meta.get("val"), torch.Tensor)
             and (n.args[0].op == "placeholder"
                  or (n.args[0] in saved_ph and not _movable(n.args[0])))]
    if not moves:
        return 0
    graph = bw_gm.graph
    first_compute = next(n for n in graph.nodes if n.op != "placeholder")
    first_tangent = bw_ph[len(saved)] if len(bw_ph) > len(saved) else first_compute
    for i in moves:
        node = saved[i]
        base = node.args[0]
        base_ph = saved_ph.get(base)
        if base_ph is None:  # the base becomes a saved value of its own
            with graph.inserting_before(first_tangent):
                base_ph = graph.placeholder(f"{base.name}_base")
            base_ph.meta["val"] = base.meta["val"]
            saved_ph[base] = base_ph
            saved.append(base)
        with graph.inserting_before(first_compute):
            view = graph.call_function(node.target, (base_ph, *node.args[1:]),
                                       dict(node.kwargs))
        old_ph = bw_ph[i]
        view.meta.update(old_ph.meta)
        old_ph.replace_all_uses_with(view)
        graph.erase_node(old_ph)
        saved[i] = None
    fw_gm.graph.output_node().args = (tuple(outs[:n_out] + [v for v in saved if v is not None]),)
    for node in {outs[n_out + i] for i in moves}:  # a value saved twice is erased once
        if not node.users:
            fw_gm.graph.erase_node(node)
    for gm in (fw_gm, bw_gm):
        gm.graph.lint()
        gm.recompile()
    return len(moves)


_WITH_EFFECTS = torch.ops.higher_order.with_effects


def _unsupported_joint(joint: torch.fx.GraphModule, n_inputs: int, n_out: int) -> str | None:
    """Why the exported joint graph is not the plain ``(inputs, tangents) -> (outputs,
    input grads)`` this path runs, or None if it is.

    Effect tokens are the known case: each effectful op adds a token placeholder before
    the inputs and a token output before the outputs, so the counts no longer match the
    call's arguments (the forward program was handed one argument too few)."""
    if any(n.target is _WITH_EFFECTS for n in joint.graph.nodes if n.op == "call_function"):
        return "it carries effect tokens (with_effects)"
    n_ph = len(joint.graph.find_nodes(op="placeholder"))
    n_outputs = len(_outputs(joint))
    if n_ph > n_inputs + n_out or n_outputs != n_out + n_inputs:
        return (f"the joint graph takes {n_ph} inputs and returns {n_outputs} values for "
                f"{n_inputs} inputs and {n_out} outputs")
    return None


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
    reason = _unsupported_joint(joint, len(example_inputs), n_out)
    if reason is not None:
        log.debug("hologram_torch: AOT autograd's wrappers run this graph: %s", reason)
        return None
    try:
        moved = _views_to_backward(fw_gm, bw_gm, n_out)
    except Exception as e:  # noqa: BLE001 - the graphs may be half edited: use AOT's path
        log.debug("hologram_torch: AOT autograd's wrappers run this graph: moving saved "
                  "views failed: %s", e)
        return None
    log.debug("hologram_torch: %d saved views recomputed in the backward", moved)
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
