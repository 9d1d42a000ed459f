"""One step of ``git bisect run`` for bench.tools.bisect: run the case on the checked-out commit.

    python STEP.py --repo REPO --baseline GOOD.json -k CASE --path PATH [-- PYTEST ARGS...]

bench.tools.bisect copies this file into its temporary folder, outside the repository, before
the first checkout, and git bisect runs that copy with the tool's python. The step's logic is
therefore the tool's own, whatever the commit under test holds (an older commit may have no
bench/tools/ at all, or one with other options), while the code under test is the commit's:
pytest runs in REPO with REPO first on PYTHONPATH, so its bench/, model/ and kernels/ are
imported, never an installed copy's.

This file runs on its own, as a script: it imports nothing from the project.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path

from kernels.ground.processes import checkout_env

GOOD, BAD, SKIP = 0, 1, 125  # git bisect run's exit codes
ABORT = 128  # git bisect run stops on codes above 127: a step that cannot work must not blame a commit
TESTS_FAILED = 1  # pytest.ExitCode.TESTS_FAILED: the only pytest failure that blames a commit


def pytest_command(path: str, case: str, extra: Sequence[str]) -> list[str]:
    """The pytest command line of one run of the case, with this python."""
    return [sys.executable, "-m", "pytest", path, "-k", case, "-p", "no:cacheprovider", "-q", *extra]


def absolute_pythonpath(environ: Mapping[str, str], cwd: Path) -> dict[str, str]:
    """`environ` with each relative PYTHONPATH entry made absolute against `cwd`: pytest runs
    in the repository, where `PYTHONPATH=.` would name something else."""
    env = dict(environ)
    entries = [str(cwd / entry) for entry in environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    if entries:
        env["PYTHONPATH"] = os.pathsep.join(entries)
    return env


def run_pytest(repo: Path, path: str, case: str, extra: Sequence[str]) -> int:
    """Run the case on the checkout at `repo`, importing its code; pytest's exit code."""
    env = checkout_env(repo, absolute_pythonpath(os.environ, Path.cwd()))
    return subprocess.run(pytest_command(path, case, extra), cwd=repo, env=env).returncode


def verdict(returncode: int) -> int:
    """git bisect run's verdict on a pytest exit code: pass is good, a failed test is bad, and
    a suite that could not run (usage, internal or collection error, no test selected, killed)
    is skipped, since it says nothing about the case."""
    if returncode == 0:
        return GOOD
    if returncode == TESTS_FAILED:
        return BAD
    return SKIP


def step(repo: Path, path: str, case: str, baseline: Path, extra: Sequence[str]) -> int:
    """One bisection step on the checkout at `repo`: 0 good, 1 bad, 125 skip."""
    return verdict(run_pytest(repo, path, case, [f"--benchmark-compare={baseline}", *extra]))


def main(argv: Sequence[str] | None = None) -> int:
    """The step's command line (bench.tools.bisect writes it); git bisect run's exit code."""
    parser = argparse.ArgumentParser(prog="loadbench-bisect-step", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, required=True, help="the checkout under test")
    parser.add_argument("--baseline", type=Path, required=True, help="the run made at GOOD")
    parser.add_argument("-k", dest="case", required=True, help="the case (a pytest -k expression)")
    parser.add_argument("--path", required=True, help="what pytest runs, relative to REPO")
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    try:
        args = parser.parse_args(argv[:split])
    except SystemExit as exc:  # argparse's exit 2 would read as "bad"
        if exc.code in (0, None):
            raise
        return ABORT
    try:
        return step(args.repo.resolve(), args.path, args.case, args.baseline, argv[split + 1 :])
    except OSError as exc:
        print(f"loadbench bisect step: cannot run pytest in {args.repo}: {exc}", file=sys.stderr)
        return ABORT


if __name__ == "__main__":
    sys.exit(main())
