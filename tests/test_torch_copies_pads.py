"""The ``*_copy`` forms of views, pixel/channel shuffles and replication padding's backward
under ``torch.compile(backend="hologram")``: a copy stored by the program (the views
themselves are PyTorch's), against eager on non-contiguous inputs with NaN, and the
padding gradient's SCATTER_ADDs for positive and negative (cropping) pads."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from .test_torch_index import _check, _randn  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def test_view_copies_are_stored_by_the_program():
    x = _randn(4, 3, 5, seed=1).transpose(0, 2)  # [5, 3, 4], strided
    x[0, 0, 0] = float("nan")

    def fn(x):
        # each term [5, 4]
        return (torch.permute_copy(x, (2, 0, 1)).sum(2).t() + torch.t_copy(x[:, 0]).t()
                + torch.unsqueeze_copy(x, 1)[:, 0, 1] + torch.view_copy(x, (5, 12))[:, :4]
                + torch.narrow_copy(x, 1, 1, 1).squeeze(1) + torch.unbind_copy(x, 1)[2])

    graphs = _check(fn, x, ops={"aten.permute_copy", "aten.t_copy", "aten.view_copy",
                                "aten.unsqueeze_copy", "aten.narrow_copy", "aten.unbind_copy"})
    assert all(g.regions for g in graphs if g.kind == "forward")


def test_pixel_and_channel_shuffle():
    x = _randn(2, 8, 3, 5, seed=2).transpose(2, 3)  # [2, 8, 5, 3], strided
    _check(lambda x: F.pixel_unshuffle(F.pixel_shuffle(x, 2) * 2.0, 2) + F.channel_shuffle(x, 4),
           x, ops={"aten.pixel_shuffle", "aten.pixel_unshuffle", "aten.channel_shuffle"})


@pytest.mark.parametrize("pad", [(2, 1), (1, 3, 2, 0), (-1, 2, 1, -1), (1, 1, 0, 2, 1, 1)])
def test_replication_pad_backward(pad):
    shape = {2: (2, 3, 6), 4: (2, 3, 5, 4), 6: (1, 2, 3, 4, 5)}[len(pad)]
    x = _randn(*shape, seed=3)
    _check(lambda x: F.pad(x, pad, mode="replicate").exp(), x,
           ops={f"aten.replication_pad{len(pad) // 2}d_backward"})


def test_as_strided_scatter_and_overlapping_positions():
    x, src = _randn(4, 4, seed=4), _randn(2, 3, seed=5)
    _check(lambda x, s: torch.as_strided_scatter(x, s, (2, 3), (5, 1), 2) * 2.0, x, src,
           ops={"aten.as_strided_scatter"})
    torch._dynamo.reset()
    # positions that overlap (stride 0): PyTorch's error, raised by PyTorch (the node is
    # left to it), never a silent choice of which write wins
    f = torch.compile(lambda x, s: torch.as_strided_scatter(x, s, (2, 2), (0, 1)),
                      backend="hologram", dynamic=False)
    for run in (f, torch.as_strided_scatter):
        with pytest.raises(RuntimeError, match="more than one element"):
            run(x, src[:, :2]) if run is f else run(x, src[:, :2], (2, 2), (0, 1))
