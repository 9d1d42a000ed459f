"""The fused linear+activation op against torch, on CPU (Triton interpreter) and GPU."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F
from hypothesis import example
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from kernels.plan.trials import FORCED
from kernels.plan.launch_plan import ACTIVATION_CODES
from kernels.plan.launch_plan import LaunchConfig
from kernels.plan.launches import launch_config
from kernels.ops.linear_act import linear_act
from kernels.ground.axes import ACTIVATIONS
from model.mlp import MLP
from tests.devices import CUDA
from tests.devices import DEVICE

gpu = pytest.mark.gpu

REFERENCE = {
    "identity": lambda z: z,
    "relu": F.relu,
    "leaky_relu": lambda z: F.leaky_relu(z, 0.01),
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "silu": F.silu,
}


def run(fn, x, w, b, dy):
    """Output and the three gradients of fn(x, w, b) for upstream gradient dy."""
    x, w, b = (t.detach().clone().requires_grad_() for t in (x, w, b))
    y = fn(x, w, b)
    y.backward(dy)
    return [y.detach(), x.grad, w.grad, b.grad]


def inputs(m, k, n, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    make = lambda *shape: (torch.randn(*shape, generator=g) / max(1, shape[-1]) ** 0.25).to(DEVICE, dtype)  # noqa: E731
    return make(m, k), make(n, k), make(n), make(m, n)


def magnitudes(x, w, b, dy):
    """What a floating-point sum's rounding error scales with: each output's and
    gradient's products summed in absolute value (an activation's derivative is at most
    about 1), so a result that cancels to near zero is not held to its own size."""
    x, w, b, dy = (t.double().abs() for t in (x, w, b, dy))
    return [x @ w.t() + b, dy @ w, dy.t() @ x, dy.sum(0)]


def check_against_float64(m, k, n, activation, dtype, factor=1.5, floor=None, floor_of="result"):
    """Our RMS error against a float64 reference is at most `factor` x eager torch's in the
    same dtype, plus `floor` x the RMS of the reference ('result') or of its products'
    magnitudes ('magnitude', for shapes whose sums may cancel).

    RMS rather than max: in 16-bit types the max is one output rounding step either way."""
    x, w, b, dy = inputs(m, k, n, dtype)
    torch_fn = lambda x, w, b: REFERENCE[activation](F.linear(x, w, b))  # noqa: E731
    ours = run(lambda x, w, b: linear_act(x, w, b, activation), x, w, b, dy)
    eager = run(torch_fn, x, w, b, dy)
    exact = run(torch_fn, x.double(), w.double(), b.double(), dy.double())
    floor = floor if floor is not None else {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]
    sizes = exact if floor_of == "result" else magnitudes(x, w, b, dy)
    for name, o, e, r, size in zip(("y", "dx", "dw", "db"), ours, eager, exact, sizes):
        ours_err = (o.double() - r).pow(2).mean().sqrt().item()
        torch_err = (e.double() - r).pow(2).mean().sqrt().item()
        scale = size.pow(2).mean().sqrt().item() + 1e-12
        assert ours_err <= factor * torch_err + floor * scale, (name, ours_err, torch_err)


@pytest.mark.parametrize("activation", sorted(ACTIVATION_CODES))
@pytest.mark.parametrize("shape", [(64, 75, 128), (37, 75, 10), (128, 96, 64)], ids=["first-layer", "head", "hidden"])
def test_forward_and_gradients_match_torch_fp32(activation, shape) -> None:
    torch.set_float32_matmul_precision("highest")
    check_against_float64(*shape, activation, torch.float32)


@pytest.mark.parametrize("activation", sorted(ACTIVATION_CODES))
def test_forward_and_gradients_match_torch_fp16(activation) -> None:
    check_against_float64(48, 75, 40, activation, torch.float16)


@settings(max_examples=25, deadline=None)
@given(
    m=st.integers(1, 130),
    k=st.sampled_from([1, 10, 17, 75, 64, 100]),
    n=st.sampled_from([1, 10, 33, 64, 96]),
    activation=st.sampled_from(sorted(ACTIVATION_CODES)),
)
@example(m=119, k=1, n=1, activation="identity")  # dW is a 119-term sum that cancels to 0.08 of its terms' size
def test_any_shape_is_masked_correctly(m, k, n, activation) -> None:
    # weird shapes: nothing needs to be a multiple of a block; a masking slip is an
    # error of the order of the values, far above fp32 rounding of the products' sizes
    torch.set_float32_matmul_precision("highest")
    check_against_float64(m, k, n, activation, torch.float32, floor_of="magnitude")


def test_input_gradient_is_skipped_when_not_needed() -> None:
    x, w, b, dy = inputs(16, 75, 32, torch.float32)
    w.requires_grad_()
    linear_act(x, w, b, "relu").backward(dy[:, :32])
    assert w.grad is not None and x.grad is None


def test_bad_arguments_are_named() -> None:
    x, w, b, _ = inputs(4, 8, 6, torch.float32)
    with pytest.raises(ValueError, match="activation 'gelu'"):
        linear_act(x, w, b, "gelu")
    with pytest.raises(ValueError, match=r"shapes x \(4, 8\), w \(6, 7\)"):
        linear_act(x, w[:, :7], b, "relu")


def test_launch_table_keeps_tiles_legal() -> None:
    for rows, cols, red in [(64, 10, 512), (16384, 2048, 2048), (512, 512, 75), (1, 1, 1)]:
        for dtype in (torch.float32, torch.bfloat16):
            cfg = launch_config("fwd", rows, cols, red, dtype)
            assert min(cfg.block_r, cfg.block_c, cfg.block_red) >= 16


def test_mlp_impls_share_the_math() -> None:
    torch.manual_seed(3)
    reference = MLP(75, 64, 2, 10, "silu").to(DEVICE)
    fused = MLP(75, 64, 2, 10, "silu", impl="triton").to(DEVICE)
    fused.load_state_dict(reference.state_dict())
    x = torch.randn(33, 75, device=DEVICE)
    torch.set_float32_matmul_precision("highest")
    assert torch.allclose(reference(x), fused(x), atol=1e-5)


# ------------------------------------------------------------------------ GPU only


@gpu
@pytest.mark.parametrize("activation", ["relu", "silu", "tanh"])
def test_bf16_and_tf32_tolerances(activation) -> None:
    check_against_float64(512, 512, 512, activation, torch.bfloat16)
    torch.set_float32_matmul_precision("high")
    try:
        check_against_float64(512, 512, 512, activation, torch.float32, floor=2e-3)
    finally:
        torch.set_float32_matmul_precision("highest")


@gpu
@pytest.mark.parametrize("mode", [
    pytest.param("ieee", marks=pytest.mark.xfail(reason="measured on an H100: Triton's IEEE fp32 dot has about 2x "
                                                  "cuBLAS SGEMM's RMS error in dX (5x in dW at batch 4096); "
                                                  "hence 3xTF32 is the default strict-fp32 mode")),
    "tf32x3",
])
@pytest.mark.parametrize("shape", [(512, 512, 512), (512, 2048, 2048), (4096, 75, 512)],
                         ids=["hidden", "wide", "first-layer"])
def test_strict_fp32_modes_against_float64(monkeypatch, mode, shape) -> None:
    """Both strict-fp32 paths, no absolute floor: the 1.5x bound against cuBLAS's IEEE
    error alone decides whether a mode may stand for 'fp32'."""
    from kernels.plan import launch_plan

    monkeypatch.setattr(launch_plan, "STRICT_FP32", mode)
    torch.set_float32_matmul_precision("highest")
    check_against_float64(*shape, "leaky_relu", torch.float32, floor=0.0)


def test_strict_fp32_choice_is_checked() -> None:
    from kernels.plan.launch_plan import strict_fp32_from_env

    assert strict_fp32_from_env(None) == "tf32x3" and strict_fp32_from_env("ieee") == "ieee"
    with pytest.raises(ValueError, match="LOADBENCH_STRICT_FP32='tf32x2': use one of ieee, tf32x3"):
        strict_fp32_from_env("tf32x2")


@gpu
def test_opcheck() -> None:
    x, w, b, _ = inputs(64, 75, 128, torch.float32)
    for t in (x, w, b):
        t.requires_grad_()
    torch.library.opcheck(torch.ops.loadbench.linear_act_fwd.default, (x, w, b, ACTIVATION_CODES["silu"]))


@gpu
def test_torch_compile_matches_eager() -> None:
    model = MLP(75, 256, 3, 10, "leaky_relu", impl="triton").cuda()
    x = torch.randn(512, 75, device="cuda")
    compiled = torch.compile(model)
    assert torch.allclose(compiled(x), model(x), atol=1e-4)


@gpu
def test_cuda_graph_capture_and_replay() -> None:
    model = MLP(75, 256, 3, 10, "silu", impl="triton").cuda()
    static_x = torch.randn(256, 75, device="cuda")
    model(static_x).sum().backward()  # compile and warm up outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = model(static_x)
    static_x.copy_(torch.randn(256, 75, device="cuda"))
    graph.replay()
    assert torch.allclose(static_y, model(static_x), atol=1e-5)


@pytest.mark.parametrize("kernel", ["fwd", "dw", "dx"])
def test_every_tuning_candidate_computes_the_same_result(kernel) -> None:
    from kernels.plan.tuning import candidates

    torch.set_float32_matmul_precision("highest")
    x, w, b, dy = inputs(40, 75, 24, torch.float32)
    expected = run(lambda x, w, b: linear_act(x, w, b, "silu"), x, w, b, dy)
    spread = candidates(torch.float32)[::3]  # a spread of tiles; the interpreter is slow
    routes = [dataclasses.replace(spread[0], split_k=2), dataclasses.replace(spread[0], backend="cublas")]
    for cfg in spread + routes:
        FORCED[kernel] = cfg
        try:
            got = run(lambda x, w, b: linear_act(x, w, b, "silu"), x, w, b, dy)
        finally:
            FORCED.clear()
        for name, g, e in zip(("y", "dx", "dw", "db"), got, expected):
            assert torch.allclose(g, e, atol=1e-5), (kernel, cfg, name)


def test_shape_classes_round_up_to_powers_of_two() -> None:
    from kernels.plan.launch_plan import shape_key

    assert (shape_key("fwd", 512, 10, 2048, torch.float32, "tf32x3", "identity")
            == "fwd:float32:tf32x3:identity:512:16:2048")
    assert shape_key("dw", 2048, 75, 64, torch.bfloat16, "ieee", "silu") == "dw:bfloat16:ieee:silu:2048:128:64"


def test_the_key_names_what_changes_the_measured_kernel(monkeypatch) -> None:
    """The strict-fp32 mode and TF32 run different dots; silu stores and re-reads its
    pre-activation; relu, tanh and sigmoid share leaky_relu's class."""
    from kernels.plan import launch_plan as plan

    torch.set_float32_matmul_precision("highest")
    keys = {}
    for mode in ("tf32x3", "ieee"):
        monkeypatch.setattr(plan, "STRICT_FP32", mode)
        keys[mode] = plan.shape_key("fwd", 64, 64, 64, torch.float32, plan.precision_for(torch.float32), "pointwise")
    torch.set_float32_matmul_precision("high")
    try:
        keys["tf32"] = plan.shape_key("fwd", 64, 64, 64, torch.float32, plan.precision_for(torch.float32), "pointwise")
    finally:
        torch.set_float32_matmul_precision("highest")
    assert len(set(keys.values())) == 3 and all(f":{mode}:" in key for mode, key in keys.items())
    assert {plan.activation_class(a) for a in ("relu", "leaky_relu", "tanh", "sigmoid")} == {"pointwise"}
    assert plan.activation_class("silu") == "silu" and plan.activation_class(ACTIVATION_CODES["identity"]) == "identity"


