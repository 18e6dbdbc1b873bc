"""Packed B operands (MKL's ``cblas_?gemm_pack``/``_compute``, compiler/blas.py ``pack``) and
the torch.compile backend's packed constant weights (hologram_torch/packed_weights.py).

Results are checked against NumPy in float64 on fresh random inputs (NaN and inf too);
what matters most is that a packed copy is never stale: an in-place update of the
weight, a new tensor at the same address, or a weight moved by ``.data =`` between calls
all give the new result. Without MKL the backend offers no pack sites; the tests that
need packing skip (CI does not install MKL), the others check that nothing packs.
"""

from __future__ import annotations

import copy
import ctypes
import gc
import threading

import numpy as np
import pytest

import hologram as hg
from hologram.compiler import blas
from hologram.isa.builder import program
from hologram.memory.address import data_pointer

CAN_PACK = (blas.provider()[0] is not None and blas.provider()[0].pack is not None)
needs_pack = pytest.mark.skipif(
    not CAN_PACK, reason=f"the BLAS cannot pack B: {blas.describe()} (with MKL installed, "
    "test_blas_provider runs this file again under HOLOGRAM_BLAS=mkl)")


DEFAULT_GROWTH = blas.PACK_MAX_GROWTH


@pytest.fixture(autouse=True)
def _any_growth(monkeypatch):
    """These tests check packed copies' results and lifetimes on small shapes, whose
    copies MKL pads far past PACK_MAX_GROWTH: the cap is lifted (the test of the cap
    puts the default back)."""
    monkeypatch.setattr(blas, "PACK_MAX_GROWTH", float("inf"))


def _ex():
    return hg.default_executor("cpu")


def _compile(fn, specs):
    ex = _ex()
    c = ex.compile(program(fn, specs))
    return ex.backend, c


def _ref(x, w, trans):
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    return x64 @ (w64.T if trans else w64)


def _close(got, want, k):
    tol = (1e-5 if got.dtype == np.float32 else 1e-12) * max(1, k)
    scale = max(1.0, float(np.nanmax(np.abs(want[np.isfinite(want)]), initial=0)))
    np.testing.assert_allclose(got, want, rtol=0, atol=tol * scale, equal_nan=True)


CASES = [(2, 5, 3, "f32", True), (8, 768, 768, "f32", True), (33, 17, 65, "f64", False),
         (128, 96, 1000, "f32", False), (300, 40, 20, "f64", True), (16, 1, 37, "f32", True),
         (16, 24, 2 * blas.CALL_MAX_COLS + 100, "f32", True)]  # tiles no wider than a call


@needs_pack
@pytest.mark.parametrize("m,k,n,dt,trans", CASES)
def test_packed_product_matches_numpy(m, k, n, dt, trans):
    """x @ w.T (the models' layout) and x @ w, with an epilogue after the product; the
    packed launch agrees with float64 NumPy and with the same launch unpacked."""
    npdt = np.float32 if dt == "f32" else np.float64
    wshape = (n, k) if trans else (k, n)
    fn = (lambda x, w: x @ w.T * 2.0 + 1.0) if trans else (lambda x, w: x @ w * 2.0 + 1.0)
    be, c = _compile(fn, [(dt, (m, k)), (dt, wshape)])
    sites = be.pack_sites(c)
    assert [s.input for s in sites] == [1]
    launch = be.pointer_launcher(c)
    rng = np.random.default_rng(m * 7 + n)
    x = rng.standard_normal((m, k)).astype(npdt)
    w = rng.standard_normal(wshape).astype(npdt)
    w.flat[rng.integers(0, w.size)] = np.nan
    x.flat[rng.integers(0, x.size)] = np.inf
    want = _ref(x, w, trans) * 2.0 + 1.0
    packed = be.pack(c, 0, data_pointer(w))
    assert packed is not None and data_pointer(packed) % 64 == 0
    got = np.empty((m, n), npdt)
    launch([data_pointer(x), data_pointer(w), data_pointer(got)], [data_pointer(packed)])
    _close(got, want, k)
    plain = np.empty((m, n), npdt)
    launch([data_pointer(x), data_pointer(w), data_pointer(plain)])
    _close(plain, want, k)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))


