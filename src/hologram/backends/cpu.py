"""The native CPU backend: fused kernels rendered as C, compiled by the system
compiler, cached on disk and called in-process through ctypes; GEMM goes to the
BLAS NumPy links against. Without a C compiler it falls back to the reference
interpreter, with one warning.
"""

from __future__ import annotations

import ctypes
import functools
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..compiler import aliasing, attention, blas, prewarm
from ..compiler.gemm_layout import GemmDesc, gemm_desc, unreadable_operand
from ..compiler.lower import (
    PACKED_KIND,
    Lowered,
    compute_instructions,
    lower,
    unfused_launches,
)
from ..compiler.render_c import gemm_step_name, render_kernels
from ..compiler.schedule import (
    AttentionPlan,
    BufRef,
    GemmPlan,
    KernelPlan,
    NeedsMaterialize,
    step_operands,
    view_chain,
    widens_16_bit,
)
from ..compiler.temp_memory import TempLayout, plan_temps
from ..isa.index_errors import index_sites, out_of_range
from ..isa.opcodes import Op
from ..isa.program import Program
from ..isa.value import Value
from ..memory.address import data_pointer
from ..memory.output_cache import output_cache
from .base import Backend
from .reference import VIEWS, ReferenceBackend

_warned = False


@dataclass
class ProgramStats:
    """What canonical compilation did to one program."""

    instructions_before: int
    instructions_after: int
    launches_before: int
    launches_after: int
    rules: dict[str, int] = field(default_factory=dict)

    @property
    def launch_reduction(self) -> float:
        if not self.launches_before:
            return 0.0
        return 1.0 - self.launches_after / self.launches_before

    def __str__(self) -> str:
        return (f"instructions {self.instructions_before} -> {self.instructions_after}, "
                f"kernel launches {self.launches_before} -> {self.launches_after} "
                f"({100 * self.launch_reduction:.0f}% fewer)")


@dataclass(frozen=True)
class PackSite:
    """A GEMM step whose B operand is program input ``input`` (read as ``desc`` says) and
    which takes a packed copy of it in table slot ``slot`` (``CPUBackend.pack``)."""

    step: int
    input: int
    desc: GemmDesc
    slot: int


@dataclass
class CompiledProgram:
    program: Program
    canonical: Program
    lowered: Lowered
    stats: ProgramStats
    steps: list[Callable[[Any, list[np.ndarray]], None]]
    temps: list[tuple[np.dtype, tuple[int, ...]]]
    raw_kernels: list[Any] = field(default_factory=list)
    # Programs that index at run time: the instructions a kernel may report a bad index
    # of (by position), and the pointer-table slot of each launch's error record.
    index_sites: list[Value] = field(default_factory=list)
    err_slot: int | None = None
    # GEMM steps that take a packed copy of an input as B (MKL), in slot order.
    packs: list[PackSite] = field(default_factory=list)
    # Where each temp lives in the launch's one scratch block (compiler/temp_memory.py).
    temp_layout: TempLayout | None = None

    def scratch(self) -> tuple[np.ndarray | None, list[int]]:
        """One launch's scratch block (alive through the launch) and each temp's address
        in it. Blocks of 1 MiB and up come from the output cache, so a repeated launch
        writes pages already mapped instead of faulting in fresh ones."""
        layout = self.temp_layout
        if layout is None or not self.temps:
            return None, []
        block = output_cache.empty(max(layout.nbytes, 1), np.uint8)
        base = data_pointer(block)
        return block, [base + o for o in layout.offsets]

    def temp_arrays(self, block: np.ndarray | None) -> list[np.ndarray]:
        """The temps as arrays over ``block`` (the array launch path's NumPy steps)."""
        if block is None:
            return []
        assert self.temp_layout is not None
        out = []
        for (dt, shape), off in zip(self.temps, self.temp_layout.offsets, strict=True):
            n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize
            out.append(block[off:off + n].view(dt).reshape(shape))
        return out

    def error_record(self) -> np.ndarray | None:
        """A fresh, zeroed error record for one launch (None: nothing to check)."""
        return None if self.err_slot is None else np.zeros(2, np.int64)

    def check_index_errors(self, err: np.ndarray | None) -> None:
        """Raise the IndexError a kernel recorded in ``err`` during the launch (its
        outputs then hold clamped reads, not results)."""
        if err is not None and err[0]:
            site, bad = int(err[0]) - 1, int(err[1])
            err[:] = 0
            raise out_of_range(self.index_sites[site], bad)

    @property
    def source(self) -> str:
        return self.lowered.source


