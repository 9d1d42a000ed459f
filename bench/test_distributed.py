"""Data-parallel training cases: strong and weak scaling against one GPU's graph loop.

Each case launches torchrun with `world` ranks (NCCL, one GPU each; gloo on a CPU) and
trains through the flat-buffer loop (``graph``, model/dp_graph.py) or DDP on the eager
fast loop (``ddp``); the record's ``loop`` says which ran and ``note`` why. Scaling is
strong at a global batch of 512 and 2048 and weak at 512 per rank. Every case is
measured against the single-GPU graph loop of the same configuration, trained in this
process once per session (``speedup_vs_one_gpu``, ``efficiency_vs_one_gpu``), and
against world size 1 of its own loop (``efficiency_vs_world1``). ``allreduce_share`` is
rank 0's all-reduce time over one profiled epoch. The record's fields in full:
docs/data-parallel.md.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import torch

from bench.monitor.loadstats import summarize_monitor
from bench.monitor.sampler import LoadMonitor
from model.config import TrainConfig
from model.data import load_dataset
from model.distributed import launch
from model.train import Trainer

CUDA = torch.cuda.is_available()
WORLDS = [w for w in (1, 2, 4, 8) if w <= torch.cuda.device_count()] if CUDA else [1, 2]
WIDTHS = [512, 2048] if CUDA else [512]
PER_RANK = 512  # weak scaling's batch per rank
# (scaling, batch): strong scaling's global batch, weak scaling's batch per rank. The
# 2048-frame global batch is where strong scaling has work to split; a CPU run skips it.
SCALINGS = [("strong", 512), ("strong", 2048), ("weak", PER_RANK)] if CUDA else [("strong", 512), ("weak", PER_RANK)]
# On a CPU the flat loop's optimizer runs through Triton's interpreter (about 1 s per
# step at width 512): there the graph cases check the code path on a narrow model.
GRAPH_WIDTHS = WIDTHS if CUDA else [32]
# DistributedDataParallel's eager loop is measured at the study's width only: it is
# the comparison, not the subject.
CASES = [
    pytest.param(dp, width, scaling, batch, id=f"{dp}-units-{width}-{scaling}-{batch}")
    for dp, widths in (("graph", GRAPH_WIDTHS), ("ddp", [512]))
    for width in widths
    for scaling, batch in SCALINGS
    if dp == "graph" or batch == 512
]


@pytest.mark.distributed
@pytest.mark.nightly  # minutes of torchrun start-ups; scaling is not what a pull request changes
@pytest.mark.parametrize(("dp", "width", "scaling", "batch"), CASES)
@pytest.mark.parametrize("world", WORLDS, ids=lambda w: f"world-{w}")
def test_data_parallel(benchmark, request, tmp_path: Path, world: int, dp: str, width: int, scaling: str,
                       batch: int) -> None:
    session = request.config.pluginmanager.get_plugin("loadbench")
    options = session.options
    epochs = options.epochs if CUDA else min(options.epochs, 3)
    config = TrainConfig(width=width, epochs=epochs, batch_size=batch * (world if scaling == "weak" else 1),
                         precision=options.precision, optimizer_impl=options.optimizer_impl,
                         loop="graph" if dp == "graph" else "fast")
    scale = options.profile.scale if options.dataset == "synthetic" else 1.0
    one_gpu = one_gpu_graph_loop(session, config.replace(batch_size=batch), options.dataset, scale)
    # children=True: the process figures cover torchrun and the ranks, where the work runs
    monitors = [LoadMonitor(torch.device(f"cuda:{i}") if CUDA else torch.device("cpu"), options.monitor_period,
                            children=True)
                for i in range(world if CUDA else 1)]
    result: dict = {}

    def run() -> None:
        for m in monitors:
            m.start()
        try:
            result.update(launch(config, world, source=options.dataset, scale=scale,
                                 backend="nccl" if CUDA else "gloo", timeout_s=300, workdir=tmp_path))
        finally:
            for m in monitors:
                m.stop()

    benchmark.group = f"dp-{dp}-{scaling}-{batch}-units-{width}"
    benchmark.pedantic(run, rounds=1)
    median = steady_median(result["epoch_seconds"])
    base = session.shared.setdefault("dp_world1", {})
    key = (dp, scaling, batch, width)
    if world == 1:
        base[key] = median
    speedup = one_gpu["median_epoch_s"] / median
    benchmark.extra_info.update(
        world_size=world, data_parallel=result["data_parallel"], loop=result["loop"], note=result.get("note"),
        scaling=scaling,
        width=width, global_batch=config.batch_size, batch_per_rank=config.batch_size / world,
        backend=result["backend"], optimizer_impl=result["optimizer_impl"],
        median_epoch_s=median, samples_per_s=result["train_frames"] / median,
        one_gpu_graph=one_gpu, speedup_vs_one_gpu=speedup, efficiency_vs_one_gpu=speedup / world,
        efficiency_vs_world1=base[key] / median / world if key in base else None,
        allreduce_share=result["allreduce_share"], allreduce_profile=result["allreduce_profile"],
        allreduce_buckets=result.get("allreduce_buckets"),  # bytes per bucket, launch order (flat loop)
        epoch_seconds=result["epoch_seconds"], accuracy=result["accuracy"], macro_f1=result["macro_f1"],
        # pytest-benchmark's public API takes its rounds only from calls it times itself, and the
        # epochs run in the ranks' processes: its one round here is the whole torchrun launch.
        benchmark_rounds="one round: the whole torchrun launch (start-up included); "
                         "rank 0's epochs are in epoch_seconds",
        # Rank 0's training window (every rank passes the same barriers), not torchrun's start-up.
        load_per_gpu=[summarize_monitor(m, epochs + 1, window=tuple(result["train_window"])) for m in monitors],
    )
    assert result["accuracy"] > 0.1 and all(s > 0 for s in result["epoch_seconds"])


def one_gpu_graph_loop(session, config: TrainConfig, dataset: str, scale: float) -> dict:
    """The single-GPU graph loop on `config` (GPU 0, this process), once per session."""
    cache = session.shared.setdefault("dp_one_gpu", {})
    config = config.replace(loop="graph")
    if config not in cache:
        device = torch.device("cuda:0" if CUDA else "cpu")
        trainer = Trainer(config, load_dataset(dataset, scale=scale, device=device, seed=config.seed))
        trainer.fit()
        cache[config] = {
            "median_epoch_s": steady_median(trainer.epoch_seconds),
            "loop": trainer.loop,  # 'fast' on a CPU, where no graph is captured
            "optimizer_impl": trainer.optimizer_impl,
            "batch_size": config.batch_size,
        }
        trainer.release()  # the ranks start from free memory on GPU 0
        if CUDA:
            torch.cuda.empty_cache()
    return cache[config]


def steady_median(epoch_seconds: list[float]) -> float:
    """The median epoch past the first (capture, allocator growth, compilation)."""
    return statistics.median(epoch_seconds[1:] or epoch_seconds)
