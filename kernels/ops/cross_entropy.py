"""Cross-entropy loss and its gradient in one kernel, as an autograd function.

    loss = mean_i (logsumexp(x_i) - x_i[t_i])          x (B, C) logits, t (B,) classes
    dx   = (softmax(x) - onehot(t)) / B

One load of each row gives its max, exp-sum, loss and gradient, in fp32 whatever the
logits' dtype; the gradient is written in the logits' dtype, the loss in fp32, and
backward only scales the stored gradient. A batch of up to ROWS_PER_PROGRAM rows is one
program summing in a fixed order (deterministic); larger batches add partial sums
atomically. Launched from a torch.autograd.Function, not a torch.library op, for host
time on the eager loop. No class weights, label smoothing or ignore_index: every target
must be in [0, C). Design notes and measurements: docs/kernels.md.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.plan.launch_plan import cdiv
from kernels.plan.launch_plan import next_power_of_2

ROWS_PER_PROGRAM = 1024
TILE = 2048  # elements per loop iteration: BLOCK_ROWS x BLOCK_C
MAX_CLASSES = TILE


@triton.jit
def _cross_entropy_kernel(
    x_ptr, t_ptr, loss_ptr, dx_ptr, B, C, inv_b,
    ROWS: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_C: tl.constexpr, ATOMIC: tl.constexpr,
):
    first = tl.program_id(0).to(tl.int64) * ROWS
    cols = tl.arange(0, BLOCK_C)
    col_ok = cols[None, :] < C
    total = tl.zeros((BLOCK_ROWS,), dtype=tl.float32)
    for start in range(first, tl.minimum(first + ROWS, B), BLOCK_ROWS):
        rows = start + tl.arange(0, BLOCK_ROWS)
        row_ok = rows < B
        offs = rows[:, None] * C + cols[None, :]
        x = tl.load(x_ptr + offs, mask=row_ok[:, None] & col_ok, other=0.0).to(tl.float32)
        x = tl.where(col_ok, x, -float("inf"))
        target = tl.load(t_ptr + rows, mask=row_ok, other=0)
        hit = cols[None, :] == target[:, None]
        row_max = tl.max(x, axis=1)
        e = tl.exp(x - row_max[:, None])  # 0 in the masked columns
        sum_e = tl.sum(e, axis=1)
        loss = row_max + tl.log(sum_e) - tl.sum(tl.where(hit, x, 0.0), axis=1)
        total += tl.where(row_ok, loss, 0.0)
        dx = (e / sum_e[:, None] - tl.where(hit, 1.0, 0.0)) * inv_b
        tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok)
    if ATOMIC:
        tl.atomic_add(loss_ptr, tl.sum(total) * inv_b)
    else:
        tl.store(loss_ptr, tl.sum(total) / B)


def cross_entropy_fwd(logits: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean loss (fp32, 0-dim) and d loss / d logits (the logits' dtype), one launch."""
    logits = logits.contiguous()
    B, C = logits.shape
    programs = cdiv(B, ROWS_PER_PROGRAM)
    loss = (torch.zeros if programs > 1 else torch.empty)((), device=logits.device, dtype=torch.float32)
    dx = torch.empty_like(logits)
    block_c = next_power_of_2(C)
    _cross_entropy_kernel[(programs,)](
        logits, target, loss, dx, B, C, 1.0 / B,
        ROWS=ROWS_PER_PROGRAM, BLOCK_ROWS=max(1, TILE // block_c), BLOCK_C=block_c, ATOMIC=programs > 1,
        num_warps=4,
    )
    return loss, dx


class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        loss, dx = cross_entropy_fwd(logits, target)
        ctx.save_for_backward(dx)
        return loss

    @staticmethod
    def backward(ctx, dloss: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        (dx,) = ctx.saved_tensors
        return dx * dloss, None


def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """F.cross_entropy(logits, target) (mean over the batch) through the one-pass kernel."""
    if logits.dim() != 2 or target.shape != logits.shape[:1] or not 1 <= logits.shape[1] <= MAX_CLASSES:
        raise ValueError(
            f"cross_entropy: logits {tuple(logits.shape)} and target {tuple(target.shape)} do not fit "
            f"(expected (B, C) and (B,), 1 <= C <= {MAX_CLASSES})"
        )
    if logits.shape[0] == 0:
        raise ValueError("cross_entropy: empty batch")
    return _CrossEntropy.apply(logits, target)