def canonical_form(program: Program) -> tuple[Program, dict[str, int], int]:
    """(canonical program, rule fire counts, compute instructions before)."""
    from ..compiler.canonicalize import canonicalize

    canon, st = canonicalize(program)
    return canon, dict(getattr(st, "rules", {}) or {}), compute_instructions(program)


_NO_ARENA = np.zeros(0, np.uint8)  # the table's arena slot when a program has none


def _view(ref: BufRef, arrays: list[np.ndarray], slots: dict[BufRef, int]) -> np.ndarray:
    a = arrays[slots[ref]]
    if ref.kind == "arena":
        nbytes = ref.size * ref.dtype.itemsize
        return a[ref.offset:ref.offset + nbytes].view(ref.dtype.np_dtype).reshape(ref.shape)
    return a.reshape(ref.shape)


def _apply_chain(a: np.ndarray, chain: list[Value]) -> np.ndarray:
    for m in chain:
        a = VIEWS[m.op](a, m)
    return a


def check_no_empty_steps(low: Lowered) -> None:
    """Refuse a schedule with a step that reads or writes a buffer of no elements.

    Such a step would index memory that is not there (torch hands out a null pointer
    for an empty tensor; NumPy a pointer to nothing). The canonical rules fold empty
    values into constants (``rules.EMPTY_RULES``) and the scheduler gives empty results
    no step, so this never fires; it is checked once per compiled program, where the
    sizes are fixed, so a launch pays nothing for it."""
    sched = low.schedule
    for i, step in enumerate(sched.steps):
        for v in step_operands(step, sched):
            if v.size == 0:
                kind = "GEMM" if isinstance(step, GemmPlan) else f"kernel {step.name}"
                raise AssertionError(
                    f"hologram internal error: step {i} ({kind}) of program "
                    f"{sched.program.hash[:12]} would launch on the empty value "
                    f"{v.op}.{v.dtype}{list(v.shape)}; empty values must be folded "
                    "(compiler/rules.py EMPTY_RULES) and get no step (schedule.plan)")


def _put_packed(table: Any, slots: list[int], packed: Sequence[int]) -> None:
    """Packed copies of B into their slots (``packed[i]`` for ``compiled.packs[i]``; 0 or
    none given: the GEMM reads B as it is)."""
    if not packed:
        return
    if len(packed) != len(slots):
        raise ValueError(f"expected {len(slots)} packed-operand addresses (one per "
                         f"packable GEMM step), got {len(packed)}")
    for slot, address in zip(slots, packed, strict=True):
        table[slot] = address or None


#: Launch frames (pointer table, scratch block, error record) whose scratch is smaller
#: than this are kept for the next launch of the same program. Building them per call
#: (a ctypes table, np.empty, np.zeros) cost microseconds each on hologram_torch's
#: per-step path (three launches a step in the README demo); larger scratch blocks
#: come from the output cache per call, as before, so that ``empty_cache`` can still
#: give them back.
FRAME_MAX_SCRATCH = 1 << 20


