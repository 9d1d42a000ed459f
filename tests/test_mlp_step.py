"""kernels/ops/mlp_step.py: the whole training step in one launch. On a CPU through
Triton's interpreter (one program, so the grid barriers pass at once); on a GPU with a
program per SM. Gradients against float64, the update against the flat optimizer's
own kernel, the same bits twice, and the route the trainer records."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from kernels.ops import mlp_step
from kernels.ops.optim import FlatOptimizer
from kernels.plan.launch_plan import cdiv
from model.config import TrainConfig
from model.data import load_dataset
from model.mlp import MLP
from model.train import OPTIMIZERS
from model.train import Trainer
from tests.devices import CUDA
from tests.devices import DEVICE

interpreter = pytest.mark.interpreter
gpu = pytest.mark.gpu


def problem(width, depth, activation, optimizer, rows=2000, classes=10, seed=0):
    """Data, two MLPs with the same weights (one behind a FusedStep, one for the layer
    route through the same flat optimizer) and a float64 copy."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 75, generator=g).to(DEVICE)
    y = torch.randint(0, classes, (rows,), generator=g).to(DEVICE)
    torch.manual_seed(seed)
    models = [MLP(75, width, depth, classes, activation).to(DEVICE) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    exact = MLP(75, width, depth, classes, activation).to(DEVICE).double()
    exact.load_state_dict({k: v.double() for k, v in models[0].state_dict().items()})
    _, settings = OPTIMIZERS[optimizer]
    optims = [FlatOptimizer(list(m.parameters()), optimizer, **settings) for m in models]
    return x, y, models, optims, exact


def fused(x, y, model, optim, activation, batch, precision="fp32"):
    return mlp_step.FusedStep(x, y, [*model.hidden, model.head], optim, activation, precision, batch)


def rms(t):
    return t.double().pow(2).mean().sqrt().item()


@pytest.mark.parametrize(("width", "depth", "activation", "optimizer", "batch", "classes"), [
    (48, 3, "leaky_relu", "adam", 40, 10),   # partial tiles everywhere
    (32, 1, "silu", "sgd", 33, 10),          # one hidden layer: no middle phases; Z kept for silu
    (40, 2, "tanh", "rmsprop", 24, 10),
    (16, 4, "sigmoid", "adagrad", 16, 10),
    (32, 2, "relu", "adam", 24, 20),         # G_{L-1} read 32 columns wide
    (32, 3, "leaky_relu", "adam", 48, 10),   # whole tiles: the hidden products load unmasked
], ids=["adam-3x48", "sgd-1x32-silu", "rmsprop-2x40", "adagrad-4x16", "adam-2x32-20-classes", "adam-3x32-whole"])
@pytest.mark.parametrize(("copies", "swap", "chains"), [
    (0, 7, True), (1, 3, True), (2, 7, True), (3, 7, True), (0, 0, True), (3, 0, True), (3, 3, True), (0, 4, True),
    (0, 0, False),
], ids=["no-copies", "w-copy", "ag-copies", "all-copies", "no-copies-unswapped", "all-copies-unswapped",
        "all-copies-weights-unswapped", "no-copies-weights-swapped", "tritons-tf32x3"])
def test_step_matches_float64_and_the_flat_optimizer(
    width, depth, activation, optimizer, batch, classes, copies, swap, chains,
) -> None:
    """Each choice of transposed copies for the backward operands (Blocks.copies), with
    the hidden products run transposed (Blocks.swap, bits per kind of tile: all, the
    forward and input-gradient tiles, the weight tiles alone) and none; 3xTF32's
    products as chains apart (Blocks.chains, fp32's choice) and as Triton chains them."""
    x, y, (ours, layers), (opt_ours, opt_layers), exact = problem(width, depth, activation, optimizer, classes=classes)
    step = fused(x, y, ours, opt_ours, activation, batch)
    step.use_blocks(dataclasses.replace(step.blocks, copies=copies, swap=swap, chains=chains))
    if mlp_step.INTERPRETER:  # its 16 x 16 x 16 tiles: the whole-tile cases do load unmasked
        assert mlp_step.whole_tiles(batch, [width] * depth, step.blocks) == (batch % 16 == 0 and width % 16 == 0)
    for scratch in (step.act, step.z, step.g, step.act_t, step.g_t, step.w_t):  # a read of anything unwritten shows
        scratch.fill_(float("nan"))
    index = torch.randperm(len(y), generator=torch.Generator().manual_seed(1))[:batch].to(DEVICE)
    total = torch.full((), 0.5, device=DEVICE)
    step(index, total)
    step.check()

    opt_layers.zero_grad()
    loss = F.cross_entropy(layers(x[index]), y[index])
    loss.backward()
    F.cross_entropy(exact(x[index].double()), y[index]).backward()
    opt_layers.step()

    assert total.item() == pytest.approx(0.5 + loss.item() * batch, rel=1e-5)
    assert step.loss.item() == pytest.approx(loss.item(), rel=1e-5)
    grads = opt_ours.flat.grad
    for (param, start, stop), reference, torch_param in zip(opt_ours.spans(), exact.parameters(), layers.parameters()):
        want = reference.grad.flatten()
        ours_err = rms(grads[start:stop].double() - want)
        torch_err = rms(torch_param.grad.flatten().double() - want)
        assert ours_err <= 1.5 * torch_err + 1e-5 * rms(want), (tuple(param.shape), ours_err, torch_err)
    # The update is the flat optimizer's math on (nearly) the same gradient.
    assert torch.allclose(opt_ours.flat, opt_layers.flat, rtol=1e-4, atol=1e-6)
    state_ours, state_layers = opt_ours.state[opt_ours.flat], opt_layers.state[opt_layers.flat]
    assert torch.equal(state_ours["step"], state_layers["step"])  # every program's count advanced once


def test_a_bf16_step_is_within_bf16_rounding() -> None:
    """bf16 keeps the backward operands' transposed copies in bf16 (the rounding its MMA
    applies anyway): gradients within the GPU test's bf16 bound of float64 (below), and
    nothing unwritten read. The interpreter runs the bf16 products in fp32, exactly."""
    x, y, (model, _), (optim, _), exact = problem(48, 2, "leaky_relu", "adam")
    step = fused(x, y, model, optim, "leaky_relu", 40, "bf16")
    step.use_blocks(dataclasses.replace(step.blocks, copies=3))
    assert step.act_t.dtype == step.g_t.dtype == step.w_t.dtype == torch.bfloat16
    for scratch in (step.act, step.z, step.g, step.act_t, step.g_t, step.w_t):
        scratch.fill_(float("nan"))
    index = torch.randperm(len(y), generator=torch.Generator().manual_seed(1))[:40].to(DEVICE)
    step(index, torch.zeros((), device=DEVICE))
    step.check()
    F.cross_entropy(exact(x[index].double()), y[index]).backward()
    for (_, start, stop), reference in zip(optim.spans(), exact.parameters()):
        want = reference.grad.flatten()
        assert rms(optim.flat.grad[start:stop].double() - want) <= 0.1 * rms(want)


def guarded(tensor, pad=4096, sentinel=12345.0):
    """`tensor`'s values in the middle of a buffer `pad` elements longer each side."""
    outer = torch.full((tensor.numel() + 2 * pad,), sentinel, dtype=tensor.dtype, device=tensor.device)
    outer[pad : pad + tensor.numel()] = tensor.flatten()
    return outer, outer[pad : pad + tensor.numel()].view_as(tensor)


def test_the_step_writes_nothing_outside_its_buffers() -> None:
    """Parameters, gradients, optimizer state and scratch sit inside sentinel-filled
    buffers: one step (10 classes, a batch not a multiple of 16) changes no sentinel.
    A hint that a width is a multiple of 16 where it is not (the head) drops a mask."""
    width, batch = (512, 500) if CUDA else (48, 40)
    x, y, (model, _), (optim, _), _ = problem(width, 3, "leaky_relu", "adam")
    flat, state = optim.flat, optim.state.pop(optim.flat)
    outer = {}
    outer["flat"], view = guarded(flat.detach())
    outer["grad"], grad = guarded(flat.grad)
    moved = torch.nn.Parameter(view)
    moved.grad = grad
    optim.param_groups[0]["params"][0] = moved
    optim.state[moved] = {}
    for name, value in state.items():
        outer[name], optim.state[moved][name] = guarded(value)
    step = fused(x, y, model, optim, "leaky_relu", batch)
    step.use_blocks(dataclasses.replace(step.blocks, copies=3))
    for name in ("act", "g", "act_t", "g_t", "w_t", "part", "loss"):
        outer[name], view = guarded(getattr(step, name))
        setattr(step, name, view)
    step.z = step.act
    step(torch.randperm(len(y), generator=torch.Generator().manual_seed(1))[:batch].to(DEVICE),
         torch.zeros((), device=DEVICE))
    step.check()
    for name, buffer in outer.items():
        inside = buffer[4096:-4096]
        changed = torch.cat([buffer[:4096], buffer[-4096:]]) != 12345.0
        assert not changed.any(), f"{name}: {int(changed.sum())} elements written outside its {inside.numel()}"
    assert not torch.equal(moved.detach(), flat.detach())  # the step did update the moved buffers


def ttgir_report(precision: str, changes: dict) -> dict:
    """tests/wgmma_buffers.py's report of the study shape's sm_90 build with these Blocks
    changes, from a process without the interpreter (which replaces the compiler)."""
    root = Path(__file__).resolve().parents[1]
    # Without TRITON_DEFAULT_FP_FUSION too: the kernels package sets it, or Triton warns.
    env = {key: value for key, value in os.environ.items()
           if key not in ("TRITON_INTERPRET", "TRITON_DEFAULT_FP_FUSION")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))  # this checkout's kernels
    done = subprocess.run([sys.executable, str(root / "tests" / "wgmma_buffers.py"), precision, json.dumps(changes)],
                          cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "TRITON_DEFAULT_FP_FUSION is unset" not in done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("chains", [True, False], ids=["chains-apart", "tritons-chain"])
def test_fp32_products_wait_for_no_other_product_in_the_build(chains) -> None:
    """Compiled for sm_90 (no GPU needed), fp32's products with Blocks.chains: no mma.sync
    takes another's result as its accumulator, but in the head's product whose sum starts
    from a constant zero (its two links). Triton folds x + dot(a, b, 0) into dot(a, b, x),
    which would chain them again; Triton's own tf32x3 chains two of each three."""
    report = ttgir_report("fp32", {"chains": chains})
    assert report["dots"] >= 27  # three per product: forward, input-gradient and weight tiles, the head's
    assert report["chained_dots"] == (2 if chains else report["dots"] // 3), report


@pytest.mark.parametrize(("precision", "changes"), [
    ("tf32", {}),                         # blocks_for's choice: every hidden product swapped, all copies
    ("tf32", {"swap": 3, "copies": 1}),   # the forward and input-gradient tiles alone, the W copy
    ("bf16", {}),
], ids=["tf32-chosen", "tf32-weights-unswapped", "bf16-chosen"])
def test_no_wgmma_reads_a_buffer_the_pipeline_refills_while_it_reads(precision, changes) -> None:
    """Compiled for sm_90 (no GPU needed), every shared-memory operand of the step's
    warpgroup MMAs has as many buffers as the pipeline has stages. An operand also read
    into registers got one fewer from Triton's pipeliner, and the asynchronous wgmma read
    it while the next loads refilled it: different bits run to run on an H200, caught by
    the GPU tests. tests/wgmma_buffers.py reads the buffers from Triton's TTGIR."""
    report = ttgir_report(precision, changes)
    buffered = [source for source in report["sources"] if source != "registers"]
    assert buffered, f"no wgmma reads shared memory: the swapped products no longer reach wgmma ({report})"
    assert set(buffered) == {f"buffers={report['stages']}"}, report


@interpreter
def test_same_seed_same_bits() -> None:
    runs = []
    for _ in range(2):
        x, y, (model, _), (optim, _), _ = problem(24, 2, "leaky_relu", "adam")
        step = fused(x, y, model, optim, "leaky_relu", 32)
        total = torch.zeros((), device=DEVICE)
        for seed in (1, 2):
            step(torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))[:32].to(DEVICE), total)
        runs.append((optim.flat.detach().clone(), total.clone()))
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])


