"""Program inputs computed from a graph input by a program of their own, and kept.

A Winograd convolution (``lowering/winograd.py``) multiplies by its weight transformed,
``U = G g G^T``: on ResNet-18 at batch 8, 2.2 ms for each 512x512x3x3 weight of the
last stage, redone on every call although the weight does not change between
inference calls (docs/perf.md, session 23). Here such a value is a program input of its
own, computed from the weight's tensor by a small program and kept while that tensor is
unchanged, by the rule packed weights follow (``packed_weights.py``, which says why
each part is there and what it cannot see): the same tensor object (a weak reference),
at the same address, with the same version counter (every in-place op on the tensor or
a view of it bumps it: an optimizer step, ``copy_``, ``mul_`` under ``no_grad``).
Writes that bypass the counter (through ``.data``, a NumPy view, C) are not seen; the
backend option ``pack_weights=False`` turns this off along with packing. An
``inference_mode`` tensor has no version counter: its transform is computed on every
call, as is one whose tensor changed since the last.

Only inference graphs on the CPU executor derive inputs (``_Plan``); training graphs
update their weights every step and compute the transform inside their program.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import torch

from hologram.isa.program import Program

from .fx_info import TORCH_FLOAT


class DerivedKey:
    """The env key of one derived input: a program reads it like a graph value."""

    __slots__ = ("name", "__weakref__")

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<derived {self.name}>"


class DerivedInput:
    """``program`` (one input, one output) applied to a graph input's tensor, the result
    kept while the tensor is unchanged. ``read(t)`` turns the tensor into the array the
    program reads (the region runner's conversion, checking dtype and shape)."""

    def __init__(self, ex: Any, program: Program, read: Any) -> None:
        self.ex = ex
        self.program = program
        self.compiled = ex.compile(program)
        self.read = read
        (self.dtype, self.shape), = program.output_specs
        self.runs = 0  # how many times the program ran (tests count them)
        self._lock = threading.Lock()

    def value(self, t: torch.Tensor) -> torch.Tensor:
        versioned = isinstance(t, torch.Tensor) and t.is_cpu and not t.is_inference()
        if versioned:
            key = (t.data_ptr(), t._version)
            kept = _KEPT.get((id(t), self.program.hash))
            if kept is not None and kept[0]() is t and kept[1] == key:
                return kept[2]
        out = torch.empty(self.shape, dtype=TORCH_FLOAT[self.dtype])
        self.ex.backend.launch(self.compiled, [self.read(t)], [out.numpy()])
        with self._lock:
            self.runs += 1
        if versioned:
            _keep(t, self.program.hash, key, out)
        return out


#: (id(tensor), program hash) -> (weak reference to the tensor, (address, version), the
#: value): one kept value per weight and transform, shared by every compiled shape and
#: region (ResNet-18 compiled at batch 1 and 8 keeps one transform of each weight). A new
#: tuple replaces an entry, never an update in place: a launch in another thread may
#: still read the previous value, which its own reference keeps alive.
_KEPT: dict[tuple[int, str], tuple[weakref.ref, tuple[int, int], torch.Tensor]] = {}


def _keep(t: torch.Tensor, name: str, key: tuple[int, int], out: torch.Tensor) -> None:
    slot = (id(t), name)

    def dead(ref: weakref.ref, slot: tuple[int, str] = slot) -> None:  # the weight died
        e = _KEPT.get(slot)
        if e is not None and e[0] is ref:
            _KEPT.pop(slot, None)

    _KEPT[slot] = (weakref.ref(t, dead), key, out)


def kept_bytes() -> int:
    """Bytes of derived values kept now (the README states what they cost)."""
    return sum(e[2].numel() * e[2].element_size() for e in list(_KEPT.values()))
