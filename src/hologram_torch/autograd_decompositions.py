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
``embedding_bag`` and 3-D ``grid_sample``, which have no decomposition in PyTorch, are
written here the same way (:func:`_bag`, :func:`_grid_sampler_3d`).

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


def _bound(node: torch.fx.Node, names: tuple[str, ...]) -> dict[str, Any]:
    """The call's arguments by name (positional ones named in order)."""
    return {**dict(zip(names, node.args, strict=False)), **node.kwargs}


def _example(arg: Any) -> Any:
    """The tensor dynamo traced for an argument node (None for anything else)."""
    return getattr(arg, "meta", {}).get("example_value")


def _source_index(coords: torch.Tensor, size: int, padding: int,
                  align_corners: bool) -> torch.Tensor:
    """Grid coordinates in [-1, 1] as input positions, padded as ``padding`` (ATen's
    enum, :data:`_PADDINGS`) says (ATen's ``grid_sampler_compute_source_index``;
    PyTorch's 2-D decomposition's)."""
    mul = (size * 0.5 - 0.5) if align_corners else size * 0.5
    coords = coords * mul + (size * 0.5 - 0.5)
    if padding == _PADDINGS["border"]:
        return _clip(coords, size)
    if padding == _PADDINGS["reflection"]:  # into [lo, hi] (bounds doubled: halves exact)
        twice_lo, twice_hi = (0, 2 * (size - 1)) if align_corners else (-1, 2 * size - 1)
        if twice_lo == twice_hi:
            return torch.zeros_like(coords)
        lo, span = twice_lo / 2, (twice_hi - twice_lo) / 2
        dist = (coords - lo).abs()
        extra = torch.fmod(dist, span)
        flips = (dist / span).floor().to(torch.int8)
        coords = torch.where(flips & 1 == 0, extra + lo, span + lo - extra)
        return _clip(coords, size)
    return coords


def _clip(coords: torch.Tensor, size: int) -> torch.Tensor:
    """``coords`` clipped to [0, size - 1] as ATen's ``std::min(size - 1, std::max(c, 0))``
    clips, which takes a NaN to size - 1 (``clamp`` would keep it NaN)."""
    coords = torch.where(coords < 0, 0.0, coords)
    return torch.where(coords < size - 1, coords, float(size - 1))


def _grid_sampler_3d(input: torch.Tensor, grid: torch.Tensor, interpolation_mode: int = 0,
                     padding_mode: int = 0, align_corners: bool = False) -> torch.Tensor:
    """``grid_sampler_3d`` in trilinear mode (ATen's signature and enums, as PyTorch's
    ``grid_sampler_2d`` decomposition takes them; the rows pass only mode 0, trilinear,
    so ``interpolation_mode`` is not read): the eight corners around
    each grid point GATHERed from the flattened volume, weighted as ATen's CPU kernel
    weighs them, a corner outside the volume weighing 0 (read at position 0). PyTorch
    has no decomposition of ``grid_sampler_3d`` (nor its backward): this one is
    PyTorch's 2-D decomposition's rule with a third axis. A NaN grid coordinate with
    border or reflection padding reads the last position, as eager's forward does;
    eager's backward gives such a point no gradient, this one the forward's."""
    align = bool(align_corners)
    dtype = input.dtype  # half inputs computed in float, as ATen's kernel computes them
    if dtype in (torch.float16, torch.bfloat16):
        input, grid = input.float(), grid.float()
    n, c, d_in, h_in, w_in = input.shape
    _, d_out, h_out, w_out, _ = grid.shape
    ix = _source_index(grid[..., 0], w_in, padding_mode, align)
    iy = _source_index(grid[..., 1], h_in, padding_mode, align)
    iz = _source_index(grid[..., 2], d_in, padding_mode, align)
    x0, y0, z0 = ix.floor(), iy.floor(), iz.floor()
    x1, y1, z1 = x0 + 1, y0 + 1, z0 + 1
    flat = input.reshape(n, c, d_in * h_in * w_in)
    out = None
    for xs, wx in ((x0, x1 - ix), (x1, ix - x0)):
        for ys, wy in ((y0, y1 - iy), (y1, iy - y0)):
            for zs, wz in ((z0, z1 - iz), (z1, iz - z0)):
                inside = ((xs >= 0) & (xs < w_in) & (ys >= 0) & (ys < h_in)
                          & (zs >= 0) & (zs < d_in))
                zi, yi, xi = (torch.where(inside, t, 0).to(torch.int64) for t in (zs, ys, xs))
                pos = (zi * h_in + yi) * w_in + xi  # in int64: exact at any size
                corner = torch.gather(flat, 2, pos.reshape(n, 1, -1).expand(n, c, -1))
                # each factor zeroed outside, so a NaN grid point's gradient is 0 (as
                # eager's), not 0 * NaN through the product's other factors
                wx_, wy_, wz_ = (torch.where(inside, w, 0) for w in (wx, wy, wz))
                weight = (wx_ * wy_ * wz_).reshape(n, 1, -1)
                term = corner * weight
                out = term if out is None else out + term
    assert out is not None
    return out.reshape(n, c, d_out, h_out, w_out).to(dtype)


