"""bench.tools.selftest: the gate's self-test on synthetic runs with planted epoch times,
and once end to end on a tiny CSV (structure only: real timings are never judged).

Three cases, five A/A runs and five runs planted at +5%:

- units-128, quiet: A/A medians within 0.2%; its planted runs did not get slower.
- units-256, noisy: quiet for three runs, then +9.4% and -12.8%: one false alarm, and
  a spread (~5%) that hides its +5% planted runs.
- batch-64, slowed: quiet A/A; its planted runs are 5% slower than the last A/A run,
  and its budget sets time_noise_k = 4.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import threading
from pathlib import Path

import pytest

from bench.gate.budgets import Budgets
from bench.gate.timing import check_time
from bench.tools.selftest import cli
from bench.tools.selftest import running
from bench.tools.selftest.analysis import CaseResult
from bench.tools.selftest.analysis import analyse
from bench.tools.selftest.analysis import false_red_line
from bench.tools.selftest.analysis import suggest_pct
from bench.tools.selftest.analysis import totals
from bench.tools.selftest.campaign import SelftestError
from bench.tools.selftest.campaign import load_campaign
from bench.tools.selftest.cli import main
from bench.tools.selftest.outputs import table
from bench.tools.selftest.outputs import write_outputs

GPU = "NVIDIA H100 80GB HBM3"
SETTINGS = {"profile": "quick", "epochs": 8, "dataset": "synthetic", "device": "cuda", "loop": "graph",
            "impl": "torch", "precision": "fp32", "shard": None, "plant": None}
BUDGETS = """\
[defaults]
time_slower_pct = 2
time_noise_k = 3
time_noise_unknown_pct = 25
time_alpha = 0.01

