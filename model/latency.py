"""Batch-1 latency: how many calls to time, their statistics, and the quiet they run in.

`latency_call_count` fits the calls to a slow model, `latency_stats` and `round_p99s`
read the samples (nearest-rank percentiles, one p99 per round for the gate's noise
estimate); `collector_paused` and `thread_pinned` keep the garbage collector and thread
migration out of the calls timed. model.inference.measure times with them.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
from collections.abc import Sequence

LATENCY_CALLS = {"cuda": 2000, "cpu": 100}  # batch-1 calls per latency mode
LATENCY_ROUNDS = 5  # the calls split into rounds: one p99 per round for the noise estimate
# Untimed batch-1 calls before each latency mode's timed ones, as any benchmark warms up:
# on an H100 the first of five rounds often held the tail (round p99s of 83-90 us against
# 27-41 us in the others); a new CUDA graph, for one, is uploaded at its first launch.
LATENCY_WARMUP = {"cuda": 50, "cpu": 3}
# A mode whose batch-1 call is slow gets fewer calls: as many as fill LATENCY_SECONDS, never
# fewer than LATENCY_MIN_CALLS (100 a round, so each round's p99 is read from 100 calls).
# Without it one slow variant (a quantized model at milliseconds a call) spends 2000 calls
# per mode per case, most of the nightly serving matrix's time.
LATENCY_SECONDS = {"cuda": 2.0, "cpu": 2.0}
LATENCY_MIN_CALLS = 100 * LATENCY_ROUNDS


def latency_call_count(calls: int, once_s: float, seconds: float, minimum: int = LATENCY_MIN_CALLS) -> int:
    """The batch-1 calls to time: `calls`, or as many as fill `seconds` at `once_s` a call
    if that is fewer, but never fewer than `minimum` (nor more than `calls`)."""
    if once_s <= 0 or not math.isfinite(once_s):
        return calls
    return min(calls, max(minimum, math.ceil(seconds / once_s)))


def latency_stats(samples_s: Sequence[float]) -> dict[str, float]:
    """p50, p99 and max of per-call latencies (seconds); nearest-rank percentiles, so
    every figure is a latency that was actually observed."""
    values = sorted(float(s) for s in samples_s)
    if not values:
        raise ValueError("latency_stats: no samples")
    if any(not math.isfinite(v) or v < 0 for v in values):
        raise ValueError("latency_stats: samples must be finite and non-negative seconds")

    def rank(q: float) -> float:
        return values[max(0, math.ceil(q * len(values)) - 1)]

    return {"p50": rank(0.50), "p99": rank(0.99), "max": values[-1]}


def round_p99s(samples: Sequence[float], rounds: int = LATENCY_ROUNDS) -> list[float]:
    """The p99 of each of `rounds` consecutive slices of the calls: one sample of the
    tail per round, for the compare's run-to-run noise and significance test."""
    size = len(samples) // rounds
    if size < 1:
        return [latency_stats(samples)["p99"]]
    return [latency_stats(samples[k * size : (k + 1) * size])["p99"] for k in range(rounds)]


@contextlib.contextmanager
def collector_paused():  # type: ignore[no-untyped-def]
    """Python's garbage collector off while batch-1 latency is timed, as timeit runs:
    a collection landing inside a call of some 20 us would count as serving latency."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


PIN_UNAVAILABLE = "this platform cannot hold a thread on one CPU (no sched_setaffinity, or it was refused)"


@contextlib.contextmanager
def thread_pinned():  # type: ignore[no-untyped-def]
    """The calling thread held on the CPU it is running on; yields that CPU, or None where
    the platform cannot pin (the calls then run free). Restores the thread's CPU set.

    Why: batch-1 calls slower than twice the p50 come in bursts of milliseconds, and one
    burst sets a round's p99; a migration of the timing thread is one cause that pinning
    removes. On an H100 host it did not lower the p99 (docs/measurements.md, serving), hence off
    by default. Linux applies sched_setaffinity(0, ...) to the calling thread only: the
    load monitor's thread and the CUDA driver's threads keep their CPUs."""
    setaffinity = getattr(os, "sched_setaffinity", None)
    cpu = _current_cpu() if setaffinity is not None else None
    before = os.sched_getaffinity(0) if cpu is not None else None
    if cpu is not None:
        try:
            setaffinity(0, {cpu})
        except OSError:
            cpu = None
    try:
        yield cpu
    finally:
        if cpu is not None:
            setaffinity(0, before)


def _current_cpu() -> int | None:
    """The CPU the calling thread runs on (field 39 of /proc/thread-self/stat), or None."""
    try:
        with open("/proc/thread-self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        cpu = int(fields[36])
    except (OSError, IndexError, ValueError):
        return None
    allowed = os.sched_getaffinity(0)
    return cpu if cpu in allowed else None
