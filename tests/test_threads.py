"""Thread counts: where the count comes from, and results that do not depend on it.

Kernels hand out chunks of their loops on demand (``schedule(dynamic)``), so which
thread computes which element changes from run to run; each element, row or column
block is still computed whole by one thread, so those results must be bit-identical
for every thread count and under a background load. Whole-array sums split their
terms among the threads (in double): those may differ in the last bits of a double
across thread counts, and are compared with a tolerance.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hologram as hg
from hologram import threads
from hologram.compiler.render_c import DYNAMIC_CHUNKS, MIN_CHUNK_WORK, dynamic_chunk
from hologram.isa import builder as b
from hologram.isa.dtypes import i64
from hologram.isa.opcodes import Op
from hologram.ops import composites as C

from .programs import compiled_and_reference, programs, random_inputs
from .test_differential import assert_close


@pytest.fixture(autouse=True)
def _restore_threads():
    yield
    hg.set_num_threads(None)


@pytest.fixture(scope="module")
def ex(native_cpu: hg.Executor) -> hg.Executor:
    return native_cpu


def _clear_env(monkeypatch) -> None:
    for name in ("HOLOGRAM_NUM_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)


def test_environment_order(monkeypatch, tmp_path: Path) -> None:
    _clear_env(monkeypatch)
    monkeypatch.setattr(threads, "affinity", lambda: 8)
    assert threads.detect(tmp_path) == threads.ThreadCount(8, threads.detect(tmp_path).source)
    monkeypatch.setenv("OMP_NUM_THREADS", "3,2")  # nested levels: the outermost counts
    assert threads.detect(tmp_path).count == 3
    monkeypatch.setenv("HOLOGRAM_NUM_THREADS", "5")
    assert threads.detect(tmp_path) == threads.ThreadCount(5, "HOLOGRAM_NUM_THREADS")
    hg.set_num_threads(2)
    assert threads.detect(tmp_path) == threads.ThreadCount(2, "hologram.set_num_threads")


@pytest.mark.parametrize("value", ["x", "0", "-2", "1.5"])
def test_bad_environment_is_ignored_and_said(monkeypatch, tmp_path: Path, value: str) -> None:
    _clear_env(monkeypatch)
    monkeypatch.setattr(threads, "affinity", lambda: 4)
    monkeypatch.setenv("HOLOGRAM_NUM_THREADS", value)
    t = threads.detect(tmp_path)
    assert t.count == 4
    assert len(t.ignored) == 1 and "HOLOGRAM_NUM_THREADS" in t.ignored[0]


@pytest.mark.parametrize(("files", "want"), [
    ({"cpu.max": "150000 100000\n"}, 2),  # v2: 1.5 CPUs rounds up
    ({"cpu.max": "max 100000\n"}, 8),  # v2: no quota
    ({"cpu/cpu.cfs_quota_us": "300000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 3),  # v1
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, 8),  # v1: none
    ({"cpu.max": "3200000 100000\n"}, 8),  # a quota above the mask: the mask
    ({}, 8),
])
def test_cgroup_quota_caps_the_affinity(monkeypatch, tmp_path: Path, files: dict[str, str],
                                        want: int) -> None:
    _clear_env(monkeypatch)
    monkeypatch.setattr(threads, "affinity", lambda: 8)
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert threads.detect(tmp_path).count == want


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_set_num_threads_refuses_bad_counts(bad: object) -> None:
    with pytest.raises(ValueError, match="set_num_threads: n must be a positive int"):
        hg.set_num_threads(bad)  # type: ignore[arg-type]


def test_info_reports_threads() -> None:
    from hologram.cli import collect_info, format_info

    hg.set_num_threads(3)
    assert "CPU kernel threads: 3 (hologram.set_num_threads)" in format_info(collect_info())


@pytest.mark.parametrize(("count", "work", "simd"), [
    (10_000_000, None, True), (32768, None, True), (1024, 1024 * 768, False),
    (3, 3 * 100_000, False), (1, None, False), (100, 50, False),
])
def test_chunks_bound_the_count_and_the_work(count: int, work: int | None, simd: bool) -> None:
    c = dynamic_chunk(count, work, simd)
    assert 1 <= c <= count
    assert -(-count // c) <= DYNAMIC_CHUNKS or c == count
    per = max(1, (work or count) // count)
    assert c * per >= min(MIN_CHUNK_WORK, count * per)
    if simd and c < count:
        assert c % 16 == 0


# Programs big enough that every loop runs on the threads: a flat element-wise loop,
# row kernels (softmax, layer norm), a column reduction, a gather, a scan, and a
# whole-array sum.
N, ROWS, COLS = 1 << 20, 1024, 768


def _kernels(x, m, idx):
    flat = (x * 1.5 + 0.25).tanh()
    rows = C.softmax(m, axis=-1)
    ln = C.layer_norm(m, None, None, axes=(1,))
    cols = m.sum(axis=0)
    gathered = m.take(idx.cast(i64), axis=0)  # jit takes float arguments: cast
    scan = m.cumsum(axis=1)
    mx = m.max(axis=1, keepdims=True)  # one element per row, the whole row's work
    lse = mx + (m - mx).exp().sum(axis=1, keepdims=True).log()
    return flat, rows, ln, cols, gathered, scan, x.sum(), lse


def _run_all(counts: list[int]) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(7)
    x = rng.standard_normal(N).astype(np.float32)
    m = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    idx = rng.integers(0, ROWS, size=ROWS * 2).astype(np.float64)
    f = hg.jit(_kernels, backend="cpu")
    out = []
    for n in counts:
        hg.set_num_threads(n)
        out.append([np.array(r) for r in f(x, m, idx)])
    return out


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    """Bit for bit, the whole-array sum included: it adds fixed chunks' partials in
    chunk order whatever thread ran each chunk."""
    for u, v in zip(a, b, strict=True):
        np.testing.assert_array_equal(u, v)


@pytest.fixture(params=["team", "openmp", "openmp, busy window"])
def threading_mode(request):
    """Who runs the loops; "openmp, busy window": OpenMP mode with a busy machine's
    window held open, so every loop goes to the team (compiler/team.py, "Under load")."""
    import ctypes

    from hologram.compiler import team

    mode = request.param.split(",")[0]
    hg.set_threading(mode)
    load = None
    if "window" in request.param:
        if not sys.platform.startswith("linux"):
            pytest.skip("busy windows are Linux only")
        _run_all([2])  # the team's library is built and bound
        load = (ctypes.c_double * 5).from_address(team.load_address())
        load[0] = float("inf")
    yield mode
    if load is not None:
        load[0] = 0.0
    hg.set_threading(None)


def test_results_do_not_depend_on_the_thread_count(ex: hg.Executor, threading_mode) -> None:
    one, two, three, again = _run_all([1, 2, 3, 2])
    _same(one, two)
    _same(one, three)
    _same(two, again)


def test_results_hold_under_a_background_load(ex: hg.Executor, threading_mode, load) -> None:
    quiet = _run_all([2])[0]
    load.on()
    try:
        loaded = _run_all([2, 2, 3])
    finally:
        load.off()
    for r in loaded:
        _same(quiet, r)


def _row_lse(m):
    mx = m.max(axis=1, keepdims=True)
    return (mx + (m - mx).exp().sum(axis=1, keepdims=True).log())[:, 0]


@pytest.mark.parametrize("cols", [1024, 1])
def test_a_row_reduction_splits_by_its_rows_work(ex: hg.Executor, cols: int) -> None:
    """A kernel that stores one element per row splits its rows over the threads when
    the rows' reductions are work enough (4096 x 1024: it ran on one thread when only
    the 4096 stored elements counted), and not when they are not (4096 x 1)."""
    m = np.random.default_rng(3).standard_normal((4096, cols)).astype(np.float32)
    m[5, -1] = np.nan
    m[9, :] = -np.inf
    f = hg.jit(_row_lse, backend="cpu")
    src = f.explain(m)
    assert ("hg_par(k0_chunk" in src) == (cols == 1024), src[-2000:]
    with np.errstate(invalid="ignore"):
        mx = m.astype(np.float64).max(axis=1, keepdims=True)
        want = (mx + np.log(np.exp(m - mx).sum(axis=1, keepdims=True)))[:, 0]
    np.testing.assert_allclose(np.array(f(m)), want, rtol=2e-6, atol=1e-6)


def test_pytorch_keeps_its_thread_count(ex: hg.Executor) -> None:
    """hologram's count is its own: the OpenMP runtime may be the one PyTorch loaded
    (dynamo refuses a trace during which torch.get_num_threads() changed)."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    hg.set_num_threads(1 if before > 1 else 2)
    _run_all([3, 1])
    assert torch.get_num_threads() == before


