"""Data-parallel training launched with torchrun: DistributedDataParallel, or one flat
all-reduce per step replayed from CUDA graphs.

Same math as single-process training at the same global batch: every rank draws the
same permutation (same seed), takes its contiguous share of each global batch, and
scales its loss so that the all-reduced gradient is exactly the mean over the global
batch, the last partial batch included. NCCL on GPUs, gloo on CPUs. Batches come from
device-resident data as in the fast loop. Which loop runs follows ``TrainConfig.loop``:

- ``'fast'`` (and ``'reference'``): DistributedDataParallel on the eager fast loop;
  DDP's bucketed all-reduce overlaps the backward pass.
- ``'graph'`` / ``'step-graph'``: model/dp_graph.py, the flat gradient buffer
  all-reduced once per step and the fused optimizer kernel, replayed from one CUDA
  graph per epoch (or per step); on gloo the same step runs eagerly.

The record names both (``data_parallel``, ``loop``). The all-reduce share of epoch
time comes from a profile of one more epoch on rank 0 (torch.profiler): NCCL kernel
time (gloo: all-reduce time) over that epoch's time.

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m model.distributed \\
        --config '{"width": 512, "loop": "graph"}' --out result.json

`launch` runs that command with a timeout and stops every rank if one fails or hangs,
if the caller is interrupted, or (on Linux) if the calling process dies. A hung rank
inside a replayed graph is out of reach of NCCL's watchdog (captured collectives are
not tracked), so the launcher's timeout is what ends it.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.autograd import DeviceType
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import ProfilerActivity
from torch.profiler import profile

from model.config import TrainConfig
from model.data import Dataset
from model.data import load_dataset
from model.dp_graph import FlatDataParallel
from model.metrics import classification_report
from model.mlp import MLP
from model.train import GRAPH_LOOPS
from model.train import autocast
from model.train import make_optimizer
from model.train import precision_mode
from model.train import predict
from model.train import seed_everything
from model.train import synchronize


class DistributedError(RuntimeError):
    """A data-parallel run that failed or timed out; every rank has been stopped."""


def train_rank(config: TrainConfig, source: str, scale: float, weights_out: str | None = None) -> dict[str, Any]:
    """The body of one rank; returns rank 0's record (other ranks return {})."""
    rank, world = dist.get_rank(), dist.get_world_size()
    cuda = dist.get_backend() == "nccl"
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', rank))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    data = load_dataset(source, scale=scale, device=device, seed=config.seed)
    if config.loop in GRAPH_LOOPS:
        flat = FlatDataParallel(config, data)
        model, epoch, how, loop, kind = flat.model, flat.epoch, flat.optimizer_impl, flat.loop, "flat-allreduce"
    else:
        model, epoch, how = _ddp(config, data)
        loop, kind = "fast", "ddp"
    n = len(data.y_train)

    def timed(fn: Any) -> tuple[float, float]:
        synchronize(device)
        dist.barrier()
        begin = time.perf_counter()
        loss = fn()
        synchronize(device)
        return time.perf_counter() - begin, loss

    seconds, losses = [], []
    window_begin = time.perf_counter()  # CLOCK_MONOTONIC: the launcher's load monitor reads the same clock
    with precision_mode(config.precision):
        for _ in range(config.epochs):
            s, loss = timed(epoch)
            seconds.append(s)
            losses.append(loss)
        if weights_out and rank == 0:
            torch.save({k: v.cpu() for k, v in model.state_dict().items()}, weights_out)
        metrics = classification_report(data.y_test, predict(model, data.x_test, config.precision), data.n_classes)
        traced = profiled_epoch(lambda: timed(epoch)[0], cuda, profiling=rank == 0)
    window_end = time.perf_counter()
    if rank != 0:
        return {}
    steps = math.ceil(n / config.batch_size)
    # With one rank nothing is communicated: no share to report. Every step all-reduces at
    # least once, so a profile with fewer calls missed some (a tracer blind to kernels
    # replayed from a graph): no share rather than a wrong one.
    share = traced["allreduce_s"] / traced["epoch_s"] if world > 1 and traced["allreduce_calls"] >= steps else None
    return {
        "world_size": world,
        "backend": dist.get_backend(),
        "data_parallel": kind,  # 'ddp' or 'flat-allreduce'
        "loop": loop,  # the loop that ran: 'graph' runs as 'fast' (eagerly) on gloo
        "optimizer_impl": how,
        "epoch_seconds": seconds,
        "losses": losses,
        "allreduce_share": share,
        "allreduce_profile": {**traced, "steps": steps},
        "train_frames": n,
        "train_window": [window_begin, window_end],  # training and the profiled epoch
        **{k: metrics[k] for k in ("accuracy", "macro_f1", "weighted_f1", "confusion")},
    }


