"""A slowdown planted inside every timed epoch (`--plant-slowdown`), so the time gate
can be tested against a known regression (`python -m bench.tools.selftest`).

The wrapper replaces the trainer's epoch function, so it runs inside `Trainer.fit`'s
timed region, between the device synchronizations that bracket each epoch:

- ``host``: the host sleeps for the fraction of the epoch's own measured time; the GPU
  sits idle meanwhile, as with a host-side regression.
- ``gpu``: the device spins (``torch.cuda._sleep``) after the epoch's work for the
  fraction of the previous epoch's time, as with a slower kernel: GPU busy and energy
  grow with it. The first epoch, which the gate leaves out, sets the length.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from bench.plugin.options import Plant
from model.train import Trainer
from model.train import synchronize


def plant_slowdown(trainer: Trainer, plant: Plant) -> None:
    """Make each epoch of `trainer` take `plant.fraction` longer."""
    epoch: Callable[[], float] = trainer._epoch
    device = trainer.device
    spin = plant.mode == "gpu" and device.type == "cuda"
    cycles_per_s = _spin_rate(device) if spin else 0.0
    previous = [0.0]

    def planted() -> float:
        synchronize(device)
        start = time.perf_counter()
        loss = epoch()
        synchronize(device)
        seconds = time.perf_counter() - start
        if spin:
            if previous[0] > 0:
                torch.cuda._sleep(int(plant.fraction * previous[0] * cycles_per_s))
        else:
            time.sleep(plant.fraction * seconds)
        previous[0] = seconds
        return loss

    trainer._epoch = planted


def _spin_rate(device: torch.device) -> float:
    """Cycles of torch.cuda._sleep per second on this device, timed with events."""
    cycles = 10_000_000
    with torch.cuda.device(device):
        torch.cuda._sleep(cycles // 10)  # warm-up
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        stop.record()
        stop.synchronize()
    return cycles / (start.elapsed_time(stop) / 1000)
