"""`python -m bench.tools.compare`: two saved runs judged by the gate's rules, on synthetic
run files whose epoch times are planted (no timing, no GPU)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from types import SimpleNamespace

from bench.gate.budgets import Budgets
from bench.gate.compare import make_baseline
from bench.gate.kernel_table import KernelTable
from bench.gate.runs import load_history
from bench.gate.runs import read_run
from bench.gate.timing import time_note
from bench.gate.verdict import STATUSES
from bench.gate.verdict import Verdict
from bench.plugin.verdicts import judge_in_test
from bench.tools.compare import main
from tests import runs
from tests.runs import H100
from tests.runs import record
from tests.runs import write_run

GPU = H100
SETTINGS = {"profile": "smoke", "epochs": 8, "dataset": "synthetic", "device": "cuda", "loop": "graph",
            "impl": "torch", "optimizer_impl": "torch", "precision": "fp32", "plant": None, "latency_pin": False}
TRAINING = {"units-128": "test_hidden_units", "batch-64": "test_batch_size"}
BUDGETS = runs.BUDGETS + """\
time_noise_k = 3
time_noise_unknown_pct = 25
energy_growth_pct = 15

[inference.defaults]
latency_slower_pct = 10
latency_noise_k = 3
latency_noise_unknown_pct = 25
latency_alpha = 0.01

