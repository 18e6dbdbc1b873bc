"""GEMM results computed in place of their element-wise tail (compiler/schedule.py).

``relu(x @ w.T + b)`` stored needs no temp for the product: the GEMM writes the
output buffer and the tail (the GEMM's epilogue) rewrites each element there. Each
case runs through the compiled CPU backend and the reference interpreter, with NaN
and inf among the inputs, and checks which products lost their temp; the cases
include what must not go in place (a reduction or a transpose of the product, two
stored tails, two products meeting in one tail).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hologram as hg
from hologram.isa import builder as b

from .programs import check_products

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

M, K, N = 33, 17, 24


def _compiled_executor() -> hg.Executor:
    ex = hg.default_executor("cpu")
    if "C via" not in ex.backend.describe():
        pytest.skip("no C compiler: the cpu backend is the reference interpreter")
    return ex


def _check(fn, specs, seed: int = 0):
    """Compiled CPU against the reference interpreter; returns the compiled program."""
    ex = _compiled_executor()
    p = b.program(fn, specs)
    check_products(ex, p, specs, seed, K)
    return ex.compile(p)


SPECS = [("f32", (M, K)), ("f32", (N, K)), ("f32", (N,))]


def test_linear_relu_tail_writes_the_output():
    c = _check(lambda x, w, bias: (x @ w.T + bias).maximum(0.0), SPECS)
    assert c.temps == []  # the product went straight into the output


def test_gelu_tail_reads_the_product_several_times():
    def fn(x, w, bias):
        t = x @ w.T + bias
        return t * 0.5 * (1.0 + ((t + t * t * t * 0.044715) * 0.7978845608).tanh())

    c = _check(fn, SPECS)
    assert c.temps == []


def test_backward_mask_tail_into_a_temp_another_gemm_reads():
    # ReLU backward: mask(g @ w) is materialized for the next product and a column sum
    def fn(g, w, h):
        d = (h < 0.0).where(0.0, g @ w)
        return d.sum(axis=0), d.T @ h

    c = _check(fn, [("f32", (M, N)), ("f32", (N, K)), ("f32", (M, K))])
    assert len(c.temps) == 1  # d itself; the product g @ w shares its buffer


def test_two_products_in_one_tail_keep_one_temp():
    def fn(x, w, v):
        return x @ w.T - (x * 2.0) @ v.T

    c = _check(fn, [("f32", (M, K)), ("f32", (N, K)), ("f32", (N, K))])
    # x * 2 is a temp (a GEMM operand); of the products, one is in place
    assert [s for _, s in c.temps if s == (M, N)] == [(M, N)]


@pytest.mark.parametrize("name,fn", [
    ("reduced", lambda x, w: ((x @ w.T) - (x @ w.T).max(axis=1, keepdims=True), )),
    ("transposed tail", lambda x, w: ((x @ w.T).T * 2.0, )),
    ("two stored tails", lambda x, w: ((x @ w.T) + 1.0, (x @ w.T) * 2.0)),
])
def test_products_that_must_keep_their_own_buffer(name, fn):
    c = _check(fn, [("f32", (M, K)), ("f32", (M, K))])
    assert (M, M) in [s for _, s in c.temps]


def test_silu_tail_in_place_and_a_stored_product_needs_no_temp():
    silu = _check(lambda x, w: (x @ w.T).sigmoid() * (x @ w.T), [("f32", (M, K))] * 2)
    assert silu.temps == []
    stored = _check(lambda x, w: ((x @ w.T), (x @ w.T).exp()), [("f32", (M, K))] * 2)
    assert stored.temps == []  # the product lives in its own output


def test_broadcast_operand_still_in_place():
    # a batched product with a broadcast (stride-0 batch) operand: BLAS reads it in place
    # batch by batch; the tail still rewrites the output in place
    def fn(x, w, bias):
        return (x @ w.expand((3, K, N)) + bias).maximum(0.0)

    _check(fn, [("f32", (3, M, K)), ("f32", (K, N)), ("f32", (N,))])


TAILS = [lambda y, z: y + z, lambda y, z: y * z, lambda y, z: (y < z).where(y, z),
         lambda y, z: y.maximum(0.0), lambda y, z: y.tanh(), lambda y, z: y - z * 0.5]


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, len(TAILS) - 1),
                          st.integers(0, 3)), min_size=1, max_size=6),
       st.integers(0, 2**32 - 1))
def test_random_tails_match_reference(steps, seed):
    """Random element-wise tails over up to three products of the same inputs, with
    random values stored: whatever goes in place, the results match the reference."""
    def fn(x, w, v):
        prods = [x @ w.T, x @ v.T, (x * 0.5) @ w.T]
        vals = []
        outs = []
        for which, tail, keep in steps:
            y = prods[which] if not vals or keep == 3 else vals[-1]
            vals.append(TAILS[tail](y, prods[(which + 1) % 3]))
            if keep == 0:
                outs.append(vals[-1])
        return (*outs, vals[-1])

    _check(fn, [("f32", (M, K)), ("f32", (N, K)), ("f32", (N, K))], seed)


def test_epilogue_over_a_split_product_covers_each_tile_row_once():
    """A 1x1 convolution's product ``[C, H*W]`` viewed as ``[1, C, H, W]`` with a bias
    per channel: the canonical form runs the add over the product's own rows (the
    reshape sinks below it) and the output is a reshape of that. The per-tile epilogue
    must then step through the product's rows of H*W, not the view's rows of W: an
    epilogue that took W for its rows wrote H times past each tile (a heap overwrite
    that crashed the next allocation)."""
    import re

    def fn(w, x, bias):
        return (w @ x).reshape(1, 4, 7, 7) + bias.reshape(4, 1, 1).expand((1, 4, 7, 7))

    c = _check(fn, [("f64", (4, 4)), ("f64", (4, 49)), ("f64", (4,))])
    rows = re.findall(r"for \(int64_t o = lo(?: \* (\d+))?; o < hi.*?\n.*?\n"
                      r"(?:.*\n)*?for \(int64_t j = 0; j < (\d+);", c.source)
    assert rows, "no per-tile epilogue"
    for factor, length in rows:
        assert int(factor or 1) * int(length) == 49