def _ddp(config: TrainConfig, data: Dataset) -> tuple[torch.nn.Module, Callable[[], float], str]:
    """DistributedDataParallel on the eager fast loop: the model, an epoch function, the optimizer's kind."""
    rank, world = dist.get_rank(), dist.get_world_size()
    device = data.device
    seed_everything(config.seed)
    model = MLP(data.n_features, config.width, config.depth, data.n_classes, config.activation, config.impl).to(device)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer, how = make_optimizer(config.optimizer, list(ddp.parameters()), fast=True)
    generator = torch.Generator(device=device).manual_seed(config.seed)
    x_all, y_all, n = data.x_train, data.y_train, len(data.y_train)

    def epoch() -> float:
        order = torch.randperm(n, device=device, generator=generator)
        total = torch.zeros((), device=device)
        for start in range(0, n, config.batch_size):
            batch = order[start : start + config.batch_size]
            local = batch.tensor_split(world)[rank]
            optimizer.zero_grad(set_to_none=True)
            with autocast(config.precision, device):
                loss = F.cross_entropy(ddp(x_all[local]), y_all[local], reduction="sum")
            (loss * world / len(batch)).backward()  # DDP averages over ranks: the global-batch mean
            optimizer.step()
            total += loss.detach().float()
        dist.all_reduce(total)
        return float(total) / n

    return model, epoch, how


def profiled_epoch(run_epoch: Callable[[], float], cuda: bool, profiling: bool) -> dict[str, float | int]:
    """One more epoch, profiled where `profiling` (rank 0; the others just train it):
    its seconds, and the time and count of all-reduces in it. On GPUs those are NCCL
    kernels, the waiting for slower ranks inside them included; only the device is
    traced, so the host's launch work is not slowed. The count includes the epoch's
    two one-element collectives (the barrier before it, its loss sum after)."""
    if not profiling:
        return {"epoch_s": run_epoch(), "allreduce_s": 0.0, "allreduce_calls": 0}
    activity = ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU
    with profile(activities=[activity]) as prof:
        seconds = run_epoch()
    total_us, calls = 0.0, 0
    for event in prof.key_averages():
        if cuda and event.device_type == DeviceType.CUDA and "nccl" in event.key.lower():
            total_us += event.self_device_time_total
        elif not cuda and event.key == "gloo:all_reduce":
            total_us += event.cpu_time_total  # the work's span, from enqueue to completion
        else:
            continue
        calls += event.count
    return {"epoch_s": seconds, "allreduce_s": total_us / 1e6, "allreduce_calls": calls}


