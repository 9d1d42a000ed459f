"""One judge for a case record: the fixture, the serving test and `bench.tools.compare`
all decide a case's verdict here, so a saved run is judged as the gate judged it live.

What stays with each caller is how it reports: the fixture and the serving test fail
their pytest test with the verdict's failures, the compare tool writes a summary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import replace
from typing import Any

from bench.gate.budgets import Budget
from bench.gate.budgets import Failure
from bench.gate.budgets import InferenceBudget
from bench.gate.budgets import check_budget
from bench.gate.budgets import check_drop_growth
from bench.gate.budgets import check_inference
from bench.gate.compare import check_against
from bench.gate.compare import explain
from bench.gate.timing import EPOCH_TIME
from bench.gate.timing import LATENCY
from bench.gate.timing import Timed
from bench.gate.timing import Noise
from bench.gate.timing import estimate_noise
from bench.gate.timing import check_latency
from bench.gate.timing import time_limit
from bench.gate.verdict import Verdict
from bench.gate.verdict import decide


@dataclass(frozen=True)
class Judgement:
    """The verdict on one record, with what the callers show beside it."""

    verdict: Verdict
    noise: Noise | None  # the case's run-to-run noise; None when nothing was compared
    floors_skipped: str | None  # why the accuracy and F1 floors did not judge the record
    time_gate: dict[str, Any] | None  # how a training case's time was judged; None when not compared


def judge(
    record: dict[str, Any],
    budget: Budget | InferenceBudget,
    *,
    then: dict[str, Any] | None,
    history: Sequence[dict[str, Any]] = (),
    baseline: str | None = None,
    gating: bool = False,
    reason: str = "",
    profile: str,
    epochs: int | None,
    budgets_too: bool = True,
    timed: Timed = EPOCH_TIME,
    time_note: str | None = None,
    ceilings: Sequence[Failure] = (),
) -> Judgement:
    """Judge `record` (a training case's extra_info under a `Budget`, a serving record's
    under an `InferenceBudget`) by its floors and ceilings (unless not `budgets_too`) and,
    where `then` (the baseline's record of the case) is given, against it: time or latency
    by the run-to-run noise of `history` (stored records of the case; the baseline's alone
    when empty), accuracy and growth limits. Only a `gating` baseline's failures count;
    `baseline` names it in the verdict and `reason` says why it did not gate or was not
    there. `profile` and `epochs` are the run's own: floors set for other epochs do not judge.
    `timed` says what a training budget's time rule reads (epochs, or a timed call's rounds);
    `time_note`, where given, says why time is not gated in this run (the rest still is);
    `ceilings`: limits the caller judged itself that broke (a case's own goal)."""
    serving = isinstance(budget, InferenceBudget)
    floors_skipped = None
    budget_failures: list[Failure] = list(ceilings)
    if budgets_too and serving:
        budget_failures += check_inference(budget, record)
    elif budgets_too:
        checked = check_budget(budget, record, profile=profile, epochs=epochs)  # type: ignore[arg-type]
        budget_failures, floors_skipped = budget_failures + list(checked.failures), checked.floors_skipped
    baseline_failures: list[Failure] = []
    noise = None
    time_gate = None
    if then is not None:
        stored = list(history) or [then]
        if serving:
            noise = estimate_noise(stored, record, samples=LATENCY.rounds)
            if gating:
                if time_note is None:
                    baseline_failures = check_latency(budget, record, then, history=stored)  # type: ignore[arg-type]
                baseline_failures += check_drop_growth(budget, record, then)  # type: ignore[arg-type]
        else:
            noise = estimate_noise(stored, record, samples=timed.rounds)
            timed_budget = budget if time_note is None else replace(budget, time_slower_pct=None, time_hard_ratio=None)
            time_gate = {
                "limit": time_limit(budget, noise)[0] if timed_budget.time_slower_pct is not None else None,  # type: ignore[union-attr]
                "spread": noise.spread,
                "runs": noise.runs,
                "source": noise.source,
                **({"not_gated": time_note} if time_note else {}),
            }
            if gating:
                found = check_against(timed_budget, record, then, history=stored, timed=timed)  # type: ignore[arg-type]
                baseline_failures = [explain(f, record, then) for f in found]
        if time_note:
            reason = f"{reason}; {time_note}" if reason else time_note
    verdict = decide(budget_failures, baseline_failures, baseline=baseline if then is not None else None,
                     gating=gating, reason=reason, noise=noise, floors_skipped=floors_skipped)
    return Judgement(verdict, noise, floors_skipped, time_gate)
