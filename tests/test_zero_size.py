"""Zero-size arrays through the whole engine: canonical rules, scheduling, the CPU
backend's guard, ``@hg.jit`` and the op library.

An empty operand or result must give NumPy's result (empty, or the reduction's identity)
and no kernel may read or write its memory: an empty tensor's pointer may be null, and a
NumPy one points at nothing. Outputs are checked inside canary bytes
(``programs.canary_outputs``) so a write past an empty output fails the test.
"""

from __future__ import annotations

import numpy as np
import pytest

import hologram as hg
from hologram.backends import registry
from hologram.backends.cpu import check_no_empty_steps
from hologram.compiler.canonicalize import canonicalize
from hologram.compiler.lower import lower, slot_table
from hologram.compiler.render_c import CRenderer
from hologram.compiler.schedule import KernelPlan, Schedule, plan, step_operands
from hologram.isa import Op
from hologram.isa import builder as b
from hologram.isa.builder import Var
from hologram.ops import composites as C

from .programs import canary_outputs, check_canaries, compiled_and_reference

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

DT = {"f32": np.float32, "f64": np.float64}
TOL = {"f32": {"rtol": 2e-5, "atol": 1e-6}, "f64": {"rtol": 1e-12, "atol": 1e-14}}


@pytest.fixture(scope="module")
def ex(native_cpu: hg.Executor) -> hg.Executor:
    return native_cpu


def _inputs(shapes, dtype: str, seed: int) -> list[np.ndarray]:
    """Fresh random inputs with NaN and inf among them (in the non-empty ones)."""
    rng = np.random.default_rng(seed)
    out = []
    for s in shapes:
        a = (rng.standard_normal(s) * 2).astype(DT[dtype])
        if a.size > 2:
            a.flat[rng.integers(0, a.size)] = np.nan
            a.flat[rng.integers(0, a.size)] = np.inf
        out.append(a)
    return out


def _touches_empty(compiled) -> list[str]:
    sched = compiled.lowered.schedule
    return [f"step {i}: {v.op}{list(v.shape)}" for i, st in enumerate(sched.steps)
            for v in step_operands(st, sched) if v.size == 0]


# --------------------------------------------------------------------------- rules

def test_empty_program_folds_to_constants_and_compiles_nothing(ex):
    p = b.program(lambda x, y: ((x.exp() + y).sum(1), (x @ x.T.reshape(3, 0)).sqrt(),
                                Var(b.concat([x.v, x.v], 0)).T),
                  [("f32", (0, 3)), ("f32", (1, 3))])
    canon, st = canonicalize(p)
    assert st.rules.get("empty_value", 0) >= 1
    assert all(v.op in (Op.LDG, Op.STG, Op.CONST) for v in canon.instructions), canon
    compiled = ex.compile(p)
    assert compiled.steps == [] and compiled.lowered.launches == 0
    assert "void k" not in compiled.source and "void g" not in compiled.source
    ins = _inputs([s for _, s in p.inputs], "f32", 0)
    got, want = compiled_and_reference(ex, p, ins)  # canaries checked inside
    assert [g.shape for g in got] == [w.shape for w in want] == [(0,), (0, 0), (3, 0)]


@pytest.mark.parametrize("dtype", ["f32", "f64", "i32", "i64"])
def test_reductions_over_nothing_are_their_identity(ex, dtype):
    """sum 0, prod 1, max -inf (an int's min), min +inf (an int's max): NumPy's initial.
    The result is a constant fill: no step reads the empty input."""
    npd = np.dtype({"f32": np.float32, "f64": np.float64, "i32": np.int32,
                    "i64": np.int64}[dtype])
    ops = [Op.RSUM, Op.RPROD, Op.RMAX, Op.RMIN]
    p = b.program(lambda x: tuple(Var(b.reduce(op, x.v, 1)) for op in ops),
                  [(dtype, (4, 0, 3))])
    x = np.zeros((4, 0, 3), npd)
    got, _ = compiled_and_reference(ex, p, [x])
    if npd.kind == "f":
        lo, hi = -np.inf, np.inf
    else:
        lo, hi = np.iinfo(npd).min, np.iinfo(npd).max
    wants = [np.sum(x, 1), np.prod(x, 1), np.max(x, 1, initial=lo), np.min(x, 1, initial=hi)]
    for g, w in zip(got, wants, strict=True):
        assert g.dtype == npd
        np.testing.assert_array_equal(g, w)
    assert not _touches_empty(ex.compile(p))


