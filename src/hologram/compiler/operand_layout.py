"""Element-wise values a GEMM reads through a copying reshape: stored in its layout.

A batch-folded convolution (``hologram_torch.lowering.convolution``) multiplies its
weight by the activations ``[B, C, L]`` viewed as ``[C, B*L]``: a permute, then a
merge of two axes that are not adjacent in memory, which no strides express, so the
scheduler stores the value in the GEMM's layout. When the value has other readers too
(MobileNetV3-small's residual adds read each block's output again), the scheduler
stored it twice: once in its own layout for them, once copied into the GEMM's
(``schedule._operand_home`` handles the value with one reader). This pass rewrites the
program so the value has one reader, the chain into the GEMM's layout, and the other
readers read that stored layout back through the inverse chain (a split and a
permute: a strided view whose innermost axis stays contiguous), so one kernel writes
the value once, in the layout the GEMM reads.

It runs when a program is lowered, after canonicalization, whose rules fold reshape
and permute pairs and would undo it. Only views are added: every backend and the
reference interpreter read the same values.

``narrow_operand_layouts`` does the same job for a product of two widened 16-bit values
(``schedule.narrow_operands``): a bf16 graph's attention output reaches its projection as
``reshape(permute(cvt.f32(x)))``, a copying chain above the widening, so the scheduler
could only store the float view (and then multiply in float, with a float copy of the
weight too). Moving the CVT above the chain (it changes no element's position) lets it
store the 16-bit value in the GEMM's layout instead.
"""

from __future__ import annotations

from ..isa.builder import cast, make, permute, reshape
from ..isa.opcodes import ELEMENTWISE, Op, group
from ..isa.program import Program
from ..isa.value import Value
from .gemm_layout import copying_reshape, walk_views
from .schedule import only_reader_chain, users_of, view_chain, widened_dtype, widened_source


def gemm_operand_layouts(program: Program) -> Program:
    """``program`` with each multi-reader element-wise value that a GEMM reads through a
    copying reshape stored in the GEMM's layout (see the module's docstring)."""
    for _ in range(len(program.instructions)):  # one value per pass: a rebuild moves others
        found = _candidate(program)
        if found is None:
            return program
        program = _redirect(program, *found)
    return program  # pragma: no cover


def _candidate(program: Program) -> tuple[Value, Value, Value] | None:
    """(value, its chain's first link, the value read back from the GEMM's layout)."""
    users = users_of(program)
    for g in program.instructions:
        if g.op is not Op.GEMM:
            continue
        for s in g.srcs:
            root, chain = view_chain(s, {})
            if not chain or group(root.op) not in ELEMENTWISE:
                continue
            readers = users.get(id(root), [])
            if len(readers) < 2 or any(u.op is Op.STG for u in readers):
                continue
            at = copying_reshape(root, chain)
            if at is None:
                continue
            prefix = chain[:chain.index(at) + 1]
            if any(m.op not in (Op.RESHAPE, Op.PERMUTE) for m in prefix):
                continue  # a window or a broadcast has no inverse view
            if len(prefix) > 1 and not only_reader_chain(prefix[0], prefix[1:-1], users):
                continue  # another reader of a link would recompute the value
            back = _inverse(at, prefix)
            if back is not None:
                return root, prefix[0], back
    return None


def _inverse(at: Value, prefix: list[Value]) -> Value | None:
    """``prefix``'s root read back from ``at`` stored row-major, or None unless that is
    a strided view with the root's innermost axis contiguous (readers then keep their
    unit-stride inner loops)."""
    back = at
    for m in reversed(prefix):
        src = m.srcs[0]
        if m.op is Op.RESHAPE:
            back = reshape(back, src.shape)
        else:
            perm = m.attr("perm")
            inv = [0] * len(perm)
            for d, p in enumerate(perm):
                inv[p] = d
            back = permute(back, inv)
    _, chain = view_chain(back, {id(at): None})
    shape, strides, _, copying = walk_views(chain, at.shape)
    if copying is not None or (shape[-1] > 1 and strides[-1] != 1):
        return None
    return back


def _redirect(program: Program, root: Value, keep: Value, back: Value) -> Program:
    """``program`` with every reader of ``root`` but ``keep`` reading ``back``."""
    new: dict[int, Value] = {}
    for v in program.instructions:
        srcs = tuple(back if s is root and v is not keep else new.get(id(s), s)
                     for s in v.srcs)
        if any(a is not b for a, b in zip(srcs, v.srcs, strict=True)):
            new[id(v)] = Value(v.op, v.dtype, v.shape, srcs, v.attrs)
    outputs = [new.get(id(o), o) for o in program.outputs]
    return Program(outputs, program.inputs, program.name)


def narrow_operand_layouts(program: Program, narrow: frozenset[str]) -> Program:
    """``program`` with the widening CVT of each GEMM operand moved above a copying view
    chain, for the GEMMs whose two operands both widen values of one dtype in ``narrow``
    (the 16-bit dtypes the backend's GEMM reads in place); see the module's docstring.
    Other products keep their form: for one that multiplies in float, a CVT above a
    transposing chain would be stored as a transposed float copy."""
    if not narrow:
        return program
    new: dict[int, Value] = {}  # id(old value) -> its rebuilt value
    for v in program.instructions:
        srcs = [new.get(id(s), s) for s in v.srcs]
        if v.op is Op.GEMM:
            srcs = [_widened_last(s, new) or x
                    for s, x in zip(v.srcs, srcs, strict=True)] if _narrow_pair(v, narrow) \
                else srcs
        if any(a is not b for a, b in zip(srcs, v.srcs, strict=True)):
            new[id(v)] = Value(v.op, v.dtype, v.shape, tuple(srcs), v.attrs)
    if not new:
        return program
    return Program([new.get(id(o), o) for o in program.outputs], program.inputs, program.name)


def _narrow_pair(g: Value, narrow: frozenset[str]) -> bool:
    """Whether both operands of f32 GEMM ``g`` are views of CVTs widening one dtype in
    ``narrow``."""
    dtypes = {widened_dtype(s) for s in g.srcs}
    return g.dtype.name == "f32" and len(dtypes) == 1 and dtypes <= narrow


def _widened_last(s: Value, new: dict[int, Value]) -> Value | None:
    """Operand ``s`` (views of a widening CVT) as the CVT of the same views over the
    16-bit source (its rebuilt form in ``new``), when those views copy; else None."""
    root, chain = view_chain(s, {})
    if not chain or copying_reshape(root, chain) is None:
        return None
    src = widened_source(root)
    x = new.get(id(src), src)
    for m in chain:
        x = make(m.op, [x], dict(m.attrs), x.dtype, m.shape)
    return cast(x, root.dtype)
