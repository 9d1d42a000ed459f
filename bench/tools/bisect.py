"""Find the commit that broke a case, with the same gate the suite uses.

    python -m bench.tools.bisect GOOD BAD -k CASE [--path PATH] [--repo REPO] [-- PYTEST ARGS...]

Runs the case at GOOD to make the baseline and checks that it fails at BAD against
that baseline (otherwise there is nothing to bisect), then drives ``git bisect run``
with a step that runs the case against the baseline (``--benchmark-compare``): a step whose
pytest passes is good, one whose test fails (budget or baseline gate) is bad, and one
that cannot run (collection or usage error) is skipped. Prints the first bad commit
and leaves the repository as it found it (``git bisect reset``).

git bisect does the search; this module only supplies the step and the baseline.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

GOOD, BAD, SKIP = 0, 1, 125  # git bisect run's exit codes


EPILOG = """\
Everything after -- goes to each pytest run unchanged (profile, device, budgets, ...),
at GOOD, at BAD and at every step, e.g.:

    python -m bench.tools.bisect v1.2 HEAD -k units-1024 -- --profile quick --device cuda:1
"""


class BisectError(Exception):
    """The bisection cannot start; the message says why."""


def git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise BisectError(f"git {' '.join(args)}: {result.stderr.strip() or result.stdout.strip()}")
    return result


def pytest_command(path: str, case: str, extra: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", path, "-k", case, "-p", "no:cacheprovider", "-q", *extra]


def step(path: str, case: str, baseline: Path, extra: Sequence[str], cwd: Path | None = None) -> int:
    """One bisection step in the checkout at `cwd` (default: here): 0 good, 1 bad, 125 skip."""
    result = subprocess.run(pytest_command(path, case, [f"--benchmark-compare={baseline}", *extra]), cwd=cwd)
    if result.returncode == 0:
        return GOOD
    if result.returncode == 1:  # tests ran and one failed its gate
        return BAD
    return SKIP


def make_baseline(repo: Path, good: str, case: str, path: str, baseline: Path, extra: Sequence[str]) -> None:
    """Run the case at GOOD into `baseline`; it must pass there."""
    git(repo, "checkout", "-q", good)
    made = subprocess.run(pytest_command(path, case, [f"--benchmark-json={baseline}", *extra]), cwd=repo)
    if made.returncode != 0 or not baseline.is_file():
        raise BisectError(f"the case {case!r} does not pass at GOOD ({good}); nothing to bisect against")


def check_fails_at_bad(repo: Path, bad: str, case: str, path: str, baseline: Path, extra: Sequence[str]) -> None:
    """Run the step at BAD: git bisect would otherwise name a first bad commit that is not one."""
    git(repo, "checkout", "-q", bad)
    verdict = step(path, case, baseline, extra, cwd=repo)
    if verdict == GOOD:
        raise BisectError(f"the case passes at BAD ({bad}): nothing to bisect")
    if verdict == SKIP:
        raise BisectError(f"the case cannot run at BAD ({bad}): pytest stopped with a usage or collection error")


def bisect(repo: Path, good: str, bad: str, case: str, path: str, extra: Sequence[str]) -> str:
    """The first bad commit's id."""
    if git(repo, "status", "--porcelain", "--untracked-files=no").stdout.strip():
        raise BisectError(f"{repo}: uncommitted changes; commit or stash them before bisecting")
    for rev in (good, bad):
        git(repo, "rev-parse", "--verify", f"{rev}^{{commit}}")
    start = git(repo, "rev-parse", "--abbrev-ref", "HEAD").stdout.strip()
    if start == "HEAD":
        start = git(repo, "rev-parse", "HEAD").stdout.strip()
    with tempfile.TemporaryDirectory(prefix="loadbench-bisect-") as tmp:
        baseline = Path(tmp) / "good.json"
        try:
            make_baseline(repo, good, case, path, baseline, extra)
            check_fails_at_bad(repo, bad, case, path, baseline, extra)
        finally:
            git(repo, "checkout", "-q", start)
        git(repo, "bisect", "start", bad, good)
        try:
            run = git(repo, "bisect", "run", sys.executable, "-m", "bench.tools.bisect", "--step", "--baseline", str(baseline),
                      "-k", case, "--path", path, "--", *extra, check=False)  # fmt: skip
            found = re.search(r"^([0-9a-f]{40}) is the first bad commit", run.stdout, re.MULTILINE)
            if found is None:
                raise BisectError(f"git bisect found no first bad commit:\n{run.stdout[-2000:]}{run.stderr[-2000:]}")
            return found.group(1)
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
    parser.add_argument("--repo", type=Path, default=Path("."), help="the git repository. Default: .")
    parser.add_argument("--step", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--baseline", type=Path, help=argparse.SUPPRESS)
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    args, pytest_args = parser.parse_args(argv[:split]), argv[split + 1 :]  # after --: for pytest
    if args.step:
        return step(args.path, args.case, args.baseline, pytest_args)
    if not args.good or not args.bad:
        parser.error("GOOD and BAD commits are required")
    try:
        commit = bisect(args.repo.resolve(), args.good, args.bad, args.case, args.path, pytest_args)
    except BisectError as exc:
        print(f"mlp-loadbench bisect: {exc}", file=sys.stderr)
        return 2
    subject = git(args.repo, "log", "-1", "--format=%h %s", commit).stdout.strip()
    print(f"first bad commit: {commit}\n  {subject}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
