"""The pytest plugin end to end, on the CPU, through pytester."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from bench.gate.runs import read_run
from bench.gate.runs import run_state
from tests.projects import CASES
from tests.projects import CONFTEST
from tests.projects import GATE
from tests.projects import PLANTED_TIMER
from tests.projects import TIMER


@pytest.fixture
def bench(inprocess_ready: None, pytester: pytest.Pytester, tiny_csv: Path):
    """Run the harness in pytester's directory on a tiny CSV, with planted epoch times.

    A run is a pytest session inside this process (torch and its compiler stack are loaded
    once per worker, not once per run; pytester drops the modules a run imports, the
    planted timer's count included). `isolated=True` starts a process of its own, for a
    run that is interrupted or kills itself; a conftest patches shared code only through
    monkeypatch, which undoes it."""
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_cases=CASES, planted=PLANTED_TIMER)
    pytester.syspathinsert()

    def run(*args: str, budgets: str | None = None, isolated: bool = False) -> pytest.RunResult:
        extra = []
        if budgets is not None:
            (pytester.path / "budgets.toml").write_text(budgets)
            extra = [f"--budgets={pytester.path / 'budgets.toml'}"]
        start = pytester.runpytest_subprocess if isolated else pytester.runpytest_inprocess
        return start(
            "-p", "no:cacheprovider", "--device=cpu", "--profile=smoke", "--epochs=8", TIMER, "--time-gate=on",
            f"--dataset={tiny_csv}", f"--benchmark-storage={pytester.path / 'runs'}", *extra, *args,
        )

    return run


def saved_runs(pytester: pytest.Pytester) -> list[Path]:
    return sorted((pytester.path / "runs").glob("*/*.json"))


def test_a_cpu_run_is_not_gated_on_time_unless_asked_and_says_so(bench, pytester, monkeypatch) -> None:
    monkeypatch.setenv("PLANTED_EPOCH_S", "0.1")
    bench("--benchmark-autosave", budgets=GATE).assert_outcomes(passed=2)
    monkeypatch.setenv("PLANTED_EPOCH_S", "0.3")  # every epoch three times as slow: past even the hard ratio
    result = bench(f"--benchmark-compare={saved_runs(pytester)[-1]}", "--time-gate=auto",
                   "--benchmark-json=out.json", budgets=GATE)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*time not gated on a CPU*--time-gate on gates it*"])
    for bench_ in json.loads((pytester.path / "out.json").read_text())["benchmarks"]:
        verdict = bench_["extra_info"]["verdict"]
        assert verdict["status"] == "ok" and "time not gated on a CPU" in verdict["reason"]
        assert bench_["extra_info"]["time_gate"]["not_gated"].startswith("time not gated on a CPU")


def test_violated_accuracy_budget_fails_that_test_only_and_keeps_its_record(bench, pytester) -> None:
    result = bench("--benchmark-json=out.json", budgets='[datasets."tiny.csv".cases."blocks-2"]\naccuracy_min = 0.99\n')
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
                "samples_per_s", "tflops", "cost", "load", "energy_j", "throttled", "config", "series_path"):
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
    compared = [line for line in result.stdout.lines if "accuracy +0.0%" in line]
    assert compared and not any("!" in line for line in compared)  # nothing broke a limit: nothing marked


def test_injected_slowdown_fails_the_time_gate(bench, pytester, monkeypatch) -> None:
    monkeypatch.setenv("PLANTED_EPOCH_S", "0.1")
    bench("--benchmark-autosave", budgets=GATE).assert_outcomes(passed=2)
    (run,) = saved_runs(pytester)
    monkeypatch.setenv("PLANTED_EPOCH_S", "0.14")  # +40%: beyond the 25% assumed without history
    result = bench(f"--benchmark-compare={run}", budgets=GATE)
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*epoch_time_ratio = 1.4 breaks its limit 1.25*noise unknown*Mann-Whitney U p=*"])
    result.stdout.fnmatch_lines(["*median +40.0%!*"])


def test_stored_history_sets_the_noise_bound(bench, pytester, monkeypatch) -> None:
    """+15%: inside the conservative bound of a lone baseline; caught once three quiet
    runs are stored (spread ~1%, so the 10% budget decides); passed again for a case
    whose stored runs scatter by ~10%."""
    def store(seconds: str) -> None:
        monkeypatch.setenv("PLANTED_EPOCH_S", seconds)
        bench("--benchmark-autosave", budgets=GATE).assert_outcomes(passed=2)

    def compare(seconds: str) -> pytest.RunResult:
        monkeypatch.setenv("PLANTED_EPOCH_S", seconds)
        return bench(f"--benchmark-compare={saved_runs(pytester)[-1]}", budgets=GATE)

    store("0.100")
    lone = compare("0.115")
    lone.assert_outcomes(passed=2)
    lone.stdout.fnmatch_lines(["*time gate: noise bound unknown for 2 case(s)*"])
    store("0.101")
    store("0.099")
    quiet = compare("0.1135")
    quiet.assert_outcomes(failed=2)
    quiet.stdout.fnmatch_lines(["*limit from budget 10%*run-to-run spread*3 stored run(s)*",
                                "*time gate: 2 case(s) judged against their run-to-run spread*"])
    store("0.112")
    store("0.089")
    store("0.100")
    noisy = compare("0.115")  # +15% over the newest, inside 3 spreads (7.3%) of these six runs
    noisy.assert_outcomes(passed=2)


def test_baseline_from_another_gpu_does_not_gate(bench, pytester, monkeypatch) -> None:
    gate = "[defaults]\ntime_slower_pct = 10\ntime_hard_ratio = 1.5\n"
    bench("--benchmark-autosave", budgets=gate).assert_outcomes(passed=2)
    (run,) = saved_runs(pytester)
    saved = json.loads(run.read_text())
    saved["machine_info"]["loadbench"]["gpu"] = {"name": "NVIDIA H100 80GB HBM3"}
    run.write_text(json.dumps(saved))
    monkeypatch.setenv("PLANTED_EPOCH_S", "0.3")
    result = bench(f"--benchmark-compare={run}", budgets=gate)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*baseline ran on NVIDIA H100 80GB HBM3, this run on no GPU: shown, not gated*"])


def test_pytest_benchmark_compare_reads_our_runs(bench, pytester) -> None:
    bench("--benchmark-autosave", budgets="").assert_outcomes(passed=2)
    (run,) = saved_runs(pytester)
    out = subprocess.run(
        [sys.executable, "-m", "pytest_benchmark", "--storage", str(pytester.path / "runs"), "compare", str(run)],
        capture_output=True, text=True, check=True,
    )
    assert "test_small" in out.stdout and "test_other" in out.stdout


@pytest.mark.parametrize(
    ("budgets", "message"),
    [
        ("[defaults]\naccuracy_mni = 0.5\n", "[defaults]: unknown key 'accuracy_mni' (did you mean 'accuracy_min'?)"),
        ('[cases."blocks-9"]\naccuracy_min = 0.5\n', "[cases.\"blocks-9\"]: unknown case id 'blocks-9'"),
        ("[defaults]\naccuracy_min = 0.5\n",
         "accuracy_min is a floor or ceiling, which holds for one dataset: set it under [datasets.synthetic.defaults]"),
        ("[experiments.opt]\naccuracy_min = 'high'\n", "accuracy_min = 'high' must be a number"),
        ("[defaults]\naccuracy_min = 1.5\n", "accuracy_min = 1.5 must be between 0 and 1"),
        ("[profiles.fast.defaults]\naccuracy_min = 0.5\n", "unknown profile 'fast'"),
        ("[default]\naccuracy_min = 0.5\n", "unknown table 'default' (did you mean 'defaults'?)"),
        ("[defaults\n", "not valid TOML"),
    ],
    ids=["typo-key", "unknown-case", "floor-outside-a-dataset", "wrong-type", "out-of-range", "unknown-profile",
         "unknown-table", "bad-toml"],
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
        (["--shard=1/0"], "*'1/0': the shard count must be at least 1*"),
        (["--shard=3/2"], "*'3/2': the shard index must be between 1 and 2*"),
        (["--dataset=."], "*--dataset .: is a directory, not a CSV file*"),
        (["--series-dir=conftest.py"], "*--series-dir conftest.py: is a file; give a directory*"),
        (["--plant-slowdown=5:cpu"], "*'5:cpu': use a percentage in (0, 1000] and mode host or gpu*"),
    ],
)
def test_bad_options_give_usage_errors(pytester, args, message) -> None:
    pytester.makeconftest('pytest_plugins = ["bench.plugin"]')
    result = pytester.runpytest_inprocess(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_bad_strict_fp32_choice_is_a_usage_error(pytester, monkeypatch) -> None:
    pytester.makeconftest('pytest_plugins = ["bench.plugin"]')
    monkeypatch.setenv("LOADBENCH_STRICT_FP32", "fp64")
    result = pytester.runpytest_inprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*LOADBENCH_STRICT_FP32='fp64': use one of ieee, tf32x3*"])


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the no-GPU error")
def test_asking_for_a_missing_gpu_is_a_usage_error(pytester) -> None:
    pytester.makeconftest('pytest_plugins = ["bench.plugin"]')
    result = pytester.runpytest_inprocess("--device=cuda")
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


def test_malformed_dataset_stops_the_session_at_start_up(pytester, tmp_path) -> None:
    pytester.makeconftest('pytest_plugins = ["bench.plugin"]')
    pytester.makepyfile(test_cases=CASES)
    bad = tmp_path / "bad.csv"
    bad.write_text("video_name,video_frame,skill_id\nv,0,FL\n")
    result = pytester.runpytest_inprocess("--device=cpu", f"--dataset={bad}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --dataset: *bad.csv: *"])
    assert "fixture was not used" not in result.stdout.str() + result.stderr.str()
    assert "passed" not in result.stdout.str()  # no case ran


def test_out_of_memory_fails_the_case_with_its_configuration(bench, pytester) -> None:
    pytester.makeconftest(
        'pytest_plugins = ["bench.plugin"]\n'
        "import pytest, torch\nfrom model.train import Trainer\n"
        "@pytest.fixture(autouse=True)\ndef oom(monkeypatch):\n"
        "    def fail(self, *a, **k):\n"
        "        raise torch.cuda.OutOfMemoryError('CUDA out of memory. Tried to allocate 80 GiB')\n"
        "    monkeypatch.setattr(Trainer, 'run_epoch', fail)\n"
    )
    result = bench(budgets="")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        ["*blocks-2: out of GPU memory (batch 512, width 32, depth 2) on cpu: CUDA out of memory*"])


def test_session_header_names_the_profile_and_why(pytester) -> None:
    pytester.makeconftest('pytest_plugins = ["bench.plugin"]')
    result = pytester.runpytest_inprocess("--device=cpu", "--collect-only")
    result.stdout.fnmatch_lines(["*mlp-loadbench: profile smoke (default for this machine)*"])


def test_compare_with_a_baseline_stored_outside_the_checkout_and_other_settings(bench, pytester,
                                                                               tmp_path_factory) -> None:
    """The self-hosted workflow keeps its baselines outside the checkout: a baseline with
    other settings (here epochs) there is shown, not gated, and nothing crashes."""
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    bench("--benchmark-autosave", f"--benchmark-storage={elsewhere}", "--epochs=3",
          budgets="").assert_outcomes(passed=2)
    (run,) = sorted(elsewhere.glob("*/*.json"))
    for compare in (f"--benchmark-compare={run}", "--benchmark-compare=0001"):
        result = bench(f"--benchmark-storage={elsewhere}", compare, "--epochs=4", budgets="")
        assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
        result.assert_outcomes(passed=2)
        result.stdout.fnmatch_lines(["*baseline ran epochs=3, this run epochs=4: shown, not gated*"])


def test_a_baseline_from_before_latency_pin_gates_and_one_with_the_other_pin_does_not(bench, pytester) -> None:
    """--latency-pin changes what batch-1 latency measures: a baseline made with the other
    setting is shown, not gated. A baseline stored before the setting existed ran unpinned."""
    bench("--benchmark-autosave", budgets="").assert_outcomes(passed=2)
    (run,) = saved_runs(pytester)
    stored = json.loads(run.read_text())
    assert stored["machine_info"]["loadbench"]["settings"]["latency_pin"] is False
    del stored["machine_info"]["loadbench"]["settings"]["latency_pin"]
    run.write_text(json.dumps(stored))

    unpinned = bench("--benchmark-compare=0001", budgets="")
    unpinned.assert_outcomes(passed=2)
    assert "shown, not gated" not in unpinned.stdout.str()
    pinned = bench("--benchmark-compare=0001", "--latency-pin=on", budgets="")
    pinned.assert_outcomes(passed=2)
    pinned.stdout.fnmatch_lines(["*baseline ran latency_pin=False, this run latency_pin=True: shown, not gated*"])


def test_an_unknown_latency_pin_value_is_a_usage_error(bench) -> None:
    result = bench("--latency-pin=sometimes")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--latency-pin: invalid choice: 'sometimes' (choose from*off*on*"])


INTERRUPT_SECOND = """
import pytest
from model.train import Trainer

@pytest.fixture(autouse=True)
def ctrl_c_in_the_second_case(request, monkeypatch):
    if request.node.name == "test_other":
        def interrupted(self, *args, **kwargs):
            raise KeyboardInterrupt
        monkeypatch.setattr(Trainer, "run_epoch", interrupted)
"""


@pytest.mark.parametrize("save", ["--benchmark-json=out.json", "--benchmark-autosave"])
def test_ctrl_c_saves_the_finished_cases_and_says_so(bench, pytester, save) -> None:
    pytester.makeconftest(CONFTEST + INTERRUPT_SECOND)
    result = bench(save, budgets="", isolated=True)
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.INTERRUPTED
    assert "min() arg is an empty sequence" not in output and "INTERNALERROR" not in output
    result.stdout.fnmatch_lines(
        ["*mlp-loadbench: interrupted: saved the finished cases; left out *test_other (cut short)"])
    saved = pytester.path / "out.json" if "json" in save else saved_runs(pytester)[0]
    names = [b["name"] for b in json.loads(saved.read_text())["benchmarks"]]
    assert names == ["test_small"]
    assert run_state(read_run(saved)).state == "interrupted"


INTERRUPT_MIDWAY = """
import pytest
from model.train import Trainer

@pytest.fixture(autouse=True)
def ctrl_c_in_the_fourth_epoch_of_the_second_case(request, monkeypatch):
    if request.node.name == "test_other":
        calls = []
        run_epoch = Trainer.run_epoch
        def interrupted(self, *args, **kwargs):
            calls.append(1)
            if len(calls) == 4:
                raise KeyboardInterrupt
            return run_epoch(self, *args, **kwargs)
        monkeypatch.setattr(Trainer, "run_epoch", interrupted)
"""


def test_a_case_cut_short_after_some_epochs_is_never_stored_and_the_run_says_it_was_interrupted(
    bench, pytester
) -> None:
    """pytest-benchmark holds the three timed epochs the case had; stored, they would read as
    a measurement of it (no accuracy, no verdict) and become a baseline."""
    pytester.makeconftest(CONFTEST + INTERRUPT_MIDWAY)
    result = bench("--benchmark-json=out.json", budgets="", isolated=True)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    run = read_run(pytester.path / "out.json")
    assert [b["name"] for b in run["benchmarks"]] == ["test_small"]
    state = run_state(run)
    assert (state.state, state.collected, state.stored) == ("interrupted", 2, 1)
    assert [name.rsplit("::", 1)[-1] for name in state.cut_short] == ["test_other"]
    assert not state.whole and "interrupted: it holds 1 finished case(s) of 2 collected" in state.line()


def test_nothing_is_written_beside_an_unsaved_run(bench, pytester) -> None:
    result = bench("--benchmark-json=out.json", budgets="")
    result.assert_outcomes(passed=2)
    assert (pytester.path / "runs" / "series").is_dir()  # a stored run keeps its series
    (pytester.path / "out.json").unlink()
    shutil.rmtree(pytester.path / "runs")
    bench(budgets="").assert_outcomes(passed=2)
    assert not (pytester.path / "runs" / "series").exists()
    assert not list(pytester.path.rglob("*.csv"))


def test_cpu_tables_print_gpu_figures_as_unavailable(bench, pytester) -> None:
    result = bench("--benchmark-json=out.json", budgets="")
    result.assert_outcomes(passed=2)
    info = json.loads((pytester.path / "out.json").read_text())["benchmarks"][0]["extra_info"]
    normalized = info["load"]["normalized"]
    assert normalized["gpu_busy"] is None and normalized["sm_activity"] is None and normalized["vram"] is None
    header = next(line for line in result.stdout.lines if "GPU busy" in line)
    row = next(line for line in result.stdout.lines if line.startswith("| 2 "))
    cells = dict(zip([c.strip() for c in header.split("|")], [c.strip() for c in row.split("|")]))
    assert cells["GPU busy"] == cells["SM act."] == cells["VRAM MiB"] == cells["Energy J"] == "n/a"
    assert cells["CPU"] != "n/a"


def test_a_users_dataset_gets_no_floors_set_for_the_embedded_data(bench, pytester) -> None:
    floors = '[datasets.synthetic.defaults]\naccuracy_min = 0.99\n'
    result = bench(budgets=floors)
    result.assert_outcomes(passed=2)  # 0.99 was set for the generator, not for tiny.csv
    result.stdout.fnmatch_lines(
        ["*no floors or ceilings for dataset 'tiny.csv' in *budgets.toml (it sets them for: synthetic)*"])
    result.stdout.fnmatch_lines(["*profile smoke: every frame of tiny.csv, 8 epochs*"])


def test_planted_slowdown_is_a_fraction_of_each_measured_epoch(monkeypatch) -> None:
    import bench.plugin.plant as plant_module
    from bench.plugin.options import parse_plant

    clock = iter([10.0, 10.5, 20.0, 20.2])  # two epochs of 0.5 s and 0.2 s
    slept: list[float] = []
    monkeypatch.setattr(plant_module.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(plant_module.time, "sleep", slept.append)
    trainer = types.SimpleNamespace(_epoch=lambda: 1.25, device=torch.device("cpu"))
    plant_module.plant_slowdown(trainer, parse_plant("10"))
    assert [trainer._epoch(), trainer._epoch()] == [1.25, 1.25]
    assert slept == pytest.approx([0.05, 0.02])
    assert str(parse_plant("15:gpu")) == "15%:gpu"


EXTRA_KERNEL = """
import pytest, torch
from model.train import Trainer

@pytest.fixture(autouse=True)
def an_extra_op_in_each_step(monkeypatch):
    step = Trainer.step

    def step_with_an_extra_op(self, x, y):
        torch.cumsum(torch.ones(4_000_000), 0)
        return step(self, x, y)

    monkeypatch.setattr(Trainer, "step", step_with_an_extra_op)
"""


def test_traced_regression_names_the_op_that_grew(bench, pytester, monkeypatch) -> None:
    monkeypatch.setenv("PLANTED_EPOCH_S", "0.1")
    bench("--benchmark-autosave", "--kernel-trace", "-k", "test_small", budgets=GATE).assert_outcomes(passed=1)
    info = json.loads(saved_runs(pytester)[0].read_text())["benchmarks"][0]["extra_info"]
    assert info["kernel_trace"]["device"] == "cpu" and info["kernel_trace"]["rows"]
    pytester.makeconftest(CONFTEST + EXTRA_KERNEL)
    monkeypatch.setenv("PLANTED_EPOCH_S", "0.15")
    result = bench(f"--benchmark-compare={saved_runs(pytester)[0]}", "--kernel-trace", "-k", "test_small", budgets=GATE)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*epoch_time_ratio = 1.5 breaks*", "*kernels that grew most:*",
                                 "*aten::cumsum (new:*"])


def test_cold_caches_are_emptied_for_the_session_and_stated(bench, pytester, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "users-triton-cache"))
    pytester.makeconftest(CONFTEST + """
import os, pytest

@pytest.fixture(autouse=True)
def report_cache_dirs(request):
    yield
    print("CACHES", os.environ["TRITON_CACHE_DIR"], os.environ["TORCHINDUCTOR_CACHE_DIR"])
""")
    result = bench("--cold-caches", "--benchmark-json=out.json", "-s", budgets="")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        ["*1st epoch s: compilation and capture included; Triton/Inductor caches cold (emptied for this session)*"])
    line = next(line for line in result.stdout.lines if "CACHES" in line)
    triton_dir = line.split()[-2]
    assert "loadbench-caches-" in triton_dir and "users-triton-cache" not in triton_dir
    assert not Path(triton_dir).parent.exists()  # the session's scratch caches are gone
    info = json.loads((pytester.path / "out.json").read_text())["benchmarks"][0]["extra_info"]
    assert info["kernel_caches"].startswith("cold") and info["first_epoch_s"] > 0


def test_cache_state_is_read_from_the_users_folders(tmp_path, monkeypatch) -> None:
    from bench.plugin.caches import KernelCaches

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    assert KernelCaches.for_session(cold=False).state == "empty"
    (tmp_path / "inductor" / "some").mkdir(parents=True)
    assert KernelCaches.for_session(cold=False).state == "warm"


_BUILD_TWICE = """
import json, sys
import triton
import triton.language as tl
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from bench.plugin.caches import TritonBuilds

@triton.jit
def copy(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs))

