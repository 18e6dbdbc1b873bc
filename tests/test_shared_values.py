"""Element-wise values several instructions read are stored once when recomputing them
would read several full-size buffers (``schedule.shared_recomputations``).

A transformer's residual stream is the case: inlined, every layer norm recomputed it
from all earlier layers' outputs. These tests check which values the rule stores, that
small or single-reader values stay inline, and that results still agree with the
reference interpreter on fresh inputs with NaN and inf.
"""

from __future__ import annotations

import numpy as np
import pytest

import hologram as hg
from hologram.compiler import schedule
from hologram.isa import builder as b
from hologram.ops import composites as C

from .programs import compiled_and_reference

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

ROWS, D = 512, 128  # 64K elements per activation: at the rule's size floor


def _residual_stack(x, w1, w2, w3):
    h = x
    outs = []
    for w in (w1, w2, w3):
        h = h + (C.layer_norm(h, None, None, axes=(1,)) @ w)
        outs.append(C.layer_norm(h, None, None, axes=(1,)))
    return tuple(outs)


def _program(rows: int = ROWS):
    specs = [("f32", (rows, D))] + [("f32", (D, D))] * 3
    return b.program(_residual_stack, specs)


def _chosen(p) -> set[int]:
    users = schedule.users_of(p)
    return schedule.shared_recomputations(p, users, {}, set())


def test_residual_sums_are_stored_once() -> None:
    p = _program()
    chosen = _chosen(p)
    # the residual sums after the second and third GEMM read several full-size buffers
    # (the earlier residual, the product): stored. The first (x + product) too.
    assert len(chosen) >= 2
    assert all(v.op.value in ("add",) for v in p.instructions if id(v) in chosen)


def test_small_values_stay_inline() -> None:
    assert _chosen(_program(rows=8)) == set()  # 1K elements: a kernel costs more


def test_single_reader_stays_inline() -> None:
    p = b.program(lambda x, y, z: ((x + y + z) * 2.0,), [("f32", (ROWS, D))] * 3)
    assert _chosen(p) == set()


def test_results_agree_with_the_reference(native_cpu: hg.Executor) -> None:
    p = _program()
    rng = np.random.default_rng(3)
    x = rng.standard_normal((ROWS, D)).astype(np.float32)
    x[0, 0], x[1, 1] = np.nan, np.inf
    ws = [(rng.standard_normal((D, D)) * 0.1).astype(np.float32) for _ in range(3)]
    got, want = compiled_and_reference(native_cpu, p, [x, *ws])
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5)


def _taps_sum(x, w):
    """A 7x7 depthwise convolution of ``x [C, H+6, W+6]`` (its 49 taps, views, times
    their weights, summed: ConvNeXt's), read by a mean over channels and a subtraction,
    as a layer norm reads it."""
    c, h, wd = x.shape[0], x.shape[1] - 6, x.shape[2] - 6
    y = None
    for i in range(7):
        for j in range(7):
            t = x.slice((0, i, j), (c, h, wd)) * w.slice((0, 7 * i + j), (c, 1)).reshape(
                (c, 1, 1))
            y = t if y is None else y + t
    mean = y.mean(0)
    return (y - mean,)


def test_a_convolutions_taps_are_not_recomputed_per_reader() -> None:
    """The taps' sum is read by the mean and by the subtraction: each would recompute
    all 49 taps, so the work rule stores it; one tap's product read twice (cheap) and
    a sum too small for a kernel stay inline."""
    p = b.program(_taps_sum, [("f32", (16, 70, 70)), ("f32", (16, 49))])
    chosen = [v for v in p.instructions if id(v) in _chosen(p)]
    assert [v.op.value for v in chosen] == ["add"]
    assert chosen[0].shape == (16, 64, 64)
    small = b.program(_taps_sum, [("f32", (2, 14, 14)), ("f32", (2, 49))])
    assert _chosen(small) == set()
    cheap = b.program(lambda x: ((x * 2.0) - (x * 2.0).mean(0),), [("f32", (16, 64, 64))])
    assert _chosen(cheap) == set()


def test_stored_taps_agree_with_the_reference(native_cpu: hg.Executor) -> None:
    p = b.program(_taps_sum, [("f32", (16, 70, 70)), ("f32", (16, 49))])
    rng = np.random.default_rng(5)
    x = rng.standard_normal((16, 70, 70)).astype(np.float32)
    x[0, 5, 5], x[3, 7, 9] = np.nan, -np.inf
    w = rng.standard_normal((16, 49)).astype(np.float32)
    got, want = compiled_and_reference(native_cpu, p, [x, w])
    np.testing.assert_allclose(got[0], want[0], rtol=2e-4, atol=2e-5)


def _batch_stats(x):
    """A batch norm's training statistics as PyTorch's decomposition builds them: the
    mean over (0, 2, 3), returned (squeezed) and read by the variance and the output."""
    n = x.shape[0] * x.shape[2] * x.shape[3]
    mean = x.sum((0, 2, 3), keepdims=True) / float(n)
    dev = x - mean
    rstd = ((dev * dev).sum((0, 2, 3), keepdims=True) / float(n) + 1e-5).rsqrt()
    return (dev * rstd).maximum(0.0), mean.reshape((x.shape[1],)), rstd.reshape((x.shape[1],))


