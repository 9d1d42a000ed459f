"""Data parallelism over one flat gradient buffer, replayed from CUDA graphs on GPUs.

A step on every rank: zero the flat gradient, forward and backward on the rank's
contiguous share of the global batch with the gradient all-reduced in buckets
(`GradientBuckets`, LOADBENCH_DP_BUCKET_MB; last layers first, each launched as soon as
backward has filled it), a wait for the last bucket, then the flat optimizer's one
kernel. Each rank's loss is scaled so that the summed gradient is the global batch's
mean: the single-process math, the last partial batch included.

On NCCL, ``loop='graph'`` captures the whole epoch and ``'step-graph'`` one graph per
step; LOADBENCH_DP_GRAPH=0, and gloo on a CPU, run the same step eagerly. A rank must
destroy its graphs before its process group (`FlatDataParallel.release`): NCCL waits
for graphs that captured its collectives. Why this loop and what it measured:
docs/data-parallel.md.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

from kernels.ground import env as loadbench_env
from model.config import TrainConfig
from model.data import Dataset
from model.graph_loop import GraphEpoch
from model.mlp import MLP
from model.train import GRAPH_LOOPS
from model.train import autocast
from model.train import make_optimizer
from model.train import seed_everything
from model.train import shuffled_epoch_total

GRAPH_ENV = "LOADBENCH_DP_GRAPH"
BUCKET_ENV = "LOADBENCH_DP_BUCKET_MB"
DEFAULT_BUCKET_MB = 1.0
NCCL_EAGER_NOTE = f"'{{loop}}' requested, runs eagerly on NCCL: {GRAPH_ENV}={{value}} in the environment"
GLOO_EAGER_NOTE = "'{loop}' requested, runs eagerly on {backend}: CUDA graphs need NCCL on GPUs"


def resolve_loop(loop: str, backend: str, env: Mapping[str, str] | None = None) -> tuple[str, str | None]:
    """The loop a data-parallel graph request runs, and a note when that is not the one asked for.

    `loop` is 'graph' or 'step-graph'. On NCCL it runs as asked unless `env` (the
    process's environment by default) sets LOADBENCH_DP_GRAPH to 0 (or false, no, off);
    then, and on any other backend, the same step runs eagerly: ('fast', note)."""
    if loop not in GRAPH_LOOPS:
        raise ValueError(f"data-parallel flat loop: {loop!r} is not a graph loop ({', '.join(GRAPH_LOOPS)})")
    env = os.environ if env is None else env
    value = env.get(GRAPH_ENV, "").strip()
    graphs = loadbench_env.parse(GRAPH_ENV, value)
    if backend != "nccl":
        return "fast", GLOO_EAGER_NOTE.format(loop=loop, backend=backend)
    if not graphs:
        return "fast", NCCL_EAGER_NOTE.format(loop=loop, value=value)
    return loop, None


def bucket_cap_bytes(env: Mapping[str, str] | None = None) -> int:
    """The gradient bucket size LOADBENCH_DP_BUCKET_MB asks for, in bytes (the process's
    environment by default; unset or empty: DEFAULT_BUCKET_MB). 0: one bucket, the whole
    buffer, all-reduced after the backward pass."""
    env = os.environ if env is None else env
    return int(loadbench_env.read(BUCKET_ENV, env) * 2**20)


Span = tuple[torch.nn.Parameter, int, int]  # a parameter's [start, stop) in the flat buffer


def plan_buckets(spans: Sequence[Span], cap_bytes: int, element_size: int = 4) -> list[tuple[int, int, list[int]]]:
    """Buckets of the flat gradient as (start, stop, indices of their parameters in
    `spans`), in the order backward completes them: from the last parameter back, a
    bucket closes once its span holds `cap_bytes` or more. cap_bytes 0: one bucket."""
    if not spans:
        return []
    if cap_bytes <= 0:
        return [(spans[0][1], spans[-1][2], list(range(len(spans))))]
    buckets, members = [], []
    for i in reversed(range(len(spans))):
        members.append(i)
        start, stop = spans[i][1], spans[members[0]][2]
        if (stop - start) * element_size >= cap_bytes or i == 0:
            buckets.append((start, stop, members))
            members = []
    return buckets


class GradientBuckets:
    """SUM all-reduces of the flat gradient in buckets, each launched from an autograd
    hook once backward has accumulated every gradient in it, so that it runs beside the
    backward of the layers before it.

    Every rank launches the same collectives in the same order whatever order its hooks
    fire in (a bucket waits for the ones before it), which a captured collective needs:
    it replays as one collective of all ranks. `begin()` before the backward pass,
    `finish()` after it: launches what is left (all of it with no backward pass, e.g. a
    rank whose share of the batch is empty, or with one bucket) and makes the current
    stream wait for every all-reduce. On GPUs the hooks run on autograd's device thread
    on the step's stream, so inside a capture the all-reduces join the graph."""

    def __init__(self, grad: torch.Tensor, spans: Sequence[Span], cap_bytes: int) -> None:
        self.grad = grad
        self.buckets = plan_buckets(spans, cap_bytes, grad.element_size())
        self._bucket_of = {id(spans[i][0]): b for b, (_, _, members) in enumerate(self.buckets) for i in members}
        self._armed = False
        self._remaining: list[int] = []
        self._launched = 0
        self._works: list[dist.Work] = []
        if len(self.buckets) > 1:  # one bucket waits for the whole backward pass anyway
            for param, _, _ in spans:
                param.register_post_accumulate_grad_hook(self._accumulated)

    @property
    def sizes(self) -> list[int]:
        """Each bucket's size in bytes, in launch order."""
        return [(stop - start) * self.grad.element_size() for start, stop, _ in self.buckets]

    def begin(self) -> None:
        self._remaining = [len(members) for _, _, members in self.buckets]
        self._launched, self._works, self._armed = 0, [], True

    def finish(self) -> None:
        assert self._armed, "GradientBuckets.finish() without begin()"
        self._launch_ready(everything=True)
        for work in self._works:
            work.wait()  # on NCCL: the current stream waits; the host does not
        self._works, self._armed = [], False

    def _accumulated(self, param: torch.Tensor) -> None:
        if not self._armed:  # a backward pass outside a step (none in training; a user's)
            return
        self._remaining[self._bucket_of[id(param)]] -= 1
        self._launch_ready()

    def _launch_ready(self, everything: bool = False) -> None:
        while self._launched < len(self.buckets) and (everything or self._remaining[self._launched] == 0):
            start, stop, _ = self.buckets[self._launched]
            self._works.append(dist.all_reduce(self.grad[start:stop], async_op=True))
            self._launched += 1


class FlatDataParallel:
    """One rank's model, flat optimizer and epoch function; call `epoch()` per epoch."""

    def __init__(self, config: TrainConfig, data: Dataset) -> None:
        if config.impl == "compile":
            raise ValueError(
                "data-parallel loop 'graph': impl 'compile' is not supported (use 'torch' or 'triton', "
                "or loop 'fast' for DistributedDataParallel)"
            )
        self.config, self.data = config, data
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.device = data.device
        seed_everything(config.seed)
        self.model = MLP(
            data.n_features, config.width, config.depth, data.n_classes, config.activation, config.impl
        ).to(self.device)
        # The flat buffer is the point: one all-reduce per step, whatever optimizer_impl says.
        self.optimizer, self.optimizer_impl = make_optimizer(
            config.optimizer, list(self.model.parameters()), fast=True, capturable=True, impl="triton"
        )
        self.flat = self.optimizer.flat
        with torch.no_grad():
            dist.broadcast(self.flat.data, src=0)  # as DDP does: identical seeds are not relied on
        assert self.flat.grad is not None
        self.buckets = GradientBuckets(self.flat.grad, self.optimizer.spans(), bucket_cap_bytes())
        self.loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy
        if config.optimizer_impl == "triton":
            from kernels.ops.cross_entropy import cross_entropy  # imported lazily: kernels/ needs triton

            self.loss_fn = cross_entropy
        self.generator = torch.Generator(device=self.device).manual_seed(config.seed)
        self.loop, self.note = (resolve_loop(config.loop, dist.get_backend()) if config.loop in GRAPH_LOOPS
                                else ("fast", None))
        self.epoch: Callable[[], float] = self._eager_epoch
        if self.loop in GRAPH_LOOPS:
            self.epoch = _GraphEpoch(self, whole_epoch=self.loop == "graph")

    def release(self) -> None:
        """Destroy this rank's CUDA graphs, after the GPU has finished them. Call before
        the process group is destroyed: NCCL does not destroy (or abort) a communicator
        while a graph that captured one of its collectives lives, and the graph epoch and
        this object refer to each other, so nothing else frees them in time."""
        epoch = self.epoch
        if isinstance(epoch, _GraphEpoch):
            torch.cuda.synchronize(self.device)
            epoch.epoch_graphs.clear()
            epoch.graphs.clear()
            epoch.parallel = None
        self.epoch = self._eager_epoch
        gc.collect()  # any other cycle holding a graph

    def step(self, x: torch.Tensor, y: torch.Tensor, batch_size: int) -> torch.Tensor:
        """One step on this rank's share (x, y) of a global batch of `batch_size`;
        returns the share's summed loss as a device scalar."""
        self.optimizer.zero_grad()  # zeroes the flat gradient in place
        local_sum = torch.zeros((), device=self.device)
        self.buckets.begin()
        if len(y):  # the fused loss refuses an empty share; its zero gradient is right anyway
            with autocast(self.config.precision, self.device):
                mean = self.loss_fn(self.model(x), y)
            (mean * (len(y) / batch_size)).backward()  # launches the buckets' all-reduces as they fill
            local_sum = mean.detach().float() * len(y)
        self.buckets.finish()  # SUM over ranks: the global batch's mean gradient
        self.optimizer.step()
        return local_sum

    def share(self, batch: torch.Tensor) -> torch.Tensor:
        """This rank's contiguous share of a global batch's indices."""
        return batch.tensor_split(self.world)[self.rank]

    def _eager_epoch(self) -> float:
        x_all, y_all = self.data.x_train, self.data.y_train

        def step_on(batch: torch.Tensor) -> torch.Tensor:
            local = self.share(batch)
            return self.step(x_all[local], y_all[local], len(batch))

        total = shuffled_epoch_total(len(y_all), self.config.batch_size, self.device, self.generator, step_on)
        return _global_mean(total, len(y_all))


class _GraphEpoch(GraphEpoch):
    """GraphEpoch whose steps are the data-parallel step on this rank's share.

    The warm-up on the side stream runs the all-reduce too: the communicator and NCCL's
    buffers exist before capture, and every rank captures the same collectives in the
    same order (a captured collective replays as a collective of all ranks)."""

    def __init__(self, parallel: FlatDataParallel, whole_epoch: bool) -> None:
        data = parallel.data
        super().__init__(
            _unused_step, parallel.model, parallel.optimizer, data.x_train, data.y_train,
            parallel.config.batch_size, parallel.generator, whole_epoch,
        )
        self.parallel: FlatDataParallel | None = parallel
        # Other threads touch the GPU while we capture (ProcessGroupNCCL's watchdog queries
        # events; NCCL's proxy thread): in 'global' mode a call of theirs can invalidate
        # the capture on one rank while the others go on (NCCL's docs advise thread-local
        # capture for captured collectives).
        self.capture_error_mode = "thread_local"

    def _step_at(self, index: torch.Tensor) -> None:
        assert self.parallel is not None, "released"
        local = self.parallel.share(index)
        self.total += self.parallel.step(self.x[local], self.y[local], len(index))

    def __call__(self) -> float:
        super().__call__()  # replays; its host read of this rank's total is the epoch's sync
        return _global_mean(self.total.clone(), self.n)


def _unused_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    raise AssertionError("the data-parallel graph epoch steps through FlatDataParallel.step")


def _global_mean(local_total: torch.Tensor, n: int) -> float:
    dist.all_reduce(local_total)
    return float(local_total) / n
