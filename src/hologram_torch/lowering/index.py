"""Reading and writing at computed indices: embedding, advanced indexing (``index``),
index_select, gather, take_along_dim, select, flip, and the writes (scatter,
scatter_add, index_put, index_add, slice/select_scatter) with their backward ops.

Integer tensors ride in programs as f64 (``context.isa_dtype``), so an index is cast
to i64 (CVT, exact below 2**53) before the ISA's GATHER/SCATTER reads it. Which ops
accept negative indices follows PyTorch: advanced indexing (``index``, ``index_put``)
wraps them once (``i + n`` for ``-n <= i < 0``); embedding, gather, index_select,
index_add, scatter and take_along_dim do not. Whatever is out of range after that is
the ISA's IndexError when the program runs (the instruction's own range check). An
index into an empty dimension with a non-empty result is an error PyTorch reports,
so those run in PyTorch.

One translator per ATen op, ``ROWS`` maps each op to it (see
:mod:`hologram_torch.lowering` for how a translator is written)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hologram.isa import builder as b
from hologram.isa import dtypes
from hologram.isa.builder import Var, broadcast_shape, concat, const
from hologram.isa.opcodes import Op

from ..fx_info import INT_DTYPES
from .context import Ctx, Unsupported, and_, as_var, not_, or_

aten = torch.ops.aten
I64 = dtypes.i64


# --- helpers -------------------------------------------------------------------------------
def _axis(ndim: int, dim: int) -> int:
    return dim % ndim if ndim else 0


def _index(i: Var) -> Var:
    """An index tensor (f64 in the program, an integer in PyTorch) as the ISA's i64."""
    if i.dtype is dtypes.boolean:
        raise Unsupported("a bool mask index (its result's size depends on the data)")
    return i.cast(I64)


def _wrap(i: Var, n: int) -> Var:
    """Advanced indexing's rule: ``-n <= i < 0`` counts from the end (f64 in, f64 out)."""
    return (i < 0.0).where(i + float(n), i)


def _needs_rows(n: int, count: int, what: str) -> None:
    """An index into an empty dimension fails for every index: PyTorch raises it."""
    if n == 0 and count:
        raise Unsupported(f"{what} of {count} indices into an empty dimension (an error "
                          "PyTorch reports)")


def _at_least_1d(*xs: Var) -> tuple[Var, ...]:
    return tuple(x.reshape(1) if x.ndim == 0 else x for x in xs)


def _window(x: Var, dim: int, size: int) -> Var:
    """``x`` narrowed to its first ``size`` elements along ``dim`` (a view)."""
    shape = tuple(size if d == dim else s for d, s in enumerate(x.shape))
    return x.slice((0,) * x.ndim, shape)


def _along(i: Var, dim: int, shape: tuple[int, ...]) -> Var:
    """A 1-D index laid along ``dim`` of ``shape`` and broadcast over its other axes."""
    return i.reshape(tuple(i.shape[0] if d == dim else 1 for d in range(len(shape)))).expand(
        shape)


# --- reads ---------------------------------------------------------------------------------
def _embedding(ctx: Ctx, weight: Var, indices: Var, padding_idx: int = -1,
               scale_grad_by_freq: bool = False, sparse: bool = False) -> Var:
    """``weight[indices]``: rows of a [V, D] table (no negative indices, as ATen)."""
    if weight.ndim != 2:
        raise Unsupported(f"embedding of a {weight.ndim}-D weight")
    _needs_rows(weight.shape[0], indices.v.size, "embedding")
    return weight.take(_index(indices), 0)


def _index_select(ctx: Ctx, x: Var, dim: int, index: Var) -> Var:
    (x,) = _at_least_1d(x)
    d = _axis(x.ndim, dim)
    _needs_rows(x.shape[d], index.v.size, "index_select")
    return x.take(_index(index.reshape(-1) if index.ndim == 0 else index), d).reshape(
        ctx.out_shape)


