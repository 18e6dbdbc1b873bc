"""Fusion: how many kernels each composite becomes, and that fused results are right."""

from __future__ import annotations

import re

import numpy as np
import pytest

import hologram as hg
from hologram.backends.reference import evaluate
from hologram.isa import builder as b
from hologram.ops import composites as C

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@pytest.fixture(scope="module")
def ex(native_cpu: hg.Executor) -> hg.Executor:
    return native_cpu


X = ("f32", (64, 96))
V = ("f32", (96,))
CASES = {
    # name: (fn, input specs, max kernel launches after fusion)
    "gelu_tanh": (C.gelu_tanh, [X], 1),
    "gelu_erf": (C.gelu_erf, [X], 1),
    "sigmoid": (C.sigmoid, [X], 1),
    "bias_relu_chain": (lambda x, v: C.relu((x + v) * 2.0 - 1.0).tanh(), [X, V], 1),
    "softmax_rows": (lambda x: C.softmax(x, -1), [X], 1),
    "softmax_cols": (lambda x: C.softmax(x, 0), [X], 1),
    "log_softmax": (lambda x: C.log_softmax(x, -1), [X], 1),
    "layer_norm": (lambda x, w, v: C.layer_norm(x, w, v, (1,)), [X, V, V], 1),
    "mse": (lambda p, t: C.squared_error(p, t).mean(), [X, X], 1),
    "bce": (lambda p, t: C.binary_cross_entropy(p, t).mean(), [X, X], 1),
    "cross_entropy": (lambda x, t: C.cross_entropy_rows(x, t).mean(), [X, X], 2),
    "sum_all": (lambda x: x.sum(), [X], 1),
    "max_rows": (lambda x: x.max(1), [X], 1),
    "gemm_bias_gelu": (lambda x, w, v: C.gelu_tanh(x @ w + v),
                       [("f32", (64, 80)), ("f32", (80, 96)), V], 2),
    "gemm_transposed": (lambda x, w: x @ w.T, [("f32", (64, 80)), ("f32", (96, 80))], 1),
}


def _inputs(specs, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _, s in specs:
        a = rng.standard_normal(s).astype(np.float32)
        out.append(a)
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_fused_kernel_count_and_result(ex, name):
    fn, specs, max_launches = CASES[name]
    p = b.program(fn, specs, name=name)
    compiled = ex.compile(p)
    assert compiled.stats.launches_after <= max_launches, compiled.source
    ins = _inputs(specs)
    if name in ("bce",):
        ins = [1 / (1 + np.exp(-a)) for a in ins]
    want, _ = evaluate(p, ins)
    got = [np.empty(s, d.np_dtype) for d, s in p.output_specs]
    ex.launch(p, ins, got)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["gelu_tanh", "gelu_erf", "sigmoid", "softmax_rows",
                                  "layer_norm", "mse", "bce", "cross_entropy"])
def test_composites_cut_launches_by_at_least_75_percent(ex, name):
    fn, specs, _ = CASES[name]
    stats = ex.compile(b.program(fn, specs)).stats
    assert stats.launch_reduction >= 0.75, str(stats)


def test_rows_are_not_reread_from_memory_between_passes(ex):
    """Softmax reads each row in its phases while it is in cache: one kernel, one
    outer loop over rows, and every pass over a row is an inner loop of that kernel."""
    p = b.program(lambda x: C.softmax(x, -1), [("f32", (4096, 1024))])
    src = ex.compile(p).source
    assert len(re.findall(r"^void k\d+\(", src, re.M)) == 1
    # the thread team runs the one loop over rows in chunks
    assert src.count("for (int64_t o = lo; o < hi; o++)") == 1
    assert src.count("hg_par(k0_chunk, (void *)B, 4096,") == 1


