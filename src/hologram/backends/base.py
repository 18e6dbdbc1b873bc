"""The backend protocol every executor talks to.

A backend compiles a Program once into something it can launch, then launches
it on arrays in its own memory. Host backends (reference, cpu) take NumPy
arrays that view the executor's pools, so results land in place.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..isa.dtypes import DType
from ..isa.program import Program


class Backend(ABC):
    """allocate / copy are the executor's (host pools); compile / launch are ours."""

    name: str = "abstract"
    device_type: str = "cpu"  # DLPack device kind of the memory this backend computes on

    @abstractmethod
    def compile(self, program: Program) -> Any:
        """Turn a verified program into a launchable object (cached by the caller)."""

    def prepare(self, program: Program) -> Callable[[], Any]:
        """Compile in two steps: the Python work (verify, canonicalize, schedule,
        render) now, on the caller's thread; the returned call finishes (native build,
        loading) and returns what :meth:`compile` would. A caller with work of its own
        (AOT autograd after a graph is compiled) runs the second step on another
        thread, so that a C compiler's seconds overlap Python work instead of
        contending with it for the GIL. By default everything is in the second step."""
        return lambda: self.compile(program)

    @abstractmethod
    def launch(
        self,
        compiled: Any,
        inputs: Sequence[np.ndarray],
        outputs: Sequence[np.ndarray],
        arena: np.ndarray | None = None,
    ) -> None:
        """Run ``compiled``, reading ``inputs`` and writing ``outputs`` in place.

        ``arena`` is the executor's boundary pool, which Φ-addressed LDG/STG read
        and write. Inputs and outputs already have the program's dtypes and shapes.
        """

    def check_buffer_dtype(self, dtype: DType) -> None:  # noqa: B027 - hosts store all
        """Raise DTypeError if this backend's memory cannot hold elements of ``dtype``
        (checked when an executor allocates or wraps a buffer). Host memory and CUDA
        device memory hold every dtype of the table; WGSL storage does not."""

    def bind(self, compiled: Any, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray],
             arena: np.ndarray | None = None) -> Any:
        """A zero-argument callable repeating this launch; backends may precompute more."""
        return lambda: self.launch(compiled, inputs, outputs, arena)

    def pointer_launcher(self, compiled: Any) -> Callable[..., None] | None:
        """A launch that takes raw host addresses (inputs, then outputs) instead of
        arrays, or None where this backend or program needs arrays.

        Callers that hold their own tensors (``hologram_torch``'s compile backend)
        use it to skip building a NumPy view of every tensor on every call, which
        cost more than the small kernels a training step runs. The caller has
        checked every address's dtype, shape and layout against the program.
        Where ``pack_sites`` lists GEMMs, the launch takes a second, optional sequence:
        one address per site of a packed copy made by ``pack`` (0: none).
        """
        return None

    def pack_sites(self, compiled: Any) -> list[Any]:
        """GEMM steps of ``compiled`` that can take a packed copy of an input as their B
        operand (each has ``.input``, the program input it reads); none by default."""
        return []

    def pack(self, compiled: Any, site: int, address: int) -> Any:
        """A packed copy (an object owning its memory) of the input at ``address`` for
        pack site ``site``, or None. It is valid while that memory is unchanged: the
        caller must make a new one after any write to it."""
        return None

    def may_overwrite(self, compiled: Any, in_index: int, out_index: int) -> bool:
        """Whether a pointer launch may pass one address as both input ``in_index`` and
        output ``out_index``: an in-place update, with no read of the input seeing an
        element the program already wrote. No, unless the backend proves it."""
        return False

    def prewarm(self, attention: bool = False,  # noqa: B027 - nothing to build
                bf16: bool = False) -> None:
        """Start building, in the background, what the programs about to be compiled
        will need whatever they hold (runtime libraries), so that a caller that still
        has work of its own to do (PyTorch tracing a graph) overlaps it; ``attention``:
        they will call the fused attention driver; ``bf16``: they hold bf16 values (and
        may multiply them). Nothing, by default."""

    def attach_memory(self, memory: Any, lock: Any) -> None:  # noqa: B027 - none kept
        """The executor's pools (a ``MemoryManager``) and the lock that guards them, for
        backends that keep scratch of their own there (the CUDA backend's per-program
        temp blocks). A backend takes ``lock`` after its own, never the other way."""

    def release_scratch(self) -> None:  # noqa: B027 - host backends keep none
        """Give scratch held across launches back to the pools (``Executor.empty_cache``
        and ``close`` call it before emptying the pools' caches)."""

    def use_stream(self, handle: int | None) -> Any:
        """A context putting this thread's work on an external stream ``handle`` (an int
        handle of the device's streams); a backend with no streams takes only None."""
        if handle is not None:
            raise ValueError(f"stream: backend {self.name!r} has no streams, got {handle!r}")
        return contextlib.nullcontext()

    def synchronize(self) -> None:  # noqa: B027 - a no-op is right for host backends
        """Wait for launched work; host backends finish before launch returns."""

    def describe(self) -> str:
        return self.name
