"""Shape and dtype rules of the Atlas ISA, and the program verifier.

``infer`` is the single source of truth for what an instruction produces: the
builder uses it to type new instructions and the verifier uses it to check
instructions that came from elsewhere (the parser, a rewrite rule, a user).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import VerifyError
from . import dtypes
from .dtypes import DType
from .opcodes import (
    ATTENTION_OPERANDS,
    ATTENTION_PART,
    BITWISE,
    FLOAT_ONLY,
    INDEX_DTYPES,
    SCATTER_STEP,
    SHIFT,
    Group,
    Op,
    arity,
    group,
)
from .value import Shape, Value

PHI_BOUNDS = (("class", 96), ("page", 48), ("byte", 256))


class RuleError(Exception):
    """Raised by a rule; the verifier adds which instruction broke it."""


def _same(srcs: Sequence[Value], what: str) -> tuple[DType, Shape]:
    d, s = srcs[0].dtype, srcs[0].shape
    for x in srcs[1:]:
        if x.dtype is not d:
            raise RuleError(f"{what} operands differ in dtype ({d} vs {x.dtype})")
        if x.shape != s:
            raise RuleError(f"{what} operands differ in shape ({list(s)} vs {list(x.shape)})")
    return d, s


def _float_check(op: Op, d: DType) -> None:
    if op in FLOAT_ONLY and not d.is_float:
        raise RuleError(f"{op} needs a floating-point dtype, got {d}")
    if op in BITWISE and d.is_float:
        raise RuleError(f"{op} is a bitwise op: it needs an integer or bool dtype, got {d}")
    if op in SHIFT and d.kind != "i":  # (signed or unsigned)
        raise RuleError(f"{op} is a shift: it needs an integer dtype, got {d}")


def _bool_check(op: Op, d: DType) -> None:
    """Arithmetic is not defined on bool; the bitwise ops are (the logical ones)."""
    if d is dtypes.boolean and op not in BITWISE:
        raise RuleError(f"{op} is not defined on bool")


def _phi(attrs: dict[str, Any]) -> None:
    phi = attrs.get("phi")
    if phi is None:
        return
    if not (isinstance(phi, tuple) and len(phi) == 3):
        raise RuleError(f"phi must be (class, page, byte), got {phi!r}")
    for (name, bound), x in zip(PHI_BOUNDS, phi, strict=True):
        if not isinstance(x, int) or not 0 <= x < bound:
            raise RuleError(f"phi {name} must be an integer in [0, {bound}), got {x!r}")


def _memory(op, srcs, attrs, dtype, shape):
    if op is Op.LDG:
        if ("in" in attrs) == ("phi" in attrs):
            raise RuleError("ldg needs exactly one of in=<input index> or phi=(class,page,byte)")
        _phi(attrs)
        return dtype, shape
    if ("out" in attrs) == ("phi" in attrs):
        raise RuleError("stg needs exactly one of out=<output index> or phi=(class,page,byte)")
    _phi(attrs)
    return srcs[0].dtype, srcs[0].shape


def _const(op, srcs, attrs, dtype, shape):
    v = attrs.get("value")
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        if not (dtype is dtypes.boolean and isinstance(v, bool)):
            raise RuleError(f"const needs a numeric value=, got {v!r}")
    if dtype is not None and dtype.kind == "i" and not isinstance(v, bool):
        info = np.iinfo(dtype.np_dtype)  # a constant the dtype cannot hold has no meaning
        if not (isinstance(v, int) and info.min <= v <= info.max):
            raise RuleError(f"const value={v!r} is not a {dtype} (an integer in "
                            f"[{info.min}, {info.max}])")
    return dtype, shape


def _unary(op, srcs, attrs, dtype, shape):
    d, s = srcs[0].dtype, srcs[0].shape
    _float_check(op, d)
    _bool_check(op, d)
    return d, s


def _binary(op, srcs, attrs, dtype, shape):
    d, s = _same(srcs, str(op))
    _float_check(op, d)
    _bool_check(op, d)
    return d, s


def _compare(op, srcs, attrs, dtype, shape):
    _, s = _same(srcs, str(op))
    return dtypes.boolean, s


def _ternary(op, srcs, attrs, dtype, shape):
    d, s = _same(srcs, str(op))
    _float_check(op, d)
    return d, s


def _select(op, srcs, attrs, dtype, shape):
    if srcs[0].dtype is not dtypes.boolean:
        raise RuleError(f"sel condition must be bool, got {srcs[0].dtype}")
    if srcs[0].shape != srcs[1].shape:
        raise RuleError(
            f"sel condition shape {list(srcs[0].shape)} differs from {list(srcs[1].shape)}"
        )
    return _same(srcs[1:], "sel")


def _cast(op, srcs, attrs, dtype, shape):
    return dtype, srcs[0].shape


def normalize_axes(axes: Sequence[int], ndim: int) -> tuple[int, ...]:
    out = []
    for a in axes:
        if not isinstance(a, int) or isinstance(a, bool):
            raise RuleError(f"axis {a!r} is not an integer")
        if not -ndim <= a < ndim:
            raise RuleError(f"axis {a} is out of range for {ndim} dimensions")
        out.append(a % ndim)
    if len(set(out)) != len(out):
        raise RuleError(f"axes {tuple(axes)} repeat an axis")
    return tuple(sorted(out))


def _reduce(op, srcs, attrs, dtype, shape):
    x = srcs[0]
    if x.dtype is dtypes.boolean:
        raise RuleError(f"{op} is not defined on bool")
    axes = attrs.get("axes")
    if not isinstance(axes, tuple):
        raise RuleError(f"{op} needs axes=(...), got {axes!r}")
    norm = normalize_axes(axes, x.ndim)
    if norm != axes:
        raise RuleError(f"{op} axes must be sorted and non-negative, got {axes} (use {norm})")
    return x.dtype, tuple(1 if i in norm else n for i, n in enumerate(x.shape))


def _reshape(x: Value, attrs: dict[str, Any], shape: Shape) -> Shape:
    if math.prod(shape) != x.size:
        raise RuleError(f"reshape of {list(x.shape)} to {list(shape)} changes the size")
    return shape


def _expand(x: Value, attrs: dict[str, Any], shape: Shape) -> Shape:
    if len(shape) != x.ndim or any(
        a != b and a != 1 for a, b in zip(x.shape, shape, strict=True)
    ):
        raise RuleError(f"expand of {list(x.shape)} to {list(shape)}: only size-1 dims grow")
    return shape


def _permute(x: Value, attrs: dict[str, Any], shape: Shape) -> Shape:
    perm = attrs.get("perm")
    if not isinstance(perm, tuple) or sorted(perm) != list(range(x.ndim)):
        raise RuleError(f"permute needs perm= a permutation of {x.ndim} axes, got {perm!r}")
    return tuple(x.shape[p] for p in perm)


def _slice(x: Value, attrs: dict[str, Any], shape: Shape) -> Shape:
    """``x[starts[0]:starts[0]+shape[0], ...]``: the declared shape holds the sizes (as a
    reshape's does), ``starts`` where each axis begins; step 1, so the result is a view."""
    starts = attrs.get("starts")
    if not isinstance(starts, tuple) or len(starts) != x.ndim or not all(
            isinstance(s, int) and not isinstance(s, bool) for s in starts):
        raise RuleError(f"slice needs starts= one integer per axis of {list(x.shape)}, "
                        f"got {starts!r}")
    if len(shape) != x.ndim:
        raise RuleError(f"slice of {list(x.shape)} to {list(shape)} changes the rank")
    for axis, (start, size, dim) in enumerate(zip(starts, shape, x.shape, strict=True)):
        if start < 0 or start + size > dim:
            raise RuleError(f"slice axis {axis}: [{start}, {start + size}) is outside "
                            f"[0, {dim}) of {list(x.shape)}")
    return shape


# Movement ops: the result shape each produces from its operand (a view of it).
MOVEMENT_RULES: dict[Op, Callable[[Value, dict[str, Any], Shape], Shape]] = {
    Op.RESHAPE: _reshape,
    Op.EXPAND: _expand,
    Op.PERMUTE: _permute,
    Op.SLICE: _slice,
}


def _movement(op, srcs, attrs, dtype, shape):
    x = srcs[0]
    return x.dtype, MOVEMENT_RULES[op](x, attrs, shape)


def _concat(op, srcs, attrs, dtype, shape):
    """Parts joined along ``axis``: one dtype and rank, equal sizes on every other axis."""
    if not srcs:
        raise RuleError("concat needs at least one operand")
    first = srcs[0]
    axis = attrs.get("axis")
    if first.ndim == 0:
        raise RuleError("concat needs operands of rank >= 1, got a scalar")
    if not isinstance(axis, int) or isinstance(axis, bool) or not 0 <= axis < first.ndim:
        raise RuleError(f"concat needs axis= an axis in [0, {first.ndim}), got {axis!r}")
    total = 0
    for i, x in enumerate(srcs):
        if x.dtype is not first.dtype:
            raise RuleError(f"concat operands differ in dtype ({first.dtype} vs {x.dtype})")
        if x.ndim != first.ndim or any(
                a != b for d, (a, b) in enumerate(zip(x.shape, first.shape, strict=True))
                if d != axis):
            raise RuleError(f"concat operand {i} {list(x.shape)} differs from "
                            f"{list(first.shape)} off axis {axis}")
        total += x.shape[axis]
    return first.dtype, (*first.shape[:axis], total, *first.shape[axis + 1:])


def _gemm(op, srcs, attrs, dtype, shape):
    """``[*batch, m, k] @ [*batch, k, n] -> [*batch, m, n]``. The batch dims must be
    equal: a broadcast batch is an explicit EXPAND before the GEMM (as the builder's
    ``matmul`` writes it), so backends never guess which operand repeats."""
    a, b = srcs
    if a.dtype is not b.dtype:
        raise RuleError(f"gemm operands differ in dtype ({a.dtype} vs {b.dtype})")
    if not a.dtype.is_float:
        raise RuleError(f"gemm needs a floating-point dtype, got {a.dtype}")
    if a.ndim < 2 or b.ndim < 2:
        raise RuleError(f"gemm needs operands of rank >= 2 ([*batch, m, k] @ [*batch, k, n]), "
                        f"got {list(a.shape)} and {list(b.shape)}")
    if a.ndim != b.ndim:
        raise RuleError(f"gemm operands differ in rank: {list(a.shape)} @ {list(b.shape)} "
                        "(expand the batch dims to one shape first)")
    if a.shape[:-2] != b.shape[:-2]:
        raise RuleError(f"gemm batch dims differ: {list(a.shape[:-2])} vs {list(b.shape[:-2])} "
                        f"in {list(a.shape)} @ {list(b.shape)} (expand them to one shape first)")
    if a.shape[-1] != b.shape[-2]:
        raise RuleError(f"gemm inner sizes differ: {list(a.shape)} @ {list(b.shape)}")
    return a.dtype, (*a.shape[:-1], b.shape[-1])


def _axis_attr(op: Op, attrs: dict[str, Any], ndim: int) -> int:
    """The ``axis=`` of an index op: an integer in [0, ndim) (rank >= 1)."""
    axis = attrs.get("axis")
    if ndim == 0:
        raise RuleError(f"{op} needs operands of rank >= 1, got a scalar")
    if not isinstance(axis, int) or isinstance(axis, bool) or not 0 <= axis < ndim:
        raise RuleError(f"{op} needs axis= an axis in [0, {ndim}), got {axis!r}")
    return axis


def _iota(op, srcs, attrs, dtype, shape):
    """Each element's coordinate along ``axis``, in the declared (numeric) dtype."""
    _axis_attr(op, attrs, len(shape))
    if dtype is None or dtype is dtypes.boolean:
        raise RuleError(f"iota needs an integer or floating-point dtype, got {dtype}")
    return dtype, shape


def _index_operand(op: Op, idx: Value, ref: Value, axis: int, what: str) -> None:
    """``idx`` is an integer array of ``ref``'s rank, no larger than ``ref`` off ``axis``
    (torch.gather's rule: an index names its own coordinates on the other axes)."""
    if idx.dtype.name not in INDEX_DTYPES:
        raise RuleError(f"{op} index must be i32 or i64, got {idx.dtype}")
    if idx.ndim != ref.ndim:
        raise RuleError(f"{op} index {list(idx.shape)} and {what} {list(ref.shape)} differ "
                        "in rank")
    for d, (i, n) in enumerate(zip(idx.shape, ref.shape, strict=True)):
        if d != axis and i > n:
            raise RuleError(f"{op} index {list(idx.shape)} is larger than {what} "
                            f"{list(ref.shape)} on axis {d} (only axis {axis} is indexed)")


def _gather(op, srcs, attrs, dtype, shape):
    """``out[j] = x[j with axis a replaced by idx[j]]``: x's dtype, idx's shape."""
    x, idx = srcs
    axis = _axis_attr(op, attrs, x.ndim)
    _index_operand(op, idx, x, axis, "table")
    return x.dtype, idx.shape


def _scatter(op, srcs, attrs, dtype, shape):
    """``base`` with ``src[j]`` written (SCATTER) or combined by the op's step (SCATTER_ADD,
    _MUL, _MAX, _MIN: ``SCATTER_STEP``) at ``j`` with axis a replaced by ``idx[j]``:
    base's dtype and shape."""
    base, idx, src = srcs
    axis = _axis_attr(op, attrs, base.ndim)
    if src.dtype is not base.dtype:
        raise RuleError(f"{op} src dtype {src.dtype} differs from base {base.dtype}")
    if SCATTER_STEP[op] is not None and base.dtype is dtypes.boolean:
        raise RuleError(f"{op} is not defined on bool")
    _index_operand(op, idx, base, axis, "base")
    if src.shape != idx.shape:
        raise RuleError(f"{op} src {list(src.shape)} and index {list(idx.shape)} differ "
                        "in shape")
    return base.dtype, base.shape


def _scan(op, srcs, attrs, dtype, shape):
    """Inclusive prefix along ``axis``: same dtype and shape."""
    x = srcs[0]
    _axis_attr(op, attrs, x.ndim)
    if x.dtype is dtypes.boolean:
        raise RuleError(f"{op} is not defined on bool")
    return x.dtype, x.shape


def _sort(op, srcs, attrs, dtype, shape):
    """ARGSORT: along ``axis``, each fiber's positions in stable sorted order (ascending:
    NaN last; ``descending=True``: NaN first), in the declared index dtype; x's shape."""
    x = srcs[0]
    _axis_attr(op, attrs, x.ndim)
    if not isinstance(attrs.get("descending"), bool):
        raise RuleError(f"{op} needs descending= True or False, got "
                        f"{attrs.get('descending')!r}")
    if dtype is None or dtype.name not in INDEX_DTYPES:
        raise RuleError(f"{op} gives i32 or i64 positions, declared {dtype}")
    return dtype, x.shape


def _attention(op, srcs, attrs, dtype, shape):
    """One part of ``softmax(q k^T * scale + mask, causal) v`` or of its gradients.

    Forward operands ``q [*b, L, E], k [*b, S, E], v [*b, S, Ev]``; backward operands
    ``dout [*b, L, Ev], q, k, v, out [*b, L, Ev], lse [*b, L]``; either may end with a
    mask ``[*b, L, S]`` that is added to the scores. The batch dims are equal: a
    broadcast (GQA's shared KV heads, a mask over heads) is an explicit EXPAND, which
    the backends read in place. ``scale=`` is a float, ``causal=`` a bool (query ``i``
    sees keys ``j <= i``, ATen's top-left alignment)."""
    kind, part = ATTENTION_PART[op]
    names = ATTENTION_OPERANDS[kind]
    if len(srcs) not in (len(names), len(names) + 1):
        raise RuleError(f"{op} takes {len(names)} operands ({', '.join(names)}) and an "
                        f"optional mask, got {len(srcs)}")
    got = dict(zip(names, srcs, strict=False))
    d = got["q"].dtype
    for name, x in (*got.items(), *((("mask", srcs[-1]),) if len(srcs) > len(names) else ())):
        if x.dtype is not d:
            raise RuleError(f"{op} operand {name} is {x.dtype}, q is {d}")
    if not d.is_float:
        raise RuleError(f"{op} needs a floating-point dtype, got {d}")
    q, k, v = got["q"], got["k"], got["v"]
    if q.ndim < 2 or k.ndim != q.ndim or v.ndim != q.ndim:
        raise RuleError(f"{op} needs q, k, v of one rank >= 2 ([*batch, L, E], [*batch, S, E], "
                        f"[*batch, S, Ev]), got {list(q.shape)}, {list(k.shape)}, "
                        f"{list(v.shape)}")
    *batch, n_q, e = q.shape
    n_k, ev = k.shape[-2], v.shape[-1]
    want = {"k": (*batch, n_k, e), "v": (*batch, n_k, ev), "dout": (*batch, n_q, ev),
            "out": (*batch, n_q, ev), "lse": (*batch, n_q), "mask": (*batch, n_q, n_k)}
    checks = [(n, x) for n, x in got.items() if n != "q"]
    if len(srcs) > len(names):
        checks.append(("mask", srcs[-1]))
    for name, x in checks:
        if x.shape != want[name]:
            raise RuleError(f"{op} operand {name} is {list(x.shape)}, expected "
                            f"{list(want[name])} for q {list(q.shape)}, k {list(k.shape)}, "
                            f"v {list(v.shape)} (expand broadcast dims first)")
    scale, causal = attrs.get("scale"), attrs.get("causal")
    if not isinstance(scale, float):
        raise RuleError(f"{op} needs scale= a float, got {scale!r}")
    if not isinstance(causal, bool):
        raise RuleError(f"{op} needs causal= True or False, got {causal!r}")
    if set(attrs) != {"scale", "causal"}:
        raise RuleError(f"{op} takes the attributes scale= and causal=, got "
                        f"{sorted(attrs)}")
    parts = {"out": (*batch, n_q, ev), "lse": (*batch, n_q), "dq": (*batch, n_q, e),
             "dk": (*batch, n_k, e), "dv": (*batch, n_k, ev)}
    return d, parts[part]


RULES: dict[Group, Callable[..., tuple[DType, Shape]]] = {
    Group.MEMORY: _memory,
    Group.CONST: _const,
    Group.UNARY: _unary,
    Group.BINARY: _binary,
    Group.COMPARE: _compare,
    Group.TERNARY: _ternary,
    Group.SELECT: _select,
    Group.CAST: _cast,
    Group.REDUCE: _reduce,
    Group.MOVEMENT: _movement,
    Group.CONCAT: _concat,
    Group.GEMM: _gemm,
    Group.ATTENTION: _attention,
    Group.IOTA: _iota,
    Group.GATHER: _gather,
    Group.SCATTER: _scatter,
    Group.SCAN: _scan,
    Group.SORT: _sort,
}


def infer(
    op: Op,
    srcs: Sequence[Value],
    attrs: dict[str, Any] | None = None,
    dtype: DType | None = None,
    shape: Shape = (),
) -> tuple[DType, Shape]:
    """(dtype, shape) that ``op`` produces from ``srcs``; raises RuleError if it cannot."""
    if not isinstance(op, Op):
        raise RuleError(f"unknown opcode {op!r}")
    n = arity(op)
    if n is not None and len(srcs) != n:
        raise RuleError(f"{op} takes {n} operand(s), got {len(srcs)}")
    if any(d < 0 for d in shape):
        raise RuleError(f"negative dimension in shape {list(shape)}")
    return RULES[group(op)](op, srcs, attrs or {}, dtype, tuple(shape))


def check_value(v: Value) -> None:
    """Raise RuleError unless ``v``'s declared dtype and shape follow from its operands."""
    d, s = infer(v.op, v.srcs, dict(v.attrs), v.dtype, v.shape)
    if v.op is Op.STG:
        return
    if d is not v.dtype:
        raise RuleError(f"declared dtype {v.dtype} but operands give {d}")
    if s != v.shape:
        raise RuleError(f"declared shape {list(v.shape)} but operands give {list(s)}")


def verify(program: Any) -> None:
    """Check every instruction of ``program``; raise VerifyError naming the first bad one."""
    from .text import format_instruction  # local: text imports this module

    defined: set[int] = set()
    names: dict[int, int] = {}
    outs: list[int] = []
    for v in program.instructions:
        for s in v.srcs:
            if id(s) not in defined:
                raise VerifyError(
                    f"{format_instruction(v, names)}: operand used before its definition"
                )
        try:
            check_value(v)
            if v.op is Op.LDG and v.attr("in") is not None:
                i = v.attr("in")
                if not isinstance(i, int) or not 0 <= i < len(program.inputs):
                    n_in = len(program.inputs)
                    raise RuleError(f"input index {i!r} out of range ({n_in} inputs)")
                want_d, want_s = program.inputs[i]
                if (want_d, want_s) != (v.dtype, v.shape):
                    raise RuleError(
                        f"input {i} is declared {want_d}{list(want_s)} but loaded as "
                        f"{v.dtype}{list(v.shape)}"
                    )
            if v.op is Op.STG and v.attr("out") is not None:
                outs.append(v.attr("out"))
        except RuleError as e:
            raise VerifyError(f"{format_instruction(v, names)}: {e}") from None
        defined.add(id(v))
        if v.op is not Op.STG:
            names[id(v)] = len(names)
    if sorted(outs) != list(range(len(outs))):
        raise VerifyError(f"output indices must be 0..{len(outs) - 1} once each, got {outs}")
