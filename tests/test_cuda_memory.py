"""The CUDA backend's memory and streams on the emulated device: each program's temps in
one device block from the executor's pools (laid out by lifetime, allocated on the first
call only, counted in the memory statistics and the limit, given back by
``empty_cache``), and launches on an external stream (``Executor.use_stream``, which
hologram_torch uses for PyTorch's current stream), checked as plumbing: which stream
each launch, copy and GEMM was handed, and the events ordering the streams."""

from __future__ import annotations

import numpy as np
import pytest

import hologram as hg
from hologram.backends.reference import evaluate
from hologram.errors import OutOfMemoryError
from hologram.isa import builder as b
from hologram.memory import bin_size

from .cuda_env import use_emulated
from .test_differential import assert_close


@pytest.fixture
def ex(monkeypatch):
    use_emulated(monkeypatch)
    with hg.Executor("cuda") as e:
        e.backend.threads_per_block = 64
        yield e


def _chain(x, w, v):
    """Three GEMMs and a softmax between them: three temps, two of which never meet."""
    g = (x @ w).tanh() @ v
    return (g.exp() / g.exp().sum(1, keepdims=True)) @ v.permute((1, 0))


SPECS = [("f32", (8, 16)), ("f32", (16, 12)), ("f32", (12, 12))]


def _operands(ex, seed):
    rng = np.random.default_rng(seed)
    data = [rng.standard_normal(s).astype(np.float32) for _, s in SPECS]
    data[0].reshape(-1)[:3] = [np.nan, np.inf, 0.0]
    return data, [ex.allocate(d.shape).from_numpy(d) for d in data]


def test_temps_live_in_one_block_allocated_once(ex):
    p = b.program(_chain, SPECS)
    c = ex.compile(p)
    layout = c.temp_layout
    assert len(c.temps) == 3 and layout.nbytes < layout.separate_nbytes  # bytes shared
    dev = ex.backend.device
    out = ex.allocate((8, 12))
    before = ex.memory_stats()["linear"]["allocated_bytes"]
    for call in range(3):
        data, bufs = _operands(ex, call)
        made = dev.allocations
        ex.run(p, bufs, [out])
        # the first call makes the program's one block; later calls make nothing
        assert dev.allocations - made == (1 if call == 0 else 0)
        assert_close(out.to_numpy(), evaluate(p, data)[0][0], rtol=2e-5, atol=1e-5)
    stats = ex.memory_stats()
    assert stats["linear"]["allocated_bytes"] - before == bin_size(layout.nbytes)
    assert ex.backend.temp_blocks.stats() == {"temp_blocks": 1, "temp_bytes": layout.nbytes}

    ex.empty_cache()  # the block goes back with the pools' cache
    assert ex.backend.temp_blocks.stats() == {"temp_blocks": 0, "temp_bytes": 0}
    assert ex.memory_stats()["linear"]["allocated_bytes"] == before
    assert ex.memory_stats()["linear"]["cached_bytes"] == 0
    data, bufs = _operands(ex, 9)
    made = dev.allocations
    ex.run(p, bufs, [out])  # and comes back on the next call
    assert dev.allocations - made == 1
    assert_close(out.to_numpy(), evaluate(p, data)[0][0], rtol=2e-5, atol=1e-5)


def test_host_operands_are_staged_in_the_pools(ex):
    """NumPy operands (Executor.launch, the op library) are uploaded into pool blocks
    that go back after the launch: after the first call, no device allocation; and
    none is left live, even when the launch raises."""
    p = b.program(_chain, SPECS)
    dev = ex.backend.device
    out = np.zeros((8, 12), np.float32)
    live = ex.memory_stats()["linear"]["num_live_blocks"]
    for call in range(3):
        data, _ = _operands(ex, 10 + call)
        made = dev.allocations
        ex.launch(p, data, [out])
        assert call == 0 or dev.allocations == made
        assert_close(out, evaluate(p, data)[0][0], rtol=2e-5, atol=1e-5)
    assert ex.memory_stats()["linear"]["num_live_blocks"] == live + 1  # the temp block
    g = b.program(lambda x, i: b.Var(b.gather(x.v, i.v, axis=0)),
                  [("f32", (5000,)), ("i64", (3,))])
    with pytest.raises(IndexError, match="out of range"):
        ex.launch(g, [np.ones(5000, np.float32), np.array([0, 9999, 1])],
                  [np.zeros(3, np.float32)])
    assert ex.memory_stats()["linear"]["num_live_blocks"] == live + 1


def test_pointer_launches_share_the_block(ex):
    """The raw-address path (hologram_torch's) reads the same block."""
    p = b.program(_chain, SPECS)
    c = ex.compile(p)
    run = ex.backend.pointer_launcher(c)
    data, _ = _operands(ex, 4)
    out = np.zeros((8, 12), np.float32)
    dev = ex.backend.device
    run([d.ctypes.data for d in data] + [out.ctypes.data])
    made = dev.allocations
    run([d.ctypes.data for d in data] + [out.ctypes.data])
    assert dev.allocations == made
    assert_close(out, evaluate(p, data)[0][0], rtol=2e-5, atol=1e-5)