seen = []
knobs.compilation.listener = before = lambda **kw: seen.append(kw["cache_hit"])
source = ASTSource(fn=copy, signature={"x_ptr": "*fp32", "y_ptr": "*fp32", "BLOCK": "constexpr"},
                   constexprs={(2,): 16})
with TritonBuilds() as builds:
    for _ in range(2):
        triton.compile(source, target=GPUTarget("cuda", 90, 32))
print(json.dumps({"counts": builds.counts(), "seen": seen, "restored": knobs.compilation.listener is before}))
"""


def test_triton_builds_count_compiles_and_cache_hits(tmp_path) -> None:
    """A case's record counts the Triton kernels compiled and those loaded from the cache:
    one kernel built twice for sm_90 (no GPU needed) into an empty cache is one of each;
    a listener set before is still called, and is back in place afterwards. In a process
    of its own: the interpreter, which the other tests run, replaces the compiler."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=str(Path(__file__).resolve().parents[1]), TRITON_CACHE_DIR=str(tmp_path / "triton"))
    script = tmp_path / "build_twice.py"  # @triton.jit reads its kernel's source from a file
    script.write_text(_BUILD_TWICE, encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got == {"counts": {"compiled": 1, "cache_hits": 1}, "seen": [False, True], "restored": True}


def test_the_record_names_the_card_a_run_was_made_on(monkeypatch) -> None:
    # Cards of one model differ by a percent or so; the self-test reads the UUID to say how much.
    from bench.monitor.sampler import GpuInfo
    from bench.monitor.sampler import GpuProbe
    from bench.plugin.session import LoadBenchSession

    info = GpuInfo(index=0, name="NVIDIA H200", uuid="GPU-1234", memory_total_mib=143771.0, power_limit_w=700.0,
                   driver="580.159.04", gpm=True)
    session = LoadBenchSession.__new__(LoadBenchSession)  # only the probe is read
    session.probe = GpuProbe(handle=None, info=info)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (9, 0))
    assert session.gpu_info == {"name": "NVIDIA H200", "uuid": "GPU-1234", "memory_total_mib": 143771,
                                "driver": "580.159.04", "power_limit_w": 700.0, "gpm": True, "capability": "9.0"}