@pytest.mark.skipif(not hasattr(Op, "SCATTER"), reason="no index instructions here")
def test_values_computed_by_unknown_ops_are_not_folded_away():
    """A scatter of values into an empty table is an index error, not an empty value:
    the empty rules neither fold it nor what is computed from it (which would drop it)."""
    p = b.program(lambda base, idx, src: Var(b.scatter(base.v, idx.v, src.v, 0)).exp()
                  * 2.0, [("f32", (0,)), ("i64", (2,)), ("f32", (2,))])
    canon, _ = canonicalize(p)
    assert any(v.op is Op.SCATTER for v in canon.instructions), canon


def test_guard_refuses_a_step_on_an_empty_operand():
    """The CPU backend's last line: a schedule with a step over an empty buffer (here a
    reduction of an empty input, left unfolded by skipping canonicalization) raises."""
    p = b.program(lambda x: x.sum(0), [("f32", (0, 3))])
    low = lower(p, lambda sched, slots: "")  # the traced program, not the canonical one
    assert len(low.schedule.steps) == 1
    with pytest.raises(AssertionError, match=r"empty value ldg\.f32\[0, 3\]"):
        check_no_empty_steps(low)


def test_scheduler_gives_empty_results_no_step():
    """Without the rules, too: an empty stored value keeps its buffer but gets no step."""
    p = b.program(lambda x, y: ((x * 2.0).sum(1), y + 1.0, x @ x.T, x.T),
                  [("f32", (0, 3)), ("f32", (2, 3))])
    sched = plan(p, set())
    (step,) = sched.steps  # y + 1.0 only
    assert isinstance(step, KernelPlan) and step.sinks[0][0] is p.outputs[1].srcs[0]
    assert all(id(o.srcs[0]) in sched.buffers for o in p.outputs)


def test_reduce_kernel_stores_nothing_for_an_empty_result():
    """The renderer itself (the bug: ``n_outer <= 1`` stored element 0 of an empty
    output); reached only if a scheduler ever hands it such a step."""
    p = b.program(lambda x: x.sum(1, keepdims=True), [("f32", (0, 3))])
    sched = plan(p, set())
    r = p.outputs[0].srcs[0]
    step = KernelPlan("k0", [(r, sched.buffers[id(r)])])
    forced = Schedule(p, [step], sched.buffers, sched.temps)
    slots, _ = slot_table(forced)
    text = CRenderer(forced, slots).kernel(step)
    assert "] =" not in text, text


# --------------------------------------------------------------------------- @hg.jit

def _np_softmax(x, axis):
    e = np.exp(x - np.max(x, axis, keepdims=True, initial=-np.inf))
    return e / e.sum(axis, keepdims=True)


def _np_layer_norm(x, axes):
    m = x.mean(axes, keepdims=True)
    d = x - m
    return d / np.sqrt((d * d).mean(axes, keepdims=True) + 1e-5)


