"""``torch.compile(model, backend="hologram")``: FX graphs run as Atlas ISA programs.

Dynamo captures a graph, AOT autograd splits it into a forward and a backward
graph of ATen ops, and this module translates each graph into as few Atlas ISA
programs as it can: every maximal run of supported ATen ops becomes ONE program,
so the executor canonicalizes and fuses across what eager PyTorch runs as many
separate kernels. ATen ops without a translation (or with tensors hologram cannot
take: f16, complex, other devices) run in PyTorch for that node, and the
reason is logged once per op on the ``hologram_torch`` logger, so a graph never
fails or silently changes meaning because one op is missing.

Why a table and not an if-chain: each supported ATen op is one row mapping the
op to a function over :class:`hologram.isa.builder.Var`, so adding an op is
adding a row, and :data:`ATEN_TABLE` doubles as the list of supported ops.

Plans are built from the shapes dynamo recorded on each node (``meta['val']``).
When the graph has symbolic (dynamic) shapes, the first call with each new set of
input shapes runs the graph eagerly in PyTorch to learn the concrete shapes, and
later calls with the same shapes run the hologram plan: programs are static-shape
by design, so each distinct shape signature gets its own programs.
"""

from __future__ import annotations

import contextlib
import logging
import math
import operator
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.fx

from hologram.executor import Executor
from hologram.interop import default_executor
from hologram.isa import dtypes
from hologram.isa.builder import Var, concat, const, elementwise, ldg, make, stg
from hologram.isa.dtypes import DType
from hologram.isa.opcodes import Op
from hologram.isa.program import Program
from hologram.isa.value import Value, contiguous_strides
from hologram.memory.address import data_pointer
from hologram.ops import composites

__all__ = [
    "ATEN_TABLE",
    "BACKEND_NAME",
    "GraphSummary",
    "HologramGraph",
    "RegionSummary",
    "Unsupported",
    "collect_graphs",
    "hologram_backend",
    "register",
    "supported_ops",
]

log = logging.getLogger("hologram_torch")
aten = torch.ops.aten
BACKEND_NAME = "hologram"

# GEMMs whose matrix products are up to this many multiply-adds each run with one
# BLAS thread (see _BlasThreads).
SMALL_GEMM_MACS = 1 << 22


class Unsupported(Exception):
    """A node hologram cannot run; the message is the reason shown to the user."""


# --------------------------------------------------------------------------------------
# Node information: what each FX node produces, with concrete shapes.
# --------------------------------------------------------------------------------------
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


def _infos_from_meta(gm: torch.fx.GraphModule) -> dict[torch.fx.Node, Any] | None:
    """Per-node infos from dynamo's fake tensors, or None when any shape is symbolic."""
    infos: dict[torch.fx.Node, Any] = {}
    for n in gm.graph.nodes:
        if n.op == "output":
            continue
        if "val" not in n.meta:
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


# --------------------------------------------------------------------------------------
# Translation context and helpers over Vars.
# --------------------------------------------------------------------------------------
class Ctx:
    """What a translation function may ask about the node it translates."""

    def __init__(self, node: torch.fx.Node, out: Any, region: _Region) -> None:
        self.node = node
        self.out = out
        self._region = region

    @property
    def out_dtype(self) -> DType:
        """The ISA dtype of the (first) tensor result."""
        info = self.out[0] if isinstance(self.out, tuple) else self.out
        return _isa_dtype(info.dtype)

    @property
    def out_shape(self) -> tuple[int, ...]:
        info = self.out[0] if isinstance(self.out, tuple) else self.out
        return info.shape

    def iota(self, n: int, dtype: DType) -> Var:
        """0, 1, ..., n-1 as an input the region receives (the ISA has no iota)."""
        return self._region.aux_input(("iota", n, dtype.name),
                                      lambda: np.arange(n, dtype=dtype.np_dtype))

    def check_index(self, target: Var, n_classes: int, ignore_index: int) -> None:
        """Have the runtime check class indices as PyTorch does before running."""
        self._region.add_index_check(target, n_classes, ignore_index)


def _isa_dtype(td: torch.dtype) -> DType:
    """The dtype a tensor of ``td`` has inside a program (integers ride in f64)."""
    if td is torch.bool:
        return dtypes.boolean
    if td in INT_DTYPES:
        return dtypes.f64
    d = ISA_FLOAT.get(td)
    if d is None:
        raise Unsupported(f"dtype {td} is not an Atlas ISA dtype the executor runs")
    return d


def _var(x: Any, dtype: DType) -> Var:
    """A Var of ``dtype``: casts a Var, turns a Python scalar into a 0-d constant."""
    if isinstance(x, Var):
        return x.cast(dtype) if x.dtype is not dtype else x
    if isinstance(x, (bool, int, float)):
        if dtype is dtypes.boolean:
            return Var(const(bool(x), dtype, ()))
        return Var(const(float(x) if dtype.is_float else int(x), dtype, ()))
    raise Unsupported(f"operand of type {type(x).__name__} is not a tensor or a number")


def _wider(*xs: Any) -> DType:
    """The compute dtype for comparing or combining mixed operands (PyTorch-like)."""
    ds = [x.dtype for x in xs if isinstance(x, Var) and x.dtype.is_float]
    if not ds:
        return dtypes.f32
    full = [x.dtype for x in xs if isinstance(x, Var) and x.dtype.is_float and x.ndim > 0]
    pool = full or ds
    return dtypes.f64 if dtypes.f64 in pool else pool[0]


def _bool_const(value: bool) -> Value:
    return const(value, dtypes.boolean, ())


def _or(p: Var, q: Var) -> Var:
    return Var(elementwise(Op.SEL, p.v, _bool_const(True), q.v))


def _and(p: Var, q: Var) -> Var:
    return Var(elementwise(Op.SEL, p.v, q.v, _bool_const(False)))


def _not(p: Var) -> Var:
    return Var(elementwise(Op.SEL, p.v, _bool_const(False), _bool_const(True)))


def _logical(kind: str) -> Callable[..., Var]:
    """and/or/not over bool tensors (integer bitwise ops fail the dtype check first)."""

    def tr(ctx: Ctx, a: Any, b: Any = None) -> Var:
        if ctx.out.dtype is not torch.bool:
            raise Unsupported(f"bitwise {kind} on {ctx.out.dtype} (only bool is translated)")
        p = _var(a, dtypes.boolean)
        if kind == "not":
            return _not(p)
        q = _var(b, dtypes.boolean)
        return _or(p, q) if kind == "or" else _and(p, q)

    return tr


def _sign(ctx: Ctx, x: Var) -> Var:
    x = x.cast(ctx.out_dtype)
    # x * 0 keeps NaN as NaN (and 0 as 0) where neither comparison holds.
    return (0.0 < x).where(1.0, (x < 0.0).where(-1.0, x * 0.0))


def _cmp(kind: str, a: Any, b: Any) -> Var:
    d = _wider(a, b)
    x, y = _var(a, d), _var(b, d)
    # Written with < and == only (the ISA's compares), keeping IEEE NaN behaviour:
    # every comparison with NaN is false except !=.
    forms: dict[str, Callable[[], Var]] = {
        "lt": lambda: x < y,
        "gt": lambda: y < x,
        "eq": lambda: x.eq(y),
        "ne": lambda: _not(x.eq(y)),
        "le": lambda: _or(x < y, x.eq(y)),
        "ge": lambda: _or(y < x, x.eq(y)),
    }
    return forms[kind]()


def _dims(x: Var, dim: Any) -> tuple[int, ...]:
    """ATen's dim argument: None or [] means every dimension."""
    if dim is None:
        return tuple(range(x.ndim))
    if isinstance(dim, int):
        dim = [dim]
    if len(dim) == 0:
        return tuple(range(x.ndim))
    return tuple(d % x.ndim if x.ndim else 0 for d in dim)


