"""The canonical rule sets: each a list of :class:`~.rewrite.Rule`, each rule exact.

"Exact" means the rewritten instruction produces the same bits as the original
under the reference semantics (NumPy's IEEE arithmetic) for f32 and f64 on every
input, NaN, infinities, -0.0 and denormals included. The one thing a rule may
change is the sign or payload of a NaN, which no ISA instruction can observe
(the text form and constants do not keep it either).

Rules deliberately left out, and why:

- ``x + 0.0 -> x``: -0.0 + 0.0 is +0.0. Only ``x + (-0.0)`` is an identity.
- ``x - (-0.0) -> x``: the same, since x - (-0.0) = x + 0.0.
- swapping MIN/MAX operands in general: on a tie between 0.0 and -0.0 NumPy
  returns the second operand, so ``min(a, b)`` and ``min(b, a)`` differ in the sign
  of a zero. They are only reordered when the constant operand is not a zero.
- ``pow(x, 1) -> x`` and ``pow(x, 2) -> x*x`` are exact for a correctly rounded
  pow (and are what NumPy's own ``x**1`` / ``x**2`` compute), but NumPy's
  array-array ``power`` on AVX-512 is not correctly rounded (x**2 differs from x*x
  in the last bit for a few percent of f32 and f64 inputs, and even x**1 != x for
  some f32); they are canonical all the same (x*x is the correctly rounded
  square), and tested against exact rationals: see ``POW_RULES``.
"""

from __future__ import annotations

import math

import numpy as np

from ..isa import builder as b
from ..isa.opcodes import GROUP, MOVEMENT, Group, Op
from ..isa.value import Value
from .rewrite import Bindings, Pat, Rule, const_scalar, order_key

ELEMENTWISE_OPS = frozenset(
    op for op, g in GROUP.items()
    if g in (Group.UNARY, Group.BINARY, Group.COMPARE, Group.TERNARY, Group.SELECT)
)

X = Pat(name="x")


def _const_value(arr: np.ndarray, kind: str) -> float | int | bool:
    x = arr.reshape(-1)[0]
    return {"f": float, "i": int, "b": bool}[kind](x)


def _as_array(v: Value) -> np.ndarray:
    return np.full((1,), v.attr("value"), dtype=v.dtype.np_dtype)


# --------------------------------------------------------------------------- constant folding

def _all_const(v: Value) -> bool:
    return bool(v.srcs) and all(
        s.op is Op.CONST and s.dtype.np_dtype is not None for s in v.srcs
    ) and v.dtype.np_dtype is not None


def _fold_elementwise(_: Bindings, node: Value) -> Value | None:
    # The reference interpreter's own tables, on one-element arrays: NumPy's loops
    # give the same bits for one element as for a whole array.
    from ..backends.reference import BINARY, TERNARY, UNARY

    g = GROUP[node.op]
    args = [_as_array(s) for s in node.srcs]
    with np.errstate(all="ignore"):
        if g is Group.UNARY:
            r = UNARY[node.op](args[0])
        elif g in (Group.BINARY, Group.COMPARE):
            r = BINARY[node.op](args[0], args[1])
        else:
            r = TERNARY[node.op](*args)
        r = np.asarray(r, dtype=node.dtype.np_dtype)
    return b.const(_const_value(r, node.dtype.kind), node.dtype, node.shape)


def _fold_cvt(bd: Bindings, node: Value) -> Value | None:
    c = bd["c"]
    src = _as_array(c)
    if node.dtype.kind in "ib" and c.dtype.kind == "f":
        x = float(src[0])
        if node.dtype.kind == "i":
            info = np.iinfo(node.dtype.np_dtype)
            # float -> int of NaN, inf or an out-of-range value is implementation-defined
            if not math.isfinite(x) or not info.min <= math.trunc(x) <= info.max:
                return None
    with np.errstate(all="ignore"):
        r = src.astype(node.dtype.np_dtype)
    return b.const(_const_value(r, node.dtype.kind), node.dtype, node.shape)


def _fold_movement(bd: Bindings, node: Value) -> Value:
    c = bd["c"]
    return b.const(c.attr("value"), c.dtype, node.shape)


FOLD_RULES: list[Rule] = [
    Rule("fold_elementwise", Pat(ops=ELEMENTWISE_OPS, where=_all_const), _fold_elementwise,
         "an element-wise op of constants is a constant"),
    Rule("fold_cvt", Pat(ops={Op.CVT}, srcs=(Pat(ops={Op.CONST}, name="c"),), where=_all_const),
         _fold_cvt, "cvt of a constant is a constant"),
    Rule("fold_movement", Pat(ops=MOVEMENT, srcs=(Pat(ops={Op.CONST}, name="c"),)),
         _fold_movement, "a reshape/expand/permute/slice of a constant is a constant of its shape"),
]


