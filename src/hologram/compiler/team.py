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

A worker the OS deschedules while it holds a chunk still holds up the job: with
another process on its core it waits a whole scheduler tick (4 ms at HZ=250) in that
core's run queue while the caller spins (issue 21 caught every slow softmax this way).
Its chunk cannot be run again elsewhere: a late writer could overwrite memory reused
since. So the caller, once it has held on longer than twice its own time per chunk
and 50 us, moves the holder onto its own CPU and sleeps on the job's done count
(``hg_take_holders``, ``RESCUE``): the worker then runs at once on the CPU the caller
left, finishes, wakes the caller and goes back to its former CPUs (a softmax over
4096 x 1024 with one of two cores busy: 2.1 ms -> 1.5 ms; docs/perf.md, session 26).

Under load (OpenMP's loops): with ``HOLOGRAM_THREADING=openmp``, or while the team
stands aside (below), hologram's loops run on OpenMP's threads, shared with PyTorch's
eager ops (``hologram.threads``). OpenMP's regions cannot do any of the above: a region
ends at a barrier every thread reaches. So a region whose end waited ``cc.LATE_US`` for
a late thread, in a process that spends most of its time in regions (``cc.INSIDE_MIN``:
hologram's programs, not PyTorch's eager ops, whose spinning OpenMP threads would
compete with the team's), sends the process's loops to this team for ``cc.BUSY_US``
(``WHEN_BUSY``; the record is ``hg_load``). Measured (docs/perf.md, session 26): with
one of two cores busy, softmax 4096 x 1024 1.9-2.1x -> 1.4-1.7x its quiet time, a
2-layer BERT 1.8x -> 1.4-1.5x; quiet, where a stray late region opens a window now and
then, the models within 1-2%. Workers keep spinning in a window: without it
MobileNetV3-small at batch 8 paid a wake-up per kernel in the windows a quiet machine
opens (4% slower, against 1%).

Beside PyTorch: a training loop whose optimizer or metrics run as eager PyTorch ops
keeps PyTorch's OpenMP threads spinning beside the team's workers, and the two pools
take turns on the cores (an MLP step with its Adam eager: 1.4-1.5x slower quiet on the
team than on OpenMP, 2.5-10x busy; docs/perf.md, session 27). A loop that is all
compiled has no such threads, and there the team holds up under load where OpenMP
cannot (the same step with Adam compiled: 1.28x its quiet time with a core taken,
OpenMP 1.76-2.08x). So in a process that has imported PyTorch the team measures,
every ``PROBE_US``, the CPU time the process's other threads used (the process's
clock less the caller's and the workers' own) and, while that is more than
``OTHERS_MAX`` of a CPU, declines its jobs (``hg_team_run`` returns 0) for ``ASIDE_US``:
the kernels then run their loops on OpenMP's threads, PyTorch's own. Nothing is
measured while the team stands aside (OpenMP's threads are then hologram's too): the
next probe after ``ASIDE_US`` starts afresh.

Each kernel library carries a pointer ``hg_team`` (``cc.THREADS_C``) that
``hologram.threads`` sets when it loads the library, and calls
``hg_team(fn, ctx, n, chunk, threads)`` (1: ran; 0: declined, the caller opens an
OpenMP region) with ``fn(ctx, lo, hi, tid)`` running the
iterations ``lo..hi`` on thread ``tid`` (0: the caller; below ``threads``).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import threading
from collections.abc import Iterator
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
#: Whether OpenMP's loops move to the team for a while once a region waited for a late
#: thread (``cc.LATE_US``, ``cc.BUSY_US``, ``cc.INSIDE_MIN``; "Under load" above).
WHEN_BUSY = True
#: Whether the caller takes a worker that holds a chunk too long onto its own CPU.
RESCUE = True
#: Beside PyTorch (``hologram.threads``), the team steps aside for PyTorch's eager ops:
#: every ``PROBE_US`` (microseconds) a job's caller compares the process's CPU time
#: with its own and its workers'; where the process's other threads (PyTorch's OpenMP
#: pool, which spins about 8 ms after each eager op) used more than ``OTHERS_MAX`` of a
#: CPU, the team declines its jobs for ``ASIDE_US`` and the kernels open OpenMP
#: regions on that same pool instead ("Beside PyTorch" above). The process's clock
#: counts a thread running on another CPU only up to its last scheduler tick (4 ms at
#: HZ=250) while the threads' own clocks are exact, so a probe spans many ticks: over
#: 20 ms a team of two read 0.2 of a CPU "elsewhere" with nothing else running.
PROBE_US = 100_000
#: A gap longer than this (microseconds) between two of the team's jobs starts the
#: probe afresh: that stretch was not spent between hologram's programs (another
#: library's loop timed in turn, a pause).
GAP_US = 20_000
OTHERS_MAX = 0.15
ASIDE_US = 30_000_000

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
#include <linux/futex.h>
/* hg:spread (cc.SPREAD_C: hg_omp_spread; cc.CLOCK_C: hg_clock_us, hg_now_us) */

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
static _Atomic int32_t hg_done;         /* chunks of the open job that finished (a futex word) */
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
int hg_rescue = HG_RESCUE;                     /* the caller takes a stuck holder onto its CPU */
static _Atomic long hg_wtid[HG_TEAM_MAX];          /* workers' thread ids */
static _Atomic double hg_since[HG_TEAM_MAX];       /* when a thread claimed its chunk; 0: none */
static _Atomic int hg_moved[HG_TEAM_MAX];          /* the caller moved this worker */
static unsigned long hg_saved[HG_TEAM_MAX][HG_MASK_WORDS];  /* its affinity before */
static _Atomic int hg_waiting;          /* the caller sleeps on hg_done */
long hg_rescues;                        /* statistics: holders moved */
long hg_jobs;                           /* statistics: jobs published to the workers */
double hg_load[6];                      /* OpenMP's loops under load (cc.THREADS_C's hg_load) */
int hg_aside_on;                        /* hologram.threads: step aside for eager PyTorch */
double hg_aside_until;                  /* jobs are declined until then (hg_now_us) */
long hg_asides;                         /* statistics: times the team stepped aside */
static clockid_t hg_wclock[HG_TEAM_MAX];            /* workers' CPU clocks */
static _Atomic int hg_wclock_ok[HG_TEAM_MAX];
double hg_probe_at;                     /* the last probe (0: none; compiling() clears it) */
static double hg_probe_proc, hg_probe_ours;  /* its clocks (under hg_run_mu) */
static long hg_probe_tid;

static double hg_last_job;              /* when the last job asked (under hg_run_mu) */

/* Under hg_run_mu: 1 while the team stands aside for the process's other threads
   (compiler/team.py, "Beside PyTorch"). Probes every HG_PROBE_US: the CPU time the
   process used beyond the caller's and the workers' since the last probe. */
static int hg_step_aside(void) {
  const double now = hg_now_us();
  if (now < hg_aside_until) return 1;
  if (now - hg_last_job > HG_GAP_US) hg_probe_at = 0.0;
  hg_last_job = now;
  if (hg_probe_at > 0.0 && now - hg_probe_at < HG_PROBE_US) return 0;
  const double proc = hg_clock_us(CLOCK_PROCESS_CPUTIME_ID);
  double ours = hg_clock_us(CLOCK_THREAD_CPUTIME_ID);
  for (int t = 1; t <= hg_workers && t < HG_TEAM_MAX; t++)
    if (atomic_load(&hg_wclock_ok[t])) ours += hg_clock_us(hg_wclock[t]);
  /* the same caller since the last probe, and no compile of hologram's own running */
  const double others = (proc - hg_probe_proc) - (ours - hg_probe_ours), span = now - hg_probe_at;
  const int valid = hg_probe_at > 0.0 && hg_probe_tid == hg_tid && hg_load[5] == 0.0;
  hg_probe_at = now; hg_probe_proc = proc; hg_probe_ours = ours; hg_probe_tid = hg_tid;
  if (valid && others > HG_OTHERS_MAX * span) {
    hg_aside_until = now + HG_ASIDE_US;
    hg_asides++;
    hg_probe_at = 0.0;  /* OpenMP's threads will be hologram's too: start afresh after */
    return 1;
  }
  return 0;
}

/* A worker the caller moved onto its CPU (hg_take_holders) goes back where it was. */
static void hg_go_back(int tid) {
  if (tid > 0 && atomic_load(&hg_moved[tid])) {
    atomic_store(&hg_moved[tid], 0);
    syscall(SYS_sched_setaffinity, 0, sizeof hg_saved[tid], hg_saved[tid]);
  }
}

/* Claim and run chunks of the job the word holds while it is generation `gen`;
   returns how many this thread ran. */
static int64_t hg_claim(uint64_t gen, int tid) {
  int64_t ran = 0;
  for (;;) {
    uint64_t w = atomic_load(&hg_word);
    if ((w >> HG_GEN_SHIFT) != gen) break;
    uint64_t n = (w >> HG_N_SHIFT) & HG_FIELD, i = w & HG_FIELD;
    if (i >= n) break;
    if (!atomic_compare_exchange_weak(&hg_word, &w, w + 1)) continue;
    /* chunk i is ours: the job cannot close before we report it, so its fields hold */
    if (tid > 0) atomic_store_explicit(&hg_since[tid], hg_now_us(), memory_order_relaxed);
    const int64_t chunk = atomic_load_explicit(&hg_chunk, memory_order_relaxed);
    const int64_t total = atomic_load_explicit(&hg_n, memory_order_relaxed);
    const int64_t lo = (int64_t)i * chunk, hi = lo + chunk < total ? lo + chunk : total;
    atomic_load_explicit(&hg_fn, memory_order_relaxed)(
        atomic_load_explicit(&hg_ctx, memory_order_relaxed), lo, hi, tid);
    ran++;
    if (tid > 0) atomic_store_explicit(&hg_since[tid], 0.0, memory_order_relaxed);
    atomic_fetch_add(&hg_done, 1);
    if (tid > 0 && atomic_load(&hg_waiting))
      syscall(SYS_futex, &hg_done, FUTEX_WAKE_PRIVATE, 1, 0, 0, 0);
    hg_go_back(tid);
  }
  hg_go_back(tid);
  return ran;
}

/* The caller has run every chunk it could and waits for chunks workers hold. A holder
   that has had its chunk much longer than the caller took for one is, on a busy
   machine, almost always waiting in another CPU's run queue (issue 21: one whole 4 ms
   tick behind another process). Move it onto the caller's CPU, which the caller then
   leaves by sleeping until the chunk is done. */
static void hg_take_holders(int nt, double now, double patience) {
  const int cpu = sched_getcpu();
  if (cpu < 0 || cpu >= HG_MASK_WORDS * HG_WORD_BITS) return;
  for (int t = 1; t < nt; t++) {
    const double since = atomic_load_explicit(&hg_since[t], memory_order_relaxed);
    const long tid = atomic_load_explicit(&hg_wtid[t], memory_order_relaxed);
    if (since <= 0.0 || now - since < patience || !tid || atomic_load(&hg_moved[t])) continue;
    if (syscall(SYS_sched_getaffinity, tid, sizeof hg_saved[t], hg_saved[t]) <= 0) continue;
    unsigned long m[HG_MASK_WORDS] = {0};
    m[cpu / HG_WORD_BITS] = 1UL << (cpu % HG_WORD_BITS);
    atomic_store(&hg_moved[t], 1);
    if (syscall(SYS_sched_setaffinity, tid, sizeof m, m) != 0) {
      atomic_store(&hg_moved[t], 0);
      continue;
    }
    hg_rescues++;
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
  atomic_store(&hg_wtid[tid], (long)syscall(SYS_gettid));
  if (pthread_getcpuclockid(pthread_self(), &hg_wclock[tid]) == 0)
    atomic_store(&hg_wclock_ok[tid], 1);
  uint64_t seen = atomic_load(&hg_word) >> HG_GEN_SHIFT;
  for (;;) {
    uint64_t gen = atomic_load(&hg_word) >> HG_GEN_SHIFT;
    if (gen == seen) {
      const double until = hg_now_us() + HG_SPIN_US;
      for (int polls = 1; gen == seen; polls++) {
        HG_RELAX();
        gen = atomic_load(&hg_word) >> HG_GEN_SHIFT;
        if ((polls & 63) == 0) hg_go_back(tid);  /* moved just after its last chunk */
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

int hg_team_run(hg_chunk_fn fn, void *ctx, int64_t n, int64_t chunk, int threads) {
  if (n <= 0) return 1;
  if (chunk < 1) chunk = 1;
  const int64_t most = (int64_t)HG_FIELD;  /* chunks a job word can count */
  if ((n + chunk - 1) / chunk > most) chunk = (n + most - 1) / most;
  const int64_t chunks = (n + chunk - 1) / chunk;
  if (threads <= 1 || chunks <= 1 || hg_inside || pthread_mutex_trylock(&hg_run_mu) != 0) {
    for (int64_t lo = 0; lo < n; lo += chunk)  /* chunk by chunk, as the team would */
      fn(ctx, lo, lo + chunk < n ? lo + chunk : n, 0);
    return 1;
  }
  if (!hg_tid) hg_tid = (long)syscall(SYS_gettid);
  if (hg_aside_on && hg_step_aside()) {
    pthread_mutex_unlock(&hg_run_mu);
    return 0;
  }
  const int have = hg_grow(threads);
  if (have < threads) threads = have;
  hg_jobs++;
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
  const double start = hg_now_us();
  const int64_t ran = hg_claim(hg_gen, 0);
  hg_inside = 0;
  /* every chunk is claimed: wait for the ones other threads are still running */
  if (atomic_load(&hg_done) < chunks) {
    const double mine = hg_now_us();
    /* patience: twice the caller's own time per chunk, and 50 us */
    const double patience = 50.0 + 2.0 * (ran > 0 ? (mine - start) / (double)ran : 0.0);
    for (int rounds = 1;; rounds++) {
      int32_t d = atomic_load(&hg_done);
      if (d >= chunks) break;
      const double now = hg_now_us();
      if (hg_rescue && now - mine > 50.0) {
        hg_take_holders(threads, now, patience);
        int away = 0;
        for (int t = 1; t < threads; t++) away |= atomic_load(&hg_moved[t]);
        if (away) {  /* a holder is on this CPU: leave it the CPU until a chunk is done */
          atomic_store(&hg_waiting, 1);
          if (atomic_load(&hg_done) == d) {
            struct timespec ts = {0, 200000};  /* and look again every 0.2 ms */
            syscall(SYS_futex, &hg_done, FUTEX_WAIT_PRIVATE, d, &ts, 0, 0);
          }
          continue;
        }
      }
      for (int k = 0; k < 256 && atomic_load(&hg_done) < chunks; k++) HG_RELAX();
      if (rounds > 256) sched_yield();  /* their thread may be waiting for this very core */
    }
    atomic_store(&hg_waiting, 0);
  }
  pthread_mutex_unlock(&hg_run_mu);
  return 1;
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
    from .cc import CLOCK_C, SPREAD_C

    mark = "/* hg:spread (cc.SPREAD_C: hg_omp_spread; cc.CLOCK_C: hg_clock_us, hg_now_us) */"
    return (f"#define HG_SPIN_US {SPIN_US}.0\n#define HG_SPREAD {int(SPREAD)}\n"
            f"#define HG_RESCUE {int(RESCUE)}\n#define HG_PROBE_US {float(PROBE_US)!r}\n"
            f"#define HG_OTHERS_MAX {float(OTHERS_MAX)!r}\n"
            f"#define HG_ASIDE_US {float(ASIDE_US)!r}\n#define HG_GAP_US {float(GAP_US)!r}\n"
            + SOURCE.replace(mark, f"{mark}\n{SPREAD_C}\n{CLOCK_C}"))


def runtime(cc: Any) -> int:
    """The address of ``hg_team_run``, which kernel libraries' ``hg_team`` point at."""
    global _LIB
    lib = library(cc)
    if lib is not _LIB:
        _LIB = lib
        ctypes.c_int.in_dll(_LIB, "hg_aside_on").value = int(_ASIDE)
        with _COMPILING_LOCK:
            _publish_compiling()
    return ctypes.cast(_LIB.hg_team_run, ctypes.c_void_p).value or 0


_LIB: Any = None  # the team's library, once runtime() built it
_ASIDE = False  # set_aside()
_COMPILING = 0  # hologram's compiles in flight (compiling())
_COMPILING_LOCK = threading.Lock()


def _publish_compiling() -> None:
    if _LIB is not None:  # hg_load[5]: what cc.THREADS_C's regions read
        (ctypes.c_double * 6).in_dll(_LIB, "hg_load")[5] = float(_COMPILING)
        # a compile's threads are not PyTorch's: no probe spans one (hg_step_aside)
        ctypes.c_double.in_dll(_LIB, "hg_probe_at").value = 0.0


@contextlib.contextmanager
def compiling() -> Iterator[None]:
    """While hologram's own compiler runs (``cc.CCompiler``, and the executor's
    background builds around it), a late OpenMP region opens no busy window: the
    compiler's processes are what took the cores (a cold README demo opened one, and
    the team then ran its whole timed training, 1.04-1.29x eager's step time against
    1.07-1.11x faster without; docs/perf.md, session 26). Nor does the team step aside
    for the planning threads' CPU time (no probe spans a compile)."""
    global _COMPILING
    with _COMPILING_LOCK:
        _COMPILING += 1
        _publish_compiling()
    try:
        yield
    finally:
        with _COMPILING_LOCK:
            _COMPILING -= 1
            _publish_compiling()


def set_aside(on: bool) -> None:
    """Whether the team steps aside for the process's other busy threads ("Beside
    PyTorch" above); ``hologram.threads`` turns it on in a process that has imported
    PyTorch and left the threading to hologram."""
    global _ASIDE
    _ASIDE = bool(on)
    if _LIB is not None:
        ctypes.c_int.in_dll(_LIB, "hg_aside_on").value = int(_ASIDE)


def asides() -> int:
    """How many times the team has stepped aside in this process (0 before it is built)."""
    return 0 if _LIB is None else ctypes.c_long.in_dll(_LIB, "hg_asides").value


def load_address() -> int | None:
    """The address of the team's ``hg_load`` (after :func:`runtime`): the process's
    record of OpenMP's loops under load (``cc.THREADS_C``)."""
    return None if _LIB is None else ctypes.addressof(ctypes.c_double.in_dll(_LIB, "hg_load"))
