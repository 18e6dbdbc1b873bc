"""GEMM and matrix-vector product.

``gemm(exec, a, b, c, m, k, n)``: C (m x n) = A (m x k) @ B (k x n), row-major,
sizes in the order m, k, n (the original API swapped k and n). Sizes default to
the buffers' own 2-D shapes. The backend runs GEMM as a library call (BLAS).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..buffer import Buffer
from ..errors import ArgumentTypeError, ShapeError
from ._run import cached_program, check_executor, float_dtype, launch, operand


def _dim(v: Any, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise ArgumentTypeError(f"{name}: expected an int, got {type(v).__name__}")
    v = int(v)
    if v < 0:
        raise ShapeError(f"{name}: must be >= 0, got {v}")
    return v


def gemm(exec: Any, a: Buffer, b: Buffer, c: Buffer, m: int | None = None,
         k: int | None = None, n: int | None = None) -> Buffer:
    """C = A @ B. m, k, n default to A's and B's shapes when they are 2-D."""
    ex = check_executor(exec)
    d = float_dtype(a, "a")
    if not isinstance(b, Buffer):
        raise ArgumentTypeError(f"b: expected a hologram Buffer, got {type(b).__name__}")
    if m is None or k is None or n is None:
        if not (a.ndim == 2 and b.ndim == 2):
            raise ShapeError("m, k, n: required unless a and b are 2-D buffers")
        m = a.shape[0] if m is None else m
        k = a.shape[1] if k is None else k
        n = b.shape[1] if n is None else n
    m, k, n = _dim(m, "m"), _dim(k, "k"), _dim(n, "n")
    x = operand(ex, a, "a", dtype=d, shape=(m, k))
    y = operand(ex, b, "b", dtype=d, shape=(k, n))
    o = operand(ex, c, "c", dtype=d, shape=(m, n), write=True)
    program = cached_program(("gemm", (m, k, n), d.name), lambda p, q: p @ q,
                             [(d, (m, k)), (d, (k, n))])
    launch(ex, program, [x, y], [o])
    return c


def matvec(exec: Any, a: Buffer, x: Buffer, y: Buffer, m: int | None = None,
           n: int | None = None) -> Buffer:
    """y (m) = A (m x n) @ x (n)."""
    ex = check_executor(exec)
    d = float_dtype(a, "a")
    if m is None or n is None:
        if a.ndim != 2:
            raise ShapeError("m, n: required unless a is a 2-D buffer")
        m = a.shape[0] if m is None else m
        n = a.shape[1] if n is None else n
    m, n = _dim(m, "m"), _dim(n, "n")
    A = operand(ex, a, "a", dtype=d, shape=(m, n))
    v = operand(ex, x, "x", dtype=d, shape=(n, 1))
    o = operand(ex, y, "y", dtype=d, shape=(m, 1), write=True)
    program = cached_program(("matvec", (m, n), d.name), lambda p, q: p @ q,
                             [(d, (m, n)), (d, (n, 1))])
    launch(ex, program, [A, v], [o])
    return y
