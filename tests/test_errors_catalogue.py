"""docs/errors.md is a catalogue of bad inputs and the errors users get for them; this
test runs every row's call and checks the exception class and the message.

Each row is ``| id | `call` | Exception | message fragment |``. The call is evaluated in
the namespace ``setup()`` builds (documented at the top of docs/errors.md); a fragment
may contain ``...`` where the message varies (handle numbers, paths), and its parts
must appear in order. A row whose call does not raise, raises another class, or
gives another message fails; so does a catalogue with fewer than 40 rows.
"""

from __future__ import annotations

import re
import stat
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hologram as hg
from hologram import errors as E
from hologram import ffi, ops
from hologram.cache import CacheError, CacheSecurityError, KernelCache

DOC = Path(__file__).resolve().parents[1] / "docs" / "errors.md"
ROW = re.compile(r"^\|\s*([A-Z]\d\d)\s*\|\s*`(.+?)`\s*\|\s*(\w+)\s*\|\s*(.*?)\s*\|\s*$")

ADD_TEXT = """.in 0 f32[4]
.in 1 f32[4]
%0 = ldg.f32[4] in=0
%1 = ldg.f32[4] in=1
%2 = add.f32[4] %0, %1
stg.f32[4] %2 out=0"""


def misaligned(n: int) -> np.ndarray:
    """A float32 array starting one byte into a uint8 buffer."""
    return np.zeros(4 * n + 1, np.uint8)[1:].view(np.float32)


def setup() -> dict[str, Any]:
    """The names the catalogue's calls use (fresh for every row)."""
    ex, other = hg.Executor("cpu"), hg.Executor("cpu")
    closed = hg.Executor("reference")
    closed.close()
    freed = ex.allocate(4)
    freed.free()
    ro_array = np.ones(4, np.float32)
    ro_array.flags.writeable = False
    h = ffi.new_executor_with_backend("cpu")
    released = ffi.executor_allocate_buffer(h, 4)
    ffi.buffer_cleanup(released)
    tmp = Path(tempfile.mkdtemp())

    def open_cache(mode: int, as_file: bool = False) -> KernelCache:
        d = tmp / f"cache-{mode:o}{'-file' if as_file else ''}"
        if as_file:
            d.write_text("not a directory")
        else:
            d.mkdir()
            d.chmod(mode)
        return KernelCache(d)

    return {
        "hg": hg, "np": np, "ops": ops, "ffi": ffi, "misaligned": misaligned,
        "ex": ex, "other": other, "closed": closed, "freed": freed,
        "a": ex.allocate(4).fill(1.0), "c": ex.allocate(4), "big": ex.allocate(8),
        "a64": ex.allocate(4, np.float64), "out": ex.allocate(1), "empty": ex.allocate(0),
        "foreign": other.allocate(4), "ro": hg.from_dlpack(ro_array, ex),
        "ADD": hg.Program.parse(ADD_TEXT), "h": h, "released": released,
        "hb": ffi.executor_allocate_buffer(h, 4), "hb2": ffi.executor_allocate_buffer(h, 8),
        "open_cache": open_cache, "_cleanup": (ex, other, h, tmp),
    }


def teardown(ns: dict[str, Any]) -> None:
    import shutil

    ex, other, h, tmp = ns["_cleanup"]
    ex.close()
    other.close()
    ffi.executor_cleanup(h)
    for p in tmp.iterdir():
        if p.is_dir():
            p.chmod(stat.S_IRWXU)
    shutil.rmtree(tmp, ignore_errors=True)


EXCEPTIONS = {name: getattr(E, name) for name in E.__all__}
EXCEPTIONS.update({"CacheError": CacheError, "CacheSecurityError": CacheSecurityError})


def rows() -> list[tuple[str, str, str, str]]:
    out = []
    for line in DOC.read_text(encoding="utf-8").splitlines():
        m = ROW.match(line)
        if m:
            ident, call, exc, frag = m.groups()
            out.append((ident, call.replace("\\|", "|"), exc, frag.replace("\\|", "|")))
    return out


def run_row(call: str) -> BaseException | None:
    ns = setup()
    try:
        eval(call, ns)  # noqa: S307 - the catalogue's own calls
    except Exception as e:
        return e
    finally:
        teardown(ns)
    return None


def matches(message: str, fragment: str) -> bool:
    pos = 0
    for part in (p for p in fragment.split("...") if p):
        i = message.find(part, pos)
        if i < 0:
            return False
        pos = i + len(part)
    return True


def test_catalogue_is_complete() -> None:
    rs = rows()
    ids = [r[0] for r in rs]
    assert len(rs) >= 40, f"docs/errors.md lists {len(rs)} rows, want at least 40"
    assert len(set(ids)) == len(ids), "duplicate ids in docs/errors.md"
    table_lines = [ln for ln in DOC.read_text().splitlines()
                   if re.match(r"^\|\s*[A-Z]\d\d\s*\|", ln)]
    assert len(table_lines) == len(rs), "a catalogue row does not parse (no check for it)"
    for _, _, exc, _ in rs:
        assert exc in EXCEPTIONS, f"{exc} is not one of hologram's exceptions"
        assert issubclass(EXCEPTIONS[exc], E.HologramError)


@pytest.mark.parametrize("ident,call,exc,fragment", rows(), ids=[r[0] for r in rows()])
def test_catalogue_row(ident: str, call: str, exc: str, fragment: str) -> None:
    got = run_row(call)
    assert got is not None, f"{ident}: `{call}` raised nothing"
    assert type(got) is EXCEPTIONS[exc], f"{ident}: got {type(got).__name__}: {got}"
    assert matches(str(got), fragment), f"{ident}: message {str(got)!r} lacks {fragment!r}"
