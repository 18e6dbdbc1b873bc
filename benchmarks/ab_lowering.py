"""A/B of a compile-time setting on a whole model, both settings in one process.

    .venv/bin/python benchmarks/ab_lowering.py --model convnext_atto --batch 8 \\
        --setting hologram_torch.lowering.convolution:FLAT_MAX_WIDTH --values 0,28
    .venv/bin/python benchmarks/ab_lowering.py --model resnet18 --batch 8 --train 112 \\
        --setting hologram_torch.lowering.convolution:INPUT_GRAD_WINOGRAD --values False,True

Why a kept tool: on this project's shared 2-core machines a model's median moves 20-60%
between processes, so comparing two versions in two processes (or two git worktrees)
measures the machine. Here the model is compiled once per value with
``torch.compile(backend=...)``, each compile through its own backend callable that sets
the setting while hologram lowers and schedules the graph (dynamo keeps one compiled
entry per backend, so each copy keeps its own programs), and the copies' calls are
interleaved (the order alternates per round, with a short settle before each call).
Only settings read while compiling count (lowering, canonical rules, the scheduler,
the renderers); a setting read at run time would be the same for both copies.
``--driver-layouts MASKS`` A/Bs a run-time choice instead: which operand layouts the
GEMM driver sends to the second BLAS library (``compiler/blas.py``'s
``hg_gemm_second``; a bit mask ``1 << (2 ta + tb)`` per value, 0: every product on
the first library), switched before each call of one compiled copy.
``--driver-define NAME=A,B`` A/Bs one of the GEMM driver's ``#define`` values the same way:
each value's driver is compiled apart (``ab_gemm_driver.build``), and every loaded
program is bound to it (``hg_bind_gemm``) before each call.
``--train SIZE`` times a CNN's training step instead (forward, cross-entropy, backward,
SGD with momentum, as ``bench_models.py --cnn`` does), each value on its own copy of
the model and optimizer.

Prints each value's median and IQR in ms and its time over the first value's; the
copies' outputs must agree with eager (largest relative difference shown). ``--json``
writes the samples. Models: those of ``bench_models.py`` (``--cnn`` names included).
"""

from __future__ import annotations

import argparse
import ast
import copy
import ctypes
import importlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SETTLE_S = 0.03  # idle before each call: the other copy's threads stop spinning


def _target(spec: str) -> tuple[Any, str]:
    """``package.module:NAME`` -> (the module, NAME), checked to exist."""
    mod_name, sep, attr = spec.partition(":")
    if not sep or not attr:
        raise SystemExit(f"--setting: expected 'package.module:NAME', got {spec!r}")
    mod = importlib.import_module(mod_name)
    if not hasattr(mod, attr):
        raise SystemExit(f"--setting: {mod_name} has no attribute {attr!r}")
    return mod, attr


def _value(text: str) -> Any:
    """A Python literal (``28``, ``1.5``, ``True``, ``'x'``), else the text itself."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def backend_with(mod: Any, attr: str, value: Any) -> Callable[..., Any]:
    """hologram's backend, with ``mod.attr = value`` while it compiles a graph, on an
    executor of its own: an executor compiles each program content once, so a setting
    read while a program is lowered (the scheduler, the renderers) would otherwise get
    the other value's build of the same program."""
    import hologram
    from hologram_torch.compile_backend import hologram_backend

    ex = hologram.Executor("cpu")

    def backend(gm: Any, example_inputs: Any, **kw: Any) -> Any:
        old = getattr(mod, attr)
        setattr(mod, attr, value)
        try:
            return hologram_backend(gm, example_inputs, options={"executor": ex})
        finally:
            setattr(mod, attr, old)

    return backend


def _no_grad_call(m: Any, kw: dict[str, Any]) -> Callable[[], Any]:
    import torch

    def call() -> Any:
        with torch.no_grad():
            return m(**kw)
    return call


