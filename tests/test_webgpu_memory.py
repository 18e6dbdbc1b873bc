"""WebGPU executors keep their buffers in device memory: pools, launches, Buffer, DLPack.

A webgpu executor's linear pool and boundary arena hand out windows of wgpu buffers
(``DeviceArray``); launches bind them where they are. These tests check that every op
and random programs agree with the reference backend on device buffers (arena windows
and linear-pool buffers), that NumPy and device operands mix, that Φ addressing uses the
device arena, that unaligned windows go through device copies, and the Buffer, stats,
DLPack, interop and handle-API behaviour of device memory. They skip without an adapter
(CI runs them on Mesa's lavapipe); the pools' device logic is also tested without one
in tests/test_memory.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hologram as hg
import hologram_ffi
from hologram import ops
from hologram.backends.reference import evaluate
from hologram.buffer import DeviceBuffer
from hologram.errors import (
    ArgumentTypeError,
    BufferStateError,
    DLPackError,
    OutOfMemoryError,
)
from hologram.isa import Program
from hologram.isa import builder as b
from hologram.memory import CLASS_BYTES, NUM_CLASSES, DeviceArray

from .programs import programs, random_inputs
from .test_webgpu import OP_CASES, REASON, SPECIAL_FREE, _data, _rng, _run_case, assert_close

pytestmark = [pytest.mark.filterwarnings("ignore::RuntimeWarning"),
              pytest.mark.skipif(REASON is not None, reason=f"webgpu unavailable: {REASON}")]


@pytest.fixture(scope="module")
def wg():
    with hg.Executor("webgpu") as e:
        yield e


@pytest.fixture(scope="module")
def wg_linear():
    """A webgpu executor whose arena is full, so every buffer comes from the linear pool
    (one device buffer each) instead of being a window of the arena's one buffer."""
    with hg.Executor("webgpu") as e:
        hold = [e.allocate_boundary(c, 48, 256) for c in range(NUM_CLASSES)]
        assert e.memory_stats()["boundary"]["classes_free"] == 0
        yield e
        del hold


@pytest.fixture(scope="module")
def ref():
    with hg.Executor("reference") as e:
        yield e


def count_staging(monkeypatch, ex: hg.Executor) -> list[int]:
    """Count what launches borrow from the staging cache (uploads, temporaries,
    read-back): a device-resident launch of a one-kernel program borrows nothing."""
    pool = ex.backend.dev.pool
    calls: list[int] = []
    acquire = pool.acquire

    def counting(nbytes: int, usage: int) -> Any:
        calls.append(nbytes)
        return acquire(nbytes, usage)

    monkeypatch.setattr(pool, "acquire", counting)
    return calls


# --- buffers are device memory -------------------------------------------------------------
def test_buffers_are_windows_of_device_buffers(wg):
    a, big = wg.allocate(1000), wg.allocate(200_000)
    assert isinstance(a, DeviceBuffer) and isinstance(a._array, DeviceArray)
    assert a.pool == "boundary" and big.pool == "linear"
    assert a._array.handle is wg.boundary_arena.handle  # the arena is one device buffer
    assert big._array.offset == 0 and big._array.handle is not a._array.handle
    assert a.device == "webgpu" and a.__dlpack_device__() == (15, 0)
    assert isinstance(wg.boundary_arena, DeviceArray)
    assert "webgpu" in repr(a)
    for x in (a, big):
        x.free()


@pytest.mark.parametrize("pool", ["arena", "linear"])
@pytest.mark.parametrize("name", list(OP_CASES))
def test_op_on_device_buffers_matches_reference(wg, wg_linear, ref, pool, name):
    """Every op of the library on device buffers: windows of the one arena buffer (all
    operands bound from one wgpu buffer in one dispatch) or linear-pool buffers."""
    ex = wg if pool == "arena" else wg_linear
    in_shapes, _, _, positive = OP_CASES[name]
    rng = _rng(name + pool)
    specials = name not in SPECIAL_FREE and not positive
    arrays = [_data(rng, s, specials=specials, positive=positive) for s in in_shapes]
    want = _run_case(ref, name, arrays)
    got = _run_case(ex, name, arrays)
    loose = name.startswith(("reduce_sum", "mse", "cross", "binary", "gemm", "matvec",
                             "softmax", "log_softmax"))
    assert_close(got, want, rtol=1e-4 if loose else 2e-5, atol=1e-5 if loose else 1e-6)


