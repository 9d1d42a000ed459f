"""What watching costs: epoch time with the load monitor on and off, interleaved.

The optimal configuration trains ROUNDS times each way, alternating, and the medians
of the per-epoch times (first epoch of each run left out) are compared. The goal is
an overhead under 1%, gated on a GPU; on a CPU the figure is recorded only, since the
monitor thread competes for the same two cores it measures, and one round each way
(CPU_ROUNDS) checks the code path.
"""

import statistics

import torch

from bench.monitor.sampler import LoadMonitor
from model.config import TrainConfig
from model.train import Trainer

ROUNDS = 3
CPU_ROUNDS = 1  # the CPU's figure is recorded, not gated: one training each way
GOAL = 0.01


def test_monitor_overhead(benchmark, request) -> None:
    session = request.config.pluginmanager.get_plugin("loadbench")
    options = session.options
    data = session.dataset()
    config = TrainConfig(epochs=min(options.epochs, 20), loop=options.loop, precision=options.precision)
    cuda = torch.device(options.device).type == "cuda"
    rounds = ROUNDS if cuda else CPU_ROUNDS
    epochs: dict[bool, list[float]] = {False: [], True: []}

    def compare() -> None:
        for _ in range(rounds):
            for watched in (False, True):
                trainer = Trainer(config, data)
                if watched:
                    with LoadMonitor(options.device, options.monitor_period, probe=session.probe):
                        trainer.fit()
                else:
                    trainer.fit()
                epochs[watched] += trainer.epoch_seconds[1:]
                trainer.release()

    benchmark.group = "monitor"
    benchmark.pedantic(compare, rounds=1)
    off, on = statistics.median(epochs[False]), statistics.median(epochs[True])
    overhead = on / off - 1
    benchmark.extra_info.update(
        median_epoch_s_off=off, median_epoch_s_on=on, overhead=overhead,
        period_s=options.monitor_period, epochs_each=len(epochs[True]), rounds=rounds, loop=config.loop,
    )
    if cuda:
        assert overhead < GOAL, f"monitor overhead {overhead:.2%} on epoch time, goal {GOAL:.0%}"
