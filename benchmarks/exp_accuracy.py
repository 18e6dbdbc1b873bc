"""Accuracy of hologram's ``hg_expf`` beside glibc's vector ``expf`` (libmvec): the
largest error over every float32 in a range, in units of float32 spacing of the exact
(float64) result. Not a speed benchmark; the figures behind compiler/c_math.py.

    .venv/bin/python benchmarks/exp_accuracy.py [--lo -104] [--hi 89] [--step 1]

``--step N`` takes every N-th float32 (the default, 1, is exhaustive: ~2.1e9 values,
about 3 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import ctypes

import numpy as np

KERNELS = {"hg_expf": "hg_expf(x[i])", "libmvec expf": "expf(x[i])"}
CHUNK = 1 << 26


def build() -> dict[str, object]:
    from hologram.compiler.cc import C_PRELUDE, CCompiler

    cc = CCompiler.find()
    if cc is None:
        raise SystemExit("no C compiler: nothing to measure")
    src = [C_PRELUDE]
    for i, expr in enumerate(KERNELS.values()):
        src.append(f"void k{i}(const float *restrict x, float *restrict y, int64_t n) {{\n"
                   "#pragma omp parallel for simd schedule(static)\n"
                   f"  for (int64_t i = 0; i < n; i++) y[i] = {expr};\n}}")
    lib = cc.compile("\n".join(src) + "\n", {"program": "exp-accuracy"})
    fns = {}
    for i, name in enumerate(KERNELS):
        fn = getattr(lib, f"k{i}")
        fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64], None
        fns[name] = fn
    return fns


def worst_units(y: np.ndarray, x: np.ndarray) -> float:
    ref = np.exp(x.astype(np.float64))
    with np.errstate(over="ignore"):
        r32 = ref.astype(np.float32)
    fin = np.isfinite(r32)
    if not np.array_equal(np.isinf(y), ~fin):
        raise AssertionError("overflow to inf differs from the float64 reference")
    spacing = np.maximum(np.spacing(np.abs(r32[fin])).astype(np.float64), 2.0 ** -149)
    return float((np.abs(y[fin].astype(np.float64) - ref[fin]) / spacing).max(initial=0.0))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lo", type=float, default=-104.0)
    p.add_argument("--hi", type=float, default=89.0)
    p.add_argument("--step", type=int, default=1)
    args = p.parse_args()
    fns = build()
    worst = dict.fromkeys(fns, 0.0)
    count = 0
    for sign, edge in ((-1, -args.lo), (1, args.hi)):
        bits = np.float32(edge).view(np.uint32)
        for start in range(0, int(bits) + 1, CHUNK * args.step):
            stop = min(int(bits) + 1, start + CHUNK * args.step)
            x = np.arange(start, stop, args.step, dtype=np.uint32).view(np.float32) * sign
            count += x.size
            for name, fn in fns.items():
                y = np.empty_like(x)
                fn(x.ctypes.data, y.ctypes.data, x.size)
                worst[name] = max(worst[name], worst_units(y, x))
    print(f"{count:,} float32 values in [{args.lo}, {args.hi}] (every {args.step})")
    for name, w in worst.items():
        print(f"  {name:14s} max error {w:.2f} units of float32 spacing")


if __name__ == "__main__":
    main()
