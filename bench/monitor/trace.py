"""Kernel traces: explain a time regression down to the kernel.

After a case's timed training, `profile_trainer` runs a few more steady epochs under
torch.profiler and keeps, per kernel name, the calls and the device time per epoch: on
a GPU the device-side events, on a CPU the ``aten::`` ops with their self CPU time, so
CI runs the same path. The result is a `KernelTable` (bench/gate/kernel_table.py, which
also holds its compact JSON form and the diff the gate reads without torch).

    table = profile_trainer(trainer)              # precision mode and train mode of the case
    extra_info["kernel_trace"] = table.to_dict()

Written by hand here: only the aggregation of torch.profiler's per-name averages into
per-epoch rows.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity
from torch.profiler import profile

from bench.gate.kernel_table import DEVICES
from bench.gate.kernel_table import KernelTable
from model.train import precision_mode

if TYPE_CHECKING:
    from model.train import Trainer

CPU_OP_PREFIX = "aten::"


# ---------------------------------------------------------------------------- profiling


def _self_device_us(event: Any) -> float:
    """Self device time of a profiler average, whatever this torch calls it
    (``self_device_time_total`` since torch 2.4, ``self_cuda_time_total`` before)."""
    for attribute in ("self_device_time_total", "self_cuda_time_total"):
        value = getattr(event, attribute, None)
        if value is not None:
            return float(value)
    raise RuntimeError("torch.profiler event has neither self_device_time_total nor self_cuda_time_total")


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_epochs(
    run_epoch: Callable[[], object], device: torch.device, epochs: int = 3, warmup: int = 1
) -> KernelTable:
    """Run `warmup` epochs unprofiled, then `epochs` under torch.profiler; the kernel table.

    On a GPU: every device-side event (kernels, memcpy, memset; not the user annotations
    mirrored onto the GPU timeline), self device time summed per name. On a CPU: every
    ``aten::`` op, self CPU time summed per name. The caller sets up the epoch's context
    (precision mode, train mode); see `profile_trainer`. Raises RuntimeError on a GPU
    when the profiler records no kernels (no CUPTI)."""
    device = torch.device(device)
    if device.type not in DEVICES:
        raise ValueError(f"profile_epochs: device {device}: expected a cuda or cpu device")
    if not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"profile_epochs: epochs={epochs!r}: expected a positive integer")
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"profile_epochs: warmup={warmup!r}: expected a non-negative integer")
    cuda = device.type == "cuda"
    if cuda and ProfilerActivity.CUDA not in torch.profiler.supported_activities():
        raise RuntimeError("profile_epochs: this torch build's profiler cannot trace CUDA kernels")
    # On a GPU the table holds kernels only, so host ops are not recorded: with them,
    # `--kernel-trace` of the quick loop matrix had not finished the study's DataLoader
    # loop after 200 s on an H100; without, the eight loop cases took 93 s.
    activities = [ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]

    for _ in range(warmup):
        run_epoch()
    _synchronize(device)  # no warm-up kernel may still run once the profiler starts
    # One cycle, so accumulating events changes nothing; asking for it silences the
    # "Profiler clears events at the end of each cycle" warning torch < 2.12 gives anyway.
    options = {"acc_events": True} if "acc_events" in inspect.signature(profile.__init__).parameters else {}
    with profile(activities=activities, **options) as prof:
        for _ in range(epochs):
            run_epoch()
        _synchronize(device)  # every profiled kernel has finished before the profiler stops

    totals: dict[str, list[float]] = {}
    for event in prof.key_averages():
        if cuda:
            # Device-side events only; record_function ranges mirrored onto the GPU
            # timeline (eager Optimizer.step, for one) are user annotations spanning
            # kernels already counted, not kernels.
            if event.device_type != DeviceType.CUDA or getattr(event, "is_user_annotation", False):
                continue
            us = _self_device_us(event)
        else:
            if event.device_type != DeviceType.CPU or not event.key.startswith(CPU_OP_PREFIX):
                continue
            us = float(event.self_cpu_time_total)
        entry = totals.setdefault(event.key, [0, 0.0])  # one name may average in several groups
        entry[0] += event.count
        entry[1] += us
    if cuda and not totals:
        raise RuntimeError(
            "profile_epochs: the profiler recorded no CUDA kernels (is CUPTI available to this process?)"
        )
    return KernelTable.from_totals(device.type, epochs, {k: (int(c), u) for k, (c, u) in totals.items()})


def profile_trainer(trainer: Trainer, epochs: int = 3, warmup: int = 1) -> KernelTable:
    """`profile_epochs` over `trainer`'s epoch, in its precision mode and in train mode,
    without adding to its recorded epoch times or losses (call it after `result()`:
    the extra epochs keep training the model)."""
    trainer.model.train()
    with precision_mode(trainer.config.precision):
        return profile_epochs(trainer._epoch, trainer.device, epochs=epochs, warmup=warmup)
