"""The report's inference views, from golden files: a run holding serving records
(tests/data/inference-run.json, the shape bench/test_inference.py stores) and a search
result (tests/data/search-small.json, written by python -m bench.search on a fake)."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from matplotlib.text import Text

from bench.figures.serving import inference_figure
from bench.figures.serving import record_p99
from bench.figures.serving import search_figure
from bench.tools.report import build_report
from bench.tools.report import main as report_main
from bench.gate.runs import load_runs

DATA = Path(__file__).resolve().parent / "data"
RUN = DATA / "inference-run.json"
SEARCH = DATA / "search-small.json"


def texts(fig) -> list[str]:  # type: ignore[no-untyped-def]
    return [t.get_text() for ax in fig.axes for t in ax.findobj(Text)]


def test_serving_records_are_not_training_cases() -> None:
    (run,), warnings = load_runs([RUN])
    assert not warnings and run.cases() == []
    records = run.inference_records()
    assert len(records) == 12 and [r["case"] for r in records[:4]] == ["blocks-3"] * 4  # study order


def test_the_inference_view_marks_the_front_on_latency_and_energy() -> None:
    (run,), _ = load_runs([RUN])
    fig = inference_figure(run.inference_records())
    latency_ax, energy_ax = fig.axes
    assert (latency_ax.get_xlabel() == "batch-1 p99 latency (µs)"
            and energy_ax.get_xlabel().startswith("energy per 1,000"))
    front = [line for line in latency_ax.get_lines() if line.get_label() == "Pareto front"]
    xs = sorted(front[0].get_xdata())
    # graph p99 where measured: units-128 int8-dynamic is the fastest point of the run
    assert xs[0] == round(19e-6 * 0.7, 9) * 1e6
    labels = [t.get_text() for t in latency_ax.texts]
    assert "units-128 int8-dynamic torch" in labels and not any("prune-90" in t for t in labels)  # off the front
    assert len(labels) == len(xs)  # only front points are labelled


def test_costs_spanning_orders_of_magnitude_get_a_log_axis() -> None:
    """Eager dynamic int8 at milliseconds beside graph replays at microseconds."""
    (run,), _ = load_runs([RUN])
    records = run.inference_records()
    assert inference_figure(records).axes[0].get_xscale() == "linear"
    slow = [dict(r, latency_graph_s=None, latency_eager_s={"p50": 0.01, "p99": 0.02, "max": 0.03}) for r in records[:1]]
    latency_ax = inference_figure(slow + records[1:]).axes[0]
    assert latency_ax.get_xscale() == "log" and latency_ax.get_xlabel().endswith("log scale")


def test_an_inference_panel_without_energy_says_why() -> None:
    (run,), _ = load_runs([RUN])
    records = [dict(r, energy_j_per_1k=None, latency_graph_s=None) for r in run.inference_records()]
    fig = inference_figure(records)
    assert "no energy data: no GPU energy counter (NVML) on this run" in texts(fig)
    assert record_p99(records[0]) == run.inference_records()[0]["latency_eager_s"]["p99"]  # eager where no graph


def test_the_search_view_draws_objectives_front_and_presets() -> None:
    summary = json.loads(SEARCH.read_text())
    fig = search_figure(summary)
    objectives, accuracy, energy = fig.axes
    assert objectives.get_xlabel() == "batch-1 p99 latency (µs)"
    assert objectives.get_ylabel().startswith("time per 1,000 inferences")
    labels = [t.get_text() for t in objectives.texts]
    assert "fp32" in labels and "prune-90" in labels  # presets labelled
    front = [r for r in summary["trials"] if r["on_front"]]
    assert all((r["preset"] or f"#{r['number']} {r['label']}") in labels for r in front)
    shown = " ".join(" ".join(texts(fig)).split())  # the reason is wrapped to fit its panel
    assert "no energy data in this search: no energy counter here (no NVML energy counter: device is cpu)" in shown


def test_the_search_view_with_energy_draws_its_third_panel() -> None:
    summary = copy.deepcopy(json.loads(SEARCH.read_text()))
    for row in summary["trials"]:
        if row["values"]:
            row["energy_j_per_1k"] = row["values"]["time_per_1k_s"] * 1e3
    fig = search_figure(summary)
    assert fig.axes[2].get_xlabel() == "energy per 1,000 inferences (J)" and fig.axes[2].collections


def test_a_search_without_measured_trials_says_so() -> None:
    summary = json.loads(SEARCH.read_text())
    summary["trials"] = [dict(r, values=None, state="pruned") for r in summary["trials"]]
    assert texts(search_figure(summary)).count("no measured trial in this search") == 3


def test_report_from_serving_records_and_a_search_alone(tmp_path, capsys) -> None:
    out = tmp_path / "reports"
    assert report_main([str(RUN), "--search", str(SEARCH), "--out", str(out)]) == 0
    names = {p.name for p in out.iterdir()}
    assert names == {"inference.png", "serving.md", "search-golden.png"}  # no training cases: no tables or history
    assert "skipped" not in capsys.readouterr().err


def test_report_skips_a_bad_search_file_with_a_warning(tmp_path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"benchmarks": []}))
    written, warnings = build_report([RUN], tmp_path / "r", searches=[bad, tmp_path / "none.json"])
    assert [p.name for p in written] == ["inference.png", "serving.md"]
    assert f"skipped {bad}: not a search result of python -m bench.search" in warnings
    assert f"skipped {tmp_path / 'none.json'}: no such file" in warnings


def test_report_with_nothing_usable_still_says_why(tmp_path, capsys) -> None:
    empty = tmp_path / "run.json"
    data = json.loads(RUN.read_text())
    data["benchmarks"] = []
    empty.write_text(json.dumps(data))
    assert report_main([str(empty), "--out", str(tmp_path / "r")]) == 1
    assert "no training cases" in capsys.readouterr().err


def test_training_and_serving_in_one_run_each_go_to_their_view(tmp_path) -> None:
    """A run holding both: the serving records never reach the study's tables."""
    data = json.loads(RUN.read_text())
    training = shutil.copy(RUN, tmp_path / "mixed.json")
    data["benchmarks"].append({"fullname": "t[blocks-3]", "name": "t", "stats": {"median": 1.0}, "extra_info": {
        "case": "blocks-3", "experiment": "blocks", "accuracy": 0.75, "macro_f1": 0.72, "median_epoch_s": 0.04}})
    Path(training).write_text(json.dumps(data))
    (run,), _ = load_runs([Path(training)])
    assert [b["extra_info"]["case"] for b in run.cases()] == ["blocks-3"] and len(run.inference_records()) == 12