def test_the_kernels_code_every_activation_a_model_may_name() -> None:
    assert list(ACTIVATION_CODES) == ["identity", *ACTIVATIONS]
    assert sorted(ACTIVATION_CODES.values()) == list(range(len(ACTIVATION_CODES)))


def test_tuner_refuses_to_run_without_a_gpu(capsys) -> None:
    if CUDA:
        pytest.skip("checks the no-GPU message")
    from bench.tools.tune import main

    assert main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_tuning_runs_split_over_gpus_merge_into_one_table(tmp_path) -> None:
    from bench.tools.tune import main
    from kernels.plan.tuning import read_measured
    from kernels.plan.tuning import write_table

    def entry(ms: float, block: int) -> dict:
        config = {"block_r": block, "block_c": 64, "block_red": 16, "num_warps": 4, "num_stages": 3, "group": 8}
        return {"ms": ms, "heuristic_ms": 2 * ms, "config": config, "shape": [512, 512, 512]}

    write_table(str(tmp_path / "a.json"), "GPU X",
                {"fwd:float32:512:512": entry(0.02, 32), "dw:float32:512:512": entry(0.01, 64)})
    write_table(str(tmp_path / "b.json"), "GPU X", {"dw:float32:512:512": entry(0.03, 128)})
    out = tmp_path / "table.json"
    assert main(["--merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--out", str(out)]) == 0
    merged = read_measured(str(out))["GPU X"]
    assert merged["fwd:float32:512:512"]["config"]["block_r"] == 32
    assert merged["dw:float32:512:512"]["config"]["block_r"] == 128  # the costlier shape's tile


