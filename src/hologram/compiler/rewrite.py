"""The rewrite engine: rules are data, applied bottom-up to a fixed point.

A :class:`Rule` is a name, a declarative :class:`Pat` over hash-consed values and
a function that builds the replacement from the pattern's bindings::

    Rule("mul_one", Pat(ops={Op.MUL}, srcs=(Pat(name="x"), Pat(const=1.0))),
         lambda b, node: b["x"])

:func:`rewrite` rebuilds every instruction in definition order with its
already-rewritten operands, then applies the rules to it until none matches, and
repeats whole passes until one changes nothing. Memory instructions (LDG, STG)
are never rewritten, so inputs, output indices and Φ addresses are preserved.
A rule set that cycles (a node rewritten back to a form it had before, or too
many rewrites) raises :class:`RewriteLoopError` naming the rules involved.
"""

from __future__ import annotations

import hashlib
import math
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import HologramError, VerifyError
from ..isa.builder import make
from ..isa.opcodes import Op
from ..isa.program import Program
from ..isa.value import Value

Bindings = dict[str, Value]
RuleFn = Callable[[Bindings, Value], "Value | None"]

MEMORY_OPS = frozenset({Op.LDG, Op.STG})


class RewriteLoopError(HologramError, RuntimeError):
    """A rule set keeps rewriting without reaching a fixed point."""

    def __init__(self, message: str, rules: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.rules: tuple[str, ...] = tuple(dict.fromkeys(rules))


# --------------------------------------------------------------------------- patterns

_ANY: Any = object()  # "no constant test" marker (None is not a constant value)


def const_scalar(v: Value) -> np.generic | None:
    """A CONST instruction's value as a NumPy scalar of its dtype (None if not a CONST
    or the dtype has no NumPy type here). Constants are stored as Python numbers, so
    this is the value the program actually computes with (e.g. 0.1 rounded to f32)."""
    if v.op is not Op.CONST or v.dtype.np_dtype is None:
        return None
    return np.asarray(v.attr("value"), dtype=v.dtype.np_dtype)[()]


def _bits(x: np.generic) -> bytes:
    return np.asarray(x).tobytes()


def const_equals(v: Value, want: float | int | bool) -> bool:
    """Whether CONST ``v`` is exactly ``want`` in ``v``'s dtype, bit for bit.

    Floats compare by bit pattern (so -0.0 differs from 0.0) except that every NaN
    matches a NaN; ``want`` must be exactly representable in the dtype. For integer
    and bool dtypes ``want`` must be an integral value and compares by value (so
    ``-0.0`` and ``0.0`` both mean integer zero).
    """
    got = const_scalar(v)
    if got is None:
        return False
    kind = v.dtype.kind
    if kind == "f":
        w = float(want)
        with np.errstate(all="ignore"):
            cast = np.asarray(w, dtype=v.dtype.np_dtype)[()]
        if math.isnan(w):
            return bool(np.isnan(got))
        if float(cast) != w:  # not representable in this dtype: never matches
            return False
        return _bits(got) == _bits(cast)
    w = float(want)
    if not math.isfinite(w) or w != int(w):
        return False
    if kind == "b" and int(w) not in (0, 1):
        return False
    return int(got) == int(w)


@dataclass(frozen=True, eq=False)
class Pat:
    """A declarative pattern over one value and (optionally) its operands.

    ops: the opcodes that match (None: any). srcs: patterns for the operands, in
    order (None: operands are not inspected). const: the value must be a CONST equal
    to this number in its dtype (see :func:`const_equals`). kind: allowed dtype kinds
    ('f', 'i', 'b', or several, e.g. 'fi'). where: an extra predicate on the value.
    name: bind the matched value; a name used twice must bind the same value.
    commutative: also try the first two operand patterns swapped.
    """

    ops: frozenset[Op] | None = None
    srcs: tuple[Pat, ...] | None = None
    const: Any = _ANY
    kind: str | None = None
    name: str | None = None
    where: Callable[[Value], bool] | None = None
    commutative: bool = False

    def __post_init__(self) -> None:
        ops = self.ops
        if ops is not None:
            ops = frozenset({ops}) if isinstance(ops, Op) else frozenset(ops)
            object.__setattr__(self, "ops", ops)
        if self.const is not _ANY and ops is None:
            object.__setattr__(self, "ops", frozenset({Op.CONST}))
        if self.srcs is not None:
            object.__setattr__(self, "srcs", tuple(self.srcs))

    def match(self, v: Value) -> Bindings | None:
        """The bindings if ``v`` matches, else None."""
        return _match(self, v, {})

    def __repr__(self) -> str:
        parts = []
        if self.ops is not None:
            parts.append("ops={" + ",".join(sorted(str(o) for o in self.ops)) + "}")
        if self.const is not _ANY:
            parts.append(f"const={self.const!r}")
        for k in ("kind", "name"):
            if getattr(self, k) is not None:
                parts.append(f"{k}={getattr(self, k)!r}")
        if self.where is not None:
            parts.append(f"where={getattr(self.where, '__name__', 'fn')}")
        if self.commutative:
            parts.append("commutative=True")
        if self.srcs is not None:
            parts.append("srcs=(" + ", ".join(map(repr, self.srcs)) + ")")
        return "Pat(" + ", ".join(parts) + ")"


def _match(p: Pat, v: Value, b: Bindings) -> Bindings | None:
    if p.ops is not None and v.op not in p.ops:
        return None
    if p.kind is not None and v.dtype.kind not in p.kind:
        return None
    if p.const is not _ANY and not (v.op is Op.CONST and const_equals(v, p.const)):
        return None
    if p.name is not None:
        bound = b.get(p.name)
        if bound is not None and bound is not v:
            return None
    if p.srcs is not None:
        if len(p.srcs) != len(v.srcs):
            return None
        got = _match_srcs(p.srcs, v.srcs, b)
        if got is None and p.commutative and len(v.srcs) >= 2:
            swapped = (v.srcs[1], v.srcs[0], *v.srcs[2:])
            got = _match_srcs(p.srcs, swapped, b)
        if got is None:
            return None
        b = got
    if p.where is not None and not p.where(v):
        return None
    if p.name is not None and p.name not in b:
        b = {**b, p.name: v}
    return b


def _match_srcs(pats: tuple[Pat, ...], srcs: Sequence[Value], b: Bindings) -> Bindings | None:
    cur: Bindings | None = dict(b)
    for sp, s in zip(pats, srcs, strict=True):
        cur = _match(sp, s, cur)
        if cur is None:
            return None
    return cur


@dataclass(frozen=True, eq=False)
class Rule:
    """A named rewrite: where ``pattern`` matches a value, ``fn(bindings, value)``
    returns its replacement (same dtype and shape) or None to decline."""

    name: str
    pattern: Pat
    fn: RuleFn
    doc: str = ""

    def __repr__(self) -> str:
        return f"Rule({self.name!r}, {self.pattern!r})"


# --------------------------------------------------------------------------- structural key

_KEYS: weakref.WeakKeyDictionary[Value, bytes] = weakref.WeakKeyDictionary()


def _attr_key(v: Any) -> str:
    if isinstance(v, bool):
        return f"b{v}"
    if isinstance(v, float):
        return "f" + (v.hex() if math.isfinite(v) else repr(v))
    if isinstance(v, int):
        return f"i{v}"
    if isinstance(v, tuple):
        return "(" + ",".join(_attr_key(x) for x in v) + ")"
    return repr(v)


def _node_header(n: Value, skip: Callable[[Value, str], bool]) -> bytes:
    """What a digest hashes of ``n`` itself: opcode, dtype, shape, the attributes but
    those ``skip`` names (its operands' digests follow)."""
    attrs = ";".join(f"{k}={_attr_key(x)}" for k, x in n.attrs if not skip(n, k))
    return f"{n.op.value}|{n.dtype.name}|{n.shape}|{attrs}|".encode()


def _digest(v: Value, memo: weakref.WeakKeyDictionary[Value, bytes],
            skip: Callable[[Value, str], bool]) -> bytes:
    """A content digest of ``v`` and everything it depends on (opcode, dtype, shape,
    attributes but those ``skip`` names, the operands' digests), memoized in ``memo``."""
    got = memo.get(v)
    if got is not None:
        return got
    # post-order over the operands not keyed yet (iterative: programs can be deep)
    stack: list[tuple[Value, bool]] = [(v, False)]
    while stack:
        n, ready = stack.pop()
        if n in memo:
            continue
        if not ready:
            stack.append((n, True))
            stack.extend((s, False) for s in n.srcs if s not in memo)
            continue
        h = hashlib.blake2b(_node_header(n, skip), digest_size=16)
        for s in n.srcs:
            h.update(memo[s])
        memo[n] = h.digest()
    return memo[v]


def structural_key(v: Value) -> bytes:
    """A content digest of ``v`` and everything it depends on: opcode, dtype, shape,
    attributes and the operands' keys, never object ids or build order. Memoized."""
    return _digest(v, _KEYS, lambda n, k: False)


_FORM_KEYS: weakref.WeakKeyDictionary[Value, bytes] = weakref.WeakKeyDictionary()


def _which_input(n: Value, k: str) -> bool:
    return n.op is Op.LDG and k in ("in", "phi")


def form_key(v: Value) -> bytes:
    """:func:`structural_key` without which program input each load reads: equal for
    the same computation over other buffers (a model's repeated layers)."""
    return _digest(v, _FORM_KEYS, _which_input)


#: How many levels of operands ``order_key`` compares before the whole computation.
ORDER_DEPTH = 3
_NEAR_KEYS: dict[int, weakref.WeakKeyDictionary[Value, bytes]] = {}


def near_form_key(v: Value, depth: int = ORDER_DEPTH) -> bytes:
    """:func:`form_key` of ``v`` down to ``depth`` levels of operands only (deeper ones
    count by opcode, dtype and shape): equal for the same local computation whatever
    produced its inputs further up."""
    memo = _NEAR_KEYS.setdefault(depth, weakref.WeakKeyDictionary())
    got = memo.get(v)
    if got is not None:
        return got
    h = hashlib.blake2b(_node_header(v, _which_input), digest_size=16)
    if depth > 0:
        for s in v.srcs:
            h.update(near_form_key(s, depth - 1))
    memo[v] = h.digest()
    return memo[v]


def order_key(v: Value) -> tuple[bool, bytes, bytes, bytes]:
    """Sort key for commutative operands: constants last, then by the computation's
    form near the operand, then by its whole form, then by its full structural key.
    Forms before the full key, so that repeated layers, which differ only in the
    buffers they read, order their operands alike and render to the same C
    (``compiler/shared_bodies.py`` then compiles it once); with the full key first the
    order followed the digests of each layer's input numbers. The near form first,
    because the whole form differs with what produced a layer's input: ResNet-18's
    Winograd transforms multiply the same loads by the same coefficients in every
    stage, but the activation each stage loads has another history, so their factors
    came in another order per layer and seven steps stayed three and four copies of two
    bodies (docs/perf.md, session 20)."""
    return tuple(part(v) for part in ORDER_PARTS)  # type: ignore[return-value]


def _is_const(v: Value) -> bool:
    return v.op is Op.CONST


#: ``order_key``'s parts in order; a comparison may stop at the first that differs
#: (``rules._unordered``), so the later digests are computed only on ties.
ORDER_PARTS: tuple[Callable[[Value], Any], ...] = (_is_const, near_form_key, form_key,
                                                   structural_key)


# --------------------------------------------------------------------------- engine

def _rebuild(v: Value, srcs: tuple[Value, ...]) -> Value:
    return make(v.op, srcs, dict(v.attrs), v.dtype, v.shape)


def _describe(v: Value) -> str:
    return f"{v.op}.{v.dtype}[{','.join(map(str, v.shape))}]"


def rewrite(
    program: Program,
    rules: Iterable[Rule],
    *,
    stats: dict[str, int] | None = None,
    max_passes: int = 64,
    max_rewrites: int = 256,
) -> Program:
    """Apply ``rules`` bottom-up until a whole pass changes nothing.

    ``stats``, if given, is updated with how often each rule fired, plus
    ``dead_code``: instructions of ``program`` whose rewritten form is no longer
    reachable from the outputs (so the rebuilt program dropped them).
    ``max_rewrites`` bounds the rewrites of one instruction in one pass and
    ``max_passes`` the number of passes; exceeding either, or rewriting an
    instruction back to a form it had before, raises RewriteLoopError.
    """
    rules = list(rules)
    by_op: dict[Op, list[Rule]] = {
        op: [r for r in rules if r.pattern.ops is None or op in r.pattern.ops]
        for op in Op if op not in MEMORY_OPS
    }
    counts: dict[str, int] = {}
    normal: dict[Value, Value] = {}  # node (operands already rewritten) -> its normal form

    def fire(node: Value) -> Value:
        hit = normal.get(node)
        if hit is not None:
            return hit
        chain: list[Value] = [node]
        fired: list[str] = []
        cur = node
        while True:
            for rule in by_op.get(cur.op, ()):
                b = _match(rule.pattern, cur, {})
                if b is None:
                    continue
                r = rule.fn(b, cur)
                if r is None or r is cur:
                    continue
                if not isinstance(r, Value) or r.op is Op.STG:
                    raise TypeError(f"rule {rule.name} returned {r!r}, not a value")
                if r.dtype is not cur.dtype or r.shape != cur.shape:
                    raise VerifyError(
                        f"rule {rule.name} rewrote {_describe(cur)} to {_describe(r)}: "
                        "a rewrite must keep the dtype and shape"
                    )
                fired.append(rule.name)
                counts[rule.name] = counts.get(rule.name, 0) + 1
                if r in chain:
                    cycle = fired[chain.index(r):]
                    raise RewriteLoopError(
                        f"rewrite loop: {_describe(node)} came back to a form it had "
                        f"before via rules {' -> '.join(cycle)}", cycle)
                if len(fired) > max_rewrites:
                    tail = fired[-8:]
                    raise RewriteLoopError(
                        f"rewrite loop: {_describe(node)} was rewritten more than "
                        f"{max_rewrites} times (last rules: {', '.join(tail)})", tail)
                chain.append(r)
                cur = r
                break
            else:
                break
        normal[node] = cur
        normal[cur] = cur
        return cur

    current = program
    # image: each original compute instruction -> its rewritten form so far
    image: dict[Value, Value | None] = {
        v: v for v in program.instructions if v.op not in MEMORY_OPS
    }
    seen_states: dict[tuple[Value, ...], int] = {program.outputs: 0}
    fired_per_pass: list[dict[str, int]] = []
    for n_pass in range(1, max_passes + 1):
        before = dict(counts)
        memo: dict[Value, Value] = {}
        for v in current.instructions:
            if v.op is Op.LDG:
                memo[v] = v
                continue
            srcs = tuple(memo[s] for s in v.srcs)
            node = v if all(a is b for a, b in zip(srcs, v.srcs, strict=True)) else _rebuild(
                v, srcs)
            memo[v] = node if v.op is Op.STG else fire(node)
        outputs = tuple(memo[o] for o in current.outputs)
        for o, img in image.items():
            if img is not None:
                image[o] = memo.get(img)
        fired_per_pass.append({k: n - before.get(k, 0) for k, n in counts.items()
                               if n != before.get(k, 0)})
        if all(a is b for a, b in zip(outputs, current.outputs, strict=True)):
            if fired_per_pass[-1]:
                # rules fired, yet the program came back unchanged: some rewrite was
                # undone by another, so the result would not be a fixed point
                cycle = list(fired_per_pass[-1])
                raise RewriteLoopError(
                    f"rewrite loop: pass {n_pass} rewrote instructions but rebuilt the "
                    f"same program (rules {', '.join(cycle)})", cycle)
            break
        current = Program(outputs, program.inputs, name=program.name)
        if outputs in seen_states:
            cycle = [k for d in fired_per_pass[seen_states[outputs]:] for k in d]
            raise RewriteLoopError(
                f"rewrite loop: pass {n_pass} rebuilt the program of pass "
                f"{seen_states[outputs]} (rules {', '.join(dict.fromkeys(cycle))})", cycle)
        seen_states[outputs] = n_pass
    else:
        tail = [k for d in fired_per_pass[-2:] for k in d]
        raise RewriteLoopError(
            f"rewrite loop: no fixed point after {max_passes} passes "
            f"(rules still firing: {', '.join(dict.fromkeys(tail))})", tail)

    if stats is not None:
        for k, n in counts.items():
            stats[k] = stats.get(k, 0) + n
        live = set(current.instructions)
        dead = sum(1 for img in image.values() if img is None or img not in live)
        if dead:
            stats["dead_code"] = stats.get("dead_code", 0) + dead
    if current is not program:
        current.verify()
    return current


__all__ = [
    "Bindings", "Pat", "RewriteLoopError", "Rule", "const_equals", "const_scalar",
    "ORDER_PARTS", "near_form_key", "order_key", "rewrite", "structural_key",
]
