"""Compression of a trained MLP for serving: lower-precision weights, pruning, 2:4 sparsity.

A `Compression` is a frozen description (what to do); `compress` applies it to a copy
of a trained model and returns a `Served` module: fp32 features in, fp32 logits out,
whatever runs inside, so every variant is timed and scored on the same inputs.

Why these libraries: torchao does int8 (weight-only and dynamic activations) and fp8
the way PyTorch's own serving stacks do; `torch.nn.utils.prune` does magnitude
pruning with masks that survive a fine-tune; `torch.sparse.to_sparse_semi_structured`
runs the 2:4 kernels PyTorch ships (cuSPARSELt or CUTLASS). What cannot run on this
machine (fp8 below sm_89, 2:4 without CUDA sm_80+, torchao missing) raises
`Unsupported` with the reason, so a benchmark can skip the case and say why.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.utils import prune

from kernels.ground.axes import VARIANT_NAMES
from model.config import TrainConfig
from model.data import Dataset
from model.train import Trainer
from model.train import make_optimizer

WEIGHTS = ("fp32", "bf16", "fp8", "int8-weight", "int8-dynamic")
# Lower-precision variants run on a bf16 model (torchao's recommended base): the
# activations they do not quantize are bf16.
BASE_DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp8": torch.bfloat16,
              "int8-weight": torch.bfloat16, "int8-dynamic": torch.bfloat16}
FINETUNE_EPOCHS = 4  # the presets' short fine-tune after pruning
FP8_CAPABILITY = (8, 9)  # Ada and Hopper have fp8 tensor cores
SEMI_STRUCTURED_CAPABILITY = (8, 0)  # Ampere and newer have 2:4 sparse tensor cores
SEMI_STRUCTURED_MULTIPLE = 64  # rows and columns a layer needs for every 2:4 backend and dtype
QUANTIZED_MULTIPLE = 16  # fp8 and int8-dynamic layers: both dimensions a multiple of this


class Unsupported(Exception):
    """A variant that cannot run here; the message says why (for a skipped case)."""


@dataclass(frozen=True)
class Compression:
    """What to do to a trained model before serving it."""

    weights: str = "fp32"  # fp32 | bf16 | fp8 | int8-weight | int8-dynamic
    sparsity: float = 0.0  # unstructured magnitude pruning: fraction of each layer's weights zeroed, in [0, 1)
    semi_structured: bool = False  # 2:4: two of every four consecutive weights of a row zeroed
    finetune_epochs: int = 0  # training epochs after pruning, with the pruned weights held at zero

    def __post_init__(self) -> None:
        if self.weights not in WEIGHTS:
            raise ValueError(f"Compression.weights={self.weights!r}: expected one of {', '.join(WEIGHTS)}")
        if isinstance(self.sparsity, bool) or not isinstance(self.sparsity, (int, float)):
            raise ValueError(f"Compression.sparsity={self.sparsity!r}: expected a number in [0, 1)")
        if not 0.0 <= self.sparsity < 1.0:
            raise ValueError(f"Compression.sparsity={self.sparsity!r}: expected a fraction in [0, 1)")
        if not isinstance(self.semi_structured, bool):
            raise ValueError(f"Compression.semi_structured={self.semi_structured!r}: expected True or False")
        if (isinstance(self.finetune_epochs, bool) or not isinstance(self.finetune_epochs, int)
                or self.finetune_epochs < 0):
            raise ValueError(f"Compression.finetune_epochs={self.finetune_epochs!r}: expected an integer >= 0")
        if self.semi_structured and self.sparsity:
            raise ValueError(
                f"Compression.semi_structured=True with sparsity={self.sparsity!r}: 2:4 is its own 50% "
                "pattern; use one or the other"
            )
        if self.semi_structured and self.weights not in ("fp32", "bf16"):
            raise ValueError(
                f"Compression.semi_structured=True with weights={self.weights!r}: 2:4 here combines with "
                "fp32 or bf16 weights only"
            )

    @property
    def sparse(self) -> bool:
        return self.semi_structured or self.sparsity > 0

    @property
    def name(self) -> str:
        """A short label: 'fp32', 'bf16', 'prune-75+ft', '2:4+bf16', '2:4+ft+bf16'."""
        parts = []
        if self.semi_structured:
            parts.append("2:4")
        elif self.sparsity:
            parts.append(f"prune-{100 * self.sparsity:g}")
        if self.finetune_epochs:
            parts.append("ft")
        if self.weights != "fp32" or not parts:
            parts.append(self.weights)
        return "+".join(parts)

    def as_dict(self) -> dict[str, object]:
        return {"weights": self.weights, "sparsity": self.sparsity, "semi_structured": self.semi_structured,
                "finetune_epochs": self.finetune_epochs, "name": self.name}


# The presets the benchmark parametrizes, in the order it lists them.
VARIANTS: dict[str, Compression] = {
    "fp32": Compression(),
    "bf16": Compression(weights="bf16"),
    "fp8": Compression(weights="fp8"),
    "int8-weight": Compression(weights="int8-weight"),
    "int8-dynamic": Compression(weights="int8-dynamic"),
    # 2:4 kernels take half-precision weights (cuSPARSELt has no fp32), hence bf16
    "sparse-2:4": Compression(weights="bf16", semi_structured=True, finetune_epochs=FINETUNE_EPOCHS),
    "prune-50": Compression(sparsity=0.5, finetune_epochs=FINETUNE_EPOCHS),
    "prune-75": Compression(sparsity=0.75, finetune_epochs=FINETUNE_EPOCHS),
    "prune-90": Compression(sparsity=0.9, finetune_epochs=FINETUNE_EPOCHS),
}
assert tuple(VARIANTS) == VARIANT_NAMES, "kernels/ground/axes.py VARIANT_NAMES lists the presets in this order"


class Served(nn.Module):
    """A compressed network as served: fp32 features in, fp32 logits out.

    `dtype` is what the inner network computes in; `notes` say what was done to
    which layer (kept beside the measurement)."""

    def __init__(self, network: nn.Module, dtype: torch.dtype, compression: Compression, notes: list[str]) -> None:
        super().__init__()
        self.network = network
        self.dtype = dtype
        self.compression = compression
        self.notes = list(notes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.network(x.to(self.dtype)).float()


# ------------------------------------------------------------------ availability


def unsupported_reason(compression: Compression, device: torch.device) -> str | None:
    """Why `compression` cannot run on `device` here, or None when it can."""
    if compression.weights in ("fp8", "int8-weight", "int8-dynamic"):
        try:
            import torchao  # noqa: F401
        except Exception as exc:  # ImportError, or a torchao built for another torch
            return f"{compression.weights} needs torchao (pip install torchao): {exc}"
    if compression.weights == "fp8":
        if device.type != "cuda":
            return f"fp8 needs a CUDA GPU with fp8 tensor cores (sm_89+); device is {device.type}"
        capability = torch.cuda.get_device_capability(device)
        if capability < FP8_CAPABILITY:
            return f"fp8 needs sm_89+ (Ada, Hopper); this GPU is sm_{capability[0]}{capability[1]}"
    if compression.semi_structured:
        if device.type != "cuda":
            return f"2:4 sparse kernels need a CUDA GPU (sm_80+); device is {device.type}"
        capability = torch.cuda.get_device_capability(device)
        if capability < SEMI_STRUCTURED_CAPABILITY:
            return f"2:4 sparse kernels need sm_80+ (Ampere or newer); this GPU is sm_{capability[0]}{capability[1]}"
    return None


# ------------------------------------------------------------------ the steps


def compress(model: nn.Module, compression: Compression, data: Dataset, config: TrainConfig) -> nn.Module:
    """A compressed copy of `model` (never changed), fine-tuned on `data` where asked.

    Order: prune (unstructured or 2:4) -> fine-tune with the masks held -> make the
    zeros permanent -> cast to the base dtype -> 2:4 or torchao quantization.
    Raises `Unsupported` with the reason where the variant cannot run on `data`'s device."""
    if not isinstance(compression, Compression):
        raise TypeError(f"compress: compression must be a Compression, not {type(compression).__name__}")
    reason = unsupported_reason(compression, data.device)
    if reason is not None:
        raise Unsupported(reason)
    network = copy.deepcopy(_network(model)).to(data.device)
    notes: list[str] = []
    masks = _prune(network, compression, notes)
    if masks and compression.finetune_epochs:
        network = _finetune(network, masks, data, config, compression.finetune_epochs, notes)
    for module in masks:
        prune.remove(module, "weight")  # the masked weights become plain tensors with zeros
    dtype = BASE_DTYPE[compression.weights]
    network = network.to(dtype).eval()
    network.requires_grad_(False)
    if compression.semi_structured:
        _to_semi_structured(network, notes)
    if compression.weights in ("fp8", "int8-weight", "int8-dynamic"):
        _quantize(network, compression.weights, notes)
    return Served(network, dtype, compression, notes)


