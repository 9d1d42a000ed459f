"""The report, figures and merge, on runs the tests make themselves (workflows and bisect:
test_workflows.py, test_bisect.py)."""

from __future__ import annotations

import json
import math
import random
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from matplotlib.text import Text

from kernels.ground.cases import Case
from kernels.ground.cases import all_cases
from kernels.ground.cases import loop_cases
from bench.monitor.series import read_series
from bench.gate.kernel_table import KernelTable
from bench.gate.budgets import Budgets
from bench.gate.runs import case_history
from bench.gate.compare import check_against
from bench.gate.runs import load_history
from bench.gate.summary import render_summary
from bench.figures.training import epoch_ends
from bench.figures.training import moving_average
from bench.figures.training import pareto_figure
from bench.figures.common import pareto_front
from bench.figures.training import resource_figure
from bench.tools.history import run_labels
from bench.tools.history import tick_labels
from bench.tools.merge import main as merge_main
from bench.tools.merge import settings_diff
from bench.tools.report import ReportError
from bench.tools.report import build_report
from bench.tools.report import regressions
from bench.tools.report import main as report_main
from bench.gate.runs import find_run_files
from bench.gate.runs import load_runs
from tests.runs import BUDGETS
from tests.runs import H100
from tests.runs import NOT_RUNS
from tests.runs import STEADY
from tests.runs import fullname
from tests.runs import not_a_run
from tests.runs import record
from tests.runs import write_run

CASES = """
from kernels.ground.cases import Case
import pytest

@pytest.mark.parametrize("case", [Case("units", 128), Case("units", 256)], ids=lambda c: c.id)
def test_units(loadbench, case):
    loadbench.run(case, width=16 if case.value == 128 else 32)

def test_opt(loadbench):
    loadbench.run(Case("opt", "sgd"), width=16)
"""


@pytest.fixture(scope="module")
def storage(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two saved runs of three small cases, with their series: made once per test session
    and only read by the tests. pytest-xdist's workers share one copy (their temporary
    folders sit side by side in the session's), made by whichever takes the lock first."""
    from filelock import FileLock  # a dependency of torch's

    base = tmp_path_factory.getbasetemp()
    root = (base.parent if hasattr(request.config, "workerinput") else base) / "report-runs"
    with FileLock(f"{root}.lock"):
        if (root / "made").is_file():
            return root
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir()
        (root / "conftest.py").write_text('pytest_plugins = ["bench.plugin"]\n')
        (root / "test_cases.py").write_text(CASES)
        (root / "budgets.toml").write_text("")  # no floors: these runs are 3 epochs of tiny models
        for _ in range(2):
            subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--device=cpu", "--profile=smoke",
                 "--epochs=3", f"--budgets={root / 'budgets.toml'}", f"--benchmark-storage={root / 'store'}",
                 "--benchmark-autosave", f"--series-dir={root / 'series'}"],
                cwd=root, check=True, capture_output=True,
            )
        (root / "made").touch()
    return root


def test_tables_figures_history_and_summary(storage, tmp_path) -> None:
    written, warnings = build_report(find_run_files(storage / "store"), tmp_path)
    names = {p.name for p in written}
    assert {"tables.md", "units.png", "opt.png", "pareto.png", "summary.md", "history.html"} <= names
    tables = (tmp_path / "tables.md").read_text()
    assert "## hidden units" in tables and "| 128 " in tables and "Accuracy" in tables
    html = (tmp_path / "history.html").read_text()
    # self-contained
    assert len(re.findall(r"\* plotly\.js v\d", html)) == 1 and not re.search(r"<script[^>]+src=", html)
    assert "<section id='gpu-no-gpu'><h2>no GPU</h2>" in html and "<table class='summary'>" in html
    assert "no energy per epoch in these runs: device is cpu" in html  # said, not an empty chart
    summary = (tmp_path / "summary.md").read_text()
    assert "units-256" in summary and "2 run(s) in the history" in summary
    for png in tmp_path.glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert warnings == []


def test_resource_figure_has_one_line_per_case(storage) -> None:
    series = {p.stem: read_series(p) for p in sorted((storage / "series").glob("*units*.csv"))}
    assert len(series) == 2
    fig = resource_figure("hidden units", series, window=50)
    for ax in fig.axes:
        assert len(ax.lines) == 2  # CPU and RSS panels on a CPU run; GPU panels absent, not zero
    assert [ax.get_ylabel() for ax in fig.axes] == ["CPU, process (% of usable cores)", "RAM, process RSS (MiB)"]
    assert [t.get_text() for t in fig.texts] == ["not measured on this run: GPU busy, SM activity, VRAM used, Power"]


