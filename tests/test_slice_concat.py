"""SLICE and CONCAT: the verifier, the reference, the text form, the CPU kernels, GEMMs
reading slices in place, WebGPU and CUDA rendering."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hologram as hg
from hologram.backends import registry
from hologram.backends.reference import evaluate
from hologram.compiler import nvrtc, schedule
from hologram.compiler.schedule import GemmPlan
from hologram.errors import ShapeError, VerifyError
from hologram.isa import Op, Program
from hologram.isa import builder as b
from hologram.isa.builder import Var

from .programs import random_inputs
from .test_differential import _compiled_executor, assert_close

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _cat(*parts: Var, axis: int) -> Var:
    return Var(b.concat([p.v for p in parts], axis))


# --- verifier and builder ------------------------------------------------------------------
def _parse(lines: str) -> Program:
    return Program.parse("\n".join([".in 0 f32[4,6]", ".in 1 f32[4,2]",
                                    "%0 = ldg.f32[4,6] in=0", "%1 = ldg.f32[4,2] in=1", lines]))


@pytest.mark.parametrize("line, fragment", [
    ("%2 = slice.f32[2,3] %0 starts=(3,0)", "slice axis 0: [3, 5) is outside [0, 4)"),
    ("%2 = slice.f32[2,3] %0 starts=(-1,0)", "slice axis 0: [-1, 1) is outside"),
    ("%2 = slice.f32[2,7] %0 starts=(0,0)", "slice axis 1: [0, 7) is outside [0, 6)"),
    ("%2 = slice.f32[2,3] %0 starts=(0,)", "needs starts= one integer per axis"),
    ("%2 = slice.f32[2,3] %0", "needs starts="),
    ("%2 = slice.f32[2] %0 starts=(0,0)", "changes the rank"),
    ("%2 = concat.f32[4,8] %0, %1 axis=2", "axis= an axis in [0, 2)"),
    ("%2 = concat.f32[4,8] %0, %1", "axis= an axis"),
    ("%2 = concat.f32[10,6] %0, %1 axis=0", "concat operand 1 [4, 2] differs from [4, 6] off "
                                            "axis 0"),
    ("%2 = concat.f32[4,9] %0, %1 axis=1", "declared shape [4, 9] but operands give [4, 8]"),
    ("%2 = cvt.f64[4,2] %1\n%3 = concat.f32[4,8] %0, %2 axis=1", "differ in dtype"),
    ("%2 = concat.f32[4,6] axis=0", "at least one operand"),
])
def test_verifier_names_the_bad_slice_or_concat(line, fragment):
    last = line.splitlines()[-1].split(" = ")[0]
    p = _parse(f"{line}\nstg.f32[1] {last} out=0")
    with pytest.raises(VerifyError) as e:
        p.verify()
    assert fragment in str(e.value)
    assert "slice.f32" in str(e.value) or "concat.f32" in str(e.value)


def test_good_slices_and_concats_verify():
    p = _parse("%2 = slice.f32[0,6] %0 starts=(4,0)\n"  # empty, starting at the end
               "%3 = slice.f32[4,2] %0 starts=(0,4)\n"
               "%4 = concat.f32[4,8] %0, %1 axis=1\n"
               "%5 = concat.f32[8,2] %3, %1 axis=0\n"
               "%6 = concat.f32[4,2] %1 axis=1\n"  # one part
               "stg.f32[0,6] %2 out=0\nstg.f32[4,8] %4 out=1\nstg.f32[8,2] %5 out=2\n"
               "stg.f32[4,2] %6 out=3")
    p.verify()


def test_builder_slices_splits_and_concats():
    x = b.ldg(0, "f32", (4, 6))
    assert b.slice(x, (0, 0), (4, 6)) is x  # all of x
    assert b.concat([x], 1) is x
    q, k, v = b.split(x, (1, 2, 3), -1)
    assert [s.attr("starts") for s in (q, k, v)] == [(0, 0), (0, 1), (0, 3)]
    assert [s.shape for s in (q, k, v)] == [(4, 1), (4, 2), (4, 3)]
    assert b.concat([q, k, v], -1).attr("axis") == 1
    with pytest.raises(VerifyError, match="slice axis 1"):
        b.slice(x, (0, 5), (4, 2))
    with pytest.raises(ShapeError, match="do not add up"):
        b.split(x, (2, 2), 1)
    with pytest.raises(VerifyError, match="out of range"):
        b.split(x, (4,), 2)
    with pytest.raises(VerifyError, match="at least one operand"):
        b.concat([], 0)
    with pytest.raises(VerifyError, match="off axis 0"):
        b.concat([x, b.ldg(1, "f32", (4, 5))], 0)
    assert [p.shape for p in Var(x).split((2, 2), 0)] == [(2, 6), (2, 6)]


def test_text_round_trip():
    p = b.program(lambda x, y: (x.slice((1, 2), (2, 3)),
                                _cat(x.exp(), y, x, axis=1)),
                  [("f32", (4, 6)), ("f32", (4, 2))])
    text = str(p)
    assert "slice.f32[2,3] %0 starts=(1,2)" in text and "axis=1" in text
    q = Program.parse(text)
    assert q == p and q.hash == p.hash and str(q) == text


def test_reference_is_numpy_slicing_and_concatenate():
    x = np.arange(24, dtype=np.float64).reshape(4, 6)
    y = -np.arange(8, dtype=np.float64).reshape(4, 2)
    p = b.program(lambda a, c: (a.slice((1, 2), (2, 3)), _cat(a, c, axis=1),
                                _cat(c, c, axis=0), a.slice((4, 0), (0, 6))),
                  [("f64", x.shape), ("f64", y.shape)])
    outs, _ = evaluate(p, [x, y])
    np.testing.assert_array_equal(outs[0], x[1:3, 2:5])
    np.testing.assert_array_equal(outs[1], np.concatenate([x, y], 1))
    np.testing.assert_array_equal(outs[2], np.concatenate([y, y], 0))
    assert outs[3].shape == (0, 6)


# --- CPU kernels against the reference -------------------------------------------------------
def _window(x: Var, axis: int, start: int, size: int) -> Var:
    return x.slice(tuple(start if d == axis else 0 for d in range(x.ndim)),
                   tuple(size if d == axis else n for d, n in enumerate(x.shape)))


def _roll(x: Var, shift: int, axis: int) -> Var:
    """``np.roll`` along ``axis``, as PyTorch decomposes ``torch.roll``: two slices
    concatenated the other way round."""
    n, s = x.shape[axis], shift % x.shape[axis]
    tail = _window(x, axis, n - s, s)
    return _cat(tail, _window(x, axis, 0, n - s), axis=axis)


def _rolled_windows(x: Var, levels: int = 6) -> Var:
    """Swin's shifted windows, ``levels`` times over: ``x [B, H, W, C]`` rolled along H
    and W, partitioned into 2x2 windows and put back: views and CONCATs whose reads
    double with each CONCAT while they are inlined (every part is read for every
    element), until the scheduler stores one (``schedule.CONCAT_DEPTH_MAX``)."""
    bb, hh, ww, cc = x.shape
    for i in range(levels):
        x = _roll(_roll(x, 1 + i % 2, 1), 1, 2)
        x = x.reshape(bb, hh // 2, 2, ww // 2, 2, cc).permute(0, 1, 3, 2, 4, 5)
        x = x.reshape(bb * hh * ww // 4, 4, cc).reshape(bb, hh // 2, ww // 2, 2, 2, cc)
        x = x.permute(0, 1, 3, 2, 4, 5).reshape(bb, hh, ww, cc)
    return x * 2.0


def _assigned(m: Var, rows: tuple[int, int], cols: tuple[int, int], value: float) -> Var:
    """``m[r0:r1, c0:c1] = value`` as a slice assignment lowers: the window's rows are
    the rows' CONCAT of what is left of ``m`` and a fill; the rows around it are ``m``'s."""
    (r0, r1), (c0, c1) = rows, cols
    h, w = m.shape
    band = _window(m, 0, r0, r1 - r0)
    fill = Var(b.const(value, m.dtype, (r1 - r0, c1 - c0)))
    band = _cat(_window(band, 1, 0, c0), fill, _window(band, 1, c1, w - c1), axis=1)
    return _cat(_window(m, 0, 0, r0), band, _window(m, 0, r1, h - r1), axis=0)


def _shifted_window_mask(scores: Var, base: Var) -> Var:
    """torchvision's Swin attention mask: nine slice assignments of a count into a
    [14, 14] map (``base``: an input, so nothing folds), split into four 7x7 windows,
    the pairwise differences filled with -100 where nonzero, added to ``scores``
    [batch, 4, heads, 49, 49] (the four windows)."""
    m, count = base, 0.0
    for rows in ((0, 7), (7, 11), (11, 14)):
        for cols in ((0, 7), (7, 11), (11, 14)):
            m, count = _assigned(m, rows, cols, count), count + 1.0
    m = m.reshape(2, 7, 2, 7).permute(0, 2, 1, 3).reshape(4, 49)
    diff = m.reshape(4, 1, 49).expand((4, 49, 49)) - m.reshape(4, 49, 1).expand((4, 49, 49))
    mask = (diff.eq(0.0)).where(diff * 0.0, Var(b.const(-100.0, m.dtype, diff.shape)))
    return scores + mask.reshape(1, 4, 1, 49, 49).expand(scores.shape)


CASES: dict[str, tuple] = {
    "slice_rows_exp": (lambda x: _window(x, 0, 1, 2).exp(), [(4, 6)]),
    "slice_window_2d": (lambda x: x.slice((1, 2), (2, 3)) * 2.0, [(4, 6)]),
    "slice_empty": (lambda x: _window(x, 1, 6, 0) + 1.0, [(4, 6)]),
    "slice_of_size1_axes": (lambda x: x.slice((0, 1), (1, 3)).tanh(), [(1, 5)]),
    "slice_of_broadcast": (lambda x, y: (x + y).slice((1, 2), (2, 3)), [(4, 5), (1, 5)]),
    "slice_of_expand": (lambda x: x.expand((4, 5)).slice((1, 1), (3, 2)), [(1, 5)]),
    "slice_of_permute": (lambda x: x.T.slice((2, 1), (3, 2)), [(4, 6)]),
    "slice_then_reduce": (lambda x: _window(x, 1, 2, 3).sum(1), [(4, 6)]),
    "slice_of_reduce": (lambda x: _window(x.max(1, keepdims=True), 0, 1, 2) + x.slice(
        (1, 0), (2, 6)), [(4, 6)]),
    "softmax_of_slice": (lambda x: (lambda s: (s - s.max(1, keepdims=True)).exp() / (
        s - s.max(1, keepdims=True)).exp().sum(1, keepdims=True))(_window(x, 1, 1, 4)),
        [(3, 6)]),
    "cat_axis0": (lambda x, y: _cat(x, y.exp(), axis=0), [(2, 3), (4, 3)]),
    "cat_axis1_three": (lambda x, y: _cat(x.exp(), y * 2.0, x, axis=1), [(4, 6), (4, 2)]),
    "cat_middle_axis_3d": (lambda x, y: _cat(x, y, x, axis=1) + 1.0, [(2, 3, 4), (2, 1, 4)]),
    "cat_with_empty_part": (lambda x, y: _cat(x, y, x, axis=1), [(3, 2), (3, 0)]),
    "cat_all_empty": (lambda x: _cat(x, x, axis=1), [(3, 0)]),
    "cat_of_empty_rows": (lambda x, y: _cat(x, y, axis=1), [(0, 2), (0, 3)]),
    "cat_size1_parts": (lambda x, y: _cat(x, y, axis=0), [(1, 1), (1, 1)]),
    "cat_then_reduce_over_axis": (lambda x, y: _cat(x, y, axis=1).max(1), [(4, 5), (4, 2)]),
    "cat_then_sum_other_axis": (lambda x, y: _cat(x, y, axis=1).sum(0), [(4, 5), (4, 2)]),
    "cat_of_reductions": (lambda x: _cat(x.sum(1, keepdims=True), x.max(1, keepdims=True),
                                         axis=1), [(4, 5)]),
    "cat_const_parts": (lambda x: _cat(Var(b.const(0.0, x.dtype, (4, 1))), x,
                                       Var(b.const(-1.5, x.dtype, (4, 2))), axis=1), [(4, 3)]),
    "split_cat_reversed": (lambda x: _cat(*reversed(x.split((1, 2, 3), 1)), axis=1),
                           [(3, 6)]),
    "slice_across_parts": (lambda x, y: _cat(x, y, axis=1).slice((0, 3), (4, 4)),
                           [(4, 5), (4, 3)]),
    "cat_broadcast_parts": (lambda x, y: _cat(x.expand((4, 3)), y, axis=1) * y.sum(),
                            [(1, 3), (4, 2)]),
    "cat_scalar_rows": (lambda x, y: _cat(x, y, axis=0), [(1,), (5,)]),
    "rolled_windows": (lambda x: _rolled_windows(x, 3), [(2, 8, 8, 4)]),
    "shifted_window_mask": (_shifted_window_mask, [(1, 4, 1, 49, 49), (14, 14)]),
}


def _program(name: str, dtype: str) -> tuple[Program, list[np.ndarray]]:
    fn, shapes = CASES[name]
    specs = [(dtype, s) for s in shapes]
    return b.program(fn, specs, name=name), random_inputs(specs, seed=len(name))


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_cpu_matches_reference(name, dtype):
    ex = _compiled_executor()
    p, ins = _program(name, dtype)
    want, _ = evaluate(p, ins)
    got = [np.empty(s, d.np_dtype) for d, s in p.output_specs]
    ex.launch(p, ins, got)
    for g, w in zip(got, want, strict=True):
        assert_close(g, w, rtol=2e-6 if dtype == "f32" else 1e-12, atol=1e-6)


def test_chained_concats_and_reshapes_name_their_index(monkeypatch):
    """Each CONCAT writes its index into every part's test and clamp, each reshape into
    every coordinate it splits off: through a chain of them (``_rolled_windows``) the
    index text grew ~4x per level, until a long index was named by a local
    (``render_c.named_index``); torchvision's Swin-T backward rendered kernels of 148 MB
    of C. The longest line stays short, the values the reference's: here with the
    whole chain in one kernel (``CONCAT_DEPTH_MAX`` off), as it was before the chain was
    cut into stored pieces."""
    monkeypatch.setattr(schedule, "CONCAT_DEPTH_MAX", 1 << 40)
    ex = _compiled_executor()
    p = b.program(_rolled_windows, [("f32", (2, 8, 8, 4))])
    ins = random_inputs([("f32", (2, 8, 8, 4))], seed=6)
    compiled = ex.backend.compile(p)
    assert len(compiled.lowered.schedule.steps) == 1
    assert max(map(len, compiled.source.splitlines())) < 1000
    (want,), _ = evaluate(p, ins)
    got = np.empty(want.shape, np.float32)
    ex.launch(p, ins, [got])
    np.testing.assert_array_equal(got, want)


def test_a_chain_of_concats_is_cut_into_stored_pieces():
    """Every part of an unstored CONCAT is computed for each element, so six levels of
    rolled windows (twelve CONCATs, each over slices of the one before) inlined into one
    kernel compute 4096 reads per element. A CONCAT nesting more than
    ``CONCAT_DEPTH_MAX`` unstored ones is stored: several kernels, each a few deep."""
    ex = _compiled_executor()
    p = b.program(_rolled_windows, [("f32", (2, 8, 8, 4))])
    compiled = ex.backend.compile(p)
    assert len(compiled.lowered.schedule.steps) >= 3
    ins = random_inputs([("f32", (2, 8, 8, 4))], seed=7)
    (want,), _ = evaluate(p, ins)
    got = np.empty(want.shape, np.float32)
    ex.launch(p, ins, [got])
    np.testing.assert_array_equal(got, want)


def test_concat_reads_no_part_out_of_bounds():
    """Each part is read at an index clamped into it (every part is read per element):
    parts placed at the very ends of their own allocations, next to guard pages, would
    fault otherwise. Checked on the source: every part's index is bounded."""
    ex = _compiled_executor()
    # a concat used inside an expression: one loop nest, a clamped select chain
    p = b.program(lambda x, y: _cat(x, y, x, axis=1) * 2.0,
                  [("f32", (3, 4)), ("f32", (3, 2))])
    src = ex.backend.compile(p).source
    assert "? 0 :" in src and "? j : 3" in src, src


