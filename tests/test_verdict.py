"""The gate's verdict record, the serving budgets per variant and configuration, the
trade-off rule, and which metrics a cold-cache record is judged on."""

from __future__ import annotations

import pytest

from kernels.ground.cases import Case
from bench.gate.budgets import Budget
from bench.gate.budgets import BudgetError
from bench.gate.budgets import Budgets
from bench.gate.budgets import Failure
from bench.gate.budgets import check_budget
from bench.gate.budgets import check_drop_growth
from bench.gate.budgets import check_inference
from bench.gate.timing import Noise
from bench.gate.compare import check_growth
from bench.gate.profiles import DEFAULT_BUDGETS
from bench.gate.summary import floors_lines
from bench.gate.verdict import NOT_GATED
from bench.gate.verdict import OK
from bench.gate.verdict import NOT_COMPARED
from bench.gate.verdict import OVER_BUDGET
from bench.gate.verdict import REGRESSED
from bench.gate.verdict import Verdict
from bench.gate.verdict import decide

SLOW = Failure("epoch_time_ratio", 1.4, 1.1, 1.0, "median epoch 0.14 s vs 0.1 s")
FLOOR = Failure("accuracy", 0.5, 0.65, None, "below its floor")


@pytest.mark.parametrize(
    ("budget_failures", "baseline_failures", "baseline", "gating", "status"),
    [
        ([], [], None, False, NOT_COMPARED),
        ([], [], "0001_main.json", True, OK),
        ([], [], "0001_main.json", False, NOT_GATED),
        ([FLOOR], [], "0001_main.json", False, OVER_BUDGET),
        ([FLOOR], [], None, False, OVER_BUDGET),
        ([], [SLOW], "0001_main.json", True, REGRESSED),
        ([FLOOR], [SLOW], "0001_main.json", True, REGRESSED),
    ],
)
def test_the_verdict_names_what_broke_first(budget_failures, baseline_failures, baseline, gating, status) -> None:
    verdict = decide(budget_failures, baseline_failures, baseline=baseline, gating=gating, reason="r")
    assert verdict.status == status
    assert verdict.passed == (status in (OK, NOT_GATED, NOT_COMPARED))
    assert list(verdict.failures) == [*baseline_failures, *budget_failures]


def test_a_verdict_survives_the_run_file() -> None:
    noise = Noise(0.004, 3, "2 stored run(s) and 1 round(s) of this run")
    verdict = decide([], [SLOW], baseline="0003_main.json", gating=True, noise=noise)
    again = Verdict.from_dict(verdict.as_dict())
    assert again == verdict
    assert again.noise == {"known": True, "spread": 0.004, "runs": 3, "source": noise.source}
    assert again.line().startswith("regressed: epoch_time_ratio = 1.4 breaks its limit 1.1")
    with pytest.raises(ValueError, match="'passed' is not one of"):
        Verdict.from_dict({"status": "passed"})


def test_without_a_baseline_the_verdict_says_budgets_only() -> None:
    verdict = decide([], [], baseline=None, gating=False)
    assert verdict.status == NOT_COMPARED and verdict.reason == "no baseline: budgets only"
    assert verdict.line() == "not compared (no baseline: budgets only)"


def write(tmp_path, text: str) -> Budgets:
    path = tmp_path / "budgets.toml"
    path.write_text(text)
    return Budgets.load(path)


