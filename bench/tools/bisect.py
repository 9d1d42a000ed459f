"""Find the commit that broke a case, with the same gate the suite uses.

    python -m bench.tools.bisect GOOD BAD -k CASE [--path PATH] [--repo REPO] [-- PYTEST ARGS...]

Runs the case at GOOD to make the baseline, checks that it fails at BAD against it, then
drives ``git bisect run`` with a step that runs the case against the baseline: pytest
passing is good, a failed test is bad, a suite that cannot run (usage, internal or
collection error, no test selected) is skipped. The step (bench/tools/bisect_step.py) is
copied out of the repository before the first checkout, so its logic is this tool's at
every commit while the code it tests is the commit's (REPO first on PYTHONPATH). Prints
the first bad commit and the skipped ones, and leaves the repository as it found it.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.tools import bisect_step
from bench.tools.bisect_step import GOOD
from bench.tools.bisect_step import SKIP
from bench.tools.bisect_step import absolute_pythonpath
from bench.tools.bisect_step import run_pytest

STEP_SCRIPT = "loadbench_bisect_step.py"  # the step's copy in the temporary folder


EPILOG = """\
Everything after -- goes to each pytest run unchanged (profile, device, budgets, ...),
at GOOD, at BAD and at every step, e.g.:

    python -m bench.tools.bisect v1.2 HEAD -k units-1024 -- --profile quick --device cuda:1
"""


class BisectError(Exception):
    """The bisection cannot start; the message says why."""


@dataclass(frozen=True)
class Found:
    """What a bisection found: the first bad commit and the commits it skipped."""

    first_bad: str
    skipped: tuple[str, ...]


def git(
    repo: Path, *args: str, check: bool = True, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run git in `repo`; BisectError with git's message when it fails and `check` is set."""
    result = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, env=env)
    if check and result.returncode != 0:
        raise BisectError(f"git {' '.join(args)}: {result.stderr.strip() or result.stdout.strip()}")
    return result


def make_baseline(repo: Path, good: str, case: str, path: str, baseline: Path, extra: Sequence[str]) -> None:
    """Run the case at GOOD into `baseline`; it must pass there."""
    git(repo, "checkout", "-q", good)
    made = run_pytest(repo, path, case, [f"--benchmark-json={baseline}", *extra])
    if made != 0 or not baseline.is_file():
        raise BisectError(f"the case {case!r} does not pass at GOOD ({good}); nothing to bisect against")


def check_fails_at_bad(repo: Path, bad: str, case: str, path: str, baseline: Path, extra: Sequence[str]) -> None:
    """Run the step at BAD: git bisect would otherwise name a first bad commit that is not one."""
    git(repo, "checkout", "-q", bad)
    verdict = bisect_step.step(repo, path, case, baseline, extra)
    if verdict == GOOD:
        raise BisectError(f"the case passes at BAD ({bad}): nothing to bisect")
    if verdict == SKIP:
        raise BisectError(f"the case cannot run at BAD ({bad}): pytest stopped with a usage or collection error")


def copy_step(folder: Path) -> Path:
    """This tool's step script, copied into `folder`: the checkouts to come may change or
    remove the repository's bench/tools/ (even this tool's own file when it bisects its own
    repository)."""
    return Path(shutil.copyfile(bisect_step.__file__, folder / STEP_SCRIPT))


def skipped_commits(log: str) -> tuple[str, ...]:
    """The commits `git bisect log` says were skipped, in the order they were."""
    return tuple(dict.fromkeys(re.findall(r"^git bisect skip ([0-9a-f]{40})", log, re.MULTILINE)))


def first_bad(output: str) -> str:
    """The first bad commit in `git bisect run`'s output; BisectError when it names none."""
    found = re.search(r"^([0-9a-f]{40}) is the first bad commit", output, re.MULTILINE)
    if found is not None:
        return found.group(1)
    if "only 'skip'ped commits left to test" in output:
        between = re.findall(r"^([0-9a-f]{40})$", output, re.MULTILINE)
        raise BisectError(f"the first bad commit is one of {', '.join(c[:12] for c in between)}: "
                          "the suite could not run at the others to tell")
    raise BisectError(f"git bisect found no first bad commit:\n{output[-4000:]}")