def test_device_launches_bind_in_place(wg, monkeypatch):
    """Repeated ops on device buffers borrow no staging (no upload, no read-back), and
    their results stay on the device until asked for."""
    x = np.linspace(-2, 2, 3000).astype(np.float32)
    a, c = wg.allocate(x.shape), wg.allocate(x.shape)
    a.from_numpy(x)
    ops.sigmoid(wg, a, c)  # binds the launch (and compiles) once
    calls = count_staging(monkeypatch, wg)
    for _ in range(3):
        ops.sigmoid(wg, a, c)
        ops.vector_add(wg, c, a, c)  # in place: output buffer == input buffer
    wg.synchronize()
    assert calls == [4]  # only synchronize's 4-byte fence read
    want = 1 / (1 + np.exp(-x.astype(np.float64))) + x
    assert_close(c.to_numpy(), want, rtol=3e-6, atol=1e-6)


# --- random programs on device buffers -----------------------------------------------------
@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
# Without the index ops, whose WGSL tests are in test_index_ops.py (no i64 in WGSL,
# and its scans add f32 in f32 where the reference adds in f64).
@given(programs(dtype="f32", scans=False, index_dtypes=()), st.integers(0, 2**32 - 1))
def test_random_programs_on_device_buffers(wg, case, seed):
    fn, specs = case
    p = b.program(fn, specs)
    ins = random_inputs(specs, seed, special=True)
    want, _ = evaluate(p, ins)
    in_bufs = [wg.allocate(x.shape).from_numpy(x) for x in ins]
    out_bufs = [wg.allocate(s) for _, s in p.output_specs]
    wg.run(p, in_bufs, out_bufs)
    for g, w in zip(out_bufs, want, strict=True):
        assert_close(g.to_numpy().reshape(w.shape), w, rtol=1e-4, atol=1e-5)
    for buf in in_bufs + out_bufs:  # free, so the next example reuses the memory
        buf.free()


def test_host_and_device_operands_mix(wg):
    rng = _rng("mix")
    x, y = (rng.standard_normal((40, 50)).astype(np.float32) for _ in range(2))
    p = b.program(lambda u, v: (u * v).tanh() + u.sum(1, keepdims=True), [("f32", x.shape)] * 2)
    want = evaluate(p, [x, y])[0][0]
    dx = wg.allocate(x.shape).from_numpy(x)
    host_out = np.empty(x.shape, np.float32)
    wg.launch(p, [dx._array, y], [host_out])  # device in, host in, host out
    assert_close(host_out, want, rtol=1e-5, atol=1e-5)
    dev_out = wg.allocate(x.shape)
    wg.launch(p, [x, dx._array], [dev_out._array])  # host in, device in, device out
    assert_close(dev_out.to_numpy(), evaluate(p, [x, x])[0][0], rtol=1e-5, atol=1e-5)


def test_jit_on_webgpu_keeps_the_host_array_path():
    @hg.jit(backend="webgpu")
    def f(u, v):
        return (u - v).exp()

    x = np.linspace(-1, 1, 300).astype(np.float32)
    assert_close(f(x, x[::-1].copy()), np.exp(x.astype(np.float64) - x[::-1]), rtol=3e-6)


# --- the boundary arena on the device ------------------------------------------------------
def test_phi_program_and_boundary_buffers_share_one_dispatch():
    """An input that is a boundary buffer and Φ-addressed loads and stores: two windows of
    the one arena buffer bound in the same dispatch."""
    with hg.Executor("webgpu") as ex:
        src = ex.allocate_boundary(20, width=1, height=64)  # 16 f32 at Φ(20,0,0)
        src.from_numpy(np.arange(16))
        phi = ex.allocate_boundary(7, width=1, height=64)
        phi.from_numpy(np.full(16, 0.5))
        out = ex.allocate_boundary(30, width=1, height=64)
        p = Program.parse(""".in 0 f32[16]
            %0 = ldg.f32[16] in=0
            %1 = ldg.f32[16] phi=(7,0,0)
            %2 = add.f32[16] %0, %1
            stg.f32[16] %2 out=0
            stg.f32[16] %2 phi=(8,0,0)""")
        ex.run(p, [src], [out])
        want = np.arange(16) + 0.5
        np.testing.assert_array_equal(out.to_numpy(), want)
        arena = ex.boundary_arena
        np.testing.assert_array_equal(arena[8 * CLASS_BYTES:8 * CLASS_BYTES + 64]
                                      .view(np.float32).to_host(), want)
        # the boundary buffers themselves, added in one op: three windows, one buffer
        ops.vector_add(ex, src, phi, out)
        np.testing.assert_array_equal(out.to_numpy(), want)


