"""The index instructions: IOTA, GATHER, SCATTER, SCATTER_ADD, CUMSUM and CUMPROD.

Verifier rules and their messages, the text form, the reference interpreter against
NumPy in float64, compiled CPU kernels against the reference (random programs with
shapes 0 and 1, NaN/inf, duplicate indices), out-of-range indices (IndexError on every
launch path, never a stray access), CUDA C through NVRTC, WGSL on lavapipe, the
scheduler and aliasing rules, and SCATTER_ADD's determinism across thread counts.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hologram as hg
from hologram.backends.reference import evaluate
from hologram.compiler import aliasing, nvrtc
from hologram.compiler.lower import lower
from hologram.compiler.render_cuda import render_cuda
from hologram.compiler.schedule import KernelPlan
from hologram.errors import DTypeError, VerifyError
from hologram.isa import Op, Program
from hologram.isa import builder as b
from hologram.isa.builder import Var
from hologram.isa.opcodes import INDEXED, SCATTER_STEP

from .programs import INT_DTYPES, SPECIAL, compiled_and_reference, int_index_case, shapes

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

NP = {"f32": np.float32, "f64": np.float64, "i32": np.int32, "i64": np.int64}


@pytest.fixture(scope="module")
def cpu(native_cpu: hg.Executor) -> hg.Executor:
    return native_cpu


def _data(rng: np.random.Generator, shape: tuple[int, ...], dtype: str = "f64",
          special: bool = True) -> np.ndarray:
    a = (rng.standard_normal(shape) * 3).astype(NP[dtype])
    if special and a.size:
        mask = rng.random(shape) < 0.2
        a[mask] = rng.choice(SPECIAL, size=int(mask.sum()))
    return a


def _same(got: np.ndarray, want: np.ndarray) -> None:
    """Equal bit for bit apart from a NaN's sign and payload, which no instruction can
    observe (compiled kernels add in the reference's order, so index ops and scans
    agree exactly, -0.0 included)."""
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape)
    nan = np.isnan(got) if got.dtype.kind == "f" else np.zeros(got.shape, bool)
    np.testing.assert_array_equal(nan, np.isnan(want) if want.dtype.kind == "f" else nan)
    np.testing.assert_array_equal(got[~nan], want[~nan])
    if got.dtype.kind == "f":
        np.testing.assert_array_equal(np.signbit(got[~nan]), np.signbit(want[~nan]))


def _run(ex: hg.Executor, p: Program, ins: list[np.ndarray]) -> list[np.ndarray]:
    got = [np.empty(s, d.np_dtype) for d, s in p.output_specs]
    ex.launch(p, ins, got)
    return got


# --- verifier -----------------------------------------------------------------------------
def _ld(d: str, s: tuple[int, ...], i: int = 0):
    return b.ldg(i, d, s)


@pytest.mark.parametrize("build, message", [
    (lambda: b.gather(_ld("f32", (5, 3)), _ld("f32", (4, 3), 1), 0), "index must be i32 or i64"),
    (lambda: b.gather(_ld("f32", (5, 3)), _ld("i64", (4,), 1), 0), "differ in rank"),
    (lambda: b.gather(_ld("f32", (5, 3)), _ld("i64", (4, 4), 1), 0),
     "larger than table [5, 3] on axis 1"),
    (lambda: b.gather(_ld("f32", (5, 3)), _ld("i64", (4, 3), 1), 2), "axis 2 is out of range"),
    (lambda: b.make(Op.GATHER, (_ld("f32", ()), _ld("i64", (), 1)), {"axis": 0}),
     "rank >= 1, got a scalar"),
    (lambda: b.make(Op.GATHER, (_ld("f32", (5,)), _ld("i64", (5,), 1)), {}),
     "needs axis= an axis in [0, 1), got None"),
    (lambda: b.scatter_add(_ld("f32", (5, 3)), _ld("i64", (4, 3), 1), _ld("f64", (4, 3), 2), 0),
     "src dtype f64 differs from base f32"),
    (lambda: b.scatter(_ld("f32", (5, 3)), _ld("i64", (4, 3), 1), _ld("f32", (4, 2), 2), 0),
     "src [4, 2] and index [4, 3] differ in shape"),
    (lambda: b.scatter(_ld("f32", (5, 3)), _ld("i32", (4, 4), 1), _ld("f32", (4, 4), 2), 0),
     "larger than base [5, 3] on axis 1"),
    (lambda: b.scatter_add(_ld("bool", (5,)), _ld("i32", (4,), 1), _ld("bool", (4,), 2), 0),
     "scatter_add is not defined on bool"),
    (lambda: b.iota((3, 4), 2, "f32"), "axis 2 is out of range"),
    (lambda: b.iota((3, 4), 0, "bool"), "iota needs an integer or floating-point dtype"),
    (lambda: b.make(Op.IOTA, (), {"axis": 0}, None, ()), "rank >= 1"),
    (lambda: b.cumsum(_ld("bool", (3,)), 0), "cumsum is not defined on bool"),
    (lambda: b.cumprod(_ld("f32", (3, 2)), -3), "axis -3 is out of range"),
    (lambda: b.scatter_combine(_ld("bool", (5,)), _ld("i32", (4,), 1), _ld("bool", (4,), 2), 0,
                               Op.MAX), "scatter_max is not defined on bool"),
    (lambda: b.scatter_combine(_ld("f32", (5,)), _ld("i32", (4,), 1), _ld("f32", (4,), 2), 0,
                               Op.SUB), "no scatter combines by sub"),
    (lambda: b.argsort(_ld("f32", (3, 2)), 0, dtype="f32"), "i32 or i64 positions, declared f32"),
    (lambda: b.argsort(_ld("f32", (3, 2)), 2), "axis 2 is out of range"),
    (lambda: b.make(Op.ARGSORT, (_ld("f32", (3,)),), {"axis": 0, "descending": 1}, "i64",
                    (3,)), "descending= True or False, got 1"),
    (lambda: b.make(Op.ARGSORT, (_ld("f32", ()),), {"axis": 0, "descending": False}, "i64",
                    ()), "rank >= 1, got a scalar"),
])
def test_verifier_rejects_with_a_clear_message(build, message):
    with pytest.raises(VerifyError) as e:
        build()
    assert message in str(e.value), str(e.value)


def test_verifier_accepts_index_smaller_off_the_axis_and_names_the_bad_line():
    v = b.gather(_ld("f32", (5, 3)), _ld("i32", (7, 2), 1), 0)  # torch.gather's rule
    assert (v.dtype.name, v.shape) == ("f32", (7, 2))
    assert b.scatter(_ld("f32", (5, 3)), _ld("i64", (9, 2), 1), _ld("f32", (9, 2), 2),
                     0).shape == (5, 3)
    text = ".in 0 f32[5,3]\n.in 1 i64[4,4]\n%0 = ldg.f32[5,3] in=0\n%1 = ldg.i64[4,4] in=1\n" \
           "%2 = gather.f32[4,4] %0, %1 axis=0\nstg.f32[4,4] %2 out=0"
    with pytest.raises(VerifyError, match=r"gather.f32\[4,4\] %0, %1 axis=0: .*larger than table"):
        Program.parse(text).verify()


# --- text form ----------------------------------------------------------------------------
def _all_ops(x: Var, i: Var, s: Var):
    g = Var(b.gather(x.v, i.v, 1))
    io = Var(b.iota(x.shape, 1, "f32"))
    return (g, Var(b.scatter_add(x.v, i.v, s.v, 1)), Var(b.scatter(x.v, i.v, s.v, 0)),
            Var(b.cumsum((x * io).v, 0)), Var(b.cumprod(x.v, 1)),
            *(x.scatter_combine(i, s, 1, step) for step in (Op.MUL, Op.MAX, Op.MIN)),
            x.argsort(1), x.argsort(0, descending=True, dtype="i32"))


def test_text_round_trip_keeps_every_op_and_attribute():
    p = b.program(_all_ops, [("f32", (4, 6)), ("i64", (3, 5)), ("f32", (3, 5))])
    text = p.text
    for op in ("iota.f32[4,6] axis=1", "gather.f32[3,5]", "scatter_add.f32[4,6]",
               "scatter.f32[4,6]", "cumsum.f32[4,6]", "cumprod.f32[4,6]",
               "scatter_mul.f32[4,6]", "scatter_max.f32[4,6]", "scatter_min.f32[4,6]",
               "argsort.i64[4,6] %0 axis=1 descending=False",
               "argsort.i32[4,6] %0 axis=0 descending=True"):
        assert op in text
    q = Program.parse(text)
    assert q == p and q.hash == p.hash
    assert q.text == text
    q.verify()


# --- the reference interpreter against NumPy (float64) ----------------------------------
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes(max_dims=3, min_dims=1), st.integers(0, 2**31), st.data())
def test_reference_matches_numpy(shape, seed, data):
    rng = np.random.default_rng(seed)
    axis = data.draw(st.integers(0, len(shape) - 1))
    n = shape[axis]
    m = data.draw(st.sampled_from([0, 1, 3, 7])) if n else 0
    ishape = tuple(m if d == axis else data.draw(st.integers(0, s)) for d, s in
                   enumerate(shape))
    idt = data.draw(st.sampled_from(["i32", "i64"]))
    x = _data(rng, shape)
    idx = rng.integers(0, max(n, 1), ishape).astype(NP[idt])  # duplicates when m > n
    src = _data(rng, ishape)

    def run(fn, *arrays):
        specs = [(a.dtype, a.shape) for a in arrays]
        p = b.program(lambda *vs: Var(fn(*(v.v for v in vs))), specs)
        return evaluate(p, list(arrays))[0][0]

    window = x[tuple(slice(None) if d == axis else slice(0, s) for d, s in enumerate(ishape))]
    np.testing.assert_array_equal(run(lambda t, i: b.gather(t, i, axis), x, idx),
                                  np.take_along_axis(window, idx.astype(np.intp), axis))
    coords = tuple(idx if d == axis else np.indices(ishape)[d] for d in range(len(shape)))
    want = x.copy()
    np.add.at(want, coords, src)
    np.testing.assert_array_equal(run(lambda t, i, s: b.scatter_add(t, i, s, axis), x, idx, src),
                                  want)
    want = x.copy()  # SCATTER: the last in row-major order (largest j[axis]) wins
    for j in np.ndindex(*ishape):
        want[tuple(idx[j] if d == axis else c for d, c in enumerate(j))] = src[j]
    np.testing.assert_array_equal(run(lambda t, i, s: b.scatter(t, i, s, axis), x, idx, src),
                                  want)
    for step, ufunc in ((Op.MUL, np.multiply), (Op.MAX, np.maximum), (Op.MIN, np.minimum)):
        want = x.copy()  # element by element in row-major order: NaN wins max and min
        for j in np.ndindex(*ishape):
            at = tuple(idx[j] if d == axis else c for d, c in enumerate(j))
            want[at] = ufunc(want[at], src[j])
        np.testing.assert_array_equal(
            run(lambda t, i, s, step=step: b.scatter_combine(t, i, s, axis, step), x, idx, src),
            want)
    np.testing.assert_array_equal(run(lambda t: b.cumsum(t, axis), x), np.cumsum(x, axis))
    np.testing.assert_array_equal(run(lambda t: b.cumprod(t, axis), x), np.cumprod(x, axis))
    io = evaluate(Program([b.stg(b.iota(shape, axis, "f64"), 0)]), [])[0][0]
    line = np.arange(n, dtype=np.float64).reshape([-1 if d == axis else 1 for d in
                                                   range(len(shape))])
    np.testing.assert_array_equal(io, np.broadcast_to(line, shape))


def test_reference_argsort_is_pytorchs_stable_sort():
    """ARGSORT's order, against torch.sort(stable=True) in float64 and int64: NaN last
    (first descending), -0.0 equal to 0.0, ties in their own order, on every axis."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    x = rng.integers(-3, 4, (6, 7, 5)).astype(np.float64)
    x[rng.random(x.shape) < 0.15] = np.nan
    x[rng.random(x.shape) < 0.1] = -0.0
    x[rng.random(x.shape) < 0.05] = np.inf
    ints = rng.integers(-2**62, 2**62, (6, 7, 5))
    ints[0, 0, :2] = np.iinfo(np.int64).min  # ~x negates it without overflow
    for a in (x, ints):
        for axis in range(3):
            for desc in (False, True):
                p = b.program(lambda v, axis=axis, desc=desc: v.argsort(axis, desc),
                              [(a.dtype, a.shape)])
                got = evaluate(p, [a])[0][0]
                want = torch.sort(torch.from_numpy(a), dim=axis, descending=desc,
                                  stable=True).indices.numpy()
                np.testing.assert_array_equal(got, want)