def test_one_variant_of_one_configuration_has_its_own_limits(tmp_path) -> None:
    budgets = write(tmp_path, """
[inference.defaults]
accuracy_drop_vs_fp32_max = 0.01
[inference.variants.fp8]
accuracy_drop_vs_fp32_max = 0.02
[datasets.synthetic.profiles.quick.inference.defaults]
latency_p99_us_max = 200
[datasets.synthetic.profiles.quick.inference.cases."blocks-3"]
throughput_4096_min = 1e6
[datasets.synthetic.profiles.quick.inference.cases."blocks-3".variants.fp32]
latency_p99_us_max = 60
""")
    fp32 = budgets.resolve_inference("quick", "fp32", "blocks-3")
    assert fp32.latency_p99_us_max == 60 and fp32.throughput_4096_min == 1e6
    assert budgets.resolve_inference("quick", "bf16", "blocks-3").latency_p99_us_max == 200
    assert budgets.resolve_inference("quick", "fp32", "blocks-2").latency_p99_us_max == 200
    assert budgets.resolve_inference("quick", "fp8", "blocks-3").accuracy_drop_vs_fp32_max == 0.02


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[inference.cases."blocks-3".variants.fp33]\naccuracy_drop_vs_fp32_max = 0.1\n',
         r"\[inference.cases.\"blocks-3\".variants.fp33\]: unknown variant 'fp33' \(did you mean 'fp32'\?\)"),
        ('[inference.cases."blocks-3".variants.fp32]\nlatency_p99_us_mx = 1\n', "unknown key 'latency_p99_us_mx'"),
        ("[inference.variants.prune-90]\ntrade_off = 1\n", "trade_off = 1 must be true or false"),
        ("[inference.variants.prune-90]\naccuracy_drop_growth_max = 2\n", "must be between 0 and 1"),
        ('[inference.cases."blocks-3".variants.fp32]\nlatency_p99_us_max = 60\n', "floor or ceiling"),
    ],
)
def test_a_mistyped_serving_budget_is_named(tmp_path, text, message) -> None:
    with pytest.raises(BudgetError, match=message):
        write(tmp_path, text)


def test_a_trade_off_variant_is_judged_against_its_own_baseline(tmp_path) -> None:
    budgets = write(tmp_path, """
[inference.defaults]
accuracy_drop_vs_fp32_max = 0.01
[inference.variants.prune-90]
trade_off = true
accuracy_drop_growth_max = 0.05
""")
    budget = budgets.resolve_inference("quick", "prune-90", "units-128")
    measured = {"accuracy_drop": 0.276, "accuracy": 0.45}
    assert check_inference(budget, measured) == []  # no fixed limit on a measured trade-off
    assert check_drop_growth(budget, measured, {"accuracy_drop": 0.25}) == []
    (grew,) = check_drop_growth(budget, measured, {"accuracy_drop": 0.20})
    assert grew.metric == "accuracy_drop_growth" and grew.value == pytest.approx(0.076) and grew.limit == 0.05
    fixed = budgets.resolve_inference("quick", "bf16", "units-128")
    assert check_drop_growth(fixed, measured, {"accuracy_drop": 0.0}) == []  # not a trade-off: the fixed limit judges
    assert [f.metric for f in check_inference(fixed, measured)] == ["accuracy_drop_vs_fp32"]


def test_the_default_budgets_hold_pruning_as_a_trade_off() -> None:
    budgets = Budgets.load(DEFAULT_BUDGETS)
    for variant in ("prune-50", "prune-75", "prune-90"):
        assert budgets.resolve_inference("quick", variant, "units-128").trade_off is True
    assert budgets.resolve_inference("quick", "bf16", "units-128").trade_off is None
    assert budgets.resolve_inference("quick", "fp32", "blocks-3").latency_p99_us_max == 60
    assert budgets.resolve_inference("quick", "fp32", "units-1024").latency_p99_us_max == 200


def grown(caches_now: str | None, caches_then: str | None) -> list[str]:
    now = {"vram_peak_mib": 202.0, "energy_per_epoch_j": 22.0, "rss_peak_mib": 1000.0}
    then = {"vram_peak_mib": 106.0, "energy_per_epoch_j": 12.0, "rss_peak_mib": 1000.0}
    for record, caches in ((now, caches_now), (then, caches_then)):
        if caches is not None:
            record["kernel_caches"] = caches
    return [f.metric for f in check_growth(Budget(memory_growth_pct=10, energy_growth_pct=15), now, then)]


