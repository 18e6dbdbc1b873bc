"""Temps sharing one scratch block by lifetime (compiler/temp_memory.py).

The oracle for "which temps does a step touch" is the C the CPU backend rendered:
every slot a step's functions name (``B[k]``) must be among the temps
``step_temps`` lists for it, so a temp the planner thinks is dead is never one a
kernel still reads. Then: no two temps whose lifetimes meet overlap in memory, and
programs whose temps share memory compute what the reference interpreter does."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hologram as hg
from hologram.compiler.render_c import gemm_step_name
from hologram.compiler.schedule import AttentionPlan, KernelPlan
from hologram.compiler.temp_memory import TEMP_ALIGNMENT, lifetimes, step_temps
from hologram.isa import builder as b
from hologram.isa import dtypes
from hologram.isa.builder import Var, ldg, stg
from hologram.isa.program import Program
from hologram.memory.output_cache import output_cache

from .programs import compiled_and_reference, programs, random_inputs

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@pytest.fixture(scope="module")
def ex(native_cpu: hg.Executor) -> hg.Executor:
    return native_cpu


_FUNCTION = re.compile(r"^(?:static )?(?:inline )?void (\w+)\(([^)]*)\)\s*\{(.*?)^\}",
                       re.M | re.S)
_SLOT = re.compile(r"\bB\[(\d+)\]")
_STEP_NAME = re.compile(r"^([a-z]+\d+)(?:_|$)")


def _rendered_temps(compiled) -> dict[str, set[int]]:
    """Step name -> the temps (by index) its C functions name: ``k4``, ``k4_rows`` and
    ``g0_epilogue`` all belong to their step."""
    low = compiled.lowered
    temp_of = {slot: ref.index for ref, slot in low.slots.items() if ref.kind == "tmp"}
    named: dict[str, set[int]] = {}
    for name, _, body in _FUNCTION.findall(low.source):
        m = _STEP_NAME.match(name)
        if m is None:
            continue
        slots = {int(k) for k in _SLOT.findall(body)}
        named.setdefault(m.group(1), set()).update(temp_of[s] for s in slots if s in temp_of)
    return named


def _check_layout(compiled) -> None:
    """Every temp a step's C names is one the planner counts as touched by that step,
    and temps alive at the same step never share a byte."""
    low = compiled.lowered
    sched = low.schedule
    rendered = _rendered_temps(compiled)
    for i, step in enumerate(sched.steps):
        name = step.name if isinstance(step, (KernelPlan, AttentionPlan)) else gemm_step_name(i)
        missing = rendered.get(name, set()) - step_temps(step, sched)
        assert not missing, f"step {i} ({name}) names temps {missing} the planner missed"
    layout = compiled.temp_layout
    if not sched.temps:
        return
    assert layout is not None
    fused = {i for i, st_ in enumerate(sched.steps)
             if isinstance(st_, KernelPlan) and f"{st_.name}_rows" in low.source}
    spans = lifetimes(sched, fused)
    extent = [(o, o + t.size * t.dtype.itemsize) for o, t in zip(layout.offsets, sched.temps,
                                                                 strict=True)]
    for a, (sa, (oa, ea)) in enumerate(zip(spans, extent, strict=True)):
        if sa is None:
            continue
        assert oa % TEMP_ALIGNMENT == 0 and ea <= layout.nbytes
        for c in range(a + 1, len(spans)):
            sc, (oc, ec) = spans[c], extent[c]
            if sc is None or oa == ea or oc == ec:
                continue
            if sa[0] <= sc[1] and sc[0] <= sa[1]:
                assert ea <= oc or ec <= oa, f"temps {a} and {c} live together and overlap"


SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@SETTINGS
@given(programs(dtype="f32", max_ops=12, gemm=True, attention=True), st.integers(0, 2**32 - 1))
def test_random_programs_layout_and_results(ex, case, seed):
    fn, specs = case
    p = b.program(fn, specs)
    _check_layout(ex.compile(p))
    got, want = compiled_and_reference(ex, p, random_inputs(specs, seed, special=False))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=1e-4, equal_nan=True)


def _layer_stack(layers: int, rows: int = 256, width: int = 256) -> tuple[Program, list]:
    """A stack of ``h = h + tanh(h @ w_l) * scale``, the shape of a residual network: each
    layer's product and activation are temps alive for a step or two."""
    x = Var(ldg(0, dtypes.f32, (rows, width)))
    h = x
    for layer in range(layers):
        w = Var(ldg(1 + layer, dtypes.f32, (width, width)))
        h = h + (h @ w).tanh() * (0.5 + 0.1 * layer)
    specs = [(dtypes.f32, (rows, width))] + [(dtypes.f32, (width, width))] * layers
    return Program([stg(h.v, 0)], specs), specs


