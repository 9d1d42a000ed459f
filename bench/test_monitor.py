"""What watching costs: epoch time with the load monitor on and off, interleaved.

The optimal configuration trains ROUNDS times each way, alternating, and the medians
of the per-epoch times (first epoch of each run left out) are compared. The goal is
an overhead under 1%, gated on a GPU; on a CPU the figure is recorded only, since the
monitor thread competes for the same two cores it measures, and one round each way
(CPU_ROUNDS) checks the code path. The watched epochs are gated on time against the
baseline like a training case's.
"""

import statistics

import torch

from bench.gate.budgets import Failure
from bench.monitor.sampler import LoadMonitor
from bench.plugin.verdicts import judge_calls
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
    ceiling = [Failure("monitor_overhead", overhead, GOAL, detail="epoch time watched over unwatched, minus one")]
    # The watched epochs are gated on time like a training case's; the overhead by its goal, on a GPU only.
    judge_calls(session, benchmark, "monitor", "monitor-overhead", seconds=epochs[True],
                ceilings=ceiling if cuda and overhead >= GOAL else ())
