"""ATen ops lowered to Atlas ISA: the translator tables of the ``torch.compile`` backend.

Every ATen op the backend runs in hologram is one row of :data:`ATEN_TABLE`, which
maps the op (an overload packet, such as ``aten.add``) to a translator: a function
over :class:`hologram.isa.builder.Var`. The rows live with their op family, one
module each, so an op is found by what it does:

========================  ===============================================================
module                    ops
========================  ===============================================================
``elementwise``           arithmetic, comparisons, logic, activations, casts, copies
``reductions``            sum, mean, amax/amin, var
``norms``                 softmax, log-softmax, layer norm
``linalg``                mm, addmm, bmm, matmul
``movement``              views, slices, split, cat
``creation``              full, zeros, ones, fill
``losses``                MSE, binary cross-entropy, NLL
========================  ===============================================================

How to add an op: in its family's module, write ``_name(ctx, *args, **kwargs) -> Var``
with the ATen op's own signature (tensor arguments arrive as ``Var``, the rest as
Python values), ask ``ctx`` for the result's dtype and shape (``ctx.out_dtype``,
``ctx.out_shape``), build the result from ``Var`` methods, :mod:`hologram.isa.builder`
constructors and :mod:`hologram.ops.composites`, and add the row ``aten.name: _name``
to that module's ``ROWS``. Raise :class:`Unsupported` with a reason for the cases it
does not cover: that node then runs in PyTorch and the reason is logged once. An op
that only re-indexes also goes into :data:`VIEW_OPS`; an op that AOT autograd should
decompose into ops of the table instead goes into :data:`DECOMPOSE`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from . import creation, elementwise, linalg, losses, movement, norms, reductions
from .context import Ctx, Unsupported, isa_dtype

__all__ = [
    "ATEN_TABLE",
    "DECOMPOSE",
    "FREE_IN_EAGER",
    "NAMED_ROWS",
    "VIEW_OPS",
    "Ctx",
    "Unsupported",
    "decompositions",
    "isa_dtype",
    "op_name",
    "supported_ops",
    "table_row",
]

aten = torch.ops.aten

FAMILIES = (elementwise, reductions, norms, linalg, movement, creation, losses)


def _assemble() -> dict[Any, Callable[..., Any]]:
    table: dict[Any, Callable[..., Any]] = {}
    for family in FAMILIES:
        for op, fn in family.ROWS.items():
            if op in table:
                raise RuntimeError(f"{op} has rows in two families")
            table[op] = fn
    return table


#: One row per ATen op (overload packet): the op -> a function over Vars.
ATEN_TABLE: dict[Any, Callable[..., Any]] = _assemble()
#: Rows for ops that exist only once another module registers them (Inductor's
#: prims), looked up by name.
NAMED_ROWS: dict[str, Callable[..., Any]] = {
    name: fn for family in FAMILIES for name, fn in getattr(family, "NAMED_ROWS", {}).items()
}
#: Ops that only re-index: a region of nothing but these is left to PyTorch (a view
#: there is free, a kernel would copy).
VIEW_OPS = frozenset({aten.t, aten.transpose, aten.permute, aten.view, aten.reshape,
                      aten._unsafe_view, aten.unsqueeze, aten.squeeze, aten.expand,
                      aten.slice, aten.narrow, aten.split, aten.split_with_sizes, aten.chunk,
                      aten.detach, aten.alias, aten.clone, aten.lift_fresh_copy})
#: Ops eager PyTorch runs without launching work (views and aliases).
FREE_IN_EAGER = VIEW_OPS - {aten.clone, aten.lift_fresh_copy}
#: Ops whose decompositions (into ops above) AOT autograd should apply.
DECOMPOSE = ("silu", "silu_backward", "hardtanh", "hardtanh_backward", "leaky_relu",
             "leaky_relu_backward", "elu", "elu_backward", "softplus", "softplus_backward",
             "hardsigmoid", "hardswish", "mish", "logsumexp", "addcmul", "addcdiv", "lerp",
             "square", "std", "std_mean", "norm", "frobenius_norm", "linalg_vector_norm",
             "log_sigmoid_forward", "log_sigmoid_backward", "huber_loss",
             "huber_loss_backward", "smooth_l1_loss", "smooth_l1_loss_backward",
             "soft_margin_loss", "sgn", "expand_as", "masked_fill", "baddbmm", "addmv",
             "native_dropout_backward")


def supported_ops() -> list[str]:
    """Names of the ATen ops the backend translates (the rows of ATEN_TABLE and
    NAMED_ROWS)."""
    return sorted({*(str(k) for k in ATEN_TABLE), *NAMED_ROWS})


def decompositions() -> dict[Any, Callable[..., Any]]:
    """PyTorch's own decompositions of the ops in :data:`DECOMPOSE`."""
    from torch._decomp import get_decompositions

    ops = [getattr(aten, n) for n in DECOMPOSE if hasattr(aten, n)]
    return get_decompositions(ops)


def op_name(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return str(target.overloadpacket) if target.overloadpacket else str(target)
    return getattr(target, "__name__", str(target))


def table_row(target: Any) -> Callable[..., Any] | None:
    """The translator of an FX node's target, or None."""
    if isinstance(target, torch._ops.OpOverload):
        return (ATEN_TABLE.get(target) or ATEN_TABLE.get(target.overloadpacket)
                or NAMED_ROWS.get(str(target.overloadpacket)))
    return None