def test_temp_blocks_count_against_the_memory_limit(ex):
    p = b.program(lambda x: ((x @ x.permute((1, 0))).exp() @ x).sum(1), [("f32", (64, 64))])
    c = ex.compile(p)
    assert c.temp_layout.nbytes > 1024
    ex.memory_limit = 1024
    x = np.ones((64, 64), np.float32)
    with pytest.raises(OutOfMemoryError, match="linear pool"):
        ex.launch(p, [x], [np.zeros(64, np.float32)])
    ex.memory_limit = None
    out = np.zeros(64, np.float32)
    ex.launch(p, [x], [out])
    assert_close(out, evaluate(p, [x])[0][0], rtol=2e-5, atol=1e-5)


def test_a_program_that_dies_gives_its_block_back(ex):
    p = b.program(_chain, SPECS)
    data, _ = _operands(ex, 1)
    out = np.zeros((8, 12), np.float32)
    c = ex.backend.compile(p)  # not cached by the executor: its life is ours
    ex.backend.launch(c, data, [out])
    held = ex.memory_stats()["linear"]["allocated_bytes"]
    assert ex.backend.temp_blocks.stats()["temp_blocks"] == 1
    del c
    other = b.program(lambda x: (x @ x.permute((1, 0))).exp().sum(1), [("f32", (8, 8))])
    ex.launch(other, [np.ones((8, 8), np.float32)], [np.zeros(8, np.float32)])
    assert ex.backend.temp_blocks.stats()["temp_blocks"] == 1  # only the live program's
    assert ex.memory_stats()["linear"]["allocated_bytes"] <= held


# --- streams -------------------------------------------------------------------------------
class StreamLog:
    """Records the stream of every launch, GEMM and copy, and every event recorded and
    waited for, on the (shared) emulated device while installed."""

    def __init__(self, monkeypatch, dev) -> None:
        self.calls: list[tuple[str, object]] = []
        for name, pos in (("launch", 5), ("gemm_strided_batched", 16), ("copy_h2d", 2),
                          ("copy_d2h", 2), ("record", 1)):
            monkeypatch.setattr(dev, name, self._wrap(name, getattr(dev, name), pos))
        real_wait = dev.wait

        def wait(stream, event):
            self.calls.append(("wait", stream))
            return real_wait(stream, event)

        monkeypatch.setattr(dev, "wait", wait)

    def _wrap(self, name, fn, pos):
        def call(*args, **kw):
            stream = kw.get("stream", args[pos] if len(args) > pos else None)
            self.calls.append((name, stream))
            return fn(*args, **kw)
        return call

    def streams(self, name):
        return [s for n, s in self.calls if n == name]


def test_launches_go_on_the_external_stream(ex, monkeypatch):
    p = b.program(_chain, SPECS)
    ex.compile(p)
    data, bufs = _operands(ex, 2)
    out = ex.allocate((8, 12))
    ex.run(p, bufs, [out])  # the block now belongs to the backend's own stream
    own = ex.backend.stream
    log = StreamLog(monkeypatch, ex.backend.device)
    with ex.use_stream(0x5EED):
        ext = ex.backend.current_stream()
        assert ext is not own and ext.handle == 0x5EED
        ex.run(p, bufs, [out])
        got = out.to_numpy()  # copies too take the external stream
    assert_close(got, evaluate(p, data)[0][0], rtol=2e-5, atol=1e-5)
    assert ex.backend.current_stream() is own  # closed: back on our own
    assert log.streams("launch") and set(map(id, log.streams("launch"))) == {id(ext)}
    assert set(map(id, log.streams("gemm_strided_batched"))) == {id(ext)}
    assert set(map(id, log.streams("copy_d2h"))) == {id(ext)}
    # entering: ext waits for own; the temp block's last user (own) before its first use
    # on ext; leaving: own waits for ext
    assert log.streams("record")[0] is own and log.streams("wait")[0] is ext
    assert log.streams("record")[-1] is ext and log.streams("wait")[-1] is own
    assert len(log.streams("wait")) == 3

    log.calls.clear()
    # leaving ordered our stream after ext, so the block is our stream's again (it
    # refers to no stream its owner may destroy): no event before the next launch
    ex.run(p, bufs, [out])
    assert set(map(id, log.streams("launch"))) == {id(own)}
    assert log.streams("record") == [] and log.streams("wait") == []


def test_pointer_launches_take_the_external_stream(ex, monkeypatch):
    p = b.program(lambda x: (x.exp() * 2.0).tanh(), [("f32", (100,))])
    run = ex.backend.pointer_launcher(ex.compile(p))
    x = np.linspace(-2, 2, 100).astype(np.float32)
    out = np.zeros(100, np.float32)
    log = StreamLog(monkeypatch, ex.backend.device)
    with ex.use_stream(7):
        run([x.ctypes.data, out.ctypes.data])
    (stream,) = log.streams("launch")
    assert stream.handle == 7
    assert_close(out, evaluate(p, [x])[0][0], rtol=2e-5, atol=1e-5)


