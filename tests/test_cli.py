"""The ``hologram`` command line: ``info`` (text and JSON) and ``demo``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hologram import __version__, cli
from hologram.backends import registry

DEMO_OPS = ("vector_add", "gelu", "softmax", "reduce_sum", "mse_loss", "gemm")
SMALL = ["--size", "4096", "--dim", "32", "--repeat", "2"]


def test_info_lists_every_backend_with_its_state(capsys):
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert f"hologram {__version__}" in out
    for name in registry.REGISTRY:
        reason = registry.why_unavailable(name)
        line = next(ln for ln in out.splitlines() if ln.split()[:1] == [name])
        assert ("yes" if reason is None else "no") == line.split()[1]
        if reason is not None:
            assert reason in line
    assert f"default backend: {registry.get_default_backend()}" in out
    for key in ("cache directory:", "CPU features:", "C compiler:"):
        assert key in out


def test_info_json_is_the_same_data(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("HOLOGRAM_CACHE_DIR", str(tmp_path))
    assert cli.main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["version"] == __version__
    assert set(info["backends"]) == set(registry.REGISTRY)
    for name, b in info["backends"].items():
        assert b["available"] is (registry.why_unavailable(name) is None)
        assert (b["reason"] is None) is b["available"]
    assert info["default_backend"] == registry.get_default_backend()
    assert info["cache_dir"] == str(tmp_path) and info["cache_dir_exists"] is True
    feats = info["cpu_features"]
    assert feats is None or set(feats) == set(cli.CPU_FLAGS)


def test_cache_dir_follows_env_then_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("HOLOGRAM_CACHE_DIR", str(tmp_path / "c"))
    assert cli.cache_dir() == tmp_path / "c"
    monkeypatch.delenv("HOLOGRAM_CACHE_DIR")
    if sys.platform.startswith("linux"):
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
        assert cli.cache_dir() == tmp_path / "xdg" / "hologram"
        monkeypatch.delenv("XDG_CACHE_HOME")
        assert cli.cache_dir() == Path.home() / ".cache" / "hologram"


def test_cpu_features_come_from_the_flags_line(tmp_path):
    f = tmp_path / "cpuinfo"
    f.write_text("processor\t: 0\nflags\t\t: fpu sse4_2 avx avx2 fma\n\nflags : avx512f\n")
    assert cli.cpu_features(f) == {"sse4_2": True, "avx": True, "avx2": True, "fma": True,
                                   "avx512f": False}
    assert cli.cpu_features(tmp_path / "missing") is None
    (tmp_path / "arm").write_text("Features\t: fp asimd\n")
    assert cli.cpu_features(tmp_path / "arm") is None


def test_c_compiler_skips_a_broken_cc_env(monkeypatch, tmp_path):
    fake = tmp_path / "mycc"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    found = cli.c_compiler()  # a $CC that cannot build a kernel is passed over
    if found is not None:
        assert str(fake) not in found
    monkeypatch.delenv("CC")
    found = cli.c_compiler()
    paths = [shutil.which(n) for n in cli.C_COMPILERS]
    assert found is None or any(p and found.startswith(p) for p in paths)


def test_demo_checks_and_times_every_op(capsys):
    assert cli.main(["demo", "--ops"]) == 0  # the default sizes: 1M elements, 512x512 GEMM
    out = capsys.readouterr().out
    for op in DEMO_OPS:
        line = next(ln for ln in out.splitlines() if ln.startswith(op + " "))
        assert " OK (max rel err " in line
    assert "FAIL" not in out and "all checks passed" in out
    header = next(ln for ln in out.splitlines() if ln.startswith("op "))
    col = header.index("check")
    assert all(ln[col:col + 2] == "OK" for ln in out.splitlines() if ln.startswith(DEMO_OPS))


def test_demo_exits_1_when_a_result_is_wrong(capsys, monkeypatch):
    real = cli.demo_cases

    def broken(*args, **kwargs):
        cases = real(*args, **kwargs)
        good = cases[1].result
        cases[1].result = lambda: good() + np.float32(1e-3)
        return cases

    monkeypatch.setattr(cli, "demo_cases", broken)
    assert cli.main(["demo", "--ops", *SMALL]) == 1
    out = capsys.readouterr().out
    assert "gelu" in out and "FAIL (max rel err" in out and "SOME CHECKS FAILED" in out


def test_demo_on_an_unknown_backend_says_why(capsys):
    assert cli.main(["demo", "--ops", "--backend", "nonsense"]) == 1
    captured = capsys.readouterr()
    assert "hologram: error:" in captured.err and "nonsense" in captured.err
    assert captured.out == ""


def test_usage_errors():
    assert cli.main([]) == 2
    with pytest.raises(SystemExit) as e:
        cli.main(["demo", "--ops", "--size", "0"])
    assert e.value.code == 2


def test_installed_entry_point_and_python_m():
    script = Path(sys.executable).parent / "hologram"
    if not script.exists():
        pytest.skip(f"no installed hologram script beside {sys.executable}")
    proc = subprocess.run([str(script), "demo", "--ops", *SMALL], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count(" OK (max rel err ") == len(DEMO_OPS)

    proc = subprocess.run([sys.executable, "-m", "hologram", "info", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "backends" in json.loads(proc.stdout)


def test_demo_trains_through_the_hologram_backend(capsys):
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    pytest.importorskip("tqdm")
    assert cli.main(["demo", "--epochs", "1", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "test acc" in out and "hologram" in out
