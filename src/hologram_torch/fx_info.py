"""What each FX node produces: dtype, shape and device, with concrete shapes.

The ``torch.compile`` backend plans from these infos, read off the shapes dynamo
recorded on each node (``meta['val']``) or, for symbolic (dynamic) shapes, from
one eager run of the graph (:class:`_Recorder`). The op translations in
:mod:`hologram_torch.lowering` see a node's result as a :class:`TInfo`, and the
dtype tables here say which torch dtypes a program carries and as what.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from hologram.isa import dtypes
from hologram.isa.dtypes import DType


@dataclass(frozen=True)
class TInfo:
    """A tensor's dtype, shape and device, all a translation needs to know."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    device: str = "cpu"

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


ISA_FLOAT: dict[torch.dtype, DType] = {torch.float32: dtypes.f32, torch.float64: dtypes.f64}
TORCH_FLOAT: dict[DType, torch.dtype] = {v: k for k, v in ISA_FLOAT.items()}
# Integer tensors (class indices, counts of a mask) are carried as f64 inside a
# program: exact for |values| < 2**53, which is what such tensors hold.
INT_DTYPES = frozenset({torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8})
#: How a program reads the memory of an integer or bool tensor as it is (the cast to
#: the program's carrier, f64 or bool, is then the program's first instruction), on a
#: backend whose memory holds that dtype (``Backend.check_buffer_dtype``).
STORED: dict[torch.dtype, DType] = {
    torch.int64: dtypes.i64, torch.int32: dtypes.i32, torch.int16: dtypes.i16,
    torch.int8: dtypes.i8, torch.uint8: dtypes.u8, torch.bool: dtypes.boolean}
#: 16-bit floats: a program reads and writes their memory as it is, but carries the
#: values as f32 and rounds every ATen op's result to the dtype (``round_half``), as
#: eager computes each op of such tensors in float and rounds its result. Rounding
#: after each ISA instruction instead (what an f16/bf16 instruction means) would round
#: inside an op (a softmax's exponentials, a norm's variance) where eager does not.
HALF: dict[torch.dtype, DType] = {torch.bfloat16: dtypes.bf16, torch.float16: dtypes.f16}
#: ATen ops whose CPU kernels round a Python-number operand to a 16-bit float tensor
#: operand's dtype before computing (``x + 0.1``, ``x > 0.1``: the number becomes a
#: tensor of the common dtype), where ``mul``, ``div`` and most others compute with it
#: in float. Measured on torch 2.13 (docs/perf.md, session 35); the translation rounds
#: such a number the same way (``compile_backend._half_scalars``).
HALF_ROUNDS_SCALARS = frozenset({"add", "sub", "rsub", "eq", "ne", "lt", "le", "gt", "ge",
                                 "fmod", "remainder"})
#: The PyTorch dtype of every ISA dtype a program reads a tensor's memory as.
TORCH_OF: dict[DType, torch.dtype] = {**TORCH_FLOAT, **{v: k for k, v in STORED.items()},
                                      **{v: k for k, v in HALF.items()}}


def _info_of(val: Any) -> Any:
    if isinstance(val, torch.Tensor):
        return TInfo(val.dtype, tuple(val.shape), val.device.type)
    if isinstance(val, (tuple, list)):
        return tuple(_info_of(v) for v in val)
    return val


def _is_concrete(info: Any) -> bool:
    if isinstance(info, TInfo):
        return all(type(s) is int for s in info.shape)
    if isinstance(info, tuple):
        return all(_is_concrete(i) for i in info)
    return not isinstance(info, (torch.SymInt, torch.SymFloat, torch.SymBool))


def returns_nothing(node: torch.fx.Node) -> bool:
    """Whether ``node`` is an ATen op whose schema returns nothing (a check such as
    ``aten._assert_tensor_metadata``): no value, so no recorded shape either."""
    t = node.target
    return (node.op == "call_function" and isinstance(t, torch._ops.OpOverload)
            and not t._schema.returns)


def _infos_from_meta(gm: torch.fx.GraphModule) -> dict[torch.fx.Node, Any] | None:
    """Per-node infos from dynamo's fake tensors, or None when any shape is symbolic
    (or a value's shape was not recorded). A node that produces no value has the info
    None: it has no shape to be symbolic, so it never makes the graph dynamic."""
    infos: dict[torch.fx.Node, Any] = {}
    for n in gm.graph.nodes:
        if n.op == "output":
            continue
        if "val" not in n.meta:
            if returns_nothing(n):
                infos[n] = None
                continue
            return None
        info = _info_of(n.meta["val"])
        if not _is_concrete(info):
            return None
        infos[n] = info
    return infos


class _Recorder(torch.fx.Interpreter):
    """Runs a graph eagerly and records what each node produced (for dynamic shapes)."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        super().__init__(gm, garbage_collect_values=True)
        self.infos: dict[torch.fx.Node, Any] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        out = super().run_node(n)
        if n.op != "output":
            self.infos[n] = _info_of(out)
        return out


def _signature(args: Sequence[Any]) -> tuple:
    return tuple((a.dtype, tuple(a.shape), a.device.type) if isinstance(a, torch.Tensor)
                 else (type(a).__name__, a if isinstance(a, (int, float, bool)) else None)
                 for a in args)