def test_merging_a_file_that_is_not_a_launch_table_names_it(tmp_path, capsys) -> None:
    from bench.tools.tune import main

    bad = tmp_path / "notes.json"
    bad.write_text('{"GPU X": {"configs": {"fwd:float32:16:16": {}}}}')
    assert main(["--merge", str(bad), "--out", str(tmp_path / "t.json")]) == 2
    err = capsys.readouterr().err
    assert "notes.json" in err and "not a launch table" in err
    assert not (tmp_path / "t.json").exists()


def test_a_first_use_cache_becomes_the_table_with_its_own_versions(tmp_path) -> None:
    from kernels.plan import launch_plan as plan
    from bench.tools.tune import main
    from kernels.plan.tuning import read_measured
    from kernels.plan.tuning_cache import TuningCache
    from kernels.plan.tuning_cache import cache_key

    config = {"block_r": 16, "block_c": 64, "block_red": 32, "num_warps": 4, "num_stages": 3, "group": 8,
              "split_k": 4, "backend": "triton"}
    cache = TuningCache(tmp_path, cache_key("GPU Y", "3.6.0", "2.11.0"))
    cache.put("dw:float32:tf32x3:pointwise:512:512:512", {"config": config, "ms": 0.004, "timing": "quick 5 x 3"})
    out = tmp_path / "table.json"
    out.write_text(json.dumps({"GPU X": {"configs": {}, "evidence": {}}}))  # another GPU's table stays
    assert main(["--from-cache", str(tmp_path / "launch-cache.json"), "--out", str(out)]) == 0
    table = json.loads(out.read_text())
    assert set(table) == {"GPU X", "GPU Y"}
    mine = table["GPU Y"]
    assert (mine["triton"], mine["torch"], mine["key_format"]) == ("3.6.0", "2.11.0", plan.KEY_FORMAT)
    assert "first-use tuning" in mine["timing"]
    entry = read_measured(str(out))["GPU Y"]["dw:float32:tf32x3:pointwise:512:512:512"]
    assert entry["config"] == config and entry["timing"] == "quick 5 x 3"


@pytest.mark.parametrize(
    "content",
    ['{"format": 1}', '{"groups": {"GPU Y": {}}}', '{"groups": {"GPU Y | triton 3 | torch 2": {"k": {"ms": 1}}}}',
     "{oops"],
)
def test_a_file_that_is_not_a_tuning_cache_is_named_and_nothing_written(tmp_path, capsys, content) -> None:
    from bench.tools.tune import main

    bad = tmp_path / "cache.json"
    bad.write_text(content)
    assert main(["--from-cache", str(bad), "--out", str(tmp_path / "t.json")]) == 2
    err = capsys.readouterr().err
    assert "cache.json" in err and "not a tuning cache file" in err
    assert not (tmp_path / "t.json").exists()


