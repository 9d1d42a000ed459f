"""Load summaries of a monitor: all it saw, or only a window of it."""

from __future__ import annotations

import time

import pytest
import torch

from bench.monitor.loadstats import summarize
from bench.monitor.loadstats import summarize_monitor
from bench.monitor.sampler import LoadMonitor


def _monitor_with(samples: list[dict], started: float = 100.0, stopped: float = 110.0) -> LoadMonitor:
    monitor = LoadMonitor(torch.device("cpu"), period=1.0, probe="no GPU in this test")
    monitor.started, monitor.stopped = started, stopped
    monitor.busy_seconds = 0.5
    monitor.samples.extend(samples)
    return monitor


def test_a_window_keeps_only_its_samples_and_takes_energy_from_their_power() -> None:
    # start-up at 50 W, training at 300 W from t = 4 s to t = 8 s
    samples = [{"t": float(t), "power_w": 300.0 if 4 <= t <= 8 else 50.0, "cpu_process": float(t)} for t in range(11)]
    monitor = _monitor_with(samples)
    whole = summarize_monitor(monitor, epochs=2)
    window = summarize_monitor(monitor, epochs=2, window=(104.0, 108.0))
    assert whole["samples"] == 11 and whole["window"] is None and whole["energy_j"] is None  # no NVML counter here
    assert window["samples"] == 5 and window["window"] == [4.0, 8.0] and window["window_s"] == 4.0
    assert window["fields"]["power_w"]["mean"] == 300.0
    assert window["energy_j"] == pytest.approx(1200.0) and window["energy_per_epoch_j"] == pytest.approx(600.0)
    assert window["fields"]["cpu_process"]["max"] == 8.0
    assert window["monitor_busy_fraction"] == pytest.approx(0.05)  # 0.5 s of 10 s, scaled to the window


def _summary(samples: list[dict]) -> dict:
    return summarize(samples, gpu=None, energy_j=None, epochs=1, elapsed=1.0, busy_seconds=0.0, period=0.1,
                     unavailable={})


def test_a_missing_gpu_busy_reading_is_none_never_zero() -> None:
    unread = _summary([{"t": 0.0, "gpu_util": None, "cpu_process": 5.0}, {"t": 0.1, "cpu_process": 5.0}])
    assert unread["fields"]["gpu_util"] is None and unread["normalized"]["gpu_busy"] is None
    # Readings missing from some samples are left out of the mean, not counted as idle.
    partly = _summary([{"t": 0.0, "gpu_util": None}, {"t": 0.1, "gpu_util": 80.0}, {"t": 0.2, "gpu_util": 60.0}])
    assert partly["fields"]["gpu_util"] == {"mean": 70.0, "p95": pytest.approx(79.0), "max": 80.0}
    assert partly["normalized"]["gpu_busy"] == pytest.approx(0.7)


def test_a_window_without_power_readings_has_no_energy() -> None:
    monitor = _monitor_with([{"t": float(t), "cpu_process": 1.0} for t in range(5)])
    assert summarize_monitor(monitor, epochs=1, window=(101.0, 103.0))["energy_j"] is None


def test_a_live_monitor_windowed_by_the_shared_clock() -> None:
    monitor = LoadMonitor(torch.device("cpu"), period=0.01)
    monitor.start()
    time.sleep(0.2)
    begin = time.perf_counter()
    time.sleep(0.2)
    end = time.perf_counter()
    time.sleep(0.2)
    monitor.stop()
    whole, window = summarize_monitor(monitor, 1), summarize_monitor(monitor, 1, window=(begin, end))
    assert 0 < window["samples"] < whole["samples"]
    assert window["window_s"] == pytest.approx(end - begin)


def test_a_process_tree_counts_the_work_of_child_processes() -> None:
    import subprocess
    import sys

    tree, alone = LoadMonitor(torch.device("cpu"), 0.05, children=True), LoadMonitor(torch.device("cpu"), 0.05)
    tree.start()
    alone.start()
    # The child burns a fixed amount of CPU time, however long a busy machine makes it wait.
    spin = "import time\nwhile time.process_time() < 1.5: pass"
    busy = subprocess.Popen([sys.executable, "-c", spin])
    busy.wait()
    tree.stop()
    alone.stop()
    # CPU seconds each monitor saw over its window (mean % of one core x window). Both
    # see this process alike; only the tree sees the child's 1.5 CPU seconds.
    seconds = [summarize_monitor(m, 1)["fields"]["cpu_process"]["mean"] * m.cores / 100 * m.elapsed
               for m in (tree, alone)]
    assert seconds[0] - seconds[1] > 1.0


def test_series_writers_never_share_a_temporary_file(tmp_path) -> None:
    """Runs on several GPUs at once can write the same case's series into one folder:
    each writer needs a temporary name of its own (a shared one lost whole records)."""
    from bench.monitor.series import read_series
    from bench.monitor.series import write_series

    target = tmp_path / "test_units_units-128.csv"
    (tmp_path / "test_units_units-128.csv.partial").mkdir()  # another writer's file, in the way
    write_series(target, [{"t": 0.0, "cpu_process": 12.5}, {"t": 0.1, "cpu_process": None}])
    assert read_series(target)["cpu_process"][0] == 12.5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["test_units_units-128.csv",
                                                          "test_units_units-128.csv.partial"]


def _wait_until(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the monitor thread never got there"
        time.sleep(0.001)


def test_no_reading_while_paused_and_the_gap_is_recorded() -> None:
    """`paused` holds the sampler off (batch-1 latency is timed inside it); readings
    resume after, and the summary says how long there were none."""
    monitor = LoadMonitor(torch.device("cpu"), period=0.001, probe="no GPU in this test")
    monitor.start()
    _wait_until(lambda: len(monitor.samples) >= 2)
    with monitor.paused():
        held = len(monitor.samples)
        time.sleep(0.05)  # some fifty periods
        assert len(monitor.samples) == held
    _wait_until(lambda: len(monitor.samples) > held)
    monitor.stop()
    assert monitor.paused_seconds >= 0.05
    assert summarize_monitor(monitor, 1)["paused_s"] == monitor.paused_seconds


def test_the_energy_per_epoch_leaves_the_warm_up_epoch_out_once_marked() -> None:
    monitor = _monitor_with([{"t": 0.0, "power_w": 100.0}])
    monitor.energy_start_mj, monitor.energy_stop_mj = 0.0, 50_000.0  # 50 J over 5 epochs
    assert summarize_monitor(monitor, epochs=5)["energy_per_epoch_j"] == pytest.approx(10.0)
    assert summarize_monitor(monitor, epochs=5)["energy_epochs"] == "all"
    monitor.energy_mark_mj = 30_000.0  # the warm-up epoch (compilation on an idling card) took 30 J
    marked = summarize_monitor(monitor, epochs=5)
    assert marked["energy_j"] == pytest.approx(50.0) and marked["energy_epochs"] == "after the first"
    assert marked["energy_per_epoch_j"] == pytest.approx(5.0)  # 20 J over the 4 epochs after it
