"""The time rule: a case's steady epochs, or a served variant's batch-1 p99, against the baseline's.

Time is judged against the case's own run-to-run noise. A run is slow throughout or
fast throughout far more often than its epochs scatter inside it, so the epochs of one
run are not independent samples of its speed; what varies between runs is estimated
from runs of the case: the stored history (earlier runs on the same GPU model with the
same settings) and the rounds of this run where the profile times several. A case
regressed only when its median epoch ratio exceeds the larger of the budget's
``time_slower_pct`` and ``time_noise_k`` times that spread, *and* a one-sided
Mann-Whitney U test on the epochs says the slowdown is real within the run
(``time_alpha``). With fewer than ``MIN_NOISE_DOF + 1`` run medians the spread is
unknown, and ``time_noise_unknown_pct`` stands in for it. ``time_hard_ratio`` fails on
the median ratio alone.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from scipy.stats import mannwhitneyu

from bench.gate.budgets import Budget
from bench.gate.budgets import Failure
from bench.gate.budgets import InferenceBudget

MIN_NOISE_DOF = 2  # degrees of freedom before a spread counts as known (3 runs, or 2 + 2 rounds)
DEFAULT_NOISE_K = 3.0
DEFAULT_UNKNOWN_NOISE_PCT = 25.0
DEFAULT_ALPHA = 0.01


def time_samples(extra_info: dict[str, Any]) -> list[float]:
    """Per-epoch seconds after each round's first epoch (allocator growth, capture, autotune)."""
    return [s for round_ in extra_info.get("epoch_seconds_by_round", []) for s in round_[1:]]


def round_medians(extra_info: dict[str, Any]) -> list[float]:
    """The median steady epoch of each timed round: one sample of the case's speed per round."""
    return [statistics.median(r[1:]) for r in extra_info.get("epoch_seconds_by_round", []) if len(r) > 1]


@dataclass(frozen=True)
class Noise:
    """A case's run-to-run spread: the standard deviation of log run medians, pooled."""

    spread: float | None  # relative (0.01 = 1%); None when too few runs to tell
    runs: int  # run medians it was estimated from
    source: str  # where they came from, for messages

    @property
    def known(self) -> bool:
        return self.spread is not None


def estimate_noise(
    history: Sequence[dict[str, Any]],
    current: dict[str, Any] | None = None,
    samples: Callable[[dict[str, Any]], list[float]] = round_medians,
) -> Noise:
    """Run-to-run spread of one case from stored runs (`history`, extra_info records) and
    the rounds of `current`. The history's run medians form one group and the current
    run's rounds another; each group's squared log deviations from its own mean are
    pooled, so a run that is simply faster than the history does not widen the spread.
    `samples` reads one figure per round from a record (the median epoch by default;
    the serving cases pass their per-round batch-1 p99).
    """
    groups = [[m for record in history for m in samples(record)]]
    if current is not None:
        groups.append(samples(current))
    squares, dof, runs = 0.0, 0, 0
    for group in groups:
        logs = [math.log(m) for m in group if m > 0]
        runs += len(logs)
        if len(logs) >= 2:
            mean = sum(logs) / len(logs)
            squares += sum((x - mean) ** 2 for x in logs)
            dof += len(logs) - 1
    parts = [f"{len(history)} stored run(s)"] + ([f"{len(groups[1])} round(s) of this run"] if current else [])
    source = " and ".join(parts)
    if dof < MIN_NOISE_DOF:
        return Noise(None, runs, source)
    return Noise(math.sqrt(squares / dof), runs, source)


def time_limit(budget: Budget, noise: Noise) -> tuple[float, str]:
    """The relative slowdown a case may show before it fails, and the rule that set it."""
    pct = budget.time_slower_pct or 0.0
    if noise.known:
        k = budget.time_noise_k if budget.time_noise_k is not None else DEFAULT_NOISE_K
        bound = k * noise.spread  # type: ignore[operator]
        rule = f"{k:g} x run-to-run spread {noise.spread:.2%} from {noise.source}"
    else:
        bound = (budget.time_noise_unknown_pct if budget.time_noise_unknown_pct is not None
                 else DEFAULT_UNKNOWN_NOISE_PCT) / 100  # fmt: skip
        rule = f"noise unknown ({noise.source}; needs {MIN_NOISE_DOF + 1} run medians): assumed {bound:.0%}"
    if pct / 100 >= bound:
        return pct / 100, f"budget {pct:g}% (above {rule})"
    return bound, rule