def test_bias_gradient_over_a_long_batch_is_as_accurate_as_torch() -> None:
    """db is one sequential sum over the batch per program; the kernel compensates it
    (Kahan), so a long batch loses no more than torch's tree reduction does."""
    torch.set_float32_matmul_precision("highest")
    x, w, b, dy = inputs(8192, 16, 16, torch.float32, seed=1)
    dy = dy * 100 + 1  # same-signed, large terms: the case where a plain running sum drifts
    ours = run(lambda x, w, b: linear_act(x, w, b, "leaky_relu"), x, w, b, dy)[3]
    eager = run(lambda x, w, b: REFERENCE["leaky_relu"](F.linear(x, w, b)), x, w, b, dy)[3]
    exact = run(lambda x, w, b: REFERENCE["leaky_relu"](F.linear(x, w, b)), x.double(), w.double(), b.double(),
                dy.double())[3]
    ours_err, torch_err = ((g.double() - exact).pow(2).mean().sqrt().item() for g in (ours, eager))
    assert ours_err <= torch_err, (ours_err, torch_err)


# -------------------------------------------------- split-K, routes, launch report


def forced_run(launches, cfg, m, k, n, activation="leaky_relu", dtype=torch.float32):
    x, w, b, dy = inputs(m, k, n, dtype)
    FORCED["dw"] = cfg
    try:
        return run(lambda x, w, b: linear_act(x, w, b, activation), x, w, b, dy)
    finally:
        FORCED.clear()


@pytest.mark.parametrize(("m", "nk", "block"), [(64, 32, 16), (130, 48, 16), (97, 40, 32)])
def test_split_k_weight_gradient_is_accurate_and_reproducible(launches, m, nk, block) -> None:
    """dW and db summed from 2 or 4 batch slices: as accurate as the one-slice kernel,
    the same bits on every run (fixed-order sum, no atomics), and equal to split 1
    within fp32 rounding."""
    torch.set_float32_matmul_precision("highest")
    whole = forced_run(launches, LaunchConfig(block, block, block, 4, 3), m, nk, nk)
    for split in (2, 4):
        cfg = LaunchConfig(block, block, block, 4, 3, split_k=split)
        first, again = forced_run(launches, cfg, m, nk, nk), forced_run(launches, cfg, m, nk, nk)
        for name, a, b, w in zip(("y", "dx", "dw", "db"), first, again, whole):
            assert torch.equal(a, b), (split, name)
            assert torch.allclose(a, w, rtol=1e-5, atol=1e-5 * w.abs().max().item()), (split, name)
        FORCED["dw"] = cfg
        try:
            check_against_float64(m, nk, nk, "silu", torch.float32)
        finally:
            FORCED.clear()


def test_split_k_in_sixteen_bits(launches) -> None:
    FORCED["dw"] = LaunchConfig(16, 16, 32, 4, 3, split_k=4)
    check_against_float64(128, 40, 32, "tanh", torch.float16)


def test_split_k_bias_gradient_over_a_long_batch_is_as_accurate_as_torch(launches) -> None:
    torch.set_float32_matmul_precision("highest")
    x, w, b, dy = inputs(8192, 16, 16, torch.float32, seed=1)
    dy = dy * 100 + 1
    FORCED["dw"] = LaunchConfig(16, 16, 32, 4, 3, split_k=8)
    ours = run(lambda x, w, b: linear_act(x, w, b, "leaky_relu"), x, w, b, dy)[3]
    FORCED.clear()
    eager = run(lambda x, w, b: REFERENCE["leaky_relu"](F.linear(x, w, b)), x, w, b, dy)[3]
    exact = run(lambda x, w, b: REFERENCE["leaky_relu"](F.linear(x, w, b)), x.double(), w.double(), b.double(),
                dy.double())[3]
    ours_err, torch_err = ((g.double() - exact).pow(2).mean().sqrt().item() for g in (ours, eager))
    assert ours_err <= torch_err, (ours_err, torch_err)


def table_for(routes: dict[str, LaunchConfig], m: int, k: int, n: int, activation: str, dtype=torch.float32) -> dict:
    """A committed-table stand-in for this device, one entry per kernel of the layer."""
    from kernels.plan import launch_plan as plan

    out = {"fwd": (m, n, k), "dw": (n, k, m), "dx": (m, k, n)}
    prec, cls = plan.precision_for(dtype), plan.activation_class(activation)
    configs = {plan.shape_key(kn, *out[kn], dtype, prec, cls): dataclasses.asdict(c) for kn, c in routes.items()}
    model = torch.cuda.get_device_name() if CUDA else "cpu"  # the table's key: this device's model
    return {model: {"key_format": plan.KEY_FORMAT, "configs": configs}}


CUBLAS = LaunchConfig(64, 32, 32, 4, 3, backend="cublas")


@pytest.mark.parametrize("activation", sorted(ACTIVATION_CODES))
def test_cublas_route_matches_torch(launches, activation) -> None:
    """torch.mm plus our epilogue (bias + activation) and prologue (dZ, db) kernels."""
    torch.set_float32_matmul_precision("highest")
    launches.reset_launch_state(mode="off",
                                tables=table_for({"fwd": CUBLAS, "dw": CUBLAS, "dx": CUBLAS}, 48, 40, 33, activation))
    check_against_float64(48, 40, 33, activation, torch.float32)
    report = launches.launch_report()
    assert {e["kernel"]: (e["source"], e["route"]) for e in report} == {
        k: ("table", "cublas+epilogue") for k in ("fwd", "dw", "dx")
    }


