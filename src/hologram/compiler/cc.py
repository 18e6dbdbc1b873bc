"""The system C compiler driver of the CPU backend.

Rendered C kernels are compiled by whatever C compiler the machine has
(``$CC``, then ``cc``, ``gcc``, ``clang``), cached on disk by
:mod:`hologram.cache`, and loaded in-process with :mod:`ctypes`.

Flags, and why (measured with gcc 12.2 / glibc 2.36 on a 2-core AMD EPYC with
AVX-512; see the report in the module's tests and DESIGN.md "Backends"):

- ``-O3 -march=native -fPIC -shared -std=gnu11 -fopenmp``: vectorise for the
  host CPU (the CPU features are part of the cache key), OpenMP threads and
  ``#pragma omp simd`` lanes.
- ``-fno-math-errno -fno-trapping-math``: the two parts of -ffast-math that
  let GCC vectorise libm calls and ``sqrtf`` (``vsqrtps``) without changing any
  result. Everything else in -ffast-math is left off on purpose: no
  ``-ffinite-math-only`` (NaN/inf must propagate as in NumPy), no
  ``-fno-signed-zeros`` (-0.0 stays -0.0), no ``-freciprocal-math`` (``x/y``
  stays a correctly rounded ``vdivps``).
- No ``-fassociative-math``: it is not needed. Sum/max reductions are rendered
  as ``#pragma omp simd reduction(+:acc)``, and OpenMP's reduction clause
  already licenses reordering *that* accumulator, so GCC emits ``vaddps`` on
  zmm registers; every other expression keeps its written evaluation order.
- ``-ffp-contract=off``: ``a*b+c`` rounds twice, exactly like the NumPy
  reference (the explicit FMA op still calls ``fmaf``); the cost on GELU is
  within noise because the loop is bound by memory and libmvec.
- libmvec: ``-DHG_LIBMVEC=1 ... -lmvec -lm``. glibc's ``<math.h>`` declares
  the SIMD variants of expf, tanhf, ... only under ``__FAST_MATH__``, so
  :data:`C_PRELUDE` declares them itself with
  ``__attribute__((__simd__("notinbranch")))``; GCC then calls ``_ZGV*``
  vector functions (AVX-512: ``_ZGVeN16v_tanhf``). libmvec is accurate to
  4 ulp and handles NaN, +-inf and -0.0 like scalar libm. Plus
  ``-fno-builtin-{sin,cos,sinf,cosf}``: otherwise GCC merges ``sin(x)`` and
  ``cos(x)`` of one argument into a scalar ``sincos`` call that blocks
  vectorisation of the whole loop.
- float32 ``exp`` (and ``sigmoid``) do not call libmvec: the renderer emits
  hologram's own inline ``hg_expf`` (:mod:`hologram.compiler.c_math`, part of
  :data:`C_PRELUDE`), as accurate and without libmvec's scalar path for results
  that are zero or subnormal.
- ``-Wl,-z,defs``: an unresolved symbol fails at link time with a readable
  log instead of at ``dlopen``.

The flags are chosen by a probe, fastest first (a compiler without libmvec or
OpenMP still gets a working, slower set), and the probe kernel itself goes
through the disk cache, so after the first run finding a compiler costs a
``--version`` call and a cache hit.

Threads: OpenMP's fork/join costs about 1-2 us on this box, so the renderer
makes a kernel's loop parallel only above a size (``render_c.PARALLEL_MIN_WORK``
and ``PARALLEL_MIN_WORK_MATH``; see their comments).

Fork: GNU OpenMP (libgomp) is not fork-safe. A child created with ``fork``
after the parent ran a parallel kernel hangs forever in its first parallel
region (reproduced here with multiprocessing's "fork" context). Once an OpenMP
kernel is loaded we therefore register an at-fork hook that sets the child's
OpenMP thread count to 1: forked children (DataLoader workers, pools) run
kernels single-threaded instead of deadlocking. ``spawn``/``forkserver``
children are unaffected and get all threads.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import os
import platform
import shlex
import shutil
import subprocess
import threading
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

from .. import __version__, threads
from ..cache import KernelCache
from ..errors import HologramError
from .c_math import C_MATH

# libmvec functions by the glibc release that first shipped them for x86-64.
_MVEC_2_22 = ("exp", "log", "sin", "cos", "pow")
_MVEC_2_35 = ("tanh", "erf", "expm1", "log1p", "tan", "asin", "acos", "atan", "sinh", "cosh",
              "asinh", "acosh", "atanh", "log2", "log10", "exp2", "erfc", "atan2", "hypot")
_MVEC_BINARY = frozenset({"pow", "atan2", "hypot"})  # the functions of two operands


def _simd_decls(names: Sequence[str]) -> list[str]:
    out = []
    for n in names:
        if n in _MVEC_BINARY:
            out += [f"HG_SIMD float {n}f(float, float);", f"HG_SIMD double {n}(double, double);"]
        else:
            out += [f"HG_SIMD float {n}f(float);", f"HG_SIMD double {n}(double);"]
    return out


#: C text the renderer puts at the top of every CPU kernel: the headers kernels use,
#: and (when the compiler links libmvec, signalled by -DHG_LIBMVEC) SIMD declarations
#: of the libm functions glibc's libmvec vectorises. ``sqrtf``/``sqrt`` are not in
#: the list on purpose: libmvec has no variant, and with -fno-math-errno GCC inlines
#: the ``vsqrtps``/``vsqrtpd`` instruction instead. Each declaration is guarded by
#: the glibc version that ships it, so an older glibc never gets an undefined
#: ``_ZGV`` symbol.
#: Every library with parallel loops carries its own thread count, which
#: ``hologram.threads`` writes after loading it, and every parallel region asks for
#: ``HG_NT`` threads. A ``num_threads`` clause and not ``omp_set_num_threads``: the
#: process's OpenMP runtime may be the one PyTorch loaded (one ``libgomp.so.1`` per
#: process), and setting its default would change PyTorch's thread count under it.
#: ``hg_omp_spread(caller, caller_tid)``: the calling thread, when it runs on CPU
#: ``caller``, takes thread ``caller_tid``'s allowed CPUs less that one (none left: it
#: stays). Linux only; one syscall to read the CPU, two more only on a collision. Used
#: by OpenMP's workers (``THREADS_C``) and by the team's (``team.py``'s ``hg_spread``).
SPREAD_C = "\n".join([
    "#include <sys/syscall.h>",
    "#include <unistd.h>",
    "extern int sched_getcpu(void);",
    "#define HG_MASK_WORDS 16",
    "#define HG_WORD_BITS (8 * (int)sizeof(unsigned long))",
    "static inline void hg_omp_spread(int caller, long caller_tid) {",
    "  if (caller < 0 || caller >= HG_MASK_WORDS * HG_WORD_BITS || sched_getcpu() != caller)",
    "    return;",
    "  unsigned long m[HG_MASK_WORDS] = {0};",
    "  if (syscall(SYS_sched_getaffinity, caller_tid, sizeof m, m) <= 0) return;",
    "  m[caller / HG_WORD_BITS] &= ~(1UL << (caller % HG_WORD_BITS));",
    "  unsigned long any = 0;",
    "  for (int i = 0; i < HG_MASK_WORDS; i++) any |= m[i];",
    "  if (any) syscall(SYS_sched_setaffinity, 0, sizeof m, m);",
    "}",
])

#: ``hg_clock_us(clock)``: a clock in microseconds (0 where it cannot be read), and
#: ``hg_now_us()``: CLOCK_MONOTONIC's, for the team's patience, spin and CPU-time probes
#: (``team.py``) and OpenMP regions' timing under load (``THREADS_C``).
CLOCK_C = "\n".join([
    "#include <time.h>",
    "static inline double hg_clock_us(clockid_t clock) {",
    "  struct timespec ts;",
    "  if (clock_gettime(clock, &ts) != 0) return 0.0;",
    "  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;",
    "}",
    "static inline double hg_now_us(void) { return hg_clock_us(CLOCK_MONOTONIC); }",
])

#: OpenMP's loops under load: a parallel region whose end waited longer than this
#: (microseconds) for a late thread ...
LATE_US = 1000
#: ... sends the process's parallel loops to hologram's team for this long ...
BUSY_US = 1_000_000
#: ... where the callers' work inside parallel regions was at least this share of the
#: last ``SHARE_US`` (hologram's programs rather than PyTorch's eager ops, whose OpenMP
#: threads would then compete with the team's).
INSIDE_MIN = 0.6
#: The stretch of time over which that share is taken, in microseconds.
SHARE_US = 10_000

THREADS_C = "\n".join([
    "/* A library built in parts (cc.py's split build) defines its globals in the first",
    "   part only; the others (-DHG_PART) declare them. */",
    "#ifdef HG_PART",
    "#define HG_GLOBAL(decl, init) extern decl",
    "#else",
    "#define HG_GLOBAL(decl, init) decl = init",
    "#endif",
    "HG_GLOBAL(int hg_num_threads, 0); /* 0: OpenMP's default */",
    "#ifdef _OPENMP",
    "#include <omp.h>",
    "#define HG_NT (hg_num_threads > 0 ? hg_num_threads : omp_get_max_threads())",
    "#else",
    "#define HG_NT 1",
    "#endif",
    "#if defined(_OPENMP) && defined(__linux__)",
    "/* OpenMP's workers move off their caller's CPU as the team's do (team.py's",
    "   hg_spread, which says why); hologram.threads clears hg_omp_spreads to turn it off. */",
    SPREAD_C,
    "HG_GLOBAL(int hg_omp_spreads, 1);",
    "static _Thread_local long hg_self_tid;",
    "#endif",
    "typedef void (*hg_chunk_fn)(void *, int64_t, int64_t, int);",
    "typedef int (*hg_team_fn)(hg_chunk_fn, void *, int64_t, int64_t, int);",
    "/* compiler/team.py's hg_team_run, or NULL for OpenMP (hologram.threads decides); it",
    "   returns 0 when it declines the job (standing aside for PyTorch's threads) */",
    "HG_GLOBAL(hg_team_fn hg_team, 0);",
    "#if defined(_OPENMP) && defined(__linux__)",
    "/* OpenMP's loops under load (team.py's \"Under load\" says why). hg_load points at",
    "   the team's process-wide record: [0] until when (CLOCK_MONOTONIC microseconds)",
    "   loops run on the team (hg_team_busy), [1] how many such windows opened, [2] the",
    "   share of the time spent in regions' work over the last HG_SHARE_US or more, [3]",
    "   that time so far in the current stretch, [4] when that stretch began, [5] how",
    "   many of hologram's own compiles run. A region whose end waited HG_LATE_US for a",
    "   late thread, in a process that spends most of its time in regions' work and",
    "   compiles nothing, opens such a window. */",
    CLOCK_C,
    "#define HG_LATE_US " + repr(float(LATE_US)),
    "#define HG_BUSY_US " + repr(float(BUSY_US)),
    "#define HG_INSIDE_MIN " + repr(INSIDE_MIN),
    "#define HG_SHARE_US " + repr(float(SHARE_US)),
    "HG_GLOBAL(hg_team_fn hg_team_busy, 0);",
    "HG_GLOBAL(double *hg_load, 0);",
    "#endif",
    "/* fn(ctx, lo, hi, tid) over 0..n, one call per whole chunk of `chunk` iterations",
    "   (a chunk function may store a partial per chunk), on up to nt threads */",
    "static inline void hg_par_nt(hg_chunk_fn fn, void *ctx, int64_t n, int64_t chunk,",
    "                             int64_t nt) {",
    "  if (n <= 0) return;",
    "  if (chunk < 1) chunk = 1;",
    "  if (nt > 1 && n > chunk) {",
    "    if (hg_team && hg_team(fn, ctx, n, chunk, (int)nt)) return;",
    "#ifdef _OPENMP",
    "    const int64_t chunks = (n + chunk - 1) / chunk;",
    "#ifdef __linux__",
    "    int caller = -1;",
    "    if (hg_omp_spreads) {",
    "      caller = sched_getcpu();",
    "      if (!hg_self_tid) hg_self_tid = syscall(SYS_gettid);",
    "    }",
    "    const long caller_tid = hg_self_tid;",
    "    double *const load = hg_team_busy ? hg_load : 0;",
    "    double start = 0.0, mine = 0.0;  /* opened; the caller found no chunk left */",
    "    if (load) {",
    "      start = hg_now_us();",
    "      if (start < load[0] && hg_team_busy(fn, ctx, n, chunk, (int)nt)) return;",
    "    }",
    "#endif",
    "#pragma omp parallel num_threads(nt)",
    "    {",
    "#ifdef __linux__",
    "      if (caller >= 0 && omp_get_thread_num() > 0) hg_omp_spread(caller, caller_tid);",
    "#endif",
    "#pragma omp for schedule(dynamic, 1) nowait",
    "      for (int64_t c = 0; c < chunks; c++) {",
    "        const int64_t lo = c * chunk, hi = lo + chunk < n ? lo + chunk : n;",
    "        fn(ctx, lo, hi, omp_get_thread_num());",
    "      }",
    "#ifdef __linux__",
    "      if (load && omp_get_thread_num() == 0) mine = hg_now_us();",
    "#endif",
    "    }",
    "#ifdef __linux__",
    "    if (load) {",
    "      const double now = hg_now_us();",
    "      load[3] += mine - start;  /* (not the wait: a late thread's stall is not work) */",
    "      if (now - load[4] > HG_SHARE_US) {  /* a new share every HG_SHARE_US */",
    "        load[2] = load[3] / (now - load[4]);",
    "        load[3] = 0.0;",
    "        load[4] = now;",
    "      }",
    "      if (now - mine > HG_LATE_US && load[2] > HG_INSIDE_MIN && load[5] == 0.0) {",
    "        load[0] = now + HG_BUSY_US;",
    "        load[1] += 1.0;",
    "      }",
    "    }",
    "#endif",
    "    return;",
    "#endif",
    "  }",
    "  for (int64_t lo = 0; lo < n; lo += chunk) fn(ctx, lo, lo + chunk < n ? lo + chunk : n, 0);",
    "}",
    "static inline void hg_par(hg_chunk_fn fn, void *ctx, int64_t n, int64_t chunk) {",
    "  hg_par_nt(fn, ctx, n, chunk, HG_NT);",
    "}",
    "",
])

C_PRELUDE = "\n".join([
    "/* hologram CPU kernel prelude */",
    "#include <math.h>",
    "#include <stdint.h>",
    "#include <stddef.h>",
    "#if defined(HG_LIBMVEC) && defined(__x86_64__) && defined(__GLIBC__) \\",
    "    && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 6",
    "/* glibc declares these only under __FAST_MATH__; we want the vector calls",
    "   without fast-math's changes to NaN, inf and signed zeros. */",
    '#define HG_SIMD __attribute__((__simd__("notinbranch")))',
    *_simd_decls(_MVEC_2_22),
    "#if __GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35)",
    *_simd_decls(_MVEC_2_35),
    "#endif",
    "#endif",
    C_MATH,
    THREADS_C,
])

#: Marks the start of one launch step's C in a kernel library (``render_c``): the text
#: before the first mark is the header every part of a split build repeats.
PART_MARK = "/* hg:part */"
#: A library's units are grouped into parts of about this many characters (gcc at -O3
#: takes ~1 s per 100K here), at most MAX_PARTS. The split depends on the source
#: alone, so a key's artifact is the same whatever the core count.
PART_CHARS = 16_000
MAX_PARTS = 8


def split_parts(source: str) -> list[str] | None:
    """The translation units a split build compiles (the first defines the library's
    globals, the others see them with ``-DHG_PART``: ``THREADS_C``), or None to build
    ``source`` whole: a small library, or a source without ``PART_MARK`` units."""
    header, *units = source.split(PART_MARK + "\n")
    body = sum(map(len, units))
    n = min(MAX_PARTS, len(units), -(-body // PART_CHARS))
    if n < 2:
        return None
    groups: list[list[str]] = [[]]
    done = 0
    for u in units:  # contiguous runs of about body / n characters each
        if groups[-1] and done >= body * len(groups) / n:
            groups.append([])
        groups[-1].append(u)
        done += len(u)
    return [("#define HG_PART 1\n" if i else "") + header
            + "".join(f"{PART_MARK}\n{u}" for u in g) for i, g in enumerate(groups)]


_BASE = ["-O3", "-march=native", "-fPIC", "-shared", "-std=gnu11",
         "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off"]
_OPENMP = ["-fopenmp"]
_GCC_MVEC = ["-DHG_LIBMVEC=1", "-fno-builtin-sin", "-fno-builtin-cos",
             "-fno-builtin-sinf", "-fno-builtin-cosf"]
_CLANG_MVEC = ["-fveclib=libmvec"]  # clang >= 16 maps libm calls to libmvec itself
_PORTABLE = ["-O2", "-fPIC", "-shared"]

# x86-64 (and the aarch64 counterparts) CPU flags that change the code -march=native
# emits; the others (e.g. 'hypervisor') would only split the cache for nothing.
_RELEVANT_CPU_FLAGS = (
    "sse2", "ssse3", "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "bmi1", "bmi2",
    "avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl", "avx512ifma", "avx512vbmi",
    "avx512_vbmi2", "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile",
    "asimd", "asimdhp", "asimddp", "fphp", "sve", "sve2", "bf16", "i8mm",
)


class CompileError(HologramError, RuntimeError):
    """The C compiler rejected a kernel (or it could not be loaded).

    The message carries the compiler command, its full log and the source with
    line numbers, because the log's ``kernel.c:12:5`` positions are useless
    without the generated source next to them.
    """

    def __init__(self, message: str, *, command: Sequence[str] = (), log: str = "",
                 source: str = "", returncode: int | None = None) -> None:
        super().__init__(message)
        self.command = list(command)
        self.log = log
        self.source = source
        self.returncode = returncode


def numbered(source: str) -> str:
    """``source`` with right-aligned line numbers (``   1 | ...``), as compiler logs cite."""
    lines = source.splitlines()
    width = max(4, len(str(len(lines))))
    return "\n".join(f"{i:{width}d} | {line}" for i, line in enumerate(lines, 1))


@lru_cache(maxsize=1)
def _cpu_features() -> tuple[str, ...]:
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return ()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            have = set(value.split())
            return tuple(f for f in _RELEVANT_CPU_FLAGS if f in have)
    return ()


def cpu_features() -> list[str]:
    """The SIMD-relevant CPU flags of this machine (from /proc/cpuinfo; [] elsewhere).

    Part of the cache key: a kernel built with -march=native for an AVX-512 host
    must not be loaded from a shared cache on a host without it.
    """
    return list(_cpu_features())


# One disk cache and one table of loaded libraries for the whole process: the same
# kernel compiled by two executors is built once and dlopen'ed once.
KERNEL_CACHE = KernelCache()
_LOADED: dict[str, ctypes.CDLL] = {}
_LOADED_LOCK = threading.Lock()

_FORK_GUARDED = False


def _guard_fork(lib: ctypes.CDLL) -> None:
    """After ``fork``, make the child's OpenMP run one thread (see the module doc).

    ``omp_set_num_threads`` is looked up through the kernel library, so it is the
    OpenMP runtime that library actually linked (libgomp, or clang's libomp).
    """
    global _FORK_GUARDED
    if _FORK_GUARDED or not hasattr(os, "register_at_fork"):
        return
    try:
        set_threads = lib.omp_set_num_threads
    except AttributeError:
        return
    set_threads.argtypes, set_threads.restype = [ctypes.c_int], None
    os.register_at_fork(after_in_child=lambda: set_threads(1))
    _FORK_GUARDED = True


_PROBE_SOURCE = C_PRELUDE + r"""
void hg_probe(void **B, int64_t n) {
  float *x = (float *)B[0], *y = (float *)B[1];
  double *u = (double *)B[2], *v = (double *)B[3];
#pragma omp parallel for simd num_threads(HG_NT) schedule(static) if(n > 4096)
  for (int64_t i = 0; i < n; i++) {
    y[i] = tanhf(x[i]) + expf(x[i]);
    v[i] = exp(u[i]);
  }
}
"""


def _probe_ok(lib: ctypes.CDLL) -> bool:
    """Run the probe kernel and check its numbers (a tier that builds but computes
    nonsense, e.g. a broken vector library, must not be chosen)."""
    import math

    n = 64
    xs = [(i - 32) / 8 for i in range(n)]
    x = (ctypes.c_float * n)(*xs)
    y = (ctypes.c_float * n)()
    u = (ctypes.c_double * n)(*xs)
    v = (ctypes.c_double * n)()
    table = (ctypes.c_void_p * 4)(*(ctypes.addressof(a) for a in (x, y, u, v)))
    fn = lib.hg_probe
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_int64], None
    fn(table, n)
    for xi, yi, vi in zip(xs, y, v, strict=True):
        want = math.tanh(xi) + math.exp(xi)
        if not (abs(yi - want) <= 1e-5 * max(1.0, abs(want))
                and abs(vi - math.exp(xi)) <= 1e-12 * math.exp(xi)):
            return False
    return True


class CCompiler:
    """One C compiler and the flags hologram builds CPU kernels with.

    ``command`` is the executable (plus any arguments ``$CC`` carried); ``version``
    is its ``--version`` output (run when None). ``flags``/``libs`` are chosen
    lazily by probing unless given: the first of :meth:`tiers` whose probe kernel
    compiles, links, loads and computes correctly here.
    """

    def __init__(self, command: str | Sequence[str], version: str | None = None, *,
                 flags: Sequence[str] | None = None, libs: Sequence[str] | None = None) -> None:
        self.command = [command] if isinstance(command, str) else list(command)
        self.path = self.command[0]
        text = version if version is not None else _version_text(self.command)
        self.version = text.splitlines()[0].strip()
        self.id = f"{' '.join(self.command)} ({self.version})"
        low = text.lower()  # `cc --version` names gcc only in its copyright line
        self.family = "clang" if "clang" in low else "gcc" if (
            "gcc" in low or "free software foundation" in low) else "unknown"
        self._version_text = text
        self._flags = list(flags) if flags is not None else None
        self._libs = list(libs) if libs is not None else (["-lm"] if flags is not None else None)
        self._probe_lock = threading.Lock()
        self._probe_error: str | None = None

    def __repr__(self) -> str:
        return f"CCompiler({self.id!r})"

    # --- flags -------------------------------------------------------------------------
    def tiers(self) -> list[tuple[list[str], list[str]]]:
        """(flags, libs) candidates, fastest first."""
        linux = platform.system() == "Linux"
        glibc_x86 = (linux and platform.machine().lower() in ("x86_64", "amd64")
                     and platform.libc_ver()[0] == "glibc")
        link = ["-Wl,-z,defs"] if linux else []
        out: list[tuple[list[str], list[str]]] = []
        if glibc_x86 and self.family in ("gcc", "clang"):
            mvec = _GCC_MVEC if self.family == "gcc" else _CLANG_MVEC
            out.append((_BASE + _OPENMP + mvec + link, ["-lmvec", "-lm"]))
        out.append((_BASE + _OPENMP + link, ["-lm"]))
        out.append((_BASE + link, ["-lm"]))
        out.append((list(_PORTABLE), ["-lm"]))
        return out

    def _choose(self) -> None:
        with self._probe_lock:
            if self._flags is not None:
                return
            errors = []
            for flags, libs in self.tiers():
                trial = CCompiler(self.command, self._version_text, flags=flags, libs=libs)
                try:
                    # Not bound to the thread team: the probe opens no parallel region,
                    # and the team's library then builds on a prewarm thread beside AOT
                    # autograd instead of here, before it (0.2 s of a cold first call).
                    lib = trial.compile(_PROBE_SOURCE, {"purpose": "probe"}, team=False)
                    if _probe_ok(lib):
                        self._flags, self._libs = flags, libs
                        return
                    errors.append(f"{' '.join(flags)}: probe computed wrong values")
                except CompileError as e:
                    errors.append(f"{' '.join(flags)}: {e.log.strip()[-400:] or e}")
            self._flags, self._libs = [], []
            self._probe_error = "\n".join(errors)

    @property
    def flags(self) -> list[str]:
        """Compiler flags kernels are built with (probed on first use)."""
        if self._flags is None:
            self._choose()
        return list(self._flags or [])

    @property
    def libs(self) -> list[str]:
        """Libraries kernels are linked with (``-lmvec -lm`` on glibc x86-64)."""
        if self._libs is None:
            self._choose()
        return list(self._libs or [])

    @property
    def available(self) -> bool:
        """Whether this compiler can build, load and run a kernel here."""
        return bool(self.flags)

    @property
    def vector_math(self) -> bool:
        """Whether kernels call glibc's vector math library (libmvec)."""
        return "-lmvec" in self.libs

    # --- discovery ---------------------------------------------------------------------
    @classmethod
    def find(cls, *, refresh: bool = False) -> CCompiler | None:
        """The first working compiler of ``$CC``, cc, gcc, clang; None when there is none.

        "Working" means the probe kernel builds, loads and computes correctly, so the
        CPU backend can fall back to the reference interpreter instead of failing on
        its first kernel. The answer is remembered per ($CC, $PATH).
        """
        memo_key = (os.environ.get("CC"), os.environ.get("PATH"))
        if not refresh and memo_key in _FOUND:
            return _FOUND[memo_key]
        with _FIND_LOCK:  # a second finder (import's prewarm thread) waits, not probes
            if not refresh and memo_key in _FOUND:
                return _FOUND[memo_key]
            found = cls._probe_candidates()
            _FOUND[memo_key] = found
            return found

    @classmethod
    def _probe_candidates(cls) -> CCompiler | None:
        """The first candidate whose probe kernel works (``find`` remembers the answer)."""
        found = None
        seen: set[tuple[str, ...]] = set()
        for cmd in _candidates():
            ident = (os.path.realpath(cmd[0]), *cmd[1:])
            if ident in seen:  # cc -> gcc: one failed probe is enough
                continue
            seen.add(ident)
            try:
                cc = cls(cmd)
            except (OSError, subprocess.SubprocessError, IndexError):
                continue
            if cc.available:
                found = cc
                break
        return found

    # --- building ----------------------------------------------------------------------
    def command_line(self, out_path: Path, src_path: Path) -> list[str]:
        return [*self.command, *self.flags, "-o", str(out_path), str(src_path), *self.libs]

    def _build_counted(self, source: str, out_path: Path, src_path: Path) -> None:
        """:meth:`build`, counted as hologram's own compiling: the compiler's processes
        take the cores meanwhile, and a parallel region they make late is no sign of a
        busy machine (``team.compiling``)."""
        from . import team

        with team.compiling():
            self.build(source, out_path, src_path)

    def build(self, source: str, out_path: Path, src_path: Path) -> None:
        """Write ``source`` to ``src_path`` and compile it into the shared object ``out_path``.

        A large kernel library (one with ``PART_MARK`` units, see :func:`split_parts`)
        is compiled in parts at once, one compiler per part, and linked: a model's
        library is a second or more of one compiler's time, most of a cold first call
        after PyTorch's own tracing. Raises :class:`CompileError` with the command, the
        compiler's full log and the numbered source (of the failing part) when the
        compiler fails or cannot be run.
        """
        src_path = Path(src_path).absolute()
        src_path.write_text(source, encoding="utf-8")
        out = Path(out_path).absolute()
        parts = split_parts(source)
        if parts is None:
            # Run next to the source and name it relatively: the object's symbol table
            # then holds "kernel.c", not a random temp path, so the same input gives the
            # same bytes in every process (concurrent builders of one key agree).
            self._run(self.command_line(out, Path(src_path.name)), src_path.parent, source)
            return
        d = src_path.parent
        for i, text in enumerate(parts):
            (d / f"part{i}.c").write_text(text, encoding="utf-8")
        jobs = [([*self.command, *self.flags, "-c", "-o", f"part{i}.o", f"part{i}.c"], text)
                for i, text in enumerate(parts)]
        workers = max(1, min(len(jobs), threads.affinity()))
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            for f in [pool.submit(self._run, cmd, d, text) for cmd, text in jobs]:
                f.result()
        self._run([*self.command, *self.flags, "-o", str(out),
                   *(f"part{i}.o" for i in range(len(parts))), *self.libs], d, source)

    def _run(self, cmd: list[str], cwd: Path, source: str) -> None:
        """One compiler command; its failure as :class:`CompileError` showing ``source``."""
        env = {**os.environ, "LC_ALL": "C"}  # plain-ASCII diagnostics
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, errors="replace",
                               timeout=600, env=env, cwd=cwd)
        except subprocess.TimeoutExpired as e:
            log = (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) \
                else (e.stderr or "")
            raise self._error(f"C compiler timed out after {e.timeout:.0f} s", cmd, log,
                              source, None) from None
        except OSError as e:
            raise self._error(f"C compiler could not be run ({e})", cmd, "", source,
                              None) from None
        if r.returncode != 0:
            raise self._error(f"C compiler failed with exit status {r.returncode}", cmd,
                              (r.stderr or "") + (r.stdout or ""), source, r.returncode)

    @staticmethod
    def _error(what: str, cmd: list[str], log: str, source: str,
               rc: int | None) -> CompileError:
        shown = " ".join(shlex.quote(c) for c in cmd)
        msg = (f"{what}\ncommand: {shown}\n--- compiler log ---\n{log.rstrip() or '(empty)'}\n"
               f"--- source ---\n{numbered(source)}")
        return CompileError(msg, command=cmd, log=log, source=source, returncode=rc)

    def key_parts(self, key_parts: dict[str, str]) -> dict[str, str]:
        """The caller's key parts plus everything else that decides the binary."""
        return {**key_parts, "kind": "cpu-c", "compiler": self.id,
                "flags": " ".join(self.flags), "libs": " ".join(self.libs),
                "machine": platform.machine(), "cpu": ",".join(cpu_features()),
                "hologram": __version__}

    def compile(self, source: str, key_parts: dict[str, str], *,
                team: bool = True) -> ctypes.CDLL:
        """Compile (or fetch from the caches) ``source`` and load it with ctypes.

        ``key_parts`` identifies the program (e.g. ``{"program": canonical_hash}``);
        the compiler id, flags, CPU features and hologram version are added here.
        Loaded libraries are memoised per process, so a repeat costs one dict lookup
        plus hashing the source. ``team=False``: a newly loaded library's parallel
        loops are not pointed at the thread team (they open OpenMP regions), so the
        team's own library is not built for it.
        """
        if not self.flags:
            raise CompileError(f"{self.id} cannot build kernels here:\n{self._probe_error}",
                               source=source)
        parts = self.key_parts(key_parts)
        key = KERNEL_CACHE.key(parts, source)
        lib = _LOADED.get(key)
        if lib is not None:
            return lib
        path = KERNEL_CACHE.get_or_build(
            parts, source, lambda src, out: self._build_counted(source, out, src))
        with _LOADED_LOCK:
            lib = _LOADED.get(key)
            if lib is None:
                try:
                    lib = ctypes.CDLL(str(path))
                except OSError as e:
                    raise CompileError(f"compiled kernel {path} could not be loaded: {e}",
                                       source=source) from None
                if "-fopenmp" in self.flags:
                    _guard_fork(lib)
                    threads.apply(lib)
                _LOADED[key] = lib
                fresh = True
            else:
                fresh = False
        if fresh and team:  # outside the lock: the team's library is compiled through here
            _bind_team(self, lib)
        return lib


