"""Paired runs end to end on the CPU (bench/tools/confirm.py through `python -m bench.tools.ci`):
a git checkout whose main runs are stored, then pull requests whose first run is slower.

Epoch times are planted on pytest-benchmark's timer: each process reads its epoch from the
checkout it runs in (`epoch_s.txt`, what the code "costs") times PLANTED_DRIFT from the
environment (what the machine adds to every process of a job). A slower machine moves both
sides of every pair; a slower commit only the change's side."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.projects import ci as run_ci
from tests.projects import write_project

CHECKOUT_TIMER = """
import itertools, os
from pathlib import Path

_ticks = itertools.count()
_epoch = float(Path("epoch_s.txt").read_text()) * float(os.environ.get("PLANTED_DRIFT", "1"))


def clock():
    epoch, stop = divmod(next(_ticks), 2)
    return epoch * 100 * _epoch + stop * _epoch * (1 + 0.004 * (epoch % 5 - 2))
"""


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=ci", "-c", "user.email=ci@example.invalid", *args],
                   check=True, capture_output=True)


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A git checkout with main's commit and three of its runs stored, as three pushes would leave them."""
    root = write_project(tmp_path_factory.mktemp("checkout"), CHECKOUT_TIMER)
    (root / "epoch_s.txt").write_text("0.1\n")
    (root / ".gitignore").write_text("main-runs/\nout-*/\n__pycache__/\n.benchmarks/\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "main")
    for number in range(3):
        done = ci(root, "main", f"out-main{number}")
        assert done.returncode == 0, done.stdout + done.stderr
    assert len(list((root / "main-runs").glob("*/*.json"))) == 3
    return root


def ci(root: Path, mode: str, out: str, drift: float = 1.0) -> subprocess.CompletedProcess:
    return run_ci(root, mode, out, "--pairs", "2", timeout=900, PLANTED_DRIFT=str(drift))


def verdicts(run: Path) -> dict[str, dict]:
    return {b["name"]: b["extra_info"]["verdict"] for b in json.loads(run.read_text())["benchmarks"]}


@pytest.mark.slow
def test_a_slower_machine_is_not_a_regression_once_paired_with_main(checkout: Path) -> None:
    done = ci(checkout, "pr", "out-drift", drift=1.4)  # every epoch of this job 40% slower, the code unchanged
    summary = (checkout / "out-drift" / "summary.md").read_text()
    assert done.returncode == 0, done.stdout + done.stderr
    assert summary.startswith("## mlp-loadbench pr: passed")
    assert "2 case(s) slower than main's history in this run were measured again" in summary
    assert "0 confirmed, 2 not" in summary
    for verdict in verdicts(checkout / "out-drift" / "run.json").values():
        assert verdict["status"] == "ok"
        assert verdict["reason"].startswith("first run: epoch_time_ratio = 1.4")
        assert verdict["paired"]["ratios"] == pytest.approx([1.0, 1.0]) and not verdict["paired"]["confirmed"]
    assert len(list((checkout / "out-drift" / "paired").glob("*.json"))) == 4  # main, change; change, main
    assert not (checkout / "out-drift" / "paired" / "main").exists()  # the worktree is gone


@pytest.mark.slow
def test_a_slower_commit_is_confirmed_by_the_paired_runs(checkout: Path) -> None:
    git(checkout, "switch", "-q", "-c", "slower")
    (checkout / "epoch_s.txt").write_text("0.14\n")
    git(checkout, "commit", "-q", "-am", "slower")
    try:
        done = ci(checkout, "pr", "out-slower")
    finally:
        git(checkout, "switch", "-q", "main")
    summary = (checkout / "out-slower" / "summary.md").read_text()
    assert done.returncode == 1, done.stdout + done.stderr
    assert summary.startswith("## mlp-loadbench pr: FAILED")
    assert "2 confirmed, 0 not" in summary and "2 regressed" in summary
    for verdict in verdicts(checkout / "out-slower" / "run.json").values():
        assert verdict["status"] == "regressed" and verdict["paired"]["confirmed"]
        assert verdict["paired"]["ratios"] == pytest.approx([1.4, 1.4])
        assert "confirmed by 2 paired run(s)" in verdict["failures"][0]["message"]
