"""Executor and Buffer: backends, allocation, data in and out, lifetime, DLPack."""

from __future__ import annotations

import numpy as np
import pytest

import hologram as hg
from hologram.errors import (
    BackendUnavailableError,
    BufferStateError,
    DTypeError,
    ShapeError,
)


@pytest.fixture
def ex():
    with hg.Executor("cpu") as e:
        yield e


def test_auto_picks_the_default_backend():
    with hg.Executor() as e:
        assert e.backend_name == hg.get_default_backend()
    assert hg.get_default_backend() in hg.available_backends()
    assert isinstance(hg.is_cuda_available(), bool)
    assert isinstance(hg.is_metal_available(), bool)


@pytest.mark.parametrize("name", ["cuda", "metal", "webgpu"])
def test_unavailable_backend_says_why(name):
    reason = hg.backend.why_unavailable(name)
    if reason is None:
        pytest.skip(f"{name} is available here")
    with pytest.raises(BackendUnavailableError, match=name) as e:
        hg.Executor(name)
    assert reason in str(e.value)


def test_unknown_backend_lists_the_choices():
    with pytest.raises(BackendUnavailableError, match="'cpu'"):
        hg.Executor("tpu")


def test_allocate_shapes_and_dtypes(ex):
    a = ex.allocate(10)
    assert a.shape == (10,) and a.dtype == np.float32 and a.nbytes == 40
    b = ex.allocate((3, 4), dtype=np.float64)
    assert b.shape == (3, 4) and b.dtype == np.float64 and b.nbytes == 96
    assert b.device == "cpu"
    z = ex.allocate(0)
    assert z.size == 0 and z.to_numpy().shape == (0,)
    with pytest.raises(ShapeError, match="size_or_shape"):
        ex.allocate(-1)
    with pytest.raises(TypeError, match="size_or_shape"):
        ex.allocate(2.5)
    assert ex.allocate(4, dtype=np.int8).dtype == np.int8  # every ISA dtype (issue 18)
    with pytest.raises(DTypeError, match="dtype"):
        ex.allocate(4, dtype=np.complex64)


def test_to_numpy_is_a_view_and_from_numpy_copies_in(ex):
    a = ex.allocate(8)
    a.from_numpy(np.arange(8, dtype=np.float64))  # same-kind cast f64 -> f32
    v = a.to_numpy()
    assert v.dtype == np.float32
    np.testing.assert_array_equal(v, np.arange(8))
    v[0] = 42
    assert a.to_numpy()[0] == 42  # same memory
    with pytest.raises(ShapeError, match="array"):
        a.from_numpy(np.zeros(7))
    with pytest.raises(DTypeError, match="cannot cast"):
        a.from_numpy(np.array(["x"] * 8))


def test_bytes_fill_copy(ex):
    a, b = ex.allocate(4), ex.allocate(4)
    data = np.array([1.5, -0.0, np.inf, np.nan], dtype=np.float32)
    a.from_bytes(data.tobytes())
    assert a.to_bytes() == data.tobytes()
    b.copy_from(a)
    assert b.to_bytes() == data.tobytes()
    b.fill(3.0)
    np.testing.assert_array_equal(b.to_numpy(), [3, 3, 3, 3])
    with pytest.raises(ShapeError, match="data"):
        a.from_bytes(b"123")
    with pytest.raises(ShapeError, match="other"):
        a.copy_from(ex.allocate(5))
    with pytest.raises(TypeError, match="value"):
        a.fill("x")


def test_freed_and_foreign_buffers_raise(ex):
    a = ex.allocate(4)
    a.free()
    for call in (a.to_numpy, a.to_bytes, lambda: a.fill(1.0), lambda: a.from_numpy(np.ones(4))):
        with pytest.raises(BufferStateError, match="freed"):
            call()
    with hg.Executor("cpu") as other:
        b = other.allocate(4)
        c = ex.allocate(4)
        with pytest.raises(BufferStateError, match="another executor"):
            hg.ops.vector_add(ex, b, c, c)
        with pytest.raises(BufferStateError, match="another executor"):
            c.copy_from(b)


def test_close_frees_everything():
    e = hg.Executor("cpu")
    bufs = [e.allocate(1000) for _ in range(10)]
    e.close()
    assert all(b.is_freed for b in bufs)
    with pytest.raises(BufferStateError, match="closed"):
        e.allocate(4)


def test_memory_stats_and_limit():
    with hg.Executor("cpu", memory_limit=4 << 20) as e:
        big = e.allocate(1 << 20)  # 4 MiB of f32 goes to the linear pool
        assert big.pool == "linear"
        small = e.allocate(100)
        assert small.pool == "boundary"
        s = e.memory_stats()
        assert s["allocated_bytes"] >= (4 << 20)
        with pytest.raises(hg.OutOfMemoryError, match="limit"):
            e.allocate(1 << 20)
        big.free()
        again = e.allocate(1 << 20)  # works after the error
        assert again.size == 1 << 20


def test_boundary_buffer_and_phi_addressing(ex):
    check_phi_addressing(ex)
    with pytest.raises(ShapeError, match="class_index"):
        ex.allocate_boundary(96)
    with pytest.raises(ShapeError, match="width"):
        ex.allocate_boundary(0, width=49)
    with pytest.raises(BufferStateError):
        ex.allocate_boundary(7, width=1, height=64)  # class 7 is taken


