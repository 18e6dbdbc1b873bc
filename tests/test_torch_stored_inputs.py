"""Integer and bool graph inputs read in their own dtype under ``torch.compile``.

A program reads an int64 (int32, int16, int8, uint8) or bool tensor's memory as it is
and casts it to its carrier (f64, bool) as its first instruction, so a call converts
nothing on the host (``compile_backend._stored_dtypes``). Checked against eager on fresh
random values (negative, large, zero-size, non-contiguous), with a count of the host
path's calls; a backend whose memory cannot hold a dtype (WebGPU and bool) keeps the
host conversion."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from hologram.errors import DTypeError  # noqa: E402
from hologram.isa import dtypes  # noqa: E402
from hologram_torch import compile_backend as cb  # noqa: E402

INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


@pytest.fixture
def host_calls(monkeypatch):
    """How many inputs went through the host's view-or-convert path (``_host_array``)."""
    calls = []
    real = cb._host_array

    def counting(t, spec):
        calls.append(spec)
        return real(t, spec)

    monkeypatch.setattr(cb, "_host_array", counting)
    return calls


def _ints(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    lo, hi = (0, 256) if dtype is torch.uint8 else (-100, 100)
    return torch.randint(lo, hi, shape, generator=g, dtype=torch.int64).to(dtype)


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
def test_integer_inputs_are_read_in_place_and_match_eager(dtype, host_calls):
    def fn(x, i):
        return x * i + (i > 3).to(x.dtype) + i.sum()

    compiled = torch.compile(fn, backend="hologram", dynamic=False)
    for seed in range(3):  # fresh values each call through the same program
        x = torch.randn(6, 7, generator=torch.Generator().manual_seed(seed))
        i = _ints(dtype, (6, 7), seed)
        with cb.collect_graphs() as graphs:
            got = compiled(x, i)
        torch.testing.assert_close(got, fn(x, i), rtol=1e-6, atol=1e-6)
    assert not graphs or all(not g.torch_ops for g in graphs)
    assert host_calls == [], "an integer input was converted on the host"


def test_bool_and_label_inputs_of_a_training_step_are_read_in_place(host_calls):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 5))
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 5))
    ref.load_state_dict(model.state_dict())

    def loss_of(m):
        def loss(x, y, keep):
            return F.cross_entropy(m(x).masked_fill(~keep, -5.0), y)
        return loss

    compiled = torch.compile(loss_of(model), backend="hologram", dynamic=False)
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(12, 8, generator=g)
        y = torch.randint(0, 5, (12,), generator=g)
        keep = torch.rand(12, 5, generator=g) > 0.3
        got, want = compiled(x, y, keep), loss_of(ref)(x, y, keep)
        got.backward()
        want.backward()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        for a, b in zip(model.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)
    assert host_calls == [], "a label or mask input was converted on the host"


def test_non_contiguous_and_empty_integer_inputs(host_calls):
    def fn(x, i):
        return x + i

    compiled = torch.compile(fn, backend="hologram", dynamic=False)
    base = _ints(torch.int64, (5, 8), 1)
    i = base[:, ::2]  # strided: viewed or copied on the host, as any such input
    x = torch.randn(5, 4)
    torch.testing.assert_close(compiled(x, i), fn(x, i))
    assert host_calls, "a strided input must take the host path"
    torch._dynamo.reset()
    e = torch.empty(0, 3, dtype=torch.int32)
    torch.testing.assert_close(torch.compile(fn, backend="hologram")(torch.randn(0, 3), e),
                               torch.randn(0, 3) + e)


def test_large_int64_values_survive_as_exactly_as_before():
    """The carrier is f64 either way: values below 2**53 are exact."""
    def fn(i):
        return i * 2

    i = torch.tensor([2**52 + 1, -(2**52) - 3, 0, 7], dtype=torch.int64)
    got = torch.compile(fn, backend="hologram", dynamic=False)(i)
    assert got.dtype is torch.int64
    assert torch.equal(got, i * 2)


class _NoBoolMemory:
    """A backend whose memory cannot hold bool (as WebGPU's cannot)."""

    def check_buffer_dtype(self, d):
        if d is dtypes.boolean:
            raise DTypeError("bool: no 1-byte bool here")


def test_a_backend_without_bool_memory_keeps_bool_inputs_converted():
    stored = cb._stored_dtypes(_NoBoolMemory())
    assert torch.bool not in stored
    assert stored[torch.int64] is dtypes.i64
    region = cb._Region(0, stored=stored)

    class Node:  # what load reads of an FX node: its traced value
        meta = {"val": torch.zeros(3, dtype=torch.bool)}

    region.load(Node(), cb.TInfo(torch.bool, (3,)))
    assert region.inputs[0].convert and region.inputs[0].isa is dtypes.f32


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_precision_graphs_run_in_programs_and_say_so(dtype):
    """What the README says of bf16/f16 models: they run in programs (read and written
    in their own dtype, carried as f32, each op's result rounded), explain counts the
    programs and no op in PyTorch, and the results are eager's to a unit in the last
    place (the GEMMs' sums run in another order)."""
    from hologram_torch.explain import explain

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                                torch.nn.Linear(32, 4)).to(dtype)
    x = torch.randn(8, 16).to(dtype)
    with torch.no_grad():
        got = torch.compile(model, backend="hologram")(x)
        want = model(x)
        report = explain(model, x)
    assert got.dtype is dtype
    ulp = torch.finfo(dtype).eps * float(want.abs().max())
    torch.testing.assert_close(got, want, rtol=0, atol=ulp)
    assert report.programs >= 1 and not report.torch_ops
