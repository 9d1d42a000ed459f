"""The paired rule: a time regression the first run found stands only if main's commit and
the change, measured alternately on the same machine, confirm it.

A run against stored history compares two machines, or one machine on two days: clocks,
memory placement and the host's load move a whole run by a percent or two, which no
within-run statistic sees. Measured beside each other in fresh processes, in the order
main, change, change, main, ... (asv's `continuous`, benchstat's A/B), that drift falls
out of each pair's ratio. A slowdown is confirmed when the change was slower in every pair
and the median pair ratio still exceeds the limit the first run broke.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# Time failures the paired rule re-judges; a broken budget or an accuracy drop is
# decided by the first run alone (no drift moves it).
TIME_METRICS = ("epoch_time_ratio", "call_time_ratio", "latency_p99_ratio")


@dataclass(frozen=True)
class Paired:
    """One case measured alternately at main's commit and the change."""

    ratios: tuple[float, ...]  # the change's figure over main's, one per pair
    limit: float  # the relative slowdown the first run's rule allowed (0.03 = 3%)
    commit: str  # main's commit, as measured

    @property
    def median(self) -> float:
        return statistics.median(self.ratios)

    @property
    def confirmed(self) -> bool:
        return bool(self.ratios) and all(r > 1 for r in self.ratios) and self.median > 1 + self.limit

    def line(self) -> str:
        shown = ", ".join(f"{r:.4f}" for r in self.ratios)
        verb = "confirmed" if self.confirmed else "not confirmed"
        return (f"{verb} by {len(self.ratios)} paired run(s) beside main's commit {self.commit[:8]}: "
                f"ratios {shown}, median {self.median - 1:+.2%} against the limit {self.limit:.2%}"
                + ("" if self.confirmed else "; slower in every pair and past the limit is needed"))

    def as_dict(self) -> dict[str, Any]:
        return {"ratios": list(self.ratios), "limit": self.limit, "commit": self.commit,
                "median": self.median, "confirmed": self.confirmed}


def time_only(failures: Sequence[dict[str, Any]]) -> bool:
    """Whether every broken limit of a stored verdict is a time rule's, so the paired runs decide it."""
    return bool(failures) and all(f.get("metric") in TIME_METRICS for f in failures)


def first_limit(failures: Sequence[dict[str, Any]]) -> float:
    """The relative slowdown the first run allowed: the tightest time limit that broke."""
    return min(float(f["limit"]) for f in failures if f.get("metric") in TIME_METRICS) - 1


def pair_ratios(main: Sequence[float | None], change: Sequence[float | None]) -> tuple[float, ...]:
    """The change's figure over main's in each pair where both were measured."""
    return tuple(c / m for m, c in zip(main, change) if m and c)
