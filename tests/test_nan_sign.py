"""The sign of a NaN is no part of an ISA value: no instruction may read it.

x86 makes the NaN of an invalid operation (inf - inf, fmod(inf, y)) with its sign bit
set, WGSL drivers make it positive, and a rewrite rule may change it. COPYSIGN is the
one instruction that reads a sign bit, so a NaN second operand gives ``|a|`` on every
backend (found by the WGSL random programs: ``copysign(x, fmod(inf, y))`` was ``-|x|``
in NumPy and ``+|x|`` on lavapipe).
"""

from __future__ import annotations

import numpy as np
import pytest

import hologram as hg
from hologram.backends import registry
from hologram.backends.reference import evaluate
from hologram.isa import Op
from hologram.isa import builder as b
from hologram.isa.builder import Var


def _program():
    """copysign(a, n) for a NaN ``n`` of either sign, and for one made by fmod(inf, y)."""
    def fn(a, n, y):
        made = Var(b.elementwise(Op.FMOD, b.const(float("inf"), "f32", y.shape), y.v))
        return (Var(b.elementwise(Op.COPYSIGN, a.v, n.v)),
                Var(b.elementwise(Op.COPYSIGN, a.v, made.v)))

    return b.program(fn, [("f32", (6,))] * 3)


def _inputs() -> list[np.ndarray]:
    a = np.array([1.5, -2.0, 0.0, -0.0, np.inf, -3.0], np.float32)
    neg_nan = np.frombuffer(np.array([0xFFC00000], np.uint32).tobytes(), np.float32)[0]
    n = np.array([np.nan, neg_nan, np.nan, neg_nan, neg_nan, np.nan], np.float32)
    y = np.full(6, 0.75, np.float32)
    return [a, n, y]


def test_reference_copysign_by_a_nan_is_the_magnitude():
    a, n, y = _inputs()
    got, _ = evaluate(_program(), [a, n, y])
    for g in got:
        assert np.array_equal(g, np.abs(a))
        assert not np.signbit(g).any()


@pytest.mark.parametrize("backend", ["cpu", "webgpu"])
def test_backends_agree_with_the_reference(backend):
    if registry.why_unavailable(backend):
        pytest.skip(f"{backend} unavailable: {registry.why_unavailable(backend)}")
    ex = hg.default_executor(backend)
    p = _program()
    ins = _inputs()
    want, _ = evaluate(p, ins)
    got = [np.empty(6, np.float32) for _ in want]
    ex.launch(p, ins, got)
    for g, w in zip(got, want, strict=True):
        assert np.array_equal(g.view(np.uint32), w.view(np.uint32))
