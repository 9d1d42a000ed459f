"""`LoadBenchSession`: the harness state of one pytest session and the hooks that use it.

It holds the resolved options, the validated budgets, the baseline (if comparing),
the dataset cache and every case's record, adds the GPU and software versions to
pytest-benchmark's machine_info, and prints the study's tables at the end.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from bench.plugin.ahead import Ahead
from bench.plugin.ahead import compile_ahead
from bench.plugin.ahead import worker_args
from bench.plugin.ahead import workers_for
from bench.plugin.benchmark_options import check as check_benchmark_options
from bench.plugin.benchmark_options import check_compare_fail
from bench.gate.budgets import Budgets
from bench.gate.budgets import BudgetError
from bench.monitor.ceiling import measure_ceilings
from bench.monitor.sampler import GpuProbe
from bench.gate.budgets import dataset_key
from bench.plugin.caches import KernelCaches
from bench.gate.record import FORMAT_KEY
from bench.gate.record import RECORD_FORMAT
from bench.gate.record import RECORD_KEY
from bench.gate.record import RUN_KEY
from bench.gate.compare import Baseline
from bench.gate.runs import COMPLETE
from bench.gate.runs import FAILED
from bench.gate.runs import INTERRUPTED
from bench.gate.runs import BaselineError
from bench.gate.runs import RunState
from bench.gate.runs import finished
from bench.gate.runs import run_state
from bench.gate.runs import load_history
from bench.gate.compare import make_baseline
from bench.gate.compare import planted_note
from bench.gate.runs import read_run
from bench.plugin.options import Options
from bench.plugin.partial import PartialRun
from bench.gate.shards import assign
from bench.gate.shards import durations_of
from bench.gate.shards import unit_of
from model.bound import Ceilings
from model.data import DataError
from model.data import Dataset
from model.data import Frames
from model.data import load_frames
from model.data import split_by_video
from model.data import to_device


def trains(item: pytest.Item) -> bool:
    """Whether a test trains through the `loadbench` fixture (a case with a first epoch)."""
    return "loadbench" in getattr(item, "fixturenames", ())


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
        check_benchmark_options(config, timed_epochs=self.options.epochs - 1)
        self._check_compile_options()
        try:
            self.budgets = Budgets.load(self.options.budgets)
        except BudgetError as exc:
            raise pytest.UsageError(str(exc)) from None
        self.shard_durations = self._read_shard_durations()
        self._frames: Frames | None = None
        if self.options.dataset != "synthetic":  # a bad CSV stops the session before any case runs
            try:
                self._frames = load_frames(self.options.dataset)
                split_by_video(self._frames)
            except DataError as exc:
                raise pytest.UsageError(f"--dataset: {exc}") from None
        self.caches = KernelCaches.for_session(cold=self.options.cold_caches)
        self.ahead: Ahead | None = None  # what --compile-workers did before the first case
        self.probe = GpuProbe.open(self.options.device)
        self.baselines: list[Baseline] = []
        self.baseline_messages: list[str] = []
        self.records: list[dict[str, Any]] = []  # one per case run, for the summary
        self.shared: dict[str, Any] = {}  # measurements later cases of the session compare with
        self._datasets: dict[float, Dataset] = {}  # by fraction of the profile's frames
        self._ceilings: dict[str, Ceilings] = {}  # by precision
        self.left_to_nightly = 0  # cases of the nightly tier this pr-tier run left out
        self.empty_shard: str | None = None  # "I/N of the M selected case(s)" where this shard got none
        self.unfinished: list[str] = []  # cases left out of the saved run: no timed round
        self._scratch: Path | None = None
        self.running: str | None = None  # the test under way, for an interrupt's message
        self.interrupted_in: str | None = None  # the test a Ctrl-C cut short
        self.collected = 0  # tests this session meant to run
        self.ended: set[str] = set()  # tests whose teardown ran
        self.failed_tests: set[str] = set()  # tests whose call or set-up failed
        self.cut_short: list[str] = []  # benchmarks left out: their test stopped before its record was whole
        self.exit_status: int | None = None  # pytest's, once the session finishes
        self.partial = PartialRun(config)  # the run so far, beside --benchmark-json
        self.started = datetime.datetime.now(datetime.timezone.utc)

    # ------------------------------------------------------------- facts

    @property
    def gpu_info(self) -> dict[str, Any] | None:
        if not isinstance(self.probe, GpuProbe):
            return None
        info = self.probe.info
        return {
            "name": info.name,
            "uuid": info.uuid,  # which card of a multi-GPU runner: cards of one model differ by a percent or so
            "memory_total_mib": round(info.memory_total_mib),
            "driver": info.driver,
            "power_limit_w": info.power_limit_w,
            "gpm": info.gpm,
            "capability": ".".join(map(str, torch.cuda.get_device_capability(info.index))),
        }

    def first_epoch_caches(self, nodeid: str) -> str:
        """What the first epoch of test `nodeid` found: the caches' state at start, or warm
        where compiling ahead built its case."""
        if self.ahead is None or nodeid not in self.ahead.built:
            return self.caches.state
        return self.ahead.state(self.caches.state)

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
            "optimizer_impl": o.optimizer_impl,
            "precision": o.precision,
            "strict_fp32_kernel": o.strict_fp32,
            "monitor_period_s": o.monitor_period,
            "shard": f"{shard[0]}/{shard[1]}" if shard else None,
            "shard_durations": self.config.getoption("shard_durations") if shard else None,
            "plant": str(o.plant) if o.plant else None,
            **({"plant_note": o.plant.note} if o.plant and o.plant.note else {}),
            "latency_pin": o.latency_pin,
            "tier": o.tier,
            "time_gated": o.time_gated,
            "kernel_caches": self.caches.state,
            "compiled_ahead": self.ahead.as_dict() if self.ahead is not None else None,
        }

    def dataset(self, fraction: float = 1.0) -> Dataset:
        """The session's dataset on its device, made on first use (the split can still fail).
        A `fraction` below 1 is a smaller slice of the generator's frames (the profile's scale
        times it), kept apart; a CSV dataset is every frame of the file at any fraction, as
        the profile's own scale leaves it whole."""
        if self.options.dataset != "synthetic":
            fraction = 1.0
        if fraction not in self._datasets:
            o = self.options
            try:
                frames = self._frames or load_frames("synthetic", scale=o.profile.scale * fraction)
                self._datasets[fraction] = to_device(frames, o.device)
            except DataError as exc:
                pytest.exit(f"mlp-loadbench: {exc}", returncode=pytest.ExitCode.USAGE_ERROR)
        return self._datasets[fraction]

    @property
    def saving(self) -> bool:
        """Whether this run is stored (pytest-benchmark's save, autosave or json options)."""
        opt = self.config.getoption
        return bool(opt("benchmark_save", None) or opt("benchmark_autosave", None) or opt("benchmark_json", None))

    @property
    def series_dir(self) -> Path | None:
        """Where sample series go: --series-dir, or beside a stored run; None when nothing is stored."""
        if self.options.series_dir is not None:
            return self.options.series_dir
        if not self.saving:
            return None
        storage = getattr(getattr(self.config, "_benchmarksession", None), "storage", None)
        root = Path(getattr(storage, "path", ".benchmarks"))
        # The process id too: parallel runs (shards, one per GPU) often start in the same second.
        return root / "series" / f"{self.started.strftime('%Y%m%d_%H%M%S')}_{os.getpid()}"

    def record_of(self, case_id: str) -> dict[str, Any] | None:
        """The record of a case already run in this session (for side-by-side ratios)."""
        for entry in self.records:
            if entry["case"].id == case_id:
                return entry["record"]
        return None

    def ceilings(self, precision: str) -> Ceilings:
        """The device's matmul ceiling in `precision`, copy bandwidth and per-kernel gap,
        measured at the first call of the session for that precision."""
        if precision not in self._ceilings:
            self._ceilings[precision] = measure_ceilings(self.options.device, precision)
        return self._ceilings[precision]

    def scratch(self, name: str) -> Path:
        """A folder of this session's own, removed when it ends: where an unstored run keeps
        what it must write (trained models), so nothing lands in the checkout."""
        if self._scratch is None:
            self._scratch = Path(tempfile.mkdtemp(prefix="loadbench-"))
        folder = self._scratch / name
        folder.mkdir(exist_ok=True)
        return folder

    def _check_compile_options(self) -> None:
        """Refuse what --compile-only and --compile-workers cannot honour."""
        opt, o = self.config.getoption, self.options
        if o.compile_only:
            stored = [flag for flag, name in (("--benchmark-save", "benchmark_save"),
                                              ("--benchmark-autosave", "benchmark_autosave"),
                                              ("--benchmark-json", "benchmark_json"),
                                              ("--benchmark-compare", "benchmark_compare")) if opt(name, None)]
            if stored:
                raise pytest.UsageError(f"--compile-only: nothing is timed, so there is nothing to store or compare: "
                                        f"drop {', '.join(stored)}")
            if o.compile_workers != 0:
                raise pytest.UsageError("--compile-only with --compile-workers: the workers run --compile-only "
                                        "themselves; use --compile-workers N for a timed session compiled ahead, "
                                        "or --compile-only alone")
        if o.compile_workers != 0 and opt("numprocesses", None):
            raise pytest.UsageError("--compile-workers with pytest-xdist's -n: the xdist workers would each compile "
                                    "ahead what the others also run; use one or the other")

    @property
    def no_baseline_reason(self) -> str:
        """Why a case had nothing to be compared with, for its verdict."""
        if not self.config.getoption("benchmark_compare", None):
            return "no baseline given (--benchmark-compare): budgets only"
        if not self.baselines:
            return "no saved run to compare with yet: budgets only"
        return "not in the baseline run (a new case): budgets only"

    def baseline_for(self, fullname: str) -> tuple[Baseline, dict[str, Any]] | None:
        """The baseline's whole record of the case, or else that of the newest stored run
        in its history that holds one (a case the newest main run lacks, because that run
        was cut short or ran fewer cases, is still judged), named as that run."""
        for baseline in self.baselines:
            bench = baseline.benchmarks.get(fullname)
            if bench is not None and finished(bench):
                return baseline, bench
            for run in reversed(baseline.history):
                older = next((b for b in run["benchmarks"] if b.get("fullname") == fullname and finished(b)), None)
                if older is not None:
                    name = f"{run.get('datetime', 'an older run')} (the newest stored run holding this case)"
                    return replace(baseline, path=Path(name)), older
        return None

    def run_state(self, stored: int) -> RunState:
        """How this run ended, for the file pytest-benchmark writes at its end."""
        if self.interrupted_in is not None or self.exit_status == pytest.ExitCode.INTERRUPTED or \
                (self.exit_status is not None and len(self.ended) < self.collected):
            state = INTERRUPTED  # Ctrl-C, pytest.exit, -x: tests that never ran
        elif self.exit_status not in (None, 0, pytest.ExitCode.NO_TESTS_COLLECTED):
            state = FAILED
        else:
            state = COMPLETE
        return RunState(state, self.collected, stored, tuple(self.cut_short))

    # -------------------------------------------------------------- hooks

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        gpu = self.gpu_info
        where = f"GPU {gpu['name']}, driver {gpu['driver']}" if gpu else f"no GPU metrics ({self.probe})"
        return [self.options.header(), f"mlp-loadbench: {where}"]

    def pytest_benchmark_update_machine_info(self, config: pytest.Config, machine_info: dict[str, Any]) -> None:
        machine_info[RECORD_KEY] = {
            FORMAT_KEY: RECORD_FORMAT,  # readers refuse a run newer than they know (bench/gate/record.py)
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

    def pytest_benchmark_update_json(self, config: pytest.Config, benchmarks: list[Any],
                                     output_json: dict[str, Any]) -> None:
        """How the run ended, beside the machine; the partial file overwrites it (bench/plugin/partial.py)."""
        info = output_json.get("machine_info", {}).get(RECORD_KEY)
        if isinstance(info, dict):
            info[RUN_KEY] = self.run_state(len(output_json.get("benchmarks", []))).as_dict()

    @pytest.hookimpl(tryfirst=True)
    def pytest_benchmark_compare_machine_info(
        self, config: pytest.Config, benchmarksession: Any, machine_info: dict[str, Any], compared_benchmark: Any
    ) -> None:
        """pytest-benchmark loaded a baseline: keep it, and say whether it may gate."""
        # The file path is not passed to this hook; the run's own datetime names it.
        name = Path(str(compared_benchmark.get("datetime", "baseline")))
        if RECORD_KEY not in compared_benchmark.get("machine_info", {}):
            return  # reported as an error by check_baseline_files
        baseline = make_baseline(name, compared_benchmark, machine_info, self.settings())
        if baseline.gate.planted:
            self.baseline_messages.append(planted_note(baseline.gate, f"baseline {name.name}"))
        if not baseline.gating:
            self.baseline_messages.append(baseline.reason)
        ended = run_state(compared_benchmark)
        if not ended.whole:
            self.baseline_messages.append(f"baseline {name.name}: {ended.line()}; a case it lacks is judged against "
                                          "the newest stored run that holds it")
        self.baselines.append(baseline)

    def check_baseline_files(self) -> None:
        """Fail at start-up on a baseline pytest-benchmark would silently skip, and find
        each baseline's history: the stored runs that tell each case's run-to-run noise."""
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
            if not files and self.config.getoption("benchmark_compare_fail", None):
                raise pytest.UsageError(f"--benchmark-compare-fail: no saved run to compare with yet in {bs.storage} "
                                        "(pytest-benchmark would say so only after training every case)")
            if not files:
                self.baseline_messages.append("no saved run to compare with yet: nothing gated")
                return
        if not files:
            raise pytest.UsageError(f"--benchmark-compare {compare}: no saved run matches in {bs.storage}")
        runs = []
        for file in files:
            try:
                runs.append((Path(file), read_run(Path(file))))
            except BaselineError as exc:
                raise pytest.UsageError(str(exc)) from None
        stored = [Path(f) for f in bs.storage.query() if Path(f).suffix == ".json"]
        for path, run in runs:
            candidates = sorted(set(path.parent.glob("*.json")) | set(stored))
            history = load_history(path, run, candidates)
            for baseline in self.baselines:
                if str(baseline.path) == str(run.get("datetime", "baseline")):
                    baseline.history = history
        check_compare_fail(self.config, self.baselines)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        """After -k and -m have deselected: with --compile-only leave out the tests that do not
        train through the fixture, in the pr tier the nightly cases, then with --shard i/n
        keep the i-th shard of what is left (bench/gate/shards.py says which)."""
        if self.options.compile_only:  # only the training cases have a first epoch to build
            others = [item for item in items if not trains(item)]
            if others:
                items[:] = [item for item in items if item not in others]
                config.hook.pytest_deselected(items=others)
        if self.options.tier == "pr":
            nightly = [item for item in items if item.get_closest_marker("nightly") is not None]
            if nightly:
                self.left_to_nightly = len(nightly)
                items[:] = [item for item in items if item.get_closest_marker("nightly") is None]
                config.hook.pytest_deselected(items=nightly)
        shard = config.getoption("shard")
        if shard is not None:
            self._keep_shard(config, items, shard)
        self.collected = len(items)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """--compile-workers: every training case's first epochs in worker processes, now,
        before the first timed case (bench/plugin/ahead.py)."""
        o = self.options
        if o.compile_workers == 0 or o.compile_only or hasattr(self.config, "workerinput"):
            return
        cases = [item.nodeid for item in session.items if trains(item)]
        workers = workers_for(o.compile_workers, len(cases))
        if not workers:
            return
        args = worker_args(profile=o.profile.name, device=str(o.device), loop=o.loop, impl=o.impl,
                           optimizer_impl=o.optimizer_impl, precision=o.precision, dataset=o.dataset,
                           rootdir=self.config.rootpath, inifile=self.config.inipath)
        self.ahead = compile_ahead(cases, args, workers, cwd=self.config.rootpath)
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(self.ahead.line())

    def _keep_shard(self, config: pytest.Config, items: list[pytest.Item], shard: tuple[int, int]) -> None:
        """Keep the shard's items (bench/gate/shards.py deals them); name a shard left empty."""
        index, count = shard
        units = {item.nodeid: unit_of(item.nodeid, item.callspec.params if hasattr(item, "callspec") else {})
                 for item in items}
        keep = set(assign(list(units), count, self.shard_durations, units)[index - 1])
        deselected = [item for item in items if item.nodeid not in keep]
        if items and not keep:  # pytest would only say "no tests ran" (exit 5)
            self.empty_shard = f"{index}/{count} of the {len(items)} selected case(s)"
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

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> Any:
        """Before pytest-benchmark saves: leave out every benchmark whose record is not
        whole, and note how the run ended for the file.

        A test an interrupt (Ctrl-C) stopped, or one that failed before the gate judged
        it (out of memory in the middle of training), has some timed rounds and no
        accuracy or verdict; stored, it would read as a measurement of the case. One with
        no timed round at all would make pytest-benchmark fail to save the whole run."""
        self.exit_status = int(exitstatus)
        bs = getattr(self.config, "_benchmarksession", None)
        if bs is not None:
            kept = []
            for bench in bs.benchmarks:
                name = str(bench.fullname)
                if not bench:
                    self.unfinished.append(name)
                elif name not in self.ended or (name in self.failed_tests and "verdict" not in bench.extra_info):
                    self.cut_short.append(name)
                else:
                    kept.append(bench)
            bs.benchmarks[:] = kept
        return (yield)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed and report.when in ("setup", "call"):
            self.failed_tests.add(report.nodeid)

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        self.running = nodeid

    def pytest_keyboard_interrupt(self, excinfo: Any) -> None:
        """Ctrl-C: name the test it cut short (a failed test is never called interrupted)."""
        self.interrupted_in = self.running

    def pytest_runtest_logfinish(self, nodeid: str, location: Any) -> None:
        """After each test, teardown included: the run so far beside --benchmark-json."""
        self.running = None
        self.ended.add(nodeid)
        self.partial.write()

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        from bench.gate.summary import render_summary

        notes = list(self.baseline_messages)
        if not self.budgets.covers(self.options.dataset) and self.records:
            named = ", ".join(self.budgets.datasets()) or "none"
            notes.append(
                f"no floors or ceilings for dataset {dataset_key(self.options.dataset)!r} in {self.budgets.path} "
                f"(it sets them for: {named}); only limits against a baseline apply"
            )
        if self.records or notes:
            terminalreporter.write_sep("-", "mlp-loadbench")
            for line in render_summary(self.records, notes):
                terminalreporter.write_line(line)
        if self.left_to_nightly:
            terminalreporter.write_line(
                f"mlp-loadbench: tier pr: {self.left_to_nightly} case(s) of the nightly tier left out "
                "(--tier nightly runs them)"
            )
        if self.empty_shard is not None:
            terminalreporter.write_line(
                f"mlp-loadbench: shard {self.empty_shard} holds none: nothing ran (exit 5, no tests); "
                "a serving configuration's cases stay in one shard, so fewer shards or a wider -k give it some"
            )
        saved = "saved the finished cases" if self.saving else "stored nothing"
        if self.interrupted_in is not None:
            terminalreporter.write_line(f"mlp-loadbench: interrupted: {saved}; "
                                        f"left out {self.interrupted_in} (cut short)")
        failed = [name for name in self.unfinished if self.interrupted_in is None or not
                  self.interrupted_in.endswith(name.rsplit("::", 1)[-1])]
        if failed:
            terminalreporter.write_line(
                f"mlp-loadbench: left out of the saved run: {', '.join(failed)} (failed before its first timed round)"
            )
        cut = [name for name in self.cut_short if name != self.interrupted_in]
        if cut:
            terminalreporter.write_line(
                f"mlp-loadbench: left out of the saved run: {', '.join(cut)} (failed before its record was whole)"
            )

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.partial.finish()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
        if isinstance(self.probe, GpuProbe):
            self.probe.close()
        self.caches.close()
