"""3xTF32 products on pre-split operands: C = A @ B at fp32 accuracy on TF32 tensor cores.

The layer kernels' 'presplit' route for fp32 at 'tf32x3' (launched by kernels/ops/linear_act.py,
picked by measurement in kernels/plan). x = hi + lo, two TF32 numbers (`split_hi`: x rounded to
10 mantissa bits, ties away from zero, as cvt.rna.tf32.f32); a product is a_lo b_hi + a_hi b_lo
+ a_hi b_hi (a_lo b_lo, 2^-22 of it, dropped). Unlike `tl.dot(input_precision="tf32x3")`, which
splits both operands in registers each step and so writes B back to shared memory before a
Hopper MMA can read it, B arrives split (B_hi, B_lo written once, `_split_kernel` or the kernel
that makes the tensor) and is copied straight into shared memory; only A is split, in registers.
B's reduction must be its contiguous dimension (no transposed 32-bit MMA). Each step's three
products are summed on the tensor cores from zero, then added to the fp32 sum: the tensor
cores' accumulation into a large running sum drops the small terms' low bits (docs/kernels.md,
"Five routes", has the figures).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.ops.tiles import epilogue
from kernels.ops.tiles import tile_ids

SPLIT_BLOCK = (64, 64)  # _split_kernel's tile: memory-bound, not tuned


@triton.jit
def split_hi(x):
    """x rounded to TF32 (10 mantissa bits, ties away from zero), as an fp32 tensor."""
    return ((x.to(tl.int32, bitcast=True) + 4096) & -8192).to(tl.float32, bitcast=True)


@triton.jit
def _split_kernel(x_ptr, hi_ptr, lo_ptr, R, C, stride_xr, stride_xc, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """hi = split_hi(x) and lo = x - hi (exact) for an (R, C) fp32 x, into contiguous (R, C)."""
    offs_r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_c = tl.program_id(1).to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (offs_r[:, None] < R) & (offs_c[None, :] < C)
    x = tl.load(x_ptr + offs_r[:, None] * stride_xr + offs_c[None, :] * stride_xc, mask=mask, other=0.0)
    hi = split_hi(x)
    out = offs_r[:, None] * C + offs_c[None, :]
    tl.store(hi_ptr + out, hi, mask=mask)
    tl.store(lo_ptr + out, x - hi, mask=mask)


@triton.jit
def _product_kernel(
    # Pointers: A (fp32, any strides), B's two parts (strides shared), C; for the
    # forward's epilogue the bias and, for silu, Z (C itself otherwise)
    a_ptr, b_hi_ptr, b_lo_ptr, c_ptr, bias_ptr, z_ptr,
    # C (M, N) = A (M, K) @ B (K, N)
    M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    slope,
    ACTIVATION: tl.constexpr, SAVE_Z: tl.constexpr, EPILOGUE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr,
):
    """C = A @ B in 3xTF32 from B's parts; with EPILOGUE, C = act(A @ B + bias) (the
    forward's), else the fp32 sum stored as it is."""
    pid_m, pid_n = tile_ids(tl.program_id(0).to(tl.int64), M, N, BLOCK_M, BLOCK_N, GROUP)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_off = offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_left), other=0.0)
        b_mask = (offs_k[:, None] < k_left) & (offs_n[None, :] < N)
        b_hi = tl.load(b_hi_ptr + b_off, mask=b_mask, other=0.0)
        b_lo = tl.load(b_lo_ptr + b_off, mask=b_mask, other=0.0)
        a_hi = split_hi(a)
        step = tl.dot(a - a_hi, b_hi, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), input_precision="tf32")
        step = tl.dot(a_hi, b_lo, step, input_precision="tf32")
        acc += tl.dot(a_hi, b_hi, step, input_precision="tf32")
        a_ptrs += BLOCK_K * stride_ak
        b_off += BLOCK_K * stride_bk
    if EPILOGUE:
        epilogue(acc, bias_ptr, c_ptr, z_ptr, offs_m, offs_n, M, N, stride_cm, stride_cn, slope, ACTIVATION, SAVE_Z)
    else:
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc, mask=mask)
