"""python -m bench.search on CPU: a fake evaluator with the real record's shape stands in
for training and timing, so the study, resume, constraint, unsupported and failed trials,
files and errors are tested without depending on how fast this machine is."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

optuna = pytest.importorskip("optuna", reason="the search needs optuna (pip install -e '.[test]')")
from optuna.trial import TrialState  # noqa: E402

from bench.search.cli import main
from bench.search.objective import ENERGY, LATENCY, real_evaluator
from bench.search.space import Space, SpaceError, load_space, preset_params
from bench.search.results import compare, dominates, verdict
from bench.search.study import SearchSettings, answered, run_search
from model.compress import VARIANTS, Compression, Unsupported
from model.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
TINY = """
weights = ["fp32", "bf16", "int8-dynamic"]
sparsity = ["dense", "unstructured"]
prune_fraction = [0.5, 0.9]
finetune_epochs = [0, 4]
"""
SPEED = {"fp32": 1.0, "bf16": 0.7, "fp8": 0.55, "int8-weight": 0.6, "int8-dynamic": 0.5}


def evaluated(latency: float, per_1k: float, accuracy: float, drop: float,
              energy: float | None = None) -> dict[str, Any]:
    """model.inference.evaluate's record shape, on a CPU: no graph latency, no energy."""
    return {
        "latency_graph_s": None,
        "latency_eager_s": {"p50": 0.8 * latency, "p99": latency, "max": 2 * latency},
        "throughput": {"512": 500.0 / per_1k, "4096": 1000.0 / per_1k},
        "energy_j_per_1k": energy,
        "accuracy": accuracy,
        "macro_f1": accuracy - 0.02,
        "accuracy_drop": drop,
        "speedup": 1.0,
        "notes": [],
    }


class Fake:
    """A deterministic evaluator: lower precision and more pruning are faster; pruning
    past 75% costs accuracy beyond the limit; fp8 is unsupported; calls are counted."""

    def __init__(self, interrupt_at: int | None = None, fail: bool = False) -> None:
        self.calls: list[tuple[TrainConfig, Compression]] = []
        self.interrupt_at = interrupt_at
        self.fail = fail

    def __call__(self, config: TrainConfig, c: Compression) -> dict[str, Any]:
        self.calls.append((config, c))
        if self.interrupt_at is not None and len(self.calls) == self.interrupt_at:
            raise KeyboardInterrupt
        if self.fail:
            raise RuntimeError("CUDA error: out of memory")
        if c.weights == "fp8":
            raise Unsupported("fp8 needs sm_89+ (Ada, Hopper); this GPU is sm_80")
        kept = 0.5 if c.semi_structured else 1 - c.sparsity
        latency = 20e-6 * SPEED[c.weights] * (0.4 + 0.6 * kept) * (config.width / 512)
        drop = 0.001 * (1 - SPEED[c.weights]) + (0.2 * (1 - kept - 0.75) if kept < 0.25 else 0.0)
        return evaluated(latency, latency * 5, 0.75 - drop, drop)


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return path


def search(tmp_path: Path, *args: str, fake: Fake | None = None) -> int:
    return main(["--device", "cpu", "--out", str(tmp_path / "out"), "--seed", "3", *args], evaluator=fake or Fake())


def stored(tmp_path: Path, name: str = "mlp-loadbench-smoke") -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path / 'out' / 'search.db'}")


def test_a_search_writes_the_front_as_table_figure_and_json(tmp_path, tiny, capsys) -> None:
    assert search(tmp_path, "--trials", "8", "--space", str(tiny)) == 0
    out = capsys.readouterr().out
    assert out.count("search: trial ") == 8  # a progress line per trial
    files = {p.name for p in (tmp_path / "out").iterdir()}
    assert {"search.json", "front.md", "front.png", "front.svg", "search.db"} <= files
    assert (tmp_path / "out" / "front.png").read_bytes()[:4] == b"\x89PNG"
    summary = json.loads((tmp_path / "out" / "search.json").read_text())
    assert summary["format"] == "mlp-loadbench-search"
    assert [o["key"] for o in summary["objectives"]] == ["p99_latency_s", "time_per_1k_s"]
    assert "no energy counter here" in summary["objectives_note"]  # the CPU's stated second objective
    front = [r for r in summary["trials"] if r["on_front"]]
    assert front and sorted(r["number"] for r in front) == sorted(summary["front"])
    last = [line for line in out.splitlines() if line.startswith("search: trial ")][-1]
    assert last.endswith(f"front {len(summary['front'])}")  # the progress line counts a repeated point once
    assert all(r["feasible"] for r in front)
    table = (tmp_path / "out" / "front.md").read_text()
    assert "## Front" in table and "| trial" in table and "batch-1 p99 latency (µs)" in table


