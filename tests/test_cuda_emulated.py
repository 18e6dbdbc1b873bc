"""The CUDA backend on the emulated device (``HOLOGRAM_CUDA_DEVICE=emulated``) against
the reference interpreter: the op library, the composite suite and random programs
(index, scan, sort, attention and GEMM steps included), each at several block sizes and
thread orders; and the harness itself can fail (a kernel missing a barrier computes
wrong values under some order, a barrier in a divergent branch is an error).

Emulated kernels are slow (each CUDA thread a fiber): shapes are small, examples few,
and each example runs every configuration on one compiled module.
"""

from __future__ import annotations

import ctypes.util
import dataclasses
import os
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hologram as hg
from hologram.backends import registry
from hologram.backends.cuda import CudaBackend, CudaProgram, KernelLaunch, launches, plan_grid
from hologram.backends.cuda_device import DEVICE_ENV, CudaDeviceError
from hologram.backends.reference import evaluate
from hologram.errors import BackendUnavailableError
from hologram.isa import builder as b

from .cuda_env import cuda_device, cuda_executors
from .programs import (
    INT_DTYPES,
    compiled_and_reference,
    int_index_case,
    int_programs,
    programs,
    random_inputs,
    random_int_inputs,
)
from .test_differential import assert_close
from .test_fusion import CASES

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

#: (threads per block, thread order): every check runs under each.
CONFIGS = [(32, "forward"), (64, "reverse"), (128, "shuffled")]
#: scripts/gpu_check.sh runs this file on a GPU with HOLOGRAM_CUDA_TEST_DEVICE=gpu (the
#: thread orders are then the hardware's; the harness tests need the emulator).
KIND = os.environ.get("HOLOGRAM_CUDA_TEST_DEVICE", "emulated")
emulator_only = pytest.mark.skipif(KIND != "emulated", reason="checks the emulator itself")


@pytest.fixture(scope="module")
def emulated():
    with cuda_device(KIND):
        yield


@pytest.fixture(scope="module")
def executors(emulated):
    with cuda_executors(CONFIGS) as exs:
        yield exs


def configs(executors, seed: int = 0):
    """Each (executor, order), with the shared device set to that order."""
    for ex, order in executors:
        dev = ex.backend.device
        dev.order, dev.seed = order, seed
        try:
            yield ex
        finally:
            dev.order, dev.seed = "forward", 0


def _check_program(executors, p: hg.Program, inputs, rtol: float, atol: float,
                   seed: int = 0) -> None:
    for ex in configs(executors, seed):
        got, want = compiled_and_reference(ex, p, inputs)
        for g, w in zip(got, want, strict=True):
            assert_close(g, w, rtol=rtol, atol=atol)


