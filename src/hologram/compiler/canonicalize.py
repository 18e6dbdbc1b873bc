"""Canonical compilation: run the rule sets to a fixed point and report the reduction.

Programs that compute the same thing by these rules reduce to the same program,
so the canonical program's ``.hash`` is the key later stages (kernel cache,
scheduler) use. Results are cached by the input program's hash, so
canonicalizing the same program twice is free.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from ..isa.opcodes import Op
from ..isa.program import Program
from .rewrite import Rule, rewrite
from .rules import CANONICAL_RULES


def compute_count(program: Program) -> int:
    """Compute instructions: everything but the loads and stores."""
    return sum(1 for v in program.instructions if v.op not in (Op.LDG, Op.STG))


@dataclass
class ReductionStats:
    """What canonicalization did to one program."""

    instructions_before: int
    instructions_after: int
    rules: dict[str, int] = field(default_factory=dict)  # fire counts; "dead_code" included
    cached: bool = False

    @property
    def removed(self) -> int:
        return self.instructions_before - self.instructions_after

    @property
    def dead_code(self) -> int:
        return self.rules.get("dead_code", 0)

    @property
    def fired(self) -> int:
        """Rule applications (dead-code removal not counted)."""
        return sum(n for k, n in self.rules.items() if k != "dead_code")

    def __str__(self) -> str:
        s = (f"canonicalize: {self.instructions_before} -> {self.instructions_after} "
             f"instructions")
        if self.rules:
            s += "; " + ", ".join(f"{k} x{n}" for k, n in sorted(self.rules.items()))
        else:
            s += "; no rule fired"
        return s + (" (cached)" if self.cached else "")


_CACHE_SIZE = 4096
_cache: OrderedDict[str, tuple[Program, ReductionStats]] = OrderedDict()
_lock = threading.Lock()


def clear_cache() -> None:
    with _lock:
        _cache.clear()


def _remember(key: str, entry: tuple[Program, ReductionStats]) -> None:
    with _lock:
        _cache[key] = entry
        _cache.move_to_end(key)
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)


def canonicalize(
    program: Program, rules: Sequence[Rule] | None = None
) -> tuple[Program, ReductionStats]:
    """The canonical form of ``program`` and what it took to get there.

    ``rules`` defaults to :data:`~.rules.CANONICAL_RULES`; only the default set is
    cached (keyed by ``program.hash``).
    """
    if rules is not None:
        counts: dict[str, int] = {}
        out = rewrite(program, rules, stats=counts)
        return out, ReductionStats(compute_count(program), compute_count(out), counts)
    key = program.hash
    with _lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
    if hit is not None:
        canon, st = hit
        if canon.name != program.name:
            canon = Program(canon.outputs, canon.inputs, name=program.name)
        return canon, replace(st, rules=dict(st.rules), cached=True)
    counts = {}
    canon = rewrite(program, CANONICAL_RULES, stats=counts)
    st = ReductionStats(compute_count(program), compute_count(canon), counts)
    _remember(key, (canon, st))
    if canon.hash != key:  # the canonical form is its own canonical form
        n = st.instructions_after
        _remember(canon.hash, (canon, ReductionStats(n, n, {})))
    return canon, replace(st, rules=dict(st.rules))


__all__ = ["ReductionStats", "canonicalize", "clear_cache", "compute_count"]
