"""The CUDA backend: every decision, made once, for the real GPU and the emulated one.

Compile: canonical program -> schedule -> CUDA C (``render_cuda``) -> a module from
the device (NVRTC cubin on a GPU, host C++ on the emulated device; both cached on
disk). GEMM steps are not kernels: each becomes cuBLAS strided-batched calls whose
layout (transposes, leading dimensions, batch strides, the row-major to
column-major swap) is worked out here, at compile time, from
``compiler/gemm_layout.py``'s description.

Launch: each kernel's grid and block come from how the renderer mapped its loops
('flat': a grid-stride loop over elements; 'outer': a block per row; 'single':
one block) and the device's size; every kernel takes one ``HgArgs`` parameter (the
program's slot table of 64 device addresses), packed here. Work goes on the
backend's stream and nothing waits until a result is read (``copy_d2h``), except
programs that index at run time, whose bounds check reads the module's error record
after the launch.

Memory: executors' pools take device memory through :class:`CudaMemory`, so a
Buffer is a ``DeviceArray`` window of a device allocation and kernels read it in
place; NumPy operands (``Executor.launch``, ``@jit``) are uploaded to scratch
device memory and outputs read back. The device is reached only through the
small interface of ``cuda_device.py``.
"""

from __future__ import annotations

import contextlib
import itertools
import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..buffer import DeviceBuffer
from ..compiler.gemm_layout import GemmDesc, gemm_desc, unreadable_operand
from ..compiler.lower import Lowered, compute_instructions, lower, unfused_launches
from ..compiler.render_cuda import render_cuda
from ..compiler.schedule import AttentionPlan, GemmPlan, KernelPlan, NeedsMaterialize
from ..compiler.temp_memory import TempLayout, plan_temps
from ..errors import DLPackError, DTypeError, HologramError
from ..isa.dtypes import BY_NAME
from ..isa.index_errors import index_sites, out_of_range
from ..isa.program import Program
from ..isa.value import Value
from ..memory import MemoryManager, device_allocator
from ..memory.device import DeviceArray
from .base import Backend
from .cpu import ProgramStats, canonical_form, check_no_empty_steps
from .cuda_device import Allocation, CudaDevice, open_device
from .cuda_dlpack import import_device_array
from .cuda_scratch import TempBlocks

HG_SLOTS = 64  # render_cuda's HgArgs: 64 device addresses
#: Resident blocks per multiprocessor a grid-stride launch aims for.
BLOCKS_PER_SM = 32
#: dtypes the CUDA renderer types for NVRTC: f16 and bf16 are stored as cuda_fp16.h's
#: ``__half`` and cuda_bf16.h's ``__nv_bfloat16`` and computed in float, rounded after
#: every instruction (``render_cuda.HALF``); integers of every width.
SUPPORTED = frozenset({"f16", "bf16", "f32", "f64", "i8", "i16", "i32", "i64", "u8", "u16",
                       "u32", "u64", "bool"})
#: dtypes of the products cuBLAS computes (f16/bf16: float accumulation, result rounded).
CUBLAS_DTYPES = ("f16", "bf16", "f32", "f64")
DLPACK_CUDA, DLPACK_EXT_DEV = 2, 12


class CudaMemory:
    """A CUDA device as ``DeviceMemory`` for the executor's pools (``memory/device.py``):
    each pool block is one device allocation; copies go on the backend's current
    stream (``stream_of``: its own, or an external one it was handed)."""

    name = "cuda"

    def __init__(self, device: CudaDevice, stream_of: Callable[[], Any]) -> None:
        self.device = device
        self._stream_of = stream_of
        # The emulated device is no GPU: it reports DLPack's extension-device type and
        # exports host copies only (DeviceBuffer), never a CUDA pointer.
        self.dlpack_device = ((DLPACK_EXT_DEV, 0) if device.properties.emulated
                              else (DLPACK_CUDA, 0))

    @property
    def stream(self) -> Any:
        return self._stream_of()

    def create(self, nbytes: int) -> Allocation:
        return self.device.alloc(nbytes)

    def read(self, handle: Allocation, offset: int, nbytes: int) -> np.ndarray:
        out = np.empty(nbytes, np.uint8)
        self.device.copy_d2h(out, handle.ptr + offset, self.stream)
        return out

    def write(self, handle: Allocation, offset: int, data: np.ndarray) -> None:
        self.device.copy_h2d(handle.ptr + offset, np.ascontiguousarray(data), self.stream)

    def copy(self, src: Allocation, src_offset: int, dst: Allocation, dst_offset: int,
             nbytes: int) -> None:
        self.device.copy_d2d(dst.ptr + dst_offset, src.ptr + src_offset, nbytes, self.stream)

    def clear(self, handle: Allocation, offset: int, nbytes: int) -> None:
        self.device.memset(handle.ptr + offset, 0, nbytes, self.stream)


