"""The fused kernel against eager torch and torch.compile: one MLP forward + backward (head
and loss gradient included, optimizer excluded), per batch x width x dtype.

pytest-benchmark times the Triton implementation (graph replay on a GPU, eager on a
CPU), and its rounds are gated on time like a training case's epochs; extra_info holds
every implementation's time in both modes, measured with triton.testing's do_bench /
do_bench_cudagraph (bench/tools/bench_cells.py does the measuring, here and in `python
-m bench.tools.bench_cells`), their TFLOP/s, the ratios, and where each layer's tiles
came from (`tile_sources`: table, cache, tuned, heuristic; `tile_routes`: split-K,
cublas+epilogue; `tiles`: the launch report). The terminal summary names the losing
cells: our speedup over the best baseline (the faster of torch and torch.compile, under
CUDA graphs) below 0.95. A baseline that fails for one cell (torch.compile, say) is
recorded in `errors`, not a failed case.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from bench.plugin.verdicts import judge_calls
from kernels.ground.axes import ACTIVATIONS
from model.mlp import MLP
from model.train import precision_mode

GPU_GRID = [(b, w) for b in (64, 128, 256, 512) for w in (128, 256, 512, 1024, 2048)]
# Batch-1 serving shapes, (width, hidden blocks): the optimal configuration, the deepest, the
# widest the one launch takes (2048 goes layer by layer); on a CPU one small network.
SERVING_GPU = {"optimal": (512, 3), "blocks-5": (512, 5), "units-1024": (1024, 3)}
SERVING_CPU = {"tiny": (32, 2)}
CPU_GRID = [(64, 32)]  # Triton's interpreter: the code path, not the speed
SUMMARY = "loadbench-kernel-cells"


# The cells of the pull-request tier: the study's batch across widths 128, 512 and 2048, its
# width at the smallest batch, and silu (the one activation whose backward re-reads its
# pre-activation); every other cell runs in the nightly tier.
PR_CELLS = {(512, 128, "leaky_relu"), (512, 512, "leaky_relu"), (512, 2048, "leaky_relu"),
            (64, 512, "leaky_relu"), (512, 512, "silu"), (64, 32, "leaky_relu")}
PR_SERVING = {"optimal", "tiny"}


def _tier(values: tuple[object, ...], pr: bool) -> object:
    return pytest.param(*values, marks=() if pr else [pytest.mark.nightly])


def _grid() -> list[object]:
    """The batch x width grid with leaky_relu (the study's optimum), and every
    activation at batch 512 x width 512; cells outside PR_CELLS are nightly."""
    grid = GPU_GRID if torch.cuda.is_available() else CPU_GRID
    cells = [(b, w, "leaky_relu") for b, w in grid]
    b, w = grid[-1] if not torch.cuda.is_available() else (512, 512)
    cells += [(b, w, a) for a in ACTIVATIONS if a != "leaky_relu"]
    return [_tier(cell, cell in PR_CELLS) for cell in cells]


class CellSummary:
    """A plugin the first cell registers: at the end, the cells that lose."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.cuda = torch.cuda.is_available()

    def lines(self) -> list[str]:
        from bench.tools.bench_cells import LOSING

        if not self.cuda:  # the interpreter's times say nothing about speed: name the cells only
            return [f"CPU: {len(self.records)} cell(s) ran through the Triton interpreter against eager torch: "
                    "the code path, not a speed comparison"]
        lines = []
        for precision in ("fp32", "bf16"):
            mine = [r for r in self.records if r["precision"] == precision]
            losing = [r for r in mine if r["losing"]]
            named = ", ".join(
                f"{r['batch']}x{r['width']} {r['activation']} {r['speedup_vs_best']:.2f} of {r['best_baseline']}"
                f" (tiles: {' '.join(f'{k} {v}' for k, v in sorted(r['tile_sources'].items()))};"
                f" routes: {' '.join(f'{k} {v}' for k, v in sorted(r['tile_routes'].items())) or 'triton'})"
                for r in losing
            )
            if mine:
                lines.append(f"{precision}: {len(losing)} of {len(mine)} cells below {LOSING} of the best baseline"
                             + (f": {named}" if named else ""))
        return lines

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.records:
            terminalreporter.write_sep("-", "fused kernel cells")
            for line in self.lines():
                terminalreporter.write_line(line)


def _summary(config: pytest.Config) -> CellSummary:
    plugin = config.pluginmanager.get_plugin(SUMMARY)
    if plugin is None:
        plugin = CellSummary()
        config.pluginmanager.register(plugin, SUMMARY)
    return plugin


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize(("batch", "width", "activation"), _grid(), ids=lambda v: str(v))
def test_mlp_step(benchmark, request, precision: str, batch: int, width: int, activation: str) -> None:
    from bench.tools.bench_cells import measure_cell

    session = request.config.pluginmanager.get_plugin("loadbench")
    device = session.options.device
    cuda = device.type == "cuda"
    cell = measure_cell(batch, width, activation, precision, device)
    with precision_mode(precision):
        triton_step = cell.steps["triton"]
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
    record = cell.record()
    notes = [] if cuda else ["CPU: Triton interpreter and eager torch only; no graphs, no torch.compile"]
    benchmark.extra_info.update(record, notes=notes)
    _summary(request.config).records.append(record)
    times = record["times_ms"]
    assert all(v is None or (v > 0 and math.isfinite(v)) for v in times.values())
    assert times["triton_eager_ms"] and (times["triton_graph_ms"] or not cuda)
    judge_calls(session, benchmark, "kernels", f"mlp_step-{precision}-{batch}x{width}-{activation}")


@pytest.mark.nightly
@pytest.mark.parametrize("batch", [4096, 8192])
def test_bare_gemm_against_cublas(benchmark, request, batch: int) -> None:
    """The strict-fp32 GEMM core at large shapes: identity activation vs torch.mm (cuBLAS
    SGEMM); extra_info names the kernel's strict-fp32 mode (IEEE or 3xTF32) and the
    launch it ran (were it routed to cuBLAS, this would compare cuBLAS with itself)."""
    session = request.config.pluginmanager.get_plugin("loadbench")
    device = session.options.device
    if device.type != "cuda":
        pytest.skip("the cuBLAS comparison needs a GPU; the interpreter proves nothing about speed")
    from triton.testing import do_bench

    from kernels.plan.launches import launch_report
    from kernels.ops.linear_act import linear_act

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
        launch=[e for e in launch_report() if e["kernel"] == "fwd" and e["shape"] == [batch, 2048, 2048]],
    )


