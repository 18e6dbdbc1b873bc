"""Where a compiled model's time goes: each C step of each CPU program, timed alone.

    .venv/bin/python benchmarks/profile_steps.py --model convnext_atto --batch 8 [--top 25]
    HOLOGRAM_NUM_THREADS=1 .venv/bin/python benchmarks/profile_steps.py --model resnet18

Models: the CNNs of ``bench_models.py --cnn`` (resnet18, mobilenet_v3_small,
convnext_atto) and its transformers (gpt2, bert, llama, t5, vit), inference under
``torch.no_grad()``; with ``--train SIZE``, a CNN's training step instead (forward in
training mode at SIZE x SIZE, cross-entropy, backward, SGD with momentum), as
``bench_models.py --cnn`` times it: its forward and backward programs are profiled.
The model is compiled with ``backend="hologram"`` and called once; every program
launch through the CPU backend's pointer launcher is recorded (its compiled program
and its pointer table). Then each step that ``hg_run`` calls (``k<i>``
kernels, ``g<i>`` GEMM steps with their fused epilogues, attention steps) is called
alone on that table, ``--repeat`` times, and its median kept. Steps run alone start
with warmer caches than inside the whole call, so the sum is a little below a call's
time; the ranking is what this is for.

Each row names the step, its program, its median in ms alone, its share of the sum,
its median inside the program (the steps called in order, a clock around each), and
what it computes: the instructions it stores (opcode and shape) from the schedule.
Why a kept tool: sessions 11-13 each wrote a scratch profiler like it to find the
steps worth rewriting (docs/perf.md).
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import os
import re
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _record_launches() -> list[tuple[Any, list[Any], list[Any]]]:
    """Wrap the CPU backend's pointer launcher so each program's first launch records
    (compiled program, its operands, packed copies of B); the list fills as the model
    runs. The operands are copies the profile owns (the inputs' contents as they were,
    fresh outputs): the launch's own tensors may be freed by the time steps are timed,
    and a kernel writing through a stale address corrupts the heap."""
    import numpy as np

    import hologram
    from hologram.backends import cpu
    from hologram.memory.address import data_pointer

    seen: list[tuple[Any, list[Any], list[Any]]] = []
    ids: set[int] = set()
    original = cpu.CPUBackend.pointer_launcher

    def owned(compiled: Any, pointers: Any, packed: Any) -> tuple[list[Any], list[Any]]:
        arrays = []
        for (dt, shape), address in zip(compiled.program.inputs, pointers, strict=False):
            a = np.empty(shape, dt.np_dtype)
            if a.nbytes:
                ctypes.memmove(data_pointer(a), address, a.nbytes)
            arrays.append(a)
        arrays += [np.empty(shape, dt.np_dtype) for dt, shape in compiled.program.output_specs]
        backend = hologram.default_executor("cpu").backend
        # No packed copies given (training graphs: weights are not constants): the
        # program reads B unpacked, as the launch did.
        copies = [backend.pack(compiled, i, address)
                  for i, (_, address) in enumerate(zip(compiled.packs, packed, strict=True))
                  ] if packed else []
        return arrays, copies

    def launcher(self: Any, compiled: Any) -> Any:
        run = original(self, compiled)
        if run is None:
            return None

        def recorded(pointers: Any, packed: Any = ()) -> None:
            if id(compiled) not in ids:
                ids.add(id(compiled))
                seen.append((compiled, *owned(compiled, pointers, packed)))
            run(pointers, packed)
        return recorded

    cpu.CPUBackend.pointer_launcher = launcher
    return seen


def _steps(source: str) -> list[str]:
    """The C functions ``hg_run`` calls, in order (one step: the library's one kernel)."""
    m = re.search(r"void hg_run\(void \*\*B\) \{\n(.*?)\}", source, re.S)
    if m:
        return re.findall(r"^\s+(\w+)\(B\);", m.group(1), re.M)
    names = re.findall(r"^void (\w+)\(void \*\*B\) \{", source, re.M)
    return names[:1]


def _describe(compiled: Any) -> dict[str, str]:
    """Step name -> what the step stores (opcode and shape of its first sinks)."""
    from hologram.compiler.schedule import GemmPlan, KernelPlan

    def show(vals: list[Any]) -> str:
        return ", ".join(f"{v.op.name.lower()}{list(v.shape)}" for v in vals[:3])

    out: dict[str, str] = {}
    for i, s in enumerate(compiled.lowered.schedule.steps):
        if isinstance(s, KernelPlan):
            out[s.name] = show([v for v, _ in s.all_sinks])
        elif isinstance(s, GemmPlan):
            out[f"g{i}"] = "gemm " + show([s.value])
        else:
            out[getattr(s, "name", f"s{i}")] = type(s).__name__
    return out


def _median_ms(call: Any, repeat: int) -> float:
    """``call()`` once to warm up, then its median over ``repeat`` calls, in ms."""
    call()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def _call(model: str, batch: int, train: int | None) -> Any:
    """The call to profile: a compiled inference, or a compiled CNN's training step."""
    import torch
    from bench_models import CNNS, build, build_cnn, cnn_training_data, cnn_training_step

    m, make = build_cnn(model) if model in CNNS else build(model)
    if train is None:
        inputs = make(batch)
        f = torch.compile(m, backend="hologram")

        def infer() -> None:
            with torch.no_grad():
                f(**inputs)
        return infer
    if model not in CNNS:
        raise SystemExit(f"--train: a CNN ({', '.join(CNNS)}), not {model!r}")
    x, y = cnn_training_data(model, batch, train)
    return cnn_training_step(m, torch.compile(m, backend="hologram"), x, y)


def _in_order_ms(fns: list[Any], repeat: int, whole: Any) -> tuple[float, list[float]]:
    """The program's whole launch (``whole``) and each step's median in ms as it runs
    inside the program: the steps called in order, ``repeat`` times, a clock read
    around each. Beside a step's time alone, this shows what it pays for its place:
    operands another core wrote or evicted, threads still busy with the step before.
    The launch runs before each pass of the steps, so both are measured over the same
    stretch of a shared machine's time (timed one after the other, the launch read
    27.8 ms against 17.0 for its steps in order on MobileNetV3-small b8, where
    alternated the two took 21.5 and 20.2; session 31)."""
    times: list[list[float]] = [[] for _ in fns]
    launches: list[float] = []
    for r in range(repeat + 1):
        t = time.perf_counter()
        whole()
        if r:  # the first pass warms up
            launches.append(time.perf_counter() - t)
        for i, fn in enumerate(fns):
            t = time.perf_counter()
            fn()
            if r:
                times[i].append(time.perf_counter() - t)
    return statistics.median(launches) * 1e3, [statistics.median(ts) * 1e3 for ts in times]


def profile(model: str, batch: int, repeat: int, top: int, source: str | None = None,
            train: int | None = None, by: str = "alone") -> None:
    import hologram
    import hologram_torch  # noqa: F401  (registers backend="hologram")
    from hologram.backends.cpu import _put_packed
    from hologram.memory.address import data_pointer

    seen = _record_launches()
    call = _call(model, batch, train)
    call()
    call_ms = _median_ms(call, repeat)
    ex = hologram.default_executor("cpu")
    rows: list[tuple[float, str, int, str, float]] = []
    programs: list[float] = []  # each program's whole launch (hg_run), median ms
    for pi, (compiled, arrays, packed_copies) in enumerate(seen):
        pointers = [data_pointer(a) for a in arrays]
        packed = [data_pointer(c) for c in packed_copies if c is not None]
        if source:
            with open(f"{source}.p{pi}.c", "w") as fh:
                fh.write(compiled.lowered.source)
        lib = ex.backend.cc.compile(compiled.lowered.source,
                                    {"program": compiled.canonical.hash})
        table_type = ctypes.c_void_p * compiled.lowered.n_slots
        block, scratch = compiled.scratch()
        table = table_type(*pointers, *scratch)
        _put_packed(table, [p.slot for p in compiled.packs], packed)
        if compiled.err_slot is not None:
            err = (ctypes.c_int64 * 2)()
            table[compiled.err_slot] = ctypes.addressof(err)
        what = _describe(compiled)
        names = _steps(compiled.lowered.source)
        fns = [functools.partial(lib[name], table) for name in names]
        launch_ms, in_order = _in_order_ms(
            fns, repeat, functools.partial(compiled.raw_kernels[0], table))
        programs.append(launch_ms)
        for name, fn, seq_ms in zip(names, fns, in_order, strict=True):
            rows.append((_median_ms(fn, repeat), name, pi, what.get(name, ""), seq_ms))
        del block
    total = sum(r[0] for r in rows)
    rows.sort(reverse=True)
    print(f"{model}, batch {batch}: {len(seen)} program(s), {len(rows)} steps, "
          f"sum of step medians {total:.2f} ms, programs' launches {sum(programs):.2f} ms, "
          f"whole call {call_ms:.2f} ms, "
          f"threads {hologram.get_num_threads()}")
    for pi, ms in enumerate(programs):
        steps = [r for r in rows if r[2] == pi]
        gemm = [r for r in steps if r[3].startswith("gemm")]
        print(f"  p{pi}: launch {ms:.2f} ms; {len(steps)} steps sum "
              f"{sum(r[0] for r in steps):.2f} ms alone, {sum(r[4] for r in steps):.2f} "
              f"in order; GEMM steps {sum(r[0] for r in gemm):.2f} alone, "
              f"{sum(r[4] for r in gemm):.2f} in order")
    print(f"{'ms':>8} {'share':>6} {'in order':>8}  program/step  stores")
    if by == "penalty":  # what a step pays for its place in the program
        rows.sort(key=lambda r: r[4] - r[0], reverse=True)
    for ms, name, pi, what, seq_ms in rows[:top]:
        print(f"{ms:8.3f} {100 * ms / total:5.1f}% {seq_ms:8.3f}  p{pi}/{name:<9} {what}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="convnext_atto")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--repeat", type=int, default=9)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--train", type=int, metavar="SIZE",
                   help="profile a CNN's training step at SIZE x SIZE instead")
    p.add_argument("--source", metavar="PATH",
                   help="also write each program's C source to PATH.<program>.c")
    p.add_argument("--sort", choices=["alone", "penalty"], default="alone",
                   help="rows by time alone, or by in order less alone")
    args = p.parse_args()
    profile(args.model, args.batch, args.repeat, args.top, args.source, args.train,
            args.sort)


if __name__ == "__main__":
    main()
