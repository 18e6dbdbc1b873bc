"""Operation reduction of the composite ops: kernel launches if each primitive ran
on its own (launches_before) vs after canonicalization and fusion (launches_after),
from ``executor.compile(program).stats``; also compute instructions before/after
and, as a check that fewer launches are also faster, the fused program's time
against the same primitives run one launch at a time.

    .venv/bin/python benchmarks/bench_reduction.py [--json out.json]

Target: launch reduction >= 75% for each composite.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
from common import Report, measure, target  # noqa: E402

ROWS, COLS = 1024, 1024  # shapes do not change the counts; they only size the timing


def composites():
    from hologram.ops import composites as C

    m = (ROWS, COLS)
    v = (ROWS * COLS,)
    w = (COLS,)
    # name -> (fn, input shapes, is a target of the issue)
    return {
        "gelu (tanh)": (C.gelu_tanh, [v], True),
        "gelu (erf)": (C.gelu_erf, [v], False),
        "softmax": (lambda x: C.softmax(x, axis=1), [m], True),
        "log_softmax": (lambda x: C.log_softmax(x, axis=1), [m], False),
        "layer norm (w, b)": (lambda x, a, b: C.layer_norm(x, a, b, axes=(1,)), [m, w, w], True),
        "mse (mean)": (lambda p, t: C.reduce_loss(C.squared_error(p, t), "mean"), [v, v], True),
        "cross entropy (mean)": (
            lambda x, t: C.reduce_loss(C.cross_entropy_rows(x, t, axis=1), "mean"), [m, m], True),
        "binary cross entropy (mean)": (
            lambda p, t: C.reduce_loss(C.binary_cross_entropy(p, t), "mean"), [v, v], True),
        "bce with logits (mean)": (
            lambda x, t: C.reduce_loss(C.binary_cross_entropy_with_logits(x, t), "mean"),
            [v, v], False),
        "sigmoid": (C.sigmoid, [v], True),  # what ops.sigmoid runs: 1 / (1 + exp(-x))
        "relu": (C.relu, [v], False),
    }


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--no-time", action="store_true", help="counts only, no timings")
    args = p.parse_args()

    import numpy as np

    hg = common.quiet_hologram()
    from hologram.isa.builder import program as build_program

    rep = Report("reduction", "kernel launches before/after canonical compilation, per composite")
    g = rep.grid("launch reduction per composite op",
                 ["composite", "instructions before", "instructions after", "launches before",
                  "launches after", "launch cut", "fused ms", "one-by-one ms", "speedup", "target"])
    ex = hg.Executor("cpu")
    rng = np.random.default_rng(0)
    labels, cuts = [], []
    reps = 3 if args.quick else 9
    for name, (fn, shapes, is_target) in composites().items():
        specs = [("f32", s) for s in shapes]
        try:
            prog = build_program(fn, specs, name=name)
            compiled = ex.compile(prog)
            st = getattr(compiled, "stats", None)
        except Exception as e:  # noqa: BLE001
            g.add(name, "ERROR", f"{type(e).__name__}: {e}"[:80], "", "", "", "", "", "", "")
            if is_target:
                rep.check(target(f"launch cut: {name}", ">= 75%", None, lambda v: True))
            continue
        if st is None:
            from hologram.compiler.lower import compute_instructions, unfused_launches

            before_i, after_i = compute_instructions(prog), None
            before_l, after_l, cut = unfused_launches(prog), None, None
        else:
            before_i, after_i = st.instructions_before, st.instructions_after
            before_l, after_l, cut = st.launches_before, st.launches_after, st.launch_reduction
        fused_ms = one_ms = speed = "-"
        if not args.no_time and st is not None:
            ins = [rng.uniform(0.05, 0.95, s).astype(np.float32) for s in shapes]
            outs = [np.empty(s, d.np_dtype) for d, s in prog.output_specs]
            try:
                tf = measure(lambda p=prog, i=ins, o=outs: ex.launch(p, i, o), repeat=reps,
                             max_s=2)
                t1 = measure(lambda p=prog, i=ins: one_by_one(ex, p, i), repeat=reps, max_s=4)
                fused_ms, one_ms = f"{tf.median * 1e3:.2f}", f"{t1.median * 1e3:.2f}"
                speed = f"{t1.median / tf.median:.1f}x"
            except Exception as e:  # noqa: BLE001
                fused_ms = f"error: {type(e).__name__}"
        tg = None
        if is_target:
            counts = f"({before_l} -> {after_l})"
            tg = rep.check(target(f"launch cut: {name}", ">= 75%", cut, lambda v: v >= 0.75,
                                  lambda v, c=counts: f"{100 * v:.0f}% {c}"))
        g.add(name, before_i, "-" if after_i is None else after_i, before_l,
              "-" if after_l is None else after_l, "-" if cut is None else f"{100 * cut:.0f}%",
              fused_ms, one_ms, speed, tg.status if tg else "(extra)")
        if st is not None and st.rules:
            rep.note(f"{name}: rules fired: " + ", ".join(f"{k} x{v}" for k, v in
                                                         sorted(st.rules.items())))
        if cut is not None:
            labels.append(name)
            cuts.append(100 * cut)
    if labels:
        g.plot = {"labels": labels, "values": cuts, "ylabel": "launch cut (%)", "line": 75}
    if not rep.env["hologram"].get("native"):
        rep.note("the cpu backend is the reference interpreter here, which reports no stats: "
                 "'launches after' could not be measured (launches before is counted from the "
                 "traced program)")
    rep.note("one-by-one: every primitive of the traced program as its own launch through "
             "the same backend (the 'launches before' execution), for scale")
    rep.finish(args)


def one_by_one(ex, prog, ins):
    """Run the traced (uncanonicalized) program one primitive per launch."""
    plan = _PLANS.get(id(prog))
    if plan is None:
        plan = _PLANS[id(prog)] = split_program(prog)
    env = {}
    for v, sub, srcs in plan:
        args = [ins[s.attr("in")] if s.op.name == "LDG" else env[id(s)] for s in srcs]
        out = _np_empty(sub)
        ex.launch(sub, args, [out])
        env[id(v)] = out
    return env


_PLANS: dict = {}


def _np_empty(sub):
    import numpy as np

    (d, s), = sub.output_specs
    return np.empty(s, d.np_dtype)


def split_program(prog):
    """[(value, one-instruction program, source values)] for each compute instruction;
    movement ops ride along with the instruction that reads them (they are views)."""
    from hologram.isa import builder as B
    from hologram.isa.opcodes import Group, group
    from hologram.isa.program import Program

    skip = {Group.MEMORY, Group.MOVEMENT, Group.CONST}
    plan = []
    materialized: set[int] = set()
    for v in prog.instructions:
        if group(v.op) in skip:
            continue
        # inputs of this launch: nearest materialized ancestors through movement/const
        srcs: list = []

        def collect(u, srcs=srcs):
            if u.op.name == "LDG" or id(u) in materialized:
                if all(u is not s for s in srcs):
                    srcs.append(u)
                return
            for s in u.srcs:
                collect(s)

        for s in v.srcs:
            collect(s)
        mapping = {id(s): B.ldg(i, s.dtype, s.shape) for i, s in enumerate(srcs)}
        body = _rebuild(v, mapping, top=True)
        plan.append((v, Program([B.stg(body, 0)], [(s.dtype, s.shape) for s in srcs],
                                name=f"one_{v.op.name}"), srcs))
        materialized.add(id(v))
    return plan


def _rebuild(v, mapping, top=False):
    from hologram.isa.value import Value

    if id(v) in mapping and not top:
        return mapping[id(v)]
    srcs = tuple(_rebuild(s, mapping) for s in v.srcs)
    return Value(v.op, v.dtype, v.shape, srcs, v.attrs)


if __name__ == "__main__":
    main()
