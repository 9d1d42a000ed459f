"""ruff passes on the whole checkout, so the line length pyproject.toml configures ([tool.ruff]) is
the one the code keeps, and a syntax error or undefined name is caught before a run reaches it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ruff_runs() -> bool:
    try:
        done = subprocess.run([sys.executable, "-m", "ruff", "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def test_ruff_finds_nothing() -> None:
    if not _ruff_runs():
        pytest.skip(f"`{sys.executable} -m ruff --version` failed: ruff is not installed "
                    "(it is in the test extra: pip install -e '.[test]')")
    done = subprocess.run([sys.executable, "-m", "ruff", "check", str(ROOT)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"ruff check failed (exit {done.returncode}):\n{done.stdout}{done.stderr}"