[inference.variants.prune-90]
trade_off = true
accuracy_drop_growth_max = 0.03
"""
# The JSON schema of the Bencher Metric Format (bencher.dev/docs/reference/bencher-metric-format).
BMF_SCHEMA = {
    "type": "object",
    "patternProperties": {".+": {
        "type": "object",
        "patternProperties": {".+": {
            "type": "object",
            "properties": {"value": {"type": "number"}, "lower_value": {"type": "number"},
                           "upper_value": {"type": "number"}},
            "required": ["value"],
            "additionalProperties": False,
        }},
    }},
}


def fullname(case: str) -> str:
    return runs.fullname(case, TRAINING[case])


def training(case: str, median: float, *, accuracy: float = 0.80, energy: float | None = 12.0) -> dict:
    """A training record whose steady epochs scatter 0.2% around `median` (first epoch apart)."""
    steady = [median * (1 + 0.002 * (i % 5 - 2)) for i in range(20)]
    return record(case, steady, first=10 * median, accuracy=accuracy, macro_f1=accuracy - 0.1,
                  energy_per_epoch_j=energy, throttled=False)


def serving(variant: str, p99: float, drop: float) -> dict:
    rounds = [p99 * (1 + 0.003 * (i - 2)) for i in range(5)]
    return {"kind": "inference", "case": "blocks-3", "experiment": "blocks", "variant": variant, "impl": "torch",
            "latency_p99_s": p99, "latency_p99_by_round_s": rounds, "latency_mode": "graph",
            "accuracy": 0.75 - drop, "macro_f1": 0.7 - drop, "accuracy_drop": drop, "throttled": False}


def serving_name(variant: str) -> str:
    return f"bench/test_inference.py::test_serving[blocks-3-{variant}-torch]"


def day_run(path: Path, day: int, records: dict[str, dict], *, gpu: str = GPU, commit: str = "", **settings) -> Path:
    """A run file holding `records` (fullname -> extra_info), saved on day `day` of March."""
    return write_run(path, records, gpu=gpu, commit=commit or f"{day:02d}" * 20, when=f"2026-03-{day:02d}T12:00:00",
                     settings=SETTINGS | settings)


def cases(slowdown: float = 1.0, drift: float = 1.0, **kwargs) -> dict[str, dict]:
    return {fullname(c): training(c, 0.1 * (2 if c == "batch-64" else 1) * slowdown * drift, **kwargs)
            for c in TRAINING}


@pytest.fixture
def budgets(tmp_path: Path) -> Path:
    path = tmp_path / "budgets.toml"
    path.write_text(BUDGETS)
    return path


@pytest.fixture
def stored(tmp_path: Path) -> Path:
    """Storage of one machine: three earlier runs a percent apart, then OLD (0004)."""
    folder = tmp_path / ".benchmarks" / "Linux-CPython-3.11-64bit"
    for day, drift in enumerate((1.01, 0.99, 1.005), start=1):
        day_run(folder / f"{day:04d}_run.json", day, cases(drift=drift))
    day_run(folder / "0004_old.json", 4, cases())
    return folder


def compare(capsys, *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def row(markdown: str, label: str) -> str:
    return next(line for line in markdown.splitlines() if line.startswith(f"| {label} "))


# ------------------------------------------------------------------------ judgement


def test_an_aa_pair_passes_and_names_both_runs(stored, tmp_path, budgets, capsys) -> None:
    new = day_run(tmp_path / "new.json", 5, cases(), commit="feedface" * 5)
    code, out, err = compare(capsys, stored / "0004_old.json", new, "--budgets", budgets)
    assert code == 0, out
    assert err == ""
    assert out.startswith(f"### mlp-loadbench compare: OLD `04040404` 2026-03-04 12:00 on {GPU} → "
                          f"NEW `feedface` 2026-03-05 12:00 on {GPU}")
    for case in TRAINING:
        assert row(out, case).rstrip(" |").endswith("ok")
    assert "0.1 → 0.1 s (+0.0%)" in row(out, "units-128")
    assert "noise unknown" not in out and "Regressions" not in out


def test_epochs_planted_30pct_slower_regress_with_the_rule_and_numbers(stored, tmp_path, budgets, capsys) -> None:
    new = day_run(tmp_path / "new.json", 5, cases(slowdown=1.3))
    code, out, _ = compare(capsys, stored / "0004_old.json", new, "--budgets", budgets)
    assert code == 1
    assert "**regressed**: median_epoch_s" in row(out, "units-128")
    assert "0.1 → 0.13 s (+30.0%)" in row(out, "units-128")
    regressions = out.split("#### Regressions", 1)[1]
    assert f"**units-128** (regressed, `{fullname('units-128')}`)" in regressions
    # The gate's own rule: the budget beat 3 x the spread of the four stored runs beside OLD.
    assert "epoch_time_ratio = 1.3 breaks its limit 1.1 (baseline 1)" in regressions
    assert "median epoch 0.13 s vs 0.1 s; limit from budget 10% (above 3 x run-to-run spread" in regressions
    assert "from 4 stored run(s)" in regressions and "Mann-Whitney U p=" in regressions
    assert "noise unknown" not in out


def test_without_history_the_conservative_bound_applies_and_is_said(stored, tmp_path, budgets, capsys) -> None:
    old = stored / "0004_old.json"
    mild = day_run(tmp_path / "mild.json", 5, cases(slowdown=1.15))
    assert compare(capsys, old, mild, "--budgets", budgets)[0] == 1  # +15% > 10%: the history knows the noise
    code, out, _ = compare(capsys, old, mild, "--budgets", budgets, "--no-history")
    assert code == 0  # +15% inside the assumed 25%
    assert "noise unknown for 2 case(s): a conservative bound applied" in out
    slow = day_run(tmp_path / "slow.json", 5, cases(slowdown=1.3))
    code, out, _ = compare(capsys, old, slow, "--budgets", budgets, "--no-history")
    assert code == 1 and "limit from noise unknown (1 stored run(s)" in out


def test_history_given_elsewhere_tells_the_noise(stored, tmp_path, budgets, capsys) -> None:
    lone = tmp_path / "lone"
    old = day_run(lone / "old.json", 4, cases())
    new = day_run(tmp_path / "new.json", 5, cases(slowdown=1.15))
    assert compare(capsys, old, new, "--budgets", budgets)[0] == 0  # nothing beside OLD: noise unknown
    files = [arg for day in (1, 2, 3) for arg in ("--history", stored / f"{day:04d}_run.json")]
    code, out, _ = compare(capsys, old, new, "--budgets", budgets, *files)
    assert code == 1 and "from 4 stored run(s)" in out  # OLD and the three given
    # A folder gives its run files in pytest-benchmark's layout: the four stored there, and OLD.
    code, out, _ = compare(capsys, old, new, "--budgets", budgets, "--history", stored.parent)
    assert code == 1 and "from 5 stored run(s)" in out


def test_a_planted_run_is_judged_against_an_unplanted_one_and_says_so(stored, tmp_path, budgets, capsys) -> None:
    """As the session judges it: a planted run exists to show what the gate catches."""
    new = day_run(tmp_path / "new.json", 5, cases(slowdown=2.5), plant="150%:host")
    code, out, _ = compare(capsys, stored / "0004_old.json", new, "--budgets", budgets)
    assert code == 1
    assert "**Planted**: NEW's planted slowdown 150%:host: judged against the unplanted OLD" in out
    assert "Not gated" not in out
    for case in TRAINING:
        assert "**regressed**: median_epoch_s" in row(out, case)


def test_a_planted_baseline_does_not_gate(stored, tmp_path, budgets, capsys) -> None:
    old = day_run(tmp_path / "old" / "old.json", 4, cases(), plant="150%:host")
    new = day_run(tmp_path / "new.json", 5, cases(slowdown=2.5))
    code, out, _ = compare(capsys, old, new, "--budgets", budgets)
    assert code == 0
    assert "**Not gated**: OLD ran plant='150%:host', NEW plant=None: shown, not gated." in out
    for case in TRAINING:
        assert row(out, case).rstrip(" |").endswith("not gated")


@pytest.mark.parametrize(("change", "reason"), [
    ({"epochs": 40}, "OLD ran epochs=8, NEW epochs=40"),
    ({"profile": "quick", "epochs": 40},
     "OLD ran profile='smoke', NEW profile='quick'; OLD ran epochs=8, NEW epochs=40"),
    ({"gpu": "NVIDIA H200"}, f"OLD ran on {GPU}, NEW on NVIDIA H200"),
    ({"gpu": "NVIDIA H200", "epochs": 40}, f"OLD ran on {GPU}, NEW on NVIDIA H200; OLD ran epochs=8, NEW epochs=40"),
])
def test_other_settings_or_gpu_are_not_gated(stored, tmp_path, budgets, capsys, change, reason) -> None:
    new = day_run(tmp_path / "new.json", 5, cases(slowdown=1.5), **change)
    code, out, _ = compare(capsys, stored / "0004_old.json", new, "--budgets", budgets, "--json")
    assert code == 0
    verdicts = [item["verdict"] for item in json.loads(out)]
    assert {v["status"] for v in verdicts} == {"not gated"}
    assert all(v["reason"] == f"{reason}: shown, not gated" for v in verdicts)


def session_verdicts(old: Path, new: Path, budgets: Path) -> dict[str, dict]:
    """NEW's verdicts as the session reaches them in its tests (bench.plugin.verdicts.judge_in_test),
    with OLD as --benchmark-compare's baseline and the runs beside it as its history."""
    old_run, new_run = read_run(old), read_run(new)
    settings = new_run["machine_info"]["loadbench"]["settings"]
    baseline = make_baseline(old, old_run, new_run["machine_info"], settings)
    baseline.history = load_history(old, old_run, sorted(old.parent.glob("*.json")))
    options = SimpleNamespace(profile=SimpleNamespace(name=settings["profile"]), epochs=settings["epochs"],
                              time_note=time_note(settings.get("time_gated", True), settings["device"]))
    session = SimpleNamespace(options=options, no_baseline_reason="no baseline",
                              baseline_for=lambda name: (baseline, baseline.benchmarks[name])
                              if name in baseline.benchmarks else None)
    rules = Budgets.load(budgets)
    out = {}
    for bench in new_run["benchmarks"]:
        info = dict(bench["extra_info"])
        if info.get("kind") == "inference":
            budget = rules.resolve_inference(settings["profile"], info["variant"], info["case"], settings["dataset"])
        else:
            budget = rules.resolve(settings["profile"], info["experiment"], info["case"], settings["dataset"])
        benchmark = SimpleNamespace(fullname=bench["fullname"], extra_info=dict(info))
        judged, _ = judge_in_test(session, benchmark, info, budget)
        out[bench["fullname"]] = judged.verdict.as_dict()
    return out


