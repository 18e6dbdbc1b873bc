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
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from .errors import ArgumentTypeError, DTypeError, ShapeError
from .executor import Executor
from .interop import default_executor
from .isa.builder import program as build_program
from .isa.dtypes import SUPPORTED, to_dtype
from .isa.program import Program
from .memory.output_cache import output_cache


def _as_array(x: Any, i: int) -> np.ndarray:
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


class JitFunction:
    """A traced function, compiled once per argument shapes and dtypes."""

    def __init__(self, fn: Callable[..., Any], backend: str = "cpu",
                 executor: Executor | None = None) -> None:
        self.fn = fn
        self.backend = backend
        self._executor = executor
        self._programs: dict[tuple, Program] = {}
        self._lock = threading.Lock()
        functools.update_wrapper(self, fn)

    @property
    def executor(self) -> Executor:
        return self._executor if self._executor is not None else default_executor(self.backend)

    def program_for(self, *args: Any) -> tuple[Program, list[np.ndarray]]:
        arrays = [_as_array(a, i) for i, a in enumerate(args)]
        key = tuple((a.dtype.str, a.shape) for a in arrays)
        p = self._programs.get(key)
        if p is None:
            specs = []
            for i, a in enumerate(arrays):
                d = to_dtype(a.dtype)
                if d not in SUPPORTED:
                    raise DTypeError(f"argument {i}: dtype {a.dtype} is not supported")
                specs.append((d, a.shape))
            with self._lock:
                p = self._programs.get(key)
                if p is None:
                    p = build_program(self.fn, specs, name=getattr(self.fn, "__name__", "jit"))
                    self._programs[key] = p
        return p, arrays

    def __call__(self, *args: Any, out: Any = None) -> Any:
        """Run on NumPy (or DLPack) arrays; ``out`` (an array, or a tuple for several
        outputs) receives the results in place instead of new arrays."""
        p, arrays = self.program_for(*args)
        specs = p.output_specs
        if out is None:
            # Large outputs come from the output cache: a repeated call writes into
            # pages that are already mapped instead of faulting in fresh ones.
            outs = [output_cache.empty(s, d.np_dtype) for d, s in specs]
            self.executor.launch(p, arrays, outs, fresh_outputs=True)
        else:
            outs = list(out) if isinstance(out, (tuple, list)) else [out]
            if len(outs) != len(specs):
                raise ShapeError(f"out: the function returns {len(specs)} arrays, "
                                 f"got {len(outs)}")
            for i, (o, (d, s)) in enumerate(zip(outs, specs, strict=True)):
                if not isinstance(o, np.ndarray):
                    raise ArgumentTypeError(
                        f"out[{i}]: expected a NumPy array, got {type(o).__name__}"
                    )
                if o.shape != s or o.dtype != d.np_dtype:
                    raise ShapeError(f"out[{i}]: expected {d}{list(s)}, got "
                                     f"{o.dtype}{list(o.shape)}")
                if not (o.flags.c_contiguous and o.flags.writeable):
                    raise ShapeError(f"out[{i}]: must be C-contiguous and writable")
            self.executor.launch(p, arrays, outs)
        return outs[0] if len(outs) == 1 else tuple(outs)

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
