"""One-launch optimizer steps over a flat parameter buffer: Adam, SGD, Adagrad, RMSprop.

`FlatOptimizer` copies its parameters into one contiguous fp32 buffer, points each
Parameter's ``.data`` at its slice and each ``.grad`` at the matching slice of one flat
gradient buffer (backward accumulates in place; gradients are never set to None). A
step is one elementwise kernel over the buffer, torch.optim's for-loop math for the
options in DEFAULTS (Adam with L2 decay, not AdamW; SGD momentum without Nesterov;
Adagrad; RMSprop, not centered). Step counts live on the device, one per program, so a
step needs no host read and can be captured in a CUDA graph. Hyperparameters are
compile-time constants: changing one compiles a new variant.
Design notes and measurements: docs/kernels.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import triton
import triton.language as tl

from kernels.plan.launch_plan import cdiv

BLOCK = 2048  # elements per program: 278 programs for the 569k-parameter optimal MLP
NUM_WARPS = 4
ALIGN = 32  # each parameter's slice starts on a 128-byte boundary; the gaps stay zero

# The options each kernel implements, with torch.optim's defaults.
DEFAULTS: dict[str, dict[str, object]] = {
    "adam": {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0},
    "sgd": {"lr": 1e-3, "momentum": 0.0, "weight_decay": 0.0},
    "adagrad": {"lr": 1e-2, "lr_decay": 0.0, "weight_decay": 0.0, "eps": 1e-10},
    "rmsprop": {"lr": 1e-2, "alpha": 0.99, "eps": 1e-8, "weight_decay": 0.0},
}
STATE = {  # torch.optim's names for the per-element state
    "adam": ("exp_avg", "exp_avg_sq"),
    "sgd": ("momentum_buffer",),
    "adagrad": ("sum",),
    "rmsprop": ("square_avg",),
}


# ----------------------------------------------------------------------- kernels


@triton.jit
def _block(n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    return offs, offs < n


@triton.jit
def _next_step(step_ptr):
    """This program's step count, advanced by one and stored back, as fp64."""
    pid = tl.program_id(0)
    step = tl.load(step_ptr + pid) + 1.0
    tl.store(step_ptr + pid, step)
    return step.to(tl.float64)


@triton.jit
def adam_update(
    p, g, m, v, step, LR: tl.constexpr, BETA1: tl.constexpr, BETA2: tl.constexpr, LOG2_BETA1: tl.constexpr,
    LOG2_BETA2: tl.constexpr, EPS: tl.constexpr, WEIGHT_DECAY: tl.constexpr,
):
    """Adam at fp64 step count `step` (already advanced): the new (param, exp_avg, exp_avg_sq)."""
    step_size = (LR / (1.0 - tl.exp2(step * LOG2_BETA1))).to(tl.float32)  # lr / (1 - beta1^step)
    bias2_sqrt = tl.sqrt(1.0 - tl.exp2(step * LOG2_BETA2)).to(tl.float32)
    g = g + WEIGHT_DECAY * p
    m = m + (1.0 - BETA1) * (g - m)  # exp_avg.lerp_(grad, 1 - beta1)
    v = v * BETA2 + (1.0 - BETA2) * (g * g)
    denom = tl.div_rn(tl.sqrt_rn(v), bias2_sqrt) + EPS
    return p - step_size * tl.div_rn(m, denom), m, v


@triton.jit
def sgd_update(p, g, buf, LR: tl.constexpr, MOMENTUM: tl.constexpr, WEIGHT_DECAY: tl.constexpr):
    """SGD with momentum: the new (param, momentum_buffer); a zero buffer takes the first gradient."""
    g = g + WEIGHT_DECAY * p
    buf = buf * MOMENTUM + g
    return p - LR * buf, buf


@triton.jit
def adagrad_update(
    p, g, s, step, LR: tl.constexpr, LR_DECAY: tl.constexpr, EPS: tl.constexpr, WEIGHT_DECAY: tl.constexpr,
):
    """Adagrad at fp64 step count `step` (already advanced): the new (param, sum)."""
    clr = (LR / (1.0 + (step - 1.0) * LR_DECAY)).to(tl.float32)
    g = g + WEIGHT_DECAY * p
    s = s + g * g
    return p - clr * tl.div_rn(g, tl.sqrt_rn(s) + EPS), s