def test_presets_come_first_and_the_comparison_names_the_objective(tmp_path, tiny) -> None:
    search(tmp_path, "--trials", "12", "--space", str(tiny))
    summary = json.loads((tmp_path / "out" / "search.json").read_text())
    presets = {r["preset"]: r["number"] for r in summary["trials"] if r["preset"]}
    # the tiny space holds fp32, bf16, int8-dynamic and prune-50/75/90; the others are said to be outside it
    assert set(presets) == {"fp32", "bf16", "int8-dynamic", "prune-50", "prune-75", "prune-90"}
    assert sorted(presets.values()) == list(range(len(presets)))
    assert set(summary["presets_not_evaluated"]) == {"fp8", "int8-weight", "sparse-2:4"}
    comparison = summary["comparison"]
    assert "prune-90" in comparison["infeasible_presets"]  # over the limit: never the best preset
    for key in ("p99_latency_s", "time_per_1k_s"):
        best = comparison["objectives"][key]["best_preset"]
        assert best["preset"] != "prune-90"
    # int8-dynamic pruned 60-75% beats every feasible preset on both objectives in the fake
    if comparison["beats_every_preset_on"]:
        assert "The front beats every single preset by more than 5% on" in (tmp_path / "out" / "front.md").read_text()


def _row(number: int, preset: str | None, latency: float, energy: float, front: bool) -> dict[str, Any]:
    return {"number": number, "label": preset or f"searched-{number}", "preset": preset, "state": "complete",
            "feasible": True, "on_front": front, "values": {"p99_latency_s": latency, "energy_j_per_1k": energy}}


@pytest.mark.parametrize(
    ("front_latency", "beats", "level"),
    [(20e-6, True, False), (28.5e-6, False, True), (29e-6, False, False)],
    ids=["ahead by 30%", "ahead by 0.4%", "behind"],
)
def test_the_front_beats_a_preset_only_beyond_the_margin(front_latency, beats, level) -> None:
    rows = [_row(0, "fp32", 28.61e-6, 0.0157, True), _row(1, "bf16", 46e-6, 0.0025, True),
            _row(2, None, front_latency, 0.0174, True)]
    comparison = compare(rows, ["p99_latency_s", "energy_j_per_1k"])
    latency = comparison["objectives"]["p99_latency_s"]
    assert latency["front_beats_every_preset"] is beats and latency["front_ahead_within_margin"] is level
    assert comparison["beats_every_preset_on"] == (["p99_latency_s"] if beats else []) and comparison["margin"] == 0.05
    objectives = [{"key": "p99_latency_s", "label": "batch-1 p99 latency", "unit": "µs", "scale": 1e6},
                  {"key": "energy_j_per_1k", "label": "energy", "unit": "J", "scale": 1.0}]
    said = verdict({"comparison": comparison, "objectives": objectives})
    if beats:
        assert said == ("The front beats every single preset by more than 5% on batch-1 p99 latency: 20 µs "
                        "(trial 2, searched-2) against the best preset's 28.61 µs (fp32).")
    else:
        assert said.startswith("The front beats no preset by more than 5% on any objective")
    assert ("Level with the best preset on batch-1 p99 latency: 28.5 µs (trial 2, searched-2) against the best "
            "preset's 28.61 µs (fp32): ahead by less than 5%" in said) is level


def test_the_sampler_seed_makes_the_search_repeatable(tmp_path, tiny) -> None:
    fakes = [Fake(), Fake()]
    for i, fake in enumerate(fakes):
        main(["--device", "cpu", "--out", str(tmp_path / str(i)), "--seed", "5", "--trials", "12",
              "--space", str(tiny)], evaluator=fake)
    assert fakes[0].calls == fakes[1].calls


