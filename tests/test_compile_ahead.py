"""--compile-workers and --compile-only: the deal, the workers' arguments and outcomes, and
the plugin end to end on the CPU (the workers are real pytest processes)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench.plugin.ahead import Ahead
from bench.plugin.ahead import compile_ahead
from bench.plugin.ahead import deal
from bench.plugin.ahead import outcome
from bench.plugin.ahead import worker_args
from bench.plugin.ahead import worker_env
from bench.plugin.ahead import workers_for
from tests.projects import CASES
from tests.projects import CONFTEST
from tests.projects import PLANTED_TIMER
from tests.projects import TIMER

FAILING_CASE = """

def test_bad(loadbench):  # fails in a worker only: the session trains it, compiling in its first epoch
    if loadbench.session.options.compile_only:
        raise RuntimeError("this case cannot be built ahead")
    loadbench.run(Case("blocks", 4), width=32)
"""
# A stand-in worker: each node id is a built case, but one named 'bad' fails.
FAKE_WORKER = """
import sys
bad = [n for n in sys.argv[1:] if "bad" in n]
for n in sys.argv[1:]:
    if n not in bad:
        print(f"SKIPPED [1] bench/plugin/fixture.py:120: --compile-only: {n} (blocks-2): 2 epochs")
for n in bad:
    print(f"FAILED {n} - RuntimeError")
