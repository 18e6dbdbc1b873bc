"""The WebGPU backend: fused kernels rendered as WGSL and run through wgpu-py.

WebGPU is the portable GPU path: wgpu picks Metal on Apple hardware, Vulkan on
Linux (Mesa's lavapipe runs it on the CPU where there is no GPU, which is how CI
tests it), D3D12 on Windows. ``MetalBackend`` is the same backend on an adapter
whose API is Metal.

Memory: a webgpu executor's buffers live in device memory. Its pools (the same
linear caching pool and 96-class boundary arena as the host's, with the same
limit and statistics) take their bytes from :class:`WebGPUMemory`, so each pool
block is a wgpu storage buffer and the arena is one device buffer; a Buffer
holds a ``DeviceArray`` window of it. A launch binds device operands directly
(at their byte offset, which the pools keep aligned to the adapter's
``min-storage-buffer-offset-alignment``; an unaligned window goes through a
device-to-device copy), dispatches every kernel with temporaries from a staging
cache, and returns without waiting: queue order keeps later reads, writes and
launches after it. Φ-addressed programs bind the arena's used range the same
way. NumPy operands (``Executor.launch`` on host arrays, ``@jit``) keep the
copy path: uploaded into cached device buffers, outputs read back in one
mapped staging buffer before the launch returns. Host and device operands mix
freely in one launch.

Because buffers are device memory, ``Buffer.to_numpy`` returns a copy,
``__dlpack_device__`` is ``(15, 0)`` (DLPack's kDLWebGPU) and ``__dlpack__``
exports only host copies (``dl_device=(1, 0)``).

Pipelines are cached per (adapter, kernel source): the source is a function of
the canonical program, so one canonical program compiles once per process.
The adapter is requested once per process and shared by every executor.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..compiler.lower import Lowered, compute_instructions, lower, unfused_launches
from ..compiler.render_wgsl import MAX_GROUPS, WGSLProgram, render_wgsl, wgsl_type
from ..compiler.schedule import GemmPlan, KernelPlan
from ..errors import BackendUnavailableError, DTypeError, HologramError, ShapeError
from ..isa.dtypes import DType
from ..isa.program import Program
from ..memory.device import DeviceArray
from .base import Backend
from .cpu import ProgramStats, canonical_form
from .webgpu_memory import WebGPUMemory

NO_ADAPTER = ("no WebGPU adapter found (on Linux install Vulkan drivers, e.g. Mesa's lavapipe: "
              "apt-get install mesa-vulkan-drivers)")


class WebGPUCompileError(HologramError, RuntimeError):
    """wgpu rejected a generated kernel; the message holds its log and numbered source."""


def _wgpu() -> Any:
    import wgpu  # lazy: importing hologram must not load wgpu-native

    return wgpu


@functools.cache
def _adapter() -> tuple[Any, str | None]:
    """(adapter, None), or (None, why there is none). Requested once per process."""
    try:
        wgpu = _wgpu()
    except ImportError as e:
        return None, f"wgpu is not installed (pip install 'hologram[webgpu]'): {e}"
    except Exception as e:  # noqa: BLE001 - a broken wgpu-native install raises anything
        return None, f"wgpu failed to load: {type(e).__name__}: {e}"
    log: list[str] = []
    try:
        adapter = _capturing_stderr(
            lambda: wgpu.gpu.request_adapter_sync(power_preference="high-performance"), log)
    except Exception as e:  # noqa: BLE001 - no Vulkan/Metal driver surfaces as various errors
        msg = " ".join(str(e).split())[:300]  # wgpu's errors span lines: keep one
        return None, f"{NO_ADAPTER} ({type(e).__name__}: {msg}){_driver_log(log)}"
    if adapter is None:
        return None, NO_ADAPTER + _driver_log(log)
    if log:  # an adapter exists: pass on what the drivers said, minus the known noise
        sys.stderr.write("".join(log))
    return adapter, None


# Printed by libwayland-client when Mesa's Vulkan WSI looks for a display on a headless
# box; harmless for compute, and it would otherwise greet every `hologram info`.
_NOISE = ("XDG_RUNTIME_DIR is invalid or not set",)


def _capturing_stderr(fn: Any, log: list[str]) -> Any:
    """Call ``fn`` with file descriptor 2 redirected to a temporary file (drivers print
    there from native code), appending the captured lines, minus known noise, to ``log``."""
    import tempfile

    try:
        saved = os.dup(2)
    except OSError:
        return fn()
    with tempfile.TemporaryFile() as tmp:
        sys.stderr.flush()
        os.dup2(tmp.fileno(), 2)
        try:
            return fn()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode(errors="replace")
            log += [ln for ln in text.splitlines(keepends=True)
                    if not any(n in ln for n in _NOISE)]


def _driver_log(log: list[str]) -> str:
    text = " ".join("".join(log).split())
    return f"; the driver said: {text[-300:]}" if text else ""


def adapter_problem() -> str | None:
    """None if a WebGPU adapter exists here, else the reason (cached: probes stay cheap)."""
    return _adapter()[1]


def adapter_info() -> dict[str, Any]:
    """The adapter's vendor/device/backend_type/adapter_type (empty if there is none)."""
    adapter = _adapter()[0]
    return dict(adapter.info) if adapter is not None else {}