def test_a_returned_statistic_is_stored_once() -> None:
    """The mean and rstd are program outputs (through a reshape) and read by the
    normalization too: stored once (``stored_statistics``), not recomputed by each
    kernel that reads them; the variance's sum, read by one instruction, stays inline.
    Below ``STATISTIC_MIN_READS`` reduced elements nothing is chosen."""
    def chosen(shape):
        p = b.program(_batch_stats, [("f32", shape)])
        users = schedule.users_of(p)
        stored = {id(v.srcs[0]): [schedule.BufRef("out", v.attr("out"), v.dtype, v.shape)]
                  for v in p.instructions if v.op.value == "stg"}
        return [v for v in p.instructions
                if id(v) in schedule.stored_statistics(p, users, stored, set())]

    got = chosen((4, 8, 16, 16))
    assert sorted(v.op.value for v in got) == ["div", "rsqrt"]
    assert all(v.shape == (1, 8, 1, 1) for v in got)
    assert chosen((2, 8, 8, 8)) == []  # 1,024 elements reduced: below the floor


def test_stored_statistics_agree_with_the_reference(native_cpu: hg.Executor) -> None:
    p = b.program(_batch_stats, [("f32", (4, 8, 16, 16))])
    rng = np.random.default_rng(7)
    x = rng.standard_normal((4, 8, 16, 16)).astype(np.float32)
    x[1, 2, 3, 4], x[0, 5, 0, 0] = np.nan, np.inf  # channels 2 and 5 turn NaN throughout
    got, want = compiled_and_reference(native_cpu, p, [x])
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5)
    assert np.isnan(got[1][2]) and np.isnan(got[2][5])


def test_a_product_reshaped_to_an_output_is_written_there(native_cpu: hg.Executor) -> None:
    """A GEMM whose only reader is a RESHAPE to a program output (a convolution's
    weight gradient ``[O, C*K]`` as ``[O, C, kh, kw]``) writes the output itself: no
    temp, no copy kernel. A product read elsewhere as well keeps its own buffer."""
    def grad(a, c):
        return ((a @ c).reshape((6, 4, 3, 3)),)

    p = b.program(grad, [("f32", (6, 20)), ("f32", (20, 36))])
    steps = schedule.plan(p, set()).steps
    assert [type(s).__name__ for s in steps] == ["GemmPlan"]
    assert steps[0].out.kind == "out"
    rng = np.random.default_rng(9)
    a, c = (rng.standard_normal(s).astype(np.float32) for s in ((6, 20), (20, 36)))
    a[0, 0] = np.nan
    got, want = compiled_and_reference(native_cpu, p, [a, c])
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
    def shared(a, c):
        g = a @ c
        return g.reshape((6, 4, 3, 3)), g * 2.0

    steps = schedule.plan(b.program(shared, [("f32", (6, 20)), ("f32", (20, 36))]),
                          set()).steps
    assert [s.out.kind for s in steps if isinstance(s, schedule.GemmPlan)] == ["tmp"]


def _costly_concat(x, y):
    """A CONCAT of 16 parts, each a 9-term sum of windows of ``x`` (a Winograd output
    transform's shape), read once, through a permute, by an element-wise tail."""
    n = x.shape[1]
    planes = [x.slice((t, 0), (1, n)).reshape((n,)) for t in range(9)]
    parts = []
    for i in range(16):
        s = planes[0] * float(i + 1)
        for p in planes[1:]:
            s = s + p
        parts.append(s.reshape((1, n)))
    cat = b.Var(b.concat([p.v for p in parts], 0))
    return ((cat.permute((1, 0)) * y).maximum(0.0),)


def test_a_costly_concat_read_once_is_stored() -> None:
    """Inlined, a CONCAT is a select chain that computes every part for each element, so
    even one reader pays the parts' summed work: stored. A cheap one (zero padding
    around a window: three parts, no arithmetic) stays inline."""
    n = 4096
    p = b.program(_costly_concat, [("f32", (9, n)), ("f32", (n, 16))])
    chosen = [v for v in p.instructions if id(v) in _chosen(p)]
    assert [v.op.value for v in chosen] == ["concat"]

    def padded(x):
        z = b.const(0.0, "f32", (x.shape[0], 1))
        return ((b.Var(b.concat([z, x.v, z], 1)) * 2.0).sum(1),)

    assert _chosen(b.program(padded, [("f32", (64, 256))])) == set()


def test_a_stored_concat_agrees_with_the_reference(native_cpu: hg.Executor) -> None:
    n = 4096
    p = b.program(_costly_concat, [("f32", (9, n)), ("f32", (n, 16))])
    rng = np.random.default_rng(5)
    x = rng.standard_normal((9, n)).astype(np.float32)
    x[2, 7], x[4, 100] = np.nan, -np.inf
    y = rng.standard_normal((n, 16)).astype(np.float32)
    (got,), (want,) = compiled_and_reference(native_cpu, p, [x, y])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _depthwise3x3(x, w):
    """A 3x3 depthwise convolution (stride 1, padding 1) as the torch backend lowers it:
    nine taps, views of the zero-padded input, weighted and summed."""
    from hologram_torch.lowering.convolution import conv_nd

    c, h = x.shape[1], x.shape[2]
    return (conv_nd(x, w, None, (1, 1), (1, 1), (1, 1), c, (h, h)),)


