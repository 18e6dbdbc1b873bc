"""On a GPU only (scripts/gpu_check.sh): zero-copy DLPack import of ``torch.cuda``
tensors and CuPy arrays, and launches on PyTorch's current stream. The shared code ran
on the emulated device (tests/test_cuda_memory.py); these check what needs real device
memory: the producers' capsules and their stream handshake. Skipped without a GPU."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

import hologram as hg
from hologram.backends import registry
from hologram.backends.cuda_device import DEVICE_ENV
from hologram.isa import builder as b

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def gpu():
    if os.environ.get(DEVICE_ENV, "gpu") != "gpu" or not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU (and CUDA PyTorch)")
    reason = registry.why_unavailable("cuda")
    if reason is not None:
        pytest.skip(f"cuda unavailable: {reason}")
    with hg.Executor("cuda") as ex:
        yield ex


def test_torch_cuda_tensors_are_shared(gpu):
    x = torch.linspace(-3, 3, 1000, device="cuda")
    out = torch.zeros(1000, device="cuda")
    bx, bout = hg.from_dlpack(x, gpu), hg.from_dlpack(out, gpu)
    assert bx.pool == "external"
    p = b.program(lambda v: (v * 2.0).tanh(), [("f32", (1000,))])
    with gpu.use_stream(torch.cuda.current_stream().cuda_stream):
        gpu.run(p, [bx], [bout])
    torch.testing.assert_close(out, torch.tanh(x * 2), rtol=2e-6, atol=1e-6)  # in place
    out.fill_(7.0)  # and read in place (after PyTorch's stream has written it)
    torch.cuda.synchronize()
    assert float(bout.to_numpy()[0]) == 7.0


def test_cupy_arrays_are_shared(gpu):
    if importlib.util.find_spec("cupy") is None:
        pytest.skip("needs CuPy")
    import cupy

    a = cupy.arange(12, dtype=cupy.float32).reshape(3, 4)
    buf = hg.from_dlpack(a, gpu)
    a += 1
    cupy.cuda.get_current_stream().synchronize()
    np.testing.assert_array_equal(buf.to_numpy(), np.arange(1, 13).reshape(3, 4))
