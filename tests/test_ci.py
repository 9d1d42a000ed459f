"""`python -m bench.tools.ci` end to end on the CPU: main's runs stored, pull requests
judged against them, the job summary written from the gate's verdicts.

Epoch times are planted on pytest-benchmark's timer (tests/projects.py), so
the gate's decisions do not depend on how busy this machine is."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from datetime import datetime
from datetime import timedelta
from pathlib import Path

import pytest

from bench.tools.ci import find_baseline
from bench.tools.ci import CiError
from bench.tools.ci import Outcome
from bench.tools.ci import checked_gpu
from bench.tools.ci import junit_failures
from bench.tools.ci import parse_args
from bench.tools.ci import read_verdicts
from bench.tools.ci import summary_markdown
from bench.tools.ci import wanted_settings
from tests.projects import ROOT
from tests.projects import TIMER
from tests.projects import ci
from tests.projects import write_project
from tests.runs import write_run


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A folder laid out like a user's checkout: conftest, two tiny cases, a CSV, budgets."""
    return write_project(tmp_path_factory.mktemp("project"))


@pytest.mark.slow
def test_ci_gates_a_pull_request_against_mains_stored_runs(project: Path) -> None:
    done = ci(project, "main", "main0", PLANTED_EPOCH_S="0.1")
    assert done.returncode == 0, done.stdout + done.stderr
    (first,) = sorted((project / "main-runs").glob("*/*.json"))
    # Two more runs of main, as two later pushes would store them: the planted timer makes
    # a run's epochs the same at every push, so each is the first with a later number and
    # date. Three runs are enough for the noise to be known.
    for number in (2, 3):
        run = json.loads(first.read_text())
        run["datetime"] = (datetime.fromisoformat(run["datetime"]) + timedelta(hours=number)).isoformat()
        (first.parent / f"{number:04d}{first.name[4:]}").write_text(json.dumps(run))
    stored = sorted((project / "main-runs").glob("*/*.json"))
    assert len(stored) == 3

    slow = ci(project, "pr", "pr-slow", PLANTED_EPOCH_S="0.14")  # every epoch 40% slower
    summary = (project / "pr-slow" / "summary.md").read_text()
    assert slow.returncode == 1, slow.stdout + slow.stderr
    assert "FAILED" in summary and "2 regressed" in summary
    assert "**test_small** (regressed)" in summary and "**test_other** (regressed)" in summary
    assert "epoch_time_ratio = 1.4 breaks its limit 1.1" in summary  # the budget's 10%: the spread is known
    assert "Noise unknown" not in summary
    assert stored[-1].name in summary  # the baseline is main's newest run
    assert len(sorted((project / "main-runs").glob("*/*.json"))) == 3  # a pull request stores nothing

    tiers, gates = project / "rows" / "tier-times.csv", project / "rows" / "gate-runs.csv"
    same = ci(project, "pr", "pr-same", "--tier-rows", str(tiers), "--rows", str(gates), PLANTED_EPOCH_S="0.1")
    summary = (project / "pr-same" / "summary.md").read_text()
    assert same.returncode == 0, same.stdout + same.stderr
    assert "passed" in summary and "2 ok" in summary and "regressed" not in summary
    (tier,) = csv.DictReader(tiers.open())
    (gated,) = csv.DictReader(gates.open())
    for row in (tier, gated):  # a CPU run names its CPU
        assert row["card"].startswith("CPU ") and row["date"] and row["commit"] and row["caches"], row
        assert row["source"] == str(project / "pr-same" / "run.json")
    assert (tier["command"], tier["tier"], tier["cases"]) == ("ci pr", "pr", "2")
    assert 0 < float(tier["pytest_s"]) <= float(tier["wall_s"])
    assert gated["gate"] == "green" and gated["ok"] == "2"


