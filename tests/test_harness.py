"""The pytest plugin end to end, on the CPU, through pytester."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from model.data import synthesize
from model.data import write_csv

CASES = """
from bench.cases import Case

def test_small(loadbench):
    loadbench.run(Case("blocks", 2), width=32)

def test_other(loadbench):
    loadbench.run(Case("blocks", 3), width=32)
"""

SLOWDOWN = """
import time
import pytest
from model.train import Trainer

@pytest.fixture(autouse=True)
def slower_epochs(monkeypatch):
    original = Trainer._fast_epoch
    def slow(self):
        time.sleep(0.05)
        return original(self)
    monkeypatch.setattr(Trainer, "_fast_epoch", slow)
"""


@pytest.fixture(scope="module")
def tiny_csv(tmp_path_factory) -> Path:
    return write_csv(synthesize(scale=0.02), tmp_path_factory.mktemp("data") / "tiny.csv")


@pytest.fixture
def bench(pytester: pytest.Pytester, tiny_csv: Path):
    """Run the harness in pytester's directory on a tiny CSV."""
    pytester.makeconftest('pytest_plugins = ["bench.plugin"]')
    pytester.makepyfile(test_cases=CASES)

    def run(*args: str, budgets: str | None = None) -> pytest.RunResult:
        extra = []
        if budgets is not None:
            (pytester.path / "budgets.toml").write_text(budgets)
            extra = [f"--budgets={pytester.path / 'budgets.toml'}"]
        return pytester.runpytest_subprocess(
            "-p", "no:cacheprovider", "--device=cpu", "--profile=smoke", "--epochs=8",
            f"--dataset={tiny_csv}", f"--benchmark-storage={pytester.path / 'runs'}", *extra, *args,
        )  # fmt: skip

    return run


def saved_runs(pytester: pytest.Pytester) -> list[Path]:
    return sorted((pytester.path / "runs").glob("*/*.json"))


def test_violated_accuracy_budget_fails_that_test_only_and_keeps_its_record(bench, pytester) -> None:
    result = bench("--benchmark-json=out.json", budgets='[cases."blocks-2"]\naccuracy_min = 0.99\n')
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*blocks-2: 1 budget(s) broken*", "*accuracy = * breaks its limit 0.99*"])
    records = {b["name"]: b["extra_info"] for b in json.loads((pytester.path / "out.json").read_text())["benchmarks"]}
    assert set(records) == {"test_small", "test_other"}
    assert 0 <= records["test_small"]["accuracy"] < 0.99
    assert records["test_small"]["load"]["fields"]["cpu_process"]["mean"] > 0


def test_records_hold_what_the_study_reported(bench, pytester) -> None:
    bench("--benchmark-json=out.json", budgets="").assert_outcomes(passed=2)
    info = json.loads((pytester.path / "out.json").read_text())["benchmarks"][0]["extra_info"]
    for key in ("accuracy", "macro_f1", "weighted_f1", "final_loss", "first_epoch_s", "median_epoch_s",
                "samples_per_s", "tflops", "cost", "load", "energy_j", "throttled", "config", "series_path"):  # fmt: skip
        assert key in info, key
    assert len(info["epoch_seconds_by_round"][0]) == 8
    assert info["load"]["fields"]["gpu_util"] is None  # unavailable on a CPU, not zero
    assert info["energy_j"] is None and info["vram_peak_mib"] is None
    series = Path(info["series_path"])
    assert series.is_file() and series.read_text().startswith("t,epoch,")


def test_run_compared_with_itself_passes(bench, pytester) -> None:
    bench("--benchmark-autosave", budgets="").assert_outcomes(passed=2)
    (run,) = saved_runs(pytester)
    result = bench(f"--benchmark-compare={run}", budgets="[defaults]\naccuracy_drop_max = 0.0\n")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*vs baseline*", "*accuracy +0.0%*"])


def test_injected_slowdown_fails_the_time_gate(bench, pytester) -> None:
    gate = "[defaults]\ntime_slower_pct = 10\ntime_alpha = 0.01\n"
    bench("--benchmark-autosave", budgets=gate).assert_outcomes(passed=2)
    (run,) = saved_runs(pytester)
    pytester.makeconftest('pytest_plugins = ["bench.plugin"]\n' + SLOWDOWN)
    result = bench(f"--benchmark-compare={run}", budgets=gate)
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*epoch_time_ratio = * breaks its limit 1.1*Mann-Whitney U p=*"])


def test_baseline_from_another_gpu_does_not_gate(bench, pytester) -> None:
    gate = "[defaults]\ntime_slower_pct = 10\ntime_hard_ratio = 1.5\n"
    bench("--benchmark-autosave", budgets=gate).assert_outcomes(passed=2)
    (run,) = saved_runs(pytester)
    saved = json.loads(run.read_text())
    saved["machine_info"]["loadbench"]["gpu"] = {"name": "NVIDIA H100 80GB HBM3"}
    run.write_text(json.dumps(saved))
    pytester.makeconftest('pytest_plugins = ["bench.plugin"]\n' + SLOWDOWN)
    result = bench(f"--benchmark-compare={run}", budgets=gate)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*measured on NVIDIA H100 80GB HBM3, this run on no GPU: shown, not gated*"])


