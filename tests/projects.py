"""A user's project for the end-to-end tests of the plugin and `python -m bench.tools.ci`:
the conftest that loads the plugin, two tiny cases, a timer that plants the epoch times,
the time gate's budgets, and a folder laid out with them all.

Time is planted, not measured: each timed epoch (one pytest-benchmark round) lasts
PLANTED_EPOCH_S (from the environment) on pytest-benchmark's timer, which the gate reads,
with a fixed ripple of +-0.8%, however busy the machine is. The timer's module goes
beside the conftest; TIMER names it with pytest-benchmark's own --benchmark-timer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from model.data import synthesize
from model.data import write_csv

ROOT = Path(__file__).resolve().parents[1]
CONFTEST = 'pytest_plugins = ["bench.plugin"]\n'
CASES = """
from kernels.ground.cases import Case

def test_small(loadbench):
    loadbench.run(Case("blocks", 2), width=32)

def test_other(loadbench):
    loadbench.run(Case("blocks", 3), width=32)
"""
PLANTED_TIMER = """
import itertools, os

_ticks = itertools.count()


def clock():
    seconds = float(os.environ.get("PLANTED_EPOCH_S", "0.1"))
    epoch, stop = divmod(next(_ticks), 2)
    return epoch * 100 * seconds + stop * seconds * (1 + 0.004 * (epoch % 5 - 2))
"""
TIMER = "--benchmark-timer=planted.clock"
GATE = "[defaults]\ntime_slower_pct = 10\ntime_noise_k = 3\ntime_noise_unknown_pct = 25\ntime_alpha = 0.01\n"


def write_project(root: Path, timer: str = PLANTED_TIMER) -> Path:
    """`root` laid out like a user's checkout: the conftest, the two cases, `timer` (the
    planted timer's source) as planted.py, GATE as budgets.toml, and a tiny CSV."""
    (root / "conftest.py").write_text(CONFTEST)
    (root / "test_cases.py").write_text(CASES)
    (root / "planted.py").write_text(timer)
    (root / "budgets.toml").write_text(GATE)
    write_csv(synthesize(scale=0.02), root / "tiny.csv")
    return root


def ci(root: Path, mode: str, out: str, *extra: str, timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
    """`python -m bench.tools.ci mode` in a project (write_project) on its CPU, storing
    main's runs in root/main-runs, writing to root/out; `extra`: ci's own options, `env`:
    what the planted timer reads. No GitHub environment reaches it."""
    environment = {**os.environ, **env, "PYTHONPATH": str(ROOT), "GITHUB_STEP_SUMMARY": ""}
    environment.pop("GITHUB_SHA", None)
    command = [sys.executable, "-m", "bench.tools.ci", mode, "--storage", str(root / "main-runs"),
               "--out", str(root / out), "--bench", "test_cases.py", "--gpu", "no GPU", "--no-history", *extra,
               "--", "--device=cpu", f"--dataset={root / 'tiny.csv'}", f"--budgets={root / 'budgets.toml'}",
               TIMER, "--time-gate=on", "-q"]
    return subprocess.run(command, cwd=root, env=environment, capture_output=True, text=True, timeout=timeout)