# --- random programs on 1, 2 and 3 threads, quiet and under load -------------------------
@pytest.fixture
def every_loop_parallel(monkeypatch) -> hg.Executor:
    """A fresh executor whose kernels run every loop on the threads in chunks of a
    single element or row where they may (the thresholds that keep small loops on one
    thread set to 1), so the random programs' few elements are spread over the threads
    and handed out in many chunks."""
    from hologram.compiler import render_c

    for name in ("PARALLEL_MIN_WORK", "PARALLEL_MIN_WORK_MATH", "MIN_CHUNK_WORK"):
        monkeypatch.setattr(render_c, name, 1)
    monkeypatch.setattr(render_c.CRenderer, "parallel_min_work", 1)
    ex = hg.Executor("cpu")
    if "C via" not in ex.backend.describe():
        pytest.skip("no C compiler: the cpu backend is the reference interpreter")
    yield ex
    ex.close()


@pytest.fixture
def load():
    """A process keeping a CPU busy, paused (SIGSTOP) until ``on()``: switched per example
    at no cost, where starting a process per example would cost more than the example."""
    import os
    import signal

    if not hasattr(signal, "SIGSTOP"):
        pytest.skip("needs POSIX signals")
    p = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    os.kill(p.pid, signal.SIGSTOP)

    class Load:
        def on(self) -> None:
            os.kill(p.pid, signal.SIGCONT)
            time.sleep(0.01)  # scheduled before the launch

        def off(self) -> None:
            os.kill(p.pid, signal.SIGSTOP)

        def across(self, run: Any) -> list[Any]:
            """``run()`` on 1, 2 and 3 threads, then on 2 and 3 under the load."""
            out = []
            for n, busy in ((1, False), (2, False), (3, False), (2, True), (3, True)):
                hg.set_num_threads(n)
                (self.on if busy else self.off)()
                out.append(run())
            self.off()
            return out

    yield Load()
    p.kill()
    p.wait()


