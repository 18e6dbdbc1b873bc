"""What hologram's own ``expf`` and float row sums buy: hologram's softmax kernel
(4096x1024 f32 rows) compiled three ways, timed interleaved beside torch eager.

    .venv/bin/python benchmarks/bench_exp.py [--json out.json] [--rows R] [--cols C]

- ``hologram``: the kernel as hologram renders it (``hg_expf``, float row sum);
- ``+ double sum``: the same source with the row sum accumulated in double (how
  every f32 sum was rendered before session 4);
- ``+ libmvec expf``: that source again with glibc's vector ``expf`` call instead
  of ``hg_expf`` (the session-3 kernel).

Each variant runs on ordinary rows and on rows whose second half is -inf (a causal
attention mask), the input that sent libmvec to its scalar fallback. No target:
this is the evidence behind compiler/c_math.py and render_c.FLOAT_SUM_MAX.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
from common import Candidate, Report, add_interleaved, max_abs_err  # noqa: E402


def variants(source: str) -> dict[str, str]:
    """The rendered source and its two older spellings (checked to differ)."""
    prelude, kernel = source.split("void k0", 1)  # the prelude defines hg_expf itself
    double = re.sub(r"\bfloat (acc\d+) = 0;", r"double \1 = 0;", kernel)
    mvec = double.replace("hg_expf(", "expf(")
    assert double != kernel and mvec != double, "softmax kernel no longer has these parts"
    return {"hologram": source, "+ double sum": f"{prelude}void k0{double}",
            "+ double sum + libmvec expf": f"{prelude}void k0{mvec}"}


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--cols", type=int, default=1024)
    args = p.parse_args()
    import numpy as np

    hg = common.quiet_hologram()
    from hologram.isa import builder as b
    from hologram.ops import composites as HC

    R, C = args.rows, args.cols
    rep = Report("exp", f"softmax kernel variants over {R}x{C} float32 rows")
    repeat = 5 if args.quick else 25
    ex = hg.default_executor("cpu")
    if "C via" not in ex.backend.describe():
        rep.note("no C compiler: nothing to compare")
        rep.finish(args)
        return
    prog = b.program(lambda x: HC.softmax(x, -1), [("f32", (R, C))])
    source = ex.backend.compile(prog).source
    assert "(float *)B[0]" in source and "(float *)B[1]" in source  # input 0, output 1
    cc = ex.backend.cc
    kernels = {}
    for name, src in variants(source).items():
        fn = cc.compile(src, {"program": f"bench-exp-{name}"}).k0
        fn.argtypes, fn.restype = [ctypes.c_void_p], None
        kernels[name] = fn

    try:
        import torch
    except ImportError:
        torch = None
    rng = np.random.default_rng(0)
    x = rng.standard_normal((R, C), dtype=np.float32) * 4
    masked = x.copy()
    masked[:, C // 2:] = -np.inf
    for label, data in (("ordinary rows", x), ("rows half -inf", masked)):
        out = np.empty_like(data)
        table = (ctypes.c_void_p * 2)(data.ctypes.data, out.ctypes.data)
        x64 = data.astype(np.float64)
        e = np.exp(x64 - x64.max(axis=1, keepdims=True))
        ref = e / e.sum(axis=1, keepdims=True)
        fns, errs = {}, {}
        if torch is not None:
            t = torch.from_numpy(data)
            fns["torch eager"] = lambda t=t: torch.softmax(t, 1)
            errs["torch eager"] = max_abs_err(torch.softmax(t, 1).numpy(), ref)
        for name, fn in kernels.items():
            fns[name] = lambda fn=fn, table=table: fn(table)
            fn(table)
            errs[name] = max_abs_err(out, ref)
        tab = rep.table(f"softmax, {R}x{C} f32, {label}, interleaved sampling",
                        baseline="torch eager" if torch is not None else "hologram",
                        unit="ms", extra_cols=("max err",))
        add_interleaved(tab, {k: Candidate(f, extra={"max err": f"{errs[k]:.1e}"})
                              for k, f in fns.items()}, repeat=repeat)
    rep.finish(args)


if __name__ == "__main__":
    main()
