"""Where a compiled model's time goes: each C step of each CPU program, timed alone.

    .venv/bin/python benchmarks/profile_steps.py --model convnext_atto --batch 8 [--top 25]
    HOLOGRAM_NUM_THREADS=1 .venv/bin/python benchmarks/profile_steps.py --model resnet18

Models: the CNNs of ``bench_models.py --cnn`` (resnet18, mobilenet_v3_small,
convnext_atto) and its transformers (gpt2, bert, llama, t5, vit), inference under
``torch.no_grad()``. The model is compiled with ``backend="hologram"`` and called once;
every program launch through the CPU backend's pointer launcher is recorded (its
compiled program and its pointer table). Then each step that ``hg_run`` calls (``k<i>``
kernels, ``g<i>`` GEMM steps with their fused epilogues, attention steps) is called
alone on that table, ``--repeat`` times, and its median kept. Steps run alone start
with warmer caches than inside the whole call, so the sum is a little below a call's
time; the ranking is what this is for.

Each row names the step, its program, its median in ms, its share of the sum, and
what it computes: the instructions it stores (opcode and shape) from the schedule.
Why a kept tool: sessions 11-13 each wrote a scratch profiler like it to find the
steps worth rewriting (docs/perf.md).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _record_launches() -> list[tuple[Any, list[int], list[int]]]:
    """Wrap the CPU backend's pointer launcher so each program's first launch records
    (compiled program, addresses, packed addresses); the list fills as the model runs."""
    from hologram.backends import cpu

    seen: list[tuple[Any, list[int], list[int]]] = []
    ids: set[int] = set()
    original = cpu.CPUBackend.pointer_launcher

    def launcher(self: Any, compiled: Any) -> Any:
        run = original(self, compiled)
        if run is None:
            return None

        def recorded(pointers: Any, packed: Any = ()) -> None:
            if id(compiled) not in ids:
                ids.add(id(compiled))
                seen.append((compiled, list(pointers), list(packed)))
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


def profile(model: str, batch: int, repeat: int, top: int, source: str | None = None) -> None:
    import torch
    from bench_models import CNNS, build, build_cnn

    import hologram
    import hologram_torch  # noqa: F401  (registers backend="hologram")
    from hologram.backends.cpu import _put_packed

    seen = _record_launches()
    m, make = build_cnn(model) if model in CNNS else build(model)
    inputs = make(batch)
    f = torch.compile(m, backend="hologram")
    with torch.no_grad():
        f(**inputs)
        f(**inputs)
        calls = []
        for _ in range(repeat):
            t = time.perf_counter()
            f(**inputs)
            calls.append(time.perf_counter() - t)
    ex = hologram.default_executor("cpu")
    rows: list[tuple[float, str, int, str]] = []
    programs: list[float] = []  # each program's whole launch (hg_run), median ms
    for pi, (compiled, pointers, packed) in enumerate(seen):
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
        run = compiled.raw_kernels[0]
        run(table)
        whole = []
        for _ in range(repeat):
            t = time.perf_counter()
            run(table)
            whole.append(time.perf_counter() - t)
        programs.append(statistics.median(whole) * 1e3)
        for name in _steps(compiled.lowered.source):
            fn = lib[name]
            fn.restype = None
            fn(table)
            times = []
            for _ in range(repeat):
                t = time.perf_counter()
                fn(table)
                times.append(time.perf_counter() - t)
            rows.append((statistics.median(times) * 1e3, name, pi, what.get(name, "")))
        del block
    total = sum(r[0] for r in rows)
    rows.sort(reverse=True)
    print(f"{model}, batch {batch}: {len(seen)} program(s), {len(rows)} steps, "
          f"sum of step medians {total:.2f} ms, programs' launches {sum(programs):.2f} ms, "
          f"whole call {statistics.median(calls) * 1e3:.2f} ms, "
          f"threads {hologram.get_num_threads()}")
    print(f"{'ms':>8} {'share':>6}  program/step  stores")
    for ms, name, pi, what in rows[:top]:
        print(f"{ms:8.3f} {100 * ms / total:5.1f}%  p{pi}/{name:<9} {what}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="convnext_atto")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--repeat", type=int, default=9)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--source", metavar="PATH",
                   help="also write each program's C source to PATH.<program>.c")
    args = p.parse_args()
    profile(args.model, args.batch, args.repeat, args.top, args.source)


if __name__ == "__main__":
    main()
