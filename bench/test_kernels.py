"""The fused kernel against eager torch and torch.compile: one MLP forward + backward
(head and loss gradient included, optimizer excluded), per batch x width x dtype.

pytest-benchmark times the Triton implementation (graph replay on a GPU, eager on a
CPU); extra_info holds every implementation's time in both modes, measured with
triton.testing's do_bench / do_bench_cudagraph, their TFLOP/s and the ratios.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from model.cost import layer_shapes
from model.config import TrainConfig
from model.mlp import MLP
from model.train import precision_mode

GPU_GRID = [(b, w) for b in (64, 128, 256, 512) for w in (128, 256, 512, 1024, 2048)]
CPU_GRID = [(64, 32)]  # Triton's interpreter: the code path, not the speed
ACTIVATIONS = ("relu", "leaky_relu", "tanh", "sigmoid", "silu")


def _grid() -> list[tuple[int, int, str]]:
    """The batch x width grid with leaky_relu (the study's optimum), and every
    activation at batch 512 x width 512."""
    grid = GPU_GRID if torch.cuda.is_available() else CPU_GRID
    cells = [(b, w, "leaky_relu") for b, w in grid]
    b, w = grid[-1] if not torch.cuda.is_available() else (512, 512)
    return cells + [(b, w, a) for a in ACTIVATIONS if a != "leaky_relu"]


def _step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, precision: str):
    def run() -> None:
        with torch.autocast(x.device.type, torch.bfloat16, enabled=precision == "bf16", cache_enabled=False):
            loss = F.cross_entropy(model(x), y)
        loss.backward()

    return run


def _time_ms(fn, device: torch.device, graph: bool) -> float:
    if device.type != "cuda":
        import time

        fn()
        start = time.perf_counter()
        fn()
        return 1000 * (time.perf_counter() - start)
    from triton.testing import do_bench
    from triton.testing import do_bench_cudagraph

    return do_bench_cudagraph(fn, rep=100) if graph else do_bench(fn, warmup=25, rep=100)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize(("batch", "width", "activation"), _grid(), ids=lambda v: str(v))
def test_mlp_step(benchmark, request, precision: str, batch: int, width: int, activation: str) -> None:
    session = request.config.pluginmanager.get_plugin("loadbench")
    device = session.options.device
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    x = torch.randn(batch, 75, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    base = MLP(75, width, 3, 10, activation).to(device)
    models = {"torch": base, "triton": MLP(75, width, 3, 10, activation, impl="triton").to(device)}
    models["triton"].load_state_dict(base.state_dict())
    if cuda:
        # A fresh compile per case: past dynamo's recompile limit a compiled module
        # quietly runs eagerly, and the baseline would no longer be torch.compile.
        torch._dynamo.reset()
        models["compile"] = torch.compile(MLP(75, width, 3, 10, activation).to(device))
    flops = 6 * batch * sum(i * o for i, o in layer_shapes(TrainConfig(width=width, depth=3)))
    times: dict[str, float | None] = {}
    with precision_mode(precision):
        steps = {name: _step(m, x, y, precision) for name, m in models.items()}
        for name, step in steps.items():
            step()  # compile / autotune outside any timing
            for graph in (False, True):
                key = f"{name}_{'graph' if graph else 'eager'}_ms"
                times[key] = _time_ms(step, device, graph) if (cuda or not graph) else None
        triton_step = steps["triton"]
        if cuda:
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                triton_step()
            target = lambda: (graph.replay(), torch.cuda.synchronize())  # noqa: E731
        else:
            target = triton_step
        benchmark.group = f"kernels-{precision}"
        benchmark.pedantic(target, rounds=20 if cuda else 1, warmup_rounds=3 if cuda else 0)

    def ratio(a: str, b: str) -> float | None:
        return times[a] / times[b] if times.get(a) and times.get(b) else None

    benchmark.extra_info.update(
        batch=batch, width=width, activation=activation, precision=precision, times_ms=times,
        tflops={k: flops / (v / 1000) / 1e12 for k, v in times.items() if v},
        speedup_graph_vs_torch=ratio("torch_graph_ms", "triton_graph_ms"),
        speedup_graph_vs_compile=ratio("compile_graph_ms", "triton_graph_ms"),
        speedup_eager_vs_torch=ratio("torch_eager_ms", "triton_eager_ms"),
        notes=[] if cuda else ["CPU: Triton interpreter and eager torch only; no graphs, no torch.compile"],
    )  # fmt: skip
    assert all(v is None or (v > 0 and math.isfinite(v)) for v in times.values())


@pytest.mark.parametrize("batch", [4096, 8192])
def test_bare_gemm_against_cublas(benchmark, request, batch: int) -> None:
    """The strict-fp32 GEMM core at large shapes: identity activation vs torch.mm (cuBLAS
    SGEMM); extra_info names the kernel's strict-fp32 mode (IEEE or 3xTF32)."""
    session = request.config.pluginmanager.get_plugin("loadbench")
    device = session.options.device
    if device.type != "cuda":
        pytest.skip("the cuBLAS comparison needs a GPU; the interpreter proves nothing about speed")
    from triton.testing import do_bench

    from kernels.linear_act import linear_act

    x = torch.randn(batch, 2048, device=device)
    w = torch.randn(2048, 2048, device=device)
    b = torch.zeros(2048, device=device)
    with precision_mode("fp32"):
        ours = do_bench(lambda: linear_act(x, w, b, "identity"), rep=200)
        cublas = do_bench(lambda: torch.mm(x, w.T), rep=200)
        benchmark.group = "gemm-fp32"
        benchmark.pedantic(lambda: (linear_act(x, w, b, "identity"), torch.cuda.synchronize()), rounds=20)
    flops = 2 * batch * 2048 * 2048
    benchmark.extra_info.update(
        triton_ms=ours, cublas_ms=cublas, triton_tflops=flops / ours / 1e9, cublas_tflops=flops / cublas / 1e9,
        fraction_of_cublas=cublas / ours, strict_fp32_kernel=session.options.strict_fp32,
    )
