"""bench/tools/rows.py: a gated run's row, appended once."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from bench.tools.rows import COLUMNS
from bench.tools.rows import append_rows
from bench.tools.rows import gate_row
from bench.tools.rows import main


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