def test_stored_concat_writes_each_part_in_its_own_loop():
    """A concat that is the stored value: one loop nest per part, each over the part's
    own shape and writing its window, so nothing is selected or clamped."""
    ex = _compiled_executor()
    p = b.program(lambda x, y: _cat(x.exp(), y, x, axis=1),
                  [("f32", (3, 4)), ("f32", (3, 2))])
    src = ex.backend.compile(p).source
    assert "? 0 :" not in src and src.count("= hg_expf(") == 1, src  # exp computed once
    for off in ("+ j]", "+ (j + 4)]", "+ (j + 6)]"):
        assert off in src, (off, src)
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    y = np.random.default_rng(2).standard_normal((3, 2)).astype(np.float32)
    out = np.empty((3, 10), np.float32)
    ex.launch(p, [x, y], [out])
    np.testing.assert_allclose(out, np.concatenate([np.exp(x), y, x], 1), rtol=1e-6)


def _windows(x: Var, offsets: list[tuple[int, int]], size: tuple[int, int] | None = None
             ) -> list[Var]:
    """``x [B, C, H, W]``'s ``size`` windows (by default 3 smaller than ``x``) at
    ``offsets``, each ``[B, C, 1, h*w]`` (an im2col's taps)."""
    bb, cc, hh, ww = x.shape
    h, w = size or (hh - 3, ww - 3)
    return [x.slice((0, 0, dy, dx), (bb, cc, h, w)).reshape((bb, cc, 1, h * w))
            for dy, dx in offsets]