# name -> (jit body, NumPy in float64, input shapes)
JIT_CASES = {
    "sum_rows": (lambda x: x.sum(1), lambda x: x.sum(1), [(0, 3)]),
    "sum_empty_axis": (lambda x: x.sum(0), lambda x: x.sum(0), [(0, 3)]),
    "sum_all": (lambda x: x.sum(), lambda x: x.sum(), [(2, 0, 3)]),
    "max_empty_axis": (lambda x: x.max(0, initial=-np.inf),
                       lambda x: np.max(x, 0, initial=-np.inf), [(0, 3)]),
    "min_empty_axis": (lambda x: x.min(1, initial=np.inf),
                       lambda x: np.min(x, 1, initial=np.inf), [(3, 0)]),
    "prod_empty_axis": (lambda x: x.prod(0), lambda x: x.prod(0), [(0, 4)]),
    "max_rows_empty": (lambda x: x.max(1, initial=-np.inf),
                       lambda x: np.max(x, 1, initial=-np.inf), [(0, 5)]),
    "mean_empty_axis": (lambda x: x.mean(1), lambda x: x.mean(1), [(4, 0)]),
    "softmax_no_rows": (lambda x: C.softmax(x, -1), lambda x: _np_softmax(x, -1), [(0, 5)]),
    "softmax_empty_rows": (lambda x: C.softmax(x, -1), lambda x: _np_softmax(x, -1), [(5, 0)]),
    "layer_norm": (lambda x: C.layer_norm(x, None, None, (1,)),
                   lambda x: _np_layer_norm(x, (1,)), [(0, 1)]),
    "matmul_k0": (lambda x, y: x @ y, np.matmul, [(4, 0), (0, 3)]),
    "matmul_k0_epilogue": (lambda x, y: (x @ y + 1.0).tanh(),
                           lambda x, y: np.tanh(x @ y + 1.0), [(4, 0), (0, 3)]),
    "matmul_m0": (lambda x, y: x @ y, np.matmul, [(0, 5), (5, 3)]),
    "matmul_n0": (lambda x, y: x @ y, np.matmul, [(2, 5), (5, 0)]),
    "batched_empty": (lambda x, y: x @ y, np.matmul, [(0, 2, 3), (0, 3, 4)]),
    "broadcast": (lambda x, y: (x + y).exp(), lambda x, y: np.exp(x + y), [(0, 3), (1, 3)]),
    "broadcast_sum": (lambda x, y: (x * y).sum(0) + y.sum(0),
                      lambda x, y: (x * y).sum(0) + y.sum(0), [(0, 3), (1, 3)]),
    "concat_empty_part": (lambda x, y: Var(b.concat([x.v, y.v, x.v], 0)).sqrt(),
                          lambda x, y: np.sqrt(np.concatenate([x, y, x], 0)),
                          [(0, 3), (2, 3)]),
    "transpose_reshape": (lambda x: x.T.reshape(2, 0) * 2.0, lambda x: x.T.reshape(2, 0) * 2,
                          [(0, 2)]),
    "vecdot": (lambda x, y: (x * y).sum(1), lambda x, y: (x * y).sum(1), [(0, 0), (0, 0)]),
}


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("name", sorted(JIT_CASES))
def test_jit_zero_size_matches_numpy(ex, name, dtype):
    # jit functions are NumPy code (issue 20): an empty max needs initial=, as in NumPy
    fn, ref, shapes = JIT_CASES[name]
    f = hg.jit(fn)
    ins = _inputs(shapes, dtype, seed=len(name))
    # non-contiguous arguments (Fortran-ordered views): jit copies what it must
    args = [np.asfortranarray(a) if a.ndim >= 2 else a for a in ins]
    want = np.asarray(ref(*(a.astype(np.float64) for a in ins)))
    got = f(*args)
    assert got.shape == want.shape and got.dtype == DT[dtype]
    np.testing.assert_allclose(got, want, equal_nan=True, **TOL[dtype])
    # into caller-owned outputs with canary bytes around them
    (out,), backs = _canary_like(got)
    f(*args, out=out)
    check_canaries(backs)
    np.testing.assert_allclose(out, want, equal_nan=True, **TOL[dtype])
    program, _ = f.program_for(*args)
    compiled = ex.compile(program)
    assert not _touches_empty(compiled)
    if want.size == 0:
        assert compiled.steps == []


def _canary_like(a: np.ndarray):
    from hologram.isa.dtypes import to_dtype

    return canary_outputs([(to_dtype(a.dtype), a.shape)])


def test_jit_empty_output_with_a_null_sized_call_writes_nothing(ex):
    """The original report: ``x.sum(1)`` over [0, 3] wrote element 0 of its empty output."""
    f = hg.jit(lambda x: x.sum(1))
    x = np.zeros((0, 3), np.float32)
    (out,), backs = _canary_like(np.zeros((0,), np.float32))
    f(x, out=out)
    check_canaries(backs)
    assert f(x).shape == (0,)


# --------------------------------------------------------------------------- the op library

SENTINEL = -7.25  # what the buffers hold beyond the n elements an op may touch


def _buffer(ex, array: np.ndarray):
    buf = ex.allocate(array.shape, dtype=array.dtype)
    buf.from_numpy(array)
    return buf


def _sentinel_buffer(ex, size: int, dtype=np.float32):
    return _buffer(ex, np.full(size, SENTINEL, dtype))


def _assert_untouched(buf, start: int = 0) -> None:
    rest = buf.to_numpy().reshape(-1)[start:]
    assert (rest == SENTINEL).all(), rest


@pytest.mark.parametrize("op", ["vector_add", "vector_mul", "vector_max", "vector_div"])
def test_ops_binary_with_n_zero_touch_nothing(ex, op):
    a, c = _sentinel_buffer(ex, 8), _sentinel_buffer(ex, 8)
    bb = _sentinel_buffer(ex, 8)
    getattr(hg.ops, op)(ex, a, bb, c, n=0)
    _assert_untouched(c)