KILL_SECOND = """
import os
from model.train import Trainer

_run_epoch = Trainer.run_epoch

def killed(self, *args, **kwargs):
    if getattr(self.config, "depth", None) == 3:
        os._exit(137)  # as a time limit's SIGKILL: no hook, no finaliser runs
    return _run_epoch(self, *args, **kwargs)

Trainer.run_epoch = killed
"""


def test_a_killed_run_keeps_its_finished_cases_beside_the_json(bench, pytester) -> None:
    from bench.gate.runs import load_runs

    pytester.makeconftest(CONFTEST + KILL_SECOND)
    result = bench("--benchmark-json=out.json", budgets="", isolated=True)
    assert result.ret == 137
    assert not (pytester.path / "out.json").is_file() or (pytester.path / "out.json").stat().st_size == 0
    partial = pytester.path / "out.partial.json"
    (run,), warnings = load_runs([partial])  # a run file like any other: report, compare and merge read it
    assert not warnings and [b["name"] for b in run.benchmarks] == ["test_small"]
    assert run.benchmarks[0]["extra_info"]["case"] == "blocks-2" and run.benchmarks[0]["stats"]["data"]
    state = run_state(read_run(partial))  # what is left of a killed run says so
    assert (state.state, state.collected, state.stored, state.whole) == ("partial", 2, 1, False)