def test_reference_f32_scans_accumulate_in_f64():
    x = np.array([3e38, 3e38, -3e38, 1.0, 1e-8, -1.0], np.float32)
    p = b.program(lambda v: (Var(b.cumsum(v.v, 0)), Var(b.cumprod(v.v, 0))), [("f32", (6,))])
    (s, q), _ = evaluate(p, [x])
    np.testing.assert_array_equal(s, np.cumsum(x.astype(np.float64)).astype(np.float32))
    assert np.isfinite(s[2]) and s[2] == np.float32(3e38)  # f32 additions would be inf
    np.testing.assert_array_equal(q, np.cumprod(x.astype(np.float64)).astype(np.float32))
    z = evaluate(b.program(lambda v: Var(b.cumsum(v.v, 0)), [("f32", (2,))]),
                 [np.array([-0.0, -0.0], np.float32)])[0][0]
    assert np.signbit(z).all()  # NumPy's cumsum keeps -0.0


# --- compiled CPU kernels against the reference ------------------------------------------
@st.composite
def index_cases(draw, dtype: str):
    """A table, base or scan operand with 0 and 1 among its sizes, an axis, in-range
    indices with duplicates, and which op to run (fused with element-wise work)."""
    shape = draw(shapes(max_dims=3, min_dims=1))
    axis = draw(st.integers(0, len(shape) - 1))
    n = shape[axis]
    m = draw(st.sampled_from([0, 1, 2, 5, 9])) if n else 0
    ishape = tuple(m if d == axis else draw(st.integers(0, s)) for d, s in enumerate(shape))
    return (dtype, shape, axis, ishape, draw(st.sampled_from(["i32", "i64"])),
            draw(st.sampled_from(["gather", "take", "cumsum", "cumprod", "iota", "argsort",
                                  "argsort_desc", *SCATTERS])), draw(st.integers(0, 2**31)))