def _gather(ctx: Ctx, x: Var, dim: int, index: Var, *, sparse_grad: bool = False) -> Var:
    """``torch.gather``: the ISA's GATHER (its shape rule is torch.gather's). An empty
    index may have any rank (ATen checks nothing then): the result is empty."""
    if index.v.size == 0:
        return Var(const(0, x.dtype, ctx.out_shape))
    x, index = _at_least_1d(x, index)
    d = _axis(x.ndim, dim)
    _needs_rows(x.shape[d], index.v.size, "gather")
    return x.gather(_index(index), d).reshape(ctx.out_shape)


def _take_along_dim(ctx: Ctx, x: Var, indices: Var, dim: int | None = None) -> Var:
    """gather after broadcasting ``x`` and ``indices`` on every dim but ``dim``."""
    if dim is None:
        x, indices = x.reshape(x.v.size), indices.reshape(indices.v.size)
        dim = 0
    x, indices = _at_least_1d(x, indices)
    d = _axis(x.ndim, dim)
    if x.ndim != indices.ndim:
        raise Unsupported("take_along_dim with operands of different rank")
    off = broadcast_shape(tuple(1 if k == d else s for k, s in enumerate(x.shape)),
                          tuple(1 if k == d else s for k, s in enumerate(indices.shape)))
    x = x.expand(tuple(x.shape[d] if k == d else s for k, s in enumerate(off)))
    indices = indices.expand(tuple(indices.shape[d] if k == d else s for k, s in enumerate(off)))
    _needs_rows(x.shape[d], indices.v.size, "take_along_dim")
    return x.gather(_index(indices), d).reshape(ctx.out_shape)


def _select(ctx: Ctx, x: Var, dim: int, index: Any) -> Var:
    """``x.select(dim, index)``: a one-wide window, its axis dropped (a view)."""
    if not isinstance(index, int):
        raise Unsupported("select with a tensor index")
    d = _axis(x.ndim, dim)
    n = x.shape[d]
    i = index + n if index < 0 else index
    if not 0 <= i < n:
        raise Unsupported(f"select index {index} out of range for size {n}")
    return x.slice(tuple(i if k == d else 0 for k in range(x.ndim)),
                   tuple(1 if k == d else s for k, s in enumerate(x.shape))).reshape(
        ctx.out_shape)


def _flip(ctx: Ctx, x: Var, dims: Sequence[int]) -> Var:
    """Reversed along ``dims``: one GATHER from the flat array, its index computed from
    IOTAs (each output element's source position) inside the kernel."""
    if x.ndim == 0 or x.v.size == 0:
        return x
    flip = {_axis(x.ndim, d) for d in dims}
    strides = [math.prod(x.shape[k + 1:]) for k in range(x.ndim)]
    pos: Var | None = None
    for k, (n, st) in enumerate(zip(x.shape, strides, strict=True)):
        if n == 1:
            continue
        io = Var(b.iota(x.shape, k, I64))
        term = ((n - 1) - io if k in flip else io) * st
        pos = term if pos is None else pos + term
    if pos is None:
        return x
    return x.reshape(x.v.size).take(pos.reshape(x.v.size), 0).reshape(x.shape)


def _advanced(x: Var, indices: Sequence[Any]) -> tuple[list[int], tuple[int, ...], Var, bool]:
    """NumPy's advanced indexing of ``x`` by ``indices`` (None: the whole dim), as the
    indexed dims ``P``, the broadcast index shape ``B``, one linear i64 index into the
    indexed dims flattened (negatives wrapped; -1 where any component is out of range,
    so the GATHER/SCATTER reports it), and whether ``P`` are adjacent (then the result
    keeps B where they were; otherwise B goes first)."""
    if len(indices) > x.ndim:
        raise Unsupported(f"{len(indices)} indices for a {x.ndim}-D tensor")
    dims = [d for d, i in enumerate(indices) if i is not None]
    if not dims:
        raise Unsupported("indexing with no index tensor")
    idxs = []
    for d in dims:
        i = indices[d]
        if not isinstance(i, Var):
            raise Unsupported(f"index of type {type(i).__name__}")
        if i.dtype is dtypes.boolean:
            raise Unsupported("a bool mask index (its result's size depends on the data)")
        idxs.append(i)
    shape = broadcast_shape(*(i.shape for i in idxs))
    count = math.prod(shape)
    for d in dims:
        _needs_rows(x.shape[d], count, "advanced indexing")
    if len(dims) == 1:
        linear = _wrap(idxs[0], x.shape[dims[0]])
    else:
        linear, ok = None, None
        for d, i in zip(dims, idxs, strict=True):
            n = x.shape[d]
            w = _wrap(i, n).expand(shape)
            inside = and_(not_(w < 0.0), w < float(n))
            ok = inside if ok is None else and_(ok, inside)
            linear = w if linear is None else linear * float(n) + w
        linear = ok.where(linear, -1.0)
    adjacent = dims == list(range(dims[0], dims[0] + len(dims)))
    return dims, tuple(shape), linear.expand(shape).cast(I64), adjacent