@pytest.mark.parametrize(("change", "status"), [
    ({}, "regressed"),  # the same settings: the slower epochs and calls regress
    ({"plant": "150%:host"}, "regressed"),  # a planted run against an unplanted baseline: judged
    ({"epochs": 40}, "not gated"),  # other settings
    ({"gpu": "NVIDIA H200"}, "not gated"),  # another card
    ({"device": "cpu", "time_gated": False}, "ok"),  # time not gated on a CPU, the rest judged
])
def test_compare_and_the_session_give_a_case_one_verdict(stored, tmp_path, budgets, capsys, change, status) -> None:
    records = cases(slowdown=1.3) | {serving_name("fp32"): serving("fp32", 30e-6, 0.0)}
    for day in (1, 2, 3, 4):  # the stored runs' serving record, so the history knows its noise
        path = stored / (f"{day:04d}_run.json" if day < 4 else "0004_old.json")
        run = json.loads(path.read_text())
        run["benchmarks"].append({"fullname": serving_name("fp32"), "name": "s", "group": None, "stats": {},
                                  "extra_info": serving("fp32", 20e-6 * (1 + 0.002 * day), 0.0)})
        path.write_text(json.dumps(run))
    new = day_run(tmp_path / "new.json", 5, records, **change)
    code, out, _ = compare(capsys, stored / "0004_old.json", new, "--budgets", budgets, "--budgets-too", "--json")
    tool = {item["fullname"]: item["verdict"] for item in json.loads(out)}
    for verdict in tool.values():  # the tool names the runs OLD and NEW, the session baseline and this run
        verdict["reason"] = verdict["reason"].replace("OLD ran", "baseline ran").replace(", NEW ", ", this run ")
    assert tool == session_verdicts(stored / "0004_old.json", new, budgets)
    assert {v["status"] for v in tool.values()} == {status}
    assert code == (1 if status == "regressed" else 0)


