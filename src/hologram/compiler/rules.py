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
from ..isa.dtypes import INTEGERS
from ..isa.opcodes import (
    ATTENTION_OPERANDS,
    ATTENTION_PART,
    GROUP,
    MOVEMENT,
    REDUCE_IDENTITY,
    SCATTER_STEP,
    Group,
    Op,
)
from ..isa.value import Shape, Value
from .rewrite import ORDER_PARTS, Bindings, Pat, Rule, const_scalar

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


def _signed(v: Value) -> bool:
    return v.dtype.kind != "i" or v.dtype.signed


#: Ops whose result is integral when every (value) operand is: rounding an integral
#: real to float gives an integral float (every float from 2^23 (f32) or 2^52 (f64) up
#: is an integer, and integers below are exact), or an infinity; SEL's condition and the
#: movement ops' layout do not matter.
_INTEGRAL_KEEPING = frozenset({Op.NEG, Op.ABS, Op.ADD, Op.SUB, Op.MUL, Op.MAD, Op.FMA,
                               Op.MIN, Op.MAX, Op.RSUM, Op.RMAX, Op.RMIN, Op.CVT,
                               *MOVEMENT})
#: Ops whose float result is integral whatever their operands.
_INTEGRAL_ALWAYS = frozenset({Op.FLOOR, Op.CEIL, Op.TRUNC, Op.RINT, Op.IOTA})


def _integral(v: Value, depth: int = 24) -> bool:
    """Whether every element of float ``v`` is an integer, infinite or NaN by
    construction (so rounding it changes nothing): integer or bool values converted,
    integral constants, rounding ops, IOTA, and sums, products, extremes, negations and
    movements of such. ``depth`` bounds the walk (index arithmetic is shallow)."""
    if v.dtype.kind != "f" or v.op in _INTEGRAL_ALWAYS:  # integers and bools included
        return True
    if v.op is Op.CVT and v.srcs[0].dtype.kind != "f":  # an integer or bool converted
        return True
    if v.op is Op.CONST:
        x = float(v.attr("value"))
        return not math.isfinite(x) or x == math.floor(x)
    if depth <= 0:
        return False
    if v.op is Op.SEL:
        return all(_integral(s, depth - 1) for s in v.srcs[1:])
    return v.op in _INTEGRAL_KEEPING and all(_integral(s, depth - 1) for s in v.srcs)


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


def _not_c(bd: Bindings, _: Value) -> Value:
    return b.unary(Op.NOT, bd["c"])


def _or_cq(bd: Bindings, _: Value) -> Value:
    return b.elementwise(Op.OR, bd["c"], bd["q"])


def _and_cp(bd: Bindings, _: Value) -> Value:
    return b.elementwise(Op.AND, bd["c"], bd["p"])


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
    Rule("abs_neg", Pat(ops={Op.ABS}, srcs=(Pat(ops={Op.NEG}, srcs=(X,)),), where=_signed),
         _abs_x, "abs(neg x) -> abs x (not unsigned: abs is the identity there, neg wraps)"),
    Rule("minmax_same", Pat(ops={Op.MIN, Op.MAX}, srcs=(X, X)), _x,
         "min(x, x) -> x, max(x, x) -> x"),
    Rule("sel_same", Pat(ops={Op.SEL}, srcs=(Pat(), X, X)), _x, "sel(c, x, x) -> x"),
    # Logic spelled as selects (ATen's `a | isnan(b)` as lowered) becomes the logic ops:
    # GCC vectorizes `!c` and `a | b` on _Bool but not `c ? 0 : 1` and `a ? 1 : b`,
    # and one such chain kept a whole kernel scalar (ResNet-18's max pool with
    # indices, 4.5 ms of a 60 ms forward; docs/perf.md, session 21).
    Rule("sel_not", Pat(ops={Op.SEL}, kind="b", srcs=(Pat(name="c"), Pat(const=False, kind="b"),
                                                    Pat(const=True, kind="b"))),
         _not_c, "sel(c, false, true) -> not c (bool)"),
    Rule("sel_or", Pat(ops={Op.SEL}, kind="b", srcs=(Pat(name="c"), Pat(const=True, kind="b"),
                                                   Pat(name="q"))),
         _or_cq, "sel(c, true, q) -> c or q (bool)"),
    Rule("sel_and", Pat(ops={Op.SEL}, kind="b", srcs=(Pat(name="c"), Pat(name="p"),
                                                    Pat(const=False, kind="b"))),
         _and_cp, "sel(c, p, false) -> c and p (bool)"),
    # An index computed in float (pooling's window starts) is rounded by construction
    # already; GCC will not vectorize a loop whose select reads a ceil() (ResNet-18's
    # training max pool with indices, 4.8 ms scalar; docs/perf.md, session 22).
    Rule("round_integral", Pat(ops={Op.FLOOR, Op.CEIL, Op.TRUNC, Op.RINT},
                               srcs=(Pat(name="x", where=_integral),)),
         _x, "floor/ceil/trunc/rint(x) -> x for an integral x"),
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