class CudaBuffer(DeviceBuffer):
    """A Buffer in CUDA device memory. On a GPU, DLPack exports it zero-copy (a CUDA
    pointer, ``__dlpack_device__() == (2, 0)``) with stream semantics: the consumer's
    ``stream`` waits for the work queued on ours. Anything else (a host copy asked for
    with ``dl_device=(1, 0)``, the emulated device) goes the DeviceBuffer way."""

    __slots__ = ()

    def __dlpack__(self, *, stream: Any = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> Any:
        mem = self._executor._device
        wanted = None if dl_device is None else tuple(int(v) for v in dl_device)
        if mem.dlpack_device[0] != DLPACK_CUDA or wanted not in (None, mem.dlpack_device) \
                or copy:
            return super().__dlpack__(stream=stream, max_version=max_version,
                                      dl_device=dl_device, copy=copy)
        self._check()
        a = self._array
        return mem.device.export_dlpack(a.handle.ptr + a.offset if a.nbytes else 0, a.nbytes,
                                        a.dtype, a.shape, a.handle, mem.stream, stream)


@dataclass(frozen=True)
class KernelLaunch:
    """One kernel of a program and its launch shape."""

    name: str
    kernel: Any
    grid: tuple[int, int, int]
    block: tuple[int, int, int]


@dataclass(frozen=True)
class GemmCall:
    """One GEMM step as cuBLAS column-major strided-batched calls: ``C^T = B^T A^T`` of
    the row-major product, so cuBLAS's A is the program's B. Offsets in bytes from
    the operand's slot; ``outer``: byte offsets (a, b, c) of each call over the batch
    axes before the last (one call, (0, 0, 0), when there are none)."""

    dtype: str
    trans_a: bool
    trans_b: bool
    m: int
    n: int
    k: int
    a: tuple[int, int, int, int]  # (slot, byte offset, ld, batch stride in elements)
    b: tuple[int, int, int, int]
    c: tuple[int, int, int, int]
    batch: int
    outer: tuple[tuple[int, int, int], ...]
    tf32: bool = False  # f32 inputs rounded to tf32 on tensor cores (the backend's choice)


def gemm_call(desc: GemmDesc, slots: dict[Any, int], tf32: bool = False) -> GemmCall:
    """The cuBLAS calls computing ``desc`` (a row-major product, BLAS-readable views)."""
    item = BY_NAME[desc.dtype].itemsize
    batch = desc.batch
    last = batch[-1] if batch else 1
    strides = [op.batch_strides for op in (desc.a, desc.b, desc.c)]
    outer = []
    for idx in itertools.product(*(range(s) for s in batch[:-1])):
        da, db, dc = (item * sum(i * st for i, st in zip(idx, s[:-1], strict=True))
                      for s in strides)
        outer.append((db, da, dc))  # cuBLAS's A is the program's B

    def operand(op: Any, st: tuple[int, ...]) -> tuple[int, int, int, int]:
        return slots[op.ref], op.offset * item, op.ld, st[-1] if st else 0

    # row-major C = A @ B  <=>  column-major C^T = B^T @ A^T
    return GemmCall(desc.dtype, desc.b.trans, desc.a.trans, desc.n, desc.m, desc.k,
                    operand(desc.b, strides[1]), operand(desc.a, strides[0]),
                    operand(desc.c, strides[2]), last, tuple(outer) or ((0, 0, 0),),
                    tf32 and desc.dtype == "f32")


@dataclass
class CudaProgram:
    """A compiled program: its module, its steps in order, and what a launch needs."""

    program: Program
    canonical: Program
    lowered: Lowered
    stats: ProgramStats
    steps: list[KernelLaunch | GemmCall]
    temps: list[int]  # bytes of each temp, in slot order after the outputs
    temp_layout: TempLayout  # where each temp lives in the program's one block
    n_in: int
    n_out: int
    arena_slot: int
    index_sites: list[Value] = field(default_factory=list)
    error_address: int = 0  # the module's hg_index_error, when it indexes at run time
    module: Any = None

    @property
    def source(self) -> str:
        return self.lowered.source

    def kernels(self) -> list[KernelLaunch]:
        return [s for s in self.steps if isinstance(s, KernelLaunch)]


def plan_grid(kind: str, count: int, threads: int, multiprocessors: int) -> int:
    """Blocks for a kernel the renderer mapped as ``kind`` over ``count`` (elements for
    'flat', rows for 'outer'). Loops are grid-stride, so any count is correct; enough
    blocks to fill the device, no more (each block costs a launch slot)."""
    if kind == "single":
        return 1
    wanted = -(-count // threads) if kind == "flat" else count
    return max(1, min(wanted, multiprocessors * BLOCKS_PER_SM))


def pack_args(addresses: Sequence[int]) -> bytes:
    """``HgArgs``: the slot table as 64 little-endian 64-bit addresses."""
    if len(addresses) > HG_SLOTS:
        raise HologramError(f"a CUDA program takes at most {HG_SLOTS} buffers, "
                            f"got {len(addresses)}")
    return struct.pack(f"<{HG_SLOTS}Q", *addresses, *([0] * (HG_SLOTS - len(addresses))))


class CudaBackend(Backend):
    """CUDA C kernels and cuBLAS on a CUDA device (a GPU, or the emulated one)."""

    name = "cuda"
    device_type = "cuda"
    buffer_type = CudaBuffer

    def __init__(self) -> None:
        self.device: CudaDevice = open_device()
        self.properties = self.device.properties
        self.stream = self.device.stream()
        self._external = threading.local()  # .stream: a stream handed in (use_stream)
        self.memory = CudaMemory(self.device, self.current_stream)
        # Each program's temps: one device block, from the executor's pools once an
        # executor attaches them (cuda_scratch.py), else from pools of our own.
        self.temp_blocks = TempBlocks(
            self.device, lambda: MemoryManager(allocator=device_allocator(self.memory)))
        self._threads = 256
        #: f32 GEMMs may round their inputs to tf32 (faster on tensor cores, ~1e-3
        #: relative error, as torch.backends.cuda.matmul.allow_tf32); off by default.
        self.allow_tf32 = False
        self._lock = threading.RLock()

    # --- configuration --------------------------------------------------------------
    @property
    def threads_per_block(self) -> int:
        """Threads of every block this backend launches (a multiple of 32, the warp)."""
        return self._threads

    @threads_per_block.setter
    def threads_per_block(self, value: int) -> None:
        top = self.properties.max_threads_per_block
        if not isinstance(value, int) or value % 32 or not 32 <= value <= top:
            raise ValueError(f"threads_per_block: expected a multiple of 32 from 32 to {top}, "
                             f"got {value!r}")
        self._threads = value

    def describe(self) -> str:
        p = self.properties
        what = "emulated device, not a GPU" if p.emulated else p.arch
        return f"cuda ({p.name}; {what})"

    @property
    def device_memory(self) -> CudaMemory:
        """Where executors on this backend keep their buffers (their pools' allocator)."""
        return self.memory

    # --- compile --------------------------------------------------------------------
    def compile(self, program: Program) -> CudaProgram:
        program.verify()
        for v in program.instructions:
            if v.dtype.name not in SUPPORTED:
                raise DTypeError(f"{v.dtype}: the cuda backend supports "
                                 f"{', '.join(sorted(SUPPORTED))} (found in {v.op})")
        canon, rules, before = canonical_form(program)
        launch_map: dict[str, tuple[str, int]] = {}
        gemms: dict[int, GemmDesc] = {}

        def render(sched: Any, slots: Any) -> str:
            gemms.clear()
            copies = []
            for i, st in enumerate(sched.steps):
                if not isinstance(st, GemmPlan):
                    continue
                d = gemm_desc(st.value, sched.buffers, st.out, False, CUBLAS_DTYPES)
                if d is None:
                    copy = unreadable_operand(st.value, sched.buffers, CUBLAS_DTYPES)
                    if copy is not None:
                        copies.append(copy)
                        continue
                    raise DTypeError(f"GEMM {st.value.dtype}{list(st.value.shape)}: cuBLAS "
                                     f"is called for {', '.join(CUBLAS_DTYPES)} products "
                                     "only")
                gemms[i] = d
            if copies:  # planned again with those views in buffers
                raise NeedsMaterialize(copies[0], copies[1:])
            source, lm = render_cuda(sched, slots)
            launch_map.clear()
            launch_map.update(lm)
            return source

        low = lower(canon, render)
        check_no_empty_steps(low)
        sched = low.schedule
        has_kernels = any(isinstance(s, (KernelPlan, AttentionPlan)) for s in sched.steps)
        module = (self.device.compile(low.source, {"program": canon.hash})
                  if has_kernels else None)
        steps: list[KernelLaunch | GemmCall] = []
        for i, st in enumerate(sched.steps):
            if isinstance(st, GemmPlan):
                steps.append(gemm_call(gemms[i], low.slots, self.allow_tf32))
                continue
            names = ([st.name] if isinstance(st, KernelPlan) else
                     [n for n in launch_map if n.startswith(st.name + "_")])
            for n in names:
                kind, count = launch_map.get(n, ("single", 1))
                steps.append(self._kernel_launch(module, n, kind, count))
        n_in, n_out = len(canon.inputs), len(canon.output_specs)
        temps = [t.size * t.dtype.itemsize for t in sched.temps]
        sites = index_sites(canon.instructions)
        err = (self.device.global_address(module, "hg_index_error")
               if module is not None and "hg_index_error" in low.source else 0)
        stats = ProgramStats(before, compute_instructions(canon), unfused_launches(program),
                             len(steps), rules)
        return CudaProgram(program, canon, low, stats, steps, temps, plan_temps(sched), n_in,
                           n_out, n_in + n_out + len(temps), sites if err else [], err, module)

    def _kernel_launch(self, module: Any, name: str, kind: str, count: int) -> KernelLaunch:
        t = self._threads
        grid = plan_grid(kind, count, t, self.properties.multiprocessors)
        return KernelLaunch(name, self.device.function(module, name), (grid, 1, 1), (t, 1, 1))

    # --- launch ---------------------------------------------------------------------
    def launch(self, compiled: CudaProgram, inputs: Sequence[Any], outputs: Sequence[Any],
               arena: Any = None) -> None:
        """Run every step in order on the backend's stream. ``DeviceArray`` operands are
        used where they are; NumPy ones are staged in pool memory (uploaded first), and
        NumPy outputs (and a host arena the program writes) read back before this
        returns."""
        c = compiled
        dev = self.device
        staged: list[Any] = []  # pool blocks of the host operands, alive through the launch
        reads: list[tuple[np.ndarray, int]] = []  # (host destination, device address)

        def address(a: Any, read: bool, write: bool) -> int:
            if isinstance(a, DeviceArray):
                return a.handle.ptr + a.offset if a.nbytes else 0
            a = np.asarray(a)
            if not a.nbytes:
                return 0
            block = self.temp_blocks.staging(a.nbytes)
            staged.append(block)
            ptr = block.array.handle.ptr + block.array.offset
            if read:
                dev.copy_h2d(ptr, np.ascontiguousarray(a), self.current_stream())
            if write:
                reads.append((a, ptr))
            return ptr

        with self._lock:
            try:
                addresses = [address(a, True, False) for a in inputs]
                addresses += [address(a, False, True) for a in outputs]
                addresses += self._temps(c)
                arena_addr = 0
                if c.program.uses_arena:
                    if arena is None:
                        raise HologramError("the program uses Φ addressing but no boundary "
                                            "pool was given")
                    arena_addr = address(arena, True, True)
                addresses.append(arena_addr)
                self._run(c, addresses)
                for host, ptr in reads:
                    if host.flags.c_contiguous:
                        dev.copy_d2h(host, ptr, self.current_stream())
                    else:
                        tmp = np.empty(host.shape, host.dtype)
                        dev.copy_d2h(tmp, ptr, self.current_stream())
                        host[...] = tmp
                self._check_index(c)
            finally:
                self.temp_blocks.unstage(staged, self.current_stream())

    def _temps(self, c: CudaProgram) -> list[int]:
        """Device addresses of the program's temps: its one block, laid out by lifetime,
        allocated on the first launch and reused (``cuda_scratch.py``)."""
        return self.temp_blocks.addresses(c, c.temp_layout, self.current_stream())

    def _run(self, c: CudaProgram, addresses: list[int]) -> None:
        dev, stream = self.device, self.current_stream()
        args = pack_args(addresses)
        for step in c.steps:
            if isinstance(step, KernelLaunch):
                dev.launch(step.kernel, step.grid, step.block, 0, args, stream)
                continue
            (sa, oa, lda, bsa), (sb, ob, ldb, bsb), (sc, oc, ldc, bsc) = step.a, step.b, step.c
            for da, db, dc in step.outer:
                dev.gemm_strided_batched(
                    step.dtype, step.trans_a, step.trans_b, step.m, step.n, step.k,
                    addresses[sa] + oa + da, lda, bsa, addresses[sb] + ob + db, ldb, bsb,
                    addresses[sc] + oc + dc, ldc, bsc, step.batch, stream, step.tf32)

    def _check_index(self, c: CudaProgram) -> None:
        """Raise the IndexError a kernel recorded (reading the record waits for the
        launch: only programs that index at run time pay it)."""
        if not c.error_address:
            return
        rec = np.zeros(2, np.uint64)
        self.device.copy_d2h(rec, c.error_address, self.current_stream())
        if rec[0]:
            self.device.memset(c.error_address, 0, 16, self.current_stream())
            raise out_of_range(c.index_sites[int(rec[0]) - 1], int(rec[1].astype(np.int64)))

    def pointer_launcher(self, compiled: CudaProgram
                         ) -> Callable[[Sequence[int], Sequence[int]], None] | None:
        """Raw-address launches, where host addresses are device addresses (the emulated
        device); on a GPU the caller's host tensors are not device memory: None."""
        if not self.properties.emulated or compiled.program.uses_arena:
            return None
        c = compiled
        n = c.n_in + c.n_out

        def run(pointers: Sequence[int], packed: Sequence[int] = ()) -> None:
            if len(pointers) != n:
                raise ValueError(f"expected {n} addresses (inputs, then outputs), "
                                 f"got {len(pointers)}")
            if packed:
                raise ValueError("packed: the cuda backend has no pack sites")
            with self._lock:
                self._run(c, [*pointers, *self._temps(c), 0])
                self._check_index(c)

        return run

    def synchronize(self) -> None:
        """Wait until every launch and copy queued so far has finished."""
        self.device.synchronize(self.current_stream())

    # --- memory and streams ---------------------------------------------------------
    def import_dlpack(self, x: Any) -> tuple[DeviceArray, Any, Any]:
        """``x`` (a kDLCUDA DLPack producer on this device: a ``torch.cuda`` tensor, a
        CuPy array) as a window of device memory, zero-copy (``cuda_dlpack.py``): the
        array, its ISA dtype, the owner to keep alive with it. The producer orders its
        work before this thread's stream."""
        if self.memory.dlpack_device[0] != DLPACK_CUDA:
            raise DLPackError("x: the emulated CUDA device is host memory, not a GPU's: it "
                              "takes no kDLCUDA tensors (copy them in with from_numpy)")
        handle = self.device.stream_handle(self.current_stream())
        return import_device_array(x, self.memory, handle)

    def attach_memory(self, memory: MemoryManager, lock: Any) -> None:
        """Programs' temp blocks come from ``memory``, the executor's pools (``lock``
        guards them)."""
        with self._lock:
            self.temp_blocks.attach(memory, lock)

    def release_scratch(self) -> None:
        """Give the programs' temp blocks back to the pools (``Executor.empty_cache``)."""
        with self._lock:
            self.temp_blocks.release()

    def current_stream(self) -> Any:
        """The stream this thread's work goes on: an external one inside
        :meth:`use_stream`, else the backend's own."""
        external = getattr(self._external, "stream", None)
        return self.stream if external is None else external

    @contextlib.contextmanager
    def use_stream(self, handle: int | None) -> Iterator[None]:
        """Put this thread's launches and copies on the external CUDA stream ``handle``
        (a ``cudaStream_t`` as an int, e.g. ``torch.cuda.current_stream().cuda_stream``)
        while the block runs; None: the backend's own stream.

        Stream semantics both ways: the external stream first waits for the work queued
        on the stream used so far, and when the block ends the stream used afterwards
        waits for the work queued on the external one, so no read or write crosses."""
        if handle is None:
            yield
            return
        if isinstance(handle, bool) or not isinstance(handle, int) or handle < 0:
            raise ValueError(f"stream: expected a CUDA stream handle (an int >= 0), got "
                             f"{handle!r}")
        outer = self.current_stream()
        inner = self.device.external_stream(handle)
        self._handoff(outer, inner)
        saved = getattr(self._external, "stream", None)
        self._external.stream = inner
        try:
            yield
        finally:
            self._external.stream = saved
            self._handoff(inner, outer)
            with self._lock:
                self.temp_blocks.handed_over(inner, outer)

    def _handoff(self, before: Any, after: Any) -> None:
        """Make ``after``'s later work wait for what is queued on ``before`` now."""
        event = self.device.event()
        self.device.record(event, before)
        self.device.wait(after, event)


def launches(compiled: CudaProgram) -> list[tuple[str, tuple[int, ...], tuple[int, ...]]]:
    """(kernel, grid, block) of every kernel launch of ``compiled``, in order."""
    return [(k.name, k.grid, k.block) for k in compiled.kernels()]


__all__ = ["CudaBackend", "CudaMemory", "CudaProgram", "GemmCall", "gemm_call", "launches",
           "pack_args", "plan_grid"]