#: The scatters by name, each with its combining step (None: SCATTER writes).
SCATTERS = {op.value: step for op, step in SCATTER_STEP.items()}


def _case_program(case) -> tuple[Program, list[np.ndarray]]:
    dtype, shape, axis, ishape, idt, op, seed = case
    rng = np.random.default_rng(seed)
    x = _data(rng, shape, dtype)
    idx = rng.integers(0, max(shape[axis], 1), ishape).astype(NP[idt])
    src = _data(rng, ishape, dtype)
    specs = [(dtype, shape), (idt, ishape), (dtype, ishape)]

    def fn(t: Var, i: Var, s: Var):
        t2 = t * 2.0 + 1.0  # computed: the table is materialized, the rest fuses
        if op == "gather":
            return Var(b.gather(t2.v, i.v, axis)) * 3.0 - s
        if op == "take":
            return Var(b.take(t.v, i.reshape(i.v.size).v, axis)) * 0.5
        if op in SCATTERS:
            r = Var(b.make(Op(op), (t2.v, i.v, (s - 1.0).v), {"axis": axis}))
            return r, r.sum(axis, keepdims=True) + t  # also read by a later kernel
        if op.startswith("argsort"):  # ties among the specials (0.0 and -0.0, NaN, inf)
            r = Var(b.argsort(t2.v, axis, op.endswith("desc"), idt))
            return r, Var(b.gather(t.v, r.v, axis)) * 0.5
        if op == "iota":
            return t + Var(b.iota(shape, axis, dtype)), i.cast(dtype) * Var(b.iota(ishape,
                                                                                   axis, dtype))
        r = Var(getattr(b, op)(t2.v, axis))
        return r, r * t

    return b.program(fn, specs), [x, idx, src]


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_cpu_matches_reference(cpu, dtype):
    @settings(max_examples=120, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(index_cases(dtype))
    def check(case):
        p, ins = _case_program(case)
        got, want = compiled_and_reference(cpu, p, ins)
        for g, w in zip(got, want, strict=True):
            if case[5] in SCATTERS and g is got[1]:
                # a sum after: its terms may cancel, so the bound is on their size
                scale = got[0][np.isfinite(got[0])]
                atol = 1e-5 * float(np.abs(scale).max()) if scale.size else 0.0
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=atol, equal_nan=True)
            else:
                _same(g, w)

    check()


