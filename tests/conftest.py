"""Hypothesis profiles: "ci" (bounded, the default, and what CI=1 selects) and "long"
(HYPOTHESIS_PROFILE=long, for the figures in docs/reliability.md)."""

import os

import pytest
from hypothesis import HealthCheck, settings

# derandomize: CI draws the same examples every run, so a red run is reproducible
# and a green one is not luck ("long" explores fresh draws).
settings.register_profile(
    "ci", max_examples=100, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
settings.register_profile(
    "long", max_examples=20_000, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or "ci"
)


@pytest.fixture
def fresh_dynamo():
    """torch.compile's caches reset before and after the test, so each test traces and
    compiles its own graphs, and hologram_torch's fallback log kept to errors (a test
    that needs a fallback's message asserts on it instead)."""
    import logging

    torch = pytest.importorskip("torch")
    torch._dynamo.reset()
    logging.getLogger("hologram_torch").setLevel(logging.ERROR)
    yield
    torch._dynamo.reset()


@pytest.fixture(scope="session")
def native_cpu():
    """The cpu executor when it compiles C; tests of the native backend skip without it
    (with no C compiler the cpu backend is the reference interpreter)."""
    import hologram as hg

    e = hg.default_executor("cpu")
    if "C via" not in e.backend.describe():
        pytest.skip("no C compiler: the cpu backend is the reference interpreter")
    return e



@pytest.fixture(scope="module")
def emulated_cuda():
    """An executor on the emulated CUDA device (CUDA C compiled for the host), one per
    test module."""
    import hologram as hg

    from .cuda_env import cuda_device

    with cuda_device("emulated"):
        ex = hg.Executor("cuda")
        yield ex
        ex.close()


# torchvision (a test dependency: the CNNs of tests/test_torch_cnn.py) is imported here,
# before any test imports transformers, which imports torchvision when it is installed
# and fails with it where torchvision's wheel does not match torch's build
# (hologram_torch/torchvision_import.py).
try:
    from hologram_torch.torchvision_import import import_torchvision
except ImportError:  # torch not installed: the torch tests skip themselves
    pass
else:
    import_torchvision()


@pytest.fixture(scope="module")
def webgpu_ex():
    """A webgpu executor for the module's tests (closed after them); they skip where
    wgpu finds no adapter, saying why."""
    import hologram as hg
    from hologram.backends import registry

    reason = registry.why_unavailable("webgpu")
    if reason is not None:
        pytest.skip(f"webgpu unavailable: {reason}")
    with hg.Executor("webgpu") as e:
        yield e
