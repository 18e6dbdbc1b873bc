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

from .render_c import CRenderer, Expr
from .schedule import KernelPlan


class GPURenderer(CRenderer):
    """Loop roles as grid, block and thread loops; one writer for a block's value."""

    column_reductions = False  # reductions spread over threads instead
    concat_loops = False  # a kernel is one loop nest mapped onto the grid
    row_scratch = False  # a row is spread over the block: no per-thread row copy
    exp_names: ClassVar[dict[str, str]] = {}  # the device's own expf: no CPU inline math
    #: role -> loop header, formatted with ``var`` and ``count``
    LOOPS: ClassVar[dict[str, str]] = {}
    #: the condition true in one thread of a block
    FIRST_THREAD: ClassVar[str] = ""

    def loop(self, var: str, count: int, parallel: bool, simd: bool, role: str = "flat") -> str:
        if role in ("flat", "outer"):  # called after the body's phases: this decides
            self.launch[self._kernel] = (role, count)
        return self.LOOPS[role if role in ("flat", "outer") else "inner"].format(
            var=var, count=count)

    def stores(self, k: KernelPlan, x: Expr, off: Expr) -> list[str]:
        lines = self.store_lines(k, x, off)
        if off.code in ("0", "o"):  # one value per block: one thread writes it
            return [f"if ({self.FIRST_THREAD}) {{ {' '.join(lines)} }}"]
        return lines

    def store_lines(self, k: KernelPlan, x: Expr, off: Expr) -> list[str]:
        return CRenderer.stores(self, k, x, off)
