"""The CUDA device a test module runs on, set for the module and restored after."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest

from hologram.backends import registry
from hologram.backends.cuda_device import DEVICE_ENV


@contextlib.contextmanager
def cuda_device(kind: str = "emulated") -> Iterator[None]:
    """``HOLOGRAM_CUDA_DEVICE=kind`` inside, the old value (or none) after, also when
    the device cannot open and the module is skipped."""
    old = os.environ.get(DEVICE_ENV)
    os.environ[DEVICE_ENV] = kind
    try:
        reason = registry.why_unavailable("cuda")
        if reason is not None:
            pytest.skip(f"{kind} cuda unavailable: {reason}")
        yield
    finally:
        if old is None:
            os.environ.pop(DEVICE_ENV, None)
        else:
            os.environ[DEVICE_ENV] = old


def use_emulated(monkeypatch: pytest.MonkeyPatch) -> None:
    """The emulated device for one test (``monkeypatch`` restores the variable), or a
    skip where it cannot open."""
    monkeypatch.setenv(DEVICE_ENV, "emulated")
    reason = registry.why_unavailable("cuda")
    if reason is not None:
        pytest.skip(f"emulated cuda unavailable: {reason}")


@contextlib.contextmanager
def cuda_executors(configs: list[tuple[int, str]]) -> Iterator[list[tuple[object, str]]]:
    """One cuda executor per (threads per block, thread order), closed after."""
    import hologram as hg

    exs = []
    for threads, order in configs:
        ex = hg.Executor("cuda")
        ex.backend.threads_per_block = threads
        exs.append((ex, order))
    try:
        yield exs
    finally:
        for ex, _ in exs:
            ex.close()
