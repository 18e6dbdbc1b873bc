"""Run the OpInfo sweep (``tests/opinfo_sweep.py``) over every float32 CPU op and write
its summary (``docs/opinfo.md`` by default); ``--dtype bfloat16`` (or ``float16``) runs
the ops that support that dtype on its samples instead (``docs/opinfo_bf16.md``).

    .venv/bin/python tools/opinfo_sweep.py --samples 20 --workers 2 \\
        --out docs/opinfo.md --json opinfo.json

Each sample runs in a worker subprocess, so a crash is a failed sample, not a dead run;
``--ops`` picks ops by name (OpInfo's ``name`` or ``name.variant``), ``--log`` appends
one JSON line per sample as it finishes (to watch a long run), ``--from-json`` writes
the summary of a saved run again (after the summary's format changed) without running.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

import opinfo_sweep as sweep  # noqa: E402

HEADER = """# The OpInfo sweep

Every OpInfo in PyTorch's `op_db` that supports {dtype} on the CPU, each of its first
samples compiled with `torch.compile(backend="hologram", dynamic=False)` and compared
with eager, forward and backward (see `tests/opinfo_sweep.py` for what is compared and
how a route is decided; `tests/test_opinfo.py` runs a fixed subset in CI). Targets
(issue 17): >= 99.5% of samples match (any remaining mismatch also fails under
`backend="aot_eager"`), 0 crashes, >= 60% of samples wholly inside hologram.

How a sample's route is decided. The compiled function is called twice (the first
call compiles: tracing runs ops that are not the sample's); the second is compared and
profiled (`torch.autograd.profiler`), every run of a hologram graph marked. A sample is
*wholly in hologram* when at least one hologram program ran and PyTorch computed
nothing: no node of any graph ran in PyTorch, and no ATen op that does work ran
outside the graphs (views, allocations and `item()` do no work). That holds however
many graphs dynamo made: a sample that graph-breaks into several graphs, all of them
programs, with only an `item()` between them, is wholly in hologram. An op run
between graphs (a graph break on `nonzero`, a function dynamo skipped, a graph whose
compilation failed and ran eagerly) makes the sample *partly* in hologram, or *wholly
in PyTorch* when no program ran at all; the table below names such ops "ran in eager
PyTorch outside the compiled graphs". The backward counts the same way, inside the
autograd nodes the forward call created (not those of OpInfo's
`output_process_fn_grad`, the harness's own, and not a compiled graph's wrapper
glue). A sample with no compute anywhere is *no compute*. A view output that AOT
autograd rebuilds outside the graph differentiates through eager autograd (the
backward of `unfold`, `narrow`, `diagonal`, `expand`): PyTorch's work, so such samples
are wholly in PyTorch.

"""


def header(dtype: str) -> str:
    """The summary's opening: what was swept (``dtype``) and how routes are decided."""
    return HEADER.replace("{dtype}", dtype)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=20, help="samples per op (default 20)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per sample")
    p.add_argument("--ops", nargs="*", help="only these ops (default: all)")
    p.add_argument("--out", help="markdown summary ('-' for stdout; default docs/opinfo.md, "
                   "docs/opinfo_<dtype>.md for another dtype)")
    p.add_argument("--json", help="also write every sample's result here")
    p.add_argument("--log", help="append each result as a JSON line while running")
    p.add_argument("--no-backward", action="store_true", help="compare forward only")
    p.add_argument("--dtype", default="float32", choices=sorted(sweep.DTYPE_TOL),
                   help="the samples' dtype (default float32, the sweep of record)")
    p.add_argument("--from-json", help="summarize this saved run (from --json) instead")
    args = p.parse_args(argv)
    if args.out is None:
        name = "opinfo.md" if args.dtype == "float32" else f"opinfo_{args.dtype}.md"
        args.out = os.path.join(ROOT, "docs", name)
    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        results = [sweep.SampleResult(**r) for r in saved["results"]]
        _write(args.out, header(saved.get("dtype", "float32"))
               + sweep.summary_markdown(results, saved["command"], saved["seconds"]))
        return 0

    ops = sweep.opinfos(args.dtype)
    keys = args.ops or sorted(ops)
    unknown = [k for k in keys if k not in ops]
    if unknown:
        p.error(f"unknown ops (not {args.dtype} CPU OpInfos): {unknown}")
    counts = sweep.sample_counts(keys, args.samples, args.dtype)
    tasks = sweep.tasks_for(counts, args.samples)
    print(f"{len(keys)} ops, {len(tasks)} samples, {args.workers} workers", file=sys.stderr)
    log = open(args.log, "a") if args.log else None  # noqa: SIM115
    done = 0
    t0 = time.perf_counter()

    def on_result(r: sweep.SampleResult) -> None:
        nonlocal done
        done += 1
        if log is not None:
            log.write(r.to_json() + "\n")
            log.flush()
        if r.status in ("mismatch", "error", "crash") or done % 200 == 0:
            print(f"[{done}/{len(tasks)} {time.perf_counter() - t0:.0f}s] {r.op}#{r.index} "
                  f"{r.status} {r.detail[:160]}", file=sys.stderr)

    pool = sweep.Pool(args.workers, args.timeout, backward=not args.no_backward,
                      dtype=args.dtype)
    results = pool.run(tasks, on_result)
    seconds = time.perf_counter() - t0
    if log is not None:
        log.close()
    command = "python tools/opinfo_sweep.py " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    _write(args.out, header(args.dtype) + sweep.summary_markdown(results, command, seconds))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": command, "seconds": seconds, "dtype": args.dtype,
                       "results": [r.__dict__ for r in results]}, f, indent=0)
    t = sweep.totals(results)
    print(f"samples {t.samples}: " + ", ".join(f"{k} {v}" for k, v in t.status.items())
          + "; routes " + ", ".join(f"{k} {v}" for k, v in t.route.items()), file=sys.stderr)
    return 0


def _write(path: str, text: str) -> None:
    if path == "-":
        sys.stdout.write(text)
    else:
        with open(path, "w") as f:
            f.write(text)


if __name__ == "__main__":
    raise SystemExit(main())
