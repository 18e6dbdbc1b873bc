"""WebGPU device memory for the executor's pools: buffers, and bytes in, out and across.

A webgpu executor's pools (the linear caching pool and the boundary arena) get
their bytes from :class:`WebGPUMemory`: each pool block is one wgpu storage
buffer, and a :class:`~hologram.memory.device.DeviceArray` window of it is what
buffers hold and what launches bind. This module is the only place that moves
those bytes, so it is where WebGPU's rules live:

* copies, clears and queue writes move whole 4-byte words at 4-byte offsets, so
  an unaligned range is widened to words (and a write merges the edge words it
  does not own, read first);
* a buffer cannot be copied onto itself (wgpu rejects it even for disjoint
  ranges), so a copy within one buffer (two boundary buffers of the one arena)
  goes through a scratch buffer in the same command encoder;
* reads map one staging buffer (from the backend's staging cache), after the
  queue's earlier work, so a read sees every launch submitted before it.

All queue work is ordered, so a write, a launch and a read issued in that order
happen in that order without waiting in between; only reads wait.
"""

from __future__ import annotations

from typing import Any

import numpy as np

DLPACK_WEBGPU = 15  # DLPack's kDLWebGPU device type


def _floor4(n: int) -> int:
    return n & ~3


def _ceil4(n: int) -> int:
    return -(-n // 4) * 4


class WebGPUMemory:
    """The process's shared wgpu device as a ``DeviceMemory`` (see hologram.memory.device).

    ``dev`` is the backend's device record: it has ``device``, ``queue``, ``lock``,
    ``limits``, ``pool`` (staging/upload cache), ``storage_usage``,
    ``readback_usage`` and ``map_read``.
    """

    name = "webgpu"
    dlpack_device = (DLPACK_WEBGPU, 0)

    def __init__(self, dev: Any) -> None:
        self.dev = dev
        # Binding offsets must be multiples of this (32 on lavapipe, 256 on most GPUs);
        # pool blocks start at 0 and boundary classes at multiples of 12,288 = 48 * 256.
        self.offset_alignment: int = int(dev.limits.get("min-storage-buffer-offset-alignment",
                                                        256))
        self.max_buffer: int | None = dev.limits.get("max-buffer-size")
        self.max_binding: int | None = dev.limits.get("max-storage-buffer-binding-size")

    def __repr__(self) -> str:
        return f"WebGPUMemory({self.dev.info.get('device') or self.dev.info.get('vendor')})"

    # --- buffers ------------------------------------------------------------------------
    def create(self, nbytes: int) -> Any:
        """A storage buffer of ``nbytes`` rounded up to whole words (zero-filled, as
        WebGPU guarantees). MemoryError when the adapter cannot hold it."""
        size = max(4, _ceil4(nbytes))
        if self.max_buffer is not None and size > self.max_buffer:
            raise MemoryError(f"{nbytes} bytes is more than this adapter's max-buffer-size "
                              f"({self.max_buffer} bytes)")
        dev = self.dev
        with dev.lock:
            try:
                return dev.device.create_buffer(size=size, usage=dev.storage_usage)
            except Exception as e:  # noqa: BLE001 - wgpu reports OOM as various errors
                raise MemoryError(f"wgpu could not create a {size}-byte buffer: "
                                  f"{' '.join(str(e).split())[:200]}") from e

    # --- bytes out ----------------------------------------------------------------------
    def read(self, handle: Any, offset: int, nbytes: int) -> np.ndarray:
        """A host copy of ``nbytes`` from ``offset`` (waits for earlier queue work)."""
        lo, hi = _floor4(offset), _ceil4(offset + nbytes)
        dev = self.dev
        with dev.lock:
            staging = dev.pool.acquire(hi - lo, dev.readback_usage)
            try:
                encoder = dev.device.create_command_encoder()
                encoder.copy_buffer_to_buffer(handle, lo, staging, 0, hi - lo)
                dev.queue.submit([encoder.finish()])
                staging.map_sync(dev.map_read, 0, staging.size)
                try:
                    raw = np.frombuffer(staging.read_mapped(0, hi - lo, copy=False), np.uint8)
                    return raw[offset - lo:offset - lo + nbytes].copy()
                finally:
                    staging.unmap()
            finally:
                dev.pool.release(staging)

    # --- bytes in -----------------------------------------------------------------------
    def write(self, handle: Any, offset: int, data: np.ndarray) -> None:
        """Upload the uint8 array ``data`` to ``offset`` (queued: ordered after earlier
        launches, before later ones)."""
        n = data.nbytes
        lo, hi = _floor4(offset), _ceil4(offset + n)
        if (lo, hi) != (offset, offset + n):  # merge the edge words we do not own
            words = self.read(handle, lo, hi - lo)
            words[offset - lo:offset - lo + n] = data
            data = words
        with self.dev.lock:
            self.dev.queue.write_buffer(handle, lo, np.ascontiguousarray(data))

    def clear(self, handle: Any, offset: int, nbytes: int) -> None:
        """Zero ``nbytes`` from ``offset`` on the device (no upload when word-aligned)."""
        if offset % 4 or nbytes % 4:
            self.write(handle, offset, np.zeros(nbytes, np.uint8))
            return
        dev = self.dev
        with dev.lock:
            encoder = dev.device.create_command_encoder()
            encoder.clear_buffer(handle, offset, nbytes)
            dev.queue.submit([encoder.finish()])

    # --- bytes across -------------------------------------------------------------------
    def copy(self, src: Any, src_offset: int, dst: Any, dst_offset: int, nbytes: int) -> None:
        """Copy on the device; through the host only for ranges that are not word-aligned."""
        if src_offset % 4 or dst_offset % 4 or nbytes % 4:
            self.write(dst, dst_offset, self.read(src, src_offset, nbytes))
            return
        dev = self.dev
        with dev.lock:
            borrowed: list[Any] = []
            try:
                encoder = dev.device.create_command_encoder()
                self.encode_copy(encoder, src, src_offset, dst, dst_offset, nbytes, borrowed)
                dev.queue.submit([encoder.finish()])
            finally:
                for b in borrowed:
                    dev.pool.release(b)

    def encode_copy(self, encoder: Any, src: Any, src_offset: int, dst: Any, dst_offset: int,
                    nbytes: int, borrowed: list[Any]) -> None:
        """Record a word-aligned device copy in ``encoder``. Within one buffer (which wgpu
        refuses to copy onto itself) it goes through a pooled scratch buffer, appended to
        ``borrowed``: the caller gives it back to the pool once the encoder is submitted."""
        if src is not dst:
            encoder.copy_buffer_to_buffer(src, src_offset, dst, dst_offset, nbytes)
            return
        scratch = self.dev.pool.acquire(nbytes, self.dev.storage_usage)
        borrowed.append(scratch)
        encoder.copy_buffer_to_buffer(src, src_offset, scratch, 0, nbytes)
        encoder.copy_buffer_to_buffer(scratch, 0, dst, dst_offset, nbytes)
