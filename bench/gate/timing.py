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


from bench.gate.budgets import Budget
from bench.gate.budgets import Failure
from bench.gate.budgets import InferenceBudget

MIN_NOISE_DOF = 2  # degrees of freedom before a spread counts as known (3 runs, or 2 + 2 rounds)
DEFAULT_NOISE_K = 3.0
DEFAULT_UNKNOWN_NOISE_PCT = 25.0
DEFAULT_ALPHA = 0.01
MEDIAN_CALL = "median_call_s"
TIMED_CALL = "timed_call"  # extra_info of a timed call: the experiment and case id whose budget judges it
CALL_SECONDS = "call_seconds"  # extra_info of a timed call (kernel cell, batch-1 forward): pytest-benchmark's rounds


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


@dataclass(frozen=True)
class SlowdownRule:
    """The time rule's limits, read from a training budget's time_* keys or a serving
    budget's latency_* keys; None means unset (the defaults above stand in)."""

    slower_pct: float | None
    noise_k: float | None = None
    noise_unknown_pct: float | None = None
    alpha: float | None = None
    hard_ratio: float | None = None

    @classmethod
    def of(cls, budget: Budget | InferenceBudget | SlowdownRule) -> SlowdownRule:
        """The rule a budget sets for its kind of record."""
        if isinstance(budget, SlowdownRule):
            return budget
        if isinstance(budget, InferenceBudget):
            return cls(budget.latency_slower_pct, budget.latency_noise_k, budget.latency_noise_unknown_pct,
                       budget.latency_alpha)
        return cls(budget.time_slower_pct, budget.time_noise_k, budget.time_noise_unknown_pct, budget.time_alpha,
                   budget.time_hard_ratio)


@dataclass(frozen=True)
class Timed:
    """What the time rule reads from one kind of record."""

    metric: str  # the Failure's metric
    samples: Callable[[dict[str, Any]], list[float]]  # within-run samples, for the Mann-Whitney U test
    rounds: Callable[[dict[str, Any]], list[float]]  # one figure per round, for the run-to-run noise
    figure: Callable[[dict[str, Any]], float | None]  # the figure whose ratio to the baseline's is judged
    what: str  # the samples, as the test's verdict names them
    shown: Callable[[dict[str, Any], float, float], str]  # the two figures in words


def time_limit(budget: Budget | InferenceBudget | SlowdownRule, noise: Noise) -> tuple[float, str]:
    """The relative slowdown a case may show before it fails, and the rule that set it."""
    rule = SlowdownRule.of(budget)
    pct = rule.slower_pct or 0.0
    if noise.known:
        k = rule.noise_k if rule.noise_k is not None else DEFAULT_NOISE_K
        bound = k * noise.spread  # type: ignore[operator]
        why = f"{k:g} x run-to-run spread {noise.spread:.2%} from {noise.source}"
    else:
        bound = (rule.noise_unknown_pct if rule.noise_unknown_pct is not None else DEFAULT_UNKNOWN_NOISE_PCT) / 100
        why = f"noise unknown ({noise.source}; needs {MIN_NOISE_DOF + 1} run medians): assumed {bound:.0%}"
    if pct / 100 >= bound:
        return pct / 100, f"budget {pct:g}% (above {why})"
    return bound, why


def check_slowdown(
    rule: SlowdownRule, timed: Timed, current: dict[str, Any], baseline: dict[str, Any], *,
    history: Sequence[dict[str, Any]] = (),
) -> list[Failure]:
    """The one time rule, for epoch times and latencies alike: a Failure when the figure's
    ratio to the baseline's passes the hard ratio, or passes the larger of slower_pct and
    k x the run-to-run spread (`history`, stored records of the case with the baseline
    among them, pooled with this run's rounds) while neither record was throttled and a
    one-sided Mann-Whitney U test on the samples is below alpha."""
    now, then = timed.samples(current), timed.samples(baseline)
    figure_now, figure_then = (timed.figure(current), timed.figure(baseline)) if now and then else (None, None)
    if not figure_now or not figure_then:
        return []
    ratio = figure_now / figure_then
    if rule.hard_ratio is not None and ratio > rule.hard_ratio:
        return [Failure(timed.metric, ratio, rule.hard_ratio, 1.0, "hard ceiling on the median ratio")]
    if rule.slower_pct is None:
        return []
    limit, why = time_limit(rule, estimate_noise(history or [baseline], current, samples=timed.rounds))
    if ratio <= 1 + limit:
        return []
    if current.get("throttled") or baseline.get("throttled"):
        return []  # inconclusive: clocks were held down
    significance = _significantly_slower(now, then, rule.alpha, timed.what)
    if significance is None:
        return []  # not significant within the run (with n <= 3 per side it never can be)
    detail = f"{timed.shown(current, figure_now, figure_then)}; limit from {why}; {significance}"
    return [Failure(timed.metric, ratio, 1 + limit, 1.0, detail)]


