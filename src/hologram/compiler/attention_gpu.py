"""Attention steps as GPU kernels: WGSL (run on lavapipe in tests) and CUDA C (NVRTC).

Simple and correct rather than fast: one workgroup (block) per (batch index, query
row), the keys in chunks of one per invocation (thread). Forward: each invocation
computes the score of its key, the workgroup reduces the chunk's maximum and the sum of
``exp(s - m)`` (the online softmax: the running sum and each invocation's output
columns are rescaled by ``exp(m_old - m_new)``), and each invocation adds the chunk's
``p_j v_j`` to the output columns it owns. Backward is two kernels: one workgroup per
query row accumulates ``dq`` over key chunks, one per key row accumulates ``dk`` and
``dv`` over query chunks, each recomputing ``p = exp(s - lse)`` (no ``L x S`` matrix
anywhere). Every key (query) is visited, so NaN and inf behave as the reference says,
without the CPU driver's block skipping.

Operands are read through their view chains by loader functions built with the fused
kernels' emitter (``gb`` the flat batch index, then row and column), so permuted,
broadcast (GQA) and sliced operands cost nothing. The math runs in f32 (WGSL has no
f64; CUDA f64 operands compute in double).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from string import Template
from typing import Any

from ..isa import builder as b
from ..isa.dtypes import f32 as F32
from ..isa.opcodes import Op
from ..isa.value import Value, contiguous_strides
from .attention import operands
from .schedule import AttentionPlan, BufRef

# --------------------------------------------------------------------------------- WGSL

_WGSL_FWD = Template(r"""var<workgroup> hg_ap: array<f32, $WG>;
$LOADERS
// One workgroup per (batch, query row): keys in chunks of $WG, online softmax.
@compute @workgroup_size($WG)
fn $NAME(@builtin(local_invocation_id) hg_lid: vec3<u32>,
    @builtin(workgroup_id) hg_wid: vec3<u32>,
    @builtin(num_workgroups) hg_nwg: vec3<u32>) {
  hg_z = hg_nwg.z - 1u;
  let lid = i32(hg_lid.x);
  let neg = hg_bits(0xff800000u);
  for (var row: i32 = i32(hg_wid.x); row < $ROWS; row += i32(hg_nwg.x)) {
    let gb = row / $L;
    let i = row % $L;
    var m: f32 = neg;
    var l: f32 = 0.0;
    var acc: array<f32, $NACC>;
    for (var a: i32 = 0; a < $NACC; a++) { acc[a] = 0.0; }
    for (var c0: i32 = 0; c0 < $S; c0 += $WG) {
      let j = c0 + lid;
      var s: f32 = neg;
      if (j < $S) {
$SCORE
      }
      let mnew = hg_max(m, $RMAX(s, hg_lid.x));
      let live = !hg_isneginf(mnew);
      var p: f32 = 0.0;
      if (j < $S && live) { p = exp(s - mnew); }
      hg_ap[lid] = p;
      let bsum = $RSUM(p, hg_lid.x);
      var alpha: f32 = 1.0;
      if (live) { alpha = exp(m - mnew); }
      l = l * alpha + bsum;
      m = mnew;
      let nk = min($WG, $S - c0);
      for (var a: i32 = 0; a < $NACC; a++) {
        let c = lid + a * $WG;
        if (c < $EV) {
          var t: f32 = acc[a] * alpha;
          for (var u: i32 = 0; u < nk; u++) { t = t + hg_ap[u] * hg_av(gb, c0 + u, c); }
          acc[a] = t;
        }
      }
      workgroupBarrier();
    }
    let dead = hg_isneginf(m);
$STORE
  }
}""")

_WGSL_DQ = Template(r"""var<workgroup> hg_ap: array<f32, $WG>;
$LOADERS
// dq: one workgroup per (batch, query row), keys in chunks of $WG.
@compute @workgroup_size($WG)
fn $NAME(@builtin(local_invocation_id) hg_lid: vec3<u32>,
    @builtin(workgroup_id) hg_wid: vec3<u32>,
    @builtin(num_workgroups) hg_nwg: vec3<u32>) {
  hg_z = hg_nwg.z - 1u;
  let lid = i32(hg_lid.x);
  let neg = hg_bits(0xff800000u);
  for (var row: i32 = i32(hg_wid.x); row < $ROWS; row += i32(hg_nwg.x)) {
    let gb = row / $L;
    let i = row % $L;
    var dpart: f32 = 0.0;
    for (var c: i32 = lid; c < $EV; c += $WG) {
      dpart = dpart + hg_ado(gb, i, c) * hg_ao(gb, i, c);
    }
    let di = $RSUM(dpart, hg_lid.x);
    let li = hg_alse(gb, i, 0);
    var acc: array<f32, $NACC>;
    for (var a: i32 = 0; a < $NACC; a++) { acc[a] = 0.0; }
    for (var c0: i32 = 0; c0 < $S; c0 += $WG) {
      let j = c0 + lid;
      var ds: f32 = 0.0;
      if (j < $S) {
        var s: f32 = neg;
$SCORE
        var p: f32 = 0.0;
        if (!hg_isneginf(s)) { p = exp(s - li); }
        var dp: f32 = 0.0;
        for (var c: i32 = 0; c < $EV; c++) { dp = dp + hg_ado(gb, i, c) * hg_av(gb, j, c); }
        ds = p * (dp - di);
      }
      hg_ap[lid] = ds;
      workgroupBarrier();
      let nk = min($WG, $S - c0);
      for (var a: i32 = 0; a < $NACC; a++) {
        let c = lid + a * $WG;
        if (c < $E) {
          var t: f32 = acc[a];
          for (var u: i32 = 0; u < nk; u++) { t = t + hg_ap[u] * hg_ak(gb, c0 + u, c); }
          acc[a] = t;
        }
      }
      workgroupBarrier();
    }
$STORE
  }
}""")

_WGSL_DKV = Template(r"""var<workgroup> hg_ap: array<f32, $WG>;
var<workgroup> hg_ads: array<f32, $WG>;
$LOADERS
// dk, dv: one workgroup per (batch, key row), queries in chunks of $WG.
@compute @workgroup_size($WG)
fn $NAME(@builtin(local_invocation_id) hg_lid: vec3<u32>,
    @builtin(workgroup_id) hg_wid: vec3<u32>,
    @builtin(num_workgroups) hg_nwg: vec3<u32>) {
  hg_z = hg_nwg.z - 1u;
  let lid = i32(hg_lid.x);
  let neg = hg_bits(0xff800000u);
  for (var row: i32 = i32(hg_wid.x); row < $KROWS; row += i32(hg_nwg.x)) {
    let gb = row / $S;
    let j = row % $S;
    var dka: array<f32, $NACCE>;
    var dva: array<f32, $NACC>;
    for (var a: i32 = 0; a < $NACCE; a++) { dka[a] = 0.0; }
    for (var a: i32 = 0; a < $NACC; a++) { dva[a] = 0.0; }
    for (var c0: i32 = 0; c0 < $L; c0 += $WG) {
      let i = c0 + lid;
      var p: f32 = 0.0;
      var ds: f32 = 0.0;
      if (i < $L) {
        var s: f32 = neg;
$SCORE
        if (!hg_isneginf(s)) { p = exp(s - hg_alse(gb, i, 0)); }
        var dp: f32 = 0.0;
        var di: f32 = 0.0;
        for (var c: i32 = 0; c < $EV; c++) {
          let g = hg_ado(gb, i, c);
          dp = dp + g * hg_av(gb, j, c);
          di = di + g * hg_ao(gb, i, c);
        }
        ds = p * (dp - di);
      }
      hg_ap[lid] = p;
      hg_ads[lid] = ds;
      workgroupBarrier();
      let nq = min($WG, $L - c0);
      for (var a: i32 = 0; a < $NACC; a++) {
        let c = lid + a * $WG;
        if (c < $EV) {
          var t: f32 = dva[a];
          for (var u: i32 = 0; u < nq; u++) { t = t + hg_ap[u] * hg_ado(gb, c0 + u, c); }
          dva[a] = t;
        }
      }
      for (var a: i32 = 0; a < $NACCE; a++) {
        let c = lid + a * $WG;
        if (c < $E) {
          var t: f32 = dka[a];
          for (var u: i32 = 0; u < nq; u++) { t = t + hg_ads[u] * hg_aq(gb, c0 + u, c); }
          dka[a] = t;
        }
      }
      workgroupBarrier();
    }
$STORE
  }
}""")

_WGSL_HELPERS = """fn hg_isneginf(x: f32) -> bool { return bitcast<u32>(x) == 0xff800000u; }"""


_SHORT = {"dout": "do", "out": "o", "mask": "m"}  # loader names: hg_a + role


def _offset(step: AttentionPlan, x: Value, col: str | None) -> str:
    """Where part ``x`` keeps element (``row``, ``col``) in its sink's buffer, ``row`` the
    kernels' flat (batch, row) index: the part's own row-major layout, or the strides
    of the stored permutation the step writes in place (``AttentionPlan.layouts``)."""
    nbd = x.ndim - (1 if col is None else 2)
    strides = step.layouts.get(id(x), contiguous_strides(x.shape))
    n = x.shape[nbd]
    terms = []
    inner = n
    for d in reversed(range(nbd)):
        if x.shape[d] > 1:
            terms.append(f"(row / {inner} % {x.shape[d]}) * {strides[d]}")
        inner *= x.shape[d]
    terms.append(f"(row % {n}) * {strides[nbd]}")
    if col is not None:
        terms.append(f"{col} * {strides[nbd + 1]}")
    return " + ".join(terms)


def _loader_operands(step: AttentionPlan) -> dict[str, Value]:
    """Operands by loader name (``hg_aq``, ``hg_ak``, ...: ``hg_k`` and ``hg_o`` are the
    WGSL renderer's own helpers); lse as [*batch, L, 1], so every loader takes (gb, r, c)."""
    ops = operands(step)
    out = {"hg_a" + _SHORT.get(r, r): x for r, x in ops.items()}
    if "hg_alse" in out:
        lse = out["hg_alse"]
        out["hg_alse"] = b.reshape(lse, (*lse.shape, 1))
    return out


_SCORE = {  # dialect -> (lines setting s for query i and key j, the mask line, causal)
    "wgsl": (["var dot: f32 = 0.0;",
              "for (var e: i32 = 0; e < $E; e++) { dot = dot + hg_aq(gb, i, e) * "
              "hg_ak(gb, j, e); }",
              "s = dot * $SCALE;"],
             "s = s + hg_am(gb, i, j);", "if (j > i) { s = neg; }"),
    "cuda": (["acc_t dot = 0;",
              "for (int64_t e = 0; e < $E; e++) dot += hg_aq(B, gb, i, e) * hg_ak(B, gb, j, e);",
              "s = dot * $SCALE;"],
             "s = s + hg_am(B, gb, i, j);", "if (j > i) s = neg;"),
}


def _score(dialect: str, e: int, scale: str, mask: bool, causal: bool) -> str:
    """Code setting ``s`` (declared before) to the score of query ``i`` and key ``j``:
    ``(q_i . k_j) * scale + mask``, ``-inf`` where causal hides the key."""
    lines, mask_line, causal_line = _SCORE[dialect]
    lines = [*lines, *([mask_line] if mask else []), *([causal_line] if causal else [])]
    return "\n".join(" " * 8 + Template(ln).substitute(E=e, SCALE=scale) for ln in lines)


def render_wgsl(r: Any, step: AttentionPlan, name: str) -> list:
    """The step's WGSL kernels (one forward kernel; backward: dq, then dk/dv), each in
    its own module; ``r`` is the program's WGSLRenderer."""
    from .render_wgsl import MAX_GROUPS, WORKGROUP, WGSLKernel

    ops = operands(step)
    q, k, v = ops["q"], ops["k"], ops["v"]
    batch = q.shape[:-2]
    nb = math.prod(batch)
    n_q, e = q.shape[-2:]
    n_k, ev = k.shape[-2], v.shape[-1]
    first = step.sinks[0][0]
    kernels = []

    def kernel(tmpl: Template, suffix: str, rows: int, store: Callable[[Any], str]) -> None:
        kname = f"{name}_{suffix}"
        r._kernel = kname
        r.used, r.helpers, r.wg_reduce = {}, {}, {}
        r.computing = set()
        r.pointers, r.pointer_decls = {}, []
        r.row, r.row_cands = None, {}
        for h in ("hg_bits", "hg_max", "hg_log"):
            r.need(h)
        loaders = [r._gemm_loader(fn, x, batch) for fn, x in _loader_operands(step).items()]
        scale = r.literal(first.attr("scale"), F32)
        body = tmpl.substitute(
            WG=WORKGROUP, NAME=kname, ROWS=nb * n_q, KROWS=nb * n_k, L=n_q, S=n_k, E=e, EV=ev,
            NACC=max(1, -(-ev // WORKGROUP)), NACCE=max(1, -(-e // WORKGROUP)),
            RMAX=r.workgroup_reduce(Op.RMAX, "f32"), RSUM=r.workgroup_reduce(Op.RSUM, "f32"),
            LOADERS=_WGSL_HELPERS + "\n" + "\n".join(loaders),
            SCORE=_score("wgsl", e, scale, "mask" in ops, first.attr("causal")),
            STORE=store(r))
        groups = (min(max(1, rows), MAX_GROUPS), 1, 1)
        kernels.append(WGSLKernel(kname, r.module(body), sorted(r.used), groups))

    def store_rows(parts: list[tuple[str, tuple[Value, BufRef], int, str]],
                   per_row: Callable[[], list[str]] = list) -> Callable[[Any], str]:
        def store(r: Any) -> str:  # called while the kernel renders (bindings recorded)
            lines = per_row()
            for acc, (x, ref), width, value in parts:
                t = r.ctype(ref.dtype)
                lines.append(f"for (var a: i32 = 0; a < {max(1, -(-width // WORKGROUP))}; "
                             f"a++) {{\n      let c = lid + a * {WORKGROUP};\n"
                             f"      if (c < {width}) {{ {r.at(ref, _offset(step, x, 'c'))} = "
                             f"{t}({value.format(acc=f'{acc}[a]')}); }}\n    }}")
            return "\n".join("    " + ln for ln in lines)
        return store

    if step.kind == "forward":
        out, lse = step.part("out"), step.part("lse")
        parts = [("acc", out, ev, "select({acc} / l, 0.0, dead)")] if out else []

        def lse_line() -> list[str]:
            if not lse:
                return []
            return [f"if (lid == 0) {{ {r.at(lse[1], _offset(step, lse[0], None))} = "
                    f"{r.ctype(lse[1].dtype)}(select(m + hg_log(l), 0.0, dead)); }}"]
        kernel(_WGSL_FWD, "fwd", nb * n_q, store_rows(parts, lse_line))
        return kernels
    dq, dk, dv = step.part("dq"), step.part("dk"), step.part("dv")
    if dq:
        def dq_store(r: Any) -> str:
            s = r.literal(first.attr("scale"), F32)
            return store_rows([("acc", dq, e, "{acc} * " + s)])(r)
        kernel(_WGSL_DQ, "dq", nb * n_q, dq_store)
    if dk or dv:
        def kv_store(r: Any) -> str:
            s = r.literal(first.attr("scale"), F32)
            parts = ([("dka", dk, e, "{acc} * " + s)] if dk else []) + \
                    ([("dva", dv, ev, "{acc}")] if dv else [])
            return store_rows(parts)(r)
        kernel(_WGSL_DKV, "dkv", nb * n_k, kv_store)
    return kernels


# --------------------------------------------------------------------------------- CUDA

_CUDA_HELPERS = r"""
#ifndef HG_ATTN_HELPERS
#define HG_ATTN_HELPERS
/* max that propagates NaN (the reference's np.max does) */
struct HgMaxNan { template <class T> __device__ T operator()(T a, T b) const {
  return (b > a || b != b) ? b : a; } };
#define HG_ATTN_MAXT 1024
#endif
"""

_CUDA_FWD = Template(r"""
extern "C" __global__ void $NAME(HgArgs B) {
  typedef $ACC acc_t;
  __shared__ acc_t hg_ap[HG_ATTN_MAXT];
  const int64_t tid = threadIdx.x, nt = blockDim.x;
  const acc_t neg = -(acc_t)INFINITY;
  for (int64_t row = blockIdx.x; row < $ROWS; row += gridDim.x) {
    const int64_t gb = row / $L, i = row % $L;
    acc_t m = neg, l = 0;
    acc_t acc[$NACC];
    for (int a = 0; a < $NACC; a++) acc[a] = 0;
    for (int64_t c0 = 0; c0 < $S; c0 += nt) {
      const int64_t j = c0 + tid;
      acc_t s = neg;
      if (j < $S) {
$SCORE
      }
      acc_t mine = s;
      const acc_t bm = hg_block_reduce<acc_t>(mine, HgMaxNan(), mine);
      const acc_t mnew = (m != m || bm != bm) ? (acc_t)NAN : (bm > m ? bm : m);
      const bool live = !(mnew == neg);
      acc_t p = 0;
      if (j < $S && live) p = exp(s - mnew);
      hg_ap[tid] = p;
      const acc_t bsum = hg_block_reduce<acc_t>(p, HgSum(), (acc_t)0);
      const acc_t alpha = live ? exp(m - mnew) : (acc_t)1;
      l = l * alpha + bsum;
      m = mnew;
      const int64_t nk = nt < $S - c0 ? nt : $S - c0;
      for (int a = 0; a < $NACC; a++) {
        const int64_t c = tid + a * nt;
        if (c < $EV) {
          acc_t t = acc[a] * alpha;
          for (int64_t u = 0; u < nk; u++) t += hg_ap[u] * hg_av(B, gb, c0 + u, c);
          acc[a] = t;
        }
      }
      __syncthreads();
    }
    const bool dead = m == neg;
$STORE
  }
}
""")

_CUDA_DQ = Template(r"""
extern "C" __global__ void $NAME(HgArgs B) {
  typedef $ACC acc_t;
  __shared__ acc_t hg_ap[HG_ATTN_MAXT];
  const int64_t tid = threadIdx.x, nt = blockDim.x;
  const acc_t neg = -(acc_t)INFINITY;
  for (int64_t row = blockIdx.x; row < $ROWS; row += gridDim.x) {
    const int64_t gb = row / $L, i = row % $L;
    acc_t dpart = 0;
    for (int64_t c = tid; c < $EV; c += nt) dpart += hg_ado(B, gb, i, c) * hg_ao(B, gb, i, c);
    const acc_t di = hg_block_reduce<acc_t>(dpart, HgSum(), (acc_t)0);
    const acc_t li = hg_alse(B, gb, i, 0);
    acc_t acc[$NACC];
    for (int a = 0; a < $NACC; a++) acc[a] = 0;
    for (int64_t c0 = 0; c0 < $S; c0 += nt) {
      const int64_t j = c0 + tid;
      acc_t ds = 0;
      if (j < $S) {
        acc_t s = neg;
$SCORE
        const acc_t p = s == neg ? (acc_t)0 : exp(s - li);
        acc_t dp = 0;
        for (int64_t c = 0; c < $EV; c++) dp += hg_ado(B, gb, i, c) * hg_av(B, gb, j, c);
        ds = p * (dp - di);
      }
      hg_ap[tid] = ds;
      __syncthreads();
      const int64_t nk = nt < $S - c0 ? nt : $S - c0;
      for (int a = 0; a < $NACC; a++) {
        const int64_t c = tid + a * nt;
        if (c < $E) {
          acc_t t = acc[a];
          for (int64_t u = 0; u < nk; u++) t += hg_ap[u] * hg_ak(B, gb, c0 + u, c);
          acc[a] = t;
        }
      }
      __syncthreads();
    }
$STORE
  }
}
""")

_CUDA_DKV = Template(r"""
extern "C" __global__ void $NAME(HgArgs B) {
  typedef $ACC acc_t;
  __shared__ acc_t hg_ap[HG_ATTN_MAXT];
  __shared__ acc_t hg_ads[HG_ATTN_MAXT];
  const int64_t tid = threadIdx.x, nt = blockDim.x;
  const acc_t neg = -(acc_t)INFINITY;
  for (int64_t row = blockIdx.x; row < $KROWS; row += gridDim.x) {
    const int64_t gb = row / $S, j = row % $S;
    acc_t dka[$NACCE], dva[$NACC];
    for (int a = 0; a < $NACCE; a++) dka[a] = 0;
    for (int a = 0; a < $NACC; a++) dva[a] = 0;
    for (int64_t c0 = 0; c0 < $L; c0 += nt) {
      const int64_t i = c0 + tid;
      acc_t p = 0, ds = 0;
      if (i < $L) {
        acc_t s = neg;
$SCORE
        if (!(s == neg)) p = exp(s - (acc_t)hg_alse(B, gb, i, 0));
        acc_t dp = 0, di = 0;
        for (int64_t c = 0; c < $EV; c++) {
          const acc_t g = hg_ado(B, gb, i, c);
          dp += g * hg_av(B, gb, j, c);
          di += g * hg_ao(B, gb, i, c);
        }
        ds = p * (dp - di);
      }
      hg_ap[tid] = p;
      hg_ads[tid] = ds;
      __syncthreads();
      const int64_t nq = nt < $L - c0 ? nt : $L - c0;
      for (int a = 0; a < $NACC; a++) {
        const int64_t c = tid + a * nt;
        if (c < $EV) {
          acc_t t = dva[a];
          for (int64_t u = 0; u < nq; u++) t += hg_ap[u] * hg_ado(B, gb, c0 + u, c);
          dva[a] = t;
        }
      }
      for (int a = 0; a < $NACCE; a++) {
        const int64_t c = tid + a * nt;
        if (c < $E) {
          acc_t t = dka[a];
          for (int64_t u = 0; u < nq; u++) t += hg_ads[u] * hg_aq(B, gb, c0 + u, c);
          dka[a] = t;
        }
      }
      __syncthreads();
    }
$STORE
  }
}
""")


def _cuda_loader(r: Any, fn: str, operand: Value, batch: tuple[int, ...]) -> str:
    """``fn(B, gb, gr, gc)``: element (gr, gc) of batch ``gb`` of ``operand``, read through
    its view chain by the C emitter (a device function, in the operand's C type)."""
    r.pointers, r.pointer_decls = {}, []
    r.row, r.row_cands, r.computing = None, {}, set()
    x, lines = r.matrix_element(operand, batch)
    t = r.ctype(operand.dtype)
    body = r.pointer_decls + lines
    return (f"__device__ __forceinline__ {t} {fn}(const HgArgs &B, int64_t gb, int64_t gr, "
            f"int64_t gc) {{\n" + "".join(f"  {ln}\n" for ln in body)
            + f"  return ({t})({x.code});\n}}")


def render_cuda(r: Any, step: AttentionPlan) -> tuple[str, dict[str, tuple[str, int]]]:
    """CUDA C for ``step`` (its kernels and their loaders) and how each kernel maps onto
    the grid: ('outer', rows), a block per (batch, row), any block size from 32 to 1024."""
    ops = operands(step)
    q, k, v = ops["q"], ops["k"], ops["v"]
    batch = q.shape[:-2]
    nb = math.prod(batch)
    n_q, e = q.shape[-2:]
    n_k, ev = k.shape[-2], v.shape[-1]
    first = step.sinks[0][0]
    acc_t = "double" if q.dtype.name == "f64" else "float"
    name = step.name
    loaders = [_cuda_loader(r, f"{name}_{fn}", x, batch)
               for fn, x in _loader_operands(step).items()]
    source = "\n".join(loaders)
    # the kernels call the loaders by their short names
    short = "\n".join(f"#define {fn} {name}_{fn}" for fn in _loader_operands(step))
    undef = "\n".join(f"#undef {fn}" for fn in _loader_operands(step))
    scale = repr(float(first.attr("scale"))) if math.isfinite(first.attr("scale")) else (
        "(acc_t)NAN" if math.isnan(first.attr("scale")) else
        ("-" if first.attr("scale") < 0 else "") + "(acc_t)INFINITY")
    score = _score("cuda", e, f"(acc_t)({scale})", "mask" in ops, first.attr("causal"))
    nacc, nacce = max(1, -(-ev // 32)), max(1, -(-e // 32))

    def store(parts: list[tuple[str, tuple[Value, BufRef], int, str]],
              extra: list[str]) -> str:
        lines = list(extra)
        for acc, (x, ref), width, value in parts:
            t = r.ctype(ref.dtype)
            n_acc = max(1, -(-width // 32))
            lines.append(f"for (int a = 0; a < {n_acc}; a++) {{ const int64_t c = tid + a * nt; "
                         f"if (c < {width}) ({r.slot_expr(ref)})[{_offset(step, x, 'c')}] = "
                         f"({t})({value.format(acc=f'{acc}[a]')}); }}")
        return "\n".join("    " + ln for ln in lines)

    common = dict(ACC=acc_t, ROWS=nb * n_q, KROWS=nb * n_k, L=n_q, S=n_k, E=e, EV=ev,
                  NACC=nacc, NACCE=nacce, SCORE=score)
    kernels, launch = [], {}
    sc = f"(acc_t)({scale})"
    if step.kind == "forward":
        out, lse = step.part("out"), step.part("lse")
        extra = []
        if lse:
            t = r.ctype(lse[1].dtype)
            extra.append(f"if (tid == 0) ({r.slot_expr(lse[1])})[{_offset(step, lse[0], None)}] = "
                         f"({t})(dead ? (acc_t)0 : m + log(l));")
        parts = [("acc", out, ev, "dead ? (acc_t)0 : {acc} / l")] if out else []
        kernels.append(_CUDA_FWD.substitute(common, NAME=f"{name}_fwd",
                                            STORE=store(parts, extra)))
        launch[f"{name}_fwd"] = ("outer", nb * n_q)
    else:
        dq, dk, dv = step.part("dq"), step.part("dk"), step.part("dv")
        if dq:
            kernels.append(_CUDA_DQ.substitute(
                common, NAME=f"{name}_dq", STORE=store([("acc", dq, e, "{acc} * " + sc)], [])))
            launch[f"{name}_dq"] = ("outer", nb * n_q)
        if dk or dv:
            parts = ([("dka", dk, e, "{acc} * " + sc)] if dk else []) + \
                    ([("dva", dv, ev, "{acc}")] if dv else [])
            kernels.append(_CUDA_DKV.substitute(common, NAME=f"{name}_dkv",
                                                STORE=store(parts, [])))
            launch[f"{name}_dkv"] = ("outer", nb * n_k)
    return "\n".join([_CUDA_HELPERS, source, short, *kernels, undef]), launch
