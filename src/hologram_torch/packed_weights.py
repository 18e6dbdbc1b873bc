"""Packed copies of the constant weights that an inference graph's GEMMs read.

MKL computes ``x @ W.T`` faster from a copy of ``W`` packed once into its own
layout (``cblas_?gemm_pack``): on the models' shapes, with two threads, 1.14-1.28x
torch.mm at 128 rows and 1.65x at 8; GPT-2 at batch 1 ran 1.21x faster for it
(docs/perf.md, session 9). OpenVINO and Inductor's freezing
get the same by treating parameters as constants outright. hologram does not assume
that. A packed copy is used only while the tensor it was made from is unchanged:

- the same tensor object (a weak reference to it, so a new tensor that reuses the
  freed memory is not mistaken for the old one),
- at the same address (``data_ptr``: ``t.data = other`` or ``set_`` move it),
- with the same version counter (``t._version``: PyTorch bumps it on every in-place
  op on the tensor or a view of it, so optimizer steps, ``copy_``, ``mul_`` and
  ``index_put_`` under ``no_grad`` all invalidate the copy).

Writes that bypass the version counter are not seen: through ``t.data`` (a tensor
with a counter of its own), through a NumPy view (``t.numpy()``), or from C. After
such a write, call the model with fresh tensors or set ``options={"pack_weights":
False}`` (the README says so too).

Only inference graphs pack (``torch.no_grad()`` or ``inference_mode`` around the call);
training graphs update their weights every step. A tensor is packed the second time a
GEMM step sees it unchanged, so activations (a new tensor each call) are never packed:
they cost one dictionary lookup. An ``inference_mode`` tensor has no version counter
and is never packed. Packed copies live as long as the runner (one per compiled region
and shape) and the tensor: a weak-reference callback drops the copy when the weight
dies. A copy is made only where MKL's packed layout costs at most
``blas.PACK_MAX_GROWTH`` (1.5) times the weight's bytes: MKL reserves a block per
packed column tile, and on MKL 2026.2 the models' weights, cut in tiles for two
threads, packed to 3.8-22x their size (T5-small: 1.8 GB resident for 240 MB of
weights) for at most a few percent of speed; so with that MKL most weights stay as
they are.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class _Entry:
    """One site's state: the tensor last seen, its (address, version), and its copy."""

    ref: weakref.ref
    key: tuple[int, int]
    packed: Any = None  # None: seen once unchanged, not packed yet; False: cannot be
    address: int = 0


class PackedOperands:
    """The packed-B addresses for one compiled program's pointer launches.

    ``sites`` are the backend's pack sites (``Backend.pack_sites``); ``nodes[i]`` is the
    FX node whose tensor is program input ``i`` and ``layouts[i]`` the (dtype, shape,
    strides) the program reads it in place with (None: always converted first).
    ``addresses(env, pointers)`` returns one address per site (0: the GEMM reads B as
    it is) and the objects that must stay alive until the launch returns.
    """

    def __init__(self, backend: Any, compiled: Any, sites: Sequence[Any],
                 nodes: Sequence[torch.fx.Node | None],
                 layouts: Sequence[tuple[torch.dtype, tuple[int, ...], tuple[int, ...]] | None]
                 ) -> None:
        self.backend = backend
        self.compiled = compiled
        self.sites = [(s.input, nodes[s.input], layouts[s.input]) for s in sites]
        self.entries: list[_Entry | None] = [None] * len(sites)
        self._lock = threading.Lock()

    def addresses(self, env: dict[torch.fx.Node, Any], pointers: Sequence[int]
                  ) -> tuple[list[int], list[Any]]:
        out: list[int] = []
        keep: list[Any] = []
        for j, (i, node, layout) in enumerate(self.sites):
            t = env[node] if node is not None and layout is not None else None
            entry = None
            if (isinstance(t, torch.Tensor) and t.dtype is layout[0] and t.is_cpu
                    and t.shape == layout[1] and t.stride() == layout[2]
                    and not t.is_inference() and t.data_ptr() == pointers[i] != 0):
                entry = self._current(j, t, pointers[i])
            out.append(entry.address if entry is not None else 0)
            if entry is not None:
                keep.append(entry.packed)
        return out, keep

    def _current(self, j: int, t: torch.Tensor, pointer: int) -> _Entry | None:
        """Site ``j``'s entry if it holds a copy of ``t`` as it is now; packs on the second
        sighting of ``t`` unchanged; None otherwise. ``t`` is read in place at ``pointer``
        (the program's layout, checked by the caller) and has a version counter."""
        key = (pointer, t._version)
        entry = self.entries[j]
        if entry is None or entry.key != key or entry.ref() is not t:
            self._remember(j, t, key)  # a first sighting in this state: not packed yet
            return None
        if entry.packed is not None:
            return entry if entry.address else None  # address 0: the BLAS would not pack
        with self._lock:  # the second sighting: pack (once, if threads race here)
            entry = self.entries[j]
            if entry is None or entry.key != key or entry.ref() is not t:
                return None
            if entry.packed is False:
                return None
            if entry.packed is None:
                packed = self.backend.pack(self.compiled, j, pointer)
                if packed is None:  # remembered, so it is not tried on every call
                    self.entries[j] = _Entry(entry.ref, key, False)
                    return None
                # a new entry, never an update in place: a launch in another thread may
                # still be reading the previous copy, which it keeps alive itself
                entry = _Entry(entry.ref, key, packed, _address(packed))
                self.entries[j] = entry
            return entry

    def _remember(self, j: int, t: torch.Tensor, key: tuple[int, int]) -> None:
        entries = self.entries

        def dead(ref: weakref.ref, j: int = j) -> None:  # the weight died: drop its copy
            e = entries[j]
            if e is not None and e.ref is ref:
                entries[j] = None

        entries[j] = _Entry(weakref.ref(t, dead), key)


def _address(packed: Any) -> int:
    from hologram.memory.address import data_pointer

    return data_pointer(packed)
