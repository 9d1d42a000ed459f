"""The verdict of one case: what the gate decided, as one record every reader shares.

The fixture and the serving test store it in ``extra_info["verdict"]``; the CI command
writes the job summary from it and `bench.tools.compare` gives the same record for two
saved runs, so a summary never judges anew what the gate already decided.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import replace
from typing import Any

from bench.gate.budgets import Failure

OK = "ok"
REGRESSED = "regressed"  # a limit against the baseline broke
OVER_BUDGET = "over budget"  # a floor or ceiling of budgets.toml broke, nothing against the baseline
NOT_GATED = "not gated"  # a baseline was there but measured something else (GPU model, settings)
NOT_COMPARED = "not compared"  # no stored record of the case to compare with: budgets alone held
STATUSES = (OK, REGRESSED, OVER_BUDGET, NOT_GATED, NOT_COMPARED)


@dataclass(frozen=True)
class Verdict:
    """What the gate decided for one case, with the rule and numbers behind it."""

    status: str
    failures: tuple[Failure, ...] = ()
    baseline: str | None = None  # the run it was judged against; None: nothing to compare with
    reason: str = ""  # why a baseline did not gate, or why nothing was compared
    noise: dict[str, Any] | None = None  # how the time rule knew the case's spread (None: not compared)
    paired: dict[str, Any] | None = None  # the paired runs that re-judged a time regression (bench.gate.paired)

    @property
    def passed(self) -> bool:
        return self.status in (OK, NOT_GATED, NOT_COMPARED)

    def as_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "failures": [failure_dict(f) for f in self.failures],
            "baseline": self.baseline,
            "reason": self.reason,
            "noise": self.noise,
            **({"paired": self.paired} if self.paired is not None else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Verdict:
        """A stored verdict; ValueError names what is missing or unknown."""
        status = data.get("status")
        if status not in STATUSES:
            raise ValueError(f"verdict status {status!r} is not one of {', '.join(STATUSES)}")
        failures = tuple(
            Failure(f["metric"], f["value"], f["limit"], f.get("baseline"), f.get("detail", ""))
            for f in data.get("failures") or []
        )
        return cls(status, failures, data.get("baseline"), str(data.get("reason") or ""), data.get("noise"),
                   data.get("paired"))

    def line(self) -> str:
        """One cell of a summary: the status, then the broken rules or the reason."""
        if self.failures:
            return f"{self.status}: " + "; ".join(f.message for f in self.failures)
        if self.reason:
            return f"{self.status} ({self.reason})"
        return self.status


def failure_dict(failure: Failure) -> dict[str, Any]:
    return {
        "metric": failure.metric,
        "value": failure.value,
        "limit": failure.limit,
        "baseline": failure.baseline,
        "detail": failure.detail,
        "message": failure.message,
    }


def decide(
    budget_failures: Sequence[Failure],
    baseline_failures: Sequence[Failure],
    *,
    baseline: str | None,
    gating: bool,
    reason: str = "",
    noise: Any = None,
    floors_skipped: str | None = None,
) -> Verdict:
    """The verdict from what broke: against the baseline first, then floors and ceilings.

    `noise` is a compare.Noise (or None when nothing was compared); a baseline that did
    not gate gives NOT_GATED with its `reason` unless a budget broke all the same.
    `floors_skipped`: why the accuracy and F1 floors were not judged, added to the reason."""
    noise_dict = None
    if noise is not None:
        noise_dict = {"known": noise.known, "spread": noise.spread, "runs": noise.runs, "source": noise.source}
    failures = (*baseline_failures, *budget_failures)
    if baseline_failures:
        status = REGRESSED
    elif budget_failures:
        status = OVER_BUDGET
    elif baseline is not None and not gating:
        status = NOT_GATED
    elif baseline is None:
        status = NOT_COMPARED
    else:
        status = OK
    if baseline is None and not reason:
        reason = "no baseline: budgets only"
    if floors_skipped:
        note = f"accuracy and F1 floors not judged: {floors_skipped}"
        reason = f"{reason}; {note}" if reason else note
    return Verdict(status, failures, baseline, reason, noise_dict)


def after_pairing(verdict: Verdict, paired: Any) -> Verdict:
    """The verdict once paired runs (a bench.gate.paired.Paired) re-judged its time
    failures: confirmed, it stands with the pairs' figures; not confirmed, the case is ok
    and its reason keeps what the first run saw."""
    if paired.confirmed:
        failures = tuple(replace(f, detail=f"{f.detail}; {paired.line()}" if f.detail else paired.line())
                         for f in verdict.failures)
        return replace(verdict, failures=failures, paired=paired.as_dict())
    seen = "; ".join(f.message for f in verdict.failures)
    return replace(verdict, status=OK, failures=(), reason=f"first run: {seen}; {paired.line()}",
                   paired=paired.as_dict())
