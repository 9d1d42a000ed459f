"""The two tiers: `pytest bench/` is the pull-request gate, `--tier nightly` runs every
case; shards are dealt from what -k, -m and the tier leave."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CASES = """
import pytest

def test_pr_case():
    pass

@pytest.mark.nightly
def test_nightly_case():
    pass

@pytest.mark.parametrize("n", [pytest.param(1), pytest.param(2, marks=pytest.mark.nightly), 3, 4])
def test_cell(n):
    pass
"""


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest('pytest_plugins = ["bench.plugin"]\n')
    pytester.makeini("[pytest]\nmarkers =\n    nightly: the nightly tier\n")
    pytester.makepyfile(test_cases=CASES)
    return pytester


def test_the_default_tier_leaves_the_nightly_cases_out_and_says_so(suite: pytest.Pytester) -> None:
    result = suite.runpytest_inprocess("-q")
    result.assert_outcomes(passed=4, deselected=2)
    result.stdout.fnmatch_lines(["*tier pr: 2 case(s) of the nightly tier left out (--tier nightly runs them)*"])


def test_the_nightly_tier_runs_every_case(suite: pytest.Pytester) -> None:
    result = suite.runpytest_inprocess("-q", "--tier", "nightly")
    result.assert_outcomes(passed=6)
    assert "tier pr" not in result.stdout.str()


def test_an_unknown_tier_is_a_usage_error(suite: pytest.Pytester) -> None:
    result = suite.runpytest_inprocess("--tier", "weekly")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--tier: invalid choice: 'weekly' (choose from 'pr', 'nightly')*"])


def test_shards_are_dealt_from_the_cases_k_selected(suite: pytest.Pytester) -> None:
    """Dealt before -k, the second shard of two selected cases could hold neither."""
    first = suite.runpytest_inprocess("-q", "-k", "cell", "--shard", "1/2")
    second = suite.runpytest_inprocess("-q", "-k", "cell", "--shard", "2/2")
    first.assert_outcomes(passed=2, deselected=4)
    second.assert_outcomes(passed=1, deselected=5)


def collected(*args: str) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "pytest", "bench/", "--collect-only", "-q", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return [line for line in done.stdout.splitlines() if "::" in line]


@pytest.mark.slow
def test_the_pull_request_tier_holds_what_the_gate_needs() -> None:
    # --profile quick: what a GPU runs by default; a CPU's smoke profile keeps fewer experiment cases
    pr, nightly = collected("--profile", "quick"), collected("--profile", "quick", "--tier", "nightly")
    assert set(pr) < set(nightly)
    assert sum("test_experiments.py" in c for c in pr) == 22  # the five experiments, whole
    assert sum("test_loops.py" in c for c in pr) == 8  # the loop headline, whole
    serving = [c for c in pr if "test_inference.py" in c]
    assert serving and all("[blocks-3-" in c for c in serving)  # the optimal configuration served
    assert not any("test_distributed.py" in c for c in pr)
    assert any("test_distributed.py" in c for c in nightly)
    assert any("test_kernels.py::test_mlp_step" in c for c in pr)
    assert len([c for c in nightly if "test_kernels.py" in c]) > len([c for c in pr if "test_kernels.py" in c])


@pytest.mark.slow
def test_the_smoke_profile_on_a_cpu_keeps_a_few_values_of_every_experiment() -> None:
    from bench.test_experiments import SMOKE_CPU_CASES

    pr = collected("--device", "cpu", "--profile", "smoke")
    nightly = collected("--device", "cpu", "--profile", "smoke", "--tier", "nightly")
    experiments = [c for c in pr if "test_experiments.py" in c]
    assert sorted(c.rsplit("[", 1)[1].rstrip("]") for c in experiments) == sorted(SMOKE_CPU_CASES)
    tests = {c.split("::")[1].split("[")[0] for c in experiments}
    assert tests == {"test_hidden_blocks", "test_hidden_units", "test_batch_size", "test_activation", "test_optimizer"}
    assert sum("test_experiments.py" in c for c in nightly) == 22  # the rest is the nightly tier's
    assert sum("test_loops.py" in c for c in pr) == 8  # the loop headline stays whole