# --------------------------------------------------------------------------- layout

def _layout_free(v: Value) -> bool:
    """A constant fill, or a broadcast of a program input or constant (a bias, a
    scale), possibly permuted: read in another layout it stays a view of the same few
    numbers, so moving a permute or reshape onto it costs nothing. A broadcast of a
    computed value is not: a layer norm's statistics are reductions along the rows of
    the layout they were computed in, and normalizing in another layout made the
    scheduler store them apart or recompute them per element (ConvNeXt-atto at batch 8
    ran 0.95x the time with them counted free, 0.88x without; docs/perf.md)."""
    while v.op is Op.PERMUTE:
        v = v.srcs[0]
    if v.op is Op.CONST:
        return True
    if v.op is not Op.EXPAND:
        return False
    v = v.srcs[0]
    while v.op in (Op.RESHAPE, Op.PERMUTE, Op.EXPAND):
        v = v.srcs[0]
    return v.op in (Op.LDG, Op.CONST)


def _data_perm(v: Value) -> tuple[int, ...] | None:
    """The permute every operand of ``v`` that carries data goes through, when they all
    go through the same one and the rest are layout-free: the op can then run in its
    operands' own layout and be permuted after. None otherwise."""
    perms = {s.attr("perm") for s in v.srcs if s.op is Op.PERMUTE and not _layout_free(s)}
    if len(perms) != 1 or not all(_layout_free(s) or s.op is Op.PERMUTE for s in v.srcs):
        return None
    return perms.pop()


def _sinkable_permute(v: Value) -> bool:
    return _data_perm(v) is not None


def _sink_permute(_: Bindings, node: Value) -> Value:
    perm = _data_perm(node)
    assert perm is not None
    inverse = tuple(perm.index(i) for i in range(len(perm)))
    shape = tuple(node.shape[i] for i in inverse)

    def unpermuted(s: Value) -> Value:
        if s.op is Op.PERMUTE and s.attr("perm") == perm:
            return s.srcs[0]
        if s.op is Op.CONST:
            return b.const(s.attr("value"), s.dtype, shape)
        if s.op is Op.EXPAND and s.srcs[0].ndim == s.ndim:  # permute the small source
            return b.expand(b.permute(s.srcs[0], inverse), shape)
        return b.permute(s, inverse)

    srcs = tuple(unpermuted(s) for s in node.srcs)
    inner = b.make(node.op, srcs, dict(node.attrs), node.dtype, shape)
    return b.permute(inner, perm)


def _split_groups(src: Shape, shape: Shape) -> list[list[int]] | None:
    """For a reshape that only splits dims (each dim of ``src`` becomes one or more
    consecutive dims of ``shape``, unit dims aside): the dims of ``shape`` each dim of
    ``src`` becomes. None for a reshape that merges dims, or one that moves nothing."""
    if 0 in src or 0 in shape:
        return None
    groups: list[list[int]] = []
    j = 0
    for a in src:
        dims: list[int] = []
        prod = 1
        while prod < a and j < len(shape):
            prod *= shape[j]
            dims.append(j)
            j += 1
        if prod != a:
            return None
        groups.append(dims)
    if any(s != 1 for s in shape[j:]):
        return None
    if not any(sum(1 for d in g if shape[d] != 1) > 1 for g in groups):
        return None
    return groups


def _unsplit(s: Value, src: Shape, groups: list[list[int]]) -> Value | None:
    """Operand ``s`` of an op over a split reshape, expressed over the unsplit shape
    ``src``, when it is layout-free there: a constant, or a broadcast whose every split
    group is wholly broadcast or wholly present."""
    if s.op is Op.CONST:
        return b.const(s.attr("value"), s.dtype, src)
    if not _layout_free(s) or s.op is not Op.EXPAND or s.srcs[0].ndim != s.ndim:
        return None
    e = s.srcs[0]
    dims = []
    for a, g in zip(src, groups, strict=True):
        live = [d for d in g if s.shape[d] != 1]
        if all(e.shape[d] == s.shape[d] for d in live):
            dims.append(a)
        elif all(e.shape[d] == 1 for d in live):
            dims.append(1)
        else:
            return None
    return b.expand(b.reshape(e, tuple(dims)), src)


