"""The layout rules (``compiler/rules.py``'s ``LAYOUT_RULES``) on the programs they are
for: products viewed through split reshapes and permutes, element-wise tails with
constants and broadcast inputs, and the views back to another product or an output.
Compiled CPU against the reference interpreter, outputs between canary bytes, inputs
with NaN and inf; and the canonical form checked to have run the tail where the data
lies (what the rules promise)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import hologram as hg
from hologram.compiler.canonicalize import canonicalize
from hologram.isa import Op
from hologram.isa import builder as b

from .programs import compiled_and_reference, random_inputs, without_finite_overflow

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

TAILS = [
    lambda y, bias: y + bias,
    lambda y, bias: (y * 0.5).tanh(),
    lambda y, bias: y.maximum(0.0) * bias,
    lambda y, bias: y.exp() - 1.0,
    lambda y, bias: (y < bias).where(y, bias * 2.0),
]


def _executor() -> hg.Executor:
    ex = hg.default_executor("cpu")
    if "C via" not in ex.backend.describe():
        pytest.skip("no C compiler: the cpu backend is the reference interpreter")
    return ex


def _split(n: int, parts: int) -> tuple[int, ...]:
    """``n`` as ``parts`` factors (the first takes what does not divide)."""
    dims = []
    for _ in range(parts - 1):
        f = next((d for d in (2, 3, 5, 7) if n % d == 0 and n // d > 1), 1)
        dims.append(f)
        n //= f
    return (n, *dims[::-1])


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.sampled_from([(4, 6, 12), (8, 5, 30), (3, 7, 42), (6, 4, 1)]),
       st.integers(1, 3), st.booleans(), st.lists(st.integers(0, len(TAILS) - 1),
                                                  min_size=1, max_size=4),
       st.sampled_from(["channel", "last", "none"]), st.sampled_from(["gemm", "out", "both"]),
       st.integers(0, 2**32 - 1))
# a bias per row over a split product, stored: the epilogue that took the view's rows for
# the product's wrote past each tile (caught by the canaries)
@example((8, 5, 30), 2, False, [0], "channel", "out", 0)
def test_product_views_and_tails_match_reference(mkn, parts, permute, tails, bias_on, end,
                                                 seed):
    """A product ``[m, n]`` read as ``[m, *split(n)]`` (a 1x1 convolution's rows of H*W
    read as [C, H, W]), maybe with its first two axes swapped (channels and batch), an
    element-wise tail whose bias is per row, per last-axis element or absent, then the
    view back into a second product, the output, or both."""
    m, k, n = mkn
    view = (m, *_split(n, parts))
    perm = (1, 0, *range(2, len(view))) if permute and len(view) > 1 else None
    seen = tuple(view[i] for i in perm) if perm else view  # the tail's shape
    bias_shape = {"channel": (m,), "last": (seen[-1],), "none": (1,)}[bias_on]

    def fn(w, x, w2, bias):
        y = (w @ x).reshape(view)
        if perm:
            y = y.permute(*perm)
        shape = y.v.shape
        if bias_on == "channel":
            bb = bias.reshape(*(m if d == (1 if perm else 0) else 1 for d in range(len(shape))))
        else:
            bb = bias.reshape(*(1,) * (len(shape) - 1), bias_shape[0])
        bb = bb.expand(shape)
        for t in tails:
            y = TAILS[t](y, bb)
        back = y.permute(*perm) if perm else y
        outs = []
        if end in ("gemm", "both"):
            outs.append(w2 @ back.reshape(m, n))
        if end in ("out", "both"):
            outs.append(y)
        return tuple(outs)

    specs = [("f64", (m, k)), ("f64", (k, n)), ("f64", (3, m)), ("f64", bias_shape)]
    p = b.program(fn, specs)
    inputs = without_finite_overflow(random_inputs(specs, seed, special=True))
    got, want = compiled_and_reference(_executor(), p, inputs)
    for g, w_ in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w_, rtol=1e-9, atol=1e-9 * max(1, k), equal_nan=True)
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w_))


def test_gelu_between_two_products_over_the_batch_runs_on_the_product():
    """The ConvNeXt pattern the rules are for, as ``hologram_torch`` lowers two 1x1
    convolutions over a batch of 4 images of 5x5 with GELU (erf form) between: in the
    canonical form no permute or copy is left between the two products, and every
    element-wise op runs over the first product's own [C, B*H*W] shape."""
    b_, c, h, o = 4, 6, 5, 12

    def fn(x, w1, bias1, w2):
        cols = x.permute(1, 0, 2, 3).reshape(c, b_ * h * h)
        y = (w1 @ cols).reshape(o, b_, h, h).permute(1, 0, 2, 3)
        y = y + bias1.reshape(1, o, 1, 1).expand((b_, o, h, h))
        g = y * 0.5 * ((y * (1 / math.sqrt(2))).erf() + 1.0)
        cols2 = g.permute(1, 0, 2, 3).reshape(o, b_ * h * h)
        return w2 @ cols2

    specs = [("f32", (b_, c, h, h)), ("f32", (o, c)), ("f32", (o,)), ("f32", (c, o))]
    p = b.program(fn, specs)
    q, st_ = canonicalize(p)
    assert st_.rules.get("sink_permute", 0) >= 1 and st_.rules.get("sink_split_reshape", 0) >= 1
    gemms = [v for v in q.instructions if v.op is Op.GEMM]
    assert len(gemms) == 2
    between = []
    stack = [gemms[1].srcs[1]]
    while stack:
        v = stack.pop()
        if v is gemms[0] or v.op in (Op.LDG, Op.CONST):
            continue
        between.append(v)
        stack.extend(v.srcs)

    def reads_product(v):
        return v is gemms[0] or any(reads_product(s) for s in v.srcs)

    assert not any(v.op is Op.PERMUTE and reads_product(v) for v in between)
    assert all(v.shape == (o, b_ * h * h) for v in between
               if v.op not in (Op.RESHAPE, Op.EXPAND, Op.PERMUTE) and v.ndim)
    inputs = random_inputs(specs, 0, special=False)
    got, want = compiled_and_reference(_executor(), p, inputs)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