def test_a_padded_input_read_by_taps_is_stored() -> None:
    """Each tap of a 3x3 depthwise convolution reads the zero-padded input through a
    window: inlined, every tap pays two CONCATs' clamped indices and selects (6.4x
    slower, docs/perf.md, session 15), so the padded input is stored once; results
    agree with the reference interpreter, NaN and inf included."""
    pytest.importorskip("torch")
    specs = [("f32", (2, 8, 28, 28)), ("f32", (8, 1, 3, 3))]
    p = b.program(_depthwise3x3, specs)
    chosen = [v for v in p.instructions if id(v) in _chosen(p)]
    assert [v.op.value for v in chosen] == ["concat"]
    assert chosen[0].shape == (2, 8, 30, 30)


def test_a_padded_input_read_by_taps_agrees_with_the_reference(native_cpu) -> None:
    pytest.importorskip("torch")
    specs = [("f32", (2, 8, 28, 28)), ("f32", (8, 1, 3, 3))]
    p = b.program(_depthwise3x3, specs)
    rng = np.random.default_rng(11)
    x = rng.standard_normal(specs[0][1]).astype(np.float32)
    w = rng.standard_normal(specs[1][1]).astype(np.float32)
    x[0, 1, 0, 0], x[1, 3, 27, 5] = np.nan, np.inf
    (got,), (want,) = compiled_and_reference(native_cpu, p, [x, w])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_padded_input_read_inside_concat_parts_stays_inline() -> None:
    """The same padded input read by 9 windows that are parts of another CONCAT (an
    im2col, Winograd's input transform): a stored CONCAT renders its parts window by
    window with no select chain, so the padding costs nothing there and is not stored
    (storing such values added 54 kernels to ResNet-18, docs/perf.md, session 15)."""

    def windows(x):
        z = b.const(0.0, "f32", (x.shape[0], 1))
        row = b.Var(b.concat([z, x.v, z], 1))
        n = x.shape[1]
        parts = [row.slice((0, i % 3), (x.shape[0], n)).reshape((1, x.shape[0], n))
                 * float(i + 1) for i in range(9)]
        return (b.Var(b.concat([p.v for p in parts], 0)),)

    p = b.program(windows, [("f32", (64, 256))])
    padded = [v for v in p.instructions if v.op.value == "concat" and v.shape == (64, 258)]
    assert len(padded) == 1 and id(padded[0]) not in _chosen(p)


def _depthwise_small_plane(x, w):
    from hologram_torch.lowering.convolution import conv_nd

    c, h = x.shape[1], x.shape[2]
    k = w.shape[-1]
    return (conv_nd(x, w, None, (1, 1), (k // 2, k // 2), (1, 1), c, (h, h)),)


@pytest.mark.parametrize("k", [5, 7])
def test_a_depthwise_sum_over_its_flat_plane_is_stored(k: int) -> None:
    """A depthwise convolution with 7-wide output rows is computed over its padded plane
    flattened (rows of ``7 * (7 + k - 1)``) and read back through a window of 7 columns
    per row (``schedule._narrowed``): the sum is stored, so its loop runs over the flat
    plane; inlined, it would run over the window's 7-wide rows again."""
    pytest.importorskip("torch")
    specs = [("f32", (8, 96, 7, 7)), ("f32", (96, 1, k, k))]
    p = b.program(_depthwise_small_plane, specs)
    chosen = [v for v in p.instructions if id(v) in _chosen(p)]
    assert any(v.op.value == "add" and v.shape[-1] == 7 * (7 + k - 1) for v in chosen), \
        [(v.op.value, v.shape) for v in chosen]


def test_a_cheap_value_read_through_a_window_stays_inline() -> None:
    """The rule is for sums that are work enough: a value of a few instructions read
    through a narrowing window is computed where the window is read."""
    p = b.program(lambda x: (((x * 2.0 + 1.0).reshape((64, 32, 32))
                              .slice((0, 0, 0), (64, 32, 16))),), [("f32", (64, 1024))])
    assert _chosen(p) == set()


@pytest.mark.parametrize("k", [5, 7])
def test_a_depthwise_sum_over_its_flat_plane_agrees_with_the_reference(native_cpu, k) -> None:
    pytest.importorskip("torch")
    specs = [("f32", (8, 96, 7, 7)), ("f32", (96, 1, k, k))]
    p = b.program(_depthwise_small_plane, specs)
    rng = np.random.default_rng(k)
    x = rng.standard_normal(specs[0][1]).astype(np.float32)
    w = rng.standard_normal(specs[1][1]).astype(np.float32)
    x[0, 1, 0, 0], x[5, 3, 6, 2], x[7, 95, 3, 6] = np.nan, np.inf, -np.inf
    (got,), (want,) = compiled_and_reference(native_cpu, p, [x, w])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