def _flat_table(x: Var, dims: list[int]) -> tuple[Var, list[int], list[int]]:
    """(``x`` with the indexed dims moved first and merged into one, the other dims,
    the permutation used): views only."""
    others = [d for d in range(x.ndim) if d not in dims]
    perm = dims + others
    rows = math.prod(x.shape[d] for d in dims)
    return x.permute(perm).reshape((rows, *(x.shape[d] for d in others))), others, perm


def _b_first(nb: int, before: int, ndim: int) -> list[int]:
    """The permutation taking a result laid out [before..., B..., after...] to
    [B..., before..., after...] (and its inverse gives the other way)."""
    return [*range(before, before + nb), *range(before), *range(before + nb, ndim)]


def strided_slice(x: Var, dim: int, start: int, step: int, shape: tuple[int, ...]) -> Var:
    """``x[..., start::step, ...]`` of ``shape`` (ATen's size): the ISA's SLICE has step 1,
    so a GATHER at ``start + step * k``, its index computed in the kernel (a copy where
    eager has a strided view)."""
    pos = Var(b.iota(shape, dim, I64)) * step + start
    return x.gather(pos, dim)


def strided_place(grad: Var, shape: tuple[int, ...], dim: int, start: int, step: int) -> Var:
    """Zeros of ``shape`` with ``grad`` at ``start + step * k`` along ``dim`` (the gradient
    of a strided slice): a SCATTER into a constant."""
    pos = Var(b.iota(grad.shape, dim, I64)) * step + start
    return Var(const(0, grad.dtype, shape)).scatter(pos, grad, dim)


def _index_tensor(ctx: Ctx, x: Var, indices: Sequence[Any]) -> Var:
    """``x[indices]`` with index tensors (advanced indexing)."""
    dims, shape, linear, adjacent = _advanced(x, indices)
    table, others, _ = _flat_table(x, dims)
    out = table.take(linear, 0)  # [B..., others...]
    if adjacent and dims[0] > 0:  # B back where the indexed dims were
        inv = _b_first(len(shape), dims[0], out.ndim)
        out = out.permute([inv.index(k) for k in range(out.ndim)])
    return out.reshape(ctx.out_shape)


# --- writes --------------------------------------------------------------------------------
def _index_put(ctx: Ctx, x: Var, indices: Sequence[Any], values: Any,
               accumulate: bool = False) -> Var:
    """``x[indices] = values`` (``+=`` with ``accumulate``): one SCATTER(_ADD) into ``x``
    with the indexed dims merged (duplicates: the last wins, or all add up)."""
    d = ctx.out_dtype
    masks = [i for i in indices if isinstance(i, Var) and i.dtype is dtypes.boolean]
    if masks:
        return _mask_put(x, indices, values, accumulate, d)
    dims, shape, linear, adjacent = _advanced(x, indices)
    table, others, perm = _flat_table(x, dims)
    rest = tuple(x.shape[k] for k in others)
    if adjacent:
        result = (*x.shape[:dims[0]], *shape, *rest[dims[0]:])
    else:
        result = (*shape, *rest)
    v = as_var(values, d).expand(result)
    if adjacent and dims[0] > 0:
        v = v.permute(_b_first(len(shape), dims[0], v.ndim))  # [B..., others...]
    nb = math.prod(shape)
    v = v.reshape((nb, *rest))
    idx = linear.reshape((nb,) + (1,) * len(rest)).expand((nb, *rest))
    out = table.scatter_add(idx, v, 0) if accumulate else table.scatter(idx, v, 0)
    out = out.reshape((*(x.shape[k] for k in dims), *rest))
    return out.permute([perm.index(k) for k in range(x.ndim)])