# --------------------------------------------------------------------------- identities

def _x(bd: Bindings, _: Value) -> Value:
    return bd["x"]


def _neg_x(bd: Bindings, _: Value) -> Value:
    return b.unary(Op.NEG, bd["x"])


def _abs_x(bd: Bindings, _: Value) -> Value:
    return b.unary(Op.ABS, bd["x"])


def _same_shape(v: Value) -> bool:
    return v.shape == v.srcs[0].shape


def _identity_perm(v: Value) -> bool:
    return v.attr("perm") == tuple(range(v.ndim))


def _reshape_reshape(bd: Bindings, node: Value) -> Value:
    return b.reshape(bd["x"], node.shape)


def _permute_permute(bd: Bindings, node: Value) -> Value:
    inner, outer = bd["p"].attr("perm"), node.attr("perm")
    return b.permute(bd["x"], tuple(inner[k] for k in outer))


def _expand_expand(bd: Bindings, node: Value) -> Value:
    return b.make(Op.EXPAND, (bd["x"],), None, node.dtype, node.shape)


IDENTITY_RULES: list[Rule] = [
    Rule("add_neg_zero", Pat(ops={Op.ADD}, srcs=(X, Pat(const=-0.0))), _x,
         "x + (-0.0) -> x (x + 0.0 is not an identity: -0.0 + 0.0 = +0.0)"),
    Rule("sub_zero", Pat(ops={Op.SUB}, srcs=(X, Pat(const=0.0))), _x, "x - 0.0 -> x"),
    Rule("mul_one", Pat(ops={Op.MUL}, srcs=(X, Pat(const=1.0))), _x, "x * 1 -> x"),
    Rule("div_one", Pat(ops={Op.DIV}, srcs=(X, Pat(const=1.0))), _x, "x / 1 -> x"),
    Rule("mul_neg_one", Pat(ops={Op.MUL}, srcs=(X, Pat(const=-1.0))), _neg_x,
         "x * -1 -> neg x"),
    Rule("neg_neg", Pat(ops={Op.NEG}, srcs=(Pat(ops={Op.NEG}, srcs=(X,)),)), _x,
         "neg(neg x) -> x"),
    Rule("abs_abs", Pat(ops={Op.ABS}, srcs=(Pat(ops={Op.ABS}, name="x"),)), _x,
         "abs(abs x) -> abs x"),
    Rule("abs_neg", Pat(ops={Op.ABS}, srcs=(Pat(ops={Op.NEG}, srcs=(X,)),)), _abs_x,
         "abs(neg x) -> abs x"),
    Rule("minmax_same", Pat(ops={Op.MIN, Op.MAX}, srcs=(X, X)), _x,
         "min(x, x) -> x, max(x, x) -> x"),
    Rule("sel_same", Pat(ops={Op.SEL}, srcs=(Pat(), X, X)), _x, "sel(c, x, x) -> x"),
    Rule("reshape_same", Pat(ops={Op.RESHAPE}, srcs=(X,), where=_same_shape), _x,
         "reshape to the same shape -> x"),
    Rule("reshape_reshape", Pat(ops={Op.RESHAPE}, srcs=(Pat(ops={Op.RESHAPE}, srcs=(X,)),)),
         _reshape_reshape, "reshape(reshape x) -> one reshape"),
    Rule("permute_identity", Pat(ops={Op.PERMUTE}, srcs=(X,), where=_identity_perm), _x,
         "identity permute -> x"),
    Rule("permute_permute",
         Pat(ops={Op.PERMUTE}, srcs=(Pat(ops={Op.PERMUTE}, name="p", srcs=(X,)),)),
         _permute_permute, "permute(permute x) -> one permute"),
    Rule("expand_same", Pat(ops={Op.EXPAND}, srcs=(X,), where=_same_shape), _x,
         "expand to the same shape -> x"),
    Rule("expand_expand", Pat(ops={Op.EXPAND}, srcs=(Pat(ops={Op.EXPAND}, srcs=(X,)),)),
         _expand_expand, "expand(expand x) -> one expand"),
]


# --------------------------------------------------------------------------- ordering

def _unordered(v: Value) -> bool:
    return order_key(v.srcs[1]) < order_key(v.srcs[0])


def _swap01(_: Bindings, node: Value) -> Value:
    s = node.srcs
    return b.make(node.op, (s[1], s[0], *s[2:]), dict(node.attrs), node.dtype, node.shape)