@pytest.mark.parametrize("layout", ["nine", "broken run", "too few"])
def test_parts_differing_only_in_slice_starts_fold_into_one_loop(layout):
    """Consecutive parts of a stored CONCAT that are the same window at other starts
    (an im2col's taps) render as one loop nest in a loop over a table of the starts
    (``render_c.folded_parts``): a run broken by another part folds on each side,
    and fewer than ``FOLD_MIN_PARTS`` stay one loop nest each. Values against NumPy."""
    from hologram.compiler.render_c import FOLD_MIN_PARTS

    ex = _compiled_executor()
    grid = [(dy, dx) for dy in range(3) for dx in range(3)]

    def fn(x: Var) -> Var:
        y = x.exp()  # the windows' source: a value of the program, not only an input
        if layout == "nine":
            parts = _windows(y, grid)
        elif layout == "broken run":
            odd = _windows(y, [(1, 2)])[0] * 2.0
            parts = _windows(y, grid[:5]) + [odd] + _windows(y, grid[5:])
        else:
            parts = _windows(y, grid[:FOLD_MIN_PARTS - 1])
        return _cat(*parts, axis=2)

    shape = (2, 3, 40, 43)
    p = b.program(fn, [("f32", shape)])
    src = ex.backend.compile(p).source
    folds = {"nine": ["tap < 9;"], "broken run": ["tap < 5;", "tap < 4;"],
             "too few": []}[layout]
    assert src.count("tap < ") == len(folds) and all(f in src for f in folds), src
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    x[0, 1, 5, 7] = np.nan
    (want,), _ = evaluate(p, [x])
    got = np.empty(p.output_specs[0][1], np.float32)
    ex.launch(p, [x], [got])
    assert_close(got, want, rtol=1e-6, atol=0)