def metal_problem() -> str | None:
    """None if WebGPU runs on a Metal adapter here, else the reason."""
    if sys.platform != "darwin":
        return f"Metal needs macOS (this is {sys.platform})"
    reason = adapter_problem()
    if reason is not None:
        return reason
    api = adapter_info().get("backend_type", "")
    if api.lower() != "metal":
        return f"the WebGPU adapter uses {api or 'an unknown API'}, not Metal"
    return None


class DevicePool:
    """Cached staging, upload and temporary device buffers, binned by size.

    Not the executor's memory (that is the pools over :class:`WebGPUMemory`): this
    caches what launches borrow for the duration of one launch (uploads of NumPy
    operands, kernel temporaries, read-back staging), so steady-state launches
    allocate nothing on the device. Cached (free) bytes beyond ``keep_bytes`` are
    dropped, oldest first. Dropped, not destroyed: a buffer given back right after
    a submit may still be in use by queued work, and wgpu frees a released buffer
    only once that work is done.
    """

    def __init__(self, device: Any, keep_bytes: int = 256 << 20) -> None:
        self.device = device
        self.keep_bytes = keep_bytes
        self.free: dict[tuple[int, int], list[Any]] = {}
        self.order: list[Any] = []  # free buffers, oldest first
        self.in_use = 0
        self.cached = 0
        self.peak = 0
        self.created = 0

    @staticmethod
    def bin_size(nbytes: int) -> int:
        """256 bytes minimum, then powers of two and their 1.5x midpoints (<= 33% slack)."""
        n = max(int(nbytes), 256)
        p = 1 << (n - 1).bit_length()
        mid = (p // 4) * 3
        return mid if mid >= n and mid % 256 == 0 else p

    def acquire(self, nbytes: int, usage: int) -> Any:
        size = self.bin_size(nbytes)
        stack = self.free.get((size, usage))
        if stack:
            buf = stack.pop()
            self.order.remove(buf)
            self.cached -= size
        else:
            buf = self.device.create_buffer(size=size, usage=usage)
            self.created += 1
        self.in_use += size
        self.peak = max(self.peak, self.in_use)
        return buf

    def release(self, buf: Any) -> None:
        size, usage = buf.size, int(buf.usage)
        self.in_use -= size
        self.free.setdefault((size, usage), []).append(buf)
        self.order.append(buf)
        self.cached += size
        while self.cached > self.keep_bytes and self.order:
            old = self.order.pop(0)
            self.free[(old.size, int(old.usage))].remove(old)
            self.cached -= old.size

    def empty_cache(self) -> None:
        self.free.clear()
        self.order.clear()
        self.cached = 0

    def stats(self) -> dict[str, int]:
        return {"device_bytes_in_use": self.in_use, "device_bytes_cached": self.cached,
                "device_peak_bytes": self.peak, "device_buffers_created": self.created}


class _Device:
    """One wgpu device per adapter per process: its queue, pipelines and buffer pool."""

    def __init__(self, adapter: Any) -> None:
        wgpu = _wgpu()
        self.adapter = adapter
        self.info = dict(adapter.info)
        feats = set(adapter.features)
        self.f16 = "shader-f16" in feats
        lim = adapter.limits
        # WebGPU's defaults (8 storage buffers per stage, 128 MiB bindings) are lower
        # than most adapters allow; ask for what the adapter has.
        wanted = {k: lim[k] for k in ("max-storage-buffers-per-shader-stage",
                                      "max-storage-buffer-binding-size", "max-buffer-size",
                                      "max-compute-workgroup-storage-size") if k in lim}
        self.device = adapter.request_device_sync(
            required_features=["shader-f16"] if self.f16 else [], required_limits=wanted)
        self.limits = dict(self.device.limits)
        self.queue = self.device.queue
        self.lock = threading.RLock()
        # Kernels loop grid-stride, so any workgroup count is correct. A CPU adapter
        # (lavapipe) runs workgroups on a few cores and pays per workgroup: 8 per core
        # measured 1.3-2x faster than one per 256 elements there (gelu 1M, softmax
        # 1024x1024, 2 cores). GPUs get the full count.
        cpu = str(self.info.get("adapter_type", "")).lower() == "cpu"
        self.max_groups = max(8, 8 * (os.cpu_count() or 1)) if cpu else MAX_GROUPS
        self.pipelines: dict[str, Any] = {}
        self.pool = DevicePool(self.device)
        U = wgpu.BufferUsage  # noqa: N806
        self.storage_usage = int(U.STORAGE | U.COPY_DST | U.COPY_SRC)
        self.readback_usage = int(U.MAP_READ | U.COPY_DST)
        self.map_read = wgpu.MapMode.READ
        self.memory = WebGPUMemory(self)  # what webgpu executors' pools allocate from
        self.pending = False  # work submitted since the last synchronize
        self.fence: Any = None  # a 4-byte buffer synchronize reads back (created on use)

    def pipeline(self, source: str, entry: str) -> Any:
        """The compute pipeline for ``entry`` in ``source``, built once per process."""
        key = hashlib.sha256(source.encode()).hexdigest()
        p = self.pipelines.get(key)
        if p is None:
            try:
                module = self.device.create_shader_module(code=source)
                p = self.device.create_compute_pipeline(
                    layout="auto", compute={"module": module, "entry_point": entry})
            except Exception as e:  # noqa: BLE001 - wgpu raises GPUValidationError & co
                numbered = "\n".join(f"{i + 1:4d}  {ln}" for i, ln in
                                     enumerate(source.splitlines()))
                raise WebGPUCompileError(f"wgpu could not build kernel {entry}:\n{e}\n"
                                         f"--- source ---\n{numbered}") from e
            self.pipelines[key] = p
        return p


@functools.cache
def shared_device() -> _Device:
    adapter, reason = _adapter()
    if adapter is None:
        raise BackendUnavailableError(f"backend 'webgpu' is not available: {reason}")
    return _Device(adapter)


@dataclass
class WebGPUProgram:
    """A compiled program: its WGSL kernels, pipelines, and the buffers it needs."""

    program: Program
    canonical: Program
    lowered: Lowered
    stats: ProgramStats
    wgsl: WGSLProgram
    pipelines: list[Any]
    slot_bytes: dict[int, int]  # bytes of every slot a kernel binds
    n_in: int
    n_out: int
    arena_slot: int
    arena_written: bool
    used_slots: list[int] = field(default_factory=list)

    @property
    def source(self) -> str:
        return self.wgsl.source


def _check_dtype(d: DType, backend: str, f16: bool) -> None:
    """DTypeError unless WGSL on this adapter has ``d`` (no f64, i64, bf16, 8- or 16-bit
    integers; f16 only with 'shader-f16')."""
    if wgsl_type(d, backend) == "f16" and not f16:
        raise DTypeError(f"f16: the {backend} backend needs the adapter feature "
                         "'shader-f16', which this adapter lacks")


def _check_dtypes(program: Program, backend: str, f16: bool) -> None:
    for d in {v.dtype for v in program.instructions}:
        _check_dtype(d, backend, f16)


class WebGPUBackend(Backend):
    """WGSL kernels on a WebGPU adapter; executors' buffers in its device memory."""

    name = "webgpu"
    device_type = "webgpu"  # executors' buffers are device memory (see the module docstring)

    def __init__(self) -> None:
        self.dev = shared_device()

    def describe(self) -> str:
        i = self.dev.info
        return (f"{self.name} ({i.get('device') or i.get('vendor')}, "
                f"{i.get('backend_type')}, {i.get('adapter_type', '?').lower()} adapter)")

    def check_buffer_dtype(self, dtype: DType) -> None:
        if dtype.kind == "b":  # programs compute bool, but a buffer of it cannot bind
            raise DTypeError(f"bool: the {self.name} backend cannot keep bool buffers (WGSL "
                             "storage has no 1-byte bool; store u8 on the cpu or cuda "
                             "backend, or cast to i32 or u32 first)")
        _check_dtype(dtype, self.name, self.dev.f16)

    # --- compile ------------------------------------------------------------------------
    def compile(self, program: Program) -> WebGPUProgram:
        program.verify()
        _check_dtypes(program, self.name, self.dev.f16)
        canon, rules, before = canonical_form(program)
        _check_dtypes(canon, self.name, self.dev.f16)
        rendered: list[WGSLProgram] = []

        def render(sched: Any, slots: Any) -> str:
            w = render_wgsl(sched, slots, self.dev.f16, self.name)
            rendered.append(w)
            return w.source

        low = lower(canon, render)
        wgsl = rendered[-1]
        limit = self.dev.limits.get("max-storage-buffers-per-shader-stage", 8)
        for k in wgsl.kernels:
            if len(k.bindings) > limit:
                raise HologramError(f"kernel {k.name} binds {len(k.bindings)} buffers; this "
                                    f"adapter allows {limit} per shader stage")
        with self.dev.lock:
            pipelines = [self.dev.pipeline(k.source, k.name) for k in wgsl.kernels]
        sched = low.schedule
        arena_slot = low.n_slots - 1
        slot_bytes: dict[int, int] = {}
        for ref, slot in low.slots.items():
            if slot == arena_slot:
                continue
            slot_bytes[slot] = ref.size * ref.dtype.itemsize
        if wgsl.arena_range is not None:
            lo, hi = wgsl.arena_range
            slot_bytes[arena_slot] = hi - lo
        arena_written = any(d.kind == "arena" for st in sched.steps
                            for d in ([st.out] if isinstance(st, GemmPlan) else
                                      [x for _, x in (st.all_sinks if isinstance(
                                          st, KernelPlan) else st.sinks)]))
        used = sorted({s for k in wgsl.kernels for s in k.bindings})
        stats = ProgramStats(before, compute_instructions(canon), unfused_launches(program),
                             low.launches, rules)
        return WebGPUProgram(program, canon, low, stats, wgsl, pipelines, slot_bytes,
                             len(canon.inputs), len(canon.output_specs), arena_slot,
                             arena_written, used)

    # --- launch -------------------------------------------------------------------------
    def launch(self, compiled: WebGPUProgram, inputs: Sequence[Any],
               outputs: Sequence[Any], arena: Any = None) -> None:
        """Dispatch every kernel in order in one command encoder.

        Operands may be ``DeviceArray`` windows (bound where they are; the launch
        returns without waiting) or NumPy arrays (uploaded first; NumPy outputs are
        read back before the launch returns). ``arena`` is the executor's boundary
        arena, either kind; a Φ-addressed program binds the range it uses.
        """
        dev = self.dev
        c = compiled
        with dev.lock:
            run = _Launch(dev)
            try:
                binds = {slot: self._bind_slot(run, c, slot, inputs, outputs, arena)
                         for slot in c.used_slots}
                self._dispatch(run.encoder, c, self._bind_groups(c, binds))
                run.finish()
            finally:
                run.give_back()

    def bind(self, compiled: WebGPUProgram, inputs: Sequence[Any], outputs: Sequence[Any],
             arena: Any = None) -> Any:
        """A repeatable launch. When every slot binds device memory where it is (device
        operands at bindable offsets, no temporaries, no NumPy operands), the bind
        groups are built once here and a call only records the dispatches and submits:
        the op library's repeated calls on the same Buffers take this path."""
        c = compiled
        dev = self.dev
        binds: dict[int, tuple[Any, int, int]] = {}
        for slot in c.used_slots:
            if slot < c.n_in + c.n_out:
                a = inputs[slot] if slot < c.n_in else outputs[slot - c.n_in]
            elif slot == c.arena_slot and c.wgsl.arena_range is not None and arena is not None:
                lo, hi = c.wgsl.arena_range
                a = arena[lo:hi] if hi <= arena.nbytes else None
            else:
                a = None  # a temporary: borrowed per launch
            where = _resident(a, dev.memory)
            if where is None:
                return super().bind(compiled, inputs, outputs, arena)
            binds[slot] = where
        with dev.lock:
            groups = self._bind_groups(c, binds)

        def call() -> None:
            with dev.lock:
                encoder = dev.device.create_command_encoder()
                self._dispatch(encoder, c, groups)
                dev.queue.submit([encoder.finish()])
                dev.pending = True

        return call

    def _bind_groups(self, c: WebGPUProgram, binds: dict[int, tuple[Any, int, int]]
                     ) -> list[Any]:
        """One bind group per kernel: binding N = slot N, at its (buffer, offset, size)."""
        return [self.dev.device.create_bind_group(
                    layout=pipe.get_bind_group_layout(0),
                    entries=[{"binding": s, "resource": {"buffer": binds[s][0],
                                                         "offset": binds[s][1],
                                                         "size": binds[s][2]}}
                             for s in k.bindings])
                for k, pipe in zip(c.wgsl.kernels, c.pipelines, strict=True)]

    def _dispatch(self, encoder: Any, c: WebGPUProgram, groups: list[Any]) -> None:
        """Record every kernel of ``c``, in order, one compute pass each (passes end
        with a barrier, so a kernel sees what the one before it wrote)."""
        cap = self.dev.max_groups
        for k, pipe, group in zip(c.wgsl.kernels, c.pipelines, groups, strict=True):
            cpass = encoder.begin_compute_pass()
            cpass.set_pipeline(pipe)
            cpass.set_bind_group(0, group)
            cpass.dispatch_workgroups(*(min(g, cap) for g in k.groups))
            cpass.end()

    @staticmethod
    def _bind_slot(run: _Launch, c: WebGPUProgram, slot: int, inputs: Sequence[Any],
                   outputs: Sequence[Any], arena: Any) -> tuple[Any, int, int]:
        """What slot ``slot`` binds: an input, an output, the used arena range, or a
        temporary (written by the kernels before they read it)."""
        if slot < c.n_in:
            return run.operand(inputs[slot], read=True, write=False)
        if slot < c.n_in + c.n_out:
            return run.operand(outputs[slot - c.n_in], read=False, write=True)
        if slot == c.arena_slot and c.wgsl.arena_range is not None:
            if arena is None:
                raise ShapeError("the program uses Φ addressing but no boundary pool was given")
            lo, hi = c.wgsl.arena_range
            if hi > arena.nbytes:
                raise ShapeError(f"Φ-addressed data ends at byte {hi}, past the "
                                 f"{arena.nbytes}-byte boundary pool")
            return run.operand(arena[lo:hi], read=True, write=c.arena_written)
        return run.temp(c.slot_bytes[slot])

    def synchronize(self) -> None:
        """Wait until every launch submitted so far has finished on the device."""
        dev = self.dev
        with dev.lock:
            if dev.pending:
                # A read maps a staging buffer after everything queued before it, so it
                # is a fence (wgpu-py's on_submitted_work_done does not bind to this
                # wgpu-native).
                if dev.fence is None:
                    dev.fence = dev.memory.create(4)
                dev.memory.read(dev.fence, 0, 4)
                dev.pending = False

    # --- memory -------------------------------------------------------------------------
    @property
    def device_memory(self) -> WebGPUMemory:
        """Where executors on this backend keep their buffers (their pools' allocator)."""
        return self.dev.memory

    def memory_stats(self) -> dict[str, int]:
        """The launch staging cache (uploads of NumPy operands, temporaries, read-back);
        the executor's buffers are in ``Executor.memory_stats``."""
        with self.dev.lock:
            return self.dev.pool.stats()

    def empty_cache(self) -> None:
        """Drop the cached staging buffers (pipelines stay)."""
        with self.dev.lock:
            self.dev.pool.empty_cache()


class _Launch:
    """One launch's bookkeeping: its command encoder, the buffers it borrowed from the
    staging cache, device outputs that were bound through a temporary (copied back
    after the kernels), and NumPy outputs to read back."""

    def __init__(self, dev: _Device) -> None:
        self.dev = dev
        self.memory: WebGPUMemory = dev.memory
        self.encoder = dev.device.create_command_encoder()
        self.borrowed: list[Any] = []
        self.copy_back: list[tuple[Any, DeviceArray, int]] = []  # (temp, window, bytes)
        self.reads: list[tuple[Any, np.ndarray]] = []

    def temp(self, nbytes: int) -> tuple[Any, int, int]:
        size = max(4, -(-nbytes // 4) * 4)
        buf = self.dev.pool.acquire(size, self.dev.storage_usage)
        self.borrowed.append(buf)
        return self._checked(buf, 0, size)

    def _checked(self, buf: Any, offset: int, size: int) -> tuple[Any, int, int]:
        limit = self.memory.max_binding
        if limit is not None and size > limit:
            raise ShapeError(f"a kernel operand of {size} bytes is larger than this adapter's "
                             f"max-storage-buffer-binding-size ({limit} bytes)")
        return buf, offset, size

    def operand(self, a: Any, read: bool, write: bool) -> tuple[Any, int, int]:
        """The binding of operand ``a``: a device window where it is, else a temporary."""
        if isinstance(a, DeviceArray):
            return self._device(a, read, write)
        bound = self.temp(a.nbytes)
        if read and a.nbytes:
            self.dev.queue.write_buffer(bound[0], 0, _padded(np.ascontiguousarray(a)))
        if write and a.nbytes:
            self.reads.append((bound[0], a))
        return bound

    def _device(self, a: DeviceArray, read: bool, write: bool) -> tuple[Any, int, int]:
        n = a.nbytes
        if not n:
            return self.temp(0)
        if n % 4 and a.offset + n + (-n % 4) <= a.handle.size:
            # an odd number of f16 elements: the binding takes the word they end in (a
            # pool block's padding, never another buffer's bytes: blocks are 64-byte
            # aligned); kernels index only the operand's own elements
            n += -n % 4
        if a.offset % 4 or n % 4:
            raise ShapeError(f"a device operand of {n} bytes at byte {a.offset} is not "
                             "4-byte aligned (WebGPU binds whole 4-byte words)")
        if a.offset % self.memory.offset_alignment == 0:
            return self._checked(a.handle, a.offset, n)
        # An offset the adapter cannot bind at: through a temporary, on the device.
        bound = self.temp(n)
        if read:
            self.memory.encode_copy(self.encoder, a.handle, a.offset, bound[0], 0, n,
                                    self.borrowed)
        if write:
            self.copy_back.append((bound[0], a, n))
        return bound

    def finish(self) -> None:
        """Copy device outputs back from temporaries, submit, and read NumPy outputs back
        through one mapped staging buffer (the only wait)."""
        dev, encoder = self.dev, self.encoder
        for buf, a, n in self.copy_back:
            encoder.copy_buffer_to_buffer(buf, 0, a.handle, a.offset, n)
        if not self.reads:
            dev.queue.submit([encoder.finish()])
            dev.pending = True
            return
        plan: list[tuple[int, np.ndarray]] = []  # (staging offset, destination)
        off = 0
        for _, dst in self.reads:
            plan.append((off, dst))
            off += -(-dst.nbytes // 256) * 256
        staging = dev.pool.acquire(off, dev.readback_usage)
        self.borrowed.append(staging)
        for (buf, dst), (o, _) in zip(self.reads, plan, strict=True):
            encoder.copy_buffer_to_buffer(buf, 0, staging, o, -(-dst.nbytes // 4) * 4)
        dev.queue.submit([encoder.finish()])
        dev.pending = False  # mapping waits for everything submitted before it
        staging.map_sync(dev.map_read, 0, staging.size)
        try:
            raw = np.frombuffer(staging.read_mapped(0, off, copy=False), np.uint8)
            for o, dst in plan:
                np.copyto(dst, raw[o:o + dst.nbytes].view(dst.dtype).reshape(dst.shape))
        finally:
            staging.unmap()

    def give_back(self) -> None:
        """Return the borrowed buffers to the cache; queued work that still uses them
        runs before anything recorded later, so they are free to reuse at once."""
        for b in self.borrowed:
            self.dev.pool.release(b)
        self.borrowed.clear()


class MetalBackend(WebGPUBackend):
    """WebGPU on a Metal adapter: the Apple GPU path."""

    name = "metal"

    def __init__(self) -> None:
        reason = metal_problem()
        if reason is not None:
            raise BackendUnavailableError(f"backend 'metal' is not available: {reason}")
        super().__init__()


def _resident(a: Any, memory: WebGPUMemory) -> tuple[Any, int, int] | None:
    """(buffer, offset, size) when ``a`` is a device window bindable where it is, else
    None (a NumPy array, a temporary, an empty or unaligned window: those need a
    launch that borrows buffers)."""
    if not isinstance(a, DeviceArray) or a.memory is not memory or not a.nbytes:
        return None
    n = a.nbytes
    if a.offset % memory.offset_alignment or n % 4:
        return None
    if memory.max_binding is not None and n > memory.max_binding:
        return None
    return a.handle, a.offset, n


def _padded(a: np.ndarray) -> np.ndarray:
    """Bytes of ``a`` padded to a multiple of 4 (WebGPU copies move whole words)."""
    raw = a.reshape(-1).view(np.uint8)
    extra = -raw.nbytes % 4
    return np.concatenate([raw, np.zeros(extra, np.uint8)]) if extra else raw
