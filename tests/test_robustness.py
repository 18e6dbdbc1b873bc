"""No crash from Python: every public entry point checks sizes, dtypes, layout,
ownership and lifetime before native code runs, and says what was wrong with one of
hologram's own exceptions (subclasses of HologramError).

The nastiest calls (launches on arrays too small for the program, misaligned and
read-only memory, freed and foreign buffers) also run in a subprocess, so a segfault
shows up as a failed test rather than a dead test run.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import hologram as hg
from hologram import errors as E
from hologram.errors import HologramError

OPS = [getattr(hg.ops, n) for n in hg.ops.__all__ if n != "composites"]

ADD = """.in 0 f32[4]
.in 1 f32[4]
%0 = ldg.f32[4] in=0
%1 = ldg.f32[4] in=1
%2 = add.f32[4] %0, %1
stg.f32[4] %2 out=0"""

BIG = """.in 0 f32[1000000]
%0 = ldg.f32[1000000] in=0
%1 = exp.f32[1000000] %0
stg.f32[1000000] %1 out=0"""


def misaligned(n: int, dtype=np.float32) -> np.ndarray:
    """A C-contiguous array whose data starts one byte past an element boundary."""
    itemsize = np.dtype(dtype).itemsize
    raw = np.zeros(n * itemsize + 1, np.uint8)
    a = raw[1:].view(dtype)
    assert not a.flags.aligned
    return a


def read_only(n: int) -> np.ndarray:
    a = np.arange(n, dtype=np.float32)
    a.flags.writeable = False
    return a


@pytest.fixture(scope="module")
def ex():
    with hg.Executor("cpu") as e:
        yield e


@pytest.fixture(scope="module")
def other():
    with hg.Executor("cpu") as e:
        yield e


class Pool:
    """Good and bad buffers for one example, all freed afterwards."""

    def __init__(self, ex: hg.Executor, other: hg.Executor) -> None:
        freed = ex.allocate(4)
        freed.free()
        a2 = ex.allocate((4, 4)).fill(0.5)
        self.buffers = [
            ex.allocate(0), ex.allocate(1).fill(1.0), ex.allocate(4).fill(2.0),
            ex.allocate(16).fill(0.25), a2, a2.reshape(16), ex.allocate(4, np.float64).fill(1),
            freed, other.allocate(4).fill(1.0), hg.from_dlpack(read_only(4), ex),
            ex.allocate((2, 3)).fill(1.0), ex.allocate((3, 2)).fill(1.0),
            hg.from_dlpack(misaligned(16), ex), ex.allocate(70_000).fill(0.0),
        ]

    def free(self) -> None:
        for b in self.buffers:
            b.free()


SCALARS = [None, [1.0, 2.0], np.ones(4, np.float32), -1, 0, 1, 2, 3, 4, 16, 10**20, True,
           2.5, "3", np.int64(4), float("nan"), float("inf"), "tanh", "none", "mean", "sum",
           (2, 2), -2, 1j, object()]


@given(st.sampled_from(OPS), st.data())
def test_ops_with_random_arguments(ex, other, op, data) -> None:
    closed = hg.Executor("reference")
    closed.close()
    pool = Pool(ex, other)
    try:
        args = []
        for p in inspect.signature(op).parameters.values():
            if p.name == "exec":
                args.append(data.draw(st.sampled_from([ex] * 6 + [other, closed, None, "cpu"])))
            elif p.default is not inspect.Parameter.empty and data.draw(st.booleans()):
                break
            else:
                args.append(data.draw(st.sampled_from(pool.buffers) | st.sampled_from(SCALARS)))
        try:
            op(*args)
        except HologramError:
            pass
    finally:
        pool.free()


BUFFER_ARGS = [None, [1.0, 2.0], [[1], [1, 2]], np.ones(4, np.float32), np.ones(4, "U3"),
               np.ones(4, object), np.ones(4, complex), -1, 0, 4, 10**20, True, 2.5, "abc",
               b"abcd", b"\x00" * 16, bytearray(16), np.int64(4), float("nan"), (2, 2),
               (-1, 4), (2**40, 2**40), object(), np.ones(8, np.float32)[::2],
               np.ones(4, ">f4"), 1e300]
METHODS = ["from_numpy", "from_bytes", "fill", "copy_from", "reshape", "to_numpy", "to_bytes",
           "free", "view"]


@given(st.sampled_from(METHODS), st.integers(0, 6),
       st.lists(st.sampled_from(BUFFER_ARGS) | st.integers(0, 13).map(lambda i: ("buf", i)),
                max_size=2))
def test_buffer_methods_with_random_arguments(ex, other, method, which, raw_args) -> None:
    pool = Pool(ex, other)
    try:
        args = [pool.buffers[a[1]] if type(a) is tuple and a[:1] == ("buf",) else a
                for a in raw_args]
        try:
            getattr(pool.buffers[which], method)(*args)
        except HologramError:
            pass
        except TypeError as e:  # Python's own arity check only
            assert "positional argument" in str(e), e
    finally:
        pool.free()


@pytest.mark.parametrize("stream,kwargs", [
    (0, {}), ("x", {}), (None, {"dl_device": (2**40, 2**40)}),
    (None, {"dl_device": (2, 0)}), (None, {"copy": "yes"}),
])
def test_dlpack_export_refusals_are_dlpack_errors(ex, stream, kwargs) -> None:
    b = ex.allocate(4)
    with pytest.raises(E.DLPackError) as info:
        b.__dlpack__(stream=stream, **kwargs)
    assert isinstance(info.value, BufferError)  # still the protocol's exception
    b.free()


# --- Executor.run / launch / bind -----------------------------------------------------
def test_launch_checks_arrays_before_native_code(ex) -> None:
    p = hg.Program.parse(BIG)
    with pytest.raises(E.ShapeError, match=r"inputs\[0\]: expected 1000000 elements"):
        ex.launch(p, [np.ones(4, np.float32)], [np.empty(4, np.float32)])
    with pytest.raises(E.ShapeError, match="inputs: program has 1, got 0"):
        ex.launch(p, [], [np.empty(10**6, np.float32)])
    with pytest.raises(E.DTypeError, match=r"inputs\[0\]: expected dtype f32, got float64"):
        ex.launch(p, [np.ones(10**6)], [np.empty(10**6, np.float32)])
    with pytest.raises(E.DTypeError):  # big-endian f32 is not the kernel's f32
        ex.launch(p, [np.ones(10**6, ">f4")], [np.empty(10**6, np.float32)])
    with pytest.raises(E.ShapeError, match="C-contiguous and aligned"):
        ex.launch(p, [misaligned(10**6)], [np.empty(10**6, np.float32)])
    with pytest.raises(E.ShapeError, match="C-contiguous and aligned"):
        ex.launch(p, [np.ones(2 * 10**6, np.float32)[::2]], [np.empty(10**6, np.float32)])
    with pytest.raises(E.BufferStateError, match="read-only"):
        ex.bind(p, [np.ones(10**6, np.float32)], [read_only(10**6)])
    with pytest.raises(E.ArgumentTypeError, match="expected a NumPy array"):
        ex.launch(p, [[1.0] * 10**6], [np.empty(10**6, np.float32)])
    with pytest.raises(E.ArgumentTypeError, match="expected a hologram Program"):
        ex.launch(BIG, [np.ones(10**6, np.float32)], [np.empty(10**6, np.float32)])
    with pytest.raises(E.ArgumentTypeError, match="inputs: expected a list or tuple"):
        ex.run(p, None, [])


RUN_ITEMS = st.sampled_from(["buf4", "buf2x2", "buf3", "f64", "freed", "foreign", "ro", None,
                             1, "x"])


@given(st.sampled_from(["run", "launch", "bind"]), st.sampled_from([ADD, None]),
       st.lists(RUN_ITEMS, max_size=3), st.lists(RUN_ITEMS, max_size=2))
def test_run_launch_bind_with_random_operands(ex, other, method, text, ins, outs) -> None:
    freed = ex.allocate(4)
    freed.free()
    bufs = {"buf4": ex.allocate(4).fill(1), "buf2x2": ex.allocate((2, 2)).fill(1),
            "buf3": ex.allocate(3), "f64": ex.allocate(4, np.float64), "freed": freed,
            "foreign": other.allocate(4), "ro": hg.from_dlpack(read_only(4), ex)}
    arrays = {"buf4": np.ones(4, np.float32), "buf2x2": np.ones((2, 2), np.float32),
              "buf3": np.ones(3, np.float32), "f64": np.ones(4), "freed": misaligned(4),
              "foreign": np.ones(8, np.float32)[::2], "ro": read_only(4)}
    table = bufs if method == "run" else arrays
    pick = [table.get(k, k) if isinstance(k, str) else k for k in ins]
    pick_out = [table.get(k, k) if isinstance(k, str) else k for k in outs]
    program = hg.Program.parse(text) if text else text
    try:
        r = getattr(ex, method)(program, pick, pick_out)
        if method == "bind":
            r()
    except HologramError:
        pass
    finally:
        for b in bufs.values():
            b.free()


def test_run_result_is_right_after_refusals(ex) -> None:
    p = hg.Program.parse(ADD)
    a, b, c = (ex.allocate(4).fill(v) for v in (1.0, 2.0, 0.0))
    with pytest.raises(E.ShapeError):
        ex.run(p, [a], [c])
    ex.run(p, [a, b], [c])
    np.testing.assert_array_equal(c.to_numpy(), 3.0)
    for x in (a, b, c):
        x.free()


# --- lifetime and ownership ---------------------------------------------------------
def test_freed_foreign_readonly_and_closed(ex, other) -> None:
    a, c = ex.allocate(4).fill(1), ex.allocate(4)
    hg.ops.vector_neg(ex, a, c)  # binds the fast path for (a, c)
    a.free()
    with pytest.raises(E.BufferStateError, match="a: the buffer was freed"):
        hg.ops.vector_neg(ex, a, c)
    with pytest.raises(E.BufferStateError, match="freed"):
        a.to_numpy()
    f = other.allocate(4)
    with pytest.raises(E.BufferStateError, match="belongs to another executor"):
        hg.ops.vector_neg(ex, f, c)
    ro = hg.from_dlpack(read_only(4), ex)
    with pytest.raises(E.BufferStateError, match="c: the buffer is read-only"):
        hg.ops.vector_neg(ex, c, ro)
    with pytest.raises(E.BufferStateError, match="read-only"):
        ro.fill(1.0)
    e2 = hg.Executor("cpu")
    x, y = e2.allocate(4).fill(1), e2.allocate(4)
    hg.ops.vector_abs(e2, x, y)
    e2.close()
    with pytest.raises(E.BufferStateError):
        hg.ops.vector_abs(e2, x, y)
    with pytest.raises(E.BufferStateError):
        x.to_numpy()
    for b in (c, f, ro):
        b.free()


def test_huge_sizes_raise_cleanly(ex) -> None:
    with pytest.raises(E.OutOfMemoryError):
        ex.allocate((2**32, 2**32))  # np.prod in int64 would wrap to 0
    with pytest.raises(E.OutOfMemoryError):
        ex.allocate(10**20)
    a, c = ex.allocate(4), ex.allocate(4)
    with pytest.raises(E.ShapeError):
        hg.ops.vector_abs(ex, a, c, n=10**20)
    with pytest.raises(E.ArgumentTypeError):
        hg.ops.scalar_add(ex, a, c, np.ones(4))
    a.free()
    c.free()


# --- misaligned, read-only and odd arrays through from_dlpack / wrap / jit --------------
def test_misaligned_arrays(ex) -> None:
    m = misaligned(1000)
    m[:] = np.arange(1000, dtype=np.float32)
    with pytest.raises(E.ShapeError, match="not aligned"):
        ex.wrap(m)
    with pytest.raises(E.ShapeError, match="contiguous and aligned"):
        hg.from_dlpack(m, ex, copy=False)
    b = hg.from_dlpack(m, ex)  # copy=None: an aligned copy
    assert b.to_numpy().flags.aligned
    c = ex.allocate(1000)
    hg.ops.vector_add(ex, b, b, c)
    np.testing.assert_array_equal(c.to_numpy(), 2 * np.arange(1000, dtype=np.float32))
    f = hg.jit(lambda x: x * 3.0 + 1.0)
    np.testing.assert_allclose(f(m), 3 * np.arange(1000, dtype=np.float32) + 1)
    with pytest.raises(E.ShapeError, match="C-contiguous and aligned"):
        f(m, out=misaligned(1000))
    with pytest.raises(E.ShapeError):
        f(m, out=read_only(1000))
    b.free()
    c.free()


# (bool, every integer dtype and float16 are jit arguments: tests/test_numpy_jit.py)
@pytest.mark.parametrize("arg", [
    "abc", None, [[1], [1, 2]], np.ones(4, object), np.ones(4, "U2"), np.ones(3, complex),
    np.ones(4, np.longdouble), np.ones(4, "m8[s]"), object(), 1, 2.5,
])
def test_jit_and_from_dlpack_refuse_odd_inputs(ex, arg) -> None:
    f = hg.jit(lambda x: x + 1.0)
    with pytest.raises(HologramError):
        f(arg)
    try:
        b = hg.from_dlpack(arg, ex)
    except HologramError:
        return
    b.free()  # some wrap fine; ops then refuse their dtype


# --- the nastiest calls, in a subprocess --------------------------------------------
NASTY = textwrap.dedent(r'''
    import numpy as np, hologram as hg
    ex, other = hg.Executor("cpu"), hg.Executor("cpu")
    BIG = """.in 0 f32[1000000]
    %0 = ldg.f32[1000000] in=0
    %1 = exp.f32[1000000] %0
    stg.f32[1000000] %1 out=0"""
    p = hg.Program.parse("\n".join(l.strip() for l in BIG.splitlines()))
    raw = np.zeros(4 * 10**6 + 1, np.uint8)
    mis = raw[1:].view(np.float32)
    ro = np.ones(10**6, np.float32); ro.flags.writeable = False
    a, c = ex.allocate(4).fill(1), ex.allocate(4)
    hg.ops.vector_neg(ex, a, c)
    a.free()
    fb = other.allocate(4)
    calls = [
        lambda: ex.launch(p, [np.ones(4, np.float32)], [np.empty(4, np.float32)]),
        lambda: ex.launch(p, [], [np.empty(4, np.float32)]),
        lambda: ex.launch(p, [mis], [np.empty(10**6, np.float32)]),
        lambda: ex.launch(p, [np.ones(10**6, np.float32)], [ro]),
        lambda: ex.bind(p, [np.ones(10**6)], [np.empty(10**6, np.float32)])(),
        lambda: hg.ops.vector_neg(ex, a, c),
        lambda: hg.ops.vector_neg(ex, fb, c),
        lambda: hg.ops.vector_exp(ex, c, c) if hasattr(hg.ops, "vector_exp") else
                hg.ops.vector_abs(ex, c, c, n=10**6),
        lambda: hg.ops.gemm(ex, c, c, c, 1000, 1000, 1000),
        lambda: ex.allocate((2**32, 2**32)),
        lambda: ex.wrap(mis),
        lambda: hg.jit(lambda x: x * 2.0)(mis, out=mis),
    ]
    for call in calls:
        try:
            call()
            print("NO-ERROR")
        except hg.HologramError as e:
            print(type(e).__name__)
    print("SURVIVED")
''')


def test_nastiest_calls_do_not_kill_the_process() -> None:
    r = subprocess.run([sys.executable, "-c", NASTY], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode >= 0, f"killed by signal {-r.returncode}\n{r.stderr}"
    assert r.returncode == 0, r.stderr
    names = r.stdout.split()
    assert names == ["ShapeError", "ShapeError", "ShapeError", "BufferStateError",
                     "DTypeError", "BufferStateError", "BufferStateError", "ShapeError",
                     "ShapeError", "OutOfMemoryError", "ShapeError", "ShapeError",
                     "SURVIVED"], r.stdout


# --- the kernel cache, end to end through the CPU backend ---------------------------
COMPILE = textwrap.dedent('''
    import json, sys
    import numpy as np, hologram as hg
    from hologram.compiler.cc import KERNEL_CACHE
    try:
        ex = hg.Executor("cpu")
        f = hg.jit(lambda x: x * 3.0 + 0.25, executor=ex)
        y = f(np.arange(8, dtype=np.float32))
        print(json.dumps({"y": y.tolist(), "stats": KERNEL_CACHE.stats.as_dict()}))
    except hg.HologramError as e:
        print(json.dumps({"error": type(e).__name__, "message": str(e)}))
''')

EVIL = r'''
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void evil(void) {
    FILE *f = fopen(getenv("HOLOGRAM_TEST_MARKER"), "w");
    if (f) { fputs("loaded", f); fclose(f); }
}
void hg_kernel_0(void **t) { (void)t; }
'''


def _compile_in_subprocess(cache: Path, marker: Path | None = None) -> dict:
    import json
    import os

    env = {**os.environ, "HOLOGRAM_CACHE_DIR": str(cache)}
    if marker is not None:
        env["HOLOGRAM_TEST_MARKER"] = str(marker)
    r = subprocess.run([sys.executable, "-c", COMPILE], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def _kernel_entries(cache: Path) -> list[tuple[Path, dict]]:
    import json

    out = []
    for meta in cache.glob("*.json"):
        m = json.loads(meta.read_text())
        # the program's kernel, not the compiler probe or the thread team's runtime
        if m["parts"].get("purpose") != "probe" and "runtime" not in m["parts"]:
            out.append((cache / f"{m['key']}{m['suffix']}", m))
    return out


def test_cache_end_to_end_private_verified_and_tamper_proof(tmp_path: Path) -> None:
    import hashlib
    import os
    import shutil
    import stat

    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    cache = tmp_path / "kc"
    want = (np.arange(8, dtype=np.float32) * 3 + 0.25).tolist()
    first = _compile_in_subprocess(cache)
    assert first["y"] == want
    assert stat.S_IMODE(os.stat(cache).st_mode) == 0o700  # created private
    (so, meta), = _kernel_entries(cache)
    assert hashlib.sha256(so.read_bytes()).hexdigest() == meta["sha256"]

    # Swap in a shared object whose constructor would leave a marker if it were loaded.
    evil_c = tmp_path / "evil.c"
    evil_c.write_text(EVIL)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(so), str(evil_c)], check=True)
    marker = tmp_path / "marker"
    second = _compile_in_subprocess(cache, marker)
    assert second["y"] == want  # rebuilt, correct
    assert second["stats"]["rebuilt_corrupt"] >= 1
    assert not marker.exists(), "a tampered shared object was loaded"
    (so2, meta2), = _kernel_entries(cache)
    assert hashlib.sha256(so2.read_bytes()).hexdigest() == meta2["sha256"]

    # Flipping one byte is caught the same way.
    data = bytearray(so2.read_bytes())
    data[len(data) // 2] ^= 0xFF
    so2.write_bytes(bytes(data))
    third = _compile_in_subprocess(cache)
    assert third["y"] == want and third["stats"]["rebuilt_corrupt"] >= 1


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702])
def test_cache_directory_writable_by_others_is_refused_end_to_end(tmp_path: Path,
                                                                   mode: int) -> None:
    import os

    cache = tmp_path / "shared"
    cache.mkdir()
    os.chmod(cache, mode)
    got = _compile_in_subprocess(cache)
    assert got["error"] == "CacheSecurityError"
    assert "group- or other-writable" in got["message"] and "chmod 700" in got["message"]
    assert not list(cache.glob("*.so"))  # nothing was built there, nothing loaded


def test_cache_directory_owned_by_another_user_is_refused_end_to_end(tmp_path: Path) -> None:
    import os

    if not hasattr(os, "getuid") or os.getuid() != 0:
        pytest.skip("needs root to give a directory to another user")
    cache = tmp_path / "theirs"
    cache.mkdir(mode=0o700)
    os.chown(cache, 12345, 12345)
    got = _compile_in_subprocess(cache)
    assert got["error"] == "CacheSecurityError"
    assert "owned by uid 12345" in got["message"]
