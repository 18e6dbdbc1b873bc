"""The handle API (``hologram_ffi``) that old callers use: every wrapper against NumPy,
JSON and bytes transfer, and the handle rules (unknown, released, foreign)."""

from __future__ import annotations

import inspect
import json
import math
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import hologram
import hologram_ffi as hg
from hologram import ffi
from hologram.errors import (
    BackendUnavailableError,
    HandleError,
    HologramError,
    ParseError,
    ShapeError,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _clean_registries():
    yield
    hg.clear_all_registries()


@pytest.fixture
def ex() -> int:
    return hg.new_executor()


def put(e: int, x: np.ndarray) -> int:
    h = hg.executor_allocate_buffer(e, x.size)
    hg.buffer_copy_from_bytes(e, h, np.ascontiguousarray(x, dtype=np.float32).tobytes())
    return h


def get(e: int, h: int) -> np.ndarray:
    return np.frombuffer(hg.buffer_to_bytes(e, h), dtype=np.float32)


# --- every wrapper against NumPy ------------------------------------------------------
def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def _log_softmax(x: np.ndarray) -> np.ndarray:
    s = x - x.max()
    return s - np.log(np.exp(s).sum())


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


N = 1000
ELEMENTWISE_BINARY: dict[str, Callable[..., np.ndarray]] = {
    "vector_add_f32": np.add, "vector_sub_f32": np.subtract, "vector_mul_f32": np.multiply,
    "vector_div_f32": np.divide, "vector_min_f32": np.minimum, "vector_max_f32": np.maximum,
}
ELEMENTWISE_UNARY: dict[str, Callable[..., np.ndarray]] = {
    "vector_abs_f32": np.abs, "vector_neg_f32": np.negative,
    "vector_relu_f32": lambda x: np.maximum(x, 0), "sigmoid_f32": lambda x: 1 / (1 + np.exp(-x)),
    "tanh_f32": np.tanh, "gelu_f32": _gelu, "softmax_f32": _softmax,
    "log_softmax_f32": _log_softmax,
}
WITH_SCALARS: dict[str, tuple[tuple[float, ...], Callable[..., np.ndarray]]] = {
    "vector_clip_f32": ((-0.5, 0.75), lambda x, lo, hi: np.clip(x, lo, hi)),
    "scalar_add_f32": ((1.5,), lambda x, s: x + s),
    "scalar_mul_f32": ((-2.25,), lambda x, s: x * s),
}
REDUCTIONS: dict[str, Callable[..., float]] = {
    "reduce_sum_f32": np.sum, "reduce_min_f32": np.min, "reduce_max_f32": np.max,
}
LOSSES: dict[str, Callable[..., float]] = {
    "mse_loss_f32": lambda p, t: np.mean((p - t) ** 2),
    "binary_cross_entropy_loss_f32": lambda p, t: -np.mean(t * np.log(p) + (1 - t) * np.log(1 - p)),
    "cross_entropy_loss_f32": lambda p, t: -np.sum(t * _log_softmax(p)),
}
LINALG = ("gemm_f32", "matvec_f32")
TESTED = {*ELEMENTWISE_BINARY, *ELEMENTWISE_UNARY, *WITH_SCALARS, *REDUCTIONS, *LOSSES, *LINALG}


def test_every_op_has_a_wrapper_and_every_wrapper_a_test():
    wrapped = {name.removesuffix("_f32") for name in hg.OP_NAMES}
    assert wrapped == set(hologram.ops.__all__) - {"composites"}
    assert TESTED == set(hg.OP_NAMES)


@pytest.mark.parametrize("name", sorted(ELEMENTWISE_BINARY))
def test_binary_wrappers_match_numpy(ex: int, name: str):
    rng = np.random.default_rng(1)
    a = rng.standard_normal(N).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    if name == "vector_div_f32":
        b = np.where(np.abs(b) < 0.1, np.float32(0.5), b)
    ha, hb, hc = put(ex, a), put(ex, b), hg.executor_allocate_buffer(ex, N)
    assert getattr(hg, name)(ex, ha, hb, hc, N) is None
    np.testing.assert_allclose(get(ex, hc), ELEMENTWISE_BINARY[name](a, b), rtol=1e-6)


@pytest.mark.parametrize("name", sorted(ELEMENTWISE_UNARY))
def test_unary_wrappers_match_numpy(ex: int, name: str):
    a = np.random.default_rng(2).standard_normal(N).astype(np.float32) * 3
    ha, hc = put(ex, a), hg.executor_allocate_buffer(ex, N)
    getattr(hg, name)(ex, ha, hc, N)
    expected = ELEMENTWISE_UNARY[name](a.astype(np.float64))
    np.testing.assert_allclose(get(ex, hc), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(WITH_SCALARS))
def test_scalar_wrappers_match_numpy(ex: int, name: str):
    a = np.random.default_rng(3).standard_normal(N).astype(np.float32)
    scalars, ref = WITH_SCALARS[name]
    ha, hc = put(ex, a), hg.executor_allocate_buffer(ex, N)
    getattr(hg, name)(ex, ha, hc, *scalars, N)
    np.testing.assert_allclose(get(ex, hc), ref(a, *scalars), rtol=1e-6)


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reduction_wrappers_return_the_value(ex: int, name: str):
    a = np.random.default_rng(4).standard_normal(N).astype(np.float32)
    ha, hout = put(ex, a), hg.executor_allocate_buffer(ex, 1)
    value = getattr(hg, name)(ex, ha, hout, N)
    assert isinstance(value, float)
    assert value == pytest.approx(float(REDUCTIONS[name](a.astype(np.float64))), rel=1e-5,
                                  abs=1e-4)
    assert get(ex, hout)[0] == np.float32(value)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_loss_wrappers_match_numpy(ex: int, name: str):
    rng = np.random.default_rng(5)
    if name == "binary_cross_entropy_loss_f32":
        p = rng.uniform(0.05, 0.95, N).astype(np.float32)
        t = rng.uniform(0, 1, N).astype(np.float32)
    elif name == "cross_entropy_loss_f32":
        p = rng.standard_normal(N).astype(np.float32)
        t = _softmax(rng.standard_normal(N)).astype(np.float32)
    else:
        p, t = rng.standard_normal((2, N)).astype(np.float32)
    hp, ht, hout = put(ex, p), put(ex, t), hg.executor_allocate_buffer(ex, 3)
    value = getattr(hg, name)(ex, hp, ht, hout, N)
    assert isinstance(value, float)
    expected = float(LOSSES[name](p.astype(np.float64), t.astype(np.float64)))
    assert value == pytest.approx(expected, rel=1e-5)


def test_gemm_and_matvec_match_numpy(ex: int):
    rng = np.random.default_rng(6)
    m, k, n = 7, 5, 3
    A = rng.standard_normal((m, k)).astype(np.float32)
    B = rng.standard_normal((k, n)).astype(np.float32)
    hA, hB, hC = put(ex, A), put(ex, B), hg.executor_allocate_buffer(ex, m * n)
    hg.gemm_f32(ex, hA, hB, hC, m, k, n)
    np.testing.assert_allclose(get(ex, hC).reshape(m, n), A @ B, rtol=1e-5, atol=1e-6)

    x = rng.standard_normal(k).astype(np.float32)
    hx, hy = put(ex, x), hg.executor_allocate_buffer(ex, m)
    hg.matvec_f32(ex, hA, hx, hy, m, k)
    np.testing.assert_allclose(get(ex, hy), A @ x, rtol=1e-5, atol=1e-6)


def test_wrappers_take_keywords_and_numpy_ints(ex: int):
    a = np.arange(8, dtype=np.float32)
    ha, hc = put(ex, a), hg.executor_allocate_buffer(ex, 8)
    hg.vector_clip_f32(exec_handle=ex, a=ha, c=hc, min_val=2.0, max_val=5.0, n=np.int64(8))
    np.testing.assert_array_equal(get(ex, hc), np.clip(a, 2, 5))
    with pytest.raises(TypeError):
        hg.vector_add_f32(ex, ha, ha, hc)  # n is required, as in the original API


def test_n_uses_a_prefix_and_leaves_the_rest(ex: int):
    a = np.arange(10, dtype=np.float32)
    ha, hc = put(ex, a), hg.executor_allocate_buffer(ex, 10)
    hg.buffer_fill(ex, hc, -1.0)
    hg.vector_neg_f32(ex, ha, hc, 4)
    np.testing.assert_array_equal(get(ex, hc), [0, -1, -2, -3] + [-1] * 6)
    with pytest.raises(ShapeError, match="a: has 10 elements, needs 11"):
        hg.vector_neg_f32(ex, ha, hc, 11)


def test_wrappers_are_documented_module_functions():
    for name in hg.OP_NAMES:
        fn = getattr(hg, name)
        assert name in dir(hg) and name in hg.__all__
        assert fn.__name__ == name and fn.__module__ == "hologram.ffi"
        assert fn.__doc__ and f"hologram.ops.{name.removesuffix('_f32')}" in fn.__doc__
        params = list(inspect.signature(fn).parameters)
        assert params[0] == "exec_handle"
    assert list(inspect.signature(hg.gemm_f32).parameters) == [
        "exec_handle", "a", "b", "c", "m", "k", "n"]
    assert hg.__all__ == ffi.__all__
    assert all(hasattr(hg, n) for n in hg.__all__)


# --- transfer ---------------------------------------------------------------------------
def test_json_round_trip_keeps_nan_inf_and_every_float32(ex: int):
    specials = [math.nan, math.inf, -math.inf, -0.0, 0.0, 1e-45, -3.4028234663852886e38]
    rng = np.random.default_rng(7)
    values = np.concatenate([np.array(specials, np.float32),
                             rng.standard_normal(100).astype(np.float32) * 1e3])
    h = hg.executor_allocate_buffer(ex, values.size)
    text = json.dumps(values.tolist())
    assert "NaN" in text and "Infinity" in text
    hg.buffer_copy_from_slice(ex, h, text)
    out = hg.buffer_to_vec(ex, h)
    back = np.array(json.loads(out), dtype=np.float32)
    np.testing.assert_array_equal(back.view(np.uint32), values.view(np.uint32))


def test_json_shorter_list_writes_a_prefix_and_ints_are_accepted(ex: int):
    h = hg.executor_allocate_buffer(ex, 5)
    hg.buffer_fill(ex, h, 9.0)
    hg.buffer_copy_from_slice(ex, h, "[1, 2.5, -3]")
    assert json.loads(hg.buffer_to_vec(ex, h)) == [1.0, 2.5, -3.0, 9.0, 9.0]
    hg.buffer_copy_from_slice(ex, h, b"[7]")  # bytes of JSON text are JSON text
    assert json.loads(hg.buffer_to_vec(ex, h))[0] == 7.0
    hg.buffer_copy_from_slice(ex, h, "[1e39]")  # beyond float32: inf, as a cast gives
    assert json.loads(hg.buffer_to_vec(ex, h))[0] == math.inf


@pytest.mark.parametrize("text, error, match", [
    ("[1, 2,", ParseError, "not valid JSON"),
    ("", ParseError, "not valid JSON"),
    ("[1, 2] x", ParseError, "not valid JSON"),
    ('{"a": 1}', ShapeError, "JSON dict"),
    ("3.0", ShapeError, "JSON float"),
    ("[[1, 2]]", ShapeError, "nested list"),
    ('[1, "2"]', ParseError, 'element 1 is "2"'),
    ("[1, null]", ParseError, "element 1 is null"),
    ("[true]", ParseError, "element 0 is true"),
    ("[1, 1" + "0" * 400 + "]", ParseError, "element 1 is too large"),
    ("[1, 2, 3, 4, 5]", ShapeError, "has 5 values"),
])
def test_bad_json_raises_a_clear_value_error(ex: int, text: str, error: type, match: str):
    h = hg.executor_allocate_buffer(ex, 4)
    with pytest.raises(error, match=match) as info:
        hg.buffer_copy_from_slice(ex, h, text)
    assert isinstance(info.value, (HologramError, ValueError))
    assert "json_str" in str(info.value)


def test_json_argument_must_be_text(ex: int):
    h = hg.executor_allocate_buffer(ex, 2)
    with pytest.raises(TypeError, match="json.dumps"):
        hg.buffer_copy_from_slice(ex, h, [1.0, 2.0])


def test_bytes_round_trip_is_bit_exact(ex: int):
    bits = np.random.default_rng(8).integers(0, 2**32, 257, dtype=np.uint32)
    bits[:3] = [0x7FC00001, 0xFF800000, 0x80000000]  # a NaN payload, -inf, -0.0
    h = hg.executor_allocate_buffer(ex, bits.size)
    hg.buffer_copy_from_bytes(ex, h, bits.tobytes())
    assert hg.buffer_to_bytes(ex, h) == bits.tobytes()
    hg.buffer_copy_from_bytes(ex, h, memoryview(np.ones(2, np.float32)))  # a prefix
    assert get(ex, h)[:3].view(np.uint32).tolist() == [0x3F800000, 0x3F800000, 0x80000000]


def test_bad_bytes_raise(ex: int):
    h = hg.executor_allocate_buffer(ex, 2)
    with pytest.raises(ShapeError, match="whole number"):
        hg.buffer_copy_from_bytes(ex, h, b"\x00" * 5)
    with pytest.raises(ShapeError, match="has 12 bytes"):
        hg.buffer_copy_from_bytes(ex, h, b"\x00" * 12)
    with pytest.raises(TypeError, match="bytes-like"):
        hg.buffer_copy_from_bytes(ex, h, "abcd")


def test_fill_length_and_boundary_buffers(ex: int):
    h = hg.executor_allocate_buffer(ex, 6)
    assert hg.buffer_length(h) == 6
    hg.buffer_fill(ex, h, 0.0)
    hg.buffer_fill(ex, h, 2.5, 3)
    assert get(ex, h).tolist() == [2.5] * 3 + [0.0] * 3
    hg.buffer_fill(ex, h, 1e39, 1)  # beyond float32: inf, without a warning
    assert get(ex, h)[:2].tolist() == [math.inf, 2.5]
    with pytest.raises(ShapeError):
        hg.buffer_fill(ex, h, 1.0, 7)
    with pytest.raises(TypeError):
        hg.buffer_fill(ex, h, "1")

    hb = hg.executor_allocate_boundary_buffer(ex, 3, 48, 256)
    assert hg.buffer_length(hb) == 48 * 256 // 4
    hg.buffer_fill(ex, hb, 1.0)
    assert hg.reduce_sum_f32(ex, hb, h, hg.buffer_length(hb)) == 3072.0
    with pytest.raises(ShapeError, match="class_index"):
        hg.executor_allocate_boundary_buffer(ex, 96, 1, 256)


# --- handles ----------------------------------------------------------------------------
def test_executors_by_backend_name():
    for make in (hg.new_executor, hg.new_executor_auto):
        assert make() > 0
    e = hg.new_executor_with_backend("reference")
    a = put(e, np.array([1, -2], np.float32))
    hg.vector_relu_f32(e, a, a, 2)
    assert get(e, a).tolist() == [1.0, 0.0]
    with pytest.raises(BackendUnavailableError, match="nonsense"):
        hg.new_executor_with_backend("nonsense")


def test_handles_are_positive_and_never_reused(ex: int):
    h1 = hg.executor_allocate_buffer(ex, 4)
    hg.buffer_cleanup(h1)
    h2 = hg.executor_allocate_buffer(ex, 4)
    assert h2 > h1 > ex > 0
    hg.clear_all_registries()
    assert hg.new_executor() > h2
    with pytest.raises(HandleError, match=f"handle {h2} was released"):
        hg.buffer_length(h2)


def test_unknown_handles_raise_handle_error_naming_them(ex: int):
    h = hg.executor_allocate_buffer(ex, 4)
    with pytest.raises(HandleError, match="unknown executor handle 987654321"):
        hg.executor_allocate_buffer(987654321, 4)
    with pytest.raises(HandleError, match="b: unknown buffer handle 987654321"):
        hg.vector_add_f32(ex, h, 987654321, h, 4)
    with pytest.raises(HandleError, match=f"handle {h} is a buffer handle"):
        hg.buffer_to_vec(h, h)
    with pytest.raises(HandleError, match=f"handle {ex} is an executor handle"):
        hg.buffer_to_vec(ex, ex)
    with pytest.raises(HandleError, match="a handle is an int"):
        hg.buffer_to_vec(ex, "1")
    with pytest.raises(KeyError):  # HandleError is also a KeyError, for dict-style callers
        hg.buffer_length(-1)


def test_freed_handles_raise(ex: int):
    h = hg.executor_allocate_buffer(ex, 4)
    hg.buffer_cleanup(h)
    for call in (lambda: hg.buffer_to_vec(ex, h), lambda: hg.buffer_cleanup(h),
                 lambda: hg.vector_abs_f32(ex, h, h, 4), lambda: hg.buffer_length(h)):
        with pytest.raises(HandleError, match=f"buffer handle {h} was released"):
            call()


def test_a_buffer_of_another_executor_is_refused(ex: int):
    other = hg.new_executor()
    mine, theirs = hg.executor_allocate_buffer(ex, 4), hg.executor_allocate_buffer(other, 4)
    with pytest.raises(HandleError, match=f"buffer handle {theirs} belongs to executor handle"):
        hg.vector_add_f32(ex, mine, theirs, mine, 4)
    with pytest.raises(HandleError, match=f"buffer handle {theirs}"):
        hg.buffer_copy_from_slice(ex, theirs, "[1]")


def test_executor_cleanup_invalidates_its_buffers_only(ex: int):
    other = hg.new_executor()
    bufs = [hg.executor_allocate_buffer(ex, 4) for _ in range(3)]
    kept = put(other, np.ones(4, np.float32))
    hg.executor_cleanup(ex)
    for h in bufs:
        with pytest.raises(HandleError, match=f"executor handle {ex} was released"):
            hg.buffer_to_vec(ex, h)
        with pytest.raises(HandleError, match=f"buffer handle {h} was released"):
            hg.buffer_to_vec(other, h)
        with pytest.raises(HandleError, match=f"buffer handle {h} was released"):
            hg.buffer_cleanup(h)
    with pytest.raises(HandleError, match=f"executor handle {ex} was released"):
        hg.executor_allocate_buffer(ex, 4)
    with pytest.raises(HandleError):
        hg.executor_cleanup(ex)
    assert get(other, kept).tolist() == [1.0] * 4


def test_clear_all_registries_closes_everything():
    e = hg.new_executor()
    h = hg.executor_allocate_buffer(e, 4)
    hg.clear_all_registries()
    with pytest.raises(HandleError):
        hg.buffer_length(h)
    with pytest.raises(HandleError):
        hg.executor_cleanup(e)


def test_handles_from_many_threads_are_unique(ex: int):
    got: list[int] = []
    lock = threading.Lock()

    def work() -> None:
        hs = [hg.executor_allocate_buffer(ex, 16) for _ in range(50)]
        with lock:
            got.extend(hs)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got)) == 200


# --- the guide's example ----------------------------------------------------------------
def test_seeds_example_runs_unchanged():
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "seeds_integration.py")],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Result: [0.0, 3.0, 6.0, 9.0" in proc.stdout
    assert "Match: True" in proc.stdout
    assert "FAIL" not in proc.stdout
