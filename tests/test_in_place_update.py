"""Outputs written over the inputs they update (compiler/aliasing.py).

The CPU backend says yes to an (input, output) pair only when no read of the input
can see an element the program already wrote. Each "yes" case is run with the
output's address set to the input's and compared with the reference interpreter on
the original inputs (NaN and inf included); each "no" case is a read pattern that
would go wrong in place: a transposed read, a reduction, a broadcast read, a second
kernel, a GEMM.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hologram as hg
from hologram.isa import builder as b
from hologram.isa import dtypes
from hologram.memory.address import data_pointer

from .programs import evaluate, programs, random_inputs

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

N = 37


def _run_in_place(ex, program, compiled, inputs, j, k) -> list[np.ndarray]:
    """Launch with output ``k`` at input ``j``'s address; the outputs as written."""
    outputs = [np.empty(s, d.np_dtype) for d, s in program.output_specs]
    outputs[k] = inputs[j]
    launch = ex.backend.pointer_launcher(compiled)
    assert launch is not None
    launch([data_pointer(a) for a in (*inputs, *outputs)])
    return outputs


def _executor() -> hg.Executor:
    ex = hg.default_executor("cpu")
    if "C via" not in ex.backend.describe():
        pytest.skip("no C compiler: the cpu backend is the reference interpreter")
    return ex


def _adam_like(p, g, m):
    m2 = m * 0.9 + g * 0.1
    return p - 0.01 * m2 / ((m2 * m2).sqrt() + 1e-8), m2


def _counter(step, x):
    s2 = step + 1.0
    return s2, x * s2


SAFE = {
    "axpy": (lambda x, g: x * 0.9 + g, [("f32", (N, 5)), ("f32", (N, 5))], [(0, 0)]),
    "adam-like, two updates": (_adam_like, [("f32", (N,)), ("f32", (N,)), ("f32", (N,))],
                               [(0, 0), (2, 1)]),
    "0-d counter read by another kernel": (_counter, [("f32", ()), ("f32", (N,))], [(0, 0)]),
    "large, threaded": (lambda x, g: (x - g).maximum(0.0),
                        [("f32", (512, 513)), ("f32", (512, 513))], [(0, 0)]),
}

UNSAFE = {
    "transposed read": (lambda x: x.T + 1.0, [("f32", (N, N))], (0, 0)),
    "reduction": (lambda x: x - x.sum(), [("f32", (N,))], (0, 0)),
    "broadcast by another output": (lambda v, m: (v * 2.0, m + v),
                                    [("f32", (N,)), ("f32", (3, N))], (0, 0)),
    "read by a second kernel": (lambda x: (x + 1.0, x * 2.0), [("f32", (N,))], (0, 0)),
    "GEMM operand": (lambda x, w: x @ w + x, [("f32", (N, N)), ("f32", (N, N))], (0, 0)),
    "dtype differs": (lambda x: (x * 2.0).cast(dtypes.f64), [("f32", (N,))], (0, 0)),
}


@pytest.mark.parametrize("name", SAFE)
def test_in_place_pairs_are_accepted_and_compute_right(name):
    fn, specs, pairs = SAFE[name]
    ex = _executor()
    program = b.program(fn, specs)
    compiled = ex.compile(program)
    for j, k in pairs:
        assert ex.backend.may_overwrite(compiled, j, k), (j, k)
    for seed in range(3):
        inputs = random_inputs(specs, seed, special=True)
        want, _ = evaluate(program, [a.copy() for a in inputs])
        outputs = [np.empty(s, d.np_dtype) for d, s in program.output_specs]
        for j, k in pairs:
            outputs[k] = inputs[j]  # the same memory: the update lands in the input
        ex.backend.pointer_launcher(compiled)([data_pointer(a) for a in (*inputs, *outputs)])
        for got, w in zip(outputs, want, strict=True):
            np.testing.assert_allclose(got, w, rtol=1e-6, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("name", UNSAFE)
def test_unsafe_pairs_are_refused(name):
    fn, specs, (j, k) = UNSAFE[name]
    ex = _executor()
    compiled = ex.compile(b.program(fn, specs))
    assert not ex.backend.may_overwrite(compiled, j, k)


def test_transposed_read_would_be_wrong_in_place():
    """Why "transposed read" must be refused: in place, it reads rewritten elements."""
    ex = _executor()
    program = b.program(lambda x: x.T + 1.0, [("f32", (N, N))])
    compiled = ex.compile(program)
    x = np.arange(N * N, dtype=np.float32).reshape(N, N)
    want = x.T + 1.0
    ex.backend.pointer_launcher(compiled)([data_pointer(x), data_pointer(x)])
    assert not np.array_equal(x, want)


def test_reference_backend_never_agrees():
    ex = hg.default_executor("reference")
    compiled = ex.compile(b.program(lambda x, g: x + g, [("f32", (N,)), ("f32", (N,))]))
    assert not ex.backend.may_overwrite(compiled, 0, 0)


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(programs(dtype="f64", gemm=True), st.integers(0, 2**32 - 1))
def test_random_programs_in_place_where_allowed(case, seed):
    """Every pair the backend accepts, on random programs (views, reductions, GEMMs,
    concatenations): run in place, the outputs equal the reference's."""
    fn, specs = case
    ex = _executor()
    program = b.program(fn, specs)
    compiled = ex.compile(program)
    if ex.backend.pointer_launcher(compiled) is None:
        return
    outs = program.output_specs
    for j, (dj, sj) in enumerate(program.inputs):
        for k, (dk, sk) in enumerate(outs):
            if (dj, tuple(sj)) != (dk, tuple(sk)) or not ex.backend.may_overwrite(compiled, j, k):
                continue
            inputs = random_inputs(specs, seed, special=True)
            want, _ = evaluate(program, [a.copy() for a in inputs])
            got = _run_in_place(ex, program, compiled, inputs, j, k)
            for g, w in zip(got, want, strict=True):
                np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-12, equal_nan=True)