PRESPLIT = LaunchConfig(16, 32, 16, 4, 3, backend="presplit")


@pytest.mark.parametrize("activation", sorted(ACTIVATION_CODES))
@pytest.mark.parametrize("routes", [
    {"fwd": PRESPLIT, "dw": PRESPLIT, "dx": PRESPLIT},
    {"dw": PRESPLIT},
    {"dx": PRESPLIT, "dw": CUBLAS},
    {"dw": PRESPLIT, "dx": CUBLAS},
], ids=["all", "dw", "dx-dw-cublas", "dw-dx-cublas"])
def test_presplit_route_matches_torch(launches, activation, routes) -> None:
    """The 3xTF32 products from pre-split operands (kernels/ops/presplit.py) as accurate
    as torch's strict fp32; 70 x 40 x 36 leaves partial tiles and reduction steps on
    every side of the three products (dX and dW launch their transposes), beside the
    other routes' kernels sharing its dZ."""
    torch.set_float32_matmul_precision("highest")
    launches.reset_launch_state(mode="off", tables=table_for(routes, 70, 40, 36, activation))
    check_against_float64(70, 40, 36, activation, torch.float32)
    got = {e["kernel"]: e["route"] for e in launches.launch_report()}
    for kernel, cfg in routes.items():
        assert got[kernel] == cfg.describe(), (kernel, got)


@pytest.mark.skipif(not CUDA, reason="the tensor cores' accumulation: the interpreter multiplies in fp32")
def test_presplit_route_is_as_accurate_as_tf32x3_at_width_2048(launches) -> None:
    """At K = 2048 the presplit route's error against float64 is at most twice the fused
    kernel's (Triton's tf32x3): each reduction step's products summed on the tensor
    cores from zero, not into the running sum, whose accumulation drops low bits."""
    torch.set_float32_matmul_precision("highest")
    x, w, b, dy = inputs(512, 2048, 2048, torch.float32)
    exact = F.linear(x.double(), w.double(), b.double())
    errors = {}
    for route in ("triton", "presplit"):
        cfg = LaunchConfig(64, 64, 32, 4, 3, backend=route)
        launches.reset_launch_state(mode="off", tables=table_for({"fwd": cfg}, 512, 2048, 2048, "identity"))
        with torch.no_grad():
            y = linear_act(x, w, b, "identity")
        errors[route] = (y.double() - exact).abs().max().item() / exact.abs().max().item()
    assert errors["presplit"] <= 2 * errors["triton"], errors


def test_presplit_parts_sum_to_the_operand() -> None:
    """hi is x rounded to TF32 (ten mantissa bits, ties away from zero) and hi + lo is x
    exactly, in the layout the product reads: a strided (transposed) input included."""
    from kernels.ops import linear_act as op

    x = torch.randn(70, 33, device=DEVICE).t()  # strides (1, 33)
    x[0, :3] = torch.tensor([1 + 2**-11, 1 + 2**-11 + 2**-13, -(1 + 2**-11 + 2**-13)])
    hi, lo = op._split(x, op._launch_direct)
    assert hi.is_contiguous() and torch.equal(hi + lo, x)
    assert (hi.view(torch.int32) & 0x1FFF).eq(0).all()
    assert hi[0, :3].tolist() == [1 + 2**-10, 1 + 2**-10, -(1 + 2**-10)]
    assert (lo.abs() <= hi.abs() * 2**-11).all()


def test_a_presplit_route_outside_strict_fp32_is_refused_with_the_key(launches) -> None:
    """A table giving the presplit route to a 16-bit or TF32 key warns with the key and
    falls back: its products are 3xTF32 of fp32 operands only."""
    torch.set_float32_matmul_precision("high")
    launches.reset_launch_state(mode="off", tables=table_for({"fwd": PRESPLIT}, 8, 40, 24, "relu"))
    with pytest.warns(UserWarning, match="fwd:float32:tf32:.*presplit route is for float32 at tf32x3"):
        check_against_float64(8, 40, 24, "relu", torch.float32, floor=2e-3)
    got = {e["kernel"]: (e["source"], e["route"]) for e in launches.launch_report()}
    assert got["fwd"] == ("heuristic", "triton")


GEMV = LaunchConfig(1, 16, 16, 4, 1, backend="gemv")


@pytest.mark.parametrize("activation", sorted(ACTIVATION_CODES))
@pytest.mark.parametrize("m", [1, 3], ids=["batch-1", "batch-3"])
def test_gemv_route_matches_torch(launches, activation, m) -> None:
    """The few-row forward (serving batches): products on the FMA units, a strip of
    columns per program; K = 75 and N = 33 leave partial strips and reduction steps.
    Its gradients take the tensor-core kernels, as a table giving it the forward only."""
    torch.set_float32_matmul_precision("highest")
    cfg = dataclasses.replace(GEMV, block_r=4 if m > 1 else 1)
    launches.reset_launch_state(mode="off", tables=table_for({"fwd": cfg}, m, 75, 33, activation))
    check_against_float64(m, 75, 33, activation, torch.float32)
    got = {e["kernel"]: e["route"] for e in launches.launch_report()}
    assert got["fwd"] == f"gemv {cfg.block_r}x16x16 w4"