def _split_of(v: Value) -> tuple[Shape, list[list[int]]] | None:
    """(the unsplit shape, :func:`_split_groups`) when every reshaped operand of ``v``
    splits one same shape into ``v``'s; None otherwise."""
    real = [s.srcs[0].shape for s in v.srcs if s.op is Op.RESHAPE]
    if not real or any(r != real[0] for r in real):
        return None
    groups = _split_groups(real[0], v.shape)
    return None if groups is None else (real[0], groups)


def _sinkable_reshape(v: Value) -> bool:
    return _split_of(v) is not None


def _sink_reshape(_: Bindings, node: Value) -> Value | None:
    """None (declined) when an operand other than the reshapes does not split alike."""
    split = _split_of(node)
    assert split is not None
    src, groups = split
    srcs = tuple(s.srcs[0] if s.op is Op.RESHAPE else _unsplit(s, src, groups)
                 for s in node.srcs)
    if any(s is None for s in srcs):
        return None
    inner = b.make(node.op, srcs, dict(node.attrs), node.dtype, src)
    return b.reshape(inner, node.shape)


LAYOUT_RULES: list[Rule] = [
    Rule("sink_permute", Pat(ops=ELEMENTWISE_OPS, where=_sinkable_permute), _sink_permute,
         "op(permute(x, p), c) -> permute(op(x, permute(c, p^-1)), p) when every other "
         "operand is a constant or a broadcast: element-wise work runs in the layout its "
         "data has, so a permute back (a 1x1 convolution's GEMM over the batch feeding "
         "the next one through GELU) cancels instead of costing two copies"),
    Rule("sink_split_reshape", Pat(ops=ELEMENTWISE_OPS, where=_sinkable_reshape),
         _sink_reshape,
         "op(reshape(x), c) -> reshape(op(x, c'), shape) for a reshape that splits dims, "
         "when every other operand is a constant or a broadcast that splits alike: the "
         "op runs over x's longer rows (a GEMM's [640, 1568] product read as [640, 8, "
         "14, 14] ran its GELU in rows of 14)"),
]


# --------------------------------------------------------------------------- ordering

def _unordered(v: Value) -> bool:
    """Whether operand 1 sorts before operand 0 by ``order_key``, compared one part at a
    time: the whole-form and structural digests are walked only between operands whose
    near forms tie."""
    a, b_ = v.srcs[1], v.srcs[0]
    for part in ORDER_PARTS:
        ka, kb = part(a), part(b_)
        if ka != kb:
            return ka < kb
    return False


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


# --------------------------------------------------------------------------- empty arrays

# The groups whose meaning on empty operands these rules settle. Ops of other groups are
# left alone, and so is anything computed from them (folding would drop them): a gather
# from an empty table into a non-empty result, or a scatter of values into an empty one,
# is an index error, not an empty value, and its own checks must report it.
_EMPTY_GROUPS = frozenset({Group.UNARY, Group.BINARY, Group.COMPARE, Group.TERNARY,
                           Group.SELECT, Group.CAST, Group.REDUCE, Group.MOVEMENT,
                           Group.CONCAT, Group.GEMM})
EMPTY_KNOWN_OPS = frozenset(op for op, g in GROUP.items() if g in _EMPTY_GROUPS)
_EMPTY_LEAVES = frozenset({Op.LDG, Op.CONST})


def _only_known(v: Value) -> bool:
    """Whether ``v`` is computed from known ops only (walked only for empty values)."""
    return all(x.op in EMPTY_KNOWN_OPS or x.op in _EMPTY_LEAVES for x in v.walk())


def _is_empty(v: Value) -> bool:
    return v.size == 0


def _empty_and_known(v: Value) -> bool:
    return v.size == 0 and _only_known(v)


def _reduces_nothing(v: Value) -> bool:
    return v.size > 0 and v.srcs[0].size == 0 and _only_known(v)


def _empty_inner(v: Value) -> bool:
    return v.size > 0 and v.srcs[0].shape[-1] == 0 and _only_known(v)


def _has_empty_part(v: Value) -> bool:
    return v.size > 0 and any(p.size == 0 for p in v.srcs) and _only_known(v)


