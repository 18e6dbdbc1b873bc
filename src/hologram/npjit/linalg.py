"""matmul, dot, einsum, tensordot, outer, inner, vdot, vecdot and vector norms on
traced values.

Every contraction goes through ``contract``: the operands are permuted and reshaped
to ``[batch, m, k] @ [batch, k, n]`` and multiplied by one GEMM (float dtypes; BLAS on
the CPU), or, for integer and bool dtypes, which BLAS has no GEMM for, multiplied
element-wise and summed over ``k`` in the integer dtype, so results stay exact.
"""

from __future__ import annotations

import math
import string
from typing import Any

import numpy as np

from ..isa import builder as B
from ..isa import dtypes as D
from ..isa.opcodes import Op
from ..isa.value import Value
from . import logic as L
from . import shapes as S
from .dtypes import result_type
from .errors import unsupported
from .lift import value
from .reductions import axes_of


def _gemm(a: Value, b: Value) -> Value:
    """``[bt, m, k] @ [bt, k, n]`` in any dtype (zero sizes give zeros, no kernel)."""
    bt, m, k = a.shape
    n = b.shape[2]
    if bt * m * n == 0 or k == 0:
        return B.const(0 if a.dtype is not D.boolean else False, a.dtype, (bt, m, n))
    if a.dtype.is_float:
        return B.gemm(a, b)
    work = D.i64 if a.dtype is D.boolean else a.dtype
    prod = L.ew(Op.MUL, B.expand(B.reshape(B.cast(a, work), (bt, m, k, 1)), (bt, m, k, n)),
                B.expand(B.reshape(B.cast(b, work), (bt, 1, k, n)), (bt, m, k, n)))
    r = B.reshape(B.make(Op.RSUM, (prod,), {"axes": (2,)}), (bt, m, n))
    return L.lt(L.k(0, D.i64), r) if a.dtype is D.boolean else r


def _sum_out(x: Value, letters: str, keep: set[str]) -> tuple[Value, str]:
    gone = tuple(i for i, c in enumerate(letters) if c not in keep)
    if not gone:
        return x, letters
    work = B.cast(x, D.i64) if x.dtype is D.boolean else x
    r = B.make(Op.RSUM, (work,), {"axes": gone})
    r = B.reshape(r, tuple(n for i, n in enumerate(x.shape) if i not in gone))
    r = L.lt(L.k(0, D.i64), r) if x.dtype is D.boolean else r
    return r, "".join(c for c in letters if c in keep)


def contract(a: Value, sa: str, b: Value, sb: str, out: str, func: str) -> Value:
    """``einsum(f"{sa},{sb}->{out}", a, b)`` as one GEMM (or an integer multiply-sum)."""
    sizes: dict[str, int] = {}
    for x, s, arg in ((a, sa, "operands[0]"), (b, sb, "operands[1]")):
        for c, n in zip(s, x.shape, strict=True):
            if sizes.setdefault(c, n) != n:
                raise unsupported(func, arg, f"size of label '{c}' is {n}, elsewhere "
                                             f"{sizes[c]}")
    a, sa = _sum_out(a, sa, set(sb) | set(out))
    b, sb = _sum_out(b, sb, set(sa) | set(out))
    batch = [c for c in out if c in sa and c in sb]
    con = [c for c in sa if c in sb and c not in out]
    af = [c for c in sa if c not in sb]
    bf = [c for c in sb if c not in sa]
    pa = B.permute(a, [sa.index(c) for c in (*batch, *af, *con)])
    pb = B.permute(b, [sb.index(c) for c in (*batch, *con, *bf)])
    nb, m, k, n = (math.prod(sizes[c] for c in g) for g in (batch, af, con, bf))
    r = _gemm(B.reshape(pa, (nb, m, k)), B.reshape(pb, (nb, k, n)))
    have = (*batch, *af, *bf)
    r = B.reshape(r, tuple(sizes[c] for c in have))
    return B.permute(r, [have.index(c) for c in out])


