"""Tuning ahead of a run (kernels/plan/tuning.py through bench.tools.tune), on CPU: what
the dry run counts, and what the committed table keeps of a winner for eager calls."""

from __future__ import annotations

import json

import pytest
import torch

from kernels.plan import launch_plan
from kernels.plan import launches
from tests.plans import CONFIG
from tests.plans import K
from tests.plans import M
from tests.plans import N
from tests.plans import key
from tests.plans import launched_kernels
from tests.plans import layer
from tests.plans import refuse
from tests.plans import sources
from tests.plans import train_step

pytestmark = pytest.mark.usefixtures("launches")  # an empty cache of its own, no plans left behind


def test_the_dry_run_lists_what_first_use_tuning_of_the_experiments_costs(capsys) -> None:
    from bench.tools import tune
    from kernels.plan import tuning

    assert tune.main(["--dry-run", "--experiments", "--sm-count", "132"]) == 0
    out = capsys.readouterr().out
    assert "8 batch x width pairs" in out and "distinct Triton compilations" in out
    assert "fwd:bfloat16:ieee:silu:512:512:512" in out and "fwd:float32:tf32x3:identity:512:16:512" in out
    from bench.tools.bench_cells import experiment_pairs

    result = tuning.dry_run(tuning.kernel_shapes(experiment_pairs(), [torch.float32, torch.bfloat16]), 132)
    before, now = result["before"], result["now"]
    assert now["candidates"] < 0.8 * before["candidates"] and now["full"] < 0.3 * before["full"]
    assert now["executions"] < 0.4 * before["executions"] and now["compiles"] <= before["compiles"]


@pytest.mark.interpreter
def test_the_table_keeps_a_cublas_winners_fused_finalist_for_eager_calls(tmp_path, monkeypatch) -> None:
    """bench.tools.tune writes a cuBLAS winner's fastest fused finalist into the table's
    evidence (not the other finalists); a run reading the table takes it eagerly."""
    from kernels.plan.tuning import write_table

    cublas = {**CONFIG, "backend": "cublas"}
    fused = {**CONFIG, "block_c": 16}
    measured = {
        key(kernel, *shape): {"config": cublas, "ms": 0.010, "finalists": [cublas, CONFIG, fused],
                              "finalists_ms": [0.010, 0.012, 0.013]}
        for kernel, *shape in launch_plan.kernel_shapes(M, N, K)
    }
    path = tmp_path / "table.json"
    write_table(str(path), "cpu", measured)
    written = json.loads(path.read_text())
    kept = written["cpu"]["evidence"][key("fwd", M, N, K)]
    assert "finalists" not in kept and "finalists_ms" not in kept
    assert (kept["eager"]["config"]["block_c"] == CONFIG["block_c"]
            and kept["eager"]["gives_up_ms"] == pytest.approx(0.002))
    launches.reset_launch_state(cache_dir=tmp_path / "cache", tables=written, measure=refuse, host_call_ms=0.005)
    names = launched_kernels(monkeypatch)
    train_step(*layer())
    assert sources() == {"fwd": "table", "dw": "table", "dx": "table"}
    assert {e["eager"]["route"] for e in launches.launch_report()} == {"triton"}
    assert ({"_forward_kernel", "_weight_grad_kernel", "_input_grad_kernel"} <= set(names)
            and "_bias_act_kernel" not in names)


def test_a_fused_winner_keeps_no_eager_finalist_in_the_table() -> None:
    from kernels.plan.tuning import evidence

    fused = {**CONFIG, "backend": "triton"}
    entry = {"config": fused, "ms": 0.01, "finalists": [fused, {**CONFIG, "backend": "cublas"}],
             "finalists_ms": [0.01, 0.011]}
    assert "eager" not in evidence(entry) and evidence({"config": fused, "ms": 0.01}) == {"ms": 0.01}
