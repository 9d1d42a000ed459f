"""Compiling ahead: the session's training cases run their first epochs in worker
processes side by side before the timed cases, so their kernels compile in parallel.

`--compile-workers N` deals the cases that train through the `loadbench` fixture to N
pytest processes with `--compile-only` (a case builds its trainer, trains two epochs and
evaluates, then skips: nothing is timed, stored or judged). The workers inherit the
session's TRITON_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR (`--cold-caches` points both at the
session's empty folders first), so the timed cases load what they compiled. Tuning is off
in the workers (LOADBENCH_TUNE=off): candidates timed beside other processes' work would
be timed wrong, and the tuning cache would keep the result; the session tunes as it
always does. A worker that fails costs only time: its cases compile in their own first
epoch, and the session's line names them. Hand-written: pytest-xdist runs the timed tests
themselves in parallel, which on one GPU would time each case beside the others.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kernels.ground.processes import checkout_env

PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder that holds bench/, model/ and kernels/
BUILT = "--compile-only: "  # how a worker's skipped case begins its reason
_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)")
_BUILT = re.compile(r"^SKIPPED \[\d+\] [^:]+(?::\d+)?: " + re.escape(BUILT) + r"(\S+) ")  # the case's node id


@dataclass(frozen=True)
class Ahead:
    """What compiling ahead did: its processes, the cases dealt, the node ids of those built,
    its seconds and what failed (a case's node id, or a worker that stopped before naming one)."""

    workers: int
    cases: int
    built: tuple[str, ...]
    seconds: float
    failed: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, object]:
        """For the run's settings: the counts, the seconds and what failed."""
        return {"workers": self.workers, "cases": self.cases, "built": len(self.built),
                "seconds": round(self.seconds, 1), "failed": list(self.failed)}

    def state(self, before: str) -> str:
        """The caches' state for the records: the timed cases' first epochs found them warm."""
        return f"warm (compiled ahead in {self.workers} processes, {self.seconds:.1f} s, from {before.split()[0]})"

    def line(self) -> str:
        text = (f"mlp-loadbench: compiled ahead: {len(self.built)} of {self.cases} case(s) in {self.workers} "
                f"process(es), {self.seconds:.1f} s")
        if self.failed:
            text += (f"; {len(self.failed)} failed there and compile in their own first epoch: "
                     + ", ".join(self.failed))
        return text


def workers_for(asked: int | str, cases: int, cpus: int | None = None) -> int:
    """The processes to start: `asked`, or for 'auto' one per CPU; never more than the cases."""
    count = (cpus or os.cpu_count() or 1) if asked == "auto" else int(asked)
    return max(0, min(count, cases))


def deal(nodeids: Sequence[str], workers: int) -> list[list[str]]:
    """Round robin, so that one experiment's cases (collected side by side, alike in cost)
    spread over the workers."""
    groups: list[list[str]] = [[] for _ in range(max(1, workers))]
    for i, nodeid in enumerate(nodeids):
        groups[i % len(groups)].append(nodeid)
    return [group for group in groups if group]


def worker_args(*, profile: str, device: str, loop: str, impl: str, optimizer_impl: str, precision: str,
                dataset: str, rootdir: Path, inifile: Path | None = None) -> list[str]:
    """A worker's pytest arguments before its node ids: the session's rootdir and ini file,
    its axes, two epochs, every tier (the node ids were already chosen), nothing stored."""
    if dataset != "synthetic":
        dataset = str(Path(dataset).resolve())
    return ["-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider", "--benchmark-disable", "--compile-only",
            f"--rootdir={rootdir}", *(["-c", str(inifile)] if inifile is not None else []),
            f"--profile={profile}", f"--device={device}", f"--loop={loop}", f"--impl={impl}",
            f"--optimizer-impl={optimizer_impl}", f"--precision={precision}", f"--dataset={dataset}",
            "--tier=nightly", "--epochs=2"]


def worker_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The session's environment (its caches' folders included), tuning off, no added pytest
    options, and this package importable from a checkout that was not installed."""
    env = checkout_env(PACKAGE_ROOT, os.environ if environ is None else environ)
    env.update(LOADBENCH_TUNE="off", PYTEST_ADDOPTS="")
    return env


def outcome(text: str, returncode: int, worker: int) -> tuple[list[str], list[str]]:
    """From a worker's output: the node ids of the cases it built, and what failed."""
    lines = text.splitlines()
    built = [m.group(1) for line in lines if (m := _BUILT.match(line))]
    failed = [m.group(1) for line in lines if (m := _FAILED.match(line))]
    if returncode not in (0, 1) or (returncode == 1 and not failed):
        last = next((line.strip() for line in reversed(lines) if line.strip()), "no output")
        failed.append(f"worker {worker} (exit {returncode}: {last})")
    return built, failed


def compile_ahead(nodeids: Sequence[str], args: Sequence[str], workers: int, cwd: Path,
                  env: dict[str, str] | None = None, python: str = sys.executable) -> Ahead:
    """Run `nodeids` dealt over `workers` processes of `python args <node ids>` and wait for all."""
    groups = deal(nodeids, workers)
    start = time.monotonic()
    built: list[str] = []
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="loadbench-ahead-") as logs:
        running: list[tuple[subprocess.Popen, Path]] = []
        try:
            for i, group in enumerate(groups):
                log = Path(logs) / f"worker-{i}.log"
                with log.open("w") as out:
                    running.append((subprocess.Popen([python, *args, *group], cwd=cwd, env=worker_env(env),
                                                     stdout=out, stderr=subprocess.STDOUT), log))
            for i, (process, log) in enumerate(running):
                process.wait()
                done, lost = outcome(log.read_text(errors="replace"), process.returncode, i)
                built += done
                failed += lost
        finally:  # an interrupt stops the workers too
            for process, _ in running:
                if process.poll() is None:
                    process.kill()
                    process.wait()
    return Ahead(len(groups), len(nodeids), tuple(built), time.monotonic() - start, tuple(failed))
