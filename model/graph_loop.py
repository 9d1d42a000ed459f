"""The fast loop replayed from CUDA graphs: the whole epoch, or one graph per step.

At these sizes a step is a few dozen short kernels, so launching them from Python costs
more than running them; a graph launches them all at once. ``loop='graph'`` unrolls
every step of the epoch (the last partial batch included) into graphs of
STEPS_PER_GRAPH steps; ``loop='step-graph'`` captures one graph for a full batch and
one for the partial batch, each reading its indices from a static buffer.

The first call warms up on a side stream, puts parameters and optimizer state back as
they were, then captures, so the trajectory matches the eager fast loop's. Each epoch
ends by drawing the next one's batch order behind its steps. The optimizer's step must
be capturable (its step count on the device, no host read).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

WARMUP_STEPS = 3
# Whole-epoch mode captures the epoch as consecutive graphs of at most this many steps,
# replayed back to back: the GPU starts on the first while the host launches the next.
# H100, fp32, 3x512, GPU time per epoch, one graph -> graphs of 40-160 steps: batch 512
# 35.66 -> 35.09-35.21 ms, batch 64 198.9 -> 195.6-196.5 ms (launches overlap the work).
STEPS_PER_GRAPH = 64
Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x, y) -> the batch's mean loss


class GraphEpoch:
    """Callable like the trainer's epoch functions: runs one epoch, returns its mean loss."""

    def __init__(
        self,
        step: Step,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        x: torch.Tensor,
        y: torch.Tensor,
        batch_size: int,
        generator: torch.Generator,
        whole_epoch: bool,
        fused_step: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
    ) -> None:
        self.step, self.model, self.optimizer = step, model, optimizer
        self.fused_step = fused_step  # (index, total): the whole step, adding its loss sum to total
        self.x, self.y, self.generator = x, y, generator
        self.whole_epoch = whole_epoch
        self.steps_per_graph = STEPS_PER_GRAPH
        # 'global' refuses, during capture, CUDA calls from any thread; a caller whose step
        # has other threads polling the GPU (NCCL's watchdog) captures 'thread_local'.
        self.capture_error_mode = "global"
        self.device = x.device
        self.n = len(y)
        self.batch = min(batch_size, self.n)
        self.steps = math.ceil(self.n / self.batch)
        self.perm = torch.empty(self.n, dtype=torch.long, device=self.device)
        self.index = torch.zeros(self.batch, dtype=torch.long, device=self.device)  # per-step mode
        self.total = torch.zeros((), device=self.device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}  # batch size -> graph (per-step mode)
        self.epoch_graphs: list[torch.cuda.CUDAGraph] = []  # whole-epoch mode, in step order

    def __call__(self) -> float:
        if not self.epoch_graphs and not self.graphs:
            self._draw()
            self._warm_up()
            self._capture()
        if self.whole_epoch:
            for graph in self.epoch_graphs:
                graph.replay()
        else:
            self.total.zero_()
            for start in range(0, self.n, self.batch):
                size = min(self.batch, self.n - start)
                self.index[:size].copy_(self.perm[start : start + size])
                self.graphs[size].replay()
        # The next epoch's order, drawn while this epoch's steps run: the sort's kernels
        # queue behind the steps, which read the buffer before it is refilled (stream
        # order), so the next epoch starts on its first step rather than waiting on the
        # host to launch the sort. The generator draws the same orders in the same order.
        self._draw()
        return float(self.total) / self.n

    def _draw(self) -> None:
        self.perm.copy_(torch.randperm(self.n, device=self.device, generator=self.generator))

    def _step_at(self, index: torch.Tensor) -> None:
        if self.fused_step is not None:
            self.fused_step(index, self.total)
            return
        self.total += self.step(self.x[index], self.y[index]) * len(index)

    def _warm_up(self) -> None:
        params = [p.detach().clone() for p in self.model.parameters()]
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):
                self._step_at(self.perm[: self.batch])
                if self.n % self.batch:
                    self._step_at(self.perm[: self.n % self.batch])
        torch.cuda.current_stream(self.device).wait_stream(side)
        # Undo the warm-up: zeroed state is each optimizer's fresh state (moments,
        # Adagrad's sum and every step count, a FlatOptimizer's per-program counts
        # included; SGD's momentum buffer taking the first gradient). Parameters are
        # restored in place, so a FlatOptimizer's views stay views.
        with torch.no_grad():
            for p, saved in zip(self.model.parameters(), params):
                p.copy_(saved)
            for state in self.optimizer.state.values():
                for value in state.values():
                    if torch.is_tensor(value):
                        value.zero_()
        self.total.zero_()

    def _capture(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        if self.whole_epoch:
            starts = range(0, self.n, self.batch)
            pool = None
            for first in range(0, len(starts), self.steps_per_graph):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, capture_error_mode=self.capture_error_mode):
                    if first == 0:
                        self.total.zero_()
                    for start in starts[first : first + self.steps_per_graph]:
                        self._step_at(self.perm[start : start + self.batch])
                pool = graph.pool()
                self.epoch_graphs.append(graph)
            return
        sizes = {self.batch} | ({self.n % self.batch} if self.n % self.batch else set())
        pool = None
        for size in sorted(sizes, reverse=True):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, capture_error_mode=self.capture_error_mode):
                self._step_at(self.index[:size])
            pool = graph.pool()
            self.graphs[size] = graph