def _training_calls(bm: Any, name: str, model: Any, batch: int, size: int, mod: Any,
                    attr: str, values: list[Any]) -> tuple[list[Callable[[], Any]],
                                                            list[float]]:
    """A CNN's training step per value (``bench_models.cnn_training_table``'s: forward
    in training mode, cross-entropy, backward, SGD with momentum), each on its own copy
    of the model, and each first step's loss against eager's (relative). The setting
    holds through each copy's first step: AOT autograd may compile the backward only
    when the first backward runs, outside the backend call."""
    import torch

    if size < 1:
        raise SystemExit(f"--train: a positive size, not {size}")
    x, y = bm.cnn_training_data(name, batch, size)

    def make(m: Any, backend: Any) -> Callable[[], Any]:
        f = torch.compile(m, backend=backend) if backend is not None else m
        return bm.cnn_training_step(m, f, x, y)

    want = make(copy.deepcopy(model), None)().item()
    calls, errs = [], []
    for v in values:
        step = make(copy.deepcopy(model), backend_with(mod, attr, v))
        old = getattr(mod, attr)
        setattr(mod, attr, v)
        try:
            errs.append(abs(step().item() - want) / abs(want))
        finally:
            setattr(mod, attr, old)
        calls.append(step)
    return calls, errs


class _DriverLayouts:
    """The GEMM driver's layout mask as an attribute (``value``): setting it rebinds the
    second library (the one ``blas.provider()`` did not choose) for those layouts."""

    def __init__(self) -> None:
        import hologram
        from hologram.compiler import blas

        main_blas, _ = blas.provider()
        if main_blas is None:
            raise SystemExit("--driver-layouts: no BLAS, GEMMs run np.matmul here")
        other = blas.PROVIDERS["openblas" if main_blas.name == "mkl" else "mkl"]()[0]
        if other is None:
            raise SystemExit("--driver-layouts: only one BLAS library is usable here")
        cc = hologram.default_executor("cpu").backend.cc
        self._lib = blas._runtime_lib(cc)
        blas.bind_layouts(cc)
        self._other = other
        self._mask = blas.second_provider()[1]

    @property
    def value(self) -> int:
        return self._mask

    @value.setter
    def value(self, mask: int) -> None:
        from hologram.compiler import blas

        blas.bind_second(self._lib, self._other, mask)
        self._mask = mask


class _DriverDefine:
    """A GEMM driver ``#define`` as an attribute (``value``): each value's driver built
    apart, bound like the real one (second library included); setting ``value`` binds
    every loaded program to that value's driver."""

    def __init__(self, name: str, values: list[str]) -> None:
        from ab_gemm_driver import build

        from hologram.compiler import blas

        self._drivers = {}
        for i, v in enumerate(values):
            lib = build({name: v}, 100 + i)
            blas.bind_runtime(lib, blas.provider()[0], *blas.second_provider())
            self._drivers[v] = ctypes.cast(lib.hg_gemm, ctypes.c_void_p).value
        self._value = values[0]

    @property
    def value(self) -> str:
        return self._value

    @value.setter
    def value(self, value: str) -> None:
        from hologram.compiler import cc

        for lib in list(cc._LOADED.values()):
            bind = getattr(lib, "hg_bind_gemm", None)
            if bind is not None:
                bind.argtypes = [ctypes.c_void_p]
                bind(self._drivers[value])
        self._value = value