def test_pytest_benchmark_compare_reads_our_runs(bench, pytester) -> None:
    bench("--benchmark-autosave", budgets="").assert_outcomes(passed=2)
    (run,) = saved_runs(pytester)
    out = subprocess.run(
        [sys.executable, "-m", "pytest_benchmark", "--storage", str(pytester.path / "runs"), "compare", str(run)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "test_small" in out.stdout and "test_other" in out.stdout


@pytest.mark.parametrize(
    ("budgets", "message"),
    [
        ("[defaults]\naccuracy_mni = 0.5\n", "[defaults]: unknown key 'accuracy_mni' (did you mean 'accuracy_min'?)"),
        ('[cases."blocks-9"]\naccuracy_min = 0.5\n', "[cases.blocks-9]: unknown case id 'blocks-9'"),
        ("[experiments.opt]\naccuracy_min = 'high'\n", "accuracy_min = 'high' must be a number"),
        ("[defaults]\naccuracy_min = 1.5\n", "accuracy_min = 1.5 must be between 0 and 1"),
        ("[profiles.fast.defaults]\naccuracy_min = 0.5\n", "unknown profile 'fast'"),
        ("[default]\naccuracy_min = 0.5\n", "unknown table 'default' (did you mean 'defaults'?)"),
        ("[defaults\n", "not valid TOML"),
    ],
    ids=["typo-key", "unknown-case", "wrong-type", "out-of-range", "unknown-profile", "unknown-table", "bad-toml"],
)
def test_bad_budgets_file_is_a_clear_startup_error(bench, budgets, message) -> None:
    result = bench(budgets=budgets)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()


def test_missing_budgets_file_is_named(bench) -> None:
    result = bench("--budgets=nowhere.toml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*nowhere.toml: budgets file not found*"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--profile=fast"], "*--profile: invalid choice: 'fast'*"),
        (["--device=gpu"], "*'gpu' is not a device: use auto, cpu, cuda or cuda:N*"),
        (["--monitor-period=0"], "*'0': the monitor period must be between 0.001 and 60 s*"),
        (["--dataset=missing.csv"], "*--dataset missing.csv: no such file*"),
        (["--loop=turbo"], "*--loop: invalid choice: 'turbo'*"),
        (["--epochs=-3"], "*'-3' is not a positive integer*"),
    ],
)
def test_bad_options_give_usage_errors(pytester, args, message) -> None:
    pytester.makeconftest('pytest_plugins = ["bench.plugin"]')
    result = pytester.runpytest_subprocess(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_bad_strict_fp32_choice_is_a_usage_error(pytester, monkeypatch) -> None:
    pytester.makeconftest('pytest_plugins = ["bench.plugin"]')
    monkeypatch.setenv("LOADBENCH_STRICT_FP32", "fp64")
    result = pytester.runpytest_subprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*LOADBENCH_STRICT_FP32='fp64': use one of ieee, tf32x3*"])


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the no-GPU error")
def test_asking_for_a_missing_gpu_is_a_usage_error(pytester) -> None:
    pytester.makeconftest('pytest_plugins = ["bench.plugin"]')
    result = pytester.runpytest_subprocess("--device=cuda")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--device cuda: no CUDA GPU is visible to torch on this machine*"])


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "corrupt JSON at line 1"),
        ('{"hello": 1}', "not a pytest-benchmark run file"),
        ('{"benchmarks": [], "machine_info": {}}', "not made by mlp-loadbench"),
    ],
    ids=["corrupt", "foreign-json", "foreign-run"],
)
def test_corrupt_or_foreign_baseline_is_a_clear_error(bench, pytester, content, message) -> None:
    baseline = pytester.path / "baseline.json"
    baseline.write_text(content)
    result = bench(f"--benchmark-compare={baseline}", budgets="")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()


def test_malformed_dataset_stops_the_session_with_its_message(pytester, tmp_path) -> None:
    pytester.makeconftest('pytest_plugins = ["bench.plugin"]')
    pytester.makepyfile(test_cases=CASES)
    bad = tmp_path / "bad.csv"
    bad.write_text("video_name,video_frame,skill_id\nv,0,FL\n")
    result = pytester.runpytest_subprocess("--device=cpu", f"--dataset={bad}")
    result.stdout.fnmatch_lines(["*bad.csv: expected 75 feature columns*"])
    assert result.ret != 0


def test_out_of_memory_fails_the_case_with_its_configuration(bench, pytester) -> None:
    pytester.makeconftest(
        'pytest_plugins = ["bench.plugin"]\n'
        "import pytest, torch\nfrom model.train import Trainer\n"
        "@pytest.fixture(autouse=True)\ndef oom(monkeypatch):\n"
        "    def fail(self, *a, **k):\n        raise torch.cuda.OutOfMemoryError('CUDA out of memory. Tried to allocate 80 GiB')\n"
        "    monkeypatch.setattr(Trainer, 'fit', fail)\n"
    )
    result = bench(budgets="")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*blocks-2: out of GPU memory (batch 512, width 32, depth 2) on cpu: CUDA out of memory*"])


def test_session_header_names_the_profile_and_why(pytester) -> None:
    pytester.makeconftest('pytest_plugins = ["bench.plugin"]')
    result = pytester.runpytest_subprocess("--device=cpu", "--collect-only")
    result.stdout.fnmatch_lines(["*mlp-loadbench: profile smoke (default for this machine)*"])