def _parse(subscripts: str, ndims: list[int]) -> tuple[list[str], str]:
    """Each operand's labels and the output's, with every ``...`` spelled out as letters
    the subscripts do not use: the broadcast axes, aligned from the right as NumPy
    aligns them (an operand with fewer gets the last ones); an implicit output lists
    them first, then the labels used once, sorted."""
    s = subscripts.replace(" ", "")
    lhs, arrow, rhs = s.partition("->")
    ins = lhs.split(",")
    if len(ins) != len(ndims):
        raise unsupported("einsum", "subscripts", f"{len(ins)} operand labels for "
                                                  f"{len(ndims)} operands")
    for t in (*ins, rhs):
        if t.count("...") > 1 or t.replace("...", "").count("."):
            raise unsupported("einsum", "subscripts", f"{t!r}: at most one '...' per "
                                                      "operand")
    spare = [c for c in string.ascii_letters if c not in s]
    extra = [max(0, nd - len(t.replace("...", ""))) if "..." in t else 0
             for t, nd in zip(ins, ndims, strict=True)]
    dots = "".join(spare[:max(extra, default=0)])
    ins = [t.replace("...", dots[len(dots) - e:] if e else "")
           for t, e in zip(ins, extra, strict=True)]
    if arrow:
        rhs = rhs.replace("...", dots)
    else:
        joined = "".join(ins)
        rhs = dots + "".join(sorted(c for c in dict.fromkeys(joined)
                                    if joined.count(c) == 1 and c not in dots))
    for t in (*ins, rhs):
        if not all(c in string.ascii_letters for c in t):
            raise unsupported("einsum", "subscripts", f"{t!r}: labels must be letters")
    if len(set(rhs)) != len(rhs):
        raise unsupported("einsum", "subscripts", f"output {rhs!r} repeats a label")
    return ins, rhs


def _diagonals(v: Value, labels: str) -> tuple[Value, str]:
    """An operand whose labels repeat (``ii``, ``iij``) as its diagonals: each repeated
    label's axes replaced by one, as NumPy's einsum reads them."""
    while len(set(labels)) != len(labels):
        c = next(c for c in labels if labels.count(c) > 1)
        a1 = labels.index(c)
        a2 = labels.index(c, a1 + 1)
        if v.shape[a1] != v.shape[a2]:
            raise unsupported("einsum", "subscripts", f"label {c!r} repeats over axes of "
                                                      f"sizes {v.shape[a1]} and "
                                                      f"{v.shape[a2]}")
        v = S.diagonal(v, a1, a2)
        labels = "".join(x for i, x in enumerate(labels) if i not in (a1, a2)) + c
    return v, labels


def _broadcast(vals: list[Value], ins: list[str]) -> list[Value]:
    """Operands whose labels have size 1 where another operand's has more, expanded
    (NumPy broadcasts the axes ``...`` stands for)."""
    size: dict[str, int] = {}
    for v, t in zip(vals, ins, strict=True):
        for c, n in zip(t, v.shape, strict=True):
            size[c] = n if size.get(c, 1) == 1 else size[c]
    out = []
    for v, t in zip(vals, ins, strict=True):
        want = tuple(size[c] if n == 1 else n for c, n in zip(t, v.shape, strict=True))
        out.append(B.expand(v, want) if want != v.shape else v)
    return out


