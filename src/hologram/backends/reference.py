"""The reference backend: a NumPy interpreter of the Atlas ISA.

Always available, deliberately simple, and the oracle every other backend is
tested against. Each opcode maps to one NumPy expression in a table; NumPy's
IEEE behaviour (NaN propagation in min/max, inf arithmetic) is the semantics.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import DTypeError, ShapeError
from ..isa.index_errors import out_of_range
from ..isa.opcodes import REDUCE_IDENTITY, SCATTER_STEP, Group, Op, group
from ..isa.program import Program
from ..isa.value import Value
from ..isa.verify import PHI_BOUNDS
from . import attention_reference, special_reference
from .base import Backend

_erf64 = np.frompyfunc(math.erf, 1, 1)


def _erf(x: np.ndarray) -> np.ndarray:
    return np.asarray(_erf64(np.asarray(x, np.float64)), np.float64).astype(x.dtype)


_erfc64 = np.frompyfunc(math.erfc, 1, 1)


def _erfc(x: np.ndarray) -> np.ndarray:
    return np.asarray(_erfc64(np.asarray(x, np.float64)), np.float64).astype(x.dtype)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    one = x.dtype.type(1)
    return one / (one + np.exp(-x))


def _bits(a: np.ndarray) -> int:
    return a.dtype.itemsize * 8


def _shl(a: np.ndarray, n: np.ndarray) -> np.ndarray:
    """NumPy's left_shift, its saturation spelled out: a count outside [0, bits) (a
    negative one too) gives 0, never C's undefined shift."""
    inside = (n >= 0) & (n < _bits(a))
    return np.where(inside, np.left_shift(a, np.where(inside, n, 0)), 0).astype(a.dtype)


def _shr(a: np.ndarray, n: np.ndarray) -> np.ndarray:
    """NumPy's right_shift (arithmetic for signed integers); a count outside [0, bits)
    gives the sign fill: -1 for a negative a, 0 otherwise."""
    inside = (n >= 0) & (n < _bits(a))
    fill = np.where(a < 0, -1, 0).astype(a.dtype)  # (uint64 beside int64 would be float64)
    return np.where(inside, np.right_shift(a, np.where(inside, n, 0)), fill)


UNARY: dict[Op, Callable[[np.ndarray], np.ndarray]] = {
    Op.NOT: np.invert,  # ~x on integers, logical not on bool
    Op.NEG: np.negative,
    Op.ABS: np.abs,
    Op.EXP: np.exp,
    Op.LOG: np.log,
    Op.SQRT: np.sqrt,
    Op.RSQRT: lambda x: x.dtype.type(1) / np.sqrt(x),
    Op.RECIP: lambda x: x.dtype.type(1) / x,
    Op.TANH: np.tanh,
    Op.SIGMOID: _sigmoid,
    Op.ERF: _erf,
    Op.SIN: np.sin,
    Op.COS: np.cos,
    Op.FLOOR: np.floor,
    Op.CEIL: np.ceil,
    Op.TRUNC: np.trunc,
    Op.RINT: np.rint,
    Op.LOG1P: np.log1p,
    Op.EXPM1: np.expm1,
    Op.TAN: np.tan,
    Op.ASIN: np.arcsin,
    Op.ACOS: np.arccos,
    Op.ATAN: np.arctan,
    Op.SINH: np.sinh,
    Op.COSH: np.cosh,
    Op.ASINH: np.arcsinh,
    Op.ACOSH: np.arccosh,
    Op.ATANH: np.arctanh,
    Op.LOG2: np.log2,
    Op.LOG10: np.log10,
    Op.EXP2: np.exp2,
    Op.ERFC: _erfc,
    Op.LGAMMA: special_reference.lgamma,
    Op.DIGAMMA: special_reference.digamma,
}
BINARY: dict[Op, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    Op.ADD: np.add,
    Op.SUB: np.subtract,
    Op.MUL: np.multiply,
    Op.DIV: np.divide,
    Op.MIN: np.minimum,
    Op.MAX: np.maximum,
    Op.POW: np.power,
    Op.FMOD: np.fmod,
    Op.ATAN2: np.arctan2,
    Op.HYPOT: np.hypot,
    # a NaN's sign is not an ISA value: copysign by a NaN gives |a| on every backend
    Op.COPYSIGN: lambda a, b: np.where(np.isnan(b), np.abs(a), np.copysign(a, b)),
    Op.ZETA: special_reference.zeta,
    Op.AND: np.bitwise_and,
    Op.OR: np.bitwise_or,
    Op.XOR: np.bitwise_xor,
    Op.SHL: _shl,
    Op.SHR: _shr,
    Op.CMPLT: np.less,
    Op.CMPEQ: np.equal,
}


