"""Shard assignment: every case once, and balanced by an earlier run's durations."""

from __future__ import annotations

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from bench.tools.shards import assign
from bench.tools.shards import durations_of


def test_without_durations_shards_take_turns_over_sorted_ids() -> None:
    assert assign(["c", "a", "d", "b", "e"], 2) == [["a", "c", "e"], ["b", "d"]]


def test_durations_keep_the_slow_cases_apart() -> None:
    durations = {"a": 8.0, "b": 1.0, "c": 8.0, "d": 1.0}
    assert [sorted(s) for s in assign(list(durations), 2)] == [["a", "c"], ["b", "d"]]  # 16 s vs 2 s
    balanced = assign(list(durations), 2, durations)
    assert sorted(sum(durations[n] for n in shard) for shard in balanced) == [9.0, 9.0]


def test_a_case_the_run_does_not_know_counts_as_the_median_case() -> None:
    shards = assign(["new", "a", "b", "c"], 2, {"a": 5.0, "b": 1.0, "c": 2.0})
    assert shards == [["a"], ["c", "new", "b"]]  # new costs 2 s: 5 against 2 + 2 + 1


@settings(max_examples=60, deadline=None)
@given(
    durations=st.dictionaries(st.text("abcdefgh", min_size=1, max_size=4), st.floats(0.01, 100), min_size=1, max_size=40),
    count=st.integers(1, 6),
)
def test_every_case_lands_in_exactly_one_shard_and_no_shard_is_far_over(durations, count) -> None:
    shards = assign(list(durations), count, durations)
    assert sorted(n for shard in shards for n in shard) == sorted(durations)
    # Greedy list scheduling's bound: the fullest shard took its last case while it was
    # the emptiest, so it ends at most one case above the mean.
    loads = [sum(durations[n] for n in shard) for shard in shards]
    assert max(loads) <= sum(loads) / count + max(durations.values()) + 1e-9


def test_durations_come_from_the_summed_rounds_of_a_run() -> None:
    run = {"benchmarks": [
        {"fullname": "bench/t.py::test_a[x]", "stats": {"total": 12.5, "mean": 6.25, "rounds": 2}},
        {"fullname": "bench/t.py::test_b", "stats": {"mean": 3.0, "rounds": 1}},
        {"fullname": "bench/t.py::test_c", "stats": {}},
    ]}  # fmt: skip
    assert durations_of(run) == {"bench/t.py::test_a[x]": 12.5, "bench/t.py::test_b": 3.0}