def _grid_sample(node: torch.fx.Node) -> Callable[..., Any] | None:
    """F.grid_sample of a 4-D input in bilinear or bicubic mode, or of a 5-D input in
    bilinear (trilinear) mode. Nearest is left to the op: its grid has no gradient
    (eager's backward gives zeros), where a decomposition would leave the grid out of
    the graph and its ``.grad`` None."""
    bound = _bound(node, ("input", "grid", "mode", "padding_mode", "align_corners"))
    mode, padding = bound.get("mode", "bilinear"), bound.get("padding_mode", "zeros")
    example = _example(bound.get("input"))
    if mode not in _MODES or padding not in _PADDINGS or example is None \
            or example.dim() not in (4, 5) or (example.dim() == 5 and mode != "bilinear"):
        return None
    from torch._decomp import decompositions

    def sample(input: torch.Tensor, grid: torch.Tensor, mode: str = "bilinear",
               padding_mode: str = "zeros", align_corners: bool | None = None
               ) -> torch.Tensor:
        decomposition = (decompositions.grid_sampler_2d if input.dim() == 4
                         else _grid_sampler_3d)
        return decomposition(input, grid, _MODES[mode], _PADDINGS[padding_mode],
                             bool(align_corners))

    return sample


def _bag(input: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor | None = None,
         max_norm: float | None = None, norm_type: float = 2.0,
         scale_grad_by_freq: bool = False, mode: str = "mean", sparse: bool = False,
         per_sample_weights: torch.Tensor | None = None, include_last_offset: bool = False,
         padding_idx: int | None = None) -> torch.Tensor:
    """F.embedding_bag as rows GATHERed and summed into their bags (``index_add``) or
    their maximum taken (``scatter_reduce``), so that autograd's backward is a
    SCATTER_ADD of the bags' gradients at the rows: ATen's ``_embedding_bag`` and its
    backward have no translation. A bag with no element (or only ``padding_idx``
    rows) is zeros, as in eager; the mean divides by the rows that are not padding."""
    if input.dim() == 2:
        nb, per_bag = input.shape
        flat = input.reshape(-1)
        bags = torch.arange(flat.numel(), device=input.device) // max(per_bag, 1)
        if per_sample_weights is not None:
            per_sample_weights = per_sample_weights.reshape(-1)
    else:
        assert offsets is not None
        flat = input
        nb = offsets.numel() - int(include_last_offset)
        starts = offsets[:nb]
        # an element's bag: how many bags start at or before it, less one (an element
        # before offsets[0], which eager refuses, gets -1: an index error)
        bags = torch.searchsorted(starts, torch.arange(flat.numel(), device=input.device),
                                  right=True) - 1
    dim = weight.shape[1]
    rows = weight[flat]
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.unsqueeze(1)
    kept = torch.ones_like(flat, dtype=weight.dtype)
    if padding_idx is not None:
        pad = padding_idx % weight.shape[0] if padding_idx < 0 else padding_idx
        keep = flat != pad
        kept = keep.to(weight.dtype)
        rows = torch.where(keep.unsqueeze(1), rows, 0.0 if mode != "max" else float("-inf"))
    count = weight.new_zeros(nb).index_add(0, bags, kept)
    if mode == "max":
        base = weight.new_zeros(nb, dim)
        out = base.scatter_reduce(0, bags.unsqueeze(1).expand(-1, dim), rows, "amax",
                                  include_self=False)
        return torch.where(count.unsqueeze(1) > 0, out, 0.0)
    out = weight.new_zeros(nb, dim).index_add(0, bags, rows)
    if mode == "mean":
        out = out / count.clamp_min(1.0).unsqueeze(1)
    return out


def _embedding_bag(node: torch.fx.Node) -> Callable[..., Any] | None:
    """F.embedding_bag without ``max_norm`` (it renormalizes the weight in place),
    ``scale_grad_by_freq`` or ``sparse`` gradients, in sum, mean or max mode."""
    bound = _bound(node, ("input", "weight", "offsets", "max_norm", "norm_type",
                          "scale_grad_by_freq", "mode", "sparse", "per_sample_weights",
                          "include_last_offset", "padding_idx"))
    example, weight = _example(bound.get("input")), _example(bound.get("weight"))
    if example is None or weight is None or weight.dim() != 2 or example.dim() not in (1, 2) \
            or bound.get("max_norm") is not None or bound.get("scale_grad_by_freq") \
            or bound.get("sparse") or bound.get("mode", "mean") not in ("sum", "mean", "max") \
            or (example.dim() == 1) != (bound.get("offsets") is not None):
        return None  # eager's checks and errors, or a form not covered: the op
    return _bag


def _grid_sampler(dims: int) -> Callable[[torch.fx.Node], Callable[..., Any] | None]:
    """``torch.grid_sampler_2d`` / ``_3d`` called directly (ATen's enums for mode and
    padding, as OpInfo's samples call them): the decompositions :func:`_grid_sample`
    uses, themselves."""
    def row(node: torch.fx.Node) -> Callable[..., Any] | None:
        bound = _bound(node, ("input", "grid", "interpolation_mode", "padding_mode",
                              "align_corners"))
        modes = set(_MODES.values()) if dims == 2 else {_MODES["bilinear"]}
        example = _example(bound.get("input"))
        if example is None or example.dim() != dims + 2 \
                or bound.get("interpolation_mode") not in modes \
                or bound.get("padding_mode") not in _PADDINGS.values():
            return None
        from torch._decomp import decompositions
        return decompositions.grid_sampler_2d if dims == 2 else _grid_sampler_3d
    return row


#: The function dynamo's node calls -> the row deciding its replacement.
ROWS: dict[Any, Callable[[torch.fx.Node], Callable[..., Any] | None]] = {
    F.grid_sample: _grid_sample,
    torch.grid_sampler_2d: _grid_sampler(2),
    torch.grid_sampler_3d: _grid_sampler(3),
    F.embedding_bag: _embedding_bag,
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
