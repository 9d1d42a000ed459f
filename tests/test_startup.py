"""Bad input found at start-up: one line naming what and where, exit 4, no traceback,
nothing trained or written first (bench/plugin/startup.py, kernels/ground/env.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from pytest_benchmark.plugin import pytest_benchmark_generate_machine_info

from kernels.ground.args import directory_problem
from bench.plugin.options import Plant
from bench.plugin.options import plant_on
from bench.plugin.startup import compare_path
from bench.plugin.startup import compare_problem
from kernels.ground.args import file_problem
from bench.plugin.startup import json_path
from bench.tools.merge import main as merge_main
from kernels.ground import env

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
RUN_NAME = "Linux-CPython-3.11-64bit/0001_abc_20260101_000000.json"

BAD = [  # (command-line arguments, environment, the one line after 'ERROR: ', a stored run present)
    (["--benchmark-compare=missing/nope.json"], {},
     "--benchmark-compare missing/nope.json: no such file (*missing/nope.json); the storage .benchmarks holds "
     f"1 run(s), the newest {RUN_NAME} (give a run number or a file)", True),
    (["--benchmark-compare=file://missing/nope.json"], {},
     "--benchmark-compare file://missing/nope.json: no such file (*missing/nope.json), "
     "and the storage .benchmarks holds no runs yet", False),
    ([], {"LOADBENCH_TUNE": "bogus"}, "LOADBENCH_TUNE='bogus': use one of off, cache, always", False),
    ([], {"LOADBENCH_TUNE_THREADS": "abc"}, "LOADBENCH_TUNE_THREADS='abc': a whole number, 1 or more", False),
    ([], {"LOADBENCH_COMPILE_PROCESSES": "-1"},
     "LOADBENCH_COMPILE_PROCESSES='-1': a whole number of processes, 0 or more (0: compile on threads only)", False),
    ([], {"LOADBENCH_COMPILE_PROCESSES": "abc"}, "LOADBENCH_COMPILE_PROCESSES='abc': a whole number*", False),
    ([], {"LOADBENCH_FUSED_FORWARD": "bogus"},
     "LOADBENCH_FUSED_FORWARD='bogus': use 1 (one launch for a few-row forward) or 0 (layer by layer)", False),
    ([], {"LOADBENCH_DP_BUCKET_MB": "abc"}, "LOADBENCH_DP_BUCKET_MB='abc': a bucket size in MiB, 0 or more*", False),
    ([], {"LOADBENCH_DP_GRAPH": "maybe"}, "LOADBENCH_DP_GRAPH='maybe': use 1 (replay from CUDA graphs*", False),
    ([], {"LOADBENCH_STRICT_FP32": "fast"}, "LOADBENCH_STRICT_FP32='fast': use one of ieee, tf32x3", False),
    ([], {"LOADBENCH_TUEN": "off"},
     "LOADBENCH_TUEN is not a variable mlp-loadbench reads (they are: LOADBENCH_TUNE, *)", False),
    ([], {"LOADBENCH_MODEL_CACHE": "a-file"}, "LOADBENCH_MODEL_CACHE=a-file: is a file; give a directory", False),
    ([], {"LOADBENCH_CACHE_DIR": "a-file/sub"}, "LOADBENCH_CACHE_DIR=a-file/sub: a-file is a file, not a directory",
     False),
    (["--series-dir", "a-file"], {}, "--series-dir a-file: is a file; give a directory", False),
    (["--series-dir", "a-file/sub"], {}, "--series-dir a-file/sub: a-file is a file, not a directory", False),
    (["--budgets", "."], {}, ".: is a directory; give the budgets TOML file", False),
    (["--benchmark-compare-fail=median:10%"], {},
     "--benchmark-compare-fail: needs --benchmark-compare, the baseline its thresholds judge against*", False),
    (["--benchmark-compare", "--benchmark-compare-fail=median:10%"], {},
     "--benchmark-compare-fail: no saved run to compare with yet in *", False),
    (["--benchmark-disable", "--benchmark-autosave"], {},
     "--benchmark-disable with --benchmark-autosave: a disabled run times nothing and pytest-benchmark stores "
     "nothing; drop one of them", False),
    (["--benchmark-disable", "--benchmark-save=x"], {}, "--benchmark-disable with --benchmark-save: *", False),
    (["--benchmark-disable", "--benchmark-json=out.json"], {}, "--benchmark-disable with --benchmark-json: *",
     False),
]


@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    # This checkout's bench/ first, ahead of any installed copy of the project.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    pytester.makeconftest('pytest_plugins = ["bench.plugin"]\n')
    pytester.makepyfile(test_case="def test_case():\n    pass\n")
    (pytester.path / "a-file").write_text("in the way\n")
    return pytester


@pytest.mark.parametrize(("args", "environ", "line", "stored"), BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_input_is_one_line_and_a_usage_error(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
    args: list[str], environ: dict[str, str], line: str, stored: bool,
) -> None:
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    if stored:
        (suite.path / ".benchmarks" / RUN_NAME).parent.mkdir(parents=True)
        shutil.copy(DATA / "inference-run.json", suite.path / ".benchmarks" / RUN_NAME)
    result = suite.runpytest_inprocess("--collect-only", "-q", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    said = [text for text in result.stderr.lines if text.strip()]
    assert len(said) == 1, said
    result.stderr.fnmatch_lines([f"ERROR: {line}"])
    assert "collected" not in result.stdout.str()


@pytest.mark.parametrize(("args", "said"), [
    (["--benchmark-json", "a-file/out.json"], "not a directory"),
    (["--benchmark-json", "."], "is a directory"),
    (["--benchmark-autosave", "--benchmark-storage", "a-file/runs"], "not a directory"),
], ids=["json-under-a-file", "json-a-directory", "storage-under-a-file"])
def test_an_output_path_that_cannot_be_written_is_refused_before_anything_runs(
    suite: pytest.Pytester, args: list[str], said: str
) -> None:
    """The suite checks its output paths itself: pytest-benchmark 5.2 opened --benchmark-json
    while parsing (its own one-line error), 5.3 only after every case had trained."""
    result = suite.runpytest_inprocess("--collect-only", "-q", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    lines = [text for text in result.stderr.lines if text.strip()]
    # One line of ours; before 5.3, pytest-benchmark's parser refused the JSON path first, with its usage.
    assert len(lines) == 1 or lines[0].startswith("ERROR: usage:"), lines
    assert any(args[-1] in line and said in line.lower() for line in lines), lines
    assert "collected" not in result.stdout.str()


def test_an_output_file_is_checked_where_it_would_land(tmp_path: Path) -> None:
    assert file_problem(tmp_path / "new" / "run.json") is None and (tmp_path / "new").is_dir()
    assert file_problem(tmp_path) == "is a directory; give a file path"
    (tmp_path / "f").write_text("")
    assert file_problem(tmp_path / "f" / "run.json") == f"{tmp_path / 'f'} is a file, not a directory"
    assert json_path(None) is None and json_path("a/b.json") == Path("a/b.json")


@pytest.mark.parametrize("args", [["--shard", "-1/2"], ["--shard"]], ids=["negative", "missing"])
def test_a_shard_that_argparse_would_read_as_an_option_says_what_a_shard_is(suite: pytest.Pytester,
                                                                             args: list[str]) -> None:
    result = suite.runpytest_inprocess("--collect-only", "-q", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "expected one argument" not in result.stderr.str()
    result.stderr.fnmatch_lines(["*argument --shard: expected I/N after it, e.g. 1/4: none was given, or it began "
                                 "with '-' (-1/2 reads as an option; a shard index counts from 1)"])
    assert suite.runpytest_inprocess("--collect-only", "-q", "--shard=-1/2").ret == pytest.ExitCode.USAGE_ERROR
    assert suite.runpytest_inprocess("--collect-only", "-q", "--shard", "1/2").ret == pytest.ExitCode.OK


def test_a_shard_left_empty_by_k_is_named(suite: pytest.Pytester) -> None:
    suite.makepyfile(test_case="def test_a():\n    pass\n\ndef test_b():\n    pass\n\ndef test_c():\n    pass\n")
    result = suite.runpytest_inprocess("-q", "-p", "no:cacheprovider", "--shard", "3/3", "-k", "test_a or test_b")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    result.stdout.fnmatch_lines(["mlp-loadbench: shard 3/3 of the 2 selected case(s) holds none: nothing ran "
                                 "(exit 5, no tests)*"])
    ran = suite.runpytest_inprocess("-q", "-p", "no:cacheprovider", "--shard", "2/3", "-k", "test_a or test_b")
    assert ran.ret == pytest.ExitCode.OK and "holds none" not in ran.stdout.str()
    nothing = suite.runpytest_inprocess("-q", "-p", "no:cacheprovider", "--shard", "3/3", "-k", "test_z")
    assert nothing.ret == pytest.ExitCode.NO_TESTS_COLLECTED and "holds none" not in nothing.stdout.str()


def test_a_missing_series_folder_is_made_at_start_up(suite: pytest.Pytester) -> None:
    result = suite.runpytest_inprocess("--collect-only", "-q", "--series-dir", "new/series")
    assert result.ret == pytest.ExitCode.OK
    assert (suite.path / "new" / "series").is_dir()


def test_a_baseline_given_as_a_file_url_reads_as_its_path(tmp_path: Path) -> None:
    run = tmp_path / "run.json"
    run.write_text("{}")
    assert compare_path(f"file://{run}") == str(run)
    assert compare_path("file://nowhere.json") == "file://nowhere.json"
    assert compare_path(True) is True


def test_run_ids_and_globs_are_left_to_the_session(tmp_path: Path) -> None:
    stored = tmp_path / RUN_NAME
    stored.parent.mkdir(parents=True)
    stored.write_text("{}")
    assert compare_problem("0001", str(tmp_path)) is None  # an id the session's own check resolves
    assert compare_problem("Linux-*/0001", f"file://{tmp_path}") is None
    assert compare_problem(str(stored), str(tmp_path)) is None
    assert compare_problem(True, str(tmp_path)) is None
    assert compare_problem("a/b/c.json", str(tmp_path)).startswith("--benchmark-compare a/b/c.json: no such file")


def test_a_folder_is_made_or_named_as_the_problem(tmp_path: Path) -> None:
    assert directory_problem(tmp_path / "x" / "y") is None and (tmp_path / "x" / "y").is_dir()
    (tmp_path / "f").write_text("")
    assert directory_problem(tmp_path / "f") == "is a file; give a directory"
    assert directory_problem(tmp_path / "f" / "sub") == f"{tmp_path / 'f'} is a file, not a directory"


def test_valid_variables_read_as_before() -> None:
    environ = {"LOADBENCH_TUNE": "always", "LOADBENCH_TUNE_THREADS": "4", "LOADBENCH_COMPILE_PROCESSES": "0",
               "LOADBENCH_DP_GRAPH": " True ", "LOADBENCH_DP_BUCKET_MB": "0.5", "LOADBENCH_FUSED_FORWARD": "0"}
    assert env.validate_all(environ) is None
    assert [env.read(name, environ) for name in environ] == ["always", 4, 0, True, 0.5, "0"]
    assert [env.read(name, {}) for name in environ] == ["cache", 8, None, True, 1.0, "1"]  # the defaults
    assert {row[0] for row in env.table()} == set(env.BY_NAME)


# Every command that reads a LOADBENCH_* variable, itself or through kernels/ and model/:
# (its module, arguments that would otherwise start work, the name its one line begins with).
TOOLS = [
    ("bench.tools.step_phases", [], "python -m bench.tools.step_phases"),
    ("bench.tools.tune", ["--dry-run"], "bench.tools.tune"),
    ("bench.tools.bench_cells", ["--device", "cpu"], "bench.tools.bench_cells"),
    ("bench.tools.databranch", ["pull", "--out", "pulled"], "mlp-loadbench history"),
    ("bench.tools.selftest", ["-k", "units"], "mlp-loadbench selftest"),
    ("bench.search", ["--out", "searched"], "mlp-loadbench search"),
]


@pytest.mark.parametrize(("module", "args", "prog"), TOOLS, ids=[tool[0] for tool in TOOLS])
@pytest.mark.parametrize(("name", "value"), [("LOADBENCH_FUSED_STEP", "bogus"), ("LOADBENCH_STRICT_FP32", "fast"),
                                             ("LOADBENCH_TUEN", "off")])
def test_every_command_refuses_a_bad_variable_in_one_line(tmp_path: Path, module: str, args: list[str], prog: str,
                                                          name: str, value: str) -> None:
    if module == "bench.search" and importlib.util.find_spec("optuna") is None:
        pytest.skip("the search needs optuna")
    environ = {k: v for k, v in os.environ.items() if not k.startswith(env.PREFIX)}
    environ |= {name: value, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", module, *args], cwd=tmp_path, env=environ, capture_output=True,
                          text=True, timeout=300)
    expected = env.validate_all({name: value})
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"{prog}: {expected}\n")
    assert not any(tmp_path.iterdir())  # refused before anything was made


def test_a_module_that_keeps_a_value_from_its_import_imports_with_a_bad_one() -> None:
    """The import reads the fallback; the command's `check` refuses the value before it is used."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(env.PREFIX)}
    environ |= {"LOADBENCH_FUSED_STEP": "bogus", "LOADBENCH_FUSED_FORWARD": "2", "LOADBENCH_STRICT_FP32": "x",
                "PYTHONPATH": str(ROOT)}
    code = ("from kernels.ops import mlp_step, mlp_forward; from kernels.plan import launch_plan; "
            "print(mlp_step.SWITCH, mlp_forward.ENABLED, launch_plan.STRICT_FP32)")
    done = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=300)
    assert (done.returncode, done.stdout) == (0, "auto True tf32x3\n"), done.stderr
    assert env.read_at_import("LOADBENCH_FUSED_STEP", {"LOADBENCH_FUSED_STEP": "1"}) == "1"


