"""Rendering the ops that index at run time or along an axis: IOTA, GATHER, SCATTER,
SCATTER_ADD, CUMSUM and CUMPROD (a mixin of the C renderer; the CUDA and WGSL
dialects inherit it with their own spellings of the few hooks at the end).

* IOTA is element-wise: the loop index of its axis, converted to its dtype.
* GATHER is element-wise in its index's coordinates: the renderer computes the index
  value at the element's own coordinates, range-checks it, and reads the table (a
  buffer, or a view chain over one: the scheduler materializes anything else) at
  those coordinates with the index in place of the gathered axis.
* SCATTER/SCATTER_ADD and the scans are kernels of their own: their result is
  stored, never inlined (a reader elsewhere makes the scheduler give it a buffer).

Race freedom without atomics, and determinism: every element ``j`` of a scatter's
index lands on the output element with ``j``'s own coordinates on every axis but the
scatter axis. So the kernel partitions the work by those other coordinates (a
*fiber*: all elements along the axis): one thread owns a fiber (on the CPU, a block of
them), copies the base's fiber into the output, then applies the fiber's updates in
ascending ``j[axis]``. No two threads write one element, and each element receives its
additions in the same order for any thread count (SCATTER: the largest ``j[axis]``
wins, as the last write). When the axis is not the innermost, a CPU thread takes a
block of consecutive columns and runs the innermost loop along them (contiguous), as
the column reductions of ``render_c`` do; otherwise an embedding's backward (a
scatter-add over axis 0 of ``[V, D]``) would read and write with a stride per element.
Scans use the same partition, with one accumulator per fiber (f32 accumulates in
double on the CPU, as ATen's CPU cumsum does).

Out-of-range indices: a kernel never reads or writes outside a buffer. It clamps the
index into the axis and, on the CPU, records the first bad index and the instruction
(its position in ``index_errors.index_sites``) in the launch's error record, a slot
of the pointer table the backend checks after the launch (``hg_index_fail``). The
CUDA dialect records into a ``__device__`` global instead; WGSL only clamps (the
README lists it among the limitations).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..isa.dtypes import DType
from ..isa.index_errors import index_sites
from ..isa.opcodes import SCAN_STEP, SCATTER_STEP, Op
from ..isa.value import Value
from .lower import ERROR_KIND
from .schedule import BufRef, KernelPlan, NeedsMaterialize, view_root

if TYPE_CHECKING:
    from types import ModuleType

    from .render_c import Expr, Scope


def _rc() -> ModuleType:
    """render_c, which defines Expr and Scope and whose CRenderer inherits this mixin:
    imported when first needed, so importing either module first works."""
    from . import render_c

    return render_c


#: The C function that records the first bad index of a launch and clamps it. The
#: record is two int64s: 1 + the instruction's site number, and the bad index. The
#: compare-and-swap keeps one thread's pair when several threads see bad indices.
INDEX_FAIL_C = """\
static __attribute__((noinline, cold)) int64_t hg_index_fail(int64_t *err, int64_t site,
                                                              int64_t bad, int64_t n) {
  int64_t none = 0;
  if (__atomic_compare_exchange_n(&err[0], &none, site + 1, 0, __ATOMIC_RELAXED,
                                  __ATOMIC_RELAXED))
    err[1] = bad;
  return bad < 0 ? 0 : n - 1;
}"""


class IndexKernels:
    """IOTA and GATHER inside any kernel; SCATTER* and scans as kernels of their own."""

    #: Whether the loop over fibers may take blocks of columns (the CPU's threads);
    #: GPU dialects give each thread one fiber instead.
    fiber_blocks = True
    #: Set once a kernel calls ``hg_index_fail``: the source then defines it.
    uses_index_fail = False
    #: The C sort helpers the kernels call (name -> definition), for the source's top.
    sort_helpers: dict[str, str]

    # --- element-wise: IOTA and GATHER ------------------------------------------------
    def iota(self, v: Value, idx: tuple[Expr, ...]) -> Expr:
        rc = _rc()
        e = idx[v.attr("axis")]
        if e.code.isdigit():
            return rc.Expr(self.literal(int(e.code), v.dtype))
        return rc.Expr(self.convert(e.code, v.dtype), e.vars)

    def gather(self, v: Value, idx: tuple[Expr, ...], cur: Scope, key: tuple) -> Expr:
        """``x`` read at ``idx`` with the gathered axis replaced by the checked index."""
        x, ind = v.srcs
        root = view_root(x, self.sched.buffers)
        while root.op is Op.CVT and id(root) not in self.sched.buffers:
            # a conversion is computed at the gathered coordinates: a half graph's bf16
            # embedding table is gathered row by row, never copied whole into floats
            root = view_root(root.srcs[0], self.sched.buffers)
        if id(root) not in self.sched.buffers or id(root) in self.computing:
            raise NeedsMaterialize(root)  # read at computed coordinates: needs memory
        axis = v.attr("axis")
        t = self.checked_index(v, self.emit(ind, idx, cur, False), cur)
        e = self.emit(x, (*idx[:axis], t, *idx[axis + 1:]), cur, False)
        self.scope_for(e.vars, cur).cache[key] = e
        return e

    def checked_index(self, v: Value, i: Expr, cur: Scope) -> Expr:
        """A local holding index ``i`` of instruction ``v``, clamped into its axis; a bad
        index is reported (where the dialect can) and the clamped one used."""
        rc = _rc()
        n = v.srcs[0].shape[v.attr("axis")]
        sc = self.scope_for(i.vars, cur)
        name = self.fresh("ix")
        sc.lines.extend(self.index_lines(name, i.code, n, self.site(v)))
        return rc.Expr(name, i.vars)

    def site(self, v: Value) -> int:
        sites = getattr(self, "_sites", None)
        if sites is None:
            sites = {id(s): k for k, s in enumerate(index_sites(self.sched.program.instructions))}
            self._sites = sites
        return sites[id(v)]

    # --- kernels of their own -------------------------------------------------------
    def fiber_plan(self, c: Value) -> tuple[list[int], int, bool]:
        """(the axes a fiber is indexed by, how many fibers, whether CPU threads take
        blocks of columns: the scan/scatter axis is not the innermost)."""
        axis = c.attr("axis")
        kept = [d for d in range(c.ndim) if d != axis]
        blocked = (self.fiber_blocks and self.row_len is None and axis != c.ndim - 1
                   and c.shape[-1] > 1)
        return kept, math.prod(c.shape[d] for d in kept), blocked

    def fiber_loops(self, c: Value, top: Scope, work: int
                    ) -> tuple[list[str], list[str], Scope, tuple[Expr, ...], bool]:
        """The loop over fibers: (header lines, footer lines, the scope inside it, the
        fiber's coordinates (the axis left ZERO; in a block, of the column ``o``),
        whether it runs over blocks of columns)."""
        rc = _rc()
        kept, n_kept, blocked = self.fiber_plan(c)
        parallel = work >= self.parallel_min_work
        if not blocked:
            scope = rc.Scope("outer" if self.fiber_blocks else "inner", "o", top)
            head = [self.loop("o", n_kept, parallel and n_kept > 1, False, "flat", work)]
            return head, ["}"], scope, self.unravel("o", c.shape, kept), False
        blk = rc.COLUMN_BLOCK
        if parallel and n_kept <= rc.COLUMN_BLOCK:  # narrow: whole SIMD widths per thread
            blk = max(16, -(-n_kept // 32) * 16)
        n_blocks = -(-n_kept // blk)
        scope = rc.Scope("outer", "ob", top)
        head = [self.loop("ob", n_blocks, parallel and n_blocks > 1, False, "outer", work),
                f"  const int64_t o0 = ob * {blk}, o1 = o0 + {blk} < {n_kept} ? o0 + {blk} "
                f": {n_kept};"]
        return head, ["}"], scope, self.unravel("o", c.shape, kept), True

    def along(self, rows: Scope, inner: Scope, count: int, blocked: bool,
              tail: list[str], simd: bool, guard: str = "") -> list[str]:
        """The loop over positions along the axis (``rows``' variable), with ``tail``
        after the lines hoisted into it; in a block, the block's columns ``o`` run
        innermost (contiguous), each first tested by ``guard`` if given."""
        if not blocked:
            return [self.serial_loop(rows.var, count, simd),
                    *("  " + ln for ln in rows.lines + tail), "}"]
        body = ([f"if (!({guard})) continue;"] if guard else []) + inner.lines + tail
        return [self.serial_loop(rows.var, count, False),
                *("  " + ln for ln in rows.lines),
                "  " + self.serial_loop("o", None, simd),
                *("    " + ln for ln in body),
                "  }",
                "}"]

    def axis_scopes(self, parent: Scope, blocked: bool) -> tuple[Scope, Scope]:
        """(the scope of the loop along the axis, the innermost scope: its own, or the
        block's column loop inside it)."""
        rc = _rc()
        r = self.fresh("r")
        rows = rc.Scope("outer" if blocked else "inner", r, parent)
        return rows, (rc.Scope("inner", "o", rows) if blocked else rows)

    def scatter_kernel(self, c: Value, k: KernelPlan, top: Scope) -> list[str]:
        """Per fiber: the base's fiber copied into the output, then the fiber's updates
        in ascending position along the axis (see the module docstring)."""
        rc = _rc()
        base, ind, src = c.srcs
        axis = c.attr("axis")
        kept, _, _ = self.fiber_plan(c)
        head, foot, fib, oidx, blocked = self.fiber_loops(c, top, c.size + 2 * ind.size)
        dsts = [d for _, d in k.sinks]
        # copy: out[fiber, r] = base[fiber, r]
        rows, inner = self.axis_scopes(fib, blocked)
        at = self.with_axis(oidx, axis, rows.var)
        x = self.emit(base, at, inner, False)
        off = self.offset(c.shape, at)
        copy = self.along(rows, inner, c.shape[axis], blocked,
                          [f"{self.element(d, off.code)} = {self.store_value(d.dtype, x.code)};"
                           for d in dsts], True)
        # updates: out[fiber, idx[fiber, r]] (+)= src[fiber, r], for fibers inside the
        # index's shape (it may be smaller off the axis). The guard's variable keeps
        # what the updates read from being hoisted above the test.
        partial = [d for d in kept if ind.shape[d] < c.shape[d]]
        cond = " && ".join(f"{oidx[d].code} < {ind.shape[d]}" for d in partial)
        guard = rc.Scope(fib.kind, "og", fib)
        gv = frozenset({"og"})
        rows2, inner2 = self.axis_scopes(guard, blocked)
        jdx = tuple(e if e is rc.ZERO else rc.Expr(e.code, e.vars | gv) for e in oidx)
        jdx = self.with_axis(jdx, axis, rows2.var)
        t = self.checked_index(c, self.emit(ind, jdx, inner2, False), inner2)
        s = self.emit(src, jdx, inner2, False)
        toff = self.offset(c.shape, (*oidx[:axis], t, *oidx[axis + 1:]))
        writes = []
        step = SCATTER_STEP[c.op]
        for d in dsts:
            el = self.element(d, toff.code)
            value = s.code if step is None else self.combine_code(step, el, s.code, c.dtype)
            writes.append(f"{el} = {self.store_value(c.dtype, value)};")
        # SIMD only across a block's columns (distinct output elements); along the axis
        # two updates may name one element and must stay in order
        update = guard.lines + self.along(rows2, inner2, ind.shape[axis], blocked, writes,
                                          blocked, cond if blocked else "")
        if cond and not blocked:
            update = [f"if ({cond}) {{", *("  " + ln for ln in update), "}"]
        return head + ["  " + ln for ln in fib.lines + copy + update] + foot

    def scan_kernel(self, c: Value, k: KernelPlan, top: Scope) -> list[str]:
        """Per fiber, one accumulator along the axis (a block of them per column block):
        the inclusive prefix, stored at each position."""
        rc = _rc()
        x = c.srcs[0]
        axis = c.attr("axis")
        head, foot, fib, oidx, blocked = self.fiber_loops(c, top, 2 * c.size)
        step, ident = SCAN_STEP[c.op]
        wide = self.scan_type(c.dtype)
        acc = self.fresh("acc")
        rows, inner = self.axis_scopes(fib, blocked)
        at = self.with_axis(oidx, axis, rows.var)
        v = self.emit(x, at, inner, False)
        off = self.offset(c.shape, at)
        cell = f"{acc}[o - o0]" if blocked else acc
        op = "+" if step is Op.ADD else "*"
        tail = [f"{cell} = {cell} {op} {self.widen(v.code, wide)};"]
        tail += [f"{self.element(d, off.code)} = "
                 f"{self.store_value(c.dtype, self.narrow(cell, wide, c.dtype))};"
                 for _, d in k.sinks]
        init = self.scan_literal(ident, wide, c.dtype)
        if blocked:
            lines = [f"{wide} {acc}[{rc.COLUMN_BLOCK}];",
                     f"for (int64_t o = o0; o < o1; o++) {acc}[o - o0] = {init};"]
        else:
            lines = [self.mutable(acc, wide, init)]
        # a prefix carries from each position to the next: no SIMD along the axis, but
        # the block's columns are independent
        lines += self.along(rows, inner, c.shape[axis], blocked, tail, blocked)
        return head + ["  " + ln for ln in fib.lines + lines] + foot

    def sort_kernel(self, c: Value, k: KernelPlan, top: Scope) -> list[str]:
        """ARGSORT: per fiber (threads take whole fibers), the fiber's keys sorted and
        their positions stored in order (:meth:`sort_fiber`, the dialect's way)."""
        rc = _rc()
        axis = c.attr("axis")
        kept = [d for d in range(c.ndim) if d != axis]
        n_kept = math.prod(c.shape[d] for d in kept)
        work = c.size * max(1, c.shape[axis].bit_length())
        fib = rc.Scope("outer" if self.fiber_blocks else "inner", "o", top)
        head = [self.loop("o", n_kept, work >= self.parallel_min_work and n_kept > 1, False,
                          "flat", work)]
        body = self.sort_fiber(c, k, fib, self.unravel("o", c.shape, kept))
        return head + ["  " + ln for ln in fib.lines + body] + ["}"]

    def sort_fiber(self, c: Value, k: KernelPlan, fib: Scope, oidx: tuple[Expr, ...]
                   ) -> list[str]:
        """C: the fiber's keys copied into its stretch of the keys scratch, a stable
        bottom-up merge sort of their positions (``sort_helper``: O(n log n), the
        second positions buffer for the merge passes), the positions stored."""
        x = c.srcs[0]
        axis = c.attr("axis")
        n = c.shape[axis]
        keys, pos = k.scratch
        fn = self.sort_helper(x.dtype, c.attr("descending"))
        rows, _ = self.axis_scopes(fib, False)
        key = self.emit(x, self.with_axis(oidx, axis, rows.var), rows, False)
        kt = self.storage_type(x.dtype)
        lines = [f"{kt} *hk = {self.ptr(keys)} + o * {n};",
                 f"int64_t *hp = {self.ptr(pos)} + o * {2 * n};"]
        lines += self.along(rows, rows, n, False,
                            [f"hk[{rows.var}] = {self.store_value(x.dtype, key.code)};",
                             f"hp[{rows.var}] = {rows.var};"],
                            False)
        lines.append(f"{fn}(hk, hp, hp + {n}, {n});")
        r = self.fresh("r")
        off = self.offset(c.shape, self.with_axis(oidx, axis, r))
        lines.append(self.serial_loop(r, n, False))
        lines += [f"  {self.element(d, off.code)} = "
                  f"{self.store_value(c.dtype, self.convert(f'hp[{r}]', c.dtype))};"
                  for _, d in k.sinks]
        lines.append("}")
        return lines

    def sort_before(self, a: str, b: str, d: DType, descending: bool) -> str:
        """Whether key ``a`` sorts strictly before key ``b``: ascending puts NaN last,
        descending first (PyTorch's orders); equal keys (-0.0 and 0.0 too) neither."""
        if d.kind != "f":
            return f"({a} {'>' if descending else '<'} {b})"
        if descending:
            return f"((isnan({a}) && !isnan({b})) || {a} > {b})"
        return f"(!isnan({a}) && (isnan({b}) || {a} < {b}))"

    def sort_helper(self, d: DType, descending: bool) -> str:
        """The name of the C merge sort for keys of dtype ``d`` in that order, added to
        the source once (``sort_helpers``)."""
        name = f"hg_msort_{d.name}_{'d' if descending else 'a'}"
        if name not in self.sort_helpers:
            kt = self.storage_type(d)
            before = self.sort_before(self.load_element(d, "k[src[j]]"),
                                      self.load_element(d, "k[src[i]]"), d, descending)
            self.sort_helpers[name] = "\n".join([
                f"static void {name}(const {kt} *k, int64_t *p, int64_t *t, int64_t n) {{",
                "  /* stable bottom-up merge sort of the positions p by their keys k; the",
                "     right run's head goes first only when it sorts strictly before */",
                "  int64_t *src = p, *dst = t;",
                "  for (int64_t w = 1; w < n; w *= 2) {",
                "    for (int64_t lo = 0; lo < n; lo += 2 * w) {",
                "      int64_t mid = lo + w < n ? lo + w : n;",
                "      int64_t hi = lo + 2 * w < n ? lo + 2 * w : n;",
                "      int64_t i = lo, j = mid, o = lo;",
                f"      while (i < mid && j < hi) dst[o++] = {before} ? src[j++] : src[i++];",
                "      while (i < mid) dst[o++] = src[i++];",
                "      while (j < hi) dst[o++] = src[j++];",
                "    }",
                "    int64_t *s = src; src = dst; dst = s;",
                "  }",
                "  if (src != p) for (int64_t i = 0; i < n; i++) p[i] = src[i];",
                "}"])
        return name

    @staticmethod
    def with_axis(idx: tuple[Expr, ...], axis: int, var: str) -> tuple[Expr, ...]:
        rc = _rc()
        return (*idx[:axis], rc.Expr(var, frozenset({var})), *idx[axis + 1:])

    # --- dialect hooks (C spellings) ------------------------------------------------
    def index_lines(self, name: str, code: str, n: int, site: int) -> list[str]:
        """Declare ``name``, the index ``code`` clamped into ``[0, n)``, reporting a bad
        one into the launch's error record when the table has one."""
        err = next((r for r in self.slots if r.kind == ERROR_KIND), None)
        if err is None:
            fix = f"{name} = {name} < 0 ? 0 : {n - 1};"
        else:
            self.uses_index_fail = True
            fix = f"{name} = hg_index_fail({self.ptr(err)}, {site}, {name}, {n});"
        return [f"int64_t {name} = (int64_t)({code});",
                f"if ({name} < 0 || {name} >= {n}) {fix}"]

    def serial_loop(self, var: str, count: int | None, simd: bool) -> str:
        """A loop one thread runs; ``count`` None: over the block's columns o0..o1."""
        pragma = "#pragma omp simd\n" if simd else ""
        if count is None:
            return f"{pragma}for (int64_t {var} = o0; {var} < o1; {var}++) {{"
        return f"{pragma}for (int64_t {var} = 0; {var} < {count}; {var}++) {{"

    def element(self, ref: BufRef, off: str) -> str:
        return f"{self.ptr(ref)}[{off}]"

    def load_element(self, d: DType, code: str) -> str:
        """A buffer element ``code`` of ``d`` read as a computing value (the 16-bit
        floats convert: compiler/half_floats.py; others are what they store)."""
        return code

    def store_value(self, d: DType, code: str) -> str:
        """A computed value ``code`` of ``d`` as a buffer element (see load_element)."""
        return code

    def convert(self, code: str, d: DType) -> str:
        return f"(({self.ctype(d)})({code}))"

    def mutable(self, name: str, t: str, init: str) -> str:
        return f"{t} {name} = {init};"

    def scan_type(self, d: DType) -> str:
        """The accumulator: double for floats narrower than f64; integers unsigned, so
        an overflow wraps (as NumPy's does) instead of being undefined in C."""
        if d.kind == "f" and d.itemsize < 8:
            return "double"
        return d.wrap if d.kind == "i" else self.ctype(d)

    def scan_literal(self, value: float, wide: str, d: DType) -> str:
        if d.kind == "f":
            return f"(({wide}){value!r})"  # -0.0 keeps its sign
        return f"(({wide}){int(value)})"

    def widen(self, code: str, wide: str) -> str:
        return f"(({wide}){code})"

    def narrow(self, code: str, wide: str, d: DType) -> str:
        return f"(({self.ctype(d)}){code})"

    def add_code(self, a: str, b: str, d: DType) -> str:
        return self.combine_code(Op.ADD, a, b, d)

    def combine_code(self, step: Op, a: str, b: str, d: DType) -> str:
        """``a step b`` for a scatter's update (``a`` the element, ``b`` the update):
        integer sums and products wrap (unsigned in C, as NumPy's do), MAX and MIN are
        the element-wise templates (a NaN of either wins)."""
        from .render_c import TEMPLATES

        u = d.wrap if d.kind == "i" else None
        if step in (Op.ADD, Op.MUL) and u is not None:
            sym = "+" if step is Op.ADD else "*"
            return f"({self.ctype(d)})(({u}){a} {sym} ({u}){b})"
        return TEMPLATES[step].format(a, b)
