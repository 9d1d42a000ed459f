"""The kernel-cell benchmark (bench/tools/bench_cells.py) on CPU: its axes against the
suite's, the interleaved eager rounds on a planted timer, the cell list, and --tune-only."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from bench.tools.rows import KINDS

pytestmark = pytest.mark.usefixtures("launches")  # an empty cache of its own, no plans left behind


def test_experiment_shapes_match_the_suite() -> None:
    """kernels/ may not import bench/: bench_cells keeps its own copy of the axes."""
    from kernels.ground.cases import EXPERIMENTS
    from bench.tools import bench_cells
    from model.config import TrainConfig

    assert tuple(EXPERIMENTS["batch"][1]) == bench_cells.BATCHES
    assert tuple(EXPERIMENTS["units"][1]) == bench_cells.WIDTHS
    assert bench_cells.CENTRE == (TrainConfig.OPTIMAL.batch_size, TrainConfig.OPTIMAL.width)
    assert bench_cells.DEPTH == TrainConfig.OPTIMAL.depth


def test_a_cells_flops_count_every_layer() -> None:
    """Three hidden layers at width 2048 are two 2048 x 2048 products, not one: the FLOPs
    (and the TFLOP/s the records give) count each Linear, while tuning sees each shape once."""
    from bench.tools import bench_cells

    cell = bench_cells.CellResult(512, 2048, "leaky_relu", "fp32", torch.device("cpu"))
    features, classes = bench_cells.FEATURES, bench_cells.CLASSES
    hidden = 512 * 2048 * 2048
    assert cell.flops == 6.0 * (512 * 2048 * features + 2 * hidden + 512 * classes * 2048)
    assert bench_cells.layer_shapes(512, 2048) == set(bench_cells.layers(512, 2048))
    assert len(bench_cells.layers(512, 2048)) == bench_cells.DEPTH + 1


def test_eager_times_come_from_interleaved_rounds(monkeypatch) -> None:
    """Each round takes every implementation in turn; each gets its median round, and a
    baseline failing part-way is recorded without a time (planted timer, a stand-in GPU)."""
    from bench.tools import bench_cells

    order, planted = [], {"torch": iter([5.0, 1.0, 3.0, 2.0, 4.0]), "triton": iter([9.0, 7.0, 8.0, 6.0, 10.0])}

    def timer(step, device):
        name = step()
        order.append(name)
        if name == "compile" and len(order) > 3:
            raise RuntimeError("recompile limit\nmore")
        return next(planted[name]) if name in planted else 1.0

    monkeypatch.setattr(bench_cells, "eager_ms", timer)
    monkeypatch.setattr(bench_cells, "EAGER_ROUNDS", 5)
    cell = bench_cells.CellResult(512, 512, "relu", "fp32", torch.device("cuda"))
    cell.steps = {name: (lambda n=name: n) for name in ("torch", "compile", "triton")}
    bench_cells._time_eager_interleaved(cell, cell.device)
    assert order[:6] == ["torch", "compile", "triton", "torch", "compile", "triton"]
    assert cell.times_ms == {"torch_eager_ms": 3.0, "compile_eager_ms": None, "triton_eager_ms": 8.0}
    assert cell.errors == {"compile_eager_ms": "RuntimeError: recompile limit"}
    assert order.count("torch") == 5


def test_the_cell_list_measures_each_cell_once_losing_cells_first() -> None:
    from bench.tools import bench_cells

    cells = bench_cells.cell_list(bench_cells.BATCHES, bench_cells.WIDTHS, bench_cells.PRECISIONS,
                                  bench_cells.ACTIVATIONS)
    assert len(cells) == len(set(cells)) == 2 * (4 * 5 + 4)
    assert cells[:3] == bench_cells.PRIORITY[:3]


@pytest.mark.interpreter
def test_bench_cells_tune_only_reports_the_tuning_phase_and_no_cells(tmp_path, capsys) -> None:
    """The one-time cost alone (--tune-only), here through the interpreter on the CPU."""
    from bench.tools import bench_cells

    out = tmp_path / "cells.json"
    argv = ["--device", "cpu", "--tune-only", "--batches", "64", "--widths", "128", "--precisions", "fp32",
            "--activations", "--cache-dir", str(tmp_path / "cache"), "--json", str(out)]
    assert bench_cells.main(argv) == 0
    result = json.loads(out.read_text())
    # the experiments vary one axis around the centre: batch 64 at width 512, width 128 at batch 512
    assert [(r["batch"], r["width"]) for r in result["tuning"]["rows"]] == [(64, 512), (512, 128)]
    assert "cells" not in result and result["skipped"] == []
    printed = capsys.readouterr().out
    assert "first-use tuning" in printed and "geomean" not in printed


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