def test_gemv_route_rounds_w_to_the_autocast_dtype(launches) -> None:
    """Under 16-bit autocast the gemv route multiplies X by W rounded to X's dtype,
    as the tensor-core kernel and autocast torch do (fp16 on a CPU: see below)."""
    low = torch.bfloat16 if CUDA else torch.float16
    launches.reset_launch_state(mode="off", tables=table_for({"fwd": GEMV}, 1, 40, 24, "relu", low))
    x, w, b, _ = inputs(1, 40, 24, torch.float32)
    with torch.no_grad(), torch.autocast(DEVICE, low):
        ours = linear_act(x, w, b, "relu")
    expected = F.relu(x.to(low).double() @ w.to(low).double().T + b.double())
    assert ours.dtype == low
    torch.testing.assert_close(ours.double(), expected.to(low).double(), rtol=1e-2, atol=1e-3)


def test_a_gemv_route_for_a_gradient_is_refused_with_the_key(launches) -> None:
    """A table giving the forward-only route to dW warns with the key and falls back."""
    launches.reset_launch_state(mode="off", tables=table_for({"dw": GEMV}, 8, 40, 24, "relu"))
    with pytest.warns(UserWarning, match="dw:.*gemv route is forward-only"):
        check_against_float64(8, 40, 24, "relu", torch.float32)
    got = {e["kernel"]: (e["source"], e["route"]) for e in launches.launch_report()}
    assert got["dw"] == ("heuristic", "triton")


@pytest.mark.parametrize("routes", [
    {"dw": CUBLAS},
    {"dx": CUBLAS},
    {"fwd": CUBLAS, "dw": LaunchConfig(16, 16, 16, 4, 3, split_k=2)},
], ids=["dw-cublas", "dx-cublas", "fwd-cublas-dw-split"])
def test_mixed_routes_match_torch(launches, routes) -> None:
    torch.set_float32_matmul_precision("highest")
    launches.reset_launch_state(mode="off", tables=table_for(routes, 70, 40, 36, "silu"))
    check_against_float64(70, 40, 36, "silu", torch.float32)
    got = {e["kernel"]: e["route"] for e in launches.launch_report()}
    for kernel, cfg in routes.items():
        assert got[kernel] == ("cublas+epilogue" if cfg.backend == "cublas" else "triton split-K 2")


@pytest.mark.parametrize("routes", [
    {},
    {"fwd": CUBLAS, "dw": CUBLAS, "dx": CUBLAS},
    {"dw": LaunchConfig(16, 16, 16, 4, 3, split_k=2)},
], ids=["triton", "cublas", "dw-split"])
def test_autocast_hands_the_kernels_fp32_master_weights(launches, routes) -> None:
    """Under 16-bit autocast W and b reach the kernels in fp32: Y is 16-bit, dW and db
    come back in fp32 (from the fused kernels without passing through 16 bits), and
    every result is as close to float64 as autocast torch's (which rounds dW before
    casting it back). fp16 on a CPU: Triton's interpreter does not support bf16 dots
    (triton-lang/triton#11584); on a GPU this runs bf16."""
    m, k, n = 48, 40, 33
    low = torch.bfloat16 if CUDA else torch.float16
    launches.reset_launch_state(mode="off", tables=table_for(routes, m, k, n, "silu", low))
    x, w, b, dy = inputs(m, k, n, torch.float32)
    x, w, b = (t.detach().clone().requires_grad_() for t in (x, w, b))
    results = {}
    for name, fn in (("ours", lambda: linear_act(x, w, b, "silu")), ("torch", lambda: F.silu(F.linear(x, w, b)))):
        with torch.autocast(DEVICE, low):
            y = fn()
        y.backward(dy.to(y.dtype))
        results[name] = [y.detach(), x.grad, w.grad, b.grad]
        x.grad = w.grad = b.grad = None
    y, dx, dw, db = results["ours"]
    assert (y.dtype, dx.dtype, dw.dtype, db.dtype) == (low, torch.float32, torch.float32, torch.float32)
    if "dw" not in routes or routes["dw"].backend != "cublas":  # torch.mm's dW is 16-bit, cast after
        assert not torch.equal(dw, dw.to(low).float())  # stored from the fp32 accumulator
    exact = run(lambda x, w, b: F.silu(F.linear(x, w, b)), x.double(), w.double(), b.double(), dy.double())
    for name, o, t, r in zip(("y", "dx", "dw", "db"), results["ours"], results["torch"], exact):
        rms = lambda a: (a.double() - r).pow(2).mean().sqrt().item()  # noqa: E731
        assert rms(o) <= 1.5 * rms(t) + 1e-3 * r.pow(2).mean().sqrt().item(), (name, rms(o), rms(t))
    got = {e["kernel"]: e["route"] for e in launches.launch_report()}
    assert got["fwd"] == ("cublas+epilogue" if "fwd" in routes else "triton")