def test_jit_fuses_across_op_boundaries(ex):
    @hg.jit
    def f(x, w):
        h = C.gelu_tanh(x * 2.0 + 1.0)
        return C.softmax(h * w, -1)

    x = np.random.default_rng(1).standard_normal((8, 32)).astype(np.float32)
    w = np.ones(32, np.float32)
    y = f(x, w)
    h = 2 * x.astype(np.float64) + 1
    g = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))
    e = np.exp(g - g.max(-1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
    p, _ = f.program_for(x, w)
    assert ex.compile(p).stats.launches_after == 1
    assert "reduction" in f.explain(x, w)


def test_jit_caches_per_shape_and_takes_torch_tensors(ex):
    calls = []

    @hg.jit
    def f(x):
        calls.append(1)
        return x.exp()

    f(np.zeros(3, np.float32))
    f(np.ones(3, np.float32))
    assert len(calls) == 1
    f(np.zeros(4, np.float32))
    assert len(calls) == 2
    torch = pytest.importorskip("torch")
    np.testing.assert_allclose(f(torch.zeros(4)), np.ones(4))


def test_jit_writes_into_out(ex):
    f = hg.jit(lambda x: x * 2.0)
    x = np.arange(6, dtype=np.float32)
    out = np.empty(6, np.float32)
    assert f(x, out=out) is out
    np.testing.assert_array_equal(out, x * 2)
    f(x, out=x)  # element-wise in place is allowed
    np.testing.assert_array_equal(x, np.arange(6) * 2)
    with pytest.raises(ValueError, match="out"):
        f(x, out=np.empty(5, np.float32))
    with pytest.raises(ValueError, match="out"):
        f(x, out=np.empty(6, np.float64))
    g = hg.jit(lambda x: x.sum(0, keepdims=True) + x)
    y = np.ones((3, 2), np.float32)
    with pytest.raises(hg.errors.AliasError):
        g(y, out=y)
    # overlapping but not identical memory: refused before any kernel runs
    buf = np.arange(8, dtype=np.float32)
    with pytest.raises(hg.errors.AliasError, match=r"outputs\[0\] partly overlaps inputs\[0\]"):
        f(buf[:6], out=buf[2:])
    np.testing.assert_array_equal(buf, np.arange(8))
    two = hg.jit(lambda x: (x * 2.0, x + 1.0))
    with pytest.raises(hg.errors.AliasError, match=r"outputs\[1\] overlaps outputs\[0\]"):
        two(x, out=(buf[:6], buf[1:7]))
    a, b = np.ones(6, np.float32), np.ones(6, np.float32)
    np.testing.assert_array_equal(two(x, out=(a, b))[1], x + 1.0)  # separate arrays: fine
    e = np.empty(0, np.float32)
    assert f(e, out=e).size == 0  # empty arrays never overlap anything


def test_softmax_computes_exp_once_per_element(ex):
    """The sum phase keeps exp(x - max) in a stack row; the store loop reads it back."""
    p = b.program(lambda x: C.softmax(x, -1), [("f32", (8, 256))])
    src = ex.compile(p).source.split("void k0")[1]
    assert src.count("hg_expf(") == 1
    assert "float row" in src
    # log_softmax needs no exp in its store loop: no scratch row is written
    p2 = b.program(lambda x: C.log_softmax(x, -1), [("f32", (8, 256))])
    assert "row" not in ex.compile(p2).source.split("void k0")[1]


@pytest.mark.parametrize("cols, axis, acc", [(1024, -1, "float"), (1025, -1, "double"),
                                            (3, -1, "float"), (1024, -2, "double"),
                                            (3, -2, "double"), (32, (-2, -1), "float"),
                                            (33, (-2, -1), "double"), (3, (0, 1), "double")])
def test_row_sum_accumulator(ex, cols: int, axis: int | tuple[int, ...], acc: str):
    """A row sum of at most FLOAT_SUM_MAX f32 elements along the innermost axis, or the
    trailing axes together (a pool over a plane), accumulates in float (16 lanes of at
    most 64 terms: ATen's scheme, 10-15% faster on softmax); a longer one, or one over
    other axes (strided reads), in double. Either way the sum stays within a few
    float32 ulps of the float64 sum."""
    from hologram.compiler.render_c import FLOAT_SUM_MAX

    assert FLOAT_SUM_MAX == 1024
    shape = (64, cols) if axis == -1 else (2, cols, 64) if axis == -2 else (4, cols, 32)
    p = b.program(lambda x: x.sum(axis, keepdims=True) * x, [("f32", shape)])
    src = ex.compile(p).source.split("void k0")[1]
    assert re.search(rf"\b{acc} acc\d+ = 0;", src), src
    rng = np.random.default_rng(cols)
    for x in (rng.uniform(0, 1, shape), rng.standard_normal(shape) * 1e3 + 1e4):
        x = x.astype(np.float32)
        out = np.empty_like(x)
        ex.launch(p, [x], [out])
        got = out.astype(np.float64) / x
        want = x.astype(np.float64).sum(axis, keepdims=True)
        np.testing.assert_allclose(got, np.broadcast_to(want, x.shape), rtol=4e-6)


@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_reduction_over_several_axes_loops_over_each(ex: hg.Executor, op: str) -> None:
    """A reduction over the two trailing axes of an inlined expression renders a loop
    over the leading reduced axis around a SIMD loop over the last: one flat loop would
    divide its index by the row length for every element and run scalar (an average
    pool of an inlined convolution in MobileNetV3, docs/perf.md, session 15). Results
    agree with the reference interpreter, NaN included."""
    from .programs import compiled_and_reference

    def fn(x: b.Var) -> tuple[b.Var]:
        y = (x * 2.0).exp().permute((0, 2, 1))
        return (getattr(y, op)((1, 2)),)

    p = b.program(fn, [("f32", (6, 50, 30))])
    src = ex.compile(p).lowered.source
    kernel = src[src.index("k0_chunk"):]
    assert len(re.findall(r"for \(int64_t r\d+ = 0; r\d+ < (?:30|50);", kernel)) == 2
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 50, 30)).astype(np.float32)
    x[1, 7, 3], x[4, 0, 29] = np.nan, -np.inf
    (got,), (want,) = compiled_and_reference(ex, p, [x])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert np.isnan(got[1]) and not np.isnan(got[0])