@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_cpu_index_ops_over_every_integer_dtype(cpu, dtype):
    """Scans and scatter sums/products wrap (accumulated in the wrap type), sorts order
    unsigned values as unsigned, bit for bit against the reference."""
    p, ins = int_index_case(dtype, "i64")
    got, want = compiled_and_reference(cpu, p, ins)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("axis", [0, 1])
def test_embedding_backward_and_column_scans(cpu, dtype, axis):
    """Sizes where the kernels run on threads: a scatter-add over axis 0 of [V, D]
    (columns in blocks), over axis 1 (a fiber per row), and scans both ways."""
    rng = np.random.default_rng(axis)
    v, d, n = 50, 300, 400
    shape, ishape = ((v, d), (n, d)) if axis == 0 else ((d, v), (d, n))
    idx = rng.integers(0, v, (n,))
    full = np.broadcast_to(idx.reshape((n, 1) if axis == 0 else (1, n)), ishape)

    def fn(g: Var, i: Var, t: Var):
        ii = Var(b.expand(b.reshape(i.v, (n, 1) if axis == 0 else (1, n)), ishape))
        return (Var(b.scatter_add(b.const(0.0, dtype, shape), ii.v, g.v, axis)),
                Var(b.scatter(t.v, ii.v, g.v, axis)), t.cumsum(axis), t.cumprod(axis))

    p = b.program(fn, [(dtype, ishape), ("i64", (n,)), (dtype, shape)])
    ins = [_data(rng, ishape, dtype), idx, _data(rng, shape, dtype, special=False) * 0.3]
    got, want = compiled_and_reference(cpu, p, ins)
    for g, w in zip(got, want, strict=True):
        _same(g, w)
    emb = np.zeros(shape, NP[dtype])
    np.add.at(emb, (full, np.indices(ishape)[1]) if axis == 0 else
              (np.indices(ishape)[0], full), ins[0])
    np.testing.assert_allclose(got[0], emb, rtol=1e-6, equal_nan=True)


