"""Random Atlas ISA programs for differential tests (hypothesis strategies)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from hologram.backends.reference import evaluate
from hologram.isa import Op
from hologram.isa import builder as b
from hologram.isa.builder import Var
from hologram.isa.dtypes import to_dtype
from hologram.isa.opcodes import MATH_UNARY, SCATTER_STEP

UNARY = [Op.NEG, Op.ABS, Op.EXP, Op.LOG, Op.SQRT, Op.RSQRT, Op.RECIP, Op.TANH, Op.SIGMOID,
         Op.ERF, Op.SIN, Op.COS, Op.FLOOR, Op.CEIL, Op.TRUNC, Op.RINT, Op.LOG1P, Op.EXPM1,
         *MATH_UNARY, Op.LGAMMA, Op.DIGAMMA]
BINARY = [Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.MIN, Op.MAX, Op.POW, Op.FMOD, Op.ATAN2, Op.HYPOT,
          Op.COPYSIGN, Op.ZETA]
#: The scatters, by their combining step (SCATTER_STEP's keys).
SCATTERS = list(SCATTER_STEP)
REDUCE = [Op.RSUM, Op.RMAX, Op.RMIN, Op.RPROD]
CONSTS = [0.0, -0.0, 1.0, -1.0, 2.0, 0.5, 3.0, float("nan"), float("inf"), float("-inf")]
SPECIAL = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-40, 3e38, -3e38]


@st.composite
def shapes(draw, max_dims: int = 3, min_dims: int = 0) -> tuple[int, ...]:
    nd = draw(st.integers(min_dims, max_dims))
    return tuple(draw(st.sampled_from([0, 1, 1, 2, 3, 5, 8])) for _ in range(nd))


def _swap_last(x: Var) -> Var:
    """x with its last two axes swapped ([*batch, m, k] -> [*batch, k, m])."""
    return x.permute((*range(x.ndim - 2), x.ndim - 1, x.ndim - 2))


def _gemm_step(x: Var, y: Var) -> Var:
    """A (batched) matrix product that always fits: x @ swap(y) when the sizes allow
    (batch dims broadcast), else x @ swap(x); 1-D x is a dot product."""
    if x.ndim == 1:
        return x @ x
    if y.ndim >= 2 and y.shape[-1] == x.shape[-1]:
        try:
            return x @ _swap_last(y)
        except ValueError:
            pass  # batch dims that do not broadcast
    return x @ _swap_last(x)


def _slice_step(x: Var, i: int, j: int) -> Var:
    """A window of x along one axis (start and size from the draws, possibly empty)."""
    axis = j % x.ndim
    n = x.shape[axis]
    start = i % (n + 1)
    size = (j // 7) % (n - start + 1)
    return x.slice(tuple(start if d == axis else 0 for d in range(x.ndim)),
                   tuple(size if d == axis else s for d, s in enumerate(x.shape)))


def _reshape_step(x: Var, i: int) -> Var:
    """x with leading axes merged, a unit axis put in, or flattened: the first two keep
    the row length (a GEMM's epilogue may still run per tile), flattening changes it."""
    if i % 3 == 0 and x.ndim >= 2:
        return x.reshape((math.prod(x.shape[:-1]), x.shape[-1]))
    if i % 3 == 1:
        return x.reshape((*x.shape[:-1], 1, x.shape[-1]) if x.ndim else (1,))
    return x.reshape((math.prod(x.shape),))


#: The view steps both generators draw (``_movement_step``).
_MOVEMENT_KINDS = ("perm", "reshape", "slice")


def _movement_step(kind: str, x: Var, i: int, j: int) -> Var | None:
    """One of the view steps both generators draw (``_MOVEMENT_KINDS``), or None."""
    if kind == "perm" and x.ndim >= 2:
        return x.T
    if kind == "reshape":
        return _reshape_step(x, i)
    if kind == "slice" and x.ndim:
        return _slice_step(x, i, j)
    return None


def _cat_step(x: Var, y: Var, i: int, j: int) -> Var:
    """x joined with y along an axis where their other sizes agree, else with a
    computed value of its own shape (so parts of every kind meet in one CONCAT)."""
    axis = j % x.ndim
    other = y if y.ndim == x.ndim and all(
        a == b for d, (a, b) in enumerate(zip(x.shape, y.shape, strict=True)) if d != axis) else -x
    parts = [x.v, other.v] if i % 2 else [other.v, x.v, x.v]
    return Var(b.concat(parts, axis))


def _indices(x: Var, y: Var, axis: int, i: int, idt: str) -> tuple[Var, bool]:
    """(indices into ``axis`` of ``x``, in range and computed by the program, whether they
    came from ``y``). From ``y``'s values (NaN to 0, doubled, clamped, cast: many
    duplicates at the ends) when ``y`` fits (``x``'s rank and dtype, no larger off the
    axis); else IOTA arithmetic over ``x``'s shape with the axis resized (and sometimes
    the last other axis shortened): reversed, doubled or shifted, then clamped."""
    n = x.shape[axis]
    fits = y.ndim == x.ndim and y.dtype is x.dtype and (n > 0 or y.v.size == 0) and all(
        a <= c for d, (a, c) in enumerate(zip(y.shape, x.shape, strict=True)) if d != axis)
    if fits and i % 3:
        clean = y.eq(y).where(y, 0.0)
        return (clean * 2.0).maximum(0.0).minimum(float(max(n - 1, 0))).cast(idt), True
    m = [n, 1, 2 * n + 1, 3][i % 4] if n else 0
    shape = [m if d == axis else s for d, s in enumerate(x.shape)]
    last = next((d for d in reversed(range(x.ndim)) if d != axis and shape[d] > 1), None)
    if i % 5 == 0 and last is not None:
        shape[last] -= 1
    io = Var(b.iota(tuple(shape), axis, idt))
    step = [(m - 1) - io, io * 2, io - 1][i % 3]
    return step.maximum(0).minimum(max(n - 1, 0)), False


def _index_step(kind: str, x: Var, y: Var, i: int, j: int, idt: str) -> Var:
    """One IOTA, GATHER, SCATTER (any of :data:`SCATTERS`), scan or ARGSORT over ``x``
    (``y`` may give the indices). A sort's positions are used both ways: the sorted
    values (a GATHER at them) plus the positions themselves as values."""
    axis = j % x.ndim
    if kind == "iota":
        io = Var(b.iota(x.shape, axis, x.dtype))
        return x * io if i % 2 else x + io
    if kind == "scan":
        return Var((b.cumsum if i % 2 else b.cumprod)(x.v, axis))
    if kind == "sort":
        pos = Var(b.argsort(x.v, axis, descending=bool(i % 2), dtype=idt))
        return Var(b.gather(x.v, pos.v, axis)) + pos.cast(x.dtype)
    idx, from_y = _indices(x, y, axis, i, idt)
    if kind == "gather":
        return Var(b.gather(x.v, idx.v, axis))
    src = y if from_y else Var(b.gather(x.v, idx.v, axis)) * 2.0
    op = SCATTERS[j % len(SCATTERS)]
    return Var(b.make(op, (x.v, idx.v, src.v), {"axis": axis}))


def _attn_step(x: Var, y: Var, i: int, j: int) -> Var:
    """Attention with x as the queries ([*batch, L, E]); keys and values from y when its
    batch dims and E match (so L != S), else from x; causal on odd draws; the output or
    (one draw in three) the row log-sum-exp."""
    fits = y.ndim == x.ndim and y.shape[:-2] == x.shape[:-2] and y.shape[-1] == x.shape[-1]
    kv = y if fits and j % 2 else x
    out, lse = b.attention(x.v, kv.v, (-kv).v, causal=bool(i % 2), scale=[None, 0.5][j % 2])
    return Var(lse) if i % 3 == 0 else Var(out)


def _replay(plan: list[tuple[str, int, int]],
            step: Callable[[str, int, int, Var, Var], Var | None]) -> Callable[..., Any]:
    """The program a drawn plan builds: each entry applies ``step`` to two earlier
    values (``None``: the step does not apply to them; a ValueError: their shapes do
    not broadcast, skip it); the outputs are the last new value and a middle one."""
    def fn(*xs: Var):
        vals = list(xs)
        for kind, i, j in plan:
            try:
                v = step(kind, i, j, vals[i % len(vals)], vals[j % len(vals)])
            except ValueError:
                continue
            if v is not None:
                vals.append(v)
        outs = vals[len(xs):] or vals
        return outs[-1], outs[len(outs) // 2]

    return fn


@st.composite
def programs(draw, dtype: str = "f32", max_ops: int = 8, gemm: bool = False,
             attention: bool = False,
             empty: bool = False, scans: bool = True,
             index_dtypes: tuple[str, ...] = ("i32", "i64")):
    """(program builder fn, input specs): 1-3 inputs whose shapes broadcast together.
    ``gemm``: also draw (batched) matrix products among the steps; ``attention``:
    attention (forward) steps. ``empty``: one axis
    of the base shape is 0, so most inputs and values are empty while reductions over
    that axis and products with it as the inner size are not. Index ops (IOTA, GATHER,
    the SCATTERs, ARGSORT) are drawn with ``index_dtypes`` (none: not drawn), scans when
    ``scans``; with neither, the draws are those from before index ops existed."""
    base = draw(shapes(min_dims=2 if attention else 1 if empty else 0))
    if empty:
        k = draw(st.integers(0, len(base) - 1))
        base = (*base[:k], 0, *base[k + 1:])
    n_in = draw(st.integers(1, 3))
    specs = []
    for _ in range(n_in):
        # each input is the base shape with some leading dims dropped or set to 1
        drop = draw(st.integers(0, len(base)))
        s = tuple(1 if draw(st.booleans()) and d != 0 else d for d in base[drop:])
        specs.append((dtype, s))
    plan = []
    for _ in range(draw(st.integers(1, max_ops))):
        kinds = ["u", "u", "b", "b", "c", "r", "sel", "mad", "perm", "slice", "cat",
                 "reshape"] + \
            ["gemm"] * (2 * gemm) + ["r"] * (3 * empty) + ["attn"] * (6 * attention) + \
            ["iota", "gather", "gather", "scatter", "sort"] * bool(index_dtypes) + \
            ["scan"] * scans
        kind = draw(st.sampled_from(kinds))
        plan.append((kind, draw(st.integers(0, 10_000)), draw(st.integers(0, 10_000))))
    idt = draw(st.sampled_from(index_dtypes)) if index_dtypes else "i32"

    def step(kind: str, i: int, j: int, x: Var, y: Var) -> Var | None:
        if kind == "u":
            return Var(b.unary(UNARY[j % len(UNARY)], x.v))
        elif kind == "b":
            return Var(b.elementwise(BINARY[i % len(BINARY)], x.v, y.v))
        elif kind == "c":
            c = CONSTS[j % len(CONSTS)]
            return x * c if i % 2 else x + c
        elif kind == "r" and x.ndim:
            axis = j % x.ndim
            r = Var(b.reduce(REDUCE[i % len(REDUCE)], x.v, axis, keepdims=True))
            return r if i % 3 else r + x  # often broadcast back over x
        elif kind == "sel":
            return (x < y).where(x, y)
        elif kind == "mad":
            return x * y + x
        elif kind in _MOVEMENT_KINDS:
            return _movement_step(kind, x, i, j)
        elif kind == "cat" and x.ndim:
            return _cat_step(x, y, i, j)
        elif kind == "gemm" and x.ndim:
            return _gemm_step(x, y)
        elif kind == "attn" and x.ndim >= 2:
            return _attn_step(x, y, i, j)
        elif kind in ("iota", "gather", "scatter", "scan", "sort") and x.ndim:
            return _index_step(kind, x, y, i, j, idt)
        return None

    return _replay(plan, step), specs


def random_inputs(specs, seed: int, special: bool = True) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for d, s in specs:
        a = np.asarray(rng.standard_normal(s) * 3).astype({"f32": np.float32,
                                                          "f64": np.float64}[d])
        if special and a.size:
            mask = np.asarray(rng.random(s) < 0.15)
            a[mask] = rng.choice(SPECIAL, size=int(mask.sum()))
        out.append(a.copy(order="C"))
    return out


def without_finite_overflow(arrays: list[np.ndarray]) -> list[np.ndarray]:
    """``arrays`` with their finite extremes (SPECIAL's +-3e38) brought to +-3e3,
    infinities, NaN and the rest kept: inputs of GEMMs compared across backends. A sum
    of products where +-3e38 meets ordinary values overflows or not by the order its
    terms are added in, and a row that also has an infinite term then ends at inf or at
    NaN accordingly. The ISA does not fix a GEMM's order (each BLAS blocks and uses FMA
    its own way): on one machine MKL and OpenBLAS (the reference's np.matmul) agreed on
    these inputs, on another (session 15, AMD Zen 3) they disagreed on a few elements."""
    out = []
    for a in arrays:
        f = a.astype(np.float64)
        big = np.isfinite(f) & (np.abs(f) > 1e30)
        f[big] = np.sign(f[big]) * 3e3
        out.append(f.astype(a.dtype))
    return out


CANARY = 0xA5  # the byte around every compiled output
CANARY_PAD = 64  # canary bytes before and after each output


def canary_outputs(specs) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(outputs, the byte buffers holding them): each output C-contiguous inside its own
    buffer with CANARY_PAD canary bytes either side, so a kernel that writes outside an
    output (element 0 of an empty one, a row past the end) changes a canary byte."""
    outs, backs = [], []
    for d, s in specs:
        dt = np.dtype(d.np_dtype)
        n = math.prod(s) * dt.itemsize
        back = np.full(n + 2 * CANARY_PAD, CANARY, np.uint8)
        outs.append(back[CANARY_PAD:CANARY_PAD + n].view(dt).reshape(s))
        backs.append(back)
    return outs, backs


def check_canaries(backs: list[np.ndarray]) -> None:
    """Raise AssertionError naming the output whose canary bytes a kernel overwrote."""
    for i, back in enumerate(backs):
        edges = np.concatenate([back[:CANARY_PAD], back[len(back) - CANARY_PAD:]])
        bad = np.flatnonzero(edges != CANARY)
        assert not bad.size, (f"outputs[{i}] ({len(back) - 2 * CANARY_PAD} bytes): a kernel "
                              f"wrote {bad.size} canary bytes outside it")


def compiled_and_reference(ex, program, inputs: list[np.ndarray]
                           ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(what executor ``ex`` computes, what the reference interpreter computes) for
    ``program`` on ``inputs``. Outputs sit between canary bytes that are checked after
    the launch: an out-of-bounds write fails here, not silently."""
    want, _ = evaluate(program, inputs)
    got, backs = canary_outputs(program.output_specs)
    ex.launch(program, inputs, got)
    check_canaries(backs)
    return got, want


def check_products(ex, program, specs, seed: int, k: int) -> None:
    """``program``'s GEMM results on ``ex`` against the reference interpreter, on random
    inputs with NaN and inf among them (finite products that would overflow left out):
    within 1e-5 relative, and 1e-5 of the largest finite result per term of a ``k``-term
    sum (the orders of summation differ), NaN exactly where the reference has one."""
    inputs = without_finite_overflow(random_inputs(specs, seed, special=True))
    got, want = compiled_and_reference(ex, program, inputs)
    for g, w in zip(got, want, strict=True):
        scale = max(1.0, float(np.nanmax(np.abs(np.where(np.isinf(w), 0, w)), initial=0)))
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * scale * k, equal_nan=True)
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))