def einsum(subscripts: Any, *operands: Any, out: Any = None, dtype: Any = None,
           optimize: Any = False, **kw: Any) -> Value:
    if out is not None:
        raise unsupported("einsum", "out", "traced results are new values; drop out=")
    if not isinstance(subscripts, str):
        raise unsupported("einsum", "subscripts", "only the string form is traced")
    d = np.dtype(dtype) if dtype is not None else result_type(*operands)
    vals = [value(x, "einsum", f"operands[{i}]", d) for i, x in enumerate(operands)]
    ins, rhs = _parse(subscripts, [v.ndim for v in vals])
    for v, s, i in zip(vals, ins, range(len(ins)), strict=True):
        if v.ndim != len(s):
            raise unsupported("einsum", f"operands[{i}]", f"{len(s)} labels for "
                                                          f"{v.ndim} dimensions")
    pairs = [_diagonals(v, t) for v, t in zip(vals, ins, strict=True)]
    ins = [t for _, t in pairs]
    vals = _broadcast([v for v, _ in pairs], ins)
    if len(vals) == 1:
        r, s = _sum_out(vals[0], ins[0], set(rhs))
        if set(rhs) - set(s):
            raise unsupported("einsum", "subscripts", f"output label not in the inputs: "
                                                      f"{rhs!r}")
        return B.permute(r, [s.index(c) for c in rhs])
    acc, sacc = vals[0], ins[0]
    for j in range(1, len(vals)):
        later = set(rhs).union(*ins[j + 1:])
        keep = "".join(dict.fromkeys(c for c in sacc + ins[j] if c in later))
        acc = contract(acc, sacc, vals[j], ins[j], keep, "einsum")
        sacc = keep
    return B.permute(acc, [sacc.index(c) for c in rhs])


def matmul(a: Value, b: Value) -> Value:
    if a.ndim == 0 or b.ndim == 0:
        raise unsupported("matmul", "x1" if a.ndim == 0 else "x2", "matmul needs operands "
                                                                     "of rank >= 1")
    if a.dtype.is_float and a.size and b.size and a.shape[-1]:
        return B.matmul(a, b)
    row, col = a.ndim == 1, b.ndim == 1
    a2 = B.reshape(a, (1, *a.shape)) if row else a
    b2 = B.reshape(b, (*b.shape, 1)) if col else b
    if a2.shape[-1] != b2.shape[-2]:
        raise unsupported("matmul", "x2", f"inner sizes differ: {list(a.shape)} @ "
                                          f"{list(b.shape)}")
    batch = B.broadcast_shape(a2.shape[:-2], b2.shape[:-2])
    m, k, n = a2.shape[-2], a2.shape[-1], b2.shape[-1]
    nb = math.prod(batch)
    r = _gemm(B.reshape(B.expand(a2, (*batch, m, k)), (nb, m, k)),
              B.reshape(B.expand(b2, (*batch, k, n)), (nb, k, n)))
    return B.reshape(r, (*batch, *(() if row else (m,)), *(() if col else (n,))))


def vecdot(a: Value, b: Value) -> Value:
    shape = B.broadcast_shape(a.shape, b.shape)
    a, b = B.expand(a, shape), B.expand(b, shape)
    if a.dtype is D.boolean:
        return L.lt(L.k(0, D.i64), B.reshape(B.make(Op.RSUM, (B.cast(L.and_(a, b), D.i64),),
                                                   {"axes": (len(shape) - 1,)}), shape[:-1]))
    return B.reduce(Op.RSUM, L.ew(Op.MUL, a, b), len(shape) - 1)


def tensordot(a: Any, b: Any, axes: Any = 2) -> Value:
    d = result_type(a, b)
    va, vb = value(a, "tensordot", "a", d), value(b, "tensordot", "b", d)
    if isinstance(axes, (int, np.integer)):
        n = int(axes)
        ax_a, ax_b = list(range(va.ndim - n, va.ndim)), list(range(n))
    else:
        ax_a, ax_b = (list(np.atleast_1d(x).tolist()) for x in axes)
    ax_a = [axes_of(x, va.ndim, "tensordot")[0] for x in ax_a]
    ax_b = [axes_of(x, vb.ndim, "tensordot")[0] for x in ax_b]
    letters = iter(string.ascii_letters)
    sa = [next(letters) for _ in range(va.ndim)]
    sb = [next(letters) for _ in range(vb.ndim)]
    for i, j in zip(ax_a, ax_b, strict=True):
        sb[j] = sa[i]
    out = "".join(c for i, c in enumerate(sa) if i not in ax_a) + \
        "".join(c for j, c in enumerate(sb) if j not in ax_b)
    return contract(va, "".join(sa), vb, "".join(sb), out, "tensordot")


