"""Summaries of a monitor's samples: mean, p95 and max per field, the study's [0, 1]
normalisation, energy over the timed window and the throttle flag. Pure functions."""

from __future__ import annotations

import math
from collections.abc import Iterable
from collections.abc import Mapping

import psutil

from bench.monitor.sampler import THROTTLE_BITS
from bench.monitor.sampler import GpuInfo
from bench.monitor.sampler import LoadMonitor

SUMMARY_FIELDS = {  # field: unit
    "gpu_util": "%",
    "gpu_mem_util": "%",
    "sm_activity": "%",
    "sm_occupancy": "%",
    "tensor_activity": "%",
    "dram_bw_util": "%",
    "vram_used_mib": "MiB",
    "torch_allocated_mib": "MiB",
    "torch_reserved_mib": "MiB",
    "power_w": "W",
    "sm_clock_mhz": "MHz",
    "temperature_c": "C",
    "cpu_process": "%",
    "cpu_system": "%",
    "rss_mib": "MiB",
    "ram_system": "%",
}
THROTTLED_FRACTION = 0.05  # a run is flagged when clocks were held down in over 5% of samples


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def describe(values: Iterable[float | None]) -> dict[str, float] | None:
    present = [v for v in values if v is not None and not math.isnan(v)]
    if not present:
        return None
    return {"mean": sum(present) / len(present), "p95": percentile(present, 0.95), "max": max(present)}


def throttle(samples: list[Mapping[str, float | None]]) -> dict[str, object] | None:
    reasons = [int(s["throttle_reasons"]) for s in samples if s.get("throttle_reasons") is not None]
    if not reasons:
        return None
    hits = {name: sum(1 for r in reasons if r & bit) / len(reasons) for bit, name in THROTTLE_BITS.items()}
    fraction = sum(1 for r in reasons if any(r & bit for bit in THROTTLE_BITS)) / len(reasons)
    return {
        "fraction": fraction,
        "reasons": sorted(name for name, share in hits.items() if share > 0),
        "throttled": fraction > THROTTLED_FRACTION,
    }


def summarize(
    samples: list[Mapping[str, float | None]],
    *,
    gpu: GpuInfo | None,
    energy_j: float | None,
    epochs: int,
    elapsed: float,
    busy_seconds: float,
    period: float,
    unavailable: Mapping[str, str],
) -> dict[str, object]:
    """The load record of one timed window, as stored in extra_info['load']."""
    fields = {name: describe(s.get(name) for s in samples) for name in SUMMARY_FIELDS}

    def mean(name: str) -> float | None:
        stats = fields[name]
        return None if stats is None else stats["mean"]

    def ratio(value: float | None, full: float | None) -> float | None:
        return None if value is None or not full else value / full

    total_mib = gpu.memory_total_mib if gpu else None
    peak_allocated = fields["torch_allocated_mib"]
    normalized = {  # the study's figures: each resource as a fraction of what the machine has
        "gpu_busy": ratio(mean("gpu_util"), 100),
        "sm_activity": ratio(mean("sm_activity"), 100),
        "vram": ratio(mean("vram_used_mib"), total_mib),
        "vram_allocated_peak": ratio(peak_allocated["max"] if peak_allocated else None, total_mib),
        "power": ratio(mean("power_w"), gpu.power_limit_w if gpu else None),
        "cpu_process": ratio(mean("cpu_process"), 100),
        "cpu_system": ratio(mean("cpu_system"), 100),
        "ram": ratio(mean("ram_system"), 100),
        "rss": ratio(mean("rss_mib"), psutil.virtual_memory().total / 2**20),
    }
    return {
        "samples": len(samples),
        "period_s": period,
        "window_s": elapsed,
        "fields": fields,
        "units": SUMMARY_FIELDS,
        "normalized": normalized,
        "energy_j": energy_j,
        "energy_per_epoch_j": None if energy_j is None or epochs == 0 else energy_j / epochs,
        "throttle": throttle(samples),
        "monitor_busy_fraction": busy_seconds / elapsed if elapsed > 0 else None,
        "unavailable": dict(unavailable),
    }


def summarize_monitor(
    monitor: LoadMonitor, epochs: int, window: tuple[float, float] | None = None
) -> dict[str, object]:
    """`summarize` of everything a stopped monitor saw, or of the samples inside
    `window` (time.perf_counter() values, a clock every process on the host shares):
    how another process's training is told apart from its start-up. The NVML energy
    counter is read at start, stop and `mark_warm`, so a window's energy is its mean
    power times its length; with a mark, the energy per epoch leaves the first epoch out
    ("energy_epochs")."""
    samples, elapsed, energy_j = list(monitor.samples), monitor.elapsed, monitor.energy_j
    busy_seconds = monitor.busy_seconds
    if window is not None:
        begin, end = window
        samples = [s for s in samples if begin <= monitor.started + s["t"] <= end]
        busy_seconds *= (end - begin) / elapsed if elapsed > 0 else 0.0
        elapsed = end - begin
        power = [s["power_w"] for s in samples if s.get("power_w") is not None]
        energy_j = sum(power) / len(power) * elapsed if power else None
    record = summarize(
        samples,
        gpu=monitor.gpu.info if monitor.gpu else None,
        energy_j=energy_j,
        epochs=epochs,
        elapsed=elapsed,
        busy_seconds=busy_seconds,
        period=monitor.period,
        unavailable=monitor.unavailable,
    )
    steady = monitor.steady_energy_j if window is None else None
    if steady is not None and epochs > 1:  # the epochs after the warm-up alone (LoadMonitor.mark_warm)
        record["energy_per_epoch_j"] = steady / (epochs - 1)
    record["energy_epochs"] = "after the first" if steady is not None and epochs > 1 else "all"
    # Where the summarized window lies in the monitor's span (seconds from its start); None: all of it.
    record["window"] = None if window is None else [window[0] - monitor.started, window[1] - monitor.started]
    record["paused_s"] = monitor.paused_seconds  # no readings there (LoadMonitor.paused)
    return record
