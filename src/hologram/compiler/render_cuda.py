"""Render scheduled kernels as CUDA C: the C renderer with loops mapped to the GPU.

Flat element-wise kernels use a grid-stride loop; a kernel with an outer loop
gives each block one outer index at a time and spreads the inner (row) loops
over its threads, so a row's phases (max, sum, ...) become block reductions
through warp shuffles and shared memory. Only the loop headers, the reduction
epilogue and the prelude differ from the C dialect.
"""

from __future__ import annotations

from typing import ClassVar

from ..isa.dtypes import DType
from ..isa.opcodes import Op
from . import attention_gpu, special_math
from .half_floats import HalfFloats, HalfType
from .render_c import KernelPlan
from .render_gpu import GPURenderer
from .schedule import AttentionPlan, BufRef, Schedule

CUDA_PRELUDE = r"""
typedef long long int64_t;
typedef int int32_t;
typedef unsigned long long uint64_t;
typedef unsigned int uint32_t;
typedef signed char int8_t;
typedef short int16_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
#define NAN __int_as_float(0x7fffffff)
#define INFINITY __int_as_float(0x7f800000)
#define INT64_MIN (-9223372036854775807LL - 1)
#define INT64_MAX 9223372036854775807LL
#define INT32_MIN (-2147483647 - 1)
#define INT32_MAX 2147483647
#define HG_SLOTS 64
struct HgArgs { void *p[HG_SLOTS]; };
struct HgSum { template <class T> __device__ T operator()(T a, T b) const { return a + b; } };
struct HgProd { template <class T> __device__ T operator()(T a, T b) const { return a * b; } };
struct HgMax { template <class T> __device__ T operator()(T a, T b) const {
  return b > a ? b : a; } };
struct HgMin { template <class T> __device__ T operator()(T a, T b) const {
  return b < a ? b : a; } };
struct HgOr { template <class T> __device__ T operator()(T a, T b) const { return a | b; } };
/* Reduce v over the block; every thread gets the result. Callers are block-uniform. */
template <class T, class F>
__device__ __forceinline__ T hg_block_reduce(T v, F f, T identity) {
  __shared__ __align__(8) unsigned char raw[33 * sizeof(double)];
  T *sh = reinterpret_cast<T *>(raw);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v = f(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  const int nw = (blockDim.x + 31) >> 5;
  if (warp == 0) {
    v = lane < nw ? sh[lane] : identity;
    for (int o = 16; o > 0; o >>= 1) v = f(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) sh[32] = v;
  }
  __syncthreads();
  return sh[32];
}
"""

#: The first out-of-range index of a launch (render_index): [1 + site, bad index], read
#: and cleared by the device runtime after the launch (``cuModuleGetGlobal``).
CUDA_INDEX_FAIL = r"""
__device__ unsigned long long hg_index_error[2];
__device__ __noinline__ int64_t hg_index_fail(int64_t site, int64_t bad, int64_t n) {
  if (atomicCAS(&hg_index_error[0], 0ull, (unsigned long long)(site + 1)) == 0ull)
    hg_index_error[1] = (unsigned long long)bad;
  return bad < 0 ? 0 : n - 1;
}
"""

_FUNCTOR = {Op.RSUM: "HgSum", Op.RPROD: "HgProd", Op.RMAX: "HgMax", Op.RMIN: "HgMin"}


def _cuda_half(storage: str, header: str, rn: str, from_float: str, from_double: str,
               to_float: str) -> HalfType:
    """A 16-bit float as the CUDA headers spell it: their storage type converts to and
    from float implicitly; ``rn`` rounds a float or a double once."""
    prelude = (f"#include <{header}>\n"
               f"__device__ __forceinline__ float {rn}(float x) {{ "
               f"return {to_float}({from_float}(x)); }}\n"
               f"__device__ __forceinline__ float {rn}(double x) {{ "
               f"return {to_float}({from_double}(x)); }}\n"
               f"static_assert(sizeof({storage}) == 2, \"{storage} is two bytes\");")
    # a load reads the element as a float: the storage type mixed with float in ``?:``
    # would be ambiguous
    return HalfType(storage, rn, "((float){0})", "{0}", prelude)


#: dtype -> its CUDA spelling (NVRTC knows neither _Float16 nor __bf16).
HALF: dict[str, HalfType] = {
    "f16": _cuda_half("__half", "cuda_fp16.h", "hg_rn_f16", "__float2half_rn",
                      "__double2half", "__half2float"),
    "bf16": _cuda_half("__nv_bfloat16", "cuda_bf16.h", "hg_rn_bf16", "__float2bfloat16_rn",
                       "__double2bfloat16", "__bfloat162float"),
}


