"""History that outlives a runner: main's runs on a data branch of a git repository.

    python -m bench.tools.databranch push run.json --repo origin --series series/
    python -m bench.tools.databranch pull --repo origin --out history/ [--gpu "NVIDIA H100 80GB HBM3"]
    python -m bench.tools.databranch build --repo origin --out site/ [--extra pr-run.json]

Every runner commits its run to one branch (default ``bench-data``) holding no code, as
github-action-benchmark and asv publish results: ``runs/<gpu-slug>/<datetime>_<commit8>_
<runner>.json``. Names never collide, so runners pushing at once only race for the tip,
and a rejected push is redone on the new tip. Every git command runs in a temporary
clone. Exit status: 0 done; 1 the push was rejected on every attempt, or nothing to
report; 2 bad input or an unreachable repository, before anything is pushed.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from collections.abc import Sequence
from datetime import datetime
from datetime import timezone
from pathlib import Path
from typing import Any

from tabulate import tabulate

from kernels.ground.args import at_least
from kernels.ground.args import directory_problem
from kernels.ground.args import seconds_at_least
from bench.gate.runs import run_state
from bench.gate.runs import BaselineError
from bench.gate.runs import gpu_name
from bench.gate.runs import read_run
from bench.tools.report import ReportError
from bench.tools.report import build_report
from bench.gate.runs import load_runs
from kernels.ground import env as loadbench_env
from kernels.ground.files import write_atomic

DEFAULT_BRANCH = "bench-data"
MAX_SERIES_ROWS = 500  # enough for the resource figures' shape; a full series can be 100x that
IDENTITY = {  # git setting: (environment variable that overrides it, default); a fresh runner has neither
    "user.name": ("LOADBENCH_GIT_NAME", "mlp-loadbench"),
    "user.email": ("LOADBENCH_GIT_EMAIL", "mlp-loadbench@localhost"),
}
# Variables that would point git at the caller's repository instead of our temporary clone.
LOCATING = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_COMMON_DIR")


class DataBranchError(Exception):
    """A refusal or a failure, said in one line; `code` is the exit status."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def git(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run git (never raising on its exit status) with our identity; with `cwd`, in our
    temporary clone, whatever repository the caller's environment names."""
    settings = [f"{key}={loadbench_env.read(var) or default}" for key, (var, default) in IDENTITY.items()]
    settings += ["commit.gpgsign=false", "advice.detachedHead=false"]  # a runner's global config may sign
    env = None if cwd is None else {k: v for k, v in os.environ.items() if k not in LOCATING}
    command = ["git", *(part for s in settings for part in ("-c", s)), *args]
    try:
        return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise DataBranchError("git: not found on PATH; the data branch is read and written with git") from None


# Prefixes of git's message lines; its first line says what is wrong, later ones give advice.
GIT_LEVELS = ("fatal: ", "error: ")
GIT_ADVICE = ("hint:", "warning:")


def first_line(result: subprocess.CompletedProcess[str]) -> str:
    """What git said is wrong: its first line that is not a hint or a warning, without its
    'fatal: ' (git ends such messages with advice, such as "...and the repository exists.")."""
    lines = [line.strip() for line in (result.stderr or result.stdout).splitlines() if line.strip()]
    said = [line for line in lines if not line.startswith(GIT_ADVICE)] or lines
    if not said:
        return f"git exited with {result.returncode}"
    line = said[0]
    for level in GIT_LEVELS:
        line = line.removeprefix(level)
    return shown(line)


def check_branch(branch: str) -> None:
    """DataBranchError (exit 2) unless `branch` is a branch name by git's own rules
    (`git check-ref-format --branch`, which also refuses a leading dash)."""
    checked = git("check-ref-format", "--branch", branch)
    if checked.returncode != 0 or checked.stdout.strip() != branch:  # @{-1} would name another branch
        raise DataBranchError(f"--branch {branch}: not a valid branch name by git's rules "
                              "(git check-ref-format --branch)")


def push_reason(result: subprocess.CompletedProcess[str]) -> str:
    """Why git refused a push: its "! [rejected] ... (why)" line and what the remote said."""
    lines = [line.strip() for line in result.stderr.splitlines()]
    said = [line for line in lines if line.startswith("!")] + [line for line in lines if line.startswith("remote:")]
    return shown("; ".join(said)) or first_line(result)


