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
/* cuda_fp16.h and cuda_bf16.h on the host (the source's #include lines are dropped):
   the two-byte types, their conversions to and from float, and the rounding ones, to
   nearest even, bit for bit as the CUDA headers' (NaN: a quiet NaN, as theirs). */
template <class U, int SM, int SE, int DM, int DE>
static unsigned short hg_narrow(U x) {
  const int sbias = (1 << (SE - 1)) - 1, dbias = (1 << (DE - 1)) - 1, emin = 1 - dbias;
  const unsigned short sign = (unsigned short)(((x >> (SM + SE)) & 1u) << (DM + DE));
  const U ex = (x >> SM) & ((U(1) << SE) - 1), man = x & ((U(1) << SM) - 1);
  const unsigned short inf = (unsigned short)(((1u << DE) - 1u) << DM);
  if (ex == (U(1) << SE) - 1)
    return sign | inf | (man ? (unsigned short)(1u << (DM - 1)) : 0);
  int e;  /* the value is sig * 2^(e - SM) */
  U sig;
  if (ex == 0) {
    if (!man) return sign;
    e = 1 - sbias; sig = man;
  } else {
    e = (int)ex - sbias; sig = man | (U(1) << SM);
  }
  if (e > dbias) return sign | inf;
  const int shift = SM - DM + (e < emin ? emin - e : 0);
  if (shift > SM + 1) return sign;  /* under half the smallest subnormal */
  U q = sig >> shift;
  const U rem = sig & ((U(1) << shift) - 1), half = U(1) << (shift - 1);
  if (rem > half || (rem == half && (q & 1))) q++;
  unsigned be = (unsigned)((e < emin ? emin : e) + dbias);  /* q * 2^(be - dbias - DM) */
  if (q >> (DM + 1)) { q >>= 1; be++; }  /* rounding carried into a new bit */
  if (!(q >> DM)) be = 0;  /* a subnormal */
  if (be >= (1u << DE) - 1u) return sign | inf;
  return sign | (unsigned short)(be << DM) | (unsigned short)(q & ((U(1) << DM) - 1));
}
static unsigned hg_f32_bits(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static unsigned long long hg_f64_bits(double f) {
  unsigned long long u; memcpy(&u, &f, 8); return u; }
static float hg_bits_f32(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static float hg_half_bits_to_float(unsigned short h) {
  const unsigned sign = (unsigned)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu;
  unsigned m = h & 0x3ffu;
  if (e == 31) return hg_bits_f32(sign | 0x7f800000u | (m << 13));
  if (e) return hg_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
  if (!m) return hg_bits_f32(sign);
  unsigned be = 113;
  while (!(m & 0x400u)) { m <<= 1; be--; }
  return hg_bits_f32(sign | (be << 23) | ((m & 0x3ffu) << 13));
}
struct __half;
static __half __float2half_rn(float f);
static float __half2float(__half h);
struct __half {
  unsigned short __x;
  __half() = default;
  __half(float f) : __x(__float2half_rn(f).__x) {}
  operator float() const { return __half2float(*this); }
  __half &operator=(float f) { __x = __float2half_rn(f).__x; return *this; }
};
static __half __hg_half(unsigned short x) { __half h; h.__x = x; return h; }
static __half __float2half_rn(float f) {
  return __hg_half(hg_narrow<unsigned, 23, 8, 10, 5>(hg_f32_bits(f))); }
static __half __double2half(double f) {
  return __hg_half(hg_narrow<unsigned long long, 52, 11, 10, 5>(hg_f64_bits(f))); }
static float __half2float(__half h) { return hg_half_bits_to_float(h.__x); }
struct __nv_bfloat16;
static __nv_bfloat16 __float2bfloat16_rn(float f);
static float __bfloat162float(__nv_bfloat16 h);
struct __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  __nv_bfloat16(float f) : __x(__float2bfloat16_rn(f).__x) {}
  operator float() const { return __bfloat162float(*this); }
  __nv_bfloat16 &operator=(float f) { __x = __float2bfloat16_rn(f).__x; return *this; }
};
static __nv_bfloat16 __hg_bf16(unsigned short x) { __nv_bfloat16 h; h.__x = x; return h; }
static __nv_bfloat16 __float2bfloat16_rn(float f) {
  return __hg_bf16(hg_narrow<unsigned, 23, 8, 7, 8>(hg_f32_bits(f))); }
static __nv_bfloat16 __double2bfloat16(double f) {
  return __hg_bf16(hg_narrow<unsigned long long, 52, 11, 7, 8>(hg_f64_bits(f))); }
static float __bfloat162float(__nv_bfloat16 h) { return hg_bits_f32((unsigned)h.__x << 16); }
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


#: The CUDA headers the prelude stands in for: their #include lines become comments
#: (the line count stays, so errors name the source's own lines).
HOST_HEADERS = ("cuda_fp16.h", "cuda_bf16.h")


def host_source(cuda_source: str) -> str:
    """The host C++ translation unit for ``cuda_source`` (NVRTC's source, its CUDA
    header includes answered by the prelude)."""
    for h in HOST_HEADERS:
        cuda_source = cuda_source.replace(f"#include <{h}>", f"/* {h}: the host prelude's */")
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