class CUDARenderer(HalfFloats, GPURenderer):
    """CUDA C for NVRTC. ``launch`` records how each kernel maps onto the grid."""

    LOOPS = {
        "flat": ("for (int64_t {var} = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; "
                 "{var} < {count}; {var} += (int64_t)gridDim.x * blockDim.x) {{"),
        "outer": "for (int64_t {var} = blockIdx.x; {var} < {count}; {var} += gridDim.x) {{",
        "inner": "for (int64_t {var} = threadIdx.x; {var} < {count}; {var} += blockDim.x) {{",
    }
    FIRST_THREAD = "threadIdx.x == 0"
    max_slots = 64
    suffix: ClassVar[dict[str, str]] = {"f32": "f", "f64": "", "f16": "f", "bf16": "f"}
    HALF = HALF

    def __init__(self, sched: Schedule, slots: dict[BufRef, int]) -> None:
        super().__init__(sched, slots)
        if len(slots) > self.max_slots:
            raise ValueError(f"a CUDA program takes at most {self.max_slots} buffers")
        self.launch: dict[str, tuple[str, int]] = {}
        self._kernel = ""
        self.halves: set[str] = set()  # 16-bit float dtypes the kernels use (HalfFloats)

    def ctype(self, d: DType) -> str:
        return "bool" if d.kind == "b" else super().ctype(d)

    def slot_expr(self, ref: BufRef) -> str:
        return super().slot_expr(ref).replace("B[", "B.p[")

    def kernel(self, k: KernelPlan) -> str:
        self._kernel = k.name
        return super().kernel(k)

    def signature(self, name: str) -> str:
        return f'extern "C" __global__ void {name}(HgArgs B)'

    def index_lines(self, name: str, code: str, n: int, site: int) -> list[str]:
        """The C clamp, recording a bad index in the module's ``hg_index_error``."""
        self.uses_index_fail = True
        return [f"int64_t {name} = (int64_t)({code});",
                f"if ({name} < 0 || {name} >= {n}) {name} = hg_index_fail({site}, {name}, {n});"]

    def phase_head(self, r: str, count: int, clauses: str, parallel: bool) -> list[str]:
        self.launch.setdefault(self._kernel, ("single", 1))
        return [f"for (int64_t {r} = threadIdx.x; {r} < {count}; {r} += blockDim.x) {{"]

    def phase_tail(self, op: Op, acc: str, wide: str, nan: str | None) -> list[str]:
        if op in (Op.RSUM, Op.RPROD):
            ident = "0" if op is Op.RSUM else "1"
            lines = [f"{acc} = hg_block_reduce<{wide}>({acc}, {_FUNCTOR[op]}(), ({wide}){ident});"]
        else:  # max and min are idempotent: a thread's own partial is a neutral filler
            lines = [f"{{ {wide} hg_mine = {acc};",
                     f"  {acc} = hg_block_reduce<{wide}>(hg_mine, {_FUNCTOR[op]}(), hg_mine); }}"]
        if nan is not None:
            lines.append(f"{nan} = hg_block_reduce<int>({nan}, HgOr(), 0);")
        return lines



def render_cuda(sched: Schedule, slots: dict[BufRef, int]) -> tuple[str, dict]:
    """CUDA C for every kernel step of ``sched`` and how each maps onto the grid.

    GEMM steps, 2-D or batched alike, are not rendered: they are library calls
    (cuBLAS ``gemmStridedBatched`` for a batch, the same strided operand layout
    ``compiler/gemm_layout.py`` works out for BLAS on the CPU), made by the device
    runtime between the kernels; the kernels read their results from the GEMM's
    buffer like any other."""
    r = CUDARenderer(sched, slots)
    parts = [CUDA_PRELUDE]
    for step in sched.steps:
        if isinstance(step, KernelPlan):
            parts.append(r.kernel(step))
        elif isinstance(step, AttentionPlan):  # its own kernels (compiler/attention_gpu.py)
            source, launch = attention_gpu.render_cuda(r, step)
            parts.append(source)
            r.launch.update(launch)
    if r.uses_index_fail:
        parts.insert(1, CUDA_INDEX_FAIL)
    if r.specials:
        parts.insert(1, special_math.c_source(r.specials, device=True))
    parts[0:0] = r.half_preludes()  # the headers first: they see no macros
    return "\n\n".join(parts) + "\n", r.launch