class Stuck(optuna.samplers.BaseSampler):
    """A sampler that proposes one point forever: the first choice, the lowest value."""

    def infer_relative_search_space(self, study, trial):  # type: ignore[no-untyped-def]
        return {}

    def sample_relative(self, study, trial, search_space):  # type: ignore[no-untyped-def]
        return {}

    def sample_independent(self, study, trial, name, distribution):  # type: ignore[no-untyped-def]
        return distribution.choices[0] if hasattr(distribution, "choices") else distribution.low


def test_a_repeat_queues_a_random_point_no_trial_holds_as_the_next_trial(tmp_path, tiny, monkeypatch, capsys) -> None:
    monkeypatch.setattr(optuna.samplers, "TPESampler", lambda **_: Stuck())  # a sampler that only repeats
    fake = Fake()
    assert search(tmp_path, "--trials", "16", "--space", str(tiny), fake=fake) == 0
    trials = stored(tmp_path).get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))
    presets = [t for t in trials if "preset" in t.user_attrs]
    searched = trials[len(presets):]
    assert "repeat_of" in searched[0].user_attrs  # the stuck point is the fp32 preset
    for before, trial in itertools.pairwise(searched):  # repeat, random, repeat, random, ...
        assert ("repeat_of" in before.user_attrs) != ("repeat_of" in trial.user_attrs), trial.number
        assert bool(trial.user_attrs.get("explored")) == ("repeat_of" in before.user_attrs), trial.number
    explored = [t for t in searched if t.user_attrs.get("explored")]
    points = [t.params for t in trials if "repeat_of" not in t.user_attrs]
    assert len(explored) == len(searched) // 2 and len(points) == len(presets) + len(explored)
    assert all(sum(p == q for q in points) == 1 for p in points)  # each measured once
    assert len(fake.calls) == len(points)  # a repeat is answered without measuring
    out = capsys.readouterr().out
    assert "a point drawn at random is queued)" in out and "(drawn at random after a repeat)" in out
    summary = json.loads((tmp_path / "out" / "search.json").read_text())
    assert summary["counts"]["explored"] == len(explored) and summary["counts"]["settings"] == len(points)
    assert f"{len(explored)} were drawn at random after a repeat" in (tmp_path / "out" / "front.md").read_text()


def test_the_random_points_cover_the_space_and_keep_its_steps(tiny) -> None:
    import random

    from bench.search.space import PRUNE_STEP
    from bench.search.space import random_point

    space, rng = load_space(tiny), random.Random(0)
    points = [random_point(rng, space, train_space=False) for _ in range(400)]
    assert ({p["sparsity"] for p in points} == set(space.sparsity)
            and {p["weights"] for p in points} == set(space.weights))
    for p in points:
        assert ("prune_fraction" in p) == (p["sparsity"] == "unstructured")
        assert ("finetune_epochs" in p) == (p["sparsity"] != "dense")
    fractions = {round(p["prune_fraction"], 9) for p in points if "prune_fraction" in p}
    low, high = space.prune_fraction
    assert fractions == {round(low + k * PRUNE_STEP, 9) for k in range(round((high - low) / PRUNE_STEP) + 1)}
    assert [random_point(random.Random(0), space, False) for _ in range(3)] == [points[0]] * 3  # seeded


def test_a_rerun_continues_the_study_to_the_new_total(tmp_path, tiny, capsys) -> None:
    assert search(tmp_path, "--trials", "3", "--space", str(tiny)) == 0
    assert sum(answered(t) for t in stored(tmp_path).trials) == 3
    capsys.readouterr()
    fake = Fake()
    assert search(tmp_path, "--trials", "5", "--space", str(tiny), fake=fake) == 0
    assert "3 trial(s) done, 2 to run" in capsys.readouterr().out
    study = stored(tmp_path)
    finished = study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL))
    assert len(finished) == 5 and all(answered(t) for t in finished)  # the other presets wait in the queue
    presets = [t.user_attrs["preset"] for t in study.trials if "preset" in t.user_attrs]
    assert len(presets) == len(set(presets))  # never enqueued twice
    assert search(tmp_path, "--trials", "5", "--space", str(tiny)) == 0  # nothing left: no new trial
    assert len(stored(tmp_path).get_trials(states=(TrialState.COMPLETE,))) == 5


