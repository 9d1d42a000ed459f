"""Serving a trained MLP: latency, throughput, energy and accuracy of exactly the model timed.

`trained_model` trains a configuration once and keeps its weights on disk (the
benchmark and the search ask for the same model many times); `measure` times a
model at batch 1 (eagerly and replayed from a CUDA graph) and at serving batches,
reads the NVML energy counter over the throughput loop, and scores the same
callables on the test set; `evaluate` chains trained_model -> compress -> measure
and states the accuracy drop and speed-up against the uncompressed model.

Times are taken with `clock` (time.perf_counter by default) and a device sync at
the edges of each call; tests plant a clock. What cannot be measured here (graph
latency without CUDA, energy without NVML) is None, with the reason under
``unavailable``, never a zero.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from collections.abc import Sequence
from pathlib import Path

import torch

from model.compress import Compression
from model.config import TrainConfig
from model.data import Dataset

LATENCY_CALLS = {"cuda": 2000, "cpu": 100}  # batch-1 calls per latency mode
LATENCY_ROUNDS = 5  # the calls split into rounds: one p99 per round for the noise estimate
BATCHES = (512, 4096)
IMPLS = ("torch", "compile", "triton")


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


def measure(
    model: torch.nn.Module,
    data: Dataset,
    device: torch.device,
    *,
    impl: str = "torch",
    latency_calls: int | None = None,
    batches: Sequence[int] = BATCHES,
    graph: bool = True,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, object]:
    """Latency (batch 1), throughput (`batches`), energy per 1,000 inferences and the
    accuracy and macro-F1 of `model` run through `impl` ('torch' eager, 'compile'
    torch.compile, 'triton' our fused kernel). Keys: latency_graph_s, latency_eager_s
    ({p50, p99, max} seconds, or None), throughput ({"512": samples/s, ...}),
    energy_j_per_1k, accuracy, macro_f1, notes, unavailable (metric -> reason)."""
    raise NotImplementedError("model.inference.measure: being implemented (issue #18)")


def trained_model(config: TrainConfig, data: Dataset, *, profile: str, cache_dir: Path) -> torch.nn.Module:
    """`config` trained on `data` (model.train.Trainer), from the disk cache when the same
    configuration, seed, dataset and profile were trained before; a corrupt cache file
    is retrained with a warning."""
    raise NotImplementedError("model.inference.trained_model: being implemented (issue #18)")


def evaluate(
    config: TrainConfig,
    compression: Compression,
    data: Dataset,
    device: torch.device,
    *,
    profile: str,
    cache_dir: Path,
    impl: str = "torch",
) -> dict[str, object]:
    """trained_model -> compress -> measure, plus accuracy_drop (fp32 accuracy minus
    this one's) and speedup (throughput at batch 4096 over the fp32 model's, measured
    once per process). What the search calls per trial."""
    raise NotImplementedError("model.inference.evaluate: being implemented (issue #18)")