@interpreter
@pytest.mark.parametrize(("width", "depth", "batch", "block_m", "copies", "precision"), [
    (48, 3, 40, 16, 0, "fp32"),
    (32, 1, 33, 16, 3, "fp32"),   # one hidden layer: the head makes G_0
    (40, 2, 24, 16, 1, "bf16"),   # W's copy: G's tiles also wait for all of F
    (32, 2, 40, 32, 2, "fp32"),   # two head row blocks to a row block, the last one short
], ids=["3x48", "1x32-all-copies", "2x40-bf16-w-copy", "2x32-tall-rows"])
def test_flags_give_the_barriers_bits(width, depth, batch, block_m, copies, precision) -> None:
    """Tiles that wait for counters of what they read (Blocks.flags) compute what the grid
    barriers do, bit for bit, over launches of different batch sizes (an epoch's short
    last batch between full ones); every wait's count is met (the flag stays clear), and
    each launch leaves the counters zero for the next."""
    results = []
    for flags in (False, True):
        x, y, (model, _), (optim, _), _ = problem(width, depth, "tanh", "adam", rows=200)
        step = fused(x, y, model, optim, "tanh", batch, precision)
        step.use_blocks(dataclasses.replace(step.blocks, m=block_m, head_m=16, copies=copies, flags=flags))
        assert step.sync.numel() == mlp_step.sync_counters(depth + 1, batch, block_m)
        total = torch.zeros((), device=DEVICE)
        for launch, rows in enumerate((batch, batch - 3, batch)):
            step(torch.arange(launch * batch, launch * batch + rows, device=DEVICE), total)
            assert not step.sync.any()
        step.check()
        results.append((optim.flat.detach().clone(), optim.flat.grad.clone(), total.clone()))
    assert all(torch.equal(a, b) for a, b in zip(results[0], results[1]))


