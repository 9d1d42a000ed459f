"""Running the self-test's pytest sessions: the A/A runs, then the planted ones, each
one process writing its own JSON, one lane per GPU with --gpus; --resume goes on from
the finished run files and --stop-after stops between runs."""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from bench.gate.runs import BaselineError
from bench.gate.runs import read_run
from bench.tools.selftest.campaign import SelftestError
from bench.tools.selftest.campaign import run_name


PYTEST_OK = (0, 1)  # 1: a case broke its own budgets; its record is still in the JSON


def pytest_command(path: str, expr: str, out_json: Path, plant: str | None, extra: Sequence[str]) -> list[str]:
    plant_args = [f"--plant-slowdown={plant}"] if plant else []
    return [sys.executable, "-m", "pytest", path, "-k", expr, "-p", "no:cacheprovider", "-q",
            f"--benchmark-json={out_json}", *plant_args, *extra]


def run_one(
    command: list[str], out_json: Path, name: str, log: Path, env: dict[str, str] | None = None
) -> tuple[int, float]:
    """One pytest run into `out_json`, its output into `log`: (exit code, seconds)."""
    out_json.unlink(missing_ok=True)  # a JSON left from an earlier campaign must not pass for this run's
    start = time.perf_counter()
    with log.open("w", encoding="utf-8") as handle:
        code = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, env=env).returncode
    seconds = time.perf_counter() - start
    # pytest-benchmark opens --benchmark-json's file while it parses the command line, so a
    # run stopped by a usage error leaves it there, empty.
    written = out_json.is_file() and out_json.stat().st_size > 0
    if code not in PYTEST_OK or not written:
        why = f"pytest exit {code}" + ("" if written else ", no JSON written")
        raise SelftestError(f"run {name} failed ({why}; output in {log}): {shlex.join(command)}")
    return code, seconds


class CampaignStopped(Exception):
    """--stop-after ended the campaign before its last run; the message says how to go on."""


def finished_run(path: Path) -> bool:
    """Whether `path` holds a complete run of this suite (what --resume keeps)."""
    try:
        read_run(path)
    except BaselineError:
        return False
    return True


def run_campaign(out: Path, path: str, expr: str, runs: int, plants: Sequence[float], mode: str,
                 extra: Sequence[str], gpus: Sequence[str] = (), resume: bool = False,
                 stop_after: float | None = None) -> list[Path]:
    """Every run, A/A first, printing a line per run as it ends; the JSON files written.
    With `gpus`, one lane per GPU runs the plan's next run as it frees; the first
    failure stops the lanes from starting more and is raised once the running ones end.

    `resume`: a run whose JSON in `out` is already a complete run is kept, not run again
    (an interrupted run leaves none, or one that does not parse, and runs again).
    `stop_after`: seconds; a lane starts no run that would end past them, judged by the
    longest run so far, and CampaignStopped is raised once the running ones end. So a
    campaign can be spread over sessions of limited time: the same command with
    ``--resume`` goes on where the last one stopped."""
    out.mkdir(parents=True, exist_ok=True)
    plan = [(None, i) for i in range(1, runs + 1)] + [(pct, i) for pct in plants for i in range(1, runs + 1)]
    own_series = any(arg.startswith("--series-dir") for arg in extra)
    width = len(str(len(plan)))
    pending = list(enumerate(plan, 1))
    if resume:
        pending = [(step, (pct, i)) for step, (pct, i) in pending if not finished_run(out / f"{run_name(pct, i)}.json")]
        if len(pending) < len(plan):
            print(f"resuming: {len(plan) - len(pending)} of {len(plan)} runs already in {out}", flush=True)
    failures: list[Exception] = []
    lock = threading.Lock()
    begin, longest = time.monotonic(), [0.0]  # longest: a cell the lanes share

    def lane(gpu: str | None) -> None:
        env = None if gpu is None else {**os.environ, "CUDA_VISIBLE_DEVICES": gpu}
        while True:
            with lock:
                if failures or not pending:
                    return
                if stop_after is not None and time.monotonic() - begin + longest[0] > stop_after:
                    return
                step, (pct, index) = pending.pop(0)
            name = run_name(pct, index)
            series = [] if own_series else [f"--series-dir={out / 'series' / name}"]
            plant = f"{pct:g}:{mode}" if pct is not None else None
            command = pytest_command(path, expr, out / f"{name}.json", plant, [*series, *extra])
            try:
                code, seconds = run_one(command, out / f"{name}.json", name, out / f"{name}.log", env)
            except Exception as exc:  # raised again by the caller's thread, below
                with lock:
                    failures.append(exc)
                return
            with lock:
                longest[0] = max(longest[0], seconds)
            note = " (a case broke its own budgets; its record counts)" if code == 1 else ""
            where = f" on GPU {gpu}" if gpu is not None else ""
            print(f"[{step:>{width}}/{len(plan)}] {name}{where}: {seconds:.1f} s, pytest exit {code}{note}", flush=True)

    if gpus:
        lanes = [threading.Thread(target=lane, args=(gpu,), name=f"selftest-gpu{gpu}") for gpu in gpus]
        for thread in lanes:
            thread.start()
        for thread in lanes:
            thread.join()
    else:
        lane(None)
    if failures:
        raise failures[0]
    if pending:  # no failure, so --stop-after left them
        raise CampaignStopped(
            f"stopped after {time.monotonic() - begin:.0f} s (--stop-after {stop_after:g}): "
            f"{len(plan) - len(pending)} of {len(plan)} runs in {out}; the same command with --resume goes on"
        )
    return [out / f"{run_name(pct, index)}.json" for pct, index in plan]


def parse_gpus(value: str) -> list[str]:
    """'0,1' -> ['0', '1']: CUDA device indices, each once."""
    parts = [part.strip() for part in value.split(",")]
    if not all(part.isdigit() for part in parts) or len(set(parts)) != len(parts):
        raise argparse.ArgumentTypeError(f"{value!r}: GPU indices separated by commas, each once (e.g. 0,1)")
    return parts


def visible_gpus() -> int:
    """How many GPUs `--gpus` may name: NVML's count of this machine's devices (the
    indices CUDA_VISIBLE_DEVICES takes, which each lane sets for its pytest); 0 where
    there is no NVIDIA driver or NVML library."""
    try:
        import pynvml
    except ImportError:
        return 0
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()


def gpus_problem(gpus: Sequence[str], count: int) -> str | None:
    """Why `--gpus` cannot run on a machine with `count` GPUs (a run would train on no
    GPU, or fail after the runs before it), or None when every index names one."""
    given = ",".join(gpus)
    if count == 0:
        return f"--gpus {given}: no GPU on this machine (NVML finds none); leave --gpus out to run one run at a time"
    missing = [gpu for gpu in gpus if int(gpu) >= count]
    if missing:
        return (f"--gpus {given}: this machine has {count} GPU(s), indices 0 to {count - 1}; "
                f"no GPU {', '.join(missing)}")
    return None