def _mask_put(x: Var, indices: Sequence[Any], values: Any, accumulate: bool, d: Any) -> Var:
    """``x[mask] = value`` for one bool mask over x's leading dims and one value: a select
    (the result's shape is x's, whatever the mask holds)."""
    if len(indices) != 1:
        raise Unsupported("a bool mask together with other indices")
    mask = indices[0]
    k = mask.ndim
    if tuple(mask.shape) != tuple(x.shape[:k]):
        raise Unsupported("a bool mask that is not the shape of the leading dims")
    if isinstance(values, Var) and values.v.size != 1:
        raise Unsupported("a bool-mask put of several values (their order is the data's)")
    v = as_var(values, d)
    v = v.reshape(()) if v.ndim else v
    m = mask.reshape((*mask.shape, *(1,) * (x.ndim - k))).expand(x.shape)
    x = x.cast(d)
    return m.where(x + v if accumulate else v.expand(x.shape), x)


def _scatter_like(ctx: Ctx, x: Var, dim: int, index: Var, src: Any,
                  reduce: str | None) -> Var:
    if index.v.size == 0:  # nothing written (ATen checks no ranks then)
        return x.reshape(ctx.out_shape)
    x, index = _at_least_1d(x, index)
    d = _axis(x.ndim, dim)
    _needs_rows(x.shape[d], index.v.size, "scatter")
    if isinstance(src, Var):
        (s,) = _at_least_1d(src.cast(x.dtype))
        if s.ndim != index.ndim:
            raise Unsupported("scatter src of another rank than the index")
        s = s.slice((0,) * s.ndim, index.shape)  # torch reads src where index is
    else:
        s = as_var(src, x.dtype).expand(index.shape)
    if reduce is None:
        out = x.scatter(_index(index), s, d)
    elif reduce == "add" or reduce == "sum":
        out = x.scatter_add(_index(index), s, d)
    else:
        raise Unsupported(f"scatter with reduce={reduce!r}")
    return out.reshape(ctx.out_shape)


def _scatter(ctx: Ctx, x: Var, dim: int, index: Var, src: Any, reduce: str | None = None,
             **kwargs: Any) -> Var:
    """scatter.src and scatter.value (and their reduce='add' forms)."""
    return _scatter_like(ctx, x, dim, index, src, kwargs.get("reduce", reduce))


def _scatter_add(ctx: Ctx, x: Var, dim: int, index: Var, src: Var) -> Var:
    return _scatter_like(ctx, x, dim, index, src, "add")


#: torch.scatter_reduce's and index_reduce's reductions: the ISA scatter step that
#: combines an update into its element, and the step's identity (what an element
#: starts from when ``include_self`` is False). "mean" is a sum divided by the count.
REDUCTIONS: dict[str, tuple[Op, float]] = {
    "sum": (Op.ADD, 0.0), "mean": (Op.ADD, 0.0), "prod": (Op.MUL, 1.0),
    "amax": (Op.MAX, -math.inf), "amin": (Op.MIN, math.inf),
}


def reduce_into(ctx: Ctx, x: Var, idx: Var, src: Var, axis: int, reduce: str,
                include_self: bool) -> Var:
    """``x`` with ``src[j]`` reduced into the element at ``j`` whose ``axis`` coordinate
    is ``idx[j]`` (i64), ATen's way: without ``include_self`` the elements that receive
    updates start from the reduction's identity; a mean divides by how many values
    each element received (itself included), floored for integer results; elements
    with no update keep ``x``."""
    if reduce not in REDUCTIONS:
        raise Unsupported(f"reduce={reduce!r}")
    step, ident = REDUCTIONS[reduce]
    d = x.dtype
    base = x if include_self else x.scatter(idx, Var(const(ident, d, idx.shape)), axis)
    out = base.scatter_combine(idx, src, axis, step)
    if reduce != "mean":
        return out
    start = Var(const(1.0 if include_self else 0.0, d, x.shape))
    count = start.scatter_add(idx, Var(const(1.0, d, idx.shape)), axis)
    count = count.eq(0.0).where(1.0, count)
    mean = out / count
    return Var(b.unary(Op.FLOOR, mean.v)) if ctx.out.dtype in INT_DTYPES else mean