def test_first_epoch_figures_are_judged_only_between_warm_caches() -> None:
    assert grown("warm", "warm") == ["vram_peak_mib", "energy_per_epoch_j"]
    assert grown(None, None) == ["vram_peak_mib", "energy_per_epoch_j"]  # older records: warm
    assert grown("empty", "warm") == []
    assert grown("warm", "cold (emptied for this session)") == []
    assert grown("empty", "empty") == []  # compilation time moves with the host's load
    ahead = "warm (compiled ahead in 16 processes, 47.7 s, from cold)"  # --compile-workers: warm first epochs
    assert grown(ahead, "warm") == grown("warm", ahead) == ["vram_peak_mib", "energy_per_epoch_j"]


SMOKE_FLOORS = Budget(accuracy_min=0.30, macro_f1_min=0.2, rss_peak_mib_max=1000.0)
WEAK = {"accuracy": 0.214, "macro_f1": 0.1, "rss_peak_mib": 1500.0}  # below both floors, above the ceiling
SKIPPED = "floors set for 8 epochs of the smoke profile; this run trained 2"


def test_floors_set_for_the_profiles_epochs_do_not_judge_a_run_of_other_epochs() -> None:
    checked = check_budget(SMOKE_FLOORS, WEAK, profile="smoke", epochs=2)
    assert checked.floors_skipped == SKIPPED
    assert [f.metric for f in checked.failures] == ["rss_peak_mib"]  # the ceiling judges any epoch count
    own = check_budget(SMOKE_FLOORS, WEAK, profile="smoke", epochs=8)
    assert own.floors_skipped is None
    assert [f.metric for f in own.failures] == ["accuracy", "macro_f1", "rss_peak_mib"]
    no_floors = Budget(rss_peak_mib_max=1.0)
    assert check_budget(no_floors, WEAK, profile="smoke", epochs=2).floors_skipped is None  # nothing skipped


def test_the_verdict_and_the_summary_say_why_floors_were_not_judged() -> None:
    verdict = decide([], [], baseline=None, gating=False, floors_skipped=SKIPPED)
    assert verdict.status == NOT_COMPARED
    assert verdict.reason == f"no baseline: budgets only; accuracy and F1 floors not judged: {SKIPPED}"
    entries = [{"case": Case.parse("units-256"), "floors_skipped": SKIPPED},
               {"case": Case.parse("units-128"), "floors_skipped": SKIPPED},
               {"case": Case.parse("loop-reference"), "floors_skipped": None}]
    assert floors_lines(entries) == ["", f"floors: accuracy and F1 floors not judged for 2 case(s): {SKIPPED}; "
                                         "load ceilings and limits against a baseline still judged"]
    assert floors_lines(entries[2:]) == []


def test_serving_tables_resolve_defaults_then_variants_then_cases_then_a_cases_variant(tmp_path) -> None:
    """Each level sets the keys of the levels before it again, so every key shows which won."""
    budgets = write(tmp_path, """
[inference.defaults]
latency_slower_pct = 1
latency_noise_k = 1
latency_noise_unknown_pct = 1
latency_alpha = 0.01
[inference.variants.bf16]
latency_slower_pct = 2
latency_noise_k = 2
latency_noise_unknown_pct = 2
[inference.cases."units-128"]
latency_slower_pct = 3
latency_noise_k = 3
[inference.cases."units-128".variants.bf16]
latency_slower_pct = 4
[profiles.thesis.inference.defaults]
latency_noise_unknown_pct = 9
""")

    def levels(variant: str, case: str, profile: str = "quick") -> tuple:
        b = budgets.resolve_inference(profile, variant, case)
        return b.latency_slower_pct, b.latency_noise_k, b.latency_noise_unknown_pct, b.latency_alpha

    assert levels("bf16", "units-128") == (4, 3, 2, 0.01)  # the case's variant, the case, the variant, defaults
    assert levels("fp32", "units-128") == (3, 3, 1, 0.01)  # no variant table: the case over the defaults
    assert levels("bf16", "units-256") == (2, 2, 2, 0.01)  # another case: units-128's tables stay its own
    assert levels("fp32", "units-256") == (1, 1, 1, 0.01)
    assert levels("bf16", "units-128", "thesis") == (4, 3, 9, 0.01)  # a later scope over every level before it


