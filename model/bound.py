"""Which floor a training step sits nearest: compute, memory or launch.

A step cannot run faster than the largest of three floors: its FLOPs at the card's
measured matmul ceiling, the bytes it must move at the card's measured copy bandwidth,
and its kernel count times the per-kernel gap of a captured graph. The floor nearest
the measured step is the largest; its ratio to the step says how much a rewrite that
keeps the kernel count could still win, and when the launch floor leads, that only
fewer kernels can.

Pure arithmetic on the cost model and measured figures; the measuring is the caller's.
"""

from __future__ import annotations

from dataclasses import asdict
from dataclasses import dataclass

from model.config import TrainConfig
from model.cost import Cost

FLOORS = ("compute", "memory", "launch")
LABEL_BYTES = 8  # int64 class labels


@dataclass(frozen=True)
class Ceilings:
    """A card's (or a CPU's) measured rates; see bench/monitor/ceiling.py."""

    matmul_tflops: float  # in the run's precision
    copy_gb_per_s: float  # bytes read plus bytes written, per second, / 1e9
    kernel_gap_us: float  # per kernel in a replayed CUDA graph (per op of an eager loop on a CPU)

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class Bound:
    """One step's measured cost beside its three floors, in microseconds."""

    kernels_per_step: float
    device_us_per_step: float  # kernel time per step (self CPU time of the ops on a CPU)
    step_us: float  # the steady epoch's wall time per step
    compute_us: float
    memory_us: float
    launch_us: float

    @property
    def nearest(self) -> str:
        """The floor the step is nearest: the largest of the three."""
        floors = dict(zip(FLOORS, (self.compute_us, self.memory_us, self.launch_us)))
        return max(FLOORS, key=lambda name: floors[name])

    @property
    def floor_us(self) -> float:
        return max(self.compute_us, self.memory_us, self.launch_us)

    @property
    def floor_fraction(self) -> float:
        """The nearest floor over the measured step: 1.0 would be at the floor."""
        return self.floor_us / self.step_us

    def as_dict(self) -> dict[str, float | str]:
        return {**asdict(self), "nearest": self.nearest, "floor_fraction": self.floor_fraction}


def step_bytes(cost: Cost, batch: int, in_features: int) -> int:
    """Bytes one step must move through device memory: parameters, gradients and optimizer
    state each read once and written once, and the batch's features and labels read once.

    Activations are left out: a step that keeps them on chip moves none."""
    parameter_sized = cost.weight_bytes + cost.gradient_bytes + cost.optimizer_state_bytes
    return 2 * parameter_sized + batch * (4 * in_features + LABEL_BYTES)


def steps_per_epoch(n_train: int, batch: int) -> int:
    """Optimizer steps in one epoch, the last partial batch included."""
    return -(-n_train // batch)


def step_bound(
    cost: Cost,
    config: TrainConfig,
    n_train: int,
    in_features: int,
    kernels_per_epoch: float,
    device_us_per_epoch: float,
    epoch_seconds: float,
    ceilings: Ceilings,
) -> Bound:
    """The bound of `config`'s step from its cost, a profiled epoch's kernel calls and
    kernel time, the steady epoch time and the measured `ceilings`; ValueError on a
    non-positive epoch time or ceiling."""
    for name, value in (("epoch_seconds", epoch_seconds), *ceilings.as_dict().items()):
        if not value > 0:
            raise ValueError(f"step_bound: {name}={value!r}: expected a positive number")
    batch = min(config.batch_size, n_train)
    steps = steps_per_epoch(n_train, batch)
    flops_per_step = cost.train_flops_per_epoch / steps
    return Bound(
        kernels_per_step=kernels_per_epoch / steps,
        device_us_per_step=device_us_per_epoch / steps,
        step_us=epoch_seconds * 1e6 / steps,
        compute_us=flops_per_step / (ceilings.matmul_tflops * 1e12) * 1e6,
        memory_us=step_bytes(cost, batch, in_features) / (ceilings.copy_gb_per_s * 1e9) * 1e6,
        launch_us=kernels_per_epoch / steps * ceilings.kernel_gap_us,
    )