@needs_pack
def test_packed_operand_read_through_a_window_of_the_input():
    """B is a slice of the input (an offset and a leading dimension that is not n)."""
    m, k, n = 24, 40, 50
    be, c = _compile(lambda x, w: x @ w.slice((3, 5), (k, n)), [("f32", (m, k)),
                                                                  ("f32", (k + 3, n + 9))])
    rng = np.random.default_rng(3)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((k + 3, n + 9)).astype(np.float32)
    [site] = be.pack_sites(c)
    assert site.desc.b.offset == 3 * (n + 9) + 5 and site.desc.b.ld == n + 9
    packed = be.pack(c, 0, data_pointer(w))
    got = np.empty((m, n), np.float32)
    be.pointer_launcher(c)([data_pointer(x), data_pointer(w), data_pointer(got)],
                           [data_pointer(packed)])
    _close(got, x.astype(np.float64) @ w[3:3 + k, 5:5 + n].astype(np.float64), k)


@needs_pack
def test_a_copy_packed_for_another_product_is_not_used():
    """The driver checks a packed copy's header against its own product; one made for
    another shape (or no copy at all: NULL) leaves the GEMM reading B as it is."""
    k, n = 64, 48
    rng = np.random.default_rng(5)
    w = rng.standard_normal((n, k)).astype(np.float32)
    be, c8 = _compile(lambda x, w: x @ w.T, [("f32", (8, k)), ("f32", (n, k))])
    _, c16 = _compile(lambda x, w: x @ w.T, [("f32", (16, k)), ("f32", (n, k))])
    other = be.pack(c8, 0, data_pointer(w * 3))  # wrong rows, and wrong values
    x = rng.standard_normal((16, k)).astype(np.float32)
    got = np.empty((16, n), np.float32)
    be.pointer_launcher(c16)([data_pointer(x), data_pointer(w), data_pointer(got)],
                             [data_pointer(other)])
    _close(got, _ref(x, w, True), k)
    junk = np.zeros(4096, np.uint8)  # not a packed copy at all
    be.pointer_launcher(c16)([data_pointer(x), data_pointer(w), data_pointer(got)],
                             [data_pointer(junk)])
    _close(got, _ref(x, w, True), k)


@needs_pack
def test_a_launch_without_packed_copies_reads_b_itself_after_one_with():
    """The pointer launcher keeps its table between launches: a launch given no packed
    copy must clear the slot the launch before filled, or it reads a stale B."""
    m, k, n = 16, 32, 24
    be, c = _compile(lambda x, w: x @ w.T, [("f32", (m, k)), ("f32", (n, k))])
    launch = be.pointer_launcher(c)
    rng = np.random.default_rng(9)
    x, w, w2 = (rng.standard_normal(s).astype(np.float32) for s in ((m, k), (n, k), (n, k)))
    packed = be.pack(c, 0, data_pointer(w))
    got = np.empty((m, n), np.float32)
    launch([data_pointer(x), data_pointer(w), data_pointer(got)], [data_pointer(packed)])
    _close(got, _ref(x, w, True), k)
    launch([data_pointer(x), data_pointer(w2), data_pointer(got)])
    _close(got, _ref(x, w2, True), k)


@needs_pack
def test_wrong_number_of_packed_addresses_is_an_error():
    be, c = _compile(lambda x, w: x @ w.T, [("f32", (8, 16)), ("f32", (12, 16))])
    x, w, out = (np.ones(s, np.float32) for s in ((8, 16), (12, 16), (8, 12)))
    with pytest.raises(ValueError, match="expected 1 packed-operand address"):
        be.pointer_launcher(c)([data_pointer(x), data_pointer(w), data_pointer(out)], [0, 0])


@needs_pack
def test_a_copy_much_larger_than_its_weight_is_not_made(monkeypatch):
    """MKL reserves a block per packed tile: a 512x512 f32 weight packed for 128 rows asks
    for several times its 1 MB, and no copy is made (the product reads B as it is); with
    the cap lifted the same product packs."""
    monkeypatch.setattr(blas, "PACK_MAX_GROWTH", DEFAULT_GROWTH)
    be, c = _compile(lambda x, w: x @ w.T, [("f32", (128, 512)), ("f32", (512, 512))])
    w = np.ones((512, 512), np.float32)
    lib = blas._runtime_lib(be.cc)
    s = blas._struct(c.packs[0].desc)
    size = lib.hg_gemm_pack_size(ctypes.byref(s), lib.hg_gemm_pack_tiles(ctypes.byref(s)))
    assert size > blas.PACK_MAX_GROWTH * w.nbytes  # MKL 2026.2: 22x (four column tiles)
    assert be.pack(c, 0, data_pointer(w)) is None
    monkeypatch.setattr(blas, "PACK_MAX_GROWTH", size / w.nbytes)
    packed = be.pack(c, 0, data_pointer(w))
    assert packed is not None and packed.nbytes == size


