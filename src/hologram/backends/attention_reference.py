"""The NumPy meaning of the attention instructions (ATTN, ATTN_LSE, ATTN_DQ/DK/DV).

Written as the plain formulas, with the whole ``L x S`` score matrix in memory: this
is the oracle the fused kernels are tested against, not a way to run attention fast.
Every backend computes exactly this, in the operand dtype:

- ``s = (q @ k^T) * scale + mask``; with ``causal``, ``s[i, j] = -inf`` for ``j > i``
  (ATen's top-left alignment: query ``i`` sees keys ``0..i``, whatever ``L`` and ``S``).
- ``m`` = the row maximum of ``s`` (NaN if the row has a NaN). A row whose every score
  is ``-inf`` (all keys masked, or no keys) is *dead*: its output is 0 and its
  log-sum-exp 0, as ATen's CPU kernel writes them.
- otherwise ``p = exp(s - m)``, ``out = (p @ v) / sum(p)``, ``lse = m + log(sum(p))``.
- backward: ``p = exp(s - lse)`` with ``p = 0`` wherever ``s = -inf`` (so a dead row,
  whose ``lse`` is 0, has no gradient), ``D = rowsum(dout * out)``,
  ``dv = p^T @ dout``, ``ds = p * (dout @ v^T - D)``, ``dq = (ds @ k) * scale``,
  ``dk = (ds^T @ q) * scale``.

IEEE arithmetic decides the rest: a NaN score makes its row's output NaN, and ``p = 0``
times a NaN in ``v`` is NaN (the kernels skip a causal block of keys only where that
cannot change the result).
"""

from __future__ import annotations

import numpy as np

from ..isa.opcodes import ATTENTION_OPERANDS, ATTENTION_PART
from ..isa.value import Value


def _t(x: np.ndarray) -> np.ndarray:
    return np.swapaxes(x, -1, -2)


def scores(q: np.ndarray, k: np.ndarray, mask: np.ndarray | None, scale: float,
           causal: bool) -> np.ndarray:
    """``(q @ k^T) * scale + mask``, causal positions ``-inf``: ``[*b, L, S]``."""
    s = np.matmul(q, _t(k)) * q.dtype.type(scale)
    if mask is not None:
        s = s + mask
    if causal:
        n_q, n_k = s.shape[-2:]
        hidden = np.arange(n_k)[None, :] > np.arange(n_q)[:, None]
        s = np.where(hidden, s.dtype.type(-np.inf), s)
    return s


def forward(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None,
            scale: float, causal: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(out [*b, L, Ev], lse [*b, L])``."""
    s = scores(q, k, mask, scale, causal)
    m = np.max(s, axis=-1, keepdims=True, initial=-np.inf)
    dead = m == -np.inf
    p = np.exp(s - np.where(dead, 0, m))
    total = p.sum(axis=-1, keepdims=True)
    out = np.where(dead, 0, np.matmul(p, v) / np.where(dead, 1, total))
    lse = np.where(dead, 0, m + np.log(np.where(dead, 1, total)))[..., 0]
    return out.astype(q.dtype), lse.astype(q.dtype)


def backward(dout: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray,
             lse: np.ndarray, mask: np.ndarray | None, scale: float,
             causal: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(dq, dk, dv)`` from the forward's ``out`` and ``lse``."""
    s = scores(q, k, mask, scale, causal)
    p = np.where(s == -np.inf, 0, np.exp(s - lse[..., None]))
    d = np.sum(dout * out, axis=-1, keepdims=True)
    dv = np.matmul(_t(p), dout)
    ds = p * (np.matmul(dout, _t(v)) - d)
    sc = q.dtype.type(scale)
    dq = np.matmul(ds, k) * sc
    dk = np.matmul(_t(ds), q) * sc
    return dq.astype(q.dtype), dk.astype(q.dtype), dv.astype(q.dtype)


def evaluate_part(v: Value, src: list[np.ndarray]) -> np.ndarray:
    """The array attention instruction ``v`` computes from its operands ``src``."""
    kind, part = ATTENTION_PART[v.op]
    n = len(ATTENTION_OPERANDS[kind])
    mask = src[n] if len(src) > n else None
    scale, causal = v.attr("scale"), v.attr("causal")
    if kind == "forward":
        out, lse = forward(*src[:n], mask, scale, causal)
        return {"out": out, "lse": lse}[part]
    dq, dk, dv = backward(*src[:n], mask, scale, causal)
    return {"dq": dq, "dk": dk, "dv": dv}[part]
