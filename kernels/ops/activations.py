"""The activations and their slopes as Triton device functions, shared by every kernel.

`activation(z, ACTIVATION, slope)` is act(z) and `activation_grad(dy, saved, ACTIVATION,
slope, one)` is dZ = dY * act'(.) from the saved output (the saved pre-activation for
silu), both in fp32. ACTIVATION is the code of `kernels.plan.launch_plan.ACTIVATION_CODES`
(0 identity, 1 relu, 2 leaky_relu, 3 tanh, 4 sigmoid, 5 silu); `slope` is leaky_relu's,
LEAKY_SLOPE unless a caller says otherwise. Both the layer kernels (linear_act.py) and
the whole-forward kernel (mlp_forward.py) import them from here, so neither imports
the other.
"""

from __future__ import annotations

import triton
import triton.language as tl

LEAKY_SLOPE = 0.01  # torch's default


@triton.jit
def activation(z, ACTIVATION: tl.constexpr, slope):
    """act(z) for the activation code ACTIVATION; identity for an unknown code."""
    if ACTIVATION == 1:
        return tl.maximum(z, 0.0)
    elif ACTIVATION == 2:
        return tl.where(z > 0, z, z * slope)
    elif ACTIVATION == 3:
        return 2.0 * tl.sigmoid(2.0 * z) - 1.0  # tanh
    elif ACTIVATION == 4:
        return tl.sigmoid(z)
    elif ACTIVATION == 5:
        return z * tl.sigmoid(z)
    else:
        return z


@triton.jit
def activation_grad(dy, saved, ACTIVATION: tl.constexpr, slope, one):
    """dZ from dY and the saved output (or pre-activation, for silu), in fp32.

    `one` is 1.0 passed at run time, not a literal: where dZ feeds both a GEMM and the
    bias sum (the weight-gradient kernel), a formula of dY, the saved tile and literals
    alone lets Triton recompute dZ from a second read of both tiles instead of converting
    its layout; a kernel argument in it (the slope, or `one`) keeps it computed once
    (docs/kernels.md, "The activation slope")."""
    if ACTIVATION == 1:
        return tl.where(saved > 0, dy, 0.0 * one)
    elif ACTIVATION == 2:
        return tl.where(saved > 0, dy, dy * slope)
    elif ACTIVATION == 3:
        return dy * (one - saved * saved)
    elif ACTIVATION == 4:
        return dy * saved * (one - saved)
    elif ACTIVATION == 5:
        s = tl.sigmoid(saved)
        return dy * s * (one + saved * (one - s))
    else:
        return dy