@triton.jit
def rmsprop_update(p, g, sq, LR: tl.constexpr, ALPHA: tl.constexpr, EPS: tl.constexpr, WEIGHT_DECAY: tl.constexpr):
    """RMSprop, not centered: the new (param, square_avg)."""
    g = g + WEIGHT_DECAY * p
    sq = sq * ALPHA + (1.0 - ALPHA) * (g * g)
    return p - LR * tl.div_rn(g, tl.sqrt_rn(sq) + EPS), sq


@triton.jit
def _adam_kernel(
    param_ptr, grad_ptr, exp_avg_ptr, exp_avg_sq_ptr, step_ptr, n,
    LR: tl.constexpr, BETA1: tl.constexpr, BETA2: tl.constexpr, LOG2_BETA1: tl.constexpr,
    LOG2_BETA2: tl.constexpr, EPS: tl.constexpr, WEIGHT_DECAY: tl.constexpr, BLOCK: tl.constexpr,
):
    offs, mask = _block(n, BLOCK)
    step = _next_step(step_ptr)
    p, m, v = adam_update(
        tl.load(param_ptr + offs, mask=mask), tl.load(grad_ptr + offs, mask=mask),
        tl.load(exp_avg_ptr + offs, mask=mask), tl.load(exp_avg_sq_ptr + offs, mask=mask), step,
        LR, BETA1, BETA2, LOG2_BETA1, LOG2_BETA2, EPS, WEIGHT_DECAY,
    )
    tl.store(param_ptr + offs, p, mask=mask)
    tl.store(exp_avg_ptr + offs, m, mask=mask)
    tl.store(exp_avg_sq_ptr + offs, v, mask=mask)


@triton.jit
def _sgd_kernel(
    param_ptr, grad_ptr, buf_ptr, step_ptr, n,
    LR: tl.constexpr, MOMENTUM: tl.constexpr, WEIGHT_DECAY: tl.constexpr, BLOCK: tl.constexpr,
):
    offs, mask = _block(n, BLOCK)
    _next_step(step_ptr)
    p, buf = sgd_update(
        tl.load(param_ptr + offs, mask=mask), tl.load(grad_ptr + offs, mask=mask),
        tl.load(buf_ptr + offs, mask=mask), LR, MOMENTUM, WEIGHT_DECAY,
    )
    tl.store(param_ptr + offs, p, mask=mask)
    tl.store(buf_ptr + offs, buf, mask=mask)


@triton.jit
def _adagrad_kernel(
    param_ptr, grad_ptr, sum_ptr, step_ptr, n,
    LR: tl.constexpr, LR_DECAY: tl.constexpr, EPS: tl.constexpr, WEIGHT_DECAY: tl.constexpr, BLOCK: tl.constexpr,
):
    offs, mask = _block(n, BLOCK)
    step = _next_step(step_ptr)
    p, s = adagrad_update(
        tl.load(param_ptr + offs, mask=mask), tl.load(grad_ptr + offs, mask=mask),
        tl.load(sum_ptr + offs, mask=mask), step, LR, LR_DECAY, EPS, WEIGHT_DECAY,
    )
    tl.store(param_ptr + offs, p, mask=mask)
    tl.store(sum_ptr + offs, s, mask=mask)


@triton.jit
def _rmsprop_kernel(
    param_ptr, grad_ptr, square_avg_ptr, step_ptr, n,
    LR: tl.constexpr, ALPHA: tl.constexpr, EPS: tl.constexpr, WEIGHT_DECAY: tl.constexpr, BLOCK: tl.constexpr,
):
    offs, mask = _block(n, BLOCK)
    _next_step(step_ptr)
    p, sq = rmsprop_update(
        tl.load(param_ptr + offs, mask=mask), tl.load(grad_ptr + offs, mask=mask),
        tl.load(square_avg_ptr + offs, mask=mask), LR, ALPHA, EPS, WEIGHT_DECAY,
    )
    tl.store(param_ptr + offs, p, mask=mask)
    tl.store(square_avg_ptr + offs, sq, mask=mask)


KERNELS = {"adam": _adam_kernel, "sgd": _sgd_kernel, "adagrad": _adagrad_kernel, "rmsprop": _rmsprop_kernel}