[profiles.quick.cases."batch-64"]
time_noise_k = 4
"""
# Steady epochs scatter +-0.2% around the run's median (which they hit exactly), so
# two runs 5% apart are wholly separated: Mann-Whitney p = 1/C(14,7) < 0.01.
RIPPLE = (-0.002, -0.001, -0.0005, 0.0, 0.0005, 0.001, 0.002)
CASES = {  # case id: (experiment, A/A medians, planted medians)
    "units-128": ("units", [1.0, 1.002, 0.998, 1.001, 0.999], [1.0, 1.001, 0.999, 1.0, 1.002]),
    "units-256": ("units", [1.0, 1.004, 0.996, 1.09, 0.95], [0.95 * 1.05] * 5),
    "batch-64": ("batch", [2.0, 2.004, 1.998, 2.002, 2.0], [2.1, 2.104, 2.098, 2.1, 2.102]),
}


def fullname(case_id: str) -> str:
    experiment = CASES[case_id][0]
    return f"bench/test_experiments.py::test_{experiment}[{case_id}]"


def extra_info(case_id: str, median: float, plant: str | None = None) -> dict:
    return {
        "case": case_id,
        "experiment": CASES[case_id][0],
        "epoch_seconds_by_round": [[3 * median] + [median * (1 + r) for r in RIPPLE]],
        "median_epoch_s": median,
        "throttled": False,
        "planted_slowdown": plant,
    }


def make_run(index: int, plant: float | None = None, *, gpu: str = GPU, **changes: object) -> dict:
    """Run `index` (0-based) of the A/A series, or of the series planted at `plant` percent."""
    recorded = f"{plant:g}%:gpu" if plant is not None else None
    benchmarks = []
    for case_id, (_, aa, planted) in CASES.items():
        median = (aa if plant is None else planted)[index]
        benchmarks.append({"fullname": fullname(case_id), "extra_info": extra_info(case_id, median, recorded)})
    return {
        "datetime": f"2026-05-01T10:{index:02d}:00",
        "commit_info": {"id": "0123456789abcdef"},
        "machine_info": {"loadbench": {"gpu": {"name": gpu}, "settings": {**SETTINGS, "plant": recorded, **changes}}},
        "benchmarks": benchmarks,
    }


@pytest.fixture
def budgets(tmp_path: Path) -> Budgets:
    path = tmp_path / "budgets.toml"
    path.write_text(BUDGETS)
    return Budgets.load(path)


@pytest.fixture
def results(budgets: Budgets) -> dict[str, CaseResult]:
    aa = [make_run(i) for i in range(5)]
    planted = {5.0: [make_run(i, 5.0) for i in range(5)]}
    return {r.case_id: r for r in analyse(aa, planted, budgets)}


def log_stdev(medians: list[float]) -> float:
    return statistics.stdev(math.log(m) for m in medians)


def write_campaign(folder: Path, runs: int = 5, plants: tuple[float, ...] = (5.0,)) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(runs):
        (folder / f"aa-{i + 1:02d}.json").write_text(json.dumps(make_run(i)))
        for pct in plants:
            (folder / f"plant{pct:02g}-{i + 1:02d}.json").write_text(json.dumps(make_run(i, pct)))
    return folder


# ------------------------------------------------------------------------ the arithmetic


def test_false_alarms_and_detections_are_counted_per_case(results) -> None:
    quiet, noisy, slowed = results["units-128"], results["units-256"], results["batch-64"]
    assert (quiet.false_alarms, quiet.comparisons, quiet.detected) == (0, 4, {5.0: (0, 5)})
    # Run 4 (+9.4%) against three runs 0.4% apart: beyond the 2% budget, and significant.
    assert (noisy.false_alarms, noisy.comparisons) == (1, 4)
    assert noisy.detected == {5.0: (0, 5)}  # +5% is inside 3 x its ~5% spread
    assert (slowed.false_alarms, slowed.detected) == (0, {5.0: (5, 5)})


def test_the_false_red_rate_counts_runs_in_which_any_case_failed(budgets) -> None:
    aa = [make_run(i) for i in range(5)]
    names = [f"aa-{i + 1:02d}" for i in range(5)]
    results = analyse(aa, {}, budgets, names)
    assert {r.case_id: r.red_runs for r in results}["units-256"] == ("aa-04",)  # its one false alarm, by name
    t = totals(results, len(aa))
    assert (t.red_runs, t.run_comparisons) == (1, 4)
    # Estimated from the cases' own rates: units-256 alone has one (1 of 4), the others none.
    assert t.estimated_red == pytest.approx(0.25)
    line = false_red_line(t)
    assert "1/4 A/A runs red against the run before" in line and "from the cases' own rates 25.0%" in line
    quiet = [r for r in results if r.case_id != "units-256"]
    assert "(under 75% at 95% confidence)" in false_red_line(totals(quiet, len(aa)))  # none red: the rule of three
    assert false_red_line(totals(results, 1)).endswith("unknown (needs 2 A/A runs)")


def test_the_counts_are_the_gates_own_verdicts(budgets) -> None:
    """The noisy case's false alarm, judged directly with check_time as the brief defines it."""
    aa = [extra_info("units-256", m) for m in CASES["units-256"][1]]
    budget = budgets.resolve("quick", "units", "units-256")
    verdicts = [bool(check_time(budget, aa[i], aa[i - 1], history=aa[:i])) for i in range(1, 5)]
    assert verdicts == [False, False, True, False]


def test_spread_change_detectable_and_suggestion(results) -> None:
    quiet, noisy, slowed = results["units-128"], results["units-256"], results["batch-64"]
    for r in (quiet, noisy, slowed):
        assert r.spread == pytest.approx(log_stdev(CASES[r.case_id][1]))  # one round per run: plain stdev
    assert noisy.largest_change == pytest.approx(1.09 / 0.95 - 1)  # the drop, read as a slowdown
    assert quiet.largest_change == pytest.approx(1.002 / 0.998 - 1)
    # Smallest detectable now: the budget's 2% where k x spread is below it, else k x spread.
    assert (quiet.detectable, quiet.detectable_rule) == (pytest.approx(0.02), "budget")
    assert (noisy.detectable, noisy.detectable_rule) == (pytest.approx(3 * noisy.spread), "3 x spread")
    assert slowed.k == 4 and slowed.detectable == pytest.approx(0.02)
    # Suggested: max(1.0, k x spread, 1.5 x largest change) in percent, up to the next 0.5.
    assert quiet.suggested_pct == 1.0
    assert noisy.suggested_pct == math.ceil(2 * 150 * (1.09 / 0.95 - 1)) / 2 == 22.5
    assert slowed.suggested_pct == 1.0