def _nonzero_const_first(v: Value) -> bool:
    c, x = v.srcs
    if c.op is not Op.CONST or x.op is Op.CONST:
        return False
    val = const_scalar(c)
    return val is not None and val != 0  # NaN != 0 too: a NaN constant wins either way


ORDER_RULES: list[Rule] = [
    Rule("order_commutative", Pat(ops={Op.ADD, Op.MUL, Op.CMPEQ}, where=_unordered), _swap01,
         "commutative operands sorted by structural key, constants last"),
    Rule("order_mad_factors", Pat(ops={Op.MAD, Op.FMA}, where=_unordered), _swap01,
         "the two factors of mad/fma sorted by structural key, constants last"),
    Rule("order_minmax_const", Pat(ops={Op.MIN, Op.MAX}, where=_nonzero_const_first), _swap01,
         "min/max(c, x) -> min/max(x, c) when c is not a zero (a 0.0/-0.0 tie returns "
         "the second operand, so zeros stay where they are)"),
]


# --------------------------------------------------------------------------- strength reduction

def _pow2_with_normal_recip(v: Value) -> bool:
    c = const_scalar(v)
    if c is None or v.dtype.kind != "f" or not np.isfinite(c) or c == 0:
        return False
    m, _ = np.frexp(c)
    if abs(float(m)) != 0.5:
        return False
    info = np.finfo(v.dtype.np_dtype)
    tiny, big = float(info.tiny), float(info.max)
    mag = abs(float(c))
    return tiny <= mag <= big and tiny <= 1.0 / mag <= big


def _div_to_mul(bd: Bindings, node: Value) -> Value:
    c = bd["c"]
    recip = 1.0 / float(const_scalar(c))  # exact: c is a power of two
    return b.make(Op.MUL, (bd["x"], b.const(recip, c.dtype, c.shape)))


def _mad(bd: Bindings, node: Value) -> Value:
    return b.make(Op.MAD, (bd["a"], bd["b"], bd["c"]))


STRENGTH_RULES: list[Rule] = [
    Rule("div_pow2",
         Pat(ops={Op.DIV}, srcs=(X, Pat(ops={Op.CONST}, name="c", where=_pow2_with_normal_recip))),
         _div_to_mul, "x / c -> x * (1/c) for a power of two c with a normal reciprocal"),
    Rule("mul_add_to_mad",
         Pat(ops={Op.ADD}, kind="f", commutative=True,
             srcs=(Pat(ops={Op.MUL}, srcs=(Pat(name="a"), Pat(name="b"))), Pat(name="c"))),
         _mad, "add(mul(a, b), c) -> mad(a, b, c), either operand order (mad rounds twice)"),
]


# --------------------------------------------------------------------------- opt-in: pow

def _mul_self(bd: Bindings, _: Value) -> Value:
    return b.make(Op.MUL, (bd["x"], bd["x"]))


POW_RULES: list[Rule] = [
    Rule("pow_one", Pat(ops={Op.POW}, srcs=(X, Pat(const=1.0))), _x,
         "pow(x, 1) -> x (exact for a correctly rounded pow; not NumPy's AVX-512 power)"),
    Rule("pow_two", Pat(ops={Op.POW}, srcs=(X, Pat(const=2.0))), _mul_self,
         "pow(x, 2) -> x * x (exact for a correctly rounded pow; not NumPy's AVX-512 power)"),
]

# Rules that are bit-exact against the reference interpreter.
EXACT_RULES: list[Rule] = [*FOLD_RULES, *IDENTITY_RULES, *ORDER_RULES, *STRENGTH_RULES]
# The canonical set, in the order they are tried on each instruction. The pow rules
# are exact against a correctly rounded pow and so more accurate than NumPy's
# AVX-512 power, which the reference uses: they differ from it by a few ulp.
CANONICAL_RULES: list[Rule] = [*EXACT_RULES, *POW_RULES]
# Every rule defined here (tests cover each one).
ALL_RULES: list[Rule] = CANONICAL_RULES

RULE_SETS: dict[str, list[Rule]] = {
    "fold": FOLD_RULES,
    "identity": IDENTITY_RULES,
    "order": ORDER_RULES,
    "strength": STRENGTH_RULES,
    "pow": POW_RULES,
}

__all__ = [
    "ALL_RULES", "CANONICAL_RULES", "ELEMENTWISE_OPS", "EXACT_RULES", "FOLD_RULES",
    "IDENTITY_RULES",
    "ORDER_RULES", "POW_RULES", "RULE_SETS", "STRENGTH_RULES",
]