def test_a_traced_regression_lists_the_kernels_that_grew(stored, tmp_path, budgets, capsys) -> None:
    def traced(records: dict[str, dict], kernels: dict[str, tuple[float, float]]) -> dict[str, dict]:
        table = KernelTable.from_totals("cuda", 3, {k: (3 * c, 3 * us) for k, (c, us) in kernels.items()}).to_dict()
        return {name: info | {"kernel_trace": table} for name, info in records.items()}

    before = {"sgemm_nn": (159, 20_000.0), "adam_kernel": (159, 4_000.0)}
    old = day_run(tmp_path / "old" / "old.json", 4, traced(cases(), before))
    new = day_run(tmp_path / "new.json", 5, traced(cases(slowdown=1.3), before | {"planted_spin": (159, 30_000.0)}))
    code, out, _ = compare(capsys, old, new, "--budgets", budgets)
    assert code == 1
    assert "    - kernels that grew most:\n    - +30000 µs/epoch  planted_spin (new: 159 calls/epoch)" in out


def test_a_new_case_is_not_compared(stored, tmp_path, budgets, capsys) -> None:
    records = cases() | {"bench/test_experiments.py::test_optimizer[opt-sgd]": training("opt-sgd", 0.1)}
    new = day_run(tmp_path / "new.json", 5, records)
    code, out, _ = compare(capsys, stored / "0004_old.json", new, "--budgets", budgets)
    assert code == 0
    assert row(out, "opt-sgd").rstrip(" |").endswith("not compared (a new case: not in OLD)")
    assert "1 case(s) not in OLD, not compared: opt-sgd" in out


def test_floors_judge_only_with_budgets_too(stored, tmp_path, budgets, capsys) -> None:
    budgets.write_text(BUDGETS + "\n[datasets.synthetic.defaults]\naccuracy_min = 0.9\n")
    new = day_run(tmp_path / "new.json", 5, cases())
    assert compare(capsys, stored / "0004_old.json", new, "--budgets", budgets)[0] == 0
    code, out, _ = compare(capsys, stored / "0004_old.json", new, "--budgets", budgets, "--budgets-too")
    assert code == 1
    assert "**over budget**: accuracy" in row(out, "units-128")
    assert "accuracy = 0.8 breaks its limit 0.9; below its floor" in out