def test_a_whole_run_says_so(bench, pytester) -> None:
    bench("--benchmark-json=out.json", budgets="").assert_outcomes(passed=2)
    state = run_state(read_run(pytester.path / "out.json"))
    assert (state.state, state.collected, state.stored, state.cut_short) == ("complete", 2, 2, ())
    failing = bench("--benchmark-json=failed.json", budgets='[datasets."tiny.csv".defaults]\naccuracy_min = 0.99\n')
    failing.assert_outcomes(failed=2)
    assert run_state(read_run(pytester.path / "failed.json")).state == "failed"  # whole, and red


def test_a_case_the_newest_run_lacks_is_judged_against_the_newest_run_holding_it(bench, pytester) -> None:
    bench("--benchmark-autosave", budgets=GATE).assert_outcomes(passed=2)
    bench("--benchmark-autosave", "-k", "test_small", budgets=GATE).assert_outcomes(passed=1)
    older, newest = saved_runs(pytester)
    result = bench(f"--benchmark-compare={newest}", "--benchmark-json=out.json", budgets=GATE)
    result.assert_outcomes(passed=2)
    verdicts = {b["name"]: b["extra_info"]["verdict"] for b in read_run(pytester.path / "out.json")["benchmarks"]}
    assert verdicts["test_small"]["status"] == "ok"
    assert verdicts["test_small"]["baseline"] == read_run(newest)["datetime"]
    assert verdicts["test_other"]["status"] == "ok"  # compared, not "not in the baseline run"
    assert verdicts["test_other"]["baseline"].startswith(read_run(older)["datetime"])
    assert verdicts["test_other"]["baseline"].endswith("(the newest stored run holding this case)")