def constants(algorithm: str, group: dict[str, object]) -> dict[str, float]:
    """A param group's hyperparameters as the kernel's constants."""
    out = {"LR": float(group["lr"]), "WEIGHT_DECAY": float(group["weight_decay"])}  # type: ignore[arg-type]
    if algorithm == "adam":
        beta1, beta2 = group["betas"]  # type: ignore[misc]
        log2 = lambda beta: math.log2(beta) if beta > 0 else -math.inf  # noqa: E731
        out.update(BETA1=beta1, BETA2=beta2, LOG2_BETA1=log2(beta1), LOG2_BETA2=log2(beta2), EPS=group["eps"])
    elif algorithm == "sgd":
        out["MOMENTUM"] = group["momentum"]  # type: ignore[assignment]
    elif algorithm == "adagrad":
        out.update(LR_DECAY=group["lr_decay"], EPS=group["eps"])  # type: ignore[arg-type]
    else:
        out.update(ALPHA=group["alpha"], EPS=group["eps"])  # type: ignore[arg-type]
    return out


# --------------------------------------------------------------------- optimizer


class FlatOptimizer(torch.optim.Optimizer):
    """`algorithm` ('adam', 'sgd', 'adagrad', 'rmsprop') over `params`, one kernel per step.

    The parameters become views of one flat buffer, `flat` (the optimizer's one
    parameter; its state is ``self.state[self.flat]``), and their gradients views of
    ``flat.grad``. Build it after the model is on its device. `zero_grad` zeroes the
    flat gradient in place whatever `set_to_none` says, so the views stay the gradients
    backward accumulates into; `step` checks that they still are.
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], algorithm: str, **settings: object) -> None:
        if algorithm not in DEFAULTS:
            raise ValueError(f"FlatOptimizer: algorithm {algorithm!r}: expected one of {', '.join(DEFAULTS)}")
        unknown = set(settings) - set(DEFAULTS[algorithm])
        if unknown:
            raise TypeError(f"FlatOptimizer({algorithm!r}) does not implement {', '.join(sorted(unknown))}")
        self._params = list(params)
        if not self._params or any(p.dtype != torch.float32 for p in self._params):
            raise ValueError("FlatOptimizer: expects fp32 parameters")
        if len({p.device for p in self._params}) > 1:
            raise ValueError("FlatOptimizer: expects parameters on one device")
        self._offsets = [0]
        for p in self._params:
            self._offsets.append(self._offsets[-1] + cdiv(p.numel(), ALIGN) * ALIGN)
        flat = torch.nn.Parameter(torch.zeros(self._offsets[-1], device=self._params[0].device))
        flat.grad = torch.zeros_like(flat)
        with torch.no_grad():
            for p, view in zip(self._params, self._slices(flat)):
                view.copy_(p)
                p.data = view
        super().__init__([flat], {**DEFAULTS[algorithm], **settings})
        self.algorithm = algorithm
        state = {"step": torch.zeros(cdiv(flat.numel(), BLOCK), device=flat.device)}
        state.update({name: torch.zeros_like(flat) for name in STATE[algorithm]})
        self.state[flat] = state
        self.zero_grad()

    @property
    def flat(self) -> torch.nn.Parameter:
        return self.param_groups[0]["params"][0]

    def spans(self) -> list[tuple[torch.nn.Parameter, int, int]]:
        """(parameter, start, stop) of each parameter's elements in the flat buffer, in
        buffer order; [start, stop) leaves out the alignment padding after it."""
        return [(p, o, o + p.numel()) for p, o in zip(self._params, self._offsets)]

    def _slices(self, buffer: torch.Tensor) -> list[torch.Tensor]:
        return [buffer[o : o + p.numel()].view_as(p) for p, o in zip(self._params, self._offsets)]

    def _grads_in_place(self) -> bool:
        base = self.flat.grad.data_ptr()  # type: ignore[union-attr]
        return all(
            p.grad is not None and p.grad.data_ptr() == base + 4 * o for p, o in zip(self._params, self._offsets)
        )

    def zero_grad(self, set_to_none: bool = True) -> None:
        grad = self.flat.grad
        assert grad is not None
        grad.zero_()
        if not self._grads_in_place():  # host-side check; first call, or something replaced a .grad
            for p, view in zip(self._params, self._slices(grad)):
                p.grad = view

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[no-untyped-def]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not self._grads_in_place():
            raise RuntimeError(
                "FlatOptimizer: a parameter's .grad is no longer its view of the flat gradient "
                "(set to None or replaced?); zero gradients through the optimizer, not the model"
            )
        flat = self.flat
        state = self.state[flat]
        buffers = [state[name] for name in STATE[self.algorithm]]
        KERNELS[self.algorithm][(len(state["step"]),)](
            flat, flat.grad, *buffers, state["step"], flat.numel(),
            **constants(self.algorithm, self.param_groups[0]), BLOCK=BLOCK, num_warps=NUM_WARPS,
        )
        return loss
