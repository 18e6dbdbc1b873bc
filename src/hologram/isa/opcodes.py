"""Atlas ISA opcodes, grouped as data.

The group decides shape and dtype rules (``verify``), how the reference
interpreter runs an op (``backends.reference``) and how the scheduler fuses it,
so adding an opcode means adding a row here and one in each table that
implements it, never a new branch in control flow.
"""

from __future__ import annotations

from enum import Enum


class Group(str, Enum):
    MEMORY = "memory"  # LDG, STG: the program's boundary to buffers
    CONST = "const"  # CONST: a value filled with one scalar
    UNARY = "unary"  # element-wise, one operand
    BINARY = "binary"  # element-wise, two operands of one dtype
    COMPARE = "compare"  # element-wise, two operands, bool result
    TERNARY = "ternary"  # element-wise, three operands (MAD, FMA)
    SELECT = "select"  # SEL(cond: bool, a, b)
    CAST = "cast"  # CVT to the instruction's dtype
    REDUCE = "reduce"  # over axes, which are kept with size 1
    MOVEMENT = "movement"  # views: index arithmetic only, no data touched
    CONCAT = "concat"  # CONCAT(parts...): index arithmetic choosing among operands
    GEMM = "gemm"  # matrix product, a library call
    ATTENTION = "attention"  # softmax(q k^T * scale + mask) v and its gradients: one step
    IOTA = "iota"  # IOTA: each element's own coordinate along axis= (element-wise, no operands)
    GATHER = "gather"  # GATHER(x, idx): x read at coordinates idx computes at run time
    SCATTER = "scatter"  # SCATTER*(base, idx, src): base with src written (combined) at idx
    SCAN = "scan"  # CUMSUM/CUMPROD: inclusive prefix along axis=
    SORT = "sort"  # ARGSORT: each fiber's positions in stable sorted order along axis=


class Op(str, Enum):
    LDG = "ldg"
    STG = "stg"
    CONST = "const"
    NEG = "neg"
    ABS = "abs"
    EXP = "exp"
    LOG = "log"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    RECIP = "recip"
    TANH = "tanh"
    SIGMOID = "sigmoid"
    ERF = "erf"
    SIN = "sin"
    COS = "cos"
    FLOOR = "floor"
    CEIL = "ceil"
    TRUNC = "trunc"
    RINT = "rint"  # round half to even (torch.round, np.rint)
    LOG1P = "log1p"
    EXPM1 = "expm1"
    TAN = "tan"
    ASIN = "asin"
    ACOS = "acos"
    ATAN = "atan"
    SINH = "sinh"
    COSH = "cosh"
    ASINH = "asinh"
    ACOSH = "acosh"
    ATANH = "atanh"
    LOG2 = "log2"
    LOG10 = "log10"
    EXP2 = "exp2"
    ERFC = "erfc"
    LGAMMA = "lgamma"  # log |gamma(x)| (libm's lgamma)
    DIGAMMA = "digamma"  # d/dx lgamma(x) (ATen's calc_digamma)
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    MIN = "min"
    MAX = "max"
    POW = "pow"
    FMOD = "fmod"  # C fmod: a - trunc(a / b) * b, exact; the sign of a
    ATAN2 = "atan2"  # atan2(y, x): the angle of (x, y), C99's signed zeros and infinities
    HYPOT = "hypot"  # sqrt(a^2 + b^2) without overflow; inf wins over NaN
    # |a| with b's sign bit (-0.0's included); a NaN b gives |a|: the sign of a NaN is
    # no part of any ISA value (rules and backends may change it), so nothing reads it
    COPYSIGN = "copysign"
    ZETA = "zeta"  # Hurwitz zeta(x, q) = sum_k (q + k)^-x (ATen's zeta)
    # Bitwise ops on integers (two's complement); on bool they are the logical ops
    AND = "and"
    OR = "or"
    XOR = "xor"
    NOT = "not"  # ~x on integers, not x on bool
    # Shifts of integers; a count outside [0, bits) saturates as NumPy's do (C's UB
    # never reaches a kernel): SHL gives 0, SHR gives 0 or -1 (the sign, arithmetic)
    SHL = "shl"
    SHR = "shr"
    CMPLT = "cmplt"
    CMPEQ = "cmpeq"
    MAD = "mad"
    FMA = "fma"
    SEL = "sel"
    CVT = "cvt"
    RSUM = "rsum"
    RMAX = "rmax"
    RMIN = "rmin"
    RPROD = "rprod"
    RESHAPE = "reshape"
    EXPAND = "expand"
    PERMUTE = "permute"
    SLICE = "slice"
    CONCAT = "concat"
    GEMM = "gemm"
    IOTA = "iota"
    GATHER = "gather"
    SCATTER = "scatter"
    SCATTER_ADD = "scatter_add"
    SCATTER_MUL = "scatter_mul"
    SCATTER_MAX = "scatter_max"
    SCATTER_MIN = "scatter_min"
    CUMSUM = "cumsum"
    CUMPROD = "cumprod"
    ARGSORT = "argsort"
    ATTN = "attn"
    ATTN_LSE = "attn_lse"
    ATTN_DQ = "attn_dq"
    ATTN_DK = "attn_dk"
    ATTN_DV = "attn_dv"

    def __str__(self) -> str:
        return self.value


