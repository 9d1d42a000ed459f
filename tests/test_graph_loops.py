"""The CUDA-graph loops against the eager fast loop: the same math, a new batch order each epoch.

`graph` and `step-graph` replay the fast loop's steps from CUDA graphs
(model/graph_loop.py), so on a GPU they must give the fast loop's losses and weights.
The CPU tests check the fast loop's own batch order, that every loop trains on every
frame once per epoch, and GraphEpoch's batching with its graphs replayed on the CPU.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import torch

from model.config import TrainConfig
from model.data import Dataset
from model.data import load_dataset
from model.graph_loop import GraphEpoch
from model.train import GRAPH_LOOPS
from model.train import Trainer
from model.train import TrainResult

gpu = pytest.mark.gpu

# Every study optimizer's step is captured (Adagrad through the trainer's
# CapturableAdagrad): a graph loop must replay each from a graph.
CAPTURABLE = ("adam", "sgd", "rmsprop", "adagrad")
EPOCHS = 3


def record_randperm(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """Every permutation `torch.randperm` hands out from now on, in order (the loops'
    only use of it is one draw per epoch)."""
    drawn: list[torch.Tensor] = []
    real = torch.randperm

    def recording(*args, **kwargs) -> torch.Tensor:
        perm = real(*args, **kwargs)
        drawn.append(perm.clone())
        return perm

    monkeypatch.setattr(torch, "randperm", recording)
    return drawn


def config(data: Dataset, **changes: object) -> TrainConfig:
    # A last partial batch, so step-graph replays both of its graphs.
    batch = 512 if len(data.y_train) % 512 else 500
    return TrainConfig(width=64, depth=2, epochs=EPOCHS, precision="fp32", batch_size=batch).replace(**changes)


def is_permutation(perm: torch.Tensor, n: int) -> bool:
    return torch.equal(perm.sort().values, torch.arange(n, device=perm.device))


# --------------------------------------------------------------------------- GPU


@dataclass
class Run:
    result: TrainResult
    weights: dict[str, torch.Tensor]
    drawn: list[torch.Tensor]  # each epoch's randperm
    read: list[torch.Tensor]  # the permutation buffer the graphs replay from, after each epoch
    read_at: list[int]  # that buffer's address, after each epoch


def train_recorded(data: Dataset, loop: str, optimizer: str) -> Run:
    read: list[torch.Tensor] = []
    read_at: list[int] = []
    with pytest.MonkeyPatch.context() as patch:
        drawn = record_randperm(patch)
        trainer = Trainer(config(data, loop=loop, optimizer=optimizer), data)

        def after_epoch(*_: object) -> None:
            if isinstance(trainer._epoch, GraphEpoch):
                read.append(trainer._epoch.perm.clone())
                read_at.append(trainer._epoch.perm.data_ptr())

        trainer.fit(after_epoch)
    weights = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    return Run(trainer.result(), weights, drawn, read, read_at)


@pytest.fixture(scope="module")
def runs():
    """run(loop, optimizer), each trained once for the whole module."""
    data = load_dataset("synthetic", scale=0.05, device="cuda")
    assert len(data.y_train) % config(data).batch_size  # the partial batch is there
    return functools.cache(functools.partial(train_recorded, data))


@gpu
@pytest.mark.parametrize("loop", GRAPH_LOOPS)
@pytest.mark.parametrize("optimizer", CAPTURABLE)
def test_graph_loops_match_the_fast_loop_exactly(runs, loop, optimizer) -> None:
    fast, graph = runs("fast", optimizer), runs(loop, optimizer)
    assert fast.result.loop == "fast"
    assert graph.result.loop == loop and graph.result.notes == []
    assert graph.result.optimizer_impl.endswith("+capturable")
    # The same generator, seeded alike, draws the same orders in both loops; a graph loop
    # draws each next epoch's at the end of the one before, one past the last.
    assert len(graph.drawn) == len(fast.drawn) + 1 == EPOCHS + 1
    assert all(torch.equal(g, f) for g, f in zip(graph.drawn, fast.drawn))
    # Exact equality, not a tolerance, is what the design promises: a graph records the
    # eager kernels and replays them unchanged, on the same batches in the same order;
    # the warm-up is undone to bit-identical fresh state (parameters copied back,
    # optimizer state zeroed, which each of these optimizers' math treats as fresh);
    # capturable=True changes where Adam's and RMSprop's step count lives, not the update
    # (Adam is fused either way, RMSprop divides by a float lr either way); and no op in
    # this MLP's step reduces with atomics, so a rerun on one GPU is bitwise the same.
    assert_trained_alike(graph, fast)


def assert_trained_alike(run: Run, fast: Run) -> None:
    assert run.result.losses == fast.result.losses
    assert run.weights.keys() == fast.weights.keys()
    for name, weight in run.weights.items():
        difference = (weight - fast.weights[name]).abs().max().item()
        assert torch.equal(weight, fast.weights[name]), f"{name}: differs by up to {difference:.3g}"
    assert run.result.confusion == fast.result.confusion


@gpu
@pytest.mark.parametrize("loop", GRAPH_LOOPS)
def test_graph_loops_replay_a_new_batch_order_every_epoch(runs, loop) -> None:
    # A permutation filled once, at capture, would still train; only the order shows it.
    run = runs(loop, "adam")
    assert len(run.drawn) == len(run.read) + 1 == EPOCHS + 1  # one draw per epoch, not one per capture
    n = len(run.read[0])
    for epoch, read in enumerate(run.read):  # after an epoch, the buffer holds the next one's draw
        assert torch.equal(read, run.drawn[epoch + 1]), f"epoch {epoch}: the graphs' buffer does not hold the next draw"
        assert is_permutation(read, n), epoch
    if loop == "graph":  # its one graph was captured reading this address: refilled in place
        assert len(set(run.read_at)) == 1
    assert not torch.equal(run.read[1], run.read[0])
    assert not torch.equal(run.read[2], run.read[1])


# --------------------------------------------------------------------------- CPU


def test_fast_loop_trains_each_epoch_in_a_new_order(monkeypatch) -> None:
    data = load_dataset("synthetic", scale=0.05)
    drawn = record_randperm(monkeypatch)
    trainer = Trainer(config(data, loop="fast", epochs=2, width=16), data)
    batches: list[torch.Tensor] = []
    step = trainer.step
    trainer.step = lambda x, y: (batches.append(x.clone()), step(x, y))[1]
    trainer.fit()

    n = len(data.y_train)
    steps = math.ceil(n / trainer.config.batch_size)
    assert len(drawn) == 2 and len(batches) == 2 * steps
    for epoch, perm in enumerate(drawn):
        assert is_permutation(perm, n), epoch
        seen = torch.cat(batches[epoch * steps : (epoch + 1) * steps])
        assert torch.equal(seen, data.x_train[perm]), f"epoch {epoch} did not train in the order it drew"
    assert not torch.equal(drawn[1], drawn[0])


@pytest.mark.parametrize("loop", ["reference", "fast", "step-graph", "graph"])
def test_every_loop_trains_on_every_frame_once_per_epoch(loop) -> None:
    data = load_dataset("synthetic", scale=0.05)
    trainer = Trainer(config(data, loop=loop, epochs=1, width=16), data)
    assert len(data.y_train) % trainer.config.batch_size  # a last partial batch
    rows: list[int] = []
    trainer.model.register_forward_hook(lambda module, args, out: rows.append(len(args[0])))
    trainer.fit()
    assert sum(rows) == len(data.y_train)
    assert rows[-1] == len(data.y_train) % trainer.config.batch_size


class _CpuGraph:
    """A CUDA graph stand-in: capture records GraphEpoch's steps, replay runs them again
    on the index buffers as they are then, which is what a real replay reads."""

    def __init__(self) -> None:
        self.steps: list[functools.partial] = []

    def replay(self) -> None:
        for step in self.steps:
            step()

    def pool(self) -> None:
        return None


class _CpuStream:
    def __init__(self, *_: object) -> None:
        pass

    def wait_stream(self, _: object) -> None:
        pass


@pytest.mark.parametrize("whole_epoch", [False, True], ids=["step-graph", "graph"])
def test_graph_epoch_batches_cover_every_frame_once_with_the_partial_batch(monkeypatch, whole_epoch) -> None:
    capturing: list[_CpuGraph] = []
    real_step_at = GraphEpoch._step_at

    def step_at(self: GraphEpoch, index: torch.Tensor) -> None:
        if capturing:  # recorded, not run: as a capture records kernels
            capturing[-1].steps.append(functools.partial(real_step_at, self, index))
        else:
            real_step_at(self, index)

    @contextlib.contextmanager
    def graph(g: _CpuGraph, pool: object = None, capture_error_mode: str = "global") -> Iterator[None]:
        capturing.append(g)
        try:
            yield
        finally:
            capturing.pop()

    monkeypatch.setattr(GraphEpoch, "_step_at", step_at)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _CpuGraph)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(torch.cuda, "Stream", _CpuStream)
    monkeypatch.setattr(torch.cuda, "stream", lambda _: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", _CpuStream)

    n, batch = 10, 4  # batches of 4, 4 and 2
    seen: list[torch.Tensor] = []

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        seen.append(x[:, 0].long().clone())
        return x[:, 0].mean()

    model = torch.nn.Linear(1, 1)
    epoch = GraphEpoch(step, model, torch.optim.SGD(model.parameters(), lr=0.1),
                       torch.arange(n, dtype=torch.float32).unsqueeze(1), torch.zeros(n, dtype=torch.long),
                       batch, torch.Generator().manual_seed(0), whole_epoch)
    loss = epoch()  # warm-up, capture and the first epoch's replay
    assert loss == pytest.approx(sum(range(n)) / n)  # every frame's loss, divided by all frames
    for _ in range(2):
        seen.clear()
        order = epoch.perm.clone()  # drawn at the end of the epoch before
        epoch()
        assert [len(b) for b in seen] == [4, 4, 2]
        assert torch.equal(torch.cat(seen), order)  # the epoch's order, each frame once
        assert not torch.equal(epoch.perm, order)  # and the next epoch's is drawn
