"""Checks that compute nothing: ``aten._assert_tensor_metadata``.

AOT autograd leaves ``_assert_tensor_metadata(x, dtype=...)`` after a ``.to(dtype)``
in training graphs. It returns nothing and has no recorded shape. A plan is built for
exactly the metadata the trace recorded (static shapes: dynamo's guards; dynamic ones:
the eager run that recorded the shapes ran the check), so a check that holds at
planning holds on every call the plan runs, and the program takes the node with no
instruction. Run in PyTorch instead, it would split the region around it and force
its operand to be stored. One that does not hold is handed back to PyTorch, which
raises as eager does.

One translator per ATen op, ``ROWS`` maps each op to it (see
:mod:`hologram_torch.lowering` for how a translator is written)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hologram.isa.builder import Var

from .context import Ctx, Unsupported

aten = torch.ops.aten


def _assert_tensor_metadata(ctx: Ctx, a: Any, size: Any = None, stride: Any = None,
                            dtype: torch.dtype | None = None, *, device: Any = None,
                            layout: torch.layout | None = None) -> None:
    val = ctx.node.args[0].meta.get("val") if ctx.node.args else None
    if not isinstance(a, Var) or not isinstance(val, torch.Tensor):
        raise Unsupported("checks a value with no recorded tensor")
    wrong = [what for what, want, got in (
        ("dtype", dtype, val.dtype),
        ("device", None if device is None else torch.device(device), val.device),
        ("layout", layout, val.layout),
        ("size", None if size is None else tuple(size), tuple(a.shape)),
    ) if want is not None and want != got]
    if stride is not None and all(type(s) is int for s in val.stride()) \
            and tuple(stride) != tuple(val.stride()):
        wrong.append("stride")
    if wrong:
        raise Unsupported(f"the traced tensor fails the check ({', '.join(wrong)})")
    return None


# One row per ATen op (overload packet).
ROWS: dict[Any, Callable[..., Any]] = {
    aten._assert_tensor_metadata: _assert_tensor_metadata,
}