# The libm functions with one float operand beyond the first dozen (each the C function
# of its name; NumPy's of its name is the reference).
MATH_UNARY: tuple[Op, ...] = (Op.TAN, Op.ASIN, Op.ACOS, Op.ATAN, Op.SINH, Op.COSH, Op.ASINH,
                              Op.ACOSH, Op.ATANH, Op.LOG2, Op.LOG10, Op.EXP2, Op.ERFC)

GROUP: dict[Op, Group] = {
    Op.LDG: Group.MEMORY,
    Op.STG: Group.MEMORY,
    Op.CONST: Group.CONST,
    **{
        op: Group.UNARY
        for op in (Op.NEG, Op.ABS, Op.EXP, Op.LOG, Op.SQRT, Op.RSQRT, Op.RECIP, Op.TANH,
                   Op.SIGMOID, Op.ERF, Op.SIN, Op.COS, Op.FLOOR, Op.CEIL, Op.TRUNC, Op.RINT,
                   Op.LOG1P, Op.EXPM1, *MATH_UNARY, Op.LGAMMA, Op.DIGAMMA, Op.NOT)
    },
    **{op: Group.BINARY for op in (Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.MIN, Op.MAX, Op.POW,
                                   Op.FMOD, Op.ATAN2, Op.HYPOT, Op.COPYSIGN, Op.ZETA,
                                   Op.AND, Op.OR, Op.XOR, Op.SHL, Op.SHR)},
    Op.CMPLT: Group.COMPARE,
    Op.CMPEQ: Group.COMPARE,
    Op.MAD: Group.TERNARY,
    Op.FMA: Group.TERNARY,
    Op.SEL: Group.SELECT,
    Op.CVT: Group.CAST,
    **{op: Group.REDUCE for op in (Op.RSUM, Op.RMAX, Op.RMIN, Op.RPROD)},
    Op.RESHAPE: Group.MOVEMENT,
    Op.EXPAND: Group.MOVEMENT,
    Op.PERMUTE: Group.MOVEMENT,
    Op.SLICE: Group.MOVEMENT,
    Op.CONCAT: Group.CONCAT,
    Op.GEMM: Group.GEMM,
    Op.IOTA: Group.IOTA,
    Op.GATHER: Group.GATHER,
    Op.SCATTER: Group.SCATTER,
    Op.SCATTER_ADD: Group.SCATTER,
    Op.SCATTER_MUL: Group.SCATTER,
    Op.SCATTER_MAX: Group.SCATTER,
    Op.SCATTER_MIN: Group.SCATTER,
    Op.CUMSUM: Group.SCAN,
    Op.CUMPROD: Group.SCAN,
    Op.ARGSORT: Group.SORT,
    **{op: Group.ATTENTION
       for op in (Op.ATTN, Op.ATTN_LSE, Op.ATTN_DQ, Op.ATTN_DK, Op.ATTN_DV)},
}

# Number of operands each group takes (None: any number >= 1, checked by the group's rule).
ARITY: dict[Group, int | None] = {
    Group.CONST: 0,
    Group.UNARY: 1,
    Group.BINARY: 2,
    Group.COMPARE: 2,
    Group.TERNARY: 3,
    Group.SELECT: 3,
    Group.CAST: 1,
    Group.REDUCE: 1,
    Group.MOVEMENT: 1,
    Group.CONCAT: None,
    Group.GEMM: 2,
    Group.IOTA: 0,
    Group.GATHER: 2,
    Group.SCATTER: 3,
    Group.SCAN: 1,
    Group.SORT: 1,
    Group.ATTENTION: None,  # an optional mask operand: the group's rule checks the count
}
MEMORY_ARITY: dict[Op, int] = {Op.LDG: 0, Op.STG: 1}

# Element-wise ops: the fusible kind (IOTA is CONST whose value is the element's index).
ELEMENTWISE: frozenset[Group] = frozenset(
    {Group.CONST, Group.UNARY, Group.BINARY, Group.COMPARE, Group.TERNARY, Group.SELECT,
     Group.CAST, Group.IOTA}
)
# Movement ops: views of their operand (a new shape over the same elements, no copy).
MOVEMENT: frozenset[Op] = frozenset(op for op, g in GROUP.items() if g is Group.MOVEMENT)
# Binary ops whose operands may be swapped.
COMMUTATIVE: frozenset[Op] = frozenset({Op.ADD, Op.MUL, Op.MIN, Op.MAX, Op.CMPEQ, Op.AND,
                                        Op.OR, Op.XOR})
