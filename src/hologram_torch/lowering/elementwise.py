"""Element-wise ATen ops: arithmetic, comparisons, logic, activations and their
backward formulas, casts and copies.

One translator per ATen op, ``ROWS`` maps each op to it (see
:mod:`hologram_torch.lowering` for how a translator is written)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from hologram.isa import dtypes
from hologram.isa.builder import Var, elementwise
from hologram.isa.opcodes import Op
from hologram.ops import composites

from .context import Ctx, Unsupported, and_, as_var, isa_dtype, not_, or_, wider

aten = torch.ops.aten


def _logical(kind: str) -> Callable[..., Var]:
    """and/or/not over bool tensors (integer bitwise ops fail the dtype check first)."""

    def tr(ctx: Ctx, a: Any, b: Any = None) -> Var:
        if ctx.out.dtype is not torch.bool:
            raise Unsupported(f"bitwise {kind} on {ctx.out.dtype} (only bool is translated)")
        p = as_var(a, dtypes.boolean)
        if kind == "not":
            return not_(p)
        q = as_var(b, dtypes.boolean)
        return or_(p, q) if kind == "or" else and_(p, q)

    return tr


def _sign(ctx: Ctx, x: Var) -> Var:
    x = x.cast(ctx.out_dtype)
    # x * 0 keeps NaN as NaN (and 0 as 0) where neither comparison holds.
    return (0.0 < x).where(1.0, (x < 0.0).where(-1.0, x * 0.0))


def compare(kind: str, a: Any, b: Any) -> Var:
    d = wider(a, b)
    x, y = as_var(a, d), as_var(b, d)
    # Written with < and == only (the ISA's compares), keeping IEEE NaN behaviour:
    # every comparison with NaN is false except !=.
    forms: dict[str, Callable[[], Var]] = {
        "lt": lambda: x < y,
        "gt": lambda: y < x,
        "eq": lambda: x.eq(y),
        "ne": lambda: not_(x.eq(y)),
        "le": lambda: or_(x < y, x.eq(y)),
        "ge": lambda: or_(y < x, x.eq(y)),
    }
    return forms[kind]()


def _binary(fn: Callable[[Var, Var], Var]) -> Callable[..., Var]:
    def tr(ctx: Ctx, a: Any, b: Any, *, alpha: Any = 1) -> Var:
        d = ctx.out_dtype
        x, y = as_var(a, d), as_var(b, d)
        if alpha != 1:
            y = y * float(alpha)
        return fn(x, y)

    return tr


def _rsub(ctx: Ctx, a: Any, b: Any, *, alpha: Any = 1) -> Var:
    d = ctx.out_dtype
    x, y = as_var(a, d), as_var(b, d)
    return y - (x * float(alpha) if alpha != 1 else x)


def _div(ctx: Ctx, a: Any, b: Any, *, rounding_mode: str | None = None) -> Var:
    if rounding_mode is not None:
        raise Unsupported(f"div rounding_mode={rounding_mode!r} has no ISA form")
    d = ctx.out_dtype
    return as_var(a, d) / as_var(b, d)


def _unary(method: str) -> Callable[..., Var]:
    def tr(ctx: Ctx, x: Var) -> Var:
        return getattr(x.cast(ctx.out_dtype), method)()

    return tr


def _where(ctx: Ctx, cond: Any, a: Any, b: Any) -> Var:
    d = ctx.out_dtype
    c = as_var(cond, dtypes.boolean)
    return c.where(as_var(a, d), as_var(b, d))


def _clamp(ctx: Ctx, x: Var, min: Any = None, max: Any = None) -> Var:  # noqa: A002
    d = ctx.out_dtype
    y = x.cast(d)
    if min is not None:
        y = y.maximum(as_var(min, d))
    if max is not None:
        y = y.minimum(as_var(max, d))
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
    return compare("le", x, threshold).where(0.0, as_var(grad, ctx.out_dtype))


def _copy(ctx: Ctx, x: Any, src: Any, non_blocking: bool = False) -> Var:
    """The functional ``copy``: ``src``'s values in ``x``'s dtype and shape (what
    functionalization makes of an in-place update of a temporary, e.g. ``addcmul_``)."""
    return as_var(src, ctx.out_dtype).expand(ctx.out_shape)


def _fma(ctx: Ctx, a: Any, b: Any, c: Any) -> Var:
    """Inductor's ``prims.fma`` (from its ``addcmul`` decomposition): ``a * b + c``
    rounded once, as eager's vectorised ``addcmul`` computes it."""
    d = ctx.out_dtype
    x, y, z = (as_var(v, d) for v in (a, b, c))
    return Var(elementwise(Op.FMA, x.v, y.v, z.v))


def _to_copy(ctx: Ctx, x: Var, *args: Any, dtype: Any = None, device: Any = None,
             **kwargs: Any) -> Var:
    if device is not None and torch.device(device).type != "cpu":
        raise Unsupported(f"_to_copy to device {device} leaves host memory")
    return x.cast(isa_dtype(ctx.out.dtype))


def _convert_element_type(ctx: Ctx, x: Var, dtype: Any) -> Var:
    return x.cast(isa_dtype(ctx.out.dtype))


# One row per ATen op (overload packet).
ROWS: dict[Any, Callable[..., Any]] = {
    aten.add: _binary(lambda x, y: x + y),
    aten.sub: _binary(lambda x, y: x - y),
    aten.rsub: _rsub,
    aten.mul: _binary(lambda x, y: x * y),
    aten.div: _div,
    aten.pow: _binary(lambda x, y: x ** y),
    aten.maximum: _binary(lambda x, y: x.maximum(y)),
    aten.minimum: _binary(lambda x, y: x.minimum(y)),
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
    aten.gelu: _gelu,
    aten.gelu_backward: _gelu_backward,
    aten.threshold_backward: _threshold_backward,
    aten.clamp: _clamp,
    aten.clamp_min: lambda ctx, x, lo: _clamp(ctx, x, lo, None),
    aten.clamp_max: lambda ctx, x, hi: _clamp(ctx, x, None, hi),
    aten.where: _where,
    aten.logical_and: _logical("and"),
    aten.logical_or: _logical("or"),
    aten.logical_not: _logical("not"),
    aten.bitwise_and: _logical("and"),
    aten.bitwise_or: _logical("or"),
    aten.bitwise_not: _logical("not"),
    aten.copy: _copy,
    aten._to_copy: _to_copy,
    torch.ops.prims.convert_element_type: _convert_element_type,
    aten.neg: _unary("__neg__"),
    aten.abs: _unary("__abs__"),
    aten.relu: lambda ctx, x: composites.relu(x.cast(ctx.out_dtype)),
    aten.tanh_backward: lambda ctx, g, y: as_var(g, ctx.out_dtype) * (1.0 - y * y),
    aten.sigmoid_backward: lambda ctx, g, y: as_var(g, ctx.out_dtype) * (y * (1.0 - y)),
    aten.gt: lambda ctx, a, b: compare("gt", a, b),
    aten.lt: lambda ctx, a, b: compare("lt", a, b),
    aten.ge: lambda ctx, a, b: compare("ge", a, b),
    aten.le: lambda ctx, a, b: compare("le", a, b),
    aten.eq: lambda ctx, a, b: compare("eq", a, b),
    aten.ne: lambda ctx, a, b: compare("ne", a, b),
}

# Rows for ops that exist only once another module registers them (Inductor's prims).
NAMED_ROWS: dict[str, Callable[..., Any]] = {
    "prims.fma": _fma,
}
