"""Attention: ATen's fused scaled-dot-product attention, forward and backward, as the
ISA's attention instructions (one fused step each: the ``L x S`` scores are never
stored).

On the CPU, ``F.scaled_dot_product_attention`` reaches AOT graphs as
``_scaled_dot_product_flash_attention_for_cpu`` (``-> (out, logsumexp)``) and its
``_backward`` (``-> (grad_q, grad_k, grad_v)``); a bool mask has already become an
additive ``where(mask, 0, -inf)`` there, but a bool mask is taken as well. GQA (fewer
key/value heads than query heads, LLaMA's repeated KV heads; ATen's ``repeat_interleave``
order: query head ``h`` reads key head ``h // G``) is spelled with no copy: q as
``[*lead, Hkv, G, L, E]`` and k/v reshaped to ``[*lead, Hkv, 1, S, E]`` and expanded
over ``G`` (a stride-0 axis the kernels read in place); the backward's ``dk``/``dv`` per
query head are summed over ``G``. A mask broadcast over batch or heads is an EXPAND,
read in place too.

One translator per ATen op, ``ROWS`` maps each op to it (see
:mod:`hologram_torch.lowering` for how a translator is written).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from hologram.isa import builder as b
from hologram.isa import dtypes
from hologram.isa.builder import Var
from hologram.isa.dtypes import DType

from .context import Ctx, Unsupported

aten = torch.ops.aten

#: dtypes the attention instructions run in on every backend that has them.
_DTYPES = (dtypes.f32, dtypes.f64)


def _check(q: Var, k: Var, v: Var, dropout_p: float) -> tuple[int, int]:
    """(query heads per key head G, key heads) after ATen's own shape checks."""
    if dropout_p:
        raise Unsupported(f"dropout_p={dropout_p} (hologram's attention has no dropout)")
    if q.ndim < 3 or k.ndim != q.ndim or v.ndim != q.ndim:
        raise Unsupported(f"attention needs q, k, v of one rank >= 3 ([..., heads, L, E]), got "
                          f"{list(q.shape)}, {list(k.shape)}, {list(v.shape)}")
    h, hkv = q.shape[-3], k.shape[-3]
    if hkv == 0 or h % hkv or v.shape[-3] != hkv:
        raise Unsupported(f"query heads {h} are not a multiple of key/value heads "
                          f"{k.shape[-3]}, {v.shape[-3]}")
    return h // hkv, hkv


def _dtype(ctx: Ctx) -> DType:
    d = ctx.out_dtype
    if d not in _DTYPES:
        raise Unsupported(f"attention in {d} (hologram's attention runs f32 and f64)")
    return d


def _grouped(x: Var, hkv: int, g: int) -> Var:
    """A query-shaped ``[*lead, H, L, E]`` as ``[*lead, Hkv, G, L, E]`` (a split axis)."""
    *lead, _, n, e = x.shape
    return x.reshape((*lead, hkv, g, n, e))


def _shared(x: Var, g: int) -> Var:
    """Key/value ``[*lead, Hkv, S, E]`` read by G query heads each: a stride-0 axis."""
    *lead, hkv, n, e = x.shape
    return x.reshape((*lead, hkv, 1, n, e)).expand((*lead, hkv, g, n, e))


def _mask(mask: Any, d: DType, q: Var, k: Var, hkv: int, g: int) -> Var | None:
    """ATen's ``attn_mask`` as an additive ``[*lead, Hkv, G, L, S]`` of dtype ``d``: a bool
    mask keeps where True (``0``) and hides where False (``-inf``); broadcast axes are
    expanded views."""
    if mask is None:
        return None
    if not isinstance(mask, Var):
        raise Unsupported(f"attn_mask of type {type(mask).__name__}")
    if mask.dtype is dtypes.boolean:
        mask = mask.where(Var(b.const(0.0, d, mask.shape)), -math.inf)
    else:
        mask = mask.cast(d)
    *lead, h, n_q, _ = q.shape
    full = (*lead, h, n_q, k.shape[-2])
    try:
        shape = b.broadcast_shape(mask.shape, full)
    except Exception as e:  # a ShapeError: ATen would refuse it too
        raise Unsupported(f"attn_mask {list(mask.shape)} does not broadcast to "
                          f"{list(full)}") from e
    if shape != full:
        raise Unsupported(f"attn_mask {list(mask.shape)} does not broadcast to {list(full)}")
    return mask.expand(full).reshape((*lead, hkv, g, n_q, k.shape[-2]))


def _forward(ctx: Ctx, q: Var, k: Var, v: Var, dropout_p: float = 0.0,
             is_causal: bool = False, *, attn_mask: Any = None,
             scale: float | None = None) -> tuple[Var, Var]:
    """``_scaled_dot_product_flash_attention_for_cpu`` -> ``(out, logsumexp)``."""
    d = _dtype(ctx)
    g, hkv = _check(q, k, v, dropout_p)
    q, k, v = q.cast(d), k.cast(d), v.cast(d)
    mask = _mask(attn_mask, d, q, k, hkv, g)
    out, lse = b.attention(_grouped(q, hkv, g).v, _shared(k, g).v, _shared(v, g).v,
                           None if mask is None else mask.v, scale=scale,
                           causal=bool(is_causal))
    return Var(out).reshape((*q.shape[:-1], v.shape[-1])), Var(lse).reshape(q.shape[:-1])


def _backward(ctx: Ctx, grad_out: Var, q: Var, k: Var, v: Var, out: Var, lse: Var,
              dropout_p: float = 0.0, is_causal: bool = False, *, attn_mask: Any = None,
              scale: float | None = None) -> tuple[Var, Var, Var]:
    """``_scaled_dot_product_flash_attention_for_cpu_backward`` -> ``(dq, dk, dv)``."""
    d = _dtype(ctx)
    g, hkv = _check(q, k, v, dropout_p)
    q, k, v, grad_out, out, lse = (x.cast(d) for x in (q, k, v, grad_out, out, lse))
    mask = _mask(attn_mask, d, q, k, hkv, g)
    dq, dk, dv = b.attention_grads(
        _grouped(grad_out, hkv, g).v, _grouped(q, hkv, g).v, _shared(k, g).v, _shared(v, g).v,
        _grouped(out, hkv, g).v, lse.reshape((*q.shape[:-3], hkv, g, q.shape[-2])).v,
        None if mask is None else mask.v, scale=scale, causal=bool(is_causal))
    lead = q.ndim - 3  # the G axis of [*lead, Hkv, G, S, E]
    dk_sum = Var(dk).sum(lead + 1) if g > 1 else Var(dk).reshape(k.shape)
    dv_sum = Var(dv).sum(lead + 1) if g > 1 else Var(dv).reshape(v.shape)
    return Var(dq).reshape(q.shape), dk_sum, dv_sum


def _sdpa(ctx: Ctx, q: Var, k: Var, v: Var, attn_mask: Any = None, dropout_p: float = 0.0,
          is_causal: bool = False, scale: float | None = None,
          enable_gqa: bool = False) -> Var:
    """``aten.scaled_dot_product_attention`` where a graph keeps it (not decomposed)."""
    return _forward(ctx, q, k, v, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]


# One row per ATen op (overload packet).
ROWS: dict[Any, Callable[..., Any]] = {
    aten._scaled_dot_product_flash_attention_for_cpu: _forward,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _backward,
    aten.scaled_dot_product_attention: _sdpa,
}
