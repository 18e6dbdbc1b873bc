"""Executor buffers of every dtype of the ISA's table, on every backend.

Round trips (from_numpy/to_numpy, bytes, fill, copy_from) keep every bit, and a program
over buffers of each dtype (``Executor.run``) gives the reference interpreter's results;
the webgpu backend refuses what WGSL cannot store with a DTypeError naming the dtype. bf16
buffers are ml_dtypes' bfloat16 arrays (NumPy has none); without ml_dtypes allocating one
says what to install. The handle API allocates every dtype too.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zlib

import numpy as np
import pytest

import hologram as hg
import hologram.ffi as ffi
from hologram.backends import registry
from hologram.backends.reference import evaluate
from hologram.errors import DTypeError, ParseError
from hologram.isa import builder as b
from hologram.isa.dtypes import ALL, DType, bf16

from .cuda_env import cuda_device

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

NAMES = [pytest.param(d.name, marks=pytest.mark.skipif(
    d.np_dtype is None, reason="bf16 needs ml_dtypes")) if d is bf16 else d.name for d in ALL]
#: What WGSL storage holds (f16 where the adapter has shader-f16).
WGSL_STORES = {"f32", "f16", "i32", "u32"}


@pytest.fixture(scope="module")
def executors():
    """One executor per backend that is here: reference, cpu, emulated cuda, webgpu."""
    exs = {"reference": hg.Executor("reference"), "cpu": hg.Executor("cpu")}
    with cuda_device("emulated"):
        exs["cuda"] = hg.Executor("cuda")
    if registry.why_unavailable("webgpu") is None:
        exs["webgpu"] = hg.Executor("webgpu")
    yield exs
    for ex in exs.values():
        ex.close()


BACKENDS = ["reference", "cpu", "cuda", "webgpu"]


def _executor(executors, backend: str, d: DType) -> hg.Executor | None:
    """The backend's executor (a skip where it is absent); None on webgpu for a dtype WGSL
    cannot store, after checking that allocating it raises a DTypeError naming it."""
    if backend not in executors:
        pytest.skip(f"{backend} unavailable")
    ex = executors[backend]
    if backend == "webgpu":
        stores = d.name in WGSL_STORES and (d.name != "f16" or ex.backend.dev.f16)
        if not stores:
            with pytest.raises(DTypeError, match=d.name):
                ex.allocate(4, d.name)
            return None
    return ex


def _values(d: DType, n: int, seed: int) -> np.ndarray:
    """Fresh random values of ``d``: the float ones with NaN, ±inf, ±0 and the extremes,
    the integer ones over their whole range."""
    rng = np.random.default_rng(seed)
    t = np.dtype(d.np_dtype)
    if d.kind == "b":
        return rng.random(n) < 0.5
    if d.kind == "i":
        info = np.iinfo(t)
        x = rng.integers(info.min, info.max, n, dtype=t, endpoint=True)
        x[:2] = info.min, info.max
        return x
    x = (rng.standard_normal(n) * 4).astype(t)
    finite = np.arange(2**16, dtype=np.uint16).view(t) if d.itemsize == 2 else None
    top = float(np.nanmax(finite[np.isfinite(finite)].astype(np.float64))) \
        if finite is not None else float(np.finfo(t).max)
    x[:6] = np.array([np.nan, np.inf, -np.inf, -0.0, top, -top]).astype(t)
    return x


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", NAMES)
def test_round_trips_keep_every_bit(executors, backend, name):
    d = hg.isa.dtypes.to_dtype(name)
    ex = _executor(executors, backend, d)
    if ex is None:
        return
    x = _values(d, 37, zlib.crc32(name.encode())).reshape(37)
    buf = ex.allocate((37,), name)
    assert buf.isa_dtype is d and buf.dtype == d.np_dtype and buf.nbytes == 37 * d.itemsize
    buf.from_numpy(x)
    back = np.asarray(buf.to_numpy())
    assert back.dtype == d.np_dtype
    np.testing.assert_array_equal(back.view(np.uint8), x.view(np.uint8))
    assert buf.to_bytes() == x.tobytes()
    other = ex.allocate((37,), name)
    other.from_bytes(x[::-1].copy().tobytes())
    buf.copy_from(other)
    np.testing.assert_array_equal(np.asarray(buf.to_numpy()).view(np.uint8),
                                  x[::-1].copy().view(np.uint8))
    buf.fill(1)
    assert (np.asarray(buf.to_numpy()).astype(np.float64) == 1).all()
    grid = buf.reshape(37, 1)
    assert grid.shape == (37, 1) and grid.isa_dtype is d
    for z in (buf, other):
        z.free()
    empty = ex.allocate((0, 3), name)  # zero-size: nothing to copy, nothing launched
    empty.from_numpy(np.zeros((0, 3), d.np_dtype))
    assert np.asarray(empty.to_numpy()).shape == (0, 3)
    empty.free()


def _program(d: DType):
    """A program that exercises ``d``'s arithmetic, a reduction and a cast out."""
    if d.kind == "f":
        return b.program(lambda x, y: (((x * y + x) / 3.0).exp() - y,
                                       (x.minimum(y) * 2.0).sum(axis=1)),
                         [(d.name, (5, 7)), (d.name, (5, 7))])
    if d.kind == "i":
        return b.program(lambda x, y: ((x + y) * x ^ y, (x & y).max(axis=1),
                                       x.cast("f64")),
                         [(d.name, (5, 7)), (d.name, (5, 7))])
    return b.program(lambda x, y: ((x & ~y) | (x ^ y), (x ^ y).cast("f32")),
                     [(d.name, (5, 7)), (d.name, (5, 7))])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", NAMES)
