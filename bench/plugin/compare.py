"""Baseline compare: read the run named by --benchmark-compare, decide whether it may
gate this run, and judge each case's metrics against it, direction-aware.

pytest-benchmark finds and loads the baseline file (and compares time statistics
with --benchmark-compare-fail); it skips a file it cannot parse with a warning and
keeps no extra_info rules, so the reading and judging of our metrics is here.

Time is judged on the per-epoch samples after the first epoch: a case regressed
only when the median ratio exceeds the budget's ``time_slower_pct`` *and* a
one-sided Mann-Whitney U test says the slowdown is significant at ``time_alpha``
(or when ``time_hard_ratio`` is exceeded, whatever the sample count).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

from scipy.stats import mannwhitneyu

from bench.plugin.budgets import Budget
from bench.plugin.budgets import Failure

RECORD_KEY = "loadbench"  # machine_info key and extra_info marker of our runs


class BaselineError(ValueError):
    """A baseline run that cannot be read or was not made by mlp-loadbench."""


@dataclass
class Baseline:
    path: Path
    machine_info: dict[str, Any]
    benchmarks: dict[str, dict[str, Any]]  # fullname -> saved benchmark
    gating: bool = True
    reason: str = ""  # why it does not gate
    notes: list[str] = field(default_factory=list)

    @property
    def gpu(self) -> str:
        return gpu_name(self.machine_info)


def gpu_name(machine_info: dict[str, Any]) -> str:
    gpu = machine_info.get(RECORD_KEY, {}).get("gpu") or {}
    return str(gpu.get("name") or "no GPU")


def read_run(path: Path) -> dict[str, Any]:
    """A saved pytest-benchmark run made by mlp-loadbench; BaselineError otherwise."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise BaselineError(f"baseline {path}: cannot be read: {exc.strerror or exc}") from None
    try:
        run = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BaselineError(f"baseline {path}: corrupt JSON at line {exc.lineno}: {exc.msg}") from None
    if not isinstance(run, dict) or not isinstance(run.get("benchmarks"), list) or "machine_info" not in run:
        raise BaselineError(f"baseline {path}: not a pytest-benchmark run file (no 'benchmarks' or 'machine_info')")
    if RECORD_KEY not in run["machine_info"]:
        raise BaselineError(
            f"baseline {path}: a pytest-benchmark run, but not made by mlp-loadbench "
            f"(machine_info has no {RECORD_KEY!r}); compare against a run of this suite"
        )
    return run


def make_baseline(path: Path, run: dict[str, Any], machine_info: dict[str, Any]) -> Baseline:
    baseline = Baseline(path, run["machine_info"], {b["fullname"]: b for b in run["benchmarks"]})
    ours, theirs = gpu_name(machine_info), baseline.gpu
    if ours != theirs:
        baseline.gating = False
        baseline.reason = f"baseline {path.name} was measured on {theirs}, this run on {ours}: shown, not gated"
    return baseline


# ------------------------------------------------------------------------ checks


def time_samples(extra_info: dict[str, Any]) -> list[float]:
    """Per-epoch seconds after each round's first epoch (allocator growth, capture, autotune)."""
    return [s for round_ in extra_info.get("epoch_seconds_by_round", []) for s in round_[1:]]


def check_time(budget: Budget, current: dict[str, Any], baseline: dict[str, Any]) -> list[Failure]:
    now, then = time_samples(current), time_samples(baseline)
    if not now or not then:
        return []
    ratio = statistics.median(now) / statistics.median(then)
    if budget.time_hard_ratio is not None and ratio > budget.time_hard_ratio:
        return [Failure("epoch_time_ratio", ratio, budget.time_hard_ratio, 1.0, "hard ceiling on the median ratio")]
    if budget.time_slower_pct is None:
        return []
    limit = 1 + budget.time_slower_pct / 100
    if ratio <= limit:
        return []
    alpha = budget.time_alpha if budget.time_alpha is not None else 0.01
    if current.get("throttled") or baseline.get("throttled"):
        return []  # inconclusive: clocks were held down
    p = float(mannwhitneyu(now, then, alternative="greater").pvalue)
    if p >= alpha:
        return []  # not significant (with n <= 3 per side it never can be)
    return [
        Failure(
            "epoch_time_ratio", ratio, limit, 1.0,
            f"median epoch {statistics.median(now):.4g} s vs {statistics.median(then):.4g} s, "
            f"Mann-Whitney U p={p:.2g} < {alpha:g} over {len(now)} vs {len(then)} epochs",
        )
    ]  # fmt: skip


def check_drops(budget: Budget, current: dict[str, Any], baseline: dict[str, Any]) -> list[Failure]:
    out = []
    for metric, limit in (("accuracy", budget.accuracy_drop_max), ("macro_f1", budget.macro_f1_drop_max)):
        if limit is None or metric not in baseline:
            continue
        drop = baseline[metric] - current[metric]
        if drop > limit:
            out.append(Failure(f"{metric}_drop", drop, limit, baseline[metric], f"now {current[metric]:.4f}"))
    return out


def check_growth(budget: Budget, current: dict[str, Any], baseline: dict[str, Any]) -> list[Failure]:
    out = []
    for metric, pct in (
        ("vram_peak_mib", budget.memory_growth_pct),
        ("rss_peak_mib", budget.memory_growth_pct),
        ("energy_per_epoch_j", budget.energy_growth_pct),
    ):
        now, then = current.get(metric), baseline.get(metric)
        if pct is None or now is None or not then:
            continue
        limit = then * (1 + pct / 100)
        if now > limit:
            out.append(Failure(metric, now, limit, then, f"grew {100 * (now / then - 1):.1f}% (limit {pct:g}%)"))
    return out


def check_against(budget: Budget, current: dict[str, Any], baseline: dict[str, Any]) -> list[Failure]:
    return check_time(budget, current, baseline) + check_drops(budget, current, baseline) + check_growth(
        budget, current, baseline
    )


# Metrics shown with deltas; +1 means higher is better, -1 lower is better.
DIRECTIONS = {
    "median_epoch_s": -1,
    "accuracy": 1,
    "macro_f1": 1,
    "weighted_f1": 1,
    "vram_peak_mib": -1,
    "rss_peak_mib": -1,
    "energy_per_epoch_j": -1,
}


def deltas(current: dict[str, Any], baseline: dict[str, Any]) -> dict[str, tuple[float, bool]]:
    """metric -> (relative change, whether it got worse)."""
    out = {}
    for metric, direction in DIRECTIONS.items():
        now, then = current.get(metric), baseline.get(metric)
        if now is None or not then:
            continue
        change = now / then - 1
        out[metric] = (change, change * direction < 0)
    return out
