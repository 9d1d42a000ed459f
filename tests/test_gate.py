"""The time gate's noise rule and the budgets' precedence, on planted records (no timing)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from scipy.stats import mannwhitneyu

from bench.gate.budgets import Budget
from bench.gate.budgets import Budgets
from bench.gate.timing import DEFAULT_UNKNOWN_NOISE_PCT
from bench.gate.timing import check_time
from bench.gate.timing import estimate_noise
from bench.gate.compare import gating
from bench.gate.compare import planted_note
from bench.gate.runs import load_history
from bench.gate.runs import machine_difference
from bench.gate.runs import same_measurement
from bench.gate.timing import time_limit

GATE = Budget(time_slower_pct=10, time_noise_k=3, time_noise_unknown_pct=25, time_alpha=0.01)


def timed(median: float, epochs: int = 20, rounds: int = 1, jitter: float = 0.002) -> dict:
    """The part of a case record the time gate reads: every round with this median epoch
    time (first epoch apart)."""
    def one_round(offset: int) -> list[float]:
        steady = [median * (1 + jitter * ((i + offset) % 5 - 2)) for i in range(epochs)]
        return [10 * median] + steady  # the first epoch: capture, compilation

    return {"epoch_seconds_by_round": [one_round(r) for r in range(rounds)], "throttled": False}


def history(*medians: float) -> list[dict]:
    return [timed(m) for m in medians]


def test_quiet_history_gives_a_small_known_spread() -> None:
    noise = estimate_noise(history(1.00, 1.01, 0.99, 1.005))
    assert noise.known and noise.runs == 4
    assert 0.005 < noise.spread < 0.01


def test_noisy_history_gives_a_large_spread() -> None:
    noise = estimate_noise(history(1.0, 1.12, 0.93, 1.23, 1.04))
    assert noise.known and 0.08 < noise.spread < 0.15


def test_single_run_leaves_the_noise_unknown() -> None:
    noise = estimate_noise(history(1.0), timed(1.0))
    assert not noise.known and noise.spread is None
    limit, rule = time_limit(GATE, noise)
    assert limit == pytest.approx(DEFAULT_UNKNOWN_NOISE_PCT / 100) and "noise unknown" in rule


def test_rounds_of_the_current_run_count_as_run_to_run_samples() -> None:
    # Each round trains a fresh model: three rounds alone make the spread known.
    current = {"epoch_seconds_by_round": [[5, 1.0, 1.0], [5, 1.02, 1.02], [5, 0.98, 0.98]]}
    noise = estimate_noise([], current)
    assert noise.known and noise.spread == pytest.approx(0.02, rel=0.05)


def test_a_faster_current_run_does_not_widen_the_history_spread() -> None:
    # Groups are pooled around their own means: the history's spread stays the history's.
    past = history(1.0, 1.0 * math.exp(0.01), 1.0 * math.exp(-0.01))
    alone = estimate_noise(past)
    with_current = estimate_noise(past, timed(0.5))
    assert with_current.spread == pytest.approx(alone.spread)


def test_slowdown_beyond_budget_and_quiet_noise_fails() -> None:
    quiet = history(1.00, 1.01, 0.99, 1.00)
    (failure,) = check_time(GATE, timed(1.15), quiet[-1], history=quiet)
    assert failure.metric == "epoch_time_ratio" and failure.value == pytest.approx(1.15, rel=1e-3)
    assert "run-to-run spread" in failure.detail and "Mann-Whitney" in failure.detail


def test_the_same_slowdown_inside_a_noisy_case_passes() -> None:
    noisy = history(1.0, 1.12, 0.93, 1.23, 1.04)
    assert check_time(GATE, timed(1.15 * 1.04), noisy[-1], history=noisy) == []
    # ... but one far beyond three spreads fails.
    assert check_time(GATE, timed(1.8 * 1.04), noisy[-1], history=noisy)


def test_without_history_a_conservative_bound_applies() -> None:
    base = timed(1.0)
    assert check_time(GATE, timed(1.15), base) == []  # +15%: inside the assumed 25%
    assert check_time(GATE, timed(1.40), base)  # +40%: beyond it


def test_a_small_budget_catches_a_small_slowdown_in_a_quiet_case() -> None:
    tight = Budget(time_slower_pct=3, time_noise_k=3, time_alpha=0.01)
    quiet = history(1.000, 1.002, 0.998, 1.001, 0.999)
    assert check_time(tight, timed(1.05), quiet[-1], history=quiet)
    assert check_time(tight, timed(1.02), quiet[-1], history=quiet) == []


def test_a_run_slow_throughout_within_noise_passes_even_when_every_epoch_is_slower() -> None:
    # What failed A/A runs before: a host-bound case slow throughout. Every epoch is
    # slower, so Mann-Whitney alone calls it overwhelmingly significant.
    noisy = history(1.0, 1.10, 0.92, 1.2, 1.05)
    assert check_time(GATE, timed(1.05 * 1.23), noisy[-1], history=noisy) == []


def test_throttled_runs_are_not_judged() -> None:
    slow = timed(2.0) | {"throttled": True}
    assert check_time(Budget(time_slower_pct=10), slow, timed(1.0)) == []


def test_a_p_value_between_half_alpha_and_alpha_fails_the_case() -> None:
    # Four steady epochs each, every one slower: the exact one-sided p is 1/70 = 0.014.
    now = {"epoch_seconds_by_round": [[10.0, 1.30, 1.31, 1.32, 1.33]], "throttled": False}
    then = {"epoch_seconds_by_round": [[10.0, 1.00, 1.01, 1.02, 1.03]], "throttled": False}
    alpha = 0.02
    p = mannwhitneyu([1.30, 1.31, 1.32, 1.33], [1.00, 1.01, 1.02, 1.03], alternative="greater").pvalue
    assert alpha / 2 < p < alpha
    budget = Budget(time_slower_pct=10, time_noise_k=3, time_noise_unknown_pct=20, time_alpha=alpha)
    (failure,) = check_time(budget, now, then)  # +30% against an assumed 20%: the test decides
    assert f"< {alpha:g}" in failure.detail
    assert check_time(replace(budget, time_alpha=alpha / 2), now, then) == []


def test_the_budgets_noise_k_sets_the_limit() -> None:
    # Run medians e^-0.05, 1, e^0.05: a run-to-run spread of exactly 5%.
    spread = history(math.exp(-0.05), 1.0, math.exp(0.05))
    base = spread[1]
    one, three = (Budget(time_slower_pct=2, time_noise_k=k, time_alpha=0.01) for k in (1, 3))
    assert time_limit(one, estimate_noise(spread))[0] == pytest.approx(0.05)
    assert time_limit(three, estimate_noise(spread))[0] == pytest.approx(0.15)
    # +10%: beyond one spread, inside three.
    assert check_time(one, timed(1.10), base, history=spread)
    assert check_time(three, timed(1.10), base, history=spread) == []


def test_a_bf16_run_is_not_history_of_an_fp32_baseline(tmp_path) -> None:
    import json

    def run(when: str, precision: str) -> dict:
        settings = {"profile": "quick", "epochs": 40, "dataset": "synthetic", "loop": "graph", "impl": "torch",
                    "optimizer_impl": "torch", "precision": precision, "plant": None}
        return {"datetime": when, "benchmarks": [{"fullname": "b::t", "extra_info": timed(1.0)}],
                "machine_info": {"loadbench": {"gpu": {"name": "H100"}, "settings": settings}}}

    fp32, bf16 = run("2026-01-01", "fp32"), run("2026-01-02", "bf16")
    settings = fp32["machine_info"]["loadbench"]["settings"]
    assert not same_measurement("H100", settings, "H100", bf16["machine_info"]["loadbench"]["settings"])
    (tmp_path / "fp32.json").write_text(json.dumps(fp32))
    (tmp_path / "bf16.json").write_text(json.dumps(bf16))
    baseline = run("2026-06-01", "fp32")
    (tmp_path / "base.json").write_text(json.dumps(baseline))
    found = load_history(tmp_path / "base.json", baseline, sorted(tmp_path.glob("*.json")))
    assert [r["datetime"] for r in found] == ["2026-01-01", "2026-06-01"]


def test_history_keeps_only_runs_comparable_to_the_baseline(tmp_path) -> None:
    import json

    def run(when: str, gpu: str = "H100", epochs: int = 40, plant: str | None = None) -> dict:
        settings = {"profile": "quick", "epochs": epochs, "dataset": "synthetic", "loop": "graph",
                    "impl": "torch", "precision": "fp32", "plant": plant}
        return {"datetime": when, "benchmarks": [{"fullname": "b::t", "extra_info": timed(1.0)}],
                "machine_info": {"loadbench": {"gpu": {"name": gpu}, "settings": settings}}}

    files = {
        "old.json": run("2026-01-01"), "other_gpu.json": run("2026-01-02", gpu="H200"),
        "other_epochs.json": run("2026-01-03", epochs=8), "planted.json": run("2026-01-04", plant="5%:host"),
        "newer.json": run("2027-01-01"), "mid.json": run("2026-01-05"),
    }
    for name, content in files.items():
        (tmp_path / name).write_text(json.dumps(content))
    (tmp_path / "corrupt.json").write_text("{")
    baseline = run("2026-06-01")
    (tmp_path / "base.json").write_text(json.dumps(baseline))
    found = load_history(tmp_path / "base.json", baseline, sorted(tmp_path.glob("*.json")))
    assert [r["datetime"] for r in found] == ["2026-01-01", "2026-01-05", "2026-06-01"]


def test_history_reads_only_as_many_stored_runs_as_it_keeps(tmp_path, monkeypatch) -> None:
    import json
    import os

    import bench.gate.runs as compare

    settings = {"profile": "quick", "epochs": 40, "dataset": "synthetic", "loop": "graph", "impl": "torch",
                "optimizer_impl": "torch", "precision": "fp32", "plant": None}
    def run(day: int) -> dict:
        return {"datetime": f"2026-01-{day:02d}", "benchmarks": [{"fullname": "b::t", "extra_info": timed(1.0)}],
                "machine_info": {"loadbench": {"gpu": {"name": "H100"}, "settings": settings}}}

    for day in range(1, 31):
        path = tmp_path / f"{day:04d}_run.json"
        path.write_text(json.dumps(run(day)))
        os.utime(path, (day * 1000, day * 1000))  # modified in the order they ran
    reads = []
    real = compare.read_run
    monkeypatch.setattr(compare, "read_run", lambda path: reads.append(path) or real(path))
    baseline = run(30)
    found = load_history(tmp_path / "0030_run.json", baseline, sorted(tmp_path.glob("*.json")))
    assert [r["datetime"] for r in found] == [f"2026-01-{day:02d}" for day in range(21, 31)]
    assert len(reads) == 9  # the nine newest before the baseline, not all 29


# ----------------------------------------------------------------- budget precedence

LEVELS = [
    ("[defaults]", 1),
    ("[experiments.units]", 2),
    ('[cases."units-128"]', 3),
    ("[profiles.quick.defaults]", 4),
    ("[profiles.quick.experiments.units]", 5),
    ('[profiles.quick.cases."units-128"]', 6),
    ("[datasets.synthetic.defaults]", 7),
    ("[datasets.synthetic.experiments.units]", 8),
    ('[datasets.synthetic.cases."units-128"]', 9),
    ("[datasets.synthetic.profiles.quick.defaults]", 10),
    ("[datasets.synthetic.profiles.quick.experiments.units]", 11),
    ('[datasets.synthetic.profiles.quick.cases."units-128"]', 12),
]


@pytest.mark.parametrize("present", [len(LEVELS), 9, 6, 4, 3, 1])
def test_the_most_specific_level_wins(tmp_path, present) -> None:
    """One key at the first `present` levels: the last of them decides."""
    text = "".join(f"{header}\ntime_slower_pct = {value}\n" for header, value in LEVELS[:present])
    path = tmp_path / "b.toml"
    path.write_text(text)
    budgets = Budgets.load(path)
    assert budgets.resolve("quick", "units", "units-128", "synthetic").time_slower_pct == present
    # Another case, experiment, profile or dataset skips the levels that name this one.
    assert budgets.resolve("smoke", "blocks", "blocks-2", "mine.csv").time_slower_pct == 1


def test_floors_apply_only_to_the_dataset_they_were_set_for(tmp_path) -> None:
    path = tmp_path / "b.toml"
    path.write_text('[datasets.synthetic.defaults]\naccuracy_min = 0.6\n'
                    '[datasets."digits.csv".defaults]\naccuracy_min = 0.9\n')
    budgets = Budgets.load(path)
    assert budgets.resolve("quick", "act", "act-sigmoid", "synthetic").accuracy_min == 0.6
    assert budgets.resolve("quick", "act", "act-sigmoid", "data/digits.csv").accuracy_min == 0.9
    assert budgets.resolve("quick", "act", "act-sigmoid", "other.csv").accuracy_min is None
    assert budgets.covers("data/digits.csv") and not budgets.covers("other.csv")


def test_a_machine_info_difference_is_one_short_line_that_names_the_settings_first() -> None:
    base = {"node": "runner-1", "cpu": {"brand_raw": "EPYC", "flags": ["avx"] * 400},
            "loadbench": {"gpu": {"name": "H100"}, "settings": {"profile": "smoke", "epochs": 8, "loop": "fast"}}}
    ours = {"node": "runner-2", "cpu": {"brand_raw": "EPYC", "flags": ["avx"] * 400},
            "loadbench": {"gpu": {"name": "H100"}, "settings": {"profile": "smoke", "epochs": 2, "loop": "fast"}}}
    assert machine_difference(base, base) is None
    assert machine_difference(ours, base) == (
        "baseline machine_info differs (this run vs baseline): settings epochs 2 vs 8; node"
    )
    ours["loadbench"]["gpu"]["name"] = "H200"
    ours["cpu"] = {f"key_{i:02d}_{'x' * 30}": i for i in range(40)}
    ours["loadbench"]["settings"].update(dataset="/a/very/long/path/to/the/frames.csv", plant="5%:gpu")
    line = machine_difference(ours, base)
    assert line is not None and len(line) <= 160
    assert line == ("baseline machine_info differs (this run vs baseline): settings epochs 2 vs 8, "
                    "dataset /a/very/long/path... vs unset and 1 more; loadbench.gpu.name and 43 more")
    del ours["cpu"]
    assert machine_difference(ours, base) == (
        "baseline machine_info differs (this run vs baseline): settings epochs 2 vs 8, dataset /a/very/long/path... "
        "vs unset and 1 more; loadbench.gpu.name and 3 more"
    )
    del ours["loadbench"]["settings"]["dataset"]
    assert machine_difference(ours, base) == ("baseline machine_info differs (this run vs baseline): settings "
                                              "epochs 2 vs 8, plant 5%:gpu vs unset; loadbench.gpu.name, "
                                              "cpu.brand_raw, cpu.flags, node")


# ------------------------------------------------------------------------ the time rule's limits


def test_a_hard_ratio_alone_fails_a_case_past_it(tmp_path) -> None:
    """time_hard_ratio with no time_slower_pct: the median ratio alone decides, past it a
    failure even with a known noise, few epochs or throttled clocks; inside it nothing."""
    (tmp_path / "budgets.toml").write_text("[defaults]\ntime_hard_ratio = 1.5\n")
    hard = Budgets.load(tmp_path / "budgets.toml").resolve("quick", "units", "units-128")
    assert hard.time_slower_pct is None and hard.time_hard_ratio == 1.5
    quiet = history(1.00, 1.01, 0.99, 1.00)
    (failure,) = check_time(hard, timed(1.6), quiet[-1], history=quiet)
    assert (failure.metric, failure.limit, failure.detail) == ("epoch_time_ratio", 1.5,
                                                               "hard ceiling on the median ratio")
    assert failure.value == pytest.approx(1.6, rel=1e-3)
    assert check_time(hard, timed(1.6, epochs=2) | {"throttled": True}, timed(1.0, epochs=2))  # no test needed
    assert check_time(hard, timed(1.45), quiet[-1], history=quiet) == []  # +45%: the rule sets no other limit
    from bench.gate.judge import judge

    verdict = judge(timed(1.6), hard, then=quiet[-1], history=quiet, baseline="0004.json", gating=True,
                    profile="quick", epochs=None).verdict
    assert verdict.status == "regressed" and [f.metric for f in verdict.failures] == ["epoch_time_ratio"]


def serving_record(p99_us: float, *, spread: float = 0.002) -> dict:
    """A serving record whose five rounds' p99 scatter `spread` around `p99_us`."""
    rounds = [p99_us * 1e-6 * (1 + spread * (i - 2)) for i in range(5)]
    return {"latency_p99_s": p99_us * 1e-6, "latency_p99_by_round_s": rounds, "latency_mode": "graph",
            "throttled": False}