# Unary/binary ops defined only on floating-point dtypes.
FLOAT_ONLY: frozenset[Op] = frozenset(
    {Op.EXP, Op.LOG, Op.SQRT, Op.RSQRT, Op.RECIP, Op.TANH, Op.SIGMOID, Op.ERF, Op.SIN, Op.COS,
     Op.POW, Op.FMA, Op.MAD, Op.DIV, Op.FLOOR, Op.CEIL, Op.TRUNC, Op.RINT, Op.LOG1P, Op.EXPM1,
     Op.FMOD, Op.ATAN2, Op.HYPOT, Op.COPYSIGN, *MATH_UNARY, Op.LGAMMA, Op.DIGAMMA, Op.ZETA}
)
# Bitwise ops: defined on integer and bool dtypes (on bool: the logical and, or, xor, not).
BITWISE: frozenset[Op] = frozenset({Op.AND, Op.OR, Op.XOR, Op.NOT})
# Shifts: integer dtypes only (NumPy shifts bool as int8). The count is the second
# operand, of the first's dtype; outside [0, bits) it saturates (see Op.SHL).
SHIFT: frozenset[Op] = frozenset({Op.SHL, Op.SHR})
# Identity element of each reduction, used for empty reductions.
REDUCE_IDENTITY: dict[Op, float] = {
    Op.RSUM: 0.0,
    Op.RPROD: 1.0,
    Op.RMAX: float("-inf"),
    Op.RMIN: float("inf"),
}

# Ops that read or write at coordinates computed at run time: their index operand is
# range-checked as they run (an out-of-range index is an IndexError, never a stray access).
INDEXED: frozenset[Op] = frozenset({Op.GATHER, Op.SCATTER, Op.SCATTER_ADD, Op.SCATTER_MUL,
                                    Op.SCATTER_MAX, Op.SCATTER_MIN})
# The integer dtypes an index operand may have (names: opcodes does not import dtypes).
INDEX_DTYPES: frozenset[str] = frozenset({"i32", "i64"})
# Each scatter's step: the binary op that meets an update with the element it lands on
# (the element first, then the update: MAX and MIN let a NaN of either win, as
# torch.scatter_reduce's amax/amin do); None: the update replaces the element.
SCATTER_STEP: dict[Op, Op | None] = {Op.SCATTER: None, Op.SCATTER_ADD: Op.ADD,
                                     Op.SCATTER_MUL: Op.MUL, Op.SCATTER_MAX: Op.MAX,
                                     Op.SCATTER_MIN: Op.MIN}
# The special functions (compiler/special_math.py): neither libm nor WGSL has them all.
SPECIAL: tuple[Op, ...] = (Op.LGAMMA, Op.DIGAMMA, Op.ZETA)
# Each scan's step: the binary op folded along the axis, and its identity (-0.0 for
# sums: -0.0 + x is x for every x, while 0.0 + -0.0 is +0.0; NumPy's cumsum keeps -0.0).
SCAN_STEP: dict[Op, tuple[Op, float]] = {Op.CUMSUM: (Op.ADD, -0.0),
                                         Op.CUMPROD: (Op.MUL, 1.0)}

# Attention: each instruction is one part of a fused computation. Parts of one kind with
# the same operands and attributes are siblings the scheduler computes in ONE step
# (values are single-result, so the forward's output and its log-sum-exp are two values).
# kind -> the operands it takes, in order (a mask [*batch, L, S] may follow them).
ATTENTION_OPERANDS: dict[str, tuple[str, ...]] = {
    "forward": ("q", "k", "v"),
    "backward": ("dout", "q", "k", "v", "out", "lse"),
}
# op -> (kind, the part it is): out [*b, L, Ev], lse [*b, L], dq [*b, L, E],
# dk [*b, S, E], dv [*b, S, Ev].
ATTENTION_PART: dict[Op, tuple[str, str]] = {
    Op.ATTN: ("forward", "out"),
    Op.ATTN_LSE: ("forward", "lse"),
    Op.ATTN_DQ: ("backward", "dq"),
    Op.ATTN_DK: ("backward", "dk"),
    Op.ATTN_DV: ("backward", "dv"),
}

BY_NAME: dict[str, Op] = {op.value: op for op in Op}


def group(op: Op) -> Group:
    return GROUP[op]


def arity(op: Op) -> int | None:
    g = GROUP[op]
    return MEMORY_ARITY[op] if g is Group.MEMORY else ARITY[g]
