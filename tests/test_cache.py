"""The kernel cache loads only what it built: corrupt, truncated, tampered or foreign
entries are rebuilt, failed builds leave nothing, other users' directories are refused,
and concurrent builders of one key end with a single valid entry."""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import stat
import threading
import time
from pathlib import Path

import pytest

from hologram.cache import (
    CacheError,
    CacheSecurityError,
    KernelCache,
    cache_dir,
    cache_key,
    clear_cache,
)
from hologram.errors import HologramError

PARTS = {"program": "p0", "compiler": "test-cc 1.0", "cpu": "avx2", "hologram": "0.0"}
SOURCE = "int answer(void) { return 42; }\n"


class Builder:
    """A fake compiler: the artifact is a header plus the source; counts its calls."""

    def __init__(self, payload: bytes = b"ARTIFACT:") -> None:
        self.payload = payload
        self.calls = 0

    def __call__(self, src: Path, out: Path) -> None:
        self.calls += 1
        out.write_bytes(self.payload + src.read_bytes())

    def expected(self, source: str = SOURCE) -> bytes:
        return self.payload + source.encode()


@pytest.fixture
def cache(tmp_path: Path) -> KernelCache:
    return KernelCache(tmp_path / "kc")


def entries(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name != "locks")


def test_build_then_hit(cache: KernelCache) -> None:
    b = Builder()
    p1 = cache.get_or_build(PARTS, SOURCE, b)
    p2 = cache.get_or_build(PARTS, SOURCE, b)
    assert p1 == p2 and p1.read_bytes() == b.expected() and b.calls == 1
    assert cache.stats.as_dict() == {"hits": 1, "misses": 1, "builds": 1, "rebuilt_corrupt": 0}
    key = cache_key(PARTS, SOURCE)
    assert entries(cache.directory) == [f"{key}.json", f"{key}.so"]
    meta = json.loads((cache.directory / f"{key}.json").read_text())
    assert meta["sha256"] == hashlib.sha256(b.expected()).hexdigest()
    assert meta["size"] == len(b.expected()) and meta["parts"] == PARTS


def test_directory_is_created_private(tmp_path: Path) -> None:
    c = KernelCache(tmp_path / "a" / "b")
    c.get_or_build(PARTS, SOURCE, Builder())
    assert stat.S_IMODE(os.stat(c.directory).st_mode) & 0o077 == 0


def test_key_covers_source_parts_and_suffix() -> None:
    k = cache_key(PARTS, SOURCE)
    assert len(k) == 64 and k == cache_key(dict(reversed(PARTS.items())), SOURCE)
    assert k != cache_key(PARTS, SOURCE + " ")
    assert k != cache_key({**PARTS, "cpu": "avx512f"}, SOURCE)
    assert k != cache_key(PARTS, SOURCE, ".cubin")
    # no separator trick can make two different part sets collide
    assert cache_key({"a": "b,c"}, "") != cache_key({"a": "b", "c": ""}, "")
    with pytest.raises(TypeError):
        cache_key({"program": 3}, SOURCE)  # type: ignore[dict-item]


def test_corrupt_file_is_rebuilt_not_loaded(cache: KernelCache) -> None:
    b = Builder()
    path = cache.get_or_build(PARTS, SOURCE, b)
    data = bytearray(path.read_bytes())
    data[3] ^= 0xFF  # same size, one flipped byte
    path.write_bytes(bytes(data))
    again = cache.get_or_build(PARTS, SOURCE, b)
    assert again.read_bytes() == b.expected() and b.calls == 2
    assert cache.stats.rebuilt_corrupt == 1 and cache.stats.hits == 0


def test_truncated_file_is_rebuilt(cache: KernelCache) -> None:
    b = Builder()
    path = cache.get_or_build(PARTS, SOURCE, b)
    path.write_bytes(path.read_bytes()[:5])
    assert cache.lookup(PARTS, SOURCE) is None
    assert cache.get_or_build(PARTS, SOURCE, b).read_bytes() == b.expected()
    assert b.calls == 2 and cache.stats.rebuilt_corrupt == 1


