"""Render scheduled kernels as C (the C-family base the CUDA renderer extends).

Each kernel is one loop nest. Values are emitted at the shallowest loop level
their indices allow (hoisting), common subexpressions share one local variable,
and a reduction whose result is needed once per outer index becomes a *phase*:
an inner loop run before the store loop. Operator spellings and math functions
come from tables, so a dialect changes rows, not logic.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from ..isa.dtypes import DType
from ..isa.opcodes import (
    ELEMENTWISE,
    MATH_UNARY,
    MOVEMENT,
    SCATTER_STEP,
    SPECIAL,
    Group,
    Op,
    group,
)
from ..isa.value import Value, contiguous_strides
from . import attention, blas, shared_bodies, special_math
from .blas import GEMM_DESC_C
from .cc import PART_MARK
from .gemm_layout import GemmDesc, walk_views
from .half_floats import HalfFloats, HalfType
from .lower import packed_ref
from .render_index import INDEX_FAIL_C, IndexKernels
from .schedule import AttentionPlan, BufRef, GemmPlan, KernelPlan, NeedsMaterialize, Schedule
from .shared_bodies import Unit

# C templates for element-wise ops; {0},{1},{2} are operands, {f} the dtype suffix
# ('f' for float, '' for double), {T} the C type, {exp} the renderer's exp function
# for the dtype (CRenderer.exp_names).
TEMPLATES: dict[Op, str] = {
    Op.NEG: "(-{0})",
    Op.ABS: "fabs{f}({0})",
    Op.EXP: "{exp}({0})",
    Op.LOG: "log{f}({0})",
    Op.SQRT: "sqrt{f}({0})",
    Op.RSQRT: "(({T})1 / sqrt{f}({0}))",
    Op.RECIP: "(({T})1 / {0})",
    Op.TANH: "tanh{f}({0})",
    Op.SIGMOID: "(({T})1 / (({T})1 + {exp}(-{0})))",
    Op.ERF: "erf{f}({0})",
    Op.SIN: "sin{f}({0})",
    Op.COS: "cos{f}({0})",
    Op.FLOOR: "floor{f}({0})",
    Op.CEIL: "ceil{f}({0})",
    Op.TRUNC: "trunc{f}({0})",
    Op.RINT: "rint{f}({0})",  # the default rounding mode: to nearest, ties to even
    Op.LOG1P: "log1p{f}({0})",
    Op.EXPM1: "expm1{f}({0})",
    **{op: op.value + "{f}({0})" for op in MATH_UNARY},  # libm's tanf, asinf, ...
    Op.ADD: "({0} + {1})",
    Op.SUB: "({0} - {1})",
    Op.MUL: "({0} * {1})",
    Op.DIV: "({0} / {1})",
    # NumPy's minimum/maximum: NaN wins, and a tie (0.0 vs -0.0) gives the second operand.
    Op.MIN: "(({0} < {1} || {0} != {0}) ? {0} : {1})",
    Op.MAX: "(({0} > {1} || {0} != {0}) ? {0} : {1})",
    Op.POW: "pow{f}({0}, {1})",
    Op.FMOD: "fmod{f}({0}, {1})",
    Op.ATAN2: "atan2{f}({0}, {1})",
    Op.HYPOT: "hypot{f}({0}, {1})",
    Op.COPYSIGN: "({1} != {1} ? fabs{f}({0}) : copysign{f}({0}, {1}))",
    # the special functions (compiler/special_math.py); digamma and zeta in double
    Op.LGAMMA: "hg_lgamma{f}({0})",
    Op.DIGAMMA: "(({T})hg_digamma((double){0}))",
    Op.ZETA: "(({T})hg_zeta((double){0}, (double){1}))",
    Op.AND: "({0} & {1})",
    Op.OR: "({0} | {1})",
    Op.XOR: "({0} ^ {1})",
    Op.NOT: "(~{0})",
    # {U} the unsigned type of {T}, {W} its bits: the shift itself runs in range only
    # (a count outside [0, W) saturates, as NumPy's do) and on unsigned bits (a negative
    # value shifted left is C's UB; the unsigned shift wraps as two's complement does)
    Op.SHL: "((uint64_t)(int64_t){1} < {W} ? ({T})(({U}){0} << {1}) : ({T})0)",
    Op.SHR: "((uint64_t)(int64_t){1} < {W} ? ({0} >> {1}) : ({0} < 0 ? ({T})-1 : ({T})0))",
    Op.CMPLT: "({0} < {1})",
    Op.CMPEQ: "({0} == {1})",
    Op.MAD: "({0} * {1} + {2})",
    Op.FMA: "fma{f}({0}, {1}, {2})",
    Op.SEL: "({0} ? {1} : {2})",
}
# Integer dtypes spell some ops differently (no libm), and compute +, -, * and negation
# in their unsigned wrap type {U} (DType.wrap): NumPy's integer arithmetic wraps modulo
# 2**bits; C's signed overflow is undefined (and int promotion makes even uint16 *
# uint16 a signed int product). Converting back to {T} keeps the low bits (GCC and
# Clang define the conversion as modulo; C23 requires it).
INT_TEMPLATES: dict[Op, str] = {
    Op.ABS: "({0} < 0 ? ({T})(({U})0 - ({U}){0}) : {0})",
    Op.NEG: "(({T})(({U})0 - ({U}){0}))",
    Op.ADD: "(({T})(({U}){0} + ({U}){1}))",
    Op.SUB: "(({T})(({U}){0} - ({U}){1}))",
    Op.MUL: "(({T})(({U}){0} * ({U}){1}))",
}
# bool's NOT is the logical one (~ of a _Bool is -1 or -2: both true).
BOOL_TEMPLATES: dict[Op, str] = {Op.NOT: "(!{0})"}
#: dtype kind -> the rows that replace TEMPLATES' for it.
KIND_TEMPLATES: dict[str, dict[Op, str]] = {"i": INT_TEMPLATES, "b": BOOL_TEMPLATES}


@dataclass(frozen=True)
class Expr:
    code: str
    vars: frozenset[str] = frozenset()
    #: A coordinate that ``reshape_index`` split off a flat index: (the flat index's
    #: code, this dim's stride within its group, this dim's size, the group's size).
    #: ``offset`` puts the flat index back where a buffer lays the whole group out
    #: contiguously, instead of a division and remainder per dim that keep the loop from
    #: vectorizing. Views may carry a coordinate into a dim of another size (a coordinate
    #: that ran over 2 indexing a dim of 4): such a dim is not its group's.
    split: tuple[str, int, int, int] | None = None


ZERO = Expr("0")


@dataclass
class Scope:
    kind: str  # 'kernel' | 'outer' | 'inner' | 'phase'
    var: str | None
    parent: Scope | None
    lines: list[str] = field(default_factory=list)
    cache: dict[tuple, Expr] = field(default_factory=dict)
    row_var: str | None = None  # a phase looping over the store loop's own row

    def defines(self) -> set[str]:
        out: set[str] = set()
        s: Scope | None = self
        while s is not None:
            if s.var:
                out.add(s.var)
            s = s.parent
        return out


# Elements from which a kernel's loop runs on every OpenMP thread; below, a second
# thread costs more than it saves (starting a region costs ~1-2 us, and a busy box can
# stall it). Crossovers of jit calls on the 2-core VM (session 7, interleaved one-off
# A/B): plain arithmetic 16-32K f32 elements, a transcendental per element 4-8K. The
# earlier 128K/32K left the transformer block's 512x128 kernels (layer norm, residuals,
# head copies) on one thread; its training step ran 1-3% slower for it.
PARALLEL_MIN_WORK = 1 << 15  # plain arithmetic: memory-bound
PARALLEL_MIN_WORK_MATH = 1 << 13  # loops calling transcendental functions
# Parallel loops hand out chunks on demand (schedule(dynamic)), so a thread the OS has
# descheduled (another process on the core) holds back at most the chunk it is in,
# not a fixed half of the loop: at most DYNAMIC_CHUNKS chunks per loop, none with less
# than MIN_CHUNK_WORK elements of work (a chunk costs one atomic increment). Each
# element or row is still computed whole by one thread, so results do not depend on
# which thread took which chunk.
DYNAMIC_CHUNKS = 64
MIN_CHUNK_WORK = 1 << 13
ROW_SCRATCH_BYTES = 16 << 10  # per-thread stack scratch for values a phase shares with a row
# A row sum of at most this many f32 elements along the innermost axis (a contiguous SIMD
# loop: softmax, layer norm, their backward) accumulates in float: 16 SIMD lanes of at
# most 64 terms each (error bound ~68 ulp of the sum of |x|, typically a few; ATen sums
# rows the same way). There the kernel is compute-bound: the double's conversions cost
# softmax 4096x1024 13-20% (benchmarks/bench_exp.py) and layer norm 4096x768 ~20%. A sum
# over other axes (kron's backward sums axes 1 and 3 of [5, 10, 5, 20]) reads strided
# elements and takes the double at no measurable cost, as do longer rows and whole
# arrays. The trailing axes together count as one row (a nested loop of SIMD rows):
# MobileNetV3-small's squeeze-excitation pools over 14x14 and 7x7 planes, where the
# double's conversions cost 2% of the model at batch 8 (session 24).
FLOAT_SUM_MAX = 1024
#: Rows of at most this many elements get a loop of their own over a plane's rows
#: (``CRenderer.plane_rows``): MobileNetV3-small b8 0.94x the time, ResNet-18's training
#: step 0.94x, transformers level (in-process A/Bs against none, docs/perf.md, session
#: 25); 128 measured level with 64.
PLANE_ROW_MAX = 64
#: A reduction over several axes whose last is shorter than this runs as one flat loop
#: over all of them (``phase``), not a loop of short SIMD rows, where every operand lays
#: the axes out contiguously: each coordinate is tagged with its place in the flat index,
#: so ``offset`` reads such an operand at the flat index itself (a 7x7 pool: one SIMD
#: loop of 49); where one does not (a padded plane), the rows stay.
NESTED_ROW_MIN = 16
COLUMN_BLOCK = 256  # accumulators per block of a column reduction (2 KiB of doubles)
# Ops whose operands are read at other coordinates than the result's: no flat loop.
NOT_FLAT = frozenset({Op.EXPAND, Op.PERMUTE, Op.SLICE, Op.CONCAT,
                      # coordinates (IOTA, GATHER) or kernels of their own (render_index)
                      Op.IOTA, Op.GATHER, *SCATTER_STEP, Op.CUMSUM, Op.CUMPROD,
                      Op.ARGSORT})
MATH_OPS = frozenset({Op.EXP, Op.LOG, Op.TANH, Op.SIGMOID, Op.ERF, Op.SIN, Op.COS, Op.POW,
                      Op.LOG1P, Op.EXPM1, Op.FMOD, Op.ATAN2, Op.HYPOT, *MATH_UNARY,
                      *SPECIAL})


def int_limit(d: DType, sign: int) -> int:
    """The smallest (``sign`` < 0) or largest value of integer dtype ``d``: the identity
    of RMAX or RMIN, which has no infinity to start from."""
    info = np.iinfo(d.np_dtype)
    return int(info.min if sign < 0 else info.max)


def dynamic_chunk(count: int, work: int | None, simd: bool) -> int:
    """Iterations per chunk of a parallel loop over ``count`` iterations (see
    DYNAMIC_CHUNKS); a whole number of 16-wide SIMD steps for a SIMD loop."""
    per = max(1, (work if work is not None else count) // max(count, 1))
    chunk = max(-(-count // DYNAMIC_CHUNKS), -(-MIN_CHUNK_WORK // per), 1)
    if simd:
        chunk = -(-chunk // 16) * 16
    return min(chunk, max(count, 1))


@dataclass(frozen=True)
class TeamLoop:
    """A kernel's parallel loop, rendered first as ``token``: ``kernel()`` makes it the
    thread team's chunk loop or puts OpenMP's ``pragma`` back."""

    token: str
    var: str
    count: int
    chunk: int
    simd: bool
    pragma: str
    work: int  # elements of work in the whole loop


class CRenderer(IndexKernels):
    """C for the CPU backend: hologram's thread team (or OpenMP) across rows, SIMD
    within them."""

    #: A reduction over several axes loops over the leading ones around a SIMD loop over
    #: the last (``phase``); GPU dialects spread one flat loop over a block's threads.
    nested_phases = True

    #: Parallel loops run on hologram's thread team where the kernel allows (GPU
    #: dialects map loops to the grid instead).
    team = True

    suffix = {"f32": "f", "f64": ""}
    parallel_min_work = PARALLEL_MIN_WORK
    column_reductions = True  # see column_reduction(); GPU dialects turn it off
    concat_loops = True  # see concat_kernel(); GPU dialects keep one loop nest a kernel
    row_scratch = True  # GPU dialects spread a row over threads: no per-thread row copy
    plane_loops = True  # see plane_rows(); GPU dialects map one outer loop to the grid
    concat_parallel = False  # concat_kernel: every part's loop on the team (set there)
    #: dtype -> the exp function templates call ({exp}); others get libm's ``exp{f}``.
    #: float32 uses hologram's own inline hg_expf (compiler/c_math.py): faster than
    #: libmvec's and as accurate. GPU dialects keep the device's own expf.
    exp_names: ClassVar[dict[str, str]] = {"f32": "hg_expf"}

    def __init__(self, sched: Schedule, slots: dict[BufRef, int]) -> None:
        self.sched = sched
        self.slots = slots
        self.n = 0
        self.row_len: int | None = None  # set while rendering a row-range kernel
        self.row_factor = 1  # the row-range kernel's own rows per product row
        self.specials: set[Op] = set()  # special functions the kernels call (special_math)
        #: SLICEs rendered with starts read from a table (``folded_parts``): id -> starts
        self.slice_starts: dict[int, tuple[int | Expr, ...]] = {}
        #: Appended to every emitted value's cache key while a fold renders, so a value
        #: the kernel computed before with fixed starts is not taken for the table's.
        self.fold_key: tuple[str, ...] = ()
        self.sort_helpers: dict[str, str] = {}  # render_index.sort_helper

    # --- helpers --------------------------------------------------------------------------
    def ctype(self, d: DType) -> str:
        return d.ctype

    def template(self, op: Op, d: DType) -> str:
        """The element-wise template of ``op`` on operands of ``d``."""
        return KIND_TEMPLATES.get(d.kind, {}).get(op) or TEMPLATES[op]

    def storage_type(self, d: DType) -> str:
        """The element type of buffers of ``d`` (a dialect may compute in a wider type
        than it stores: CUDA keeps f16 in ``__half`` and computes in float)."""
        return self.ctype(d)

    def accumulator_type(self, d: DType) -> str:
        """What a reduction of ``d`` accumulates in, where f32 sums do not take double."""
        return self.ctype(d)

    def cast_code(self, v: Value, code: str) -> str:
        """``code`` (of ``v``'s source dtype) converted to ``v``'s dtype."""
        return f"(({self.ctype(v.dtype)}){code})"

    def fresh(self, prefix: str = "t") -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def literal(self, value: float | int | bool, d: DType) -> str:
        if d.kind == "b":
            return "1" if value else "0"
        if d.kind == "i":
            v = int(value)
            if d.signed and v == int_limit(d, -1):  # -2**63 is no literal: 2**63 overflows
                return f"(({d.ctype})({v + 1}LL - 1))"
            return f"(({d.ctype}){v}{'LL' if d.signed else 'ULL'})"
        v = float(value)
        suffix = "f" if d.name == "f32" else ""
        if math.isnan(v):
            return f"(({d.ctype})NAN)"
        if math.isinf(v):
            return f"(({d.ctype}){'-' if v < 0 else ''}INFINITY)"
        return f"({v.hex()}{suffix})"

    def ptr(self, ref: BufRef) -> str:
        """A typed pointer local for ``ref``, declared once at the top of the kernel.

        Reading ``B[slot]`` inside loops makes GCC reload it on every iteration (it
        cannot prove stores leave the table alone), which cost 4x on row kernels.
        """
        key = (self.slots[ref], ref.dtype.name, ref.offset if ref.kind == "arena" else 0)
        name = self.pointers.get(key)
        if name is None:
            name = f"p{key[0]}_{ref.dtype.name}" + (f"_{key[2]}" if key[2] else "")
            self.pointers[key] = name
            self.pointer_decls.append(f"{self.storage_type(ref.dtype)} *{name} = "
                                      f"{self.slot_expr(ref)};")
        return name

    def slot_expr(self, ref: BufRef) -> str:
        slot = self.slots[ref]
        t = self.storage_type(ref.dtype)
        if ref.kind == "arena":
            return f"({t} *)((char *)B[{slot}] + {ref.offset})"
        return f"({t} *)B[{slot}]"

    strides = staticmethod(contiguous_strides)

    def offset(self, shape: tuple[int, ...], idx: tuple[Expr, ...]) -> Expr:
        strides = self.strides(shape)
        merged = self._merged_groups(shape, strides, idx)
        terms, vars_ = [], frozenset()
        for d, (s, st, e) in enumerate(zip(shape, strides, idx, strict=True)):
            if d in merged:
                code, st = merged[d]
                if code is None:
                    continue
                e = Expr(f"({code})", e.vars)
            elif s == 1 or e.code == "0":
                continue
            terms.append(e.code if st == 1 else f"{e.code} * {st}")
            vars_ |= e.vars
        return Expr(" + ".join(terms) if terms else "0", vars_)

    @staticmethod
    def _merged_groups(shape: tuple[int, ...], strides: tuple[int, ...],
                       idx: tuple[Expr, ...]) -> dict[int, tuple[str | None, int]]:
        """Dims whose coordinates ``reshape_index`` split off one flat index F, where the
        buffer has exactly that group's dims (each the size the coordinate runs over,
        together its whole size) laid out contiguously (each dim's buffer stride its
        stride within the group times the innermost's): dim -> (F, that innermost
        stride) for one of them and (None, 0) for the rest, since the group's terms sum
        to F times it."""
        groups: dict[tuple[str, int], list[int]] = {}
        for d, e in enumerate(idx):
            if e.split is not None and shape[d] != 1 and shape[d] == e.split[2]:
                groups.setdefault((e.split[0], e.split[3]), []).append(d)
        out: dict[int, tuple[str | None, int]] = {}
        for (flat, total), dims in groups.items():
            if math.prod(shape[d] for d in dims) != total:
                continue  # not the whole group (another view in between): keep the dims
            unit = strides[dims[-1]]
            if all(strides[d] == idx[d].split[1] * unit for d in dims):
                out.update({d: (None, 0) for d in dims})
                out[dims[0]] = (flat, unit)
        return out

    # --- scopes -----------------------------------------------------------------------------
    def scope_for(self, vars_: frozenset[str], cur: Scope) -> Scope:
        """The outermost scope in which every var of ``vars_`` is defined."""
        chain = []
        s: Scope | None = cur
        while s is not None:
            chain.append(s)
            s = s.parent
        for sc in reversed(chain):
            if vars_ <= sc.defines():
                return sc
        return cur

    def bind(self, code: str, d: DType, vars_: frozenset[str], cur: Scope, key: tuple) -> Expr:
        sc = self.scope_for(vars_, cur)
        name = self.fresh()
        sc.lines.append(self.declare(name, d, code))
        e = Expr(name, vars_)
        sc.cache[key] = e
        return e

    def declare(self, name: str, d: DType, code: str) -> str:
        """One local's declaration (the dialect's syntax)."""
        return f"{self.ctype(d)} {name} = {code};"

    def index_decl(self, name: str, code: str) -> str:
        """An index local's declaration (the dialect's syntax and index type)."""
        return f"const int64_t {name} = {code};"

    def named_index(self, e: Expr, cur: Scope) -> Expr:
        """``e`` as a local when its code is long: a CONCAT writes its index into every
        part's test and clamp, a reshape into every coordinate it splits off, so a chain
        of them repeated the text at each step. Torchvision's Swin-T backward (rolls and
        window partitions of the gradient, block after block) rendered five kernels of
        148 MB of C each; naming the index keeps each step's text its own size."""
        if len(e.code) < INDEX_NAME_MIN or e.code.isidentifier():
            return e
        key = ("index", e.code)
        hit = self.lookup(key, cur)
        if hit is not None:
            return hit
        sc = self.scope_for(e.vars, cur)
        name = self.fresh("ix")
        sc.lines.append(self.index_decl(name, e.code))
        out = Expr(name, e.vars)
        sc.cache[key] = out
        return out

    def lookup(self, key: tuple, cur: Scope) -> Expr | None:
        s: Scope | None = cur
        while s is not None:
            if key in s.cache:
                return s.cache[key]
            s = s.parent
        return None

    # --- emission -----------------------------------------------------------------------------
    def emit(self, v: Value, idx: tuple[Expr, ...], cur: Scope, flat: bool) -> Expr:
        key = (id(v), tuple(e.code for e in idx), *self.fold_key)
        hit = self.lookup(key, cur)
        if hit is not None:
            return hit
        if self.row_cands and cur.kind == "inner":
            saved = self.row_cands.get((id(v), self._canon(key[1], "j")))
            if saved is not None:  # a phase already computed this row: read it back
                saved["used"] = True
                return self.bind(f"{saved['name']}[j]", v.dtype, frozenset({"j"}), cur, key)
        e = self._emit(v, idx, cur, flat, key)
        if v.op in MATH_OPS and self.row is not None and v.dtype.kind == "f":
            self._offer_row_value(v, e, key, cur)
        return e

    @staticmethod
    def _canon(codes: tuple[str, ...], var: str) -> tuple[str, ...]:
        return tuple(re.sub(rf"\b{var}\b", "@", c) for c in codes)

    def _offer_row_value(self, v: Value, e: Expr, key: tuple, cur: Scope) -> None:
        """An expensive value computed inside a row phase may be needed again by the
        store loop at the same row positions: keep it in a stack scratch row (written
        only if the store loop asks for it)."""
        s: Scope | None = cur
        while s is not None and s.row_var is None:
            s = s.parent
        if s is None or s.row_var not in e.vars:
            return
        ck = (id(v), self._canon(key[1], s.row_var))
        if ck in self.row_cands:
            return
        token = f"/*@@row{len(self.row_cands)}@@*/"
        name = self.fresh("row")
        self.row_cands[ck] = {"name": name, "token": token, "used": False,
                              "store": f"{name}[{s.row_var}] = {e.code};",
                              "decl": f"{self.ctype(v.dtype)} {name}[{self.row['count']}];"}
        self.scope_for(e.vars, cur).lines.append(token)

    def _emit(self, v: Value, idx: tuple[Expr, ...], cur: Scope, flat: bool,
              key: tuple) -> Expr:
        ref = self.sched.buffers.get(id(v))
        if ref is not None and id(v) not in self.computing:
            off = idx[0] if flat else self.offset(v.shape, idx)
            return self.bind(f"{self.ptr(ref)}[{off.code}]", v.dtype, off.vars, cur, key)
        g = group(v.op)
        if g is Group.CONST:
            return Expr(self.literal(v.attr("value"), v.dtype))
        if g in (Group.UNARY, Group.BINARY, Group.COMPARE, Group.TERNARY, Group.SELECT):
            args = [self.emit(s, idx, cur, flat) for s in v.srcs]
            d = v.srcs[-1].dtype
            tmpl = self.template(v.op, d)
            if v.op in SPECIAL:
                self.specials.add(v.op)
            f = self.suffix.get(d.name, "")
            code = tmpl.format(*(a.code for a in args), f=f, T=self.ctype(d),
                               exp=self.exp_names.get(d.name, f"exp{f}"),
                               U=d.wrap, W=d.bits)
            vars_ = frozenset().union(*(a.vars for a in args))
            return self.bind(code, v.dtype, vars_, cur, key)
        if g is Group.CAST:
            a = self.emit(v.srcs[0], idx, cur, flat)
            return self.bind(self.cast_code(v, a.code), v.dtype, a.vars, cur, key)
        if flat:
            if v.op is Op.RESHAPE:  # a reshape keeps the row-major flat index
                return self.emit(v.srcs[0], idx, cur, flat)
            raise AssertionError(f"{v.op} in a flat kernel")  # pragma: no cover
        if v.op is Op.EXPAND:
            src = v.srcs[0]
            sub = tuple(ZERO if a == 1 and b != 1 else e
                        for a, b, e in zip(src.shape, v.shape, idx, strict=True))
            return self.emit(src, sub, cur, flat)
        if v.op is Op.PERMUTE:
            perm = v.attr("perm")
            sub = [ZERO] * len(idx)
            for d, p in enumerate(perm):
                sub[p] = idx[d]
            return self.emit(v.srcs[0], tuple(sub), cur, flat)
        if v.op is Op.RESHAPE:
            return self.emit(v.srcs[0], self.reshape_index(v.srcs[0].shape, v.shape, idx,
                                                           cur), cur, flat)
        if v.op is Op.SLICE:  # a window: each axis's index moves by where it starts
            starts = self.slice_starts.get(id(v)) or v.attr("starts")
            sub = tuple(shift(e, s) for e, s in zip(idx, starts, strict=True))
            return self.emit(v.srcs[0], sub, cur, flat)
        if v.op is Op.CONCAT:
            return self.concat(v, idx, cur, key)
        if g is Group.IOTA:
            return self.iota(v, idx)
        if v.op is Op.GATHER:
            return self.gather(v, idx, cur, key)
        if g is Group.REDUCE:
            return self.phase(v, idx, cur, key)
        raise NeedsMaterialize(v)

    def select_code(self, cond: str, a: str, b: str) -> str:
        """``cond ? a : b`` in the dialect (WGSL spells it ``select(b, a, cond)``)."""
        return f"({cond} ? {a} : {b})"

    def concat(self, v: Value, idx: tuple[Expr, ...], cur: Scope, key: tuple) -> Expr:
        """CONCAT: the part whose range along the axis holds the index, as a chain of
        selects (``e < end0 ? part0 : e < end1 ? part1 : ...``), each part read at the
        index less its offset. Every part is read for every element, so each part's
        index is clamped into the part: no read ever leaves its buffer."""
        axis = v.attr("axis")
        total = v.shape[axis]
        e = self.named_index(idx[axis], cur)
        parts, off = [], 0
        for p in v.srcs:
            if p.shape[axis]:
                parts.append((p, off))
            off += p.shape[axis]
        if not parts:  # an empty result: nothing is read, any part will do
            parts = [(v.srcs[0], 0)]
        code, vars_ = "", frozenset(e.vars)
        for n_done, (p, start) in enumerate(reversed(parts)):
            end = start + p.shape[axis]
            local = self.clamp_index(e, start, end, total)
            x = self.emit(p, (*idx[:axis], local, *idx[axis + 1:]), cur, False)
            vars_ |= x.vars
            code = x.code if n_done == 0 else self.select_code(f"{e.code} < {end}", x.code,
                                                                code)
        return self.bind(code, v.dtype, vars_, cur, key)

    def clamp_index(self, e: Expr, start: int, end: int, total: int) -> Expr:
        """``e - start`` clamped into ``[0, end - start)`` (bounds that ``e``, which runs
        over ``[0, total)``, cannot cross need no test)."""
        if end - start == 1:  # a part one wide along the axis: its only index
            return ZERO
        if e.code.isdigit():  # a fixed index (a size-1 axis)
            return Expr(str(min(max(int(e.code) - start, 0), max(end - start - 1, 0))))
        code = shift(e, -start).code
        if end < total:
            code = self.select_code(f"{e.code} < {end}", code, str(end - start - 1))
        if start > 0:
            code = self.select_code(f"{e.code} < {start}", "0", code)
        return Expr(code, e.vars)  # a name, or already parenthesised

    def reshape_index(self, src: tuple[int, ...], dst: tuple[int, ...],
                      idx: tuple[Expr, ...], cur: Scope | None = None) -> tuple[Expr, ...]:
        live = [(s, e) for s, e in zip(dst, idx, strict=True) if s != 1]
        if [s for s in src if s != 1] == [s for s, _ in live]:  # only size-1 dims moved
            it = iter(e for _, e in live)
            return tuple(ZERO if s == 1 else next(it) for s in src)
        groups = reshape_groups(src, dst)
        if groups is None:  # an empty array: any index will do, nothing is read
            groups = [(list(range(len(src))), list(range(len(dst))))]
        out = [ZERO] * len(src)
        for si, dj in groups:
            # Only the dims a group splits or merges need index arithmetic, so a dim that
            # passes through keeps its loop variable (and its loop stays vectorisable).
            flat = self.offset(tuple(dst[d] for d in dj), tuple(idx[d] for d in dj))
            sizes = tuple(src[d] for d in si)
            if cur is not None and sum(size != 1 for size in sizes) > 1:
                flat = self.named_index(flat, cur)  # split into several coordinates
            total = math.prod(sizes)
            for d, size, st in zip(si, sizes, self.strides(sizes), strict=True):
                if size == 1:
                    continue
                code = flat.code if st == 1 else f"({flat.code}) / {st}"
                if st * size != total:  # the outermost dim of a group needs no modulo
                    code = f"({code}) % {size}"
                out[d] = flat if code.isidentifier() else Expr(f"({code})", flat.vars,
                                                                (flat.code, st, size, total))
        return tuple(out)

    def phase(self, v: Value, idx: tuple[Expr, ...], cur: Scope, key: tuple) -> Expr:
        """A reduction computed once per outer index, before the loop that uses it."""
        kept = frozenset().union(*(e.vars for e in idx))
        home = self.scope_for(kept, cur)
        if home.kind not in ("kernel", "outer"):
            raise NeedsMaterialize(v)  # would rerun per inner element: give it a buffer
        src = v.srcs[0]
        axes = v.attr("axes")
        d = v.dtype
        acc, nan, r = self.fresh("acc"), self.fresh("nan"), self.fresh("r")
        sizes = [src.shape[a] for a in axes]
        count = math.prod(sizes)
        parallel = home.kind == "kernel" and count >= self.parallel_min_work
        short_sum = (v.op is Op.RSUM and count <= FLOAT_SUM_MAX and home.kind == "outer"
                     and tuple(axes) == tuple(range(src.ndim - len(axes), src.ndim)))
        wide = self.accumulator(v.op, d, short_sum)
        row = (self.row is not None and home.kind == "outer"
               and tuple(axes) == self.row["axes"] and count == self.row["count"])
        # Several reduced axes: on the CPU a loop over the leading ones around a SIMD loop
        # over the last, where one flat loop would divide its index per element (an
        # average pool over a 56x56 plane of an inlined stride-2 convolution ran
        # scalar: 3.8 ms of MobileNetV3-small's 26, docs/perf.md, session 15). Rows
        # shorter than NESTED_ROW_MIN try one flat loop first, kept where every operand
        # reads at the flat index itself (no division left in the loop).
        nested = (self.nested_phases and len(axes) > 1 and not parallel and not row
                  and sizes[-1] > 1)
        loop_parts = None
        if nested and sizes[-1] < NESTED_ROW_MIN:
            loop_parts = self.phase_loop(src, axes, idx, home, sizes, r, False, row)
            divides = (f"({r} / ", f"({r} % ")  # unravel's coordinates, not merged
            if any(p in ln for ln in [*loop_parts[1].lines, loop_parts[2].code]
                   for p in divides):
                loop_parts = None  # an operand splits the flat index: rows after all
            else:
                nested = False
        if loop_parts is None:
            loop_parts = self.phase_loop(src, axes, idx, home, sizes, r, nested, row)
        outer, body, x = loop_parts
        ro = outer.var if nested else r
        lead = tuple(sizes[:-1]) if nested else tuple(sizes)
        init, step, red = self.REDUCE_RULES[v.op]
        has_nan = v.op in (Op.RMAX, Op.RMIN) and d.kind == "f"
        decl = [f"{wide} {acc} = {init(d, self)};"] + ([f"int {nan} = 0;"] if has_nan else [])
        clauses = f"reduction({red}:{acc})" + (f" reduction(|:{nan})" if has_nan else "")
        loop = ["  " + ln for ln in body.lines] + ["  " + step(acc, x.code)]
        if has_nan:
            loop.append(f"  {nan} |= ({x.code} != {x.code});")
        loop.append("}")
        if nested:
            loop = (["  " + ln for ln in outer.lines + self.phase_head(r, sizes[-1], clauses,
                                                                        False)]
                    + ["  " + ln for ln in loop] + ["}"])
            home.lines.extend(decl + [f"for (int64_t {ro} = 0; {ro} < {math.prod(lead)}; "
                                      f"{ro}++) {{"] + loop)
        elif (parallel and self.team_loops is not None and self.row_len is None
                and not any("for (" in ln or "#pragma" in ln for ln in home.lines)):
            home.lines.extend(self.team_phase(v.op, wide, acc, nan if has_nan else None, r,
                                              count, decl, clauses, loop, list(home.lines)))
        else:
            home.lines.extend(decl + self.phase_head(r, count, clauses, parallel) + loop
                              + self.phase_tail(v.op, acc, wide, nan if has_nan else None))
        result = f"(({self.ctype(d)}){acc})"
        if has_nan:
            result = f"({nan} ? ({self.ctype(d)})NAN : {result})"
        return self.bind(result, d, kept, home, key)

    def phase_loop(self, src: Value, axes: Sequence[int], idx: tuple[Expr, ...], home: Scope,
                   sizes: list[int], r: str, nested: bool, row: bool
                   ) -> tuple[Scope, Scope, Expr]:
        """A reduction's loop: (the scope around its SIMD loop, that loop's body, the
        reduced value in it). Flat: one loop ``r`` over all reduced axes, each axis's
        coordinate tagged with its place in ``r`` (``Expr.split``) so that ``offset``
        reads an operand laying the axes out contiguously at ``r`` itself. Nested: a
        loop over the leading axes around a SIMD loop ``r`` over the last."""
        ro = self.fresh("r") if nested else r
        lead = list(axes[:-1] if nested else axes)
        split = self.unravel(ro, src.shape, lead)
        sub = [split[a] if a in lead else e for a, e in enumerate(idx)]
        if nested:
            sub[axes[-1]] = Expr(r, frozenset({r}))
        outer = Scope("phase", ro, home) if nested else home
        body = Scope("phase", r, outer)
        if row:
            body.row_var = r
        return outer, body, self.emit(src, tuple(sub), body, False)

    def team_phase(self, op: Op, wide: str, acc: str, nan: str | None, r: str, count: int,
                   decl: list[str], clauses: str, loop: list[str],
                   setup: list[str]) -> list[str]:
        """A whole-array reduction on the thread team: a chunk function (rendered by
        ``kernel()`` once the pointers are known) writes each fixed chunk's partial into
        an array, which the kernel combines in chunk order, so the result is the same
        for every thread count and for whichever thread ran a chunk. ``decl`` declares
        the accumulators, ``loop`` is the phase's loop body through its closing brace,
        ``setup`` the kernel's lines before the phase (no loops), which the chunk
        function repeats."""
        _, step, _ = self.REDUCE_RULES[op]
        chunk = dynamic_chunk(count, None, True)
        n_chunks = -(-count // chunk)
        fn = f"{self.kernel_name}_r{len(self.team_phases)}"
        part, nans = f"{acc}_part", f"{nan}_part"
        lines = decl + [f"#pragma omp simd {clauses}",
                        f"for (int64_t {r} = lo; {r} < hi; {r}++) {{"] + loop
        lines.append(f"(({wide} *)((void **)ctx)[1])[lo / {chunk}] = {acc};")
        if nan is not None:
            lines.append(f"((int *)((void **)ctx)[2])[lo / {chunk}] = {nan};")
        self.team_phases.append((fn, setup + lines))
        out = [f"{wide} {part}[{n_chunks}];"]
        if nan is not None:
            out.append(f"int {nans}[{n_chunks}];")
        out += [f"void *{acc}_ctx[3] = {{(void *)B, {part}, "
                f"{nans if nan is not None else 'NULL'}}};",
                f"hg_par({fn}, {acc}_ctx, {count}, {chunk});", *decl,
                f"for (int64_t {r} = 0; {r} < {n_chunks}; {r}++) {{",
                f"  {step(acc, f'{part}[{r}]')}"]
        if nan is not None:
            out.append(f"  {nan} |= {nans}[{r}];")
        return out + ["}"]

    def phase_head(self, r: str, count: int, clauses: str, parallel: bool) -> list[str]:
        """The loop over a reduction's axes: SIMD lanes, and threads when it is alone."""
        head = "parallel for simd num_threads(HG_NT)" if parallel else "simd"
        return [f"#pragma omp {head} {clauses}",
                f"for (int64_t {r} = 0; {r} < {count}; {r}++) {{"]

    def phase_tail(self, op: Op, acc: str, wide: str, nan: str | None) -> list[str]:
        """Combine partial accumulators after the loop (OpenMP's clauses already did)."""
        return []

    REDUCE_RULES = {
        Op.RSUM: (lambda d, R: "0", lambda a, x: f"{a} += {x};", "+"),
        Op.RPROD: (lambda d, R: "1", lambda a, x: f"{a} *= {x};", "*"),
        Op.RMAX: (lambda d, R: R.literal(-math.inf if d.kind == "f" else int_limit(d, -1), d),
                  lambda a, x: f"{a} = {x} > {a} ? {x} : {a};", "max"),
        Op.RMIN: (lambda d, R: R.literal(math.inf if d.kind == "f" else int_limit(d, 1), d),
                  lambda a, x: f"{a} = {x} < {a} ? {x} : {a};", "min"),
    }

    def accumulator(self, op: Op, d: DType, short_sum: bool = False) -> str:
        """The C type a reduction accumulates in: double for f32 sums and products (but
        a short row sum, see FLOAT_SUM_MAX); an integer sum or product in its wrap type,
        so it wraps as NumPy's does; an 8- or 16-bit maximum or minimum in 32 bits (the
        same values: CUDA's warp shuffles take no narrower integer); otherwise the dtype
        itself."""
        if op in (Op.RSUM, Op.RPROD):
            if d.name == "f32" and not short_sum:
                return "double"
            if d.kind == "i":
                return d.wrap
        if d.kind == "i" and d.itemsize < 4:
            return "int32_t" if d.signed else "uint32_t"
        return self.accumulator_type(d)

    # --- kernels ------------------------------------------------------------------------------
    def _computed_here(self, roots: list[Value]) -> Iterator[Value]:
        """The values a kernel computes itself for ``roots`` (its sinks): their
        expressions down to what other steps stored (read from memory here). Not the
        whole upstream graph: a late kernel of a big program would walk every layer
        before it."""
        buffers = self.sched.buffers
        stack = list(roots)
        seen = {id(s) for s in stack}
        while stack:
            v = stack.pop()
            yield v
            for src in v.srcs:
                if id(src) not in seen and id(src) not in buffers:
                    seen.add(id(src))
                    stack.append(src)

    def kernel(self, k: KernelPlan) -> str:
        self.pointers: dict[tuple, str] = {}
        self.pointer_decls: list[str] = []
        self.row: dict | None = None
        self.row_cands: dict[tuple, dict] = {}
        self.team_loops: list[TeamLoop] | None = [] if self.team else None
        self.team_phases: list[tuple[str, list[str]]] = []  # see team_phase()
        self.kernel_name = k.name
        v, _ = k.sinks[0]
        heavy = any(x.op in MATH_OPS for x in self._computed_here([s for s, _ in k.all_sinks]))
        self.parallel_min_work = PARALLEL_MIN_WORK_MATH if heavy else PARALLEL_MIN_WORK
        # The sink is computed here, unless a load, a GEMM result or an attention part (a
        # copy kernel: their steps wrote the value).
        copy = v.op in (Op.LDG, Op.GEMM) or group(v.op) is Group.ATTENTION
        self.computing = set() if copy else {id(v)}
        self.computing |= {id(s) for s, _ in k.siblings}
        c = v
        if not copy:
            chain = computed_in_place(v, self.sched)
            c = chain[-1]
            self.computing |= {id(x) for x in chain}
        top = Scope("kernel", None, None)
        if group(c.op) is Group.REDUCE and id(c) in self.computing:
            body = (self.column_reduce_kernel(c, k, top) if self.column_reduction(c)
                    else self.reduce_kernel(c, k, top))
        elif c.op is Op.CONCAT and self.concat_loops and id(c) in self.computing:
            body = self.concat_kernel(c, k, top)
        elif group(c.op) is Group.SCATTER and id(c) in self.computing:
            body = self.scatter_kernel(c, k, top)
        elif group(c.op) is Group.SCAN and id(c) in self.computing:
            body = self.scan_kernel(c, k, top)
        elif group(c.op) is Group.SORT and id(c) in self.computing:
            body = self.sort_kernel(c, k, top)
        elif self.is_flat(c) and all(self.is_flat(s) for s, _ in k.siblings):
            body = self.flat_kernel(c, k, top)
        elif k.siblings:  # schedule.merge_siblings merges only flat element-wise kernels
            raise AssertionError(f"hologram internal error: kernel {k.name} has siblings "
                                 "but is not one flat loop")
        else:
            body = self.nested_kernel(c, k, top)
        text = self.team_kernel(k.name, top, body)
        if text is None:
            lines = [self.signature(k.name) + " {"]
            lines += ["  " + ln for ln in self.pointer_decls + top.lines + body]
            lines.append("}")
            text = "\n".join(lines)
            for t in self.team_loops or ():
                text = text.replace(t.token, t.pragma)
        for fn, fn_lines in reversed(self.team_phases):  # defined before their caller
            head = [f"static void {fn}(void *ctx, int64_t lo, int64_t hi, int tid) {{",
                    "  void **B = (void **)((void **)ctx)[0];", "  (void)tid;"]
            text = "\n".join(head + ["  " + ln for ln in self.pointer_decls + fn_lines]
                             + ["}", text])
        for cand in self.row_cands.values():
            text = text.replace(cand["token"], cand["store"] if cand["used"] else "")
        return text

    def team_kernel(self, name: str, top: Scope, body: list[str]) -> str | None:
        """The kernel as a chunk function the thread team (``compiler/team.py``) runs,
        and the entry point that hands it to the team. The kernel's top-level loops
        must all be parallel loops (a stored CONCAT has one per part, writing disjoint
        windows): their iterations are laid end to end as one range, and a chunk runs
        its share of each loop it overlaps. None when the kernel has anything else at
        its top level, or set-up with a loop of its own before them (e.g. a whole-array
        reduction the loop reads, which would run once per chunk): it stays OpenMP
        regions."""
        loops = {t.token: t for t in self.team_loops or []}
        if (not loops or self.row_len is not None or not body
                or any("for (" in ln or "#pragma" in ln for ln in top.lines)):
            return None
        segments: list[tuple[TeamLoop, list[str]]] = []
        for ln in body:  # header (token first), indented body lines, closing brace
            token = ln[:ln.index("@*/") + 3] if ln.startswith("/*@team") else None
            if token in loops:
                segments.append((loops[token], [ln]))
            elif segments and (ln.startswith("  ") or ln == "}"):
                segments[-1][1].append(ln)
            else:
                return None
        if len(segments) != len(loops):
            return None
        total = sum(t.count for t, _ in segments)
        chunk = (segments[0][0].chunk if len(segments) == 1
                 else dynamic_chunk(total, sum(t.work for t, _ in segments), False))
        lines = [f"static void {name}_chunk(void *ctx, int64_t lo, int64_t hi, int tid) {{",
                 "  void **B = (void **)ctx;", "  (void)tid;"]
        lines += ["  " + ln for ln in self.pointer_decls + top.lines]
        start = 0
        for t, seg in segments:
            header = seg[0].replace(t.token, "#pragma omp simd" if t.simd else "")
            if len(segments) == 1:
                header = header.replace(f"{t.var} = 0; {t.var} < {t.count};",
                                        f"{t.var} = lo; {t.var} < hi;")
                lines += ["  " + ln for ln in header.lstrip("\n").split("\n") + seg[1:]]
                break
            end = start + t.count
            header = header.replace(f"{t.var} = 0; {t.var} < {t.count};",
                                    f"{t.var} = hg_lo; {t.var} < hg_hi;")
            lines += [f"  if (lo < {end} && hi > {start}) {{",
                      f"    const int64_t hg_lo = lo > {start} ? lo - {start} : 0;",
                      f"    const int64_t hg_hi = hi < {end} ? hi - {start} : {t.count};"]
            lines += ["    " + ln for ln in header.lstrip("\n").split("\n") + seg[1:]]
            lines.append("  }")
            start = end
        lines += ["}", f"{self.signature(name)} {{",
                  f"  hg_par({name}_chunk, (void *)B, {total}, {chunk});", "}"]
        return "\n".join(lines)

    def signature(self, name: str) -> str:
        if self.row_len is not None:
            return f"void {name}(void **B, int64_t lo, int64_t hi)"
        return f"void {name}(void **B)"

    def rows_kernel(self, k: KernelPlan, row_len: int) -> str:
        """``k`` over output rows ``lo..hi`` (rows of ``row_len`` elements), serial: the
        GEMM driver calls it on each tile right after BLAS wrote that tile."""
        self.row_len = row_len
        # an epilogue has no reduction, so its store loop's rows are its last dimension,
        # which divides the product's rows (fusable_epilogue): row_factor of them each
        self.row_factor = row_len // computed_in_place(k.sinks[0][0], self.sched)[-1].shape[-1]
        try:
            text = self.kernel(KernelPlan(rows_name(k.name), k.sinks))
        finally:
            self.row_len = None
        return text

    def stores(self, k: KernelPlan, x: Expr, off: Expr) -> list[str]:
        return [f"{self.ptr(dst)}[{off.code}] = {self.store_value(dst.dtype, x.code)};"
                for _, dst in k.sinks]

    def is_flat(self, c: Value) -> bool:
        """Element-wise over same-shaped contiguous data: one loop over a flat index."""
        seen: set[int] = set()
        stack = [c]
        while stack:
            v = stack.pop()
            if id(v) in seen:
                continue
            seen.add(id(v))
            if id(v) in self.sched.buffers and id(v) not in self.computing:
                continue
            g = group(v.op)
            if g in (Group.REDUCE, Group.GEMM) or v.op in NOT_FLAT:
                return False
            stack.extend(v.srcs)
        return True

    def loop(self, var: str, count: int, parallel: bool, simd: bool, role: str = "flat",
             work: int | None = None) -> str:
        """A loop header; ``role`` ('flat', 'outer', 'inner') lets GPU dialects map loops
        to the grid, blocks and threads. In a row-range kernel (a GEMM epilogue run per
        tile) the outermost loop covers rows ``lo..hi`` only, on the caller's thread.
        ``work``: elements of work in the whole loop (default one per iteration), which
        sizes a parallel loop's chunks."""
        if self.row_len is not None and role in ("flat", "outer"):
            factor = self.row_len if role == "flat" else self.row_factor
            scale = f" * {factor}" if factor != 1 else ""
            pragma = "#pragma omp simd\n" if simd else ""
            return f"{pragma}for (int64_t {var} = lo{scale}; {var} < hi{scale}; {var}++) {{"
        if parallel:
            chunk = dynamic_chunk(count, work, simd)
            pragma = ("#pragma omp parallel for" + (" simd" if simd else "")
                      + f" num_threads(HG_NT) schedule(dynamic, {chunk})")
            if self.team_loops is not None:  # kernel() decides: the team, or OpenMP
                token = f"/*@team{len(self.team_loops)}@*/"
                self.team_loops.append(TeamLoop(token, var, count, chunk, simd, pragma,
                                                work if work is not None else count))
                pragma = token
        else:
            pragma = "#pragma omp simd" if simd else ""
        head = f"for (int64_t {var} = 0; {var} < {count}; {var}++) {{"
        return f"{pragma}\n{head}" if pragma else head

    def flat_kernel(self, c: Value, k: KernelPlan, top: Scope) -> list[str]:
        n = max(c.size, 1) if c.ndim == 0 else c.size
        inner = Scope("inner", "i", top)
        i = (Expr("i", frozenset({"i"})),)
        x = self.emit(c, i, inner, True)
        stores = self.stores(k, x, Expr("i"))
        for s, dst in k.siblings:  # computed in the same scope: shared work is bound once
            stores += self.stores(KernelPlan(k.name, [(s, dst)]), self.emit(s, i, inner, True),
                                  Expr("i"))
        out = [self.loop("i", n, n >= self.parallel_min_work, True, "flat")]
        out += ["  " + ln for ln in inner.lines + stores]
        return out + ["}"]

    def reduce_kernel(self, c: Value, k: KernelPlan, top: Scope) -> list[str]:
        axes = set(c.attr("axes"))
        outer_dims = [d for d in range(c.ndim) if d not in axes]
        n_outer = math.prod(c.shape[d] for d in outer_dims)
        if n_outer == 0:  # no result elements: nothing to store (the scheduler skips these)
            return []
        if n_outer == 1:  # one result element: the phase alone, stored at 0
            x = self.emit(c, tuple(ZERO for _ in c.shape), top, False)
            return self.stores(k, x, Expr("0"))
        outer = Scope("outer", "o", top)
        idx = self.unravel("o", c.shape, outer_dims)
        x = self.emit(c, idx, outer, False)
        work = c.srcs[0].size
        out = [self.loop("o", n_outer, work >= self.parallel_min_work, False, "outer", work)]
        out += ["  " + ln for ln in outer.lines + self.stores(k, x, Expr("o"))]
        return out + ["}"]

    def column_reduction(self, c: Value) -> bool:
        """Whether reduction ``c`` keeps its input's innermost axis (a sum over the batch,
        as bias gradients are): then the loop over the kept elements goes innermost and
        each reduced row is read contiguously into a block of accumulators. Looping the
        other way reads a column with a stride per element (measured 5x slower for
        256x256 f32). GPU dialects spread reductions over threads instead."""
        if not self.column_reductions or self.row_len is not None:
            return False
        src = c.srcs[0]
        if c.op not in (Op.RSUM, Op.RMAX, Op.RMIN) or src.ndim == 0:
            return False
        axes = c.attr("axes")
        if (src.ndim - 1 in axes or src.shape[-1] < 2) and not self.reads_across(src, axes):
            return False
        stack, seen = [src], set()
        while stack:  # no reduction inside: its phases would need an outer loop of their own
            v = stack.pop()
            if id(v) in seen or (id(v) in self.sched.buffers and id(v) not in self.computing):
                continue
            seen.add(id(v))
            if group(v.op) in (Group.REDUCE, Group.GEMM):
                return False
            stack.extend(v.srcs)
        return True

    def reads_across(self, src: Value, axes: tuple[int, ...]) -> bool:
        """Whether ``src`` reduced over ``axes``, though its logical last axis is reduced,
        is a column reduction in memory: every stored operand it reads (through views)
        that varies along the kept axes has its last kept axis contiguous and no reduced
        axis contiguous.
        A layer norm over the channels of a channels-first buffer (ConvNeXt's, over a
        PERMUTE) read each channel with a stride, a SIMD loop of 40 gathered elements
        per position; as a column reduction its loop runs along the positions instead
        (ConvNeXt-atto at batch 8: 0.988x the time, docs/perf.md, session 25)."""
        kept = [a for a in range(src.ndim) if a not in axes and src.shape[a] > 1]
        if not kept:
            return False
        last = kept[-1]
        leaves = self.leaf_strides(src)
        if not leaves:
            return False
        # operands that vary along the kept axes (not a per-channel bias: a column kernel
        # reads that once per reduced index)
        varying = [st for st in leaves if any(st[a] for a in kept)]
        reduced = [a for a in axes if src.shape[a] > 1]
        return bool(varying) and all(st[last] == 1 and all(st[a] != 1 for a in reduced)
                                     for st in varying)

    def leaf_strides(self, v: Value) -> list[tuple[int, ...]] | None:
        """The strides (per axis of ``v``) at which element-wise expression ``v`` reads
        each stored operand, through views above or below element-wise steps (each
        stored operand row-major); None where it reads anything else (a reduction, a
        GEMM, a view no strides express)."""
        out: list[tuple[int, ...]] = []
        # (value, the movement ops between it and ``v``, innermost first)
        stack: list[tuple[Value, tuple[Value, ...]]] = [(v, ())]
        seen: set[tuple[int, ...]] = set()
        while stack:
            x, above = stack.pop()
            key = (id(x), *map(id, above))
            if key in seen:
                continue
            seen.add(key)
            if id(x) in self.sched.buffers and id(x) not in self.computing:
                shape, strides, _, copying = walk_views(list(above), x.shape)
                if copying is not None or shape != v.shape:
                    return None
                out.append(strides)
            elif x.op in MOVEMENT:
                stack.append((x.srcs[0], (x, *above)))
            elif group(x.op) is Group.CONST:
                continue
            elif group(x.op) in ELEMENTWISE and group(x.op) is not Group.IOTA:
                stack.extend((src, above) for src in x.srcs)
            else:
                return None
        return out

    def column_reduce_kernel(self, c: Value, k: KernelPlan, top: Scope) -> list[str]:
        """Blocks of kept elements ``o`` (threads take blocks); per block, every reduced
        row ``r`` adds its contiguous segment into the block's accumulators."""
        src = c.srcs[0]
        axes = set(c.attr("axes"))
        kept = [d for d in range(c.ndim) if d not in axes]
        red = sorted(axes)
        n_outer = math.prod(c.shape[d] for d in kept)
        count = math.prod(src.shape[d] for d in red)
        d = c.dtype
        wide = self.accumulator(c.op, d)
        init, step, _ = self.REDUCE_RULES[c.op]
        has_nan = c.op in (Op.RMAX, Op.RMIN) and d.kind == "f"
        work = src.size
        parallel = work >= self.parallel_min_work
        blk = COLUMN_BLOCK
        if parallel and n_outer <= COLUMN_BLOCK:
            # Narrow columns (a bias gradient of 128): two blocks of whole SIMD widths,
            # so both threads share the rows instead of one reading them all.
            blk = max(16, -(-n_outer // 32) * 16)
        n_blocks = -(-n_outer // blk)
        acc, nan, r = self.fresh("acc"), self.fresh("nan"), self.fresh("r")
        block = Scope("outer", "ob", top)
        rows = Scope("outer", r, block)
        inner = Scope("inner", "o", rows)
        oidx = self.unravel("o", c.shape, kept)
        ridx = self.unravel(r, src.shape, red)
        idx = tuple(ridx[i] if i in axes else oidx[i] for i in range(c.ndim))
        x = self.emit(src, idx, inner, False)
        out = [self.loop("ob", n_blocks, parallel and n_blocks > 1, False, "outer", work)]
        body = [f"const int64_t o0 = ob * {blk}, o1 = o0 + {blk} < {n_outer} ? o0 + {blk} "
                f": {n_outer};",
                f"{wide} {acc}[{blk}];"]
        if has_nan:
            body.append(f"int {nan}[{blk}];")
        body += ["for (int64_t o = o0; o < o1; o++) {",
                 f"  {acc}[o - o0] = {init(d, self)};"]
        if has_nan:
            body.append(f"  {nan}[o - o0] = 0;")
        body.append("}")
        body += [f"for (int64_t {r} = 0; {r} < {count}; {r}++) {{"]
        body += ["  " + ln for ln in rows.lines]
        body += ["  #pragma omp simd", "  for (int64_t o = o0; o < o1; o++) {"]
        body += ["    " + ln for ln in inner.lines]
        body.append("    " + step(f"{acc}[o - o0]", x.code))
        if has_nan:
            body.append(f"    {nan}[o - o0] |= ({x.code} != {x.code});")
        body += ["  }", "}"]
        t = self.ctype(d)
        result = f"(({t}){acc}[o - o0])"
        if has_nan:
            result = f"({nan}[o - o0] ? ({t})NAN : {result})"
        body += ["for (int64_t o = o0; o < o1; o++) {"]
        body += ["  " + ln for ln in self.stores(k, Expr(result), Expr("o"))]
        body.append("}")
        out += ["  " + ln for ln in block.lines + body]
        return out + ["}"]

    def unravel(self, var: str, shape: tuple[int, ...], dims: list[int]) -> tuple[Expr, ...]:
        """Coordinates of ``dims`` of ``shape`` from one flat loop variable over them."""
        sizes = [shape[d] for d in dims]
        st = self.strides(tuple(sizes))
        total = math.prod(sizes)
        idx = [ZERO] * len(shape)
        single = sum(1 for x in sizes if x != 1) == 1
        for d, s, stride in zip(dims, sizes, st, strict=True):
            if s == 1:
                continue
            if single:
                idx[d] = Expr(var, frozenset({var}))
                continue
            code = f"({var} % {s})" if stride == 1 else f"({var} / {stride} % {s})"
            # split off ``var`` as reshape_index splits a flat index: where a buffer lays
            # these dims out contiguously, ``offset`` reads ``var`` itself, not a
            # division and a remainder per dim (which keep a loop from vectorizing)
            idx[d] = Expr(code, frozenset({var}), (var, stride, s, total))
        return tuple(idx)

    def inner_axes(self, c: Value) -> list[int]:
        """Axes the store loop runs innermost: those reduced by phases feeding ``c``."""
        axes: set[int] = set()
        stack, seen = [c], set()
        while stack:
            v = stack.pop()
            if id(v) in seen or (id(v) in self.sched.buffers and id(v) not in self.computing):
                continue
            seen.add(id(v))
            if group(v.op) is Group.REDUCE and v.ndim == c.ndim:
                axes |= set(v.attr("axes"))
                continue
            if v.op in (Op.RESHAPE, Op.PERMUTE) or group(v.op) is Group.GEMM:
                continue
            stack.extend(s for s in v.srcs if s.ndim == c.ndim)
        axes = {a for a in axes if c.shape[a] != 1}
        return sorted(axes) if axes else [c.ndim - 1]

    def concat_kernel(self, c: Value, k: KernelPlan, top: Scope) -> list[str]:
        """A stored CONCAT as one loop nest per part, each writing its own window of the
        result, so each part is read (and computed) once; the select chain of
        ``concat()`` reads every part for every element (measured 3x a plain copy)."""
        axis = c.attr("axis")
        out: list[str] = []
        start = 0
        self.row_scratch = False  # (instance attribute: this kernel only)
        # Every part's loop is parallel when the whole is big enough: team_kernel lays
        # them end to end as one job (an im2col's 49 taps were 49 fork-joins, and small
        # parts ran on one thread).
        self.concat_parallel = (self.team_loops is not None and self.row_len is None
                                and c.size >= self.parallel_min_work)
        units = math.prod(c.shape[:axis])
        # Units first: one parallel loop over the dims before the axis, every part inside
        # (an im2col: per image and channel, all its taps), so a unit's input is read
        # from cache by every part that reads it, where part after part each swept the
        # whole input (docs/perf.md, "Session 12, CNN").
        interleave = (self.concat_parallel and units > 1
                      and all(keeps_lead(p, axis, self.sched.buffers) for p in c.srcs))
        lead: tuple[Expr, ...] = ()
        body_top = top
        if interleave:
            lead = self.unravel("u", c.shape, list(range(axis)))[:axis]
            body_top = Scope("outer", "u", top)
            self.concat_parallel = False
        try:
            i = 0
            while i < len(c.srcs):
                part = c.srcs[i]
                twins = shifted_twins(c.srcs, i, self.sched.buffers) if lead else None
                if twins is not None and part.shape[axis]:
                    out += self.folded_parts(c, twins, k, body_top, start, lead)
                    i += len(twins[0])
                    start += len(twins[0]) * part.shape[axis]
                    continue
                if part.shape[axis]:
                    def place(idx: tuple[Expr, ...], start: int = start) -> Expr:
                        moved = tuple(shift(e, start) if d == axis else e
                                      for d, e in enumerate(idx))
                        return self.offset(c.shape, moved)

                    out += self.concat_part(part, k, body_top, place, lead)
                start += part.shape[axis]
                i += 1
        finally:
            del self.row_scratch
            del self.concat_parallel
        if interleave:
            head = self.loop("u", units, True, False, "outer", c.size)
            out = [head] + ["  " + ln for ln in body_top.lines + out] + ["}"]
        return out

    def folded_parts(self, c: Value, twins: tuple[list[Value], dict[int, list[tuple[int, ...]]]],
                     k: KernelPlan, top: Scope, start: int, lead: tuple[Expr, ...]
                     ) -> list[str]:
        """Consecutive parts of a stored CONCAT that differ only in where their SLICEs
        start (an im2col's taps: windows of one stored plane at other offsets) as ONE
        loop nest inside a loop over the parts, the starts that differ read from a
        table. Each part as its own loop nest made ResNet-18's stem 49 copies of the
        same loops, most of a cold first call's compiler time in its part (docs/perf.md,
        session 31); the copies run the same at run time (the table is read outside the
        inner loop)."""
        parts, slices = twins
        first = parts[0]
        axis = c.attr("axis")
        size = first.shape[axis]
        tab = self.fresh("t")
        tap = Expr("tap", frozenset({"tap"}))
        columns: list[list[int]] = [[] for _ in parts]
        symbolic: dict[int, tuple[int | Expr, ...]] = {}
        for sid, per_part in slices.items():
            starts: list[int | Expr] = list(per_part[0])
            for a in range(len(starts)):
                if len({st[a] for st in per_part}) > 1:
                    starts[a] = Expr(f"{tab}[tap][{len(columns[0])}]", tap.vars)
                    for row, st in zip(columns, per_part, strict=True):
                        row.append(st[a])
            symbolic[sid] = tuple(starts)
        at = Expr(f"{start} + tap * {size}" if start else f"tap * {size}", tap.vars)

        def place(idx: tuple[Expr, ...]) -> Expr:
            return self.offset(c.shape, tuple(shift(e, at) if d == axis else e
                                              for d, e in enumerate(idx)))

        loop = Scope("outer", "tap", top)
        self.slice_starts.update(symbolic)
        self.fold_key = ("fold", tab)
        try:
            body = self.nested_kernel(first, k, loop, place, lead)
        finally:
            self.fold_key = ()
            for sid in symbolic:
                del self.slice_starts[sid]
        rows = ", ".join("{" + ", ".join(map(str, row)) + "}" for row in columns)
        return ([f"static const int64_t {tab}[{len(parts)}][{len(columns[0])}] = {{{rows}}};",
                 f"for (int64_t tap = 0; tap < {len(parts)}; tap++) {{"]
                + ["  " + ln for ln in loop.lines + body] + ["}"])

    def concat_part(self, part: Value, k: KernelPlan, top: Scope,
                    place: Callable[[tuple[Expr, ...]], Expr],
                    lead: tuple[Expr, ...] = ()) -> list[str]:
        """One part of a stored CONCAT, written through ``place``. A part that is itself
        a CONCAT nothing stores (seen through reshapes that only add or drop unit dims:
        an im2col tap built as its input window padded with zeros, see
        ``hologram_torch.lowering.convolution.window_taps``) is split the same way, one
        loop nest per sub-part: the window becomes a plain copy and the padding plain
        stores of the fill, where a select per element would pick between them."""
        inner = unit_reshape_concat(part, self.sched.buffers)
        if inner is None:
            return self.nested_kernel(part, k, top, place, lead)
        cat, to_part = inner
        ax = cat.attr("axis")
        out: list[str] = []
        start = 0
        for sub in cat.srcs:
            if sub.shape[ax]:
                def sub_place(idx: tuple[Expr, ...], start: int = start) -> Expr:
                    moved = tuple(shift(e, start) if d == ax else e for d, e in enumerate(idx))
                    return place(to_part(moved))

                out += self.concat_part(sub, k, top, sub_place, lead)
            start += sub.shape[ax]
        return out

    def plane_rows(self, c: Value, outer_dims: list[int], n_inner: int,
                   lead: tuple[Expr, ...]) -> int | None:
        """The outer dim to loop over inside the outer loop (a plane's rows), or None.
        Short rows (a 14x14 plane's 14) pay per row for every value computed per outer
        index: a batch norm's scale (a square root, a division) and the
        squeeze-excitation gate, per plane in MobileNetV3-small, were recomputed every
        14 elements. With the plane's rows as a loop of their own inside the outer one,
        values that do not depend on the row are computed once a plane."""
        if (not self.plane_loops or lead or self.row_len is not None
                or n_inner > PLANE_ROW_MAX or len(outer_dims) < 2):
            return None
        last = outer_dims[-1]
        rows = c.shape[last]
        if rows < 2 or math.prod(c.shape[d] for d in outer_dims[:-1]) < 2:
            return None
        return last

    def nested_kernel(self, c: Value, k: KernelPlan, top: Scope,
                      place: Callable[[tuple[Expr, ...]], Expr] | None = None,
                      lead: tuple[Expr, ...] = ()) -> list[str]:
        """``c`` over its own shape; ``place`` maps its index to the stored element's
        offset (a CONCAT part's window), by default ``c``'s own row-major offset.
        ``lead``: the indices of ``c``'s first dims, fixed by an enclosing loop (the
        units of an interleaved CONCAT); the loops here run over the other dims."""
        if c.ndim == 0:  # a scalar: no loops of its own, only the phases it needs
            x = self.emit(c, (), top, False)
            return self.stores(k, x, Expr("0") if place is None else place(()))
        inner_dims = [d for d in self.inner_axes(c) if d >= len(lead)] or [c.ndim - 1]
        outer_dims = [d for d in range(len(lead), c.ndim) if d not in inner_dims]
        n_outer = math.prod(c.shape[d] for d in outer_dims)
        n_inner = math.prod(c.shape[d] for d in inner_dims)
        rows_dim = self.plane_rows(c, outer_dims, n_inner, lead)
        outer = Scope("outer", "o", top)
        plane = Scope("outer", "orow", outer) if rows_dim is not None else outer
        inner = Scope("inner", "j", plane)
        if rows_dim is not None:
            outer_dims = [d for d in outer_dims if d != rows_dim]
        oidx = self.unravel("o", c.shape, outer_dims)
        if rows_dim is not None:
            ridx = self.unravel("orow", c.shape, [rows_dim])
            oidx = tuple(o if o is not ZERO else r for o, r in zip(oidx, ridx, strict=True))
        iidx = self.unravel("j", c.shape, inner_dims)
        idx = tuple(o if o is not ZERO else i for o, i in zip(oidx, iidx, strict=True))
        idx = lead + idx[len(lead):]
        if self.row_scratch and n_inner * c.dtype.itemsize <= ROW_SCRATCH_BYTES:
            self.row = {"axes": tuple(inner_dims), "count": n_inner}
        x = self.emit(c, idx, inner, False)
        if self.row_cands:  # again, now that the phases have offered their row values
            inner = Scope("inner", "j", plane)
            x = self.emit(c, idx, inner, False)
            plane.lines[:0] = [cand["decl"] for cand in self.row_cands.values()
                               if cand["used"]]
        off = self.offset(c.shape, idx) if place is None else place(idx)
        body = [self.loop("j", n_inner, False, True, "inner")]
        body += ["  " + ln for ln in inner.lines + self.stores(k, x, off)]
        body.append("}")
        if rows_dim is not None:
            n_rows = c.shape[rows_dim]
            n_outer //= n_rows
            body = ([f"for (int64_t orow = 0; orow < {n_rows}; orow++) {{"]
                    + ["  " + ln for ln in plane.lines + body] + ["}"])
        # The reductions computed per outer index count too: a row-wise log-sum-exp stores
        # one element per row but reads and exponentiates the whole row.
        work = max([c.size] + [x.srcs[0].size for x in self._computed_here([c])
                               if group(x.op) is Group.REDUCE])
        parallel = not lead and (self.concat_parallel
                                 or (work >= self.parallel_min_work and n_outer > 1))
        out = [self.loop("o", n_outer, parallel, False, "outer", work)]
        out += ["  " + ln for ln in outer.lines + body]
        return out + ["}"]


def keeps_lead(part: Value, axis: int, buffers: dict[int, BufRef]) -> bool:
    """Whether ``part`` of a CONCAT along ``axis``, and every unstored CONCAT inside it
    that ``concat_part`` splits, has the same first ``axis`` dims with their inner
    axes after them, so one loop over those dims can enclose all their loop nests."""
    inner = unit_reshape_concat(part, buffers)
    if inner is None:
        return True
    cat, _ = inner
    return (cat.shape[:axis] == part.shape[:axis] and cat.attr("axis") >= axis
            and all(keeps_lead(p, axis, buffers) for p in cat.srcs))


def unit_reshape_concat(v: Value, buffers: dict[int, BufRef]
                        ) -> tuple[Value, Callable[[tuple[Expr, ...]], tuple[Expr, ...]]] | None:
    """``v`` as an unstored CONCAT seen through unstored RESHAPEs that only add or drop
    dims of size 1, with the map from the CONCAT's index to ``v``'s; None otherwise."""
    chain: list[Value] = []
    x = v
    while x.op is Op.RESHAPE and id(x) not in buffers:
        src = x.srcs[0]
        if [d for d in src.shape if d != 1] != [d for d in x.shape if d != 1]:
            return None
        chain.append(x)
        x = src
    if x.op is not Op.CONCAT or id(x) in buffers or 0 in x.shape:
        return None

    def to_v(idx: tuple[Expr, ...]) -> tuple[Expr, ...]:
        cur, shape = idx, x.shape
        for r in reversed(chain):  # innermost reshape first
            kept = iter(e for e, d in zip(cur, shape, strict=True) if d != 1)
            cur, shape = tuple(ZERO if d == 1 else next(kept) for d in r.shape), r.shape
        return cur

    return x, to_v


#: Index expressions this long or longer are named by a local before a CONCAT or a
#: reshape repeats them (``CRenderer.named_index``); shorter ones stay inline, as every
#: kernel of the benchmark models has them.
INDEX_NAME_MIN = 160
#: Fewest consecutive CONCAT parts folded into one loop over a table (folded_parts).
FOLD_MIN_PARTS = 4
#: What a folded part may compute: values rendered in place, where the part's loops
#: are. A reduction's loop is placed before the part's stores, in the scope of the
#: indices its result depends on, outside the loop over the table (whose ``tap`` it
#: would read undeclared); scans, sorts and the like are steps of their own.
FOLDABLE_GROUPS = ELEMENTWISE | {Group.MOVEMENT, Group.MEMORY, Group.GATHER}


def shifted_twins(parts: Sequence[Value], i: int, buffers: dict[int, BufRef]
                  ) -> tuple[list[Value], dict[int, list[tuple[int, ...]]]] | None:
    """The run of parts from ``parts[i]`` that are ``parts[i]`` with only their SLICEs'
    starts changed (the same ops, shapes, other attributes and leaves; nothing stored
    in between), and each SLICE of ``parts[i]`` (by id) with its starts in every part
    of the run; None for a run shorter than ``FOLD_MIN_PARTS``, or a first part
    ``concat_part`` splits (a padded window)."""
    first = parts[i]
    if unit_reshape_concat(first, buffers) is not None:
        return None
    run = [first]
    slices: dict[int, list[tuple[int, ...]]] = {}
    for other in parts[i + 1:]:
        pairs = _slice_pairs(first, other, buffers)
        if pairs is None:
            break
        if not run[1:]:
            slices = {sid: [v.attr("starts")] for sid, (v, _) in pairs.items()}
        if pairs.keys() != slices.keys():
            break
        for sid, (_, starts) in pairs.items():
            slices[sid].append(starts)
        run.append(other)
    if len(run) < FOLD_MIN_PARTS or not slices:
        return None
    return run, slices


def _slice_pairs(a: Value, b: Value, buffers: dict[int, BufRef]
                 ) -> dict[int, tuple[Value, tuple[int, ...]]] | None:
    """``b`` as ``a`` with other SLICE starts: each SLICE of ``a`` by id, with itself
    and its counterpart's starts; None when they differ otherwise."""
    out: dict[int, tuple[Value, tuple[int, ...]]] = {}
    seen: set[tuple[int, int]] = set()
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        if x is y:
            continue
        if (id(x), id(y)) in seen:
            continue
        seen.add((id(x), id(y)))
        if (id(x) in buffers or id(y) in buffers or x.op is not y.op or x.dtype != y.dtype
                or x.shape != y.shape or len(x.srcs) != len(y.srcs)
                or group(x.op) not in FOLDABLE_GROUPS):
            return None
        if x.op is Op.SLICE:
            if [kv for kv in x.attrs if kv[0] != "starts"] != \
                    [kv for kv in y.attrs if kv[0] != "starts"]:
                return None
            if id(x) in out and out[id(x)][1] != y.attr("starts"):
                return None
            out[id(x)] = (x, y.attr("starts"))
        elif x.attrs != y.attrs:
            return None
        stack.extend(zip(x.srcs, y.srcs, strict=True))
    return out


def shift(e: Expr, by: int | Expr) -> Expr:
    """Index ``e`` moved by ``by`` (a SLICE's start, a CONCAT part's offset; an
    expression where parts folded into one loop read theirs from a table)."""
    if isinstance(by, Expr):
        return Expr(f"({e.code} + {by.code})", e.vars | by.vars)
    if by == 0:
        return e
    if e.code.isdigit():
        return Expr(str(int(e.code) + by))
    return Expr(f"({e.code} {'+' if by > 0 else '-'} {abs(by)})", e.vars)


def reshape_groups(src: tuple[int, ...], dst: tuple[int, ...]
                   ) -> list[tuple[list[int], list[int]]] | None:
    """Runs of consecutive dims of ``src`` and ``dst`` with equal products (what a
    row-major reshape maps onto each other); None for an empty shape."""
    if 0 in src or 0 in dst:
        return None
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(src) and j < len(dst):
        si, dj = [i], [j]
        ps, pd = src[i], dst[j]
        i, j = i + 1, j + 1
        while ps != pd:
            if ps < pd:
                ps *= src[i]
                si.append(i)
                i += 1
            else:
                pd *= dst[j]
                dj.append(j)
                j += 1
        groups.append((si, dj))
    return groups  # trailing size-1 dims of either side need no index


def gemm_step_name(index: int) -> str:
    return f"g{index}"


def render_gemm(name: str, d: GemmDesc, slots: dict[BufRef, int],
                epilogue: str | None = None, packed_slot: int | None = None) -> str:
    """A GEMM step as a call of the BLAS driver (compiler/blas.py) with a constant
    descriptor; the operands' pointers come from the slot table like any kernel's.
    ``epilogue`` names a row-range kernel the driver runs on each tile it finishes;
    ``packed_slot`` is the table slot where a launch may pass a packed copy of B (NULL:
    none; the driver checks that a copy matches the product before it uses it)."""

    def field(v: int | tuple[int, ...]) -> str:
        return "{" + ", ".join(map(str, v)) + "}" if isinstance(v, tuple) else str(v)

    fields = ", ".join(f".{k} = {field(v)}" for k, v in blas.desc_fields(d).items())
    epi = f"(hg_epilogue_fn){epilogue}" if epilogue else "0"
    packed = f"B[{packed_slot}]" if packed_slot is not None else "0"
    return (f"void {name}(void **B) {{\n"
            f"  static const hg_gemm_desc d = {{{fields}}};\n"
            f"  hg_gemm_rt(&d, B[{slots[d.a.ref]}], B[{slots[d.b.ref]}], B[{slots[d.c.ref]}], "
            f"{epi}, B, {packed});\n"
            "}")


GEMM_BINDING = ("HG_GLOBAL(hg_gemm_fn hg_gemm_rt, 0);\n#ifndef HG_PART\n"
                "void hg_bind_gemm(void *fn) { hg_gemm_rt = (hg_gemm_fn)fn; }\n#endif")


def rows_name(name: str) -> str:
    return f"{name}_rows"


def computed_in_place(v: Value, sched: Schedule) -> list[Value]:
    """``v`` and the reshapes under it down to the value a kernel storing ``v``
    computes, the last, whose shape its loops run over: through reshapes of values
    nothing stores, their first source (a reshape's bytes are its source's, so the
    source is computed in place)."""
    chain = [v]
    while chain[-1].op is Op.RESHAPE and id(chain[-1].srcs[0]) not in sched.buffers:
        chain.append(chain[-1].srcs[0])
    return chain


def fusable_epilogue(gemm: GemmPlan, k: KernelPlan, sched: Schedule,
                     tile_values: frozenset[int] = frozenset()) -> bool:
    """Whether kernel ``k`` may run per GEMM tile, on the rows that tile just wrote.

    A tile is whole rows of the product (``n`` elements each, batch rows flattened),
    and the kernel then runs over the same rows of its own value. That is right when
    everything in ``k`` that depends on the product (or on ``tile_values``: what
    earlier epilogue kernels stored for the same rows) is element-wise or a reshape,
    with the product's element count and last dimension: each element then reads
    only the element at its own row-major position, which its tile has written.
    Reductions, permutes, expands or slices of the product would read other rows.
    A reshape is allowed because ``linear`` on a 3-D input is a 2-D GEMM viewed back
    as 3-D; the bias add and activation after it are still per row. The kernel's own
    rows may be shorter than the product's when they divide them (a 1x1 convolution's
    product ``[B, 1, C, H*W]`` viewed as ``[B, C, H, W]``): a tile's rows are then
    whole runs of the kernel's rows (``rows_kernel``), and element positions still match.
    """
    g = gemm.value
    v = k.sinks[0][0]
    if k.siblings or not g.shape or v is g or not all(x.shape == v.shape for x, _ in k.sinks):
        return False
    n = g.shape[-1]
    rows = computed_in_place(v, sched)[-1].shape  # the shape the kernel's loops run over
    if not rows or rows[-1] < 1 or n % rows[-1]:
        return False

    def same_elements(x: Value) -> bool:  # row-major positions carry over
        return x.ndim >= 1 and x.size == g.size

    sources = tile_values | {id(g)}
    depends: dict[int, bool] = {}
    stack = [v]
    order: list[Value] = []
    seen: set[int] = set()
    while stack:  # the kernel's expression tree, stopping at buffers
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        order.append(x)
        if id(x) in sources or (id(x) in sched.buffers and x is not v):
            continue
        stack.extend(x.srcs)
    for x in reversed(order):  # sources before users
        if id(x) in sources:
            depends[id(x)] = True
            continue
        if id(x) in sched.buffers and x is not v:
            depends[id(x)] = False
            continue
        if group(x.op) is Group.REDUCE:
            return False
        depends[id(x)] = any(depends.get(id(s), False) for s in x.srcs)
        if depends[id(x)] and not (same_elements(x) and (group(x.op) in ELEMENTWISE
                                                         or x.op is Op.RESHAPE)):
            return False
    return depends.get(id(v), False)


#: bf16 on the CPU: GCC before 13 has no ``__bf16`` on x86 and no compiler computes in
#: it, so a bf16 element is its 16 bits in a struct (a load or store the renderer did not
#: convert cannot compile) and converts to float exactly (the bits are the top half of
#: the float's) and back to nearest even. From f64 it rounds once: to float rounding to
#: odd (toward zero, the last bit set if inexact), then to bf16, which is the one
#: rounding f64 -> bf16 because float keeps more than two bits beyond bf16's.
BF16_C = r"""
typedef struct { uint16_t bits; } hg_bf16;
static inline float hg_bf16_to_f32(hg_bf16 h) {
  union { uint32_t u; float f; } c; c.u = (uint32_t)h.bits << 16; return c.f; }
static inline hg_bf16 hg_bf16_of_f32(float f) {
  union { float f; uint32_t u; } c; c.f = f; hg_bf16 h;
  if ((c.u & 0x7fffffffu) > 0x7f800000u) { h.bits = (uint16_t)((c.u >> 16) | 0x40u); return h; }
  c.u += 0x7fffu + ((c.u >> 16) & 1u); h.bits = (uint16_t)(c.u >> 16); return h; }
static inline hg_bf16 hg_bf16_of_f64(double d) {
  union { float f; uint32_t u; } c; c.f = (float)d;
  if (d == d && (double)c.f != d) { if (fabs((double)c.f) > fabs(d)) c.u -= 1u; c.u |= 1u; }
  return hg_bf16_of_f32(c.f); }
#define hg_rn_bf16(x) _Generic((x), double: hg_bf16_to_f32(hg_bf16_of_f64(x)), \
                               default: hg_bf16_to_f32(hg_bf16_of_f32(x)))
""".strip()

#: f16 on the CPU: a struct over the uint16 bits (as bf16), converted by integer and
#: float arithmetic GCC vectorizes. GCC 12's ``_Float16`` conversions (``vcvtph2ps``)
#: do not vectorize without AVX-512 FP16 ("unsupported data-type"), and an f16 loop
#: ran one element at a time: a float16 stencil under ``@hg.jit`` 17x Inductor's time
#: (docs/perf.md, session 37). Each conversion rounds once, to nearest even, checked
#: against ``_Float16``'s on every float32 and every float16 (session 37, a C harness;
#: ``tests/test_cpu_half.py`` runs every float16, every tie and its neighbours, and
#: random bit patterns against NumPy's): ``hg_rn_f16_f32`` adds and subtracts
#: 1.5 * 2^(e + 13), e the binade of |x| (at least -14, the subnormals'), so the
#: float addition itself rounds |x| to float16's spacing there, to nearest even; from
#: 65520 up it is infinity, and NaN stays NaN. A float16 is widened by a multiply
#: that rebiases its exponent (subnormals included), and a double is first rounded to
#: float toward zero with its last bit set when inexact (round to odd), so the f16
#: rounding after it is the one a direct rounding would give.
F16_C = r"""
typedef struct { uint16_t bits; } hg_f16;
static inline uint32_t hg_f16_u(float f) { uint32_t u; __builtin_memcpy(&u, &f, 4); return u; }
static inline float hg_f16_f(uint32_t u) { float f; __builtin_memcpy(&f, &u, 4); return f; }
static inline float hg_rn_f16_f32(float x) {
  const float a = fabsf(x);
  const float e = hg_f16_f(hg_f16_u(a) & 0x7f800000u);  /* 2^floor(log2 a) */
  const float c = (e > 0x1p-14f ? e : 0x1p-14f) * 0x1.8p13f;
  const float r = a >= 65520.0f ? INFINITY : (a + c) - c;
  return copysignf(r, x); }
static inline float hg_rn_f16_f64(double d) {
  uint32_t u = hg_f16_u((float)d);
  if (d == d && (double)hg_f16_f(u) != d) {
    if (fabs((double)hg_f16_f(u)) > fabs(d)) u -= 1u;
    u |= 1u; }
  return hg_rn_f16_f32(hg_f16_f(u)); }
static inline hg_f16 hg_f16_of_f32(float x) {
  const float y = hg_rn_f16_f32(x), a = fabsf(y);
  const uint32_t u = hg_f16_u(y);
  uint32_t h = a < 0x1p-14f ? (uint32_t)(int32_t)(a * 0x1p24f)
                            : ((u & 0x7fffffffu) >> 13) - ((127u - 15u) << 10);
  h = a > 65504.0f ? 0x7c00u : h;
  h = y != y ? 0x7e00u | ((u >> 13) & 0x3ffu) : h;
  hg_f16 r; r.bits = (uint16_t)(((u >> 16) & 0x8000u) | h); return r; }
static inline float hg_f16_to_f32(hg_f16 h) {
  const uint32_t b = h.bits, o = (b & 0x7fffu) << 13;
  float f = hg_f16_f(o) * 0x1p112f;
  f = (b & 0x7c00u) == 0x7c00u ? hg_f16_f(o | 0x7f800000u) : f;
  return hg_f16_f(hg_f16_u(f) | ((b & 0x8000u) << 16)); }
#define hg_rn_f16(x) _Generic((x), double: hg_rn_f16_f64(x), default: hg_rn_f16_f32(x))
""".strip()

#: dtype -> its C spelling on the CPU (compiler/half_floats.py says how it computes).
C_HALF: dict[str, HalfType] = {
    "f16": HalfType("hg_f16", "hg_rn_f16", "hg_f16_to_f32({0})", "hg_f16_of_f32({0})", F16_C),
    "bf16": HalfType("hg_bf16", "hg_rn_bf16", "hg_bf16_to_f32({0})", "hg_bf16_of_f32({0})",
                     BF16_C),
}


class CPURenderer(HalfFloats, CRenderer):
    """The CPU's C: CRenderer with f16 and bf16 computed in float and rounded per
    instruction, as the reference interpreter and the CUDA backend compute them."""

    HALF = C_HALF
    suffix: ClassVar[dict[str, str]] = {"f32": "f", "f64": "", "f16": "f", "bf16": "f"}


def epilogue_name(gemm_name: str) -> str:
    return f"{gemm_name}_epilogue"


#: Whether a rendering pass collects every step's NeedsMaterialize before raising
#: (one re-plan for all) rather than raising at the first.
BATCH_MATERIALIZE = True


def _render_step(r: CPURenderer, sched: Schedule, slots: dict[BufRef, int],
                 gemms: dict[int, GemmDesc], fused: set[int], i: int,
                 step: KernelPlan | AttentionPlan | GemmPlan,
                 units: list[Unit], names: list[str]) -> None:
    """Render step ``i`` into ``units`` and ``names`` (a GEMM with the kernels fused
    into it as its epilogue, which join ``fused``)."""
    steps = sched.steps
    if isinstance(step, KernelPlan):
        units.append(Unit(step.name, (step.name,), r.kernel(step)))
        names.append(step.name)
    elif isinstance(step, AttentionPlan):  # a call of the attention driver
        units.append(Unit(step.name, (step.name,), attention.render_step(
            step.name, attention.describe(step, sched.buffers), slots)))
        names.append(step.name)
    elif i in gemms:
        # The kernels right after the GEMM that work per row of it run on each tile
        # while it is in cache: e.g. bias add (stored for backward), then GELU.
        chain: list[KernelPlan] = []
        tile_values: frozenset[int] = frozenset()
        for nxt in steps[i + 1:]:
            if not (isinstance(nxt, KernelPlan)
                    and fusable_epilogue(step, nxt, sched, tile_values)):
                break
            chain.append(nxt)
            tile_values |= {id(x) for x, _ in nxt.sinks}
        name = gemm_step_name(i)
        epilogue = None
        unit = []
        for j, kp in enumerate(chain, start=i + 1):
            unit.append(r.rows_kernel(kp, step.value.shape[-1]))
            fused.add(j)
        if len(chain) == 1:
            epilogue = rows_name(chain[0].name)
        elif chain:
            epilogue = epilogue_name(name)
            unit.append(f"void {epilogue}(void **B, int64_t lo, int64_t hi) {{\n"
                        + "".join(f"  {rows_name(kp.name)}(B, lo, hi);\n" for kp in chain)
                        + "}")
        names.append(name)
        unit.append(render_gemm(name, gemms[i], slots, epilogue,
                                slots.get(packed_ref(i))))
        units.append(Unit(name, (name, *(kp.name for kp in chain)), "\n\n".join(unit)))


def render_kernels(sched: Schedule, slots: dict[BufRef, int], prelude: str,
                   gemms: dict[int, GemmDesc] | None = None,
                   fused: set[int] | None = None) -> str:
    """C for every kernel step, and for the GEMM steps in ``gemms`` (step index ->
    descriptor; the others stay NumPy calls). A kernel right after a C GEMM that is
    element-wise over the product runs inside it, per tile (its index is added to
    ``fused``). When every step is C, ``hg_run`` runs them all in one call."""
    gemms = gemms if gemms is not None else {}
    fused = fused if fused is not None else set()
    fused.clear()
    r = CPURenderer(sched, slots)
    parts = [prelude]
    if gemms:
        parts += [GEMM_DESC_C.strip(), GEMM_BINDING]
    if any(isinstance(st, AttentionPlan) for st in sched.steps):
        parts += [attention.DESC_C.strip(), attention.BINDING]
    units: list[Unit] = []  # one per launch step: what cc may build in a part of its own
    names = []
    steps = sched.steps
    wanted: list[Value] = []  # values steps asked to have buffers (NeedsMaterialize)
    for i, step in enumerate(steps):
        if i in fused:
            continue
        try:
            _render_step(r, sched, slots, gemms, fused, i, step, units, names)
        except NeedsMaterialize as e:  # every step of this pass asks: one re-plan for all
            if not BATCH_MATERIALIZE:
                raise
            wanted += e.values
    if wanted:
        raise NeedsMaterialize(wanted[0], wanted[1:])
    if r.uses_index_fail:  # a kernel range-checks indices into the launch's error record
        parts.insert(1, INDEX_FAIL_C)
    if r.specials:
        parts.insert(1, special_math.c_source(r.specials))
    parts[1:1] = list(r.sort_helpers.values())
    parts[1:1] = r.half_preludes()  # before anything that spells their types
    texts = shared_bodies.share(units)  # a model's repeated layers compile once
    if len(names) + len(fused) == len(steps) and len(names) > 1:
        texts.append("".join(f"void {n}(void **B);\n" for n in names)
                     + "void hg_run(void **B) {\n"
                     + "".join(f"  {n}(B);\n" for n in names) + "}")
    # Everything before the first unit is the header every part repeats (cc.py).
    return "\n\n".join(parts + [f"{PART_MARK}\n{t}" for t in texts]) + "\n"
