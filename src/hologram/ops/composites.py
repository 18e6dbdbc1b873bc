"""Composite ops written once in Atlas ISA primitives.

The op library, ``hologram_torch`` and traced functions all call these, so a
composite has one definition and the compiler (not hand-written kernels) makes
it fast. Constants are written as Python floats and take the operand's dtype.
"""

from __future__ import annotations

import math

from ..isa.builder import Var

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
INV_SQRT2 = 1.0 / math.sqrt(2.0)


def relu(x: Var) -> Var:
    return x.maximum(0.0)  # MAX propagates NaN, like torch.relu


def clip(x: Var, lo: float, hi: float) -> Var:
    return x.maximum(lo).minimum(hi)


def sigmoid(x: Var) -> Var:
    """1 / (1 + exp(-x)) in primitives (neg, exp, add, div).

    The same expression, in the same order, that the single ``Op.SIGMOID``
    instruction renders to, so the fused kernel is the same loop and the same
    bits; written out, it is a composite whose primitives fusion folds into one
    launch, and canonicalization and fusion see through it when sigmoid is part
    of a larger traced function. Saturates like NumPy's ``1 / (1 + np.exp(-x))``:
    exp overflows to inf for very negative x and the result is 0 (not a denormal).
    """
    return 1.0 / (1.0 + (-x).exp())


def gelu_tanh(x: Var) -> Var:
    inner = SQRT_2_OVER_PI * (x + 0.044715 * (x * x * x))
    return 0.5 * x * (1.0 + inner.tanh())


def gelu_erf(x: Var) -> Var:
    return 0.5 * x * (1.0 + (x * INV_SQRT2).erf())


def gelu(x: Var, approximate: str = "tanh") -> Var:
    return GELU_FORMS[approximate](x)


GELU_FORMS = {"tanh": gelu_tanh, "none": gelu_erf, "erf": gelu_erf}


def softmax(x: Var, axis: int = -1) -> Var:
    e = (x - Var.max(x, axis, keepdims=True)).exp()
    return e / e.sum(axis, keepdims=True)


def log_softmax(x: Var, axis: int = -1) -> Var:
    shifted = x - Var.max(x, axis, keepdims=True)
    return shifted - shifted.exp().sum(axis, keepdims=True).log()


def layer_norm(x: Var, weight: Var | None, bias: Var | None, axes: tuple[int, ...],
               eps: float = 1e-5) -> Var:
    mean = x.mean(axes, keepdims=True)
    d = x - mean
    y = d * ((d * d).mean(axes, keepdims=True) + eps).rsqrt()
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def reduce_loss(per_element: Var, reduction: str) -> Var:
    return REDUCTIONS[reduction](per_element)


REDUCTIONS = {
    "none": lambda v: v,
    "sum": lambda v: v.sum(),
    "mean": lambda v: v.mean(),
}


def squared_error(pred: Var, target: Var) -> Var:
    d = pred - target
    return d * d


def cross_entropy_rows(logits: Var, target_probs: Var, axis: int = -1) -> Var:
    """Per-row loss -sum(t * log_softmax(x)), stable for large logits."""
    return -(target_probs * log_softmax(logits, axis)).sum(axis)


def binary_cross_entropy(prob: Var, target: Var) -> Var:
    """-(t log p + (1-t) log(1-p)) with logs clamped at -100, as torch does."""
    log_p = prob.log().maximum(-100.0)
    log_1mp = (1.0 - prob).log().maximum(-100.0)
    return -(target * log_p + (1.0 - target) * log_1mp)


def binary_cross_entropy_with_logits(x: Var, target: Var) -> Var:
    """Stable form: max(x,0) - x t + log(1 + exp(-|x|))."""
    return x.maximum(0.0) - x * target + ((-abs(x)).exp() + 1.0).log()
