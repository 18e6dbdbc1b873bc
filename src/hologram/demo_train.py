"""Training demo: an MLP on scikit-learn's digits, eager PyTorch beside hologram.

``python -m hologram.demo_train`` (or ``hologram demo`` with torch installed)
trains the same 64-256-256-10 classifier twice from the same initial weights on
the same batches in the same order: once in eager PyTorch and once through
``torch.compile(backend="hologram")``, where the model and its loss become one
Atlas ISA program forward and one backward, and the optimizer step (compiled too,
PyTorch's compiled-optimizer recipe) one program that updates the weights and
momentum buffers in place. It prints test accuracy and the
median step time of each, how far the two sets of weights drifted apart, and the
operation reduction ``hologram_torch.explain`` measured.

It is a demo, so it is honest about what it measures: the step time is wall
clock for zero_grad + forward + backward + optimizer step, the two runs take
turns every ten steps (so a slow phase of a shared machine falls on both), the
first hologram step (tracing and compiling) is reported separately rather than
folded into a median (the optimizer's second step compiles again, once its
momentum buffers exist: one slow step among hundreds, which a median ignores),
and no result is assumed: the accuracies are measured on held-out data. The
digits data ship with scikit-learn, so nothing is downloaded.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

DIMS = (64, 256, 256, 10)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hologram-demo-train", description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=12, help="passes over the training set")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (momentum 0.9)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--executor", default="cpu",
                   help="hologram executor backend for the compiled model (cpu, reference)")
    p.add_argument("--threads", type=int, default=1,
                   help="PyTorch intra-op threads for both runs (default 1: at these sizes "
                        "threads cost more than they save, and an idle pool spinning beside "
                        "hologram's single-threaded kernels steals their core)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    p.add_argument("--explain", action="store_true", help="print the full explain report")
    return p


def _load_data(seed: int) -> tuple[Any, Any, Any, Any]:
    """Digits (8x8 images, 1797 samples) scaled to [0, 1], split 80/20 with a fixed seed."""
    import numpy as np
    import torch
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.from_numpy((digits.data / 16.0).astype(np.float32))
    y = torch.from_numpy(digits.target.astype(np.int64))
    order = torch.from_numpy(np.random.default_rng(seed).permutation(len(x)))
    n_test = len(x) // 5
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def _make_model(seed: int) -> Any:
    import torch

    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    for i, (a, b) in enumerate(zip(DIMS[:-1], DIMS[1:], strict=True)):
        layers.append(torch.nn.Linear(a, b))
        if i < len(DIMS) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def _batches(n: int, batch: int, epochs: int, seed: int) -> list[Any]:
    """Every epoch's shuffled full batches, fixed up front so both runs see the same."""
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    out = []
    for _ in range(epochs):
        perm = torch.randperm(n, generator=g)
        out.extend(perm[i:i + batch] for i in range(0, n - batch + 1, batch))  # full only
    return out


class _Run:
    """One side of the demo: a model, its loss, its optimizer step; trained in place."""

    def __init__(self, model: Any, loss_fn: Callable[[Any, Any], Any], lr: float,
                 compile_options: dict[str, Any] | None = None) -> None:
        import torch

        self.loss_fn = loss_fn
        self.opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        self.update = (self.opt.step if compile_options is None else
                       torch.compile(self.opt.step, backend="hologram",
                                     options=compile_options))
        self.times: list[float] = []
        self.losses: list[float] = []

    def step(self, xb: Any, yb: Any) -> None:
        t0 = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss_fn(xb, yb)
        loss.backward()
        self.update()
        self.times.append(time.perf_counter() - t0)
        self.losses.append(loss.item())


#: Steps each run takes before the other takes its turn (_train_side_by_side).
BLOCK = 10


def _train_side_by_side(runs: Sequence[_Run], x: Any, y: Any, batches: list[Any],
                        progress: bool) -> None:
    """Train every run on the same batches in the same order, taking turns every
    ``BLOCK`` steps (who goes first alternates too), so both step times are measured
    over the same stretch of the machine's time: run one after the other, a slow
    phase of a shared machine (tens of percent for seconds) lands on one of them and
    the ratio shows the phase, not the engines (docs/perf.md, session 29). Each
    run's weights depend only on its own steps, so the order changes no result."""
    from tqdm import tqdm

    bar = tqdm(total=len(batches), desc="training", unit="step", disable=not progress,
               leave=True, file=sys.stderr, dynamic_ncols=True)
    for n, lo in enumerate(range(0, len(batches), BLOCK)):
        block = batches[lo:lo + BLOCK]
        for run in (runs if n % 2 == 0 else runs[::-1]):
            for idx in block:
                run.step(x[idx], y[idx])
        bar.update(len(block))
        bar.set_postfix(loss=" / ".join(f"{r.losses[-1]:.3f}" for r in runs))
    bar.close()