def test_layer_stack_shares_temps_and_matches_numpy(ex):
    p, specs = _layer_stack(8)
    compiled = ex.compile(p)
    _check_layout(compiled)
    layout = compiled.temp_layout
    one = 256 * 256 * 4
    assert len(compiled.temps) >= 6
    # lifetimes of a layer or two: a few temps' worth, not one per layer
    assert layout.nbytes <= 4 * one < layout.separate_nbytes, (layout, len(compiled.temps))
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(s).astype(np.float32) / 16 for _, s in specs]
    want = xs[0].astype(np.float64)
    for layer, w in enumerate(xs[1:]):
        want = want + np.tanh(want @ w.astype(np.float64)) * (0.5 + 0.1 * layer)
    for _ in range(2):  # the second launch reuses the first one's block
        out = np.empty((256, 256), np.float32)
        ex.launch(p, xs, [out])
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)


def test_scratch_block_is_reused_between_launches(ex):
    p, specs = _layer_stack(4, rows=512, width=512)  # temps of 1 MiB: the cached size
    compiled = ex.compile(p)
    assert compiled.temp_layout.nbytes >= output_cache.min_bytes
    launch = ex.backend.pointer_launcher(compiled)
    if launch is None:
        pytest.skip("no BLAS the C program can call: GEMMs run as NumPy steps")
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(s).astype(np.float32) / 32 for _, s in specs]
    out = np.empty((512, 512), np.float32)
    from hologram.memory.address import data_pointer

    ptrs = [data_pointer(a) for a in (*xs, out)]
    launch(ptrs)
    first = out.copy()
    hits = output_cache.stats()["hits"]
    launch(ptrs)
    assert output_cache.stats()["hits"] > hits  # the block came back from the cache
    np.testing.assert_array_equal(out, first)  # and stale bytes in it changed nothing


def test_concurrent_pointer_launches_each_get_their_own_scratch(ex):
    """Small scratch blocks stay with their program between launches (a launch frame:
    table, block, error record); launches of one program from several threads at once
    must still each hold their own, or one thread's temps overwrite another's."""
    import threading

    from hologram.backends.cpu import FRAME_MAX_SCRATCH
    from hologram.memory.address import data_pointer

    p, specs = _layer_stack(3, rows=64, width=64)
    compiled = ex.compile(p)
    assert compiled.temps and compiled.temp_layout.nbytes < FRAME_MAX_SCRATCH  # pooled
    launch = ex.backend.pointer_launcher(compiled)
    if launch is None:
        pytest.skip("no BLAS the C program can call: GEMMs run as NumPy steps")
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        xs = [rng.standard_normal(s).astype(np.float32) / 8 for _, s in specs]
        want = xs[0].astype(np.float64)
        for layer, w in enumerate(xs[1:]):
            want = want + np.tanh(want @ w.astype(np.float64)) * (0.5 + 0.1 * layer)
        out = np.empty((64, 64), np.float32)
        try:
            for _ in range(40):
                out[...] = np.nan
                launch([data_pointer(a) for a in (*xs, out)])
                np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[0]
