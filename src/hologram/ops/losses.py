"""Loss functions: ``loss(exec, pred, target, out, n=None, reduction='mean')``.

With reduction 'mean' or 'sum' the loss is written to out[0] and returned as a
float; with 'none' the per-element (or per-row) losses are written to ``out``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..buffer import Buffer
from ..errors import ArgumentValueError, ShapeError
from . import composites as C
from ._run import cached_program, check_executor, float_dtype, launch, operand, resolve_n

_REDUCTIONS = tuple(C.REDUCTIONS)


def _check_reduction(reduction: Any) -> str:
    if not isinstance(reduction, str) or reduction not in C.REDUCTIONS:
        raise ArgumentValueError(f"reduction: expected one of {_REDUCTIONS}, got {reduction!r}")
    return reduction


def _pairwise(name: str, per_element: Any, exec: Any, pred: Buffer, target: Buffer,
              out: Buffer, n: Any, reduction: str) -> Any:
    ex = check_executor(exec)
    reduction = _check_reduction(reduction)
    d = float_dtype(pred, "pred")
    count = resolve_n(n, pred)
    shape = pred.shape if count is None else (count,)
    if count is None and isinstance(target, Buffer) and target.size != pred.size:
        raise ShapeError(f"target: has {target.size} elements, pred has {pred.size}")
    p = operand(ex, pred, "pred", dtype=d, shape=shape)
    t = operand(ex, target, "target", dtype=d, shape=shape)
    out_shape = shape if reduction == "none" else ()
    o = operand(ex, out, "out", dtype=d, shape=out_shape, write=True)
    program = cached_program(
        (name, shape, d.name, reduction),
        lambda a, b: C.reduce_loss(per_element(a, b), reduction),
        [(d, shape), (d, shape)],
    )
    launch(ex, program, [p, t], [o])
    return out if reduction == "none" else float(o)


def mse_loss(exec: Any, pred: Buffer, target: Buffer, out: Buffer, n: int | None = None,
             reduction: str = "mean") -> Any:
    """Mean (or sum, or per-element) squared error."""
    return _pairwise("mse_loss", C.squared_error, exec, pred, target, out, n, reduction)


def binary_cross_entropy_loss(exec: Any, pred: Buffer, target: Buffer, out: Buffer,
                              n: int | None = None, reduction: str = "mean") -> Any:
    """BCE of probabilities ``pred`` against ``target``; logs clamped at -100 (as torch)."""
    return _pairwise("binary_cross_entropy_loss", C.binary_cross_entropy, exec, pred, target,
                     out, n, reduction)


def cross_entropy_loss(exec: Any, logits: Buffer, target: Buffer, out: Buffer,
                       n: int | None = None, reduction: str = "mean",
                       classes: int | None = None) -> Any:
    """Cross entropy of raw ``logits`` against target probabilities (one-hot for labels).

    Rows are the leading axes and classes the last: a buffer of shape (N, C) is N rows;
    a flat buffer (or a prefix of ``n`` elements) is one row unless ``classes`` says how
    many classes a row has. Computed with a stable log-softmax; 'mean' averages over rows,
    as torch does.
    """
    ex = check_executor(exec)
    reduction = _check_reduction(reduction)
    d = float_dtype(logits, "logits")
    count = resolve_n(n, logits)
    shape = logits.shape if count is None else (count,)
    if classes is not None:
        if isinstance(classes, bool) or not isinstance(classes, (int, np.integer)):
            raise ArgumentValueError(f"classes: expected a positive int, got {classes!r}")
        classes = int(classes)
        if classes <= 0:
            raise ArgumentValueError(f"classes: expected a positive int, got {classes!r}")
        total = int(_size(shape))
        if total % classes:
            raise ShapeError(f"classes: {total} elements do not split into rows of {classes}")
        shape = (total // classes, classes)
    if len(shape) == 0:
        shape = (1,)
    if count is None and isinstance(target, Buffer) and target.size != logits.size:
        raise ShapeError(f"target: has {target.size} elements, logits has {logits.size}")
    x = operand(ex, logits, "logits", dtype=d, shape=shape)
    t = operand(ex, target, "target", dtype=d, shape=shape)
    out_shape = shape[:-1] if reduction == "none" else ()
    o = operand(ex, out, "out", dtype=d, shape=out_shape, write=True)
    program = cached_program(
        ("cross_entropy_loss", shape, d.name, reduction),
        lambda a, b: C.reduce_loss(C.cross_entropy_rows(a, b), reduction),
        [(d, shape), (d, shape)],
    )
    launch(ex, program, [x, t], [o])
    return out if reduction == "none" else float(o)


def _size(shape: tuple[int, ...]) -> int:
    r = 1
    for s in shape:
        r *= s
    return r
