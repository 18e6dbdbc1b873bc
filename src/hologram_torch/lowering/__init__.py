"""ATen ops lowered to Atlas ISA: the translator tables of the ``torch.compile`` backend.

Every ATen op the backend runs in hologram is one row of :data:`ATEN_TABLE`, which
maps the op (an overload packet, such as ``aten.add``) to a translator: a function
over :class:`hologram.isa.builder.Var`. The rows live with their op family, one
module each, so an op is found by what it does:

========================  ===============================================================
module                    ops
========================  ===============================================================
``elementwise``           arithmetic, comparisons, logic, activations, casts, copies;
                          rounding, remainders (fmod, remainder, floor division), log1p,
                          expm1, IEEE class tests, nan_to_num, tril/triu masks
``reductions``            sum, mean, prod, amax/amin, max/min with indices, argmax/argmin,
                          any/all, count_nonzero, nansum, var, cumsum/cumprod
``norms``                 softmax, log-softmax, layer norm
``linalg``                mm, addmm, bmm, matmul, mv, dot
``attention``             scaled-dot-product attention (ATen's fused CPU op), its backward
``convolution``           convolution and its backward (taps as views; im2col GEMM or a
                          direct kernel for depthwise)
``pooling``               average pools (fixed, adaptive) and their backward
``movement``              views, slices, split, cat, stack, unbind, repeat, roll,
                          constant_pad_nd
``creation``              full, zeros, ones, fill, arange, linspace, logspace, eye
``diagonal``              diagonal (a GATHER), diag_embed, diagonal_backward and
                          diagonal_scatter (selects against IOTA masks)
``index``                 embedding, index, index_select, gather, select, flip, scatter,
                          index_put, index_add, slice/select_scatter (and backward)
``sorting``               sort, topk, kthvalue, median, nanmedian (ARGSORT and GATHER),
                          searchsorted, bucketize (counts of boundaries below)
``distance``              cdist (forward and backward: a fused reduction per pair of rows)
``segments``              segment_reduce and its backward (combining SCATTERs into segments)
``losses``                MSE, binary cross-entropy, NLL
``random``                native_dropout, bernoulli, rand/randn (and _like), uniform,
                          normal: hologram's counter-based generator, seeded per call
``checks``                metadata checks that compute nothing (_assert_tensor_metadata)
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

from . import (
    attention,
    checks,
    convolution,
    creation,
    diagonal,
    distance,
    elementwise,
    index,
    linalg,
    losses,
    movement,
    norms,
    pooling,
    random,
    reductions,
    segments,
    sorting,
)
from .context import Ctx, Unsupported, isa_dtype, round_half

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
    "round_half",
    "supported_ops",
    "table_row",
]

aten = torch.ops.aten

FAMILIES = (elementwise, reductions, norms, linalg, attention, convolution, movement, creation,
            losses, checks, index, diagonal, sorting, distance, segments, pooling, random)


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
                      aten.select, aten.unbind, aten.diagonal, aten.as_strided,
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
             "native_dropout_backward",
             # element-wise ops whose decompositions are ATen ops of the table (checked
             # by the OpInfo sweep: tests/opinfo_sweep.py)
             "celu", "logit", "logit_backward", "xlogy", "logaddexp", "logaddexp2",
             "deg2rad", "rad2deg", "hardswish_backward", "hardsigmoid_backward", "glu",
             "glu_backward", "softshrink", "hardshrink", "threshold", "dist",
             "special_xlog1py", "special_entr", "sinc", "mse_loss_backward",
             "_prelu_kernel", "_prelu_kernel_backward", "addr",
             # normalizations whose decompositions are reductions of the table
             "native_group_norm", "native_group_norm_backward", "native_batch_norm",
             "native_batch_norm_backward", "_native_batch_norm_legit",
             "_native_batch_norm_legit_functional", "_native_batch_norm_legit_no_training",
             "_batch_norm_with_update", "_batch_norm_with_update_functional",
             "batch_norm_backward", "_batch_norm_no_update", "expand_copy", "rot90",
             # ops whose decompositions are views, GATHER/SCATTER indexing (index,
             # index_put, gather, scatter), element-wise ops and reductions of the table
             # (checked by the OpInfo sweep)
             "_safe_softmax", "ldexp", "block_diag", "_chunk_cat", "linalg_cross", "renorm",
             "index_copy", "index_fill", "take", "unfold", "unfold_copy", "unfold_backward",
             "isin", "soft_margin_loss_backward", "reflection_pad1d", "reflection_pad2d",
             "reflection_pad3d", "reflection_pad1d_backward", "reflection_pad2d_backward",
             "reflection_pad3d_backward", "replication_pad1d", "replication_pad2d",
             "replication_pad3d", "_unsafe_masked_index", "_unsafe_masked_index_put_accumulate",
             "im2col", "col2im", "nll_loss2d_forward", "nll_loss2d_backward",
             "mvlgamma",
             # pooling: max pools gather their windows (index) and reduce with indices,
             # their backward is a scatter_add; adaptive average pools with divisible
             # sizes become avg_pool2d (pooling), the others gathers
             "max_pool2d_with_indices_backward", "_adaptive_avg_pool2d",
             "max_unpool2d", "max_unpool3d",
             # grid sampling: a GATHER of the corners at the grid's positions, weighted
             "grid_sampler_2d")


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
