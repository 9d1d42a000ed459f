"""One trial's measurement and the objective values taken from it.

An evaluator is any callable ``(TrainConfig, Compression) -> dict`` returning
model.inference.evaluate's record (latency_graph_s, latency_eager_s, throughput,
energy_j_per_1k, accuracy, macro_f1, accuracy_drop, ...). The real one trains (or
loads from the model cache) and measures; tests inject a fake with the same shape, so
everything between the measurement and the front runs the same code either way.

The objectives: batch-1 p99 latency (from the CUDA graph replay where the record has
it, else eager: the kind is recorded per trial), and energy per 1,000 inferences. On a
machine without an energy counter (a CPU, a GPU without NVML's counter) the second
objective is the time per 1,000 inferences at the largest measured batch (1000 /
throughput): at a steady power draw energy is that time times the power, so it ranks
settings the way energy would, and a study says which one it minimises.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from model.compress import Compression
from model.config import TrainConfig

Evaluator = Callable[[TrainConfig, Compression], dict[str, Any]]


class MissingMeasurement(Exception):
    """The record lacks a value an objective needs: the trial fails with this reason."""


@dataclass(frozen=True)
class Objective:
    key: str  # the name in the JSON and the table
    label: str  # axis and column title
    unit: str
    scale: float  # value * scale is shown in `unit`


LATENCY = Objective("p99_latency_s", "batch-1 p99 latency", "µs", 1e6)
ENERGY = Objective("energy_j_per_1k", "energy per 1,000 inferences", "J", 1.0)
TIME_PER_1K = Objective("time_per_1k_s", "time per 1,000 inferences (largest batch)", "ms", 1e3)
OBJECTIVES = {o.key: o for o in (LATENCY, ENERGY, TIME_PER_1K)}
NO_ENERGY_NOTE = (
    "no energy counter here ({why}): the second objective is the time per 1,000 inferences at "
    "the largest measured batch, which energy follows at a steady power draw"
)


def choose_objectives(energy_why_not: str | None) -> tuple[tuple[Objective, Objective], str | None]:
    """(latency, energy) where energy can be read, else (latency, time per 1k) and a note why."""
    if energy_why_not is None:
        return (LATENCY, ENERGY), None
    return (LATENCY, TIME_PER_1K), NO_ENERGY_NOTE.format(why=energy_why_not)


def energy_unavailable(device: torch.device) -> str | None:
    """Why this device's energy counter cannot be read, or None where it can (the
    reader model.inference.measure itself uses)."""
    from model.inference import nvml_energy

    return nvml_energy(device)[1]


def p99_latency(record: dict[str, Any]) -> tuple[float, str]:
    """The p99 batch-1 latency and where it came from: 'graph' or 'eager'."""
    for kind in ("graph", "eager"):
        stats = record.get(f"latency_{kind}_s")
        if stats and _number(stats.get("p99")):
            return float(stats["p99"]), kind
    raise MissingMeasurement("the record holds no p99 latency (graph or eager)")


def time_per_1k(record: dict[str, Any]) -> float:
    """1000 / samples per second at the largest batch measured."""
    throughput = {int(k): v for k, v in (record.get("throughput") or {}).items() if _number(v) and v > 0}
    if not throughput:
        raise MissingMeasurement("the record holds no throughput")
    return 1000.0 / throughput[max(throughput)]


def values(record: dict[str, Any], objectives: tuple[Objective, ...]) -> dict[str, float]:
    """Each objective's value from one record; MissingMeasurement names what is absent."""
    out = {}
    for objective in objectives:
        if objective is LATENCY:
            out[objective.key] = p99_latency(record)[0]
        elif objective is ENERGY:
            energy = record.get("energy_j_per_1k")
            if not _number(energy):
                raise MissingMeasurement("no energy per 1,000 inferences in the record (NVML counter unread)")
            out[objective.key] = float(energy)
        else:
            out[objective.key] = time_per_1k(record)
    return out


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def real_evaluator(data: Any, device: torch.device, profile: str, cache_dir: Path, impl: str,
                   pin: bool = False) -> Evaluator:
    """model.inference.evaluate on one dataset and device: train (or load the cached
    model), compress, measure, with the NVML energy counter where there is one; `pin`
    holds the timing thread on one CPU for batch-1 latency (measure's `pin`).
    Imported on use: the search's own tests inject a fake."""
    from model.inference import evaluate
    from model.inference import nvml_energy

    energy_mj, _ = nvml_energy(device)

    def run(config: TrainConfig, compression: Compression) -> dict[str, Any]:
        return evaluate(config, compression, data, device, profile=profile, cache_dir=cache_dir, impl=impl,
                        energy_mj=energy_mj, pin=pin)

    return run
