"""bench.tools.bisect on throwaway git repositories with a planted slow commit.

Time is planted through the trainer's epoch clock, not by sleeping, so the verdicts
do not depend on how busy the machine is.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

import bench
from bench.tools.bisect import main as bisect_main
from bench.tools.bisect_step import ABORT
from bench.tools.bisect_step import BAD
from bench.tools.bisect_step import GOOD
from bench.tools.bisect_step import SKIP
from kernels.ground.processes import checkout_env
from bench.tools.bisect_step import verdict

# The checkout whose tool the tests run, by absolute path: the tool runs in other folders,
# where a PYTHONPATH=. of the test session would name something else.
TOOL_ROOT = Path(bench.__file__).resolve().parents[1]

# The temp repo's timer: each epoch "takes" exactly EPOCH_SECONDS of the commit.
# pytest-benchmark (--benchmark-timer=delay.clock) reads it once before and once after an
# epoch, so a clock that advances by that much per read makes every timed epoch that long,
# whatever the machine is doing.
CONFTEST = 'pytest_plugins = ["bench.plugin"]\n'
DELAY = ("import itertools\n\nEPOCH_SECONDS = {seconds}\n_ticks = itertools.count()\n\n\n"
         "def clock():\n    return next(_ticks) * EPOCH_SECONDS\n")

CASE = ("from kernels.ground.cases import Case\n\n"
        "def test_units(loadbench):\n    loadbench.run(Case('units', 128), width=16)\n")

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


def tool_env(**extra: str) -> dict[str, str]:
    """The environment the tool runs in: this checkout's code first, whatever is installed."""
    inherited = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(TOOL_ROOT), *inherited]), **extra}


def run_bisect(repo: Path, good: str, bad: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench.tools.bisect", good, bad, "-k", "test_units", "--path", "perf/",
         "--", "--device=cpu", "--time-gate=on", "--profile=smoke", "--epochs=8", f"--budgets={repo / 'budgets.toml'}",
         "--benchmark-timer=delay.clock", "--dataset=" + str(_tiny_csv(tmp_path))],
        cwd=repo, capture_output=True, text=True, env=tool_env(),
    )


def _tiny_csv(tmp_path: Path) -> Path:
    from model.data import synthesize
    from model.data import write_csv

    path = tmp_path / "tiny.csv"
    return path if path.is_file() else write_csv(synthesize(scale=0.02), path)


@pytest.mark.slow
def test_bisect_finds_the_planted_slow_commit(tmp_path) -> None:
    good, slow = GOOD_EPOCH_S, SLOW_EPOCH_S
    repo, commits = make_repo(tmp_path, [good, good, slow, slow])  # the steps meet a good and a slow commit
    out = run_bisect(repo, commits[0], commits[-1], tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"first bad commit: {commits[2]}" in out.stdout
    assert "change 2 (slow)" in out.stdout
    assert git(repo, "rev-parse", "HEAD").strip() == commits[-1]  # left where it was


def test_bisect_refuses_when_the_case_passes_at_bad(tmp_path) -> None:
    repo, commits = light_repo(tmp_path, [("change 1", {"notes.txt": "1\n"}), ("change 2", {"notes.txt": "2\n"})])
    out = run_light_bisect(repo, commits[0], commits[-1], tmp_path)
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
                         capture_output=True, text=True)
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