def check_time(
    budget: Budget, current: dict[str, Any], baseline: dict[str, Any], *, history: Sequence[dict[str, Any]] = ()
) -> list[Failure]:
    """Judge the median epoch against the baseline's; `history` holds stored records of
    the same case (the baseline among them) for its run-to-run noise."""
    now, then = time_samples(current), time_samples(baseline)
    if not now or not then:
        return []
    ratio = statistics.median(now) / statistics.median(then)
    if budget.time_hard_ratio is not None and ratio > budget.time_hard_ratio:
        return [Failure("epoch_time_ratio", ratio, budget.time_hard_ratio, 1.0, "hard ceiling on the median ratio")]
    if budget.time_slower_pct is None:
        return []
    limit, rule = time_limit(budget, estimate_noise(history or [baseline], current))
    if ratio <= 1 + limit:
        return []
    if current.get("throttled") or baseline.get("throttled"):
        return []  # inconclusive: clocks were held down
    significance = _significantly_slower(now, then, budget.time_alpha, "epochs")
    if significance is None:
        return []  # not significant within the run (with n <= 3 per side it never can be)
    return [
        Failure(
            "epoch_time_ratio", ratio, 1 + limit, 1.0,
            f"median epoch {statistics.median(now):.4g} s vs {statistics.median(then):.4g} s; limit from {rule}; "
            f"{significance}",
        )
    ]  # fmt: skip


def _significantly_slower(now: Sequence[float], then: Sequence[float], alpha: float | None, what: str) -> str | None:
    """The one-sided Mann-Whitney U test both gates end with: its verdict in words when
    `now` is significantly larger than `then` at `alpha`, else None."""
    alpha = alpha if alpha is not None else DEFAULT_ALPHA
    p = float(mannwhitneyu(now, then, alternative="greater").pvalue)
    if p >= alpha:
        return None
    return f"Mann-Whitney U p={p:.2g} < {alpha:g} over {len(now)} vs {len(then)} {what}"


def latency_rounds(extra_info: dict[str, Any]) -> list[float]:
    """A serving record's batch-1 p99 per round of calls (seconds)."""
    return [float(v) for v in extra_info.get("latency_p99_by_round_s") or []]


def check_latency(
    budget: InferenceBudget, current: dict[str, Any], baseline: dict[str, Any], *, history: Sequence[dict[str, Any]] = ()
) -> list[Failure]:
    """A served variant's batch-1 p99 against the baseline's, by the epoch-time rule: slower
    than both latency_slower_pct and k x the run-to-run spread of per-round p99s (stored
    runs pooled with this run's rounds), and a one-sided Mann-Whitney U test on the
    rounds' p99s below latency_alpha. Records of different latency modes (a graph
    replay against an eager loop) are not compared."""
    now, then = latency_rounds(current), latency_rounds(baseline)
    p99_now, p99_then = current.get("latency_p99_s"), baseline.get("latency_p99_s")
    if not now or not then or not p99_now or not p99_then or budget.latency_slower_pct is None:
        return []
    if current.get("latency_mode") != baseline.get("latency_mode"):
        return []
    rule = Budget(time_slower_pct=budget.latency_slower_pct, time_noise_k=budget.latency_noise_k,
                  time_noise_unknown_pct=budget.latency_noise_unknown_pct)  # fmt: skip
    limit, why = time_limit(rule, estimate_noise(history or [baseline], current, samples=latency_rounds))
    ratio = p99_now / p99_then
    if ratio <= 1 + limit or current.get("throttled") or baseline.get("throttled"):
        return []
    significance = _significantly_slower(now, then, budget.latency_alpha, "rounds' p99")
    if significance is None:
        return []
    return [
        Failure(
            "latency_p99_ratio", ratio, 1 + limit, 1.0,
            f"batch-1 p99 {p99_now * 1e6:.4g} us vs {p99_then * 1e6:.4g} us ({current.get('latency_mode')}); "
            f"limit from {why}; {significance}",
        )
    ]  # fmt: skip
