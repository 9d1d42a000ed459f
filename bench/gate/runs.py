"""Saved runs for the report: find pytest-benchmark run files and read the ones we can.

A missing, corrupt or foreign file is skipped with a warning that names it; the
caller decides what an empty result means.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.cases import study_order
from bench.plugin.compare import BaselineError
from bench.plugin.compare import gpu_name
from bench.plugin.compare import read_run


@dataclass(frozen=True)
class Run:
    path: Path
    datetime: str
    commit: str  # short id, or "unknown"
    gpu: str
    settings: dict[str, Any]
    benchmarks: list[dict[str, Any]]

    @property
    def label(self) -> str:
        return f"{self.commit} {self.datetime[:16].replace('T', ' ')}"

    def cases(self) -> list[dict[str, Any]]:
        """Benchmarks that are training cases (they carry a case id and metrics), in the
        study's order whatever order the run file holds."""
        cases = [b for b in self.benchmarks if "case" in b.get("extra_info", {}) and "accuracy" in b["extra_info"]
                 and not is_inference(b["extra_info"])]  # fmt: skip
        return sorted(cases, key=lambda b: study_order(b["extra_info"]["case"]))

    def inference_records(self) -> list[dict[str, Any]]:
        """extra_info of the serving cases (bench/test_inference.py), in the study's order."""
        records = [b["extra_info"] for b in self.benchmarks if is_inference(b.get("extra_info", {}))]
        return sorted(records, key=lambda r: study_order(str(r.get("case", ""))))


def is_inference(info: dict[str, Any]) -> bool:
    """A serving record, not a training case: the report draws it in the inference view."""
    return info.get("kind") == "inference"


def find_run_files(storage: Path) -> list[Path]:
    """pytest-benchmark's layout: STORAGE/<machine id>/NNNN_*.json."""
    return sorted(storage.glob("*/*.json")) + sorted(storage.glob("*.json"))


def load_runs(paths: list[Path]) -> tuple[list[Run], list[str]]:
    """The runs read, oldest first, and a warning "skipped PATH: REASON" for each file not read."""
    runs, warnings = [], []
    for path in paths:
        if not path.is_file():
            warnings.append(f"skipped {path}: {'not a file' if path.exists() else 'no such file'}")
            continue
        if path.stat().st_size == 0:
            warnings.append(f"skipped {path}: empty file")  # clearer than JSON's "Expecting value"
            continue
        try:
            data = read_run(path)
        except BaselineError as exc:
            warnings.append(f"skipped {path}: {unreadable_reason(path, exc)}")
            continue
        commit = str(data.get("commit_info", {}).get("id") or "unknown")
        runs.append(
            Run(
                path=path,
                datetime=str(data.get("datetime", "")),
                commit=commit[:8],
                gpu=gpu_name(data["machine_info"]),
                settings=data["machine_info"]["loadbench"].get("settings", {}),
                benchmarks=data["benchmarks"],
            )
        )
    runs.sort(key=lambda run: run.datetime)
    return runs, warnings


def by_gpu(runs: list[Run]) -> dict[str, list[Run]]:
    """Runs grouped by GPU model, oldest first within each: runs on different models are
    never one history. The newest run's model comes first, then the others by how
    recently each last ran."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.gpu, []).append(run)
    return dict(sorted(groups.items(), key=lambda item: item[1][-1].datetime, reverse=True))


def unreadable_reason(path: Path, exc: BaselineError) -> str:
    """read_run's reason without its "baseline PATH: " prefix or its advice after "; ",
    which is about --benchmark-compare, not the report."""
    return str(exc).removeprefix(f"baseline {path}: ").split("; ", 1)[0]