def _network(model: nn.Module) -> nn.Module:
    """The inner network of an already `Served` model (compressing twice starts from its copy)."""
    return model.network if isinstance(model, Served) else model


def linear_layers(network: nn.Module) -> list[tuple[str, nn.Linear]]:
    return [(name, m) for name, m in network.named_modules() if isinstance(m, nn.Linear)]


def semi_structured_fits(layer: nn.Linear) -> bool:
    """Whether a layer's weight has a shape every 2:4 backend takes (the 75-feature input
    layer and the 10-class head do not; they stay dense)."""
    rows, cols = layer.weight.shape
    return rows % SEMI_STRUCTURED_MULTIPLE == 0 and cols % SEMI_STRUCTURED_MULTIPLE == 0


def two_four_mask(weight: torch.Tensor) -> torch.Tensor:
    """The 2:4 mask of largest magnitude: in each run of four consecutive weights of a
    row, the two largest |w| are kept (ties to the first). Columns must be a multiple of 4."""
    rows, cols = weight.shape
    if cols % 4:
        raise ValueError(f"two_four_mask: {cols} columns is not a multiple of 4")
    groups = weight.detach().abs().reshape(rows, cols // 4, 4)
    keep = groups.topk(2, dim=-1, sorted=False).indices
    mask = torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, keep, True)
    return mask.reshape(rows, cols)