sys.exit(1 if bad else 0)
"""


def test_cases_are_dealt_round_robin_to_at_most_one_worker_each() -> None:
    assert deal(["a", "b", "c", "d", "e"], 2) == [["a", "c", "e"], ["b", "d"]]
    assert deal(["a", "b"], 4) == [["a"], ["b"]]
    assert workers_for("auto", cases=22, cpus=16) == 16
    assert workers_for("auto", cases=3, cpus=16) == 3
    assert workers_for(8, cases=22) == 8
    assert workers_for(0, cases=22) == 0


def test_a_worker_runs_the_sessions_axes_only_building_and_untuned(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # a CSV named relative to the session's folder, which a worker may not share
    args = worker_args(profile="thesis", device="cuda", loop="graph", impl="triton", optimizer_impl="triton",
                       precision="tf32", dataset="data.csv", rootdir=tmp_path / "root",
                       inifile=tmp_path / "root" / "pytest.ini")
    assert {"--compile-only", "--benchmark-disable", "--epochs=2", "--tier=nightly", "--profile=thesis",
            "--impl=triton", "--optimizer-impl=triton", "--precision=tf32", f"--dataset={tmp_path / 'data.csv'}",
            f"--rootdir={tmp_path / 'root'}"} <= set(args)
    assert args[args.index("-c") + 1] == str(tmp_path / "root" / "pytest.ini")  # the session's ini file
    env = worker_env({"PYTEST_ADDOPTS": "--benchmark-autosave", "TRITON_CACHE_DIR": "/scratch/triton"})
    assert env["LOADBENCH_TUNE"] == "off" and env["PYTEST_ADDOPTS"] == ""
    assert env["TRITON_CACHE_DIR"] == "/scratch/triton"  # the session's (cold) caches
    assert Path(env["PYTHONPATH"].split(os.pathsep)[0], "bench", "plugin", "ahead.py").is_file()


def test_a_workers_output_says_what_it_built_and_what_failed() -> None:
    text = ("SKIPPED [1] bench/plugin/fixture.py:120: --compile-only: bench/test_experiments.py::test_hidden_units"
            "[units-128] (units-128): 2 epochs and the evaluation in 3.10 s; nothing timed or stored\n"
            "SKIPPED [1] bench/test_x.py:3: needs a CUDA GPU\n"
            "FAILED bench/test_experiments.py::test_batch_size[batch-64] - RuntimeError: x\n")
    assert outcome(text, 1, worker=0) == (["bench/test_experiments.py::test_hidden_units[units-128]"],
                                          ["bench/test_experiments.py::test_batch_size[batch-64]"])
    assert outcome("Fatal Python error: Aborted\n", -6, worker=3) == ([], ["worker 3 (exit -6: Fatal Python error: "
                                                                           "Aborted)"])
    assert outcome("", 4, worker=1)[1] == ["worker 1 (exit 4: no output)"]


def test_compiling_ahead_waits_for_every_worker_and_names_a_case_that_failed(tmp_path: Path) -> None:
    worker = tmp_path / "worker.py"
    worker.write_text(FAKE_WORKER)
    ahead = compile_ahead(["t.py::a", "t.py::bad", "t.py::c"], [str(worker)], workers=2, cwd=tmp_path)
    assert (ahead.workers, ahead.cases, ahead.built, ahead.failed) == (2, 3, ("t.py::a", "t.py::c"), ("t.py::bad",))
    assert "2 of 3 case(s) in 2 process(es)" in ahead.line()
    assert "1 failed there and compile in their own first epoch: t.py::bad" in ahead.line()
    assert ahead.as_dict()["built"] == 2 and ahead.as_dict()["failed"] == ["t.py::bad"]
    assert Ahead(4, 22, (), 41.04).state("cold (emptied for this session)") == \
        "warm (compiled ahead in 4 processes, 41.0 s, from cold)"


@pytest.fixture
def project(inprocess_ready: None, pytester: pytest.Pytester, tiny_csv: Path):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_cases=CASES, planted=PLANTED_TIMER)
    pytester.syspathinsert()

    def run(*args: str) -> pytest.RunResult:
        return pytester.runpytest_inprocess("-p", "no:cacheprovider", "--device=cpu", "--profile=smoke", "--epochs=3",
                                            TIMER, f"--dataset={tiny_csv}", *args)

    return run


@pytest.mark.slow
def test_a_session_compiles_its_cases_ahead_in_workers_and_its_records_say_so(project, pytester) -> None:
    result = project("--compile-workers=2", "--cold-caches", "--benchmark-json=out.json")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["mlp-loadbench: compiled ahead: 2 of 2 case(s) in 2 process(es), * s"])
    run = json.loads((pytester.path / "out.json").read_text())
    for bench in run["benchmarks"]:  # each case's first epoch found the caches warm
        assert bench["extra_info"]["kernel_caches"].startswith("warm (compiled ahead in 2 processes, ")
        assert bench["extra_info"]["kernel_caches"].endswith(" s, from cold)")
    settings = run["machine_info"]["loadbench"]["settings"]  # the session's caches at its start
    assert settings["kernel_caches"] == "cold (emptied for this session)"
    ahead = settings["compiled_ahead"]
    assert (ahead["workers"], ahead["cases"], ahead["built"], ahead["failed"]) == (2, 2, 2, [])


@pytest.mark.slow
def test_a_case_that_fails_in_its_worker_is_named_and_its_record_says_what_its_first_epoch_found(project,
                                                                                                pytester) -> None:
    pytester.makepyfile(test_cases=CASES + FAILING_CASE)
    result = project("--compile-workers=auto", "--cold-caches", "--benchmark-json=out.json")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*compiled ahead: 2 of 3 case(s) in * process(es), * s; 1 failed there and compile "
                                 "in their own first epoch: test_cases.py::test_bad"])
    caches = {b["name"]: b["extra_info"]["kernel_caches"]
              for b in json.loads((pytester.path / "out.json").read_text())["benchmarks"]}
    assert caches["test_bad"] == "cold (emptied for this session)"
    assert caches["test_small"].startswith("warm (compiled ahead") and caches["test_other"].startswith("warm")


def test_compile_only_builds_each_case_and_stores_nothing(project, pytester) -> None:
    result = project("--compile-only", "-rs")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["SKIPPED * --compile-only: test_cases.py::test_small (blocks-2): 2 epochs and the "
                                 "evaluation in * s; nothing timed or stored"])
    assert not list(pytester.path.rglob("*.json"))  # pytest-benchmark makes its storage folder, empty


@pytest.mark.parametrize("args, message", [
    (("--compile-only", "--benchmark-autosave"),
     "*--compile-only: nothing is timed, so there is nothing to store or compare: drop --benchmark-autosave"),
    (("--compile-only", "--compile-workers=2"), "*--compile-only with --compile-workers: the workers run*"),
    (("--compile-workers=2", "-n", "2"), "*--compile-workers with pytest-xdist's -n:*"),
    (("--compile-workers=-1",), "*--compile-workers: '-1' is not a number of processes: use 0, a whole number or "
                                "auto"),
])
def test_what_compiling_ahead_cannot_honour_stops_the_session_in_one_line(project, args, message) -> None:
    result = project(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