def test_a_fold_after_the_same_part_rendered_plainly_reads_its_own_starts():
    """Parts [c0 * 2, c0 * 2, c1 * 2, ..., c4 * 2] of one column each: the first renders
    as a plain loop nest, the run from the second on folds (``folded_parts``). The
    first's value depends on the unit alone, so it is kept in the unit's scope; the
    fold's first part is the same value, which must not be taken from there (every
    folded part read column 0)."""
    ex = _compiled_executor()

    def fn(x: Var) -> Var:
        bb, cc, _ = x.shape
        return _cat(*(x.slice((0, 0, i), (bb, cc, 1)) * 2.0 for i in (0, 0, 1, 2, 3, 4)),
                    axis=2)

    p = b.program(fn, [("f32", (64, 128, 8))])
    assert "tap < 5;" in ex.backend.compile(p).source
    x = np.random.default_rng(4).standard_normal((64, 128, 8)).astype(np.float32)
    got = np.empty((64, 128, 6), np.float32)
    ex.launch(p, [x], [got])
    np.testing.assert_array_equal(got, x[:, :, [0, 0, 1, 2, 3, 4]] * 2)


def _in_unit_loops(p: Program, ins: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(the compiled CPU kernels' one result, the reference's), the parallel threshold
    lowered so that small shapes render each CONCAT part's loops inside one loop over
    the units, as a big CONCAT gets them (where parts fold)."""
    from unittest import mock

    from hologram.compiler import render_c

    (want,), _ = evaluate(p, ins)
    got = np.empty(want.shape, want.dtype)
    with mock.patch.object(render_c, "PARALLEL_MIN_WORK", 1), \
            mock.patch.object(render_c, "PARALLEL_MIN_WORK_MATH", 1):
        _compiled_executor().launch(p, ins, [got])
    return got, want


@pytest.mark.parametrize("units", [1, 32])
def test_parts_that_reduce_their_windows_are_not_folded(units):
    """A depthwise convolution's weight gradient as its backward builds it: one column
    per tap, each the sum over the batch and the positions of a window of the input
    times the output's gradient. Parts alike but for their SLICEs' starts, as an
    im2col's taps, but each a reduction, whose loop the renderer places before the
    part's stores (in the unit's scope, outside a fold's loop over its table): folded,
    the reductions read the table's ``tap`` where it is not declared, and the C did not
    compile (torchvision's ConvNeXt-T training step)."""
    grid = [(dy, dx) for dy in range(3) for dx in range(3)]

    def fn(x: Var, g: Var) -> Var:
        bb, cc = g.shape[:2]
        taps = [(w.reshape(g.shape) * g).sum(axis=(0, 2, 3)).reshape((cc, 1))
                for w in _windows(x, grid, g.shape[2:])]
        return _cat(*taps, axis=1)

    shape, gshape = (2, units, 6, 6), (2, units, 4, 4)
    p = b.program(fn, [("f32", shape), ("f32", gshape)])
    rng = np.random.default_rng(5)
    got, want = _in_unit_loops(p, [rng.standard_normal(s).astype(np.float32)
                                   for s in (shape, gshape)])
    assert_close(got, want, rtol=1e-5, atol=1e-5)


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_random_runs_of_windows_match_the_reference(data):
    """Random im2col-like CONCATs (windows of one value at drawn starts, repeats
    allowed, the parts computed or not, now and then one that breaks the run), each
    part's loops inside one loop over the units as a big CONCAT gets them (the
    threshold lowered so small shapes do too): the compiled CPU kernels, folded
    (``render_c.folded_parts``) or not, against the reference. Fails with the fold's
    table rows out of order. In f16 and bf16 too: a folded load of a 16-bit float
    buffer (its index reads the table) was rendered as the raw storage and did not
    compile (a bf16 ResNet-18 under torch.compile)."""
    dtype = data.draw(st.sampled_from(["f32", "f16", "bf16"]))
    if dtype == "bf16":
        pytest.importorskip("ml_dtypes")
    lead = (data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3)))
    hh, ww = data.draw(st.integers(2, 7)), data.draw(st.integers(2, 7))
    h, w = data.draw(st.integers(1, hh)), data.draw(st.integers(1, ww))
    n = data.draw(st.integers(1, 9))
    starts = [(data.draw(st.integers(0, hh - h)), data.draw(st.integers(0, ww - w)))
              for _ in range(n)]
    odd = data.draw(st.sampled_from([None, *range(n)]))
    computed, scaled = data.draw(st.booleans()), data.draw(st.booleans())

    def fn(x: Var) -> Var:
        y = x.exp() if computed else x
        parts = _windows(y, starts, (h, w))
        if scaled:  # every part computed (still the same but for the starts)
            parts = [q * 0.5 for q in parts]
        if odd is not None:
            parts[odd] = parts[odd] * 2.0
        return _cat(*parts, axis=2)

    p = b.program(fn, [(dtype, (*lead, hh, ww))])
    x = np.random.default_rng(n).standard_normal((*lead, hh, ww)).astype(
        p.inputs[0][0].np_dtype)
    got, want = _in_unit_loops(p, [x])
    assert_close(got.astype(np.float64), want.astype(np.float64), rtol=1e-6, atol=0)


