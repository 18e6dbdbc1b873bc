"""The kernel cache: compiled kernels on disk, verified before every use.

Why it is strict: a cached kernel is a shared object that gets loaded into the
process, so loading one *runs its code*. A file that is corrupt, truncated,
left half-written by a crash, or put there by someone else must never be
loaded. Hence:

- Every entry is two files: the artifact ``<key><suffix>`` and a sidecar
  ``<key>.json`` holding the artifact's sha256, its size and the key parts.
  On lookup the artifact is hashed and compared; anything that does not match
  (or has no sidecar) is deleted and rebuilt, never returned.
- Files are written into a private temporary directory inside the cache and
  moved into place with ``os.replace`` (atomic on POSIX and Windows), so a
  reader never sees a partial file, and when two processes build the same key
  at once the last writer wins with a whole, valid entry.
- Builds of one key are serialised across processes with an advisory lock
  (``fcntl.flock`` on one of 256 lock files), so a second process usually
  waits and then finds the first one's entry instead of compiling again; where
  locks do not work (Windows, some network filesystems) atomic replacement
  alone still keeps every entry whole.
- A failed build leaves nothing behind and re-raises.
- The directory is created with mode 0700, and an existing directory that
  others can write to (group/other-writable, or owned by another user) is
  refused with :class:`CacheSecurityError`.

The key is a sha256 over the caller's key parts (canonical program hash,
compiler id and flags, CPU features, hologram version) plus the source text
itself, so a renderer change that alters the source can never hit a stale
kernel.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import sys
import tempfile
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from .errors import HologramError

#: Sidecar format version; bump it when the sidecar's meaning changes.
FORMAT = 1

_ENTRY = re.compile(r"^[0-9a-f]{64}(\.[A-Za-z0-9_]+)+$")  # <key>.json, <key>.so, ...
_BUILD_PREFIX = ".build-"
_LOCK_DIR = "locks"


class CacheError(HologramError, OSError):
    """The kernel cache cannot be used (not a directory, or a build wrote nothing)."""


class CacheSecurityError(CacheError, PermissionError):
    """The cache directory is writable by others, so a cached kernel could be swapped.

    Cached kernels are shared objects loaded into this process; a directory that
    another user can write to would let them run code as you.
    """


def cache_dir() -> Path:
    """Where compiled kernels live: ``$HOLOGRAM_CACHE_DIR``, else the user cache dir.

    On Linux that is ``$XDG_CACHE_HOME/hologram`` or ``~/.cache/hologram`` (the
    same rule ``hologram info`` reports), so the cache survives between runs
    with no configuration and tests can redirect it with one variable.
    """
    env = os.environ.get("HOLOGRAM_CACHE_DIR")
    if env:
        return Path(env).expanduser().absolute()
    home = Path.home()
    if sys.platform == "darwin":
        return home / "Library" / "Caches" / "hologram"
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA")
        return (Path(base) if base else home / "AppData" / "Local") / "hologram" / "Cache"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else home / ".cache") / "hologram"


def check_directory(path: Path) -> None:
    """Refuse a cache directory that someone other than us could write to.

    Raises :class:`CacheSecurityError` when ``path`` is owned by another uid or
    is group/other-writable, and :class:`CacheError` when it is not a directory.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise CacheError(f"hologram kernel cache directory {path} does not exist") from None
    if not stat.S_ISDIR(st.st_mode):
        raise CacheError(
            f"hologram kernel cache path {path} is not a directory; remove it or set "
            "HOLOGRAM_CACHE_DIR to a private directory")
    if not hasattr(os, "getuid"):  # Windows: no POSIX owner/mode bits to check
        return
    why = ("cached kernels are shared objects loaded into this process, so whoever can "
           "write there can run code as you")
    if st.st_uid != os.getuid():
        raise CacheSecurityError(
            f"refusing to use hologram kernel cache directory {path}: it is owned by uid "
            f"{st.st_uid}, not by you (uid {os.getuid()}); {why}. Fix: set "
            "HOLOGRAM_CACHE_DIR to a directory you own (hologram creates it with mode 0700)")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CacheSecurityError(
            f"refusing to use hologram kernel cache directory {path}: it is group- or "
            f"other-writable (mode {stat.S_IMODE(st.st_mode):#o}); {why}. Fix: "
            f"`chmod 700 {path}`, or set HOLOGRAM_CACHE_DIR to a private directory")


