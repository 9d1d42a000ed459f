"""Data-parallel training cases: throughput, weak and strong scaling, all-reduce share.

Each case launches torchrun with `world` ranks (NCCL, one GPU each; gloo on a CPU).
Strong scaling keeps the global batch at 512; weak scaling keeps 512 per rank. The
efficiency of a world size is measured against world size 1 of the same kind in the
same session; the monitor watches every local GPU that takes part, and each GPU's load
is summarized over rank 0's training window, not torchrun's start-up. The ranks train
with the eager fast loop (DDP's hooks do not run inside our CUDA graphs).
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import torch

from bench.monitor.loadstats import summarize_monitor
from bench.monitor.sampler import LoadMonitor
from model.config import TrainConfig
from model.distributed import launch

CUDA = torch.cuda.is_available()
WORLDS = [w for w in (1, 2, 4, 8) if w <= torch.cuda.device_count()] if CUDA else [1, 2]
WIDTHS = [512, 2048] if CUDA else [512]
BATCH = 512


@pytest.mark.distributed
@pytest.mark.parametrize("width", WIDTHS, ids=lambda w: f"units-{w}")
@pytest.mark.parametrize("scaling", ["strong", "weak"])
@pytest.mark.parametrize("world", WORLDS, ids=lambda w: f"world-{w}")
def test_data_parallel(benchmark, request, tmp_path: Path, world: int, scaling: str, width: int) -> None:
    session = request.config.pluginmanager.get_plugin("loadbench")
    options = session.options
    epochs = options.epochs if CUDA else min(options.epochs, 3)
    config = TrainConfig(width=width, epochs=epochs, batch_size=BATCH * (world if scaling == "weak" else 1),
                         precision=options.precision, loop="fast")  # fmt: skip
    scale = options.profile.scale if options.dataset == "synthetic" else 1.0
    # children=True: the process figures cover torchrun and the ranks, where the work runs
    monitors = [LoadMonitor(torch.device(f"cuda:{i}") if CUDA else torch.device("cpu"), options.monitor_period, children=True)
                for i in range(world if CUDA else 1)]  # fmt: skip
    result: dict = {}

    def run() -> None:
        for m in monitors:
            m.start()
        try:
            result.update(launch(config, world, source=options.dataset, scale=scale,
                                 backend="nccl" if CUDA else "gloo", timeout_s=900 if CUDA else 300, workdir=tmp_path))  # fmt: skip
        finally:
            for m in monitors:
                m.stop()

    benchmark.group = f"ddp-{scaling}-units-{width}"
    benchmark.pedantic(run, rounds=1)
    steady = result["epoch_seconds"][1:] or result["epoch_seconds"]
    median = statistics.median(steady)
    throughput = result["train_frames"] / median
    key = (scaling, width)
    base = session.shared.setdefault("ddp_world1", {})
    if world == 1:
        base[key] = median
    # Per-epoch work is the whole training set either way, so both efficiencies are the
    # epoch-time speedup over world size 1 divided by the world size: strong scaling
    # splits each 512-batch, weak scaling keeps 512 per rank (half the steps at world 2).
    efficiency = base[key] / median / world if key in base else None
    benchmark.extra_info.update(
        world_size=world, scaling=scaling, width=width, global_batch=config.batch_size,
        backend=result["backend"], median_epoch_s=median, samples_per_s=throughput,
        scaling_efficiency=efficiency, allreduce_share=result["allreduce_share"],
        epoch_seconds=result["epoch_seconds"], accuracy=result["accuracy"], macro_f1=result["macro_f1"],
        # Rank 0's training window (every rank passes the same barriers), not torchrun's start-up.
        load_per_gpu=[summarize_monitor(m, epochs + 2, window=tuple(result["train_window"])) for m in monitors],
    )  # fmt: skip
    assert result["accuracy"] > 0.1 and all(s > 0 for s in result["epoch_seconds"])