def _significantly_slower(now: Sequence[float], then: Sequence[float], alpha: float | None, what: str) -> str | None:
    """The one-sided Mann-Whitney U test both gates end with: its verdict in words when
    `now` is significantly larger than `then` at `alpha`, else None."""
    alpha = alpha if alpha is not None else DEFAULT_ALPHA
    from scipy.stats import mannwhitneyu  # here: scipy.stats takes seconds to import, and most runs compare nothing

    p = float(mannwhitneyu(now, then, alternative="greater").pvalue)
    if p >= alpha:
        return None
    return f"Mann-Whitney U p={p:.2g} < {alpha:g} over {len(now)} vs {len(then)} {what}"


def latency_rounds(extra_info: dict[str, Any]) -> list[float]:
    """A serving record's batch-1 p99 per round of calls (seconds)."""
    return [float(v) for v in extra_info.get("latency_p99_by_round_s") or []]


def _median_epoch(extra_info: dict[str, Any]) -> float | None:
    samples = time_samples(extra_info)
    return statistics.median(samples) if samples else None


EPOCH_TIME = Timed(
    "epoch_time_ratio", time_samples, round_medians, _median_epoch, "epochs",
    lambda record, now, then: f"median epoch {now:.4g} s vs {then:.4g} s",
)
LATENCY = Timed(
    "latency_p99_ratio", latency_rounds, latency_rounds, lambda record: record.get("latency_p99_s"), "rounds' p99",
    lambda record, now, then: f"batch-1 p99 {now * 1e6:.4g} us vs {then * 1e6:.4g} us ({record.get('latency_mode')})",
)


def call_samples(extra_info: dict[str, Any]) -> list[float]:
    """The seconds of each timed call of a kernel cell, batch-1 forward or other timed call."""
    return [float(v) for v in extra_info.get(CALL_SECONDS) or []]


def _median_call(extra_info: dict[str, Any]) -> float | None:
    samples = call_samples(extra_info)
    return statistics.median(samples) if samples else None


CALL_TIME = Timed(
    "call_time_ratio", call_samples, lambda record: [m] if (m := _median_call(record)) else [], _median_call,
    "calls", lambda record, now, then: f"median call {now * 1e6:.4g} us vs {then * 1e6:.4g} us",
)


def check_time(
    budget: Budget, current: dict[str, Any], baseline: dict[str, Any], *, history: Sequence[dict[str, Any]] = (),
    timed: Timed = EPOCH_TIME,
) -> list[Failure]:
    """The median steady epoch (or, with `timed`, another figure) against the baseline's, by
    `check_slowdown`; `history` holds stored records of the same case (the baseline among
    them) for its run-to-run noise."""
    return check_slowdown(SlowdownRule.of(budget), timed, current, baseline, history=history)


def check_latency(
    budget: InferenceBudget, current: dict[str, Any], baseline: dict[str, Any], *,
    history: Sequence[dict[str, Any]] = ()
) -> list[Failure]:
    """A served variant's batch-1 p99 against the baseline's, by `check_slowdown` over the
    rounds' p99s. Records of different latency modes (a graph replay against an eager
    loop) are not compared."""
    if current.get("latency_mode") != baseline.get("latency_mode"):
        return []
    return check_slowdown(SlowdownRule.of(budget), LATENCY, current, baseline, history=history)


def time_note(time_gated: bool, device: str) -> str | None:
    """Why time is not judged against the baseline in a run (its settings' `time_gated` and
    `device`), for every verdict of it; None when it is."""
    if time_gated:
        return None
    if device.split(":")[0] == "cpu":
        return "time not gated on a CPU (its epochs move with the machine's other load; --time-gate on gates it)"
    return "time not gated (--time-gate off)"