@pytest.mark.slow
def test_ci_says_when_there_is_no_history_and_keeps_budget_failures(project: Path, tmp_path: Path) -> None:
    (project / "strict.toml").write_text("[datasets.\"tiny.csv\".defaults]\naccuracy_min = 0.99\n")
    done = subprocess.run(
        [sys.executable, "-m", "bench.tools.ci", "pr", "--storage", str(tmp_path / "empty"), "--out",
         str(tmp_path / "out"), "--bench", "test_cases.py", "--gpu", "no GPU", "--no-history", "--",
         "--device=cpu", f"--dataset={project / 'tiny.csv'}", f"--budgets={project / 'strict.toml'}", "-q"],
        cwd=project, env={**os.environ, "PYTHONPATH": str(ROOT), "GITHUB_STEP_SUMMARY": ""},
        capture_output=True, text=True, timeout=600,
    )
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert done.returncode == 1
    assert "nothing was compared, budgets only" in summary
    assert "2 over budget" in summary and "accuracy = " in summary and "below its floor" in summary


def test_baseline_is_the_newest_run_measured_alike(tmp_path: Path) -> None:
    def run(name: str, when: str, gpu: str | None, profile: str, plant: str | None = None) -> Path:
        settings = {"profile": profile, "epochs": 40, "plant": plant}
        return write_run(tmp_path / f"{name}.json", {}, gpu=gpu, when=when, settings=settings)

    paths = [
        run("old", "2026-01-01T00:00:00", "NVIDIA H100", "quick"),
        run("new", "2026-01-02T00:00:00", "NVIDIA H100", "quick"),
        run("planted", "2026-01-03T00:00:00", "NVIDIA H100", "quick", plant="5%:gpu"),
        run("thesis", "2026-01-04T00:00:00", "NVIDIA H100", "thesis"),
        run("h200", "2026-01-05T00:00:00", "NVIDIA H200", "quick"),
    ]
    (tmp_path / "broken.json").write_text("{")
    found, count = find_baseline([*paths, tmp_path / "broken.json"], "NVIDIA H100", wanted_settings([], "NVIDIA H100"))
    assert found is not None and found.name == "new.json" and count == 2
    found, _ = find_baseline(paths, "NVIDIA H100", wanted_settings(["--profile", "thesis"], "NVIDIA H100"))
    assert found is not None and found.name == "thesis.json"
    assert find_baseline(paths, "NVIDIA A100", wanted_settings([], "NVIDIA A100")) == (None, 0)
    assert wanted_settings(["--epochs=4"], "no GPU") == {"profile": "smoke", "plant": None, "epochs": 4}