@interpreter
def test_a_short_batch_of_a_whole_tile_step_reads_no_row_past_it() -> None:
    """A step built for whole tiles (48 rows) loads its hidden products unmasked, also for
    an epoch's short last batch (45 rows): the rows past the batch it reads from scratch
    (NaN here) reach no gradient, loss or parameter."""
    x, y, (model, _), (optim, _), exact = problem(32, 3, "leaky_relu", "adam")
    step = fused(x, y, model, optim, "leaky_relu", 48)
    assert mlp_step.whole_tiles(48, [32] * 3, step.blocks)
    for scratch in (step.act, step.z, step.g):
        scratch.fill_(float("nan"))
    index = torch.randperm(len(y), generator=torch.Generator().manual_seed(1))[:45].to(DEVICE)
    step(index, torch.zeros((), device=DEVICE))
    step.check()
    F.cross_entropy(exact(x[index].double()), y[index]).backward()
    assert torch.isfinite(optim.flat).all() and torch.isfinite(step.loss)
    for (_, start, stop), reference in zip(optim.spans(), exact.parameters()):
        want = reference.grad.flatten()
        assert rms(optim.flat.grad[start:stop].double() - want) <= 1e-4 * rms(want)


def test_whole_tiles_need_every_dimension_whole() -> None:
    """Unmasked loads only where the built batch fills the row blocks and every hidden width
    fills the column blocks and both reduction steps."""
    blocks = mlp_step.Blocks(16, 64, 32, 16, 4, k_forward=64)
    assert mlp_step.whole_tiles(512, [512, 512, 512], blocks)
    assert not mlp_step.whole_tiles(500, [512] * 3, blocks)  # 500 rows: 31.25 row blocks of 16
    assert not mlp_step.whole_tiles(512, [512, 480], blocks)  # 480 columns: 7.5 blocks of 64
    assert mlp_step.whole_tiles(64, [96], dataclasses.replace(blocks, n=32, k_forward=0))
    assert not mlp_step.whole_tiles(64, [96], blocks)


def test_a_timed_out_barrier_is_an_error_not_a_hang() -> None:
    x, y, (model, _), (optim, _), _ = problem(16, 1, "relu", "sgd", rows=64)
    step = fused(x, y, model, optim, "relu", 16)
    step.check()  # nothing launched: no flag
    step.flag.fill_(1)  # what a barrier or counter wait that gave up leaves
    with pytest.raises(RuntimeError, match="a wait between tiles timed out.*LOADBENCH_FUSED_STEP=0"):
        step.check()


def test_a_batch_larger_than_built_for_is_refused() -> None:
    x, y, (model, _), (optim, _), _ = problem(16, 1, "relu", "sgd", rows=64)
    step = fused(x, y, model, optim, "relu", 16)
    with pytest.raises(ValueError, match="a batch of 17 rows > the 16 it was built for"):
        step(torch.arange(17, device=DEVICE), torch.zeros((), device=DEVICE))


def test_shapes_that_do_not_fit_say_why() -> None:
    assert mlp_step.unfit_reason([512, 512, 10], 10, 512, 75) is None
    assert mlp_step.unfit_reason([512, 100], 100, 512, 75) == f"100 classes > {mlp_step.MAX_CLASSES}"
    assert mlp_step.unfit_reason([10], 10, 512, 75) == "no hidden layer"
    assert "scratch of" in mlp_step.unfit_reason([1 << 16, 10], 10, 4096, 75)


def test_programs_per_sm_are_what_stays_resident() -> None:
    h100 = {"regs_per_sm": 65536, "shared_per_sm": 228 * 1024, "threads_per_sm": 2048}
    # 255 registers a thread on 4 warps: 32 768 registers, two programs in 65 536.
    assert mlp_step.resident_per_sm(2, 255, 24 * 1024, 4, **h100) == 2
    assert mlp_step.resident_per_sm(4, 255, 24 * 1024, 4, **h100) == 2
    assert mlp_step.resident_per_sm(2, 255, 24 * 1024, 8, **h100) == 1  # 65 536 on 8 warps
    assert mlp_step.resident_per_sm(2, 128, 120 * 1024, 4, **h100) == 1  # shared memory binds
    assert mlp_step.resident_per_sm(2, 255, 300 * 1024, 4, **h100) == 1  # never below one
    assert mlp_step.resident_per_sm(1, 32, 1024, 4, **h100) == 1
    # Blocks.max_regs: 168 registers hold three programs of 4 warps, 128 four, if shared memory does.
    assert mlp_step.resident_per_sm(3, 168, 64 * 1024, 4, **h100) == 3
    assert mlp_step.resident_per_sm(4, 168, 44 * 1024, 4, **h100) == 3
    assert mlp_step.resident_per_sm(4, 128, 44 * 1024, 4, **h100) == 4
    assert mlp_step.resident_per_sm(4, 128, 64 * 1024, 4, **h100) == 3  # shared memory binds


def test_the_switch_is_parsed_and_checked() -> None:
    assert mlp_step.switch_from_env(None) == "auto"
    assert [mlp_step.switch_from_env(v) for v in ("1", "0", "auto")] == ["1", "0", "auto"]
    with pytest.raises(ValueError, match="LOADBENCH_FUSED_STEP='yes'"):
        mlp_step.switch_from_env("yes")


def test_auto_takes_the_step_only_where_it_was_measured_faster() -> None:
    study = [512, 512, 512, 10]
    assert mlp_step.auto_refusal(study, 512, cuda=True) is None
    assert mlp_step.auto_refusal([128, 128, 10], 512, cuda=True) is None
    assert mlp_step.auto_refusal(study, 512, cuda=False) == "auto: no CUDA GPU"
    assert mlp_step.auto_refusal([512] * 5 + [10], 64, cuda=True) is None  # the experiments' far ends
    assert mlp_step.auto_refusal([512] * 6 + [10], 512, cuda=True) == "auto: 6 hidden layers > 5"
    assert mlp_step.auto_refusal([1024] * 3 + [10], 512, cuda=True) == "auto: width 1024 > 512"
    assert mlp_step.auto_refusal(study, 32, cuda=True) == "auto: batch 32 < 64"


def test_tiles_leave_few_programs_idle() -> None:
    """The tile shape keeps a phase's tiles near the program count (two per SM) or above
    it: 16 x 64 at the study shape (256 tiles for 264 programs, where 32 x 64 gave 128)
    and past it (two rounds of 16 x 64 beat one of 32 x 64, but for fp32 wider than 512),
    16 x 32 for smaller batches."""
    def shape(rows, width, sms=132):
        blocks = mlp_step.blocks_for(rows, width, sms, interpreter=False)
        return blocks.m, blocks.n

    assert shape(512, 512) == (16, 64)
    assert shape(1024, 512) == shape(512, 512, sms=64) == (16, 64)
    assert shape(512, 1024) == (32, 64)  # fp32's longer reductions, wider than 512
    assert mlp_step.blocks_for(512, 1024, 132, "tf32", interpreter=False).m == 16
    assert shape(256, 512) == (16, 32)
    assert shape(64, 512) == (16, 32)
    assert mlp_step.blocks_for(512, 512, 132, interpreter=True).m == 16
    # TF32's swapped 16 x 64 tiles beat 16 x 32 with 3/8 as many tiles as programs.
    for rows, width in ((256, 512), (512, 256)):
        assert (mlp_step.blocks_for(rows, width, 132, "tf32", interpreter=False).n,
                mlp_step.blocks_for(rows, width, 132, "bf16", interpreter=False).n) == (64, 32)
    assert mlp_step.blocks_for(128, 512, 132, "tf32", interpreter=False).n == 32


