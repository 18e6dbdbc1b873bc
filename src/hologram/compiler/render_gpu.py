"""What the GPU dialects (CUDA, WGSL) share on top of the C renderer.

The C renderer names each loop's role: 'flat' (an element-wise kernel's one loop),
'outer' (one index per row) and 'inner' (within a row). A GPU dialect maps them the
same way, only spelled differently: a flat loop is a grid-stride loop over all
threads, an outer loop gives each block (workgroup) one row at a time, and inner
loops spread a row over the block's threads. So the mapping lives here once and a
dialect supplies its loop headers as data (``LOOPS``) and how "thread 0 of the block"
is tested (``FIRST_THREAD``); reductions spread over threads, so the C renderer's
column-reduction loop order does not apply.
"""

from __future__ import annotations

from typing import ClassVar

from ..isa.value import Value
from .render_c import ZERO, CRenderer, Expr, Scope
from .schedule import KernelPlan


class GPURenderer(CRenderer):
    """Loop roles as grid, block and thread loops; one writer for a block's value."""

    team = False  # loops map to the grid, not to host threads
    nested_phases = False  # a phase's one flat loop is strided over the block's threads

    column_reductions = False  # reductions spread over threads instead
    fiber_blocks = False  # scans and scatters: one thread per fiber (render_index)
    concat_loops = False  # a kernel is one loop nest mapped onto the grid
    row_scratch = False  # a row is spread over the block: no per-thread row copy
    plane_loops = False  # the outer loop is the grid: no loop of a plane's rows inside it
    exp_names: ClassVar[dict[str, str]] = {}  # the device's own expf: no CPU inline math
    #: role -> loop header, formatted with ``var`` and ``count``
    LOOPS: ClassVar[dict[str, str]] = {}
    #: the condition true in one thread of a block
    FIRST_THREAD: ClassVar[str] = ""

    def matrix_element(self, operand: Value, batch: tuple[int, ...]) -> tuple[Expr, list[str]]:
        """Element (gr, gc) of matrix ``gb`` (the flat batch index over ``batch``) of a
        GEMM or attention operand, read through its view chain by the fused-kernel
        emitter: the expression, and the lines that compute it. Each dialect wraps them
        in a loader function of its own."""
        top = Scope("kernel", None, None)
        s0 = Scope("outer", "gb", top)
        s1 = Scope("outer", "gr", s0)
        s2 = Scope("inner", "gc", s1)
        gb = frozenset({"gb"})
        idx = [ZERO if size == 1 else
               Expr("gb" if len(batch) == 1 else f"(gb / {st} % {size})", gb)
               for size, st in zip(batch, self.strides(batch), strict=True)]
        idx += [Expr("gr", frozenset({"gr"})), Expr("gc", frozenset({"gc"}))]
        x = self.emit(operand, tuple(idx), s2, False)
        return x, top.lines + s0.lines + s1.lines + s2.lines

    def loop(self, var: str, count: int, parallel: bool, simd: bool, role: str = "flat",
             work: int | None = None) -> str:
        if role in ("flat", "outer"):  # called after the body's phases: this decides
            self.launch[self._kernel] = (role, count)
        return self.LOOPS[role if role in ("flat", "outer") else "inner"].format(
            var=var, count=count)

    def serial_loop(self, var: str, count: int | None, simd: bool) -> str:
        """A loop one thread runs (render_index: along a scan's or scatter's fiber)."""
        return f"for (int64_t {var} = 0; {var} < {count}; {var}++) {{"

    #: The type of a count a thread keeps (a sort position's rank).
    COUNT_T: ClassVar[str] = "int64_t"

    def sort_fiber(self, c: Value, k: KernelPlan, fib: Scope, oidx: tuple[Expr, ...]
                   ) -> list[str]:
        """ARGSORT on a GPU: one thread per fiber, no scratch. Each position's rank is
        the number of keys that sort before it (equal keys: those at lower positions),
        and the position is stored at its rank: O(n^2) per fiber, simple and stable.
        (The CPU merge-sorts; a GPU sort of long fibers would want a parallel one.)"""
        x = c.srcs[0]
        axis = c.attr("axis")
        n = c.shape[axis]
        desc = c.attr("descending")
        rows, _ = self.axis_scopes(fib, False)
        cols, _ = self.axis_scopes(rows, False)
        r, s = rows.var, cols.var
        mine = self.emit(x, self.with_axis(oidx, axis, r), rows, False)
        other = self.emit(x, self.with_axis(oidx, axis, s), cols, False)
        rank = self.fresh("rank")
        before = self.sort_before(other.code, mine.code, x.dtype, desc)
        after = self.sort_before(mine.code, other.code, x.dtype, desc)
        count = [f"if ({before} || (!{after} && {s} < {r})) {{ {rank} = {rank} + 1; }}"]
        at = self.offset(c.shape, self.with_axis(oidx, axis, rank))
        tail = [self.mutable(rank, self.COUNT_T, "0"),
                *self.along(cols, cols, n, False, count, False),
                *(f"{self.element(d, at.code)} = "
                  f"{self.store_value(c.dtype, self.convert(r, c.dtype))};"
                  for _, d in k.sinks)]
        return self.along(rows, rows, n, False, tail, False)

    def stores(self, k: KernelPlan, x: Expr, off: Expr) -> list[str]:
        lines = self.store_lines(k, x, off)
        if off.code in ("0", "o"):  # one value per block: one thread writes it
            return [f"if ({self.FIRST_THREAD}) {{ {' '.join(lines)} }}"]
        return lines

    def store_lines(self, k: KernelPlan, x: Expr, off: Expr) -> list[str]:
        return CRenderer.stores(self, k, x, off)