def _empty_const(_: Bindings, node: Value) -> Value:
    return b.const(0, node.dtype, node.shape)


def _reduce_identity(_: Bindings, node: Value) -> Value:
    ident = REDUCE_IDENTITY[node.op]
    if node.dtype.kind == "i" and math.isinf(ident):  # the reference's initial for ints
        info = np.iinfo(node.dtype.np_dtype)
        ident = info.min if ident < 0 else info.max
    return b.const(ident, node.dtype, node.shape)


def _drop_empty_parts(_: Bindings, node: Value) -> Value:
    return b.concat([p for p in node.srcs if p.size], node.attr("axis"))


EMPTY_RULES: list[Rule] = [
    Rule("empty_value", Pat(ops=EMPTY_KNOWN_OPS, where=_empty_and_known), _empty_const,
         "a computed value with no elements is a constant of its shape: no kernel may "
         "read or write it (an empty operand's pointer may be null)"),
    Rule("empty_reduce", Pat(ops=frozenset(REDUCE_IDENTITY), where=_reduces_nothing),
         _reduce_identity,
         "a reduction over no elements is the reduction's identity (NumPy's initial: "
         "sum 0, prod 1, max -inf, min +inf; an integer's min/max for ints)"),
    Rule("empty_gemm", Pat(ops={Op.GEMM}, where=_empty_inner), _empty_const,
         "a matrix product with inner size 0 is an empty sum: +0.0 everywhere"),
    Rule("empty_concat_part", Pat(ops={Op.CONCAT}, where=_has_empty_part), _drop_empty_parts,
         "a concat's empty parts contribute nothing: dropped (one part left is itself)"),
]


# --------------------------------------------------------------------------- attention

ATTENTION_OPS = frozenset(op for op, g in GROUP.items() if g is Group.ATTENTION)


def _attention_operand(v: Value, name: str) -> Value:
    return v.srcs[ATTENTION_OPERANDS[ATTENTION_PART[v.op][0]].index(name)]


def _no_keys_or_queries(v: Value) -> bool:
    return v.size > 0 and 0 in (_attention_operand(v, "q").shape[-2],
                                _attention_operand(v, "k").shape[-2])


def _empty_features(v: Value) -> bool:
    q, vv = _attention_operand(v, "q"), _attention_operand(v, "v")
    return (v.size > 0 and 0 in (q.shape[-1], vv.shape[-1]) and q.shape[-2] > 0
            and _attention_operand(v, "k").shape[-2] > 0)


def _no_flow(_: Bindings, node: Value) -> Value:
    """What an attention part is with no keys or no queries: every sum in it is empty
    (+0.0), and dq and dk are such a sum times the scale (NaN for a NaN or infinite
    scale, -0.0 for a negative one, as the reference's ``(ds @ k) * scale`` gives)."""
    part = ATTENTION_PART[node.op][1]
    scale = node.attr("scale")
    with np.errstate(all="ignore"):
        value = float(np.zeros((), node.dtype.np_dtype) * np.asarray(scale, node.dtype.np_dtype)
                      ) if part in ("dq", "dk") else 0.0
    return b.const(value, node.dtype, node.shape)


def _unit_features(_: Bindings, node: Value) -> Value:
    kind = ATTENTION_PART[node.op][0]
    srcs = []
    for name, x in zip((*ATTENTION_OPERANDS[kind], "mask"), node.srcs, strict=False):
        if name in ("q", "k", "v", "dout", "out") and x.shape[-1] == 0:
            x = b.const(0.0, x.dtype, (*x.shape[:-1], 1))
        srcs.append(x)
    return b.make(node.op, srcs, dict(node.attrs))


ATTENTION_RULES: list[Rule] = [
    Rule("empty_attention", Pat(ops=ATTENTION_OPS, where=_is_empty), _empty_const,
         "an attention part with no elements is a constant of its shape (no step reads "
         "or writes it)"),
    Rule("attention_no_keys_or_queries", Pat(ops=ATTENTION_OPS, where=_no_keys_or_queries),
         _no_flow,
         "with no keys every row is dead (out 0, lse 0, dq an empty sum); with no queries "
         "nothing flows to a key (dk, dv empty sums): the reference's values, so no step "
         "runs on an empty operand"),
    Rule("attention_unit_features", Pat(ops=ATTENTION_OPS, where=_empty_features),
         _unit_features,
         "an empty feature axis (E or Ev = 0) becomes one axis of zeros: a dot product over "
         "no terms and over one term 0 * 0 are both +0.0, so scores, probabilities and "
         "every gradient are unchanged, and no step reads an empty operand"),
]