def test_flags_where_they_were_measured_faster() -> None:
    """Counter waits wherever they were measured faster than grid barriers (every
    precision at the study shape and with 16 x 32 tiles, but fp32 under 128 rows); 64-wide
    forward steps likewise. The interpreter takes the counters, so CI runs that path."""
    def choice(rows, width, precision):
        blocks = mlp_step.blocks_for(rows, width, 132, precision, interpreter=False)
        return blocks.flags, blocks.k_forward

    for precision in ("fp32", "tf32", "bf16"):
        assert choice(512, 512, precision) == (True, 64)
        assert choice(1024, 512, precision) == (True, 64)
        assert choice(512, 1024, precision) == ((False, 0) if precision == "fp32" else (True, 64))
        assert mlp_step.blocks_for(512, 512, 132, precision, interpreter=True).flags
    assert choice(64, 512, "fp32") == (False, 0)
    assert choice(128, 512, "fp32") == choice(256, 512, "fp32") == choice(512, 256, "fp32") == (True, 0)
    assert choice(64, 512, "tf32") == (True, 64) and choice(512, 128, "tf32") == (True, 0)
    assert choice(64, 512, "bf16") == choice(512, 256, "bf16") == (True, 64)


def test_tiles_dealt_as_one_sequence_where_that_was_measured_faster() -> None:
    """Blocks.balance with 16 x 32 tiles and counter waits (3-13% faster on an H200: width
    128, batches 64 to 256), not at fp32 and width 256 (2% slower), not with 16 x 64 tiles
    (the study shape: 2-4% slower; TF32 takes them from 256 rows) and not with grid
    barriers, where each phase still waits for its busiest program. The interpreter takes
    it, so CI runs that code."""
    def balanced(rows, width, precision):
        return mlp_step.blocks_for(rows, width, 132, precision, interpreter=False).balance

    for precision in ("fp32", "tf32", "bf16"):
        assert balanced(512, 128, precision) and balanced(128, 512, precision)
        assert not balanced(512, 512, precision) and not balanced(1024, 512, precision)
        assert not balanced(512, 2048, precision)
        assert mlp_step.blocks_for(512, 512, 132, precision, interpreter=True).balance
    assert balanced(512, 256, "bf16") and not balanced(512, 256, "fp32")
    assert balanced(256, 512, "fp32") and balanced(256, 512, "bf16")
    assert not balanced(512, 256, "tf32") and not balanced(256, 512, "tf32")  # TF32 takes 16 x 64 there
    assert balanced(64, 512, "tf32") and balanced(64, 512, "bf16") and not balanced(64, 512, "fp32")


def test_reduction_steps_where_they_were_measured_faster() -> None:
    """With 16 x 64 tiles the backward tiles reduce 64 at a time at TF32 (measured 4-5%
    faster there) and at fp32 with 3xTF32's chains apart (11% faster), 32 at bf16 (11%
    slower with 64), and the head's logits 64 at a time at bf16 (2% faster), 128
    otherwise; 16 x 32 tiles keep 32 and 128."""
    def steps(rows, width, precision):
        blocks = mlp_step.blocks_for(rows, width, 132, precision, interpreter=False)
        return blocks.k, blocks.head_k

    assert steps(512, 512, "tf32") == steps(1024, 512, "tf32") == steps(512, 256, "tf32") == (64, 128)
    assert steps(512, 512, "bf16") == steps(1024, 512, "bf16") == (32, 64)
    assert steps(512, 512, "fp32") == (64, 128)
    assert steps(64, 512, "tf32") == steps(128, 512, "tf32") == steps(64, 512, "bf16") == (32, 128)


def test_transposed_products_and_copies_where_they_were_measured_faster() -> None:
    """Measured (docs/fused-step.md): at TF32 and bf16, 64-column tiles run every
    hidden product transposed (wgmma), the backward tiles reading W, A and G from their
    transposed copies; bf16 swaps at any tile. fp32 (3xTF32 splits its operands in
    registers) and the 16 x 32 tiles of TF32 keep neither (slower or even). The
    interpreter runs each precision's choice, so CI runs the GPU's code."""
    def chosen(rows, width, precision, interpreter=False):
        blocks = mlp_step.blocks_for(rows, width, 132, precision, interpreter=interpreter)
        return blocks.swap, blocks.copies

    every = mlp_step.SWAP_CHOSEN
    assert every == 7  # forward (1), input-gradient (2) and weight (4) tiles
    for precision in ("tf32", "bf16"):
        assert chosen(512, 512, precision) == chosen(512, 512, precision, interpreter=True)
        assert chosen(512, 512, precision) == (every, mlp_step.ALL_COPIES)
    assert chosen(256, 512, "tf32") == chosen(64, 512, "bf16") == (every, mlp_step.ALL_COPIES)
    assert chosen(512, 512, "fp32") == chosen(512, 512, "fp32", interpreter=True) == (0, 0)
    assert chosen(1024, 512, "tf32") == (every, mlp_step.ALL_COPIES) and chosen(1024, 512, "fp32") == (0, 0)
    for precision in ("fp32", "tf32"):
        assert chosen(64, 512, precision) == chosen(512, 128, precision) == (0, 0)


def test_fp32_runs_3xtf32_as_independent_chains_everywhere() -> None:
    """Measured on an H200 (docs/fused-step.md): fp32's step with 3xTF32's three products
    as chains apart took 89.5 us against 112.8 at the study shape, and 55.9 against 64.9
    at batch 64, with gradients as close to float64. Every fp32 tile choice takes it, the
    interpreter's too; it names its own mode only where the precision is 'tf32x3'."""
    for rows, width in ((512, 512), (64, 512), (512, 128), (1024, 1024), (512, 256)):
        assert mlp_step.blocks_for(rows, width, 132, "fp32", interpreter=False).chains
    assert mlp_step.blocks_for(512, 512, 132, "fp32", interpreter=True).chains
    for precision in ("tf32", "bf16"):
        assert not mlp_step.blocks_for(512, 512, 132, precision, interpreter=False).chains
    x, y, (model, _), (optim, _), _ = problem(32, 2, "relu", "adam")
    step = fused(x, y, model, optim, "relu", 24)
    chains, plain = step.blocks, dataclasses.replace(step.blocks, chains=False)
    assert step.dot_for(plain) == mlp_step.STRICT_FP32
    assert step.dot_for(chains) == ("tf32x3 chains" if mlp_step.STRICT_FP32 == "tf32x3" else mlp_step.STRICT_FP32)
    step.dot = "tf32"  # a TF32 step keeps its mode whatever the field says
    assert step.dot_for(chains) == "tf32"


