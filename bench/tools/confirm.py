"""Paired runs for the CI command: re-measure the cases a run found slower than main's
history, alternately at main's commit (a git worktree) and at the change, in fresh
processes on this machine, and let bench/gate/paired.py decide.

`confirm` returns each re-judged case's `Paired` and rewrites the run file's verdicts,
so what is stored, summarised and pushed is the decision after pairing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

from bench.gate.paired import Paired
from bench.gate.paired import first_limit
from bench.gate.paired import pair_ratios
from bench.gate.paired import time_only
from bench.gate.runs import BaselineError
from bench.gate.runs import read_run
from bench.gate.timing import CALL_TIME
from bench.gate.timing import EPOCH_TIME
from bench.gate.timing import LATENCY
from bench.gate.verdict import Verdict
from bench.gate.verdict import after_pairing
from kernels.ground.files import write_atomic

TIMED = {EPOCH_TIME.metric: EPOCH_TIME, CALL_TIME.metric: CALL_TIME, LATENCY.metric: LATENCY}
PLANT = "--plant-slowdown"  # the change's own: main's side runs without it


@dataclass
class Confirmation:
    """What the paired runs decided, or why none ran."""

    paired: dict[str, Paired] = field(default_factory=dict)  # test id -> its pairs
    unpaired: dict[str, str] = field(default_factory=dict)  # test id -> why its first verdict stands
    commit: str | None = None  # main's commit, measured beside the change


def candidates(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Test id -> stored verdict, for the cases that regressed on time alone."""
    found = {}
    for bench in run["benchmarks"]:
        verdict = (bench.get("extra_info") or {}).get("verdict")
        if isinstance(verdict, dict) and verdict.get("status") == "regressed" and time_only(verdict.get("failures")):
            found[str(bench["fullname"])] = verdict
    return found


def without_plant(args: Sequence[str]) -> list[str]:
    """pytest arguments for main's side: the change's planted slowdown left out."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg == PLANT:
            skip = True
        elif not arg.startswith(PLANT + "="):
            out.append(arg)
    return out


def records(run_path: Path) -> dict[str, dict[str, Any]]:
    """Test id -> extra_info of a paired run's file; empty where it wrote none or a broken one."""
    try:
        run = read_run(run_path)
    except BaselineError:
        return {}
    return {str(bench.get("fullname")): bench.get("extra_info") or {} for bench in run["benchmarks"]}


def git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)


def has_commit(repo: Path, commit: str) -> bool:
    """Whether `commit` is in `repo`, fetching it from origin where the checkout is shallow."""
    if git(repo, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}").returncode == 0:
        return True
    git(repo, "fetch", "--quiet", "--depth=1", "origin", commit)
    return git(repo, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}").returncode == 0


def confirm(
    run_file: Path, main_commit: str | None, *, repo: Path, tier: str,
    pytest_args: Sequence[str], pairs: int, out: Path, say: Callable[[str], None] = print,
) -> Confirmation:
    """Pair the time regressions of `run_file` and rewrite their verdicts there."""
    run = read_run(run_file)
    found = candidates(run)
    result = Confirmation(commit=main_commit)
    if not found:
        return result
    why = None
    if pairs < 1:
        why = "paired runs turned off (--pairs 0)"
    elif not main_commit or main_commit == "unknown":
        why = "the baseline run names no commit to measure beside this one"
    elif not has_commit(repo, main_commit):
        why = f"main's commit {main_commit[:8]} is not in this checkout and could not be fetched"
    if why is not None:
        result.unpaired = dict.fromkeys(found, why)
        return result
    folder = out / "paired"
    folder.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="loadbench-main-"))
    checkout = work / "main"
    try:
        added = git(repo, "worktree", "add", "--detach", "--force", str(checkout), main_commit)  # type: ignore[arg-type]
        if added.returncode != 0:
            first = (added.stderr.strip().splitlines() or ["git worktree add failed"])[0]
            result.unpaired = dict.fromkeys(found, f"no checkout of main's commit: {first}")
            return result
        tests = list(found)
        figures: dict[str, dict[str, list[float | None]]] = {t: {"main": [], "change": []} for t in tests}
        failed_sides: set[str] = set()
        for index in range(pairs):
            order = ("main", "change") if index % 2 == 0 else ("change", "main")  # ABBA: drift cancels
            for side in order:
                path = folder / f"{side}-{index + 1}.json"
                cwd = checkout if side == "main" else repo
                args = without_plant(pytest_args) if side == "main" else list(pytest_args)
                command = [sys.executable, "-m", "pytest", *tests, f"--tier={tier}", f"--benchmark-json={path}",
                           f"--series-dir={folder / 'series' / f'{side}-{index + 1}'}", "-p", "no:cacheprovider",
                           "-q", *args]
                env = {**os.environ, "PYTHONPATH": str(cwd)}
                say(f"mlp-loadbench ci: paired run {index + 1}/{pairs}, {side}: {len(tests)} case(s)")
                done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
                if not path.is_file():
                    failed_sides.add(side)
                    tail = (done.stdout + done.stderr).strip().splitlines()[-1:] or [f"exit {done.returncode}"]
                    say(f"mlp-loadbench ci: paired run {side} wrote no run file: {tail[0]}")
                measured = records(path)
                for test in tests:
                    timed = TIMED[next(f["metric"] for f in found[test]["failures"] if f["metric"] in TIMED)]
                    figures[test][side].append(timed.figure(measured[test]) if test in measured else None)
        for test, verdict in found.items():
            ratios = pair_ratios(figures[test]["main"], figures[test]["change"])
            if not ratios:
                side = "main's checkout" if "main" in failed_sides else "this checkout"
                result.unpaired[test] = f"the paired runs measured it in no pair ({side} did not run it)"
                continue
            result.paired[test] = Paired(ratios, first_limit(verdict["failures"]), main_commit)  # type: ignore[arg-type]
    finally:
        git(repo, "worktree", "remove", "--force", str(checkout))
        shutil.rmtree(work, ignore_errors=True)
    rewrite(run_file, run, result.paired)
    return result


def rewrite(run_file: Path, run: dict[str, Any], paired: dict[str, Paired]) -> None:
    """Store the verdicts after pairing in the run file itself (atomically)."""
    if not paired:
        return
    for bench in run["benchmarks"]:
        pairs = paired.get(str(bench.get("fullname")))
        if pairs is not None:
            verdict = Verdict.from_dict(bench["extra_info"]["verdict"])
            bench["extra_info"]["verdict"] = after_pairing(verdict, pairs).as_dict()
    write_atomic(run_file, json.dumps(run, indent=4))