def _pointer_launcher(compiled: CompiledProgram
                      ) -> Callable[[Sequence[int], Sequence[int]], None]:
    """``run(addresses, packed=())``: the program's one C function on a pointer table of
    raw addresses (inputs, then outputs), its temps in a scratch block, its error
    record (programs that index at run time) checked when the kernel returns.

    Frames are taken from and given back to a list (``pop``/``append`` are atomic), so
    concurrent launches of one program each hold their own table, scratch and record.
    """
    fn = compiled.raw_kernels[0]
    n = len(compiled.program.inputs) + len(compiled.program.output_specs)
    table_type = ctypes.c_void_p * compiled.lowered.n_slots
    pack_slots = [p.slot for p in compiled.packs]
    no_packs = [0] * len(pack_slots)
    err_slot = compiled.err_slot
    layout = compiled.temp_layout
    pooled = not compiled.temps or layout is None or layout.nbytes < FRAME_MAX_SCRATCH
    idle: list[tuple[Any, np.ndarray | None, np.ndarray | None]] = []

    def frame() -> tuple[Any, np.ndarray | None, np.ndarray | None]:
        block, scratch = compiled.scratch()
        table = table_type()
        table[n:n + len(scratch)] = scratch  # the arena's slot after them stays NULL
        err = None
        if err_slot is not None:
            err = np.zeros(2, np.int64)
            table[err_slot] = data_pointer(err)
        return table, block, err

    def run(pointers: Sequence[int], packed: Sequence[int] = ()) -> None:
        if len(pointers) != n:
            raise ValueError(f"expected {n} addresses (inputs, then outputs), "
                             f"got {len(pointers)}")
        f = idle.pop() if idle else frame()
        table, block, err = f  # block: alive through the call
        try:
            table[:n] = pointers
            if pack_slots:  # a reused table's slots are set either way
                _put_packed(table, pack_slots, packed or no_packs)
            fn(table)
            if err is not None:
                compiled.check_index_errors(err)  # zeroes the record when it raises
        finally:
            if pooled:
                idle.append(f)

    return run