def _bind_team(cc: CCompiler, lib: ctypes.CDLL) -> None:
    """Point a kernel library's ``hg_team`` at the process's one thread team
    (``compiler/team.py``), or leave it to OpenMP (``hologram.threads`` decides which);
    a library without parallel loops has no such pointer."""
    try:
        ctypes.c_void_p.in_dll(lib, "hg_team")
    except ValueError:
        return
    from . import team

    threads.bind_team(lib, lambda: team.runtime(cc))


_FOUND: dict[tuple[str | None, str | None], CCompiler | None] = {}
_FIND_LOCK = threading.Lock()


def _fresh_find_lock() -> None:
    """A forked child gets an unheld lock: the thread probing in the parent (the import's
    prewarm) does not exist in the child, and would never release it."""
    global _FIND_LOCK
    _FIND_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_find_lock)


def _candidates() -> list[list[str]]:
    """Commands to try: ``$CC`` (which may carry arguments, e.g. "ccache gcc"), then
    cc, gcc and clang as found on PATH."""
    out = []
    env = os.environ.get("CC", "").strip()
    names: list[list[str]] = []
    if env:
        try:
            names.append(shlex.split(env))
        except ValueError:
            pass
    names += [["cc"], ["gcc"], ["clang"]]
    for cmd in names:
        if not cmd:
            continue
        path = shutil.which(cmd[0])
        if path:
            out.append([path, *cmd[1:]])
    return out


def _version_text(command: Sequence[str]) -> str:
    """``<cc> --version``: its first line names the compiler and release (for the key),
    the rest tells gcc from clang."""
    r = subprocess.run([*command, "--version"], capture_output=True, text=True,
                       errors="replace", timeout=30, env={**os.environ, "LC_ALL": "C"})
    text = (r.stdout or r.stderr).strip()
    if r.returncode != 0 or not text:
        raise OSError(f"{' '.join(command)} --version failed")
    return text


__all__ = ["C_PRELUDE", "KERNEL_CACHE", "CCompiler", "CompileError", "cpu_features", "numbered"]
