"""Training: the study's optimizers, precision modes and loops.

Every loop has the same math (cross-entropy, one optimizer step per batch, the last
partial batch kept): ``reference`` is the study's DataLoader loop with a per-step
``loss.item()``; ``fast`` keeps data on the device, slices batches from a device
``randperm`` and reads the loss once per epoch; ``graph`` and ``step-graph`` replay the
fast loop from CUDA graphs (model/graph_loop.py; on a CPU they run the fast loop and
say so). ``TrainConfig.optimizer_impl`` picks torch.optim and F.cross_entropy
('torch') or one flat-buffer optimizer kernel and one fused loss kernel ('triton').

`Trainer` splits setup, `fit` / `run_epoch` (what a benchmark times) and `evaluate`,
and reports each epoch through a callback, so a harness can time and show progress
without the loop knowing about it. Longer notes: docs/loops.md.
"""

from __future__ import annotations

import contextlib
import inspect
import random
import time
from collections.abc import Callable
from collections.abc import Iterator
from dataclasses import dataclass
from dataclasses import field

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torch.utils.data import TensorDataset

from kernels.ground.axes import Impl
from kernels.ground.axes import Loop
from kernels.ground.axes import OptimizerImpl
from kernels.ground.axes import Precision
from model.config import TrainConfig
from model.data import Dataset
from model.graph_loop import GraphEpoch
from model.metrics import classification_report
from model.mlp import MLP

# The study's optimizer settings.
OPTIMIZERS: dict[str, tuple[type[torch.optim.Optimizer], dict[str, float]]] = {
    "adam": (torch.optim.Adam, {"lr": 1e-4, "weight_decay": 1e-4}),
    "sgd": (torch.optim.SGD, {"lr": 0.01, "momentum": 0.9}),
    "adagrad": (torch.optim.Adagrad, {"lr": 0.01, "lr_decay": 1e-6, "weight_decay": 1e-4}),
    "rmsprop": (torch.optim.RMSprop, {"lr": 0.01, "alpha": 0.99, "eps": 1e-8, "weight_decay": 1e-4}),
}

GRAPH_LOOPS = (Loop.GRAPH.value, Loop.STEP_GRAPH.value)
EpochCallback = Callable[[int, float, float], None]  # (epoch index, seconds, mean loss)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # seeds every CUDA device too


class CapturableAdagrad(torch.optim.Optimizer):
    """torch.optim.Adagrad's math with its step count on the device, so a CUDA graph can
    capture the step (torch's Adagrad reads the count on the host to decay the rate):

        step += 1; clr = lr / (1 + (step - 1) * lr_decay)          (a device scalar)
        grad += weight_decay * param; sum += grad^2; param -= clr * grad / (sqrt(sum) + eps)

    in the order of torch's foreach implementation. One count per param group, shared
    by its parameters' states (every parameter has a gradient at every step here). The
    accumulator starts at 0, torch's default, so zeroed state is fresh state."""

    def __init__(
        self, params: list[torch.nn.Parameter], lr: float = 1e-2, lr_decay: float = 0.0,
        weight_decay: float = 0.0, eps: float = 1e-10,
    ) -> None:
        super().__init__(params, {"lr": lr, "lr_decay": lr_decay, "weight_decay": weight_decay, "eps": eps})
        for group in self.param_groups:
            step = torch.zeros((), device=group["params"][0].device)
            for p in group["params"]:
                self.state[p] = {"step": step, "sum": torch.zeros_like(p)}

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[no-untyped-def]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = group["params"]
            grads = [p.grad for p in params]
            sums = [self.state[p]["sum"] for p in params]
            step = self.state[params[0]]["step"]
            step.add_(1)
            minus_clr = -group["lr"] / (1 + (step - 1) * group["lr_decay"])  # a device scalar
            if group["weight_decay"]:
                grads = torch._foreach_add(grads, params, alpha=group["weight_decay"])
            torch._foreach_addcmul_(sums, grads, grads, value=1)
            std = torch._foreach_sqrt(sums)
            torch._foreach_add_(std, group["eps"])
            torch._foreach_addcdiv_(params, torch._foreach_mul(grads, minus_clr), std)
        return loss