def _fma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    # One rounding for f32 and narrower: the f64 product of two f32 is exact.
    wide = np.float64 if a.dtype.itemsize <= 4 else a.dtype
    return (a.astype(wide) * b.astype(wide) + c.astype(wide)).astype(a.dtype)


TERNARY: dict[Op, Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]] = {
    Op.MAD: lambda a, b, c: a * b + c,
    Op.FMA: _fma,
    Op.SEL: np.where,
}
REDUCE: dict[Op, Callable[..., np.ndarray]] = {
    Op.RSUM: np.sum,
    Op.RPROD: np.prod,
    Op.RMAX: np.max,
    Op.RMIN: np.min,
}


def _identity(op: Op, d: np.dtype) -> Any:
    v = REDUCE_IDENTITY[op]
    if np.issubdtype(d, np.integer) and math.isinf(v):
        info = np.iinfo(d)
        return info.min if v < 0 else info.max
    return d.type(v)


def slice_index(v: Value) -> tuple[slice, ...]:
    """NumPy's basic index for SLICE ``v``: a view of its operand, as the ISA means it."""
    return tuple(slice(s, s + n) for s, n in zip(v.attr("starts"), v.shape, strict=True))


#: How NumPy takes each view op (a view of its operand, never a copy): the reference's
#: semantics, and the CPU backend's np.matmul fallback applies the same to GEMM operands.
VIEWS: dict[Op, Callable[[np.ndarray, Value], np.ndarray]] = {
    Op.RESHAPE: lambda a, v: a.reshape(v.shape),
    Op.PERMUTE: lambda a, v: np.transpose(a, v.attr("perm")),
    Op.EXPAND: lambda a, v: np.broadcast_to(a, v.shape),
    Op.SLICE: lambda a, v: a[slice_index(v)],
}


def _iota(v: Value) -> np.ndarray:
    axis = v.attr("axis")
    line = np.arange(v.shape[axis]).reshape([-1 if d == axis else 1 for d in range(v.ndim)])
    return np.broadcast_to(line.astype(v.dtype.np_dtype), v.shape)


def _checked(v: Value, idx: np.ndarray) -> np.ndarray:
    """``idx`` as int64 after the range check: IndexError naming the first bad index."""
    n = v.srcs[0].shape[v.attr("axis")]
    bad = (idx < 0) | (idx >= n)
    if bad.any():
        raise out_of_range(v, int(idx[bad].reshape(-1)[0]))
    return idx.astype(np.int64)


def _coords(v: Value, idx: np.ndarray) -> tuple[np.ndarray, ...]:
    """Full coordinates for each element of ``idx``: its own on every axis but ``axis``,
    ``idx`` there (broadcast index arrays, for NumPy's fancy indexing)."""
    axis = v.attr("axis")
    return tuple(idx if d == axis else
                 np.arange(n).reshape([-1 if e == d else 1 for e in range(idx.ndim)])
                 for d, n in enumerate(idx.shape))


