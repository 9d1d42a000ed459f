"""Shard assignment: every case once, and balanced by an earlier run's durations."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from bench.gate.shards import assign
from bench.gate.shards import durations_of
from bench.gate.shards import unit_of


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
    durations=st.dictionaries(st.text("abcdefgh", min_size=1, max_size=4), st.floats(0.01, 100), min_size=1,
                              max_size=40),
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
    ]}
    assert durations_of(run) == {"bench/t.py::test_a[x]": 12.5, "bench/t.py::test_b": 3.0}


class Case:
    def __init__(self, id: str) -> None:
        self.id = id


SERVING = "bench/test_inference.py::test_serving"


def serving(case: str, variant: str, impl: str) -> tuple[str, dict]:
    return f"{SERVING}[{case}-{variant}-{impl}]", {"case": Case(case), "variant": variant, "impl": impl}


def test_a_configuration_s_serving_cases_travel_together() -> None:
    """They serve one trained model: a shard holding them all trains it once."""
    cases = [serving(c, v, i) for c in ("blocks-2", "blocks-3", "units-128") for v in ("fp32", "bf16")
             for i in ("torch", "triton")]
    training = "bench/test_experiments.py::test_blocks[blocks-3]"
    units = {node: unit_of(node, params) for node, params in cases}
    units[training] = unit_of(training, {"case": Case("blocks-3")})
    assert units[training] == training  # a training case is its own unit
    assert units[cases[0][0]] == f"{SERVING}[blocks-2]"
    shards = assign([*units], 2, units=units)
    for shard in shards:
        configs = {units[n] for n in shard if n != training}
        for config in configs:  # every variant x impl of a configuration, in one shard
            assert sum(units[n] == config for n in shard) == 4
    assert sorted(n for shard in shards for n in shard) == sorted(units)


def test_with_durations_a_unit_costs_the_sum_of_its_cases() -> None:
    units = {"a1": "a", "a2": "a", "b": "b", "c": "c"}
    durations = {"a1": 3.0, "a2": 3.0, "b": 5.0, "c": 1.0}
    shards = assign(list(units), 2, durations, units)
    assert shards == [["a1", "a2"], ["b", "c"]]  # a (6 s) first, then b (5 s) and c beside it


@settings(max_examples=60, deadline=None)
@given(
    durations=st.dictionaries(st.text("abcdefgh", min_size=1, max_size=4), st.floats(0.01, 100), min_size=1,
                              max_size=40),
    count=st.integers(1, 6),
    timed=st.booleans(),
)
def test_a_unit_is_never_split(durations, count, timed) -> None:
    units = {n: n[0] for n in durations}  # by first letter: up to eight units
    shards = assign(list(durations), count, durations if timed else None, units)
    assert sorted(n for shard in shards for n in shard) == sorted(durations)
    assert all(len({k for k, shard in enumerate(shards) if any(units[n] == u for n in shard)}) == 1
               for u in set(units.values()))


def test_a_pytest_shard_of_the_serving_matrix_holds_whole_configurations() -> None:
    root = Path(__file__).resolve().parents[1]
    args = ["bench/test_inference.py", "--profile", "quick", "--tier", "nightly", "--shard", "2/4", "--collect-only",
            "-q", "-p", "no:cacheprovider"]
    out = subprocess.run([sys.executable, "-m", "pytest", *args], cwd=root, capture_output=True, text=True, timeout=300)
    ids = [line for line in out.stdout.splitlines() if "test_serving[" in line]
    configs = Counter("-".join(line.split("[", 1)[1].split("-")[:2]) for line in ids)  # 'units-128', 'act-leaky_relu'
    assert len(configs) == 6, out.stdout[-2000:] + out.stderr[-2000:]  # 22 configurations dealt to 4 shards
    assert set(configs.values()) == {27}  # every variant x implementation of each
