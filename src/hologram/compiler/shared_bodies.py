"""Launch steps whose C differs only in slot numbers and local names share one body.

A transformer's layers compile to the same kernels over different buffers: BERT-base's
125 launch steps are 22 distinct functions once the slot table indices and the
renderer's numbered locals are set aside. Compiling each copy cost most of a cold
first call's compiler time (~1.2 s of gcc for BERT), and the copies fill the
instruction cache. So each step's C (one *unit*: its function and the helpers only it
calls) is put in a canonical form: the slots it reads, in order of first use, become
0, 1, 2, ... of a local table, and its numbered locals and its own function names are
renamed in order of appearance. Steps with the same canonical text share that text,
compiled once; each keeps its exported name as a wrapper that gathers its slots into
the local table and calls the shared body (a few pointer copies per launch).

Renaming is alpha-renaming on text the renderer wrote: the local prefixes below are
the renderer's ``fresh()`` names and its pointer locals (``p<slot>_<dtype>``), all local
to the unit, and the new names use prefixes nothing else emits. A unit that indexes
the slot table other than by a literal (none today) keeps its own text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

#: The renderer's numbered locals (``CRenderer.fresh`` prefixes) and pointer locals.
_LOCAL = re.compile(r"\b(?:t|acc|ix|nan|r|rank|row)\d+\b")
_POINTER = re.compile(r"\bp(\d+)_")
_SLOT = re.compile(r"\bB\[(\d+)\]")
_OTHER_SLOT_USE = re.compile(r"\bB\[(?!\d+\])")


@dataclass(frozen=True)
class Unit:
    """One launch step's C: ``entry`` is the exported ``void entry(void **B)``, ``bases``
    every function name the unit defines is derived from (``k3`` for ``k3_chunk``)."""

    entry: str
    bases: tuple[str, ...]
    text: str


def _renumber(pattern: re.Pattern[str], text: str, new: str, group: int = 0,
              mapping: dict[str, int] | None = None) -> str:
    """``text`` with each distinct match of ``pattern`` (its ``group``) replaced by
    ``new.format(i)``, i numbering first appearances (or taken from ``mapping``)."""
    seen = {} if mapping is None else mapping

    def sub(m: re.Match[str]) -> str:
        key = m.group(group)
        if key not in seen:
            seen[key] = len(seen)
        return new.format(seen[key])

    return pattern.sub(sub, text)


def canonical(unit: Unit) -> tuple[str, list[int]] | None:
    """(the unit's canonical text, its slots in local-table order), or None when it
    cannot share (a slot index that is not a literal)."""
    if _OTHER_SLOT_USE.search(unit.text):
        return None
    slots: dict[str, int] = {}
    text = _renumber(_SLOT, unit.text, "B[{}]", 1, slots)
    # A pointer local is named after its slot: number it as its slot was.
    text = _POINTER.sub(lambda m: f"hgp{slots[m.group(1)]}_" if m.group(1) in slots
                        else m.group(0), text)
    text = _renumber(_LOCAL, text, "hgv{}")
    names = re.compile(r"\b(" + "|".join(map(re.escape, unit.bases)) + r")(?![0-9A-Za-z])")
    order = {b: i for i, b in enumerate(unit.bases)}
    text = names.sub(lambda m: f"HG_SHARED_{order[m.group(1)]}", text)
    return text, [int(s) for s in slots]


def share(units: Sequence[Unit]) -> list[str]:
    """The C of ``units`` with every group of identical canonical texts compiled once:
    the shared body (``hg_s<g>_<i>`` names), then one wrapper per step. A unit with no
    twin keeps its own text unchanged."""
    forms = [canonical(u) for u in units]
    groups: dict[str, list[int]] = {}
    for i, f in enumerate(forms):
        if f is not None:
            groups.setdefault(f[0], []).append(i)
    out: list[str] = []
    emitted: dict[str, str] = {}  # canonical text -> its shared entry's name
    for u, f in zip(units, forms, strict=True):
        if f is None or len(groups[f[0]]) < 2:
            out.append(u.text)
            continue
        text, slots = f
        entry = emitted.get(text)
        pieces = []
        if entry is None:
            g = len(emitted)
            entry = f"hg_s{g}_{u.bases.index(u.entry)}"
            emitted[text] = entry
            pieces.append(re.sub(r"\bHG_SHARED_(\d+)", lambda m, g=g: f"hg_s{g}_{m.group(1)}",
                                 text))
        else:  # its body may sit in another part of a split build (cc.py)
            pieces.append(f"void {entry}(void **B);")
        table = ", ".join(f"B[{s}]" for s in slots) or "0"
        pieces.append(f"void {u.entry}(void **B) {{\n  void *L[] = {{{table}}};\n"
                      f"  {entry}(L);\n}}")
        out.append("\n".join(pieces))
    return out