def slug(text: str) -> str:
    """A folder-safe name: lower case, runs of other characters as one dash (as the
    history page's section ids are made)."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def shown(repo: str) -> str:
    """A repository (or git's message naming it) as we print it: URLs without the token they may carry."""
    return re.sub(r"(://)[^/@]+@", r"\1", repo)


def resolve_repo(repo: str) -> str:
    """A path (made absolute: git runs elsewhere), a remote of the current checkout (its
    URL), or a URL as given."""
    if Path(repo).exists():
        return str(Path(repo).resolve())
    if re.fullmatch(r"[A-Za-z0-9._-]+", repo):
        found = git("remote", "get-url", repo)
        if found.returncode == 0:
            return found.stdout.strip()
    return repo


def branch_exists(repo: str, branch: str) -> bool:
    """Whether `repo` has `branch`; DataBranchError (exit 2) when it cannot be reached."""
    found = git("ls-remote", "--exit-code", "--heads", repo, f"refs/heads/{branch}")
    if found.returncode == 2:  # reached, no such branch
        return False
    if found.returncode != 0:
        raise DataBranchError(f"repository {shown(repo)}: cannot be reached: {first_line(found)}")
    return True


def checkout_tip(repo: str, branch: str, into: Path) -> bool:
    """A new repository in `into` on `branch` at `repo`'s tip of it (shallow, that branch
    only), or on a new orphan branch where `repo` has none; whether it had one."""
    into.mkdir(parents=True, exist_ok=True)
    for args in (("init", "-q"), ("symbolic-ref", "HEAD", f"refs/heads/{branch}")):
        _check(git(*args, cwd=into), "git " + args[0])
    if not branch_exists(repo, branch):
        return False
    _check(git("fetch", "-q", "--depth", "1", repo, f"refs/heads/{branch}", cwd=into), f"fetch {shown(repo)}")
    _check(git("reset", "-q", "--hard", "FETCH_HEAD", cwd=into), "checkout")
    return True


def _check(result: subprocess.CompletedProcess[str], what: str) -> None:
    if result.returncode != 0:
        raise DataBranchError(f"{what}: {first_line(result)}", code=1)


def run_time(run: dict[str, Any]) -> datetime:
    """The run's own datetime in UTC (pytest-benchmark writes ISO 8601; naive is UTC);
    now where the run has none readable."""
    try:
        when = datetime.fromisoformat(str(run.get("datetime", "")).replace("Z", "+00:00"))
    except ValueError:
        return datetime.now(timezone.utc)
    return when.replace(tzinfo=timezone.utc) if when.tzinfo is None else when.astimezone(timezone.utc)


def run_stem(run: dict[str, Any], runner: str) -> str:
    """<datetime to the second>_<commit8>_<runner>: unique for reruns of one commit and
    for runners that finish in the same second; sorts by time."""
    commit = str((run.get("commit_info") or {}).get("id") or "unknown")[:8]
    return f"{run_time(run):%Y%m%dT%H%M%SZ}_{slug(commit)}_{slug(runner)[:24]}"


def thin(text: str, limit: int = MAX_SERIES_ROWS) -> str:
    """A series CSV with its header and every k-th row, k the smallest that leaves at most `limit`."""
    header, *rows = text.splitlines()
    step = max(1, math.ceil(len(rows) / limit))
    return "\n".join([header, *rows[::step]]) + "\n"


def series_files(run: dict[str, Any], folder: Path) -> tuple[dict[str, str], list[str]]:
    """The run's series found in `folder`, thinned (file name -> CSV), and the names it
    records that are not there."""
    names = [Path(b["extra_info"]["series_path"]).name for b in run["benchmarks"]
             if isinstance(b, dict) and (b.get("extra_info") or {}).get("series_path")]
    found = {name: thin((folder / name).read_text(encoding="utf-8")) for name in names if (folder / name).is_file()}
    return found, [name for name in names if name not in found]


def read_input(path: Path) -> dict[str, Any]:
    """An mlp-loadbench run, or DataBranchError (exit 2) saying what the file is."""
    try:
        return read_run(path)
    except BaselineError as exc:
        raise DataBranchError(str(exc).replace("baseline ", "run ", 1).split("; ", 1)[0]) from None


def push(run_path: Path, repo: str, branch: str = DEFAULT_BRANCH, runner: str = "", series: Path | None = None,
         attempts: int = 5, backoff: float = 2.0, say: Callable[[str], None] = print) -> str:
    """Commit the run (and its thinned series) to `branch` of `repo` and push, redoing the
    commit on the new tip after a rejected push; the run's path on the branch."""
    if attempts < 1:
        raise DataBranchError(f"--attempts {attempts}: must be at least 1")
    if not (math.isfinite(backoff) and backoff >= 0):  # time.sleep would refuse it after a rejected push
        raise DataBranchError(f"--backoff {backoff}: must be a finite number of seconds, at least 0")
    check_branch(branch)
    run = read_input(run_path)
    if series is not None and not series.is_dir():
        raise DataBranchError(f"--series {series}: not a folder")
    gpu = gpu_name(run["machine_info"])
    stem = run_stem(run, runner or default_runner())
    state = run_state(run)
    if not state.whole:  # marked in its name too, so a listing of the branch shows it
        stem += f"_{state.state}"
        say(f"note: {state.line()}; stored as {stem}")
    name = f"runs/{slug(gpu)}/{stem}.json"
    files = {name: run_path.read_bytes()}
    if series is not None:
        found, missing = series_files(run, series)
        files |= {f"series/{stem}/{csv}": text.encode() for csv, text in found.items()}
        if missing:
            say(f"note: {len(missing)} series the run records are not in {series} (first: {missing[0]})")
    url = resolve_repo(repo)
    commit = str((run.get("commit_info") or {}).get("id") or "unknown")[:8]
    message = f"bench: {commit} on {gpu} ({stem})"
    reason = ""
    for attempt in range(1, attempts + 1):
        with tempfile.TemporaryDirectory(prefix="mlp-loadbench-data-") as tmp:
            clone = Path(tmp)
            checkout_tip(url, branch, clone)
            if (clone / name).is_file():  # the same run pushed again: nothing to add
                if (clone / name).read_bytes() == files[name]:
                    say(f"{name} is already on {branch} of {shown(url)}")
                    return name
                raise DataBranchError(f"{branch} of {shown(url)} already holds a different {name}", code=1)
            for path, data in files.items():
                (clone / path).parent.mkdir(parents=True, exist_ok=True)
                (clone / path).write_bytes(data)
            _check(git("add", "--", *files, cwd=clone), "git add")
            _check(git("commit", "-q", "--no-verify", "-m", message, cwd=clone), "git commit")
            pushed = git("push", "-q", url, f"HEAD:refs/heads/{branch}", cwd=clone)
        if pushed.returncode == 0:
            say(f"pushed {name} to {branch} of {shown(url)} (attempt {attempt} of {attempts})")
            return name
        reason = push_reason(pushed)
        if attempt < attempts:
            say(f"push rejected (attempt {attempt} of {attempts}): {reason}; trying again on the new tip")
            time.sleep(backoff * attempt)
    raise DataBranchError(f"push to {branch} of {shown(url)} gave up after {attempts} attempts: {reason}", code=1)


def default_runner() -> str:
    return os.environ.get("RUNNER_NAME") or socket.gethostname() or "runner"


def pull(repo: str, out: Path, branch: str = DEFAULT_BRANCH, gpu: str | None = None,
         say: Callable[[str], None] = print) -> dict[str, int]:
    """Copy the branch's runs (of one GPU model where `gpu` names one, by name or slug)
    into `out`/runs/<gpu-slug>/, with their series under `out`/series/<stem>/; runs per
    GPU slug. A repository without the branch gives an empty folder and a note."""
    check_branch(branch)
    problem = directory_problem(out)
    if problem:
        raise DataBranchError(f"--out {out}: {problem}")
    url = resolve_repo(repo)
    with tempfile.TemporaryDirectory(prefix="mlp-loadbench-data-") as tmp:
        clone = Path(tmp)
        if not checkout_tip(url, branch, clone):
            say(f"note: {shown(url)} has no branch {branch} yet: no history to pull (a first run has none)")
            return {}
        folders = sorted(p for p in (clone / "runs").glob("*") if p.is_dir() and (gpu is None or p.name == slug(gpu)))
        counts = {}
        for folder in folders:
            runs = sorted(folder.glob("*.json"))
            counts[folder.name] = len(runs)
            for run in runs:
                _copy(run, out / "runs" / folder.name / run.name)
                if (clone / "series" / run.stem).is_dir():
                    shutil.copytree(clone / "series" / run.stem, out / "series" / run.stem, dirs_exist_ok=True)
    if gpu is not None and not counts:
        say(f"note: {branch} of {shown(url)} holds no runs on {gpu} (folder runs/{slug(gpu)})")
    return counts


def _copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)


