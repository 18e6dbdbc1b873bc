"""hologram's thread team (compiler/team.py): every chunk runs exactly once, on a
thread below the job's count, whatever the workers do; a worker that never runs
stalls nothing; nested and concurrent calls run on the caller; a forked child gets a
working team of its own."""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import hologram as hg
from hologram.compiler import cc, team
from hologram.compiler.cc import C_PRELUDE, CCompiler
from hologram.ops import composites as C

# A chunk function that counts each index's visits and records the thread, and one
# that calls the team again from inside a chunk (nested).
_PROBE = C_PRELUDE + r"""
static void count(void *ctx, int64_t lo, int64_t hi, int tid) {
  int32_t *c = (int32_t *)ctx;
  for (int64_t i = lo; i < hi; i++) {
    __atomic_fetch_add(&c[2 * i], 1, __ATOMIC_RELAXED);
    c[2 * i + 1] = tid;
  }
}
void run_count(int32_t *c, int64_t n, int64_t chunk, int64_t nt, int64_t times) {
  for (int64_t t = 0; t < times; t++) hg_par_nt(count, c, n, chunk, nt);
}
static void nested(void *ctx, int64_t lo, int64_t hi, int tid) {
  int32_t *c = (int32_t *)ctx;
  (void)tid;
  for (int64_t i = lo; i < hi; i++) hg_par_nt(count, c + 2 * 64 * i, 64, 8, 2);
}
void run_nested(int32_t *c, int64_t n) { hg_par_nt(nested, c, n, 1, 2); }
/* A job whose first chunk a worker claims stalls `us` microseconds off the CPU (as a
   worker descheduled while it holds a chunk); the other chunks spin 5 us. */
#include <time.h>
static _Atomic int stalled;
static int64_t stall_us;
static void stalling(void *ctx, int64_t lo, int64_t hi, int tid) {
  int32_t *c = (int32_t *)ctx;
  if (tid > 0 && stall_us > 0 && !__atomic_exchange_n(&stalled, 1, __ATOMIC_SEQ_CST)) {
    struct timespec ts = {stall_us / 1000000, (stall_us % 1000000) * 1000};
    nanosleep(&ts, 0);
  } else {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do clock_gettime(CLOCK_MONOTONIC, &t1);
    while ((t1.tv_sec - t0.tv_sec) * 1000000000L + (t1.tv_nsec - t0.tv_nsec) < 5000);
  }
  for (int64_t i = lo; i < hi; i++) {
    __atomic_fetch_add(&c[2 * i], 1, __ATOMIC_RELAXED);
    c[2 * i + 1] = tid;
  }
}
void run_stalling(int32_t *c, int64_t n, int64_t us, int64_t times) {
  stall_us = us;
  for (int64_t t = 0; t < times; t++) {
    stalled = 0;
    hg_par_nt(stalling, c + 2 * n * t, n, 1, 2);
  }
}
"""


@pytest.fixture(scope="module", autouse=True)
def on_the_team():
    """These tests are about the team: other tests may have imported PyTorch, which
    makes OpenMP the default (hologram.threads.threading)."""
    hg.set_threading("team")
    yield
    hg.set_threading(None)


@pytest.fixture(scope="module")
def probe():
    cc = CCompiler.find()
    if cc is None or "-fopenmp" not in cc.flags:
        pytest.skip("needs a C compiler with OpenMP (the team binds to such libraries)")
    lib = cc.compile(_PROBE, {"test": "team"})
    i64 = ctypes.c_int64
    lib.run_count.argtypes = [ctypes.c_void_p, i64, i64, i64, i64]
    lib.run_nested.argtypes = [ctypes.c_void_p, i64]
    lib.run_stalling.argtypes = [ctypes.c_void_p, i64, i64, i64]
    hold = team.library(cc).hg_team_hold
    hold.argtypes = [ctypes.c_int]
    return lib, hold


def _count(lib, n: int, chunk: int, nt: int, times: int = 1) -> np.ndarray:
    c = np.zeros((n, 2), np.int32)
    lib.run_count(c.ctypes.data, n, chunk, nt, times)
    return c


@pytest.mark.parametrize("nt", [1, 2, 3, 5])
@pytest.mark.parametrize("n,chunk", [(1, 1), (7, 3), (1000, 16), (4096, 1), (10, 100)])
def test_every_chunk_runs_once_on_a_thread_of_the_job(probe, n, chunk, nt):
    lib, _ = probe
    c = _count(lib, n, chunk, nt, times=3)
    np.testing.assert_array_equal(c[:, 0], 3)
    assert c[:, 1].min() >= 0 and c[:, 1].max() < nt