@pytest.mark.parametrize("bad", [-1, 1.5, "0", True])
def test_a_bad_stream_handle_is_refused(ex, bad):
    with pytest.raises(ValueError, match="stream"), ex.use_stream(bad):
        pass


def test_host_backends_take_no_stream():
    with hg.Executor("cpu") as cpu:
        with cpu.use_stream(None):
            pass
        with pytest.raises(ValueError, match="stream: backend 'cpu' has no streams"):
            cpu.use_stream(3)


# --- DLPack imports of CUDA device memory -------------------------------------------------
class FakeCudaTensor:
    """Host memory dressed as a kDLCUDA tensor (the emulated device's addresses are host
    addresses, so kernels can run on it): NumPy's own capsule, its device rewritten.
    Records the stream each ``__dlpack__`` call was handed."""

    def __init__(self, arr, device=(2, 0), capsule_device=None):
        self.arr, self.device = arr, device
        self.capsule_device = capsule_device or device
        self.streams = []

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None):
        from hologram.backends.cuda_dlpack import DLManagedTensor, _capsule_get

        self.streams.append(stream)
        cap = self.arr.__dlpack__()
        m = DLManagedTensor.from_address(_capsule_get(cap, b"dltensor"))
        m.dl_tensor.device.device_type, m.dl_tensor.device.device_id = self.capsule_device
        return cap


@pytest.fixture
def gpu_memory(ex, monkeypatch):
    """The emulated executor's memory reporting kDLCUDA, as a GPU's does."""
    monkeypatch.setattr(ex._device, "dlpack_device", (2, 0))
    return ex


def test_cuda_tensors_are_imported_without_a_copy(gpu_memory):
    ex = gpu_memory
    x = np.linspace(-3, 3, 60, dtype=np.float32).reshape(6, 10)
    out = np.zeros((6, 10), np.float32)
    fx, fout = FakeCudaTensor(x), FakeCudaTensor(out)
    bx, bout = hg.from_dlpack(fx, ex), hg.from_dlpack(fout, ex)
    assert bx.pool == "external" and bx.shape == (6, 10) and bx.isa_dtype.name == "f32"
    p = b.program(lambda v: (v * 2.0).tanh(), [("f32", (6, 10))])
    ex.run(p, [bx], [bout])
    assert_close(out, evaluate(p, [x])[0][0], rtol=2e-5, atol=1e-5)  # written in place
    x[0, 0] = 5.0  # and read in place
    assert bx.to_numpy()[0, 0] == 5.0
    # the producer was asked to order its work before our stream
    assert fx.streams == [ex.backend.device.stream_handle(ex.backend.stream)]
    f77 = FakeCudaTensor(x)
    with ex.use_stream(77):
        hg.from_dlpack(f77, ex)
    assert f77.streams == [77]
    copied = hg.from_dlpack(FakeCudaTensor(x), ex, copy=True)
    assert copied.pool != "external"
    x[0, 0] = -1.0
    assert copied.to_numpy()[0, 0] == 5.0


def test_an_imported_tensor_is_released_with_its_buffer(gpu_memory):
    import gc
    import weakref

    arr = np.ones(100, np.float64)
    ref = weakref.ref(arr)
    fake = FakeCudaTensor(arr)
    del arr
    buf = hg.from_dlpack(fake, gpu_memory)
    del fake
    gc.collect()
    assert ref() is not None  # the buffer keeps the producer's memory alive
    buf.free()
    del buf
    gc.collect()
    assert ref() is None, "the capsule's deleter did not run"


def test_cuda_imports_refuse_what_kernels_cannot_index(gpu_memory):
    ex = gpu_memory
    x = np.zeros((4, 6), np.float32)
    with pytest.raises(hg.errors.DLPackError, match="not C-contiguous"):
        hg.from_dlpack(FakeCudaTensor(x[:, ::2]), ex)
    with pytest.raises(hg.errors.DLPackError, match=r"DLPack device \(2, 1\)"):
        hg.from_dlpack(FakeCudaTensor(x, device=(2, 1)), ex)
    with pytest.raises(hg.errors.DLPackError, match="its capsule is on"):
        hg.from_dlpack(FakeCudaTensor(x, capsule_device=(2, 3)), ex)
    with pytest.raises(hg.errors.DLPackError, match="complex|dtype|code"):
        hg.from_dlpack(FakeCudaTensor(np.zeros(3, np.complex64)), ex)


def test_the_emulated_device_takes_no_cuda_tensors(ex):
    with pytest.raises(hg.errors.DLPackError, match="emulated CUDA device is host memory"):
        hg.from_dlpack(FakeCudaTensor(np.zeros(3, np.float32)), ex)
