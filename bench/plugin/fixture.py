"""The `loadbench` fixture: train one case under pytest-benchmark while the monitor watches.

`LoadBench.run(case)` builds the case's configuration from the session options,
times full trainings with ``benchmark.pedantic`` (fresh model and optimizer per
round, built in ``setup`` so building is not timed), samples load on the monitor
thread, evaluates, fills ``benchmark.extra_info``, writes the sample series beside
the run, and then checks budgets and the baseline. A broken limit fails this test
with a message per metric; the record was already saved in extra_info by then.
"""

from __future__ import annotations

import gc
import statistics
import time
from typing import Any

import pytest
import torch

from kernels.ground.cases import Case
from bench.gate.judge import Judgement
from bench.gate.kernel_table import KernelTable
from bench.gate.compare import deltas
from bench.gate.timing import time_samples
from bench.monitor.loadstats import summarize_monitor
from bench.monitor.sampler import LoadMonitor
from bench.monitor.series import safe_name
from bench.monitor.series import write_series
from bench.monitor.trace import profile_trainer
from bench.plugin.ahead import BUILT
from bench.plugin.caches import TritonBuilds
from bench.plugin.plant import plant_slowdown
from bench.plugin.session import LoadBenchSession
from bench.plugin.verdicts import budget_for
from bench.plugin.verdicts import gate
from model.bound import step_bound
from model.config import TrainConfig
from model.cost import training_cost
from model.data import Dataset
from model.train import TrainResult
from model.train import Trainer

PROGRESS_EVERY_S = 1.0  # at most one progress line a second, so fast epochs do not flood
QUIET_PROGRESS_AFTER_S = 10.0  # without -v, a case this long shows a line this often