def test_a_test_that_failed_without_a_verdict_is_named(tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    junit.write_text(
        '<testsuites><testsuite><testcase name="test_big[units-2048]"><error message="out of GPU memory (batch 512)"/>'
        '</testcase><testcase name="test_ok"/></testsuite></testsuites>'
    )
    failed = junit_failures(junit)
    assert failed == [("test_big[units-2048]", "out of GPU memory (batch 512)")]
    text = summary_markdown(Outcome("pr", "NVIDIA H100", "NVIDIA H100", None, 0, [], failed, 1))
    assert "FAILED" in text and "test_big[units-2048]**: out of GPU memory" in text
    assert "passed" not in text.splitlines()[0]


@pytest.mark.parametrize("given", ["--tier=nightly", "--benchmark-json=x.json", "--benchmark-compare", "--junitxml=j",
                                   "--benchmark-storage=runs", "--benchmark-autosave", "--series-dir=s"])
def test_options_ci_controls_are_refused_after_the_separator(given: str, tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["pr", "--out", str(tmp_path / "out"), "--", "-k", "units", given])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"-- {given}: refused: " in err


def test_an_output_folder_that_cannot_be_made_is_refused(tmp_path: Path, capsys) -> None:
    (tmp_path / "a-file").write_text("")
    for out, said in ((tmp_path / "a-file", "is a file; give a directory"),
                      (tmp_path / "a-file" / "ci", "a-file is a file, not a directory")):
        with pytest.raises(SystemExit):
            parse_args(["pr", "--out", str(out)])
        assert said in capsys.readouterr().err


def test_an_unknown_gpu_is_refused_and_a_known_one_is_an_override(tmp_path: Path) -> None:
    run = tmp_path / "h200.json"
    run.write_text(json.dumps({"machine_info": {"loadbench": {"gpu": {"name": "NVIDIA H200"}, "settings": {}}},
                               "datetime": "2026-11-01T00:00:00", "benchmarks": []}))
    assert checked_gpu(None, "no GPU", [run]) == "no GPU"
    assert checked_gpu("NVIDIA H200", "no GPU", [run]) == "NVIDIA H200"
    with pytest.raises(CiError, match=r"--gpu 'NVIDIA Nope': this machine measures on 'no GPU'.*holds: NVIDIA H200"):
        checked_gpu("NVIDIA Nope", "no GPU", [run])
    text = summary_markdown(Outcome("pr", "no GPU", "NVIDIA H200", None, 0, [], [], 0))
    assert "History of **NVIDIA H200** was asked for (--gpu) on a machine measuring on no GPU" in text


def test_a_planted_run_says_so_first_and_a_failed_store_before_anything_passes() -> None:
    planted = summary_markdown(Outcome("pr", "NVIDIA H200", "NVIDIA H200", Path("main.json"), 3, [], [], 1,
                                       plant="5%:gpu"))
    head = planted.splitlines()[0]
    assert head == "## mlp-loadbench pr, planted slowdown 5%:gpu: FAILED on NVIDIA H200"
    assert "without the plant" in planted and "show what the gate catches" in planted
    failed = summary_markdown(Outcome("main", "NVIDIA H200", "NVIDIA H200", Path("main.json"), 3, [], [], 2,
                                      store_error="data branch push: push to bench-data gave up after 5 attempts"))
    lines = failed.splitlines()
    assert lines[0] == "## mlp-loadbench main: FAILED on NVIDIA H200"
    assert lines[2].startswith("**The run was not stored:** data branch push")
    assert "passed" not in failed


@pytest.mark.slow
def test_a_refused_push_fails_the_main_job_and_says_so(project: Path, tmp_path: Path) -> None:
    data = tmp_path / "data.git"
    subprocess.run(["git", "init", "-q", "--bare", str(data)], check=True)
    hook = data / "hooks" / "pre-receive"
    hook.write_text("#!/bin/sh\necho 'refused by the server' >&2\nexit 1\n")
    hook.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GITHUB_STEP_SUMMARY": "", "LOADBENCH_GIT_NAME": "ci"}
    done = subprocess.run(
        [sys.executable, "-m", "bench.tools.ci", "main", "--data-repo", str(data), "--out", str(tmp_path / "out"),
         "--bench", "test_cases.py", "--no-history", "--", "--device=cpu", f"--dataset={project / 'tiny.csv'}",
         f"--budgets={project / 'budgets.toml'}", TIMER, "-q"],
        cwd=project, env=env, capture_output=True, text=True, timeout=600,
    )
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert done.returncode == 2, done.stdout + done.stderr
    assert summary.startswith("## mlp-loadbench main: FAILED on no GPU")
    assert "**The run was not stored:** data branch push" in summary and "Stored" not in summary


def test_each_kind_of_case_is_shown_in_its_unit_and_a_failed_case_is_listed_once(tmp_path: Path) -> None:
    regressed = {"status": "regressed", "failures": [{"metric": "call_time_ratio", "value": 1.3, "limit": 1.1,
                                                      "baseline": 1.0, "detail": "median call 13 us vs 10 us"}]}
    run = {"machine_info": {"loadbench": {"gpu": {"name": "NVIDIA H200"}, "settings": {}}}, "benchmarks": [
        {"name": "test_batch1_forward[optimal-fp32]", "extra_info": {"median_call_s": 1.3e-5, "verdict": regressed}},
        {"name": "test_inference[optimal-fp32]", "extra_info": {"kind": "inference", "latency_p99_s": 4.2e-5,
                                                                "accuracy": 0.8, "verdict": {"status": "ok"}}},
        {"name": "test_hidden_units[units-128]", "extra_info": {"median_epoch_s": 0.0331, "accuracy": 0.72,
                                                                "verdict": {"status": "not compared"}}},
    ]}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    cases = read_verdicts(path)
    assert [c.figure for c in cases] == ["13.0 us/call", "p99 42.0 us", "0.0331 s/epoch"]
    failed = [("test_batch1_forward[optimal-fp32]", "Failed: batch1-optimal-fp32: 1 budget(s) broken")]
    text = summary_markdown(Outcome("pr", "NVIDIA H200", "NVIDIA H200", path, 3, cases, failed, 1))
    assert text.count("**test_batch1_forward[optimal-fp32]**") == 1  # under what the gate failed, not again
    assert "### What the gate failed" in text and "Tests that failed without a verdict" not in text
    assert "3 case(s): 1 not compared, 1 ok, 1 regressed." in text