def test_the_inference_view_joins_the_serving_runs_of_the_newest_commit(tmp_path) -> None:
    """A matrix served a configuration at a time: the runs of one commit and GPU make one
    view, a case served twice shows its newer record, another commit stays out."""
    from bench.tools.report import records_of
    from bench.tools.report import serving_runs

    data = json.loads(RUN.read_text())

    def run_file(name: str, commit: str, when: str, case: str | None, first_accuracy: float | None = None) -> Path:
        copied = copy.deepcopy(data)
        copied["commit_info"]["id"], copied["datetime"] = commit, when
        for i, bench in enumerate(copied["benchmarks"]):
            if first_accuracy is not None and i == 0:
                bench["extra_info"]["accuracy"] = first_accuracy  # the same case as in the first run
            elif case is not None:
                bench["extra_info"]["case"] = case
        path = tmp_path / name
        path.write_text(json.dumps(copied))
        return path

    first = run_file("a.json", "aaaa111", "2026-01-02T03:00:00", None)
    second = run_file("b.json", "aaaa111", "2026-01-02T04:00:00", "units-1024", first_accuracy=0.5)
    other = run_file("c.json", "bbbb222", "2026-01-01T00:00:00", "act-silu")
    runs, _ = load_runs([first, second, other])
    records = records_of(serving_runs(runs))
    original = json.loads(RUN.read_text())["benchmarks"][0]["extra_info"]

    def key(r: dict[str, Any]) -> tuple[str, str, str]:
        return (r["case"], r["variant"], r["impl"])

    expected = {key(r) for run in runs[1:] for r in run.inference_records()}  # the two runs of aaaa111
    assert sorted(map(key, records)) == sorted(expected) and len(expected) > 12
    assert not any(r["case"] == "act-silu" for r in records)
    same = [r for r in records if key(r) == key(original)]
    assert [r["accuracy"] for r in same] == [0.5]  # the newer run's record
    written, _ = build_report([first, second, other], tmp_path / "r")
    assert [p.name for p in written] == ["inference.png", "serving.md"]
    assert "| units-1024 " in (tmp_path / "r" / "serving.md").read_text()  # both runs in the table too
    unknown = run_file("d.json", "aaaa111", "2026-01-03T00:00:00", "batch-64")
    raw = json.loads(unknown.read_text())
    raw.pop("commit_info")
    unknown.write_text(json.dumps(raw))
    runs, _ = load_runs([first, second, unknown])
    assert {r["case"] for r in records_of(serving_runs(runs))} == {"batch-64"}  # alone: no commit to join by