def test_the_serving_latency_rules_noise_factor_changes_the_verdict() -> None:
    """Stored p99s e^-0.05, 1, e^0.05 apart (five equal rounds each) pooled with this run's
    rounds: a spread between 3.3% and 6.7%, so +20% is past three spreads, inside six."""
    from bench.gate.budgets import InferenceBudget
    from bench.gate.timing import check_latency
    from bench.gate.timing import latency_rounds

    stored = [serving_record(30 * math.exp(d), spread=0.0) for d in (-0.05, 0.0, 0.05)]
    slower = serving_record(36)
    noise = estimate_noise(stored, slower, samples=latency_rounds)
    assert noise.known and 0.2 / 6 < noise.spread < 0.2 / 3
    three, six = (InferenceBudget(latency_slower_pct=5, latency_noise_k=k, latency_alpha=0.01) for k in (3, 6))
    (failure,) = check_latency(three, slower, stored[1], history=stored)
    assert failure.metric == "latency_p99_ratio" and "3 x run-to-run spread" in failure.detail
    assert check_latency(six, slower, stored[1], history=stored) == []


def test_the_serving_latency_rules_unknown_noise_stand_in_changes_the_verdict() -> None:
    """A baseline of one round and a run of two: two p99s against one cannot tell the
    spread, so latency_noise_unknown_pct stands in (the default 25% where unset)."""
    from bench.gate.budgets import InferenceBudget
    from bench.gate.timing import Noise
    from bench.gate.timing import check_latency

    def rounds(*p99_us: float) -> dict:
        return serving_record(p99_us[0]) | {"latency_p99_by_round_s": [p * 1e-6 for p in p99_us]}

    base, slower = rounds(30.0), rounds(36.0, 36.1)  # +20%; Mann-Whitney's p is 1/3 at best
    tight, loose, default = (InferenceBudget(latency_slower_pct=5, latency_noise_unknown_pct=pct, latency_alpha=0.5)
                             for pct in (10, 30, None))
    unknown = Noise(None, 1, "1 stored run(s)")
    assert [time_limit(b, unknown)[0] for b in (tight, loose, default)] == pytest.approx([0.10, 0.30, 0.25])
    (failure,) = check_latency(tight, slower, base)
    assert "noise unknown" in failure.detail and "assumed 10%" in failure.detail
    assert check_latency(loose, slower, base) == []
    assert check_latency(default, slower, base) == []
    assert check_latency(default, rounds(39.0, 39.1), base)  # +30%: past the default 25%


def test_a_baseline_gates_only_a_run_that_measured_alike_or_a_planted_one() -> None:
    base = {"profile": "quick", "epochs": 8, "plant": None}
    assert gating("H100", base, "H100", base).gates
    other = gating("H200", base | {"epochs": 40}, "H100", base)
    assert other.differs == ("gpu", "epochs") and not other.gates
    assert other.reason == ("baseline ran on H100, this run on H200; baseline ran epochs=8, this run epochs=40: "
                            "shown, not gated")
    planted = gating("H100", base | {"plant": "30%:host"}, "H100", base)
    assert planted.gates and planted.reason == "" and planted.planted == "30%:host"
    assert planted_note(planted) == ("planted slowdown 30%:host: judged against the unplanted baseline, "
                                     "to show what the gate catches")
    assert planted_note(gating("H100", base, "H100", base)) == ""
    baseline_planted = gating("H100", base, "H100", base | {"plant": "30%:host"}, run="NEW", baseline="OLD")
    assert baseline_planted.differs == ("plant",)
    assert baseline_planted.reason == "OLD ran plant='30%:host', NEW plant=None: shown, not gated"