# A checkout with a bench/ of its own, as the project's history has: its pytest runs must
# import this bench/, and the step must not need anything of it. The case times three rounds
# on the checkout's planted timer (each round takes exactly EPOCH_SECONDS) and fails above
# LIMIT_S; it appends the bench/ it imported to $BISECT_TEST_LOG.
OWN_BENCH = 'CHECKOUT = "the bisected checkout"\n'
LIGHT_CASE = """import os

import bench

LIMIT_S = 0.2


def test_units(benchmark):
    if os.environ.get("BISECT_TEST_LOG"):
        with open(os.environ["BISECT_TEST_LOG"], "a") as log:
            log.write(bench.__file__ + "\\n")
    benchmark.pedantic(lambda: None, rounds=3, iterations=1)
    assert benchmark.stats.stats.median <= LIMIT_S, benchmark.stats.stats.median
"""
# An older bisect module without the --step option: argparse exits 2 on it.
OLD_TOOL = 'import argparse\n\nargparse.ArgumentParser().parse_args()\n'
# How a commit can leave the suite unable to run, and pytest's exit code for it.
BROKEN = {
    "syntax error": ({"perf/test_case.py": "def test_units(:\n"}, 2),
    "import error": ({"perf/test_case.py": "from bench.gone import thing\n\n" + LIGHT_CASE}, 2),
    "no case folder": ({"perf/test_case.py": None}, 4),
    "no case selected": ({"perf/test_case.py": LIGHT_CASE.replace("def test_units", "def test_other")}, 5),
}


def commit_changes(repo: Path, changes: Mapping[str, str | None], message: str) -> str:
    """Write (or with None, delete) each file, commit, and return the commit's id."""
    for name, text in changes.items():
        if text is None:
            (repo / name).unlink()
        else:
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            (repo / name).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", message)
    return git(repo, "rev-parse", "HEAD").strip()


def light_repo(tmp_path: Path, history: list[tuple[str, Mapping[str, str | None]]]) -> tuple[Path, list[str]]:
    """A repository with bench/ of its own: the first commit holds the case at GOOD_EPOCH_S,
    each entry of `history` is (message, changes) on top of the one before."""
    repo = tmp_path / "checkout"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    first = {"bench/__init__.py": OWN_BENCH, "bench/delay.py": DELAY.format(seconds=GOOD_EPOCH_S),
             "perf/test_case.py": LIGHT_CASE}
    commits = [commit_changes(repo, first, "change 0")]
    for message, changes in history:
        commits.append(commit_changes(repo, changes, message))
    return repo, commits


def slow() -> dict[str, str | None]:
    return {"bench/delay.py": DELAY.format(seconds=SLOW_EPOCH_S)}


def run_light_bisect(repo: Path, good: str, bad: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The tool of this checkout on `repo` through --repo, from a folder outside it."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "bench.tools.bisect", good, bad, "-k", "test_units", "--path", "perf/",
         "--repo", str(repo), "--", "--benchmark-timer=bench.delay.clock"],
        cwd=elsewhere, capture_output=True, text=True, env=tool_env(**env),
    )


def test_the_step_blames_only_a_failed_test() -> None:
    assert verdict(0) == GOOD
    assert verdict(1) == BAD
    for could_not_run in (2, 3, 4, 5, -9):  # usage, internal, collection error, none selected, killed
        assert verdict(could_not_run) == SKIP