# --- the op library, on device buffers ---------------------------------------------------
def _op_results(ex: hg.Executor, data: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every op of the op library once, on ``ex``'s Buffers; name -> result."""
    o = hg.ops
    res: dict[str, np.ndarray] = {}

    def buf(name):
        return ex.allocate(data[name].shape).from_numpy(data[name])

    x, y, p, t = buf("x"), buf("y"), buf("p"), buf("t")

    def run(name, f, *args, shape=(6, 40), scalars=(), **kw):
        out = ex.allocate(shape)
        f(ex, *args, out, *scalars, **kw)
        res[name] = out.to_numpy()

    for f in (o.vector_add, o.vector_sub, o.vector_mul, o.vector_div, o.vector_min,
              o.vector_max):
        run(f.__name__, f, x, y)
    for f in (o.vector_abs, o.vector_neg, o.vector_relu, o.sigmoid, o.tanh, o.gelu):
        run(f.__name__, f, x)
    run("gelu_erf", o.gelu, x, approximate="none")
    run("clip", o.vector_clip, x, scalars=(-0.5, 0.8))
    run("scalar_add", o.scalar_add, x, scalars=(1.5,))
    run("scalar_mul", o.scalar_mul, x, scalars=(-2.0,))
    run("softmax", o.softmax, x)
    run("log_softmax0", o.log_softmax, x, axis=0)
    for f in (o.reduce_sum, o.reduce_max, o.reduce_min):
        run(f.__name__, f, x, shape=1)
        run(f.__name__ + "_rows", f, x, shape=6, axis=1)
    run("mse", o.mse_loss, x, y, shape=1)
    run("bce", o.binary_cross_entropy_loss, p, t, shape=1)
    run("ce", o.cross_entropy_loss, x, t, shape=1)
    w = buf("w")
    run("gemm", o.gemm, x, w, shape=(6, 5))
    run("matvec", o.matvec, x, buf("v"), shape=6)
    return res


def test_op_library_matches_reference(executors):
    rng = np.random.default_rng(zlib.crc32(b"cuda ops"))
    x = (rng.standard_normal((6, 40)) * 3).astype(np.float32)
    x.reshape(-1)[rng.choice(x.size, 6, replace=False)] = [np.nan, np.inf, -np.inf, 0.0,
                                                           -0.0, 1e30]
    data = {"x": x, "y": (rng.standard_normal((6, 40)) * 3).astype(np.float32),
            "p": rng.uniform(0.01, 0.99, (6, 40)).astype(np.float32),
            "t": rng.uniform(0, 1, (6, 40)).astype(np.float32),
            "w": rng.standard_normal((40, 5)).astype(np.float32),
            "v": rng.standard_normal(40).astype(np.float32)}
    with hg.Executor("reference") as ref:
        want = _op_results(ref, data)
    for ex in configs(executors):
        got = _op_results(ex, data)
        assert got.keys() == want.keys()
        for name in want:
            assert_close(got[name], want[name], rtol=2e-5, atol=1e-5), name


# --- the composite suite -----------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(CASES))
def test_composites_match_reference(executors, name):
    fn, specs, _ = CASES[name]
    small = [(d, tuple(min(n, 24) for n in s)) for d, s in specs]
    if name.startswith("gemm"):  # keep the inner sizes equal after shrinking
        small = [(d, s) for d, s in specs]
    p = b.program(fn, small)
    _check_program(executors, p, random_inputs(small, zlib.crc32(name.encode())),
                   rtol=2e-5, atol=1e-5)


# --- random programs ---------------------------------------------------------------------
SETTINGS = settings(max_examples=30, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@SETTINGS
@given(programs(dtype="f32", gemm=True, max_ops=6), st.integers(0, 2**32 - 1))
def test_random_programs_f32(executors, case, seed):
    fn, specs = case
    _check_program(executors, b.program(fn, specs), random_inputs(specs, seed),
                   rtol=2e-4, atol=1e-5, seed=seed)


@SETTINGS
@given(programs(dtype="f64", gemm=True, max_ops=6), st.integers(0, 2**32 - 1))
def test_random_programs_f64(executors, case, seed):
    fn, specs = case
    _check_program(executors, b.program(fn, specs), random_inputs(specs, seed),
                   rtol=1e-9, atol=1e-12, seed=seed)


@settings(SETTINGS, max_examples=20)
@given(programs(dtype="f32", attention=True, max_ops=4), st.integers(0, 2**32 - 1))
def test_random_programs_with_attention(executors, case, seed):
    fn, specs = case
    _check_program(executors, b.program(fn, specs), random_inputs(specs, seed),
                   rtol=2e-4, atol=1e-5, seed=seed)


@settings(SETTINGS, max_examples=20)
@given(programs(dtype="f32", gemm=True, empty=True, max_ops=6), st.integers(0, 2**32 - 1))
def test_random_programs_with_an_empty_axis(executors, case, seed):
    fn, specs = case
    _check_program(executors, b.program(fn, specs), random_inputs(specs, seed),
                   rtol=2e-4, atol=1e-5, seed=seed)


@settings(SETTINGS, max_examples=15)
@given(st.sampled_from(INT_DTYPES).flatmap(lambda d: int_programs(dtype=d, max_ops=6)),
       st.integers(0, 2**32 - 1))
def test_random_int_programs(executors, case, seed):
    """Bitwise ops, shifts (counts out of range, negative values), wrapping arithmetic
    and integer casts, over every integer dtype, bit for bit."""
    fn, specs = case
    p = b.program(fn, specs)
    inputs = random_int_inputs(specs, seed)
    for ex in configs(executors, seed):
        got, want = compiled_and_reference(ex, p, inputs)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w, err_msg=str(p))


@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_index_ops_over_every_integer_dtype(executors, dtype):
    p, inputs = int_index_case(dtype, "i64")
    for ex in configs(executors, 1):
        got, want = compiled_and_reference(ex, p, inputs)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w, err_msg=f"{dtype}\n{p}")


def test_attention_backward_matches_reference(executors):
    rng = np.random.default_rng(7)
    specs = [("f32", (2, 5, 8)), ("f32", (2, 7, 8)), ("f32", (2, 7, 8)), ("f32", (2, 5, 8))]

    def fn(q, k, v, g):
        out, lse = b.attention(q.v, k.v, v.v, causal=True)
        return tuple(b.Var(x) for x in b.attention_grads(g.v, q.v, k.v, v.v, out, lse,
                                                          causal=True))

    p = b.program(fn, specs)
    inputs = [rng.standard_normal(s).astype(np.float32) for _, s in specs]
    _check_program(executors, p, inputs, rtol=2e-4, atol=1e-5)


