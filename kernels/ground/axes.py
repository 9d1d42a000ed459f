"""The axes a run is measured along, one definition each: implementation, optimizer
implementation, precision, training loop, hidden activation, and the served variants.

Stdlib only, so that bench/gate reads the same values without torch. Each axis is a
str-valued Enum: a member equals its value (``Impl.TRITON == "triton"``), so options,
configs and stored records keep plain strings while code compares against members.
"""

from __future__ import annotations

from enum import Enum


class Impl(str, Enum):
    """How the layers run: eager torch, torch.compile of the step, or the Triton kernels."""

    TORCH = "torch"
    TRITON = "triton"
    COMPILE = "compile"


class OptimizerImpl(str, Enum):
    """How the optimizer step and the loss run."""

    TORCH = "torch"
    TRITON = "triton"
    COMPILE = "compile"


class Precision(str, Enum):
    """The matmul precision: strict IEEE fp32 (TF32 off), TF32, or bf16 autocast."""

    FP32 = "fp32"
    TF32 = "tf32"
    BF16 = "bf16"


class Loop(str, Enum):
    """The training loop."""

    REFERENCE = "reference"
    FAST = "fast"
    GRAPH = "graph"
    STEP_GRAPH = "step-graph"


class Activation(str, Enum):
    """The hidden layers' activation, in the study's order (the head has none)."""

    RELU = "relu"
    LEAKY_RELU = "leaky_relu"
    TANH = "tanh"
    SIGMOID = "sigmoid"
    SILU = "silu"


def values(axis: type[Enum]) -> tuple[str, ...]:
    """An axis's values in declaration order, as the strings options and records hold."""
    return tuple(member.value for member in axis)


IMPLS = values(Impl)
OPTIMIZER_IMPLS = values(OptimizerImpl)
PRECISIONS = values(Precision)
LOOPS = values(Loop)
ACTIVATIONS = values(Activation)
# Serving lists its implementations from the baseline out: eager, compiled, then the kernels.
SERVING_IMPLS = (Impl.TORCH.value, Impl.COMPILE.value, Impl.TRITON.value)
# The compression presets the serving benchmark parametrizes, in its order (model/compress.py
# gives each its Compression).
VARIANT_NAMES = ("fp32", "bf16", "fp8", "int8-weight", "int8-dynamic", "sparse-2:4", "prune-50", "prune-75",
                 "prune-90")
