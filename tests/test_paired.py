"""The paired rule (bench/gate/paired.py) and a verdict after pairing (bench/gate/verdict.py)."""

from __future__ import annotations

import pytest

from bench.gate.budgets import Failure
from bench.gate.paired import Paired
from bench.gate.paired import first_limit
from bench.gate.paired import pair_ratios
from bench.gate.paired import time_only
from bench.gate.verdict import OK
from bench.gate.verdict import REGRESSED
from bench.gate.verdict import Verdict
from bench.gate.verdict import after_pairing
from bench.tools.confirm import without_plant

SLOW = Failure("epoch_time_ratio", 1.02, 1.0159, 1.0, "median epoch 0.0306 s vs 0.03 s")


@pytest.mark.parametrize(("ratios", "confirmed"), [
    ((1.05, 1.06, 1.04), True),  # slower in every pair, past the limit
    ((1.05, 0.99, 1.06), False),  # one pair the other way: the machine, not the code
    ((1.01, 1.01, 1.012), False),  # slower every time, but within the limit
    ((), False),  # nothing measured confirms nothing
])
def test_a_slowdown_is_confirmed_only_when_every_pair_is_slower_and_the_median_passes_the_limit(
    ratios: tuple[float, ...], confirmed: bool
) -> None:
    assert Paired(ratios, 0.03, "abcdef123456").confirmed is confirmed


def test_a_cleared_case_is_ok_and_says_what_the_first_run_saw() -> None:
    verdict = Verdict(REGRESSED, (SLOW,), baseline="2026-11-01T00:00:00", noise={"known": True})
    cleared = after_pairing(verdict, Paired((1.001, 0.998, 1.003), 0.0159, "abcdef123456"))
    assert cleared.status == OK and cleared.passed and not cleared.failures
    assert cleared.reason.startswith("first run: epoch_time_ratio = 1.02 breaks its limit 1.0159")
    assert "not confirmed by 3 paired run(s) beside main's commit abcdef12" in cleared.reason
    assert cleared.paired == {"ratios": [1.001, 0.998, 1.003], "limit": 0.0159, "commit": "abcdef123456",
                              "median": 1.001, "confirmed": False}
    assert Verdict.from_dict(cleared.as_dict()) == cleared  # stored and read back alike


def test_a_confirmed_case_keeps_its_failure_with_the_pairs_figures() -> None:
    verdict = Verdict(REGRESSED, (SLOW,), baseline="2026-11-01T00:00:00")
    confirmed = after_pairing(verdict, Paired((1.05, 1.06), 0.0159, "abcdef123456"))
    assert confirmed.status == REGRESSED and not confirmed.passed
    assert confirmed.failures[0].value == SLOW.value
    assert "confirmed by 2 paired run(s)" in confirmed.failures[0].message
    assert "median +5.50% against the limit 1.59%" in confirmed.failures[0].message


def test_only_time_failures_are_paired_and_the_tightest_limit_rules() -> None:
    time_failure = {"metric": "epoch_time_ratio", "limit": 1.03}
    call_failure = {"metric": "call_time_ratio", "limit": 1.10}
    assert time_only([time_failure, call_failure])
    assert not time_only([time_failure, {"metric": "accuracy_drop", "limit": 0.03}])
    assert not time_only([])
    assert first_limit([time_failure, call_failure]) == pytest.approx(0.03)


def test_pairs_with_a_missing_side_are_left_out() -> None:
    assert pair_ratios([0.1, None, 0.2], [0.11, 0.3, None]) == pytest.approx((1.1,))


def test_mains_side_runs_without_the_changes_planted_slowdown() -> None:
    assert without_plant(["--profile", "quick", "--plant-slowdown", "5:gpu", "-q"]) == ["--profile", "quick", "-q"]
    assert without_plant(["--plant-slowdown=10:gpu", "-k", "units"]) == ["-k", "units"]
