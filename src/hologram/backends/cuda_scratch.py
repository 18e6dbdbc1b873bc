"""Where a CUDA program's temps live: one device block per program, kept across calls.

Why: the scheduler gives every materialized intermediate its own temp. Allocating
each one on the device per program (as the backend first did) costs one
``cudaMalloc``-sized allocation per temp and as many bytes as all temps together;
``compiler/temp_memory.py`` lays the temps out by lifetime in one block (temps whose
steps never meet share bytes), as the CPU backend does. Here that block is taken
once per program from the executor's pools (the linear pool only: scratch is never
Φ-addressable), so it shows in ``Executor.memory_stats()``, counts against
``memory_limit`` and goes back with ``Executor.empty_cache()``; a call after the
first allocates nothing.

Ordering: the launches of one program reuse its block, which is safe while they are
ordered. Launches on the backend's own stream are; a launch on another stream (an
external one, such as PyTorch's current stream) first makes that stream wait for the
work queued on the stream that used the block last (an event), so two streams never
write one program's temps at the same time.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..compiler.temp_memory import TempLayout
from ..memory import Block, MemoryManager
from .cuda_device import CudaDevice


@dataclass
class _Held:
    """One program's block: where it is, each temp's address, and the stream that used
    it last."""

    program: weakref.ref
    block: Block
    addresses: list[int]
    stream: Any


class TempBlocks:
    """The temp blocks of one backend's programs, and the staging of host operands, taken
    from a ``MemoryManager``.

    The backend calls it under its launch lock; the pools it takes from are guarded by
    their own lock (the executor's), taken after the backend's."""

    def __init__(self, device: CudaDevice, own: Callable[[], MemoryManager]) -> None:
        self.device = device
        self._own = own  # pools of the backend's own, made when first needed
        self.memory: MemoryManager | None = None
        self.lock: Any = threading.RLock()  # guards self.memory (an executor's: its lock)
        self._held: dict[int, _Held] = {}

    def attach(self, memory: MemoryManager, lock: Any) -> None:
        """Take blocks from ``memory`` (an executor's pools, guarded by ``lock``) from now
        on."""
        if memory is not self.memory:
            self.release()
            self.memory, self.lock = memory, lock

    def _allocate(self, nbytes: int) -> Block:
        with self.lock:
            if self.memory is None:
                self.memory = self._own()
            return self.memory.allocate_scratch(nbytes)

    def _free(self, blocks: list[Block]) -> None:
        with self.lock:
            assert self.memory is not None  # it gave the blocks
            for block in blocks:
                self.memory.free(block)

    def addresses(self, program: Any, layout: TempLayout, stream: Any) -> list[int]:
        """Each temp's device address for a launch of ``program`` on ``stream`` (its block
        is allocated on the first call, then reused)."""
        if not layout.offsets:
            return []
        held = self._held.get(id(program))
        if held is None or held.program() is not program:
            self._sweep()
            block = self._allocate(layout.nbytes)
            arr = block.array
            base = arr.handle.ptr + arr.offset if block.nbytes else 0
            held = _Held(weakref.ref(program), block,
                         [base + o if block.nbytes else 0 for o in layout.offsets], stream)
            self._held[id(program)] = held
        elif held.stream is not stream:
            # The block's last user may still be running on the other stream.
            event = self.device.event()
            self.device.record(event, held.stream)
            self.device.wait(stream, event)
            held.stream = stream
        return held.addresses

    def handed_over(self, before: Any, after: Any) -> None:
        """``after`` now waits for everything queued on ``before`` (an external stream
        whose context closed): blocks ``before`` used last count as ``after``'s, so no
        block refers to a stream its owner may destroy."""
        for held in self._held.values():
            if held.stream is before:
                held.stream = after

    def staging(self, nbytes: int) -> Block:
        """``nbytes`` of device memory for one launch's host operands, from the pools'
        linear bins (after a first call of the same sizes, no device allocation)."""
        return self._allocate(nbytes)

    def unstage(self, blocks: list[Block], stream: Any) -> None:
        """Give a launch's staging back once ``stream``'s work on it has finished."""
        if not blocks:
            return
        self.device.synchronize(stream)
        self._free(blocks)
        blocks.clear()

    def _sweep(self) -> None:
        """Give back the blocks of programs that no longer exist."""
        self._give_back([key for key, held in self._held.items() if held.program() is None])

    def _give_back(self, keys: list[int]) -> None:
        if not keys:
            return
        # No launch may still use them. The whole device: the stream that used a block
        # last may be an external one its owner has since destroyed.
        self.device.synchronize(None)
        self._free([self._held.pop(key).block for key in keys])

    def release(self) -> None:
        """Give every block back to the pools (the next launch of a program allocates
        again)."""
        self._give_back(list(self._held))

    def stats(self) -> dict[str, int]:
        """Programs holding a block and the bytes held."""
        return {"temp_blocks": len(self._held),
                "temp_bytes": sum(h.block.nbytes for h in self._held.values())}


__all__ = ["TempBlocks"]
