"""Data-parallel training launched with torchrun: DistributedDataParallel, or one flat
all-reduce per step replayed from CUDA graphs (model/dp_graph.py).

Same math as single-process training at the same global batch: every rank draws the
same permutation, takes its contiguous share of each global batch and scales its loss
so the all-reduced gradient is the global batch's mean. NCCL on GPUs, gloo on CPUs.
``TrainConfig.loop`` picks DDP on the eager fast loop ('fast', 'reference') or the
flat-buffer loop ('graph', 'step-graph'); the record names the loop that ran and, where
it is not the one asked for, why (``note``).

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m model.distributed \
        --config '{"width": 512, "loop": "graph"}' --out result.json

`launch` runs that command with a timeout and stops every rank if one fails or hangs;
the teardown and hang handling are described in docs/data-parallel.md.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import faulthandler
import json
import math
import os
import signal
import subprocess
import sys
import threading
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

from kernels.ground import env as loadbench_env
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
    rank = dist.get_rank()
    cuda = dist.get_backend() == "nccl"
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', rank))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    data = load_dataset(source, scale=scale, device=device, seed=config.seed)
    if config.loop not in GRAPH_LOOPS:
        model, epoch, how = _ddp(config, data)
        return _train(config, data, model, epoch, how, loop="fast", kind="ddp", note=None, weights_out=weights_out)
    flat = FlatDataParallel(config, data)
    try:
        record = _train(config, data, flat.model, flat.epoch, flat.optimizer_impl, loop=flat.loop,
                        kind="flat-allreduce", note=flat.note, weights_out=weights_out)
        if record:  # rank 0: the all-reduces' bucket sizes, in launch order
            record["allreduce_buckets"] = flat.buckets.sizes
        return record
    finally:
        flat.release()  # its CUDA graphs die before the process group does


def _train(
    config: TrainConfig,
    data: Dataset,
    model: torch.nn.Module,
    epoch: Callable[[], float],
    how: str,
    *,
    loop: str,
    kind: str,
    note: str | None,
    weights_out: str | None,
) -> dict[str, Any]:
    """Train and profile through `epoch`; rank 0's record (other ranks return {})."""
    rank, world = dist.get_rank(), dist.get_world_size()
    device, cuda = data.device, dist.get_backend() == "nccl"
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
        # the loop that ran: 'graph' runs as 'fast' (eagerly) on gloo, and on NCCL with LOADBENCH_DP_GRAPH=0
        "loop": loop,
        "note": note,  # why the loop that ran is not the one asked for, else None
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
    ] + (["--weights", weights_out] if weights_out else [])
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), **{PARENT_ENV: str(os.getpid())})
    if backend == "gloo":  # CPU ranks: their Triton kernels can only run interpreted, GPU on the host or not
        env.setdefault("TRITON_INTERPRET", "1")
    # Its own session, so that one killpg reaches torchrun and every rank it started.
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True, env=env)
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        output = _stop(process)
        errors = sorted(workdir.glob(f"{out.name}.rank*.err"))
        try:
            # What the ranks left: an error a rank wrote before its teardown hung, stacks
            # from LOADBENCH_DUMP_STACKS_S, NCCL's log. The message's first line stays as is.
            detail = "\n".join([*_rank_errors(errors), *output.strip().splitlines()[-TIMEOUT_TAIL_LINES:]])
        finally:
            out.unlink(missing_ok=True)
            for error in errors:
                error.unlink(missing_ok=True)
        raise DistributedError(
            f"data-parallel run on {world_size} ranks timed out after {timeout_s:g} s; all ranks stopped"
            + (f"\n{detail}" if detail else "")
        ) from None
    except BaseException:  # Ctrl-C or an error in the caller: no rank outlives the launch
        _stop(process)
        raise
    errors = sorted(workdir.glob(f"{out.name}.rank*.err"))
    try:
        if process.returncode != 0 or not out.is_file():
            detail = "\n".join(_rank_errors(errors)) or failure_detail(output)
            raise DistributedError(f"data-parallel run on {world_size} ranks failed "
                                   f"(exit {process.returncode}):\n{detail}")
        return json.loads(out.read_text())
    finally:
        out.unlink(missing_ok=True)
        for error in errors:
            error.unlink(missing_ok=True)