INDEX = """<!doctype html>
<meta charset="utf-8">
<meta http-equiv="refresh" content="0; url=history.html">
<title>mlp-loadbench history</title>
<p><a href="history.html">mlp-loadbench history</a> (one section per GPU model)</p>
"""


def build(repo: str, out: Path, branch: str = DEFAULT_BRANCH, extra: Sequence[Path] = (),
          series_roots: Sequence[Path] = (), window: int = 50,
          say: Callable[[str], None] = print) -> tuple[list[Path], list[str]]:
    """The report (bench.tools.report) of the branch's runs and the `extra` ones, written
    into `out` with an index.html that opens history.html: a GitHub Pages site."""
    for path in extra:
        read_input(path)
    check_branch(branch)
    problem = directory_problem(out, keep=False)  # made by the report, once there is one
    if problem:
        raise DataBranchError(f"--out {out}: {problem}")
    with tempfile.TemporaryDirectory(prefix="mlp-loadbench-history-") as tmp:
        pulled = Path(tmp)
        counts = pull(repo, pulled, branch, say=say)
        say(counts_table(counts))
        paths = sorted(pulled.glob("runs/*/*.json")) + list(extra)
        runs, _ = load_runs(paths)  # the report draws the newest run's series: find its folder
        trained = [run for run in runs if run.cases()]
        newest = [pulled / "series" / trained[-1].path.stem] if trained else []
        roots = [*series_roots, *(p for p in newest if p.is_dir())]
        written, warnings = build_report(paths, out, window, roots)
    if out / "history.html" in written:
        written.append(write_atomic(out / "index.html", INDEX))
    return written, warnings


