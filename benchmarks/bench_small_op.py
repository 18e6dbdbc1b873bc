"""Per-call cost of a tiny op: ``hg.ops.vector_add(ex, a, b, c)`` on 1,024 float32
(program cached, same buffers each call) vs ``torch.add(a, b, out=c)`` and
``np.add(a, b, out=c)``; plus a breakdown of where hologram's time goes.

    .venv/bin/python benchmarks/bench_small_op.py [--json out.json] [--n 1024]

Targets: vector_add <= 1.5 us per call, and faster than torch eager.
"""

from __future__ import annotations

import ctypes
import functools
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
from common import Report, guarded, measure, target  # noqa: E402

REPEAT = 15


def ctypes_floor() -> tuple[Callable[[], None], str] | None:
    """A ctypes call of an empty C function taking one pointer: the floor of any
    Python -> native call through ctypes (what hologram's kernels are called by)."""
    d = tempfile.mkdtemp(prefix="bench-noop-")
    src, lib = os.path.join(d, "noop.c"), os.path.join(d, "noop.so")
    with open(src, "w") as f:
        f.write("void noop(void **table) { (void)table; }\n")
    cc = os.environ.get("CC", "cc")
    try:
        subprocess.run([cc, "-O2", "-shared", "-fPIC", src, "-o", lib], check=True,
                       capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    fn = ctypes.CDLL(lib).noop  # no argtypes: a ctypes array passes as a pointer
    table = (ctypes.c_void_p * 4)()
    return functools.partial(fn, table), "functools.partial(empty C function, table)"


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1024)
    args = p.parse_args()

    import numpy as np

    n = args.n
    rep = Report("small_op", f"vector_add on {n:,} float32, per-call cost")
    repeat = 7 if args.quick else REPEAT
    t = rep.table(f"vector_add, {n:,} f32, same buffers every call", baseline="torch eager",
                  unit="us")
    rng = np.random.default_rng(0)
    xa = rng.standard_normal(n, dtype=np.float32)
    xb = rng.standard_normal(n, dtype=np.float32)

    def timed(fn):
        return measure(fn, repeat=repeat, warmup=200, inner=None, sample_s=0.05)

    try:
        import torch

        ta, tb, tc = torch.from_numpy(xa.copy()), torch.from_numpy(xb.copy()), torch.empty(n)
        guarded(t, "torch eager", lambda: timed(lambda: torch.add(ta, tb, out=tc)),
                note="torch.add(a, b, out=c)")
    except ImportError:
        t.add("torch eager", None, error="torch not installed")

    na, nb, nc = xa.copy(), xb.copy(), np.empty(n, np.float32)
    guarded(t, "numpy", lambda: timed(lambda: np.add(na, nb, out=nc)),
            note="np.add(a, b, out=c)")

    hg = common.quiet_hologram()
    vector_add = hg.ops.vector_add
    ex = None
    try:
        ex = hg.Executor("cpu")
        a, b, c = ex.allocate(n), ex.allocate(n), ex.allocate(n)
        a.from_numpy(xa)
        b.from_numpy(xb)
        vector_add(ex, a, b, c)
        ok = np.array_equal(c.to_numpy(), xa + xb)
        guarded(t, "hologram vector_add", lambda: timed(lambda: vector_add(ex, a, b, c)),
                note="hg.ops.vector_add(ex, a, b, c), cached program"
                + ("" if ok else "; WRONG RESULT"))
        try:
            st = ex.compile(next(iter(hg.ops._run._PROGRAMS.values()))).stats
            rep.note(f"vector_add program: {st}")
        except Exception:  # noqa: BLE001
            pass
    except Exception as e:  # noqa: BLE001
        t.add("hologram vector_add", None, error=f"{type(e).__name__}: {e}")
        ex = None

    # --- where hologram's time goes (internal entry points; diagnostic only). Each row
    # is one layer of the call path, timed alone; the differences attribute the cost.
    bd = rep.table("hologram vector_add: per-call breakdown (layers of the call path)",
                   baseline=None, unit="us")
    if ex is not None:
        bound = ex._bound
        key = ("vector_add", (), None, id(a), id(b), id(c))
        entry = bound.get(key)

        def checks():  # what the op's inlined fast path does before calling the kernel
            refs, _call = bound[("vector_add", (), None, id(a), id(b), id(c))]
            return (refs[0]() is a and refs[1]() is b and refs[2]() is c
                    and not (a._freed or b._freed or c._freed))

        guarded(bd, "vector_add (public call)", lambda: timed(lambda: vector_add(ex, a, b, c)),
                note="everything the user pays")
        if entry is not None:
            call = entry[1]
            guarded(bd, "fast-path checks", lambda: timed(checks),
                    note="key tuple, bound-launch dict lookup, weakref and liveness checks "
                    "(a copy of the op's inlined fast path, without the call)")
            guarded(bd, "bound call()", lambda: timed(call),
                    note=f"the launch the backend bound ({type(call).__name__}): "
                    "native kernel with a prebuilt pointer table")
        else:
            bd.add("bound call()", None,
                   error="no bound launch under the expected key (the op's fast path changed?)")
        floor = ctypes_floor()
        if floor is not None:
            guarded(bd, "ctypes floor", lambda: timed(floor[0]), note=floor[1])
        guarded(bd, "python no-op call", lambda: timed(lambda: None),
                note="calling a lambda (loop overhead, included in every row)")
        m = {r.name: r.timing.median for r in bd.rows if r.timing is not None}
        if {"vector_add (public call)", "bound call()"} <= m.keys():
            parts = {"Python op wrapper (call, key, checks)":
                     m["vector_add (public call)"] - m["bound call()"]}
            if "ctypes floor" in m:
                parts["bound call over an empty ctypes call (kernel work)"] = (
                    m["bound call()"] - m["ctypes floor"])
                parts["ctypes call of an empty C function"] = m["ctypes floor"]
            rep.data["breakdown_us"] = {k: v * 1e6 for k, v in parts.items()}
            rep.note("breakdown (us per call): " + ", ".join(
                f"{k} {v * 1e6:.3f}" for k, v in parts.items()))

    h = "hologram vector_add"
    rep.check(target("vector_add per call", "<= 1.5 us", t.median(h), lambda v: v <= 1.5e-6,
                     lambda v: f"{v * 1e6:.2f} us"), t, h)
    rep.check(target("vector_add vs torch eager", "below torch eager", t.ratio(h),
                     lambda v: v > 1,
                     lambda v: f"{v:.2f}x faster" if v >= 1 else f"{1 / v:.2f}x slower"), t, h)
    rep.finish(args)


if __name__ == "__main__":
    main()