def test_tile_and_reduction_choices_at_their_exact_thresholds() -> None:
    """132 SMs, 264 programs: 16 x 64 tiles from programs / 2 = 132 tiles of a hidden
    layer (TF32 from 3/8, 99), fp32's 32 x 64 wider than 512 from 3/4 = 198 of them;
    counter waits at fp32 from 128 rows, TF32's 64-wide forward steps below 256 rows,
    balance but at fp32 and width 256. One row, or one column block, either side."""
    def b(rows, width, precision="fp32"):
        blocks = mlp_step.blocks_for(rows, width, 132, precision, interpreter=False)
        return blocks.m, blocks.n, blocks.k, blocks.k_forward, blocks.flags, blocks.balance

    # fp32, width 1024 (16 column blocks of 64): 13 x 16 = 208 tiles of 32 rows at 385 rows, 12 x 16 = 192 at 384
    assert b(385, 1024)[:2] == (32, 64) and b(384, 1024) == (16, 64, 64, 64, True, False)
    assert b(1024, 576)[:2] == (32, 64) and b(1024, 512)[:2] == (16, 64)  # wider than 512 only
    # width 512 (8 column blocks): 17 x 8 = 136 tiles at 257 rows, 16 x 8 = 128 at 256
    for precision in ("fp32", "bf16"):
        assert b(257, 512, precision)[:2] == (16, 64) and b(256, 512, precision)[:2] == (16, 32)
    assert b(512, 257)[:2] == (16, 64) and b(512, 256)[:2] == (16, 32)  # 5 x 32 = 160 tiles, 4 x 32 = 128
    # TF32: 13 x 8 = 104 tiles at 193 rows, 12 x 8 = 96 at 192
    assert b(193, 512, "tf32")[:3] == (16, 64, 64) and b(192, 512, "tf32")[:3] == (16, 32, 32)
    # 16 x 32 tiles: counter waits at fp32 from 128 rows, not at 127
    assert b(128, 512)[4:] == (True, True) and b(127, 512)[4:] == (False, False)
    assert b(127, 512, "tf32")[4] and b(127, 512, "bf16")[4]
    # TF32's forward steps of 64 under 256 rows (width 384: 16 x 6 = 96 tiles, below 99 at both)
    assert b(255, 384, "tf32")[3] == 64 and b(256, 384, "tf32")[3] == 0
    # balance at fp32 but for width 256 exactly
    assert not b(128, 256)[5] and b(128, 257)[5] and b(128, 255)[5]


def test_whole_tiles_only_where_the_forward_reduction_step_divides_the_width() -> None:
    """16 x 32 tiles with 64-wide forward steps: a width of 96 fills the column blocks
    and the backward steps (32) but not the forward's, so its loads stay masked."""
    blocks = mlp_step.Blocks(16, 32, 32, 16, 4, k_forward=64)
    assert not mlp_step.whole_tiles(64, [96], blocks)
    assert not mlp_step.whole_tiles(64, [128, 96], blocks)
    assert mlp_step.whole_tiles(64, [128, 64], blocks)
    assert mlp_step.whole_tiles(64, [96], dataclasses.replace(blocks, k_forward=0))
    assert not mlp_step.whole_tiles(64, [96], dataclasses.replace(blocks, k_forward=0, k=64))


def test_the_largest_head_that_fits_is_accepted_and_trains() -> None:
    assert mlp_step.unfit_reason([512, mlp_step.MAX_CLASSES], mlp_step.MAX_CLASSES, 512, 75) is None
    over = mlp_step.MAX_CLASSES + 1
    assert mlp_step.unfit_reason([512, over], over, 512, 75) == f"{over} classes > {mlp_step.MAX_CLASSES}"
    x, y, (model, _), (optim, _), exact = problem(16, 1, "relu", "sgd", rows=64, classes=mlp_step.MAX_CLASSES)
    assert mlp_step.FusedStep.usable([*model.hidden, model.head], 16) is None
    step = fused(x, y, model, optim, "relu", 16)
    index = torch.arange(16, device=DEVICE)
    step(index, torch.zeros((), device=DEVICE))
    step.check()
    F.cross_entropy(exact(x[index].double()), y[index]).backward()
    for (_, start, stop), reference in zip(optim.spans(), exact.parameters()):
        want = reference.grad.flatten()
        assert rms(optim.flat.grad[start:stop].double() - want) <= 1e-4 * rms(want)


def test_each_precision_builds_its_own_tiles(monkeypatch) -> None:
    x, y, (model, _), (optim, _), _ = problem(32, 2, "relu", "adam", rows=64)
    asked = []
    real = mlp_step.blocks_for

    def blocks_for(rows, width, sms, precision="fp32", **kwargs):
        asked.append(precision)
        return real(rows, width, sms, precision, **kwargs)

    monkeypatch.setattr(mlp_step, "blocks_for", blocks_for)
    steps = {p: fused(x, y, model, optim, "relu", 32, precision=p) for p in ("fp32", "tf32", "bf16")}
    assert asked == ["fp32", "tf32", "bf16"]
    for precision, step in steps.items():
        assert step.blocks == real(32, 32, step.sms, precision)
    assert steps["fp32"].blocks != steps["bf16"].blocks  # the interpreter runs each precision's GPU choice
    assert steps["bf16"].act_t.dtype == torch.bfloat16 and steps["fp32"].act_t.numel() == 1  # copies kept or not
    assert steps["tf32"].act_t.dtype == torch.float32 and steps["tf32"].act_t.numel() > 1


def test_a_batch_whose_last_row_block_is_short_has_its_counters() -> None:
    """40 rows in blocks of 16: three row blocks, the last of 8 rows, each with its rows-of-A
    and rows-of-G counter per layer. The interpreter's one program never waits, so the
    counts are read after a step whose last program was kept from zeroing them; a step as
    launched leaves them zero for the next, and the gradients are right."""
    assert mlp_step.sync_counters(3, 40, 16) == 2 + 2 * 3 * 3 + 2 * 3
    assert mlp_step.sync_counters(3, 48, 16) == mlp_step.sync_counters(3, 40, 16)
    assert mlp_step.sync_counters(3, 49, 16) == 2 + 2 * 3 * 4 + 2 * 3
    x, y, (model, _), (optim, _), exact = problem(32, 2, "relu", "adam", rows=64)
    step = fused(x, y, model, optim, "relu", 40)
    assert step.blocks.flags and step.blocks.m == 16 and step.blocks.n == 16
    assert step.sync.numel() == mlp_step.sync_counters(3, 40, 16)
    index = torch.arange(40, device=DEVICE)
    step.sync[1] = 1000  # "programs finished" far from the grid: the last one keeps from zeroing the counters
    step(index, torch.zeros((), device=DEVICE))
    step.check()
    blocks = 3
    rows_of_a = step.sync[2:2 + 3 * blocks].view(3, blocks)
    rows_of_g = step.sync[2 + 3 * blocks:2 + 6 * blocks].view(3, blocks)
    # each hidden layer's two 16-column tiles signalled their row block, the short third one too
    assert rows_of_a[:2].tolist() == [[2, 2, 2]] * 2 and rows_of_g[:2].tolist() == [[2, 2, 2]] * 2
    F.cross_entropy(exact(x[index].double()), y[index]).backward()
    for (_, start, stop), reference in zip(optim.spans(), exact.parameters()):
        want = reference.grad.flatten()
        assert rms(optim.flat.grad[start:stop].double() - want) <= 1e-4 * rms(want)
    step.sync.zero_()
    step(index, torch.zeros((), device=DEVICE))  # as the trainer launches it: the counters reset after
    step.check()
    assert not step.sync.any()