def test_a_finished_run_leaves_no_partial_file(bench, pytester) -> None:
    bench("--benchmark-json=out.json", budgets="").assert_outcomes(passed=2)
    assert json.loads((pytester.path / "out.json").read_text())["benchmarks"]
    assert not (pytester.path / "out.partial.json").exists()
    assert not list(pytester.path.glob(".out.partial.json.*"))  # no temporary left behind


def test_a_partial_file_that_cannot_be_written_is_a_warning_not_a_failure(bench, pytester) -> None:
    (pytester.path / "out.partial.json").mkdir()  # the rename onto it fails
    result = bench("--benchmark-json=out.json", budgets="")
    result.assert_outcomes(passed=2, warnings=1)
    result.stdout.fnmatch_lines(["*mlp-loadbench: cannot keep the run so far in *out.partial.json: *"])
    assert len(json.loads((pytester.path / "out.json").read_text())["benchmarks"]) == 2  # the run is saved as usual


def test_the_partial_file_is_written_after_each_finished_case_and_waits_only_after_a_slow_write(
    tmp_path, monkeypatch
) -> None:
    """Planted time (a write advances the clock by its planted cost): every finished case
    is written at once, however soon after the last; only a write of SLOW_WRITE_S or more
    makes the next wait COST_FACTOR times its cost."""
    from types import SimpleNamespace

    from bench.plugin import partial

    now = [100.0]
    cost = [0.01]  # seconds each write takes on the planted clock
    monkeypatch.setattr(partial.time, "monotonic", lambda: now[0])

    def generate_json(config, benchmarks, include_data, machine_info, commit_info):
        now[0] += cost[0]
        return {"benchmarks": [str(b) for b in benchmarks], "machine_info": machine_info, "commit_info": commit_info}

    hook = SimpleNamespace(
        pytest_benchmark_generate_commit_info=lambda config: {"id": "abc"},
        pytest_benchmark_update_commit_info=lambda config, commit_info: None,
        pytest_benchmark_generate_json=generate_json,
        pytest_benchmark_update_json=lambda config, benchmarks, output_json: None,
    )
    def machine_info() -> dict:
        now[0] += 5.0  # py-cpuinfo and git take seconds, once: no write's cost
        return {}

    session = SimpleNamespace(benchmarks=[], json=tmp_path / "run.json", disabled=False,
                              get_machine_info=machine_info)
    run = partial.PartialRun(SimpleNamespace(hook=hook, _benchmarksession=session))
    written = tmp_path / "run.partial.json"

    def finish_case(name: str | None, after_s: float) -> list[str] | None:
        if name is not None:
            session.benchmarks.append(name)
        now[0] += after_s
        return json.loads(written.read_text())["benchmarks"] if run.write() else None

    assert finish_case("a", 1.0) == ["a"]
    assert finish_case("b", 0.001) == ["a", "b"]  # a millisecond after the last write: kept all the same
    assert finish_case(None, 0.001) is None  # nothing new finished: nothing written
    assert finish_case("c", 0.0) == ["a", "b", "c"]
    cost[0] = partial.SLOW_WRITE_S  # the file has grown: this write takes a second
    assert finish_case("d", 0.001) == ["a", "b", "c", "d"]  # the write before it was fast
    assert finish_case("e", partial.COST_FACTOR * partial.SLOW_WRITE_S - 1) is None
    assert finish_case("f", 1.5) == ["a", "b", "c", "d", "e", "f"]  # COST_FACTOR x the cost after the slow write
    assert not list(tmp_path.glob(".run.partial.json.*"))  # written through a temporary and a rename
    session.json.write_text("{}")
    os.utime(session.json, (0, 0))  # a final file older than the partial one: another run's
    run.finish()
    assert written.exists()
    session.json.write_text("{}")  # pytest-benchmark wrote the whole run
    run.finish()
    assert not written.exists()


