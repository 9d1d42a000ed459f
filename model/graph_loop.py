"""The fast loop replayed from CUDA graphs: one graph per epoch, or one per step.

At these sizes a training step is a few dozen short kernels, so launching them from
Python costs more than running them; a graph launches them all at once. The data
and the permutation buffer stay where they are: each epoch refills the permutation
in place (outside the graph, asynchronously) and replays.

- whole epoch (``loop='graph'``): every step of the epoch, the last partial batch
  included, unrolled into one graph; one replay per epoch.
- per step (``loop='step-graph'``): one graph for a full batch and one for the
  partial batch, each reading its batch indices from a static buffer; one replay per
  step.

The first call warms up (allocator growth, cuBLAS workspaces, optimizer state,
Triton compilation) on a side stream, puts parameters and optimizer state back
as they were, then captures; so the trajectory matches the eager fast loop's.
An optimizer whose step cannot be captured (Adagrad reads its step count on the
host) makes `build_graph_epoch` return None and the trainer runs the fast loop.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from model.train import Trainer

WARMUP_STEPS = 3


def build_graph_epoch(trainer: Trainer, whole_epoch: bool) -> GraphEpoch | None:
    if "capturable" not in trainer.optimizer_impl:
        trainer.notes.append(
            f"{trainer.config.optimizer}: its step cannot be captured in a CUDA graph; ran the eager fast loop"
        )
        return None
    return GraphEpoch(trainer, whole_epoch)


class GraphEpoch:
    """Callable like the trainer's epoch functions: runs one epoch, returns its mean loss."""

    def __init__(self, trainer: Trainer, whole_epoch: bool) -> None:
        self.trainer = trainer
        self.whole_epoch = whole_epoch
        data = trainer.data
        self.n = len(data.y_train)
        self.batch = min(trainer.config.batch_size, self.n)
        self.steps = math.ceil(self.n / self.batch)
        self.perm = torch.empty(self.n, dtype=torch.long, device=trainer.device)
        self.index = torch.zeros(self.batch, dtype=torch.long, device=trainer.device)  # per-step mode
        self.total = torch.zeros((), device=trainer.device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}  # batch size -> graph (per-step mode)
        self.epoch_graph: torch.cuda.CUDAGraph | None = None

    def __call__(self) -> float:
        t = self.trainer
        self.perm.copy_(torch.randperm(self.n, device=t.device, generator=t.generator))
        if self.epoch_graph is None and not self.graphs:
            self._warm_up()
            self._capture()
        if self.whole_epoch:
            assert self.epoch_graph is not None
            self.epoch_graph.replay()
        else:
            self.total.zero_()
            for start in range(0, self.n, self.batch):
                size = min(self.batch, self.n - start)
                self.index[:size].copy_(self.perm[start : start + size])
                self.graphs[size].replay()
        return float(self.total) / self.n

    def _step_at(self, index: torch.Tensor) -> None:
        x = self.trainer.data.x_train[index]
        y = self.trainer.data.y_train[index]
        self.total += self.trainer.step(x, y) * len(index)

    def _warm_up(self) -> None:
        t = self.trainer
        params = [p.detach().clone() for p in t.model.parameters()]
        side = torch.cuda.Stream(t.device)
        side.wait_stream(torch.cuda.current_stream(t.device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):
                self._step_at(self.perm[: self.batch])
                if self.n % self.batch:
                    self._step_at(self.perm[: self.n % self.batch])
        torch.cuda.current_stream(t.device).wait_stream(side)
        # Undo the warm-up: zeroed state is each optimizer's fresh state (Adam and
        # RMSprop moments and step, SGD's momentum buffer taking the first gradient).
        with torch.no_grad():
            for p, saved in zip(t.model.parameters(), params):
                p.copy_(saved)
            for state in t.optimizer.state.values():
                for value in state.values():
                    if torch.is_tensor(value):
                        value.zero_()
        self.total.zero_()

    def _capture(self) -> None:
        t = self.trainer
        t.optimizer.zero_grad(set_to_none=True)
        if self.whole_epoch:
            self.epoch_graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.epoch_graph):
                self.total.zero_()
                for start in range(0, self.n, self.batch):
                    self._step_at(self.perm[start : start + self.batch])
            return
        sizes = {self.batch} | ({self.n % self.batch} if self.n % self.batch else set())
        pool = None
        for size in sorted(sizes, reverse=True):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._step_at(self.index[:size])
            pool = graph.pool()
            self.graphs[size] = graph
