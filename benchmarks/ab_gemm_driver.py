"""A/B of the GEMM driver's compile-time constants, variants side by side in one process.

    .venv/bin/python benchmarks/ab_gemm_driver.py \\
        --variant base --variant 'HG_TWO_ROUNDS_FLOPS=1e30;HG_CALL_COLS=1000000' \\
        --shapes 1024x768x32000t,128x768x32000t,640x160x1568

Why a kept tool: the driver's cut (``compiler/blas.py``: two rounds of tiles, BLAS calls
of at most ``HG_CALL_COLS`` columns, the tall-product rule) is C compiled once per
process, so ``ab_lowering.py`` cannot switch it, and on this project's shared machines
two processes measure the machine more than the change. Here each variant is the
driver's source with some ``#define`` values replaced, compiled under its own cache key
and bound to the same BLAS, and the variants' calls alternate on the same operands.

A shape is ``MxKxN`` (C = A @ B) with a trailing ``t`` for ``A @ B.T`` (B stored N x K, as
``x @ W.T``). Prints each variant's median in ms and its time over the first variant's,
per shape; ``--json`` writes the samples. Only float32, one product (no batch).
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import os
import re
import statistics
import sys
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from profile_steps import _median_ms as median_ms  # noqa: E402  (one call, then a median)


def parse_variant(text: str) -> dict[str, str]:
    """``'NAME=V;NAME2=V2'`` -> {NAME: V, ...}; ``base`` (or empty) -> {}."""
    if text.strip() in ("", "base"):
        return {}
    out = {}
    for part in text.split(";"):
        name, sep, value = part.partition("=")
        if not sep or not re.fullmatch(r"HG_\w+", name.strip()) or not value.strip():
            raise SystemExit(f"--variant: expected 'HG_NAME=value[;...]' or 'base', got {text!r}")
        out[name.strip()] = value.strip()
    return out


def parse_shape(text: str) -> tuple[int, int, int, bool]:
    """``'1024x768x32000t'`` -> (M, K, N, B transposed)."""
    m = re.fullmatch(r"(\d+)x(\d+)x(\d+)(t?)", text.strip())
    if m is None:
        raise SystemExit(f"--shapes: expected MxKxN or MxKxNt, got {text!r}")
    return int(m[1]), int(m[2]), int(m[3]), bool(m[4])


def build(defines: dict[str, str], tag: int) -> Any:
    """The driver compiled with ``defines`` replacing its ``#define`` values, initialised."""
    import hologram
    from hologram.compiler import blas

    found, _ = blas.provider()
    if found is None:
        raise SystemExit("no BLAS: the GEMM driver is not used on this machine")
    src = blas.runtime_source()
    for name, value in defines.items():
        src, n = re.subn(rf"#define {name} \S+", f"#define {name} {value}", src)
        if n == 0:
            raise SystemExit(f"--variant: the driver has no '#define {name}'")
    cc = hologram.default_executor("cpu").backend.cc
    lib = blas.bind_runtime(cc.compile(src, {"runtime": f"gemm-ab-{tag}",
                                             "defines": repr(sorted(defines.items()))}), found)
    lib.hg_gemm.argtypes = [ctypes.c_void_p] * 7
    lib.hg_gemm.restype = None
    return lib


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variant", action="append", required=True,
                   help="'base' or 'HG_NAME=value[;HG_NAME=value]'; give two or more")
    p.add_argument("--shapes", required=True, help="comma-separated MxKxN[t]")
    p.add_argument("--rounds", type=int, default=4, help="alternations per shape")
    p.add_argument("--repeat", type=int, default=0,
                   help="calls per timing (default: by size, 3-30)")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args()
    if len(args.variant) < 2:
        raise SystemExit("--variant: give at least two")

    from hologram.compiler import blas

    variants = [parse_variant(v) for v in args.variant]
    libs = [build(v, i) for i, v in enumerate(variants)]
    rng = np.random.default_rng(0)
    results: dict[str, Any] = {}
    print(f"GEMM driver variants ({args.rounds} alternations, median ms; time over the first)")
    for text in args.shapes.split(","):
        m, k, n, tb = parse_shape(text)
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((n, k) if tb else (k, n), dtype=np.float32)
        c = np.empty((m, n), np.float32)
        d = blas.DescStruct()
        d.nb, d.m, d.n, d.k = 1, m, n, k
        d.lda, d.ldb, d.ldc = k, k if tb else n, n
        d.ta, d.tb, d.f64, d.nbd = 0, int(tb), 0, 0
        repeat = args.repeat or max(3, min(30, int(3e9 / max(1, 2 * m * n * k))))
        want = a.astype(np.float64) @ (b.T if tb else b).astype(np.float64)
        scale = max(1.0, float(np.abs(want).max()))
        samples: list[list[float]] = [[] for _ in libs]
        for r in range(args.rounds):
            order = range(len(libs)) if r % 2 == 0 else reversed(range(len(libs)))
            for i in order:
                lib = libs[i]
                c.fill(np.nan)  # a block no call writes shows
                call = functools.partial(lib.hg_gemm, ctypes.byref(d), a.ctypes.data,
                                         b.ctypes.data, c.ctypes.data, None, None, None)
                samples[i].append(median_ms(call, repeat))
                if r == 0 and not float(np.abs(c - want).max()) <= 1e-4 * scale:
                    raise SystemExit(f"{text}: variant {args.variant[i]!r} computes a "
                                     "wrong product")
        base = statistics.median(samples[0])
        cells = [f"{statistics.median(s):9.2f} ({statistics.median(s) / base:.3f})"
                 for s in samples]
        print(f"  {text:>18}: " + "  ".join(f"[{v}] {c_}" for v, c_ in
                                             zip(args.variant, cells, strict=True)))
        results[text] = samples
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"variants": args.variant, "ms": results}, f)


if __name__ == "__main__":
    main()