def test_launch_report_names_every_kernel_shape_and_source(launches) -> None:
    torch.manual_seed(1)
    launches.reset_launch_state(mode="off")  # the heuristic everywhere: no tuning on a GPU
    model = MLP(75, 32, 2, 10, "relu", impl="triton").to(DEVICE)
    x = torch.randn(20, 75, device=DEVICE)
    model(x).sum().backward()
    report = launches.launch_report()
    seen = {(e["kernel"], tuple(e["shape"])) for e in report}
    layers = [(20, 32, 75), (20, 32, 32), (20, 10, 32)]  # (M, N, K)
    assert seen == {("fwd", s) for s in layers} | {("dw", s) for s in layers} | {("dx", s) for s in layers[1:]}
    for e in report:  # the first layer's input needs no gradient: no dx for it
        assert e["source"] == "heuristic" and e["route"] == "triton" and e["dtype"] == "float32"
        assert LaunchConfig.from_dict(e["config"]) == launch_config(e["kernel"], *_out(e), torch.float32, DEVICE)


def _out(entry) -> tuple[int, int, int]:
    m, n, k = entry["shape"]
    return {"fwd": (m, n, k), "dw": (n, k, m), "dx": (m, k, n)}[entry["kernel"]]


def test_launch_configs_are_checked_when_read() -> None:
    assert LaunchConfig.from_dict({"block_r": 32, "block_c": 32, "block_red": 16, "num_warps": 4, "num_stages": 3})
    for bad in ({"block_r": 24}, {"block_r": 8}, {"backend": "cudnn"}, {"split_k": 0}, {"tile": 3}, {"num_warps": 3}):
        cfg = {"block_r": 32, "block_c": 32, "block_red": 16, "num_warps": 4, "num_stages": 3, **bad}
        with pytest.raises((ValueError, TypeError)):
            LaunchConfig.from_dict(cfg)


@gpu
def test_split_k_is_reproducible_on_the_gpu(launches) -> None:
    """The fixed-order partial sum gives the same bits run to run where the hardware
    schedules programs differently every time."""
    torch.set_float32_matmul_precision("highest")
    cfg = LaunchConfig(64, 64, 32, 4, 3, split_k=4)
    first, again = forced_run(launches, cfg, 512, 512, 512), forced_run(launches, cfg, 512, 512, 512)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    FORCED["dw"] = cfg
    check_against_float64(512, 512, 512, "leaky_relu", torch.float32)


@gpu
def test_first_use_tuning_on_the_gpu_then_capture(launches, tmp_path) -> None:
    """LOADBENCH_TUNE=always on a real GPU: every kernel of a layer is timed, stored,
    right, and a CUDA graph captured afterwards replays the tuned tiles."""
    torch.set_float32_matmul_precision("highest")
    launches.reset_launch_state(mode="always", cache_dir=tmp_path / "cache")
    check_against_float64(512, 256, 512, "silu", torch.float32)
    report = launches.launch_report()
    assert {e["kernel"] for e in report
            if e["source"] == "tuned" and e["shape"] == [512, 512, 256]} == {"fwd", "dw", "dx"}
    assert (tmp_path / "cache" / "launch-cache.json").is_file()
    model = MLP(75, 256, 2, 10, "silu", impl="triton").cuda()
    static_x = torch.randn(256, 75, device="cuda")
    model(static_x).sum().backward()  # tunes eagerly, outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = model(static_x)
    graph.replay()
    assert torch.allclose(static_y, model(static_x), atol=1e-5)
    assert not any(e.get("note") for e in launches.launch_report())  # nothing fell back


@gpu
def test_a_capture_runs_the_tuned_cublas_route_and_eager_calls_the_fused_finalist(launches, tmp_path,
                                                                                  monkeypatch) -> None:
    """Kernels tuned to the cuBLAS route with a fused finalist close behind: eager calls
    (forward, and backward on autograd's thread) launch the fused kernels, a CUDA graph
    captured from the same code after a warm-up the cuBLAS route (the GPU-time
    winner), whose handles the eager calls made ready (none may be created inside a
    capture), and both give the same answer."""
    from kernels.plan import launch_plan as plan
    from kernels.ops import linear_act as op

    def measure(kernel, m, n, k, dtype, cfg, device, activation="leaky_relu", quick=False):
        rows_cols_red = {kn: shape for kn, *shape in plan.kernel_shapes(m, n, k)}[kernel]
        return 1.0 if cfg.backend == "cublas" else 1.001 if cfg == plan.heuristic_config(*rows_cols_red, dtype) else 5.0

    torch.set_float32_matmul_precision("highest")
    # no committed table: on a GPU it has (an H100) the table would decide the tiles
    launches.reset_launch_state(cache_dir=tmp_path / "cache", tables={}, measure=measure, host_call_ms=0.01)
    names: list[str] = []
    real = op._launch_direct
    monkeypatch.setattr(op, "_launch_direct",
                        lambda fn, grid, *a, **k: (names.append(fn.fn.__name__), real(fn, grid, *a, **k)))
    x, w, b, dy = (t.requires_grad_(i < 3) for i, t in enumerate(inputs(256, 128, 128, torch.float32)))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # the warm-up torch's CUDA-graph notes ask for
        for _ in range(2):
            eager_y = linear_act(x, w, b, "leaky_relu")
            eager_y.backward(dy)
    torch.cuda.current_stream().wait_stream(side)
    assert names == ["_forward_kernel", "_weight_grad_kernel", "_input_grad_kernel"] * 2, names
    names.clear()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = linear_act(x, w, b, "leaky_relu")
        static_y.backward(dy)
    graph.replay()
    report = [(e["kernel"], e["route"], e.get("eager", {}).get("route"), e.get("note"))
              for e in launches.launch_report()]
    assert names == ["_bias_act_kernel", "_act_grad_kernel"], (names, report)
    torch.testing.assert_close(static_y, eager_y, rtol=1e-5, atol=1e-5)


