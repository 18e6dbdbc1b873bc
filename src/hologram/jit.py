"""``@hologram.jit``: trace a Python function into one Atlas ISA program.

The function is called once per distinct (shapes, dtypes) with ``Var`` stand-ins
for its arguments; whatever it computes with operators, ``Var`` methods and
``hologram.ops.composites`` becomes one program, so fusion crosses the
boundaries between the ops it calls. Calls take NumPy arrays (or anything with
DLPack on the host) and return NumPy arrays, with no copies of contiguous data.
Returned arrays of 1 MiB or more come from ``memory.output_cache``: their block
is reused once every array viewing it has died (``hologram.empty_cache()``
gives cached blocks back).
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import ArgumentTypeError, DTypeError, ShapeError
from .executor import Executor, check_aliasing
from .interop import default_executor
from .isa.dtypes import to_dtype
from .isa.program import Program
from .memory.address import data_pointer
from .memory.output_cache import output_cache
from .npjit.dtypes import NAMES as TRACEABLE_NAMES
from .npjit.dtypes import TRACEABLE
from .npjit.guards import Guard
from .npjit.random import SEED_SLOT, draw_seed
from .npjit.traced import trace


def _as_array(x: Any, i: int) -> np.ndarray:
    if type(x) is np.ndarray:  # the common case, checked with one flags object
        flags = x.flags
        if flags.c_contiguous and flags.aligned:
            return x
        return np.array(x, order="C")
    if isinstance(x, np.ndarray):
        a = x
    elif hasattr(x, "__dlpack__"):
        a = np.from_dlpack(x)
    elif isinstance(x, (int, float)):
        raise ArgumentTypeError(
            f"argument {i}: Python scalars are constants; close over them instead"
        )
    else:
        try:
            a = np.asarray(x)
        except ValueError as e:  # ragged nested lists
            raise ShapeError(f"argument {i}: cannot be read as an array: {e}") from None
    if not (a.flags.c_contiguous and a.flags.aligned):
        a = np.array(a, order="C")  # a fresh array: contiguous and aligned
    return a


@dataclass
class _Signature:
    """What one (dtypes, shapes) signature runs, worked out on its first call.

    A call then costs the argument conversion and one launch: the program's output
    specs, its compiled form and the checks ``Executor.launch`` makes per call
    (dtype, size and layout of every array) are settled here once, since every
    array that maps to this signature has exactly these dtypes and shapes and is
    C-contiguous and aligned (``_as_array`` makes it so).
    """

    program: Program
    outputs: list[tuple[np.dtype, tuple[int, ...]]]
    hidden: list[np.ndarray]  # captured NumPy arrays: inputs after the arguments
    guard: Guard  # the cells and globals the trace read, and the small arrays it baked in
    executor: Executor | None = None  # set on the first call (tracing alone compiles nothing)
    launch: Callable[[list[int]], None] | None = None  # raw addresses in; None: checked path

    @functools.cached_property
    def nbytes(self) -> list[int]:
        """Bytes of each input, then each output (all C-contiguous here)."""
        sizes = [(d.np_dtype, s) for d, s in self.program.inputs] + self.outputs
        return [np.dtype(d).itemsize * math.prod(s) for d, s in sizes]

    def bind(self, ex: Executor) -> None:
        """Compile for ``ex`` and take its raw-address launch where it has one."""
        self.launch = (ex.backend.pointer_launcher(ex.compile(self.program))
                       if ex.backend.device_type == "cpu" else None)
        self.executor = ex


def _any_overlap(pointers: list[int], nbytes: list[int], n_in: int) -> bool:
    """Whether an output's bytes meet any other operand's: contiguous arrays' exact
    ranges, so a call with separate arrays skips the full aliasing check."""
    for i in range(n_in, len(pointers)):
        lo, hi = pointers[i], pointers[i] + nbytes[i]
        for j, p in enumerate(pointers):
            if j != i and p < hi and lo < p + nbytes[j] and nbytes[i] and nbytes[j]:
                return True
    return False


class JitFunction:
    """A traced function, compiled once per argument shapes and dtypes."""

    def __init__(self, fn: Callable[..., Any], backend: str = "cpu",
                 executor: Executor | None = None) -> None:
        self.fn = fn
        self.backend = backend
        self._executor = executor
        self._signatures: dict[tuple, _Signature] = {}
        self._lock = threading.Lock()
        functools.update_wrapper(self, fn)

    @property
    def executor(self) -> Executor:
        return self._executor if self._executor is not None else default_executor(self.backend)

    def _signature(self, args: tuple[Any, ...]) -> tuple[_Signature, list[np.ndarray]]:
        arrays = [_as_array(a, i) for i, a in enumerate(args)]
        key = tuple([(a.dtype, a.shape) for a in arrays])  # dtypes compare by value
        sig = self._signatures.get(key)
        if sig is not None and sig.guard and not sig.guard.holds():
            sig = None  # a captured scalar or array was rebound (or a baked one changed)
        if sig is None:
            specs = []
            for i, a in enumerate(arrays):
                d = TRACEABLE.get(a.dtype)
                if d is None:
                    raise DTypeError(f"argument {i}: dtype {a.dtype} is not supported "
                                     f"(expected one of {TRACEABLE_NAMES})")
                specs.append((d, a.shape))
            with self._lock:
                sig = self._signatures.get(key)
                if sig is None or (sig.guard and not sig.guard.holds()):
                    guard = Guard(self.fn)
                    p, hidden, baked = trace(self.fn, specs,
                                             name=getattr(self.fn, "__name__", "jit"))
                    guard.watch_contents(baked)
                    outs = [(d.np_dtype, s) for d, s in p.output_specs]
                    sig = self._signatures[key] = _Signature(p, outs, hidden, guard)
        if sig.hidden:  # captured arrays, and a fresh seed where the trace drew numbers
            arrays += [draw_seed() if h is SEED_SLOT else _as_array(h, len(arrays) + i)
                       for i, h in enumerate(sig.hidden)]
        return sig, arrays

    def program_for(self, *args: Any) -> tuple[Program, list[np.ndarray]]:
        sig, arrays = self._signature(args)
        return sig.program, arrays

    def __call__(self, *args: Any, out: Any = None) -> Any:
        """Run on NumPy (or DLPack) arrays; ``out`` (an array, or a tuple for several
        outputs) receives the results in place instead of new arrays."""
        sig, arrays = self._signature(args)
        ex = self.executor
        if sig.executor is not ex:
            sig.bind(ex)
        if out is None:
            # Large outputs come from the output cache: a repeated call writes into
            # pages that are already mapped instead of faulting in fresh ones.
            outs = [output_cache.empty(s, d) for d, s in sig.outputs]
            fresh = True
        else:
            outs = self._check_out(out, sig)
            fresh = False
        if sig.launch is None or ex.closed:  # the executor's checked path
            ex.launch(sig.program, arrays, outs, fresh_outputs=fresh)
        else:
            pointers = [data_pointer(a) for a in (*arrays, *outs)]
            if not fresh and _any_overlap(pointers, sig.nbytes, len(arrays)):
                check_aliasing(sig.program, arrays, outs)  # raises, or allows exact in-place
            sig.launch(pointers)
        return outs[0] if len(outs) == 1 else tuple(outs)

    @staticmethod
    def _check_out(out: Any, sig: _Signature) -> list[np.ndarray]:
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        if len(outs) != len(sig.outputs):
            raise ShapeError(f"out: the function returns {len(sig.outputs)} arrays, "
                             f"got {len(outs)}")
        for i, (o, (d, s)) in enumerate(zip(outs, sig.outputs, strict=True)):
            if not isinstance(o, np.ndarray):
                raise ArgumentTypeError(f"out[{i}]: expected a NumPy array, got "
                                        f"{type(o).__name__}")
            if o.shape != s or o.dtype != d:
                raise ShapeError(f"out[{i}]: expected {to_dtype(d)}{list(s)}, got "
                                 f"{o.dtype}{list(o.shape)}")
            flags = o.flags
            if not (flags.c_contiguous and flags.aligned):
                raise ShapeError(f"out[{i}]: must be C-contiguous and aligned")
            if not flags.writeable:
                raise ShapeError(f"out[{i}]: must be writable (the array is read-only)")
        return outs

    def explain(self, *args: Any) -> str:
        """The traced and canonical programs, the kernels and the reduction statistics."""
        p, _ = self.program_for(*args)
        return explain(p, self.executor)


def jit(fn: Callable[..., Any] | None = None, *, backend: str = "cpu",
        executor: Executor | None = None) -> Any:
    """Decorator: ``@jit`` or ``@jit(backend='reference')``."""
    if fn is None:
        return lambda f: JitFunction(f, backend, executor)
    return JitFunction(fn, backend, executor)


def explain(program: Program, executor: Executor | None = None) -> str:
    """A readable report of what compilation did to ``program``."""
    ex = executor if executor is not None else default_executor("cpu")
    compiled = ex.compile(program)
    lines = ["== traced program ==", str(program)]
    canonical = getattr(compiled, "canonical", None)
    if canonical is not None:
        lines += ["== canonical program ==", str(canonical)]
    stats = getattr(compiled, "stats", None)
    if stats is not None:
        lines += ["== reduction ==", str(stats)]
        if stats.rules:
            lines.append("rules fired: " + ", ".join(f"{k} x{v}" for k, v in
                                                    sorted(stats.rules.items())))
    source = getattr(compiled, "source", None)
    if source is not None:
        lines += ["== kernels ==", source]
    return "\n".join(lines)
