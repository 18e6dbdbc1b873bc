"""hologram's own thread team: parallel loops that never wait for a thread that has
not started.

Why not OpenMP's ``parallel for``: an OpenMP region ends at a barrier every thread of
the team must reach, including one the OS has not scheduled yet. On a machine where
another process holds a core, that thread starts a timeslice late (milliseconds), and
the kernel, however dynamic its chunks, waits for it to wake, find no work and arrive
(issue 21 measured GELU 2.3x slower with one of two cores busy). This team hands out
chunks through one atomic word, and the calling thread, which always runs, claims
chunks too; when none is left it waits only for chunks another thread has claimed and
is running. A worker that wakes late finds the job closed and goes back to sleep.

The job word packs a generation (16 bits), the job's chunk count (24 bits) and the
next unclaimed chunk (24 bits). A thread claims chunk ``i`` by a compare-and-swap
from ``(gen, n, i)`` to ``(gen, n, i + 1)`` with ``i < n``; the job's function and
operands are read only after a successful claim, when they cannot change (the caller
publishes the next job only after every claimed chunk reported done). A stale worker
whose claim succeeds on a word equal to the current one (the generation wrapped) claims
a chunk of the current job, which is what the word says, so it is still right.

Workers spin for ``SPIN_US`` after a job (programs run kernels back to back, and a
sleeping thread takes tens of microseconds to wake), then sleep on a condition
variable; the caller signals it only when someone sleeps. A call from a team thread
(nested) or while another caller holds the team runs on the calling thread alone, so
nothing can deadlock; they too run the job chunk by chunk. Results never depend on which
thread runs a chunk: a chunk is a fixed range of the loop (a whole-array sum keeps a
partial per chunk and adds them in chunk order).

A worker that claims a job while running on the CPU its caller published moves off it,
to the caller's allowed CPUs less that one (``hg_spread``, ``SPREAD``): with another
process holding one of two cores, Linux balances run queues by length and would leave
the caller and the worker time-sharing one core, indefinitely. The caller is never
moved, and nothing leaves the CPUs the process may use.

Each kernel library carries a pointer ``hg_team`` (``cc.THREADS_C``) that
``hologram.threads`` sets when it loads the library, and calls
``hg_team(fn, ctx, n, chunk, threads)`` with ``fn(ctx, lo, hi, tid)`` running the
iterations ``lo..hi`` on thread ``tid`` (0: the caller; below ``threads``).
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

#: How long a worker polls for the next job before it sleeps, in microseconds. A
#: training step leaves 0.1-0.3 ms of Python between its programs: with 100 us the
#: workers slept through every gap and each program's first kernels paid their wake-up
#: (16K elements: 19-21 us against 11-12; 1000 us: 11-15, as OpenMP's spinning pool;
#: docs/perf.md, session 11). OpenMP's libgomp spins longer still by default.
SPIN_US = 1000
#: Whether a worker on its caller's CPU moves off it (``hg_spread``); OpenMP's workers
#: follow the same setting when hologram's loops run on them (``cc.THREADS_C``'s
#: ``hg_omp_spread``, applied by ``hologram.threads``).
SPREAD = True

SOURCE = r"""
/* hologram thread team (compiler/team.py) */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
/* hg:spread (cc.SPREAD_C: hg_omp_spread) */

typedef void (*hg_chunk_fn)(void *, int64_t, int64_t, int);

#define HG_TEAM_MAX 256
#define HG_GEN_SHIFT 48
#define HG_N_SHIFT 24
#define HG_FIELD 0xffffffULL

#if defined(__x86_64__) || defined(__i386__)
#define HG_RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define HG_RELAX() __asm__ __volatile__("yield")
#else
#define HG_RELAX() ((void)0)
#endif

