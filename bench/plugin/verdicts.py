"""The gate inside a test: judge one record against the case's baseline and budgets, store
the verdict in extra_info, and fail the test on a broken limit.

Training cases (the fixture), serving cases (bench/plugin/serving.py) and the timed calls
(kernel cells, batch-1 forward, monitor overhead) all go through `gate`, so every case
of a run holds a verdict reached the same way; bench/gate/judge.py decides it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import pytest

from bench.gate.budgets import Budget
from bench.gate.budgets import Failure
from bench.gate.budgets import InferenceBudget
from bench.gate.judge import Judgement
from bench.gate.judge import judge
from bench.gate.runs import case_history
from bench.gate.timing import CALL_SECONDS
from bench.gate.timing import CALL_TIME
from bench.gate.timing import MEDIAN_CALL
from bench.gate.timing import TIMED_CALL
from bench.gate.timing import EPOCH_TIME
from bench.gate.timing import Timed


def judge_in_test(
    session: Any, benchmark: Any, record: dict[str, Any], budget: Budget | InferenceBudget, *,
    timed: Timed = EPOCH_TIME, budgets_too: bool = True, ceilings: Sequence[Failure] = (),
) -> tuple[Judgement, dict[str, Any] | None]:
    """The verdict on `record` (already in `benchmark.extra_info`) against the newest stored
    record of this test (`session.baseline_for`) and `budget`, written into the record and
    extra_info with how its time was judged; and that stored record (None: none)."""
    options = session.options
    found = session.baseline_for(benchmark.fullname)
    baseline, then = (found[0], found[1].get("extra_info", {})) if found is not None else (None, None)
    judged = judge(
        record, budget, then=then,
        history=case_history(baseline.history, benchmark.fullname) if baseline is not None else (),
        baseline=str(baseline.path) if baseline is not None else None,
        gating=baseline.gating if baseline is not None else False,
        reason=baseline.reason if baseline is not None else session.no_baseline_reason,
        # --epochs: the run's own count, not a case's override (a case that trains fewer on a CPU has floors for that)
        profile=options.profile.name, epochs=options.epochs,
        budgets_too=budgets_too, timed=timed, time_note=options.time_note, ceilings=ceilings,
    )
    if judged.time_gate is not None:  # how the case's time was judged, for the record and the report
        record["time_gate"] = judged.time_gate
        benchmark.extra_info["time_gate"] = judged.time_gate
    record["verdict"] = judged.verdict.as_dict()
    benchmark.extra_info["verdict"] = record["verdict"]
    return judged, then


def fail_on(judged: Judgement, label: str) -> None:
    """Fail the running test with one line per broken limit; nothing when all held."""
    failures = judged.verdict.failures
    if failures:
        lines = "\n".join(f"  {f.message}" for f in failures)
        pytest.fail(f"{label}: {len(failures)} budget(s) broken\n{lines}", pytrace=False)


def budget_for(session: Any, case_id: str, *, experiment: str = "", variant: str = "") -> Budget | InferenceBudget:
    """The limits on a case at the session's profile and dataset: a serving `variant`'s,
    else those of the training case (or timed call) of `experiment`."""
    options = session.options
    if variant:
        return session.budgets.resolve_inference(options.profile.name, variant, case_id, options.dataset)
    return session.budgets.resolve(options.profile.name, experiment, case_id, options.dataset)


def gate(
    session: Any, benchmark: Any, record: dict[str, Any], budget: Budget | InferenceBudget, label: str, *,
    timed: Timed = EPOCH_TIME, budgets_too: bool = True, ceilings: Sequence[Failure] = (),
    before_failing: Callable[[Judgement, dict[str, Any] | None], None] | None = None,
) -> Judgement:
    """Judge `record` in the running test (`judge_in_test`) and fail it, as `label`, on a
    broken limit; `before_failing` sees the verdict and the stored record first."""
    judged, then = judge_in_test(session, benchmark, record, budget, timed=timed, budgets_too=budgets_too,
                                 ceilings=ceilings)
    if before_failing is not None:
        before_failing(judged, then)
    fail_on(judged, label)
    return judged


def judge_calls(session: Any, benchmark: Any, experiment: str, case_id: str, *,
                seconds: Sequence[float] | None = None, ceilings: Sequence[Failure] = ()) -> Judgement:
    """Gate a timed call (a kernel cell, a batch-1 forward: pytest-benchmark's rounds, or
    the given `seconds`) on time by the training cases' rule and the budget of
    `experiment` / `case_id` (its time_* keys; no floors apply), and fail the test on a
    broken limit."""
    calls = list(seconds) if seconds is not None else list(benchmark.stats.stats.data)
    record = {CALL_SECONDS: calls, MEDIAN_CALL: statistics.median(calls) if calls else None,
              TIMED_CALL: {"experiment": experiment, "case": case_id}}
    benchmark.extra_info.update(record)
    return gate(session, benchmark, record, budget_for(session, case_id, experiment=experiment), case_id,
                timed=CALL_TIME, budgets_too=False, ceilings=ceilings)