def _scatter_reduce(ctx: Ctx, x: Var, dim: int, index: Var, src: Var, reduce: str, *,
                    include_self: bool = True) -> Var:
    """``torch.scatter_reduce`` (sum, prod, mean, amax, amin): ``src`` where the index
    is (torch reads src only there), reduced into ``x`` by the ISA's scatter steps."""
    if index.v.size == 0:
        return x.reshape(ctx.out_shape)
    x, index = _at_least_1d(x, index)
    d = _axis(x.ndim, dim)
    _needs_rows(x.shape[d], index.v.size, "scatter_reduce")
    (s,) = _at_least_1d(src.cast(x.dtype))
    s = s.slice((0,) * s.ndim, index.shape)
    return reduce_into(ctx, x, _index(index), s, d, reduce, include_self).reshape(
        ctx.out_shape)


def _index_reduce(ctx: Ctx, x: Var, dim: int, index: Var, source: Var, reduce: str, *,
                  include_self: bool = True) -> Var:
    """``x.index_reduce(dim, index, source, reduce)``: source's slice k reduced into the
    slice ``index[k]`` (prod, mean, amax, amin)."""
    x, source = _at_least_1d(x, source)
    d = _axis(x.ndim, dim)
    i = index.reshape(1) if index.ndim == 0 else index
    _needs_rows(x.shape[d], i.v.size, "index_reduce")
    if i.v.size == 0:
        return x.reshape(ctx.out_shape)
    s = source.cast(x.dtype)
    return reduce_into(ctx, x, _index(_along(i, d, s.shape)), s, d, reduce,
                       include_self).reshape(ctx.out_shape)


def _index_add(ctx: Ctx, x: Var, dim: int, index: Var, source: Var, *, alpha: Any = 1) -> Var:
    """``x.index_add(dim, index, source)``: source's slice k added at index[k]."""
    x, source = _at_least_1d(x, source)
    d = _axis(x.ndim, dim)
    i = index.reshape(1) if index.ndim == 0 else index
    _needs_rows(x.shape[d], i.v.size, "index_add")
    s = source.cast(x.dtype)
    if alpha != 1:
        s = s * float(alpha)
    return x.scatter_add(_index(_along(i, d, s.shape)), s, d).reshape(ctx.out_shape)


def _put(ctx: Ctx, x: Var, index: Var, source: Var, accumulate: bool = False) -> Var:
    """``x.put(index, source)``: ``x`` flattened, ``source``'s elements written (added,
    with ``accumulate``) at ``index`` (negative counts from the end, as ``take``)."""
    n = x.v.size
    i = index.reshape(index.v.size)
    _needs_rows(n, i.v.size, "put")
    if i.v.size == 0:
        return x
    flat = x.reshape(n)
    s = source.cast(x.dtype).reshape(i.v.size)
    idx = _index(_wrap(i, n))
    out = flat.scatter_add(idx, s, 0) if accumulate else flat.scatter(idx, s, 0)
    return out.reshape(ctx.out_shape)


def _histc(ctx: Ctx, x: Var, bins: int = 100, min: Any = 0, max: Any = 0) -> Var:
    """torch.histc over an explicit range: ATen's bin ``trunc((x - min) * bins / (max -
    min))`` in the input's dtype (the last edge falls in the last bin), NaN and values
    outside ``[min, max]`` counted nowhere; the counts a SCATTER_ADD of ones. The data's
    own range (``min == max``) is PyTorch's: it first checks that range is finite."""
    lo, hi = float(min), float(max)
    if lo == hi:
        raise Unsupported("histc over the data's own range (PyTorch checks it is finite)")
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
        raise Unsupported(f"histc range [{lo}, {hi}] (an error PyTorch reports)")
    d = ctx.out_dtype
    v = x.cast(d).reshape(x.v.size)
    inside = and_(or_(v > lo, v.eq(lo)), or_(v < hi, v.eq(hi)))  # false for NaN
    pos = b.unary(Op.TRUNC, (((v - lo) * float(bins)) / (hi - lo)).v)
    pos = Var(pos).minimum(float(bins - 1))
    idx = inside.where(pos, 0.0).cast(I64)
    hits = inside.cast(d)
    return Var(const(0, d, (bins,))).scatter_add(idx, hits, 0) if v.v.size else \
        Var(const(0, d, (bins,)))


