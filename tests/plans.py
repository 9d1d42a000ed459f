"""Launch plans on CPU, for the tests of the tuning cache, the launch policy, tuning and
the op's eager path: one small layer (the interpreter is slow), a training step through
the op, and what the launch report says of it."""

from __future__ import annotations

import torch

from kernels.ops import linear_act as op
from kernels.ops.linear_act import linear_act
from kernels.plan import launch_plan
from kernels.plan import launches

M, N, K = 40, 24, 32  # one small layer: the interpreter is slow
CONFIG = {"block_r": 16, "block_c": 32, "block_red": 16, "num_warps": 4, "num_stages": 3}


def layer(m=M, n=N, k=K, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g), torch.randn(n, k, generator=g) / k**0.5, torch.randn(n, generator=g)


def train_step(x, w, b, activation="leaky_relu"):
    """Forward and backward through the op (every kernel: fwd, dw, dx)."""
    x, w, b = (t.clone().requires_grad_() for t in (x, w, b))
    y = linear_act(x, w, b, activation)
    y.sum().backward()
    return [y.detach(), x.grad, w.grad, b.grad]


def sources() -> dict[str, str]:
    return {e["kernel"]: e["source"] for e in launches.launch_report()}


def refuse(*args, **kwargs):
    raise AssertionError("nothing should be tuned here")


def key(kernel, rows, cols, red, act_class="pointwise", dtype=torch.float32):
    """The shape class at the current float32 precision."""
    return launch_plan.shape_key(kernel, rows, cols, red, dtype, launch_plan.precision_for(dtype), act_class)


def launched_kernels(monkeypatch) -> list[str]:
    """The names of the kernels the eager path launches from here on."""
    names: list[str] = []
    real = op._launch_direct

    def spy(fn, grid, *args, **kwargs):
        names.append(getattr(getattr(fn, "fn", fn), "__name__", str(fn)))
        return real(fn, grid, *args, **kwargs)

    monkeypatch.setattr(op, "_launch_direct", spy)
    return names