@pytest.fixture(scope="module")
def tiny():
    return load_dataset("synthetic", scale=0.01, device=DEVICE)


def config(**changes):
    base = {"width": 16, "depth": 1, "batch_size": 256, "epochs": 1, "impl": "triton", "optimizer_impl": "triton",
            "loop": "fast"}
    return TrainConfig(**{**base, **changes})


def test_the_trainer_records_which_route_ran(tiny, monkeypatch) -> None:
    monkeypatch.setattr(mlp_step, "SWITCH", "0")
    off = Trainer(config(), tiny)
    assert off.step_route == "layers (LOADBENCH_FUSED_STEP=0)" and off.notes == []
    monkeypatch.setattr(mlp_step, "SWITCH", "auto")
    auto = Trainer(config(batch_size=32), tiny)  # below the smallest batch measured (64)
    assert auto.step_route == ("layers (auto: batch 32 < 64)" if CUDA else "layers (auto: no CUDA GPU)")
    assert auto.notes == []
    monkeypatch.setattr(mlp_step, "SWITCH", "1")
    assert Trainer(config(), tiny).step_route == "fused-step"
    assert Trainer(config(loop="reference"), tiny).step_route.startswith("layers (the reference loop")
    assert Trainer(config(impl="torch"), tiny).step_route == "layers"
    monkeypatch.setattr(mlp_step, "MAX_CLASSES", 4)
    refused = Trainer(config(), tiny)
    assert refused.step_route == "layers (10 classes > 4)"
    assert refused.notes == ["the fused step did not run: 10 classes > 4"]


def test_auto_never_overrides_the_steps_own_refusal(tiny, monkeypatch) -> None:
    """Under 'auto', where auto itself would take the step (as on a GPU at a measured
    shape), a shape the step refuses still trains through the layer kernels, with the
    step's reason and no note (auto asked for nothing in particular)."""
    monkeypatch.setattr(mlp_step, "SWITCH", "auto")
    monkeypatch.setattr(mlp_step, "auto_refusal", lambda widths, rows, cuda: None)
    assert Trainer(config(), tiny).step_route == "fused-step"  # auto takes it where the step fits
    monkeypatch.setattr(mlp_step, "MAX_CLASSES", 4)
    refused = Trainer(config(), tiny)
    assert refused.step_route == "layers (10 classes > 4)" and refused.fused_step is None and refused.notes == []
    assert Trainer(config(loop="reference"), tiny).step_route.startswith("layers (the reference loop")


@interpreter
def test_an_epoch_through_the_fused_step_follows_the_layer_route(tiny, monkeypatch) -> None:
    results = {}
    for enabled in (True, False):
        monkeypatch.setattr(mlp_step, "SWITCH", "1" if enabled else "0")
        trainer = Trainer(config(), tiny)
        trainer.fit()
        results[enabled] = (trainer.result(), trainer.optimizer.flat.detach().clone())
    (fused_run, fused_params), (layer_run, layer_params) = results[True], results[False]
    assert fused_run.step_route == "fused-step" and layer_run.step_route.startswith("layers")
    assert fused_run.losses[0] == pytest.approx(layer_run.losses[0], rel=1e-5)
    assert torch.allclose(fused_params, layer_params, rtol=1e-4, atol=1e-6)