static _Atomic uint64_t hg_word;        /* gen << 48 | chunks << 24 | next */
static _Atomic int64_t hg_done;         /* chunks of the open job that finished */
static _Atomic(hg_chunk_fn) hg_fn;
static _Atomic(void *) hg_ctx;
static _Atomic int64_t hg_n, hg_chunk;
static _Atomic int hg_nt;               /* threads the open job may use */
static _Atomic int hg_sleepers;
static _Atomic int hg_held;             /* tests: workers claim nothing (hg_team_hold) */
static int hg_workers;                  /* started (under hg_run_mu) */
static uint64_t hg_gen;                 /* last published generation (under hg_run_mu) */
static pthread_mutex_t hg_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hg_cv = PTHREAD_COND_INITIALIZER;
static pthread_mutex_t hg_run_mu = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local int hg_inside;     /* 1 on team threads and a caller inside a job */
static _Atomic int hg_caller_cpu = -1;  /* the CPU the open job's caller published it from */
static _Atomic long hg_caller_tid;      /* and its thread id (its CPU affinity) */
static _Thread_local long hg_tid;       /* this thread's id, once asked */

static double hg_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/* Claim and run chunks of the job the word holds while it is generation `gen`. */
static void hg_claim(uint64_t gen, int tid) {
  for (;;) {
    uint64_t w = atomic_load(&hg_word);
    if ((w >> HG_GEN_SHIFT) != gen) return;
    uint64_t n = (w >> HG_N_SHIFT) & HG_FIELD, i = w & HG_FIELD;
    if (i >= n) return;
    if (!atomic_compare_exchange_weak(&hg_word, &w, w + 1)) continue;
    /* chunk i is ours: the job cannot close before we report it, so its fields hold */
    const int64_t chunk = atomic_load_explicit(&hg_chunk, memory_order_relaxed);
    const int64_t total = atomic_load_explicit(&hg_n, memory_order_relaxed);
    const int64_t lo = (int64_t)i * chunk, hi = lo + chunk < total ? lo + chunk : total;
    atomic_load_explicit(&hg_fn, memory_order_relaxed)(
        atomic_load_explicit(&hg_ctx, memory_order_relaxed), lo, hi, tid);
    atomic_fetch_add(&hg_done, 1);
  }
}

/* A worker that finds itself on the caller's CPU moves off it (cc.SPREAD_C's
   hg_omp_spread, which OpenMP's workers use too). Linux balances run queues by their
   length, so with one core taken by another process (three runnable
   threads on two cores) it leaves the caller and the worker sharing one core, the other
   process alone on the other, indefinitely: the team then has one core, not the one and
   a half a fair share gives (issue 21 sampled this placement in ~60% of a busy GEMM's
   time). The worker takes the caller's allowed CPUs less the caller's own, so it never
   leaves what the process may use; a syscall only on a collision. */
static void hg_spread(void) {
  hg_omp_spread(atomic_load_explicit(&hg_caller_cpu, memory_order_relaxed),
                atomic_load_explicit(&hg_caller_tid, memory_order_relaxed));
}

static void *hg_worker(void *arg) {
  const int tid = (int)(intptr_t)arg;
  hg_inside = 1;
  uint64_t seen = atomic_load(&hg_word) >> HG_GEN_SHIFT;
  for (;;) {
    uint64_t gen = atomic_load(&hg_word) >> HG_GEN_SHIFT;
    if (gen == seen) {
      const double until = hg_now_us() + HG_SPIN_US;
      for (int polls = 1; gen == seen; polls++) {
        HG_RELAX();
        gen = atomic_load(&hg_word) >> HG_GEN_SHIFT;
        if ((polls & 63) == 0 && gen == seen && hg_now_us() > until) {
          pthread_mutex_lock(&hg_mu);
          atomic_fetch_add(&hg_sleepers, 1);
          while ((gen = atomic_load(&hg_word) >> HG_GEN_SHIFT) == seen)
            pthread_cond_wait(&hg_cv, &hg_mu);
          atomic_fetch_sub(&hg_sleepers, 1);
          pthread_mutex_unlock(&hg_mu);
        }
      }
    }
    seen = gen;
    if (tid < atomic_load(&hg_nt) && !atomic_load(&hg_held)) {
      hg_spread();
      hg_claim(gen, tid);
    }
  }
  return 0;
}

static void hg_after_fork_in_child(void) {
  /* the child has none of the parent's workers: start afresh */
  pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
  hg_mu = fresh;
  hg_run_mu = fresh;
  hg_cv = cv;
  hg_workers = 0;
  atomic_store(&hg_sleepers, 0);
}

