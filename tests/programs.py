"""Random Atlas ISA programs for differential tests (hypothesis strategies)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

from hologram.backends.reference import evaluate
from hologram.isa import Op
from hologram.isa import builder as b
from hologram.isa.builder import Var

UNARY = [Op.NEG, Op.ABS, Op.EXP, Op.LOG, Op.SQRT, Op.RSQRT, Op.RECIP, Op.TANH, Op.SIGMOID,
         Op.ERF, Op.SIN, Op.COS]
BINARY = [Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.MIN, Op.MAX, Op.POW]
REDUCE = [Op.RSUM, Op.RMAX, Op.RMIN, Op.RPROD]
CONSTS = [0.0, -0.0, 1.0, -1.0, 2.0, 0.5, 3.0, float("nan"), float("inf"), float("-inf")]
SPECIAL = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-40, 3e38, -3e38]


@st.composite
def shapes(draw, max_dims: int = 3) -> tuple[int, ...]:
    nd = draw(st.integers(0, max_dims))
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


def _cat_step(x: Var, y: Var, i: int, j: int) -> Var:
    """x joined with y along an axis where their other sizes agree, else with a
    computed value of its own shape (so parts of every kind meet in one CONCAT)."""
    axis = j % x.ndim
    other = y if y.ndim == x.ndim and all(
        a == b for d, (a, b) in enumerate(zip(x.shape, y.shape, strict=True)) if d != axis) else -x
    parts = [x.v, other.v] if i % 2 else [other.v, x.v, x.v]
    return Var(b.concat(parts, axis))


@st.composite
def programs(draw, dtype: str = "f32", max_ops: int = 8, gemm: bool = False):
    """(program builder fn, input specs): 1-3 inputs whose shapes broadcast together.
    ``gemm``: also draw (batched) matrix products among the steps."""
    base = draw(shapes())
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
            ["gemm"] * (2 * gemm)
        kind = draw(st.sampled_from(kinds))
        plan.append((kind, draw(st.integers(0, 10_000)), draw(st.integers(0, 10_000))))

    def fn(*xs: Var):
        vals = list(xs)
        for kind, i, j in plan:
            x = vals[i % len(vals)]
            y = vals[j % len(vals)]
            try:
                if kind == "u":
                    vals.append(Var(b.unary(UNARY[j % len(UNARY)], x.v)))
                elif kind == "b":
                    vals.append(Var(b.elementwise(BINARY[i % len(BINARY)], x.v, y.v)))
                elif kind == "c":
                    c = CONSTS[j % len(CONSTS)]
                    vals.append(x * c if i % 2 else x + c)
                elif kind == "r" and x.ndim:
                    axis = j % x.ndim
                    r = Var(b.reduce(REDUCE[i % len(REDUCE)], x.v, axis, keepdims=True))
                    vals.append(r if i % 3 else r + x)  # often broadcast back over x
                elif kind == "sel":
                    vals.append((x < y).where(x, y))
                elif kind == "mad":
                    vals.append(x * y + x)
                elif kind == "perm" and x.ndim >= 2:
                    vals.append(x.T)
                elif kind == "reshape":
                    vals.append(_reshape_step(x, i))
                elif kind == "slice" and x.ndim:
                    vals.append(_slice_step(x, i, j))
                elif kind == "cat" and x.ndim:
                    vals.append(_cat_step(x, y, i, j))
                elif kind == "gemm" and x.ndim:
                    vals.append(_gemm_step(x, y))
            except ValueError:
                continue  # shapes that do not broadcast: skip the step
        outs = vals[len(xs):] or vals
        return outs[-1], outs[len(outs) // 2]

    return fn, specs


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


def compiled_and_reference(ex, program, inputs: list[np.ndarray]
                           ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(what executor ``ex`` computes, what the reference interpreter computes) for
    ``program`` on ``inputs``."""
    want, _ = evaluate(program, inputs)
    got = [np.empty(s, d.np_dtype) for d, s in program.output_specs]
    ex.launch(program, inputs, got)
    return got, want
