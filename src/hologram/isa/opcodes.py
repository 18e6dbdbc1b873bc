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
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    MIN = "min"
    MAX = "max"
    POW = "pow"
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

    def __str__(self) -> str:
        return self.value


GROUP: dict[Op, Group] = {
    Op.LDG: Group.MEMORY,
    Op.STG: Group.MEMORY,
    Op.CONST: Group.CONST,
    **{
        op: Group.UNARY
        for op in (Op.NEG, Op.ABS, Op.EXP, Op.LOG, Op.SQRT, Op.RSQRT, Op.RECIP, Op.TANH,
                   Op.SIGMOID, Op.ERF, Op.SIN, Op.COS)
    },
    **{op: Group.BINARY for op in (Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.MIN, Op.MAX, Op.POW)},
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
}
MEMORY_ARITY: dict[Op, int] = {Op.LDG: 0, Op.STG: 1}

# Element-wise ops: the fusible kind.
ELEMENTWISE: frozenset[Group] = frozenset(
    {Group.CONST, Group.UNARY, Group.BINARY, Group.COMPARE, Group.TERNARY, Group.SELECT,
     Group.CAST}
)
# Movement ops: views of their operand (a new shape over the same elements, no copy).
MOVEMENT: frozenset[Op] = frozenset(op for op, g in GROUP.items() if g is Group.MOVEMENT)
# Binary ops whose operands may be swapped.
COMMUTATIVE: frozenset[Op] = frozenset({Op.ADD, Op.MUL, Op.MIN, Op.MAX, Op.CMPEQ})
# Unary/binary ops defined only on floating-point dtypes.
FLOAT_ONLY: frozenset[Op] = frozenset(
    {Op.EXP, Op.LOG, Op.SQRT, Op.RSQRT, Op.RECIP, Op.TANH, Op.SIGMOID, Op.ERF, Op.SIN, Op.COS,
     Op.POW, Op.FMA, Op.MAD, Op.DIV}
)
# Identity element of each reduction, used for empty reductions.
REDUCE_IDENTITY: dict[Op, float] = {
    Op.RSUM: 0.0,
    Op.RPROD: 1.0,
    Op.RMAX: float("-inf"),
    Op.RMIN: float("inf"),
}

BY_NAME: dict[str, Op] = {op.value: op for op in Op}


def group(op: Op) -> Group:
    return GROUP[op]


def arity(op: Op) -> int | None:
    g = GROUP[op]
    return MEMORY_ARITY[op] if g is Group.MEMORY else ARITY[g]
