"""The self-test's statistics: each case's A/A spread and largest change, its false
alarms and catches under the gate's own rules, and the time budget that keeps it quiet
(FORMULA); the totals and the false-red line."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench.gate.budgets import Budget
from bench.gate.budgets import Budgets
from bench.gate.timing import DEFAULT_NOISE_K
from bench.gate.runs import MAX_HISTORY
from bench.gate.record import RECORD_KEY
from bench.gate.timing import check_time
from bench.gate.timing import estimate_noise
from bench.gate.timing import time_limit
from bench.gate.timing import time_samples
from bench.tools.selftest.campaign import settings
from bench.tools.selftest.campaign import timed_cases


FORMULA = (
    "suggested time_slower_pct = max(1.0, k x spread, 1.5 x largest A/A change) in percent, "
    "rounded up to 0.5 (k: the budget's time_noise_k, default 3)"
)
CHANGE_MARGIN = 1.5  # how far above the largest A/A change the budget sits
MIN_SUGGESTED_PCT = 1.0  # a floor: ten quiet runs can understate the jitter of a very steady case


@dataclass(frozen=True)
class CaseResult:
    fullname: str
    case_id: str
    experiment: str
    runs: int  # A/A runs
    spread: float | None  # relative; None while unknown
    largest_change: float  # relative, as a slowdown
    false_alarms: int
    comparisons: int  # A/A judgements: runs - 1
    detected: dict[float, tuple[int, int]]  # planted percentage -> (runs failed, runs)
    detectable: float | None  # relative limit now; None when the budget does not judge time
    detectable_rule: str
    k: float
    suggested_pct: float | None
    cards: int = 1  # distinct GPUs among the A/A runs; 0: some run does not say which
    card_offset: float | None = None  # relative, slowest card's median over the fastest's; None: one card or unknown
    red_runs: tuple[str, ...] = ()  # the A/A runs (by name) this case failed in, against the run before


def card_of(run: dict[str, Any]) -> str | None:
    """The UUID of the GPU a run was made on; None for runs that do not record it."""
    gpu = run["machine_info"][RECORD_KEY].get("gpu") or {}
    return gpu.get("uuid")


def card_offset(records: Sequence[dict[str, Any]], cards: Sequence[str | None]) -> tuple[int, float | None]:
    """(distinct cards, offset): the median of each card's run medians, the slowest over
    the fastest minus 1. A campaign on a multi-GPU host alternates cards; this says how
    much of the A/A spread is the cards rather than the runs. (0, None) when some run
    does not name its card, (1, None) on one card."""
    if not cards or any(card is None for card in cards):
        return 0, None
    per_card: dict[str | None, list[float]] = {}
    for record, card in zip(records, cards):
        per_card.setdefault(card, []).append(median_epoch(record))
    if len(per_card) < 2:
        return len(per_card), None
    medians = [statistics.median(values) for values in per_card.values()]
    return len(per_card), max(medians) / min(medians) - 1


def median_epoch(extra_info: dict[str, Any]) -> float:
    """The median steady epoch, as check_time takes it."""
    return statistics.median(time_samples(extra_info))


def largest_change(records: Sequence[dict[str, Any]]) -> float:
    """The largest change of the median epoch between consecutive runs, either way, as a
    slowdown: which run of a pair came first is chance, so a speedup counts as well."""
    changes = [0.0]
    for before, now in zip(records, records[1:]):
        ratio = median_epoch(now) / median_epoch(before)
        changes.append(max(ratio, 1 / ratio) - 1)
    return max(changes)


def gate_history(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the suite would hold as stored history: the newest MAX_HISTORY runs."""
    return list(records[-MAX_HISTORY:])


def false_alarm_runs(budget: Budget, aa: Sequence[dict[str, Any]]) -> list[int]:
    """A/A run i against run i-1, history runs 1..i-1, for i = 2..N: the i that failed (0-based)."""
    return [i for i in range(1, len(aa)) if check_time(budget, aa[i], aa[i - 1], history=gate_history(aa[:i]))]


def count_false_alarms(budget: Budget, aa: Sequence[dict[str, Any]]) -> int:
    """How many A/A comparisons failed (false_alarm_runs)."""
    return len(false_alarm_runs(budget, aa))


def count_detections(budget: Budget, aa: Sequence[dict[str, Any]], planted: Sequence[dict[str, Any]]) -> int:
    """Planted runs against the last A/A run, history all A/A runs: how many failed."""
    history = gate_history(aa)
    return sum(bool(check_time(budget, run, aa[-1], history=history)) for run in planted)


def noise_k(budget: Budget) -> float:
    return budget.time_noise_k if budget.time_noise_k is not None else DEFAULT_NOISE_K


def suggest_pct(k: float, spread: float | None, change: float) -> float | None:
    """max(1.0, k x spread, 1.5 x largest change) in percent, rounded up to 0.5; None
    while the spread is unknown: a budget from two runs would only guess."""
    if spread is None:
        return None
    pct = max(MIN_SUGGESTED_PCT, 100 * k * spread, 100 * CHANGE_MARGIN * change)
    return math.ceil(round(2 * pct, 9)) / 2  # round(): 3 x 0.5% must stay 1.5, not 1.5000000001 -> 2.0