FLOORS = Budget(accuracy_min=0.9, macro_f1_min=0.9)
BELOW = {"accuracy": 0.5, "macro_f1": 0.4}


@pytest.mark.parametrize("epochs", [2, 7, 9, 400])
def test_floors_let_off_runs_of_fewer_and_of_more_epochs_than_the_profiles(epochs) -> None:
    checked = check_budget(FLOORS, BELOW, profile="smoke", epochs=epochs)
    assert checked.failures == ()
    assert checked.floors_skipped == f"floors set for 8 epochs of the smoke profile; this run trained {epochs}"


def test_floors_judge_a_run_of_the_profiles_own_epochs_and_of_unknown_epochs() -> None:
    for epochs in (8, None):
        checked = check_budget(FLOORS, BELOW, profile="smoke", epochs=epochs)
        assert [f.metric for f in checked.failures] == ["accuracy", "macro_f1"] and checked.floors_skipped is None


def test_a_case_the_baseline_does_not_hold_is_judged_by_budgets_only() -> None:
    """No record of the case in the baseline: nothing is compared, however slow the case
    next to the history given, and the verdict says budgets only."""
    from bench.gate.judge import judge

    slow = {"epoch_seconds_by_round": [[5.0] + [3.0] * 10], "accuracy": 0.1, "macro_f1": 0.1, "throttled": False}
    history = [{"epoch_seconds_by_round": [[1.0] + [1.0 + 0.01 * i for i in range(10)]], "accuracy": 0.9,
                "macro_f1": 0.9, "throttled": False}] * 3
    strict = Budget(time_slower_pct=1, time_hard_ratio=1.1, accuracy_drop_max=0.01, macro_f1_drop_max=0.01)
    judged = judge(slow, strict, then=None, history=history, baseline="0004_main.json", gating=True,
                   profile="smoke", epochs=8)
    assert judged.verdict.status == NOT_COMPARED and judged.verdict.failures == ()
    assert judged.verdict.baseline is None and judged.verdict.reason == "no baseline: budgets only"
    assert judged.noise is None and judged.time_gate is None and judged.verdict.noise is None
    floored = judge(slow, Budget(accuracy_min=0.5), then=None, history=history, baseline="0004_main.json",
                    gating=True, profile="smoke", epochs=8)
    assert floored.verdict.status == OVER_BUDGET and floored.verdict.baseline is None  # the budgets still judge


def test_a_verdicts_summary_line_names_the_broken_rules_not_only_its_reason() -> None:
    reason = "baseline ran epochs=8, this run epochs=4: shown, not gated"
    over = decide([FLOOR], [], baseline="0001_main.json", gating=False, reason=reason)
    assert over.status == OVER_BUDGET
    assert over.line() == f"over budget: {FLOOR.message}"
    both = decide([FLOOR], [SLOW], baseline="0001_main.json", gating=True, reason="a reason")
    assert both.line() == f"regressed: {SLOW.message}; {FLOOR.message}"
    assert "epoch_time_ratio = 1.4 breaks its limit 1.1" in both.line() and "accuracy = 0.5" in both.line()
    assert Verdict.from_dict(both.as_dict()).line() == both.line()  # as a stored run's reader prints it


def test_an_energy_counted_after_the_warm_up_is_judged_with_cold_caches_and_only_against_its_kind() -> None:
    steady = {"energy_epochs": "after the first", "kernel_caches": "empty"}
    now = {"energy_per_epoch_j": 22.0, **steady}
    then = {"energy_per_epoch_j": 12.0, **steady}
    budget = Budget(energy_growth_pct=15)
    assert [f.metric for f in check_growth(budget, now, then)] == ["energy_per_epoch_j"]  # caches do not matter
    assert check_growth(budget, now, {**then, "energy_epochs": "all", "kernel_caches": "warm"}) == []
    assert check_growth(budget, {**now, "energy_per_epoch_j": 13.0}, then) == []
