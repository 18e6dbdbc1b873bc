"""The WebGPU backend: fused kernels rendered as WGSL and run through wgpu-py.

WebGPU is the portable GPU path: wgpu picks Metal on Apple hardware, Vulkan on
Linux (Mesa's lavapipe runs it on the CPU where there is no GPU, which is how CI
tests it), D3D12 on Windows. ``MetalBackend`` is the same backend on an adapter
whose API is Metal.

Memory: the executor's buffers live in host pools (NumPy views), and that stays
the source of truth. Each launch uploads the program's inputs into device
storage buffers (reused from a per-size cache), dispatches the kernels in order
with temporaries kept on the device, then copies the outputs back into the
caller's arrays in one read-back. So every launch pays host<->device copies of
its operands: on lavapipe the "device" is host memory anyway, and on a discrete
GPU this is honest but not fast (device-resident buffers need an executor that
does not assume host memory). Because buffers stay host memory,
``__dlpack_device__`` stays CPU, which is correct.

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
from ..compiler.schedule import GemmPlan
from ..errors import BackendUnavailableError, DTypeError, HologramError, ShapeError
from ..isa.program import Program
from .base import Backend
from .cpu import ProgramStats, canonical_form

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
    """Cached device storage buffers, binned by size like the host linear pool.

    Launches take buffers from here and give them back when the read-back is done,
    so steady-state launches allocate nothing on the device. Cached (free) bytes
    beyond ``keep_bytes`` are destroyed, oldest first.
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
            old.destroy()

    def empty_cache(self) -> None:
        for buf in self.order:
            buf.destroy()
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


def _check_dtypes(program: Program, backend: str, f16: bool) -> None:
    for v in program.instructions:
        t = wgsl_type(v.dtype, backend)  # DTypeError for f64, i64, bf16
        if t == "f16" and not f16:
            raise DTypeError(f"f16: the {backend} backend needs the adapter feature "
                             "'shader-f16', which this adapter lacks")