def smallest_detectable(budget: Budget, aa: Sequence[dict[str, Any]]) -> tuple[float | None, str]:
    """time_limit against the A/A history, and a short name of the rule that set it."""
    if budget.time_slower_pct is None:
        return None, "time not judged (no time_slower_pct)"
    noise = estimate_noise(gate_history(aa))
    limit, rule = time_limit(budget, noise)
    if rule.startswith("budget"):
        return limit, "budget"
    return limit, f"{noise_k(budget):g} x spread" if noise.known else "noise unknown"


def analyse_case(
    budget: Budget,
    fullname: str,
    aa: Sequence[dict[str, Any]],
    planted: dict[float, Sequence[dict[str, Any]]],
    cards: Sequence[str | None] = (),
    names: Sequence[str] = (),
) -> CaseResult:
    """One case's figures from its extra_info records: A/A in run order, planted per
    percentage; `cards`, the GPU of each A/A record (card_of), where known; `names`, the
    A/A runs' names (aa-01 ...), for the run-level false-red rate."""
    red = false_alarm_runs(budget, aa)
    spread = estimate_noise(aa).spread
    change = largest_change(aa)
    detectable, rule = smallest_detectable(budget, aa)
    n_cards, offset = card_offset(aa, cards)
    return CaseResult(
        fullname=fullname,
        case_id=str(aa[0].get("case", fullname)),
        experiment=str(aa[0].get("experiment", "")),
        runs=len(aa),
        spread=spread,
        largest_change=change,
        false_alarms=len(red),
        comparisons=len(aa) - 1,
        detected={pct: (count_detections(budget, aa, runs), len(runs)) for pct, runs in sorted(planted.items())},
        detectable=detectable,
        detectable_rule=rule,
        k=noise_k(budget),
        suggested_pct=suggest_pct(noise_k(budget), spread, change),
        cards=n_cards,
        card_offset=offset,
        red_runs=tuple(names[i] if i < len(names) else str(i + 1) for i in red),
    )


def analyse(
    aa_runs: Sequence[dict[str, Any]], planted_runs: dict[float, Sequence[dict[str, Any]]], budgets: Budgets,
    aa_names: Sequence[str] = (),
) -> list[CaseResult]:
    """Every case of the runs (checked alike beforehand), in name order; `aa_names` names the A/A runs."""
    campaign_names = list(zip(aa_names, aa_runs))
    run_settings = settings(aa_runs[0])
    profile, dataset = run_settings.get("profile", "smoke"), run_settings.get("dataset", "synthetic")
    results = []
    every = sorted(set().union(*(timed_cases(run) for run in aa_runs)))
    for fullname in every:
        holding = [run for run in aa_runs if fullname in timed_cases(run)]
        aa = [timed_cases(run)[fullname] for run in holding]
        if len(aa) < 2:
            continue  # no A/A comparison to make; missing_cases says which runs lack it
        planted = {pct: [timed_cases(run)[fullname] for run in runs if fullname in timed_cases(run)]
                   for pct, runs in planted_runs.items()}
        budget = budgets.resolve(profile, str(aa[0].get("experiment", "")), str(aa[0].get("case", "")), dataset)
        names = [name for name, run in campaign_names if run in holding] if campaign_names else []
        results.append(analyse_case(budget, fullname, aa, planted, [card_of(run) for run in holding], names))
    return results


@dataclass(frozen=True)
class Totals:
    false_alarms: int
    comparisons: int
    caught_always: dict[float, int]  # percentage -> cases caught in every planted run
    cases: int
    red_runs: int = 0  # A/A runs in which some case failed against the run before
    run_comparisons: int = 0  # A/A runs judged against the one before (runs - 1)
    estimated_red: float | None = None  # 1 - prod(1 - each case's false-alarm rate): a run of all these cases


def totals(results: Sequence[CaseResult], aa_runs: int = 0) -> Totals:
    pcts = sorted({pct for r in results for pct in r.detected})
    clear = 1.0
    for r in results:
        clear *= 1 - (r.false_alarms / r.comparisons if r.comparisons else 0.0)
    return Totals(
        false_alarms=sum(r.false_alarms for r in results),
        comparisons=sum(r.comparisons for r in results),
        caught_always={pct: sum(r.detected.get(pct, (0, 1))[0] == r.detected.get(pct, (0, 1))[1] for r in results)
                       for pct in pcts},
        cases=len(results),
        red_runs=len({name for r in results for name in r.red_runs}),
        run_comparisons=max(aa_runs - 1, 0),
        estimated_red=1 - clear if results else None,
    )


def false_red_line(t: Totals) -> str:
    """The chance that an unchanged run of these cases is red, before any paired re-run:
    as observed over the A/A runs, with the rule of three's 95% bound where none was red,
    and as estimated from the cases' own rates taken as independent."""
    if not t.run_comparisons:
        return "false-red rate per run: unknown (needs 2 A/A runs)"
    observed = f"{t.red_runs}/{t.run_comparisons} A/A runs red against the run before"
    if t.red_runs == 0:
        observed += f" (under {min(1.0, 3 / t.run_comparisons):.0%} at 95% confidence)"
    estimate = f"; from the cases' own rates {t.estimated_red:.1%}" if t.estimated_red is not None else ""
    return (f"false-red rate per run (an unchanged run of these {t.cases} case(s) failing somewhere, before the "
            f"paired re-runs of `ci`): {observed}{estimate}")