def test_index_error_is_raised(executors):
    p = b.program(lambda x, i: b.Var(b.gather(x.v, i.v, axis=0)),
                  [("f32", (5,)), ("i64", (3,))])
    x = np.arange(5, dtype=np.float32)
    for ex in configs(executors):
        out = np.zeros(3, np.float32)
        ex.launch(p, [x, np.array([0, 4, 2])], [out])
        np.testing.assert_array_equal(out, [0, 4, 2])
        with pytest.raises(IndexError, match="out of range"):
            ex.launch(p, [x, np.array([0, 9, 2])], [out])


# --- the harness can fail ----------------------------------------------------------------
def _patched(ex: hg.Executor, p: hg.Program, edit) -> CudaProgram:
    """``p`` compiled, then its module rebuilt from ``edit(source)`` (kernels swapped)."""
    c = ex.backend.compile(p)
    source = edit(c.source)
    assert source != c.source, "the edit changed nothing"
    dev = ex.backend.device
    module = dev.compile(source, {"program": "harness-test"})
    steps = [dataclasses.replace(s, kernel=dev.function(module, s.name))
             if isinstance(s, KernelLaunch) else s for s in c.steps]
    return dataclasses.replace(c, steps=steps, module=module)


def _row_sum_program() -> hg.Program:
    return b.program(lambda x: x.sum(1), [("f32", (3, 200))])


@emulator_only
def test_a_kernel_missing_its_barriers_is_caught(executors):
    """hg_block_reduce without __syncthreads: warps read the shared partials before the
    other warps wrote them, so some block size and order gives a wrong sum."""
    p = _row_sum_program()
    x = np.random.default_rng(1).standard_normal((3, 200)).astype(np.float32)
    want = x.astype(np.float64).sum(1)
    wrong = 0
    for ex in configs(executors):
        good = _patched(ex, p, lambda s: s.replace("for (int o = 16", "for (int o=16"))
        broken = _patched(ex, p, lambda s: s.replace("__syncthreads();", ""))
        out = np.zeros(3, np.float32)
        ex.backend.launch(good, [x], [out])
        np.testing.assert_allclose(out, want, rtol=1e-5)  # the control passes
        ex.backend.launch(broken, [x], [out])
        wrong += not np.allclose(out, want, rtol=1e-5)
    assert wrong, "removing the barriers went unnoticed at every block size and order"


@emulator_only
def test_a_barrier_in_a_divergent_branch_is_an_error(executors):
    p = _row_sum_program()
    x = np.ones((3, 200), np.float32)
    for ex in configs(executors):
        broken = _patched(ex, p, lambda s: s.replace(
            "__syncthreads();\n  if (lane == 0)",
            "if (lane < 16) __syncthreads();\n  if (lane == 0)", 1))
        name = broken.kernels()[0].name
        with pytest.raises(CudaDeviceError, match=f"kernel {name}.*barrier some threads never"):
            ex.backend.launch(broken, [x], [np.zeros(3, np.float32)])


# --- selection, planning, memory ---------------------------------------------------------
@emulator_only
def test_auto_never_picks_the_emulated_device(emulated):
    assert registry.why_unavailable("cuda") is None
    assert registry.get_default_backend() != "cuda"
    from hologram.cli import collect_info

    info = collect_info()["backends"]["cuda"]
    assert info["device"] == "emulated" and "EMULATED" in info["summary"]


def test_without_a_driver_cuda_says_so(monkeypatch):
    if ctypes.util.find_library("cuda") is not None:
        pytest.skip("this machine has an NVIDIA driver")
    monkeypatch.delenv(DEVICE_ENV, raising=False)
    with pytest.raises(BackendUnavailableError, match="no NVIDIA driver"):
        hg.Executor("cuda")
    monkeypatch.setenv(DEVICE_ENV, "gpux")
    with pytest.raises(BackendUnavailableError, match=DEVICE_ENV):
        hg.Executor("cuda")


def test_launch_plan_follows_block_size(executors):
    p = b.program(lambda x: x.tanh(), [("f32", (1000,))])
    for (ex, _), (threads, _) in zip(executors, CONFIGS, strict=True):
        (name, grid, block), = launches(ex.backend.compile(p))
        assert block == (threads, 1, 1)
        assert grid[0] == plan_grid("flat", 1000, threads, ex.backend.properties.multiprocessors)
    assert plan_grid("flat", 10, 32, 4) == 1 and plan_grid("outer", 10**6, 32, 4) == 128
    assert plan_grid("single", 10**6, 256, 4) == 1


def test_block_size_is_validated(emulated):
    backend = CudaBackend()
    for bad in (0, 16, 48, 2048, 64.0):
        with pytest.raises(ValueError, match="threads_per_block"):
            backend.threads_per_block = bad


