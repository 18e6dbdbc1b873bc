"""How a GEMM's operands sit in memory, for a BLAS call that reads them in place.

A GEMM operand is a view chain (reshape, permute, expand, slice) over a materialized
buffer. BLAS reads a matrix given a pointer, a leading dimension and a
transpose flag, so a chain can be handed over without a copy exactly when its
last two axes have one unit stride between them; batch axes may have any
stride (0 for a broadcast one). ``gemm_desc`` works that out at compile time,
where shapes are known, and returns None when BLAS cannot read the view (the
backend then falls back to NumPy's matmul, which copies).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..isa.opcodes import Op
from ..isa.value import Value, contiguous_strides
from .schedule import BufRef, gemm_operand_chain

#: Batch axes the runtime's descriptor has room for (contiguous ones are merged first).
MAX_BATCH_DIMS = 6
#: dtypes a host BLAS multiplies (a device library may take more: cuBLAS f16/bf16).
BLAS_DTYPES = ("f32", "f64")
_INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class Strided:
    """A strided view (in elements) of buffer ``ref``, starting ``offset`` elements in."""

    ref: BufRef
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]


@dataclass(frozen=True)
class Operand:
    """One matrix operand as BLAS takes it, plus its per-batch-axis strides."""

    ref: BufRef
    offset: int  # elements
    trans: bool
    ld: int
    batch_strides: tuple[int, ...]


@dataclass(frozen=True)
class GemmDesc:
    """Everything the C GEMM driver needs for ``C[b] = A[b] @ B[b]`` over a batch."""

    dtype: str  # 'f32' | 'f64' (host BLAS); cuBLAS also 'f16' | 'bf16'
    batch: tuple[int, ...]  # merged batch shape (empty for a plain product)
    m: int
    n: int
    k: int
    a: Operand
    b: Operand
    c: Operand
    narrow: str | None = None  # A and B hold this 16-bit dtype (C: ``dtype``)


def strided(v: Value, buffers: dict[int, BufRef], narrow: str | None = None
            ) -> Strided | None:
    """The strided view a chain of movement ops over a buffer amounts to, or None
    when a reshape would need a copy (NumPy's rule: only reshape contiguous data).
    ``narrow``: read through a widening CVT to its stored 16-bit source
    (``schedule.gemm_operand_chain``)."""
    root, chain = gemm_operand_chain(v, buffers, narrow)
    if id(root) not in buffers:
        return None
    ref = buffers[id(root)]
    offset = _element_offset(ref)
    if offset is None:
        return None
    shape, strides, moved, copying = walk_views(chain, ref.shape)
    if copying is not None:
        return None
    return Strided(ref, offset + moved, tuple(shape), tuple(strides))


def _view_step(m: Value, shape: tuple[int, ...], strides: tuple[int, ...]
               ) -> tuple[tuple[int, ...], tuple[int, ...], int] | None:
    """(shape, strides, elements the start moves) after movement op ``m`` over a view
    of ``shape``/``strides``, or None where ``m`` is a RESHAPE that needs a copy."""
    if m.op is Op.RESHAPE:
        new = nocopy_reshape(shape, strides, m.shape)
        return None if new is None else (m.shape, new, 0)
    if m.op is Op.PERMUTE:
        perm = m.attr("perm")
        return tuple(shape[p] for p in perm), tuple(strides[p] for p in perm), 0
    if m.op is Op.SLICE:  # a window: the same strides from a later first element
        return m.shape, strides, sum(s * st for s, st in zip(m.attr("starts"), strides,
                                                             strict=True))
    # EXPAND: new leading axes and grown size-1 axes read the same element
    lead = len(m.shape) - len(shape)
    old_shape, old_strides = (1,) * lead + shape, (0,) * lead + strides
    return m.shape, tuple(0 if o == 1 and s != 1 else st for o, s, st in
                          zip(old_shape, m.shape, old_strides, strict=True)), 0


def walk_views(chain: list[Value], shape: tuple[int, ...]
               ) -> tuple[tuple[int, ...], tuple[int, ...], int, Value | None]:
    """Movement ops ``chain`` (innermost first) over row-major data of ``shape``:
    (shape, strides, elements the start moved, None), or, at the first RESHAPE no
    strides express, the view so far and that RESHAPE."""
    strides, offset = contiguous_strides(shape), 0
    for m in chain:
        step = _view_step(m, shape, strides)
        if step is None:
            return shape, strides, offset, m
        shape, strides, moved = step
        offset += moved
    return shape, strides, offset, None


def copying_reshape(root: Value, chain: list[Value]) -> Value | None:
    """The first RESHAPE of ``chain`` (movement ops over ``root``, innermost first) that
    no strides express once ``root`` is stored row-major, or None if BLAS can read the
    whole chain in place."""
    return walk_views(chain, root.shape)[3]


def _element_offset(ref: BufRef) -> int | None:
    """Where ``ref`` starts in its slot, in elements (arena data lies at a byte offset);
    None if that is not a whole number of elements."""
    if ref.kind != "arena":
        return 0
    q, r = divmod(ref.offset, ref.dtype.itemsize)
    return None if r else q


def nocopy_reshape(shape: tuple[int, ...], strides: tuple[int, ...],
                   new_shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """Strides that view ``shape``/``strides`` data as ``new_shape`` without a copy, or
    None (NumPy's rule: each run of old axes that new axes split or merge must be
    contiguous within itself; e.g. a transposed batch of matrices can still have its
    batch axis split)."""
    if 0 in shape or 0 in new_shape:
        return contiguous_strides(new_shape)
    old = [(n, st) for n, st in zip(shape, strides, strict=True) if n != 1]
    out = [0] * len(new_shape)
    oi = ni = 0
    while ni < len(new_shape) and oi < len(old):
        nj, oj = ni + 1, oi + 1
        np_, op = new_shape[ni], old[oi][0]
        while np_ != op:
            if np_ < op:
                np_ *= new_shape[nj]
                nj += 1
            else:
                op *= old[oj][0]
                oj += 1
        for k in range(oi, oj - 1):  # the old run must be one block of memory
            if old[k][1] != old[k + 1][0] * old[k + 1][1]:
                return None
        out[nj - 1] = old[oj - 1][1]
        for k in range(nj - 1, ni, -1):
            out[k - 1] = out[k] * new_shape[k]
        ni, oi = nj, oj
    last = out[ni - 1] if ni > 0 else 1
    for k in range(ni, len(new_shape)):  # trailing size-1 axes
        out[k] = last
    return tuple(out)


def _matrix(view: Strided, rows: int, cols: int) -> tuple[bool, int] | None:
    """(transposed, leading dimension) for the last two axes, or None."""
    sr, sc = view.strides[-2], view.strides[-1]
    if sc == 1 or cols == 1:  # row-major rows
        ld = sr if rows > 1 else cols
        if ld >= max(1, cols):
            return False, ld
    if sr == 1 or rows == 1:  # column-major: BLAS reads it transposed
        ld = sc if cols > 1 else rows
        if ld >= max(1, rows):
            return True, ld
    return None


def _merge_batch(shape: tuple[int, ...], per_operand: list[tuple[int, ...]]
                 ) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """Drop size-1 batch axes and merge neighbours every operand steps through evenly."""
    dims = [(s, [st[i] for st in per_operand]) for i, s in enumerate(shape) if s != 1]
    merged: list[tuple[int, list[int]]] = []
    for s, sts in dims:
        if merged:
            ps, psts = merged[-1]
            if all(p == q * s for p, q in zip(psts, sts, strict=True)):
                merged[-1] = (ps * s, sts)
                continue
        merged.append((s, sts))
    new_shape = tuple(s for s, _ in merged)
    strides = [tuple(sts[j] for _, sts in merged) for j in range(len(per_operand))]
    return new_shape, strides


def unreadable_operand(v: Value, buffers: dict[int, BufRef],
                       dtypes: tuple[str, ...] = BLAS_DTYPES, narrow: str | None = None
                       ) -> Value | None:
    """The operand of GEMM ``v`` that is a view BLAS cannot read in place (a reshape of a
    permuted buffer that would need a copy, a broadcast matrix), or None.

    The CPU backend then has the planner give that view a buffer of its own (one copy
    kernel on hologram's threads), so the product still runs on the BLAS driver.
    ``np.matmul`` would copy it too, and run on OpenBLAS's own thread pool, whose threads
    spin against ours after every call; it also made every program with such a GEMM
    launch step by step through Python (session 9: GPT-2's attention output,
    ``[B, H, L, E]`` viewed as ``[B * L, H * E]``, twelve times per forward)."""
    if v.dtype.name not in dtypes:
        return None
    for s in v.srcs:
        if id(s) in buffers:  # a buffer of its own is contiguous: BLAS reads it
            continue
        view = strided(s, buffers, narrow)
        if view is None or _matrix(view, s.shape[-2], s.shape[-1]) is None:
            return s
    return None


def gemm_desc(v: Value, buffers: dict[int, BufRef], out: BufRef,
              int64: bool, dtypes: tuple[str, ...] = BLAS_DTYPES,
              narrow: str | None = None) -> GemmDesc | None:
    """The BLAS-ready description of GEMM ``v`` writing ``out``, or None if BLAS
    cannot read the operands in place (or ``dtypes``, the library's, lack its dtype).
    ``narrow``: the operands are read in that 16-bit dtype (``GemmPlan.narrow``)."""
    if v.dtype.name not in dtypes:
        return None
    a, b = (strided(s, buffers, narrow) for s in v.srcs)
    if a is None or b is None:
        return None
    if narrow is not None and not a.ref.dtype.name == b.ref.dtype.name == narrow:
        return None
    *batch, m, k = a.shape
    n = b.shape[-1]
    la, lb = _matrix(a, m, k), _matrix(b, k, n)
    if la is None or lb is None:
        return None
    c_strides = contiguous_strides(v.shape)
    c_off = _element_offset(out)
    if c_off is None:
        return None
    nbd = len(batch)
    shape, (sa, sb, sc) = _merge_batch(tuple(batch), [a.strides[:nbd], b.strides[:nbd],
                                                      c_strides[:nbd]])
    if len(shape) > MAX_BATCH_DIMS:
        return None
    if not int64 and max(m, n, k, la[1], lb[1], max(n, 1)) > _INT32_MAX:
        return None
    return GemmDesc(v.dtype.name, shape, m, n, k,
                    Operand(a.ref, a.offset, la[0], la[1], sa),
                    Operand(b.ref, b.offset, lb[0], lb[1], sb),
                    Operand(out, c_off, False, max(n, 1), sc), narrow)
