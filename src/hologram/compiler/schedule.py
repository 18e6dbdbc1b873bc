"""Scheduling: which values live in memory, and which kernels compute them.

A value is *materialized* (has a buffer) when it is a program input, a Φ load,
an output, a GEMM result, or something a kernel cannot recompute cheaply (a
reduction whose result is needed at coordinates the consuming kernel does not
iterate once per outer index). Everything else is inlined into the kernels that
use it, so element-wise chains, and reductions with the element-wise work that
feeds and follows them, become one loop nest that reads each input once.

The renderer decides whether a reduction can be hoisted; when it cannot it asks
for the value to be materialized (``NeedsMaterialize``) and scheduling retries,
so the rule lives in one place.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..isa.dtypes import DType, i64
from ..isa.opcodes import ATTENTION_PART, ELEMENTWISE, MOVEMENT, Group, Op, group
from ..isa.program import Program
from ..isa.value import Shape, Value, _attr_key, contiguous_strides


@dataclass(frozen=True)
class BufRef:
    """Where a materialized value lives: input i, output i, temp i, or the arena."""

    kind: str  # 'in' | 'out' | 'tmp' | 'arena'
    index: int
    dtype: DType
    shape: Shape
    offset: int = 0  # byte offset (arena only)

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


@dataclass
class KernelPlan:
    """One loop nest computing ``sinks`` (value, destination) over ``value.shape``;
    ``scratch``: temps only this kernel uses (a sort's keys and merge buffers);
    ``siblings``: other element-wise values of the same shape the same flat loop
    computes and stores (:func:`merge_siblings`), so work they share is done once."""

    name: str
    sinks: list[tuple[Value, BufRef]]
    scratch: list[BufRef] = field(default_factory=list)
    siblings: list[tuple[Value, BufRef]] = field(default_factory=list)

    @property
    def all_sinks(self) -> list[tuple[Value, BufRef]]:
        """Every (value, destination) the kernel writes: its sinks, then its siblings'."""
        return self.sinks + self.siblings


@dataclass
class GemmPlan:
    """A library matrix product into ``out``; operands are read through NumPy views.
    ``narrow``: the 16-bit dtype both operands are read in, where each is a widening
    CVT of a stored value of that dtype (``gemm_operand_chain``), else None."""

    value: Value
    out: BufRef
    narrow: str | None = None


@dataclass
class AttentionPlan:
    """One fused attention step (``compiler/attention.py``): every part of one attention
    computation the program uses (forward: out, lse; backward: dq, dk, dv), written by
    one pass over the operands, which are read in place through their view chains.

    Values are single-result, so the parts are sibling instructions with the same
    operands and attributes; ``plan`` gives them one step, never one per part (that
    would recompute the scores once per part)."""

    name: str
    kind: str  # 'forward' | 'backward' (opcodes.ATTENTION_OPERANDS)
    srcs: tuple[Value, ...]
    sinks: list[tuple[Value, BufRef]]  # (part, where it goes), like a kernel's
    scratch: BufRef | None = None  # the CPU driver's per-thread blocks (a temp)
    # id(part) -> its element strides in its sink's buffer, when the part is written
    # straight into a stored permutation of it (absent: the part's own row-major layout)
    layouts: dict[int, tuple[int, ...]] = field(default_factory=dict)

    def part(self, name: str) -> tuple[Value, BufRef] | None:
        """The sink of the part called ``name`` ('out', 'lse', 'dq', ...), if used."""
        for v, ref in self.sinks:
            if ATTENTION_PART[v.op][1] == name:
                return v, ref
        return None


Step = KernelPlan | GemmPlan | AttentionPlan


@dataclass
class Schedule:
    program: Program
    steps: list[Step] = field(default_factory=list)
    buffers: dict[int, BufRef] = field(default_factory=dict)  # id(value) -> where it lives
    temps: list[BufRef] = field(default_factory=list)

    @property
    def kernel_count(self) -> int:
        return len(self.steps)


class NeedsMaterialize(Exception):
    """Raised by the renderer: this value must be computed into a buffer first.

    ``more``: other values found in the same pass that need one too; each retry plans
    the whole program again, so a pass names every value it can (BERT-base took 74
    passes, one value each, before they were batched)."""

    def __init__(self, value: Value, more: Sequence[Value] = ()) -> None:
        super().__init__(f"{value.op} needs its own buffer")
        self.values = (value, *more)


def view_chain(v: Value, buffers: dict[int, BufRef]) -> tuple[Value, list[Value]]:
    """(root, views): the first value under ``v``'s movement ops that is computed or
    materialized, and those ops from the root up to ``v`` (innermost first). Movement
    ops are strided views (a GEMM reads them in place); a CONCAT is not one: its parts
    live in different buffers, so a kernel computes it."""
    chain = []
    while id(v) not in buffers and v.op in MOVEMENT:  # views: read through, never copied
        chain.append(v)
        v = v.srcs[0]
    return v, chain[::-1]


def view_root(v: Value, buffers: dict[int, BufRef]) -> Value:
    """The first value under ``v``'s movement ops that is computed (or materialized)."""
    return view_chain(v, buffers)[0]


def is_view_chain(v: Value, buffers: dict[int, BufRef]) -> bool:
    """True if ``v`` is movement ops over a materialized value (a NumPy view suffices)."""
    return id(view_root(v, buffers)) in buffers


def widened_source(v: Value) -> Value | None:
    """The 16-bit float value ``v`` widens to f32 exactly (a CVT), else None."""
    if v.op is Op.CVT and v.dtype.name == "f32" and v.srcs[0].dtype.name in ("bf16", "f16"):
        return v.srcs[0]
    return None


def widened_dtype(s: Value) -> str | None:
    """The 16-bit dtype GEMM operand ``s`` widens, where it is views of a widening CVT;
    else None."""
    src = widened_source(view_chain(s, {})[0])
    return None if src is None else src.dtype.name


def widens_16_bit(g: Value) -> bool:
    """Whether each operand of GEMM ``g`` is views of a CVT widening a 16-bit float: a
    product the backend may read in its 16-bit dtype (``narrow_operands``)."""
    return all(widened_dtype(s) is not None for s in g.srcs)


def _under_widening(s: Value, buffers: dict[int, BufRef]
                    ) -> tuple[Value, Value, list[Value], list[Value]] | None:
    """(the 16-bit source, the value under its views, those views, the views above the
    CVT) for operand ``s`` whose root is a widening CVT with no buffer of its own; else
    None."""
    root, chain = view_chain(s, buffers)
    src = None if id(root) in buffers else widened_source(root)
    if src is None:
        return None
    inner, below = view_chain(src, buffers)
    return src, inner, below, chain


def gemm_operand_chain(s: Value, buffers: dict[int, BufRef], narrow: str | None = None
                       ) -> tuple[Value, list[Value]]:
    """(root, views) a GEMM reads operand ``s`` through: ``view_chain``'s, or, for a
    product read in 16-bit dtype ``narrow`` (``GemmPlan.narrow``), the stored value
    under the widening CVT at its root and the views on both sides of the CVT (a CVT
    changes no element's position, so the views apply to its source alike)."""
    found = _under_widening(s, buffers) if narrow is not None else None
    if found is None or found[0].dtype.name != narrow:
        return view_chain(s, buffers)
    _, inner, below, chain = found
    return inner, below + chain


def narrow_operands(v: Value, buffers: dict[int, BufRef], narrow: frozenset[str],
                    users: dict[int, list[Value]]) -> tuple[str, list[Value]] | None:
    """(dtype, the value to store for each operand) when both operands of f32 GEMM ``v``
    widen values of one 16-bit dtype in ``narrow`` (what the backend's GEMM reads in
    place), each through views BLAS reads in place once that value is stored; None where
    either has a float buffer of its own or another root. The product then reads the
    16-bit values: no float copy of a bf16 weight or activation is written per call.

    The value to store is the CVT's source, or, where the views under the CVT copy
    (``operand_layout.narrow_operand_layouts`` moves a copying chain there), the copying
    RESHAPE, as ``_operand_home`` stores a float operand."""
    from .gemm_layout import copying_reshape

    if not narrow or v.dtype.name != "f32":
        return None
    dtypes, homes = set(), []
    for s in v.srcs:
        found = _under_widening(s, buffers)
        if found is None or found[0].dtype.name not in narrow:
            return None
        src, inner, below, chain = found
        at = copying_reshape(inner, below + chain)
        if at is not None:
            idx = next((i for i, m in enumerate(below) if m is at), None)
            if chain or idx is None or not only_reader_chain(inner, below[:idx], users):
                return None
            inner = at
        dtypes.add(src.dtype.name)
        homes.append(inner)
    return (dtypes.pop(), homes) if len(dtypes) == 1 else None


def storage_root(v: Value, buffers: dict[int, BufRef]) -> Value:
    """Follow RESHAPEs of computed values: a reshape's bytes are its source's bytes."""
    while v.op is Op.RESHAPE and id(v.srcs[0]) not in buffers:
        v = v.srcs[0]
    return v


def plan(program: Program, forced: set[int], narrow: frozenset[str] = frozenset()
         ) -> Schedule:
    """Assign buffers and order the steps; ``forced`` are ids the renderer asked for;
    ``narrow``: the 16-bit dtypes the backend's GEMM reads in place (``narrow_operands``).

    Steps come out in program order, which is topological, so every buffer is
    written before a later step reads it.
    """
    sched = Schedule(program)
    bufs = sched.buffers

    stored: dict[int, list[BufRef]] = {}
    for v in program.instructions:
        if v.op is Op.STG:
            src = v.srcs[0]
            phi = v.attr("phi")
            if phi is None:
                dst = BufRef("out", v.attr("out"), src.dtype, src.shape)
            else:
                dst = BufRef("arena", 0, src.dtype, src.shape, _phi_bytes(phi))
            stored.setdefault(id(src), []).append(dst)

    homes: dict[int, BufRef] = {}

    def home(v: Value) -> BufRef:
        if id(v) in homes:
            return homes[id(v)]
        dsts = stored.get(id(v))
        if dsts:
            ref = dsts[0]
        else:
            ref = BufRef("tmp", len(sched.temps), v.dtype, v.shape)
            sched.temps.append(ref)
        homes[id(v)] = ref
        return ref

    users = users_of(program)
    forced |= shared_recomputations(program, users, stored, forced, narrow)
    forced |= stored_statistics(program, users, stored, forced)
    deferred: list[Value] = []  # forced here: planned again once this pass has found all
    claimed: set[int] = set()  # values a GEMM result is already computed in place of
    attention: dict[tuple, AttentionPlan] = {}  # one step per attention computation
    written: dict[int, Value] = {}  # stored views an attention step or a GEMM writes in place

    for v in program.instructions:
        if v.op is Op.STG:
            continue
        if v.op is Op.LDG:
            phi = v.attr("phi")
            bufs[id(v)] = (BufRef("in", v.attr("in"), v.dtype, v.shape) if phi is None else
                           BufRef("arena", 0, v.dtype, v.shape, _phi_bytes(phi)))
            copies = stored.get(id(v), [])
        elif v.op is Op.GEMM:
            narrowed = narrow_operands(v, bufs, narrow, users)
            narrow_dtype = narrowed[0] if narrowed is not None else None
            for i, s in enumerate(v.srcs):
                if narrowed is not None:  # store the 16-bit value under the CVT
                    inner = narrowed[1][i]
                    if id(inner) not in bufs:
                        forced.add(id(inner))
                        deferred.append(inner)
                elif not is_view_chain(s, bufs):
                    # Materialize the computed value under the view chain, not the view:
                    # BLAS reads a transposed or batched view in place, while
                    # materializing the view would copy it through a strided loop.
                    root = _operand_home(s, bufs, users)
                    forced.add(id(root))
                    deferred.append(root)
            into = None if id(v) in stored else _in_place_target(v, users, stored, forced)
            # One product per buffer: the tail of x @ a + y @ b has two in-place candidates,
            # and the second GEMM would overwrite the first before the tail reads both.
            if into is not None and id(into) not in claimed:
                ref = home(into)
                if ref.kind in ("out", "tmp"):
                    claimed.add(id(into))
                    homes[id(v)] = ref
            elif into is None and id(v) not in stored:
                u = _reshaped_output(v, users, stored, forced)
                if u is not None:  # written straight into the output it is reshaped to
                    homes[id(v)] = home(u)
                    written[id(u)] = v
            bufs[id(v)] = home(v)
            if v.size:
                sched.steps.append(GemmPlan(v, bufs[id(v)], narrow_dtype))
            copies = stored.get(id(v), [])[1:]
        elif group(v.op) is Group.ATTENTION:
            deferred += _need_views(v, bufs, forced)
            through = None if id(v) in stored or id(v) in forced else \
                _stored_through(v, users, stored)
            if through is None:
                bufs[id(v)] = home(v)
                sink, strides = bufs[id(v)], None
            else:  # the part is written straight into the stored view of it
                u, strides = through
                sink = home(u)
                written[id(u)] = v
            kind = ATTENTION_PART[v.op][0]
            key = (kind, tuple(map(id, v.srcs)), tuple((k, _attr_key(x)) for k, x in v.attrs))
            step = attention.get(key)
            if step is None and v.size:
                step = AttentionPlan(f"a{len(sched.steps)}", kind, v.srcs, [])
                step.scratch = _attention_scratch(step, sched)
                attention[key] = step
                sched.steps.append(step)
            if step is not None:  # the first part, or a sibling the same step writes too
                step.sinks.append((v, sink))
                if strides is not None:
                    step.layouts[id(v)] = strides
            copies = stored.get(id(v), [])[1:]
        elif id(v) in written:  # an attention step or a GEMM wrote it (above): only extra copies
            bufs[id(v)] = home(v)
            copies = stored[id(v)][1:]
        elif id(v) in forced or id(v) in stored:
            bufs[id(v)] = home(v)
            copies = stored.get(id(v), [bufs[id(v)]])
        else:
            continue
        # A value with no elements keeps its (empty) buffer but gets no step: a kernel
        # over it would only read or write memory that is not there (an empty tensor's
        # pointer may be null). So a program whose results are all empty launches nothing.
        if copies and v.size:
            kp = KernelPlan(f"k{len(sched.steps)}", [(v, d) for d in copies])
            if group(v.op) is Group.SORT:
                kp.scratch = _sort_scratch(v, sched)
            sched.steps.append(kp)
    if deferred:
        raise NeedsMaterialize(deferred[0], deferred[1:])
    merge_siblings(sched)
    return sched


def _flat_tree(v: Value, bufs: dict[int, BufRef]) -> set[int] | None:
    """ids of the computed (non-constant) values in ``v``'s kernel expression, when every
    one is element-wise at ``v``'s shape (one flat loop computes it); else None."""
    computed: set[int] = set()
    stack, seen = [v], set()
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if x is not v and id(x) in bufs:
            continue
        g = group(x.op)
        if g is Group.CONST:
            continue
        if g not in ELEMENTWISE or g is Group.IOTA or x.shape != v.shape:
            return None  # IOTA is element-wise but needs coordinates, not a flat index
        computed.add(id(x))
        stack.extend(x.srcs)
    return computed


def merge_siblings(sched: Schedule) -> None:
    """Fold element-wise kernels into an earlier kernel of the same shape that computes
    some of the same subexpressions, as its ``siblings``: one loop then stores both.

    Values are single-result, so a function returning two arrays built from shared
    work (Black-Scholes' call and put both need ``cnd(d1)`` and ``cnd(d2)``) plans one
    kernel per result, each recomputing the shared part: twice the transcendental
    work and twice the input reads. A kernel moves up to an earlier one only if it
    reads no buffer that a step from there on writes (so its inputs are ready there)
    and neither writes the Φ arena (whose slots may overlap)."""
    bufs = sched.buffers
    steps = sched.steps
    trees: dict[int, set[int] | None] = {}

    def tree(k: KernelPlan) -> set[int] | None:
        if id(k) not in trees:
            v = k.sinks[0][0]
            ok = (not k.scratch and v.op is not Op.LDG and group(v.op) in ELEMENTWISE
                  and all(x is v and d.kind != "arena" for x, d in k.sinks))
            trees[id(k)] = _flat_tree(v, bufs) if ok else None
        return trees[id(k)]

    i = 0
    while i < len(steps):
        a = steps[i]
        if isinstance(a, KernelPlan) and tree(a) is not None:
            shape = a.sinks[0][0].shape
            written: set[int] = set()  # buffers written from step i on
            j = i
            while j < len(steps):
                b = steps[j]
                if j > i and isinstance(b, KernelPlan) and tree(b) is not None \
                        and b.sinks[0][0].shape == shape and tree(a) & tree(b):
                    reads = {id(x) for x in step_operands(b, sched)} - {id(b.sinks[0][0])}
                    if not reads & written:
                        a.siblings.extend(b.sinks)
                        trees[id(a)] = tree(a) | tree(b)
                        del steps[j]
                        continue
                outs = (b.all_sinks if isinstance(b, KernelPlan) else
                        [(b.value, b.out)] if isinstance(b, GemmPlan) else b.sinks)
                written |= {id(x) for x, _ in outs}
                j += 1
        i += 1


def _sort_scratch(v: Value, sched: Schedule) -> list[BufRef]:
    """Temps for an ARGSORT kernel (``render_index.sort_kernel``): every fiber's keys in
    the operand's dtype, and two i64 position buffers for the merge passes. Each fiber
    owns its own stretch of each, so threads never share one; sized by the planner, so
    a launch allocates them like any temp (no allocation inside a kernel)."""
    refs = [BufRef("tmp", len(sched.temps), v.srcs[0].dtype, (v.size,)),
            BufRef("tmp", len(sched.temps) + 1, i64, (2 * v.size,))]
    sched.temps.extend(refs)
    return refs


def _attention_scratch(step: AttentionPlan, sched: Schedule) -> BufRef:
    """A temp for the CPU driver's per-thread blocks (``compiler/attention.py``): sized
    by the planner, so a launch allocates it like any temp (a MemoryError in Python, not
    a failed malloc inside a kernel). GPU backends bind only the slots their kernels use."""
    from .attention import max_threads, operands, scratch_elements

    ops = operands(step)
    q = ops["q"]
    n = scratch_elements(step.kind == "backward", q.shape[-2], ops["k"].shape[-2],
                         ops["v"].shape[-1], math.prod(q.shape[:-2])) * max_threads()
    ref = BufRef("tmp", len(sched.temps), step.srcs[0].dtype, (n,))
    sched.temps.append(ref)
    return ref


def _stored_through(v: Value, users: dict[int, list[Value]], stored: dict[int, list[BufRef]]
                    ) -> tuple[Value, tuple[int, ...]] | None:
    """(u, strides): when ``v``'s only reader is a chain of reshapes and permutes ending at a
    stored value ``u`` (each link read once), the strides of ``v``'s elements inside
    ``u``'s row-major buffer, so the step computing ``v`` writes ``u`` in place.

    Models hand attention's output and gradients to PyTorch as ``[B, L, H, E]`` memory
    (traced strides): stored as ``permute(reshape(out))``, each would otherwise be a
    temp the size of the output and a copy kernel. The last stride must be 1 for a
    matrix part (BLAS writes rows), any for ``lse`` (a vector)."""
    from .gemm_layout import nocopy_reshape

    chain = []
    u = v
    while not chain or id(u) not in stored:
        readers = users.get(id(u), [])
        if len(readers) != 1 or readers[0].op not in (Op.RESHAPE, Op.PERMUTE):
            return None
        u = readers[0]
        chain.append(u)
    strides = contiguous_strides(u.shape)
    for link in reversed(chain):  # back from u's layout to v's
        src = link.srcs[0]
        if link.op is Op.PERMUTE:
            inner = [0] * src.ndim
            for d, p in enumerate(link.attr("perm")):
                inner[p] = strides[d]
            strides = tuple(inner)
        else:
            new = nocopy_reshape(link.shape, strides, src.shape)
            if new is None:
                return None
            strides = new
    if ATTENTION_PART[v.op][1] != "lse" and v.shape[-1] > 1 and strides[-1] != 1:
        return None
    return u, strides


def _reshaped_output(v: Value, users: dict[int, list[Value]], stored: dict[int, list[BufRef]],
                     forced: set[int]) -> Value | None:
    """The program output ``u`` that GEMM result ``v`` only reaches through RESHAPEs (each
    link read once, none materialized on its own), or None. A RESHAPE keeps row-major
    order, so the product written row-major into ``u``'s buffer is ``u``: no temp and no
    copy kernel. A convolution's weight gradient is such a product (``[O, C*K]``
    reshaped to ``[O, C, *K]``); its copy cost 3.4 ms for each 512x512x3x3 weight of
    ResNet-18's training step at batch 8, one thread (docs/perf.md, "Session 13")."""
    u = v
    while id(u) not in stored:
        readers = users.get(id(u), [])
        if len(readers) != 1 or readers[0].op is not Op.RESHAPE or id(readers[0]) in forced:
            return None
        u = readers[0]
    return u if u is not v and stored[id(u)][0].kind == "out" else None


def _operand_home(s: Value, bufs: dict[int, BufRef], users: dict[int, list[Value]]
                  ) -> Value:
    """The value to store so that a GEMM reads operand ``s`` in place: the computed
    value under its view chain, or, where that chain reshapes the value's row-major
    data in a way no strides express and the chain is the value's only reader, that
    RESHAPE. A batch-folded convolution reads ``[B, C, L]`` activations as ``[C, B*L]``
    (a permute, then a merge): stored under the chain, the activations were written
    once and copied again into the GEMM's layout (MobileNetV3-small at batch 8: 16
    such copies a call); stored at the RESHAPE, their kernel writes the GEMM's layout
    directly."""
    from .gemm_layout import copying_reshape

    root, chain = view_chain(s, bufs)
    at = copying_reshape(root, chain)
    if at is None or not only_reader_chain(root, chain[:chain.index(at)], users):
        return root
    return at


def only_reader_chain(root: Value, links: Sequence[Value], users: dict[int, list[Value]]
                      ) -> bool:
    """True if ``root`` and each of ``links`` (movement ops over it, innermost first) is
    read only by the next link (or, for the last, by one instruction): a value stored
    above them computes ``root`` for its only reader, recomputing it for no one else."""
    for v, nxt in zip([root, *links], [*links, None], strict=True):
        readers = users.get(id(v), [])
        if len(readers) != 1 or (nxt is not None and readers[0] is not nxt):
            return False
    return True


def _need_views(v: Value, bufs: dict[int, BufRef], forced: set[int]) -> list[Value]:
    """Make every operand of ``v`` a view chain over a buffer (a library step reads it in
    place): the computed value under a chain that is not gets a buffer (not the view:
    materializing a transposed view would copy it through a strided loop). Returns
    those values, now in ``forced``: the plan is made again with them."""
    roots = []
    for s in v.srcs:
        if not is_view_chain(s, bufs):
            root = view_root(s, bufs)
            forced.add(id(root))
            roots.append(root)
    return roots


def step_operands(step: Step, sched: Schedule) -> list[Value]:
    """The materialized values ``step`` reads (the buffers under its expressions, or
    under a GEMM's operand views) and those it writes, each once."""
    if isinstance(step, GemmPlan):
        return [*(gemm_operand_chain(s, sched.buffers, step.narrow)[0]
                  for s in step.value.srcs), step.value]
    out: dict[int, Value] = {}
    stack: list[Value] = []
    for v, _ in step.all_sinks if isinstance(step, KernelPlan) else step.sinks:
        out[id(v)] = v
        stack.extend(v.srcs if v.op not in (Op.LDG, Op.GEMM) else [v])  # else: a copy
    seen: set[int] = set()
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if id(x) in sched.buffers:
            out[id(x)] = x
            continue
        stack.extend(x.srcs)
    return list(out.values())


# An element-wise value read by several instructions is stored once, rather than
# recomputed by each reader, when recomputing it reads at least this many full-size
# buffers and it has at least this many elements (below that, a kernel launch costs
# more than the reads it saves).
SHARED_MIN_READS = 2
SHARED_MIN_SIZE = 1 << 16
# A value whose readers would each recompute it (it is inlined into every one) is
# stored once when (readers - 1) x its work per element reaches this: the work is the
# instructions and full-size reads of its inlined expression. A 7x7 depthwise
# convolution (49 taps) read by a layer norm's three phases, or a normalized activation
# read by 49 taps of the next convolution, were recomputed by each (docs/perf.md,
# "Session 11, CNN"). From this size up: below it a kernel launch costs more. A CONCAT
# counts all its readers, not one less: inlined, it is a select chain that computes
# every part for each element it gives, so even one reader pays the parts' summed work
# per element (a Winograd output transform, 16 parts of ~20 terms each, read once by
# the batch norm after it, ran 14x slower inlined; docs/perf.md, "Session 13, CNN
# inference").
SHARED_MIN_WORK = 64
# What one part of a CONCAT inlined into several readers costs per element, in the work
# rule's units: a clamped index and a compare-and-select per part, which also keep the
# C compiler from vectorizing the loads behind it. A zero-padded input read by the 9
# taps of a 3x3 depthwise convolution ran 6.4x slower inlined than stored (0.93 against
# 5.9 ms over [8, 96, 28, 28], one thread; docs/perf.md, session 15), where counting the
# CONCAT as one instruction had its 9 readers x 3 work units fall short of
# SHARED_MIN_WORK. A CONCAT read once, or read only inside the parts of other CONCATs
# (which a stored CONCAT renders window by window, no selects), keeps the
# one-instruction count: Winograd's transforms read a padded input that way, and
# counting its parts there stored 54 more values in ResNet-18 (88 -> 142 steps, its
# step sum 197 -> 287 ms at batch 8).
CONCAT_PART_WORK = 8
SHARED_WORK_MIN_SIZE = 1 << 12
# An unstored CONCAT is a select chain that computes every part for each element, and
# a part that reads an earlier unstored CONCAT (a slice of it) computes that one's
# parts again at its own index: a chain of them (slice assignments one after another,
# as torchvision's Swin builds its shifted-window mask: nine of them into a [56, 56]
# map, 18 CONCATs deep) grows its inlined expression geometrically with its depth. A
# CONCAT with more unstored CONCATs than this nested in its parts (along one path) is
# stored whatever its size (the size floor above weighs a launch against reads; here
# the expression itself is the cost): the mask's GEMM epilogues were 16K selects per
# element and 2.2 MB of C each, five of them in Swin-T's training step (docs/perf.md,
# session 34). The benchmark models nest 3 (ResNet-18's Winograd transforms of padded
# phase planes) and 4 (its training step), left as they were.
CONCAT_DEPTH_MAX = 4
# A CONCAT read once is inlined into its reader as a select chain that computes every
# part for each element, where stored it computes each element's own part (its kernel
# writes part by part, window by window) for one more write and read. So it is stored
# when the parts' summed work exceeds the costliest part's by this much: the work its
# reader would throw away per element. DCGAN's transposed convolutions interleave four
# output phases of four taps each (a col2im by phase): inlined into the batch norm and
# ReLU after them, every element summed all sixteen taps and kept four; stored, the
# generator at batch 16 took 0.73x the time, 0.89x at batch 1 (in-process A/Bs,
# docs/perf.md, session 34). The benchmark models' kernel libraries are unchanged by it.
CONCAT_WASTE_MIN = 16
_WORK_CAP = 1 << 20
_RECOMPUTED = ELEMENTWISE | {Group.CONCAT}  # what the work rule may store

# Groups a kernel computes inline from its operands; every other value has a buffer.
_INLINED = ELEMENTWISE | {Group.MOVEMENT, Group.REDUCE, Group.CONCAT, Group.GATHER}


def shared_recomputations(program: Program, users: dict[int, list[Value]],
                          stored: dict[int, list[BufRef]], forced: set[int],
                          narrow: frozenset[str] = frozenset()) -> set[int]:
    """Element-wise values to materialize because inlining would recompute them per reader.

    Inlining is free for a value read once; a value with several readers is recomputed
    by each, from every buffer its expression reads. A transformer's residual stream is
    the case that matters: ``h[l+1] = h[l] + proj(...)`` is element-wise, so each layer
    norm (itself three passes over its row) would recompute it from the outputs of every
    earlier layer, traffic that grows with the square of the depth (GPT-2's layer norms
    took more time than its attention). Storing such a value costs one write and one
    read per reader; recomputing it costs a full-size read per buffer per reader, so
    with two or more full-size buffers behind it storing never reads more. Small values
    are left inline: there a kernel launch costs more than the reads. Bias vectors and
    index arrays, much smaller than the value, are not counted as full-size reads.

    A value so chosen that only widens a computed 16-bit value of a dtype in ``narrow``
    (a half graph's rounded activation, ``cvt.f32(cvt.bf16(x))``) has that 16-bit value
    stored instead: half the bytes, and the GEMMs among its readers read it in place
    (``narrow_operands``); each other reader widens it as it loads it.
    """
    leaves: dict[int, frozenset[Value]] = {}
    work: dict[int, int] = {}  # instructions and full-size reads per element, inlined
    readers = _readers_through_views(program, users)
    narrowed = _narrowed(program, users)
    into_concats = _only_into_concats(program, users)
    one_loop = _only_elementwise_to_outputs(program, users)
    rejoin = _rejoining(program, users)
    depth: dict[int, int] = {}  # unstored CONCATs nested in a value's inlined expression
    chosen: set[int] = set()
    for v in program.instructions:
        if v.op is Op.STG:
            continue
        if id(v) in one_loop:  # its readers, all in one_loop too, end in one loop
            continue           # (merge_siblings): nothing reads its leaves or work
        if group(v.op) not in _INLINED or id(v) in forced or id(v) in stored:
            leaves[id(v)] = frozenset([v])
            continue
        srcs = list({id(s): s for s in v.srcs}.values())
        cost = {id(s): work[id(s)] if id(s) in work else int(4 * s.size >= v.size)
                for s in srcs}  # each operand's work per element of v
        deps = frozenset().union(*(leaves.get(id(s), frozenset()) for s in srcs))
        many = readers.get(id(v), 0) - (v.op is not Op.CONCAT)
        own = (CONCAT_PART_WORK * len(v.srcs)
               if v.op is Op.CONCAT and many >= 2 and id(v) not in into_concats
               else int(v.op not in MOVEMENT))
        w = min(_WORK_CAP, own + sum(cost.values()))
        nested = max((depth.get(id(s), 0) for s in srcs), default=0) + (v.op is Op.CONCAT)
        waste = 0  # what an inlined select chain computes per element and throws away
        if v.op is Op.CONCAT and id(v) not in into_concats:
            pw = [cost[id(s)] for s in v.srcs]  # (a part read twice is computed twice)
            waste = sum(pw) - max(pw)
        # (a value whose readers rejoin is computed once where they meet: one reader)
        if v.op not in MOVEMENT and id(v) not in rejoin and (
                (group(v.op) in ELEMENTWISE and v.size >= SHARED_MIN_SIZE
                 and len(users.get(id(v), [])) >= 2
                 and sum(4 * leaf.size >= v.size for leaf in deps) >= SHARED_MIN_READS)
                or (group(v.op) in _RECOMPUTED and v.size >= SHARED_WORK_MIN_SIZE
                    and max(many, id(v) in narrowed) * w >= SHARED_MIN_WORK)
                or (v.op is Op.CONCAT and nested > CONCAT_DEPTH_MAX)
                or (v.size >= SHARED_WORK_MIN_SIZE and waste >= CONCAT_WASTE_MIN)):
            src = widened_source(v)
            keep = v if (src is None or src.dtype.name not in narrow or id(src) in stored
                         or group(src.op) not in _INLINED) else src
            chosen.add(id(keep))
            deps = frozenset([keep])
            w = 1 if keep is v else 2
        elif nested:
            depth[id(v)] = nested
        leaves[id(v)] = deps
        work[id(v)] = w
    return chosen


def _rejoining(program: Program, users: dict[int, list[Value]]) -> set[int]:
    """Element-wise values whose readers, all element-wise over the value's own shape,
    meet again in one expression before anything else reads them: ``x ^ (x >> 16)``,
    ``x * sigmoid(x)``. The kernel that computes the meeting point computes such a
    value once per element (the renderer names each value once), so to the sharing
    rules its readers are one reader. A counter-based hash is a chain of these
    (``hologram.ops.random_bits``): counted as two readers each, its rounds were
    stored one kernel after another: a dropout read by a row sum took 4 kernels and
    2 temporaries (now 2 kernels, none).

    Each value's *end* is where the chain of its single element-wise readers stops (a
    value met this way ends where its readers do); a value whose readers all end at
    one value rejoins. A GATHER whose index is an element-wise value of its own shape
    reads it element by element too (each result element reads the index at its own
    position), so the chain goes through it: the steps of a binary search
    (``npjit/searching.py``: each step's position read by the next step's GATHER and
    by its select) were stored one pass per step (session 37)."""
    end: dict[int, int] = {}
    rejoin: set[int] = set()

    def pointwise(u: Value, v: Value) -> bool:
        """Whether ``u`` reads ``v`` element by element at its own position."""
        if u.shape != v.shape:
            return False
        return group(u.op) in ELEMENTWISE or (u.op is Op.GATHER and u.srcs[1] is v
                                              and u.srcs[0] is not v)

    for v in reversed(program.instructions):
        rs = list({id(u): u for u in users.get(id(v), [])}.values())
        inline = bool(rs) and (group(v.op) in ELEMENTWISE or v.op is Op.GATHER) and all(
            pointwise(u, v) for u in rs)
        ends = {end.get(id(u), id(u)) for u in rs} if inline else set()
        if inline and len(ends) == 1:
            end[id(v)] = ends.pop()
            if len(rs) >= 2:
                rejoin.add(id(v))
        else:
            end[id(v)] = id(v)
    return rejoin


def _only_elementwise_to_outputs(program: Program, users: dict[int, list[Value]]
                                 ) -> set[int]:
    """Element-wise values whose every reader, transitively, is an element-wise value
    of the same shape or a store of one: a function of several same-shape results
    (Black-Scholes' call and put from shared ``d1``, ``cnd(d1)``, ...). The kernels of
    those results become one loop (:func:`merge_siblings`), which computes each shared
    value once per element with no buffer: storing it would add a write and a read per
    element (Black-Scholes ran as 7 kernels through 5 temps)."""
    pure: set[int] = set()
    for v in reversed(program.instructions):
        if v.op is Op.STG or group(v.op) not in ELEMENTWISE:
            continue
        readers = users.get(id(v), [])
        if readers and all(u.shape == v.shape and (u.op is Op.STG or id(u) in pure)
                           for u in readers):
            pure.add(id(v))
    return pure


#: A reduction's result that is a program output through views and is read elsewhere
#: too is stored once (:func:`stored_statistics`) where the data it reduces has at least
#: this many elements; below, the kernel launch costs more than the reads it saves.
STATISTIC_MIN_READS = 1 << 12


def stored_statistics(program: Program, users: dict[int, list[Value]],
                      stored: dict[int, list[BufRef]], forced: set[int]) -> set[int]:
    """Values to materialize that contain a reduction, are stored through views (a
    program output reshaped: a batch norm's or layer norm's saved mean) and are read by
    another instruction as well.

    A reduction is inlined into each kernel that reads it, computed once per output row
    there; the work rule (:func:`shared_recomputations`) counts per element and leaves
    it alone. But a result the program returns is computed by its output's kernel
    anyway, and each other kernel reading it computed it again: a batch norm's mean in
    training was computed three times (its output, the variance, the normalization),
    each a pass over the activation (docs/perf.md, "Session 13"). Stored once, the
    others read the few stored elements."""
    reduced: dict[int, int] = {}  # elements the reductions in v's inlined expression read
    readers = _readers_through_views(program, users)
    chosen: set[int] = set()

    def reaches_store(v: Value) -> bool:
        return any(u.op is Op.STG or (u.op in MOVEMENT and (id(u) in stored
                                                           or reaches_store(u)))
                   for u in users.get(id(v), []))

    for v in program.instructions:
        if v.op is Op.STG or group(v.op) not in _INLINED or id(v) in forced \
                or id(v) in stored:
            continue
        n = max((reduced.get(id(s), 0) for s in v.srcs), default=0)
        if group(v.op) is Group.REDUCE:
            n = max(n, v.srcs[0].size)
        if not n:
            continue
        reduced[id(v)] = n
        if (v.op not in MOVEMENT and n >= STATISTIC_MIN_READS
                and readers.get(id(v), 0) >= 2 and reaches_store(v)):
            chosen.add(id(v))
            reduced[id(v)] = 0
    return chosen


def _readers_through_views(program: Program, users: dict[int, list[Value]]
                           ) -> dict[int, int]:
    """id(value) -> how many instructions read it, through any chain of views (a layer
    norm over channels reads a convolution's result through a PERMUTE)."""
    count: dict[int, int] = {}
    for v in reversed(program.instructions):
        n = 0
        for u in users.get(id(v), []):
            n += count.get(id(u), 1) if u.op in MOVEMENT else 1
        count[id(v)] = n
    return count


def _narrowed(program: Program, users: dict[int, list[Value]]) -> set[int]:
    """Values read only through windows that drop some of their elements (SLICEs,
    possibly behind RESHAPEs). Inlined, such a value is computed over its readers'
    index space, not its own: a depthwise convolution computed over its flat padded
    plane (``hologram_torch.lowering.convolution._depthwise_flat``) would run over the
    7-wide rows of the window its readers take, which is what the flat plane avoids.
    The work rule stores one whose expression is work enough, as if it had a second
    reader."""
    narrowed: set[int] = set()
    through: set[int] = set()  # RESHAPEs every reader of which is a narrowing SLICE
    for v in reversed(program.instructions):
        readers = users.get(id(v), [])
        if readers and all((u.op is Op.SLICE and u.size < v.size)
                           or (u.op is Op.RESHAPE and id(u) in through) for u in readers):
            (through if v.op is Op.RESHAPE else narrowed).add(id(v))
    return narrowed


def _only_into_concats(program: Program, users: dict[int, list[Value]]) -> set[int]:
    """Values every reader of which, through views and element-wise instructions, is a
    CONCAT: they are computed inside CONCAT parts, which a stored CONCAT renders one
    loop nest per part, window by window (``render_c.concat_kernel``), with no select
    chain for an unstored CONCAT among them (Winograd's transforms of a padded input)."""
    into: set[int] = set()
    for v in reversed(program.instructions):
        readers = users.get(id(v), [])
        if readers and all(u.op is Op.CONCAT or ((u.op in MOVEMENT or group(u.op) in
                                                   ELEMENTWISE) and id(u) in into)
                           for u in readers):
            into.add(id(v))
    return into


def users_of(program: Program) -> dict[int, list[Value]]:
    """id(value) -> the distinct instructions that read it (STG included)."""
    users: dict[int, list[Value]] = {}
    for v in program.instructions:
        for s in {id(x): x for x in v.srcs}.values():
            users.setdefault(id(s), []).append(v)
    return users


def elementwise_sink(v: Value, users: dict[int, list[Value]],
                     materialized: Callable[[Value], bool]) -> Value | None:
    """The one materialized value every read of ``v`` ends in, or None.

    Every reader of ``v``, directly or through readers that are inlined (not
    ``materialized``), must be element-wise at ``v``'s shape, and all of them must end
    in the same materialized value. That value's kernel is then the only one to read
    ``v``, and it reads ``v[i]`` only to write element ``i``. A store, a movement op,
    a reduction, a GEMM, another shape or a second materialized reader gives None, as
    does a ``v`` nothing reads.
    """
    sink: Value | None = None
    seen = {id(v)}
    stack = [v]
    while stack:
        for u in users.get(id(stack.pop()), []):
            if id(u) in seen:
                continue
            seen.add(id(u))
            if u.op is Op.STG or group(u.op) not in ELEMENTWISE or u.shape != v.shape:
                return None
            if materialized(u):
                if sink is not None:
                    return None  # two kernels would read v
                sink = u
            else:
                stack.append(u)
    return sink


def _in_place_target(g: Value, users: dict[int, list[Value]], stored: dict[int, list[BufRef]],
                     forced: set[int]) -> Value | None:
    """The value a GEMM result ``g`` may be computed in place of, or None.

    The common shape after a GEMM is an element-wise tail into one materialized value:
    ``gelu(x @ w + b)`` stored, or a ReLU backward's mask applied to the product.
    Written into the tail's buffer, the product needs no temp of its own, and the tail
    reads and writes the same element (in the GEMM's epilogue, on the tile in cache).
    That is right when ``g``'s reads all end in one materialized value (stored or
    ``forced``) of ``g``'s dtype (:func:`elementwise_sink`).
    """
    sink = elementwise_sink(g, users, lambda u: id(u) in stored or id(u) in forced)
    return sink if sink is not None and sink.dtype == g.dtype else None


def _phi_bytes(phi: tuple[int, int, int]) -> int:
    c, p, b = phi
    return (c * 48 + p) * 256 + b