/* Start workers 1..want-1 that are not running yet (under hg_run_mu). */
static int hg_grow(int want) {
  static int registered;
  if (!registered) {
    pthread_atfork(0, 0, hg_after_fork_in_child);
    registered = 1;
  }
  if (want > HG_TEAM_MAX) want = HG_TEAM_MAX;
  while (hg_workers + 1 < want) {
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &attr, hg_worker, (void *)(intptr_t)(hg_workers + 1));
    pthread_attr_destroy(&attr);
    if (rc != 0) break;  /* fewer threads: the caller and the rest share the chunks */
    hg_workers++;
  }
  return hg_workers + 1;
}

/* Tests: while `held` is non-zero, workers claim nothing, as if the OS never ran them. */
void hg_team_hold(int held) { atomic_store(&hg_held, held); }

void hg_team_run(hg_chunk_fn fn, void *ctx, int64_t n, int64_t chunk, int threads) {
  if (n <= 0) return;
  if (chunk < 1) chunk = 1;
  const int64_t most = (int64_t)HG_FIELD;  /* chunks a job word can count */
  if ((n + chunk - 1) / chunk > most) chunk = (n + most - 1) / most;
  const int64_t chunks = (n + chunk - 1) / chunk;
  if (threads <= 1 || chunks <= 1 || hg_inside || pthread_mutex_trylock(&hg_run_mu) != 0) {
    for (int64_t lo = 0; lo < n; lo += chunk)  /* chunk by chunk, as the team would */
      fn(ctx, lo, lo + chunk < n ? lo + chunk : n, 0);
    return;
  }
  const int have = hg_grow(threads);
  if (have < threads) threads = have;
  if (!hg_tid) hg_tid = (long)syscall(SYS_gettid);
  atomic_store_explicit(&hg_caller_tid, hg_tid, memory_order_relaxed);
  atomic_store_explicit(&hg_caller_cpu, HG_SPREAD ? sched_getcpu() : -1, memory_order_relaxed);
  atomic_store_explicit(&hg_fn, fn, memory_order_relaxed);
  atomic_store_explicit(&hg_ctx, ctx, memory_order_relaxed);
  atomic_store_explicit(&hg_n, n, memory_order_relaxed);
  atomic_store_explicit(&hg_chunk, chunk, memory_order_relaxed);
  atomic_store(&hg_nt, threads);
  atomic_store(&hg_done, 0);
  hg_gen = (hg_gen + 1) & 0xffffULL;
  atomic_store(&hg_word, hg_gen << HG_GEN_SHIFT | (uint64_t)chunks << HG_N_SHIFT);
  if (atomic_load(&hg_sleepers) > 0) {
    pthread_mutex_lock(&hg_mu);
    pthread_cond_broadcast(&hg_cv);
    pthread_mutex_unlock(&hg_mu);
  }
  hg_inside = 1;
  hg_claim(hg_gen, 0);
  hg_inside = 0;
  /* every chunk is claimed: wait for the ones other threads are still running */
  for (int polls = 1; atomic_load(&hg_done) < chunks; polls++) {
    if (polls < 4096) HG_RELAX();
    else sched_yield();  /* their thread may be waiting for this very core */
  }
  pthread_mutex_unlock(&hg_run_mu);
}
"""


@functools.cache
def library(cc: Any) -> Any:
    """The team's library compiled by ``cc`` (once per process: one team for every
    kernel library)."""
    return cc.compile(library_source(), RUNTIME_KEY)


RUNTIME_KEY = {"runtime": "team"}


def library_source() -> str:
    """The team's C source."""
    from .cc import SPREAD_C

    mark = "/* hg:spread (cc.SPREAD_C: hg_omp_spread) */"
    return (f"#define HG_SPIN_US {SPIN_US}.0\n#define HG_SPREAD {int(SPREAD)}\n"
            + SOURCE.replace(mark, mark + "\n" + SPREAD_C))


def runtime(cc: Any) -> int:
    """The address of ``hg_team_run``, which kernel libraries' ``hg_team`` point at."""
    return ctypes.cast(library(cc).hg_team_run, ctypes.c_void_p).value or 0
