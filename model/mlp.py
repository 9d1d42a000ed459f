"""The study's network: `depth` blocks of Linear then activation, then a Linear head."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.ground.axes import Impl
from kernels.ground.axes import ACTIVATIONS
from model.config import IMPLS

LEAKY_SLOPE = 0.01  # torch's default, and the kernel's

_TORCH_ACTIVATIONS = {
    "relu": F.relu,
    "leaky_relu": lambda x: F.leaky_relu(x, LEAKY_SLOPE),
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "silu": F.silu,
}


class MLP(nn.Module):
    """(B, 75) -> depth x [Linear(width) -> act] -> Linear(classes) -> (B, classes) logits.

    ``impl`` picks how each layer runs, never what it computes: 'torch' is nn.Linear
    plus the activation, 'triton' is our fused linear+bias+activation op with the
    same parameters ('compile' runs the torch layers; the trainer compiles its step).
    All initialise identically for a given torch seed.
    """

    def __init__(
        self,
        in_features: int = 75,
        width: int = 512,
        depth: int = 3,
        classes: int = 10,
        activation: str = "leaky_relu",
        impl: str = "torch",
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation {activation!r}: expected one of {', '.join(ACTIVATIONS)}")
        if impl not in IMPLS:
            raise ValueError(f"impl {impl!r}: expected one of {', '.join(IMPLS)}")
        sizes = [in_features] + [width] * depth
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))
        self.head = nn.Linear(width, classes)
        self.activation = activation
        self.impl = impl
        if impl == Impl.TRITON:  # registers the ops now, not inside the first (timed apart) forward
            import kernels.ops.linear_act  # noqa: F401  (lazily: kernels/ needs triton)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.impl == Impl.TRITON:
            from kernels.ops.linear_act import linear_act_stack  # imported lazily: kernels/ needs triton

            layers = [*self.hidden, self.head]
            activations = [self.activation] * len(self.hidden) + ["identity"]
            return linear_act_stack(x, [m.weight for m in layers], [m.bias for m in layers], activations)
        act = _TORCH_ACTIVATIONS[self.activation]
        for layer in self.hidden:
            x = act(layer(x))
        return self.head(x)