def _prune(network: nn.Module, compression: Compression, notes: list[str]) -> list[nn.Module]:
    """Attach pruning masks (torch.nn.utils.prune reparametrization); returns the pruned layers."""
    pruned: list[nn.Module] = []
    if compression.semi_structured:
        for name, layer in linear_layers(network):
            if semi_structured_fits(layer):
                prune.custom_from_mask(layer, "weight", two_four_mask(layer.weight))
                pruned.append(layer)
            else:
                notes.append(f"{name}: {tuple(layer.weight.shape)} does not fit 2:4 kernels, kept dense")
    elif compression.sparsity:
        for _, layer in linear_layers(network):
            # exactly round(sparsity x weights) of the smallest |w| of each layer; biases kept
            prune.l1_unstructured(layer, "weight", amount=float(compression.sparsity))
            pruned.append(layer)
        notes.append(f"every layer's weights {100 * compression.sparsity:g}% pruned by magnitude (biases kept)")
    return pruned


def _finetune(
    network: nn.Module, masks: list[nn.Module], data: Dataset, config: TrainConfig, epochs: int, notes: list[str]
) -> nn.Module:
    """A short fine-tune with the masks held: model.train.Trainer's fast loop (the study's
    optimizer and settings, fresh optimizer state) on the pruned weights. The masked
    weights' parameters are the trainer's; the forward hooks multiply in the masks."""
    tune = config.replace(epochs=epochs, loop="fast", impl="torch", optimizer_impl="torch", precision="fp32")
    trainer = Trainer(tune, data)
    trainer.model = network
    trainer.optimizer, _ = make_optimizer(tune.optimizer, list(network.parameters()), fast=True)
    trainer.fit()
    notes.append(f"fine-tuned {epochs} epoch(s) with the masks held (final loss {trainer.losses[-1]:.4f})")
    network.eval()
    return network


def _to_semi_structured(network: nn.Module, notes: list[str]) -> None:
    """Swap each fitting layer's (already 2:4-pruned) weight for PyTorch's compressed 2:4 tensor."""
    from torch.sparse import to_sparse_semi_structured

    for name, layer in linear_layers(network):
        if not semi_structured_fits(layer):
            continue
        try:
            layer.weight = nn.Parameter(to_sparse_semi_structured(layer.weight.detach()), requires_grad=False)
        except (RuntimeError, ValueError) as exc:
            raise Unsupported(f"2:4 kernels refused {name} {tuple(layer.weight.shape)}: {exc}") from None
        notes.append(f"{name}: 2:4 semi-structured ({type(layer.weight.data).__name__})")


def _quantize(network: nn.Module, weights: str, notes: list[str]) -> None:
    """torchao's quantize_ on the layers whose shapes its kernels take."""
    from torchao.quantization import quantize_

    if weights == "int8-weight":
        from torchao.quantization import Int8WeightOnlyConfig

        config: object = Int8WeightOnlyConfig()
    elif weights == "int8-dynamic":
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig

        config = Int8DynamicActivationInt8WeightConfig()
    else:
        from torchao.quantization import Float8DynamicActivationFloat8WeightConfig
        from torchao.quantization import PerRow

        config = Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())
    fits = {id(layer) for name, layer in linear_layers(network) if _quantizable(layer, weights)}
    for name, layer in linear_layers(network):
        if id(layer) not in fits:
            notes.append(f"{name}: {tuple(layer.weight.shape)} kept bf16 ({weights} kernels need dimensions "
                         f"that are multiples of {QUANTIZED_MULTIPLE})")
    try:
        quantize_(network, config, filter_fn=lambda module, _fqn: id(module) in fits)
    except (RuntimeError, NotImplementedError, AssertionError, ValueError) as exc:
        raise Unsupported(f"torchao could not quantize to {weights}: {exc}") from None
    notes.append(f"{weights} through torchao ({type(config).__name__}) on {len(fits)} layer(s)")


def _quantizable(layer: nn.Linear, weights: str) -> bool:
    if weights == "int8-weight":
        return True
    rows, cols = layer.weight.shape
    return rows % QUANTIZED_MULTIPLE == 0 and cols % QUANTIZED_MULTIPLE == 0
