"""Element-wise values a GEMM reads through a copying reshape are stored in its layout.

A batch-folded convolution reads activations ``[B, C, L]`` as ``[C, B*L]`` (a permute,
then a merge no strides express). The value is computed once, straight into the
GEMM's layout (``schedule._operand_home``), also when other readers need it
(``compiler/operand_layout.py``: they read it back through views). Each case runs
through the compiled CPU backend and the reference interpreter, NaN and inf among the
inputs, and counts the kernels: one copy fewer than storing the value in its own
layout and copying it.
"""

from __future__ import annotations

import numpy as np
import pytest

import hologram as hg
from hologram.compiler.operand_layout import gemm_operand_layouts
from hologram.compiler.schedule import GemmPlan, KernelPlan
from hologram.isa import builder as b
from hologram.isa.opcodes import Op

from .programs import check_products

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

B, C, L, O = 3, 5, 14, 7
SPECS = [("f32", (B, C, L)), ("f32", (O, C)), ("f32", (C,))]


def _folded(y: b.Var) -> b.Var:
    """``y [B, C, L]`` as the ``[C, B*L]`` operand of a batch-folded product."""
    return y.permute((1, 0, 2)).reshape((C, B * L))


def _compiled(fn, specs=SPECS, seed: int = 0):
    ex = hg.default_executor("cpu")
    if "C via" not in ex.backend.describe():
        pytest.skip("no C compiler: the cpu backend is the reference interpreter")
    p = b.program(fn, specs)
    check_products(ex, p, specs, seed, C)
    steps = ex.compile(p).lowered.schedule.steps
    return (sum(isinstance(s, KernelPlan) for s in steps),
            sum(isinstance(s, GemmPlan) for s in steps), p)


def test_a_value_only_the_gemm_reads_is_written_in_its_layout():
    def fn(x, w, s):
        y = (x * s.reshape((1, C, 1)) + 1.0).maximum(0.0)
        return w @ _folded(y)

    kernels, gemms, _ = _compiled(fn)
    assert (kernels, gemms) == (1, 1)  # no kernel for y in [B, C, L], then a copy


def test_a_value_with_another_reader_is_stored_once_in_the_gemms_layout():
    def fn(x, w, s):
        y = (x * s.reshape((1, C, 1)) + 1.0).maximum(0.0)
        return w @ _folded(y), (y + x).exp()  # the second: a residual-like reader

    kernels, gemms, p = _compiled(fn)
    assert (kernels, gemms) == (2, 1)  # y in the GEMM's layout, the second result
    rewritten = gemm_operand_layouts(p)
    y = next(v for v in p.instructions if v.op is Op.MAX)
    readers = [v for v in rewritten.instructions if any(s is y for s in v.srcs)]
    assert [v.op for v in readers] == [Op.PERMUTE]  # only the chain into the GEMM


def test_a_program_output_keeps_its_own_layout():
    def fn(x, w, s):
        y = x * s.reshape((1, C, 1))
        return w @ _folded(y), y

    kernels, gemms, p = _compiled(fn)
    assert gemm_operand_layouts(p) is p
    assert (kernels, gemms) == (2, 1)  # y stored for the caller, and its GEMM layout


def test_a_permute_that_moves_the_inner_axis_is_left_alone():
    # [B, C, L] read as [L, B*C]: the inverse view would read the value's rows with a
    # stride, so the other reader keeps the value in its own layout
    specs = [("f32", (B, C, L)), ("f32", (O, L)), ("f32", (C,))]

    def fn(x, w, s):
        y = x + 1.0
        return w @ y.permute((2, 0, 1)).reshape((L, B * C)), y * 2.0

    _, _, p = _compiled(fn, specs)
    assert gemm_operand_layouts(p) is p


def test_random_chains_match_the_reference():
    rng = np.random.default_rng(7)
    for seed in range(6):
        b_, c_, l_ = (int(v) for v in rng.integers(1, 6, 3))
        o_ = int(rng.integers(1, 6))
        specs = [("f32", (b_, c_, l_)), ("f32", (o_, c_)), ("f32", (c_,))]

        def fn(x, w, s, b_=b_, c_=c_, l_=l_):
            y = (x - s.reshape((1, c_, 1))).tanh()
            op = y.permute((1, 0, 2)).reshape((c_, b_ * l_))
            return (w @ op).reshape((w.shape[0], b_, l_)).permute((1, 0, 2)) + y.sum(axis=1,
                                                                                   keepdims=True)

        _compiled(fn, specs, seed)


def test_a_shared_permute_keeps_the_value_stored_once():
    # the permuted view read by a GEMM and by another instruction: storing the chain
    # would make that other reader recompute the value, so the value is stored
    def fn(x, w, s):
        y = (x * s.reshape((1, C, 1))).exp()
        t = y.permute((1, 0, 2))
        return w @ t.reshape((C, B * L)), t.sum(axis=2)

    _, _, p = _compiled(fn)
    assert gemm_operand_layouts(p) is p
