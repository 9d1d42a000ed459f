"""The card's measured rates, for the roofline fraction and the bound of a training step.

Measured in the session rather than taken from a datasheet: a large square matmul in
the run's precision, a large device-to-device copy, and a replayed CUDA graph of tiny
kernels, each timed with triton.testing.do_bench on a GPU. On a CPU the same three run
eagerly and are timed with perf_counter, so CI exercises the path.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from kernels.ground.axes import Precision
from model.bound import Ceilings
from model.train import precision_mode

SIZE = {"cuda": 8192, "cpu": 512}  # a CPU figure only exercises the path: kept cheap
COPY_BYTES = {"cuda": 1 << 30, "cpu": 16 << 20}  # the source; as much again is written
GRAPH_KERNELS = 256  # tiny kernels in the graph whose replay gives the per-kernel gap
CPU_OPS = 512


def _seconds(fn: Callable[[], object], device: torch.device, repeats: int = 3) -> float:
    """Seconds per call of `fn`: do_bench on a GPU, the mean of `repeats` timed calls
    after one untimed call on a CPU."""
    if device.type == "cuda":
        from triton.testing import do_bench

        return do_bench(fn, warmup=25, rep=100) / 1000
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def matmul_tflops(device: torch.device, precision: str) -> float:
    """TFLOP/s of a large square matmul in `precision` on `device`."""
    n = SIZE[device.type]
    dtype = torch.bfloat16 if precision == Precision.BF16 else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    with precision_mode(precision):
        seconds = _seconds(lambda: a @ b, device)
    return 2 * n**3 / seconds / 1e12


def copy_gb_per_s(device: torch.device) -> float:
    """GB/s of a large copy on `device`, counting bytes read plus bytes written."""
    src = torch.ones(COPY_BYTES[device.type] // 4, device=device)
    dst = torch.empty_like(src)
    seconds = _seconds(lambda: dst.copy_(src), device)
    return 2 * COPY_BYTES[device.type] / seconds / 1e9


def kernel_gap_us(device: torch.device) -> float:
    """Microseconds per kernel of a replayed CUDA graph of tiny kernels; on a CPU, per op
    of an eager loop of tiny ops (the dispatch cost a CPU step pays per op)."""
    x = torch.zeros(1, device=device)
    if device.type != "cuda":
        def ops() -> None:
            for _ in range(CPU_OPS):
                x.add_(1)

        return _seconds(ops, device) / CPU_OPS * 1e6
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):  # capture needs the op's first run off the default stream
        x.add_(1)
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GRAPH_KERNELS):
            x.add_(1)
    return _seconds(graph.replay, device) / GRAPH_KERNELS * 1e6


def measure_ceilings(device: torch.device, precision: str) -> Ceilings:
    """The three rates a step's bound is judged against, measured now on `device`."""
    return Ceilings(
        matmul_tflops=matmul_tflops(device, precision),
        copy_gb_per_s=copy_gb_per_s(device),
        kernel_gap_us=kernel_gap_us(device),
    )
