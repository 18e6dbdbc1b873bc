"""Render scheduled kernels as CUDA C: the C renderer with loops mapped to the GPU.

Flat element-wise kernels use a grid-stride loop; a kernel with an outer loop
gives each block one outer index at a time and spreads the inner (row) loops
over its threads, so a row's phases (max, sum, ...) become block reductions
through warp shuffles and shared memory. Only the loop headers, the reduction
epilogue and the prelude differ from the C dialect.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..isa.dtypes import DType
from ..isa.opcodes import Op
from ..isa.value import Value
from . import attention_gpu, special_math
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


@dataclass(frozen=True)
class HalfType:
    """How a 16-bit float dtype is spelled in CUDA C: stored as the CUDA headers' type,
    computed in float, every instruction's result rounded to the dtype (``round``, to
    nearest even), as NumPy computes float16 (each ufunc in float, rounded back)."""

    storage: str  # the element type of buffers
    header: str
    round: str  # float or double -> the nearest value of the dtype, as a float
    from_float: str
    from_double: str
    to_float: str

    def prelude(self) -> str:
        r, s = self.round, self.storage
        return (f"#include <{self.header}>\n"
                f"__device__ __forceinline__ float {r}(float x) {{ "
                f"return {self.to_float}({self.from_float}(x)); }}\n"
                f"__device__ __forceinline__ float {r}(double x) {{ "
                f"return {self.to_float}({self.from_double}(x)); }}\n"
                f"static_assert(sizeof({s}) == 2, \"{s} is two bytes\");")


#: dtype -> its CUDA spelling (NVRTC knows neither _Float16 nor __bf16, the C renderer's).
HALF: dict[str, HalfType] = {
    "f16": HalfType("__half", "cuda_fp16.h", "hg_rn_f16", "__float2half_rn", "__double2half",
                    "__half2float"),
    "bf16": HalfType("__nv_bfloat16", "cuda_bf16.h", "hg_rn_bf16", "__float2bfloat16_rn",
                     "__double2bfloat16", "__bfloat162float"),
}


#: A load of one element of a 16-bit float buffer (``ptr()``'s names: p<slot>_<dtype>).
_LOAD = re.compile(r"p\d+_b?f16(?:_\d+)?\[[^\[\]]*\]")
#: Element-wise templates of 16-bit floats that round inside the instruction, as the
#: ISA's meaning does: MAD is a product rounded to the dtype, then a sum ({R}: round).
HALF_TEMPLATES = {Op.MAD: "({R}({0} * {1}) + {2})"}


def _rounded(value: float, d: DType) -> float | None:
    """``value`` rounded to ``d`` (None where NumPy has no such dtype here)."""
    if d.np_dtype is None:
        return None
    return float(np.asarray(value, dtype=np.float64).astype(d.np_dtype))


class CUDARenderer(GPURenderer):
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

    def __init__(self, sched: Schedule, slots: dict[BufRef, int]) -> None:
        super().__init__(sched, slots)
        if len(slots) > self.max_slots:
            raise ValueError(f"a CUDA program takes at most {self.max_slots} buffers")
        self.launch: dict[str, tuple[str, int]] = {}
        self._kernel = ""
        self.halves: set[str] = set()  # 16-bit float dtypes the kernels use

    def half(self, d: DType) -> HalfType | None:
        """``d``'s CUDA spelling if it is a 16-bit float (its header is then included)."""
        half = HALF.get(d.name)
        if half is not None:
            self.halves.add(d.name)
        return half

    def ctype(self, d: DType) -> str:
        if self.half(d) is not None:
            return "float"
        return "bool" if d.kind == "b" else d.ctype

    def storage_type(self, d: DType) -> str:
        half = self.half(d)
        return self.ctype(d) if half is None else half.storage

    def accumulator_type(self, d: DType) -> str:
        return "float" if d.name in HALF else self.ctype(d)

    def template(self, op: Op, d: DType) -> str:
        half = self.half(d)
        if half is not None and op in HALF_TEMPLATES:
            return HALF_TEMPLATES[op].replace("{R}", half.round)
        return super().template(op, d)

    def combine_code(self, step: Op, a: str, b: str, d: DType) -> str:
        """A scatter's update reads the element (``a``) as a float: the storage type
        mixed with float in ``?:`` would be ambiguous."""
        if self.half(d) is not None:
            a = f"((float){a})"
        return super().combine_code(step, a, b, d)

    def declare(self, name: str, d: DType, code: str) -> str:
        half = self.half(d)
        if half is None:
            return super().declare(name, d, code)
        if _LOAD.fullmatch(code):  # a stored value is the dtype's already: no rounding
            return f"float {name} = {code};"
        return f"float {name} = {half.round}({code});"

    def cast_code(self, v: Value, code: str) -> str:
        half = self.half(v.dtype)
        if half is None:
            return super().cast_code(v, code)
        if v.srcs[0].dtype.name in ("f32", *HALF):
            return f"{half.round}((float)({code}))"
        return f"{half.round}((double)({code}))"  # one rounding, from f64 or an integer

    def narrow(self, code: str, wide: str, d: DType) -> str:
        half = self.half(d)
        return super().narrow(code, wide, d) if half is None else f"{half.round}({code})"

    def literal(self, value: float | int | bool, d: DType) -> str:
        if d.name not in HALF:
            return super().literal(value, d)
        v = float(value)
        if math.isnan(v):
            return "NAN"
        rounded = _rounded(v, d)
        if rounded is None and not math.isinf(v):  # no NumPy dtype to round with here:
            return f"{self.half(d).round}({v.hex()})"  # round where it is used
        rounded = v if rounded is None else rounded
        if math.isinf(rounded):
            return "(-INFINITY)" if rounded < 0 else "INFINITY"
        return f"({rounded.hex()}f)"

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
    for name in sorted(r.halves, reverse=True):  # the headers first: they see no macros
        parts.insert(0, HALF[name].prelude())
    return "\n\n".join(parts) + "\n", r.launch