def _histogram(ctx: Ctx, x: Var, bins: Any, *, range: Any = None, weight: Var | None = None,
               density: bool = False) -> tuple[Var, Var]:
    """torch.histogram with a tensor of bin edges (ATen's binary search: a value's bin is
    how many edges are at or below it, less one; the last edge belongs to the last bin;
    NaN and values outside the edges count nowhere), as a SCATTER_ADD of the weights (or
    ones); ``density`` divides by the total times each bin's width. A bin count computes
    its edges from the data's range, which PyTorch first checks is finite: PyTorch's."""
    if not isinstance(bins, Var):
        raise Unsupported("histogram with a bin count (edges from the data's own range)")
    d = ctx.out_dtype
    edges = bins.cast(d)
    m = edges.shape[0]
    nb = m - 1
    v = x.cast(d).reshape(x.v.size)
    hist = Var(const(0, d, (nb,)))
    if v.v.size and nb > 0:
        lo = edges.slice((0,), (1,)).expand(v.shape)
        hi = edges.slice((m - 1,), (1,)).expand(v.shape)
        inside = and_(or_(lo < v, v.eq(lo)), or_(v < hi, v.eq(hi)))  # false for NaN
        shape = (v.v.size, m)
        below = not_(v.reshape((v.v.size, 1)).expand(shape) < edges.reshape((1, m)).expand(
            shape)).cast(dtypes.f64).sum(1)  # edges <= x
        pos = (below - 1.0).minimum(float(nb - 1)).maximum(0.0)
        w = weight.cast(d).reshape(v.v.size) if weight is not None else Var(const(1, d, v.shape))
        hist = hist.scatter_add(inside.where(pos, 0.0).cast(I64), inside.where(w, 0.0), 0)
    if density:
        widths = edges.slice((1,), (nb,)) - edges.slice((0,), (nb,))
        hist = hist / (hist.sum(0, keepdims=True).expand((nb,)) * widths)
    return hist, edges


def _nonzero_static(ctx: Ctx, x: Var, *, size: int, fill_value: int = -1) -> Var:
    """The coordinates of the first ``size`` nonzero elements (row-major order), rows of
    ``fill_value`` after them. Element i's row is its rank among the nonzeros (a CUMSUM
    of the mask); a SCATTER writes each nonzero's coordinates (IOTAs) there, and sends
    the others, and ranks from ``size`` on, to one extra row dropped afterwards."""
    shape = tuple(ctx.out_shape)
    nd, n = x.ndim, x.v.size
    fill = Var(const(float(fill_value), dtypes.f64, (size + 1, nd)))
    if nd == 0 or n == 0 or size == 0:
        return fill.slice((0, 0), shape)
    hit = not_(x.reshape(n).eq(0.0))
    rank = hit.cast(dtypes.f64).cumsum(0) - 1.0
    row = and_(hit, rank < float(size)).where(rank, float(size))
    idx = row.cast(I64).reshape((n, 1)).expand((n, nd))
    coords = [Var(b.iota(x.shape, d, dtypes.f64)).reshape((n, 1)) for d in range(nd)]
    src = Var(concat([c.v for c in coords], 1)) if nd > 1 else coords[0]
    return fill.scatter(idx, src, 0).slice((0, 0), shape)


def _span(n: int, start: int | None, end: int | None) -> tuple[int, int]:
    """Python's slice bounds for a sequence of ``n`` (negative from the end, clamped)."""
    lo = 0 if start is None else start + n if start < 0 else start
    hi = n if end is None else end + n if end < 0 else end
    lo = min(max(lo, 0), n)
    return lo, min(max(hi, lo), n)