class WebGPUBackend(Backend):
    """WGSL kernels on a WebGPU adapter; host buffers copied in and out per launch."""

    name = "webgpu"
    device_type = "cpu"  # buffers are host memory (see the module docstring)

    def __init__(self) -> None:
        self.dev = shared_device()

    def describe(self) -> str:
        i = self.dev.info
        return (f"{self.name} ({i.get('device') or i.get('vendor')}, "
                f"{i.get('backend_type')}, {i.get('adapter_type', '?').lower()} adapter)")

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
                                      [x for _, x in st.sinks]))
        used = sorted({s for k in wgsl.kernels for s in k.bindings})
        stats = ProgramStats(before, compute_instructions(canon), unfused_launches(program),
                             low.launches, rules)
        return WebGPUProgram(program, canon, low, stats, wgsl, pipelines, slot_bytes,
                             len(canon.inputs), len(canon.output_specs), arena_slot,
                             arena_written, used)

    # --- launch -------------------------------------------------------------------------
    def launch(self, compiled: WebGPUProgram, inputs: Sequence[np.ndarray],
               outputs: Sequence[np.ndarray], arena: np.ndarray | None = None) -> None:
        """Upload inputs, dispatch every kernel in order, read the outputs back."""
        dev = self.dev
        c = compiled
        with dev.lock:
            bufs: dict[int, Any] = {}
            try:
                for slot in c.used_slots:
                    bufs[slot] = dev.pool.acquire(max(c.slot_bytes[slot], 4),
                                                  dev.storage_usage)
                    data = self._host_data(c, slot, inputs, arena)
                    if data is not None and data.nbytes:
                        dev.queue.write_buffer(bufs[slot], 0, _padded(data))
                encoder = dev.device.create_command_encoder()
                for k, pipe in zip(c.wgsl.kernels, c.pipelines, strict=True):
                    group = dev.device.create_bind_group(
                        layout=pipe.get_bind_group_layout(0),
                        entries=[{"binding": s, "resource": {"buffer": bufs[s], "offset": 0,
                                                             "size": bufs[s].size}}
                                 for s in k.bindings])
                    cpass = encoder.begin_compute_pass()
                    cpass.set_pipeline(pipe)
                    cpass.set_bind_group(0, group)
                    cpass.dispatch_workgroups(*(min(g, dev.max_groups) for g in k.groups))
                    cpass.end()
                self._read_back(c, encoder, bufs, outputs, arena)
            finally:
                for b in bufs.values():
                    dev.pool.release(b)

    def _host_data(self, c: WebGPUProgram, slot: int, inputs: Sequence[np.ndarray],
                   arena: np.ndarray | None) -> np.ndarray | None:
        """What a slot starts with on the device: an input, the used arena range, or
        nothing (outputs and temps are written by the kernels before they are read)."""
        if slot < c.n_in:
            return np.ascontiguousarray(inputs[slot])
        if slot == c.arena_slot and c.wgsl.arena_range is not None:
            if arena is None:
                raise ShapeError("the program uses Φ addressing but no boundary pool was given")
            lo, hi = c.wgsl.arena_range
            if hi > arena.nbytes:
                raise ShapeError(f"Φ-addressed data ends at byte {hi}, past the "
                                 f"{arena.nbytes}-byte boundary pool")
            return arena[lo:hi]
        return None

    def _read_back(self, c: WebGPUProgram, encoder: Any, bufs: dict[int, Any],
                   outputs: Sequence[np.ndarray], arena: np.ndarray | None) -> None:
        """Copy outputs (and a written arena range) into one staging buffer, map it once."""
        dev = self.dev
        plan: list[tuple[int, int, int]] = []  # (slot, staging offset, bytes)
        off = 0
        for i in range(c.n_out):
            slot = c.n_in + i
            n = outputs[i].nbytes
            if n and slot in bufs:
                plan.append((slot, off, n))
                off += -(-n // 256) * 256
        if c.arena_written and c.arena_slot in bufs:
            n = c.slot_bytes[c.arena_slot]
            plan.append((c.arena_slot, off, n))
            off += -(-n // 256) * 256
        if not plan:
            dev.queue.submit([encoder.finish()])
            return
        staging = dev.pool.acquire(off, dev.readback_usage)
        try:
            for slot, o, n in plan:
                encoder.copy_buffer_to_buffer(bufs[slot], 0, staging, o, -(-n // 4) * 4)
            dev.queue.submit([encoder.finish()])
            staging.map_sync(dev.map_read, 0, staging.size)
            try:
                raw = np.frombuffer(staging.read_mapped(0, off, copy=False), np.uint8)
                for slot, o, n in plan:
                    if slot == c.arena_slot:
                        assert arena is not None and c.wgsl.arena_range is not None
                        lo, hi = c.wgsl.arena_range
                        arena[lo:hi] = raw[o:o + n]
                        continue
                    dst = outputs[slot - c.n_in]
                    src = raw[o:o + n].view(dst.dtype).reshape(dst.shape)
                    np.copyto(dst, src)
            finally:
                staging.unmap()
        finally:
            dev.pool.release(staging)

    # --- memory -------------------------------------------------------------------------
    def memory_stats(self) -> dict[str, int]:
        """Device-side bytes (the host pools' stats come from ``Executor.memory_stats``)."""
        with self.dev.lock:
            return self.dev.pool.stats()

    def empty_cache(self) -> None:
        """Destroy the cached device buffers (pipelines stay)."""
        with self.dev.lock:
            self.dev.pool.empty_cache()


class MetalBackend(WebGPUBackend):
    """WebGPU on a Metal adapter: the Apple GPU path."""

    name = "metal"

    def __init__(self) -> None:
        reason = metal_problem()
        if reason is not None:
            raise BackendUnavailableError(f"backend 'metal' is not available: {reason}")
        super().__init__()


def _padded(a: np.ndarray) -> np.ndarray:
    """Bytes of ``a`` padded to a multiple of 4 (WebGPU copies move whole words)."""
    raw = a.reshape(-1).view(np.uint8)
    extra = -raw.nbytes % 4
    return np.concatenate([raw, np.zeros(extra, np.uint8)]) if extra else raw