def test_a_table_written_by_the_tuner_holds_routes_and_is_used(launches, tmp_path) -> None:
    """bench.tools.tune writes the tuned entries, split-K and the cuBLAS route included, in
    key format 2; a run reads them back as the table and launches those routes."""
    import json

    from kernels.plan import launch_plan as plan
    from kernels.plan.tuning import write_table

    torch.set_float32_matmul_precision("highest")
    f32, (m, k, n) = torch.float32, (70, 40, 36)
    prec, cls = plan.precision_for(f32), plan.activation_class("silu")
    entries = {
        plan.shape_key("fwd", m, n, k, f32, prec, cls): {"config": dataclasses.asdict(CUBLAS), "ms": 0.01},
        plan.shape_key("dw", n, k, m, f32, prec, cls):
            {"config": dataclasses.asdict(LaunchConfig(16, 16, 16, 4, 3, split_k=2)), "ms": 0.02},
    }
    model = torch.cuda.get_device_name() if CUDA else "cpu"  # the table's key: this device's model
    write_table(str(tmp_path / "table.json"), model, entries)
    written = json.loads((tmp_path / "table.json").read_text())
    assert written[model]["key_format"] == plan.KEY_FORMAT
    launches.reset_launch_state(mode="off", tables=written)
    check_against_float64(m, k, n, "silu", f32)
    got = {e["kernel"]: (e["source"], e["route"]) for e in launches.launch_report()}
    assert got == {"fwd": ("table", "cublas+epilogue"), "dw": ("table", "triton split-K 2"),
                   "dx": ("heuristic", "triton")}


# ------------------------------------------------------------------ the layer stack


def _stack_params(widths, seed=0):
    g = torch.Generator().manual_seed(seed)
    ws = [(torch.randn(o, i, generator=g) / i**0.5).to(DEVICE).requires_grad_() for i, o in zip(widths, widths[1:])]
    bs = [(torch.randn(o, generator=g) / 4).to(DEVICE).requires_grad_() for o in widths[1:]]
    return ws, bs


@pytest.mark.parametrize("low", [None, "fp16"], ids=["fp32", "fp16-autocast"])
@pytest.mark.parametrize("input_grad", [False, True], ids=["x-no-grad", "x-grad"])
def test_the_stack_gives_the_per_layer_bits_in_one_autograd_node(launches, low, input_grad) -> None:
    """`linear_act_stack` (what MLP(impl='triton') calls) against `linear_act` layer by
    layer: the same launches, so the same bits, forward and every gradient; eagerly the
    stack is one backward node. fp16 autocast on a CPU (the interpreter has no bf16 dot)."""
    from kernels.ops.linear_act import linear_act_stack

    torch.set_float32_matmul_precision("highest")
    launches.reset_launch_state(mode="off")
    acts = ["relu", "silu", "tanh", "identity"]
    ws, bs = _stack_params([75, 40, 33, 24, 10])
    x = torch.randn(37, 75, generator=torch.Generator().manual_seed(1)).to(DEVICE).requires_grad_(input_grad)
    dtype = torch.bfloat16 if CUDA else torch.float16
    results = []
    for stacked in (True, False):
        with torch.autocast(DEVICE, dtype, enabled=low is not None):
            if stacked:
                y = linear_act_stack(x, ws, bs, acts)
                assert type(y.grad_fn).__name__ == "_EagerStackBackward"
            else:
                y = x
                for w, b, a in zip(ws, bs, acts):
                    y = linear_act(y, w, b, a)
        y.float().square().sum().backward()
        results.append([y.detach()] + [t.grad.clone() for t in (*ws, *bs)] + ([x.grad.clone()] if input_grad else []))
        for t in (x, *ws, *bs):
            t.grad = None
    for a, b in zip(*results):
        assert a.dtype == b.dtype and torch.equal(a, b)


def test_the_stack_says_which_layer_does_not_fit() -> None:
    from kernels.ops.linear_act import linear_act_stack

    ws, bs = _stack_params([75, 40, 10])
    x = torch.randn(5, 75, device=DEVICE)
    with pytest.raises(ValueError, match="layer 1: shapes"):
        linear_act_stack(x, [ws[0], ws[0]], bs, ["relu", "identity"])
    with pytest.raises(ValueError, match="layer 1: activation 'gelu'"):
        linear_act_stack(x, ws, bs, ["relu", "gelu"])
    with pytest.raises(ValueError, match="2 weights, 1 biases"):
        linear_act_stack(x, ws, bs[:1], ["relu", "identity"])


def test_under_a_dispatch_mode_the_stack_runs_the_ops_layer_by_layer(launches) -> None:
    """A dispatch mode (FlopCounter, make_fx) must see the op of every layer."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from kernels.ops.linear_act import linear_act_stack

    class Seen(TorchDispatchMode):
        ops: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func.name()))
            return func(*args, **(kwargs or {}))

    launches.reset_launch_state(mode="off")
    ws, bs = _stack_params([75, 40, 10])
    with Seen() as seen:
        y = linear_act_stack(torch.randn(5, 75, device=DEVICE), ws, bs, ["relu", "identity"])
    assert type(y.grad_fn).__name__ != "_EagerStackBackward"
    assert seen.ops.count("loadbench::linear_act_fwd") == 2