def _runtime_calls(bm: Any, args: Any, model: Any, inputs: Any, mod: Any,
                   values: list[Any]) -> tuple[list[Callable[[], Any]], list[float]]:
    """One compiled copy (inference, or a CNN's training step with ``--train``), called
    with ``mod.value`` set to each value first; errors against eager per value (training:
    the first step's loss, under the first value only)."""
    import torch

    if args.train is not None:
        x, y = bm.cnn_training_data(args.model, args.batch, args.train)
        eager = copy.deepcopy(model)
        want = bm.cnn_training_step(eager, eager, x, y)().item()
        m = copy.deepcopy(model)
        inner = bm.cnn_training_step(m, torch.compile(m, backend="hologram"), x, y)

        def result() -> float:
            return abs(inner().item() - want) / abs(want)
    else:
        kw = inputs(args.batch)
        compiled = torch.compile(copy.deepcopy(model), backend="hologram")
        inner = _no_grad_call(compiled, kw)
        with torch.no_grad():
            want_out = bm.main_output(model(**kw))

        def result() -> float:
            return bm.rel_err(bm.main_output(inner()), want_out)

    def with_value(v: Any) -> Callable[[], Any]:
        def call() -> Any:
            mod.value = v
            return inner()
        return call

    errs = []
    for v in values:
        mod.value = v
        errs.append(result())
        if args.train is not None:  # later steps start from updated weights: not compared
            errs.extend([float("nan")] * (len(values) - 1))
            break
    return [with_value(v) for v in values], errs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="convnext_atto")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--setting", metavar="MODULE:NAME")
    p.add_argument("--values", help="comma-separated Python literals")
    p.add_argument("--driver-layouts", metavar="MASKS",
                   help="comma-separated layout masks for the second BLAS (run time)")
    p.add_argument("--driver-define", metavar="HG_NAME=A,B",
                   help="a GEMM driver #define and its values (run time)")
    p.add_argument("--samples", type=int, default=30)
    p.add_argument("--train", type=int, metavar="SIZE",
                   help="time a CNN's training step at SIZE x SIZE instead of inference")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args()

    import bench_models as bm
    import torch

    if args.driver_layouts:
        mod, attr, values = _DriverLayouts(), "value", [
            int(v, 0) for v in args.driver_layouts.split(",")]
        args.setting = "GEMM driver layout mask (run time)"
    elif args.driver_define:
        name, _, text = args.driver_define.partition("=")
        values = [v.strip() for v in text.split(",")]
        mod, attr = _DriverDefine(name.strip(), values), "value"
        args.setting = f"GEMM driver #define {name.strip()} (run time)"
    elif args.setting and args.values:
        mod, attr = _target(args.setting)
        values = [_value(v) for v in args.values.split(",")]
    else:
        raise SystemExit("give --setting and --values, or --driver-layouts")
    if len(values) < 2:
        raise SystemExit("--values: give at least two")
    model, inputs = bm.build(args.model)  # CNN names included
    if args.driver_layouts or args.driver_define:
        calls, errs = _runtime_calls(bm, args, model, inputs, mod, values)
    elif args.train is not None:
        if args.model not in bm.CNNS:
            raise SystemExit(f"--train: a CNN ({', '.join(bm.CNNS)}), not {args.model!r}")
        calls, errs = _training_calls(bm, args.model, model, args.batch, args.train, mod,
                                      attr, values)
    else:
        kw = inputs(args.batch)
        copies = [torch.compile(copy.deepcopy(model), backend=backend_with(mod, attr, v))
                  for v in values]
        with torch.no_grad():
            want = bm.main_output(model(**kw))
            errs = [bm.rel_err(bm.main_output(m(**kw)), want) for m in copies]
        calls = [_no_grad_call(m, kw) for m in copies]
    times: list[list[float]] = [[] for _ in values]
    for _ in range(2):
        for call in calls:
            call()
    for r in range(args.samples):
        order = range(len(calls)) if r % 2 == 0 else reversed(range(len(calls)))
        for i in order:
            time.sleep(SETTLE_S)
            t = time.perf_counter()
            calls[i]()
            times[i].append(time.perf_counter() - t)
    base = statistics.median(times[0])
    what = f"training step at {args.train}x{args.train}" if args.train else "inference"
    print(f"{args.model}, batch {args.batch}, {what}: {args.setting} (medians of "
          f"{args.samples}, calls interleaved)")
    for v, ts, err in zip(values, times, errs, strict=True):
        q = statistics.quantiles(ts, n=4)
        print(f"  {v!r:>12}: {statistics.median(ts) * 1e3:9.2f} ms  IQR "
              f"{(q[2] - q[0]) * 1e3:7.2f}  time over the first {statistics.median(ts) / base:.3f}"
              f"  rel err {err:.1e}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"model": args.model, "batch": args.batch, "setting": args.setting,
                       "values": [repr(v) for v in values], "seconds": times,
                       "rel_err": errs}, f)


if __name__ == "__main__":
    main()