def _serving_cells() -> list[object]:
    if torch.cuda.is_available():
        cells = [(shape, p) for shape in SERVING_GPU for p in ("fp32", "bf16")]
    else:
        cells = [(shape, "fp32") for shape in SERVING_CPU]  # numpy, under the interpreter, has no bfloat16
    return [_tier(cell, cell[0] in PR_SERVING) for cell in cells]


@pytest.mark.parametrize(("shape", "precision"), _serving_cells(), ids=lambda v: str(v))
def test_batch1_forward(benchmark, request, shape: str, precision: str) -> None:
    """The serving forward at batch 1: our one launch for every layer
    (kernels/ops/mlp_forward.py) against our kernels layer by layer and eager torch's, on the
    same weights. pytest-benchmark times a graph replay plus stream sync of the one launch
    (what a caller waits for; eager through the interpreter on a CPU); extra_info holds
    each implementation's GPU time per forward from do_bench_cudagraph (forwards back to
    back inside one graph, so it leaves out the gap between graph launches) and the
    ratios. The one launch must be taken and agree with torch."""
    from kernels.ops import mlp_forward
    from bench.tools.bench_cells import time_ms

    device = request.config.pluginmanager.get_plugin("loadbench").options.device
    cuda = device.type == "cuda"
    width, depth = (SERVING_GPU if cuda else SERVING_CPU)[shape]
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    torch.manual_seed(0)
    model = MLP(75, width, depth, 10, "leaky_relu").to(device, dtype).eval()
    fused = MLP(75, width, depth, 10, "leaky_relu", impl="triton").to(device, dtype).eval()
    fused.load_state_dict(model.state_dict())
    x = torch.randn(1, 75, device=device, dtype=dtype)
    key = (1, (75,) + (width,) * depth + (10,), str(dtype).removeprefix("torch."))
    with torch.no_grad(), precision_mode("fp32"):
        mlp_forward.LAUNCHES.clear()
        got = fused(x)
        assert key in mlp_forward.LAUNCHES, f"batch 1 through {key[1]} did not take the one launch"
        tol = 1e-4 if dtype == torch.float32 else 3e-2
        torch.testing.assert_close(got.float(), model(x).float(), rtol=tol, atol=tol)
        times = {"one_launch": time_ms(lambda: fused(x), device, graph=cuda),
                 "torch": time_ms(lambda: model(x), device, graph=cuda)}
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(mlp_forward, "ENABLED", False)
            times["layer_by_layer"] = time_ms(lambda: fused(x), device, graph=cuda)
        if cuda:
            stream = torch.cuda.current_stream(device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fused(x)
            target = lambda: (graph.replay(), stream.synchronize())  # noqa: E731
        else:
            target = lambda: fused(x)  # noqa: E731
        benchmark.group = f"batch1-forward-{precision}"
        benchmark.pedantic(target, rounds=1000 if cuda else 3, warmup_rounds=50 if cuda else 1)
    benchmark.extra_info.update(
        shape=shape, widths=list(key[1]), precision=precision, launch=mlp_forward.LAUNCHES[key],
        gpu_us_per_forward={k: v * 1000 for k, v in times.items()} if cuda else None,
        host_us_per_forward=None if cuda else {k: v * 1000 for k, v in times.items()},
        one_launch_speedup={k: times[k] / times["one_launch"] for k in ("torch", "layer_by_layer")},
        notes=[] if cuda else ["CPU: Triton's interpreter and eager torch, one call each; "
                               "the code path, not the speed"],
    )
    assert all(v > 0 and math.isfinite(v) for v in times.values())
    judge_calls(request.config.pluginmanager.get_plugin("loadbench"), benchmark, "batch1-forward",
                f"batch1-{shape}-{precision}")

