"""pytest-benchmark's options as a user sees them: the epochs are the rounds, and every
option the README's table names is honoured or refused with one line saying why.

Epoch times are planted on pytest-benchmark's timer (tests/projects.py), so the
table's spread and compare-fail's verdicts do not depend on this machine's load."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.projects import CONFTEST
from tests.projects import PLANTED_TIMER
from tests.projects import TIMER

CASES = """
import pytest

@pytest.mark.parametrize("case", ["blocks-2", "units-128"])
def test_case(loadbench, case):
    loadbench.run(case, width=32)
"""
EPOCHS = 8


@pytest.fixture
def run(inprocess_ready: None, pytester: pytest.Pytester, tiny_csv: Path, monkeypatch):
    """A pytest session of the tiny cases inside this process (see test_harness's bench)."""
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_cases=CASES, planted=PLANTED_TIMER)
    pytester.syspathinsert()
    (pytester.path / "budgets.toml").write_text("[defaults]\n")
    monkeypatch.setenv("PLANTED_EPOCH_S", "0.1")

    def go(*args: str, timer: bool = True, isolated: bool = False) -> pytest.RunResult:
        start = pytester.runpytest_subprocess if isolated else pytester.runpytest_inprocess
        return start(
            "-p", "no:cacheprovider", "--device=cpu", "--profile=smoke", f"--epochs={EPOCHS}",
            f"--dataset={tiny_csv}", f"--budgets={pytester.path / 'budgets.toml'}",
            f"--benchmark-storage={pytester.path / 'runs'}", *([TIMER] if timer else []), *args,
        )

    return go


def saved(pytester: pytest.Pytester) -> list[Path]:
    return sorted((pytester.path / "runs").glob("*/*.json"))


def test_each_timed_epoch_is_a_round(run, pytester) -> None:
    result = run("--benchmark-json=out.json", "--benchmark-save-data")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*Rounds*", f"*test_case?blocks-2?*{EPOCHS - 1}*1*"])
    for bench in json.loads((pytester.path / "out.json").read_text())["benchmarks"]:
        stats, info = bench["stats"], bench["extra_info"]
        assert stats["rounds"] == EPOCHS - 1 and stats["iterations"] == 1
        assert stats["stddev"] > 0 and stats["max"] > stats["min"]  # the planted ripple: a spread of epochs
        assert stats["ops"] == pytest.approx(1 / stats["mean"])  # epochs per second
        assert stats["median"] == pytest.approx(0.1, rel=0.01)  # the planted epoch, as the gate reads it
        (epochs,) = info["epoch_seconds_by_round"]
        assert len(epochs) == EPOCHS and epochs[1:] == stats["data"]  # the rounds, sample for sample
        assert info["median_epoch_s"] == pytest.approx(stats["median"])  # the gate's sample is pytest-benchmark's
        assert bench["params"] == {"case": info["case"]}  # a string, not UNSERIALIZABLE[Case(...)]


def test_compare_fail_gates_epochs(run, pytester, monkeypatch) -> None:
    run("--benchmark-autosave").assert_outcomes(passed=2)
    (baseline,) = saved(pytester)
    same = run(f"--benchmark-compare={baseline}", "--benchmark-compare-fail=median:10%")
    same.assert_outcomes(passed=2)
    assert same.ret == 0
    monkeypatch.setenv("PLANTED_EPOCH_S", "0.13")  # every epoch 30% slower
    slow = run(f"--benchmark-compare={baseline}", "--benchmark-compare-fail=median:10%")  # the budgets judge no time
    assert slow.ret != 0
    shown = slow.stdout.str() + slow.stderr.str()
    assert "Performance has regressed" in shown and "Field 'median' has failed PercentageRegressionCheck" in shown


