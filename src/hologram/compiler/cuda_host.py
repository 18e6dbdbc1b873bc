"""CUDA C on the host: the prelude and launcher that let g++ compile NVRTC's source.

The emulated CUDA device (``backends/cuda_emulated.py``) compiles the very source
``render_cuda`` hands NVRTC, wrapped between :data:`HOST_PRELUDE` and
:data:`HOST_LAUNCHER`:

* the prelude gives CUDA's names their CPU meaning: ``__global__``/``__device__``
  vanish, ``__shared__`` becomes ``static`` (blocks run one at a time, so a
  function-static array is exactly one block's shared memory), ``threadIdx`` reads
  the running fiber's index, atomics are plain read-modify-writes (fibers switch only
  at barriers, so nothing interleaves inside one), and ``__syncthreads``, warp
  shuffles and votes are *yields* to a scheduler;
* the launcher runs each block's threads as fibers (``ucontext``), one per CUDA
  thread, each on its own stack. A fiber runs until it reaches a barrier, a warp
  operation or its end; when no fiber can run, the scheduler releases a barrier only
  if every thread of the block waits at it (at the same source line), and a warp
  operation only when all 32 lanes (those that exist) reached one. Anything else is
  a barrier some threads never reach: the launch stops with an error naming the line,
  and the backend names the kernel. Because barriers truly hold, a kernel that is
  missing one computes wrong values under some thread order: the launcher runs
  threads (and blocks) forward, in reverse, or shuffled (a fresh permutation each
  round), which the tests vary.

The CUDA source typedefs ``int64_t`` & co. itself (NVRTC has no ``stdint.h``); the
prelude renames those names after including the host headers, so both definitions
live side by side. Every kernel hologram renders takes one parameter, ``HgArgs``
(a table of 64 pointers); the launcher calls kernels with that signature.
"""

from __future__ import annotations

from pathlib import Path

from .cc import CCompiler

#: Threads per block the launcher accepts (CUDA's limit) and bytes of stack per fiber.
MAX_THREADS = 1024
STACK_BYTES = 128 * 1024

HOST_PRELUDE = r"""
/* hologram: CUDA C on the host (emulated device) */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <stdio.h>
#include <ucontext.h>
struct hg_uint3 { unsigned int x, y, z; };
typedef hg_uint3 dim3;
enum { HG_RUN = 0, HG_BAR = 1, HG_WARP = 2, HG_DONE = 3 };
struct HgFiber { ucontext_t ctx; hg_uint3 tid; int state; int line; int linear; };
static HgFiber hg_fib[1024];
static HgFiber *hg_cur;
static ucontext_t hg_main;
static int hg_nthr;
static hg_uint3 hg_block, hg_bdim, hg_gdim;
static unsigned char hg_slot[1024][16], hg_snap[1024][16];
static char hg_err[600];
#define threadIdx (hg_cur->tid)
#define blockIdx hg_block
#define blockDim hg_bdim
#define gridDim hg_gdim
#define warpSize 32
#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __align__(n) __attribute__((aligned(n)))
static void hg_yield(int state, int line) {
  hg_cur->state = state; hg_cur->line = line;
  swapcontext(&hg_cur->ctx, &hg_main);
}
#define __syncthreads() hg_yield(HG_BAR, __LINE__)
#define __syncwarp(...) hg_yield(HG_WARP, __LINE__)
/* A warp operation: publish my value, wait for the warp, read the snapshot. */
template <class T> static T hg_warp_read(T v, int src, int line) {
  const int me = hg_cur->linear;
  memcpy(hg_slot[me], &v, sizeof(T));
  hg_yield(HG_WARP, line);
  src = (me & ~31) | (src & 31);
  if (src >= hg_nthr) src = me;  /* a lane that does not exist: CUDA leaves it undefined */
  T r; memcpy(&r, hg_snap[src], sizeof(T)); return r;
}
#define __shfl_xor_sync(mask, v, o, ...) hg_warp_read((v), (hg_cur->linear & 31) ^ (o), __LINE__)
#define __shfl_sync(mask, v, s, ...) hg_warp_read((v), (s), __LINE__)
#define HG_LANE ((int)(hg_cur->linear & 31))
#define __shfl_down_sync(mask, v, d, ...) hg_warp_read((v), \
    HG_LANE + (int)(d) > 31 ? HG_LANE : HG_LANE + (int)(d), __LINE__)
#define __shfl_up_sync(mask, v, d, ...) hg_warp_read((v), \
    HG_LANE - (int)(d) < 0 ? HG_LANE : HG_LANE - (int)(d), __LINE__)
static unsigned hg_ballot(int pred, int line) {
  const int me = hg_cur->linear;
  hg_slot[me][0] = pred != 0;
  hg_yield(HG_WARP, line);
  unsigned r = 0; const int base = me & ~31;
  for (int l = 0; l < 32 && base + l < hg_nthr; l++) r |= (unsigned)hg_snap[base + l][0] << l;
  return r;
}
static unsigned hg_live_lanes(void) {
  const int base = hg_cur->linear & ~31, n = hg_nthr - base < 32 ? hg_nthr - base : 32;
  return n == 32 ? 0xffffffffu : ((1u << n) - 1u);
}
#define __ballot_sync(mask, p) hg_ballot((p), __LINE__)
#define __any_sync(mask, p) (hg_ballot((p), __LINE__) != 0u)
#define __all_sync(mask, p) (hg_ballot((p), __LINE__) == hg_live_lanes())
#define __activemask() hg_live_lanes()
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
static inline float __uint_as_float(unsigned i) { float f; memcpy(&f, &i, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned i; memcpy(&i, &f, 4); return i; }
static inline double __longlong_as_double(long long i) { double f; memcpy(&f, &i, 8); return f; }
static inline long long __double_as_longlong(double f) { long long i; memcpy(&i, &f, 8); return i; }
/* Fibers switch only at barriers and warp operations: a read-modify-write is atomic. */
template <class T> static T atomicAdd(T *p, T v) { T o = *p; *p = o + v; return o; }
template <class T> static T atomicSub(T *p, T v) { T o = *p; *p = o - v; return o; }
template <class T> static T atomicExch(T *p, T v) { T o = *p; *p = v; return o; }
template <class T> static T atomicMax(T *p, T v) { T o = *p; if (v > o) *p = v; return o; }
template <class T> static T atomicMin(T *p, T v) { T o = *p; if (v < o) *p = v; return o; }
template <class T> static T atomicOr(T *p, T v) { T o = *p; *p = o | v; return o; }
template <class T> static T atomicAnd(T *p, T v) { T o = *p; *p = o & v; return o; }
template <class T> static T atomicCAS(T *p, T cmp, T v) {
  T o = *p; if (o == cmp) *p = v; return o; }
/* NVRTC's source defines these itself (it has no libc headers). */
#undef NAN
#undef INFINITY
#undef INT64_MIN
#undef INT64_MAX
#undef INT32_MIN
#undef INT32_MAX
#define int64_t hg_cu_int64_t
#define int32_t hg_cu_int32_t
#define uint64_t hg_cu_uint64_t
#define uint32_t hg_cu_uint32_t
#define int8_t hg_cu_int8_t
#define int16_t hg_cu_int16_t
#define uint8_t hg_cu_uint8_t
#define uint16_t hg_cu_uint16_t
/* ---- the CUDA source, exactly as NVRTC compiles it ---- */
"""