def test_resource_figure_runs_on_seconds_with_epoch_ends_marked() -> None:
    # 30 samples 0.1 s apart over 3 epochs: the monitor carries the epoch last reported, -1 before the first.
    columns = {"t": [0.05 + 0.1 * i for i in range(30)], "epoch": [-1.0] * 10 + [0.0] * 10 + [1.0] * 9 + [2.0],
               "cpu_process": [50.0 + i % 3 for i in range(30)]}
    fig = resource_figure("hidden units", {"units-256": columns, "units-128": columns}, window=50)
    lines = fig.axes[0].lines
    assert [line.get_label() for line in lines] == ["units-128", "units-256"]  # the study's order, in the legend too
    assert list(lines[0].get_xdata()) == columns["t"]  # seconds since the monitor started, not sample numbers
    assert fig.axes[-1].get_xlabel().startswith("time since the monitor started (s)")
    assert lines[0].get_markevery() == [10, 20, 29] and lines[0].get_marker() == "|"  # each epoch's end


def test_epoch_ends_thin_out_when_epochs_outpace_the_monitor() -> None:
    columns = {"epoch": [-1, -1, 0, 0, 1, 2, 3, 5, float("nan"), 6, 0, 1]}  # a new round restarts at 0
    assert epoch_ends(columns) == [2, 4, 5, 6, 7, 10, 11]
    assert epoch_ends(columns, every=2) == [4, 6, 7, 10, 11]  # where 2, 4, 6 epochs were done, and the new round
    fig = resource_figure("loop", {"loop-graph": {"t": [0.1 * i for i in range(400)],
                                                  "epoch": [float(i) for i in range(400)],
                                                  "cpu_process": [50.0] * 400}}, window=50)
    assert len(fig.axes[0].lines[0].get_markevery()) <= 40 and "every 10 epochs" in fig.axes[0].get_xlabel()


def test_a_resource_figure_with_nothing_measured_says_so() -> None:
    fig = resource_figure("hidden units",
                          {"units-128": {"t": [0.1, 0.2], "epoch": [0.0, 1.0], "cpu_process": [math.nan] * 2}}, 50)
    assert [t.get_text() for t in fig.axes[0].texts] == ["no resource samples in these series"]
    assert len(fig.axes[0].lines) == 0 and len(fig.axes[0].get_yticks()) == 0


def test_bad_files_are_skipped_with_a_warning_naming_each(storage, tmp_path) -> None:
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text("{oops")
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps({"benchmarks": [], "machine_info": {}}))
    missing = tmp_path / "missing.json"
    paths = find_run_files(storage / "store") + [corrupt, foreign, missing]
    _, warnings = build_report(paths, tmp_path / "out")
    assert any("corrupt.json" in w and "corrupt JSON" in w for w in warnings)
    assert any("foreign.json" in w and "not made by mlp-loadbench" in w for w in warnings)
    assert any("missing.json: no such file" in w for w in warnings)


