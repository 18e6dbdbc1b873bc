"""Ops that dynamo's graph computes through their decomposition, so that autograd
differentiates the decomposition's parts.

AOT autograd applies the backend's decompositions (``lowering.DECOMPOSE``) below
autograd: an op with a derivative formula of its own keeps its backward op. For
``grid_sampler_2d`` that is ``grid_sampler_2d_backward``, which hologram does not
translate, so a model that samples a grid (a spatial transformer, a flow warp) trained
with its backward in PyTorch. Rewritten here, in dynamo's graph before AOT autograd
traces it, the call runs PyTorch's own decomposition (``torch._decomp``): corners
GATHERed at the grid's positions, weights, selects and sums, whose backward ops
(scatter-adds, products) are in hologram's table. The values are the decomposition's
(PyTorch's reference for the op, checked against eager in float64 by the tests).

One row per function dynamo records (:data:`ROWS`); a row returns the replacement or
None to keep the call (a form the decomposition does not cover).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

#: grid_sample's mode and padding names as ATen's enums (F.grid_sample's own mapping).
_MODES = {"bilinear": 0, "bicubic": 2}
_PADDINGS = {"zeros": 0, "border": 1, "reflection": 2}


def _grid_sample(node: torch.fx.Node) -> Callable[..., Any] | None:
    """F.grid_sample of a 4-D input in bilinear or bicubic mode. Nearest is left to the
    op: its grid has no gradient (eager's backward gives zeros), where a decomposition
    would leave the grid out of the graph and its ``.grad`` None."""
    names = ("input", "grid", "mode", "padding_mode", "align_corners")
    bound = {**dict(zip(names, node.args, strict=False)), **node.kwargs}
    mode, padding = bound.get("mode", "bilinear"), bound.get("padding_mode", "zeros")
    example = getattr(bound.get("input"), "meta", {}).get("example_value")
    if mode not in _MODES or padding not in _PADDINGS or example is None \
            or example.dim() != 4:
        return None
    from torch._decomp import decompositions

    def sample(input: torch.Tensor, grid: torch.Tensor, mode: str = "bilinear",
               padding_mode: str = "zeros", align_corners: bool | None = None
               ) -> torch.Tensor:
        return decompositions.grid_sampler_2d(input, grid, _MODES[mode],
                                              _PADDINGS[padding_mode], bool(align_corners))

    return sample


#: The function dynamo's node calls -> the row deciding its replacement.
ROWS: dict[Any, Callable[[torch.fx.Node], Callable[..., Any] | None]] = {
    F.grid_sample: _grid_sample,
}


def apply(gm: torch.fx.GraphModule) -> int:
    """Point each call :data:`ROWS` covers at its decomposition; returns how many."""
    done = 0
    for node in gm.graph.nodes:
        row = ROWS.get(node.target) if node.op == "call_function" else None
        replacement = row(node) if row is not None else None
        if replacement is not None:
            node.target = replacement
            done += 1
    if done:
        gm.recompile()
    return done