def counts_table(counts: dict[str, int]) -> str:
    rows = [[gpu, n] for gpu, n in counts.items()]
    return tabulate(rows, headers=["GPU model (folder)", "runs"], tablefmt="github") if rows else "0 runs"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tools.databranch", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--repo", default="origin", help="a remote of this checkout, a URL or a path. Default: origin")
    common.add_argument("--branch", default=DEFAULT_BRANCH, help=f"the data branch. Default: {DEFAULT_BRANCH}")
    pushing = commands.add_parser("push", parents=[common], help="add one run to the data branch")
    pushing.add_argument("run", type=Path, metavar="RUN.json")
    pushing.add_argument("--series", type=Path, metavar="DIR", help="where the run wrote its series (--series-dir)")
    pushing.add_argument("--runner", default="",
                         help="the runner's name in the file name. Default: $RUNNER_NAME or the host name")
    pushing.add_argument("--attempts", type=at_least(1), default=5, metavar="N",
                         help="pushes to try before giving up. Default: 5")
    pushing.add_argument("--backoff", type=seconds_at_least(0), default=2.0, metavar="S",
                         help="seconds to wait after the n-th rejected push, times n. Default: 2.0")
    pulling = commands.add_parser("pull", parents=[common], help="copy the branch's runs into a folder")
    pulling.add_argument("--out", type=Path, required=True, metavar="DIR")
    pulling.add_argument("--gpu", default=None, metavar="NAME", help="only this GPU model (its name or folder)")
    building = commands.add_parser("build", parents=[common], help="the history page of the branch's runs")
    building.add_argument("--out", type=Path, default=Path("site"), metavar="DIR", help="Default: site")
    building.add_argument("--extra", type=Path, action="append", default=[], metavar="RUN.json",
                          help="a run not on the branch (a pull request's own); repeatable")
    building.add_argument("--series-root", type=Path, action="append", default=[], help="where --extra's series are")
    building.add_argument("--window", type=int, default=50, choices=(50, 100),
                          help="moving-average window. Default: 50")
    args = parser.parse_args(argv)
    loadbench_env.check("mlp-loadbench history")
    try:
        if args.command == "push":
            push(args.run, args.repo, args.branch, args.runner, args.series, args.attempts, args.backoff)
        elif args.command == "pull":
            print(counts_table(pull(args.repo, args.out, args.branch, args.gpu)))
        else:
            return _build(args)
    except DataBranchError as exc:
        print(f"mlp-loadbench history: {exc}", file=sys.stderr)
        return exc.code
    return 0


def _build(args: argparse.Namespace) -> int:
    try:
        written, warnings = build(args.repo, args.out, args.branch, args.extra, args.series_root, args.window)
    except ReportError as exc:
        print(f"mlp-loadbench history: {exc}", file=sys.stderr)
        return 1
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