def test_compare_fail_is_refused_against_a_baseline_of_other_settings(run, pytester) -> None:
    run("--benchmark-autosave").assert_outcomes(passed=2)
    (baseline,) = saved(pytester)
    result = run(f"--benchmark-compare={baseline}", "--benchmark-compare-fail=median:10%", "--epochs=4")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--benchmark-compare-fail: the baseline measured something else (baseline ran "
                                 "epochs=8, this run epochs=4*"])


def test_compare_fail_against_a_baseline_that_differs_only_by_a_planted_slowdown_judges_it(run, pytester,
                                                                                            monkeypatch) -> None:
    """As documented: let through, and pytest-benchmark's threshold judges the epochs; the
    suite's own gate judges the planted run against the unplanted baseline too, and says so."""
    run("--benchmark-autosave").assert_outcomes(passed=2)
    (baseline,) = saved(pytester)
    compare = (f"--benchmark-compare={baseline}", "--benchmark-compare-fail=median:10%", "--plant-slowdown=30")
    same = run(*compare)  # the planted timer does not see the plant's sleep: the epochs are as long as before
    assert same.ret == 0, same.stdout.str()[-2000:] + same.stderr.str()[-2000:]
    same.assert_outcomes(passed=2)
    monkeypatch.setenv("PLANTED_EPOCH_S", "0.13")  # what a 30% plant does to the timed epochs
    slow = run(*compare)
    shown = slow.stdout.str() + slow.stderr.str()
    assert slow.ret not in (0, pytest.ExitCode.USAGE_ERROR)
    assert "Performance has regressed" in shown and "Field 'median' has failed PercentageRegressionCheck" in shown
    assert "the baseline measured something else" not in shown
    assert "planted slowdown 30%:host: judged against the unplanted baseline" in shown