def _accuracy(predict: Callable[[Any], Any], x: Any, y: Any) -> float:
    import torch

    with torch.no_grad():
        return float((predict(x).argmax(1) == y).float().mean())


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; returns a process exit code (0 ok, 1 wrong result, 2 missing deps)."""
    args = _parser().parse_args(argv)
    try:
        import sklearn  # noqa: F401
        import torch
        import tqdm  # noqa: F401
    except ImportError as e:
        print(f"hologram demo-train needs PyTorch, scikit-learn and tqdm: {e}\n"
              "  pip install 'hologram[torch]'", file=sys.stderr)
        return 2
    import torch.nn.functional as F

    import hologram_torch  # noqa: F401  (registers backend="hologram")
    from hologram.interop import default_executor
    from hologram_torch.explain import explain

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    x_train, y_train, x_test, y_test = _load_data(args.seed)
    batches = _batches(len(x_train), args.batch_size, args.epochs, args.seed)
    eager_model = _make_model(args.seed)
    holo_model = copy.deepcopy(eager_model)  # the same initial weights
    ex = default_executor(args.executor)
    print(f"digits: {len(x_train)} train / {len(x_test)} test, MLP {'-'.join(map(str, DIMS))}, "
          f"{args.epochs} epochs x {len(batches) // max(args.epochs, 1)} steps of "
          f"{args.batch_size}; {torch.get_num_threads()} PyTorch thread(s) in both runs; "
          f"hologram executor: {ex.backend.describe()}")

    def eager_loss(xb: Any, yb: Any) -> Any:
        return F.cross_entropy(eager_model(xb), yb)

    def holo_loss_fn(xb: Any, yb: Any) -> Any:
        return F.cross_entropy(holo_model(xb), yb)

    options = {"executor": ex}
    holo_loss = torch.compile(holo_loss_fn, backend="hologram", options=options)
    progress = not args.no_progress

    eager_run = _Run(eager_model, eager_loss, args.lr)
    holo_run = _Run(holo_model, holo_loss, args.lr, compile_options=options)
    _train_side_by_side([eager_run, holo_run], x_train, y_train, batches, progress)
    t_eager, l_eager = eager_run.times, eager_run.losses
    t_holo, l_holo = holo_run.times, holo_run.losses

    holo_predict = torch.compile(holo_model, backend="hologram", options=options)
    acc_eager = _accuracy(eager_model, x_test, y_test)
    acc_holo = _accuracy(holo_predict, x_test, y_test)
    drift = max(float((a.detach() - b.detach()).abs().max())
                for a, b in zip(eager_model.parameters(), holo_model.parameters(), strict=True))
    med_eager = statistics.median(t_eager[1:]) * 1e3
    med_holo = statistics.median(t_holo[1:]) * 1e3

    print()
    print(f"{'':10} {'test acc':>9} {'final loss':>11} {'median step':>12} {'first step':>11}")
    print(f"{'eager':10} {100 * acc_eager:8.2f}% {l_eager[-1]:11.4f} {med_eager:9.3f} ms "
          f"{t_eager[0] * 1e3:8.1f} ms")
    print(f"{'hologram':10} {100 * acc_holo:8.2f}% {l_holo[-1]:11.4f} {med_holo:9.3f} ms "
          f"{t_holo[0] * 1e3:8.1f} ms  (first step traces and compiles)")
    ratio = med_holo / med_eager if med_eager else float("inf")
    verdict = f"{ratio:.2f}x eager's step time" if ratio >= 1 else f"{1 / ratio:.2f}x faster"
    print(f"hologram median step: {verdict}; largest weight difference after "
          f"{len(batches)} steps: {drift:.2e}")

    report = explain(holo_loss_fn, x_train[batches[0]], y_train[batches[0]], executor=ex)
    print("operation reduction (forward + backward of model and loss): "
          + report.summary_line())
    for g in report.graphs:
        for r in g.regions:
            print(f"  {g.kind}: program {r.number} holds {sum(r.aten_ops.values())} ATen ops, "
                  f"{r.launches_before} ISA ops -> {r.launches_after} launches")
        for op, why in g.torch_ops:
            print(f"  {g.kind}: {op} ran in PyTorch ({why})")
    if args.explain:
        print(report)

    # Same weights, same batches: the runs must agree (float32 rounding differs, so
    # allow a prediction or two to flip, not a different model).
    ok = abs(acc_holo - acc_eager) <= 0.02 and abs(l_holo[-1] - l_eager[-1]) <= 1e-2
    if not ok:
        print("FAIL: hologram's results differ from eager PyTorch's", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
