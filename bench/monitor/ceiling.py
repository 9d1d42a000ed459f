"""The card's measured matmul ceiling, for the roofline fraction of a training run.

Measured in the session rather than taken from a datasheet: a large square matmul
in the run's precision, timed with triton.testing.do_bench on a GPU.
"""

from __future__ import annotations

import time

import torch

from model.axes import Precision
from model.train import precision_mode

SIZE = {"cuda": 8192, "cpu": 1024}


def matmul_tflops(device: torch.device, precision: str) -> float:
    n = SIZE[device.type]
    dtype = torch.bfloat16 if precision == Precision.BF16 else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    with precision_mode(precision):
        if device.type == "cuda":
            from triton.testing import do_bench

            ms = do_bench(lambda: a @ b, warmup=100, rep=300)
            seconds = ms / 1000
        else:
            a @ b
            start = time.perf_counter()
            for _ in range(3):
                a @ b
            seconds = (time.perf_counter() - start) / 3
    return 2 * n**3 / seconds / 1e12