def test_gather_reads_views_and_fuses_its_index(cpu):
    """The table through a transpose and a broadcast, the index computed from an IOTA:
    one kernel, no temp for the index."""
    def fn(x: Var):
        io = Var(b.iota((6, 4), 0, "i64"))
        idx = (io * 3 + 1).minimum(4)  # 1, 4, 4, 4, ... duplicates
        return Var(b.gather(x.T.v, idx.v, 0))

    p = b.program(fn, [("f64", (4, 5))])
    x = np.arange(20, dtype=np.float64).reshape(4, 5)
    (got,) = _run(cpu, p, [x])
    want = x.T[np.minimum(np.arange(6) * 3 + 1, 4)]
    np.testing.assert_array_equal(got, want)
    sched = cpu.compile(p).lowered.schedule
    assert len(sched.steps) == 1 and not sched.temps


# --- out-of-range indices -----------------------------------------------------------------
def _gather_program() -> Program:
    return b.program(lambda x, i: Var(b.gather(x.v, i.v, 0)) * 2.0,
                     [("f32", (5, 3)), ("i64", (4, 2))])


@pytest.mark.parametrize("bad", [5, 7, -1, -(2**40), 2**62])
def test_out_of_range_raises_on_every_path(cpu, bad):
    p = _gather_program()
    x = np.arange(15, dtype=np.float32).reshape(5, 3)
    idx = np.array([[0, 1], [4, 4], [2, 0], [1, 1]])
    good = [np.empty((4, 2), np.float32)]
    bad_idx = idx.copy()
    bad_idx[2, 1] = bad
    msg = rf"gather: index {bad} is out of range for axis 0 of size 5"
    with pytest.raises(IndexError, match=msg):
        evaluate(p, [x, bad_idx])
    with pytest.raises(IndexError, match=msg):  # Executor.launch
        cpu.launch(p, [x, bad_idx], good)
    cpu.launch(p, [x, idx], good)  # the record was reset: a good launch runs
    np.testing.assert_array_equal(good[0], 2 * x[idx, np.arange(2)])
    out = [np.empty((4, 2), np.float32)]
    arrays = [x, bad_idx.copy()]
    bound = cpu.bind(p, arrays, out)  # the bound fast path
    with pytest.raises(IndexError, match=msg):
        bound()
    arrays[1][...] = idx
    bound()
    np.testing.assert_array_equal(out[0], good[0])
    compiled = cpu.compile(p)
    launch = cpu.backend.pointer_launcher(compiled)  # raw addresses (hologram_torch's path)
    assert launch is not None
    with pytest.raises(IndexError, match=msg):
        launch([x.ctypes.data, bad_idx.ctypes.data, out[0].ctypes.data])
    launch([x.ctypes.data, idx.ctypes.data, out[0].ctypes.data])
    np.testing.assert_array_equal(out[0], good[0])
    with pytest.raises(IndexError, match=msg):  # its (reused) record still reports
        launch([x.ctypes.data, bad_idx.ctypes.data, out[0].ctypes.data])