@pytest.mark.parametrize("tamper", ["sha", "parts", "key", "garbage", "missing", "empty"])
def test_tampered_or_missing_sidecar_is_rebuilt(cache: KernelCache, tamper: str) -> None:
    b = Builder()
    path = cache.get_or_build(PARTS, SOURCE, b)
    meta = path.with_suffix(".json")
    info = json.loads(meta.read_text())
    if tamper == "sha":
        info["sha256"] = hashlib.sha256(b"something else").hexdigest()
    elif tamper == "parts":
        info["parts"] = {**PARTS, "compiler": "other-cc"}
    elif tamper == "key":
        info["key"] = "0" * 64
    if tamper == "garbage":
        meta.write_text("{not json")
    elif tamper == "missing":
        meta.unlink()
    elif tamper == "empty":
        meta.write_text("")
    else:
        meta.write_text(json.dumps(info))
    assert cache.get_or_build(PARTS, SOURCE, b).read_bytes() == b.expected()
    assert b.calls == 2 and cache.stats.rebuilt_corrupt == 1
    assert cache.get_or_build(PARTS, SOURCE, b) == path and b.calls == 2  # healthy again


def test_foreign_file_swapped_in_is_rebuilt(cache: KernelCache, tmp_path: Path) -> None:
    """Another entry's (valid) files copied under this key must not be accepted."""
    b = Builder()
    mine = cache.get_or_build(PARTS, SOURCE, b)
    other = cache.get_or_build({**PARTS, "program": "p1"}, SOURCE + "//x", b)
    mine.write_bytes(other.read_bytes())
    mine.with_suffix(".json").write_bytes(other.with_suffix(".json").read_bytes())
    assert cache.get_or_build(PARTS, SOURCE, b).read_bytes() == b.expected()
    assert cache.stats.rebuilt_corrupt == 1


def test_symlinked_artifact_is_rebuilt(cache: KernelCache, tmp_path: Path) -> None:
    b = Builder()
    path = cache.get_or_build(PARTS, SOURCE, b)
    elsewhere = tmp_path / "evil.so"
    elsewhere.write_bytes(path.read_bytes())  # even with the right bytes
    path.unlink()
    path.symlink_to(elsewhere)
    got = cache.get_or_build(PARTS, SOURCE, b)
    assert not got.is_symlink() and got.read_bytes() == b.expected() and b.calls == 2


def test_failed_build_is_not_cached(cache: KernelCache) -> None:
    calls = []

    def broken(src: Path, out: Path) -> None:
        calls.append(1)
        out.write_bytes(b"half a file")  # wrote something, then failed
        raise RuntimeError("compiler exploded")

    for _ in range(2):  # the next call builds again: no negative caching
        with pytest.raises(RuntimeError, match="exploded"):
            cache.get_or_build(PARTS, SOURCE, broken)
    assert len(calls) == 2 and entries(cache.directory) == []
    assert cache.stats.builds == 0 and cache.stats.misses == 2
    b = Builder()
    assert cache.get_or_build(PARTS, SOURCE, b).read_bytes() == b.expected()


def test_build_that_writes_nothing_is_an_error(cache: KernelCache) -> None:
    with pytest.raises(CacheError, match="wrote no"):
        cache.get_or_build(PARTS, SOURCE, lambda src, out: None)
    with pytest.raises(CacheError, match="empty"):
        cache.get_or_build(PARTS, SOURCE, lambda src, out: out.write_bytes(b""))
    assert entries(cache.directory) == []


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o720, 0o702])
def test_writable_by_others_is_refused(tmp_path: Path, mode: int) -> None:
    d = tmp_path / "shared"
    d.mkdir()
    d.chmod(mode)
    b = Builder()
    with pytest.raises(CacheSecurityError) as info:
        KernelCache(d).get_or_build(PARTS, SOURCE, b)
    msg = str(info.value)
    assert str(d) in msg and "writable" in msg and "chmod 700" in msg
    assert "HOLOGRAM_CACHE_DIR" in msg
    assert isinstance(info.value, HologramError) and isinstance(info.value, PermissionError)
    assert b.calls == 0 and list(d.iterdir()) == []
    d.chmod(0o700)  # the fix the message suggests works
    assert KernelCache(d).get_or_build(PARTS, SOURCE, b).read_bytes() == b.expected()


def test_owned_by_someone_else_is_refused(tmp_path: Path) -> None:
    if os.getuid() == 0:
        d = tmp_path / "theirs"
        d.mkdir(mode=0o700)
        os.chown(d, 65534, 65534)
    else:
        d = Path("/")  # owned by root and not writable by others: the owner check fires
    with pytest.raises(CacheSecurityError, match="owned by uid"):
        KernelCache(d).get_or_build(PARTS, SOURCE, Builder())


