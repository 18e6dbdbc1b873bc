"""Winograd's transformed weights in inference graphs: computed apart, kept while the
weight is unchanged (``hologram_torch/derived_inputs.py``).

Each case compiles 3x3 convolutions that take the Winograd path (batch 2 or more, 7x7
or more outputs, float32), counts how often the transform program ran, and checks the
results against eager after every change a user can make to a weight: an in-place op
under ``no_grad``, a new tensor through ``.data``, a fresh weight per call,
``inference_mode`` (no version counter), and ``pack_weights=False``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import hologram as hg  # noqa: E402
from hologram_torch import derived_inputs  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture
def transforms(monkeypatch):
    """Every DerivedInput made while the test runs."""
    if "C via" not in hg.default_executor("cpu").backend.describe():
        pytest.skip("no C compiler: the cpu backend is the reference interpreter")
    made: list[derived_inputs.DerivedInput] = []
    init = derived_inputs.DerivedInput.__init__

    def record(self, *a, **k):
        init(self, *a, **k)
        made.append(self)

    monkeypatch.setattr(derived_inputs.DerivedInput, "__init__", record)
    torch._dynamo.reset()  # Sequential.forward's compiled entries count toward a limit
    yield made
    torch._dynamo.reset()


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.Conv2d(16, 16, 3, padding=1, bias=False))


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_the_transform_runs_once_while_the_weight_is_unchanged(transforms):
    net = _net()
    x = torch.randn(2, 8, 12, 12)
    f = torch.compile(net, backend="hologram")
    with torch.no_grad():
        for _ in range(3):
            _close(f(x), net(x))
        assert len(transforms) == 2 and [d.runs for d in transforms] == [1, 1]
        net[0].weight.mul_(-0.5)  # in place: the version counter moves
        _close(f(x), net(x))
        assert [d.runs for d in transforms] == [2, 1]
        net[2].weight.data = torch.randn_like(net[2].weight)  # another tensor
        _close(f(x), net(x))
        _close(f(x), net(x))
        assert [d.runs for d in transforms] == [2, 2]


def test_a_fresh_weight_per_call_is_transformed_per_call(transforms):
    f = torch.compile(lambda x, w: F.conv2d(x, w, padding=1), backend="hologram")
    x = torch.randn(3, 4, 9, 9)
    with torch.no_grad():
        for _ in range(3):
            w = torch.randn(6, 4, 3, 3)
            _close(f(x, w), F.conv2d(x, w, padding=1))
    assert [d.runs for d in transforms] == [3]


def test_inference_mode_tensors_are_transformed_every_call(transforms):
    net = _net()
    x = torch.randn(2, 8, 10, 10)
    with torch.inference_mode():
        f = torch.compile(net, backend="hologram")
        for _ in range(2):
            _close(f(x), net(x))
    # parameters made outside inference mode keep their counter; the kept transforms
    # are reused for them
    assert transforms and all(d.runs == 1 for d in transforms)
    with torch.inference_mode():
        w = torch.randn(16, 8, 3, 3)  # an inference tensor: no version counter
        g = torch.compile(lambda x, w: F.conv2d(x, w, padding=1), backend="hologram")
        for _ in range(2):
            _close(g(x, w), F.conv2d(x, w, padding=1))
    assert transforms[-1].runs == 2


def test_training_graphs_and_pack_weights_false_transform_inline(transforms):
    net = _net()
    x = torch.randn(2, 8, 10, 10)
    f = torch.compile(net, backend="hologram")
    f(x).sum().backward()  # a training graph: its weights change every step
    g = torch.compile(_net(), backend="hologram", options={"pack_weights": False})
    with torch.no_grad():
        _close(g(x), net(x))
    assert transforms == []


def test_compiled_shapes_share_one_kept_transform_which_dies_with_its_weight(transforms):
    import gc

    net = _net()
    f = torch.compile(net, backend="hologram", dynamic=False)
    with torch.no_grad():
        for batch in (2, 3, 2, 3):  # two compiled shapes, each its own programs
            x = torch.randn(batch, 8, 10, 10)
            _close(f(x), net(x))
    assert len(transforms) == 4  # two convolutions per compiled shape
    assert sum(d.runs for d in transforms) == 2  # one transform per weight
    assert derived_inputs.kept_bytes() > 0
    del f, net
    torch._dynamo.reset()
    gc.collect()
    assert derived_inputs.kept_bytes() == 0


def test_the_reference_executor_runs_derived_inputs_too(transforms):
    net = _net()
    x = torch.randn(2, 8, 8, 8)
    f = torch.compile(net, backend="hologram", options={"executor": "reference"})
    with torch.no_grad():
        for _ in range(2):
            _close(f(x), net(x))
    assert len(transforms) == 2 and all(d.runs == 1 for d in transforms)
