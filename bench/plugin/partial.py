"""A run file rewritten while the session runs, so a run cut short by a time limit or a
killed process keeps the cases it finished.

pytest-benchmark writes ``--benchmark-json PATH`` once, at the end of the session; a
GPU matrix on a CI runner or a lent machine with a time limit can lose tens of minutes
of cases to one kill. With ``--benchmark-json run.json`` this writes ``run.partial.json``
beside it, atomically, after each test that finished a benchmark, through
pytest-benchmark's own JSON hooks and encoder (the content the final file gets, so the
report, compare and merge read it), and removes it once the final file is written.
pytest-benchmark has no such option, hence this module.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any

import pytest
from pytest_benchmark.utils import safe_dumps

from bench.gate.record import RECORD_KEY
from bench.gate.record import RUN_KEY
from bench.gate.runs import PARTIAL
from bench.gate.runs import partial_path
from bench.gate.runs import RunState
from bench.plugin.startup import json_path
from kernels.ground.files import write_atomic

# The file holds every finished case with its samples, so each write costs more than the
# last. A normal run's write takes milliseconds and follows every finished case; only
# where one took SLOW_WRITE_S or more (a whole serving matrix in one process reaches
# tens of MB) does the next wait COST_FACTOR times as long, so writing stays a small
# part of the session. The cases it waits over are in the next write, or the final file.
SLOW_WRITE_S = 1.0
COST_FACTOR = 50


def json_target(benchmarksession: Any) -> Path | None:
    """--benchmark-json's path."""
    return json_path(getattr(benchmarksession, "json", None))


class PartialRun:
    def __init__(self, config: Any) -> None:
        self.config = config
        self.written = 0  # benchmarks in the file last written
        self.infos: tuple[dict[str, Any], dict[str, Any]] | None = None  # machine_info, commit_info
        self.broken = False  # a write failed: said once, not tried again
        self.last_write = -float("inf")  # time.monotonic() at the last write ...
        self.last_cost_s = 0.0  # ... and how long it took

    @property
    def session(self) -> Any:
        return getattr(self.config, "_benchmarksession", None)

    @property
    def path(self) -> Path | None:
        bs = self.session
        if bs is None or getattr(bs, "disabled", False):
            return None
        target = json_target(bs)
        return partial_path(target) if target is not None else None

    def write(self) -> Path | None:
        """Rewrite the partial file where a benchmark finished since the last write. A
        failure to write it is a warning, never the end of the session."""
        path = self.path
        finished = [bench for bench in self.session.benchmarks if bench] if path is not None else []
        if path is None or self.broken or len(finished) == self.written:
            return None
        slow = self.last_cost_s >= SLOW_WRITE_S
        if slow and time.monotonic() - self.last_write < COST_FACTOR * self.last_cost_s:
            return None
        try:
            infos = self._infos()  # once per session, and seconds (py-cpuinfo, git): not the cost of a write
            start = time.monotonic()
            written = self._write(path, finished, infos)
            self.last_write = time.monotonic()
            self.last_cost_s = self.last_write - start
            return written
        except Exception as exc:  # a full disk, a hook of another plugin: the run itself goes on
            self.broken = True
            warnings.warn(pytest.PytestWarning(f"mlp-loadbench: cannot keep the run so far in {path}: "
                                               f"{type(exc).__name__}: {exc}"), stacklevel=1)
            return None

    def _infos(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """machine_info and commit_info, gathered once: git and the machine do not change within a session."""
        if self.infos is None:
            hook = self.config.hook
            commit_info = hook.pytest_benchmark_generate_commit_info(config=self.config)
            hook.pytest_benchmark_update_commit_info(config=self.config, commit_info=commit_info)
            self.infos = (self.session.get_machine_info(), commit_info)
        return self.infos

    def _write(self, path: Path, finished: list[Any], infos: tuple[dict[str, Any], dict[str, Any]]) -> Path:
        hook = self.config.hook
        machine_info, commit_info = infos
        output = hook.pytest_benchmark_generate_json(config=self.config, benchmarks=finished, include_data=True,
                                                     machine_info=machine_info, commit_info=commit_info)
        hook.pytest_benchmark_update_json(config=self.config, benchmarks=finished, output_json=output)
        if isinstance(output.get("machine_info", {}).get(RECORD_KEY), dict):  # a run read while it runs, or killed
            collected = getattr(self.config.pluginmanager.get_plugin("loadbench"), "collected", None)
            output["machine_info"][RECORD_KEY][RUN_KEY] = RunState(PARTIAL, collected, len(finished)).as_dict()
        write_atomic(path, safe_dumps(output, ensure_ascii=True, indent=4))  # as pytest-benchmark's save_json
        self.written = len(finished)
        return path

    def finish(self) -> None:
        """Remove the partial file once pytest-benchmark has written the whole run: a
        final file older than it (a run of another day, a save that failed) leaves it."""
        path = self.path
        target = json_target(self.session) if path is not None else None
        if path is None or target is None or not path.is_file() or not target.is_file():
            return
        final = target.stat()
        if final.st_size > 0 and final.st_mtime >= path.stat().st_mtime:
            path.unlink()