def test_an_interrupted_search_writes_what_it_has_and_resumes(tmp_path, tiny, capsys) -> None:
    assert search(tmp_path, "--trials", "5", "--space", str(tiny), fake=Fake(interrupt_at=3)) == 130
    err = capsys.readouterr().err
    assert "interrupted; rerun the same command" in err
    summary = json.loads((tmp_path / "out" / "search.json").read_text())
    assert summary["counts"]["complete"] == 2
    assert search(tmp_path, "--trials", "5", "--space", str(tiny)) == 0
    study = stored(tmp_path)
    assert sum(answered(t) for t in study.trials) == 5  # the cut-short trial is run again, not counted
    assert [t.state for t in study.trials].count(TrialState.FAIL) == 1


def test_a_preset_cut_short_by_ctrl_c_is_measured_on_resume(tmp_path, tiny, capsys) -> None:
    """The first trials are the presets: a Ctrl-C in the second leaves it unanswered, and
    resuming measures it (Optuna's own enqueue would skip it as already there)."""
    assert search(tmp_path, "--trials", "6", "--space", str(tiny), fake=Fake(interrupt_at=2)) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    cut = [t for t in stored(tmp_path).trials if t.state == TrialState.FAIL]
    assert len(cut) == 1 and "preset" in cut[0].user_attrs
    name = cut[0].user_attrs["preset"]
    assert search(tmp_path, "--trials", "6", "--space", str(tiny)) == 0
    again = [t for t in stored(tmp_path).trials if t.user_attrs.get("preset") == name and answered(t)]
    assert len(again) == 1
    summary = json.loads((tmp_path / "out" / "search.json").read_text())
    assert name not in json.dumps(summary.get("missing_presets", {}))
    assert f"preset {name} not measured" not in (tmp_path / "out" / "front.md").read_text()


def test_an_accuracy_drop_over_the_limit_is_infeasible_and_off_the_front(tmp_path, tiny) -> None:
    search(tmp_path, "--trials", "10", "--space", str(tiny))
    summary = json.loads((tmp_path / "out" / "search.json").read_text())
    over = [r for r in summary["trials"] if r["state"] == "complete" and r["accuracy_drop"] > 0.01]
    assert over, "prune-90 breaks the limit in the fake"
    fastest = min((r for r in summary["trials"] if r["values"]), key=lambda r: r["values"]["p99_latency_s"])
    assert fastest in over  # it would lead the front without the constraint
    assert not any(r["on_front"] or r["feasible"] for r in over)
    study = stored(tmp_path)
    assert all(t.user_attrs["drop"] <= 0.01 for t in study.best_trials)


def test_a_variant_more_accurate_than_fp32_beyond_the_limit_is_feasible(tmp_path, capsys) -> None:
    # The limit bounds a loss of accuracy; a gain of any size is feasible.
    def fake(config: TrainConfig, c: Compression) -> dict[str, Any]:
        drop = -0.05 if c.weights == "bf16" else 0.0
        return evaluated(20e-6 * SPEED[c.weights], 1e-4 * SPEED[c.weights], 0.75 - drop, drop)

    space = tmp_path / "two.toml"
    space.write_text('weights = ["fp32", "bf16"]\nsparsity = ["dense"]\n')
    assert search(tmp_path, "--trials", "2", "--space", str(space), "--max-accuracy-drop", "0.01", fake=fake) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if "(preset bf16)" in line]
    assert "drop -0.0500 feasible" in line
    summary = json.loads((tmp_path / "out" / "search.json").read_text())
    (bf16,) = [r for r in summary["trials"] if r["preset"] == "bf16"]
    assert bf16["accuracy_drop"] == pytest.approx(-0.05) and bf16["feasible"] and bf16["on_front"]
    assert "bf16" not in summary["comparison"]["infeasible_presets"]
    assert [t.user_attrs["preset"] for t in stored(tmp_path).best_trials] == ["bf16"]  # it dominates fp32


