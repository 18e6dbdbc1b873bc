"""Element-wise values several instructions read are stored once when recomputing them
would read several full-size buffers (``schedule.shared_recomputations``).

A transformer's residual stream is the case: inlined, every layer norm recomputed it
from all earlier layers' outputs. These tests check which values the rule stores, that
small or single-reader values stay inline, and that results still agree with the
reference interpreter on fresh inputs with NaN and inf.
"""

from __future__ import annotations

import numpy as np
import pytest

import hologram as hg
from hologram.compiler import schedule
from hologram.isa import builder as b
from hologram.ops import composites as C

from .programs import compiled_and_reference

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

ROWS, D = 512, 128  # 64K elements per activation: at the rule's size floor


def _residual_stack(x, w1, w2, w3):
    h = x
    outs = []
    for w in (w1, w2, w3):
        h = h + (C.layer_norm(h, None, None, axes=(1,)) @ w)
        outs.append(C.layer_norm(h, None, None, axes=(1,)))
    return tuple(outs)


def _program(rows: int = ROWS):
    specs = [("f32", (rows, D))] + [("f32", (D, D))] * 3
    return b.program(_residual_stack, specs)


def _chosen(p) -> set[int]:
    users = schedule.users_of(p)
    return schedule.shared_recomputations(p, users, {}, set())


def test_residual_sums_are_stored_once() -> None:
    p = _program()
    chosen = _chosen(p)
    # the residual sums after the second and third GEMM read several full-size buffers
    # (the earlier residual, the product): stored. The first (x + product) too.
    assert len(chosen) >= 2
    assert all(v.op.value in ("add",) for v in p.instructions if id(v) in chosen)


def test_small_values_stay_inline() -> None:
    assert _chosen(_program(rows=8)) == set()  # 1K elements: a kernel costs more


def test_single_reader_stays_inline() -> None:
    p = b.program(lambda x, y, z: ((x + y + z) * 2.0,), [("f32", (ROWS, D))] * 3)
    assert _chosen(p) == set()


def test_results_agree_with_the_reference(native_cpu: hg.Executor) -> None:
    p = _program()
    rng = np.random.default_rng(3)
    x = rng.standard_normal((ROWS, D)).astype(np.float32)
    x[0, 0], x[1, 1] = np.nan, np.inf
    ws = [(rng.standard_normal((D, D)) * 0.1).astype(np.float32) for _ in range(3)]
    got, want = compiled_and_reference(native_cpu, p, [x, *ws])
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5)