def test_floors_do_not_judge_a_run_of_other_epochs_than_its_profiles(stored, tmp_path, budgets, capsys) -> None:
    budgets.write_text(BUDGETS + "\n[datasets.synthetic.defaults]\naccuracy_min = 0.9\n")
    new = day_run(tmp_path / "new.json", 5, cases(), epochs=2)
    code, out, _ = compare(capsys, stored / "0004_old.json", new, "--budgets", budgets, "--budgets-too")
    assert code == 0 and "below its floor" not in out
    assert "accuracy and F1 floors not judged: floors set for 8 epochs of the smoke profile; this run trained 2" in out


def test_a_partial_run_file_is_read_like_any_run(stored, tmp_path, budgets, capsys) -> None:
    new = day_run(tmp_path / "run.partial.json", 5, {fullname("units-128"): training("units-128", 0.1)})
    code, out, _ = compare(capsys, stored / "0004_old.json", new, "--budgets", budgets)
    assert code == 0
    assert row(out, "units-128") and "1 case(s) of OLD not in NEW: batch-64" in out


def test_json_gives_each_case_its_verdict_and_deltas(stored, tmp_path, budgets, capsys) -> None:
    new = day_run(tmp_path / "new.json", 5, cases(slowdown=1.3, accuracy=0.82))
    out_file = tmp_path / "out" / "verdicts.json"
    code, out, _ = compare(capsys, stored / "0004_old.json", new, "--budgets", budgets, "--json", "--out", out_file)
    assert code == 1 and out == ""
    items = json.loads(out_file.read_text())
    assert [(i["case"], i["kind"]) for i in items] == [("units-128", "training"), ("batch-64", "training")]
    for item in items:
        assert set(item) == {"case", "fullname", "kind", "verdict", "deltas"}
        assert item["fullname"] == fullname(item["case"])
        verdict = Verdict.from_dict(item["verdict"])
        assert verdict.status == "regressed" and verdict.status in STATUSES
        assert verdict.baseline == str(stored / "0004_old.json")
        assert item["verdict"]["noise"]["known"] and item["verdict"]["noise"]["runs"] == 5  # 4 stored + 1 round
        assert [f["metric"] for f in item["verdict"]["failures"]] == ["epoch_time_ratio"]
        epoch = item["deltas"]["median_epoch_s"]
        assert epoch["change"] == pytest.approx(0.3) and epoch["worse"] is True
        assert item["deltas"]["accuracy"]["new"] == 0.82 and item["deltas"]["accuracy"]["worse"] is False


def test_a_trade_off_variant_whose_drop_grew_beyond_its_limit_regresses(tmp_path, budgets, capsys) -> None:
    def run(path: Path, day: int, drop: float) -> Path:
        return day_run(path, day, {serving_name("fp32"): serving("fp32", 30e-6, 0.0),
                                     serving_name("prune-90"): serving("prune-90", 25e-6, drop)})

    old = run(tmp_path / "old" / "old.json", 1, 0.05)
    code, out, _ = compare(capsys, old, run(tmp_path / "within.json", 2, 0.07), "--budgets", budgets)
    assert code == 0, out
    code, out, _ = compare(capsys, old, run(tmp_path / "grew.json", 2, 0.10), "--budgets", budgets)
    assert code == 1
    assert row(out, "blocks-3 fp32 torch").rstrip(" |").endswith("ok")
    assert "**regressed**: accuracy_drop_growth" in row(out, "blocks-3 prune-90 torch")
    assert "30 → 30 us (+0.0%)" in row(out, "blocks-3 fp32 torch")
    assert "drop against the fp32 model 0.1000 now, 0.0500 in the baseline" in out


# ------------------------------------------------------------------------ unusable input


def _foreign() -> str:
    return json.dumps({"machine_info": {"node": "x"}, "benchmarks": [{"fullname": "t.py::test_a", "stats": {}}]})


def _ours(benchmarks: list) -> str:
    return json.dumps({"machine_info": {"loadbench": {"gpu": None, "settings": SETTINGS}}, "datetime": "2026-03-09",
                       "benchmarks": benchmarks})


