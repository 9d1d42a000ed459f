"""`LoadBenchSession`: the harness state of one pytest session and the hooks that use it.

It holds the resolved options, the validated budgets, the baseline (if comparing),
the dataset cache and every case's record, adds the GPU and software versions to
pytest-benchmark's machine_info, and prints the study's tables at the end.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from bench.plugin.budgets import Budgets
from bench.plugin.budgets import BudgetError
from bench.plugin.compare import RECORD_KEY
from bench.plugin.compare import Baseline
from bench.plugin.compare import BaselineError
from bench.plugin.compare import make_baseline
from bench.plugin.compare import read_run
from bench.plugin.options import Options
from bench.monitor.sampler import GpuProbe
from bench.tools.shards import assign
from bench.tools.shards import durations_of
from model.data import DataError
from model.data import Dataset
from model.data import load_dataset


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


class LoadBenchSession:
    """Registered as the plugin named 'loadbench'; its methods are hooks."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.options = Options.from_config(config)
        try:
            self.budgets = Budgets.load(self.options.budgets)
        except BudgetError as exc:
            raise pytest.UsageError(str(exc)) from None
        self.shard_durations = self._read_shard_durations()
        self.probe = GpuProbe.open(self.options.device)
        self.baselines: list[Baseline] = []
        self.baseline_messages: list[str] = []
        self.records: list[dict[str, Any]] = []  # one per case run, for the summary
        self.shared: dict[str, Any] = {}  # measurements later cases of the session compare with
        self._datasets: dict[tuple[str, float, str], Dataset] = {}
        self.started = datetime.datetime.now(datetime.timezone.utc)

    # ------------------------------------------------------------- facts

    @property
    def gpu_info(self) -> dict[str, Any] | None:
        if not isinstance(self.probe, GpuProbe):
            return None
        info = self.probe.info
        return {
            "name": info.name,
            "memory_total_mib": round(info.memory_total_mib),
            "driver": info.driver,
            "power_limit_w": info.power_limit_w,
            "gpm": info.gpm,
            "capability": ".".join(map(str, torch.cuda.get_device_capability(info.index))),
        }

    def settings(self) -> dict[str, Any]:
        o = self.options
        shard = self.config.getoption("shard")
        return {
            "profile": o.profile.name,
            "epochs": o.epochs,
            "dataset": o.dataset,
            "device": str(o.device),
            "loop": o.loop,
            "impl": o.impl,
            "precision": o.precision,
            "strict_fp32_kernel": o.strict_fp32,
            "monitor_period_s": o.monitor_period,
            "shard": f"{shard[0]}/{shard[1]}" if shard else None,
            "shard_durations": self.config.getoption("shard_durations") if shard else None,
        }

    def dataset(self) -> Dataset:
        o = self.options
        key = (o.dataset, o.profile.scale, str(o.device))
        if key not in self._datasets:
            scale = o.profile.scale if o.dataset == "synthetic" else 1.0
            try:
                self._datasets[key] = load_dataset(o.dataset, scale=scale, device=o.device)
            except DataError as exc:
                pytest.exit(f"mlp-loadbench: {exc}", returncode=pytest.ExitCode.USAGE_ERROR)
        return self._datasets[key]

    @property
    def series_dir(self) -> Path:
        if self.options.series_dir is not None:
            return self.options.series_dir
        storage = getattr(getattr(self.config, "_benchmarksession", None), "storage", None)
        root = Path(getattr(storage, "path", ".benchmarks"))
        return root / "series" / self.started.strftime("%Y%m%d_%H%M%S")

    def record_of(self, case_id: str) -> dict[str, Any] | None:
        """The record of a case already run in this session (for side-by-side ratios)."""
        for entry in self.records:
            if entry["case"].id == case_id:
                return entry["record"]
        return None

    def baseline_for(self, fullname: str) -> tuple[Baseline, dict[str, Any]] | None:
        for baseline in self.baselines:
            if fullname in baseline.benchmarks:
                return baseline, baseline.benchmarks[fullname]
        return None

    # -------------------------------------------------------------- hooks

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        gpu = self.gpu_info
        where = f"GPU {gpu['name']}, driver {gpu['driver']}" if gpu else f"no GPU metrics ({self.probe})"
        return [self.options.header(), f"mlp-loadbench: {where}"]

    def pytest_benchmark_update_machine_info(self, config: pytest.Config, machine_info: dict[str, Any]) -> None:
        machine_info[RECORD_KEY] = {
            "gpu": self.gpu_info,
            "cuda": torch.version.cuda,
            "torch": torch.__version__,
            "triton": _version("triton"),
            "nvidia_ml_py": _version("nvidia-ml-py"),
            "mlp_loadbench": _version("mlp-loadbench"),
            "settings": self.settings(),
        }

    def pytest_benchmark_update_commit_info(self, config: pytest.Config, commit_info: dict[str, Any]) -> None:
        """CI checkouts without history (or copies without .git) still name their commit."""
        sha = os.environ.get("GITHUB_SHA")
        if sha and commit_info.get("id") in (None, "", "unknown"):
            commit_info["id"] = sha
            commit_info.pop("error", None)

    def pytest_benchmark_compare_machine_info(
        self, config: pytest.Config, benchmarksession: Any, machine_info: dict[str, Any], compared_benchmark: Any
    ) -> None:
        """pytest-benchmark loaded a baseline: keep it, and say whether it may gate."""
        # The file path is not passed to this hook; the run's own datetime names it.
        name = Path(str(compared_benchmark.get("datetime", "baseline")))
        if RECORD_KEY not in compared_benchmark.get("machine_info", {}):
            return  # reported as an error by check_baseline_files
        baseline = make_baseline(name, compared_benchmark, machine_info)
        theirs = compared_benchmark["machine_info"][RECORD_KEY].get("settings", {})
        ours = self.settings()
        for key in ("profile", "epochs", "dataset"):
            if baseline.gating and theirs.get(key) != ours[key]:
                baseline.gating = False
                baseline.reason = f"baseline ran {key}={theirs.get(key)!r}, this run {key}={ours[key]!r}: shown, not gated"
        if not baseline.gating:
            self.baseline_messages.append(baseline.reason)
        self.baselines.append(baseline)

    def check_baseline_files(self) -> None:
        """Fail at start-up on a baseline pytest-benchmark would silently skip."""
        bs = getattr(self.config, "_benchmarksession", None)
        compare = self.config.getoption("benchmark_compare", None)
        if not compare or bs is None or not hasattr(bs.storage, "query"):
            return
        try:
            files = bs.storage.query() if compare is True else bs.storage.query(compare)
        except ValueError as exc:
            raise pytest.UsageError(f"--benchmark-compare {compare}: {exc}") from None
        files = [f for f in files if f.suffix == ".json"]
        if compare is True:
            files = files[-1:]
            if not files:
                self.baseline_messages.append("no saved run to compare with yet: nothing gated")
                return
        if not files:
            raise pytest.UsageError(f"--benchmark-compare {compare}: no saved run matches in {bs.storage}")
        for file in files:
            try:
                read_run(Path(file))
            except BaselineError as exc:
                raise pytest.UsageError(str(exc)) from None

    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        """--shard i/n: keep the i-th shard's cases (bench/shards.py says which)."""
        shard = config.getoption("shard")
        if shard is None:
            return
        index, count = shard
        keep = set(assign([item.nodeid for item in items], count, self.shard_durations)[index - 1])
        deselected = [item for item in items if item.nodeid not in keep]
        items[:] = [item for item in items if item.nodeid in keep]
        if deselected:
            config.hook.pytest_deselected(items=deselected)

    def _read_shard_durations(self) -> dict[str, float] | None:
        path = self.config.getoption("shard_durations")
        if path is None:
            return None
        if self.config.getoption("shard") is None:
            raise pytest.UsageError(f"--shard-durations {path}: only means something with --shard I/N")
        try:
            return durations_of(read_run(Path(path)))
        except BaselineError as exc:
            raise pytest.UsageError(f"--shard-durations: {str(exc).removeprefix('baseline ')}") from None

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        from bench.plugin.summary import render_summary

        if self.records or self.baseline_messages:
            terminalreporter.write_sep("-", "mlp-loadbench")
            for line in render_summary(self.records, self.baseline_messages):
                terminalreporter.write_line(line)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if isinstance(self.probe, GpuProbe):
            self.probe.close()