@pytest.mark.parametrize("op", list(SCATTERS))
def test_scatter_out_of_range_raises_and_writes_nothing_outside(cpu, op):
    p = b.program(lambda x, i, s: Var(b.make(Op(op), (x.v, i.v, s.v), {"axis": 1})),
                  [("f64", (3, 4)), ("i32", (3, 6)), ("f64", (3, 6))])
    x, s = np.ones((3, 4)), np.full((3, 6), 5.0)
    idx = np.tile(np.arange(6, dtype=np.int32) % 4, (3, 1))
    idx[1, 3] = 4
    for run in (lambda: evaluate(p, [x, idx, s]), lambda: compiled_and_reference(cpu, p,
                                                                                   [x, idx, s])):
        with pytest.raises(IndexError, match=rf"{op}: index 4 is out of range for axis 1 "
                                             "of size 4"):
            run()
    got = [np.empty((3, 4))]
    with pytest.raises(IndexError):
        cpu.launch(p, [x, idx, s], got)  # clamped writes stayed inside: canaries above


def test_index_into_an_empty_axis_is_an_error_not_an_empty_value(cpu):
    p = b.program(lambda x, i: Var(b.gather(x.v, i.v, 0)), [("f32", (0, 3)), ("i32", (2, 3))])
    x, idx = np.zeros((0, 3), np.float32), np.zeros((2, 3), np.int32)
    with pytest.raises(IndexError, match="gather: index 0 is out of range for axis 0 of size 0"):
        evaluate(p, [x, idx])
    with pytest.raises(IndexError, match=r"axis 0 of the table \[0, 3\] is empty"):
        cpu.launch(p, [x, idx], [np.empty((2, 3), np.float32)])
    # no index at all: nothing to check, an empty result
    q = b.program(lambda x, i: Var(b.gather(x.v, i.v, 0)), [("f32", (0, 3)), ("i32", (0, 3))])
    assert _run(cpu, q, [x, np.zeros((0, 3), np.int32)])[0].shape == (0, 3)


# --- scheduling and aliasing ----------------------------------------------------------------
def test_a_stored_scatter_is_one_kernel_and_a_read_one_gets_a_buffer(cpu):
    specs = [("f32", (6, 4)), ("i64", (5, 4)), ("f32", (5, 4))]
    one = b.program(lambda x, i, s: Var(b.scatter_add((x * 2.0).v, i.v, s.exp().v, 0)), specs)
    steps = cpu.compile(one).lowered.schedule.steps
    assert len(steps) == 1 and isinstance(steps[0], KernelPlan)
    assert steps[0].sinks[0][0].op is Op.SCATTER_ADD
    two = b.program(lambda x, i, s: Var(b.cumsum(b.scatter(x.v, i.v, s.v, 0), 1)) + x, specs)
    sched = cpu.compile(two).lowered.schedule
    # each is its own kernel: the scan reads the scatter's buffer, the add the scan's
    assert [st.sinks[0][0].op for st in sched.steps] == [Op.SCATTER, Op.CUMSUM, Op.ADD]
    assert len(sched.temps) == 2


def test_in_place_update_refused_when_a_gather_reads_the_table(cpu):
    """An output written over its input is right only when each element is read to write
    itself; a GATHER reads the table at other coordinates."""
    specs = [("f32", (4, 3)), ("i64", (4, 3))]
    gathered = b.program(lambda x, i: x + Var(b.gather(x.v, i.v, 0)), specs)
    plain = b.program(lambda x, i: x + i.cast("f32"), specs)
    assert not aliasing.may_overwrite(cpu.compile(gathered).lowered.schedule, 0, 0)
    assert aliasing.may_overwrite(cpu.compile(plain).lowered.schedule, 0, 0)
    cumsum = b.program(lambda x: Var(b.cumsum(x.v, 0)), [("f32", (4, 3))])
    assert not aliasing.may_overwrite(cpu.compile(cumsum).lowered.schedule, 0, 0)