def test_what_gets_no_pack_site():
    """One row (a matrix-vector product: packing measured slower), a batch of products,
    a B computed inside the program, an empty product (folded to a constant): none."""
    be, _ = _compile(lambda x, w: x @ w, [("f32", (4, 4)), ("f32", (4, 4))])
    specs = [
        (lambda x, w: x @ w.T, [("f32", (1, 16)), ("f32", (12, 16))]),
        (lambda x, w: x @ w, [("f32", (3, 8, 16)), ("f32", (3, 16, 12))]),
        (lambda x, w: x @ (w * 2.0), [("f32", (8, 16)), ("f32", (16, 12))]),
        (lambda x, w: x @ w, [("f32", (8, 0)), ("f32", (0, 12))]),
    ]
    for fn, sp in specs:
        _, c = _compile(fn, sp)
        assert be.pack_sites(c) == []
    _, c = _compile(lambda x, w: x @ w, [("f32", (8, 16)), ("f32", (16, 12))])
    assert len(be.pack_sites(c)) == (1 if CAN_PACK else 0)
    with pytest.raises(IndexError, match="pack site 1 out of range"):
        be.pack(c, 1, 1)


# --- torch.compile: packed constant weights ---------------------------------------------
torch = pytest.importorskip("torch")


class _Spy:
    """Counts the packed copies made (blas.pack calls that returned a copy)."""

    def __init__(self, monkeypatch):
        self.made = 0
        real = blas.pack

        def pack(*args):
            out = real(*args)
            self.made += out is not None
            return out

        monkeypatch.setattr(blas, "pack", pack)


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(48, 96), torch.nn.GELU(),
                               torch.nn.Linear(96, 40)).eval()


def _compiled(model, **options):
    import hologram_torch  # noqa: F401

    torch._dynamo.reset()
    return torch.compile(model, backend="hologram", options=options or None)


def _check(y, model, x):
    """``y`` against ``model``'s current weights in float64 (on a copy: converting the
    model itself would move its weights)."""
    with torch.no_grad():
        want = copy.deepcopy(model).double()(x.double()).float()
    torch.testing.assert_close(y, want, atol=2e-5, rtol=2e-5)


@needs_pack
def test_inference_packs_weights_once_and_sees_in_place_updates(monkeypatch):
    spy = _Spy(monkeypatch)
    model = _mlp()
    f = _compiled(model)
    x = torch.randn(16, 48)
    with torch.no_grad():
        for _ in range(3):
            _check(f(x), model, x)
        assert spy.made == 2  # both weights, on the second call, once
        model[0].weight.mul_(-2.0)  # in place: the version counter moves
        _check(f(x), model, x)
        model[2].weight[3:7].zero_()  # through a view: the same counter
        _check(f(x), model, x)
        model[0].weight.copy_(torch.randn(96, 48))
        _check(f(x), model, x)
        for _ in range(2):
            _check(f(x), model, x)
        assert spy.made > 2  # the changed weights were packed again


@needs_pack
def test_weight_moved_by_data_assignment_is_repacked(monkeypatch):
    _Spy(monkeypatch)
    model = _mlp()
    f = _compiled(model)
    x = torch.randn(16, 48)
    with torch.no_grad():
        for _ in range(3):
            _check(f(x), model, x)
        model[2].weight.data = torch.randn(40, 96)  # a new address, same object
        for _ in range(3):
            _check(f(x), model, x)