def test_many_jobs_in_a_row(probe):
    """Thousands of back-to-back jobs (the generation wraps past 16 bits)."""
    lib, _ = probe
    c = _count(lib, 64, 1, 3, times=70_000)
    np.testing.assert_array_equal(c[:, 0], 70_000)


def test_workers_that_never_run_stall_nothing(probe):
    """With every worker held (as if the OS never scheduled them), each job completes
    on the calling thread alone: it waits only for chunks someone claimed."""
    lib, hold = probe
    hold(1)
    try:
        c = _count(lib, 4096, 16, 4, times=50)
    finally:
        hold(0)
    np.testing.assert_array_equal(c[:, 0], 50)
    np.testing.assert_array_equal(c[:, 1], 0)


def _affinities() -> dict[int, set[int]]:
    out = {}
    for t in os.listdir("/proc/self/task"):
        try:
            out[int(t)] = os.sched_getaffinity(int(t))
        except OSError:  # the thread ended meanwhile
            pass
    return out


def _stalling_jobs(lib, us: int, times: int) -> tuple[np.ndarray, int]:
    """``times`` jobs of 256 chunks whose first worker chunk stalls ``us`` off the CPU:
    the visit counts and threads per index (every index checked visited once), and how
    many holders the callers moved."""
    stats = ctypes.c_long.in_dll(team.library(CCompiler.find()), "hg_rescues")
    before = stats.value
    c = np.zeros((256 * times, 2), np.int32)
    lib.run_stalling(c.ctypes.data, 256, us, times)
    np.testing.assert_array_equal(c[:, 0], 1)
    return c, stats.value - before


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux CPU affinity")
def test_a_holder_off_the_cpu_is_taken_onto_the_callers(probe):
    """A worker that holds a chunk while off the CPU (here: asleep 20 ms inside it) is
    moved onto the caller's CPU while the caller sleeps; every chunk still runs once,
    and afterwards no thread is left pinned to the caller's CPU."""
    c, moved = _stalling_jobs(probe[0], 20_000, 5)
    if not (c[:, 1] > 0).any():
        pytest.skip("no worker claimed a chunk (an overloaded machine)")
    assert moved >= 1
    everyone = os.sched_getaffinity(0)
    if len(everyone) > 2:  # (with two CPUs a spread worker has one of its own)
        for tid, cpus in _affinities().items():
            assert len(cpus) > 1, (tid, cpus)


def test_without_a_stall_nothing_is_moved(probe):
    """Chunks that finish in their time are not moved (a few may be, where the OS
    deschedules a worker here for longer than its patience: a busy test machine)."""
    times = 20
    c, moved = _stalling_jobs(probe[0], 0, times)
    assert (c[:, 1] > 0).any()  # the workers took part
    assert moved <= times // 4


def _now_us() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6


@pytest.fixture()
def openmp_load(probe):
    """OpenMP mode, and the process's record of OpenMP's loops under load (``hg_load``:
    until, windows opened, share, this stretch's work, its start)."""
    hg.set_threading("openmp")
    load = (ctypes.c_double * 5).from_address(team.load_address())
    try:
        yield load
    finally:
        load[0] = 0.0
        hg.set_threading("team")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