@pytest.mark.parametrize("where", ["ini", "PYTEST_ADDOPTS"])
def test_a_refused_option_set_in_the_ini_files_addopts_or_the_environment_is_refused_too(run, pytester, monkeypatch,
                                                                                       where) -> None:
    if where == "ini":
        pytester.makefile(".ini", pytest="[pytest]\naddopts = --benchmark-warmup-iterations=3\n")
    else:
        monkeypatch.setenv("PYTEST_ADDOPTS", "--benchmark-warmup-iterations=3")
    result = run("--collect-only")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--benchmark-warmup-iterations: not used by mlp-loadbench*"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--benchmark-warmup"],
         "--benchmark-warmup: not used by mlp-loadbench: the first epoch of every case is its warm-up round*"),
        (["--benchmark-warmup-iterations=3"], "--benchmark-warmup-iterations: not used by mlp-loadbench*"),
        (["--benchmark-max-time=2"],
         "--benchmark-max-time: not used by mlp-loadbench: rounds are epochs*change the training*"),
        (["--benchmark-min-time=0.1"], "--benchmark-min-time: not used by mlp-loadbench: rounds are epochs*"),
        (["--benchmark-calibration-precision=20"], "--benchmark-calibration-precision: not used by mlp-loadbench*"),
        (["--benchmark-min-rounds=20"],
         "--benchmark-min-rounds 20: a training case times 7 epoch(s)*pass --epochs 21*"),
        (["--benchmark-storage=elasticsearch+http://localhost:9200/bench/run"],
         "--benchmark-storage elasticsearch+http://...: refused*file storage*"),
        (["--epochs=1"], "*--epochs: '1': the first epoch is the warm-up*at least 2*"),
    ],
)
def test_options_without_a_meaning_for_epochs_are_refused_at_start_up(run, args, message) -> None:
    result = run(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{message}"])
    assert "Traceback" not in result.stderr.str()


def test_min_rounds_within_the_timed_epochs_is_honoured(run) -> None:
    run("--benchmark-min-rounds=7").assert_outcomes(passed=2)


def test_cprofile_profiles_apart(run, pytester) -> None:
    run("--benchmark-json=plain.json").assert_outcomes(passed=2)
    run("--benchmark-json=profiled.json", "--benchmark-cprofile=tottime").assert_outcomes(passed=2)
    plain, profiled = (json.loads((pytester.path / f).read_text())["benchmarks"]
                       for f in ("plain.json", "profiled.json"))
    for a, b in zip(plain, profiled):
        assert b["stats"]["rounds"] == EPOCHS - 1  # the profiled epoch is not a timed round
        assert len(b["extra_info"]["epoch_seconds_by_round"][0]) == EPOCHS  # nor one of the gate's samples
        assert b["extra_info"]["accuracy"] == a["extra_info"]["accuracy"]  # the model was read before it
        assert b.get("cprofile")  # and pytest-benchmark has its profile


def test_group_by_case_and_csv_name_the_case(run, pytester) -> None:
    result = run("--benchmark-group-by=param:case", "--benchmark-autosave")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*benchmark 'case=blocks-2'*", "*benchmark 'case=units-128'*"])
    (stored,) = saved(pytester)
    cli = "import sys; from pytest_benchmark.cli import main; sys.argv[0] = 'pytest-benchmark'; main()"
    done = subprocess.run([sys.executable, "-c", cli, "compare", "--csv=table", "--group-by=param:case", str(stored)],
                          cwd=pytester.path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    (table,) = pytester.path.glob("table*.csv")
    text = table.read_text()
    assert "UNSERIALIZABLE" not in text
    rows = {line.split(",")[1] for line in text.splitlines()[1:]}
    assert text.startswith("name,param:case,") and rows == {"blocks-2", "units-128"}


def test_histogram_draws_the_epochs(run, pytester) -> None:
    # Looked up, not imported, and drawn in a process of its own: pygal loads
    # importlib_metadata, whose finder outlives pytester's module snapshot and hides the
    # entry-point plugins (pytest-benchmark among them) from this process's later sessions.
    if importlib.util.find_spec("pygal") is None:
        pytest.skip("--benchmark-histogram needs pygal (pip install -e '.[test]')")
    run("--benchmark-histogram=hist", isolated=True).assert_outcomes(passed=2)
    drawn = sorted(pytester.path.glob("hist*.svg"))
    assert drawn, "no histogram written"
    text = " ".join(svg.read_text() for svg in drawn)
    assert "<svg" in text and "test_case[blocks-2]" in text and "test_case[units-128]" in text


def test_disable_still_trains_every_epoch(run) -> None:
    result = run("--benchmark-disable", "-v")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([f"*blocks-2: epoch {EPOCHS}/{EPOCHS}*", f"*units-128: epoch {EPOCHS}/{EPOCHS}*"])


def test_disable_gc_holds_for_every_timed_epoch(run, pytester) -> None:
    """--benchmark-disable-gc: pytest-benchmark turns the collector off around each round,
    so every timed epoch runs without it (the warm-up epoch, outside the rounds, with it)."""
    pytester.makeconftest('pytest_plugins = ["bench.plugin"]\n' + """
import gc, pytest
from model.train import Trainer

@pytest.fixture(autouse=True)
def watch_gc(monkeypatch, tmp_path_factory):
    seen = []
    original = Trainer.run_epoch
    def run_epoch(self, *args, **kwargs):
        seen.append(gc.isenabled())
        return original(self, *args, **kwargs)
    monkeypatch.setattr(Trainer, "run_epoch", run_epoch)
    yield
    with open("gc.txt", "a") as handle:
        handle.write("".join("1" if on else "0" for on in seen) + "\\n")
""")
    run("--benchmark-disable-gc", "-k", "blocks-2").assert_outcomes(passed=1, deselected=1)
    run("-k", "blocks-2").assert_outcomes(passed=1, deselected=1)
    with_flag, without = (pytester.path / "gc.txt").read_text().split()
    assert with_flag == "1" + "0" * (EPOCHS - 1)
    assert without == "1" * EPOCHS