def test_concat_kernel_is_one_launch_with_fused_work():
    x = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    f = hg.jit(lambda a: _cat(a.exp(), a * 2.0, axis=1).sum(1))
    np.testing.assert_allclose(f(x), np.concatenate([np.exp(x), x * 2], 1).sum(1), rtol=1e-5)
    assert "kernel launches 4 -> 1 " in f.explain(x)  # exp, mul, concat, sum: one loop nest


# --- GEMMs read slices in place -------------------------------------------------------------
def _qkv(x: Var, w: Var) -> Var:
    q, k, v = (x @ w).split((8, 8, 8), 1)
    return (q @ k.T) @ v


def test_gemm_reads_column_slices_in_place():
    """q, k, v are column windows of one product: BLAS reads each at an element offset
    (``.ob = 8``, ``.ob = 16``) with the full row stride, and nothing copies them."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 6)).astype(np.float32)
    w = rng.standard_normal((6, 24)).astype(np.float32)
    f = hg.jit(_qkv)
    qkv = x @ w
    want = (qkv[:, :8] @ qkv[:, 8:16].T) @ qkv[:, 16:]
    np.testing.assert_allclose(f(x, w), want, rtol=1e-4, atol=1e-4)
    text = f.explain(x, w)
    if "hg_gemm_desc" not in text:
        pytest.skip("GEMM runs as np.matmul here (no OpenBLAS driver)")
    assert ".ob = 8," in text and ".ob = 16," in text and ".ldb = 24," in text, text
    ex = _compiled_executor()
    p = b.program(_qkv, [("f32", x.shape), ("f32", w.shape)])
    steps = ex.backend.compile(p).lowered.schedule.steps
    assert all(isinstance(s, GemmPlan) for s in steps), steps  # no copy kernel


def test_batched_gemm_reads_head_slices_in_place():
    """Attention's heads: a column slice of a [b*t, 3d] product, split into heads and
    permuted, is a strided batch BLAS reads where it is."""
    rng = np.random.default_rng(2)
    bt, t, d, h = 2, 5, 8, 2
    x = rng.standard_normal((bt * t, d)).astype(np.float64)
    w = rng.standard_normal((d, 3 * d)).astype(np.float64)

    def attn(x: Var, w: Var) -> Var:
        q, k, _ = (x @ w).reshape(bt, t, 3 * d).split((d, d, d), 2)
        q, k = (z.reshape(bt, t, h, d // h).permute(0, 2, 1, 3) for z in (q, k))
        return q @ k.permute(0, 1, 3, 2)

    p = b.program(attn, [("f64", x.shape), ("f64", w.shape)])
    want, _ = evaluate(p, [x, w])
    got = np.empty(want[0].shape)
    ex = _compiled_executor()
    ex.launch(p, [x, w], [got])
    np.testing.assert_allclose(got, want[0], rtol=1e-12, atol=1e-12)
    steps = ex.backend.compile(p).lowered.schedule.steps
    assert all(isinstance(s, GemmPlan) for s in steps), steps


def test_gemm_of_concat_is_computed_first():
    """A CONCAT is no view: a kernel computes it, then BLAS reads the result."""
    rng = np.random.default_rng(3)
    a, c = rng.standard_normal((4, 3)), rng.standard_normal((4, 2))
    m = rng.standard_normal((5, 5))
    f = hg.jit(lambda x, y, z: _cat(x, y, axis=1) @ z)
    np.testing.assert_allclose(f(a, c, m), np.concatenate([a, c], 1) @ m, rtol=1e-12)


def test_numpy_matmul_fallback_takes_slices():
    code = ("import numpy as np, hologram\n"
            "from hologram.isa.builder import Var\n"
            "def f(x, w):\n"
            "    q, k, v = (x @ w).split((8, 8, 8), 1)\n"
            "    return (q @ k.T) @ v\n"
            "x = np.arange(30, dtype=np.float64).reshape(5, 6) / 7\n"
            "w = np.arange(144, dtype=np.float64).reshape(6, 24) / 11\n"
            "y = hologram.jit(f)(x, w)\n"
            "r = x @ w\n"
            "print(np.abs(y - (r[:, :8] @ r[:, 8:16].T) @ r[:, 16:]).max() / np.abs(y).max())\n")
    env = {**os.environ, "HOLOGRAM_GEMM": "numpy"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=120, check=True).stdout
    assert float(out) < 1e-12


# --- WebGPU and CUDA ----------------------------------------------------------------------------
WG_REASON = registry.why_unavailable("webgpu")


@pytest.mark.skipif(WG_REASON is not None, reason=f"webgpu unavailable: {WG_REASON}")
def test_webgpu_matches_reference():
    from .test_webgpu import assert_close as wg_close

    with hg.Executor("webgpu") as wg:
        for name in sorted(CASES):
            p, ins = _program(name, "f32")
            want, _ = evaluate(p, ins)
            got = [np.empty(s, d.np_dtype) for d, s in p.output_specs]
            wg.launch(p, ins, got)
            for g, w in zip(got, want, strict=True):
                wg_close(g, w, rtol=2e-5, atol=1e-5)
        # four levels of rolled windows in one kernel name long indices (WGSL's
        # ``let ix: i32``)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(schedule, "CONCAT_DEPTH_MAX", 1 << 40)
            p = b.program(lambda x: _rolled_windows(x, 4), [("f32", (2, 8, 8, 4))])
            assert "let ix" in wg.backend.compile(p).wgsl.source
            ins = random_inputs([("f32", (2, 8, 8, 4))], seed=4)
            got = np.empty((2, 8, 8, 4), np.float32)
            wg.launch(p, ins, [got])
        np.testing.assert_array_equal(got, evaluate(p, ins)[0][0])
        rng = np.random.default_rng(4)
        x = rng.standard_normal((5, 6)).astype(np.float32)
        w = rng.standard_normal((6, 24)).astype(np.float32)
        p = b.program(_qkv, [("f32", x.shape), ("f32", w.shape)])
        got = np.empty((5, 8), np.float32)
        wg.launch(p, [x, w], [got])
        wg_close(got, evaluate(p, [x, w])[0][0], rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not nvrtc.available(), reason="NVRTC is not installed")
@pytest.mark.parametrize("name", sorted(CASES))
def test_cuda_kernels_compile(name):
    from .test_cuda_compile import compile_for_gpu

    compile_for_gpu(_program(name, "f32")[0])
    assert Op.SLICE in {v.op for v in _program("slice_rows_exp", "f32")[0].instructions}


def test_chained_slice_assignments_store_their_concats():
    """Each slice assignment is a CONCAT whose parts slice the one before, so inlined
    the chain computes the earlier parts again at every index: torchvision's Swin-T
    mask (nine assignments) was 16K selects per element, five GEMM epilogues of 2.2 MB
    of C each in its training step (4.8 MB here). A CONCAT nesting more than
    ``CONCAT_DEPTH_MAX`` unstored ones is stored whatever its size: the library stays
    small, the values the reference's."""
    ex = _compiled_executor()
    specs = [("f32", (2, 4, 3, 49, 49)), ("f32", (14, 14))]
    p = b.program(_shifted_window_mask, specs)
    src = ex.backend.compile(p).source
    assert len(src) < 60_000, len(src)
    ins = random_inputs(specs, seed=34)
    (want,), _ = evaluate(p, ins)
    got = np.empty(want.shape, np.float32)
    ex.launch(p, ins, [got])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def _phase_sums(x: Var) -> Var:
    """Four phases, each a sum of four shifted windows of ``x [16, 70]``, interleaved
    along the rows (a col2im by phase, as a transposed convolution's is) and scaled."""
    phases = []
    for r in range(4):
        terms = [_window(x, 1, r + t, 64) for t in range(4)]
        acc = terms[0]
        for t in terms[1:]:
            acc = acc + t
        phases.append(acc.reshape(16, 64, 1))
    return _cat(*phases, axis=2).reshape(16, 256) * 0.5


