"""The seeds' backend selection (``hologram.backend.BackendType``, ``validate_backend``)
and raw-pointer access of the handle API (``buffer_as_ptr``/``buffer_as_mut_ptr``)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import hologram as hg
import hologram_ffi as ffi
from hologram import ffi as ffi_impl
from hologram.backend import BackendType, validate_backend
from hologram.backends import registry
from hologram.backends.cuda_device import DEVICE_ENV
from hologram.errors import (
    ArgumentTypeError,
    BackendUnavailableError,
    BufferStateError,
    HandleError,
)


def test_backend_type_names_every_backend():
    assert {b.value for b in BackendType} == {"cpu", "cuda", "metal", "webgpu", "reference"}
    assert set(registry.REGISTRY) == {b.value for b in BackendType}
    assert BackendType.CUDA == "cuda" and str(BackendType.CPU) == "cpu"


def test_validate_backend():
    assert validate_backend("CPU") == "cpu"
    assert validate_backend(" auto ") == "auto"
    assert validate_backend(BackendType.WEBGPU) == "webgpu"
    with pytest.raises(BackendUnavailableError, match="unknown backend 'tpu'"):
        validate_backend("tpu")
    with pytest.raises(ArgumentTypeError, match="backend"):
        validate_backend(3)


def test_executor_takes_a_backend_type(monkeypatch):
    with hg.Executor(backend=BackendType.REFERENCE) as ex:
        assert ex.backend_name == "reference"
    monkeypatch.setenv(DEVICE_ENV, "emulated")
    if registry.why_unavailable("cuda") is not None:
        pytest.skip(registry.why_unavailable("cuda"))
    with hg.Executor(backend=BackendType.CUDA) as ex:
        assert ex.backend_name == "cuda"


def _read(address: int, n: int) -> np.ndarray:
    return np.ctypeslib.as_array((ctypes.c_float * n).from_address(address)).copy()


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_buffer_pointers_reach_the_buffer(monkeypatch, backend):
    if backend == "cuda":  # device pointers are host addresses only on the emulated device
        monkeypatch.setenv(DEVICE_ENV, "emulated")
        if registry.why_unavailable("cuda") is not None:
            pytest.skip(registry.why_unavailable("cuda"))
    e = ffi.new_executor_with_backend(backend)
    try:
        h = ffi.executor_allocate_buffer(e, 5)
        ffi.buffer_copy_from_slice(e, h, "[1, 2, 3, 4, 5]")
        ptr = ffi.buffer_as_ptr(e, h)
        assert ptr == ffi.buffer_as_mut_ptr(e, h) and ptr % 4 == 0
        np.testing.assert_array_equal(_read(ptr, 5), [1, 2, 3, 4, 5])
        ctypes.memmove(ptr, np.array([9.5], np.float32).ctypes.data, 4)
        assert ffi.buffer_to_vec(e, h).startswith("[9.5")
        ffi.buffer_cleanup(h)
        with pytest.raises(HandleError):
            ffi.buffer_as_ptr(e, h)
    finally:
        ffi.executor_cleanup(e)


def test_pointers_refused_for_freed_and_read_only_buffers():
    e = ffi.new_executor_with_backend("cpu")
    try:
        ex = ffi_impl._executor(e)
        frozen = np.arange(4, dtype=np.float32)
        frozen.flags.writeable = False
        h = ffi_impl._register_buffer(e, ex.wrap(frozen))
        assert ffi.buffer_as_ptr(e, h) == frozen.ctypes.data
        with pytest.raises(BufferStateError, match="read-only"):
            ffi.buffer_as_mut_ptr(e, h)
        h2 = ffi.executor_allocate_buffer(e, 3)
        ffi_impl._buffer(e, h2).free()  # freed behind the handle's back
        for f in (ffi.buffer_as_ptr, ffi.buffer_as_mut_ptr):
            with pytest.raises(BufferStateError, match="freed"):
                f(e, h2)
    finally:
        ffi.executor_cleanup(e)
