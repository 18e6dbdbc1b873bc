"""The README's two commands are the project's contract; CI must run the test one."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    lines = (ROOT / "README.md").read_text().splitlines()
    start = lines.index("```sh")
    end = lines.index("```", start + 1)
    return [ln for ln in lines[start + 1:end] if ln.strip() and not ln.startswith("#")]


def test_readme_opens_with_demo_and_test_commands():
    demo, test = _readme_commands()[:2]
    assert demo.endswith("hologram demo")
    assert "pytest" in test


def test_ci_runs_the_readme_test_command():
    test = _readme_commands()[1]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test in ci