def test_unaligned_windows_go_through_device_copies(monkeypatch):
    """Windows (and a Φ range) at offsets the adapter cannot bind at are copied to a
    temporary on the device, and written ones copied back."""
    with hg.Executor("webgpu") as ex:
        mem = ex.backend.device_memory
        assert mem.offset_alignment > 4
        bb = ex.allocate_boundary(40, width=48, height=256)
        x = np.arange(bb.size, dtype=np.float32)
        bb.from_numpy(x)
        win_in = bb._array[1:101]  # 4 bytes past an aligned offset
        win_out = bb._array[201:301]
        p = b.program(lambda u: u * 2.0 + 1.0, [("f32", (100,))])
        calls = count_staging(monkeypatch, ex)
        ex.launch(p, [win_in], [win_out])
        assert len(calls) == 2  # the two temporaries; nothing went through the host
        ex.launch(p, [win_in], [win_in])  # in place, unaligned
        got = bb.to_numpy()
        np.testing.assert_array_equal(got[201:301], x[1:101] * 2 + 1)
        np.testing.assert_array_equal(got[1:101], x[1:101] * 2 + 1)
        np.testing.assert_array_equal(got[101:201], x[101:201])  # untouched between
        q = Program.parse("""%0 = ldg.f32[8] phi=(41,0,4)
            %1 = neg.f32[8] %0
            stg.f32[8] %1 phi=(41,1,4)""")
        ex.allocate_boundary(41, 2, 256).from_numpy(np.arange(128))
        ex.launch(q, [], [])
        after = ex.boundary_arena[41 * CLASS_BYTES:42 * CLASS_BYTES].view(np.float32).to_host()
        np.testing.assert_array_equal(after[65:73], -np.arange(1, 9))
        np.testing.assert_array_equal(after[:65], np.arange(65))


# --- pools and statistics ------------------------------------------------------------------
def test_device_pools_have_the_host_stats_limit_and_cache():
    with hg.Executor("webgpu", memory_limit=4 << 20) as ex, hg.Executor("cpu") as host:
        assert ex.memory_stats().keys() == host.memory_stats().keys()
        a = ex.allocate(300_000)  # 1.2 MB: the linear pool (bin 1.5 MiB)
        handle = a._array.handle
        s = ex.memory_stats()
        assert s["linear"]["allocated_bytes"] == 3 << 19 and s["allocated_bytes"] >= 3 << 19
        b2 = ex.allocate(300_000)
        with pytest.raises(OutOfMemoryError, match="limit 4194304"):
            ex.allocate(300_000)
        a.free()
        assert ex.memory_stats()["cached_bytes"] == 3 << 19
        again = ex.allocate(290_000)  # the same bin: the freed device buffer comes back
        assert again._array.handle is handle
        assert ex.memory_stats()["linear"]["num_cache_hits"] == 1
        again.free()
        b2.free()
        ex.empty_cache()
        s = ex.memory_stats()
        assert s["cached_bytes"] == 0 and s["allocated_bytes"] == 0
        assert s["peak_bytes"] >= 2 * (3 << 19)


def test_more_than_the_device_holds_is_out_of_memory(wg):
    with pytest.raises(OutOfMemoryError, match="could not provide"):
        wg.allocate(2**40)
    assert wg.allocate(10).size == 10  # the pools still work