UNUSABLE = {  # name: (contents of NEW; None: no file, "/": a directory), what the line must say
    "missing": (None, "no such file"),
    "directory": ("/", "a directory; give one run file"),
    "empty": ("", "empty file"),
    "corrupt": ('{"benchmarks": [', "corrupt JSON at line 1"),
    "not a run": (json.dumps({"results": [1, 2]}), "not a pytest-benchmark run file"),
    "a list": (json.dumps([1, 2]), "not a pytest-benchmark run file"),
    "foreign": (_foreign(), "a pytest-benchmark run, but not made by mlp-loadbench"),
    "no benchmarks": (_ours([]), "a run with no benchmarks"),
    "no cases": (_ours([{"fullname": "bench/test_kernels.py::test_gemm", "extra_info": {}}]),
                 "no training cases or serving records among its 1 benchmark(s)"),
    "no fullname": (_ours([{"name": "x", "extra_info": {}}]), "benchmarks[0] has no 'fullname'"),
    "no case in common": (_ours([{"fullname": "bench/test_experiments.py::test_optimizer[opt-sgd]",
                                  "extra_info": training("opt-sgd", 0.1)}]), "no case in common: NEW"),
}


@pytest.mark.parametrize("name", UNUSABLE)
def test_unusable_input_gives_one_line_naming_the_file(stored, tmp_path, budgets, capsys, name) -> None:
    contents, says = UNUSABLE[name]
    new = tmp_path / f"{name.replace(' ', '-')}.json"
    if contents == "/":
        new.mkdir()
    elif contents is not None:
        new.write_text(contents)
    code, out, err = compare(capsys, stored / "0004_old.json", new, "--budgets", budgets)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("mlp-loadbench compare: "), err
    assert str(new) in err and says in err
    assert "Traceback" not in err


def test_unusable_old_and_budgets_are_named_too(stored, tmp_path, budgets, capsys) -> None:
    new = day_run(tmp_path / "new.json", 5, cases())
    code, _, err = compare(capsys, tmp_path / "gone.json", new, "--budgets", budgets)
    assert code == 2 and err == f"mlp-loadbench compare: OLD {tmp_path / 'gone.json'}: no such file\n"
    code, _, err = compare(capsys, stored / "0004_old.json", new, "--budgets", budgets, "--history", tmp_path / "none")
    assert code == 2 and err == f"mlp-loadbench compare: --history {tmp_path / 'none'}: no such file or directory\n"
    budgets.write_text("[defaults]\ntime_slower_pc = 10\n")
    code, _, err = compare(capsys, stored / "0004_old.json", new, "--budgets", budgets)
    assert code == 2 and err.count("\n") == 1
    assert str(budgets) in err and "unknown key 'time_slower_pc'" in err


def test_one_run_without_export_is_a_usage_error(tmp_path, capsys) -> None:
    new = day_run(tmp_path / "new.json", 5, cases())
    with pytest.raises(SystemExit) as exit_:
        main([str(new)])
    assert exit_.value.code == 2
    assert "give OLD NEW to compare; one run file only with --export" in capsys.readouterr().err


def test_old_and_new_the_same_file_is_refused_not_passed(stored, tmp_path, budgets, capsys) -> None:
    old = stored / "0004_old.json"
    link = tmp_path / "link.json"
    link.symlink_to(old)
    for again in (old, link, stored / ".." / stored.name / old.name):
        code, out, err = compare(capsys, old, again, "--budgets", budgets)
        assert code == 2 and out == ""
        assert err == f"mlp-loadbench compare: OLD {old} and NEW {again} are the same file: give two runs\n"


@pytest.mark.parametrize("option", ["--out", "--export"])
@pytest.mark.parametrize("role", ["OLD", "NEW"])
def test_an_output_over_an_input_is_refused_and_the_input_kept(stored, tmp_path, budgets, capsys, option,
                                                                role) -> None:
    old, new = stored / "0004_old.json", day_run(tmp_path / "new.json", 5, cases())
    target = old if role == "OLD" else new
    before = target.read_bytes()
    args = ["--out", target] if option == "--out" else ["--export", "bencher", target]
    code, out, err = compare(capsys, old, new, "--budgets", budgets, *args)
    assert code == 2 and out == ""
    assert err == f"mlp-loadbench compare: {option} {target}: is {role}, a run this reads; write elsewhere\n"
    assert target.read_bytes() == before
    code, _, err = compare(capsys, "--export", "bencher", new, new)  # export alone: NEW is the one input
    assert code == 2 and err == f"mlp-loadbench compare: --export {new}: is NEW, a run this reads; write elsewhere\n"


