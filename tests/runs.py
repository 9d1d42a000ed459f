"""Run files as mlp-loadbench stores them, from planted numbers, for the tests of the tools
that read them (the gate, report, history page, compare, the data branch): a training
case's record, and a run file holding records. Nothing here is timed or trained."""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import Any

H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
STEADY = [0.100, 0.102, 0.098, 0.101, 0.099, 0.103, 0.097] * 3  # per-epoch seconds after the first
SETTINGS = {"profile": "quick", "dataset": "synthetic", "epochs": 22}
# Limits far from the changes the tests make: 3x time or 0.2 of accuracy is flagged under
# any sensible rule; +24% time whose epochs overlap is not significant under any.
BUDGETS = """\
[defaults]
time_slower_pct = 10
time_alpha = 0.01
time_hard_ratio = 2.0
accuracy_drop_max = 0.03
macro_f1_drop_max = 0.04
"""


# Files a reader of runs must refuse, by name; None: no file there at all.
NOT_RUNS: dict[str, str | None] = {
    "missing.json": None, "corrupt.json": "{oops", "zero.json": "",
    "foreign.json": json.dumps({"benchmarks": [], "machine_info": {}}),  # pytest-benchmark's, not ours
}


def not_a_run(folder: Path, name: str, files: Mapping[str, str | None] = NOT_RUNS) -> Path:
    """folder/name holding files[name], or absent where that is None."""
    path = folder / name
    contents = files[name]
    if contents is not None:
        path.write_text(contents)
    return path


def fullname(case: str, test: str = "test_x") -> str:
    """The pytest node id a case of the study is stored under."""
    return f"bench/test_experiments.py::{test}[{case}]"


def record(case: str, epochs: Sequence[float] = STEADY, *, gpu: str | None = H100, accuracy: float = 0.75,
           first: float | None = None, **fields: Any) -> dict[str, Any]:
    """A training case's extra_info as the fixture stores it, with what the gate and the
    report read: one round of steady `epochs` (seconds) after a first epoch of `first`
    (twice the first steady one unless given). The GPU's figures are None where `gpu` is
    None; `fields` add keys or replace these."""
    first = 2 * epochs[0] if first is None else first
    on_gpu = gpu is not None
    return {
        "case": case, "experiment": case.split("-")[0], "profile": "quick",
        "epoch_seconds_by_round": [[first, *epochs]], "median_epoch_s": statistics.median(epochs),
        "train_seconds": sum(epochs), "accuracy": accuracy, "macro_f1": accuracy - 0.03,
        "vram_peak_mib": 100.0 if on_gpu else None, "rss_peak_mib": 1500.0,
        "energy_j": 300.0 if on_gpu else None, "energy_per_epoch_j": 10.0 if on_gpu else None,
        "load": {"normalized": {"gpu_busy": 0.7 if on_gpu else None, "sm_activity": None, "cpu_process": 0.05}},
        "series_path": None,
    } | fields


def run(records: Mapping[str, dict[str, Any]], *, gpu: str | None = H100, commit: str = "",
        when: str = "2999-01-01T10:00:00", settings: Mapping[str, Any] = SETTINGS) -> dict[str, Any]:
    """A run of mlp-loadbench holding `records` (full test name -> record, in that order),
    made on `gpu` (None: on a CPU) at `commit` (hex, filled to 40 digits with zeros) at
    `when` (ISO)."""
    return {
        "datetime": when,
        "commit_info": {"id": commit.ljust(40, "0")},
        "machine_info": {"loadbench": {"gpu": {"name": gpu} if gpu else None, "settings": dict(settings)}},
        "benchmarks": [{"name": name.split("::")[-1], "fullname": name, "extra_info": info}
                       for name, info in records.items()],
    }


def write_run(path: Path, records: Mapping[str, dict[str, Any]], **made: Any) -> Path:
    """`run(records, **made)` saved at `path` (its folder made if need be)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(run(records, **made)))
    return path