# --- integer programs: the bitwise ops, shifts and wrapping arithmetic ----------------------
#: Every integer dtype of the ISA.
INT_DTYPES = ("i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64")
#: Binary ops drawn in integer programs: the bitwise ops, shifts, MIN/MAX and the
#: arithmetic, which wraps modulo 2**bits in every backend (NumPy's rule: C computes it
#: in the dtype's unsigned wrap type, WGSL's i32 arithmetic wraps itself).
INT_BINARY = [Op.AND, Op.OR, Op.XOR, Op.SHL, Op.SHR, Op.MIN, Op.MAX, Op.ADD, Op.SUB, Op.MUL]
#: Unary ops drawn in integer programs (NEG and ABS of the minimum wrap to it).
INT_UNARY = [Op.NOT, Op.NEG, Op.ABS]
#: Logical ops drawn on bool values inside integer programs.
BOOL_BINARY = [Op.AND, Op.OR, Op.XOR]


def shift_counts(bits: int) -> list[int]:
    """Shift counts at and around the edges: negative, 0, in range, bits and beyond."""
    return [-(2**31), -65, -1, 0, 1, bits - 1, bits, bits + 1, 2 * bits, 100]


@st.composite
def int_programs(draw, dtype: str = "i32", max_ops: int = 8,
                 casts: tuple[str, ...] = INT_DTYPES):
    """(program builder fn, input specs) over ``dtype`` inputs (any of INT_DTYPES):
    bitwise ops and shifts (counts from the inputs or :func:`shift_counts`, cast into the
    dtype, so an unsigned one wraps), wrapping +, -, *, NEG, ABS, NOT, MIN/MAX, bool
    logic (AND/OR/XOR/NOT of comparisons) choosing between values, bool->int casts, round
    trips through another integer dtype of ``casts`` (a narrowing keeps the low bits),
    reductions (wrapping sums and products too) and movement (permute, slice, concat,
    reshape). Every value is of ``dtype``; shapes as :func:`programs` draws them."""
    base = draw(shapes(min_dims=1))
    specs = []
    for _ in range(draw(st.integers(1, 3))):
        drop = draw(st.integers(0, len(base)))
        specs.append((dtype, tuple(1 if draw(st.booleans()) and d != 0 else d
                                   for d in base[drop:])))
    kinds = ["b"] * 6 + ["k"] * 3 + ["u", "logic", "logic", "cvt", "via", "r", "perm",
                                     "slice", "cat", "reshape"]
    plan = [(draw(st.sampled_from(kinds)), draw(st.integers(0, 10_000)),
             draw(st.integers(0, 10_000))) for _ in range(draw(st.integers(2, max_ops)))]
    d = to_dtype(dtype)
    info = np.iinfo(d.np_dtype)

    def step(kind: str, i: int, j: int, x: Var, y: Var) -> Var | None:
        if kind == "b":
            return Var(b.elementwise(INT_BINARY[i % len(INT_BINARY)], x.v, y.v))
        elif kind == "k":
            count = shift_counts(d.bits)[j % 10] % 2**d.bits  # into the dtype, wrapped
            n = b.const(count - 2**d.bits if count > info.max else count, dtype, ())
            op = (Op.SHL, Op.SHR)[i % 2]
            return Var(b.elementwise(op, x.v, n))
        elif kind == "u":
            return Var(b.unary(INT_UNARY[i % len(INT_UNARY)], x.v))
        elif kind == "logic":
            m1, m2 = (x < y).v, (y < x).v if i % 3 else b.elementwise(Op.CMPEQ, x.v, y.v)
            m = (b.unary(Op.NOT, m1) if j % 4 == 0 else
                 b.elementwise(BOOL_BINARY[j % 3], m1, m2))
            return Var(m).where(x, y)
        elif kind == "cvt":
            return Var(b.cast(b.elementwise(Op.XOR, (x < y).v, (y < x).v), dtype))
        elif kind == "via" and casts:
            return Var(b.cast(b.cast(x.v, casts[j % len(casts)]), dtype))
        elif kind == "r" and x.ndim:
            op = (Op.RMAX, Op.RMIN, Op.RSUM, Op.RPROD)[i % 4]
            return Var(b.reduce(op, x.v, j % x.ndim, keepdims=True))
        elif kind in _MOVEMENT_KINDS:
            return _movement_step(kind, x, i, j)
        elif kind == "cat" and x.ndim:
            return Var(b.concat([x.v, b.unary(Op.NOT, x.v)], j % x.ndim))
        return None

    return _replay(plan, step), specs