THREE_CASES = """
from kernels.ground.cases import Case

def test_small(loadbench):
    loadbench.run(Case("blocks", 2), width=32)

def test_four(loadbench):
    loadbench.run(Case("blocks", 4), width=32)

def test_other(loadbench):
    loadbench.run(Case("blocks", 3), width=32)
"""


def test_a_run_killed_in_its_third_case_keeps_both_finished_ones(bench, pytester) -> None:
    """Two small cases finish within a second or two: both are in the partial file when the third is killed."""
    from bench.gate.runs import load_runs

    pytester.makeconftest(CONFTEST + KILL_SECOND)
    pytester.makepyfile(test_cases=THREE_CASES)
    result = bench("--benchmark-json=out.json", budgets="", isolated=True)
    assert result.ret == 137, result.stdout.str()[-3000:]
    (run,), warnings = load_runs([pytester.path / "out.partial.json"])
    assert not warnings and [b["name"] for b in run.benchmarks] == ["test_small", "test_four"], result.stdout.str()
    assert all(b["stats"]["data"] for b in run.benchmarks)


def test_a_long_case_shows_progress_without_verbose(bench, pytester) -> None:
    """Without -v a case says it is alive every QUIET_PROGRESS_AFTER_S (here 0, so every
    epoch); with the default it stays quiet, as the other tests here show."""
    pytester.makeconftest(CONFTEST + "import pytest\nimport bench.plugin.fixture as fixture\n\n"
                          "@pytest.fixture(autouse=True)\ndef progress_at_once(monkeypatch):\n"
                          "    monkeypatch.setattr(fixture, 'QUIET_PROGRESS_AFTER_S', 0.0)\n")
    result = bench(budgets="")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*blocks-2: epoch 1/8*", "*blocks-2: epoch 8/8*"])
    pytester.makeconftest(CONFTEST)  # the default: a case of a second or so prints no epoch line
    quiet = bench(budgets="")
    quiet.assert_outcomes(passed=2)
    assert "epoch 1/8" not in quiet.stdout.str()


@pytest.mark.slow
def test_an_unstored_serving_run_writes_nothing_where_it_runs(inprocess_ready, pytester, monkeypatch) -> None:
    """The serving case trains its model; unstored, it keeps it in a folder of the session's
    own, not in `.benchmarks/trained-models/` under the working directory."""
    root = Path(__file__).resolve().parents[1]
    work = pytester.mkdir("work")  # pytester's own folder is HOME for the run, too
    monkeypatch.chdir(work)
    monkeypatch.setenv("LOADBENCH_MODEL_CACHE", "")
    result = pytester.runpytest_inprocess(
        str(root / "bench" / "test_inference.py"), "-k", "blocks-3-fp32-torch", "-p", "no:cacheprovider", "-q",
        "--device=cpu", "--profile=smoke", f"--rootdir={root}",
    )
    result.assert_outcomes(passed=1, deselected=result.parseoutcomes().get("deselected", 0))
    # pytest-benchmark makes its (empty) storage folder wherever it runs; nothing of ours is in it
    assert [p.relative_to(work) for p in work.rglob("*")] in ([], [Path(".benchmarks")])
