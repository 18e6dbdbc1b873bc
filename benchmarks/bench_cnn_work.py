"""CPU time per CNN inference call, eager against hologram, one thread each.

    PYTHONPATH=$PWD/src HOLOGRAM_NUM_THREADS=1 MKL_NUM_THREADS=1 OMP_NUM_THREADS=1 \\
        nice -n 10 .venv/bin/python benchmarks/bench_cnn_work.py --batches 1:15,8:5

Why CPU time and one thread: on a shared two-core machine the wall-clock medians of
``bench_models.py --cnn`` moved 5-50x between minutes while other test suites ran
(docs/perf.md, "Session 11, CNN"); the CPU time a call takes on one thread is the work
it does, which time slicing does not change. It does not show how well either side
uses more threads: ``bench_models.py --cnn`` on a quiet machine does. Eager and
hologram are called in turn (interleaved); medians; the ratio is eager's time over
hologram's (above 1: hologram does less work).
"""

from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import Report  # noqa: E402


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--models", default="resnet18,convnext_atto,mobilenet_v3_small")
    p.add_argument("--batches", default="1:15,8:5",
                   help="batch:samples pairs, comma-separated")
    args = p.parse_args()
    import torch
    from bench_models import build_cnn

    import hologram_torch  # noqa: F401  (registers backend="hologram")

    common.quiet_hologram()
    torch.set_num_threads(1)
    rep = Report("cnn_work", "CPU time per CNN inference call, one thread, eager vs hologram")
    grid = rep.grid("CPU ms per call (medians), one thread, 224x224",
                    ["model", "batch", "eager ms", "hologram ms", "hologram vs eager"])
    for name in filter(None, args.models.split(",")):
        model, make_inputs = build_cnn(name)
        fns = {"eager": model, "hologram": torch.compile(model, backend="hologram")}
        for pair in args.batches.split(","):
            batch, samples = (int(v) for v in pair.split(":"))
            samples = min(samples, 3) if args.quick else samples
            x = make_inputs(batch)["x"]
            times: dict[str, list[float]] = {k: [] for k in fns}
            with torch.no_grad():
                for f in fns.values():  # compile, then one untimed call each
                    f(x)
                    f(x)
                for _ in range(samples):
                    for k, f in fns.items():
                        t = time.process_time()
                        f(x)
                        times[k].append(time.process_time() - t)
            e, h = (statistics.median(times[k]) * 1e3 for k in ("eager", "hologram"))
            grid.add(name, batch, f"{e:.1f}", f"{h:.1f}", f"{e / h:.2f}x")
            rep.data[f"{name} batch {batch}"] = {k: v for k, v in times.items()}
        torch._dynamo.reset()
    rep.finish(args)


if __name__ == "__main__":
    main()