def test_gemm_product_read_by_a_gather_keeps_its_own_buffer(cpu):
    """A GEMM's product goes into its element-wise tail's buffer only when every read
    of it is element-wise; a GATHER reads it at other coordinates."""
    def fn(x: Var, w: Var, i: Var):
        g = x @ w
        return g * 2.0 + Var(b.gather(g.v, i.v, 0))

    p = b.program(fn, [("f64", (5, 4)), ("f64", (4, 3)), ("i32", (5, 3))])
    rng = np.random.default_rng(4)
    ins = [rng.standard_normal((5, 4)), rng.standard_normal((4, 3)),
           rng.integers(0, 5, (5, 3)).astype(np.int32)]
    got, want = compiled_and_reference(cpu, p, ins)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
    sched = cpu.compile(p).lowered.schedule
    gemm = next(st for st in sched.steps if not isinstance(st, KernelPlan))
    assert gemm.out.kind == "tmp"  # not the tail's output buffer


# --- determinism across thread counts ------------------------------------------------------
_DETERMINISM = textwrap.dedent("""
    import hashlib, sys
    import numpy as np
    import hologram as hg
    from hologram.isa import builder as b
    from hologram.isa.builder import Var
    rng = np.random.default_rng(0)
    v, d, n = 64, 1024, 3000
    def fn(g, i, h, j):
        ii = Var(b.expand(b.reshape(i.v, (n, 1)), (n, d)))
        jj = Var(b.expand(b.reshape(j.v, (1, n)), (512, n)))
        return (Var(b.scatter_add(b.const(0.0, "f32", (v, d)), ii.v, g.v, 0)),
                Var(b.scatter_add(b.const(0.0, "f32", (512, v)), jj.v, h.v, 1)))
    p = b.program(fn, [("f32", (n, d)), ("i64", (n,)), ("f32", (512, n)), ("i64", (n,))])
    ins = [rng.standard_normal((n, d)).astype(np.float32), rng.integers(0, v, n),
           rng.standard_normal((512, n)).astype(np.float32), rng.integers(0, v, n)]
    out = [np.empty((v, d), np.float32), np.empty((512, v), np.float32)]
    hg.default_executor("cpu").launch(p, ins, out)
    want, _ = __import__("hologram.backends.reference", fromlist=["x"]).evaluate(p, ins)
    assert all(np.array_equal(o, w) for o, w in zip(out, want)), "differs from the reference"
    print(hashlib.sha256(b"".join(o.tobytes() for o in out)).hexdigest())
""")


