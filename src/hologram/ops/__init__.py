"""The op library (the seeds' API): ``hologram.ops.vector_add(exec, a, b, c, n=None)``.

Each op is an Atlas ISA program (composites built from primitives in
``composites``), cached per (op, shapes, dtype, parameters) and run by the
executor's backend on the caller's buffers in place.
"""

from . import composites
from .elementwise import (
    gelu,
    scalar_add,
    scalar_mul,
    sigmoid,
    tanh,
    vector_abs,
    vector_add,
    vector_clip,
    vector_div,
    vector_max,
    vector_min,
    vector_mul,
    vector_neg,
    vector_relu,
    vector_sub,
)
from .linalg import gemm, matvec
from .losses import binary_cross_entropy_loss, cross_entropy_loss, mse_loss
from .reductions import log_softmax, reduce_max, reduce_min, reduce_sum, softmax

__all__ = [
    "binary_cross_entropy_loss", "composites", "cross_entropy_loss", "gelu", "gemm",
    "log_softmax", "matvec", "mse_loss", "reduce_max", "reduce_min", "reduce_sum",
    "scalar_add", "scalar_mul", "sigmoid", "softmax", "tanh", "vector_abs", "vector_add",
    "vector_clip", "vector_div", "vector_max", "vector_min", "vector_mul", "vector_neg",
    "vector_relu", "vector_sub",
]