# --- Buffer on the device ------------------------------------------------------------------
def test_buffer_data_methods_on_device(wg):
    a = wg.allocate((10, 100))
    x = np.arange(1000, dtype=np.float64).reshape(10, 100)
    a.from_numpy(x)  # f64 -> f32, same_kind
    h = a.to_numpy()
    assert h.dtype == np.float32 and h.shape == (10, 100)
    h[:] = -1  # a copy: the buffer is unchanged
    np.testing.assert_array_equal(a.to_numpy(), x)
    with pytest.raises(ValueError, match="copy"):
        np.asarray(a, copy=False)
    np.testing.assert_array_equal(np.asarray(a), x)
    raw = np.arange(1000, dtype=np.float32)[::-1].copy()
    a.from_bytes(raw.tobytes())
    assert a.to_bytes() == raw.tobytes()
    a.fill(0.0)
    assert not a.to_numpy().any()
    a.fill(2.5)
    np.testing.assert_array_equal(a.to_numpy(), 2.5)
    r = a.reshape(1000)  # a view of the same device memory
    assert isinstance(r, DeviceBuffer) and r._array.handle is a._array.handle
    r.from_numpy(np.arange(1000))
    np.testing.assert_array_equal(a.to_numpy().reshape(-1), np.arange(1000))
    big = wg.allocate((10, 100), np.float32)
    big.copy_from(a)  # device to device
    np.testing.assert_array_equal(big.to_numpy(), a.to_numpy())
    a.free()
    assert r.is_freed
    for fn in (a.to_numpy, r.to_bytes, lambda: a.fill(1.0), lambda: big.copy_from(a)):
        with pytest.raises(BufferStateError, match="freed"):
            fn()
    big.free()


def test_copy_between_windows_of_the_arena():
    """wgpu refuses to copy a buffer onto itself; two boundary buffers are windows of the
    one arena buffer, so their copy goes through a scratch buffer."""
    with hg.Executor("webgpu") as ex:  # its own arena: the shared one fills up
        a = ex.allocate_boundary(60, 1, 256)
        c = ex.allocate_boundary(61, 1, 256)
        a.from_numpy(np.arange(64))
        c.copy_from(a)
        np.testing.assert_array_equal(c.to_numpy(), np.arange(64))
        raw = c._array.view(np.uint8)[3:7]  # bytes inside words: merged with their neighbours
        raw.write(np.array([1, 2, 3, 4], np.uint8))
        got = np.frombuffer(c.to_bytes(), np.uint8)
        assert list(got[3:7]) == [1, 2, 3, 4]
        before = np.arange(64, dtype=np.float32).tobytes()
        assert got[:3].tobytes() == before[:3] and got[7:].tobytes() == before[7:]


def test_freed_buffers_and_bound_launches(wg):
    a, c = wg.allocate(100), wg.allocate(100)
    a.fill(1.0)
    ops.vector_neg(wg, a, c)  # binds a fast-path launch for (a, c)
    a.free()
    with pytest.raises(BufferStateError, match="freed"):
        ops.vector_neg(wg, a, c)
    fresh = wg.allocate(100).fill(3.0)  # may reuse a's memory: the old binding is dead
    ops.vector_neg(wg, fresh, c)
    np.testing.assert_array_equal(c.to_numpy(), -3.0)
    with hg.Executor("cpu") as cpu:
        p = b.program(lambda u: -u, [("f32", (100,))])
        with pytest.raises(ArgumentTypeError, match="webgpu device memory"):
            cpu.launch(p, [fresh._array], [np.empty(100, np.float32)])


# --- DLPack and interop --------------------------------------------------------------------
def test_dlpack_exports_only_host_copies(wg):
    a = wg.allocate((3, 4)).from_numpy(np.arange(12))
    assert a.__dlpack_device__() == (15, 0)
    with pytest.raises(BufferError, match="device memory, which DLPack cannot share"):
        np.from_dlpack(a)
    with pytest.raises(DLPackError, match="copy=False"):
        a.__dlpack__(dl_device=(1, 0), copy=False)
    with pytest.raises(DLPackError, match=r"dl_device=\(2, 0\) given"):
        a.__dlpack__(dl_device=(2, 0))
    host = np.from_dlpack(a, device="cpu", copy=True)
    np.testing.assert_array_equal(host, np.arange(12).reshape(3, 4))
    host[0, 0] = 99
    assert a.to_numpy()[0, 0] == 0
    np.testing.assert_array_equal(np.from_dlpack(a, device="cpu"), np.arange(12).reshape(3, 4))
    assert "dltensor" in repr(a.__dlpack__(dl_device=(1, 0), max_version=(1, 0)))