def test_the_share_of_time_in_openmp_regions(probe, openmp_load):
    """The share of time in regions' work, over stretches of ``cc.SHARE_US``: near 1 for
    regions back to back, small for regions between sleeps. (Each part starts with no
    window open: regions in a window run on the team and measure nothing.)"""
    lib, _ = probe
    load = openmp_load
    c = np.zeros((256 * 40, 2), np.int32)
    load[0], load[2], load[3], load[4] = 0.0, 0.0, 0.0, _now_us()
    lib.run_stalling(c.ctypes.data, 256, 0, 40)  # regions back to back
    assert load[2] > cc.INSIDE_MIN
    load[0], load[3], load[4] = 0.0, 0.0, _now_us()
    for _ in range(4):  # mostly outside regions (long enough that a region whose caller
        time.sleep(0.05)  # the OS deschedules for a few ticks still counts for little)
        lib.run_stalling(c.ctypes.data, 16, 0, 1)
    assert load[2] < cc.INSIDE_MIN


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
@pytest.mark.parametrize("share,compiling", [(1.0, False), (0.0, False), (1.0, True)])
def test_a_late_openmp_region_sends_loops_to_the_team(probe, openmp_load, share, compiling):
    """A region whose end waited for a late thread (here a worker asleep 5 ms in its
    chunk) opens a window in which loops run on the team, in a process that spends
    most of its time in regions' work and compiles nothing (hologram's own compiler
    takes the cores: ``team.compiling``); otherwise nothing changes."""
    lib, _ = probe
    load = openmp_load
    jobs = ctypes.c_long.in_dll(team.library(CCompiler.find()), "hg_jobs")
    c = np.zeros((256, 2), np.int32)
    took_part = False
    opens = share > cc.INSIDE_MIN and not compiling
    for _ in range(5):  # (a descheduled caller can end its share after the stall)
        c[:] = 0
        load[0], load[2], load[4] = 0.0, share, _now_us()  # (the stretch runs on)
        opened = load[1]
        with team.compiling() if compiling else contextlib.nullcontext():
            lib.run_stalling(c.ctypes.data, 256, 5000, 1)
        took_part = took_part or bool((c[:, 1] > 0).any())  # a worker claimed, so stalled
        if took_part and (not opens or load[0] > 0.0):
            break
    if not took_part:
        pytest.skip("no worker claimed a chunk (an overloaded machine)")
    before = jobs.value
    _count(lib, 4096, 16, 2)
    if opens:
        assert load[0] > _now_us() and load[1] == opened + 1
        assert jobs.value == before + 1  # on the team
        load[0] = 0.0
        _count(lib, 4096, 16, 2)
        assert jobs.value == before + 1  # back on OpenMP
    else:
        assert load[0] == 0.0 and load[1] == opened
        assert jobs.value == before


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
def test_without_a_team_library_openmp_mode_keeps_its_loops(probe, monkeypatch):
    """Where the team's C does not build, binding a library in OpenMP mode warns once and
    leaves its loops on OpenMP (no busy windows), rather than failing the load."""
    from hologram import threads

    lib, _ = probe

    def no_team() -> int:
        raise cc.CompileError("no compiler for the team here")

    monkeypatch.setattr(threads, "_WARNED", set())
    with pytest.warns(RuntimeWarning, match="thread team does not build here"):
        threads._point(lib, no_team, "openmp")
    assert ctypes.c_void_p.in_dll(lib, "hg_team_busy").value is None
    assert ctypes.c_void_p.in_dll(lib, "hg_load").value is None
    np.testing.assert_array_equal(_count(lib, 4096, 16, 2)[:, 0], 1)
    threads._point(lib, lambda: team.runtime(CCompiler.find()), "team")  # as it was


def test_nested_calls_run_on_the_calling_thread(probe):
    lib, _ = probe
    c = np.zeros((16 * 64, 2), np.int32)
    lib.run_nested(c.ctypes.data, 16)
    np.testing.assert_array_equal(c[:, 0], 1)


def test_concurrent_callers(probe):
    """Python threads calling at once (ctypes drops the GIL): one holds the team, the
    others run on their own thread; every count is right."""
    lib, _ = probe
    outs = [np.zeros((2048, 2), np.int32) for _ in range(4)]

    def work(c: np.ndarray) -> None:
        lib.run_count(c.ctypes.data, 2048, 8, 2, 200)

    ts = [threading.Thread(target=work, args=(c,)) for c in outs]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for c in outs:
        np.testing.assert_array_equal(c[:, 0], 200)


@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "darwin",
                    reason="fork semantics of POSIX threads")
def test_a_forked_child_has_a_working_team(probe):
    lib, _ = probe
    _count(lib, 4096, 16, 2)  # the parent's workers exist
    pid = os.fork()
    if pid == 0:  # child: its own workers start on demand
        code = 1
        try:
            x = np.linspace(-3, 3, 1 << 20, dtype=np.float32)
            ok = np.allclose(hg.jit(lambda v: v * 2.0 + 1.0)(x), x * 2 + 1)
            c = _count(lib, 4096, 16, 2)
            code = 0 if ok and (c[:, 0] == 1).all() else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0


