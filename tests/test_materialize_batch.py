"""A rendering pass names every value that needs a buffer at once (``render_c``:
``BATCH_MATERIALIZE``), so scheduling re-plans once per pass rather than once per value.

A ResNet-18 training step planned its two programs 125 times, one value per pass (23.7
s of lowering in a 41 s first step), and 9 times with every step of a pass asking
(1.8 s); the programs' C is the same either way (docs/perf.md, session 22). Here: a
small CNN's training graphs, both ways, in one process.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import hologram  # noqa: E402
import hologram_torch  # noqa: E402, F401  (registers the backend)
from hologram.backends import cpu  # noqa: E402
from hologram.compiler import lower as lower_mod  # noqa: E402
from hologram.compiler import render_c  # noqa: E402

PLAN, LOWER = lower_mod.plan, cpu.lower  # before any test wraps them


def _compile_training_graphs(monkeypatch: pytest.MonkeyPatch, batch: bool
                             ) -> tuple[list[str], int]:
    """(the C of every program a small CNN's forward and backward lower to, plans)."""
    monkeypatch.setattr(render_c, "BATCH_MATERIALIZE", batch)
    plans, sources = [0], []

    def counted_plan(*a, **k):
        plans[0] += 1
        return PLAN(*a, **k)

    def recorded_lower(*a, **k):
        low = LOWER(*a, **k)
        sources.append(low.source)
        return low

    monkeypatch.setattr(lower_mod, "plan", counted_plan)
    monkeypatch.setattr(cpu, "lower", recorded_lower)
    # compiled programs are kept per executor by hash: lower both ways
    monkeypatch.setattr(hologram.default_executor("cpu"), "_kernels", {})
    torch._dynamo.reset()
    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))
    x = torch.randn(2, 3, 10, 10)
    torch.compile(model, backend="hologram")(x).sum().backward()
    torch._dynamo.reset()
    return sources, plans[0]


def test_one_pass_names_every_value_and_the_programs_stay_the_same(monkeypatch):
    one_at_a_time, plans_before = _compile_training_graphs(monkeypatch, False)
    batched, plans_after = _compile_training_graphs(monkeypatch, True)
    assert len(batched) >= 2  # the forward and the backward
    assert sorted(batched) == sorted(one_at_a_time)
    assert plans_after < plans_before / 2, (plans_after, plans_before)
