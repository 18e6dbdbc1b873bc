"""The strides of tensors a program hands to PyTorch: the strides the trace recorded.

A program writes each output as one dense row-major buffer, but the PyTorch code after
it (a node that runs in PyTorch, a view PyTorch makes of a stored value, the caller of
a graph output, the backward graph of a training step) was traced with each tensor's
strides (``node.meta['val'].stride()``) and may depend on them: ``aten.view`` of a
transposed attention output fails unless its input has the traced layout (GPT-2's
training step failed so). So an output whose traced layout is not contiguous is handed
out with that layout:

- a permutation of a dense layout (a transpose, a permute of a reshape): the program
  stores the value permuted into a dense buffer and PyTorch gets a strided view of it.
  No copy: the inputs do the mirror image (``compile_backend._physical_order``), so a
  later program reads that view in place too;
- any other layout without overlap (a window of a larger tensor, as q, k and v are
  views of one projection): a tensor of exactly those strides
  (``torch.empty_strided``) and one copy into it, only where PyTorch reads the value.

Layouts in which elements overlap (stride 0) are views PyTorch makes itself; symbolic
strides (dynamic shapes) have no fixed layout. Both keep the dense buffer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx


def dense_order(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...] | None:
    """The axis order in which ``(shape, strides)`` is dense (``t.permute(order)`` is
    contiguous), or None. Size-1 axes may have any stride."""
    order = tuple(sorted(range(len(shape)), key=lambda d: -strides[d]))
    expect = 1
    for d in reversed(order):
        if shape[d] != 1 and strides[d] != expect:
            return None
        expect *= shape[d]
    return order


def row_major(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Contiguous as PyTorch means it (size-1 axes may have any stride)."""
    expect = 1
    for size, st in zip(reversed(shape), reversed(strides), strict=True):
        if size != 1 and st != expect:
            return False
        expect *= size
    return True


def overlaps(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether two elements of the layout share memory (a stride-0 broadcast, or strides
    too small for the sizes within them)."""
    span = 1
    for size, st in sorted(((s, st) for s, st in zip(shape, strides, strict=True) if s > 1),
                           key=lambda x: x[1]):
        if st < span:
            return True
        span = st * size
    return False


@dataclass(frozen=True)
class OutputLayout:
    """How an output leaves its program: the traced ``shape`` and ``strides``, and
    ``order`` when they are a permuted dense layout (else a copy makes them)."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    order: tuple[int, ...] | None

    @property
    def stored_shape(self) -> tuple[int, ...]:
        """The shape the program stores: the value permuted into ``order``."""
        if self.order is None:
            return self.shape
        return tuple(self.shape[d] for d in self.order)

    @property
    def inverse(self) -> tuple[int, ...]:
        assert self.order is not None
        return tuple(self.order.index(d) for d in range(len(self.order)))

    def hand_out(self, stored: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The tensor PyTorch gets from the program's buffer ``stored``, in ``dtype``."""
        if self.order is not None:
            t = stored.permute(self.inverse)
            # .to keeps the strides of a dense tensor (preserve_format)
            return t if t.dtype is dtype else t.to(dtype)
        out = torch.empty_strided(self.shape, self.strides, dtype=dtype)
        out.copy_(stored)
        return out


def traced_layout(node: torch.fx.Node, copy_ok: bool = True) -> OutputLayout | None:
    """The layout ``node``'s value must be handed to PyTorch in, or None when a dense
    row-major tensor is that layout (or no fixed layout was recorded). ``copy_ok``:
    whether a layout that needs a copy is wanted (PyTorch reads the value)."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.layout is not torch.strided:
        return None
    shape, strides = tuple(val.shape), tuple(val.stride())
    if any(type(x) is not int for x in (*shape, *strides)):
        return None  # symbolic: planned per shape signature, no layout to keep
    if 0 in shape or row_major(shape, strides):
        return None
    order = dense_order(shape, strides)
    if order is not None:
        return OutputLayout(shape, strides, order)
    if not copy_ok or overlaps(shape, strides):
        return None
    return OutputLayout(shape, strides, None)


__all__ = ["OutputLayout", "dense_order", "overlaps", "row_major", "traced_layout"]