def test_scatter_add_is_bitwise_deterministic_across_thread_counts(cpu):
    digests = []
    for threads in ("1", "2"):
        env = {**os.environ, "OMP_NUM_THREADS": threads}
        r = subprocess.run([sys.executable, "-c", _DETERMINISM], env=env, capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        digests.append(r.stdout.strip())
    assert digests[0] == digests[1]
    assert len(digests[0]) == len(hashlib.sha256().hexdigest())


# --- CUDA C and WGSL ----------------------------------------------------------------------
def _gpu_programs(idt: str) -> list[Program]:
    f = "f32"
    return [
        b.program(lambda x, i: Var(b.gather(x.v, i.v, 0)) * 2.0, [(f, (5, 3)), (idt, (4, 2))]),
        b.program(lambda w, i: Var(b.take(w.v, i.v, 0)).exp(), [(f, (10, 4)), (idt, (2, 3))]),
        b.program(lambda x, i, s: Var(b.scatter_add(x.v, i.v, s.v, 0)),
                  [(f, (5, 3)), (idt, (7, 3)), (f, (7, 3))]),
        b.program(lambda x, i, s: Var(b.scatter(x.v, i.v, (s * 3.0).v, 1)),
                  [(f, (4, 5)), (idt, (2, 8)), (f, (2, 8))]),
        b.program(lambda x: (x.cumsum(0), x.cumprod(1) + x), [(f, (5, 7))]),
        b.program(lambda x: x * Var(b.iota((5, 7), 1, f)) + Var(b.iota((5, 7), 0, f)),
                  [(f, (5, 7))]),
        b.program(lambda x, i: Var(b.gather(x.v, i.v, 1)).sum(1), [(f, (6, 9)), (idt, (6, 4))]),
        *(b.program(lambda x, i, s, step=step: x.scatter_combine(i, s * 2.0, 0, step),
                    [(f, (5, 3)), (idt, (7, 3)), (f, (7, 3))])
          for step in (Op.MUL, Op.MAX, Op.MIN)),
        b.program(lambda x, i, s: x.scatter_combine(i, s, 1, Op.MAX),
                  [(f, (4, 5)), (idt, (2, 8)), (f, (2, 8))]),
        b.program(lambda x: ((x * 2.0).argsort(1, False, idt), x.argsort(0, True, idt)),
                  [(f, (5, 7))]),
        b.program(lambda x: Var(b.gather(x.v, x.argsort(2, False, idt).v, 2)) + 1.0,
                  [(f, (2, 3, 40))]),
    ]


@pytest.mark.skipif(not nvrtc.available(), reason="NVRTC is not installed")
@pytest.mark.parametrize("idt", ["i32", "i64"])
def test_cuda_kernels_compile_for_sm90(idt):
    for p in _gpu_programs(idt):
        source = lower(p, lambda s, sl: render_cuda(s, sl)[0]).source
        cubin = nvrtc.compile_cubin(source, "sm_90")
        assert cubin[:4] == b"\x7fELF"
        if any(v.op in INDEXED for v in p.instructions):
            assert "hg_index_fail(" in source and "hg_index_error" in source


@pytest.fixture(scope="module")
def wg(webgpu_ex: hg.Executor) -> hg.Executor:
    return webgpu_ex


def _inputs_for(p: Program, rng: np.random.Generator) -> list[np.ndarray]:
    out = []
    for d, s in p.inputs:
        if d.kind == "i":
            out.append(rng.integers(0, 3, s).astype(d.np_dtype))  # in range, duplicates
        else:
            out.append(_data(rng, s, d.name, special=True))
    return out


def test_wgsl_runs_index_ops_on_lavapipe(wg):
    rng = np.random.default_rng(3)
    for p in _gpu_programs("i32"):
        ins = _inputs_for(p, rng)
        got, want = compiled_and_reference(wg, p, ins)
        for g, w in zip(got, want, strict=True):
            exact = not any(v.op in (Op.CUMSUM, Op.CUMPROD, Op.EXP, Op.RSUM)
                            for v in p.instructions)
            if exact:
                _same(g, w)
            else:  # scans add f32 in f32 on WGSL (the reference in f64)
                np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("dtype", ["i32", "u32"])
def test_wgsl_index_ops_over_32_bit_integers(wg, dtype):
    p, ins = int_index_case(dtype, "i32")
    got, want = compiled_and_reference(wg, p, ins)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def test_wgsl_clamps_out_of_range_indices_and_rejects_i64(wg):
    p = _gather_program()
    with pytest.raises(DTypeError, match="i64"):
        _run(wg, p, [np.zeros((5, 3), np.float32), np.zeros((4, 2), np.int64)])
    q = b.program(lambda x, i: Var(b.gather(x.v, i.v, 0)), [("f32", (5, 3)), ("i32", (2, 3))])
    x = np.arange(15, dtype=np.float32).reshape(5, 3)
    (got,) = _run(wg, q, [x, np.array([[9, -4, 2], [5, 0, 100]], np.int32)])
    np.testing.assert_array_equal(got, [[12, 1, 8], [12, 1, 14]])  # clamped, no stray read


@pytest.mark.parametrize("dtype", ["f32"])
def test_wgsl_random_index_programs(wg, dtype):
    @settings(max_examples=40, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(index_cases(dtype))
    def check(case):
        case = (*case[:4], "i32", *case[5:])
        if case[5] in ("cumsum", "cumprod"):
            return  # f32 accumulation: test_wgsl_runs_index_ops_on_lavapipe
        p, ins = _case_program(case)
        got, want = compiled_and_reference(wg, p, ins)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-6, equal_nan=True)

    check()