def dot(a: Any, b: Any, out: Any = None) -> Value:
    if out is not None:
        raise unsupported("dot", "out", "traced results are new values; drop out=")
    d = result_type(a, b)
    va, vb = value(a, "dot", "a", d), value(b, "dot", "b", d)
    if va.ndim == 0 or vb.ndim == 0:
        return L.and_(va, vb) if va.dtype is D.boolean else L.ew(Op.MUL, va, vb)
    if vb.ndim == 1:
        return tensordot(_v(va), _v(vb), ([-1], [0]))
    return tensordot(_v(va), _v(vb), ([-1], [-2]))


def _v(x: Value) -> Any:
    from ..isa.builder import Var
    return Var(x)


def outer(a: Any, b: Any, out: Any = None) -> Value:
    if out is not None:
        raise unsupported("outer", "out", "traced results are new values; drop out=")
    d = result_type(a, b)
    va, vb = value(a, "outer", "a", d), value(b, "outer", "b", d)
    va, vb = B.reshape(va, (va.size, 1)), B.reshape(vb, (1, vb.size))
    return L.and_(va, vb) if va.dtype is D.boolean else L.ew(Op.MUL, va, vb)


def inner(a: Any, b: Any) -> Value:
    return tensordot(a, b, ([-1], [-1])) if np.ndim(a) and np.ndim(b) else dot(a, b)


def vdot(a: Any, b: Any) -> Value:
    d = result_type(a, b)
    va, vb = value(a, "vdot", "a", d), value(b, "vdot", "b", d)
    return dot(_v(B.reshape(va, (va.size,))), _v(B.reshape(vb, (vb.size,))))


def norm(x: Any, ord: Any = None, axis: Any = None, keepdims: bool = False) -> Value:
    """``np.linalg.norm`` for vector norms (ord None, 2, 1, inf, -inf, 0) and the
    Frobenius norm; matrix 2-norms and nuclear norms need an SVD and are refused."""
    v = value(x, "linalg.norm", "x")
    if not v.dtype.is_float:
        v = B.cast(v, D.f64)
    if axis is None and ord is not None and v.ndim != 1:
        if not (ord == "fro" and v.ndim == 2):
            raise unsupported("linalg.norm", "ord", f"ord={ord!r} over a {v.ndim}-D array "
                                                    "is not traced")
    if isinstance(axis, tuple) and len(axis) == 2 and ord not in (None, "fro"):
        raise unsupported("linalg.norm", "ord", f"matrix norm ord={ord!r} is not traced")
    axes = axes_of(axis, v.ndim, "linalg.norm")
    a = B.unary(Op.ABS, v)
    if ord in (None, 2, "fro"):
        return B.unary(Op.SQRT, B.reduce(Op.RSUM, L.ew(Op.MUL, v, v), axes, keepdims))
    if ord == 1:
        return B.reduce(Op.RSUM, a, axes, keepdims)
    if ord == np.inf:
        return B.reduce(Op.RMAX, a, axes, keepdims)
    if ord == -np.inf:
        return B.reduce(Op.RMIN, a, axes, keepdims)
    if ord == 0:
        return B.reduce(Op.RSUM, B.cast(L.truth(v), v.dtype), axes, keepdims)
    if isinstance(ord, (int, float)):
        p = L.k(float(ord), v)
        s = B.reduce(Op.RSUM, L.ew(Op.POW, a, p), axes, keepdims)
        return L.ew(Op.POW, s, L.k(1.0 / float(ord), v))
    raise unsupported("linalg.norm", "ord", f"ord={ord!r} is not traced")


__all__ = ["contract", "dot", "einsum", "inner", "matmul", "norm", "outer", "tensordot",
           "vdot", "vecdot"]