TIMEOUT_TAIL_LINES = 60  # of the ranks' output, in a timed-out launch's error


def _rank_errors(errors: list[Path]) -> list[str]:
    return [f"{e.suffixes[-2][1:]}: {e.read_text().strip()}" for e in errors]


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


def _stop(process: subprocess.Popen) -> str:
    """Kill torchrun and every rank it started; what they printed.

    torch.distributed.elastic starts each rank in a session of its own, out of reach of
    torchrun's process group (killing that group alone orphans running ranks, and the
    launcher's read of their output then waits for them). So torchrun is stopped first,
    to start no more, its children (the ranks) are killed with their process groups,
    then torchrun's group."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGSTOP)
    for pid in _children(process.pid):
        for kill in (os.killpg, os.kill):  # the rank's group (its session), or the rank alone
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    output, _ = process.communicate()
    return output or ""


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid`, read from /proc (none where there is no /proc)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after 'pid (command)': state, ppid, ...
        except (OSError, IndexError):
            continue  # ended meanwhile
        if int(fields[1]) == pid:
            children.append(int(stat.parent.name))
    return children


def _torchrun_bound_to_parent(argv: list[str]) -> None:
    """torchrun, told (Linux prctl PR_SET_PDEATHSIG) to take SIGTERM when the launching
    process dies, however it dies: torchrun then stops its ranks. Without this a killed
    pytest leaves the ranks training on the GPUs, under the next job's timings."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
        if loadbench_env.read(PARENT_ENV) and os.getppid() != loadbench_env.read(PARENT_ENV):
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
    if loadbench_env.read(STACKS_ENV):
        faulthandler.dump_traceback_later(loadbench_env.read(STACKS_ENV), repeat=True)
    failed = True
    try:
        dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=args.timeout))
        try:
            record = train_rank(config, args.source, args.scale, args.weights)
            if dist.get_rank() == 0:
                Path(args.out).write_text(json.dumps(record))
            failed = False
        except Exception as exc:
            _write_rank_error(args.out, rank, exc)  # before the teardown, which may hang
            raise
        finally:
            if not finished_within(dist.destroy_process_group, TEARDOWN_TIMEOUT_S):
                print(f"model.distributed: rank {rank}: the process group's teardown did not return within "
                      f"{TEARDOWN_TIMEOUT_S:g} s; exiting without it", file=sys.stderr, flush=True)
                sys.stdout.flush()
                os._exit(1 if failed else 0)  # the record (or the error) is written; nothing else to wait for
    except Exception as exc:
        if not Path(f"{args.out}.rank{rank}.err").exists():
            _write_rank_error(args.out, rank, exc)  # init_process_group's own failure
        raise


STACKS_ENV = "LOADBENCH_DUMP_STACKS_S"
TEARDOWN_TIMEOUT_S = 60.0


def _write_rank_error(out: str, rank: str, exc: BaseException) -> None:
    """The launcher reads this to say which rank failed and why; torchrun's own summary
    keeps only exit codes."""
    Path(f"{out}.rank{rank}.err").write_text(f"{type(exc).__name__}: {exc}")


def finished_within(fn: Callable[[], object], timeout_s: float) -> bool:
    """Run `fn` on a daemon thread; whether it returned within `timeout_s`. An exception
    it raises counts as returned and is raised here."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # handed to the caller
            raised.append(exc)

    thread = threading.Thread(target=run, name="teardown", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        return False
    if raised:
        raise raised[0]
    return True


if __name__ == "__main__":
    main()