def _reduce_as(method: str) -> Callable[..., Var]:
    def fn(ctx: Ctx, x: Var, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Var:
        x = x.cast(ctx.out_dtype)  # a bool count sums in the (integer, so f64) result
        if x.ndim == 0:
            return x
        r = getattr(x, method)(_dims(x, dim), keepdims=bool(keepdim))
        return r.reshape(ctx.out_shape)

    return fn


def _loss_reduce(per_elem: Var, reduction: int) -> Var:
    # ATen encodes reduction as an int: 0 none, 1 mean, 2 sum.
    return composites.reduce_loss(per_elem, {0: "none", 1: "mean", 2: "sum"}[int(reduction)])


def _binary(fn: Callable[[Var, Var], Var]) -> Callable[..., Var]:
    def tr(ctx: Ctx, a: Any, b: Any, *, alpha: Any = 1) -> Var:
        d = ctx.out_dtype
        x, y = _var(a, d), _var(b, d)
        if alpha != 1:
            y = y * float(alpha)
        return fn(x, y)

    return tr


def _rsub(ctx: Ctx, a: Any, b: Any, *, alpha: Any = 1) -> Var:
    d = ctx.out_dtype
    x, y = _var(a, d), _var(b, d)
    return y - (x * float(alpha) if alpha != 1 else x)


def _div(ctx: Ctx, a: Any, b: Any, *, rounding_mode: str | None = None) -> Var:
    if rounding_mode is not None:
        raise Unsupported(f"div rounding_mode={rounding_mode!r} has no ISA form")
    d = ctx.out_dtype
    return _var(a, d) / _var(b, d)


def _unary(method: str) -> Callable[..., Var]:
    def tr(ctx: Ctx, x: Var) -> Var:
        return getattr(x.cast(ctx.out_dtype), method)()

    return tr


def _where(ctx: Ctx, cond: Any, a: Any, b: Any) -> Var:
    d = ctx.out_dtype
    c = _var(cond, dtypes.boolean)
    return c.where(_var(a, d), _var(b, d))


def _clamp(ctx: Ctx, x: Var, min: Any = None, max: Any = None) -> Var:  # noqa: A002
    d = ctx.out_dtype
    y = x.cast(d)
    if min is not None:
        y = y.maximum(_var(min, d))
    if max is not None:
        y = y.minimum(_var(max, d))
    return y


def _gelu(ctx: Ctx, x: Var, approximate: str = "none") -> Var:
    return composites.gelu(x.cast(ctx.out_dtype), approximate)


def _gelu_backward(ctx: Ctx, grad: Var, x: Var, approximate: str = "none") -> Var:
    d = ctx.out_dtype
    g, x = grad.cast(d), x.cast(d)
    if approximate == "tanh":
        k0, k1 = composites.SQRT_2_OVER_PI, 0.044715
        t = (k0 * (x + k1 * (x * x * x))).tanh()
        left_d = 0.5 * (1.0 + t)
        right_d = (0.5 * x) * (1.0 - t * t) * k0 * (1.0 + (3.0 * k1) * (x * x))
        return g * (left_d + right_d)
    cdf = 0.5 * (1.0 + (x * composites.INV_SQRT2).erf())
    pdf = (-0.5 * (x * x)).exp() * (1.0 / math.sqrt(2.0 * math.pi))
    return g * (cdf + x * pdf)


def _threshold_backward(ctx: Ctx, grad: Var, x: Var, threshold: float) -> Var:
    return _cmp("le", x, threshold).where(0.0, _var(grad, ctx.out_dtype))


def _softmax(ctx: Ctx, x: Var, dim: int, half_to_float: bool = False) -> Var:
    return composites.softmax(x.cast(ctx.out_dtype), dim)


def _log_softmax(ctx: Ctx, x: Var, dim: int, half_to_float: bool = False) -> Var:
    return composites.log_softmax(x.cast(ctx.out_dtype), dim)


def _softmax_backward(ctx: Ctx, grad: Var, out: Var, dim: int, input_dtype: Any = None) -> Var:
    d = ctx.out_dtype
    g, y = grad.cast(d), out.cast(d)
    return y * (g - (g * y).sum(dim, keepdims=True))


def _log_softmax_backward(ctx: Ctx, grad: Var, out: Var, dim: int,
                          input_dtype: Any = None) -> Var:
    d = ctx.out_dtype
    g, y = grad.cast(d), out.cast(d)
    return g - y.exp() * g.sum(dim, keepdims=True)


def _var_of(x: Var, dims: tuple[int, ...], correction: float, keepdim: bool) -> tuple[Var, Var]:
    n = math.prod(x.shape[d] for d in dims)
    mean = x.mean(dims, keepdims=True)
    dev = x - mean
    var = (dev * dev).sum(dims, keepdims=True) / float(max(n - correction, 0))
    if not keepdim:
        keep = tuple(s for i, s in enumerate(x.shape) if i not in dims)
        var, mean = var.reshape(keep), mean.reshape(keep)
    return var, mean


def _var_correction(ctx: Ctx, x: Var, dim: Any = None, *, correction: Any = None,
                    keepdim: bool = False) -> Var:
    x = x.cast(ctx.out_dtype)
    return _var_of(x, _dims(x, dim), 1.0 if correction is None else float(correction),
                   keepdim)[0]


def _var_mean_correction(ctx: Ctx, x: Var, dim: Any = None, *, correction: Any = None,
                         keepdim: bool = False) -> tuple[Var, Var]:
    x = x.cast(ctx.out_dtype)
    return _var_of(x, _dims(x, dim), 1.0 if correction is None else float(correction), keepdim)


def _layer_norm(ctx: Ctx, x: Var, normalized_shape: Sequence[int], weight: Var | None,
                bias: Var | None, eps: float) -> tuple[Var, Var, Var]:
    d = ctx.out_dtype
    x = x.cast(d)
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    mean = x.mean(axes, keepdims=True)
    dev = x - mean
    rstd = ((dev * dev).mean(axes, keepdims=True) + float(eps)).rsqrt()
    y = dev * rstd
    if weight is not None:
        y = y * weight.cast(d)
    if bias is not None:
        y = y + bias.cast(d)
    stat_shape = ctx.out[1].shape
    return y, mean.reshape(stat_shape), rstd.reshape(stat_shape)


def _layer_norm_backward(ctx: Ctx, grad_out: Var, x: Var, normalized_shape: Sequence[int],
                         mean: Var, rstd: Var, weight: Var | None, bias: Var | None,
                         output_mask: Sequence[bool]) -> tuple[Var | None, ...]:
    d = _isa_dtype(next(i for i in ctx.out if isinstance(i, TInfo)).dtype)
    g, x = grad_out.cast(d), x.cast(d)
    k = len(normalized_shape)
    axes = tuple(range(x.ndim - k, x.ndim))
    lead = tuple(range(x.ndim - k))
    keep = tuple(x.shape[: x.ndim - k]) + (1,) * k
    mean, rstd = mean.cast(d).reshape(keep), rstd.cast(d).reshape(keep)
    x_hat = (x - mean) * rstd
    n = float(math.prod(normalized_shape))
    results: list[Var | None] = [None, None, None]
    if output_mask[0]:
        gw = g * weight.cast(d) if weight is not None else g
        s1 = gw.sum(axes, keepdims=True)
        s2 = (gw * x_hat).sum(axes, keepdims=True)
        results[0] = (rstd / n) * (n * gw - s1 - x_hat * s2)
    if output_mask[1] and weight is not None:
        results[1] = (g * x_hat).sum(lead).reshape(tuple(normalized_shape)) if lead else \
            (g * x_hat).reshape(tuple(normalized_shape))
    if output_mask[2] and bias is not None:
        results[2] = g.sum(lead).reshape(tuple(normalized_shape)) if lead else \
            g.reshape(tuple(normalized_shape))
    return tuple(results)


def _mm(ctx: Ctx, a: Var, b: Var) -> Var:
    d = ctx.out_dtype
    return a.cast(d) @ b.cast(d)


def _addmm(ctx: Ctx, bias: Var, a: Var, b: Var, *, beta: Any = 1, alpha: Any = 1) -> Var:
    d = ctx.out_dtype
    r = a.cast(d) @ b.cast(d)
    if alpha != 1:
        r = r * float(alpha)
    if beta == 0:
        return r
    c = _var(bias, d)
    return r + (c * float(beta) if beta != 1 else c)


def _unmerged(v: Value) -> Value | None:
    """``v`` (shape [B, r, c]) as the value ``u`` of shape [*batch, r, c] it was
    flattened from (prod(batch) == B), or None when it was not.

    ``torch.matmul`` on 4-D operands (attention's ``q @ k.transpose(-2, -1)``) reaches
    the graph as bmm of ``_unsafe_view(expand(transpose(...)), [B, r, c])``: a reshape
    that merges batch axes. Merging a head axis into the batch axis of a permuted
    tensor is not a strided view, so a GEMM reading it would need a copy; the
    unmerged operand is one (a permute over a buffer), which a strided-batch GEMM
    reads in place. A transpose of the last two axes on top of the reshape (the
    backward graph's ``bmm(transpose(view), ...)``) is looked through as well.
    """
    if v.op is Op.PERMUTE and v.attr("perm") == (0, 2, 1):
        u = _unmerged(v.srcs[0])
        if u is None:
            return None
        return make(Op.PERMUTE, (u,), {"perm": (*range(u.ndim - 2), u.ndim - 1, u.ndim - 2)})
    if v.op is Op.RESHAPE:
        u = v.srcs[0]
        if u.ndim > 3 and u.shape[-2:] == v.shape[-2:] and math.prod(u.shape[:-2]) == v.shape[0]:
            return u
    return None


def _batched_gemm(a: Var, b: Var) -> Var:
    """``a [B, m, k] @ b [B, k, n]`` as one batched GEMM, over the operands' unmerged
    batch axes where their reshapes merged some (see :func:`_unmerged`): splitting an
    axis is always a view, merging one may not be."""
    (bs, m, _), n = a.shape, b.shape[2]
    ua, ub = _unmerged(a.v), _unmerged(b.v)
    batch = next((u.shape[:-2] for u in (ua, ub) if u is not None), None)
    if batch is None or any(u is not None and u.shape[:-2] != batch for u in (ua, ub)):
        return a @ b  # nothing to unmerge, or two different splits: the 3-D product
    pa = Var(ua) if ua is not None else a.reshape((*batch, *a.shape[1:]))
    pb = Var(ub) if ub is not None else b.reshape((*batch, *b.shape[1:]))
    return (pa @ pb).reshape(bs, m, n)


def _bmm(ctx: Ctx, a: Var, b: Var) -> Var:
    d = ctx.out_dtype
    return _batched_gemm(a.cast(d), b.cast(d))


def _matmul(ctx: Ctx, a: Var, b: Var) -> Var:
    """``torch.matmul``: NumPy's rules (1-D operands, broadcast batch dims), which the
    builder spells as RESHAPE/EXPAND before one GEMM. AOT autograd normally decomposes
    matmul into mm/bmm before the graph reaches us; this row covers graphs that keep it."""
    d = ctx.out_dtype
    return a.cast(d) @ b.cast(d)


def _reshape_to_out(ctx: Ctx, x: Var, *args: Any, **kwargs: Any) -> Var:
    return x.reshape(ctx.out_shape)


def _expand(ctx: Ctx, x: Var, *args: Any, **kwargs: Any) -> Var:
    return x.expand(ctx.out_shape)


def _t(ctx: Ctx, x: Var) -> Var:
    return x.T if x.ndim == 2 else x


def _transpose(ctx: Ctx, x: Var, d0: int, d1: int) -> Var:
    if x.ndim < 2:
        return x
    perm = list(range(x.ndim))
    perm[d0 % x.ndim], perm[d1 % x.ndim] = perm[d1 % x.ndim], perm[d0 % x.ndim]
    return x.permute(tuple(perm))


def _permute(ctx: Ctx, x: Var, dims: Sequence[int]) -> Var:
    return x.permute(tuple(d % x.ndim for d in dims)) if x.ndim else x


def _axis(x: Var, dim: int) -> int:
    if x.ndim == 0:
        raise Unsupported("slicing a 0-d tensor")
    return dim % x.ndim


def _window(ctx: Ctx, x: Var, dim: int, start: int) -> Var:
    """``x`` narrowed along ``dim`` to ATen's result size from ``start`` (Python's
    rules: a negative start counts from the end, out-of-range starts clamp)."""
    d = _axis(x, dim)
    n = x.shape[d]
    lo = min(max(start + n if start < 0 else start, 0), n)
    return x.slice(tuple(lo if a == d else 0 for a in range(x.ndim)), ctx.out_shape)


def _slice(ctx: Ctx, x: Var, dim: int = 0, start: int | None = None, end: int | None = None,
           step: int = 1) -> Var:
    if step != 1:
        raise Unsupported(f"slice with step {step} (the ISA's SLICE takes step 1)")
    return _window(ctx, x, dim, 0 if start is None else start)


def _narrow(ctx: Ctx, x: Var, dim: int, start: Any, length: int) -> Var:
    if not isinstance(start, int):
        raise Unsupported("narrow with a tensor start (a data-dependent slice)")
    return _window(ctx, x, dim, start)


def _split(ctx: Ctx, x: Var, _sizes: Any, dim: int = 0) -> tuple[Var, ...]:
    """split, split_with_sizes and chunk: consecutive slices, sized as ATen's results
    are (which settles chunk's and split's rounding once, in PyTorch)."""
    d = _axis(x, dim)
    return tuple(x.split([o.shape[d] for o in ctx.out], d))


def _cat(ctx: Ctx, tensors: Sequence[Any], dim: int = 0) -> Var:
    """``torch.cat``, in the result's dtype; PyTorch's legacy 1-D empty operands (shape
    [0] beside higher-rank tensors) are skipped as it skips them."""
    out_ndim = len(ctx.out_shape)
    parts = [_var(t, ctx.out_dtype).v for t in tensors
             if not (isinstance(t, Var) and t.shape == (0,) and out_ndim != 1)]
    if not parts:
        raise Unsupported("cat of nothing but legacy empty tensors")
    return Var(concat(parts, dim % out_ndim))


def _slice_backward(ctx: Ctx, grad: Var, input_sizes: Sequence[int], dim: int, start: int,
                    end: int, step: int) -> Var:
    """The gradient of a slice: ``grad`` in its window, zeros around it (a CONCAT with
    constant parts, which read no memory)."""
    if step != 1:
        raise Unsupported(f"slice_backward with step {step} (the ISA's SLICE takes step 1)")
    shape = tuple(input_sizes)
    d = dim % len(shape)
    n = shape[d]
    lo = min(max(start + n if start < 0 else start, 0), n)
    g = _var(grad, ctx.out_dtype)

    def zeros(size: int) -> Value:
        return const(0, g.dtype, (*shape[:d], size, *shape[d + 1:]))

    parts = [p for p in (zeros(lo), g.v, zeros(n - lo - g.shape[d])) if p.shape[d]]
    return Var(concat(parts or [g.v], d))


def _identity(ctx: Ctx, x: Var, *args: Any, **kwargs: Any) -> Var:
    return x


def _to_copy(ctx: Ctx, x: Var, *args: Any, dtype: Any = None, device: Any = None,
             **kwargs: Any) -> Var:
    if device is not None and torch.device(device).type != "cpu":
        raise Unsupported(f"_to_copy to device {device} leaves host memory")
    return x.cast(_isa_dtype(ctx.out.dtype))


def _convert_element_type(ctx: Ctx, x: Var, dtype: Any) -> Var:
    return x.cast(_isa_dtype(ctx.out.dtype))


def _fill_from(pos: int | None) -> Callable[..., Var]:
    """Constant fills; ``pos`` is where the fill value sits in the arguments."""

    def tr(ctx: Ctx, *args: Any, **kwargs: Any) -> Var:
        value = kwargs.get("fill_value", args[pos] if pos is not None else None)
        if isinstance(value, Var):
            raise Unsupported("fill value is a tensor")
        return _var(value, ctx.out_dtype).expand(ctx.out_shape)

    return tr


def _const_fill(value: float) -> Callable[..., Var]:
    def tr(ctx: Ctx, *args: Any, **kwargs: Any) -> Var:
        return _var(value, ctx.out_dtype).expand(ctx.out_shape)

    return tr


def _mse_loss(ctx: Ctx, x: Var, t: Var, reduction: int = 1) -> Var:
    d = ctx.out_dtype
    return _loss_reduce(composites.squared_error(x.cast(d), t.cast(d)), reduction)


def _mse_loss_backward(ctx: Ctx, grad: Var, x: Var, t: Var, reduction: int) -> Var:
    d = ctx.out_dtype
    x, t = x.cast(d), t.cast(d)
    g = 2.0 * (x - t) * _var(grad, d)
    return g / float(x.v.size) if int(reduction) == 1 else g


def _bce(ctx: Ctx, x: Var, t: Var, weight: Var | None = None, reduction: int = 1) -> Var:
    d = ctx.out_dtype
    loss = composites.binary_cross_entropy(x.cast(d), t.cast(d))
    if weight is not None:
        loss = loss * weight.cast(d)
    return _loss_reduce(loss, reduction)


def _bce_backward(ctx: Ctx, grad: Var, x: Var, t: Var, weight: Var | None = None,
                  reduction: int = 1) -> Var:
    d = ctx.out_dtype
    x, t = x.cast(d), t.cast(d)
    # PyTorch's formula, with its 1e-12 floor on x(1-x).
    g = _var(grad, d) * (x - t) / ((1.0 - x) * x).maximum(1e-12)
    if weight is not None:
        g = g * weight.cast(d)
    return g / float(x.v.size) if int(reduction) == 1 else g


def _bce_logits(ctx: Ctx, x: Var, t: Var, weight: Var | None = None,
                pos_weight: Var | None = None, reduction: int = 1) -> Var:
    d = ctx.out_dtype
    x, t = x.cast(d), t.cast(d)
    softplus_neg = ((-abs(x)).exp() + 1.0).log() + (-x).maximum(0.0)  # log(1 + e^-x)
    if pos_weight is not None:
        loss = (1.0 - t) * x + (1.0 + (pos_weight.cast(d) - 1.0) * t) * softplus_neg
    else:
        loss = (1.0 - t) * x + softplus_neg
    if weight is not None:
        loss = loss * weight.cast(d)
    return _loss_reduce(loss, reduction)


def _nll_parts(ctx: Ctx, x: Var, target: Var, weight: Var | None,
               ignore_index: int) -> tuple[Var, Var, tuple[int, int]]:
    """(one-hot mask, effective per-row weight, (rows, classes)) of a class-index target."""
    d = x.dtype
    if x.ndim not in (1, 2):
        raise Unsupported(f"nll_loss over {x.ndim}-D input (only 1-D or 2-D)")
    n, c = (1, x.shape[0]) if x.ndim == 1 else x.shape
    ctx.check_index(target, c, int(ignore_index))
    tgt = target.reshape(n, 1)
    onehot = ctx.iota(c, target.dtype).reshape(1, c).eq(tgt)  # (n, c) bool
    valid = _not(tgt.eq(float(ignore_index)))  # (n, 1)
    if weight is not None:
        w_row = onehot.where(weight.cast(d).reshape(1, c), 0.0).sum(1, keepdims=True)
    else:
        w_row = Var(const(1.0, d, (n, 1)))
    w_eff = valid.where(w_row, 0.0)  # (n, 1)
    return onehot, w_eff, (n, c)


def _nll_loss_forward(ctx: Ctx, x: Var, target: Var, weight: Var | None, reduction: int,
                      ignore_index: int) -> tuple[Var, Var]:
    d = ctx.out_dtype
    x = x.cast(d)
    onehot, w_eff, (n, c) = _nll_parts(ctx, x.reshape(-1, x.shape[-1]) if x.ndim else x,
                                       target, weight, ignore_index)
    x2 = x.reshape(n, c)
    picked = onehot.where(x2, 0.0).sum(1, keepdims=True)  # (n, 1)
    per_row = -(picked * w_eff)
    total = w_eff.sum()
    red = int(reduction)
    if red == 0:
        out = per_row.reshape(ctx.out[0].shape)
    elif red == 2:
        out = per_row.sum()
    else:
        out = per_row.sum() / total
    tw = total.reshape(ctx.out[1].shape) if ctx.out[1].numel == 1 else \
        Var(const(0.0, d, ctx.out[1].shape))
    return out, tw


def _nll_loss_backward(ctx: Ctx, grad: Var, x: Var, target: Var, weight: Var | None,
                       reduction: int, ignore_index: int, total_weight: Var) -> Var:
    d = ctx.out_dtype
    x = x.cast(d)
    onehot, w_eff, (n, c) = _nll_parts(ctx, x, target, weight, ignore_index)
    g = _var(grad, d)
    red = int(reduction)
    if red == 0 and g.ndim > 0:
        g = g.reshape(n, 1)
    elif red == 1:
        g = g / total_weight.cast(d)
    # d loss / d x[i, c] = -g_i * w[target_i] where c == target_i (and the row counts).
    gi = onehot.where(-(g * w_eff), 0.0)
    return gi.reshape(ctx.out_shape)


# One row per ATen op (overload packet): the op -> a function over Vars.
ATEN_TABLE: dict[Any, Callable[..., Any]] = {
    aten.add: _binary(lambda x, y: x + y),
    aten.sub: _binary(lambda x, y: x - y),
    aten.rsub: _rsub,
    aten.mul: _binary(lambda x, y: x * y),
    aten.div: _div,
    aten.pow: _binary(lambda x, y: x ** y),
    aten.maximum: _binary(lambda x, y: x.maximum(y)),
    aten.minimum: _binary(lambda x, y: x.minimum(y)),
    aten.neg: _unary("__neg__"),
    aten.abs: _unary("__abs__"),
    aten.exp: _unary("exp"),
    aten.log: _unary("log"),
    aten.tanh: _unary("tanh"),
    aten.sigmoid: _unary("sigmoid"),
    aten.sqrt: _unary("sqrt"),
    aten.rsqrt: _unary("rsqrt"),
    aten.reciprocal: _unary("recip"),
    aten.erf: _unary("erf"),
    aten.sin: _unary("sin"),
    aten.cos: _unary("cos"),
    aten.sign: _sign,
    aten.relu: lambda ctx, x: composites.relu(x.cast(ctx.out_dtype)),
    aten.gelu: _gelu,
    aten.gelu_backward: _gelu_backward,
    aten.threshold_backward: _threshold_backward,
    aten.tanh_backward: lambda ctx, g, y: _var(g, ctx.out_dtype) * (1.0 - y * y),
    aten.sigmoid_backward: lambda ctx, g, y: _var(g, ctx.out_dtype) * (y * (1.0 - y)),
    aten.clamp: _clamp,
    aten.clamp_min: lambda ctx, x, lo: _clamp(ctx, x, lo, None),
    aten.clamp_max: lambda ctx, x, hi: _clamp(ctx, x, None, hi),
    aten.where: _where,
    aten.gt: lambda ctx, a, b: _cmp("gt", a, b),
    aten.lt: lambda ctx, a, b: _cmp("lt", a, b),
    aten.ge: lambda ctx, a, b: _cmp("ge", a, b),
    aten.le: lambda ctx, a, b: _cmp("le", a, b),
    aten.eq: lambda ctx, a, b: _cmp("eq", a, b),
    aten.ne: lambda ctx, a, b: _cmp("ne", a, b),
    aten.logical_and: _logical("and"),
    aten.logical_or: _logical("or"),
    aten.logical_not: _logical("not"),
    aten.bitwise_and: _logical("and"),
    aten.bitwise_or: _logical("or"),
    aten.bitwise_not: _logical("not"),
    aten.sum: _reduce_as("sum"),
    aten.mean: _reduce_as("mean"),
    aten.amax: _reduce_as("max"),
    aten.amin: _reduce_as("min"),
    aten.var: _var_correction,
    aten.var_mean: _var_mean_correction,
    aten._softmax: _softmax,
    aten._log_softmax: _log_softmax,
    aten._softmax_backward_data: _softmax_backward,
    aten._log_softmax_backward_data: _log_softmax_backward,
    aten.native_layer_norm: _layer_norm,
    aten.native_layer_norm_backward: _layer_norm_backward,
    aten.mm: _mm,
    aten.addmm: _addmm,
    aten.bmm: _bmm,
    aten.matmul: _matmul,
    aten.t: _t,
    aten.transpose: _transpose,
    aten.permute: _permute,
    aten.view: _reshape_to_out,
    aten.reshape: _reshape_to_out,
    aten._unsafe_view: _reshape_to_out,
    aten.unsqueeze: _reshape_to_out,
    aten.squeeze: _reshape_to_out,
    aten.expand: _expand,
    aten.slice: _slice,
    aten.narrow: _narrow,
    aten.split: _split,
    aten.split_with_sizes: _split,
    aten.chunk: _split,
    aten.cat: _cat,
    aten.slice_backward: _slice_backward,
    aten.detach: _identity,
    aten.clone: _identity,
    aten.alias: _identity,
    aten.lift_fresh_copy: _identity,
    aten._to_copy: _to_copy,
    torch.ops.prims.convert_element_type: _convert_element_type,
    aten.full: _fill_from(1),
    aten.full_like: _fill_from(1),
    aten.new_full: _fill_from(2),
    aten.scalar_tensor: _fill_from(0),
    aten.zeros: _const_fill(0.0),
    aten.zeros_like: _const_fill(0.0),
    aten.new_zeros: _const_fill(0.0),
    aten.ones: _const_fill(1.0),
    aten.ones_like: _const_fill(1.0),
    aten.new_ones: _const_fill(1.0),
    aten.mse_loss: _mse_loss,
    aten.mse_loss_backward: _mse_loss_backward,
    aten.binary_cross_entropy: _bce,
    aten.binary_cross_entropy_backward: _bce_backward,
    aten.binary_cross_entropy_with_logits: _bce_logits,
    aten.nll_loss_forward: _nll_loss_forward,
    aten.nll_loss_backward: _nll_loss_backward,
}
# Ops that take integer class indices (loaded as f64: exact below 2**53).
# Ops that only re-index: a region of nothing but these is left to PyTorch (a view
# there is free, a kernel would copy).
VIEW_OPS = frozenset({aten.t, aten.transpose, aten.permute, aten.view, aten.reshape,
                      aten._unsafe_view, aten.unsqueeze, aten.squeeze, aten.expand,
                      aten.slice, aten.narrow, aten.split, aten.split_with_sizes, aten.chunk,
                      aten.detach, aten.alias, aten.clone, aten.lift_fresh_copy})
# Ops eager PyTorch runs without launching work (views and aliases).
FREE_IN_EAGER = VIEW_OPS - {aten.clone, aten.lift_fresh_copy}
# Ops whose decompositions (into ops above) AOT autograd should apply.
DECOMPOSE = ("silu", "silu_backward", "hardtanh", "hardtanh_backward", "leaky_relu",
             "leaky_relu_backward", "elu", "elu_backward", "softplus", "softplus_backward",
             "hardsigmoid", "hardswish", "mish", "logsumexp", "addcmul", "addcdiv", "lerp",
             "square", "std", "std_mean", "norm", "frobenius_norm", "linalg_vector_norm",
             "log_sigmoid_forward", "log_sigmoid_backward", "huber_loss",
             "huber_loss_backward", "smooth_l1_loss", "smooth_l1_loss_backward", "soft_margin_loss",
             "sgn", "expand_as", "masked_fill", "baddbmm", "addmv", "native_dropout_backward")


def supported_ops() -> list[str]:
    """Names of the ATen ops the backend translates (the rows of ATEN_TABLE)."""
    return sorted(str(k) for k in ATEN_TABLE)


def _decompositions() -> dict[Any, Callable[..., Any]]:
    from torch._decomp import get_decompositions

    ops = [getattr(aten, n) for n in DECOMPOSE if hasattr(aten, n)]
    return get_decompositions(ops)


def _op_name(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return str(target.overloadpacket) if target.overloadpacket else str(target)
    return getattr(target, "__name__", str(target))


def _table_row(target: Any) -> Callable[..., Any] | None:
    if isinstance(target, torch._ops.OpOverload):
        return ATEN_TABLE.get(target) or ATEN_TABLE.get(target.overloadpacket)
    return None


# --------------------------------------------------------------------------------------
# Regions and plans.
# --------------------------------------------------------------------------------------
@dataclass
class _Input:
    """One program input: a node's tensor (converted as needed) or an auxiliary tensor."""

    node: torch.fx.Node | None
    isa: DType
    shape: tuple[int, ...]
    convert: bool = False  # the tensor's dtype is not the program's (bool->f32, int->f64)
    aux: np.ndarray | None = None  # NumPy, not torch: planning may run under fake tensors
    index_check: tuple[int, int] | None = None  # (classes, ignore_index)
    # Axis order in which the tensor was laid out when traced, if it was a permuted
    # contiguous tensor (a transposed weight saved for backward): the program reads
    # that layout and permutes it itself, so no copy is made per call.
    order: tuple[int, ...] | None = None


class _Region:
    """A maximal run of translated nodes that becomes one Atlas ISA program."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.nodes: list[torch.fx.Node] = []
        self.env: dict[torch.fx.Node, Any] = {}
        self.inputs: list[_Input] = []
        self._by_node: dict[torch.fx.Node, Var] = {}
        self._aux: dict[tuple, Var] = {}
        self.view_only: set[torch.fx.Node] = set()
        # Filled by _finish:
        self.program: Program | None = None
        self.outputs: list[tuple[torch.fx.Node, int | None, TInfo]] = []
        self.mirrors: list[torch.fx.Node] = []
        self.none_outputs: list[torch.fx.Node] = []

    def load(self, node: torch.fx.Node, info: TInfo) -> Var:
        v = self._by_node.get(node)
        if v is not None:
            return v
        if info.device != "cpu":
            raise Unsupported(f"input on device {info.device} (hologram runs on host memory)")
        if info.dtype in ISA_FLOAT:
            spec = _Input(node, ISA_FLOAT[info.dtype], info.shape)
        elif info.dtype is torch.bool:
            spec = _Input(node, dtypes.f32, info.shape, convert=True)
        elif info.dtype in INT_DTYPES:
            spec = _Input(node, dtypes.f64, info.shape, convert=True)
        else:
            raise Unsupported(f"input dtype {info.dtype}")
        order = _physical_order(node)
        if order is not None:
            spec.order = order
            spec.shape = tuple(info.shape[d] for d in order)
        v = Var(ldg(len(self.inputs), spec.isa, spec.shape))
        if order is not None:
            v = v.permute(tuple(order.index(d) for d in range(len(order))))
        if info.dtype is torch.bool:
            v = v.cast(dtypes.boolean)
        self.inputs.append(spec)
        self._by_node[node] = v
        return v

    def aux_input(self, key: tuple, make_array: Callable[[], np.ndarray]) -> Var:
        v = self._aux.get(key)
        if v is None:
            a = np.ascontiguousarray(make_array())
            spec = _Input(None, dtypes.to_dtype(a.dtype), tuple(a.shape), aux=a)
            v = Var(ldg(len(self.inputs), spec.isa, spec.shape))
            self.inputs.append(spec)
            self._aux[key] = v
        return v

    def add_index_check(self, target: Var, n_classes: int, ignore_index: int) -> None:
        """Range-check the input ``target`` views, as PyTorch checks class indices."""
        v = target.v
        while v.op in (Op.RESHAPE, Op.EXPAND, Op.PERMUTE):
            v = v.srcs[0]
        if v.op is not Op.LDG or self.inputs[v.attr("in")].node is None:
            raise Unsupported("class indices computed inside the program cannot be "
                              "range-checked before it runs")
        self.inputs[v.attr("in")].index_check = (n_classes, ignore_index)

    def snapshot(self) -> tuple[int, dict, dict, list]:
        checks = [s.index_check for s in self.inputs]
        return len(self.inputs), dict(self._by_node), dict(self._aux), checks

    def rollback(self, snap: tuple[int, dict, dict, list]) -> None:
        n, by_node, aux, checks = snap
        del self.inputs[n:]
        for spec, check in zip(self.inputs, checks, strict=True):
            spec.index_check = check
        self._by_node, self._aux = by_node, aux


def _renumber(outputs: list[Var], inputs: list[_Input]) -> tuple[list[Value], list[_Input]]:
    """Drop program inputs nothing reads (a translation may load and not use one)."""
    stores = [stg(o.v, i) for i, o in enumerate(outputs)]
    used = sorted({v.attr("in") for s in stores for v in s.walk() if v.op is Op.LDG})
    if used == list(range(len(inputs))):
        return stores, inputs
    new_index = {old: new for new, old in enumerate(used)}
    memo: dict[int, Value] = {}

    def rebuild(v: Value) -> Value:
        r = memo.get(id(v))
        if r is None:
            if v.op is Op.LDG:
                r = ldg(new_index[v.attr("in")], v.dtype, v.shape)
            else:
                r = make(v.op, [rebuild(s) for s in v.srcs], dict(v.attrs), v.dtype, v.shape)
            memo[id(v)] = r
        return r

    stores = [stg(rebuild(o.v), i) for i, o in enumerate(outputs)]
    return stores, [inputs[i] for i in used]


@dataclass
class RegionSummary:
    """What one program of a graph holds and what compiling it did."""

    number: int
    aten_ops: Counter
    instructions_before: int
    instructions_after: int
    launches_before: int
    launches_after: int
    fused: bool
    kernels: list[str] = field(default_factory=list)
    program_text: str = ""
    source: str = ""


@dataclass
class GraphSummary:
    """One FX graph the backend compiled: its regions and the nodes left to PyTorch."""

    kind: str
    aten_nodes: int
    aten_compute_nodes: int  # ATen nodes that are not views: eager launches work for these
    regions: list[RegionSummary]
    torch_ops: list[tuple[str, str]]  # (op, reason), one per node that ran in PyTorch
    executor: str

    @property
    def hologram_ops(self) -> Counter:
        total: Counter = Counter()
        for r in self.regions:
            total.update(r.aten_ops)
        return total


_COLLECTORS: list[list[GraphSummary]] = []
_COLLECT_LOCK = threading.Lock()


@contextlib.contextmanager
def collect_graphs() -> Iterator[list[GraphSummary]]:
    """Collect a GraphSummary for every plan built inside the block (for explain)."""
    sink: list[GraphSummary] = []
    with _COLLECT_LOCK:
        _COLLECTORS.append(sink)
    try:
        yield sink
    finally:
        with _COLLECT_LOCK:
            _COLLECTORS.remove(sink)


_LOGGED: set[tuple[str, str]] = set()


def _log_fallback(op: str, reason: str) -> None:
    key = (op, reason)
    if key not in _LOGGED:
        _LOGGED.add(key)
        log.warning("hologram_torch: %s runs in PyTorch: %s", op, reason)


def _kernel_names(compiled: Any) -> list[str]:
    low = getattr(compiled, "lowered", None)
    if low is None:
        return []
    names = []
    for st in low.schedule.steps:
        names.append(getattr(st, "name", None) or f"gemm{list(st.value.shape)}")
    return names


def _summarize(region: _Region, ex: Executor) -> RegionSummary:
    from hologram.compiler.lower import compute_instructions, unfused_launches

    assert region.program is not None
    compiled = ex.compile(region.program)
    stats = getattr(compiled, "stats", None)
    ops = Counter(_op_name(n.target) for n in region.nodes if n.target is not operator.getitem)
    if stats is not None:
        return RegionSummary(region.number, ops, stats.instructions_before,
                             stats.instructions_after, stats.launches_before,
                             stats.launches_after, True, _kernel_names(compiled),
                             region.program.text, getattr(compiled, "source", "") or "")
    # A backend that interprets the program (reference) runs each instruction alone.
    n_inst = compute_instructions(region.program)
    n_launch = unfused_launches(region.program)
    return RegionSummary(region.number, ops, n_inst, n_inst, n_launch, n_launch, False, [],
                         region.program.text, "")


class _Plan:
    """Steps that run one graph for one set of concrete shapes."""

    def __init__(self, gm: torch.fx.GraphModule, infos: dict[torch.fx.Node, Any],
                 ex: Executor, kind: str, blas_threads: Any = "auto") -> None:
        self.ex = ex
        self.kind = kind
        self.blas_threads = blas_threads
        self.torch_nodes: list[tuple[torch.fx.Node, str]] = []
        self.regions: list[_Region] = []
        self.steps: list[tuple[str, Any]] = []  # ("torch", node) | ("region", _Region)
        self.placeholders: list[torch.fx.Node] = []
        self.output_args: Any = None
        self._build(gm, infos)
        self._runners = [self._make_runner(kind_, obj, gm) for kind_, obj in self.steps]
        self._frees = self._free_lists()
        self.summary = GraphSummary(
            kind,
            sum(1 for n in gm.graph.nodes if isinstance(n.target, torch._ops.OpOverload)),
            sum(1 for n in gm.graph.nodes if isinstance(n.target, torch._ops.OpOverload)
                and n.target.overloadpacket not in FREE_IN_EAGER),
            [_summarize(r, ex) for r in self.regions],
            [(_op_name(n.target), why) for n, why in self.torch_nodes],
            ex.backend_name,
        )

    # --- planning ------------------------------------------------------------------
    def _build(self, gm: torch.fx.GraphModule, infos: dict[torch.fx.Node, Any]) -> None:
        region_of: dict[torch.fx.Node, _Region] = {}
        open_region: _Region | None = None
        all_cpu = all(i.device == "cpu" for i in infos.values() if isinstance(i, TInfo))

        def flush() -> None:
            nonlocal open_region
            if open_region is not None and open_region.nodes:
                self.regions.append(open_region)
                self.steps.append(("region", open_region))
            open_region = None

        def to_torch(node: torch.fx.Node, reason: str | None) -> None:
            # A PyTorch node runs where it stands, before the open region, unless it
            # reads the region's results or may write memory the region reads.
            deps = node.all_input_nodes
            if open_region is not None and (
                    _may_mutate(node) or any(region_of.get(d) is open_region for d in deps)):
                flush()
            if reason is not None:
                self.torch_nodes.append((node, reason))
                if isinstance(node.target, torch._ops.OpOverload):
                    _log_fallback(_op_name(node.target), reason)
            self.steps.append(("torch", node))

        for node in gm.graph.nodes:
            if node.op == "placeholder":
                self.placeholders.append(node)
                continue
            if node.op == "output":
                self.output_args = node.args[0]
                continue
            if node.op != "call_function":
                to_torch(node, None)
                continue
            if node.target is operator.getitem:
                src = node.args[0]
                r = region_of.get(src)
                if r is not None:
                    r.env[node] = r.env[src][node.args[1]]
                    r.nodes.append(node)
                    region_of[node] = r
                    if src in r.view_only:
                        r.view_only.add(node)
                else:
                    to_torch(node, None)
                continue
            row = _table_row(node.target)
            if row is None:
                reason = (f"no hologram translation for {_op_name(node.target)}"
                          if isinstance(node.target, torch._ops.OpOverload) else None)
                to_torch(node, reason)
                continue
            if not all_cpu:
                to_torch(node, "graph tensors are not on the CPU (hologram_torch's compile "
                               "backend runs on host memory)")
                continue
            if open_region is None:
                open_region = _Region(len(self.regions))
            try:
                self._translate(node, row, infos, open_region, region_of)
            except Unsupported as e:
                to_torch(node, str(e))
            except Exception as e:  # a translation bug or an ISA rule: never hide it
                to_torch(node, f"translation failed: {type(e).__name__}: {e}")
        flush()
        for r in self.regions:
            self._finish(r, region_of, infos)
        # A region whose outputs are all views is nothing but PyTorch views.
        kept = []
        for kind, obj in self.steps:
            if kind == "region" and obj.program is None:
                kept.extend(("torch", n) for n in obj.mirrors)
                kept.extend(("none", n) for n in obj.none_outputs)
                continue
            kept.append((kind, obj))
            if kind == "region":  # after it: a mirror may view what the region stores
                kept.extend(("torch", n) for n in obj.mirrors)
        self.steps = kept
        self.regions = [r for r in self.regions if r.program is not None]
        for i, r in enumerate(self.regions):
            r.number = i

    def _translate(self, node: torch.fx.Node, row: Callable[..., Any],
                   infos: dict[torch.fx.Node, Any], region: _Region,
                   region_of: dict[torch.fx.Node, _Region]) -> None:
        out = infos[node]
        outs = out if isinstance(out, tuple) else (out,)
        for o in outs:
            if isinstance(o, TInfo) and o.dtype not in ISA_FLOAT and o.dtype is not torch.bool \
                    and o.dtype not in INT_DTYPES:
                raise Unsupported(f"result dtype {o.dtype}")
        snap = region.snapshot()
        try:
            def arg(a: Any) -> Any:
                if isinstance(a, torch.fx.Node):
                    if region_of.get(a) is region:
                        return region.env[a]
                    info = infos[a]
                    if isinstance(info, TInfo):
                        return region.load(a, info)
                    if isinstance(info, tuple):
                        raise Unsupported("takes a multi-output value from outside the region")
                    return info
                if isinstance(a, (list, tuple)):
                    return type(a)(arg(x) for x in a)
                return a

            args = [arg(a) for a in node.args]
            kwargs = {k: arg(v) for k, v in node.kwargs.items()}
            result = row(Ctx(node, out, region), *args, **kwargs)
            self._check_result(node, result, out)
        except BaseException:
            region.rollback(snap)
            raise
        region.env[node] = result
        region.nodes.append(node)
        region_of[node] = region
        if node.target.overloadpacket in VIEW_OPS:
            srcs = [a for a in node.all_input_nodes]
            if all(region_of.get(s) is not region or s in region.view_only for s in srcs):
                region.view_only.add(node)

    @staticmethod
    def _check_result(node: torch.fx.Node, result: Any, out: Any) -> None:
        res = result if isinstance(result, tuple) else (result,)
        outs = out if isinstance(out, tuple) else (out,)
        if len(res) != len(outs):
            raise Unsupported(f"translation gave {len(res)} results, ATen gives {len(outs)}")
        for r, o in zip(res, outs, strict=True):
            if r is None or not isinstance(o, TInfo):
                continue
            if not isinstance(r, Var):
                raise Unsupported(f"translation gave {type(r).__name__}, not a tensor")
            if tuple(r.shape) != o.shape:
                raise Unsupported(f"translation shape {list(r.shape)} differs from ATen's "
                                  f"{list(o.shape)}")
            if r.dtype is not _isa_dtype(o.dtype):
                raise Unsupported(f"translation dtype {r.dtype} differs from ATen's {o.dtype}")

    def _finish(self, r: _Region, region_of: dict[torch.fx.Node, _Region],
                infos: dict[torch.fx.Node, Any]) -> None:
        """Decide the region's outputs (values used elsewhere) and build its program."""
        needed: list[torch.fx.Node] = []
        for n in r.nodes:
            if isinstance(infos[n], tuple):
                continue  # multi-output values leave through their getitems
            if any(region_of.get(u) is not r for u in n.users):
                needed.append(n)
        mirrors: list[torch.fx.Node] = []
        # Values the program stores; a free view of one (AOT autograd saves both `relu`
        # and `detach(relu)` for backward) is made by PyTorch from the stored tensor,
        # an alias as in eager, instead of being stored twice.
        stored = {n for n in needed if n not in r.view_only and r.env[n] is not None}
        stored -= {n for n in stored if _view_of(n, stored | r.view_only, region_of, r)}

        def mirror(n: torch.fx.Node) -> None:
            if n in mirrors:
                return
            for s in n.all_input_nodes:
                if region_of.get(s) is r and s not in stored:
                    mirror(s)
            mirrors.append(n)

        outs: list[tuple[torch.fx.Node, Var, TInfo]] = []
        for n in needed:
            v = r.env[n]
            if v is None:  # e.g. a gradient output_mask did not ask for
                r.none_outputs.append(n)
                continue
            if n in stored:
                outs.append((n, v, infos[n]))
            else:  # a view of an input or of a stored value: PyTorch makes it, no copy
                mirror(n)
        order = {n: i for i, n in enumerate(r.nodes)}
        r.mirrors = sorted(mirrors, key=order.__getitem__)
        if not outs:
            return
        vars_ = [v if v.dtype is not dtypes.boolean else v.cast(dtypes.f32) for _, v, _ in outs]
        stores, r.inputs = _renumber(vars_, r.inputs)
        r.program = Program(stores, [(s.isa, s.shape) for s in r.inputs],
                            name=f"{self.kind}_region{r.number}")
        r.outputs = [(n, i, info) for i, (n, _, info) in enumerate(outs)]

    # --- running -------------------------------------------------------------------
    def _make_runner(self, kind: str, obj: Any, gm: torch.fx.GraphModule
                     ) -> Callable[[dict[torch.fx.Node, Any]], None]:
        if kind == "torch":
            return _torch_runner(obj, gm)
        if kind == "none":
            return lambda env: env.__setitem__(obj, None)
        return _region_runner(obj, self.ex, self.blas_threads)

    def _free_lists(self) -> list[list[torch.fx.Node]]:
        """After which step each value is dead, so memory is released as eager would."""
        last: dict[torch.fx.Node, int] = {}

        def uses(kind: str, obj: Any) -> list[torch.fx.Node]:
            if kind == "torch":
                return list(obj.all_input_nodes)
            if kind == "none":
                return []
            return [s.node for s in obj.inputs if s.node is not None]

        for i, (kind, obj) in enumerate(self.steps):
            for n in uses(kind, obj):
                last[n] = i
        keep = set()
        torch.fx.node.map_arg(self.output_args, keep.add)
        frees: list[list[torch.fx.Node]] = [[] for _ in self.steps]
        for n, i in last.items():
            if n not in keep:
                frees[i].append(n)
        return frees

    def run(self, args: list[Any]) -> Any:
        env: dict[torch.fx.Node, Any] = dict(zip(self.placeholders, args, strict=True))
        args.clear()  # boxed call: let inputs die when their last user has run
        for runner, frees in zip(self._runners, self._frees, strict=True):
            runner(env)
            for n in frees:
                env.pop(n, None)
        return torch.fx.node.map_arg(self.output_args, env.__getitem__)


def _view_of(n: torch.fx.Node, available: set[torch.fx.Node],
             region_of: dict[torch.fx.Node, _Region], r: _Region) -> bool:
    """Whether ``n`` is a view op eager PyTorch makes for free (detach, t, view, ...)
    whose tensor operands from region ``r`` are all in ``available``."""
    if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
        return False
    if n.target.overloadpacket not in FREE_IN_EAGER:
        return False
    srcs = [s for s in n.all_input_nodes if region_of.get(s) is r]
    return bool(srcs) and all(s in available and s is not n for s in srcs)


def _may_mutate(node: torch.fx.Node) -> bool:
    """Whether a node may write memory (ATen ops say so in their schema)."""
    t = node.target
    if isinstance(t, torch._ops.OpOverload):
        return t._schema.is_mutable
    if node.op == "call_function" and getattr(t, "__module__", None) in ("_operator", "math"):
        return False  # getitem, SymInt arithmetic
    return node.op not in ("get_attr", "placeholder")


def _resolve_attr(gm: torch.fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _torch_runner(node: torch.fx.Node, gm: torch.fx.GraphModule
                  ) -> Callable[[dict[torch.fx.Node, Any]], None]:
    if node.op == "get_attr":
        value = _resolve_attr(gm, node.target)

        def get(env: dict[torch.fx.Node, Any]) -> None:
            env[node] = value

        return get
    if node.op == "call_module":
        fn: Any = _resolve_attr(gm, node.target)
    elif node.op == "call_method":
        def fn(self_: Any, *a: Any, **k: Any) -> Any:
            return getattr(self_, node.target)(*a, **k)
    else:
        fn = node.target
    args, kwargs = node.args, node.kwargs

    def call(env: dict[torch.fx.Node, Any]) -> None:
        a = torch.fx.node.map_arg(args, env.__getitem__)
        k = torch.fx.node.map_arg(kwargs, env.__getitem__)
        env[node] = fn(*a, **k)

    return call


def _physical_order(node: torch.fx.Node) -> tuple[int, ...] | None:
    """The axis order of a traced tensor that is a permutation of a contiguous one
    (and not contiguous itself), from its strides; None otherwise."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.ndim < 2:
        return None
    shape, strides = tuple(val.shape), tuple(val.stride())
    if any(not isinstance(x, int) for x in (*shape, *strides)):
        return None  # symbolic sizes: no fixed layout to plan for

    def dense(order: tuple[int, ...]) -> bool:  # contiguous in this axis order
        expect = 1
        for d in reversed(order):
            if shape[d] != 1 and strides[d] != expect:
                return False
            expect *= shape[d]
        return True

    if dense(tuple(range(len(shape)))):
        return None
    order = tuple(sorted(range(len(shape)), key=lambda d: -strides[d]))
    return order if dense(order) else None


def _host_array(t: torch.Tensor, spec: _Input) -> np.ndarray:
    """The NumPy view (or contiguous copy) of a tensor a program reads.

    Everything here is on the hot path of every call, so it stays in NumPy once
    the tensor is viewed: a torch op costs microseconds of dispatch each.
    """
    if t.requires_grad:
        t = t.detach()
    if t.device.type != "cpu":
        raise RuntimeError(f"hologram_torch: tensor on {t.device}; the backend runs on the CPU")
    if spec.order is not None:
        t = t.permute(spec.order)  # the traced layout: contiguous again, unless it changed
    if not t.is_contiguous():
        t = t.contiguous()
    a = t.numpy()
    if a.shape != spec.shape:
        raise RuntimeError(f"hologram_torch: planned for shape {list(spec.shape)}, "
                           f"got {list(a.shape)}")
    if spec.index_check is not None and a.size:
        n, ignore = spec.index_check
        if a.min() < 0 or a.max() >= n:  # rare: look closer, ignore_index is allowed
            if (((a < 0) | (a >= n)) & (a != ignore)).any():
                raise IndexError(f"hologram_torch: class index out of range [0, {n}) "
                                 "in target")
    if spec.convert:
        a = a.astype(spec.isa.np_dtype)
    elif a.dtype != spec.isa.np_dtype:
        raise RuntimeError(f"hologram_torch: planned for {spec.isa}, got {a.dtype}")
    return a


class _BlasThreads:
    """Caps NumPy's BLAS threads while a program with small GEMMs runs.

    The CPU executor hands GEMMs to the BLAS NumPy links (OpenBLAS, with its own
    thread pool). Inside a PyTorch process, PyTorch's OpenMP pool holds the cores
    too, and the two pools spin against each other: a 64x64x256 sgemm measured
    1.8 ms after a torch matmul against 13-20 us alone, which made a small MLP's
    training step ~80x slower than eager. Small GEMMs gain nothing from threads,
    so they run on one; large ones keep BLAS's own setting.
    """

    _libs: list[Any] | None = None

    @classmethod
    def libs(cls) -> list[Any]:
        if cls._libs is None:
            try:
                from threadpoolctl import ThreadpoolController
            except ImportError:
                log.info("hologram_torch: threadpoolctl is not installed; NumPy's BLAS threads "
                         "are left as they are (small GEMMs may contend with PyTorch's pool)")
                cls._libs = []
            else:
                ctl = ThreadpoolController().select(user_api="blas")
                cls._libs = list(ctl.lib_controllers)
        return cls._libs

    def __init__(self, threads: int | None) -> None:
        self.threads = threads
        self._saved: list[int] = []

    def __enter__(self) -> None:
        if self.threads is not None:
            for lib in self.libs():
                self._saved.append(lib.get_num_threads())
                lib.set_num_threads(self.threads)

    def __exit__(self, *exc: object) -> None:
        for lib, n in zip(self.libs(), self._saved, strict=False):
            lib.set_num_threads(n)
        self._saved.clear()


def _blas_threads_for(program: Program, setting: Any) -> int | None:
    """The BLAS thread cap for ``program`` under the ``blas_threads`` option.

    "auto" caps nothing when the CPU backend runs GEMMs itself (hologram's OpenMP
    tiles over one-thread BLAS calls, ``hologram.compiler.blas``): there is no second
    pool to contend with. The cap matters only where GEMMs stay ``np.matmul``.
    """
    if setting is None or isinstance(setting, int):
        return setting
    from hologram.compiler import blas

    if blas.numpy_blas()[0] is not None:
        return None
    macs = [_matrix_macs(v) for v in program.instructions if v.op is Op.GEMM]
    if not macs:
        return None
    return 1 if max(macs) <= SMALL_GEMM_MACS else None


def _matrix_macs(gemm: Value) -> int:
    """Multiply-adds of ONE matrix product of a (batched) GEMM, ``m * k * n``: BLAS is
    called (and decides its threads) per matrix of a batch, so a batch of small
    products is as small, for this purpose, as one of them."""
    (*_, m, k), n = gemm.srcs[0].shape, gemm.srcs[1].shape[-1]
    return m * k * n


def _carrier(td: torch.dtype) -> torch.dtype:
    return torch.float32 if td is torch.bool else torch.float64 if td in INT_DTYPES else td


def _in_place_layout(spec: _Input) -> tuple[torch.dtype, tuple[int, ...], tuple[int, ...]] | None:
    """(dtype, shape, strides) a tensor must have for a program to read its memory as
    it is; None for inputs that always go through :func:`_host_array` (converted,
    range-checked, or auxiliary arrays the plan made)."""
    if spec.node is None or spec.convert or spec.index_check is not None:
        return None
    strides = contiguous_strides(spec.shape)
    if spec.order is None:
        return TORCH_FLOAT[spec.isa], spec.shape, strides
    # A permuted contiguous tensor: axis order[i] of the tensor is axis i of the program.
    shape, st = [0] * len(spec.order), [0] * len(spec.order)
    for i, d in enumerate(spec.order):
        shape[d], st[d] = spec.shape[i], strides[i]
    return TORCH_FLOAT[spec.isa], tuple(shape), tuple(st)


def _region_runner(r: _Region, ex: Executor, blas_threads: Any = "auto"
                   ) -> Callable[[dict[torch.fx.Node, Any]], None]:
    assert r.program is not None
    program = r.program
    guard = _BlasThreads(_blas_threads_for(program, blas_threads))
    compiled = ex.compile(program)
    in_specs = list(r.inputs)
    # Bool results leave a program as f32 and integer ones as f64 (the executor's
    # dtypes); PyTorch converts them back, exactly.
    outs = [(n, info.shape, info.dtype, _carrier(info.dtype)) for n, _, info in r.outputs]
    nones = list(r.none_outputs)
    direct = ex.backend.pointer_launcher(compiled)
    if direct is not None:
        # The per-call path of every training step: tensors' addresses go straight into
        # the program's pointer table. A tensor is read in place when it has the
        # planned dtype, shape and strides (dynamo's guards make that the rule);
        # anything else is viewed or copied by _host_array, as on the general path.
        reads = [(s.node, s, _in_place_layout(s),
                  data_pointer(s.aux) if s.aux is not None else 0) for s in in_specs]

        def launch(env: dict[torch.fx.Node, Any], results: list[torch.Tensor]) -> None:
            pointers: list[int] = []
            copies: list[np.ndarray] = []  # alive until the program has run
            for node, spec, layout, aux_ptr in reads:
                if node is None:
                    pointers.append(aux_ptr)
                    continue
                t = env[node]
                if (layout is not None and t.dtype is layout[0] and t.is_cpu
                        and t.shape == layout[1] and t.stride() == layout[2]):
                    pointers.append(t.data_ptr())
                else:
                    a = _host_array(t, spec)
                    copies.append(a)
                    pointers.append(data_pointer(a))
            pointers.extend(t.data_ptr() for t in results)
            direct(pointers)
    else:
        aux = [s.aux for s in in_specs]

        def launch(env: dict[torch.fx.Node, Any], results: list[torch.Tensor]) -> None:
            arrays = [a if a is not None else _host_array(env[s.node], s)
                      for s, a in zip(in_specs, aux, strict=True)]
            # Straight to the backend: Executor.launch would re-check that outputs do
            # not alias inputs, which cannot happen (we just allocated them), and that
            # check cost as much as a small kernel. No program here uses Φ addressing,
            # so no boundary arena is passed.
            ex.backend.launch(compiled, arrays, [t.numpy() for t in results])

    def run(env: dict[torch.fx.Node, Any]) -> None:
        for n in nones:
            env[n] = None
        results = [torch.empty(shape, dtype=carrier) for _, shape, _, carrier in outs]
        with guard:
            launch(env, results)
        for (node, _, td, carrier), t in zip(outs, results, strict=True):
            env[node] = t if td is carrier else t.to(td)

    return run


# --------------------------------------------------------------------------------------
# The compiled graph and the dynamo backend.
# --------------------------------------------------------------------------------------
class HologramGraph:
    """The callable AOT autograd gets back for one graph (boxed calling convention)."""

    def __init__(self, gm: torch.fx.GraphModule, kind: str, executor: Executor,
                 blas_threads: Any = "auto") -> None:
        # An instance attribute, so dynamo's disable() wrapper (functools.wraps copies
        # __dict__) still tells AOT autograd that we take boxed arguments.
        self._boxed_call = True
        self.gm = gm
        self.kind = kind
        self.executor = executor
        self.blas_threads = blas_threads
        self._plans: dict[tuple, _Plan] = {}
        self._lock = threading.Lock()
        infos = _infos_from_meta(gm)
        self._static = self._new_plan(infos) if infos is not None else None

    def _new_plan(self, infos: dict[torch.fx.Node, Any]) -> _Plan:
        plan = _Plan(self.gm, infos, self.executor, self.kind, self.blas_threads)
        with _COLLECT_LOCK:
            for sink in _COLLECTORS:
                sink.append(plan.summary)
        return plan

    @property
    def plans(self) -> list[_Plan]:
        """Every plan built so far (one, or one per shape signature when shapes vary)."""
        return ([self._static] if self._static is not None else []) + list(self._plans.values())

    def __call__(self, *call_args: Any) -> Any:
        # Boxed (one list, which we may clear to free inputs early) as AOT autograd
        # prefers; its backward wrapper drops the _boxed_call mark and calls unboxed.
        if len(call_args) == 1 and isinstance(call_args[0], list):
            args = call_args[0]
        else:
            args = list(call_args)
        if self._static is not None:
            return self._static.run(args)
        key = _signature(args)
        plan = self._plans.get(key)
        if plan is not None:
            return plan.run(args)
        # New shapes under a dynamic graph: run eagerly once to learn them, then plan.
        rec = _Recorder(self.gm)
        out = rec.run(*args)
        args.clear()
        with self._lock:
            if key not in self._plans:
                self._plans[key] = self._new_plan(rec.infos)
        return out


def _graph_compiler(kind: str, executor: Executor, blas_threads: Any
                    ) -> Callable[..., HologramGraph]:
    def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> HologramGraph:
        return HologramGraph(gm, kind, executor, blas_threads)

    return compile_graph


def hologram_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                     options: dict[str, Any] | None = None, **_: Any) -> Callable[..., Any]:
    """The dynamo backend: AOT autograd around graphs translated to Atlas ISA programs.

    ``options`` (from ``torch.compile(..., options=...)``): ``executor`` is an
    :class:`hologram.Executor` or a backend name for the shared executor
    (default ``"cpu"``); ``blas_threads`` caps NumPy's BLAS threads while a
    program runs: ``"auto"`` (default: one thread for programs whose GEMMs are
    all small, see :class:`_BlasThreads`), an int, or None to leave BLAS alone.
    """
    from torch._dynamo.backends.common import aot_autograd

    opts = dict(options or {})
    ex = opts.pop("executor", "cpu")
    blas = opts.pop("blas_threads", "auto")
    if opts:
        raise TypeError(f"hologram backend: unknown options {sorted(opts)}")
    if not (blas is None or blas == "auto" or (isinstance(blas, int) and blas > 0)):
        raise ValueError(f"hologram backend: blas_threads must be 'auto', None or a positive "
                         f"int, got {blas!r}")
    executor = ex if isinstance(ex, Executor) else default_executor(str(ex))
    backend = aot_autograd(
        fw_compiler=_graph_compiler("forward", executor, blas),
        bw_compiler=_graph_compiler("backward", executor, blas),
        inference_compiler=_graph_compiler("inference", executor, blas),
        decompositions=_decompositions(),
    )
    return backend(gm, example_inputs)


def register() -> None:
    """Make ``backend="hologram"`` resolve to :func:`hologram_backend`.

    Registration is skipped when the name is already known to dynamo: either this
    function ran, or the ``torch_dynamo_backends`` entry point was discovered, in
    which case dynamo loads this module through it (registering here as well would
    make dynamo's own registration fail as a duplicate).
    """
    from torch._dynamo.backends import registry

    if BACKEND_NAME in getattr(registry, "_COMPILER_FNS", {}):
        return
    if getattr(registry, "_BACKENDS", {}).get(BACKEND_NAME) is not None:
        return
    registry.register_backend(hologram_backend, name=BACKEND_NAME)


register()
