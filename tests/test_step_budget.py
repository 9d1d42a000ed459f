"""The step's phase budget: the tiling model and the goal's arithmetic (pure), and the tool's refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.tools.step_budget import Budget
from bench.tools.step_budget import main
from bench.tools.step_budget import phase_models

STUDY_BLOCKS = {"m": 16, "n": 64, "k": 64, "head_m": 16, "head_k": 128, "k_forward": 64}


def test_the_study_shape_has_the_tiles_the_kernel_deals() -> None:
    # kernels/ops/mlp_step.py at 3x512, batch 512, 16 x 64 tiles: 256 a forward phase,
    # D_2 256 + the head's 8 weight tiles, D_1 256 + 256, the last 256 + 64 (dW_0's 80 columns).
    tiles = {p.name: p.tiles for p in phase_models(3, 512, 512, STUDY_BLOCKS)}
    assert tiles == {"F_0": 256, "F_1": 256, "F_2": 256, "H": 256, "D_2": 264, "D_1": 512, "last": 320}
    chains = {p.name: p.chain for p in phase_models(3, 512, 512, STUDY_BLOCKS)}
    assert chains["F_0"] == 2 and chains["F_1"] == 8 and chains["D_1"] == 8  # 80 / 64, 512 / 64


def test_wider_tiles_read_less_through_l2() -> None:
    narrow = sum(p.l2_bytes for p in phase_models(3, 512, 512, STUDY_BLOCKS))
    wide = sum(p.l2_bytes for p in phase_models(3, 512, 512, STUDY_BLOCKS | {"m": 32}))
    assert wide < 0.8 * narrow  # a weight column block is read by half as many row blocks


def test_the_goal_step_leaves_the_epochs_time_outside_its_steps() -> None:
    budget = Budget(step_us=64.0, epoch_s=0.0112, steps=159, goal_epoch_s=0.008)
    assert budget.outside_s == pytest.approx(0.0112 - 159 * 64e-6)
    assert budget.goal_step_us == pytest.approx((0.008 - budget.outside_s) / 159 * 1e6)


def result(precision: str = "tf32") -> dict:
    return {"date": "2026-11-29", "card": "NVIDIA H200", "commit": "abc", "caches": "warm", "per_step_us": 64.0,
            "config": {"depth": 3, "width": 512, "batch": 512, "precision": precision, "steps": 100},
            "blocks": STUDY_BLOCKS, "phases": [{"name": n, "work_us": 8.0, "barrier_us": None}
                                              for n in ("F_0", "F_1", "F_2", "H", "D_2", "D_1", "last")]}


def run_file(path: Path, route: str = "fused-step") -> Path:
    info = {"step_route": route, "median_epoch_s": 0.0112, "dataset": {"train_frames": 81396},
            "config": {"precision": "tf32", "depth": 3, "width": 512, "batch_size": 512}}
    run = {"machine_info": {"loadbench": {"format": 3}}, "commit_info": {}, "datetime": "2026-11-29T00:00:00",
           "benchmarks": [{"fullname": "bench/test_loops.py::x", "name": "x", "stats": {}, "extra_info": info}]}
    path.write_text(json.dumps(run))
    return path


def test_rows_name_each_phase_with_its_goal(tmp_path: Path, capsys) -> None:
    phases = tmp_path / "phases.json"
    phases.write_text(json.dumps(result()))
    csv = tmp_path / "step-budget.csv"
    assert main([str(phases), "--run", str(run_file(tmp_path / "run.json")), "--goal-epoch-s", "0.008",
                 "--rows", str(csv)]) == 0
    lines = csv.read_text().splitlines()
    assert len(lines) == 8 and lines[0].startswith("date,card,commit,caches,precision")
    assert "allows" in capsys.readouterr().out


def test_a_phase_goal_scales_the_time_the_phase_added_to_the_step() -> None:
    """With counter waits a program's work holds its waits; when the phase's last program
    finished it (done_us) does not: the goals scale each phase's step on that timeline."""
    from bench.tools.step_budget import budget_rows

    timed = result()
    done = (8.0, 14.0, 20.0, 27.0, 37.0, 47.0, 64.0)
    for phase, at in zip(timed["phases"], done):
        phase["done_us"] = at
    run = json.loads(run_file_text())
    budget, rows = budget_rows(timed, run, 0.008, "p.json + r.json")
    added = [r["added_us"] for r in rows]
    assert added == [8.0, 6.0, 6.0, 7.0, 10.0, 10.0, 17.0] and sum(added) == 64.0
    scale = budget.goal_step_us / 64.0
    assert [r["phase_goal_us"] for r in rows] == [round(a * scale, 2) for a in added]
    _, untimed = budget_rows(result(), run, 0.008, "p.json + r.json")  # older results: the work, scaled
    assert untimed[0]["added_us"] == "" and untimed[0]["phase_goal_us"] == round(8.0 * scale, 2)


def run_file_text() -> str:
    info = {"step_route": "fused-step", "median_epoch_s": 0.0112, "dataset": {"train_frames": 81396},
            "config": {"precision": "tf32", "depth": 3, "width": 512, "batch_size": 512}}
    return json.dumps({"benchmarks": [{"extra_info": info}]})


def test_a_run_without_the_fused_step_of_that_model_is_one_clear_error(tmp_path: Path, capsys) -> None:
    phases = tmp_path / "phases.json"
    phases.write_text(json.dumps(result()))
    code = main([str(phases), "--run", str(run_file(tmp_path / "run.json", route="layers")), "--goal-epoch-s", "0.008"])
    err = capsys.readouterr().err
    assert code == 2 and "no fused-step record of 3x512, batch 512, tf32" in err and len(err.splitlines()) == 1


def test_a_goal_of_zero_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path / "p.json"), "--run", str(tmp_path / "r.json"), "--goal-epoch-s", "0"])
    assert exc.value.code == 2
