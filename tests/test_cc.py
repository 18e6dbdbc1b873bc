"""The C compiler driver: kernels compile, load and run through ctypes; compile errors
show the command, the log and the numbered source; libm calls become libmvec vector
calls; and IEEE special values survive the flags we chose."""

from __future__ import annotations

import ctypes
import math
import multiprocessing as mp
import os
import re
from pathlib import Path

import numpy as np
import pytest

import hologram.compiler.cc as ccmod
from hologram.compiler.cc import (
    C_PRELUDE,
    KERNEL_CACHE,
    CCompiler,
    CompileError,
    cpu_features,
    numbered,
)
from hologram.errors import HologramError


@pytest.fixture(autouse=True)
def private_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Every test builds into its own cache, never the user's."""
    d = tmp_path / "cache"
    monkeypatch.setenv("HOLOGRAM_CACHE_DIR", str(d))
    return d


@pytest.fixture
def cc() -> CCompiler:
    found = CCompiler.find()
    if found is None:
        pytest.skip("no working C compiler on this machine")
    return found


def ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def call_unary(lib: ctypes.CDLL, name: str, x: np.ndarray) -> np.ndarray:
    y = np.empty_like(x)
    fn = getattr(lib, name)
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64], None
    fn(ptr(x), ptr(y), x.size)
    return y


def unary_kernels(names: dict[str, tuple[str, str]]) -> str:
    """One vectorisable loop per entry: name -> (C type, expression of x[i])."""
    out = [C_PRELUDE]
    for name, (t, expr) in names.items():
        out.append(f"void {name}(const {t} *restrict x, {t} *restrict y, int64_t n) {{\n"
                   "#pragma omp simd\n"
                   f"  for (int64_t i = 0; i < n; i++) y[i] = {expr};\n}}")
    return "\n".join(out) + "\n"


def test_numbered() -> None:
    assert numbered("a\nb") == "   1 | a\n   2 | b"
    assert numbered("\n".join("x" * 12345)).splitlines()[-1] == "12345 | x"


def test_cpu_features_are_flag_names() -> None:
    feats = cpu_features()
    assert isinstance(feats, list) and all(isinstance(f, str) and f for f in feats)
    assert feats == cpu_features()  # stable: it is part of the cache key


