"""What every translator shares: the context it is called with, the exception that
hands a node back to PyTorch, and the helpers that turn ATen's arguments into ISA
values of the right dtype.

The context knows the node and its traced result only, never the region being
built, so this package never imports the backend that uses it (the backend imports
the package, and nothing points back).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from hologram.isa import dtypes
from hologram.isa.builder import Var, const, elementwise
from hologram.isa.dtypes import DType
from hologram.isa.opcodes import MOVEMENT, Op
from hologram.isa.value import Value

from ..fx_info import HALF, INT_DTYPES, ISA_FLOAT


class Unsupported(Exception):
    """A node hologram cannot run; the message is the reason shown to the user."""


def inline(v: Var, name: str, fn: Callable[[Var], Var]) -> Var:
    """``Ctx.derive`` where nothing is kept: ``fn(v)`` inside the program."""
    return fn(v)


def no_seed() -> tuple[Var, int]:
    """``Ctx.random_key`` where no backend draws seeds: random ops run in PyTorch."""
    raise Unsupported("random numbers need a seed the backend draws at every call")


class Ctx:
    """What a translation function may ask about the node it translates.

    ``derive(v, name, fn)`` is ``fn(v)``, a value computed from ``v`` alone, which the
    backend may compute apart and keep across calls while ``v``'s tensor is unchanged
    (a Winograd convolution's transformed weight); ``name`` tells apart two such
    values of one tensor. The backend passes it; by default it is computed inline.

    ``random_key()`` is (seed, stream) for a random op: a 0-d integer program input the
    backend draws afresh at every call, and a stream number no other node of the
    program has (``hologram.ops.random_bits`` draws from the pair).
    """

    def __init__(self, node: torch.fx.Node, out: Any,
                 derive: Callable[[Var, str, Callable[[Var], Var]], Var] = inline,
                 random_key: Callable[[], tuple[Var, int]] = no_seed) -> None:
        self.node = node
        self.out = out
        self.derive = derive
        self.random_key = random_key

    @property
    def first_out(self) -> Any:
        """The traced result (its first tensor, for ops with several)."""
        return self.out[0] if isinstance(self.out, tuple) else self.out

    @property
    def out_dtype(self) -> DType:
        """The ISA dtype of the (first) tensor result."""
        return isa_dtype(self.first_out.dtype)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return self.first_out.shape


def isa_dtype(td: torch.dtype) -> DType:
    """The dtype a tensor of ``td`` has inside a program (integers ride in f64, 16-bit
    floats in f32: ``fx_info.HALF``)."""
    if td is torch.bool:
        return dtypes.boolean
    if td in INT_DTYPES:
        return dtypes.f64
    if td in HALF:
        return dtypes.f32
    d = ISA_FLOAT.get(td)
    if d is None:
        raise Unsupported(f"dtype {td} is not an Atlas ISA dtype the executor runs")
    return d


def _holds(v: Value, d: DType, depth: int = 16) -> bool:
    """Whether every element of f32 ``v`` is a value of 16-bit float ``d`` by
    construction: ``d`` converted, or views and concatenations of such."""
    if v.op is Op.CVT:
        return v.srcs[0].dtype is d
    if depth > 0 and (v.op in MOVEMENT or v.op is Op.CONCAT):
        return all(_holds(s, d, depth - 1) for s in v.srcs)
    return False


def round_half(v: Var, td: torch.dtype) -> Var:
    """``v``, the f32 carrier of an ATen result of 16-bit float dtype ``td``, rounded to
    it (to nearest even), as eager rounds every op's result (``fx_info.HALF``); a view
    of a value that holds one already is left alone."""
    d = HALF[td]
    if v.dtype is not dtypes.f32 or _holds(v.v, d):
        return v
    return v.cast(d).cast(dtypes.f32)


def as_var(x: Any, dtype: DType) -> Var:
    """A Var of ``dtype``: casts a Var, turns a Python scalar into a 0-d constant."""
    if isinstance(x, Var):
        return x.cast(dtype) if x.dtype is not dtype else x
    if isinstance(x, (bool, int, float)):
        if dtype is dtypes.boolean:
            return Var(const(bool(x), dtype, ()))
        return Var(const(float(x) if dtype.is_float else int(x), dtype, ()))
    raise Unsupported(f"operand of type {type(x).__name__} is not a tensor or a number")


def wider(*xs: Any) -> DType:
    """The compute dtype for comparing or combining mixed operands (PyTorch-like)."""
    ds = [x.dtype for x in xs if isinstance(x, Var) and x.dtype.is_float]
    if not ds:
        return dtypes.f32
    full = [x.dtype for x in xs if isinstance(x, Var) and x.dtype.is_float and x.ndim > 0]
    pool = full or ds
    return dtypes.f64 if dtypes.f64 in pool else pool[0]


def bool_const(value: bool) -> Value:
    return const(value, dtypes.boolean, ())


def or_(p: Var, q: Var) -> Var:
    return Var(elementwise(Op.SEL, p.v, bool_const(True), q.v))


def and_(p: Var, q: Var) -> Var:
    return Var(elementwise(Op.SEL, p.v, q.v, bool_const(False)))


def not_(p: Var) -> Var:
    return Var(elementwise(Op.SEL, p.v, bool_const(False), bool_const(True)))


def dims(x: Var, dim: Any) -> tuple[int, ...]:
    """ATen's dim argument: None or [] means every dimension."""
    if dim is None:
        return tuple(range(x.ndim))
    if isinstance(dim, int):
        dim = [dim]
    if len(dim) == 0:
        return tuple(range(x.ndim))
    return tuple(d % x.ndim if x.ndim else 0 for d in dim)
