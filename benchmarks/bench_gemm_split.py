"""How the GEMM driver should split a product over its OpenMP threads, on the chosen BLAS:
row tiles, column tiles, and (MKL) column tiles over a B packed once per tile, on the
models' ``x @ W.T`` shapes. The driver's rule (compiler/blas.py) is column tiles when
``n > m`` and row tiles otherwise; packed copies are always column tiles.

    .venv/bin/python benchmarks/bench_gemm_split.py [--json out.json] [--quick]
        [--shapes 128x768x768,...] [--b-layout nt|nn]

Each variant is a C loop (compiled once with hologram's compiler) over ``omp_get_max_
threads()`` tiles, each tile one single-threaded ``?gemm`` (or ``?gemm_compute``) call of
the BLAS ``hologram info`` names; samples interleaved, medians quoted, GFLOP/s.
``--b-layout nn`` times ``x @ W`` (GPT-2's Conv1D layout) instead of ``x @ W.T``.
"""

from __future__ import annotations

import ctypes
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
from common import Report  # noqa: E402

#: (M, K, N): the models' products at batch 1 and 8 (bench_models.GEMM_SHAPES), a few
#: more row counts (8: decoding-sized batches; 2048, 4096: is packing still worth it).
SHAPES = ((8, 768, 768), (128, 768, 512), (128, 2048, 512), (128, 768, 768),
          (128, 768, 3072), (128, 3072, 768), (128, 768, 50257), (1024, 768, 768),
          (1024, 768, 3072), (1024, 3072, 768), (2048, 768, 3072), (4096, 768, 3072))

SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
#include <omp.h>
typedef void (*sg_t)(int, int, int, int64_t, int64_t, int64_t, float, const float *, int64_t,
                     const float *, int64_t, float, float *, int64_t);
typedef size_t (*psz_t)(int, int64_t, int64_t, int64_t);
typedef void (*pk_t)(int, int, int, int64_t, int64_t, int64_t, float, const float *, int64_t,
                     float *);
typedef void (*cp_t)(int, int64_t, int64_t, int64_t, int64_t, int64_t, const float *, int64_t,
                     const float *, int64_t, float, float *, int64_t);
static sg_t sg; static psz_t psz; static pk_t pk; static cp_t cp;
static int64_t M, K, N, T, TB;  /* TB: 112 B = W^T (W is N x K), 111 B = W (K x N) */
static float *x, *w, *c, *packs[64];

void bench_init(void *s, void *size, void *pack, void *compute) {
  sg = (sg_t)s; psz = (psz_t)size; pk = (pk_t)pack; cp = (cp_t)compute;
}
static int64_t ldb(void) { return TB == 112 ? K : N; }
static const float *bcols(int64_t lo) { return TB == 112 ? w + lo * K : w + lo; }

int bench_setup(int64_t m, int64_t k, int64_t n, int trans) {
  for (int i = 0; i < 64; i++) { free(packs[i]); packs[i] = 0; }
  free(x); free(w); free(c);
  M = m; K = k; N = n; TB = trans ? 112 : 111; T = omp_get_max_threads();
  if (T > 64) T = 64;
  x = aligned_alloc(64, (size_t)(M * K * 4 + 63) / 64 * 64);
  w = aligned_alloc(64, (size_t)(N * K * 4 + 63) / 64 * 64);
  c = aligned_alloc(64, (size_t)(M * N * 4 + 63) / 64 * 64);
  if (!x || !w || !c) return -1;
  for (int64_t i = 0; i < M * K; i++) x[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
  for (int64_t i = 0; i < N * K; i++) w[i] = (float)((i * 104729) % 1000) / 1000.0f - 0.5f;
  if (!pk) return 0;
  for (int64_t t = 0; t < T; t++) {
    int64_t lo = N * t / T, hi = N * (t + 1) / T;
    size_t bytes = (psz(162, M, hi - lo, K) + 63) / 64 * 64;
    packs[t] = aligned_alloc(64, bytes);
    if (!packs[t]) return -1;
    pk(101, 162, (int)TB, M, hi - lo, K, 1.0f, bcols(lo), ldb(), packs[t]);
  }
  return 0;
}

void bench_rows(void) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; t++) {
    int64_t lo = M * t / T, hi = M * (t + 1) / T;
    if (hi > lo) sg(101, 111, (int)TB, hi - lo, N, K, 1.0f, x + lo * K, K, w, ldb(), 0.0f,
                    c + lo * N, N);
  }
}
void bench_cols(void) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; t++) {
    int64_t lo = N * t / T, hi = N * (t + 1) / T;
    sg(101, 111, (int)TB, M, hi - lo, K, 1.0f, x, K, bcols(lo), ldb(), 0.0f, c + lo, N);
  }
}
void bench_packed(void) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; t++) {
    int64_t lo = N * t / T, hi = N * (t + 1) / T;
    cp(101, 111, 151, M, hi - lo, K, x, K, packs[t], ldb(), 0.0f, c + lo, N);
  }
}
"""


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--shapes", default="", help="MxKxN,... (default: the models' shapes)")
    p.add_argument("--b-layout", choices=("nt", "nn"), default="nt")
    args = p.parse_args()
    from hologram.compiler import blas
    from hologram.compiler.cc import CCompiler

    found, how = blas.provider()
    if found is None or not found.ilp64:
        raise SystemExit(f"needs an ILP64 BLAS bound by hologram; GEMM here: {how}")
    cc = CCompiler.find()
    if cc is None:
        raise SystemExit("no C compiler")
    lib = cc.compile(SOURCE, {"bench": "gemm_split"})
    lib.bench_init.argtypes = [ctypes.c_void_p] * 4
    lib.bench_setup.argtypes = [ctypes.c_int64] * 3 + [ctypes.c_int]
    pack = found.pack  # s size, s pack, s compute, ... (MKL only)
    lib.bench_init(found.sgemm, *(pack[:3] if pack else (None, None, None)))
    shapes = ([tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
              if args.shapes else SHAPES)
    rep = Report("gemm_split", f"GEMM tile splits over OpenMP threads on {how}")
    layout = "x @ W.T" if args.b_layout == "nt" else "x @ W"
    t = rep.grid(f"{layout}, GFLOP/s (interleaved medians)",
                 ["M x K x N", "row tiles", "column tiles", "packed column tiles", "driver"])
    repeat = 3 if args.quick else 9
    for m, k, n in shapes:
        if lib.bench_setup(m, k, n, int(args.b_layout == "nt")) != 0:
            raise SystemExit("out of memory")
        fns = {"rows": lib.bench_rows, "cols": lib.bench_cols}
        if pack:
            fns["packed"] = lib.bench_packed
        tm = common.measure_interleaved(fns, repeat=repeat)
        g = {name: 2 * m * k * n / v.median / 1e9 for name, v in tm.items()}
        t.add(f"{m} x {k} x {n}", f"{g['rows']:.0f}", f"{g['cols']:.0f}",
              f"{g['packed']:.0f}" if "packed" in g else "-",
              "columns" if n > m else "rows")
        rep.data.setdefault("gflops", {})[f"{m}x{k}x{n}"] = g
    lib.bench_setup(1, 1, 1, 1)  # frees the big buffers
    rep.finish(args)


if __name__ == "__main__":
    main()