def test_no_compiler_found(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty PATH: nothing to find
    assert CCompiler.find(refresh=True) is None


def test_broken_cc_env_falls_through(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "broken-cc"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    found = CCompiler.find(refresh=True)
    assert found is None or found.path != str(fake)


def test_flags_keep_ieee(cc: CCompiler) -> None:
    for banned in ("-ffast-math", "-ffinite-math-only", "-fno-signed-zeros", "-Ofast",
                   "-freciprocal-math", "-fassociative-math", "-funsafe-math-optimizations"):
        assert banned not in cc.flags
    assert cc.available and cc.flags and "-lm" in cc.libs
    if cc.family == "gcc":
        assert {"-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off"} <= set(cc.flags)
    assert cc.id.startswith(cc.path)


def test_compile_and_call(cc: CCompiler, private_cache: Path) -> None:
    src = C_PRELUDE + """
void add(void **B, int64_t n) {
  const float *a = (const float *)B[0], *b = (const float *)B[1];
  float *c = (float *)B[2];
#pragma omp parallel for simd if(n > 100000)
  for (int64_t i = 0; i < n; i++) c[i] = a[i] + b[i];
}
"""
    lib = cc.compile(src, {"program": "test-add"})
    for n in (0, 1, 37, 200_001):  # empty, scalar tail, vector + tail, threaded
        a = np.arange(n, dtype=np.float32)
        b = np.full(n, 0.5, np.float32)
        c = np.empty(n, np.float32)
        table = (ctypes.c_void_p * 3)(ptr(a), ptr(b), ptr(c))
        lib.add.argtypes, lib.add.restype = [ctypes.c_void_p, ctypes.c_int64], None
        lib.add(table, n)
        np.testing.assert_array_equal(c, a + b)
    # the same kernel again: the very same loaded library, no rebuild
    assert cc.compile(src, {"program": "test-add"}) is lib
    assert len(list(private_cache.glob("*.so"))) >= 1


def test_disk_cache_is_used_across_processes(cc: CCompiler, monkeypatch) -> None:
    src = unary_kernels({"neg": ("float", "-x[i]")})
    cc.compile(src, {"program": "test-neg"})
    monkeypatch.setattr(ccmod, "_LOADED", {})  # as a fresh process would start
    hits = KERNEL_CACHE.stats.hits
    lib = cc.compile(src, {"program": "test-neg"})
    assert KERNEL_CACHE.stats.hits == hits + 1
    x = np.array([1.0, -2.0, 0.0], np.float32)
    assert list(call_unary(lib, "neg", x)) == [-1.0, 2.0, -0.0]


def test_compile_error_shows_command_log_and_numbered_source(cc: CCompiler,
                                                             private_cache: Path) -> None:
    src = C_PRELUDE + "void broken(float *x) {\n  x[0] = undeclared_thing + ;\n}\n"
    with pytest.raises(CompileError) as info:
        cc.compile(src, {"program": "test-broken"})
    err = info.value
    assert isinstance(err, HologramError) and isinstance(err, RuntimeError)
    msg = str(err)
    bad_line = src.splitlines().index("  x[0] = undeclared_thing + ;") + 1
    assert f"{bad_line:4d} |   x[0] = undeclared_thing + ;" in msg  # numbered source
    assert "command:" in msg and cc.path in msg and "-O3" in msg
    assert "undeclared_thing" in err.log and "error" in err.log.lower()
    assert err.log.strip() in msg  # the full log, not a summary
    assert err.returncode not in (0, None) and err.command[0] == cc.command[0]
    assert list(private_cache.glob("*.so")) == []  # a failed build is never cached
    with pytest.raises(CompileError):  # and the next call tries again
        cc.compile(src, {"program": "test-broken"})


def test_link_error_is_a_compile_error(cc: CCompiler) -> None:
    """-Wl,-z,defs turns a missing symbol into a compile error, not a dlopen failure."""
    src = C_PRELUDE + "float nowhere(float);\nfloat f(float x) { return nowhere(x); }\n"
    with pytest.raises(CompileError, match="nowhere"):
        cc.compile(src, {"program": "test-link"})


def test_simd_prelude_calls_libmvec(cc: CCompiler, private_cache: Path) -> None:
    if cc.family != "gcc" or not cc.vector_math:
        pytest.skip("libmvec declarations apply to gcc on glibc x86-64")
    funcs = {"tanhf": "float", "expf": "float", "logf": "float", "erff": "float",
             "sinf": "float", "cosf": "float", "tanh": "double", "exp": "double",
             "log": "double", "erf": "double"}
    src = unary_kernels({f"k_{f}": (t, f"{f}(x[i])") for f, t in funcs.items()} | {
        "k_powf": ("float", "powf(x[i], x[i])"),
        # sin and cos of one argument: GCC would fuse them into scalar sincosf
        "k_sincosf": ("float", "sinf(x[i]) + cosf(x[i])"),
    })
    lib = cc.compile(src, {"program": "test-mvec"})
    so = next(p for p in private_cache.glob("*.so")
              if b"k_tanhf" in p.read_bytes()).read_bytes()
    for f in [*funcs, "powf"]:
        assert re.search(rb"_ZGV[bcde]N\d+v+_" + f.encode() + rb"\b", so), f
    x = np.linspace(-3, 3, 101, dtype=np.float32)
    np.testing.assert_allclose(call_unary(lib, "k_sincosf", x), np.sin(x) + np.cos(x),
                               rtol=1e-5, atol=1e-6)


SPECIALS = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0, -1.0, 0.5, 88.0, -88.0, 1e-30, -1e-30]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_ieee_special_values_survive(cc: CCompiler, dtype) -> None:
    """NaN, +-inf and -0.0 come out as NumPy's (the reason there is no -ffast-math);
    correctly rounded ops (+, /, sqrt) are bit-exact; libm calls are within 4 ulp."""
    t, f = ("float", "f") if dtype == np.float32 else ("double", "")
    exact = {  # IEEE-exact operations: NumPy's bits, no tolerance
        "k_neg": ("-x[i]", lambda x: -x),
        "k_add0": (f"x[i] + ({t})0", lambda x: x + dtype(0)),  # -0.0 + 0 is +0.0
        "k_div3": (f"x[i] / ({t})3", lambda x: x / dtype(3)),  # not x * (1/3)
        "k_recip": (f"({t})1 / x[i]", lambda x: dtype(1) / x),
        "k_sqrt": (f"sqrt{f}(x[i])", np.sqrt),
        "k_max0": (f"((x[i] > ({t})0 || x[i] != x[i]) ? x[i] : ({t})0)",
                   lambda x: np.maximum(x, dtype(0))),
        "k_cancel": (f"(x[i] + ({t})1e8) - ({t})1e8", lambda x: (x + dtype(1e8)) - dtype(1e8)),
    }
    erf = np.vectorize(lambda v: math.erf(v) if not math.isnan(v) else v, otypes=[dtype])
    libm = {  # vector libm: within 4 ulp, same special values
        "k_tanh": (f"tanh{f}(x[i])", np.tanh), "k_exp": (f"exp{f}(x[i])", np.exp),
        "k_log": (f"log{f}(x[i])", np.log), "k_erf": (f"erf{f}(x[i])", erf),
        "k_gelu": (f"({t})0.5 * x[i] * (({t})1 + tanh{f}(({t})0.7978845608 * "
                   f"(x[i] + ({t})0.044715 * x[i] * x[i] * x[i])))",
                   lambda x: dtype(0.5) * x * (1 + np.tanh(dtype(0.7978845608) * (
                       x + dtype(0.044715) * x * x * x)))),
    }
    src = unary_kernels({k: (t, e) for k, (e, _) in (exact | libm).items()})
    lib = cc.compile(src, {"program": f"test-ieee-{t}"})
    rng = np.random.default_rng(0)
    # specials plus random values: long enough for full vectors and a scalar tail
    x = np.concatenate([SPECIALS * 7, rng.standard_normal(301) * 10]).astype(dtype)
    with np.errstate(all="ignore"):
        for name, (_, ref) in exact.items():
            got, want = call_unary(lib, name, x), ref(x).astype(dtype)
            assert np.array_equal(got.view(f"u{x.itemsize}")[~np.isnan(want)],
                                  want.view(f"u{x.itemsize}")[~np.isnan(want)]), name
            assert np.array_equal(np.isnan(got), np.isnan(want)), name
        for name, (_, ref) in libm.items():
            got, want = call_unary(lib, name, x), ref(x).astype(dtype)
            assert np.array_equal(np.isnan(got), np.isnan(want)), name
            inf = np.isinf(want)
            assert np.array_equal(got[inf], want[inf]), name
            zero = want == 0
            assert np.array_equal(np.signbit(got[zero]), np.signbit(want[zero])), name
            finite = np.isfinite(want)
            eps = np.finfo(dtype).eps
            # GELU's 1 + tanh(...) cancels for negative x: an error of a few ulp in tanh
            # (both sides' libm) is scaled by 0.5|x|, not by the tiny result.
            atol = 4 * eps * np.abs(x[finite]) if name == "k_gelu" else np.finfo(dtype).tiny
            err = np.abs(got[finite].astype(np.float64) - want[finite])
            bound = 4 * eps * np.abs(want[finite].astype(np.float64)) + atol
            assert (err <= bound).all(), (name, x[finite][err > bound], err[err > bound])


def test_prelude_builds_without_libmvec(cc: CCompiler) -> None:
    """The fallback tier (no -DHG_LIBMVEC, no -lmvec) still builds the same kernels."""
    flags, libs = cc.tiers()[-2]  # optimised, no OpenMP, no vector math
    plain = CCompiler(cc.command, cc._version_text, flags=flags, libs=libs)
    lib = plain.compile(unary_kernels({"k": ("float", "tanhf(x[i])")}), {"program": "plain"})
    x = np.linspace(-4, 4, 33, dtype=np.float32)
    np.testing.assert_allclose(call_unary(lib, "k", x), np.tanh(x), rtol=1e-6, atol=1e-7)


def _fork_child(lib_path: str, q) -> None:
    lib = ctypes.CDLL(lib_path)
    y = np.ones(1 << 20, np.float32)
    lib.k(ctypes.c_void_p(y.ctypes.data), ctypes.c_int64(y.size))
    q.put(float(y[0]))


@pytest.mark.skipif(not hasattr(os, "register_at_fork"), reason="no fork on this platform")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # 3.12+: fork with threads
def test_forked_child_runs_parallel_kernels(cc: CCompiler) -> None:
    """libgomp deadlocks a forked child's first parallel region unless the at-fork
    hook drops the child to one OpenMP thread."""
    if "-fopenmp" not in cc.flags:
        pytest.skip("no OpenMP here")
    src = C_PRELUDE + ("void k(float *x, int64_t n) {\n#pragma omp parallel for\n"
                       "  for (int64_t i = 0; i < n; i++) x[i] = tanhf(x[i]);\n}\n")
    lib = cc.compile(src, {"program": "test-fork"})
    x = np.ones(1 << 20, np.float32)
    lib.k(ctypes.c_void_p(x.ctypes.data), ctypes.c_int64(x.size))  # parent's thread pool
    path = KERNEL_CACHE.lookup(cc.key_parts({"program": "test-fork"}), src)
    assert path is not None
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    child = ctx.Process(target=_fork_child, args=(str(path), q))
    child.start()
    child.join(30)
    if child.is_alive():
        child.kill()
        pytest.fail("forked child hung in its first OpenMP parallel region")
    assert child.exitcode == 0 and q.get(timeout=5) == pytest.approx(math.tanh(1.0))
