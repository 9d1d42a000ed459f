"""bench.tools.bisect on throwaway git repositories with a planted slow commit.

Time is planted through the trainer's epoch clock, not by sleeping, so the verdicts
do not depend on how busy the machine is.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.tools.bisect import main as bisect_main

# The temp repo's timer: each epoch "takes" exactly EPOCH_SECONDS of the commit.
# pytest-benchmark (--benchmark-timer=delay.clock) reads it once before and once after an
# epoch, so a clock that advances by that much per read makes every timed epoch that long,
# whatever the machine is doing.
CONFTEST = 'pytest_plugins = ["bench.plugin"]\n'
DELAY = "import itertools\n\nEPOCH_SECONDS = {seconds}\n_ticks = itertools.count()\n\n\ndef clock():\n    return next(_ticks) * EPOCH_SECONDS\n"

CASE = "from bench.cases import Case\n\ndef test_units(loadbench):\n    loadbench.run(Case('units', 128), width=16)\n"

# A slow commit makes epochs 3x slower: far beyond a 50% limit, significant over 7 vs 7
# epochs; equal epochs are a ratio of 1.
BUDGETS = "[defaults]\ntime_slower_pct = 50\ntime_alpha = 0.01\n"

GOOD_EPOCH_S, SLOW_EPOCH_S = 0.1, 0.3


def make_repo(tmp_path: Path, epoch_seconds: list[float]) -> tuple[Path, list[str]]:
    """A repository with one commit per entry; each commit plants that epoch time."""
    repo = tmp_path / "repo"
    (repo / "perf").mkdir(parents=True)
    (repo / "conftest.py").write_text(CONFTEST)
    (repo / "perf" / "test_case.py").write_text(CASE)
    (repo / "budgets.toml").write_text(BUDGETS)
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    commits = []
    for i, seconds in enumerate(epoch_seconds):
        (repo / "delay.py").write_text(DELAY.format(seconds=seconds))
        (repo / "notes.txt").write_text(f"change {i}\n")
        slow = i > 0 and seconds > epoch_seconds[i - 1]
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", f"change {i}" + (" (slow)" if slow else ""))
        commits.append(git(repo, "rev-parse", "HEAD").strip())
    return repo, commits


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


def run_bisect(repo: Path, good: str, bad: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench.tools.bisect", good, bad, "-k", "test_units", "--path", "perf/",
         "--", "--device=cpu", "--profile=smoke", "--epochs=8", f"--budgets={repo / 'budgets.toml'}", "--benchmark-timer=delay.clock",
         "--dataset=" + str(_tiny_csv(tmp_path))],
        cwd=repo, capture_output=True, text=True,
    )  # fmt: skip


def _tiny_csv(tmp_path: Path) -> Path:
    from model.data import synthesize
    from model.data import write_csv

    path = tmp_path / "tiny.csv"
    return path if path.is_file() else write_csv(synthesize(scale=0.02), path)


@pytest.mark.slow
def test_bisect_finds_the_planted_slow_commit(tmp_path) -> None:
    good, slow = GOOD_EPOCH_S, SLOW_EPOCH_S
    repo, commits = make_repo(tmp_path, [good, good, good, slow, slow])
    out = run_bisect(repo, commits[0], commits[-1], tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"first bad commit: {commits[3]}" in out.stdout
    assert "change 3 (slow)" in out.stdout
    assert git(repo, "rev-parse", "HEAD").strip() == commits[-1]  # left where it was


@pytest.mark.slow
def test_bisect_refuses_when_the_case_passes_at_bad(tmp_path) -> None:
    repo, commits = make_repo(tmp_path, [GOOD_EPOCH_S] * 3)
    out = run_bisect(repo, commits[0], commits[-1], tmp_path)
    assert out.returncode == 2, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"the case passes at BAD ({commits[-1]}): nothing to bisect" in out.stderr
    assert "first bad commit" not in out.stdout
    assert git(repo, "rev-parse", "HEAD").strip() == commits[-1]
    bisecting = subprocess.run(["git", "bisect", "log"], cwd=repo, capture_output=True, text=True)
    assert bisecting.returncode != 0  # no bisection was started or left behind


def test_bisect_refuses_a_dirty_tree(tmp_path) -> None:
    repo = tmp_path / "r"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    (repo / "a.txt").write_text("1")
    subprocess.run(["git", "add", "a.txt"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.email=t@e", "-c", "user.name=t", "commit", "-qm", "a"], cwd=repo, check=True)
    (repo / "a.txt").write_text("2")
    out = subprocess.run([sys.executable, "-m", "bench.tools.bisect", "HEAD", "HEAD", "-k", "x", "--repo", str(repo)],
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 2 and "uncommitted changes" in out.stderr
    assert shutil.which("git")


def test_help_shows_the_pytest_pass_through(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        bisect_main(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    usage = text.splitlines()[0]
    assert usage.startswith("usage: python -m bench.tools.bisect GOOD BAD -k CASE")
    assert usage.endswith("[-- PYTEST ARGS...]")
    assert "after -- goes to each pytest run" in text
    assert " -- --profile quick" in text  # an example of the pass-through