def test_two_records_with_one_label_are_told_apart_in_the_summary_and_the_exports(stored, tmp_path, budgets,
                                                                                   capsys) -> None:
    """A loop case and an experiment case can both record case units-128: neither may hide the other."""
    twin = "bench/test_loops.py::test_loop[units-128]"
    old = day_run(tmp_path / "old.json", 4, cases() | {twin: training("units-128", 0.3)})
    new = day_run(tmp_path / "new.json", 5, cases() | {twin: training("units-128", 0.3 * 1.4)})
    code, out, _ = compare(capsys, old, new, "--budgets", budgets, "--no-history")
    assert code == 1
    assert "| units-128 (test_hidden_units[units-128]) " in out and "| units-128 (test_loop[units-128]) " in out
    assert "**regressed**" in row(out, "units-128 (test_loop[units-128])")
    assert "**regressed**" not in row(out, "units-128 (test_hidden_units[units-128])")
    assert "- **units-128 (test_loop[units-128])** (regressed, `bench/test_loops.py::test_loop[units-128]`)" in out
    code, _, _ = compare(capsys, "--export", "bencher", tmp_path / "bmf.json", "--export", "github-action-benchmark",
                         tmp_path / "gab.json", new)
    assert code == 0
    bmf = json.loads((tmp_path / "bmf.json").read_text())
    assert bmf["units-128 (test_loop[units-128])"]["median-epoch-s"]["value"] == pytest.approx(0.42)
    assert bmf["units-128 (test_hidden_units[units-128])"]["median-epoch-s"]["value"] == pytest.approx(0.1)
    names = [entry["name"] for entry in json.loads((tmp_path / "gab.json").read_text())]
    assert len(names) == len(set(names))
    assert "units-128 (test_loop[units-128]) median epoch" in names


# ------------------------------------------------------------------------ exports


def _published(tmp_path: Path) -> Path:
    records = cases(energy=None) | {fullname("units-128"): training("units-128", 0.1, energy=12.5)}
    records |= {serving_name("fp32"): serving("fp32", 30e-6, 0.0)}
    return day_run(tmp_path / "new.json", 5, records)


def test_bencher_export_follows_the_bencher_metric_format(tmp_path, capsys) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    out = tmp_path / "bmf.json"
    code, stdout, _ = compare(capsys, "--export", "bencher", out, _published(tmp_path))
    assert code == 0 and f"wrote {out}" in stdout
    bmf = json.loads(out.read_text())
    jsonschema.validate(bmf, BMF_SCHEMA)
    assert set(bmf) == {"units-128", "batch-64", "blocks-3 fp32 torch"}
    assert set(bmf["units-128"]) == {"median-epoch-s", "accuracy", "energy-per-epoch-j"}
    assert set(bmf["batch-64"]) == {"median-epoch-s", "accuracy"}  # its energy was not measured: left out
    assert set(bmf["blocks-3 fp32 torch"]) == {"batch1-p99-us", "accuracy"}
    epoch = bmf["units-128"]["median-epoch-s"]
    assert epoch["lower_value"] <= epoch["value"] == 0.1 <= epoch["upper_value"]
    assert bmf["units-128"]["accuracy"] == {"value": 0.8}
    p99 = bmf["blocks-3 fp32 torch"]["batch1-p99-us"]
    assert p99["value"] == pytest.approx(30.0) and p99["lower_value"] < 30 < p99["upper_value"]


