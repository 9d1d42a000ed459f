"""bench/tools/bench_cells.py on the CPU: a measured cell becomes a kernel-cells row."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from bench.tools.rows import KINDS


@pytest.mark.interpreter
def test_a_cell_measured_through_the_interpreter_is_a_row_naming_the_cpu(tmp_path: Path) -> None:
    from bench.tools import bench_cells

    rows, out = tmp_path / "kernel-cells.csv", tmp_path / "cells.json"
    argv = ["--device", "cpu", "--skip-tuning-phase", "--batches", "64", "--widths", "128", "--precisions", "fp32",
            "--activations", "relu", "--no-compile", "--rep", "5", "--json", str(out), "--rows", str(rows)]
    assert bench_cells.main(argv) == 0
    with rows.open(newline="") as handle:
        reader = csv.DictReader(handle)
        assert tuple(reader.fieldnames or ()) == KINDS["kernel-cells"].fields
        written = list(reader)
    assert written and all(row["card"].startswith("CPU ") for row in written)
    for row in written:
        assert row["date"] and row["commit"] and row["caches"] == "empty" and row["source"] == str(out)
        assert row["mode"] == "eager" and float(row["ours_us"]) > 0 and float(row["torch_us"]) > 0
