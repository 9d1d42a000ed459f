"""Analytic cost of training one configuration: parameters, FLOPs, bytes.

Forward FLOPs are 2 * IN * OUT per Linear layer (one multiply-add each); a training
step is counted as 3x forward (the forward GEMM plus the input- and weight-gradient
GEMMs), the usual convention, so TFLOP/s figures compare with other tools. Element-
wise work (bias, activation, loss, optimizer) is left out: it is memory-bound and
small next to the GEMMs at these widths.
"""

from __future__ import annotations

from dataclasses import asdict
from dataclasses import dataclass

from model.config import TrainConfig

# Optimizer state tensors kept per parameter by the study's settings.
OPTIMIZER_STATE_SLOTS = {"adam": 2, "sgd": 1, "adagrad": 1, "rmsprop": 1}
BYTES = {"fp32": 4, "tf32": 4, "bf16": 2}


@dataclass(frozen=True)
class Cost:
    parameters: int
    macs_per_sample: int  # forward multiply-adds
    train_flops_per_sample: int
    train_flops_per_epoch: int
    weight_bytes: int
    gradient_bytes: int
    optimizer_state_bytes: int
    activation_bytes_per_batch: int  # saved for backward, estimate

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def tflops(self, seconds_per_epoch: float) -> float:
        return self.train_flops_per_epoch / seconds_per_epoch / 1e12

    def roofline_seconds_per_epoch(self, peak_tflops: float) -> float:
        return self.train_flops_per_epoch / (peak_tflops * 1e12)


def layer_shapes(config: TrainConfig, in_features: int = 75, classes: int = 10) -> list[tuple[int, int]]:
    sizes = [in_features] + [config.width] * config.depth + [classes]
    return list(zip(sizes[:-1], sizes[1:]))


def training_cost(config: TrainConfig, n_train: int, in_features: int = 75, classes: int = 10) -> Cost:
    shapes = layer_shapes(config, in_features, classes)
    parameters = sum(i * o + o for i, o in shapes)
    macs = sum(i * o for i, o in shapes)
    train_flops = 3 * 2 * macs
    # Parameters stay fp32 under autocast; activations take the compute dtype.
    act_bytes = BYTES[config.precision]
    # Each layer saves its input and its activation output for backward.
    saved = in_features + 2 * config.width * config.depth + 2 * classes
    return Cost(
        parameters=parameters,
        macs_per_sample=macs,
        train_flops_per_sample=train_flops,
        train_flops_per_epoch=train_flops * n_train,
        weight_bytes=4 * parameters,
        gradient_bytes=4 * parameters,
        optimizer_state_bytes=4 * parameters * OPTIMIZER_STATE_SLOTS[config.optimizer],
        activation_bytes_per_batch=act_bytes * saved * config.batch_size,
    )
