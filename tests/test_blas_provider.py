"""Which BLAS hologram's GEMMs run on (compiler/blas.py ``provider``): with MKL (the ``mkl``
wheel) and NumPy's OpenBLAS both usable, the one measured faster on this machine
(``blas_choice``, remembered in the kernel cache), else the one there; ``HOLOGRAM_BLAS``
chooses, ``HOLOGRAM_GEMM=numpy`` means np.matmul. Each case runs in a fresh interpreter
(the choice is made once per process). The GEMM test files run again under the provider
the default did not pick, so both are covered wherever both are installed; tests that
need MKL skip without it.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hologram.compiler import blas

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAVE_MKL = blas.mkl_blas()[0] is not None
HAVE_OPENBLAS = blas.numpy_blas()[0] is not None
needs_mkl = pytest.mark.skipif(not HAVE_MKL, reason="MKL is not installed (pip install mkl)")

PROBE = ("import warnings, numpy as np, hologram\n"
         "from hologram.compiler import blas\n"
         "with warnings.catch_warnings(record=True) as w:\n"
         "    warnings.simplefilter('always')\n"
         "    found, how = blas.provider()\n"
         "print(found.name if found else None)\n"
         "print(blas.describe())\n"
         "print(len([x for x in w if 'HOLOGRAM_BLAS' in str(x.message)]))\n"
         "a = np.arange(12, dtype=np.float32).reshape(3, 4)\n"
         "print(float(hologram.jit(lambda x, y: x @ y.T)(a, a).sum()))\n")


def _probe(**env: str) -> tuple[str, str, int, float]:
    full = {k: v for k, v in os.environ.items() if k not in ("HOLOGRAM_BLAS", "HOLOGRAM_GEMM")}
    full.update(env)
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=full,
                       cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    name, describe, warned, total = r.stdout.strip().split("\n")[-4:]
    return name, describe, int(warned), float(total)


def _run_fresh(code: str, cache: object) -> str:
    """stdout of ``code`` in a fresh interpreter with its own kernel cache ``cache`` and
    neither HOLOGRAM_BLAS nor HOLOGRAM_GEMM set (the measured default decides)."""
    env = {k: v for k, v in os.environ.items() if k not in ("HOLOGRAM_BLAS", "HOLOGRAM_GEMM")}
    env["HOLOGRAM_CACHE_DIR"] = str(cache)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def _want_sum() -> float:
    import numpy as np

    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    return float((a @ a.T).sum())


def test_default_is_the_measured_faster_one_when_both_else_the_one_there():
    name, describe, warned, total = _probe()
    if HAVE_MKL and HAVE_OPENBLAS:
        assert name in ("mkl", "openblas")
        assert "measured on this CPU: OpenBLAS at" in describe
        assert ("sequential" in describe) == (name == "mkl")
    else:
        assert name == ("mkl" if HAVE_MKL else "openblas" if HAVE_OPENBLAS else "None")
        if HAVE_MKL:
            assert "MKL" in describe and "default: MKL first" in describe
    assert warned == 0 and total == _want_sum()


needs_both = pytest.mark.skipif(not (HAVE_MKL and HAVE_OPENBLAS),
                                reason="needs both MKL and NumPy's OpenBLAS")


@needs_both
@pytest.mark.parametrize(("ratio", "layouts", "want", "moved"), [
    (2.0, {"NN": 1.0, "TN": 1.0}, "openblas", []),
    (1.05, {"NN": 1.2, "TN": 1.02}, "mkl", ["NN"]),
    (0.5, {"NN": 0.9, "TN": 1.3}, "mkl", ["TN"]),
    (1.5, {"NN": 0.9, "TN": 0.95}, "openblas", ["NN", "TN"])])
def test_a_remembered_measurement_decides_without_timing_again(tmp_path, ratio, layouts,
                                                               want, moved):
    """The record in the kernel cache decides (OpenBLAS only from MARGIN up on x @ W.T;
    the other library for a layout where it is LAYOUT_MARGIN faster), so every process on
    a machine makes the same choice; nothing is timed while it is there. Every layout's
    product is right whichever library runs it."""
    code = ("import numpy as np, hologram\n"
            "from hologram.compiler import blas, blas_choice\n"
            "mkl, ob = blas.mkl_blas()[0], blas.numpy_blas()[0]\n"
            f"blas_choice._write(blas_choice._record_path(mkl, ob), {ratio}, {layouts})\n"
            "def refuse(*a):\n"
            "    raise AssertionError('timed again')\n"
            "blas_choice.measure = blas_choice.measure_layouts = refuse\n"
            "rng = np.random.default_rng(0)\n"
            "a, b = (rng.standard_normal((96, 80)).astype(np.float32) for _ in range(2))\n"
            "for f in (lambda x, y: x @ y.T, lambda x, y: x @ y[:80].T.copy(),\n"
            "          lambda x, y: x.T @ y, lambda x, y: x.T @ y.T.copy().T):\n"
            "    got = hologram.jit(f)(a, b)\n"
            "    want = f(a.astype(np.float64), b.astype(np.float64))\n"
            "    assert np.abs(got - want).max() < 1e-4, f\n"
            "print(blas.provider()[0].name)\n"
            "print(blas.second_provider()[1])\n"
            "print(blas.describe())\n")
    out = _run_fresh(code, tmp_path / "cache")
    name, mask, describe = out.strip().split("\n")[-3:]
    assert name == want
    assert int(mask) == sum(1 << blas.LAYOUT_INDEX[lay] for lay in moved)
    assert f"OpenBLAS at {ratio:.2f}x MKL's speed" in describe and "remembered" in describe
    other = "OpenBLAS" if want == "mkl" else "MKL"
    assert (f"{', '.join(moved)} products on {other}" in describe) == bool(moved)


@needs_both
def test_layouts_are_timed_only_once_a_program_needs_them(tmp_path):
    """x @ W.T products alone (a transformer's) never pay for the layouts' timing; the
    first program with a product read otherwise (a convolution's W @ columns) does,
    once, and it is remembered."""
    code = ("import json, glob, os, numpy as np, hologram\n"
            "from hologram.compiler import blas\n"
            "a = np.ones((64, 32), np.float32)\n"
            "def record():\n"
            "    path, = glob.glob(os.path.join(os.environ['HOLOGRAM_CACHE_DIR'], '**',\n"
            "                                   'blas-choice-*.json'), recursive=True)\n"
            "    return json.load(open(path))['layouts']\n"
            "hologram.jit(lambda x, y: x @ y.T)(a, a)\n"
            "print(record())\n"
            "hologram.jit(lambda x, y: x @ y)(a, a.T.copy())\n"
            "print(sorted(record()))\n")
    out = _run_fresh(code, tmp_path / "cache")
    assert out.split("\n")[-3:-1] == ["None", "['NN', 'TN']"]


@pytest.mark.skipif(not (HAVE_MKL or HAVE_OPENBLAS), reason="no BLAS library")
def test_the_driver_sends_each_layout_to_its_library():
    """``hg_gemm_second`` routes exactly the layouts in its mask (bit ``2 ta + tb``): a
    second "library" that fills C with a marker shows which products it ran."""
    import ctypes

    import numpy as np

    import hologram

    cc = hologram.default_executor("cpu").backend.cc
    fake = cc.compile("#include <stdint.h>\n"
                      "void marker(int o, int ta, int tb, int64_t m, int64_t n, int64_t k,\n"
                      "            float al, const float *a, int64_t lda, const float *b,\n"
                      "            int64_t ldb, float be, float *c, int64_t ldc) {\n"
                      "  for (int64_t i = 0; i < m; i++)\n"
                      "    for (int64_t j = 0; j < n; j++) c[i * ldc + j] = 7.0f;\n"
                      "}\n", {"test": "gemm-layout-marker"})
    found, _ = blas.provider()
    lib = blas.bind_runtime(cc.compile(blas.runtime_source(), {"runtime": "gemm-test-layout"}),
                            found)
    lib.hg_gemm.argtypes = [ctypes.c_void_p] * 7
    marker = ctypes.cast(fake.marker, ctypes.c_void_p).value
    rng = np.random.default_rng(1)
    m, k, n = 40, 24, 56
    for mask in range(16):
        lib.hg_gemm_second(marker, marker, 1, mask)
        for ta in (0, 1):
            for tb in (0, 1):
                a = rng.standard_normal((k, m) if ta else (m, k), dtype=np.float32)
                b = rng.standard_normal((n, k) if tb else (k, n), dtype=np.float32)
                c = np.full((m, n), np.nan, np.float32)
                d = blas.DescStruct()
                d.nb, d.m, d.n, d.k = 1, m, n, k
                d.lda, d.ldb, d.ldc = m if ta else k, k if tb else n, n
                d.ta, d.tb, d.f64, d.nbd = ta, tb, 0, 0
                lib.hg_gemm(ctypes.byref(d), a.ctypes.data, b.ctypes.data, c.ctypes.data,
                            None, None, None)
                if mask >> (2 * ta + tb) & 1:
                    assert (c == 7).all(), (mask, ta, tb)
                else:
                    want = (a.T if ta else a).astype(np.float64) @ (b.T if tb else b)
                    assert np.abs(c - want).max() < 1e-4, (mask, ta, tb)


@needs_both
def test_a_damaged_record_is_measured_again_and_replaced(tmp_path, monkeypatch):
    from hologram.compiler import blas_choice

    monkeypatch.setenv("HOLOGRAM_CACHE_DIR", str(tmp_path / "cache"))
    mkl, ob = blas.mkl_blas()[0], blas.numpy_blas()[0]
    path = blas_choice._record_path(mkl, ob)
    assert path is not None
    for damaged in ("{not json", '{"openblas_over_mkl": "nan"}', '{"other": 1}',
                    '{"openblas_over_mkl": 1.0}',  # layouts not measured yet
                    '{"openblas_over_mkl": 1.0, "layouts": {"NN": 1.0}}',
                    '{"openblas_over_mkl": 1.0, "layouts": {"NN": 1.0, "TN": "nan"}}'):
        with open(path, "w") as f:
            f.write(damaged)
        first = blas_choice.choose(mkl, ob, layouts=True)
        assert not first.cached and first.ratio > 0
        again = blas_choice.choose(mkl, ob, layouts=True)
        assert again.cached and again.ratio == first.ratio and again.name == first.name
        assert again.name == ("openblas" if first.ratio >= blas_choice.MARGIN else "mkl")
        assert again.layouts == first.layouts and len(first.layouts) == len(blas_choice.LAYOUTS)


@needs_both
def test_the_record_is_per_library_version(tmp_path, monkeypatch):
    """Another OpenBLAS (or MKL) build is another record: an upgrade is measured again."""
    import dataclasses

    from hologram.compiler import blas_choice

    monkeypatch.setenv("HOLOGRAM_CACHE_DIR", str(tmp_path / "cache"))
    mkl, ob = blas.mkl_blas()[0], blas.numpy_blas()[0]
    other = dataclasses.replace(ob, config=ob.config + " (another build)")
    assert blas_choice._record_path(mkl, ob) != blas_choice._record_path(mkl, other)


@pytest.mark.skipif(not HAVE_OPENBLAS, reason="NumPy has no OpenBLAS here")
def test_override_openblas():
    name, describe, warned, total = _probe(HOLOGRAM_BLAS="openblas")
    assert name == "openblas" and "[HOLOGRAM_BLAS=openblas]" in describe
    assert warned == 0 and total == _want_sum()


def test_override_mkl_uses_it_or_warns_and_falls_back():
    name, describe, warned, total = _probe(HOLOGRAM_BLAS="MKL")  # any case
    if HAVE_MKL:
        assert name == "mkl" and "[HOLOGRAM_BLAS=mkl]" in describe and warned == 0
    else:
        assert name in ("openblas", "None") and warned == (1 if HAVE_OPENBLAS else 0)
        assert "not installed" in describe
    assert total == _want_sum()


def test_numpy_gemm_overrides_the_blas_choice():
    name, describe, _, total = _probe(HOLOGRAM_BLAS="mkl", HOLOGRAM_GEMM="numpy")
    assert name == "None" and describe == "np.matmul (HOLOGRAM_GEMM=numpy)"
    assert total == _want_sum()


def test_unknown_provider_is_a_clear_error():
    full = {**os.environ, "HOLOGRAM_BLAS": "atlas"}
    full.pop("HOLOGRAM_GEMM", None)
    r = subprocess.run([sys.executable, "-c", "from hologram.compiler import blas\n"
                        "blas.provider()"], capture_output=True, text=True, env=full,
                       cwd=ROOT, timeout=300)
    assert r.returncode != 0
    assert "ValueError: HOLOGRAM_BLAS must be one of mkl, openblas" in r.stderr
    assert "'atlas'" in r.stderr


def test_hologram_info_names_the_blas():
    from hologram.cli import collect_info, format_info

    info = collect_info()
    line = next(x for x in format_info(info).splitlines() if x.startswith("GEMM: "))
    found, _ = blas.provider()
    if found is None:
        assert "np.matmul" in line
    else:
        assert ("MKL" if found.name == "mkl" else "openblas") in line
        assert "[" in line  # why this one


@needs_mkl
def test_mkl_runs_sequential_without_intel_openmp():
    """MKL's sequential layer: no second thread pool (libiomp5) beside GNU OpenMP."""
    code = ("import numpy as np, hologram\n"
            "from hologram.compiler import blas\n"
            "assert blas.provider()[0].name == 'mkl'\n"
            "a = np.ones((256, 256), np.float32)\n"
            "assert (hologram.jit(lambda x, y: x @ y)(a, a) == 256).all()\n"
            "maps = open('/proc/self/maps').read()\n"
            "print('libmkl_sequential' in maps, 'libiomp5' in maps,\n"
            "      'libmkl_intel_thread' in maps or 'libmkl_gnu_thread' in maps)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("HOLOGRAM_BLAS", "HOLOGRAM_GEMM")}
    env["HOLOGRAM_BLAS"] = "mkl"  # the default may be OpenBLAS on this machine
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["True", "False", "False"]


@needs_mkl
def test_mkl_stays_out_of_the_global_scope_and_pytorch_keeps_its_threads():
    """MKL is hologram's alone: no MKL symbol resolves globally after it ran, and PyTorch
    imported afterwards (its own MKL asks how many threads to use) keeps its threads and
    computes as before. With libmkl_rt (which loads its layers globally) PyTorch set
    OpenMP, hologram's kernels included, to one thread."""
    code = ("import ctypes, numpy as np, hologram\n"
            "from hologram.compiler import blas\n"
            "assert blas.provider()[0].name == 'mkl'\n"
            "a = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)\n"
            "hologram.jit(lambda x, y: x @ y)(a, a)\n"
            "g = ctypes.CDLL(None)\n"
            "print(any(hasattr(g, s) for s in ('mkl_get_max_threads', 'cblas_sgemm',\n"
            "                                  'mkl_serv_get_max_threads')))\n"
            "import torch\n"
            "print(torch.get_num_threads())\n"
            "t = torch.from_numpy(a).double()\n"
            "want = torch.from_numpy(a.astype(np.float64) @ a)\n"
            "print(float((torch.mm(t, t) - want).abs().max()))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("HOLOGRAM_BLAS", "HOLOGRAM_GEMM")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**env, "HOLOGRAM_BLAS": "mkl"}, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    leaked, threads, err = r.stdout.split()
    fresh = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                           capture_output=True, text=True, env=env, timeout=300)
    assert leaked == "False"
    assert int(threads) == int(fresh.stdout)
    assert float(err) < 1e-9


@needs_mkl
def test_an_mkl_someone_else_loaded_is_left_alone():
    """A process where another library loaded MKL already (here libmkl_rt, by ctypes)
    runs GEMM on OpenBLAS, and says why."""
    rt = next((os.path.join(d, n) for d in blas._mkl_dirs() for n in os.listdir(d)
               if n.startswith("libmkl_rt.so")), None)
    if rt is None:
        pytest.skip("no libmkl_rt next to the MKL layers")
    code = (f"import ctypes; ctypes.CDLL({rt!r})\n" + PROBE)
    env = {k: v for k, v in os.environ.items() if k not in ("HOLOGRAM_BLAS", "HOLOGRAM_GEMM")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    name, describe, _, total = r.stdout.strip().split("\n")[-4:]
    assert name == ("openblas" if HAVE_OPENBLAS else "None")
    assert "was loaded by another library" in describe
    assert float(total) == _want_sum()


@pytest.mark.skipif(not (HAVE_MKL and HAVE_OPENBLAS),
                    reason="needs both MKL and NumPy's OpenBLAS")
def test_gemm_tests_pass_under_the_other_provider():
    """The GEMM test files (plain, transposed, batched, in-place tails, random epilogue
    chains, NaN/inf, empty and forked cases) under the provider the default did not pick:
    this run already covered the default one."""
    default = blas.provider()[0]
    other = "openblas" if default is not None and default.name == "mkl" else "mkl"
    assert _probe(HOLOGRAM_BLAS=other)[0] == other
    env = {k: v for k, v in os.environ.items() if k != "HOLOGRAM_GEMM"}
    env["HOLOGRAM_BLAS"] = other
    r = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                        "tests/test_gemm_blas.py", "tests/test_batched_gemm.py",
                        "tests/test_gemm_in_place.py", "tests/test_packed_gemm.py",
                        "-k", "not webgpu and not wgsl and not cuda"],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and "failed" not in r.stdout