def test_kernels_run_on_the_team():
    """Parallel loops of CPU kernels are team chunk functions; results match NumPy at
    every thread count."""
    x = np.random.default_rng(0).standard_normal((4096, 256)).astype(np.float32)
    f = hg.jit(lambda v: (v * 2.0).sum(axis=1))
    assert "hg_par(k0_chunk" in f.explain(x)
    want = (x.astype(np.float64) * 2).sum(axis=1)
    try:
        for n in (1, 2, 3):
            hg.set_num_threads(n)
            np.testing.assert_allclose(f(x), want, rtol=1e-5, atol=1e-4)
    finally:
        hg.set_num_threads(None)


def test_openmp_mode_gives_the_same_bits():
    """``set_threading("openmp")`` runs the same chunk functions in OpenMP regions:
    every result is bit for bit the team's, the whole-array sum included."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal(1 << 20).astype(np.float32)
    m = rng.standard_normal((2048, 300)).astype(np.float32)
    f = hg.jit(lambda v, w: ((v * 1.5).tanh(), C.softmax(w, axis=-1), w.sum(axis=0), v.sum()))
    team_out = [np.array(r) for r in f(x, m)]
    try:
        hg.set_threading("openmp")
        omp_out = [np.array(r) for r in f(x, m)]
    finally:
        hg.set_threading("team")
    for a, b in zip(team_out, omp_out, strict=True):
        np.testing.assert_array_equal(a, b)


def test_threading_mode_sources(monkeypatch):
    from hologram import threads

    hg.set_threading(None)
    try:
        monkeypatch.setenv(threads.THREADING_ENV, "openmp")
        assert threads.threading() == ("openmp", threads.THREADING_ENV)
        monkeypatch.setenv(threads.THREADING_ENV, "fibers")
        mode, why = threads.threading()
        assert "ignored" in why and mode in threads.THREADING_MODES
        with pytest.raises(ValueError, match="set_threading: mode must be one of"):
            hg.set_threading("fibers")
    finally:
        hg.set_threading("team")


def test_importing_hologram_torch_keeps_the_team_which_steps_aside():
    """In a process that imports PyTorch the team keeps the loops, and steps aside for
    PyTorch's eager ops (``team.set_aside``); a mode the user chose is left as it is."""
    pytest.importorskip("torch")
    code = (
        "import ctypes, sys\n"
        "import numpy as np, hologram as hg\n"
        "from hologram import threads\n"
        "from hologram.compiler import team\n"
        "f = hg.jit(lambda v: v * 2.0)\n"
        "x = np.ones(1 << 20, np.float32)\n"
        "f(x)\n"
        "assert threads.threading()[0] == 'team', threads.threading()\n"
        "lib = threads._TEAM_LIBS[-1][0]\n"
        "before = ctypes.c_void_p.in_dll(lib, 'hg_team').value\n"
        "import hologram_torch\n"
        "after = ctypes.c_void_p.in_dll(lib, 'hg_team').value\n"
        "want = int(sys.argv[1])\n"
        "mode, why = threads.threading()\n"
        "assert mode == 'team' and ('PyTorch' in why) == bool(want), (mode, why)\n"
        "assert before and after == before, (before, after)\n"
        "aside = lambda: ctypes.c_int.in_dll(team._LIB, 'hg_aside_on').value\n"
        "assert aside() == want, aside()\n"
        "assert (f(x) == 2).all()\n")
    for chosen, aside in ((None, 1), ("team", 0)):
        env = {k: v for k, v in os.environ.items() if k != "HOLOGRAM_THREADING"}
        if chosen:
            env["HOLOGRAM_THREADING"] = chosen
        r = subprocess.run([sys.executable, "-c", code, str(aside)], capture_output=True,
                           text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]


def test_the_team_steps_aside_while_other_threads_keep_a_cpu_busy():
    """With ``set_aside`` on, the team declines its jobs (they open OpenMP regions,
    same results) once the process's other threads used more than ``OTHERS_MAX`` of a
    CPU over a probe, and not while they are idle."""
    from hologram import threads

    if threads.get_num_threads() < 2:
        pytest.skip("one thread: no parallel loop reaches the team")
    hg.set_threading("team")
    f = hg.jit(lambda v: v * 2.0 + 1.0)
    x = np.arange(1 << 22, dtype=np.float32)
    want = x * 2.0 + 1.0
    np.testing.assert_array_equal(f(x), want)
    team.set_aside(True)
    try:
        time.sleep(0.5)  # spinning pools of earlier tests go to sleep
        before = team.asides()
        end = time.monotonic() + 0.3
        while time.monotonic() < end:
            f(x)
        assert team.asides() == before
        stop = threading.Event()
        data = b"x" * (1 << 22)

        def burn() -> None:  # hashlib releases the GIL: a CPU's worth outside it
            while not stop.is_set():
                hashlib.sha256(data).digest()

        burner = threading.Thread(target=burn)
        burner.start()
        try:
            end = time.monotonic() + 5.0
            while team.asides() == before and time.monotonic() < end:
                got = f(x)  # back to back: a gap of team.GAP_US restarts the probe
        finally:
            stop.set()
            burner.join()
        assert team.asides() > before
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(f(x), want)  # on OpenMP's threads now
    finally:
        team.set_aside(False)