def _random_program_runs(ex, case, seed, load) -> tuple[bool, list[list[np.ndarray]], list]:
    fn, specs = case
    p = b.program(fn, specs)
    inputs = random_inputs(specs, seed, special=True)
    results = load.across(lambda: compiled_and_reference(ex, p, inputs))
    return (any(v.op is Op.GEMM for v in p.instructions), [got for got, _ in results],
            results[-1][1])


@settings(max_examples=15, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
@given(programs(dtype="f32", gemm=True), st.integers(0, 2**32 - 1))
def test_random_programs_on_1_2_3_threads_quiet_and_under_load(
        every_loop_parallel, threading_mode, load, case, seed) -> None:
    """Issue 21's determinism on random programs (tests/programs.py): every loop on the
    threads in many chunks, run on 1, 2 and 3 threads, then on 2 and 3 while another
    process keeps a CPU busy: the same bits each time (element-wise ops, rows,
    reductions, index ops and scans are each computed whole by one thread; whole-array
    sums add fixed chunks' partials in chunk order); a program with a GEMM, whose tiles
    follow the thread count, within the reference's tolerance."""
    gemm, runs, want = _random_program_runs(every_loop_parallel, case, seed, load)
    for got in runs:
        if gemm:
            for g, w in zip(got, want, strict=True):
                assert_close(g, w, rtol=1e-4, atol=1e-4)
        else:
            _same(runs[0], got)


def _op_suite(ex: hg.Executor, rng: np.random.Generator) -> dict[str, Any]:
    """Each op of ``hologram.ops`` (``composites`` aside) as a thunk that runs it on fixed
    inputs into fresh buffers and returns what it wrote (a loss: the returned float too)."""
    from hologram import ops

    def put(x: np.ndarray) -> Any:
        buf = ex.allocate(x.shape, dtype=np.float32)
        buf.from_numpy(x.astype(np.float32))
        return buf

    n, rows, cols = 3073, 37, 130
    x, y = rng.standard_normal(n) * 3, rng.standard_normal(n) * 3
    x[:4] = [np.nan, np.inf, -np.inf, -0.0]
    m = rng.standard_normal((rows, cols)) * 3
    prob = rng.uniform(0.01, 0.99, n)
    onehot = np.eye(cols)[rng.integers(0, cols, rows)]
    a, b, p, t, mb, oh = put(x), put(y), put(prob), put(prob[::-1].copy()), put(m), put(onehot)
    w, v = put(rng.standard_normal((cols, 65))), put(rng.standard_normal(cols))

    def got(r: Any) -> np.ndarray:  # a buffer's contents, or a returned float
        return np.array([r]) if isinstance(r, float) else r.to_numpy().copy()

    def out(shape: Any) -> Any:
        return ex.allocate(shape, dtype=np.float32)

    def unary(op: Any, *args: Any, **kw: Any) -> Any:
        return lambda: [got(op(ex, a, out(n), *args, **kw))]

    def binary(op: Any) -> Any:
        return lambda: [got(op(ex, a, b, out(n)))]

    def reduce(op: Any) -> Any:  # whole, then along each axis
        return lambda: [got(op(ex, mb, out((1,)))), got(op(ex, mb, out((cols,)), axis=0)),
                        got(op(ex, mb, out((rows,)), axis=1))]

    def rows_op(op: Any) -> Any:
        return lambda: [got(op(ex, mb, out((rows, cols)), axis=1)),
                        got(op(ex, mb, out((rows, cols)), axis=0))]

    def loss(op: Any, lhs: Any, rhs: Any, shape: Any) -> Any:
        def run() -> list[np.ndarray]:
            mean = op(ex, lhs, rhs, out(shape), reduction="mean")
            return [got(mean), got(op(ex, lhs, rhs, out(shape), reduction="none"))]
        return run

    return {
        **{name: unary(getattr(ops, name)) for name in
           ("vector_abs", "vector_neg", "vector_relu", "sigmoid", "tanh")},
        "gelu": lambda: [got(ops.gelu(ex, a, out(n))),
                         got(ops.gelu(ex, a, out(n), approximate="none"))],
        "vector_clip": unary(ops.vector_clip, -0.5, 1.25),
        "scalar_add": unary(ops.scalar_add, 0.75),
        "scalar_mul": unary(ops.scalar_mul, -1.5),
        **{name: binary(getattr(ops, name)) for name in
           ("vector_add", "vector_sub", "vector_mul", "vector_div", "vector_min",
            "vector_max")},
        **{name: reduce(getattr(ops, name)) for name in
           ("reduce_sum", "reduce_max", "reduce_min")},
        **{name: rows_op(getattr(ops, name)) for name in ("softmax", "log_softmax")},
        "mse_loss": loss(ops.mse_loss, a, b, (n,)),
        "binary_cross_entropy_loss": loss(ops.binary_cross_entropy_loss, p, t, (n,)),
        "cross_entropy_loss": loss(ops.cross_entropy_loss, mb, oh, (rows,)),
        "gemm": lambda: [got(ops.gemm(ex, mb, w, out((rows, 65))))],
        "matvec": lambda: [got(ops.matvec(ex, mb, v, out((rows,))))],
    }


def test_the_op_suite_on_1_2_3_threads_quiet_and_under_load(every_loop_parallel, threading_mode,
                                                            load) -> None:
    """Issue 21's determinism on the op library: every op (every loop on the threads in
    many chunks) on 1, 2 and 3 threads, then on 2 and 3 under a background load: the
    same bits each time; the BLAS products (gemm, matvec), whose tiles follow the thread
    count, within float32's rounding of the one-thread result."""
    from hologram import ops

    suite = _op_suite(every_loop_parallel, np.random.default_rng(21))
    assert set(suite) == set(ops.__all__) - {"composites"}  # a new op joins the table
    for name, run in suite.items():
        results = load.across(run)
        for r in results[1:]:
            if name in ("gemm", "matvec"):
                for u, v in zip(results[0], r, strict=True):
                    np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-5)
            else:
                _same(results[0], r)