def test_the_checkout_comes_first_on_pythonpath(tmp_path: Path) -> None:
    repo = tmp_path / "checkout"
    env = checkout_env(repo, {"PYTHONPATH": os.pathsep.join(["/installed", str(repo)]), "HOME": "/h"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(repo), "/installed"]
    assert env["HOME"] == "/h"
    assert checkout_env(repo, {})["PYTHONPATH"] == str(repo)


def test_a_step_with_a_broken_command_line_stops_the_bisection(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.tools.bisect_step import main as step_main

    assert step_main(["--repo", "."]) == ABORT  # git bisect run stops instead of calling the commit bad
    assert "required" in capsys.readouterr().err


@pytest.mark.slow
def test_bisect_runs_its_own_step_at_commits_before_the_regrouping(tmp_path: Path) -> None:
    """Commits 0-2 have no bench/tools/ and commit 3 an older bisect without --step: a step
    taken from the commit under test exits 1 or 2 there, which git bisect reads as bad."""
    repo, commits = light_repo(tmp_path, [
        ("change 1", {"notes.txt": "1\n"}),
        ("change 2", {"notes.txt": "2\n"}),
        ("change 3: bench/tools/", {"bench/tools/__init__.py": "", "bench/tools/bisect.py": OLD_TOOL}),
        ("change 4 (slow)", slow()),
        ("change 5", {"notes.txt": "5\n"}),
    ])
    out = run_light_bisect(repo, commits[0], commits[-1], tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"first bad commit: {commits[4]}" in out.stdout
    assert "change 4 (slow)" in out.stdout
    assert "skipped" not in out.stdout  # every commit could run the case
    assert git(repo, "rev-parse", "HEAD").strip() == commits[-1]


@pytest.mark.slow
@pytest.mark.parametrize("broken", BROKEN)
def test_a_commit_where_the_suite_cannot_run_is_skipped_not_blamed(tmp_path: Path, broken: str) -> None:
    """Commit 2 cannot run the case (git bisect tries the middle one first); 3 repairs it, 4 is slow."""
    changes, returncode = BROKEN[broken]
    repo, commits = light_repo(tmp_path, [
        ("change 1", {"notes.txt": "1\n"}),
        (f"change 2 ({broken})", changes),
        ("change 3: repaired", {"perf/test_case.py": LIGHT_CASE}),
        ("change 4 (slow)", slow()),
    ])
    git(repo, "checkout", "-q", commits[2])
    direct = subprocess.run([sys.executable, "-m", "pytest", "perf/", "-k", "test_units", "-p", "no:cacheprovider",
                             "-q", "--benchmark-timer=bench.delay.clock"], cwd=repo, capture_output=True, text=True,
                            env=checkout_env(repo, tool_env()))
    assert direct.returncode == returncode, direct.stdout[-2000:]  # the commit breaks the way it says
    git(repo, "checkout", "-q", "-")
    out = run_light_bisect(repo, commits[0], commits[-1], tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    found = out.stdout[out.stdout.index("first bad commit: "):].splitlines()  # after pytest's own output
    assert found == [f"first bad commit: {commits[4]}", f"  {commits[4][:7]} change 4 (slow)",
                     "skipped, the suite could not run there (1):", f"  {commits[2][:7]} change 2 ({broken})"]


@pytest.mark.slow
def test_repo_runs_the_code_of_that_checkout_not_the_installed_one(tmp_path: Path) -> None:
    """The tool runs from this checkout (first on PYTHONPATH, as an installed copy would be);
    --repo names another with a bench/ of its own. PYTHONSAFEPATH keeps `python -m` from
    putting the working folder on sys.path: only the step's PYTHONPATH brings the checkout in."""
    repo, commits = light_repo(tmp_path, [
        ("change 1", {"notes.txt": "1\n"}),
        ("change 2 (slow)", slow()),
        ("change 3", {"notes.txt": "3\n"}),
    ])
    log = tmp_path / "imported.txt"
    out = run_light_bisect(repo, commits[0], commits[-1], tmp_path, BISECT_TEST_LOG=str(log), PYTHONSAFEPATH="1")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"first bad commit: {commits[2]}" in out.stdout
    imported = log.read_text().splitlines()
    assert len(imported) >= 3  # GOOD, BAD and at least one step
    assert set(imported) == {str(repo / "bench" / "__init__.py")}


def test_only_skipped_commits_left_is_one_line_naming_them() -> None:
    from bench.tools.bisect import BisectError
    from bench.tools.bisect import first_bad

    a, b = "a" * 40, "b" * 40
    output = (f"There are only 'skip'ped commits left to test.\nThe first bad commit could be any of:\n{a}\n{b}\n"
              "We cannot bisect more!\n")
    with pytest.raises(BisectError) as raised:
        first_bad(output)
    assert str(raised.value) == (f"the first bad commit is one of {a[:12]}, {b[:12]}: "
                                 "the suite could not run at the others to tell")
    assert first_bad(f"{a} is the first bad commit\ncommit {a}\n") == a


def test_the_skipped_commits_come_from_the_bisect_log() -> None:
    from bench.tools.bisect import skipped_commits

    a, b, c = "a" * 40, "b" * 40, "c" * 40
    log = (f"git bisect start '{a}' '{b}'\n# skip: [{c}] change 2\ngit bisect skip {c}\n"
           f"# good: [{b}] change 1\ngit bisect good {b}\n")
    assert skipped_commits(log) == (c,)
    assert skipped_commits(f"git bisect good {b}\n") == ()