def test_a_point_better_on_one_objective_and_worse_on_another_does_not_dominate() -> None:
    fast, frugal = {"p99_latency_s": 1.0, "energy_j_per_1k": 3.0}, {"p99_latency_s": 2.0, "energy_j_per_1k": 2.0}
    assert not dominates(fast, frugal) and not dominates(frugal, fast)
    assert not dominates(fast, fast)  # no better anywhere
    assert dominates(fast, {"p99_latency_s": 1.0, "energy_j_per_1k": 4.0})  # no worse in all, better in one
    rows = [_row(0, "fp32", 2.0, 2.0, True), _row(1, None, 1.0, 3.0, True), _row(2, "bf16", 1.5, 3.5, False)]
    dominated = compare(rows, ["p99_latency_s", "energy_j_per_1k"])["presets_dominated_by"]
    assert dominated == {"fp32": None, "bf16": 1}


def test_a_tighter_limit_moves_trials_off_the_front(tmp_path, tiny) -> None:
    search(tmp_path, "--trials", "6", "--space", str(tiny), "--max-accuracy-drop", "0")
    summary = json.loads((tmp_path / "out" / "search.json").read_text())
    front = [r for r in summary["trials"] if r["on_front"]]
    assert front and all(r["accuracy_drop"] <= 0 for r in front)
    lossy = {r["preset"] for r in summary["trials"] if r["preset"] and r["values"] and r["accuracy_drop"] > 0}
    assert lossy >= {"bf16", "int8-dynamic"} and not lossy & {r["preset"] for r in front}


def test_unsupported_trials_are_pruned_with_the_reason_and_the_study_goes_on(tmp_path, capsys) -> None:
    space = tmp_path / "fp8.toml"
    space.write_text('weights = ["fp8", "bf16"]\nsparsity = ["dense"]\n')
    assert search(tmp_path, "--trials", "4", "--space", str(space)) == 0
    out = capsys.readouterr().out
    assert "pruned: unsupported: fp8 needs sm_89+" in out
    summary = json.loads((tmp_path / "out" / "search.json").read_text())
    assert summary["comparison"]["unmeasured_presets"] == {
        "fp8": "unsupported: fp8 needs sm_89+ (Ada, Hopper); this GPU is sm_80"}
    assert summary["counts"]["complete"] >= 1 and summary["counts"]["pruned"] >= 1


def test_failed_trials_record_the_reason_and_a_run_of_them_stops_the_search(tmp_path, tiny, capsys) -> None:
    assert search(tmp_path, "--trials", "10", "--space", str(tiny), fake=Fake(fail=True)) == 1
    captured = capsys.readouterr()
    assert captured.out.count("FAILED: RuntimeError: CUDA error: out of memory") == 3
    assert "3 trials failed in a row" in captured.err
    study = stored(tmp_path)
    assert [t.state for t in study.trials].count(TrialState.FAIL) == 3
    assert all(t.user_attrs["reason"].startswith("RuntimeError") for t in study.trials if t.state == TrialState.FAIL)


def test_energy_is_the_second_objective_where_measured_and_its_absence_fails_the_trial(tmp_path) -> None:
    def fake(config: TrainConfig, c: Compression) -> dict[str, Any]:
        energy = None if c.weights == "bf16" else 0.5 * SPEED[c.weights]
        return evaluated(1e-5 * SPEED[c.weights], 1e-4, 0.75, 0.0, energy=energy)

    settings = SearchSettings(study_name="e", storage=f"sqlite:///{tmp_path / 'e.db'}", trials=3,
                              objectives=(LATENCY, ENERGY), objectives_note=None,
                              space=Space(weights=("fp32", "bf16", "int8-dynamic"), sparsity=("dense",)))
    lines: list[str] = []
    outcome = run_search(settings, fake, {k: VARIANTS[k] for k in ("fp32", "bf16", "int8-dynamic")}, log=lines.append)
    trials = {t.user_attrs["preset"]: t for t in outcome.study.trials}
    assert trials["fp32"].values == [1e-5, 0.5]
    assert (trials["bf16"].state == TrialState.FAIL
            and "no energy per 1,000 inferences" in trials["bf16"].user_attrs["reason"])