def test_check_exits_2_with_the_commands_name_and_passes_good_values(capsys: pytest.CaptureFixture[str]) -> None:
    env.check("prog", {"LOADBENCH_TUNE": "off", "PATH": "/bin"})
    with pytest.raises(SystemExit) as exit_:
        env.check("prog", {"LOADBENCH_TUNE": "sometimes"})
    assert exit_.value.code == 2
    assert capsys.readouterr().err == "prog: LOADBENCH_TUNE='sometimes': use one of off, cache, always\n"


def test_a_gpu_plant_on_a_cpu_records_the_host_sleep_that_runs() -> None:
    planted = plant_on(Plant(0.05, "gpu"), torch.device("cpu"))
    assert (str(planted), planted.note is not None) == ("5%:host", True)
    assert "host sleeps instead" in planted.note
    assert plant_on(Plant(0.05, "gpu"), torch.device("cuda")) == Plant(0.05, "gpu")
    assert plant_on(None, torch.device("cpu")) is None


def test_the_search_and_merge_commands_describe_themselves(capsys: pytest.CaptureFixture[str]) -> None:
    # The search's command line imports optuna (the test extra has it; a bare GPU host may not).
    search_parser = pytest.importorskip("bench.search.cli", reason="the search needs optuna").parser
    assert "Command line of" not in search_parser().description
    assert "Pareto front" in search_parser().description
    with pytest.raises(SystemExit):
        merge_main(["--help"])
    shown = capsys.readouterr().out
    assert "the merged run file to write" in shown and "the run files of the shards" in shown


def test_a_baseline_with_other_epochs_is_named_in_one_short_line(suite: pytest.Pytester) -> None:
    """pytest-benchmark's own warning prints both machine_info dicts whole, kilobytes on one line."""
    machine_info = pytest_benchmark_generate_machine_info()
    machine_info["loadbench"] = {"gpu": None, "settings": {"profile": "smoke", "epochs": 8, "dataset": "synthetic"}}
    stored = {"machine_info": machine_info, "commit_info": {"id": "abc"}, "datetime": "2026-01-01T00:00:00",
              "version": "5.2.3", "benchmarks": []}
    (suite.path / "baseline.json").write_text(json.dumps(stored))
    # A process of its own: in this one, the warning would go to this session's warnings.
    result = suite.runpytest_subprocess("--collect-only", "-q", "--profile=smoke", "--epochs=2",
                                        "--benchmark-compare=baseline.json")
    said = result.stdout.lines + result.stderr.lines
    assert result.ret == pytest.ExitCode.OK
    assert "Benchmark machine_info is different" not in "\n".join(said)
    assert max(len(line) for line in said) < 300, max(said, key=len)
    result.stderr.fnmatch_lines(["*: baseline machine_info differs (this run vs baseline): settings epochs 2 vs 8*"])
