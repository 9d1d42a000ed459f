"""The tuning candidates and their rules (kernels/plan/launch_plan.py): which tiles are
tried for a shape, the few-row forward's GEMV tiles, the occupancy and reduction-step
rules, and that the committed table's winners are tiles the rules keep."""

from __future__ import annotations

import json

import pytest
import torch

from kernels.plan import launch_plan
from kernels.plan import launches
from kernels.plan.launch_plan import LaunchConfig

pytestmark = pytest.mark.usefixtures("launches")  # an empty cache of its own, no plans left behind


def test_tuning_candidates() -> None:
    dw = launch_plan.tuning_candidates("dw", 512, 512, 512, torch.float32, sm_count=132)
    assert dw[0] == launch_plan.heuristic_config(512, 512, 512, torch.float32)  # measured first: the baseline
    assert {c.split_k for c in dw} >= {1, 2, 4} and dw[-1].backend == "cublas"
    assert all(c.split_k * -(-512 // c.block_r) * -(-512 // c.block_c) <= 2 * 132 for c in dw if c.split_k > 1)
    assert all(c.split_k == 1 for c in launch_plan.tuning_candidates("fwd", 512, 512, 512, torch.float32, 132))
    assert all(c.split_k == 1 for c in launch_plan.tuning_candidates("dw", 512, 512, 512, torch.float32, None))
    head = launch_plan.tuning_candidates("fwd", 512, 10, 512, torch.bfloat16, 132)
    assert all(c.block_c <= 32 for c in head if c.backend == "triton")  # no 128-column tiles over 10 columns
    assert len(set(dw)) == len(dw)


def test_gemv_candidates_only_for_a_few_row_forward() -> None:
    one = launch_plan.tuning_candidates("fwd", 1, 512, 512, torch.float32, 132)
    gemv = [c for c in one if c.backend == "gemv"]
    assert gemv and one[-1].backend == "cublas"  # cuBLAS stays last (first-use tuning's seeds keep it there)
    assert all(c.block_r == 1 and c.block_r * c.block_c * c.block_red <= launch_plan.GEMV_MAX_TILE for c in gemv)
    first = launch_plan.tuning_candidates("fwd", 3, 512, 75, torch.float32, 132)
    assert {c.block_r for c in first if c.backend == "gemv"} == {4}
    assert all(c.block_red <= 128 for c in first if c.backend == "gemv")  # no step past the 75-long reduction
    for kernel, rows in (("fwd", 17), ("fwd", 512), ("dw", 1), ("dx", 1)):
        assert all(c.backend != "gemv"
                   for c in launch_plan.tuning_candidates(kernel, rows, 512, 512, torch.float32, 132))


def test_gemv_configs_are_checked() -> None:
    ok = {"block_r": 1, "block_c": 16, "block_red": 128, "num_warps": 4, "num_stages": 1, "backend": "gemv"}
    assert LaunchConfig.from_dict(ok).describe() == "gemv 1x16x128 w4"
    for bad in ({"block_r": 32}, {"block_r": 3}, {"split_k": 2}, {"block_c": 8}):
        with pytest.raises(ValueError):
            LaunchConfig.from_dict({**ok, **bad})
    with pytest.raises(ValueError, match="not for dx"):
        launch_plan.check_route("dx:float32:tf32x3:pointwise:16:512:512", LaunchConfig.from_dict(ok))


def test_presplit_candidates_only_for_large_strict_fp32_layers() -> None:
    """The presplit route is timed for fp32 at 'tf32x3' where a layer has at least
    PRESPLIT_MIN_WORK multiply-adds (widths 1024 and up at batch 512), before cuBLAS."""
    wide = launch_plan.tuning_candidates("dx", 512, 2048, 2048, torch.float32, 132, precision="tf32x3")
    presplit = [c for c in wide if c.backend == "presplit"]
    assert len(presplit) == len(launch_plan.PRESPLIT_TILES) and wide[-1].backend == "cublas"
    assert all(c.split_k == 1 for c in presplit)
    for kernel, shape, dtype, precision in (
        ("dx", (512, 2048, 2048), torch.float32, "tf32"),  # TF32 is one product: nothing to split
        ("dx", (512, 2048, 2048), torch.float32, "ieee"),
        ("dx", (512, 2048, 2048), torch.bfloat16, "ieee"),
        ("fwd", (512, 512, 512), torch.float32, "tf32x3"),  # the study's width: below the work floor
        ("dx", (512, 2048, 2048), torch.float32, None),  # a caller that does not say: as before
    ):
        cands = launch_plan.tuning_candidates(kernel, *shape, dtype, 132, precision=precision)
        assert all(c.backend != "presplit" for c in cands), (kernel, shape, dtype, precision)


def test_presplit_plans_tile_the_transposed_products_of_the_gradients() -> None:
    """dX and dW launch dX.T and dW.T: the tile's rows run along the layer's K."""
    cfg = LaunchConfig(64, 128, 32, 4, 3, backend="presplit")
    assert launch_plan.make_plan("fwd", 512, 2048, 1024, cfg).grid == (8 * 16,)  # Y (512, 2048)
    assert launch_plan.make_plan("dx", 512, 1024, 2048, cfg).grid == (16 * 4,)  # dX.T (1024, 512)
    assert launch_plan.make_plan("dw", 2048, 1024, 512, cfg).grid == (16 * 16,)  # dW.T (1024, 2048)
    ok = {"block_r": 64, "block_c": 64, "block_red": 32, "num_warps": 4, "num_stages": 3, "backend": "presplit"}
    assert LaunchConfig.from_dict(ok).describe() == "presplit 64x64x32 w4 s3"
    with pytest.raises(ValueError, match="no split-K"):
        LaunchConfig.from_dict({**ok, "split_k": 2})
    for key in ("dx:float32:tf32:pointwise:512:2048:2048", "fwd:bfloat16:ieee:pointwise:512:2048:2048"):
        with pytest.raises(ValueError, match="presplit route is for float32 at tf32x3"):
            launch_plan.check_route(key, LaunchConfig.from_dict(ok))
    assert launch_plan.check_route("dw:float32:tf32x3:identity:2048:2048:512", LaunchConfig.from_dict(ok))


def test_the_report_names_each_plans_route_the_same_way() -> None:
    """A plan and the eager plan beside it are named by one function: a presplit
    finalist run by uncaptured calls is reported as presplit, not as the fused kernels."""
    presplit = LaunchConfig(64, 64, 32, 4, 3, backend="presplit")
    split = LaunchConfig(16, 64, 32, 4, 3, split_k=2)
    assert launches.route_of(launch_plan.make_plan("dw", 2048, 2048, 512, presplit)) == "presplit 64x64x32 w4 s3"
    assert launches.route_of(launch_plan.make_plan("dw", 512, 512, 512, split)) == "triton split-K 2"
    assert launches.route_of(launch_plan.make_plan("fwd", 512, 512, 512, LaunchConfig(64, 32, 32, 4, 3))) == "triton"
    cublas = LaunchConfig(64, 32, 32, 4, 3, backend="cublas")
    assert launches.route_of(launch_plan.make_plan("dx", 512, 512, 512, cublas)) == "cublas+epilogue"


def test_the_occupancy_rule_drops_only_tiles_that_leave_most_sms_idle() -> None:
    full = launch_plan.tuning_candidates("fwd", 512, 512, 512, torch.float32, 132, prune=False)
    pruned = launch_plan.tuning_candidates("fwd", 512, 512, 512, torch.float32, 132)
    gone = set(full) - set(pruned)
    assert gone and all(-(-512 // c.block_r) * -(-512 // c.block_c) < 33 for c in gone)
    # a small output where no tile fills the GPU: nothing is dropped for occupancy
    small = launch_plan.tuning_candidates("fwd", 64, 128, 128, torch.float32, 132)
    assert small == launch_plan.tuning_candidates("fwd", 64, 128, 128, torch.float32, 132, prune=False)
    # bf16: one reduction step, the one that fits
    assert {c.block_red for c in launch_plan.tuning_candidates("dw", 512, 512, 512, torch.bfloat16, 132)
            if c.backend == "triton"} == {64}
    assert {c.block_red for c in launch_plan.tuning_candidates("dx", 64, 128, 10, torch.bfloat16, 132)[1:-1]} == {32}


def test_every_winner_of_the_committed_table_is_a_candidate_the_rules_keep() -> None:
    """The committed table's winners must be tiles the tuner still tries on the GPUs
    they were measured on (132 SMs each), under the occupancy and reduction-step rules;
    a rule change that would drop one must re-tune the table first."""
    tables = json.loads(launches.TABLE_PATH.read_text())
    checked = 0
    for group in tables.values():
        for name, cfg in group["configs"].items():
            kernel, dtype = name.split(":")[:2]
            m, n, k = group["evidence"][name]["shape"]
            rows, cols, red = {"fwd": (m, n, k), "dw": (n, k, m), "dx": (m, k, n)}[kernel]
            won = LaunchConfig.from_dict(cfg)
            assert won in launch_plan.tuning_candidates(kernel, rows, cols, red, getattr(torch, dtype), 132), name
            checked += 1
    assert checked >= 100, f"the committed table holds {checked} entries"