@emulator_only
def test_buffers_are_device_memory_in_the_pools(executors):
    ex, _ = executors[0]
    buf = ex.allocate((100,))
    assert isinstance(buf, hg.buffer.DeviceBuffer)
    assert ex.memory_stats()["allocated_bytes"] >= 400
    buf.from_numpy(np.arange(100, dtype=np.float32))
    np.testing.assert_array_equal(buf.to_numpy(), np.arange(100))
    assert buf.__dlpack_device__() == (12, 0)  # not a GPU: DLPack's extension device
    host = np.from_dlpack(buf, device="cpu", copy=True)
    np.testing.assert_array_equal(host, np.arange(100))
    buf.free()


@emulator_only
def test_reference_agrees_on_a_fresh_input_each_order(executors):
    """The same module, three orders and seeds: bitwise the same result (the kernels'
    reductions have a fixed shape per block size, whatever the thread order)."""
    p = b.program(lambda x: (x.exp().sum(1, keepdims=True) + x).max(0), [("f64", (9, 33))])
    x = np.random.default_rng(3).standard_normal((9, 33))
    want, _ = evaluate(p, [x])
    ex, _ = executors[1]
    results = []
    for order in ("forward", "reverse", "shuffled"):
        ex.backend.device.order = order
        out = np.zeros(want[0].shape)
        ex.launch(p, [x], [out])
        results.append(out)
    ex.backend.device.order = "forward"
    assert_close(results[0], want[0], rtol=1e-12, atol=1e-12)
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])


def test_gemm_over_two_batch_axes_of_permuted_views(executors):
    """Attention's products: batch axes that do not merge (one cuBLAS strided-batched call
    per outer index, each operand stepping by its own stride)."""
    def fn(x, y):
        q = x.reshape((2, 6, 4, 16)).permute((0, 2, 1, 3))
        k = y.reshape((2, 5, 4, 16)).permute((0, 2, 3, 1))
        return q @ k

    p = b.program(fn, [("f64", (2, 6, 64)), ("f64", (2, 5, 64))])
    rng = np.random.default_rng(11)
    inputs = [rng.standard_normal((2, 6, 64)), rng.standard_normal((2, 5, 64))]
    ex, _ = executors[0]
    (call,) = [s for s in ex.backend.compile(p).steps if not isinstance(s, KernelLaunch)]
    assert call.batch == 4 and len(call.outer) == 2
    _check_program(executors, p, inputs, rtol=1e-12, atol=1e-12)


@emulator_only
def test_dlpack_on_a_gpu_goes_through_the_device_with_the_consumers_stream(executors):
    """The export path a GPU takes (the emulated device exports host copies): the memory
    says kDLCUDA, so ``__dlpack__`` hands the device its pointer, our stream and the
    consumer's; a host copy (``dl_device=(1, 0)``) still goes the DeviceBuffer way."""
    ex, _ = executors[0]
    buf = ex.allocate((3, 4)).from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4))
    mem = ex._device
    calls = []

    class Recorder:
        def __getattr__(self, name):  # everything else: the emulated device
            return getattr(saved[1], name)

        def export_dlpack(self, ptr, nbytes, dtype, shape, owner, stream, consumer):
            calls.append((ptr, nbytes, dtype, shape, stream, consumer))
            return "capsule"

    saved = (mem.dlpack_device, mem.device)
    mem.dlpack_device, mem.device = (2, 0), Recorder()
    try:
        assert buf.__dlpack__(stream=7) == "capsule"
        host = np.from_dlpack(buf, device="cpu", copy=True)
    finally:
        mem.dlpack_device, mem.device = saved
    ((ptr, nbytes, dtype, shape, stream, consumer),) = calls
    assert ptr == buf.view().handle.ptr + buf.view().offset and nbytes == 48
    assert shape == (3, 4) and dtype == np.float32
    assert stream is mem.stream and consumer == 7
    np.testing.assert_array_equal(host, np.arange(12).reshape(3, 4))


def test_tf32_gemm_is_the_backends_choice(emulated):
    """Off by default (f32 exact to BLAS rounding); allowed, f32 products read tf32 inputs
    (the emulated device rounds them as tensor cores do: ~1e-3 relative)."""
    p = b.program(lambda x, y: x @ y, [("f32", (8, 64)), ("f32", (64, 8))])
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((8, 64), np.float32), rng.standard_normal((64, 8), np.float32)
    want = x.astype(np.float64) @ y.astype(np.float64)
    for tf32 in (False, True):
        with hg.Executor("cuda") as ex:
            ex.backend.allow_tf32 = tf32
            (call,) = ex.backend.compile(p).steps
            assert call.tf32 is tf32
            out = np.zeros((8, 8), np.float32)
            ex.launch(p, [x, y], [out])
        err = np.abs(out - want).max() / np.abs(want).max()
        assert (err < 1e-6) if not tf32 else (1e-5 < err < 1e-2), (tf32, err)