def test_empty_storage_gives_a_clear_message(tmp_path, capsys) -> None:
    with pytest.raises(ReportError, match="no mlp-loadbench runs"):
        build_report([], tmp_path)
    assert report_main(["--storage", str(tmp_path / "nothing"), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'nothing'}: no run files there" in err
    assert "run `pytest bench/ --benchmark-autosave` first" in err
    assert not (tmp_path / "out").exists()


def _our_run_without_cases() -> str:
    return json.dumps({"datetime": "2024-01-01T00:00:00", "benchmarks": [],
                       "machine_info": {"loadbench": {"gpu": None, "settings": {"profile": "smoke"}}}})


UNUSABLE = {  # file name (NOT_RUNS and one more): the reason the error must give
    "missing.json": "no such file", "corrupt.json": "corrupt JSON at line 1", "zero.json": "empty file",
    "foreign.json": "not made by mlp-loadbench", "no-cases.json": "a run with no training cases",
}


def _unusable(tmp_path: Path, name: str) -> tuple[Path, str]:
    return not_a_run(tmp_path, name, NOT_RUNS | {"no-cases.json": _our_run_without_cases()}), UNUSABLE[name]


@pytest.mark.parametrize("name", UNUSABLE)
def test_nothing_usable_says_why_for_the_file(tmp_path, capsys, name) -> None:
    path, reason = _unusable(tmp_path, name)
    assert report_main([str(path), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one line
    assert err.startswith("mlp-loadbench report: no mlp-loadbench runs with training cases")
    assert _says(err, path, reason)
    assert not (tmp_path / "out").exists()


def test_nothing_usable_names_every_file_and_its_reason(tmp_path) -> None:
    given = [_unusable(tmp_path, name) for name in UNUSABLE]
    with pytest.raises(ReportError) as error:
        build_report([path for path, _ in given], tmp_path / "out")
    for path, reason in given:
        assert _says(str(error.value), path, reason)


def _says(message: str, path: Path, reason: str) -> bool:
    """Whether the message names the file and then its reason, before the next file's."""
    return re.search(f"{re.escape(str(path))}: [^;]*{re.escape(reason)}", message) is not None


CASE_IDS = {"units-128", "units-256", "opt-sgd"}


def _set_epochs(info: dict, samples: list[float]) -> None:
    """Per-epoch times of one round (its first epoch apart) and the median the record derives."""
    info["epoch_seconds_by_round"] = [[2 * samples[0], *samples]]
    info["median_epoch_s"] = statistics.median(samples)


def _scores(accuracy: float, macro_f1: float):
    def change(info: dict) -> None:
        _set_epochs(info, STEADY)
        info.update(accuracy=accuracy, macro_f1=macro_f1)

    return change


def _epochs(samples: list[float]):
    return lambda info: _set_epochs(info, samples)


def _two_runs(storage: Path, tmp_path: Path, before, after) -> tuple[list[Path], Path]:
    """The newest stored run with `before` applied to each case, a later copy with `after`,
    and a budgets file."""
    budgets = tmp_path / "budgets.toml"
    budgets.write_text(BUDGETS)
    return _runs(storage, tmp_path, [before, after]), budgets


def _runs(storage: Path, tmp_path: Path, changes: list) -> list[Path]:
    """Copies of the newest stored run, a day apart, each with its change applied to every case."""
    run = json.loads(find_run_files(storage / "store")[-1].read_text())
    paths = []
    for day, change in enumerate(changes, start=1):
        copy = json.loads(json.dumps(run))
        for bench in copy["benchmarks"]:
            change(bench["extra_info"])
        paths.append(tmp_path / f"{day:04d}_run.json")
        paths[-1].write_text(json.dumps(copy | {"datetime": f"2999-01-{day:02d}T00:00:00"}))
    return paths


def _verdicts(out: Path) -> dict[str, str]:
    """case -> its "vs previous run" cell in summary.md."""
    rows = {}
    for line in (out / "summary.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 5 and cells[0] in CASE_IDS:
            rows[cells[0]] = cells[4]
    return rows


def test_a_rise_in_accuracy_and_f1_is_not_a_regression(storage, tmp_path) -> None:
    paths, budgets = _two_runs(storage, tmp_path, _scores(0.5, 0.4), _scores(0.7, 0.6))
    build_report(paths, tmp_path / "out", budgets_path=budgets)
    assert _verdicts(tmp_path / "out") == dict.fromkeys(CASE_IDS, "ok")


def test_a_drop_in_accuracy_and_f1_beyond_the_budget_is_flagged(storage, tmp_path) -> None:
    paths, budgets = _two_runs(storage, tmp_path, _scores(0.7, 0.6), _scores(0.5, 0.4))
    build_report(paths, tmp_path / "out", budgets_path=budgets)
    assert _verdicts(tmp_path / "out") == dict.fromkeys(CASE_IDS, "REGRESSED: accuracy, macro_f1")
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "- units-128, accuracy: accuracy_drop = 0.2 breaks its limit 0.03" in summary  # the rule that flagged it
    assert "- units-128, macro_f1: macro_f1_drop = 0.2 breaks its limit 0.04" in summary


def test_a_3x_slowdown_is_flagged_with_the_gates_rule(storage, tmp_path) -> None:
    paths, budgets = _two_runs(storage, tmp_path, _epochs(STEADY), _epochs([3 * s for s in STEADY]))
    build_report(paths, tmp_path / "out", budgets_path=budgets)
    assert _verdicts(tmp_path / "out") == dict.fromkeys(CASE_IDS, "REGRESSED: median_epoch_s")
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "- opt-sgd, median_epoch_s: epoch_time_ratio = 3 breaks its limit" in summary


def _traced(samples: list[float], kernels: dict[str, tuple[float, float]]):
    """Epoch times and a kernel table (name -> calls, µs per epoch) for every case."""
    def change(info: dict) -> None:
        _set_epochs(info, samples)
        info["kernel_trace"] = KernelTable.from_totals(
            "cuda", 3, {k: (3 * c, 3 * us) for k, (c, us) in kernels.items()}).to_dict()

    return change


def test_a_traced_regression_lists_the_kernels_that_grew(storage, tmp_path) -> None:
    before = {"sgemm_nn": (159, 20_000.0), "adam_kernel": (159, 4_000.0)}
    after = {**before, "planted_spin_kernel": (159, 40_000.0)}
    paths, budgets = _two_runs(storage, tmp_path, _traced(STEADY, before), _traced([3 * s for s in STEADY], after))
    build_report(paths, tmp_path / "out", budgets_path=budgets)
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert ("kernels that grew most:" in summary
            and "+40000 µs/epoch  planted_spin_kernel (new: 159 calls/epoch)" in summary)


def test_a_slowdown_the_gate_passes_is_not_marked_by_the_report(storage, tmp_path) -> None:
    # +24% on the median, but the two runs' epochs overlap: not significant, the gate passes it.
    then = [0.9, 1.0, 1.0, 1.0, 1.5, 1.6, 1.7] * 3
    now = [0.9, 1.0, 1.1, 1.24, 1.5, 1.6, 1.7] * 3
    paths, budgets = _two_runs(storage, tmp_path, _epochs(then), _epochs(now))
    before, after = (json.loads(p.read_text())["benchmarks"][0]["extra_info"] for p in paths)
    assert after["median_epoch_s"] / before["median_epoch_s"] == pytest.approx(1.24)
    budget = Budgets.load(budgets).resolve("smoke", before["experiment"], before["case"])
    assert check_against(budget=budget, current=after, baseline=before) == []  # the gate passes it
    build_report(paths, tmp_path / "out", budgets_path=budgets)
    assert _verdicts(tmp_path / "out") == dict.fromkeys(CASE_IDS, "ok")  # and so does the report


# The gate's noise rule: a slowdown must exceed the budget and k run-to-run spreads, or
# an assumed spread while too few runs tell it. +20% lies between the two.
NOISE_BUDGETS = BUDGETS + "time_noise_k = 3\ntime_noise_unknown_pct = 40\n"


def test_the_report_reads_run_to_run_noise_from_earlier_runs_like_the_gate(storage, tmp_path) -> None:
    factors = [1.0, 1.01, 0.99, 1.0, 1.2]  # four steady runs (spread ~1%), then 20% slower
    paths = _runs(storage, tmp_path, [_epochs([f * s for s in STEADY]) for f in factors])
    budgets = tmp_path / "budgets.toml"
    budgets.write_text(NOISE_BUDGETS)
    build_report(paths, tmp_path / "out", budgets_path=budgets)
    assert _verdicts(tmp_path / "out") == dict.fromkeys(CASE_IDS, "REGRESSED: median_epoch_s")
    # The gate, given the same stored runs, judges the same way.
    baseline_run, current_run = (json.loads(p.read_text()) for p in paths[-2:])
    history = load_history(paths[-2], baseline_run, paths[:-2])
    for saved, now in zip(baseline_run["benchmarks"], current_run["benchmarks"]):
        info = now["extra_info"]
        budget = Budgets.load(budgets).resolve("smoke", info["experiment"], info["case"])
        gate = check_against(budget=budget, current=info, baseline=saved["extra_info"],
                             history=case_history(history, saved["fullname"]))
        assert [f.metric for f in gate] == ["epoch_time_ratio"]
    # Without the earlier runs the spread is unknown, 40% is assumed, and +20% passes.
    build_report(paths[-2:], tmp_path / "alone", budgets_path=budgets)
    assert _verdicts(tmp_path / "alone") == dict.fromkeys(CASE_IDS, "ok")


def test_regressions_judge_each_run_against_the_one_before(storage, tmp_path) -> None:
    paths, budgets = _two_runs(storage, tmp_path, _epochs(STEADY), _epochs([3 * s for s in STEADY]))
    runs, _ = load_runs(paths)
    lines, flagged = regressions(runs, Budgets.load(budgets))
    median = statistics.median(STEADY)
    assert lines["median_epoch_s"]["units-128"] == [median, pytest.approx(3 * median)]
    assert list(flagged["median_epoch_s"]["units-128"]) == [1]  # the second run, against the first
    assert "epoch_time_ratio" in flagged["median_epoch_s"]["units-128"][1]  # the gate's message
    assert flagged["accuracy"] == {} and flagged["macro_f1"] == {}


def test_a_pareto_panel_without_data_says_why(storage) -> None:
    runs, _ = load_runs(find_run_files(storage / "store"))
    records = [b["extra_info"] for b in runs[-1].cases()]
    assert all(r["energy_j"] is None for r in records)  # a CPU run: no GPU energy counter
    time_ax, energy_ax = pareto_figure(records).axes
    assert len(time_ax.collections) == len(records)  # one point per case
    assert [t.get_text() for t in energy_ax.texts] == ["no energy data: no GPU energy counter on this run"]
    assert len(energy_ax.get_xticks()) == 0 and len(energy_ax.get_yticks()) == 0  # not an empty 0-1 axis


def _overlapping(boxes: list) -> list[tuple[int, int]]:
    return [(i, j) for i in range(len(boxes)) for j in range(i + 1, len(boxes)) if boxes[i].overlaps(boxes[j])]


def test_pareto_labels_do_not_overlap_even_when_points_crowd() -> None:
    rng = random.Random(1)
    cases = [c.id for c in all_cases() + loop_cases()]
    records = [{"case": case, "train_seconds": rng.choice([1.6, 1.62, 2.9, 5.7, 9.6]) + rng.gauss(0, 0.01),
                "accuracy": 0.755 + rng.gauss(0, 0.003), "energy_j": 400 + rng.gauss(0, 2)} for case in cases]
    fig = pareto_figure(records)
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        labels = [t for t in ax.texts if t.get_text() in cases]
        assert sorted(t.get_text() for t in labels) == sorted(cases)  # every point labelled once
        for label in labels:
            label.update_positions(renderer)
        boxes = [Text.get_window_extent(t, renderer) for t in labels]  # the words, not a leader line
        assert _overlapping(boxes) == []
        frame = ax.get_window_extent(renderer)
        assert all(frame.x0 <= b.x0 and b.x1 <= frame.x1 and frame.y0 <= b.y0 and b.y1 <= frame.y1 for b in boxes)


def _shuffled_run(storage: Path, tmp_path: Path, name: str, cases: list[str], **extra) -> Path:
    """The newest stored run with its benchmarks renamed to `cases`, in that order."""
    run = json.loads(find_run_files(storage / "store")[-1].read_text())
    template = run["benchmarks"][0]
    run["benchmarks"] = []
    for case in cases:
        bench = json.loads(json.dumps(template))
        bench["extra_info"].update(case=case, experiment=case.split("-")[0])
        bench["fullname"] = bench["name"] = f"test_cases.py::test_x[{case}]"
        run["benchmarks"].append(bench)
    path = tmp_path / name
    path.write_text(json.dumps(run | extra))
    return path


SORTED_STRINGS = ["batch-128", "batch-256", "batch-512", "batch-64", "blocks-2", "units-1024", "units-128",
                  "units-2048"]
STUDY = ["blocks-2", "units-128", "units-1024", "units-2048", "batch-64", "batch-128", "batch-256", "batch-512"]


def test_tables_and_summary_list_cases_in_study_order(storage, tmp_path) -> None:
    run = _shuffled_run(storage, tmp_path, "0001_run.json", SORTED_STRINGS)
    build_report([run], tmp_path / "out")
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert [line.split("|")[1].strip() for line in summary.splitlines()
            if line.startswith("| ") and "case" not in line] == STUDY
    tables = (tmp_path / "out" / "tables.md").read_text()
    assert re.findall(r"^## (.+)$", tables, re.MULTILINE) == ["hidden blocks", "hidden units", "batch size"]
    rows: dict[bool, list[str]] = {False: [], True: []}  # the study's tables, the step-bound tables
    bound_table = False
    for line in tables.splitlines():
        if line.startswith("| ") and not re.match(r"\| \d", line):  # a header
            bound_table = "step bound" in line
        elif re.match(r"\| \d", line):
            rows[bound_table].append(line.split("|")[1].strip())
    assert rows[False] == rows[True] == ["2", "128", "1024", "2048", "64", "128", "256", "512"]


def test_merged_shards_hold_the_cases_in_study_order(storage, tmp_path) -> None:
    shards = [_shuffled_run(storage, tmp_path, "a.json", SORTED_STRINGS[::2]),
              _shuffled_run(storage, tmp_path, "b.json", SORTED_STRINGS[1::2])]
    assert merge_main([str(tmp_path / "merged.json"), *map(str, shards)]) == 0
    merged = json.loads((tmp_path / "merged.json").read_text())
    assert [b["extra_info"]["case"] for b in merged["benchmarks"]] == STUDY


def test_the_terminal_summary_lists_cases_in_study_order(storage) -> None:
    runs, _ = load_runs(find_run_files(storage / "store"))
    info = runs[-1].cases()[0]["extra_info"]
    entries = [{"case": Case(case.split("-")[0], case.split("-")[1]), "record": info, "failures": [], "deltas": None}
               for case in SORTED_STRINGS]
    lines = "\n".join(render_summary(entries, []))
    assert [title for title in re.findall(r"^\| (hidden blocks|hidden units|batch size) ", lines, re.MULTILINE)] == [
        "hidden blocks", "hidden units", "batch size"]
    values = [line.split("|")[1].strip() for line in lines.splitlines() if re.match(r"\| \d", line)]
    assert values == ["2", "128", "1024", "2048", "64", "128", "256", "512"]


def test_merge_names_only_the_settings_that_differ(tmp_path, capsys) -> None:
    settings = {"profile": "quick", "epochs": 40, "dataset": "synthetic", "device": "cpu", "loop": "fast"}
    shards = []
    for i, changed in ((1, {}), (2, {"epochs": 8, "profile": "smoke"})):
        ours = {"gpu": None, "settings": settings | changed | {"shard": f"{i}/2"}}
        run = {"datetime": "2024-01-01T00:00:00", "commit_info": {"id": "abc"}, "benchmarks": [],
               "machine_info": {"loadbench": ours}}
        shards.append(tmp_path / f"shard-{i}.json")
        shards[-1].write_text(json.dumps(run))
    assert merge_main([str(tmp_path / "merged.json"), *map(str, shards)]) == 2
    err = capsys.readouterr().err
    assert err == (f"mlp-loadbench merge: {shards[1]}: settings differ from {shards[0]}'s: "
                   "epochs 8 vs 40, profile 'smoke' vs 'quick'\n")
    assert not (tmp_path / "merged.json").exists()


def test_settings_diff_shows_a_setting_only_one_side_has() -> None:
    assert settings_diff({"loop": "fast"}, {}) == "loop 'fast' vs (not set)"
    assert settings_diff({"a": 1}, {"a": 1}) == ""


def test_pure_helpers() -> None:
    assert list(moving_average([1, 1, 1, 1], 2)) == [1, 1, 1, 1]
    assert moving_average([0, 10, float("nan"), 10], 3)[2] == 10
    assert pareto_front([(1, 0.5), (2, 0.9), (3, 0.8), (1, 0.4)]) == [0, 1]


# ------------------------------------------- runs judged only against their like (synthetic)

SETTINGS = {"profile": "quick", "epochs": 22, "dataset": "synthetic", "device": "cuda", "loop": "fast", "impl": "torch",
            "optimizer_impl": "torch", "precision": "fp32", "shard": None, "shard_durations": None, "plant": None,
            "latency_pin": False}
GPU = H100


def _synthetic(folder: Path, n: int, slower: float = 1.0, commit: str | None = None, when: str | None = None,
               **settings: object) -> Path:
    """Run number n (a day apart, commit c<n>... unless given) of CASE_IDS on GPU, with
    `settings` over SETTINGS and every epoch `slower` times STEADY; no SM activity or
    energy counter."""
    samples = [slower * s for s in STEADY]
    load = {"normalized": {"gpu_busy": 0.8, "sm_activity": None, "cpu_process": 0.05},
            "unavailable": {"sm_activity": "GPM not supported on this GPU", "energy": "no NVML energy counter"}}
    records = {fullname(case): record(case, samples, gpu=GPU, first_epoch_s=2 * samples[0],
                                      train_seconds=2 * samples[0] + sum(samples), vram_peak_mib=120.0,
                                      energy_j=None, energy_per_epoch_j=None, load=load)
               for case in sorted(CASE_IDS)}
    return write_run(folder / f"{n:04d}_run.json", records, gpu=GPU, commit=commit or f"c{n:07d}",
                     when=when or f"2999-01-{n + 1:02d}T10:00:00", settings=SETTINGS | settings)


def _budgets(folder: Path) -> Path:
    path = folder / "budgets.toml"
    path.write_text(BUDGETS)
    return path


def _gate(paths: list[Path], budgets: Path) -> dict[str, list[str]]:
    """case -> the messages of the gate's check_against for the last run against the one
    before it, with the history the gate would load: what it flags when given that pair."""
    baseline_run, current_run = (json.loads(p.read_text()) for p in paths[-2:])
    history = load_history(paths[-2], baseline_run, paths[:-2])
    out = {}
    for saved, now in zip(baseline_run["benchmarks"], current_run["benchmarks"]):
        info = now["extra_info"]
        budget = Budgets.load(budgets).resolve("quick", info["experiment"], info["case"])
        failures = check_against(budget=budget, current=info, baseline=saved["extra_info"],
                                 history=case_history(history, saved["fullname"]))
        out[info["case"]] = [f.message for f in failures]
    return out


def test_a_planted_run_is_not_judged_against_unplanted_runs(tmp_path) -> None:
    paths = [_synthetic(tmp_path, 0), _synthetic(tmp_path, 1), _synthetic(tmp_path, 2, slower=2.5, plant="150%:host")]
    budgets = _budgets(tmp_path)
    gate = _gate(paths, budgets)  # the gate's rules on the planted pair would flag every case...
    assert all(messages and messages[0].startswith("epoch_time_ratio = 2.5 breaks") for messages in gate.values())
    build_report(paths, tmp_path / "out", budgets_path=budgets)  # ...the report skips it on purpose
    why = "no earlier run with the same settings (plant 150%:host; the run before: plant unset)"
    assert _verdicts(tmp_path / "out") == dict.fromkeys(CASE_IDS, f"not gated: {why}")
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "\n**Planted run**: --plant-slowdown 150%:host slowed every timed epoch on purpose" in summary
    assert f"Not gated: {why}." in summary and "REGRESSED" not in summary
    runs, _ = load_runs(paths)
    _, flagged = regressions(runs, Budgets.load(budgets))
    assert all(cases == {} for cases in flagged.values())


def test_a_run_with_other_epochs_is_not_judged_against_the_runs_before(tmp_path) -> None:
    paths = [_synthetic(tmp_path, 0), _synthetic(tmp_path, 1), _synthetic(tmp_path, 2, slower=3.0, epochs=8)]
    budgets = _budgets(tmp_path)
    assert all(messages for messages in _gate(paths, budgets).values())  # the pair's rules alone would flag it
    build_report(paths, tmp_path / "out", budgets_path=budgets)
    why = "no earlier run with the same settings (epochs 8; the run before: epochs 22)"
    assert _verdicts(tmp_path / "out") == dict.fromkeys(CASE_IDS, f"not gated: {why}")


def test_an_unplanted_run_is_judged_against_the_unplanted_run_before_the_planted_one(tmp_path) -> None:
    # Against the planted run (2.5x) a 2.5x slower run looks steady; against its like it is 2.5x slower.
    paths = [_synthetic(tmp_path, 0), _synthetic(tmp_path, 1, slower=2.5, plant="150%:host"),
             _synthetic(tmp_path, 2, slower=2.5)]
    budgets = _budgets(tmp_path)
    build_report(paths, tmp_path / "out", budgets_path=budgets)
    assert _verdicts(tmp_path / "out") == dict.fromkeys(CASE_IDS, "REGRESSED: median_epoch_s")
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert ("Judged against c0000000 2999-01-01 10:00:00, the newest earlier run on this GPU with the same settings"
            in summary)
    gate = _gate([paths[0], paths[2]], budgets)
    assert f"- units-128, median_epoch_s: {gate['units-128'][0]}" in summary  # the gate's own message


def test_planted_runs_are_judged_against_runs_planted_alike(tmp_path) -> None:
    paths = [_synthetic(tmp_path, 0), _synthetic(tmp_path, 1, slower=2.5, plant="150%:host"), _synthetic(tmp_path, 2),
             _synthetic(tmp_path, 3, slower=2.5, plant="150%:host")]
    build_report(paths, tmp_path / "out", budgets_path=_budgets(tmp_path))
    assert _verdicts(tmp_path / "out") == dict.fromkeys(CASE_IDS, "ok")
    assert ("Judged against c0000001 2999-01-02 10:00:00, planted +150% (host), the newest"
            in (tmp_path / "out" / "summary.md").read_text())


def test_a_real_slowdown_between_runs_with_the_same_settings_is_flagged_with_the_gates_message(tmp_path) -> None:
    paths = [_synthetic(tmp_path, 0), _synthetic(tmp_path, 1), _synthetic(tmp_path, 2, slower=2.5)]
    budgets = _budgets(tmp_path)
    build_report(paths, tmp_path / "out", budgets_path=budgets)
    assert _verdicts(tmp_path / "out") == dict.fromkeys(CASE_IDS, "REGRESSED: median_epoch_s")
    summary = (tmp_path / "out" / "summary.md").read_text()
    for case, messages in _gate(paths, budgets).items():
        assert f"- {case}, median_epoch_s: {messages[0]}" in summary


def test_a_first_run_is_not_gated_and_says_so(tmp_path) -> None:
    build_report([_synthetic(tmp_path, 0)], tmp_path / "out", budgets_path=_budgets(tmp_path))
    assert _verdicts(tmp_path / "out") == dict.fromkeys(CASE_IDS, "not gated: first run on this GPU")


def _without(path: Path, case: str) -> Path:
    run = json.loads(path.read_text())
    run["benchmarks"] = [b for b in run["benchmarks"] if b["extra_info"]["case"] != case]
    path.write_text(json.dumps(run))
    return path


def test_a_case_new_in_this_run_is_not_gated(tmp_path) -> None:
    first = _without(_synthetic(tmp_path, 0), "opt-sgd")
    build_report([first, _synthetic(tmp_path, 1)], tmp_path / "out", budgets_path=_budgets(tmp_path))
    verdicts = _verdicts(tmp_path / "out")
    assert verdicts["opt-sgd"] == "not gated: no earlier run of this case with the same settings"
    assert verdicts["units-128"] == "ok"


def test_a_case_left_out_of_the_run_before_is_judged_against_the_newest_run_holding_it(tmp_path) -> None:
    """A run of part of the matrix (the experiments alone, say) does not hide the history of
    the rest: a case is judged against the newest earlier comparable run that holds it."""
    paths = [_synthetic(tmp_path, 0), _without(_synthetic(tmp_path, 1), "opt-sgd"), _synthetic(tmp_path, 2)]
    build_report(paths, tmp_path / "out", budgets_path=_budgets(tmp_path))
    assert (_verdicts(tmp_path / "out")["opt-sgd"]
            == "ok (against c0000000 2999-01-01 10:00:00, the newest run holding it)")
    slow = _synthetic(tmp_path, 2, slower=1.5)  # run 2 again, every epoch 50% slower
    build_report(paths[:2] + [slow], tmp_path / "slow", budgets_path=_budgets(tmp_path))
    assert _verdicts(tmp_path / "slow")["opt-sgd"].startswith("REGRESSED: median_epoch_s")


def test_reruns_of_one_commit_get_distinct_labels(tmp_path) -> None:
    commit = "abcdef12" + "0" * 32
    paths = [_synthetic(tmp_path, n, commit=commit, when=when) for n, when in
             enumerate(["2999-01-01T10:00:05", "2999-01-01T10:00:41", "2999-01-01T10:00:41"])]
    build_report(paths, tmp_path / "out", budgets_path=_budgets(tmp_path))
    runs, _ = load_runs(paths)
    labels = run_labels(runs)
    assert labels == ["abcdef12 2999-01-01 10:00:05", "abcdef12 2999-01-01 10:00:41 #1",
                      "abcdef12 2999-01-01 10:00:41 #2"]
    assert len(set(tick_labels(runs))) == 3
    assert (tmp_path / "out" / "summary.md").read_text().startswith(f"## mlp-loadbench: {GPU}, {labels[-1]}\n")


def _tables(tmp_path: Path, **settings: object) -> str:
    build_report([_synthetic(tmp_path, 0, **settings)], tmp_path / "out", budgets_path=_budgets(tmp_path))
    return (tmp_path / "out" / "tables.md").read_text()


def test_tables_say_what_n_a_and_time_mean(tmp_path) -> None:
    tables = _tables(tmp_path)
    assert "| n/a " in tables  # SM activity and energy were not measured
    assert ("n/a: not measured on this machine (sm_activity: GPM not supported on this GPU; energy: no NVML energy "
            "counter), or not recorded by this run.") in tables
    assert "Time(s) is the whole training of the case (its last timed round, where the profile times several): " \
           "every epoch, the first included" in tables


def test_the_settings_line_leaves_unset_settings_out(tmp_path) -> None:
    tables = _tables(tmp_path)
    line = next(line for line in tables.splitlines() if line.startswith("Settings: "))
    assert "None" not in line and "shard" not in line and "plant" not in line
    assert line.startswith("Settings: profile quick, epochs 22, dataset synthetic, device cuda, loop fast")
    assert "latency_pin False" in line  # False is a setting, not an unset one


def test_tables_of_a_planted_run_say_so(tmp_path) -> None:
    tables = _tables(tmp_path, plant="150%:host")
    assert "plant 150%:host" in next(line for line in tables.splitlines() if line.startswith("Settings: "))
    assert "**Planted run**: --plant-slowdown 150%:host slowed every timed epoch on purpose" in tables


def test_the_help_says_how_regressions_are_judged_and_what_the_exit_codes_mean(capsys) -> None:
    with pytest.raises(SystemExit):
        report_main(["--help"])
    shown = " ".join(capsys.readouterr().out.split())  # the epilog's lines joined
    assert "Regressions: each run is judged by the gate's own rules" in shown
    assert "compare.same_measurement" in shown and '"not gated"' in shown
    assert "Exit codes: 0 the report was written, regressions or not" in shown
    assert "1 nothing to report" in shown and "2 a bad command line or budgets file" in shown


def test_a_bad_budgets_file_is_one_line_and_exit_2(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[defaults]\ntime_slower_pc = 10\n")
    assert report_main([str(_synthetic(tmp_path, 0)), "--out", str(tmp_path / "out"), "--budgets", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"mlp-loadbench report: --budgets {bad}: [defaults]: unknown key 'time_slower_pc'")
    assert not (tmp_path / "out").exists()


def test_an_out_that_is_a_file_or_cannot_be_made_is_one_line_and_exit_2(tmp_path, capsys) -> None:
    run = _synthetic(tmp_path, 0)
    (tmp_path / "a-file").write_text("in the way\n")
    for out, said in ((tmp_path / "a-file", "is a file; give a directory"),
                      (tmp_path / "a-file" / "sub", f"{tmp_path / 'a-file'} is a file, not a directory"),
                      (Path("/proc/nope/out"), "cannot be written (")):
        assert report_main([str(run), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"mlp-loadbench report: --out {out}: {said}"), err
    assert (tmp_path / "a-file").read_text() == "in the way\n"


def test_the_out_check_leaves_no_folder_when_there_is_nothing_to_report(tmp_path, capsys) -> None:
    path, _ = _unusable(tmp_path, "corrupt.json")
    assert report_main([str(path), "--out", str(tmp_path / "new" / "out")]) == 1
    assert not (tmp_path / "new").exists()
    assert report_main([str(_synthetic(tmp_path, 0)), "--out", str(tmp_path / "new" / "out")]) == 0
    assert (tmp_path / "new" / "out" / "tables.md").is_file()