@needs_pack
def test_new_tensor_at_the_same_address_is_not_mistaken_for_the_old(monkeypatch):
    """Weights passed as arguments, over one NumPy buffer: a new tensor object at the
    old address with version 0 (as the old one had) must not reuse the old copy."""
    spy = _Spy(monkeypatch)
    f = _compiled(lambda x, w: torch.nn.functional.linear(x, w))
    rng = np.random.default_rng(1)
    buf = rng.standard_normal((64, 32)).astype(np.float32)
    x = torch.randn(8, 32)
    with torch.no_grad():
        w = torch.from_numpy(buf)
        for _ in range(3):
            torch.testing.assert_close(f(x, w), x @ w.T, atol=1e-5, rtol=1e-5)
        assert spy.made == 1
        old_version = w._version
        del w
        gc.collect()
        buf[:] = rng.standard_normal((64, 32))  # new contents, written behind torch's back
        w2 = torch.from_numpy(buf)
        assert w2.data_ptr() == buf.ctypes.data and w2._version == old_version
        for _ in range(3):
            torch.testing.assert_close(f(x, w2), x @ w2.T, atol=1e-5, rtol=1e-5)
        w3 = torch.from_numpy(buf)  # the same again while w2 is alive
        buf[:] = rng.standard_normal((64, 32))
        torch.testing.assert_close(f(x, w3), x @ w3.T, atol=1e-5, rtol=1e-5)


def test_activations_and_training_graphs_never_pack(monkeypatch):
    """A B operand that is a new tensor every call is never packed (it would be packed
    for nothing); training graphs update their weights every step and never pack."""
    spy = _Spy(monkeypatch)
    f = _compiled(lambda x, y: x @ y)
    with torch.no_grad():
        for _ in range(4):
            x, y = torch.randn(16, 24), torch.randn(24, 32)
            torch.testing.assert_close(f(x, y), x @ y, atol=1e-5, rtol=1e-5)
    model = _mlp().train()
    g = _compiled(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        g(torch.randn(16, 48)).square().mean().backward()
        opt.step()
    assert spy.made == 0


def test_pack_weights_option(monkeypatch):
    spy = _Spy(monkeypatch)
    model = _mlp()
    f = _compiled(model, pack_weights=False)
    x = torch.randn(16, 48)
    with torch.no_grad():
        for _ in range(3):
            _check(f(x), model, x)
    assert spy.made == 0
    with pytest.raises(Exception, match="pack_weights must be True or False"):
        _compiled(model, pack_weights="yes")(x)


@needs_pack
def test_concurrent_inference_with_changing_weights(monkeypatch):
    """Threads run the compiled model while the main thread keeps replacing a weight
    between rounds: every result matches the weights of its round."""
    spy = _Spy(monkeypatch)
    model = _mlp()
    f = _compiled(model)
    x = torch.randn(32, 48)
    errors: list[BaseException] = []
    with torch.no_grad():
        f(x)  # compiled here, once, not by three threads at the same time
        for _ in range(3):
            want = model(x)
            outs: list[torch.Tensor] = []

            def work(outs=outs):
                try:
                    with torch.no_grad():  # grad mode is per thread: an inference graph
                        for _ in range(5):
                            outs.append(f(x))
                except BaseException as e:  # noqa: BLE001 - reported below
                    errors.append(e)

            threads = [threading.Thread(target=work) for _ in range(3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert not errors, errors[0]
            for y in outs:
                torch.testing.assert_close(y, want, atol=2e-5, rtol=2e-5)
            model[0].weight.add_(0.5)
    assert spy.made >= 3  # packed, and packed again after each update


class _Heads(torch.nn.Module):
    """Two projections around a head split that BLAS cannot read in place (a permuted
    buffer reshaped back): that GEMM stays np.matmul, so the program launches through
    arrays, not raw addresses, and the packed copies must reach it that way too."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.a = torch.nn.Linear(32, 64, bias=False)
        self.b = torch.nn.Linear(64, 24, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bsz, seq, _ = x.shape
        h = self.a(x).view(bsz, seq, 4, 16).permute(0, 2, 1, 3) * 2.0
        return self.b(h.permute(0, 2, 1, 3).reshape(bsz * seq, 64))


@needs_pack
def test_packed_weights_reach_programs_launched_through_arrays(monkeypatch):
    spy = _Spy(monkeypatch)
    model = _Heads().eval()
    f = _compiled(model)
    x = torch.randn(2, 8, 32)
    with torch.no_grad():
        for _ in range(3):
            _check(f(x), model, x)
        assert spy.made >= 1
        model.a.weight.mul_(-1.5)
        model.b.weight[:, :5] = 0.25
        for _ in range(3):
            _check(f(x), model, x)