class CPUBackend(Backend):
    name = "cpu"

    def __init__(self) -> None:
        try:
            from ..compiler.cc import CCompiler
        except ImportError:  # pragma: no cover - transitional while the driver lands
            CCompiler = None  # noqa: N806
        self.cc = CCompiler.find() if CCompiler is not None else None
        self._fallback = ReferenceBackend() if self.cc is None else None
        if self.cc is None:
            global _warned
            if not _warned:
                warnings.warn("hologram: no C compiler found (set CC or install gcc); the cpu "
                              "backend runs the slow reference interpreter", stacklevel=3)
                _warned = True

    def describe(self) -> str:
        return f"cpu (C via {self.cc.id})" if self.cc else "cpu (reference fallback: no C compiler)"

    def prewarm(self, attention: bool = False, bf16: bool = False) -> None:
        if self.cc is not None:
            prewarm.start(self.cc, attention, bf16)

    def compile(self, program: Program) -> Any:
        return self.prepare(program)()

    def prepare(self, program: Program) -> Callable[[], Any]:
        program.verify()
        if self._fallback is not None:
            return lambda: self._fallback.compile(program)  # type: ignore[union-attr]
        from ..compiler.cc import C_PRELUDE

        canon, rules, before = canonical_form(program)
        # The BLAS driver is built (once per process) only when a program has a GEMM.
        has_gemm = any(v.op is Op.GEMM for v in canon.instructions)
        gemm_rt = blas.runtime(self.cc) if has_gemm else None
        int64 = gemm_rt is not None and blas.int64_sizes()
        gemms: dict[int, GemmDesc] = {}
        fused: set[int] = set()  # kernel steps that run inside the GEMM before them

        def describe_gemms(sched: Any) -> list[int]:
            """Every GEMM step BLAS can run (into ``gemms``); returns those whose B is a
            program input a packed copy could stand in for."""
            gemms.clear()
            copies = []
            if gemm_rt is not None:
                for i, st in enumerate(sched.steps):
                    if not isinstance(st, GemmPlan):
                        continue
                    d = gemm_desc(st.value, sched.buffers, st.out, int64, narrow=st.narrow)
                    if d is not None:
                        gemms[i] = d
                        continue
                    copy = unreadable_operand(st.value, sched.buffers, narrow=st.narrow)
                    if copy is not None:
                        copies.append(copy)
                    elif st.narrow is not None:  # read as floats, through np.matmul
                        copies += [view_chain(s, sched.buffers)[0] for s in st.value.srcs]
            if copies:  # planned again with those views in buffers
                raise NeedsMaterialize(copies[0], copies[1:])
            return [i for i, d in gemms.items() if d.b.ref.kind == "in" and blas.may_pack(d)]

        def render(sched: Any, slots: Any) -> str:
            return render_kernels(sched, slots, C_PRELUDE, gemms, fused)

        narrow = (blas.narrow_dtypes(self.cc) if gemm_rt is not None and
                  any(v.op is Op.GEMM and widens_16_bit(v) for v in canon.instructions)
                  else frozenset())
        low = lower(canon, render, error_slot=True, packed=describe_gemms, narrow=narrow)
        check_no_empty_steps(low)
        if any(d.a.trans or not d.b.trans for d in gemms.values()):  # not x @ W.T
            blas.bind_layouts(self.cc)
        named = (KernelPlan, AttentionPlan)  # C functions of their own (GEMMs: g<i>)
        names = {i: (s.name if isinstance(s, named) else gemm_step_name(i))
                 for i, s in enumerate(low.schedule.steps)
                 if (isinstance(s, named) or i in gemms) and i not in fused}
        return lambda: self._finish(program, canon, before, rules, low, names, gemms, fused,
                                    gemm_rt)

    def _finish(self, program: Program, canon: Program, before: int, rules: Any,
                low: Lowered, names: dict[int, str], gemms: dict[int, GemmDesc],
                fused: set[int], gemm_rt: Any) -> CompiledProgram:
        """The native half of a compile: build and load the program's library."""
        lib = self.cc.compile(low.source, {"program": canon.hash}) if names else None
        if gemms:
            bind = lib.hg_bind_gemm
            bind.argtypes, bind.restype = [ctypes.c_void_p], None
            bind(gemm_rt)
        attn_dtypes = tuple(sorted({s.srcs[0].dtype.name for s in low.schedule.steps
                                    if isinstance(s, AttentionPlan)}))
        if attn_dtypes:
            bind = lib.hg_bind_attn
            bind.argtypes, bind.restype = [ctypes.c_void_p], None
            bind(attention.runtime(self.cc, attn_dtypes))
        stats = ProgramStats(before, compute_instructions(canon), unfused_launches(program),
                             low.launches - len(fused), rules)
        raw = {n: self._raw(lib, n) for n in names.values()}
        steps = [self._step(s, low, raw[names[i]] if i in names else None)
                 for i, s in enumerate(low.schedule.steps) if i not in fused]
        temps = [(t.dtype.np_dtype, t.shape) for t in low.schedule.temps]
        if len(names) == len(steps) > 1:  # every step is C: one call runs them all
            raw_list = [self._raw(lib, "hg_run")]
            steps = [lambda table, arrays, fn=raw_list[0]: fn(table)]
        else:
            raw_list = list(raw.values())
        sites = index_sites(canon.instructions) if low.err_slot is not None else []
        layout = plan_temps(low.schedule, fused)
        packs = [PackSite(ref.index, gemms[ref.index].b.ref.index, gemms[ref.index], slot)
                 for ref, slot in sorted(low.slots.items(), key=lambda kv: kv[1])
                 if ref.kind == PACKED_KIND]
        return CompiledProgram(program, canon, low, stats, steps, temps, raw_list, sites,
                               low.err_slot, packs, layout)

    @staticmethod
    def _raw(lib: Any, name: str) -> Any:
        """A fresh function object (``lib[name]``) with no argtypes to convert through."""
        fn = lib[name]
        fn.restype = None
        return fn

    def _step(self, step: KernelPlan | GemmPlan, low: Lowered, fn: Any):
        """A launch step: the C function ``fn`` on the slot table, or (a GEMM whose
        operands BLAS cannot read in place, or no BLAS found) np.matmul on views."""
        if fn is not None:
            return lambda table, arrays: fn(table)
        bufs, slots = low.schedule.buffers, low.slots
        (a_root, a_chain), (b_root, b_chain) = (view_chain(s, bufs) for s in step.value.srcs)
        a_ref, b_ref = bufs[id(a_root)], bufs[id(b_root)]  # the scheduler made them buffers
        out_ref, shape = step.out, step.value.shape

        def gemm(table: Any, arrays: list[np.ndarray]) -> None:
            a = _apply_chain(_view(a_ref, arrays, slots), a_chain)
            b = _apply_chain(_view(b_ref, arrays, slots), b_chain)
            # the buffer may hold the product under another shape of the same elements
            # (a dot product's [1, 1, 1] stored as the program's scalar output)
            with np.errstate(all="ignore"):  # NaN and inf propagate, as in C
                np.matmul(a, b, out=_view(out_ref, arrays, slots).reshape(shape))

        return gemm

    def bind(self, compiled: Any, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray],
             arena: np.ndarray | None = None) -> Any:
        if (self._fallback is not None or compiled.temps or len(compiled.steps) != 1
                or len(compiled.raw_kernels) != 1):
            return super().bind(compiled, inputs, outputs, arena)
        arrays = [*inputs, *outputs, arena if arena is not None else _NO_ARENA]
        err = compiled.error_record()
        if err is not None:
            arrays.append(err)
        # packed-B slots, if any, stay NULL: only pointer launches pass packed copies
        table = (ctypes.c_void_p * compiled.lowered.n_slots)(*map(data_pointer, arrays))
        # The bare C function with its pointer table bound: the cheapest call ctypes has
        # (no argtypes conversion; a ctypes array passes as a pointer).
        call = functools.partial(compiled.raw_kernels[0], table)
        if err is not None:  # bound calls may run concurrently: each checks its own record
            fn = call

            def call() -> None:
                fn()
                compiled.check_index_errors(err)

        call.arrays = arrays  # type: ignore[attr-defined]  # keep the memory alive
        return call

    def pointer_launcher(self, compiled: Any
                         ) -> Callable[[Sequence[int], Sequence[int]], None] | None:
        if (self._fallback is not None or len(compiled.steps) != 1
                or len(compiled.raw_kernels) != 1 or compiled.program.uses_arena):
            return None  # np.matmul steps and Φ-addressed programs take arrays
        return _pointer_launcher(compiled)

    def pack_sites(self, compiled: Any) -> list[PackSite]:
        return [] if self._fallback is not None else list(compiled.packs)

    def pack(self, compiled: Any, site: int, address: int) -> np.ndarray | None:
        """A packed copy of the B operand of ``compiled.packs[site]``, read from the input
        at ``address`` (its data as the program reads that input: planned dtype, shape
        and contiguous strides), or None where the BLAS cannot pack it."""
        if self._fallback is not None:
            return None
        if not 0 <= site < len(compiled.packs):
            raise IndexError(f"pack site {site} out of range: this program has "
                             f"{len(compiled.packs)} (CPUBackend.pack_sites)")
        return blas.pack(self.cc, compiled.packs[site].desc, address)

    def may_overwrite(self, compiled: Any, in_index: int, out_index: int) -> bool:
        if self._fallback is not None:
            return False
        return aliasing.may_overwrite(compiled.lowered.schedule, in_index, out_index)

    def launch(self, compiled: Any, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray],
               arena: np.ndarray | None = None, packed: Sequence[int] = ()) -> None:
        """``packed``: as for a pointer launch, one packed-copy address per pack site (0:
        none), made by ``pack`` from the very memory ``inputs`` pass."""
        if self._fallback is not None:
            return self._fallback.launch(compiled, inputs, outputs, arena)
        # Temps share one block (1 MiB or more: cached, so pages are not faulted in anew).
        block, _ = compiled.scratch()
        arrays = [*inputs, *outputs, *compiled.temp_arrays(block)]
        arrays.append(arena if arena is not None else _NO_ARENA)
        err = compiled.error_record()
        if err is not None:
            arrays.append(err)
        table = (ctypes.c_void_p * compiled.lowered.n_slots)(*map(data_pointer, arrays))
        _put_packed(table, [p.slot for p in compiled.packs], packed)
        for step in compiled.steps:
            step(table, arrays)
        compiled.check_index_errors(err)