def test_a_file_where_the_directory_should_be(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(CacheError, match="not a directory"):
        KernelCache(f).get_or_build(PARTS, SOURCE, Builder())


def test_env_var_and_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOLOGRAM_CACHE_DIR", str(tmp_path / "env"))
    assert cache_dir() == tmp_path / "env"
    c = KernelCache()  # no directory: follows the environment at each call
    path = c.get_or_build(PARTS, SOURCE, Builder())
    assert path.parent == tmp_path / "env"
    monkeypatch.setenv("HOLOGRAM_CACHE_DIR", str(tmp_path / "env2"))
    assert c.get_or_build(PARTS, SOURCE, Builder()).parent == tmp_path / "env2"
    monkeypatch.delenv("HOLOGRAM_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    if os.name == "posix" and os.uname().sysname == "Linux":
        assert cache_dir() == tmp_path / "xdg" / "hologram"
        monkeypatch.delenv("XDG_CACHE_HOME")
        assert cache_dir() == Path.home() / ".cache" / "hologram"


def test_clear_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    d = tmp_path / "kc"
    monkeypatch.setenv("HOLOGRAM_CACHE_DIR", str(d))
    c = KernelCache()
    b = Builder()
    for i in range(3):
        c.get_or_build({**PARTS, "program": f"p{i}"}, SOURCE, b)
    (d / ".build-leftover").mkdir()  # a crashed build's temp dir
    (d / "notes.txt").write_text("not ours")
    assert clear_cache() == 7
    assert sorted(p.name for p in d.iterdir()) == ["notes.txt"]  # only our names go
    assert clear_cache() == 0 and clear_cache(tmp_path / "missing") == 0
    c.get_or_build(PARTS, SOURCE, b)
    assert b.calls == 4


def test_threads_share_one_build(cache: KernelCache) -> None:
    b = Builder()

    def slow(src: Path, out: Path) -> None:
        time.sleep(0.2)
        b(src, out)

    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(
        cache.get_or_build(PARTS, SOURCE, slow))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert b.calls == 1 and len(set(results)) == 1
    assert cache.stats.hits == 3 and cache.stats.builds == 1


# --- two processes, one key --------------------------------------------------------------
PAD = 200_000


def _payload(tag: str) -> bytes:
    head = f"payload-{tag}-".encode()
    return head + b"x" * (PAD - len(head))


def _worker(directory: str, barrier, queue) -> None:
    """Runs in a spawned process (start-up costs ~1 s, so one pair runs both modes)."""
    import contextlib

    import hologram.cache as hc

    locked = hc._file_lock
    for mode in ("flock", "unlocked"):
        unlocked = mode == "unlocked"
        # unlocked: what atomic replacement alone guarantees (no flock)
        hc._file_lock = (lambda d, k: contextlib.nullcontext()) if unlocked else locked
        built = []

        def build(src: Path, out: Path, built=built, unlocked=unlocked) -> None:
            built.append(1)
            # Unlocked, both processes build: like a real compiler given the same input
            # they write the same bytes. Locked, the second must not build at all.
            data = _payload("same" if unlocked else str(os.getpid()))
            with open(out, "wb") as f:  # written slowly, in pieces
                for i in range(0, len(data), PAD // 4):
                    f.write(data[i:i + PAD // 4])
                    f.flush()
                    time.sleep(0.05)

        barrier.wait()
        path = hc.KernelCache(Path(directory) / mode).get_or_build(PARTS, SOURCE, build)
        data = path.read_bytes()
        queue.put((mode, len(built), len(data), data[:40].decode(errors="replace")))


def test_two_processes_build_one_key(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(str(tmp_path), barrier, queue))
             for _ in range(2)]
    for p in procs:
        p.start()
    got = [queue.get(timeout=120) for _ in range(4)]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for _, _, size, head in got:  # every caller got a whole, working artifact
        assert size == PAD and head.startswith("payload-")
    locked = [g for g in got if g[0] == "flock"]
    unlocked = [g for g in got if g[0] == "unlocked"]
    # with flock the second process waited for the first and found its entry
    assert sum(g[1] for g in locked) == 1 and locked[0][3] == locked[1][3]
    assert sum(g[1] for g in unlocked) in (1, 2)  # without it both may build
    key = cache_key(PARTS, SOURCE)
    for mode in ("flock", "unlocked"):
        d = tmp_path / mode
        assert entries(d) == [f"{key}.json", f"{key}.so"]  # one entry, no temp leftovers
        path = KernelCache(d).lookup(PARTS, SOURCE)  # and it verifies
        assert path is not None and path.read_bytes().startswith(b"payload-")
