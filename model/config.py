"""One training configuration: the study's five hyperparameters plus our own axes.

A `TrainConfig` is frozen and hashable so it can key caches and name pytest cases;
`TrainConfig.OPTIMAL` is the study's optimal configuration, the centre every
experiment varies one axis around.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kernels.ground.axes import ACTIVATIONS
from kernels.ground.axes import IMPLS
from kernels.ground.axes import LOOPS
from kernels.ground.axes import OPTIMIZER_IMPLS
from kernels.ground.axes import PRECISIONS

OPTIMIZERS = ("adagrad", "rmsprop", "sgd", "adam")


@dataclass(frozen=True)
class TrainConfig:
    depth: int = 3  # hidden blocks, each Linear then activation
    width: int = 512  # hidden units per block
    batch_size: int = 512
    activation: str = "leaky_relu"
    optimizer: str = "adam"
    epochs: int = 400  # the study's schedule
    # 'triton': every Linear through kernels/ops/linear_act.py; 'compile': torch.compile of the step
    impl: str = "torch"
    precision: str = "fp32"  # fp32 is strict IEEE (TF32 off)
    loop: str = "fast"
    seed: int = 42  # split, torch, numpy and random
    # 'triton': the parameters live in one flat buffer updated by one kernel per step
    # (kernels/ops/optim.py), and the loss and its gradient come from one kernel
    # (kernels/ops/cross_entropy.py); 'torch': torch.optim and F.cross_entropy
    optimizer_impl: str = "torch"

    def __post_init__(self) -> None:
        for name, allowed in (
            ("activation", ACTIVATIONS),
            ("optimizer", OPTIMIZERS),
            ("impl", IMPLS),
            ("precision", PRECISIONS),
            ("loop", LOOPS),
            ("optimizer_impl", OPTIMIZER_IMPLS),
        ):
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"TrainConfig.{name}={value!r}: expected one of {', '.join(allowed)}")
        for name in ("depth", "width", "batch_size", "epochs"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"TrainConfig.{name}={value!r}: expected a positive integer")

    def replace(self, **changes: object) -> TrainConfig:
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


TrainConfig.OPTIMAL = TrainConfig()  # type: ignore[attr-defined]