@pytest.mark.parametrize("padded", [False, True])
def test_a_pool_over_short_rows_is_one_flat_loop_where_it_reads_contiguously(
        ex: hg.Executor, padded: bool) -> None:
    """A sum over 7x7 planes of a buffer laid out [channels, batch * 49] (a GEMM's output
    as a CNN's squeeze-excitation pools it) is one SIMD loop of 49 reading at its own
    index; over planes of a padded [.., 7, 9] buffer it keeps a loop of rows of 7 (a flat
    loop would divide its index per element)."""
    rng = np.random.default_rng(5)
    width = 9 if padded else 7
    x = rng.standard_normal((64, 8 * 7 * width)).astype(np.float32)
    x[3, 10] = np.nan
    x[7, 20] = np.inf

    def pool(v):
        y = (v * 2.0).reshape(64, 8, 7, width)
        if padded:
            y = y[:, :, :, 1:8]
        return (y.transpose(1, 0, 2, 3) + 1.0).sum(axis=(2, 3))

    src = hg.jit(pool, backend="cpu").explain(x)
    body = src[src.index("void k0("):]
    assert (" < 49;" in body) == (not padded), body
    assert (" < 7;" in body) == padded, body
    y = (x.astype(np.float64) * 2).reshape(64, 8, 7, width)
    if padded:
        y = y[:, :, :, 1:8]
    want = (y.transpose(1, 0, 2, 3) + 1.0).sum(axis=(2, 3))
    got = np.array(hg.jit(pool, backend="cpu")(x))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    assert np.isnan(got).any() and np.isinf(got).any()


@pytest.mark.parametrize("w", [14, 7, 65])
def test_short_rows_compute_plane_values_once_a_plane(ex: hg.Executor, w: int) -> None:
    """Rows of at most PLANE_ROW_MAX elements (a 14x14 plane's 14) loop over a plane's
    rows inside the outer loop, so a value that depends on the plane only (a batch norm's
    1/sqrt(var + eps), a squeeze-excitation gate) is computed once a plane, not once a
    row: MobileNetV3-small's batch-8 call ran 0.94x the time (docs/perf.md, session 25).
    Longer rows keep one outer loop. Results match NumPy in float64, NaN included."""
    from hologram.compiler.render_c import PLANE_ROW_MAX

    shape = (3, 5, 6, w)  # [B, C, H, W], written channel-first: [C, B, H, W]

    def fn(x: b.Var, var: b.Var, g: b.Var) -> tuple[b.Var]:
        scale = (var + 1e-3).rsqrt().reshape(5, 1, 1, 1)
        gate = g.sigmoid().permute(1, 0).reshape(5, 3, 1, 1)
        return ((x.permute(1, 0, 2, 3) * scale * gate).exp(),)

    p = b.program(fn, [("f32", shape), ("f32", (5,)), ("f32", (3, 5))])
    src = ex.compile(p).lowered.source
    kernel = src[src.index("void k0"):]
    split = w <= PLANE_ROW_MAX
    assert ("for (int64_t orow = 0; orow < 6; orow++)" in kernel) == split, kernel
    if split:  # the plane's values sit before its rows' loop
        assert kernel.index("sqrtf(") < kernel.index("orow = 0"), kernel
    rng = np.random.default_rng(w)
    x = rng.standard_normal(shape).astype(np.float32)
    x[0, 1, 2, 3] = np.nan
    var = rng.uniform(0.5, 2, 5).astype(np.float32)
    g = rng.standard_normal((3, 5)).astype(np.float32)
    out = np.empty((5, 3, 6, w), np.float32)
    ex.launch(p, [x, var, g], [out])
    x64, g64 = x.astype(np.float64), g.astype(np.float64)
    scale = 1 / np.sqrt(var.astype(np.float64) + 1e-3)[:, None, None, None]
    want = np.exp(x64.transpose(1, 0, 2, 3) * scale / (1 + np.exp(-g64.T))[:, :, None, None])
    np.testing.assert_allclose(out, want, rtol=2e-6)