def test_a_stored_concat_is_one_team_job():
    """A big stored CONCAT is one job, small parts included: along an inner axis, one
    loop over the dims before it (here the 512 rows) with every part's window inside
    (``render_c.concat_kernel``, units first); along the first axis, the parts' loops
    laid end to end. Every split of the range gives NumPy's result."""
    from hologram.isa import builder as b
    from hologram.isa.builder import Var

    rng = np.random.default_rng(2)
    x = rng.standard_normal((512, 300)).astype(np.float32)
    y = rng.standard_normal((512, 7)).astype(np.float32)
    p = b.program(lambda u, v: Var(b.concat([u.v, (v * 2.0).v, (u + 1.0).v], axis=1)),
                  [("f32", x.shape), ("f32", y.shape)])
    want = np.concatenate([x, y * 2, x + 1], axis=1)
    xt, yt = np.ascontiguousarray(x.T), np.ascontiguousarray(y.T)
    p0 = b.program(lambda u, v: Var(b.concat([u.v, (v * 2.0).v, (u + 1.0).v], axis=0)),
                   [("f32", xt.shape), ("f32", yt.shape)])
    want0 = np.concatenate([xt, yt * 2, xt + 1], axis=0)
    with hg.Executor("cpu") as ex:
        assert ex.compile(p).source.count("hg_par(k0_chunk, (void *)B, 512,") == 1
        assert ex.compile(p0).source.count("hg_par(k0_chunk, (void *)B, 607,") == 1
        try:
            for n in (1, 2, 3):
                hg.set_num_threads(n)
                for prog, args, w in ((p, [x, y], want), (p0, [xt, yt], want0)):
                    got = np.empty_like(w)
                    ex.launch(prog, args, [got])
                    np.testing.assert_array_equal(got, w)
        finally:
            hg.set_num_threads(None)



_SPREAD_PROBE = C_PRELUDE + r"""
#if defined(_OPENMP) && defined(__linux__)
void spread_from(int caller, long caller_tid) { hg_omp_spread(caller, caller_tid); }
#endif
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2,
                    reason="moves threads between CPUs: Linux with two or more CPUs")
def test_an_openmp_worker_on_its_callers_cpu_moves_off_it():
    """OpenMP's workers get the team's spread (``cc.THREADS_C``'s ``hg_omp_spread``,
    which ``hg_par_nt`` calls on each worker as a region opens): a thread on the
    caller's CPU takes the caller's allowed CPUs less that one; a thread elsewhere is
    left alone. Run on a thread of its own, pinned where the test needs it."""
    cc = CCompiler.find()
    if cc is None or "-fopenmp" not in cc.flags:
        pytest.skip("needs a C compiler with OpenMP")
    lib = cc.compile(_SPREAD_PROBE, {"test": "omp-spread"})
    lib.spread_from.argtypes = [ctypes.c_int, ctypes.c_long]
    cpus = sorted(os.sched_getaffinity(0))
    caller_tid = threading.get_native_id()
    seen: dict[str, set[int]] = {}

    def worker(where: int, caller_cpu: int, name: str) -> None:
        os.sched_setaffinity(0, {where})  # this thread only
        lib.spread_from(caller_cpu, caller_tid)
        seen[name] = os.sched_getaffinity(0)

    for args in ((cpus[0], cpus[0], "collides"), (cpus[1], cpus[0], "elsewhere")):
        t = threading.Thread(target=worker, args=args)
        t.start()
        t.join()
    assert seen["collides"] == set(cpus) - {cpus[0]}
    assert seen["elsewhere"] == {cpus[1]}
    src = C_PRELUDE[C_PRELUDE.index("static inline void hg_par_nt"):]
    assert "hg_omp_spread(caller, caller_tid)" in src.split("#pragma omp for")[0]