def launch(
    config: TrainConfig,
    world_size: int,
    *,
    source: str = "synthetic",
    scale: float = 1.0,
    backend: str = "nccl",
    timeout_s: float = 600,
    weights_out: str | None = None,
    workdir: Path | None = None,
) -> dict[str, Any]:
    """Run `config` on `world_size` ranks through torchrun; rank 0's record."""
    workdir = workdir or Path.cwd()
    out = workdir / f"ddp-{os.getpid()}-{time.monotonic_ns()}.json"
    command = [
        sys.executable, "-m", "model.distributed", "--torchrun", "--standalone", f"--nproc-per-node={world_size}",
        "-m", "model.distributed", "--config", json.dumps(config.as_dict()), "--source", source,
        "--scale", str(scale), "--backend", backend, "--out", str(out), "--timeout", str(timeout_s),
    ] + (["--weights", weights_out] if weights_out else [])  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), **{PARENT_ENV: str(os.getpid())})
    # Its own session, so that one killpg reaches torchrun and every rank it started.
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True, env=env)  # fmt: skip
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _stop(process)
        raise DistributedError(f"data-parallel run on {world_size} ranks timed out after {timeout_s:g} s; all ranks stopped") from None
    except BaseException:  # Ctrl-C or an error in the caller: no rank outlives the launch
        _stop(process)
        raise
    errors = sorted(workdir.glob(f"{out.name}.rank*.err"))
    try:
        if process.returncode != 0 or not out.is_file():
            reasons = [f"{e.suffixes[-2][1:]}: {e.read_text().strip()}" for e in errors]
            detail = "\n".join(reasons) or failure_detail(output)
            raise DistributedError(f"data-parallel run on {world_size} ranks failed (exit {process.returncode}):\n{detail}")
        return json.loads(out.read_text())
    finally:
        out.unlink(missing_ok=True)
        for error in errors:
            error.unlink(missing_ok=True)


def failure_detail(output: str, summary: int = 15, before: int = 10) -> str:
    """What torchrun printed about a rank that died without a Python exception (a signal,
    a C++ abort): the ranks' last lines before torchrun's failure report, then the
    report's end, which names the rank and the signal."""
    lines = output.strip().splitlines()
    report = next((i for i, line in enumerate(lines) if line.startswith(("Traceback", "====="))), None)
    if report is None:
        return "\n".join(lines[-summary:])
    ranks = [line for line in lines[:report] if line.strip()][-before:]
    return "\n".join([*ranks, "...", *lines[-summary:]] if ranks else lines[-summary:])


PARENT_ENV = "LOADBENCH_LAUNCHER_PID"


def _stop(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGKILL)  # torchrun and every rank it started
    process.communicate()


def _torchrun_bound_to_parent(argv: list[str]) -> None:
    """torchrun, told (Linux prctl PR_SET_PDEATHSIG) to take SIGTERM when the launching
    process dies, however it dies: torchrun then stops its ranks. Without this a killed
    pytest leaves the ranks training on the GPUs, under the next job's timings."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
        if os.environ.get(PARENT_ENV) and os.getppid() != int(os.environ[PARENT_ENV]):
            sys.exit("model.distributed: the launching process ended before torchrun started")
    from torch.distributed.run import main as torchrun

    torchrun(argv)


def main() -> None:
    if sys.argv[1:2] == ["--torchrun"]:
        _torchrun_bound_to_parent(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description="one rank of a data-parallel run (start it with torchrun)")
    parser.add_argument("--config", default="{}", help="TrainConfig fields as JSON")
    parser.add_argument("--source", default="synthetic")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--backend", default="nccl", choices=("nccl", "gloo"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--weights", default=None)
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    config = TrainConfig(**json.loads(args.config))
    rank = os.environ.get("RANK", "0")
    try:
        dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=args.timeout))
        try:
            record = train_rank(config, args.source, args.scale, args.weights)
            if dist.get_rank() == 0:
                Path(args.out).write_text(json.dumps(record))
        finally:
            dist.destroy_process_group()
    except Exception as exc:
        # The launcher reads this to say which rank failed and why; torchrun's own
        # summary keeps only exit codes.
        Path(f"{args.out}.rank{rank}.err").write_text(f"{type(exc).__name__}: {exc}")
        raise


if __name__ == "__main__":
    main()
