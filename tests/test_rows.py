"""bench/tools/rows.py: each kind's rows built from a tool's result, appended once."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from bench.tools.rows import COLUMNS
from bench.tools.rows import COMMON
from bench.tools.rows import KINDS
from bench.tools.rows import loop_rows
from bench.tools.rows import RowsError
from bench.tools.rows import append_rows
from bench.tools.rows import cell_rows
from bench.tools.rows import cpu_name
from bench.tools.rows import csv_problem
from bench.tools.rows import experiment_rows
from bench.tools.rows import gate_row
from bench.tools.rows import main
from bench.tools.rows import measured_here
from bench.tools.rows import phase_rows
from bench.tools.rows import read_rows
from bench.tools.rows import serving_rows
from bench.tools.rows import tier_row


def run(plant: str | None = None) -> dict:
    def bench(name: str, status: str | None, paired: dict | None = None) -> dict:
        verdict = {"status": status, "failures": [], **({"paired": paired} if paired else {})} if status else None
        return {"fullname": name, "extra_info": {"verdict": verdict} if verdict else {}}

    return {
        "datetime": "2026-11-29T04:03:12+00:00", "commit_info": {"id": "0123456789abcdef", "dirty": False},
        "machine_info": {"loadbench": {"format": 3, "gpu": {"name": "NVIDIA H200"},
                                       "settings": {"profile": "quick", "plant": plant, "kernel_caches": "warm"},
                                       "run": {"state": "complete"}}},
        "benchmarks": [bench("a", "ok"), bench("b", "ok", {"confirmed": False}),
                       bench("c", "regressed", {"confirmed": True}), bench("d", "regressed"), bench("e", None)],
    }


def test_a_row_counts_the_verdicts_and_what_the_paired_runs_decided() -> None:
    row = gate_row(run("5%:gpu"), "runs/x.json", "planted")
    assert set(row) == set(COLUMNS)
    assert (row["card"], row["commit"], row["plant"], row["cases"]) == ("NVIDIA H200", "0123456789ab", "5%:gpu", 5)
    assert (row["ok"], row["regressed"], row["no_verdict"]) == (2, 2, 1)
    # red in the first run: the two paired cases and the regression nothing paired
    assert (row["first_run_red"], row["paired_confirmed"], row["paired_cleared"]) == (3, 1, 1)
    assert row["gate"] == "red" and row["run_state"] == "complete" and row["note"] == "planted"
    green = run()
    green["benchmarks"] = green["benchmarks"][:2]
    assert gate_row(green, "runs/y.json")["gate"] == "green"


def test_rows_are_appended_once(tmp_path: Path) -> None:
    path = tmp_path / "rows" / "gate.csv"
    first = gate_row(run(), "a.json")
    assert append_rows(path, [first]) == 1
    assert append_rows(path, [first]) == 0  # the same run again adds nothing
    later = {**first, "date": "2026-11-30T00:00:00+00:00"}
    assert append_rows(path, [later]) == 1
    rows = list(csv.DictReader(path.open()))
    assert [r["date"] for r in rows] == [first["date"], later["date"]] and list(rows[0]) == list(COLUMNS)


def test_the_command_refuses_a_file_that_is_not_a_run(tmp_path: Path, capsys) -> None:
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(run()))
    bad.write_text("{")
    assert main([str(good), "--csv", str(tmp_path / "rows.csv")]) == 0
    capsys.readouterr()
    assert main([str(bad), "--csv", str(tmp_path / "rows.csv")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"mlp-loadbench rows: run {bad}: corrupt JSON") and err.count("\n") == 1


def test_every_kind_opens_with_where_and_when_and_closes_with_its_source() -> None:
    for kind in KINDS.values():
        assert set(COMMON) <= set(kind.fields) and kind.fields[-2:] == ("source", "note"), kind.stem
        assert len(set(kind.fields)) == len(kind.fields)
    assert list(KINDS) == ["tier-times", "experiments", "loops", "kernel-cells", "step-phases", "step-budget",
                           "step-builds", "serving", "data-parallel", "selftest", "gate-runs"]


def filled(row: dict) -> None:
    for column in (*COMMON, "source"):
        assert row[column] not in ("", None), (column, row)


def test_a_run_without_a_gpu_names_its_cpu() -> None:
    cpu = run()
    cpu["machine_info"]["loadbench"]["gpu"] = None
    cpu["machine_info"]["cpu"] = {"brand_raw": "AMD EPYC 9654"}
    assert gate_row(cpu, "a.json")["card"] == "CPU AMD EPYC 9654"
    cpu["machine_info"].pop("cpu")
    assert gate_row(cpu, "a.json")["card"] == cpu_name() and cpu_name().startswith("CPU ")


def test_tier_experiment_and_serving_rows_from_a_stored_run(tmp_path: Path) -> None:
    stored = run()
    stored["machine_info"]["loadbench"]["settings"] |= {"tier": "pr", "precision": "fp32",
                                                        "kernel_caches": "cold (emptied for this session)"}
    stored["benchmarks"] = [
        {"extra_info": {"case": "units-128", "experiment": "units", "loop_ran": "graph", "median_epoch_s": 0.123456,
                        "first_epoch_s": 2.5, "vram_peak_mib": 40.0, "accuracy": 0.9, "train_seconds": 7.123,
                        "load": {"normalized": {"gpu_busy": 0.5, "sm_activity": None}}}},
        {"extra_info": {"kind": "inference", "case": "units-128", "variant": "fp16", "impl": "triton",
                        "latency_mode": "graph", "latency_graph_s": {"p50": 20e-6, "p99": 31e-6},
                        "throughput": {"1": 5e4, "4096": 9.5e7, "64": "n/a"}, "accuracy_drop": 0.0004,
                        "speedup": 1.5, "energy_j_per_1k": 0.00325}},
    ]
    (tier,) = [tier_row(stored, "ci pr", 147.04, "ci-out/run.json", pytest_s=139.96)]
    assert (tier["command"], tier["tier"], tier["cases"], tier["pytest_s"], tier["wall_s"], tier["caches"]) == (
        "ci pr", "pr", 2, 140.0, 147.0, "cold")
    (trained,) = experiment_rows(stored, "r.json")
    assert (trained["case"], trained["profile"], trained["loop"], trained["median_epoch_s"], trained["train_s"],
            trained["gpu_busy"], trained["sm_activity"]) == ("units-128", "quick", "graph", 0.1235, 7.12, 0.5, "")
    (served,) = serving_rows(stored, "r.json")
    assert (served["p50_us"], served["p99_us"], served["batch"], served["samples_per_s"]) == (20.0, 31.0, "4096",
                                                                                              95000000)
    assert (served["drop_pts"], served["mj_per_1k"]) == (0.04, 3.25)
    for row, stem in ((tier, "tier-times"), (trained, "experiments"), (served, "serving")):
        filled(row)
        assert append_rows(tmp_path / f"{stem}.csv", [row]) == 1
        assert append_rows(tmp_path / f"{stem}.csv", [row]) == 0


def test_cell_and_phase_rows_carry_where_they_were_measured(tmp_path: Path) -> None:
    where = measured_here(cpu_name(), "empty", Path(__file__).parent)
    assert where["card"].startswith("CPU ") and where["date"] and where["commit"] != ""
    result = {"cells": [{"precision": "bf16", "batch": 512, "width": 512, "activation": "silu",
                         "times_ms": {"torch_graph_ms": 0.2, "compile_graph_ms": None, "triton_graph_ms": 0.1},
                         "speedup_graph_vs_torch": 2.0, "speedup_graph_vs_compile": None,
                         "best_baseline": "torch_graph", "speedup_vs_best": 2.0}]}
    (cell,) = cell_rows(result, where, "cells.json")
    assert (cell["mode"], cell["torch_us"], cell["compile_us"], cell["ours_us"]) == ("graph", 200.0, "", 100.0)
    assert (cell["speedup_vs_torch"], cell["speedup_vs_compile"]) == (2.0, "")
    setup = {"precision": "fp32", "depth": 3, "width": 512, "batch": 512, "blocks": "Blocks(m=16)"}
    phases = phase_rows(setup, 41.234, [("F_0", 3.1, 0.4, 3.2), ("last", 2.0, None, 41.0)], where, "python -m x",
                        inner={"F_1 product": (3.6, 4.1)})
    assert [(p["phase"], p["barrier_us"], p["done_us"], p["step_us"]) for p in phases[:2]] == [
        ("F_0", 0.4, 3.2, 41.23), ("last", "", 41.0, 41.23)]
    assert (phases[2]["phase"], phases[2]["work_us"]) == ("in F_1: product", 3.6)
    assert "slowest 4.1" in phases[2]["note"]
    for rows, stem in (([cell], "kernel-cells"), (phases, "step-phases")):
        for row in rows:
            filled(row)
        assert append_rows(tmp_path / f"{stem}.csv", rows) == len(rows)
    header, read = read_rows(tmp_path / "step-phases.csv")
    assert header == KINDS["step-phases"].fields and read[0]["card"] == where["card"]


def test_a_row_of_another_kind_or_a_file_of_another_header_is_refused(tmp_path: Path) -> None:
    row = tier_row(run(), "ci pr", 1.0, "a.json")
    with pytest.raises(RowsError, match="serving.csv: a serving row needs the columns"):
        append_rows(tmp_path / "serving.csv", [row])
    (tmp_path / "tier-times.csv").write_text("date,card\n1,2\n")
    with pytest.raises(RowsError, match="tier-times.csv: its header is not that of tier-times"):
        append_rows(tmp_path / "tier-times.csv", [row])


def test_the_command_appends_the_rows_of_the_kind_asked_for(tmp_path: Path, capsys) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run()))
    assert main([str(path), "--csv", str(tmp_path / "gate-runs.csv")]) == 0
    with pytest.raises(SystemExit) as exc:
        main([str(path), "--kind", "serving", "--csv", str(tmp_path / "gate-runs.csv")])
    assert exc.value.code == 2 and "gate-runs.csv: its header is not that of serving" in capsys.readouterr().err
    assert main([str(path), "--kind", "experiments", "--csv", str(tmp_path / "experiments.csv")]) == 0
    assert "appended 0 of 0 row(s)" in capsys.readouterr().out  # a run of verdicts only: no training records


def test_a_measuring_tool_refuses_an_unusable_csv_before_it_measures(tmp_path: Path, capsys) -> None:
    from bench.tools import ci
    from bench.tools import step_phases

    wrong = tmp_path / "other.csv"
    wrong.write_text("date,card\n")
    assert csv_problem(tmp_path / "new.csv", KINDS["tier-times"]) is None
    assert csv_problem(tmp_path, KINDS["tier-times"]) == "is a directory; give the CSV file"
    for flag, command in (
        ("--tier-rows", lambda: ci.parse_args(["pr", "--out", str(tmp_path / "out"), "--tier-rows", str(wrong)])),
        ("--rows", lambda: step_phases.main(["--rows", str(wrong)])),  # before it asks for a GPU
    ):
        with pytest.raises(SystemExit) as exc:
            command()
        assert exc.value.code == 2 and f"{flag} {wrong}: its header is not" in capsys.readouterr().err


def loop_run(impl: str, median: float) -> dict:
    config = {"loop": "graph", "impl": impl, "optimizer_impl": "triton" if impl == "triton" else "torch",
              "precision": "tf32", "depth": 3, "width": 512, "batch_size": 512, "activation": "leaky_relu",
              "optimizer": "adam", "epochs": 40}
    info = {"config": config, "median_epoch_s": median, "first_epoch_s": 7.0, "profile": "quick",
            "dataset": {"train_frames": 81396}, "kernel_caches": "warm", "step_route": "fused-step"}
    return {"datetime": "2026-11-29T06:31:00+00:00", "commit_info": {"id": "0123456789abcdef"},
            "machine_info": {"loadbench": {"format": 3, "gpu": {"name": "NVIDIA H200"}, "settings": {}}},
            "benchmarks": [{"fullname": f"x[{impl}]", "extra_info": info}]}


def test_a_loop_row_names_its_step_and_the_compiled_step_beside_it() -> None:
    rows = loop_rows([(loop_run("compile", 0.0262), "compile.json"), (loop_run("triton", 0.01125), "fused.json")])
    fused = next(r for r in rows if r["loop"] == "graph/triton/triton")
    assert fused["step_us"] == round(0.01125 / 159 * 1e6, 1)  # 81396 frames, 512 a step
    assert fused["against"] == "graph/compile/torch" and fused["ratio"] == round(0.0262 / 0.01125, 3)
    assert next(r for r in rows if r["loop"] == "graph/compile/torch")["against"] == ""  # not its own peer
    filled(fused)