def make_optimizer(
    name: str, params: list[torch.nn.Parameter], fast: bool, capturable: bool = False, impl: str = "torch"
) -> tuple[torch.optim.Optimizer, str]:
    """The study's optimizer; with ``fast``, its fused or foreach implementation.

    Returns the optimizer and how it runs ('fused', 'foreach' or 'default', with
    '+capturable' when its step can be captured in a CUDA graph), since fused and
    capturable support differ by optimizer, device and torch version. With ``impl``
    'triton' it is kernels/ops/optim.py's FlatOptimizer ('triton-flat+capturable'), which
    turns `params` into views of its flat buffer.
    """
    cls, settings = OPTIMIZERS[name]
    if impl == Impl.TRITON:
        from kernels.ops.optim import FlatOptimizer  # imported lazily: kernels/ needs triton

        return FlatOptimizer(params, name, **settings), "triton-flat+capturable"
    if not fast:
        return cls(params, **settings), "default"
    if name == "adagrad" and params[0].device.type == "cuda":
        # The fast and graph loops run the same Adagrad, so a graph replays the fast loop.
        return CapturableAdagrad(params, **settings), "foreach" + ("+capturable" if capturable else "")
    accepts = inspect.signature(cls.__init__).parameters
    extra = {"capturable": True} if capturable and "capturable" in accepts else {}
    suffix = "+capturable" if extra or (capturable and name == "sgd") else ""
    if "fused" in accepts and _fused_works(cls, settings, params[0].device):
        return cls(params, **settings, fused=True, **extra), "fused" + suffix
    return cls(params, **settings, foreach=True, **extra), "foreach" + suffix


def _fused_works(cls: type[torch.optim.Optimizer], settings: dict[str, float], device: torch.device) -> bool:
    """Whether a fused step runs here: some optimizers check their device only at the first step."""
    probe = torch.zeros(1, device=device, requires_grad=True)
    probe.grad = torch.zeros_like(probe)
    try:
        cls([probe], **settings, fused=True).step()
    except (RuntimeError, TypeError, ValueError):
        return False
    return True


@contextlib.contextmanager
def precision_mode(precision: str) -> Iterator[None]:
    """fp32 is strict IEEE (TF32 off); tf32 lets fp32 matmuls use TF32 (bf16 autocasts per step)."""
    previous = torch.get_float32_matmul_precision()
    cudnn_tf32 = torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("high" if precision == Precision.TF32 else "highest")
    torch.backends.cudnn.allow_tf32 = precision == Precision.TF32
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)
        torch.backends.cudnn.allow_tf32 = cudnn_tf32


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager[None]:
    """bf16 autocast around one forward pass. Entered per step: autocast caches weight
    casts until it exits, which must happen before the optimizer changes the weights.
    The cache is off so the same code is safe inside CUDA-graph capture."""
    if precision != "bf16":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, cache_enabled=False)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def predict(model: torch.nn.Module, x: torch.Tensor, precision: str, batch: int = 16384) -> torch.Tensor:
    """Class predictions for `x`, in chunks, in the training precision, in eval mode."""
    model.eval()
    with precision_mode(precision), autocast(precision, x.device):
        predictions = torch.cat([model(chunk).argmax(1) for chunk in x.split(batch)])
    model.train()
    return predictions