def _gather(v: Value, x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    return x[_coords(v, _checked(v, idx))]


#: Each combining scatter's step as a NumPy ufunc (NumPy's maximum and minimum let a
#: NaN win, as the ISA's MAX and MIN do).
SCATTER_UFUNCS: dict[Op, np.ufunc] = {Op.ADD: np.add, Op.MUL: np.multiply,
                                     Op.MAX: np.maximum, Op.MIN: np.minimum}


def _scatter_combine(v: Value, base: np.ndarray, idx: np.ndarray,
                     src: np.ndarray) -> np.ndarray:
    # ufunc.at applies unbuffered, in idx's row-major order: per output element, in
    # ascending j[axis] (the order compiled kernels combine in).
    out = base.copy()
    SCATTER_UFUNCS[SCATTER_STEP[v.op]].at(out, _coords(v, _checked(v, idx)), src)
    return out


def _scatter(v: Value, base: np.ndarray, idx: np.ndarray, src: np.ndarray) -> np.ndarray:
    """Among indices naming one element the last in row-major order (the largest
    j[axis]: two such j agree off the axis) wins; NumPy's own assignment does not
    promise which duplicate wins, so the winners are picked explicitly."""
    out = base.copy()
    flat = np.ravel_multi_index(_coords(v, _checked(v, idx)), base.shape).reshape(-1)
    if flat.size:
        last = flat.size - 1 - np.unique(flat[::-1], return_index=True)[1]
        out.reshape(-1)[flat[last]] = src.reshape(-1)[last]
    return out


def _scan(v: Value, x: np.ndarray) -> np.ndarray:
    """Sequential inclusive prefix (NumPy's accumulate is a left fold); floats narrower
    than f64 accumulate in f64, as the CPU kernels (and ATen's CPU cumsum) do."""
    fn = np.cumsum if v.op is Op.CUMSUM else np.cumprod
    wide = np.float64 if v.dtype.is_float else x.dtype  # (ml_dtypes' bf16 is kind 'V')
    return fn(x, axis=v.attr("axis"), dtype=wide).astype(x.dtype)


def _argsort(v: Value, x: np.ndarray) -> np.ndarray:
    """Stable argsort along the axis. Ascending is NumPy's (NaN last, -0.0 equal to 0.0);
    descending sorts by (not NaN, then the negated key) with one stable lexsort, so NaN
    comes first and equal keys keep their order (``~x`` negates integers without
    overflow)."""
    axis = v.attr("axis")
    if not v.attr("descending"):
        r = np.argsort(x, axis=axis, kind="stable")
    else:
        y = np.moveaxis(x, axis, -1)
        if v.srcs[0].dtype.is_float:  # the ISA's kind: ml_dtypes' bf16 is NumPy kind 'V'
            nan = np.isnan(y)
            keys = (np.where(nan, 0, -y), ~nan)
        else:
            keys = (~y,)
        r = np.moveaxis(np.lexsort(keys, axis=-1), -1, axis)
    return r.astype(v.dtype.np_dtype)


#: Ops that read at computed coordinates or along an axis: value -> result.
INDEXING: dict[Op, Callable[..., np.ndarray]] = {
    Op.GATHER: _gather,
    **{op: _scatter_combine for op, step in SCATTER_STEP.items() if step is not None},
    Op.SCATTER: _scatter,
    Op.CUMSUM: _scan,
    Op.CUMPROD: _scan,
    Op.ARGSORT: _argsort,
}


def phi_offset(phi: tuple[int, int, int]) -> int:
    (_, n_cls), (_, n_page), (_, n_byte) = PHI_BOUNDS
    c, p, b = phi
    return (c * n_page + p) * n_byte


def arena_view(arena: np.ndarray | None, v: Value) -> np.ndarray:
    """The boundary-pool bytes a Φ-addressed LDG/STG touches, viewed as its dtype."""
    if arena is None:
        raise ShapeError(f"{v.op} uses Φ addressing but no boundary pool was given")
    off = phi_offset(v.attr("phi"))
    nbytes = v.size * v.dtype.itemsize
    if off + nbytes > arena.nbytes:
        raise ShapeError(
            f"{v.op} at Φ{v.attr('phi')} needs {nbytes} bytes from offset {off}, "
            f"past the {arena.nbytes}-byte boundary pool"
        )
    if off % v.dtype.itemsize:
        raise ShapeError(f"{v.op} at Φ{v.attr('phi')} is not aligned to {v.dtype}")
    return arena[off:off + nbytes].view(v.dtype.np_dtype).reshape(v.shape)


def evaluate(
    program: Program,
    inputs: Sequence[np.ndarray],
    arena: np.ndarray | None = None,
) -> tuple[list[np.ndarray], list[tuple[Value, np.ndarray]]]:
    """Compute every STG value: (outputs by index, Φ stores). Nothing is written yet,
    so an output that aliases an input reads the input's old contents."""
    env: dict[int, np.ndarray] = {}
    outs: dict[int, np.ndarray] = {}
    phi_stores: list[tuple[Value, np.ndarray]] = []
    with np.errstate(all="ignore"):
        for v in program.instructions:
            g = group(v.op)
            src = [env[id(s)] for s in v.srcs]
            if v.op is Op.LDG:
                phi = v.attr("phi")
                r = arena_view(arena, v).copy() if phi else inputs[v.attr("in")]
            elif v.op is Op.STG:
                val = np.asarray(src[0])
                if v.attr("phi") is not None:
                    phi_stores.append((v, val))
                else:
                    outs[v.attr("out")] = val
                continue
            elif g is Group.CONST:
                r = np.full(v.shape, v.attr("value"), dtype=v.dtype.np_dtype)
            elif g is Group.IOTA:
                r = _iota(v)
            elif v.op in INDEXING:
                r = INDEXING[v.op](v, *src)
            elif g is Group.UNARY:
                r = UNARY[v.op](src[0])
            elif g in (Group.BINARY, Group.COMPARE):
                r = BINARY[v.op](src[0], src[1])
            elif g in (Group.TERNARY, Group.SELECT):
                r = TERNARY[v.op](*src)
            elif g is Group.CAST:
                r = src[0].astype(v.dtype.np_dtype)
            elif g is Group.REDUCE:
                x = src[0]
                axes = v.attr("axes")
                extra = {"initial": _identity(v.op, x.dtype)} if x.size == 0 else {}
                r = REDUCE[v.op](x, axis=axes, keepdims=True, **extra)
            elif v.op in VIEWS:
                r = VIEWS[v.op](src[0], v)
            elif v.op is Op.CONCAT:
                r = np.concatenate(src, axis=v.attr("axis"))
            elif v.op is Op.GEMM:
                r = np.matmul(src[0], src[1])
            elif g is Group.ATTENTION:
                r = attention_reference.evaluate_part(v, src)
            else:  # pragma: no cover - every opcode has a row above
                raise NotImplementedError(v.op)
            env[id(v)] = np.asarray(r, dtype=v.dtype.np_dtype)
    return [outs[i] for i in range(len(outs))], phi_stores


class ReferenceBackend(Backend):
    name = "reference"

    def compile(self, program: Program) -> Program:
        program.verify()
        for v in program.instructions:
            if v.dtype.np_dtype is None:
                raise DTypeError(
                    f"{v.op}.{v.dtype}: NumPy has no {v.dtype} dtype here "
                    "(install ml_dtypes for bf16)"
                )
        return program

    def launch(self, compiled: Program, inputs, outputs, arena=None) -> None:
        results, phi_stores = evaluate(compiled, inputs, arena)
        for dst, val in zip(outputs, results, strict=True):
            np.copyto(dst, val, casting="unsafe")
        for v, val in phi_stores:
            np.copyto(arena_view(arena, v), val, casting="unsafe")