@pytest.mark.parametrize("op", ["vector_neg", "vector_relu", "sigmoid", "tanh", "gelu"])
def test_ops_unary_with_n_zero_touch_nothing(ex, op):
    a, c = _sentinel_buffer(ex, 4), _sentinel_buffer(ex, 4)
    getattr(hg.ops, op)(ex, a, c, n=0)
    _assert_untouched(c)


def test_ops_reductions_of_empty_buffers(ex):
    a = _buffer(ex, np.zeros((0, 3), np.float32))
    out = _sentinel_buffer(ex, 4)
    assert hg.ops.reduce_sum(ex, a, out) == 0.0
    _assert_untouched(out, 1)
    rows = _buffer(ex, np.zeros((3,), np.float32))
    hg.ops.reduce_sum(ex, a, rows, axis=0)
    np.testing.assert_array_equal(rows.to_numpy(), np.zeros(3, np.float32))
    none = _buffer(ex, np.full((0,), SENTINEL, np.float32))
    hg.ops.reduce_max(ex, a, none, axis=1)  # [0] result: nothing to compute
    for op in (hg.ops.reduce_max, hg.ops.reduce_min):
        with pytest.raises(ValueError, match="no identity"):
            op(ex, a, rows, axis=0)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_ops_softmax_of_empty_rows(ex, op):
    a = _buffer(ex, np.zeros((0, 5), np.float32))
    c = _buffer(ex, np.zeros((0, 5), np.float32))
    getattr(hg.ops, op)(ex, a, c)
    assert c.to_numpy().shape == (0, 5)
    big, out = _sentinel_buffer(ex, 6), _sentinel_buffer(ex, 6)
    getattr(hg.ops, op)(ex, big, out, n=0)
    _assert_untouched(out)


@pytest.mark.parametrize("mkn", [(4, 0, 3), (0, 5, 3), (2, 5, 0), (0, 0, 0)])
def test_ops_gemm_with_a_zero_size(ex, mkn):
    m, k, n = mkn
    rng = np.random.default_rng(sum(mkn))
    x = rng.standard_normal((m, k))
    y = rng.standard_normal((k, n))
    a, bb = _buffer(ex, x.astype(np.float64)), _buffer(ex, y.astype(np.float64))
    c = _buffer(ex, np.full(max(m * n, 1) + 4, SENTINEL, np.float64))
    hg.ops.gemm(ex, a, bb, c, m, k, n)
    got = c.to_numpy()
    np.testing.assert_allclose(got[:m * n].reshape(m, n), x @ y, rtol=1e-12, atol=1e-14)
    _assert_untouched(c, m * n)


def test_ops_losses_of_empty_buffers(ex):
    p = _buffer(ex, np.zeros((0,), np.float32))
    t = _buffer(ex, np.zeros((0,), np.float32))
    out = _sentinel_buffer(ex, 2)
    assert hg.ops.mse_loss(ex, p, t, out, reduction="sum") == 0.0
    assert np.isnan(hg.ops.mse_loss(ex, p, t, out, reduction="mean"))  # 0/0, as torch
    none = _buffer(ex, np.full((0,), SENTINEL, np.float32))
    hg.ops.mse_loss(ex, p, t, none, reduction="none")
    _assert_untouched(out, 1)


# --------------------------------------------------------------------------- WebGPU

WEBGPU_REASON = registry.why_unavailable("webgpu")


@pytest.mark.skipif(WEBGPU_REASON is not None, reason=f"webgpu unavailable: {WEBGPU_REASON}")
@pytest.mark.parametrize("name", ["sum_rows", "sum_empty_axis", "max_empty_axis",
                                  "matmul_k0_epilogue", "matmul_m0", "concat_empty_part",
                                  "softmax_empty_rows", "broadcast_sum"])
def test_webgpu_zero_size_matches_numpy(name):
    """The same scheduling on WebGPU: no dispatch for an empty result, identities for
    reductions over nothing; outputs checked within canary bytes."""
    fn, ref, shapes = JIT_CASES[name]
    wg = hg.default_executor("webgpu")
    ins = _inputs(shapes, "f32", seed=len(name))
    p = b.program(fn, [("f32", s) for s in shapes])
    got, _ = compiled_and_reference(wg, p, ins)
    want = np.asarray(ref(*(a.astype(np.float64) for a in ins)))
    np.testing.assert_allclose(got[0], want, equal_nan=True, **TOL["f32"])