def test_github_action_benchmark_export_is_smaller_is_better(stored, tmp_path, budgets, capsys) -> None:
    out = tmp_path / "gab.json"
    code, stdout, _ = compare(capsys, stored / "0004_old.json", _published(tmp_path), "--budgets", budgets,
                              "--export", "github-action-benchmark", out)
    assert code == 0 and stdout.startswith("### mlp-loadbench compare")  # judged and exported at once
    entries = json.loads(out.read_text())
    assert isinstance(entries, list) and entries
    for entry in entries:
        assert set(entry) <= {"name", "unit", "value", "range", "extra"}
        assert isinstance(entry["name"], str) and isinstance(entry["unit"], str)
        assert isinstance(entry["value"], (int, float)) and not isinstance(entry["value"], bool)
        assert math.isfinite(entry["value"])
        assert all(isinstance(entry[key], str) for key in ("range", "extra") if key in entry)
    by_name = {entry["name"]: entry for entry in entries}
    assert len(by_name) == len(entries)
    assert by_name["units-128 error rate (1 - accuracy)"]["value"] == pytest.approx(0.2)
    assert by_name["units-128 median epoch"]["unit"] == "s" and "IQR" in by_name["units-128 median epoch"]["range"]
    assert by_name["units-128 energy per epoch"]["value"] == 12.5
    assert "batch-64 energy per epoch" not in by_name
    assert by_name["blocks-3 fp32 torch batch-1 p99"]["unit"] == "us"


def test_unknown_export_format_is_a_usage_error(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--export", "csv", str(tmp_path / "x"), str(_published(tmp_path))])
    assert exit_.value.code == 2
    assert "'csv' is not an export format" in capsys.readouterr().err


def test_the_module_runs_as_a_command(stored, tmp_path, budgets) -> None:
    new = day_run(tmp_path / "new.json", 5, cases(slowdown=1.3))
    done = subprocess.run([sys.executable, "-m", "bench.tools.compare", str(stored / "0004_old.json"), str(new),
                           "--budgets", str(budgets)], capture_output=True, text=True, cwd=Path(__file__).parents[1])
    assert done.returncode == 1, done.stderr
    assert "#### Regressions" in done.stdout
    assert "customSmallerIsBetter" in subprocess.run([sys.executable, "-m", "bench.tools.compare", "--help"],
                                                     capture_output=True, text=True,
                                                     cwd=Path(__file__).parents[1]).stdout


def test_a_run_cut_short_is_named_in_the_summary(stored, tmp_path, budgets, capsys) -> None:
    new = day_run(tmp_path / "new.json", 5, dict(list(cases().items())[:2]))
    data = json.loads(new.read_text())
    data["machine_info"]["loadbench"]["run"] = {"state": "interrupted", "collected": 6, "stored": 2, "cut_short": []}
    new.write_text(json.dumps(data))
    code, out, _ = compare(capsys, stored / "0004_old.json", new, "--budgets", budgets)
    assert code == 0
    assert "- NEW is not a whole run: the run was interrupted: it holds 2 finished case(s) of 6 collected" in out
    whole = day_run(tmp_path / "whole.json", 6, cases())
    assert "not a whole run" not in compare(capsys, stored / "0004_old.json", whole, "--budgets", budgets)[1]


def timed_call(median_us: float) -> dict:
    """A kernel cell's record: its calls scatter 0.2% around `median_us`, and the budget that judges it."""
    calls = [median_us * 1e-6 * (1 + 0.002 * (i % 5 - 2)) for i in range(30)]
    return {"call_seconds": calls, "median_call_s": median_us * 1e-6,
            "timed_call": {"experiment": "kernels", "case": "mlp_step-fp32-512x512-leaky_relu"}}


def test_timed_calls_are_judged_on_time_like_the_session_judges_them(tmp_path: Path, budgets: Path, capsys) -> None:
    cell = "bench/test_kernels.py::test_mlp_step[512-512-leaky_relu-fp32]"
    old = day_run(tmp_path / "old.json", 4, {**cases(), cell: timed_call(180.0)})
    steady = day_run(tmp_path / "same.json", 5, {**cases(), cell: timed_call(180.5)})
    slower = day_run(tmp_path / "slower.json", 6, {**cases(), cell: timed_call(240.0)})
    code, out, _ = compare(capsys, old, steady, "--budgets", budgets)
    assert code == 0 and "| timed call " in out
    assert row(out, "test_mlp_step[512-512-leaky_relu-fp32]").rstrip(" |").endswith("ok")
    code, out, _ = compare(capsys, old, slower, "--budgets", budgets)
    assert code == 1
    assert "**regressed**: call_time_ratio" in row(out, "test_mlp_step[512-512-leaky_relu-fp32]")