def check_phi_addressing(ex) -> None:
    """A boundary buffer at Φ(7,0,0) read by ldg and a result stored at Φ(8,0,0)
    (shared with the other backends' tests)."""
    from hologram.isa import Program

    buf = ex.allocate_boundary(7, width=1, height=64)  # 64 bytes = 16 f32 at Φ(7,0,0)
    assert buf.pool == "boundary" and buf.size == 16
    buf.from_numpy(np.arange(16))
    out = ex.allocate(16)
    p = Program.parse("""
        %0 = ldg.f32[16] phi=(7,0,0)
        %1 = const.f32[16] value=2.0
        %2 = mul.f32[16] %0, %1
        stg.f32[16] %2 out=0
        stg.f32[16] %2 phi=(8,0,0)
    """)
    ex.run(p, [], [out])
    np.testing.assert_array_equal(out.to_numpy(), np.arange(16) * 2)
    arena = ex.boundary_arena
    np.testing.assert_array_equal(arena[8 * 12288:8 * 12288 + 64].view(np.float32),
                                  np.arange(16) * 2)


def test_run_checks_operands(ex):
    from hologram.isa import builder as b

    p = b.program(lambda x: x.exp(), [("f32", (4,))])
    a, c = ex.allocate(4), ex.allocate(4)
    a.from_numpy(np.zeros(4))
    ex.run(p, [a], [c])
    np.testing.assert_array_equal(c.to_numpy(), np.ones(4))
    with pytest.raises(ShapeError, match="inputs"):
        ex.run(p, [], [c])
    with pytest.raises(ShapeError, match=r"inputs\[0\]"):
        ex.run(p, [ex.allocate(5)], [c])
    with pytest.raises(DTypeError, match=r"outputs\[0\]"):
        ex.run(p, [a], [ex.allocate(4, np.float64)])
    with pytest.raises(TypeError, match=r"inputs\[0\]"):
        ex.run(p, [np.zeros(4, np.float32)], [c])


# --- DLPack -------------------------------------------------------------------------


def test_dlpack_export_to_numpy_shares_memory(ex):
    a = ex.allocate((2, 3))
    a.from_numpy(np.arange(6))
    v = np.from_dlpack(a)
    assert v.shape == (2, 3)
    v[0, 0] = 99
    assert a.to_numpy()[0, 0] == 99
    assert a.__dlpack_device__() == (1, 0)
    cap = a.__dlpack__(max_version=(1, 0))
    assert "dltensor" in repr(cap)


def test_dlpack_import_from_numpy_shares_memory(ex):
    x = np.arange(5, dtype=np.float32)
    buf = hg.from_dlpack(x, executor=ex)
    out = ex.allocate(5)
    hg.ops.vector_add(ex, buf, buf, out)
    np.testing.assert_array_equal(out.to_numpy(), 2 * x)
    hg.ops.scalar_add(ex, buf, buf, 1.0)  # in place on the caller's memory
    np.testing.assert_array_equal(x, np.arange(5) + 1)


def test_dlpack_import_non_contiguous(ex):
    x = np.arange(10, dtype=np.float32)[::2]
    with pytest.raises(ShapeError, match="contiguous"):
        hg.from_dlpack(x, executor=ex, copy=False)
    buf = hg.from_dlpack(x, executor=ex)  # copies
    np.testing.assert_array_equal(buf.to_numpy(), x)
    with pytest.raises(TypeError, match="__dlpack__"):
        hg.from_dlpack([1, 2, 3], executor=ex)


def test_dlpack_with_torch_both_ways(ex):
    torch = pytest.importorskip("torch")
    t = torch.arange(6, dtype=torch.float32)
    buf = hg.from_dlpack(t, executor=ex)
    hg.ops.scalar_mul(ex, buf, buf, 2.0)
    assert torch.equal(t, torch.arange(6, dtype=torch.float32) * 2)  # shared memory

    a = ex.allocate((2, 3))
    a.from_numpy(np.ones((2, 3)))
    t2 = torch.from_dlpack(a)
    assert t2.shape == (2, 3)
    t2.add_(1)
    np.testing.assert_array_equal(a.to_numpy(), np.full((2, 3), 2.0))


def test_100k_allocate_free_cycles_on_one_executor_do_not_grow():
    import resource

    rng = np.random.default_rng(7)
    sizes = rng.choice([1, 100, 3072, 3073, 20_000, 100_000, 300_000], size=100_000)
    with hg.Executor("cpu") as e:
        live: list[hg.Buffer] = []
        rss_mid = 0
        for i, n in enumerate(sizes):
            live.append(e.allocate(int(n)))
            if len(live) > 4:
                live.pop(0).free()
            if i == 10_000:
                rss_mid = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for b in live:
            b.free()
        stats = e.memory_stats()
        assert stats["boundary"]["classes_used"] == 0
        assert stats["allocated_bytes"] == 0
        rss_end = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        assert rss_end - rss_mid < 64 * 1024  # KiB: no growth beyond the pools' caches