@pytest.mark.parametrize(
    ("k", "spread", "change", "expected"),
    [
        (3, 0.001, 0.002, 1.0),  # the floor
        (3, 0.005, 0.004, 1.5),  # exactly 1.5: not pushed to 2.0 by rounding error
        (3, 0.0051, 0.001, 2.0),  # 1.53 rounds up
        (4, 0.01, 0.02, 4.0),  # k x spread decides
        (3, 0.01, 0.03, 4.5),  # 1.5 x change decides
        (3, None, 0.03, None),  # spread unknown: no suggestion
    ],
)
def test_suggestion_formula(k, spread, change, expected) -> None:
    assert suggest_pct(k, spread, change) == expected


def on_card(run: dict, uuid: str | None) -> dict:
    run["machine_info"]["loadbench"]["gpu"]["uuid"] = uuid
    return run


def test_the_offset_between_cards_is_the_slowest_cards_median_over_the_fastests(budgets) -> None:
    # Runs alternate over two cards (as --gpus lanes do); card B's runs are 1.3% slower.
    aa = []
    for i in range(6):
        run = make_run(0)
        card_b = i % 2 == 1
        for bench in run["benchmarks"]:
            info = bench["extra_info"]
            median = info["median_epoch_s"] * (1.013 if card_b else 1.0) * (1 + 0.001 * (i // 2))
            info.update(extra_info(info["case"], median))
        aa.append(on_card(run, "GPU-b" if card_b else "GPU-a"))
    result = {r.case_id: r for r in analyse(aa, {}, budgets)}["units-128"]
    # card medians: a = 1.001 x m (runs 0, 2, 4), b = 1.013 x 1.001 x m (runs 1, 3, 5)
    assert result.cards == 2 and result.card_offset == pytest.approx(0.013, rel=1e-6)
    assert "| 1.30% (2 cards)" in table([result])


@pytest.mark.parametrize(("uuids", "cards", "shown"),
                         [(["GPU-a"] * 3, 1, "one card"), (["GPU-a", None, "GPU-b"], 0, "unknown")])
def test_one_card_or_a_run_that_does_not_say_has_no_offset(budgets, uuids, cards, shown) -> None:
    aa = [on_card(make_run(i), uuid) for i, uuid in enumerate(uuids)]
    result = {r.case_id: r for r in analyse(aa, {}, budgets)}["units-128"]
    assert (result.cards, result.card_offset) == (cards, None)
    assert f"| {shown} " in table([result])


def test_two_runs_leave_the_spread_unknown(budgets) -> None:
    (r, *_) = analyse([make_run(0), make_run(1)], {}, budgets)
    assert r.spread is None and r.suggested_pct is None
    assert (r.detectable, r.detectable_rule) == (pytest.approx(0.25), "noise unknown")
    assert r.detected == {}


# ------------------------------------------------------------------------ the outputs


def test_suggested_toml_loads_and_resolves_to_the_suggestions(tmp_path, results) -> None:
    campaign = load_campaign(sorted(write_campaign(tmp_path / "runs").glob("*.json")))
    write_outputs(tmp_path / "out", campaign, list(results.values()), Path("budgets.toml"))
    text = (tmp_path / "out" / "suggested-budgets.toml").read_text()
    assert '[profiles.quick.cases."units-256"]' in text and "largest A/A change 14.74%" in text
    loaded = Budgets.load(tmp_path / "out" / "suggested-budgets.toml")
    for case_id, r in results.items():
        assert loaded.resolve("quick", r.experiment, case_id).time_slower_pct == r.suggested_pct
    assert loaded.resolve("smoke", "units", "units-256").time_slower_pct is None  # for the measured profile only


def test_suggested_toml_without_a_known_spread_still_loads(tmp_path, budgets) -> None:
    campaign = load_campaign(sorted(write_campaign(tmp_path / "runs", runs=2).glob("*.json")))
    results = analyse(campaign.aa_runs, campaign.planted_runs, budgets)
    write_outputs(tmp_path / "out", campaign, results, Path("budgets.toml"))
    text = (tmp_path / "out" / "suggested-budgets.toml").read_text()
    assert "no suggestion: spread unknown" in text
    assert not [line for line in text.splitlines() if line.startswith("time_slower_pct")]  # nothing guessed
    loaded = Budgets.load(tmp_path / "out" / "suggested-budgets.toml")
    assert loaded.resolve("quick", "units", "units-128").time_slower_pct is None


def test_from_folder_through_main(tmp_path, capsys) -> None:
    runs = write_campaign(tmp_path / "runs", plants=(5.0, 15.0))
    (runs / "notes.json").write_text("{}")  # not named like a run file: passed over
    (tmp_path / "budgets.toml").write_text(BUDGETS)
    assert main(["--from", str(runs), "--budgets", str(tmp_path / "budgets.toml")]) == 0
    printed = capsys.readouterr().out
    table = (runs / "selftest.md").read_text()
    assert table.split("\n| case")[1] in printed  # the table is printed and written alike
    assert "| units-256 " in table and "| 1/4 " in table and "detected at +15%" in table
    assert "max(1.0, k x spread, 1.5 x largest A/A change)" in table
    assert "totals: false failures 1/12 A/A comparisons over 3 case(s); +5% caught in every run in 1/3 case(s)" in table
    assert (runs / "suggested-budgets.toml").is_file()


# ------------------------------------------------------------------------ errors


def write_runs(folder: Path, runs: dict[str, dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, run in runs.items():
        (folder / name).write_text(json.dumps(run) if isinstance(run, dict) else run)
    return folder


def dropped(run: dict, case_id: str) -> dict:
    return {**run, "benchmarks": [b for b in run["benchmarks"] if b["extra_info"]["case"] != case_id]}


AA = {"aa-01.json": make_run(0), "aa-02.json": make_run(1)}


def test_a_killed_runs_partial_file_is_passed_over(tmp_path) -> None:
    """aa-03.partial.json: what a killed run finished (bench/plugin/partial.py); the
    campaign runs aa-03 again, so the folder still reads as the two complete runs."""
    from bench.tools.selftest.campaign import run_files

    folder = write_runs(tmp_path / "c", {**AA, "aa-03.partial.json": dropped(make_run(2), "blocks-2")})
    assert [p.name for p in run_files(folder)] == ["aa-01.json", "aa-02.json"]


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({}, "no self-test run files (aa-NN.json, plantX-NN.json)"),
        ({"plant05-01.json": make_run(0, 5.0)}, "no A/A run files (aa-NN.json)"),
        ({"aa-01.json": make_run(0)}, "1 A/A run: the false-alarm rate needs at least 2"),
        ({**AA, "aa-03.json": "{not json"}, "aa-03.json: corrupt JSON at line 1"),
        ({**AA, "aa-03.json": {"benchmarks": [], "machine_info": {}}}, "not made by mlp-loadbench"),
        ({**AA, "plant5x-01.json": make_run(0, 5.0)}, "plant5x-01.json: not a self-test run name"),
        ({**AA, "aa-2.json": make_run(2)}, "aa-02.json and aa-2.json are both run 2"),
        ({**AA, "aa-03.json": make_run(2, gpu="NVIDIA H200")},
         "aa-03.json: measured on NVIDIA H200, aa-01.json on NVIDIA H100 80GB HBM3"),
        ({**AA, "plant05-01.json": make_run(0, 5.0, profile="smoke")},
         "plant05-01.json: settings differ from aa-01.json's: profile 'smoke' vs 'quick'"),
        ({**AA, "plant05-01.json": make_run(0, 15.0)},
         "plant05-01.json: ran with --plant-slowdown 15%:gpu, but its name says 5%"),
        ({**AA, "aa-03.json": make_run(2, 5.0)},
         "aa-03.json: ran with --plant-slowdown 5%:gpu; A/A runs run without one"),
    ],
    ids=["empty", "no-aa", "one-aa", "corrupt", "foreign", "bad-name", "same-number", "other-gpu", "other-settings",
         "wrong-plant", "planted-aa"],
)
def test_unusable_runs_are_one_clear_line_and_exit_2(tmp_path, capsys, files, message) -> None:
    folder = write_runs(tmp_path / "runs", files)
    assert main(["--from", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("mlp-loadbench selftest: ") and message in err


def test_corrupt_run_file_is_named(tmp_path, capsys) -> None:
    folder = write_runs(tmp_path / "runs", {**AA, "aa-03.json": "{not json"})
    assert main(["--from", str(folder)]) == 2
    assert f"run {folder / 'aa-03.json'}: corrupt JSON at line 1" in capsys.readouterr().err


def test_bad_budgets_file_is_one_line(tmp_path, capsys) -> None:
    folder = write_runs(tmp_path / "runs", AA)
    (tmp_path / "b.toml").write_text("[defaults]\ntime_slower = 3\n")
    assert main(["--from", str(folder), "--budgets", str(tmp_path / "b.toml")]) == 2
    assert "unknown key 'time_slower'" in capsys.readouterr().err


def test_running_options_do_not_go_with_from(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--from", str(tmp_path), "--plant", "5", "--", "--profile", "quick"])
    assert exit_.value.code == 2
    assert "--plant, pytest arguments do not apply" in capsys.readouterr().err


def test_gpu_lanes_run_at_once_each_on_its_own_gpu_and_every_run_once(tmp_path, monkeypatch, capsys) -> None:
    both_running = threading.Barrier(2, timeout=30)  # passes only when two runs are in flight together
    seen: list[tuple[str, str]] = []

    def fake_run_one(command, out_json, name, log, env=None):
        seen.append((name, env["CUDA_VISIBLE_DEVICES"]))
        if len(seen) <= 2:
            both_running.wait()
        out_json.write_text("{}")
        return 0, 1.0

    monkeypatch.setattr(running, "run_one", fake_run_one)
    paths = running.run_campaign(tmp_path, "bench", "x", 3, [5.0], "gpu", [], gpus=["0", "3"])
    assert [p.name for p in paths] == [f"{n}.json" for n in ("aa-01", "aa-02", "aa-03",
                                                             "plant05-01", "plant05-02", "plant05-03")]
    assert sorted(name for name, _ in seen) == sorted(p.stem for p in paths)
    assert {gpu for _, gpu in seen} == {"0", "3"}
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 6 and all(" on GPU 0:" in line or " on GPU 3:" in line for line in lines)


def test_a_failing_lane_stops_the_campaign_and_its_error_is_raised(tmp_path, monkeypatch) -> None:
    started: list[str] = []

    def fake_run_one(command, out_json, name, log, env=None):
        started.append(name)
        if name == "aa-01":
            raise SelftestError("run aa-01 failed (pytest exit 4)")
        return 0, 1.0

    monkeypatch.setattr(running, "run_one", fake_run_one)
    with pytest.raises(SelftestError, match="run aa-01 failed"):
        running.run_campaign(tmp_path, "bench", "x", 10, [], "gpu", [], gpus=["0", "1"])
    assert len(started) < 10  # the lanes stopped taking runs once one failed


class PlantedClock:
    """time.monotonic for run_campaign: each fake run moves it on by its seconds."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def timed_fake_runs(monkeypatch, clock: PlantedClock, seconds: float, ran: list[str]) -> None:
    def fake_run_one(command, out_json, name, log, env=None):
        ran.append(name)
        clock.now += seconds
        out_json.write_text(json.dumps(make_run(0)))
        return 0, seconds

    monkeypatch.setattr(running, "run_one", fake_run_one)
    monkeypatch.setattr(running.time, "monotonic", clock)


def test_stop_after_starts_no_run_that_would_end_past_it_and_resume_goes_on(tmp_path, monkeypatch, capsys) -> None:
    clock, ran = PlantedClock(), []
    timed_fake_runs(monkeypatch, clock, 100.0, ran)
    # 0 s: run 1 (no run timed yet); 100 s: run 2 would end at 200 <= 250; 200 s: run 3 would end at 300.
    with pytest.raises(running.CampaignStopped, match=r"2 of 6 runs in .*--resume goes on"):
        running.run_campaign(tmp_path, "bench", "x", 3, [5.0], "gpu", [], stop_after=250)
    assert ran == ["aa-01", "aa-02"]
    # A run cut off mid-write leaves a JSON that does not parse: run again, not kept.
    (tmp_path / "aa-03.json").write_text('{"benchmarks": [')
    ran.clear()
    paths = running.run_campaign(tmp_path, "bench", "x", 3, [5.0], "gpu", [], resume=True)
    assert ran == ["aa-03", "plant05-01", "plant05-02", "plant05-03"]
    assert len(paths) == 6 and all(path.is_file() for path in paths)
    assert "resuming: 2 of 6 runs already in" in capsys.readouterr().out


def test_without_resume_every_run_runs_again(tmp_path, monkeypatch) -> None:
    clock, ran = PlantedClock(), []
    timed_fake_runs(monkeypatch, clock, 1.0, ran)
    running.run_campaign(tmp_path, "bench", "x", 2, [], "host", [])
    running.run_campaign(tmp_path, "bench", "x", 2, [], "host", [])
    assert ran == ["aa-01", "aa-02"] * 2


def test_a_stopped_campaign_exits_3_with_how_to_go_on(tmp_path, monkeypatch, capsys) -> None:
    clock, ran = PlantedClock(), []
    timed_fake_runs(monkeypatch, clock, 100.0, ran)
    code = main(["-k", "x", "--runs", "3", "--out", str(tmp_path), "--stop-after", "150"])
    assert code == 3 and ran == ["aa-01"]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "(--stop-after 150): 1 of 3 runs" in err
    assert not (tmp_path / "selftest.md").exists()  # no analysis of a campaign half done


def test_an_empty_k_runs_every_case(tmp_path, monkeypatch) -> None:
    commands: list[list[str]] = []

    def fake_run_one(command, out_json, name, log, env=None):
        commands.append(command)
        out_json.write_text(json.dumps(make_run(0)))
        return 0, 1.0

    monkeypatch.setattr(running, "run_one", fake_run_one)
    assert main(["-k", "", "--runs", "2", "--out", str(tmp_path)]) == 0
    assert len(commands) == 2 and all(c[c.index("-k") + 1] == "" for c in commands)


@pytest.mark.parametrize(
    ("option", "values"), [("--stop-after", ["0", "-5", "soon", "inf"]), ("--gpus", ["0,0", "a", "0,,1", "-1"])]
)
def test_bad_running_options_are_usage_errors(capsys, option, values) -> None:
    for value in values:
        with pytest.raises(SystemExit) as exit_:
            main(["-k", "x", option, value])
        assert exit_.value.code == 2
        assert option in capsys.readouterr().err, value


@pytest.mark.parametrize(
    ("gpus", "count", "line"),
    [("0", 0, "--gpus 0: no GPU on this machine (NVML finds none); leave --gpus out to run one run at a time"),
     ("0,1,2", 2, "--gpus 0,1,2: this machine has 2 GPU(s), indices 0 to 1; no GPU 2")],
)
def test_gpus_that_are_not_there_are_refused_before_any_run(tmp_path, monkeypatch, capsys, gpus, count, line) -> None:
    ran: list[str] = []
    monkeypatch.setattr(cli, "visible_gpus", lambda: count)
    monkeypatch.setattr(running, "run_one", lambda command, out_json, name, log, env=None: ran.append(name))
    assert main(["-k", "x", "--runs", "2", "--gpus", gpus, "--out", str(tmp_path / "st")]) == 2
    assert capsys.readouterr().err.splitlines() == [f"mlp-loadbench selftest: {line}"]
    assert ran == [] and not (tmp_path / "st").exists()


def test_gpus_that_are_there_pass_the_check() -> None:
    assert running.gpus_problem(["0", "1"], 2) is None
    assert running.gpus_problem(["3"], 4) is None
    assert isinstance(running.visible_gpus(), int)


@pytest.mark.parametrize(("given", "named"),
                         [(["-k", ""], "-k"), (["--resume"], "--resume"), (["--gpus", "0,1"], "--gpus")])
def test_running_options_named_with_from_are_usage_errors(tmp_path, capsys, given, named) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--from", str(tmp_path), *given])
    assert exit_.value.code == 2
    assert f"{named} do not apply" in capsys.readouterr().err


def test_a_pytest_usage_error_stops_with_the_run_and_command(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "test_nothing.py").write_text("def test_x():\n    pass\n")
    code = main(["-k", "x", "--runs", "2", "--path", "test_nothing.py", "--out", "st", "--", "--no-such-option"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    assert err.startswith("mlp-loadbench selftest: run aa-01 failed "
                          "(pytest exit 4, no JSON written; output in st/aa-01.log)")
    assert "-m pytest test_nothing.py -k x -p no:cacheprovider -q --benchmark-json=st/aa-01.json" in err
    assert err.endswith("--no-such-option")
    assert not (tmp_path / "st" / "aa-02.log").exists()  # it stopped at the first


@pytest.mark.parametrize(("code", "writes", "counts"), [(0, True, True), (1, True, True), (1, False, False),
                                                     (2, True, False), (4, False, False)])
def test_a_run_counts_when_pytest_ran_its_cases_and_wrote_the_json(tmp_path, code, writes, counts) -> None:
    """Exit 1 is a case that broke its own budgets: its record is in the JSON all the same."""
    out_json = tmp_path / "aa-01.json"
    out_json.write_text("{}")  # left from an earlier campaign: must not pass for this run's
    script = (f"open({str(out_json)!r}, 'w').write('{{}}'); " if writes else "") + f"raise SystemExit({code})"
    command = [sys.executable, "-c", script]
    if counts:
        assert running.run_one(command, out_json, "aa-01", tmp_path / "aa-01.log")[0] == code
    else:
        with pytest.raises(SelftestError, match=rf"run aa-01 failed \(pytest exit {code}"):
            running.run_one(command, out_json, "aa-01", tmp_path / "aa-01.log")


# ------------------------------------------------------------------------ end to end

ONE_CASE = """\
from kernels.ground.cases import Case

def test_small(loadbench):
    loadbench.run(Case("blocks", 2), width=32)
"""


@pytest.mark.slow
def test_real_campaign_on_a_tiny_case(tmp_path, monkeypatch, capsys) -> None:
    """Two A/A runs and two planted ones through real pytest: what is written, not what it says."""
    from model.data import synthesize
    from model.data import write_csv

    monkeypatch.chdir(tmp_path)
    csv = write_csv(synthesize(scale=0.02), tmp_path / "tiny.csv")
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["bench.plugin"]\n')
    (tmp_path / "test_cases.py").write_text(ONE_CASE)
    (tmp_path / "budgets.toml").write_text("[defaults]\ntime_slower_pct = 10\n")  # no floors
    code = main(["-k", "small", "--runs", "2", "--plant", "50", "--path", "test_cases.py", "--out", "st",
                 "--budgets", "budgets.toml", "--", "--device=cpu", "--profile=smoke", "--epochs=3",
                 f"--dataset={csv}", "--budgets=budgets.toml"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    out = tmp_path / "st"
    names = ["aa-01", "aa-02", "plant50-01", "plant50-02"]
    assert all((out / f"{n}.json").is_file() and (out / f"{n}.log").is_file() for n in names)
    assert [line.split(":")[0] for line in printed.splitlines() if line.startswith("[")] == \
        [f"[{i}/4] {n}" for i, n in enumerate(names, 1)]
    planted = json.loads((out / "plant50-01.json").read_text())
    assert planted["machine_info"]["loadbench"]["settings"]["plant"] == "50%:host"
    assert planted["benchmarks"][0]["extra_info"]["planted_slowdown"] == "50%:host"
    assert json.loads((out / "aa-02.json").read_text())["machine_info"]["loadbench"]["settings"]["plant"] is None
    assert "| blocks-2 " in (out / "selftest.md").read_text()
    assert (out / "series" / "aa-01").is_dir()  # the load series stay with the self-test
    Budgets.load(out / "suggested-budgets.toml")


def test_a_case_missing_from_one_run_is_judged_on_the_runs_that_hold_it(tmp_path, capsys) -> None:
    folder = write_runs(tmp_path / "runs", {**AA, "plant05-01.json": dropped(make_run(0, 5.0), "batch-64")})
    assert main(["--from", str(folder)]) == 0
    captured = capsys.readouterr()
    assert ("warning: plant05-01.json: lacks 1 case(s) that other runs hold: "
            "bench/test_experiments.py::test_batch[batch-64]; judged on the runs that hold them") in captured.err
    assert "batch-64" in captured.out
    assert "plant05-01.json: lacks 1 case(s)" in (folder / "selftest.md").read_text()
