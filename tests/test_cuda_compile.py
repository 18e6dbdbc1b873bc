"""Every CUDA kernel hologram renders compiles through NVRTC to sm_80 and sm_90 cubins
(Ampere and Hopper), with no GPU.

Covers the op library's programs, the composite suite and random test programs.
Skips (with the reason) where NVRTC is not installed: `pip install -e '.[cuda]'`.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hologram as hg
from hologram.compiler import nvrtc
from hologram.compiler.lower import lower
from hologram.compiler.render_cuda import render_cuda
from hologram.isa import builder as b
from hologram.ops import _run

from .programs import INT_DTYPES, int_programs, programs
from .test_fusion import CASES

pytestmark = pytest.mark.skipif(not nvrtc.available(), reason="NVRTC is not installed")
ARCHS = ("sm_80", "sm_90")


def compile_for_gpu(p: hg.Program) -> dict:
    launch: dict = {}

    def render(s, sl):
        src, lm = render_cuda(s, sl)
        launch.update(lm)
        return src

    low = lower(p, render)
    if any(hasattr(step, "sinks") for step in low.schedule.steps):
        for arch in ARCHS:
            cubin = nvrtc.compile_cubin(low.source, arch)
            assert cubin[:4] == b"\x7fELF"
    return launch


def _op_library_programs() -> list[hg.Program]:
    """Run every op once on the reference backend, then collect the programs it built."""
    ex = hg.Executor("reference")
    rng = np.random.default_rng(0)

    def buf(shape):
        return ex.allocate(shape).from_numpy(rng.random(shape))

    x, y, out = buf((4, 8)), buf((4, 8)), buf((4, 8))
    o = hg.ops
    for f in (o.vector_add, o.vector_sub, o.vector_mul, o.vector_div, o.vector_min,
              o.vector_max):
        f(ex, x, y, out)
    for f in (o.vector_abs, o.vector_neg, o.vector_relu, o.sigmoid, o.tanh, o.gelu):
        f(ex, x, out)
    o.gelu(ex, x, out, approximate="none")
    o.vector_clip(ex, x, out, 0.2, 0.8)
    o.scalar_add(ex, x, out, 1.5)
    o.scalar_mul(ex, x, out, -2.0)
    o.softmax(ex, x, out)
    o.log_softmax(ex, x, out, axis=0)
    scalar = ex.allocate(1)
    for f in (o.reduce_sum, o.reduce_max, o.reduce_min):
        f(ex, x, scalar)
        f(ex, x, ex.allocate(4), axis=1)
    for f in (o.mse_loss, o.binary_cross_entropy_loss, o.cross_entropy_loss):
        f(ex, x, y, scalar)
    o.gemm(ex, x, buf((8, 3)), ex.allocate((4, 3)))
    o.matvec(ex, x, buf(8), ex.allocate(4))
    ex.close()
    return list(_run._PROGRAMS.values())


def test_op_library_kernels_compile_for_sm90():
    progs = _op_library_programs()
    assert len(progs) >= 25
    for p in progs:
        compile_for_gpu(p)


@pytest.mark.parametrize("name", sorted(CASES))
def test_composite_kernels_compile_for_sm90(name):
    fn, specs, _ = CASES[name]
    launch = compile_for_gpu(b.program(fn, specs))
    assert all(kind in ("flat", "outer", "single") for kind, _ in launch.values())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(dtype="f32"))
def test_random_program_kernels_compile_for_sm90(case):
    fn, specs = case
    compile_for_gpu(b.program(fn, specs))


@settings(max_examples=24, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(INT_DTYPES).flatmap(lambda d: int_programs(dtype=d, max_ops=6)))
def test_random_int_program_kernels_compile_for_sm90(case):
    """int8 ... uint64 (NVRTC has no stdint.h: the prelude's typedefs), block reductions
    of 8/16-bit maxima in 32 bits (warp shuffles take nothing narrower)."""
    fn, specs = case
    compile_for_gpu(b.program(fn, specs))


def test_compile_errors_show_log_and_numbered_source():
    with pytest.raises(nvrtc.NVRTCError, match="   1 | "):
        nvrtc.compile_cubin('extern "C" __global__ void k() { undefined_thing(); }')


HALVES = ("f16", "bf16")


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("name", sorted(n for n in CASES if not n.startswith("gemm")))
def test_half_composite_kernels_compile(name, dtype):
    """f16/bf16 kernels spell their types with cuda_fp16.h/cuda_bf16.h (found through
    nvrtc.header_dir()), which NVRTC compiles for sm_80 and sm_90."""
    fn, specs, _ = CASES[name]
    p = b.program(fn, [(dtype, s) for _, s in specs])
    launch = compile_for_gpu(p)
    assert launch


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(HALVES).flatmap(lambda d: programs(dtype=d, max_ops=5)))
def test_random_half_program_kernels_compile(case):
    fn, specs = case
    compile_for_gpu(b.program(fn, specs))


def test_half_kernels_use_the_cuda_headers_types():
    p = b.program(lambda x, y: (x * y + x).exp().sum(), [("f16", (8,)), ("f16", (8,))])
    src = lower(p, lambda s, sl: render_cuda(s, sl)[0]).source
    assert "#include <cuda_fp16.h>" in src and "__half *" in src
    assert "_Float16" not in src and "__bf16" not in src
    q = b.program(lambda x: x.cast("bf16").tanh(), [("f32", (8,))])
    src = lower(q, lambda s, sl: render_cuda(s, sl)[0]).source
    assert "#include <cuda_bf16.h>" in src and "__nv_bfloat16 *" in src