def test_a_program_over_buffers_of_each_dtype(executors, backend, name):
    d = hg.isa.dtypes.to_dtype(name)
    ex = _executor(executors, backend, d)
    if ex is None:
        return
    p = _program(d)
    if backend == "webgpu" and any(od.name not in WGSL_STORES for od, _ in p.output_specs):
        p = b.program(lambda x, y: x * y + x, [(name, (5, 7))] * 2)  # i32/u32: no f64 out
    seed = zlib.crc32(f"{backend}{name}".encode())
    xs = [_values(d, 35, seed + i).reshape(5, 7) for i in range(2)]
    ins = [ex.allocate((5, 7), name).from_numpy(x) for x in xs]
    outs = [ex.allocate(shape, od.name) for od, shape in p.output_specs]
    ex.run(p, ins, outs)
    want, _ = evaluate(p, xs)
    for o, w in zip(outs, want, strict=True):
        got = np.asarray(o.to_numpy())
        assert got.dtype == w.dtype
        if o.isa_dtype.is_float:
            g64, w64 = got.astype(np.float64), w.astype(np.float64)
            # 16-bit floats: the sum adds in float (kernels) or the dtype (NumPy)
            tol = 2.0**-5 if d.itemsize == 2 else 1e-5
            np.testing.assert_allclose(g64, w64, rtol=tol, atol=tol, equal_nan=True)
        else:
            np.testing.assert_array_equal(got, w)
    for z in ins + outs:
        z.free()


def test_bf16_without_ml_dtypes_says_what_to_install():
    """``import hologram`` works without ml_dtypes; a bf16 buffer then names it."""
    code = ("import sys; sys.modules['ml_dtypes'] = None\n"
            "import hologram as hg\n"
            "from hologram.errors import DTypeError\n"
            "ex = hg.Executor('cpu'); ex.allocate(4, 'f32').free()\n"
            "try:\n    ex.allocate(4, 'bf16')\n"
            "except DTypeError as e:\n    print('refused:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert "refused:" in out and "ml-dtypes" in out and "bf16" in out


def test_bf16_reads_back_as_float32_exactly(executors):
    """What README documents: a bf16 buffer's values widen to float32 exactly, and its
    bytes are the upper halves of float32 bits."""
    if bf16.np_dtype is None:
        pytest.skip("bf16 needs ml_dtypes")
    x = np.array([1.5, -2.25, 3.0e38, np.inf, 1e-40], np.float32)
    buf = executors["cpu"].allocate(5, "bf16").from_numpy(x.astype(bf16.np_dtype))
    wide = np.asarray(buf.to_numpy()).astype(np.float32)
    raw = np.frombuffer(buf.to_bytes(), np.uint16).astype(np.uint32) << 16
    np.testing.assert_array_equal(raw.view(np.float32), wide)
    np.testing.assert_array_equal(wide[:2], x[:2])


@pytest.mark.parametrize("name", ["i64", "u8", "bool", "f16", "f64",
                                  pytest.param("bf16", marks=pytest.mark.skipif(
                                      bf16.np_dtype is None, reason="bf16 needs ml_dtypes"))])
def test_handle_api_allocates_every_dtype(name):
    e = ffi.new_executor()
    try:
        h = ffi.executor_allocate_buffer(e, 4, name)
        if name == "i64":
            big = [2**62 + 1, -(2**63), 7, 2**53 + 1]  # exact: not through float64
            ffi.buffer_copy_from_slice(e, h, json.dumps(big))
            assert json.loads(ffi.buffer_to_vec(e, h)) == big
            with pytest.raises(ParseError, match="element 0"):
                ffi.buffer_copy_from_slice(e, h, "[0.5]")
        elif name == "u8":
            ffi.buffer_copy_from_slice(e, h, "[255, 0, 3]")
            assert json.loads(ffi.buffer_to_vec(e, h))[:3] == [255, 0, 3]
            with pytest.raises(ParseError, match="256"):
                ffi.buffer_copy_from_slice(e, h, "[256]")
        elif name == "bool":
            ffi.buffer_copy_from_slice(e, h, "[1, 0, 1, 1]")
            assert json.loads(ffi.buffer_to_vec(e, h)) == [1, 0, 1, 1]
        else:
            ffi.buffer_copy_from_slice(e, h, "[1.5, -2.0, Infinity, NaN]")
            back = json.loads(ffi.buffer_to_vec(e, h))
            assert back[:3] == [1.5, -2.0, float("inf")] and np.isnan(back[3])
        raw = ffi.buffer_to_bytes(e, h)
        assert len(raw) == 4 * hg.isa.dtypes.to_dtype(name).itemsize
        ffi.buffer_copy_from_bytes(e, h, raw)
        assert ffi.buffer_to_bytes(e, h) == raw
        ffi.buffer_cleanup(h)
    finally:
        ffi.executor_cleanup(e)