@gpu
@pytest.mark.parametrize("flags", [False, True], ids=["barriers", "flags"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_study_shape_on_a_gpu(precision, flags) -> None:
    """3x512, batch 512, a program per SM: gradients against float64 (fp32 as close as
    eager torch's; bf16 within bf16's rounding), the barrier flag clear, two runs equal."""
    runs = []
    for _ in range(2):
        x, y, (model, _), (optim, _), exact = problem(512, 3, "leaky_relu", "adam")
        step = fused(x, y, model, optim, "leaky_relu", 512, precision)
        step.use_blocks(dataclasses.replace(step.blocks, flags=flags))
        index = torch.randperm(len(y), generator=torch.Generator().manual_seed(1))[:512].to(DEVICE)
        step(index, torch.zeros((), device=DEVICE))
        step.check()
        F.cross_entropy(exact(x[index].double()), y[index]).backward()
        runs.append(optim.flat.detach().clone())
        bound = 2e-6 if precision == "fp32" else 0.1
        for (_, start, stop), reference in zip(optim.spans(), exact.parameters()):
            want = reference.grad.flatten()
            assert rms(optim.flat.grad[start:stop].double() - want) <= bound * rms(want)
    assert torch.equal(runs[0], runs[1])


def thirty_steps(shape, **changes):
    """(parameters, summed loss, programs) after 30 steps of the fused step at `shape`
    (width, depth, batch, precision) with these Blocks changes, every seventh batch short
    as an epoch's last one is."""
    width, depth, batch, precision = shape
    x, y, (model, _), (optim, _), _ = problem(width, depth, "leaky_relu", "adam", rows=4000)
    step = fused(x, y, model, optim, "leaky_relu", batch, precision)
    step.use_blocks(dataclasses.replace(step.blocks, **changes))
    total = torch.zeros((), device=DEVICE)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(3)).to(DEVICE)
    for s in range(30):
        step(order[(s * batch) % 3000 :][: batch - 13 * (s % 7 == 6)], total)
    step.check()
    return optim.flat.detach().clone(), total.clone(), step.programs


@gpu
@pytest.mark.parametrize("shape", [(512, 3, 512, "tf32"), (512, 5, 500, "bf16"), (128, 1, 64, "fp32")],
                         ids=["3x512-tf32", "5x512-bf16", "1x128-batch-64"])
def test_flags_race_nothing_on_a_gpu(shape) -> None:
    """With every program resident and running at once, 30 steps whose tiles wait on
    counters (some batches short) end on the bits the grid barriers give: a read that
    raced its producer would show as a difference somewhere in the parameters."""
    (flat, total, _), (flat_flags, total_flags, _) = (thirty_steps(shape, flags=flags) for flags in (False, True))
    assert torch.equal(flat, flat_flags) and torch.equal(total, total_flags)


@gpu
@pytest.mark.parametrize("shape", [(512, 3, 512, "tf32"), (512, 5, 500, "bf16"), (512, 3, 128, "fp32"),
                                   (512, 3, 64, "fp32")],
                         ids=["3x512-tf32", "5x512-bf16", "3x512-batch-128", "3x512-batch-64-barriers"])
def test_tiles_dealt_as_one_sequence_give_the_same_bits_on_a_gpu(shape) -> None:
    """Blocks.balance changes which program takes a tile, not what the tile computes: 30
    steps (some batches short) end on the same bits dealt either way, with counter waits
    and with grid barriers (fp32 at batch 64)."""
    (flat, total, programs), (flat_dealt, total_dealt, _) = (
        thirty_steps(shape, balance=balance) for balance in (False, True))
    assert programs > 100  # many programs, so the two deals differ
    assert torch.equal(flat, flat_dealt) and torch.equal(total, total_dealt)


@gpu
@pytest.mark.parametrize("shape", [(512, 3, 512, "tf32"), (512, 5, 500, "bf16"), (512, 3, 512, "fp32")],
                         ids=["3x512-tf32", "5x512-bf16", "3x512-fp32"])
def test_split_tiles_give_the_same_bits_dealt_any_way_on_a_gpu(shape) -> None:
    """Blocks.split: a tile's two parts meet at a counter and sum in a fixed order, so 30
    steps end on the same bits whichever programs take the parts: grid barriers or
    counter waits, the tiles dealt phase by phase or as one sequence, one or two programs
    an SM."""
    runs = [thirty_steps(shape, m=32, split=2, flags=flags, balance=balance, per_sm=per_sm)
            for flags, balance, per_sm in ((False, False, 2), (True, False, 2), (True, True, 2), (True, False, 1))]
    assert runs[0][2] != runs[3][2]  # two grids
    for flat, total, _ in runs[1:]:
        assert torch.equal(runs[0][0], flat) and torch.equal(runs[0][1], total)


@interpreter
@pytest.mark.parametrize(("width", "depth", "batch", "block_m", "precision"), [
    (48, 3, 40, 16, "fp32"),      # partial tiles; the input's 75 columns split 48 + 27
    (32, 1, 33, 32, "bf16"),      # one hidden layer, two head row blocks to a row block
    (32, 2, 48, 16, "tf32"),      # whole tiles: unmasked loads over each part
], ids=["3x48", "1x32-tall-rows-bf16", "2x32-whole"])
def test_a_split_step_matches_float64_and_leaves_its_counters_zero(width, depth, batch, block_m, precision) -> None:
    """Blocks.split = 2: every hidden tile's reduction in two parts, with grid barriers and
    with counter waits (the same bits), over launches of different batch sizes: gradients
    as close to float64 as one part's, every wait met, the counters zero after each launch."""
    results = []
    for flags in (False, True):
        x, y, (model, _), (optim, _), exact = problem(width, depth, "tanh", "adam", rows=200)
        step = fused(x, y, model, optim, "tanh", batch, precision)
        step.use_blocks(dataclasses.replace(step.blocks, m=block_m, head_m=16, split=2, flags=flags))
        for scratch in (step.act, step.z, step.g, step.act_t, step.g_t, step.w_t):
            scratch.fill_(float("nan"))
        total = torch.zeros((), device=DEVICE)
        for launch, rows in enumerate((batch, batch - 3, batch)):
            index = torch.arange(launch * batch, launch * batch + rows, device=DEVICE)
            if launch == 0:
                exact.zero_grad()
                F.cross_entropy(exact(x[index].double()), y[index]).backward()
            step(index, total)
            assert not step.sync.any()
            if launch == 0:
                for (_, start, stop), reference in zip(optim.spans(), exact.parameters()):
                    want = reference.grad.flatten()
                    bound = 1e-2 if precision == "bf16" else 1e-5
                    assert rms(optim.flat.grad[start:stop].double() - want) <= bound * rms(want)
        step.check()
        results.append((optim.flat.detach().clone(), total.clone()))
    assert all(torch.equal(a, b) for a, b in zip(results[0], results[1]))


@pytest.mark.parametrize("settings", [["--precision", "fp32"], ["--precision", "tf32"], ["--precision", "bf16"],
                                      ["--precision", "tf32", "--set", "m=32", "--set", "split=2"],
                                      ["--precision", "tf32", "--set", "tma=1"],
                                      ["--precision", "bf16", "--set", "tma=1"],
                                      ["--precision", "tf32", "--set", "max_regs=168", "--set", "per_sm=3"]],
                         ids=["fp32", "tf32", "bf16", "tf32-split", "tf32-tma", "bf16-tma", "tf32-168-registers"])
def test_the_step_compiles_for_hopper_without_a_gpu(settings, tmp_path) -> None:
    """The interpreter runs the kernel's Python, not Triton's compiler: a kernel only the
    compiler refuses (a value of two types on two branches, once) passed every CPU test.
    bench.tools.step_compile builds it for sm_90 here, in a process without the
    interpreter, and fails where the GPU's build would; --rows writes the build's row."""
    from bench.tools.rows import KINDS
    from bench.tools.rows import read_rows

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    csv_path = tmp_path / "step-builds.csv"
    done = subprocess.run([sys.executable, "-m", "bench.tools.step_compile", *settings, "--rows", str(csv_path)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.search(r"sm_90, 3x512, batch 512, \w+, .*: \d+ registers, \d+ stack bytes, \d+ spill stores", done.stdout)
    header, (row,) = read_rows(csv_path)
    assert header == KINDS["step-builds"].fields
    assert row["card"] == "sm_90 build (no GPU)" and row["precision"] == settings[1] and int(row["registers"]) > 0
    assert (row["blocks"] == "blocks_for") == ("--set" not in settings)
    if "max_regs=168" in settings:  # ptxas keeps to the cap and spills the rest
        assert int(row["registers"]) <= 168


@interpreter
@pytest.mark.parametrize(("width", "depth", "batch", "block_m", "precision"), [
    (48, 3, 40, 16, "tf32"),    # partial tiles: the descriptors' zero fill stands in for the masks
    (32, 2, 40, 32, "bf16"),    # two head row blocks to a row block; bf16 copies
], ids=["3x48-tf32", "2x32-tall-rows-bf16"])
def test_tensor_memory_loads_give_the_pointer_loads_bits(width, depth, batch, block_m, precision) -> None:
    """Blocks.tma: the hidden products' operands through tensor descriptors, with and
    without the transposed copies, over launches of different batch sizes, end on the bits
    of the per-element loads; scratch left NaN shows no read past the batch."""
    for copies in (0, 3):
        results = []
        for tma in (False, True):
            x, y, (model, _), (optim, _), _ = problem(width, depth, "tanh", "adam", rows=200)
            step = fused(x, y, model, optim, "tanh", batch, precision)
            step.use_blocks(dataclasses.replace(step.blocks, m=block_m, head_m=16, copies=copies, tma=tma))
            for scratch in (step.act, step.z, step.g, step.act_t, step.g_t, step.w_t):
                scratch.fill_(float("nan"))
            total = torch.zeros((), device=DEVICE)
            for launch, rows in enumerate((batch, batch - 3, batch)):
                step(torch.arange(launch * batch, launch * batch + rows, device=DEVICE), total)
                assert not step.sync.any()
            step.check()
            results.append((optim.flat.detach().clone(), total.clone()))
        assert torch.isfinite(results[1][0]).all()
        assert all(torch.equal(a, b) for a, b in zip(results[0], results[1])), copies


def test_tensor_memory_loads_need_widths_in_sixteens() -> None:
    x, y, (model, _), (optim, _), _ = problem(40, 2, "tanh", "adam", rows=100)
    step = fused(x, y, model, optim, "tanh", 40)
    with pytest.raises(ValueError, match=r"Blocks.tma needs hidden widths in multiples of 16 .*\[40, 40\]"):
        step.use_blocks(dataclasses.replace(step.blocks, tma=True))


@gpu
@pytest.mark.parametrize("shape", [(512, 3, 512, "tf32"), (512, 5, 500, "bf16"), (512, 3, 512, "fp32")],
                         ids=["3x512-tf32", "5x512-bf16", "3x512-fp32"])
def test_tensor_memory_loads_give_the_same_bits_on_a_gpu(shape) -> None:
    """Blocks.tma with every program running at once: 30 steps (some batches short) end on
    the bits of the per-element loads, with counter waits (a descriptor load that raced
    its producer, or read a stale line, would show)."""
    (flat, total, _), (flat_tma, total_tma, _) = (thirty_steps(shape, tma=tma) for tma in (False, True))
    assert torch.equal(flat, flat_tma) and torch.equal(total, total_tma)


@gpu
@pytest.mark.parametrize("shape", [(512, 3, 512, "tf32"), (512, 5, 500, "bf16"), (512, 3, 512, "fp32")],
                         ids=["3x512-tf32", "5x512-bf16", "3x512-fp32"])
def test_capped_registers_keep_more_programs_and_the_same_bits_on_a_gpu(shape) -> None:
    """Blocks.max_regs changes where values live (registers or the stack), not what is
    computed: with three and four programs an SM resident at once, 30 steps (some batches
    short) end on the bits of two programs an SM."""
    flat, total, programs = thirty_steps(shape)
    sms = torch.cuda.get_device_properties(DEVICE).multi_processor_count
    for per_sm, changes in ((3, dict(max_regs=168)), (4, dict(max_regs=128, stages=2))):
        flat_capped, total_capped, capped = thirty_steps(shape, per_sm=per_sm, **changes)
        assert (programs, capped) == (2 * sms, per_sm * sms), changes
        assert torch.equal(flat, flat_capped) and torch.equal(total, total_capped), changes


def test_the_compile_tool_refuses_the_interpreter(monkeypatch, capsys) -> None:
    from bench.tools.step_compile import main

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(SystemExit) as stop:
        main(["--precision", "tf32"])
    assert stop.value.code == 2 and "TRITON_INTERPRET=1 replaces the compiler" in capsys.readouterr().err


def test_a_tile_splits_in_one_or_two_parts() -> None:
    x, y, (model, _), (optim, _), _ = problem(32, 2, "tanh", "adam", rows=100)
    step = fused(x, y, model, optim, "tanh", 40)
    with pytest.raises(ValueError, match="Blocks.split=3; a tile's reduction splits in 1 or 2 parts"):
        step.use_blocks(dataclasses.replace(step.blocks, split=3))
    step.use_blocks(dataclasses.replace(step.blocks, m=16, split=2))
    # 40 rows and 80 columns (the input's 75, padded): 3 x 5 hidden tiles of 16 x 16 at most
    assert step.pair_tiles == 5 * cdiv(80, step.blocks.n)
    assert step.sync.numel() == mlp_step.sync_counters(3, 40, 16, step.pair_tiles)


def test_the_phase_table_reads_the_stamps() -> None:
    from bench.tools.step_phases import Phase
    from bench.tools.step_phases import phase_names
    from bench.tools.step_phases import phases

    assert phase_names(4) == ["F_0", "F_1", "F_2", "H", "D_2", "D_1", "last"]
    assert phase_names(2) == ["F_0", "H", "last"]
    # Two programs, two layers: start, (arrival, departure) per barrier, end; in ns.
    stamps = [[0, 5000, 7000, 20000, 21000, 30000], [100, 6000, 7100, 19000, 21500, 40000]]
    assert phases(stamps, 2) == [Phase("F_0", 5.9, 1.1, 6.0), Phase("H", 13.0, 1.5, 20.0),
                                 Phase("last", 18.5, None, 40.0)]


def test_the_inner_stamps_give_each_part_of_the_first_forward_tiles() -> None:
    from bench.tools.step_phases import inner_spans

    # Columns 0 start, 2 F_0's end; 20-22 inside F_0's tile, 23-27 inside F_1's; a program
    # without a tile of F_1 (the third) leaves those zero and is not counted.
    def row(start, f0, f1):
        r = [0] * 32
        r[0], r[2] = start, start + 9000
        r[20], r[21], r[22] = (start + f for f in f0)
        if f1:
            r[23], r[24], r[26], r[27] = (start + 9000 + f for f in f1)
        return r
    stamps = [row(1000, (4000, 5000, 8000), (1000, 5000, 6000, 7000)),  # globaltimer ns: never 0
              row(1100, (3000, 4000, 6000), (2000, 4000, 5000, 5500)),
              row(1200, (5000, 6000, 9000), None)]
    spans = inner_spans(stamps, 4)
    assert spans["F_0 product"] == (4.0, 5.0)  # 4, 3, 5 us: median 4, slowest 5
    assert spans["F_1 wait"] == (2.0, 2.0) and spans["F_1 product"] == (4.0, 4.0)
    assert spans["F_1 signal"] == (1.0, 1.0)
    assert inner_spans(stamps, 6) is None


def test_the_phase_tool_takes_a_tile_shape_and_refuses_a_bad_one(capsys) -> None:
    from bench.tools.step_phases import main
    from bench.tools.step_phases import parse_tiles

    assert parse_tiles("16x64") == (16, 64)
    assert parse_tiles("32X32") == (32, 32)
    for bad in ("16", "16x48", "x64", "16x64x2", "a x b"):
        with pytest.raises(SystemExit) as stop:
            main(["--tiles", bad])
        assert stop.value.code == 2
        assert f"argument --tiles: {bad!r}: expected MxN" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        main(["--sync", "barrier"])
    assert stop.value.code == 2
    assert "argument --sync: invalid choice: 'barrier'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        main(["--swap", "8"])
    assert stop.value.code == 2
    assert "argument --swap: invalid choice: 8" in capsys.readouterr().err


def test_the_phase_tool_sets_any_blocks_field_and_refuses_a_bad_one(capsys) -> None:
    from bench.tools.step_phases import blocks_changes
    from bench.tools.step_phases import main
    from bench.tools.step_phases import parse_setting

    fields = [f.name for f in dataclasses.fields(mlp_step.Blocks)]
    assert parse_setting("head_k=64") == ("head_k", 64)
    assert blocks_changes([("k", 64), ("flags", 0)], fields, ["flags"]) == {"k": 64, "flags": False}
    assert blocks_changes([("flags", 1)], fields, ["flags"]) == {"flags": True}
    for bad in ("k", "k=", "k=-1", "k=6.5", "=3", "k 64"):
        with pytest.raises(SystemExit) as stop:
            main(["--set", bad])
        assert stop.value.code == 2
        assert f"argument --set: {bad!r}: expected FIELD=VALUE" in capsys.readouterr().err
    for args, message in ((["--set", "head=64"], "Blocks has no field 'head' (it has: m, n, k, head_m"),
                          (["--set", "k=64", "--set", "k=32"], "--set k: given twice"),
                          (["--set", "flags=2"], "--set flags=2: a switch, 0 (off) or 1 (on)")):
        with pytest.raises(SystemExit) as stop:
            main(args)
        assert stop.value.code == 2
        assert message in capsys.readouterr().err


def test_the_phase_tool_refuses_without_a_gpu(capsys) -> None:
    if CUDA:
        pytest.skip("checks the no-GPU message")
    from bench.tools.step_phases import main

    assert main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