def toplevel(repo: Path) -> Path:
    """The root of the work tree that holds `repo`; BisectError when it is not in one."""
    return Path(git(repo, "rev-parse", "--show-toplevel").stdout.strip()).resolve()


def bisect(repo: Path, good: str, bad: str, case: str, path: str, extra: Sequence[str]) -> Found:
    """Bisect the case between GOOD and BAD in the work tree at `repo`; the first bad commit
    and the skipped ones. Leaves `repo` at the branch or commit it was on."""
    repo = toplevel(repo)
    if git(repo, "status", "--porcelain", "--untracked-files=no").stdout.strip():
        raise BisectError(f"{repo}: uncommitted changes; commit or stash them before bisecting")
    for rev in (good, bad):
        git(repo, "rev-parse", "--verify", f"{rev}^{{commit}}")
    start = git(repo, "rev-parse", "--abbrev-ref", "HEAD").stdout.strip()
    if start == "HEAD":
        start = git(repo, "rev-parse", "HEAD").stdout.strip()
    # The step runs with cwd = the repository: a PYTHONPATH=. given here must still mean here.
    env = absolute_pythonpath(os.environ, Path.cwd())
    with tempfile.TemporaryDirectory(prefix="loadbench-bisect-") as tmp:
        step = copy_step(Path(tmp))  # before any checkout
        baseline = Path(tmp) / "good.json"
        try:
            make_baseline(repo, good, case, path, baseline, extra)
            check_fails_at_bad(repo, bad, case, path, baseline, extra)
        finally:
            git(repo, "checkout", "-q", start)
        git(repo, "bisect", "start", bad, good)
        try:
            run = git(repo, "bisect", "run", sys.executable, str(step), "--repo", str(repo),
                      "--baseline", str(baseline), "-k", case, "--path", path, "--", *extra, check=False, env=env)
            skipped = skipped_commits(git(repo, "bisect", "log", check=False).stdout)
            return Found(first_bad(run.stdout + run.stderr), skipped)
        finally:
            git(repo, "bisect", "reset", check=False)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.tools.bisect",
        usage="%(prog)s GOOD BAD -k CASE [--path PATH] [--repo REPO] [-- PYTEST ARGS...]",
        description=__doc__.split("\n\n")[0],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,  # keep the epilog's lines
    )
    parser.add_argument("good", nargs="?", metavar="GOOD", help="a commit where the case passes")
    parser.add_argument("bad", nargs="?", metavar="BAD", help="a commit where it fails")
    parser.add_argument("-k", dest="case", required=True, help="the case (a pytest -k expression)")
    parser.add_argument("--path", default="bench/", help="what pytest runs. Default: bench/")
    parser.add_argument("--repo", type=Path, default=Path("."),
                        help="the git repository whose code is bisected (pytest imports its bench/, model/, kernels/). "
                             "Default: .")
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    args, pytest_args = parser.parse_args(argv[:split]), argv[split + 1 :]  # after --: for pytest
    if not args.good or not args.bad:
        parser.error("GOOD and BAD commits are required")
    try:
        found = bisect(args.repo.resolve(), args.good, args.bad, args.case, args.path, pytest_args)
    except BisectError as exc:
        print(f"mlp-loadbench bisect: {exc}", file=sys.stderr)
        return 2
    print(f"first bad commit: {found.first_bad}\n  {describe(args.repo, found.first_bad)}")
    if found.skipped:
        print(f"skipped, the suite could not run there ({len(found.skipped)}):")
        print("\n".join(f"  {describe(args.repo, commit)}" for commit in found.skipped))
    return 0


def describe(repo: Path, commit: str) -> str:
    """A commit's short id and subject."""
    return git(repo, "log", "-1", "--format=%h %s", commit).stdout.strip()


if __name__ == "__main__":
    sys.exit(main())
