"""Results that share work are computed by one loop (``schedule.merge_siblings``).

A function returning two arrays built from the same subexpressions (Black-Scholes'
call and put) used to plan one kernel per result, each recomputing the shared part.
These tests check the kernel count and that every backend stores each result right,
on fresh inputs with NaN and inf, and that results reading one another stay apart.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import hologram as hg
from hologram.backends import registry
from hologram.backends.reference import evaluate
from hologram.isa import builder as b

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

N = ("f32", (3000,))


def _shared(x, y):
    e = (x * 0.5).exp() + y * y
    return e * x - y, (e + 1.0).sqrt(), e.tanh()


def _chained(x, y):
    e = (x * 2.0).exp()
    a = e + 1.0
    return a, a * e + y  # shares e, but reads the first's buffer: two loops, in order


def _data(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal(n).astype(np.float32) * 3 for _ in range(2)]
    if n >= 8:
        xs[0][:3] = [np.nan, np.inf, -np.inf]
        xs[1][5:7] = [0.0, -np.inf]
    return xs


def _check(ex: hg.Executor, fn, n: int = 3000, seed: int = 0, rtol: float = 2e-5) -> None:
    p = b.program(fn, [("f32", (n,))] * 2)
    ins = _data(n, seed)
    want, _ = evaluate(p, ins)
    got = [np.empty(s, d.np_dtype) for d, s in p.output_specs]
    ex.launch(p, ins, got)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-6)


@pytest.fixture(scope="module")
def cpu(native_cpu: hg.Executor) -> hg.Executor:
    return native_cpu


def test_shared_work_is_one_kernel(cpu):
    p = b.program(_shared, [N, N])
    compiled = cpu.compile(p)
    assert compiled.stats.launches_after == 1, compiled.source
    assert compiled.source.count("expf(") + compiled.source.count("hg_expf(") >= 1
    # the exp is computed once per element, not once per result
    body = compiled.source.split("void k0", 1)[1]
    assert body.count("hg_expf(") + body.count(" expf(") == 1, body
    _check(cpu, _shared)


def test_a_result_read_by_another_keeps_its_order(cpu):
    _check(cpu, _chained)
    p = b.program(_chained, [N, N])
    assert cpu.compile(p).stats.launches_after == 2


def test_small_and_empty(cpu):
    _check(cpu, _shared, n=1)
    p = b.program(_shared, [("f32", (0,))] * 2)
    got = [np.empty(s, d.np_dtype) for d, s in p.output_specs]
    cpu.launch(p, [np.empty(0, np.float32)] * 2, got)
    assert all(g.size == 0 for g in got)


def test_jit_black_scholes_style_two_results(cpu):
    @hg.jit
    def f(s, k):
        d = np.log(s / k)
        c = 1.0 / (1.0 + np.exp(-d))
        return s * c - k, k * (1.0 - c)

    rng = np.random.default_rng(3)
    s, k = rng.uniform(1, 9, (2, 257)).astype(np.float32)
    call, put = f(s, k)
    d = np.log(s.astype(np.float64) / k)
    c = 1 / (1 + np.exp(-d))
    np.testing.assert_allclose(call, s * c - k, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(put, k * (1 - c), rtol=1e-5, atol=1e-5)
    p, _ = f.program_for(s, k)
    assert cpu.compile(p).stats.launches_after == 1


def test_webgpu_stores_every_sibling():
    reason = registry.why_unavailable("webgpu")
    if reason is not None:
        pytest.skip(f"webgpu unavailable: {reason}")
    with hg.Executor("webgpu") as ex:
        _check(ex, _shared, rtol=1e-4)
        _check(ex, _chained, rtol=1e-4)


def test_emulated_cuda_stores_every_sibling(monkeypatch):
    monkeypatch.setenv("HOLOGRAM_CUDA_DEVICE", "emulated")
    reason = registry.why_unavailable("cuda")
    if reason is not None:
        pytest.skip(f"emulated cuda unavailable: {reason}")
    ex = hg.Executor("cuda")
    try:
        _check(ex, _shared, n=700, rtol=1e-4)
    finally:
        ex.close()
    assert os.environ["HOLOGRAM_CUDA_DEVICE"] == "emulated"


BIG = 1 << 17  # above schedule.SHARED_MIN_SIZE: the store-shared-values rules apply


def test_big_shared_work_is_still_one_loop(cpu):
    """Above the size where a value read by several readers may be stored, a value whose
    readers all end in the same loop is not: one kernel, no temps (Black-Scholes ran
    as 7 kernels through 5 temps)."""
    p = b.program(_shared, [("f32", (BIG,))] * 2)
    compiled = cpu.compile(p)
    assert compiled.stats.launches_after == 1 and not compiled.temps, compiled.source[-3000:]
    _check(cpu, _shared, n=BIG, seed=4)
    _check(cpu, _chained, n=BIG, seed=5)


def _residual(x, y, z):
    h = x * y + z  # three full-size reads behind it
    return h * 2.0, h - h.max(axis=0, keepdims=True)


def test_a_shared_value_a_reduction_reads_is_still_stored(cpu):
    p = b.program(_residual, [("f32", (BIG,))] * 3)
    compiled = cpu.compile(p)
    assert compiled.temps, compiled.source[-3000:]  # h: stored once, read by both
    rng = np.random.default_rng(6)
    ins = [rng.standard_normal(BIG).astype(np.float32) for _ in range(3)]
    want, _ = evaluate(p, ins)
    got = [np.empty(s, d.np_dtype) for d, s in p.output_specs]
    cpu.launch(p, ins, got)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=2e-6, atol=1e-6)
