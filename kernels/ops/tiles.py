"""Device functions the layer kernels share: the programs' tile order and the forward's
epilogue. kernels/ops/linear_act.py and kernels/ops/presplit.py both import them from
here, so neither imports the other's kernels.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.ops.activations import activation


@triton.jit
def tile_ids(pid, rows, cols, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, GROUP: tl.constexpr):
    """Grouped program order (tutorial 03): neighbouring programs share operand tiles in L2."""
    tiles_r = tl.cdiv(rows, BLOCK_R)
    tiles_c = tl.cdiv(cols, BLOCK_C)
    in_group = GROUP * tiles_c
    first = (pid // in_group) * GROUP
    size = tl.minimum(tiles_r - first, GROUP)
    return first + (pid % in_group) % size, (pid % in_group) // size


@triton.jit
def epilogue(
    acc, b_ptr, y_ptr, z_ptr, offs_m, offs_n, M, N, stride_ym, stride_yn, slope,
    ACTIVATION: tl.constexpr, SAVE_Z: tl.constexpr,
):
    """The forward's epilogue, while the accumulator is still fp32: bias, activation,
    Y stored in its dtype and, for silu, the pre-activation Z."""
    z = acc + tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    y = activation(z, ACTIVATION, slope)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    out = offs_m[:, None] * stride_ym + offs_n[None, :] * stride_yn
    tl.store(y_ptr + out, y.to(y_ptr.dtype.element_ty), mask=mask)
    if SAVE_Z:
        tl.store(z_ptr + out, z.to(z_ptr.dtype.element_ty), mask=mask)