def test_train_space_measures_the_reference_once_and_judges_drops_against_it(tmp_path) -> None:
    space = tmp_path / "train.toml"
    space.write_text('weights = ["fp32"]\nsparsity = ["dense"]\n[train]\nwidth = [256, 512]\n')
    fake = Fake()
    assert search(tmp_path, "--trials", "4", "--space", str(space), "--train-space", fake=fake) == 0
    summary = json.loads((tmp_path / "out" / "search.json").read_text())
    assert summary["reference_accuracy"] == 0.75 and summary["train_space"]
    assert {r["config"]["width"] for r in summary["trials"]} <= {256, 512}
    assert (fake.calls[0][0], fake.calls[0][1]) == (TrainConfig(epochs=8), Compression())  # the reference first
    assert search(tmp_path, "--trials", "5", "--space", str(space), "--train-space", fake=(again := Fake())) == 0
    assert len(again.calls) <= 1  # resumed: no second reference measurement


@pytest.mark.parametrize("args, message", [
    (["--trials", "0"], "--trials: '0' is not a positive integer"),
    (["--max-accuracy-drop", "1.5"], "an accuracy drop is a fraction in [0, 1)"),
    (["--timeout", "-3"], "the timeout must be a positive number"),
    (["--sampler", "grid"], "invalid choice: 'grid'"),
    (["--bogus"], "unrecognized arguments: --bogus"),
])
def test_bad_options_stop_with_one_message(tmp_path, capsys, args, message) -> None:
    with pytest.raises(SystemExit) as exc:
        search(tmp_path, *args)
    assert exc.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("url, message", [
    ("nonsense", "not a database URL"),
    ("sqlite:////no/such/folder/x.db", "cannot open the database"),
    ("nosuchdb://host/x", "cannot open the database"),
])
def test_a_bad_storage_url_stops_with_one_message(tmp_path, capsys, url, message) -> None:
    assert search(tmp_path, "--storage", url) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"mlp-loadbench search: --storage {url}") and message in err and "Traceback" not in err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize("text, message", [
    ('colour = ["red"]', "unknown key(s) colour"),
    ('weights = ["fp16"]', "'fp16' is not one of fp32"),
    ('weights = []', "expected a non-empty list"),
    ('prune_fraction = [0.9, 0.5]', "need 0 < low <= high < 1"),
    ('prune_fraction = [0.33, 0.9]', "multiples of 0.05"),
    ('finetune_epochs = [2]', "expected [low, high]"),
    ('weights = ["int8-dynamic"]\nsparsity = ["2:4"]', "sparsity 2:4 needs weights bf16"),
    ('[train]\ndepth = [0, 3]', "need 1 <= low <= high"),
    ('[train]\nactivation = ["gelu"]', "'gelu' is not one of relu"),
    ('[train]\nheads = [1, 2]', "train: unknown key(s) heads"),
    ('weights = ["fp32"', "not valid TOML"),
])
def test_a_bad_space_stops_with_one_message_naming_the_key(tmp_path, capsys, text, message) -> None:
    path = tmp_path / "space.toml"
    path.write_text(text)
    assert search(tmp_path, "--space", str(path)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"mlp-loadbench search: --space {path}: ") and message in err
    assert len(err.splitlines()) == 1


def test_a_missing_space_file_device_or_dataset_is_a_usage_error(tmp_path, capsys) -> None:
    assert search(tmp_path, "--space", str(tmp_path / "none.toml")) == 2
    assert main(["--device", "cuda:999", "--out", str(tmp_path)], evaluator=Fake()) == 2  # no such GPU anywhere
    assert search(tmp_path, "--dataset", str(tmp_path / "frames.csv")) == 2
    err = capsys.readouterr().err
    assert "no such file" in err and "--dataset" in err


def test_a_study_whose_2_4_weights_differ_is_refused_at_the_start(tmp_path, tiny, capsys, monkeypatch) -> None:
    from bench.search import space as space_module

    monkeypatch.setattr(space_module, "SEMI_STRUCTURED_WEIGHTS", ("fp32", "bf16"))  # an older release's choices
    assert search(tmp_path, "--trials", "2") == 0
    monkeypatch.undo()
    capsys.readouterr()
    assert search(tmp_path, "--trials", "3") == 2
    err = capsys.readouterr().err
    assert "was made under other settings (space: " in err and "'weights_2:4': ['fp32', 'bf16']" in err


def test_resuming_under_other_settings_is_refused_naming_the_difference(tmp_path, tiny, capsys) -> None:
    assert search(tmp_path, "--trials", "2", "--space", str(tiny)) == 0
    capsys.readouterr()
    assert search(tmp_path, "--trials", "3", "--space", str(tiny), "--max-accuracy-drop", "0.02") == 2
    err = capsys.readouterr().err
    assert "was made under other settings (max_accuracy_drop: study 0.01, now 0.02)" in err