class LoadBench:
    def __init__(self, benchmark: Any, session: LoadBenchSession, request: pytest.FixtureRequest) -> None:
        self.benchmark = benchmark
        self.session = session
        self.request = request
        self.used = False
        self.allocated_before = 0  # device memory live before the case's setup (the dataset)

    def config_for(self, case: Case, **overrides: object) -> TrainConfig:
        o = self.session.options
        base = TrainConfig(
            epochs=o.epochs, impl=o.impl, optimizer_impl=o.optimizer_impl, precision=o.precision, loop=o.loop
        )
        return base.replace(**{**case.changes, **overrides})  # explicit overrides win

    def run(self, case: Case | str, data_fraction: float = 1.0, **overrides: object) -> TrainResult:
        """Train `case` (a Case or its id; with `overrides` of its TrainConfig) on the session's
        dataset, or on `data_fraction` of its generated frames, then measure, record and judge it."""
        case = Case.parse(case) if isinstance(case, str) else case
        if self.used:
            raise RuntimeError("loadbench.run() may be called once per test: one timed region per record")
        self.used = True
        session, options = self.session, self.session.options
        config = self.config_for(case, **overrides)
        data = session.dataset(data_fraction)
        self.benchmark.group = case.experiment
        self.benchmark.extra_info.update(case=case.id, experiment=case.experiment, config=config.as_dict())

        if options.compile_only:
            self._build_only(case, config, data)
        monitor = LoadMonitor(options.device, options.monitor_period, probe=session.probe)
        progress = self._progress(case, config, monitor)
        gc.collect()
        if options.device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(options.device)
            # What other live objects (the dataset) hold is not this case's.
            self.allocated_before = torch.cuda.memory_allocated(options.device)
        builds = TritonBuilds()
        try:
            with builds:
                trainer = Trainer(config, data)  # built outside the timed window
                if options.plant is not None:
                    plant_slowdown(trainer, options.plant)
                with monitor:
                    result, epochs = self._train(trainer, config, progress, monitor)
        except torch.cuda.OutOfMemoryError as exc:
            self._out_of_memory(case, config, exc)
        record = self._record(case, config, data, result, epochs, monitor)
        record["triton_builds"] = builds.counts()
        # After the timed window and the record's memory peaks, before the trainer lets go
        # of its model: --kernel-trace profiles three epochs for the stored table, the bound
        # of every other case one.
        if options.trace:
            table = profile_trainer(trainer)
            record["kernel_trace"] = table.to_dict()
        else:
            table = self._profile_once(trainer)
        record.update(self._bound(config, data, record, table))
        trainer.release()
        self.benchmark.extra_info.update(record)
        self._judge(case, record)
        return result

    def _build_only(self, case: Case, config: TrainConfig, data: Dataset) -> None:
        """--compile-only: train the case's first two epochs (the first compiles and captures,
        the second replays) and evaluate, so that what its timed run compiles is compiled,
        then skip the test (bench/plugin/ahead.py counts the skip's line)."""
        start = time.monotonic()
        epochs = min(2, config.epochs)
        try:
            trainer = Trainer(config, data)
            trainer.fit(epochs=epochs)
            trainer.evaluate()
            trainer.release()
        except torch.cuda.OutOfMemoryError as exc:
            self._out_of_memory(case, config, exc)
        pytest.skip(f"{BUILT}{self.request.node.nodeid} ({case.id}): {epochs} epochs and the evaluation in "
                    f"{time.monotonic() - start:.2f} s; nothing timed or stored")

    def _out_of_memory(self, case: Case, config: TrainConfig, exc: torch.cuda.OutOfMemoryError) -> None:
        """Fail the test in one line that names the case, its size and the device."""
        pytest.fail(
            f"{case.id}: out of GPU memory (batch {config.batch_size}, width {config.width}, "
            f"depth {config.depth}) on {self.session.options.device}: {str(exc).splitlines()[0]}",
            pytrace=False,
        )

    def _profile_once(self, trainer: Trainer) -> KernelTable | str:
        """One more epoch under the profiler, or why it could not be profiled (no CUPTI)."""
        try:
            return profile_trainer(trainer, epochs=1, warmup=0)
        except RuntimeError as exc:
            return str(exc)

    def _bound(self, config: TrainConfig, data: Dataset, record: dict[str, Any],
               table: KernelTable | str) -> dict[str, Any]:
        """The record's "bound" (model/bound.py) from the profiled epoch, or None with the
        reason in "bound_unavailable"."""
        if isinstance(table, str):
            return {"bound": None, "bound_unavailable": table}
        ceilings = self.session.ceilings(config.precision)
        bound = step_bound(
            training_cost(config, len(data.y_train), data.n_features, data.n_classes), config,
            n_train=len(data.y_train), in_features=data.n_features,
            kernels_per_epoch=table.total_calls_per_epoch, device_us_per_epoch=table.total_us_per_epoch,
            epoch_seconds=record["median_epoch_s"], ceilings=ceilings,
        )
        return {"bound": {**bound.as_dict(), "device": table.device, "ceilings": ceilings.as_dict()}}

    def _train(
        self, trainer: Trainer, config: TrainConfig, progress: Any, monitor: LoadMonitor
    ) -> tuple[TrainResult, list[float]]:
        """The first epoch as the warm-up (timed by the trainer, recorded apart), then every
        later epoch as one pytest-benchmark round; the result and the epoch times of exactly
        `config.epochs` epochs. The gate reads pytest-benchmark's rounds, so both judge the
        same samples; rounds `--benchmark-cprofile` adds after them change neither the result
        nor the load window (the monitor stops with the last timed round)."""
        first = trainer.run_epoch(progress)
        monitor.mark_warm()
        done: dict[str, Any] = {}

        def after_round(*_: object) -> None:
            if "result" not in done and len(trainer.epoch_seconds) == config.epochs:
                monitor.stop()
                done["result"] = trainer.result()

        if getattr(self.benchmark, "disabled", False):  # --benchmark-disable: pedantic would run one epoch
            trainer.fit(progress, epochs=config.epochs - 1)
            after_round()
            return done["result"], list(trainer.epoch_seconds[: config.epochs])
        self.benchmark.pedantic(trainer.run_epoch, args=(progress,), rounds=config.epochs - 1, warmup_rounds=0,
                                iterations=1, teardown=after_round)
        return done["result"], [first, *self.benchmark.stats.stats.data[: config.epochs - 1]]

    def _progress(self, case: Case, config: TrainConfig, monitor: LoadMonitor) -> Any:
        verbose = self.request.config.get_verbosity() > 0 or self.request.config.getoption("capture") == "no"
        reporter = self.request.config.pluginmanager.get_plugin("terminalreporter")
        capture = self.request.config.pluginmanager.get_plugin("capturemanager")
        last = [time.monotonic() if not verbose else 0.0]

        def on_epoch(epoch: int, seconds: float, loss: float) -> None:
            monitor.epoch = epoch
            if reporter is None:
                return
            now = time.monotonic()
            if verbose:
                due = epoch == config.epochs - 1 or now - last[0] >= PROGRESS_EVERY_S
            else:  # a long case says it is alive every QUIET_PROGRESS_AFTER_S
                due = now - last[0] >= QUIET_PROGRESS_AFTER_S
            if not due:
                return
            last[0] = now
            line = f"  {case.id}: epoch {epoch + 1}/{config.epochs}  {seconds:.3f} s  loss {loss:.4f}"
            if capture is not None:
                with capture.global_and_fixture_disabled():
                    reporter.write_line(line)
            else:
                reporter.write_line(line)

        return on_epoch

    def _record(
        self, case: Case, config: TrainConfig, data: Dataset, result: TrainResult, epoch_seconds: list[float],
        monitor: LoadMonitor,
    ) -> dict[str, Any]:
        session, options = self.session, self.session.options
        rounds = [epoch_seconds]  # one training; the gate's records keep the list of trainings
        steady = time_samples({"epoch_seconds_by_round": rounds}) or rounds[-1]
        median_epoch = statistics.median(steady)
        cost = training_cost(config, len(data.y_train), data.n_features, data.n_classes)
        epochs = sum(len(r) for r in rounds)
        load = summarize_monitor(monitor, epochs)
        cuda = options.device.type == "cuda"
        rss = load["fields"]["rss_mib"]  # type: ignore[index]
        folder = session.series_dir
        series = None
        if folder is not None:
            series = write_series(folder / f"{safe_name(self.request.node.name)}.csv", list(monitor.samples))
        throttle = load["throttle"]
        return {
            "profile": options.profile.name,
            "dataset": data.describe(),
            "loop_ran": result.loop,
            "optimizer_impl": result.optimizer_impl,
            "step_route": result.step_route,
            "notes": result.notes,
            "epoch_seconds_by_round": rounds,
            "first_epoch_s": rounds[-1][0],
            "kernel_caches": session.first_epoch_caches(self.request.node.nodeid),  # what the first epoch compiled
            "median_epoch_s": median_epoch,
            "train_seconds": sum(rounds[-1]),
            "samples_per_s": len(data.y_train) / median_epoch,
            "tflops": cost.tflops(median_epoch),
            "cost": cost.as_dict(),
            "accuracy": result.accuracy,
            "macro_f1": result.macro_f1,
            "weighted_f1": result.weighted_f1,
            "final_loss": result.final_loss,
            "confusion": result.confusion,
            # The case's own allocator peak: what it allocated above what was live before it.
            "vram_peak_mib": (torch.cuda.max_memory_allocated(options.device) - self.allocated_before) / 2**20
            if cuda
            else None,
            "vram_reserved_peak_mib": torch.cuda.max_memory_reserved(options.device) / 2**20 if cuda else None,
            "rss_peak_mib": rss["max"] if rss else None,
            "energy_j": load["energy_j"],
            "energy_per_epoch_j": load["energy_per_epoch_j"],
            "energy_epochs": load["energy_epochs"],  # "after the first", or "all" (records before the mark)
            "throttled": bool(throttle and throttle["throttled"]),  # type: ignore[index]
            "load": load,
            "series_path": str(series) if series else None,  # None: the run is not stored
            "planted_slowdown": str(options.plant) if options.plant else None,
        }

    def _judge(self, case: Case, record: dict[str, Any]) -> None:
        """The gate's judge on this record; the verdict goes into extra_info and the summary,
        and a broken limit fails this test."""
        session = self.session

        def keep(judged: Judgement, then: dict[str, Any] | None) -> None:
            session.records.append({
                "case": case, "record": record, "failures": list(judged.verdict.failures), "noise": judged.noise,
                "deltas": deltas(record, then) if then is not None else None,
                "floors_skipped": judged.floors_skipped,
            })

        gate(session, self.benchmark, record, budget_for(session, case.id, experiment=case.experiment), case.id,
             before_failing=keep)