def test_serving_commits_join_a_matrix_served_at_several_commits(tmp_path, capsys) -> None:
    """Parts of one matrix served at commits that did not change serving: named on the
    command line, their runs make one view, and serving.md says which commit gave what."""
    data = json.loads(RUN.read_text())

    def run_file(name: str, commit: str, when: str, case: str) -> Path:
        copied = copy.deepcopy(data)
        copied["commit_info"]["id"], copied["datetime"] = commit, when
        for bench in copied["benchmarks"]:
            bench["extra_info"]["case"] = case
        path = tmp_path / name
        path.write_text(json.dumps(copied))
        return path

    files = [run_file("a.json", "aaaa111", "2026-01-01T00:00:00", "units-512"),
             run_file("b.json", "bbbb222", "2026-01-02T00:00:00", "act-silu"),
             run_file("c.json", "cccc333", "2026-01-03T00:00:00", "batch-64")]
    out = tmp_path / "r"
    assert report_main([*map(str, files), "--out", str(out), "--serving-commits", "aaaa,bbbb222cafe"]) == 0
    table = (out / "serving.md").read_text()
    assert "commits aaaa111 (1 configuration), bbbb222 (1 configuration)" in table
    assert "| units-512 " in table and "| act-silu " in table and "batch-64" not in table
    capsys.readouterr()
    assert report_main([*map(str, files), "--out", str(out), "--serving-commits", "aaaa,dddd"]) == 0
    assert "--serving-commits dddd: no serving run of that commit among the runs read" in capsys.readouterr().err
    assert report_main([*map(str, files), "--out", str(tmp_path / "none"), "--serving-commits", "dddd"]) == 1
    err = capsys.readouterr().err
    assert ("--serving-commits dddd: no serving run of these commits (serving runs read: aaaa111, bbbb222, cccc333)"
            in err)
    assert not (tmp_path / "none").exists()
    with pytest.raises(SystemExit):
        report_main([*map(str, files), "--out", str(out), "--serving-commits", "a5,not-a-commit"])
    assert "give commit ids of at least 4 hex digits" in capsys.readouterr().err


def test_the_serving_table_has_a_row_per_configuration_and_names_the_best_variant() -> None:
    from bench.tools.serving import serving_markdown
    from bench.tools.serving import serving_rows

    (run,), _ = load_runs([RUN])
    records = run.inference_records()
    rows = {row[0]: row for row in serving_rows(records)}
    assert list(rows) == ["blocks-3", "units-128", "units-2048"]  # the study's order
    blocks = rows["blocks-3"]
    assert blocks[1] == "22.4 / 28.0 (graph)" and blocks[2] == blocks[3] == "n/a"  # torch only in this run
    assert blocks[4] == "9.0 M at 4096"
    # int8-dynamic is fastest within a point (drop 0.4); prune-90 (drop 4.1 points) is not eligible
    assert blocks[5:8] == ["int8-dynamic torch", "2.10x", "+0.40"] and blocks[8] == "600.00 / 350.00"
    assert serving_rows(records, max_drop=0.002)[0][5] == "bf16 torch"  # a tighter limit: drop 0.1 point only
    eager = [dict(r, latency_graph_s=None, energy_j_per_1k=None) for r in records]
    row = serving_rows(eager)[0]
    assert row[1] == "84.0 / 112.0 (eager)" and row[8] == "n/a / n/a"  # never a zero for what was not measured
    none = serving_rows([dict(r, accuracy_drop=None) for r in records])[0]
    assert none[5] == "none within the limit"
    text = serving_markdown(records, "NVIDIA H100 80GB HBM3, commit 01234567")
    assert text.startswith("# Serving: NVIDIA H100 80GB HBM3") and "12 serving records" in text


def test_the_serving_command_prints_the_table_and_appends_a_row_per_record(tmp_path, capsys) -> None:
    from bench.tools.rows import read_rows
    from bench.tools.serving import main as serving_main

    rows = tmp_path / "serving.csv"
    assert serving_main([str(RUN), "--rows", str(rows)]) == 0
    assert "# Serving: " in capsys.readouterr().out
    _, written = read_rows(rows)
    assert len(written) == 12 and {row["source"] for row in written} == {str(RUN)}
    for row in written:
        assert row["date"] and row["card"] and row["commit"] and row["caches"]
    assert serving_main([str(RUN), "--rows", str(rows)]) == 0
    assert len(read_rows(rows)[1]) == 12  # the same run again adds nothing
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    assert serving_main([str(bad)]) == 2
    assert capsys.readouterr().err.startswith(f"mlp-loadbench serving: run {bad}")