def cache_key(key_parts: dict[str, str], source: str, suffix: str = ".so") -> str:
    """The entry name: sha256 over the sorted key parts, the source and the suffix.

    JSON encoding makes the hash unambiguous (no separator a value could forge).
    """
    for k, v in key_parts.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"kernel cache key parts must be str -> str, got {k!r}: {v!r}")
    blob = json.dumps([FORMAT, sorted(key_parts.items()), suffix, source],
                      ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass
class CacheStats:
    """Counters of one :class:`KernelCache` (in this process).

    ``hits``: a valid entry was found; ``misses``: none was (a build followed);
    ``builds``: builds that succeeded; ``rebuilt_corrupt``: entries found invalid
    (corrupt, truncated, tampered, foreign) and deleted before rebuilding.
    """

    hits: int = 0
    misses: int = 0
    builds: int = 0
    rebuilt_corrupt: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def _unlink(path: Path) -> bool:
    try:
        path.unlink()
        return True
    except FileNotFoundError:
        return False


@contextlib.contextmanager
def _file_lock(directory: Path, key: str) -> Iterator[None]:
    """Serialise work on ``key`` across processes (best effort, POSIX only).

    256 lock files (by the key's first byte) bound the clutter; two keys sharing
    one only wait for each other. Without ``fcntl`` or where ``flock`` fails,
    correctness still rests on atomic replacement.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    lock_dir = directory / _LOCK_DIR
    lock_dir.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(lock_dir / f"{key[:2]}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        with contextlib.suppress(OSError):  # e.g. ENOLCK on NFS: go on unlocked
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


class KernelCache:
    """Compiled artifacts on disk, keyed by everything that determines their bytes.

    ``directory=None`` follows :func:`cache_dir` at each call, so a process-wide
    cache honours ``HOLOGRAM_CACHE_DIR`` changes (tests rely on that).
    """

    def __init__(self, directory: Path | None = None) -> None:
        self._directory = Path(directory).absolute() if directory is not None else None
        self.stats = CacheStats()
        self._reset_locks()
        # A fork while another thread builds (a background prewarm) would leave that
        # key's lock held forever in the child, which has only the forking thread.
        if hasattr(os, "register_at_fork"):
            me = weakref.ref(self)
            os.register_at_fork(after_in_child=lambda: (c := me()) and c._reset_locks())

    def _reset_locks(self) -> None:
        self._lock = threading.Lock()  # guards _key_locks and stats
        self._key_locks: dict[str, threading.Lock] = {}

    @property
    def directory(self) -> Path:
        return self._directory if self._directory is not None else cache_dir()

    def ensure_directory(self) -> Path:
        """Create the directory (0700) if needed and check that it is private."""
        d = self.directory
        if not d.exists():
            d.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):  # another process was first
                d.mkdir(mode=0o700)
        check_directory(d)
        return d

    def key(self, key_parts: dict[str, str], source: str, suffix: str = ".so") -> str:
        return cache_key(key_parts, source, suffix)

    def paths(self, key: str, suffix: str = ".so") -> tuple[Path, Path]:
        """(artifact, sidecar) paths of an entry."""
        d = self.directory
        return d / f"{key}{suffix}", d / f"{key}.json"

    def _key_lock(self, key: str) -> threading.Lock:
        with self._lock:
            lock = self._key_locks.get(key)
            if lock is None:
                lock = self._key_locks[key] = threading.Lock()
            return lock

    def _count(self, name: str) -> None:
        with self._lock:
            setattr(self.stats, name, getattr(self.stats, name) + 1)

    def _verify(self, key: str, key_parts: dict[str, str], suffix: str) -> str:
        """'ok', 'missing' (no trace of the entry) or 'bad' (present but not valid)."""
        art, meta = self.paths(key, suffix)
        try:
            st = os.lstat(art)
        except FileNotFoundError:
            return "bad" if meta.exists() else "missing"
        if not stat.S_ISREG(st.st_mode):  # a symlink or device is never ours
            return "bad"
        try:
            info = json.loads(meta.read_text(encoding="utf-8"))
            data = art.read_bytes()
        except (OSError, ValueError):
            return "bad"
        ok = (isinstance(info, dict) and info.get("format") == FORMAT
              and info.get("key") == key and info.get("suffix") == suffix
              and info.get("parts") == key_parts and info.get("size") == len(data)
              and info.get("sha256") == hashlib.sha256(data).hexdigest())
        return "ok" if ok else "bad"

    def lookup(self, key_parts: dict[str, str], source: str, suffix: str = ".so") -> Path | None:
        """The verified artifact for this key, or None (nothing is built or deleted)."""
        key = self.key(key_parts, source, suffix)
        self.ensure_directory()
        return self.paths(key, suffix)[0] if self._verify(key, key_parts, suffix) == "ok" else None

    def get_or_build(self, key_parts: dict[str, str], source: str,
                     build: Callable[[Path, Path], None], suffix: str = ".so", *,
                     source_suffix: str = ".c") -> Path:
        """The path of a verified artifact for (key_parts, source), building it if needed.

        ``build(src_path, out_path)`` must write the artifact to ``out_path``; the
        source is already written to ``src_path``. Both live in a private temporary
        directory that is removed afterwards. An exception from ``build`` leaves
        nothing in the cache and propagates. ``build`` must not use this cache.
        """
        key = self.key(key_parts, source, suffix)
        with self._key_lock(key):
            d = self.ensure_directory()
            with _file_lock(d, key):
                state = self._verify(key, key_parts, suffix)
                art, meta = self.paths(key, suffix)
                if state == "ok":
                    self._count("hits")
                    return art
                if state == "bad":
                    _unlink(art)
                    _unlink(meta)
                    self._count("rebuilt_corrupt")
                self._count("misses")
                self._build(d, key, key_parts, source, build, suffix, source_suffix)
                self._count("builds")
                return art

    def _build(self, d: Path, key: str, key_parts: dict[str, str], source: str,
               build: Callable[[Path, Path], None], suffix: str, source_suffix: str) -> None:
        art, meta = self.paths(key, suffix)
        tmp = Path(tempfile.mkdtemp(prefix=_BUILD_PREFIX, dir=d))
        placed = False
        try:
            src = tmp / f"kernel{source_suffix}"
            out = tmp / f"kernel{suffix}"
            src.write_text(source, encoding="utf-8")
            build(src, out)
            try:
                data = out.read_bytes()
            except FileNotFoundError:
                raise CacheError(f"kernel build for {key} finished but wrote no {out.name}") \
                    from None
            if not data:
                raise CacheError(f"kernel build for {key} wrote an empty {out.name}")
            info = {"format": FORMAT, "key": key, "suffix": suffix, "size": len(data),
                    "sha256": hashlib.sha256(data).hexdigest(), "parts": key_parts,
                    "source_sha256": hashlib.sha256(source.encode("utf-8",
                                                                  "surrogatepass")).hexdigest()}
            side = tmp / "sidecar.json"
            side.write_text(json.dumps(info, indent=1, sort_keys=True), encoding="utf-8")
            # Artifact first, sidecar last: the sidecar is the commit record, and an
            # artifact without a matching sidecar is treated as invalid.
            os.replace(out, art)
            placed = True
            os.replace(side, meta)
        except BaseException:
            if placed:  # never leave an artifact whose sidecar did not land
                _unlink(art)
            raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def clear(self) -> int:
        """Delete every cache entry, lock and leftover build directory; return the count.

        Only names this cache creates are touched, so pointing HOLOGRAM_CACHE_DIR
        at a directory with other files in it never deletes those files.
        """
        d = self.directory
        if not d.is_dir():
            return 0
        removed = 0
        with self._lock:
            for p in d.iterdir():
                if p.name.startswith(_BUILD_PREFIX) and p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p, ignore_errors=True)
                    removed += 1
                elif _ENTRY.match(p.name) and (p.is_file() or p.is_symlink()):
                    removed += _unlink(p)
            locks = d / _LOCK_DIR
            if locks.is_dir() and not locks.is_symlink():
                for p in locks.glob("*.lock"):
                    _unlink(p)
                with contextlib.suppress(OSError):
                    locks.rmdir()
        return removed


def clear_cache(directory: Path | None = None) -> int:
    """Delete cached kernels in ``directory`` (default :func:`cache_dir`); return the count.

    Libraries already loaded into a process stay usable; the next process rebuilds.
    """
    return KernelCache(directory).clear()


__all__ = ["FORMAT", "CacheError", "CacheSecurityError", "CacheStats", "KernelCache",
           "cache_dir", "cache_key", "check_directory", "clear_cache"]