def shuffled_epoch_total(
    n: int,
    batch_size: int,
    device: torch.device,
    generator: torch.Generator,
    step_on: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """One epoch over `n` samples in an order drawn on `device` from `generator`:
    `step_on(index)` for each batch of indices in turn, and the sum of what it returns,
    on the device (no host read)."""
    order = torch.randperm(n, device=device, generator=generator)
    total = torch.zeros((), device=device)
    for start in range(0, n, batch_size):
        total += step_on(order[start : start + batch_size])
    return total

@dataclass
class TrainResult:
    config: TrainConfig
    epoch_seconds: list[float]
    losses: list[float]
    accuracy: float
    macro_f1: float
    weighted_f1: float
    confusion: list[list[int]]
    optimizer_impl: str
    loop: str  # the loop that ran: a 'graph' request falls back to 'fast' where capture is impossible
    notes: list[str] = field(default_factory=list)
    step_route: str = "layers"  # 'fused-step' (one launch per step) or 'layers (why)'; see Trainer

    @property
    def final_loss(self) -> float:
        return self.losses[-1] if self.losses else float("nan")


class Trainer:
    """One training run of `config` on `data`: build in __init__, `fit`, `evaluate`."""

    # The epoch timer. Tests replace it with a planted clock, so that gates judging
    # epoch times are tested without depending on how fast a busy machine runs.
    clock: Callable[[], float] = staticmethod(time.perf_counter)

    def __init__(self, config: TrainConfig, data: Dataset) -> None:
        self.config = config
        self.data = data
        self.device = data.device
        seed_everything(config.seed)
        self.model = MLP(
            data.n_features, config.width, config.depth, data.n_classes, config.activation, config.impl
        ).to(self.device)
        fast = config.loop != "reference"
        capturable = config.loop in GRAPH_LOOPS and self.device.type == "cuda"
        self.optimizer, self.optimizer_impl = make_optimizer(
            config.optimizer, list(self.model.parameters()), fast, capturable, config.optimizer_impl
        )
        # impl 'compile': the whole step (forward, loss, backward, optimizer) through
        # torch.compile, Inductor's default mode; dynamo splits it at backward. The graph
        # loops capture the compiled kernels like the eager ones. One compilation per
        # batch shape (the full and the last partial batch), paid in the first epoch.
        self._step = self._eager_step
        if config.impl == Impl.COMPILE:
            # Each trainer's step guards on a new `self`: past dynamo's recompile limit a
            # compiled function silently runs eagerly, so every trainer starts afresh.
            torch.compiler.reset()
            self._step = torch.compile(self._eager_step, dynamic=False)
        self.loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy
        if config.optimizer_impl == OptimizerImpl.TRITON:
            from kernels.ops.cross_entropy import cross_entropy

            self.loss_fn = cross_entropy
        self.generator = torch.Generator(device=self.device if fast else "cpu").manual_seed(config.seed)
        self.loop = Loop.FAST.value if config.loop in GRAPH_LOOPS and self.device.type != "cuda" else config.loop
        self.notes: list[str] = []
        if self.loop != config.loop:
            self.notes.append(f"loop {config.loop!r} runs as {self.loop!r} on {self.device.type}")
        self.fused_step, self.step_route = self._make_fused_step()
        self.epoch_seconds: list[float] = []
        self.losses: list[float] = []
        self._epoch = self._make_epoch()

    def _make_fused_step(self) -> tuple[Callable[[torch.Tensor, torch.Tensor], None] | None, str]:
        """kernels/ops/mlp_step.py's one-launch step where the kernel axis asks for it and
        the shape fits, and the route that runs: 'fused-step', or 'layers' and why not."""
        config = self.config
        if config.impl != Impl.TRITON or config.optimizer_impl != OptimizerImpl.TRITON:
            return None, "layers"
        from kernels.ops import mlp_step

        layers = [*self.model.hidden, self.model.head]
        rows = min(config.batch_size, len(self.data.y_train))
        reason = mlp_step.FusedStep.usable(layers, rows)
        if mlp_step.SWITCH == "0":
            reason = "LOADBENCH_FUSED_STEP=0"
        elif self.loop == Loop.REFERENCE:
            reason = "the reference loop's batches come from a DataLoader"
        elif reason is None and mlp_step.SWITCH == "auto":
            widths = [m.out_features for m in layers]
            reason = mlp_step.auto_refusal(widths, rows, self.device.type == "cuda" and not mlp_step.INTERPRETER)
        if reason is not None:
            if mlp_step.SWITCH == "1":  # asked for and not given: the summary's notes say so
                self.notes.append(f"the fused step did not run: {reason}")
            return None, f"layers ({reason})"
        fused = mlp_step.FusedStep(
            self.data.x_train, self.data.y_train, layers, self.optimizer, config.activation, config.precision, rows,
        )
        return fused, "fused-step"

    def _make_epoch(self) -> Callable[[], float]:
        if self.loop == Loop.REFERENCE:
            return self._reference_epoch
        if self.loop in GRAPH_LOOPS:
            return GraphEpoch(
                self.step, self.model, self.optimizer, self.data.x_train, self.data.y_train,
                self.config.batch_size, self.generator, whole_epoch=self.loop == Loop.GRAPH,
                fused_step=self.fused_step,
            )
        return self._fast_epoch

    def fit(self, on_epoch: EpochCallback | None = None, epochs: int | None = None) -> None:
        """Train for `epochs` (default: the config's), timing each epoch with a sync."""
        for _ in range(self.config.epochs if epochs is None else epochs):
            self.run_epoch(on_epoch)

    def run_epoch(self, on_epoch: EpochCallback | None = None) -> float:
        """Train one epoch between two device synchronizations and return its seconds on
        `clock`; a caller that times the call itself (pytest-benchmark) brackets the same work."""
        self.model.train()
        with precision_mode(self.config.precision):
            synchronize(self.device)
            start = self.clock()
            loss = self._epoch()
            synchronize(self.device)
            seconds = self.clock() - start
        if self.fused_step is not None:
            self.fused_step.check()
        self.epoch_seconds.append(seconds)
        self.losses.append(loss)
        if on_epoch is not None:
            on_epoch(len(self.epoch_seconds) - 1, seconds, loss)
        return seconds

    def _reference_epoch(self) -> float:
        loader = DataLoader(
            TensorDataset(self.data.x_train, self.data.y_train),
            batch_size=self.config.batch_size,
            shuffle=True,
            generator=self.generator,
        )
        total, count = 0.0, 0
        for x, y in loader:
            self.optimizer.zero_grad()
            with autocast(self.config.precision, self.device):
                loss = self.loss_fn(self.model(x), y)
            loss.backward()
            self.optimizer.step()
            total += loss.item() * len(y)
            count += len(y)
        return total / count

    def _fast_epoch(self) -> float:
        x_all, y_all = self.data.x_train, self.data.y_train

        def step_on(index: torch.Tensor) -> torch.Tensor:
            if self.fused_step is not None:
                total = torch.zeros((), device=self.device)
                self.fused_step(index, total)
                return total
            return self.step(x_all[index], y_all[index]) * len(index)

        total = shuffled_epoch_total(len(y_all), self.config.batch_size, self.device, self.generator, step_on)
        return float(total) / len(y_all)  # the epoch's one host read

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One optimizer step; returns the batch's mean loss as a device tensor."""
        return self._step(x, y)

    def _eager_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)  # FlatOptimizer zeroes its flat gradient instead
        with autocast(self.config.precision, self.device):
            loss = self.loss_fn(self.model(x), y)
        loss.backward()
        self.optimizer.step()
        return loss.detach().float()

    def evaluate(self) -> dict[str, object]:
        predictions = predict(self.model, self.data.x_test, self.config.precision)
        return classification_report(self.data.y_test, predictions, self.data.n_classes)

    def release(self) -> None:
        """Drop the model, optimizer state and graphs so the next run starts from free memory."""
        self._epoch = self._fast_epoch
        self.optimizer.state.clear()
        self.optimizer.param_groups.clear()  # a FlatOptimizer's flat buffer is its parameter
        self.model = self.model.to("meta")

    def result(self) -> TrainResult:
        metrics = self.evaluate()
        return TrainResult(
            config=self.config,
            epoch_seconds=list(self.epoch_seconds),
            losses=list(self.losses),
            accuracy=metrics["accuracy"],  # type: ignore[arg-type]
            macro_f1=metrics["macro_f1"],  # type: ignore[arg-type]
            weighted_f1=metrics["weighted_f1"],  # type: ignore[arg-type]
            confusion=metrics["confusion"],  # type: ignore[arg-type]
            optimizer_impl=self.optimizer_impl,
            loop=self.loop,
            notes=list(self.notes),
            step_route=self.step_route,
        )


def train(config: TrainConfig, data: Dataset, on_epoch: EpochCallback | None = None) -> TrainResult:
    """Build, fit and evaluate `config` on `data`."""
    trainer = Trainer(config, data)
    trainer.fit(on_epoch)
    return trainer.result()