def test_a_concat_whose_reader_would_discard_most_of_its_work_is_stored():
    """Inlined, a CONCAT read once computes every part for each element and keeps one;
    stored, each element computes its own part. From ``CONCAT_WASTE_MIN`` of discarded
    work per element it is stored (four phases of four windows: two steps), while a
    padded input (one part with work, constant bands) stays inline (one step)."""
    ex = _compiled_executor()
    specs = [("f32", (16, 70))]
    p = b.program(_phase_sums, specs)
    assert len(ex.backend.compile(p).lowered.schedule.steps) == 2
    ins = random_inputs(specs, seed=5)
    (want,), _ = evaluate(p, ins)
    got = np.empty(want.shape, np.float32)
    ex.launch(p, ins, [got])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    pad = b.program(lambda x: _cat(Var(b.const(0.0, x.dtype, (16, 4))), x.exp(),
                                   Var(b.const(0.0, x.dtype, (16, 190))), axis=1) * 0.5,
                    specs)
    assert len(ex.backend.compile(pad).lowered.schedule.steps) == 1


def test_the_waste_rule_can_be_turned_off(monkeypatch):
    """The same program inlines its CONCAT when the rule is off (the test above is not
    passing by another rule)."""
    monkeypatch.setattr(schedule, "CONCAT_WASTE_MIN", 1 << 40)
    ex = _compiled_executor()
    p = b.program(_phase_sums, [("f32", (16, 70))])
    assert len(ex.backend.compile(p).lowered.schedule.steps) == 1