# --------------------------------------------------------------------------- index ops

_INDEX_VALUE_OPS = frozenset({Op.IOTA, Op.GATHER, Op.CUMSUM, Op.CUMPROD, Op.ARGSORT})
# The largest integer each dtype holds exactly (with every smaller one).
_EXACT_INT = {"f16": 2**11, "bf16": 2**8, "f32": 2**24, "f64": 2**53,
              **{d.name: int(np.iinfo(d.np_dtype).max) for d in INTEGERS}}


def _empty_index_value(v: Value) -> bool:
    return v.size == 0


def _unit_axis(v: Value) -> bool:
    return v.shape[v.attr("axis")] == 1


def _empty_src(v: Value) -> bool:
    return v.srcs[2].size == 0


def _iota_fits(v: Value) -> bool:
    """cvt(iota) is an iota of the new dtype when every coordinate converts exactly."""
    io = v.srcs[0]
    limit = _EXACT_INT.get(v.dtype.name)
    return limit is not None and io.shape[io.attr("axis")] - 1 <= limit


def _zero(_: Bindings, node: Value) -> Value:
    return b.const(0, node.dtype, node.shape)


def _base(_: Bindings, node: Value) -> Value:
    return node.srcs[0]


def _iota_as(bd: Bindings, node: Value) -> Value:
    return b.iota(node.shape, bd["i"].attr("axis"), node.dtype)


INDEX_RULES: list[Rule] = [
    Rule("index_empty", Pat(ops=_INDEX_VALUE_OPS, where=_empty_index_value), _zero,
         "an iota, gather, scan or argsort with no elements is an empty constant (a gather "
         "with no elements reads no index; one from an empty axis into a non-empty result "
         "is an IndexError, which lowering raises, never folded)"),
    Rule("iota_unit_axis", Pat(ops={Op.IOTA, Op.ARGSORT}, where=_unit_axis), _zero,
         "an iota or argsort along an axis of size 1 is 0 everywhere (one element per "
         "fiber: position 0)"),
    Rule("scan_unit_axis", Pat(ops={Op.CUMSUM, Op.CUMPROD}, where=_unit_axis), _base,
         "a scan along an axis of size 1 is its operand (-0.0 + x and 1 * x are x, also "
         "rounded through f64)"),
    Rule("scatter_empty_src", Pat(ops=frozenset(SCATTER_STEP), where=_empty_src), _base,
         "a scatter of nothing is its base (no index to check)"),
    Rule("cvt_iota", Pat(ops={Op.CVT}, srcs=(Pat(ops={Op.IOTA}, name="i"),), where=_iota_fits),
         _iota_as, "cvt of an iota is the iota of the new dtype when every coordinate is "
         "exact in it"),
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
EXACT_RULES: list[Rule] = [*EMPTY_RULES, *ATTENTION_RULES, *FOLD_RULES, *IDENTITY_RULES,
                            *ORDER_RULES, *STRENGTH_RULES, *INDEX_RULES,
                            *LAYOUT_RULES]
# The canonical set, in the order they are tried on each instruction. The pow rules
# are exact against a correctly rounded pow and so more accurate than NumPy's
# AVX-512 power, which the reference uses: they differ from it by a few ulp.
CANONICAL_RULES: list[Rule] = [*EXACT_RULES, *POW_RULES]
# Every rule defined here (tests cover each one).
ALL_RULES: list[Rule] = CANONICAL_RULES

RULE_SETS: dict[str, list[Rule]] = {
    "empty": EMPTY_RULES,
    "attention": ATTENTION_RULES,
    "fold": FOLD_RULES,
    "identity": IDENTITY_RULES,
    "index": INDEX_RULES,
    "layout": LAYOUT_RULES,
    "order": ORDER_RULES,
    "strength": STRENGTH_RULES,
    "pow": POW_RULES,
}

__all__ = [
    "ATTENTION_RULES",
    "ALL_RULES", "CANONICAL_RULES", "ELEMENTWISE_OPS", "EMPTY_KNOWN_OPS", "EMPTY_RULES",
    "EXACT_RULES", "FOLD_RULES",
    "IDENTITY_RULES", "INDEX_RULES", "LAYOUT_RULES",
    "ORDER_RULES", "POW_RULES", "RULE_SETS", "STRENGTH_RULES",
]