def _slice_scatter(ctx: Ctx, x: Var, src: Var, dim: int = 0, start: int | None = None,
                   end: int | None = None, step: int = 1) -> Var:
    """``x`` with ``x[..., start:end:step, ...] = src``: a CONCAT of windows for step 1,
    a SCATTER at the positions ``start + step * k`` otherwise."""
    d = _axis(x.ndim, dim)
    s = src.cast(x.dtype)
    lo, hi = _span(x.shape[d], start, end)
    if step == 1:
        return _splice(x, s, d, lo, lo + s.shape[d])
    if s.shape[d] == 0:
        return x
    pos = Var(b.iota(s.shape, d, I64)) * step + lo
    return x.scatter(pos, s, d)


def _splice(x: Var, part: Var, d: int, lo: int, hi: int) -> Var:
    """``x`` with its window [lo, hi) along ``d`` replaced by ``part``."""
    n = x.shape[d]

    def window(a: int, z: int) -> Any:
        return x.slice(tuple(a if k == d else 0 for k in range(x.ndim)),
                       tuple(z - a if k == d else s for k, s in enumerate(x.shape))).v

    parts = [p for p in (window(0, lo), part.v, window(hi, n)) if p.shape[d]]
    return Var(concat(parts or [part.v], d))


def _select_scatter(ctx: Ctx, x: Var, src: Var, dim: int, index: int) -> Var:
    d = _axis(x.ndim, dim)
    i = index + x.shape[d] if index < 0 else index
    shape = tuple(1 if k == d else s for k, s in enumerate(x.shape))
    return _splice(x, src.cast(x.dtype).reshape(shape), d, i, i + 1)


def _select_backward(ctx: Ctx, grad: Var, input_sizes: Sequence[int], dim: int,
                     index: int) -> Var:
    """The gradient of select: ``grad`` in its row, zeros around it (CONCAT with constant
    parts, which read no memory)."""
    shape = tuple(input_sizes)
    d = _axis(len(shape), dim)
    i = index + shape[d] if index < 0 else index
    zeros = Var(const(0, ctx.out_dtype, shape))
    row = grad.cast(ctx.out_dtype).reshape(tuple(1 if k == d else s for k, s in
                                                 enumerate(shape)))
    return _splice(zeros, row, d, i, i + 1)


def _embedding_backward(ctx: Ctx, grad: Var, indices: Var, num_weights: int,
                        padding_idx: int, scale_grad_by_freq: bool) -> Var:
    """The [V, D] gradient of an embedding: each row of ``grad`` added at its index (a
    SCATTER_ADD over rows, columns in contiguous blocks), none for ``padding_idx``."""
    d = ctx.out_dtype
    n, width = indices.v.size, grad.shape[-1]
    _needs_rows(num_weights, n, "embedding_dense_backward")
    g = grad.cast(d).reshape(n, width)
    i = indices.reshape(n)
    if padding_idx >= 0:
        g = i.eq(float(padding_idx)).reshape(n, 1).expand((n, width)).where(0.0, g)
    if scale_grad_by_freq:  # divided by how often each index occurs
        ones = Var(const(1.0, d, (n,)))
        counts = Var(const(0.0, d, (num_weights,))).scatter_add(_index(i), ones, 0)
        g = g / counts.gather(_index(i), 0).reshape(n, 1)
    idx = _index(i).reshape(n, 1).expand((n, width))
    return Var(const(0.0, d, (num_weights, width))).scatter_add(idx, g, 0)


# One row per ATen op (overload packet).
ROWS: dict[Any, Callable[..., Any]] = {
    aten.embedding: _embedding,
    aten.embedding_dense_backward: _embedding_backward,
    aten.index: _index_tensor,
    aten._unsafe_index: _index_tensor,
    aten.index_select: _index_select,
    aten.gather: _gather,
    aten.take_along_dim: _take_along_dim,
    aten.select: _select,
    aten.select_backward: _select_backward,
    aten.flip: _flip,
    aten.scatter: _scatter,
    aten.scatter_add: _scatter_add,
    aten.index_put: _index_put,
    aten._unsafe_index_put: _index_put,
    aten.index_add: _index_add,
    aten.put: _put,
    aten.histc: _histc,
    aten.histogram: _histogram,
    aten.nonzero_static: _nonzero_static,
    aten.scatter_reduce: _scatter_reduce,
    aten.index_reduce: _index_reduce,
    aten.slice_scatter: _slice_scatter,
    aten.select_scatter: _select_scatter,
}