def test_a_pinned_search_does_not_resume_an_unpinned_study(tmp_path, tiny, capsys) -> None:
    assert search(tmp_path, "--trials", "2", "--space", str(tiny)) == 0
    capsys.readouterr()
    assert search(tmp_path, "--trials", "3", "--space", str(tiny), "--latency-pin", "on") == 2
    assert "was made under other settings (latency_pin: study None, now True)" in capsys.readouterr().err
    assert search(tmp_path, "--trials", "3", "--space", str(tiny), "--latency-pin", "off") == 0


def test_the_real_evaluator_hands_latency_pin_to_measure(monkeypatch) -> None:
    import model.inference

    seen = {}
    monkeypatch.setattr(model.inference, "evaluate", lambda *args, **kwargs: seen.update(kwargs) or {})
    run = real_evaluator("data", torch.device("cpu"), "smoke", Path("cache"), "torch", pin=True)
    run(TrainConfig(), Compression())
    assert seen["pin"] is True and seen["impl"] == "torch"


def test_presets_map_onto_the_space_or_say_why_not() -> None:
    space, base = Space(), TrainConfig()
    assert preset_params(VARIANTS["sparse-2:4"], space, base, False) == {"sparsity": "2:4", "weights_2:4": "bf16",
                                                                         "finetune_epochs": 4}
    assert preset_params(VARIANTS["prune-75"], space, base, False) == {"sparsity": "unstructured", "weights": "fp32",
                                                                       "prune_fraction": 0.75, "finetune_epochs": 4}
    narrow = Space(weights=("bf16",))
    assert preset_params(VARIANTS["fp32"], narrow, base, False) == "weights fp32 are not in the space"
    assert load_space(None) == Space()
    with pytest.raises(SpaceError):
        load_space(Path("/no/such/space.toml"))


def test_the_module_runs_as_python_dash_m() -> None:
    done = subprocess.run([sys.executable, "-m", "bench.search", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0 and "--max-accuracy-drop" in done.stdout and "--train-space" in done.stdout


@pytest.mark.slow
def test_the_real_objective_on_the_smoke_profile(tmp_path) -> None:
    """Trains the optimal configuration (smoke: 10% of the frames, 8 epochs) and serves it
    fp32 and bf16 on the CPU: about 2 minutes on 2 cores, hence slow."""
    space = tmp_path / "space.toml"
    space.write_text('weights = ["fp32", "bf16"]\nsparsity = ["dense"]\n')
    done = subprocess.run(
        [sys.executable, "-m", "bench.search", "--trials", "2", "--profile", "smoke", "--device", "cpu",
         "--space", str(space), "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "models")],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((tmp_path / "out" / "search.json").read_text())
    assert summary["counts"]["complete"] == 2
    fp32 = next(r for r in summary["trials"] if r["preset"] == "fp32")
    assert fp32["latency_kind"] == "eager" and fp32["accuracy_drop"] == 0 and fp32["values"]["p99_latency_s"] > 0


def test_without_optuna_the_search_says_how_to_get_it() -> None:
    hide_optuna = (
        # what an environment without optuna looks like to find_spec
        "import runpy, sys; sys.modules['optuna'] = None; "
        "runpy.run_module('bench.search', run_name='__main__')"
    )
    done = subprocess.run([sys.executable, "-c", hide_optuna, "--help"], capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "python -m bench.search: needs optuna, an optional dependency: pip install -e '.[search]'"
    ]


def test_the_documented_training_space_loads_and_keeps_the_base_configuration_inside() -> None:
    """The README's `--train-space --space docs/search-h100/train/space.toml` command: the
    file narrows depth and width, keeps the default compression space, and the presets
    (made at the base configuration) still enter the study."""
    space = load_space(ROOT / "docs" / "search-h100" / "train" / "space.toml")
    assert space.train["depth"] == (2, 3) and space.train["width"] == (128, 256, 512)
    assert space.weights == Space().weights and space.sparsity == Space().sparsity
    assert isinstance(preset_params(VARIANTS["bf16"], space, TrainConfig(), train_space=True), dict)