HOST_LAUNCHER = r"""
/* ---- the launcher (host only) ---- */
#undef int64_t
#undef int32_t
#undef uint64_t
#undef uint32_t
#undef int8_t
#undef int16_t
#undef uint8_t
#undef uint16_t
typedef void (*hg_kernel_fn)(HgArgs);
static hg_kernel_fn hg_kernel;
static const HgArgs *hg_args;
static void hg_entry(void) {
  hg_kernel(*hg_args);
  hg_cur->state = HG_DONE;
}
static unsigned long long hg_rng;
static unsigned hg_rand(unsigned n) {
  hg_rng ^= hg_rng << 13; hg_rng ^= hg_rng >> 7; hg_rng ^= hg_rng << 17;
  return (unsigned)(hg_rng % n);
}
/* 0 forward, 1 reverse, 2 shuffled */
static void hg_order(int *ord, int n, int mode) {
  for (int i = 0; i < n; i++) ord[i] = mode == 1 ? n - 1 - i : i;
  if (mode == 2)
    for (int i = n - 1; i > 0; i--) {
      int j = hg_rand(i + 1), t = ord[i]; ord[i] = ord[j]; ord[j] = t; }
}
static int hg_fail(const char *what, int line, int count, int other) {
  snprintf(hg_err, sizeof hg_err, what, line, count, hg_nthr, other);
  return 1;
}
/* Run one block to its end; 0, or 1 with hg_err set. */
static int hg_run_block(char *stacks, long stack_bytes, int mode) {
  static int ord[1024];
  for (int i = 0; i < hg_nthr; i++) {
    HgFiber *f = &hg_fib[i];
    f->linear = i;
    f->tid.x = i % hg_bdim.x; f->tid.y = (i / hg_bdim.x) % hg_bdim.y;
    f->tid.z = i / (hg_bdim.x * hg_bdim.y);
    f->state = HG_RUN; f->line = 0;
    getcontext(&f->ctx);
    f->ctx.uc_stack.ss_sp = stacks + (long)i * stack_bytes;
    f->ctx.uc_stack.ss_size = stack_bytes;
    f->ctx.uc_link = &hg_main;
    makecontext(&f->ctx, hg_entry, 0);
  }
  hg_order(ord, hg_nthr, mode);
  for (;;) {
    for (int k = 0; k < hg_nthr; k++) {
      HgFiber *f = &hg_fib[ord[k]];
      if (f->state != HG_RUN) continue;
      hg_cur = f;
      swapcontext(&hg_main, &f->ctx);
    }
    if (mode == 2) hg_order(ord, hg_nthr, mode);
    int done = 0, bar = 0, warp = 0, bar_line = -1, other_line = -1, warp_line = -1;
    for (int i = 0; i < hg_nthr; i++) {
      const HgFiber *f = &hg_fib[i];
      if (f->state == HG_DONE) done++;
      else if (f->state == HG_BAR) {
        bar++;
        if (bar_line < 0) bar_line = f->line;
        else if (f->line != bar_line) other_line = f->line;
      } else { warp++; warp_line = f->line; }
    }
    if (done == hg_nthr) return 0;
    int released = 0;  /* warps whose every lane waits at a warp operation */
    for (int w = 0; w * 32 < hg_nthr; w++) {
      const int lo = w * 32, hi = lo + 32 < hg_nthr ? lo + 32 : hg_nthr;
      int all = 1;
      for (int i = lo; i < hi; i++) all &= hg_fib[i].state == HG_WARP;
      if (!all) continue;
      memcpy(hg_snap[lo], hg_slot[lo], (size_t)(hi - lo) * 16);
      for (int i = lo; i < hi; i++) hg_fib[i].state = HG_RUN;
      released = 1;
    }
    if (released) continue;
    if (bar == hg_nthr) {
      if (other_line >= 0)
        return hg_fail("a barrier some threads never reach: threads wait at different "
                       "__syncthreads (line %d and line %d of the source)", bar_line,
                       other_line, 0);
      for (int i = 0; i < hg_nthr; i++) hg_fib[i].state = HG_RUN;
      continue;
    }
    if (bar)
      return hg_fail("a barrier some threads never reach: __syncthreads at line %d of the "
                     "source waits with %d of %d threads; the other %d exited or wait at a "
                     "warp operation", bar_line, bar, hg_nthr - bar);
    return hg_fail("a warp operation some lanes never reach: line %d of the source waits "
                   "with %d of %d threads; the other %d exited", warp_line, warp, done);
  }
}
extern "C" const char *hg_emu_error(void) { return hg_err; }
extern "C" int hg_emu_launch(void *kernel, const void *args, unsigned gx, unsigned gy,
                             unsigned gz, unsigned bx, unsigned by, unsigned bz,
                             char *stacks, long stack_bytes, int mode,
                             unsigned long long seed) {
  hg_err[0] = 0;
  hg_kernel = (hg_kernel_fn)kernel;
  hg_args = (const HgArgs *)args;
  hg_gdim.x = gx; hg_gdim.y = gy; hg_gdim.z = gz;
  hg_bdim.x = bx; hg_bdim.y = by; hg_bdim.z = bz;
  hg_nthr = (int)(bx * by * bz);
  hg_rng = seed * 2654435761ull + 88172645463325252ull;
  const long nblocks = (long)gx * gy * gz;
  long stride = 1, start = 0;  /* shuffled: a stride coprime to nblocks is a permutation */
  if (mode == 2 && nblocks > 1) {
    stride = (long)(hg_rng % (unsigned long long)nblocks) | 1;
    for (;; stride++) { long a = stride, c = nblocks; while (c) { long t = a % c; a = c; c = t; }
                        if (a == 1) break; }
    start = (long)(seed % (unsigned long long)nblocks);
  }
  for (long b = 0; b < nblocks; b++) {
    const long id = mode == 1 ? nblocks - 1 - b : mode == 2 ? (start + b * stride) % nblocks : b;
    hg_block.x = id % gx; hg_block.y = (id / gx) % gy; hg_block.z = id / ((long)gx * gy);
    if (hg_run_block(stacks, stack_bytes, mode)) return 1;
  }
  return 0;
}
"""


def host_source(cuda_source: str) -> str:
    """The host C++ translation unit for ``cuda_source`` (NVRTC's source, untouched)."""
    return HOST_PRELUDE + "#line 1 \"kernel.cu\"\n" + cuda_source + HOST_LAUNCHER


class HostCudaCompiler(CCompiler):
    """The host C++ compiler building emulated CUDA modules, cached like CPU kernels.

    -O1: modules are small and compiled often by the tests; the emulation's cost is
    the fiber switches, not the arithmetic. No fast math, no contraction: the same
    IEEE rules as NVRTC's ``--fmad=false``."""

    FLAGS = ("-x", "c++", "-std=gnu++17", "-O1", "-fPIC", "-shared", "-w",
             "-ffp-contract=off", "-fno-strict-aliasing")

    def __init__(self, command: list[str], version: str | None = None) -> None:
        super().__init__(command, version, flags=list(self.FLAGS), libs=["-lm"])

    def key_parts(self, key_parts: dict[str, str]) -> dict[str, str]:
        return {**super().key_parts(key_parts), "kind": "cuda-emulated"}

    def command_line(self, out_path: Path, src_path: Path) -> list[str]:
        return [*self.command, *self.flags, "-o", str(out_path), str(src_path), *self.libs]