def test_from_dlpack_copies_into_device_memory(wg):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    buf = hg.from_dlpack(x, executor=wg)
    assert isinstance(buf, DeviceBuffer) and buf.shape == (2, 3)
    x[0, 0] = 50  # a copy: the device buffer keeps the old value
    assert buf.to_numpy()[0, 0] == 0
    strided = hg.from_dlpack(np.arange(12, dtype=np.float32)[::2], executor=wg)
    np.testing.assert_array_equal(strided.to_numpy(), np.arange(0, 12, 2))
    with pytest.raises(DLPackError, match="copy=False"):
        hg.from_dlpack(x, executor=wg, copy=False)
    on_host = hg.from_dlpack(buf)  # device buffer -> the default cpu executor: a copy
    assert on_host.device == "cpu"
    np.testing.assert_array_equal(on_host.to_numpy(), [[0, 1, 2], [3, 4, 5]])
    with pytest.raises(BufferStateError, match="device memory"):
        wg.wrap(np.ones(3, np.float32))


def test_handle_api_on_webgpu():
    e = hologram_ffi.new_executor_with_backend("webgpu")
    try:
        a, c = (hologram_ffi.executor_allocate_buffer(e, 8) for _ in range(2))
        out = hologram_ffi.executor_allocate_buffer(e, 1)
        hologram_ffi.buffer_fill(e, a, 1.0)
        hologram_ffi.buffer_copy_from_slice(e, a, json.dumps([5, 6, 7]))  # a prefix
        hologram_ffi.vector_add_f32(e, a, a, c, 8)
        assert json.loads(hologram_ffi.buffer_to_vec(e, c)) == [10, 12, 14] + [2] * 5
        assert hologram_ffi.reduce_sum_f32(e, c, out, 8) == 46.0
        bb = hologram_ffi.executor_allocate_boundary_buffer(e, 3, 1, 32)
        hologram_ffi.buffer_copy_from_bytes(e, bb, np.full(8, 0.5, np.float32).tobytes())
        assert np.frombuffer(hologram_ffi.buffer_to_bytes(e, bb), np.float32).sum() == 4.0
    finally:
        hologram_ffi.executor_cleanup(e)


# --- the catalogue rows of docs/errors.md for device buffers -------------------------------
DOC = Path(__file__).resolve().parents[1] / "docs" / "errors.md"
WG_ROW = re.compile(r"^\|\s*(WG\d\d)\s*\|\s*`(.+?)`\s*\|\s*(\w+)\s*\|\s*(.*?)\s*\|\s*$")


def wg_rows() -> list[tuple[str, str, str, str]]:
    return [m.groups() for ln in DOC.read_text(encoding="utf-8").splitlines()
            if (m := WG_ROW.match(ln))]


def test_device_rows_exist():
    assert len(wg_rows()) >= 6


@pytest.mark.parametrize("ident,call,exc,fragment", wg_rows(), ids=[r[0] for r in wg_rows()])
def test_device_error_row(ident, call, exc, fragment):
    """Each WG row's call raises that exception with that message (`...` = varies), in
    the namespace docs/errors.md lists above the table."""
    from hologram import errors as E

    with hg.Executor("webgpu") as wgx, hg.Executor("cpu") as ex:
        d = wgx.allocate(4).fill(1.0)
        add = Program.parse(".in 0 f32[4]\n.in 1 f32[4]\n%0 = ldg.f32[4] in=0\n"
                            "%1 = ldg.f32[4] in=1\n%2 = add.f32[4] %0, %1\nstg.f32[4] %2 out=0")
        ns = {"np": np, "hg": hg, "wg": wgx, "ex": ex, "d": d, "ADD": add}
        with pytest.raises(getattr(E, exc)) as info:
            eval(call, ns)  # noqa: S307 - the catalogue's own calls
    assert type(info.value) is getattr(E, exc)
    pos, message = 0, str(info.value)
    for part in (p for p in fragment.split("...") if p):
        i = message.find(part, pos)
        assert i >= 0, f"{ident}: message {message!r} lacks {part!r}"
        pos = i + len(part)