def random_int_inputs(specs, seed: int) -> list[np.ndarray]:
    """Integers over the whole range, small ones (shift counts in and out of range;
    negative ones wrap into an unsigned dtype) and the edges: the minimum, the maximum,
    -1, 0 and the shift counts."""
    rng = np.random.default_rng(seed)
    out = []
    for d, s in specs:
        npd = np.dtype(to_dtype(d).np_dtype)
        info = np.iinfo(npd)
        a = rng.integers(info.min, info.max, s, dtype=npd, endpoint=True)
        if a.size:
            pick = rng.random(s)
            small = rng.integers(-70, 71, s).astype(npd)
            edges = np.array([int(info.min), int(info.max),
                              *(v % 2**(8 * npd.itemsize) if not info.min else
                                min(max(v, int(info.min)), int(info.max))
                                for v in [-1, 0, *shift_counts(npd.itemsize * 8)])],
                             dtype=npd)
            a = np.where(pick < 0.4, small, a)
            a = np.where(pick > 0.8, rng.choice(edges, size=s), a)
        out.append(np.ascontiguousarray(a))
    return out


def int_index_case(dtype: str, idt: str, seed: int = 1) -> tuple[Any, list[np.ndarray]]:
    """(program, inputs): CUMSUM, CUMPROD, SCATTER_ADD, SCATTER_MUL, SCATTER_MAX, GATHER
    and both ARGSORTs over integer ``dtype`` (positions and indices of ``idt``), on
    values over the whole range (sums and products wrap), with ties for the sorts and
    repeated indices for the scatters."""
    def fn(x: Var, y: Var, i: Var):
        outs = [b.cumsum(x.v, 1), b.cumprod(x.v, 0), b.scatter_add(x.v, i.v, y.v, 1),
                b.scatter_combine(x.v, i.v, y.v, 1, Op.MUL),
                b.scatter_combine(x.v, i.v, y.v, 0, Op.MAX), b.gather(x.v, i.v, 1),
                b.argsort(x.v, 1, dtype=idt), b.argsort(x.v, 0, descending=True, dtype=idt)]
        return tuple(Var(o) for o in outs)

    p = b.program(fn, [(dtype, (9, 40)), (dtype, (9, 40)), (idt, (9, 40))])
    rng = np.random.default_rng(seed)
    info = np.iinfo(to_dtype(dtype).np_dtype)
    x = rng.integers(info.min, info.max, (9, 40), dtype=info.dtype, endpoint=True)
    x[:, 0:39:3] = x[:, 1::3]  # ties
    y = rng.integers(info.min, info.max, (9, 40), dtype=info.dtype, endpoint=True)
    i = rng.integers(0, 9, (9, 40)).astype(to_dtype(idt).np_dtype)
    return p, [x, y, i]


#: Hypothesis settings of the half-precision random-program tests (CPU and emulated
#: CUDA): fewer examples, each a compile.
HALF_SETTINGS = settings(max_examples=25, deadline=None,
                         suppress_health_check=[HealthCheck.too_slow,
                                                HealthCheck.data_too_large])


def near_ties(t: np.dtype, n: int = 400, seed: int = 5) -> np.ndarray:
    """float64 values where converting to the 16-bit float ``t`` can round twice: ``n``
    exact midpoints between neighbours, ``n`` a hair (2**-40 relative) past them, and
    200 ordinary values: a conversion through f32 rounds a hair-past value to the tie,
    then to even, instead of to the far neighbour."""
    finite = np.unique(np.arange(2**16, dtype=np.uint16).view(t).astype(np.float64))
    finite = finite[np.isfinite(finite)]
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(finite) - 1, n, replace=False)
    mids = (finite[pick] + finite[pick + 1]) / 2
    hair = mids + np.where(rng.random(n) < 0.5, 1, -1) * np.abs(mids) * 2.0**-40
    return np.concatenate([mids, hair, rng.standard_normal(200) * 1e3])
