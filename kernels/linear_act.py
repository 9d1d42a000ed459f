"""Fused linear + bias + activation, forward and backward, as a torch op.

    Y = act(X @ W.T + b)          X (M, K), W (N, K), b (N,), Y (M, N)

Forward: one GEMM with bias and activation in its epilogue, the accumulator kept in
fp32 until the final cast. Backward: two GEMMs whose prologue turns dY into
dZ = dY * act'(.) on the fly, from the saved output (relu, leaky_relu, tanh,
sigmoid) or the saved pre-activation (silu):

    dX = dZ @ W        (M, K)   reduces over N
    dW = dZ.T @ X      (N, K)   reduces over M; the K-column-0 programs also sum db

fp32 inputs follow torch's float32 matmul precision ('highest' is fp32, 'high' TF32),
so 'fp32' means the same thing in both implementations; bf16 and fp16 use fp32
accumulation. Strict fp32 runs one of two ways, chosen by LOADBENCH_STRICT_FP32:
'tf32x3' (the default: each operand split into a TF32 part and a TF32 remainder, three
tensor-core products) or 'ieee' (Triton's fp32 dot on the FMA units). On an H100,
3xTF32 runs the 4096 x 2048 x 2048 GEMM at 1.4x cuBLAS SGEMM's speed, the IEEE dot at
0.42x; 3xTF32's error against float64 stays within 1.5x of cuBLAS's on the MLP's
shapes, the IEEE dot's input gradient does not (tests/test_kernels.py, GPU tests). It
is not bit-for-bit IEEE.

Three routes, chosen per kernel and shape by the launch configuration:

- 'triton' (split_k = 1): the fused kernels above.
- split-K, for dW only (split_k = S > 1): at batch 512 a 512 x 512 weight gradient
  is about 128 output tiles, fewer than an H100's 132 SMs, each walking all 512 rows.
  Then S programs per tile each reduce one slice of the batch into an fp32 workspace
  [S, N*K + N] (dW and db partials), and a second small kernel sums the S partials
  in the fixed order s = 0..S-1 (Kahan-compensated): no atomics, so the same inputs
  give the same bits on every run.
- 'cublas' ("cublas+epilogue"): torch.mm (cuBLAS) for the GEMM and a small Triton
  kernel for what the fused kernel does around it: bias + activation after the
  forward GEMM, dZ = act'(.) and the compensated db before the backward GEMMs. For
  the shapes where cuBLAS's GEMM is measured faster than ours.

Launch configurations come from `launch_config` / `launch_report`, resolved once per
(kernel, shape, dtype, device) per process and then kept in a dict, so the eager hot
path does one dict lookup, not a table walk, a heuristic or an environment read per
call. Where a configuration comes from ('source' in `launch_report()`), in order:

1. 'table': kernels/launch_table.json, measured offline by `python -m kernels.tune`
   per GPU model and shape class, committed (the table wins over the cache);
2. 'cache': the per-user cache of tiles tuned on first use (kernels/tuning_cache.py),
   keyed by GPU model and the Triton and torch versions;
3. 'tuned': on the first eager call of a shape class neither covers, the candidates
   (split-K and the cuBLAS route included) are compiled at once on a thread pool,
   each is timed briefly from a CUDA graph, the few fastest are timed again properly
   and the fastest of those is used and stored in the cache, with a progress line on
   stderr (`kernels.tune --dry-run` counts what that costs);
4. 'heuristic': `heuristic_config`, where nothing can be measured (CPU, the
   interpreter), tuning is off, or the first call comes during CUDA-graph capture or
   torch.compile tracing, where no timing may run: that call uses the heuristic, the
   report says so, and the next eager call tunes.

Table and cache are keyed by `shape_key`: kernel, dtype, the dot's precision (the
strict-fp32 mode or TF32), the activation class (silu stores and re-reads its
pre-activation; the others share leaky_relu's tiles) and the shape class.
LOADBENCH_TUNE=off|cache|always picks the policy (kernels/tuning_cache.py). The ops are
declared with `torch.library.triton_op`, so they run under torch.compile, inside
CUDA-graph capture and, with TRITON_INTERPRET=1, on CPU tensors. An eager call of
`linear_act` (no torch.compile trace, no dispatch mode) skips the op's dispatcher
round trip: an autograd.Function runs the same launch code with Triton's own launcher
(on a 2-core CPU, with the launches stubbed out, about 40 us less per layer forward +
backward), so the results are the same bits.

The structure follows Triton's matrix-multiplication tutorial (grouped program order,
masked loads); the fused prologue, the bias-gradient reduction, split-K and the op
wiring are ours.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl
from torch.library import triton_op
from torch.library import wrap_triton

from kernels import tuning_cache
from kernels.tuning_cache import TuningCache

ACTIVATIONS = {"identity": 0, "relu": 1, "leaky_relu": 2, "tanh": 3, "sigmoid": 4, "silu": 5}
SILU = ACTIVATIONS["silu"]
LEAKY_SLOPE = 0.01  # torch's default


# ----------------------------------------------------------------------- kernels


@triton.jit
def _activation(z, ACTIVATION: tl.constexpr, slope):
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
def _activation_grad(dy, saved, ACTIVATION: tl.constexpr, slope):
    """dZ from dY and the saved output (or pre-activation, for silu), in fp32."""
    if ACTIVATION == 1:
        return tl.where(saved > 0, dy, 0.0)
    elif ACTIVATION == 2:
        return tl.where(saved > 0, dy, dy * slope)
    elif ACTIVATION == 3:
        return dy * (1.0 - saved * saved)
    elif ACTIVATION == 4:
        return dy * saved * (1.0 - saved)
    elif ACTIVATION == 5:
        s = tl.sigmoid(saved)
        return dy * s * (1.0 + saved * (1.0 - s))
    else:
        return dy


@triton.jit
def _tile_ids(pid, rows, cols, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, GROUP: tl.constexpr):
    """Grouped program order (tutorial 03): neighbouring programs share operand tiles in L2."""
    tiles_r = tl.cdiv(rows, BLOCK_R)
    tiles_c = tl.cdiv(cols, BLOCK_C)
    in_group = GROUP * tiles_c
    first = (pid // in_group) * GROUP
    size = tl.minimum(tiles_r - first, GROUP)
    return first + (pid % in_group) % size, (pid % in_group) // size


@triton.jit
def _forward_kernel(
    # Pointers
    x_ptr, w_ptr, b_ptr, y_ptr, z_ptr,
    # Matrix dimensions
    M, N, K,
    # Strides
    stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yn,
    slope,
    # Meta-parameters
    ACTIVATION: tl.constexpr, SAVE_Z: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr,
):  # fmt: skip
    pid_m, pid_n = _tile_ids(tl.program_id(0).to(tl.int64), M, N, BLOCK_M, BLOCK_N, GROUP)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk
    w_ptrs = w_ptr + offs_n[None, :] * stride_wn + offs_k[:, None] * stride_wk  # W.T tile (K, N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(x_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(w_ptrs, mask=(offs_k[:, None] < k_left) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk
    # Epilogue, while the accumulator is still fp32.
    z = acc + tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    y = _activation(z, ACTIVATION, slope)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    out = offs_m[:, None] * stride_ym + offs_n[None, :] * stride_yn
    tl.store(y_ptr + out, y.to(y_ptr.dtype.element_ty), mask=mask)
    if SAVE_Z:
        tl.store(z_ptr + out, z.to(z_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _input_grad_kernel(
    # Pointers
    dy_ptr, s_ptr, w_ptr, dx_ptr,
    # Matrix dimensions
    M, N, K,
    # Strides (dy and the saved tensor share strides)
    stride_dm, stride_dn, stride_wn, stride_wk, stride_xm, stride_xk,
    slope,
    # Meta-parameters
    ACTIVATION: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr,
):  # fmt: skip
    pid_m, pid_k = _tile_ids(tl.program_id(0).to(tl.int64), M, K, BLOCK_M, BLOCK_K, GROUP)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    offs_n = tl.arange(0, BLOCK_N)
    d_off = offs_m[:, None] * stride_dm + offs_n[None, :] * stride_dn
    w_ptrs = w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :] * stride_wk
    acc = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    for n in range(0, tl.cdiv(N, BLOCK_N)):
        n_left = N - n * BLOCK_N
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < n_left)
        dy = tl.load(dy_ptr + d_off, mask=mask, other=0.0).to(tl.float32)
        saved = tl.load(s_ptr + d_off, mask=mask, other=0.0).to(tl.float32)
        dz = _activation_grad(dy, saved, ACTIVATION, slope).to(w_ptr.dtype.element_ty)
        w = tl.load(w_ptrs, mask=(offs_n[:, None] < n_left) & (offs_k[None, :] < K), other=0.0)
        acc = tl.dot(dz, w, acc, input_precision=PRECISION)
        d_off += BLOCK_N * stride_dn
        w_ptrs += BLOCK_N * stride_wn
    mask = (offs_m[:, None] < M) & (offs_k[None, :] < K)
    out = offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk
    tl.store(dx_ptr + out, acc.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _weight_grad_kernel(
    # Pointers (split-K: dw_ptr and db_ptr are both the fp32 workspace)
    dy_ptr, s_ptr, x_ptr, dw_ptr, db_ptr,
    # Matrix dimensions; rows of the batch each split reduces
    M, N, K, m_per_split,
    # Strides; stride_split: one split's partials in the workspace (N * K + N)
    stride_dm, stride_dn, stride_xm, stride_xk, stride_wn, stride_wk, stride_split,
    slope,
    # Meta-parameters
    ACTIVATION: tl.constexpr, PRECISION: tl.constexpr, SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr,
):  # fmt: skip
    pid_n, pid_k = _tile_ids(tl.program_id(0).to(tl.int64), N, K, BLOCK_N, BLOCK_K, GROUP)
    split = tl.program_id(1).to(tl.int64)  # 0 without split-K
    m_first = split * m_per_split
    m_count = tl.minimum(M - m_first, m_per_split)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    offs_m = tl.arange(0, BLOCK_M)
    d_off = offs_n[:, None] * stride_dn + (m_first + offs_m)[None, :] * stride_dm  # dZ.T tile (N, M)
    x_ptrs = x_ptr + (m_first + offs_m)[:, None] * stride_xm + offs_k[None, :] * stride_xk
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    bias = tl.zeros((BLOCK_N,), dtype=tl.float32)
    bias_lost = tl.zeros((BLOCK_N,), dtype=tl.float32)  # Kahan: db is a long sequential sum over M
    for m in range(0, tl.cdiv(m_count, BLOCK_M)):
        m_left = m_count - m * BLOCK_M
        mask = (offs_n[:, None] < N) & (offs_m[None, :] < m_left)
        dy = tl.load(dy_ptr + d_off, mask=mask, other=0.0).to(tl.float32)
        saved = tl.load(s_ptr + d_off, mask=mask, other=0.0).to(tl.float32)
        dz = _activation_grad(dy, saved, ACTIVATION, slope)
        part = tl.sum(dz, axis=1) - bias_lost
        total = bias + part
        bias_lost = (total - bias) - part
        bias = total
        x = tl.load(x_ptrs, mask=(offs_m[:, None] < m_left) & (offs_k[None, :] < K), other=0.0)
        acc = tl.dot(dz.to(x_ptr.dtype.element_ty), x, acc, input_precision=PRECISION)
        d_off += BLOCK_M * stride_dm
        x_ptrs += BLOCK_M * stride_xm
    mask = (offs_n[:, None] < N) & (offs_k[None, :] < K)
    if SPLIT:
        # This split's fp32 partials, summed in order by _split_sum_kernel.
        part_ptr = dw_ptr + split * stride_split
        tl.store(part_ptr + offs_n[:, None] * K + offs_k[None, :], acc, mask=mask)
        if pid_k == 0:
            tl.store(part_ptr + N * K + offs_n, bias - bias_lost, mask=offs_n < N)
    else:
        out = offs_n[:, None] * stride_wn + offs_k[None, :] * stride_wk
        tl.store(dw_ptr + out, acc.to(dw_ptr.dtype.element_ty), mask=mask)
        if pid_k == 0:
            tl.store(db_ptr + offs_n, bias.to(db_ptr.dtype.element_ty), mask=offs_n < N)


@triton.jit
def _split_sum_kernel(ws_ptr, dw_ptr, db_ptr, S, N, K, stride_split, stride_wn, stride_wk, BLOCK: tl.constexpr):
    """dW and db from the S split-K partials [S, N*K + N], summed s = 0, 1, ..., S-1
    for every element (compensated): a fixed order, so the result is reproducible."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    weights = N * K
    mask = offs < weights + N
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    lost = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(0, S):
        part = tl.load(ws_ptr + s * stride_split + offs, mask=mask, other=0.0) - lost
        t = total + part
        lost = (t - total) - part
        total = t
    total = total - lost
    n = offs // K
    k = offs - n * K
    tl.store(dw_ptr + n * stride_wn + k * stride_wk, total.to(dw_ptr.dtype.element_ty), mask=mask & (offs < weights))
    tl.store(db_ptr + (offs - weights), total.to(db_ptr.dtype.element_ty), mask=mask & (offs >= weights))


@triton.jit
def _bias_act_kernel(
    z_ptr, b_ptr, y_ptr, M, N, stride_zm, stride_zn, stride_ym, stride_yn, slope,
    ACTIVATION: tl.constexpr, SAVE_Z: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """The cuBLAS route's forward epilogue: Y = act(Z + b) from torch.mm's Z; for silu
    Z + b (the pre-activation the backward needs) is written back over Z."""
    offs_m = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    z_off = offs_m[:, None] * stride_zm + offs_n[None, :] * stride_zn
    z = tl.load(z_ptr + z_off, mask=mask, other=0.0).to(tl.float32)
    z += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    y = _activation(z, ACTIVATION, slope)
    tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :] * stride_yn, y.to(y_ptr.dtype.element_ty), mask=mask)
    if SAVE_Z:
        tl.store(z_ptr + z_off, z.to(z_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _act_grad_kernel(
    dy_ptr, s_ptr, dz_ptr, db_ptr, M, N, stride_dm, stride_dn, stride_zm, stride_zn, slope,
    ACTIVATION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """The cuBLAS route's backward prologue: dZ (in the GEMM's dtype) and db, each
    program a strip of columns walking the batch, so db is one compensated sum in a
    fixed order, as in the fused weight-gradient kernel."""
    offs_n = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    bias = tl.zeros((BLOCK_N,), dtype=tl.float32)
    bias_lost = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for m in range(0, tl.cdiv(M, BLOCK_M)):
        rows = m * BLOCK_M + offs_m
        mask = (rows[:, None] < M) & (offs_n[None, :] < N)
        d_off = rows[:, None] * stride_dm + offs_n[None, :] * stride_dn
        dy = tl.load(dy_ptr + d_off, mask=mask, other=0.0).to(tl.float32)
        saved = tl.load(s_ptr + d_off, mask=mask, other=0.0).to(tl.float32)
        dz = _activation_grad(dy, saved, ACTIVATION, slope)
        tl.store(dz_ptr + rows[:, None] * stride_zm + offs_n[None, :] * stride_zn, dz.to(dz_ptr.dtype.element_ty), mask=mask)
        part = tl.sum(dz, axis=0) - bias_lost
        total = bias + part
        bias_lost = (total - bias) - part
        bias = total
    tl.store(db_ptr + offs_n, (bias - bias_lost).to(db_ptr.dtype.element_ty), mask=offs_n < N)


# Fixed tiles of the small helper kernels: memory-bound, so no tuning.
SUM_BLOCK = 1024
EPILOGUE_BLOCK = (32, 128)  # rows, columns (columns contiguous)
GRAD_BLOCK = (64, 32)  # rows walked per step, columns per program


# ---------------------------------------------------------------- launch configs


TRITON, CUBLAS = "triton", "cublas"
BACKENDS = (TRITON, CUBLAS)


@dataclass(frozen=True)
class LaunchConfig:
    block_r: int  # rows of the output tile
    block_c: int  # columns of the output tile
    block_red: int  # reduction step
    num_warps: int
    num_stages: int
    group: int = 8
    split_k: int = 1  # dw only: slices of the batch reduced by separate programs
    backend: str = TRITON  # 'cublas': torch.mm plus our epilogue / prologue kernel

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LaunchConfig:
        """A configuration read from a table or cache file, checked: a bad one must not
        reach a kernel launch (tl.dot needs sides >= 16 and powers of two)."""
        names = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(data, dict) or not set(data) <= names:
            raise ValueError(f"launch config {data!r}: expected the fields {', '.join(sorted(names))}")
        cfg = cls(**data)
        blocks = (cfg.block_r, cfg.block_c, cfg.block_red)
        ints = (*blocks, cfg.num_warps, cfg.num_stages, cfg.group, cfg.split_k)
        if not all(type(v) is int for v in ints) or cfg.backend not in BACKENDS:
            raise ValueError(f"launch config {data!r}: integer fields, backend one of {', '.join(BACKENDS)}")
        if any(b < 16 or b & (b - 1) for b in blocks) or cfg.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"launch config {data!r}: blocks must be powers of two >= 16, warps 1-16")
        if not (1 <= cfg.num_stages <= 8 and cfg.group >= 1 and 1 <= cfg.split_k <= 64):
            raise ValueError(f"launch config {data!r}: stages 1-8, group >= 1, split_k 1-64")
        return cfg

    def describe(self) -> str:
        if self.backend == CUBLAS:
            return "cublas+epilogue"
        split = f" split-K {self.split_k}" if self.split_k > 1 else ""
        return f"{self.block_r}x{self.block_c}x{self.block_red} w{self.num_warps} s{self.num_stages}{split}"


def _pow2_at_least(n: int, low: int, high: int) -> int:
    return max(low, min(high, triton.next_power_of_2(n)))


def _bucket(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


# What the tuned kernel's speed depends on besides its tile, and so what a measured
# tile is keyed by. The activation matters little in most cases (a few elementwise
# operations on the tile) but not for silu: its forward also stores the pre-activation
# and its backward prologue re-reads it and computes a sigmoid. Every other activation
# shares one class and is timed with leaky_relu, the study's; the head (identity) is
# its own class, so this costs no tuning beyond the silu layers.
ACTIVATION_CLASSES = {"identity": "identity", "silu": "silu"}  # any other: "pointwise"
TIMED_ACTIVATION = {"identity": "identity", "silu": "silu", "pointwise": "leaky_relu"}
_CLASS_OF = {code: ACTIVATION_CLASSES.get(name, "pointwise") for name, code in ACTIVATIONS.items()}
# Version of the key below. Tables and cache entries keyed before the precision and
# the activation class were part of the key (format 1) are not reused.
KEY_FORMAT = 2


def activation_class(activation: int | str) -> str:
    """'identity', 'silu' or 'pointwise' (relu, leaky_relu, tanh, sigmoid)."""
    return _CLASS_OF[ACTIVATIONS[activation] if isinstance(activation, str) else activation]


def shape_key(
    kernel: str, rows: int, cols: int, reduction: int, dtype: torch.dtype, precision: str, act_class: str
) -> str:
    """The shape class a measured tile holds for (committed table and cache alike):
    the kernel, the dtype and the dot's precision (fp32 runs a different kernel for
    'tf32x3', 'ieee' and 'tf32'), the activation class, and the output rows x cols and
    the reduction rounded up to powers of two. The reduction is in it because for dW
    it is the batch (split-K's best S depends on it) and the first layer's forward
    (K = 75) and a hidden layer's want different tiles."""
    kind = str(dtype).removeprefix("torch.")
    return f"{kernel}:{kind}:{precision}:{act_class}:{_bucket(rows)}:{_bucket(cols)}:{_bucket(reduction)}"


def heuristic_config(rows: int, cols: int, reduction: int, dtype: torch.dtype) -> LaunchConfig:
    """A tile no larger than the output (the head has 10 columns, the first layer
    reduces over 75); small outputs (batch <= 512 at width <= 512) split into 64 x 32
    tiles so there are enough programs for the SMs; tl.dot needs every side >= 16. A
    16-bit dtype moves twice the reduction per stage. Never split-K and never cuBLAS:
    those are chosen only by measurement."""
    red_max = 64 if dtype.itemsize == 2 else 32
    block_c = _pow2_at_least(cols, 16, 128)
    block_r = _pow2_at_least(rows, 16, 128)
    block_red = _pow2_at_least(reduction, 16, red_max)
    if rows * cols <= 512 * 512:
        block_r, block_c = min(block_r, 64), min(block_c, 32 if cols > 32 else block_c)
    warps = 8 if block_r * block_c >= 128 * 128 else 4
    return LaunchConfig(block_r, block_c, block_red, warps, 3)


# The tiles the tuners try: (block_r, block_c, warps, stages); the reduction step per dtype.
TILES = [
    (16, 64, 4, 3), (32, 32, 4, 3), (64, 32, 4, 3), (32, 64, 4, 3),
    (64, 64, 4, 3), (128, 64, 8, 3), (64, 128, 8, 3), (128, 128, 8, 3),
]  # fmt: skip
REDUCTION_STEPS = {torch.float32: (16, 32), torch.bfloat16: (32, 64), torch.float16: (32, 64)}
SPLITS = (2, 4, 8, 16)
# Occupancy rule: where some candidate tile gives at least one program per SM, a
# candidate giving fewer than this many programs per SM is not timed (a quarter of the
# SMs or fewer busy). Evidence: the format-1 launch table timed every candidate of its
# day; none of its winners still among the candidates (90 of 94 on the H100, 34 of 36
# on the H200) falls under it (tests/test_tuning_cache.py checks).
MIN_PROGRAMS_PER_SM = 0.25


# 16-bit dtypes: one reduction step, the longest that does not overrun the reduction.
# Evidence: every bf16 winner of the format-1 launch table still among the candidates
# (36 on the H100, 7 on the H200, both steps timed) took 64 where the reduction is
# >= 64 and 32 where it is 10 (the head's dX).
# fp32 keeps both steps: 16 won for the head's dW and for dX at 512 x 1024 on the H100.
ONE_STEP_DTYPES = (torch.bfloat16, torch.float16)


def candidates(dtype: torch.dtype, reduction: int | None = None) -> list[LaunchConfig]:
    """Every fused-kernel tile, without split-K or cuBLAS; for a 16-bit dtype and a
    known reduction, with the one reduction step that fits it (ONE_STEP_DTYPES)."""
    steps = REDUCTION_STEPS[dtype]
    if reduction is not None and dtype in ONE_STEP_DTYPES:
        fitting = [s for s in steps if s <= max(16, reduction)]
        steps = (max(fitting),) if fitting else (min(steps),)
    return [LaunchConfig(r, c, red, w, s) for r, c, w, s in TILES for red in steps]


def _programs(kernel: str, rows: int, cols: int, reduction: int, cfg: LaunchConfig) -> int:
    return _make_plan(kernel, rows, cols, reduction, cfg).programs


def tuning_candidates(
    kernel: str, rows: int, cols: int, reduction: int, dtype: torch.dtype, sm_count: int | None, prune: bool = True
) -> list[LaunchConfig]:
    """What tuning one shape times: the heuristic's tile, the tiles that fit the output
    (a 128-row tile over a 16-row output is mostly masked work), for dW split-K over
    the tiles that leave SMs idle, and the cuBLAS route; where the SM count is known,
    less the tiles the occupancy rule (MIN_PROGRAMS_PER_SM) and, in 16 bits, the
    reduction-step rule (ONE_STEP_DTYPES) rule out; `prune=False`: neither rule."""
    heuristic = heuristic_config(rows, cols, reduction, dtype)
    fits = [c for c in candidates(dtype, reduction if prune else None) if c.block_r <= max(32, _bucket(rows)) and c.block_c <= max(32, _bucket(cols))]
    out = [heuristic] + [c for c in fits if c != heuristic]
    if kernel == "dw" and sm_count:
        longest = max(REDUCTION_STEPS[dtype])  # a slice is short: take the long step
        for c in fits:
            tiles = triton.cdiv(rows, c.block_r) * triton.cdiv(cols, c.block_c)
            if c.block_red != longest or tiles >= sm_count:
                continue
            for s in SPLITS:  # at least one reduction step per slice, at most two waves
                if s <= triton.cdiv(reduction, c.block_red) and tiles * s <= 2 * sm_count:
                    out.append(dataclasses.replace(c, split_k=s))
    if sm_count and prune:  # among whole tiles: split-K has its own bounds above
        programs = [_programs(kernel, rows, cols, reduction, c) if c.split_k == 1 else None for c in out]
        if max(p for p in programs if p is not None) >= sm_count:
            floor = MIN_PROGRAMS_PER_SM * sm_count
            out = [c for i, (c, p) in enumerate(zip(out, programs)) if i == 0 or p is None or p >= floor]
    out.append(dataclasses.replace(heuristic, backend=CUBLAS))
    return out


STRICT_FP32_CHOICES = ("ieee", "tf32x3")


def strict_fp32_from_env(value: str | None) -> str:
    """How 'highest' fp32 runs, from LOADBENCH_STRICT_FP32 (unset: 'tf32x3')."""
    if value in (None, ""):
        return "tf32x3"
    if value not in STRICT_FP32_CHOICES:
        raise ValueError(f"LOADBENCH_STRICT_FP32={value!r}: use one of {', '.join(STRICT_FP32_CHOICES)}")
    return value


STRICT_FP32 = strict_fp32_from_env(os.environ.get("LOADBENCH_STRICT_FP32"))


def _precision(dtype: torch.dtype) -> str:
    if dtype != torch.float32:
        return "ieee"  # 16-bit inputs: the tensor cores, fp32 accumulation
    return STRICT_FP32 if torch.get_float32_matmul_precision() == "highest" else "tf32"


# ------------------------------------------------------------------------ planning


# kernels/launch_table.json, written by `python -m kernels.tune` on each GPU model:
# per GPU name, "key_format" (KEY_FORMAT) and "configs" keyed by `shape_key`, each a
# LaunchConfig (split_k and backend included: the routes are table entries too).
TABLE_PATH = Path(__file__).with_name("launch_table.json")
KERNELS = ("fwd", "dw", "dx")


def _mnk(kernel: str, rows: int, cols: int, reduction: int) -> tuple[int, int, int]:
    """(M, N, K) of the layer from a kernel's output rows x cols and its reduction."""
    if kernel == "fwd":
        return rows, cols, reduction
    if kernel == "dw":
        return reduction, rows, cols
    return rows, reduction, cols  # dx


def kernel_shapes(m: int, n: int, k: int, input_grad: bool = True) -> list[tuple[str, int, int, int]]:
    """(kernel, rows, cols, reduction) of the kernels a layer (M, N, K) launches."""
    out = [("fwd", m, n, k), ("dw", n, k, m)]
    return out + [("dx", m, k, n)] if input_grad else out


@dataclass(frozen=True)
class _Plan:
    """Everything a launch needs besides the tensors, worked out once per shape."""

    cfg: LaunchConfig
    grid: tuple
    splits: int = 1  # dw: split-K slices in use (never an empty one)
    m_per_split: int = 0  # dw: batch rows per slice
    sum_grid: tuple = ()  # dw with splits > 1: the partial-sum kernel's grid

    @property
    def programs(self) -> int:
        return math.prod(self.grid) if self.grid else 0


def _make_plan(kernel: str, rows: int, cols: int, reduction: int, cfg: LaunchConfig) -> _Plan:
    if cfg.backend == CUBLAS:  # only the forward's epilogue has a grid per shape
        fwd = kernel == "fwd"
        return _Plan(cfg, (triton.cdiv(rows, EPILOGUE_BLOCK[0]), triton.cdiv(cols, EPILOGUE_BLOCK[1])) if fwd else ())
    tiles = triton.cdiv(rows, cfg.block_r) * triton.cdiv(cols, cfg.block_c)
    if kernel == "dw" and cfg.split_k > 1:
        steps = triton.cdiv(reduction, cfg.block_red)
        per_split = triton.cdiv(steps, max(1, min(cfg.split_k, steps))) * cfg.block_red  # on step boundaries
        splits = triton.cdiv(reduction, per_split) if reduction else 1
        if splits > 1:
            sum_grid = (triton.cdiv(rows * cols + rows, SUM_BLOCK),)
            return _Plan(cfg, (tiles, splits), splits, per_split, sum_grid)
    return _Plan(cfg, (tiles,), 1, reduction)


# The hot path: (kernel, rows, cols, reduction, dtype, device, precision, activation
# class) -> plan. Only final answers go in (table, cache, tuned, or the heuristic
# where nothing can be tuned).
_PLANS: dict[tuple, _Plan] = {}
# Set only by a tuner while it measures a candidate: the config every call then uses.
_FORCED: dict[str, LaunchConfig] = {}

# (kernel, M, N, K, dtype, config, device, *, activation, quick) -> ms per call
Measure = Callable[..., float]
# (kernel, M, N, K, dtype, configs, device, *, activation) -> kernels compiled
Prepare = Callable[..., int]

# Successive halving: every candidate is first timed briefly (QUICK_TIMING: calls per
# graph, replays), only the FINALISTS fastest (and the heuristic's tile, the baseline
# the report compares with) again with FULL_TIMING, and the choice rests on the full
# timing alone. A quick timing is about a tenth of a full one in kernel executions; its
# ranking need only put the true winner among the first four.
QUICK_TIMING = (5, 3)
FULL_TIMING = (20, 10)
FINALISTS = 4
# silu's tiles are chosen among the pointwise class's finalists at the same shape
# (where that class was tuned first, as the experiments order it): the same GEMM with
# a heavier epilogue and prologue reorders close tiles, not distant ones, and silu's
# own compilations (its ACTIVATION is a constexpr) would otherwise add about a third
# to first-use tuning. The heuristic's tile and the cuBLAS route are always timed too.
SEED_CLASSES = {"silu": "pointwise"}


def _stream_capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _why_not_now(like: torch.Tensor) -> str | None:
    """Why no timing may run in this call, if none may: a graph being captured would
    record the tuner's launches, and a traced (fake) tensor has no data to time."""
    from torch._subclasses.fake_tensor import is_fake

    if torch.compiler.is_compiling() or is_fake(like):
        return "torch.compile tracing"
    if _stream_capturing(like.device):
        return "CUDA-graph capture"
    return None


class _Launches:
    """Where this process's launch configurations come from: the mode, the committed
    table and the per-user cache (each read once), the tuner, and the report."""

    def __init__(
        self,
        mode: str | None = None,
        cache_dir: str | Path | None = None,
        tables: dict[str, dict[str, Any]] | None = None,
        measure: Measure | None = None,
        sm_count: int | None = None,
        prepare: Prepare | None = None,
    ) -> None:
        self.mode = tuning_cache.tune_mode_from_env(os.environ.get("LOADBENCH_TUNE") if mode is None else mode)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else tuning_cache.cache_dir()
        self._table_file = tables  # None: TABLE_PATH, read on first need
        self._tables: dict[str, dict[str, LaunchConfig]] = {}
        self._caches: dict[str, TuningCache] = {}
        self._models: dict[torch.device, str] = {}
        self._measure = measure  # None: CUDA-graph timing on a GPU, nothing to measure elsewhere
        self._prepare = prepare  # None: parallel compilation where _measure is None too
        self._sm_count = sm_count
        self._tuned: dict[tuple[str, str], LaunchConfig] = {}  # (gpu, key): tuned in this process
        self._finalists: dict[tuple[str, str], list[LaunchConfig]] = {}  # (gpu, key): fastest first
        self.report: dict[tuple, dict[str, Any]] = {}
        self.tuning_seconds = 0.0
        self.tuning_counts = {"shapes": 0, "candidates": 0, "quick": 0, "full": 0, "compiled": 0}
        self._warned: set[str] = set()

    def _warn_once(self, what: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            warnings.warn(what, stacklevel=4)

    # --------------------------------------------------------------- sources

    def model(self, device: torch.device) -> str:
        """The GPU model's name (what the table and the cache are keyed by), or 'cpu'."""
        if device not in self._models:
            self._models[device] = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
        return self._models[device]

    def table(self, gpu: str) -> dict[str, LaunchConfig]:
        if gpu not in self._tables:
            if self._table_file is None:
                try:
                    self._table_file = json.loads(TABLE_PATH.read_text())
                except (OSError, ValueError) as exc:
                    self._warn_once(f"{TABLE_PATH}: unreadable ({exc}); launching without the committed table")
                    self._table_file = {}
            group = self._table_file.get(gpu, {})
            raw = group.get("configs", {}) if isinstance(group, dict) else {}
            if raw and group.get("key_format") != KEY_FORMAT:
                self._warn_once(
                    f"{TABLE_PATH}: {gpu}: tuned before its keys named the precision and activation class "
                    f"(key format {group.get('key_format', 1)}, not {KEY_FORMAT}); not used. Re-tune it: python -m kernels.tune"
                )
                raw = {}
            parsed = {}
            for key, cfg in raw.items():
                try:
                    parsed[key] = cfg if isinstance(cfg, LaunchConfig) else LaunchConfig.from_dict(cfg)
                except (ValueError, TypeError) as exc:
                    self._warn_once(f"{TABLE_PATH}: {gpu}: {key}: {exc}; using the heuristic for it")
            self._tables[gpu] = parsed
        return self._tables[gpu]

    def cache(self, gpu: str) -> TuningCache:
        if gpu not in self._caches:
            key = tuning_cache.cache_key(gpu, triton.__version__, torch.__version__)
            self._caches[gpu] = TuningCache(self.cache_dir, key)
        return self._caches[gpu]

    def cached(self, gpu: str, key: str) -> LaunchConfig | None:
        entry = self.cache(gpu).get(key)
        if entry is None:
            return None
        try:
            return LaunchConfig.from_dict(entry["config"])
        except (ValueError, TypeError, KeyError) as exc:
            self._warn_once(f"{self.cache(gpu).path}: {key}: {exc}; re-tuning it")
            return None

    def measure(self, device: torch.device) -> Measure | None:
        if self._measure is not None:
            return self._measure
        return time_launch if device.type == "cuda" else None

    def prepare(self, device: torch.device) -> Prepare | None:
        if self._prepare is not None or self._measure is not None:
            return self._prepare
        return precompile if device.type == "cuda" else None

    def sm_count(self, device: torch.device) -> int | None:
        if self._sm_count is None and device.type == "cuda":
            self._sm_count = torch.cuda.get_device_properties(device).multi_processor_count
        return self._sm_count

    # ------------------------------------------------------------- resolution

    def resolve(
        self, kernel: str, rows: int, cols: int, red: int, dtype: torch.dtype, device: torch.device,
        busy: str | None, precision: str, act_class: str,
    ) -> tuple[LaunchConfig, str, str | None, bool]:  # fmt: skip
        """(config, source, note, final). Not final: the heuristic stood in for a
        tuning that could not run now (`busy` says why); the next call asks again."""
        gpu = self.model(device)
        key = shape_key(kernel, rows, cols, red, dtype, precision, act_class)
        if self.mode != "always":
            cfg = self.table(gpu).get(key)
            if cfg is not None:
                return cfg, "table", None, True
        if (gpu, key) in self._tuned:  # another shape of the same class, tuned in this process
            return self._tuned[gpu, key], "tuned", None, True
        if self.mode == "cache":
            cfg = self.cached(gpu, key)
            if cfg is not None:
                return cfg, "cache", None, True
        heuristic = heuristic_config(rows, cols, red, dtype)
        measure = self.measure(device)
        if self.mode == "off" or measure is None:
            return heuristic, "heuristic", None, True
        if busy is not None:
            return heuristic, "heuristic", f"first call during {busy}: heuristic for it, tuned on the next eager call", False
        cfg, note = self.tune(kernel, rows, cols, red, dtype, device, measure, precision, act_class)
        return (cfg, "tuned", None, True) if cfg is not None else (heuristic, "heuristic", note, True)

    def tune(
        self, kernel: str, rows: int, cols: int, red: int, dtype: torch.dtype, device: torch.device,
        measure: Measure, precision: str, act_class: str,
    ) -> tuple[LaunchConfig | None, str | None]:  # fmt: skip
        """Compile every candidate at once, time each briefly, time the finalists
        properly, keep the fastest in the cache; one progress line."""
        gpu, key = self.model(device), shape_key(kernel, rows, cols, red, dtype, precision, act_class)
        m, n, k = _mnk(kernel, rows, cols, red)
        activation = TIMED_ACTIVATION[act_class]
        cands = tuning_candidates(kernel, rows, cols, red, dtype, self.sm_count(device))
        seeds = self.seeds(gpu, kernel, rows, cols, red, dtype, precision, act_class)
        if seeds is not None:
            cands = list(dict.fromkeys([cands[0], *seeds, cands[-1]]))  # heuristic, seeds, cuBLAS
        label = f"loadbench: tuning {key} (M={m} N={n} K={k}) on {gpu}, {len(cands)} candidates"
        tty = sys.stderr.isatty()
        print(label, end="" if tty else " ...", file=sys.stderr, flush=True)
        start = time.perf_counter()
        prepare = self.prepare(device)
        compiled = 0
        if prepare is not None:
            try:
                compiled = int(prepare(kernel, m, n, k, dtype, cands, device, activation=activation))
            except Exception:  # compiling ahead is an optimisation: the timing compiles what is left
                compiled = 0

        def timed(i: int, quick: bool) -> float | None:
            try:
                ms = float(measure(kernel, m, n, k, dtype, cands[i], device, activation=activation, quick=quick))
            except Exception:  # a tile too large for this GPU's shared memory, or a route that cannot run
                return None
            return ms if math.isfinite(ms) else None

        quick: dict[int, float | None] = {}
        if len(cands) > FINALISTS + 1:
            for i in range(len(cands)):
                quick[i] = timed(i, True)
                if tty:
                    print(f"\r{label}: {i + 1}/{len(cands)}", end="", file=sys.stderr, flush=True)
            ranked = sorted((ms, i) for i, ms in quick.items() if ms is not None)  # ties: first listed
            finalists = sorted({i for _, i in ranked[:FINALISTS]} | ({0} if quick[0] is not None else set()))
        else:
            finalists = list(range(len(cands)))
        full = {i: timed(i, False) for i in finalists}
        seconds = time.perf_counter() - start
        self.tuning_seconds += seconds
        counts = self.tuning_counts
        counts["shapes"] += 1
        counts["candidates"] += len(cands)
        counts["quick"] += len(quick)
        counts["full"] += len(finalists)
        counts["compiled"] += compiled
        ranked_full = sorted((ms, i) for i, ms in full.items() if ms is not None)
        if not ranked_full:
            print(f" -> no candidate ran; heuristic ({seconds:.1f} s)", file=sys.stderr, flush=True)
            return None, "no tuning candidate ran"
        best_ms, best = ranked_full[0][0], cands[ranked_full[0][1]]
        self._finalists[gpu, key] = [cands[i] for _, i in ranked_full]
        heuristic_ms = full.get(0)  # candidate 0 is the heuristic's tile
        versus = f"heuristic {heuristic_ms * 1000:.1f} us" if heuristic_ms is not None else "heuristic not a finalist or failed"
        print(f" -> {best.describe()}: {best_ms * 1000:.1f} us ({versus}) in {seconds:.1f} s", file=sys.stderr, flush=True)
        entry = {
            "config": dataclasses.asdict(best),
            "ms": best_ms,
            "heuristic_ms": heuristic_ms,
            "shape": [m, n, k],
            "precision": precision,
            "activation": act_class,
            "timed_with": activation,
            "candidates": len(cands),
            "seeded_from": SEED_CLASSES.get(act_class) if seeds is not None else None,
            "finalists": [dataclasses.asdict(cands[i]) for _, i in ranked_full],  # fastest first
            "failed": sum(t is None for t in (quick or full).values()),
            "compiled_ahead": compiled,
            "seconds": round(seconds, 3),
            "timing": f"CUDA-graph replay, median ms per call (linear_act.replay_ms): every candidate "
            f"{QUICK_TIMING[0]} calls x {QUICK_TIMING[1]} replays, the {FINALISTS} fastest and the heuristic "
            f"{FULL_TIMING[0]} x {FULL_TIMING[1]}",
            "tuned_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        self._tuned[gpu, key] = best
        try:
            self.cache(gpu).put(key, entry)
        except OSError as exc:  # a read-only home must not stop a run: keep the tile for this process
            self._warn_once(f"{self.cache(gpu).path}: cannot store tuned tiles ({exc}); they last this process only")
        return best, None

    def seeds(
        self, gpu: str, kernel: str, rows: int, cols: int, red: int, dtype: torch.dtype, precision: str, act_class: str
    ) -> list[LaunchConfig] | None:
        """For a class SEED_CLASSES seeds: the finalists of the same shape in the seeding
        class, fastest first, from this process or the cache; None if it has none."""
        source = SEED_CLASSES.get(act_class)
        if source is None:
            return None
        key = shape_key(kernel, rows, cols, red, dtype, precision, source)
        if (gpu, key) in self._finalists:
            return self._finalists[gpu, key]
        entry = self.cache(gpu).get(key) if self.mode != "off" else None
        if not entry:
            return None
        try:
            return [LaunchConfig.from_dict(c) for c in entry["finalists"]] or None
        except (ValueError, TypeError, KeyError):  # an older entry: no finalists kept
            return None

    # ------------------------------------------------------------------- plans

    def plan(self, kernel: str, rows: int, cols: int, red: int, like: torch.Tensor, precision: str, act_class: str) -> _Plan:
        dtype, device = like.dtype, like.device
        cfg, source, note, final = self.resolve(
            kernel, rows, cols, red, dtype, device, _why_not_now(like), precision, act_class
        )
        plan = _make_plan(kernel, rows, cols, red, cfg)
        self.record(kernel, rows, cols, red, dtype, device, plan, source, note, final, precision, act_class)
        if final:
            _PLANS[(kernel, rows, cols, red, dtype, device, precision, act_class)] = plan
        return plan

    def record(self, kernel, rows, cols, red, dtype, device, plan, source, note, final, precision, act_class) -> None:  # type: ignore[no-untyped-def]
        cfg = plan.cfg
        route = cfg.describe() if cfg.backend == CUBLAS else f"triton split-K {plan.splits}" if plan.splits > 1 else "triton"
        entry: dict[str, Any] = {
            "kernel": kernel,
            "dtype": str(dtype).removeprefix("torch."),
            "precision": precision,
            "activation": act_class,
            "shape": list(_mnk(kernel, rows, cols, red)),  # M, N, K of the layer
            "device": self.model(device),
            "key": shape_key(kernel, rows, cols, red, dtype, precision, act_class),
            "source": source,
            "route": route,
            "config": dataclasses.asdict(cfg),
        }
        if note:
            entry["note"] = note
        slot = (kernel, rows, cols, red, dtype, str(device), precision, act_class)
        earlier = self.report.get(slot)
        if earlier is not None and earlier.get("deferred"):
            # A graph captured (or a trace made) before this call keeps the heuristic's tile.
            entry["fallback"] = {k: earlier[k] for k in ("config", "source", "note") if k in earlier}
        if not final:
            entry["deferred"] = True
        self.report[slot] = entry


_STATE: _Launches | None = None


def _state() -> _Launches:
    global _STATE
    if _STATE is None:
        _STATE = _Launches()
    return _STATE


def _plan(
    kernel: str, rows: int, cols: int, reduction: int, like: torch.Tensor, precision: str, act_class: str
) -> _Plan:
    """The launch plan for a call: a dict lookup after the first call of a shape."""
    if _FORCED:
        cfg = _FORCED.get(kernel)
        if cfg is not None:
            return _make_plan(kernel, rows, cols, reduction, cfg)
    try:
        return _PLANS[(kernel, rows, cols, reduction, like.dtype, like.device, precision, act_class)]
    except KeyError:
        return _state().plan(kernel, rows, cols, reduction, like, precision, act_class)
    except TypeError:  # symbolic sizes (torch.compile, dynamic shapes) do not hash: plan per trace
        return _make_plan(kernel, rows, cols, reduction, heuristic_config(rows, cols, reduction, like.dtype))


def launch_config(
    kernel: str, rows: int, cols: int, reduction: int, dtype: torch.dtype, device: torch.device | str | None = None,
    activation: int | str = "leaky_relu",
) -> LaunchConfig:  # fmt: skip
    """The tile `kernel` uses for a `rows` x `cols` output reducing over `reduction`
    (at the current float32 matmul precision): what this process already uses for the
    shape, else table, cache or heuristic. It never tunes (only a call of the op does)."""
    if kernel in _FORCED:
        return _FORCED[kernel]
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    precision, act_class = _precision(dtype), activation_class(activation)
    plan = _PLANS.get((kernel, rows, cols, reduction, dtype, device, precision, act_class))
    if plan is not None:
        return plan.cfg
    return _state().resolve(kernel, rows, cols, reduction, dtype, device, "a lookup", precision, act_class)[0]


def launch_report() -> list[dict[str, Any]]:
    """Per kernel and shape this process launched: the config, its source ('table',
    'cache', 'tuned', 'heuristic'), the route ('triton', 'triton split-K S',
    'cublas+epilogue'), the precision and activation class it was keyed by and, where
    the first call could not tune, a note (and, once tuned, a 'fallback' naming the
    tile that call used)."""
    entries = _state().report.values() if _STATE is not None else []
    order = lambda e: (e["dtype"], e["precision"], e["activation"], e["kernel"], e["shape"])  # noqa: E731
    return [json.loads(json.dumps(e)) for e in sorted(entries, key=order)]


def tuning_seconds() -> float:
    """Seconds this process spent tuning (compiling ahead and timing candidates)."""
    return _STATE.tuning_seconds if _STATE is not None else 0.0


def tuning_counts() -> dict[str, int]:
    """What this process's first-use tuning did: shapes tuned, candidates, quick and
    full timings, kernels compiled ahead."""
    return dict(_STATE.tuning_counts) if _STATE is not None else {}


def reset_launch_state(**overrides: Any) -> None:
    """Forget every plan and re-read LOADBENCH_TUNE, the table and the cache on next
    use. Tests and tools pass `_Launches` arguments (mode, cache_dir, tables,
    measure, sm_count, prepare) to replace what the environment would give."""
    global _STATE
    _PLANS.clear()
    _STATE = _Launches(**overrides) if overrides else None


def replay_ms(fn: Callable[[], object], calls: int = 20, replays: int = 10) -> float:
    """Median milliseconds per call of `fn`, `calls` calls captured in one CUDA graph
    and replayed: GPU time, not the Python launch cost that eager timing of these
    microsecond kernels would measure. Lean on purpose (a capture of 20 calls, not
    do_bench_cudagraph's hundreds): first-use tuning times some 20 candidates per
    shape, and ranking them needs a few percent, not more."""
    fn()  # compile, allocate and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return sorted(times)[len(times) // 2]


@contextlib.contextmanager
def _forcing(kernel: str, m: int, n: int, k: int, dtype: torch.dtype, cfg: LaunchConfig) -> Any:
    """Every call inside runs `cfg` for `kernel` and the heuristic's tile for the
    layer's other kernels, so nothing in it resolves or tunes (it may run inside a call
    of the op: first-use tuning); the forced tiles before it come back after."""
    before = dict(_FORCED)
    _FORCED.update({kn: heuristic_config(r, c, red, dtype) for kn, r, c, red in kernel_shapes(m, n, k)})
    _FORCED[kernel] = cfg
    try:
        yield
    finally:
        _FORCED.clear()
        _FORCED.update(before)


def _layer_tensors(m: int, n: int, k: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, ...]:
    x = torch.randn(m, k, device=device, dtype=dtype)
    w = torch.randn(n, k, device=device, dtype=dtype)
    b = torch.randn(n, device=device, dtype=dtype)
    return x, w, b


def time_launch(
    kernel: str, m: int, n: int, k: int, dtype: torch.dtype, cfg: LaunchConfig,
    device: torch.device | None = None, calls: int | None = None, replays: int | None = None,
    timer: Callable[[Callable[[], object]], float] | None = None,
    activation: str = "leaky_relu", quick: bool = False,
) -> float:  # fmt: skip
    """Milliseconds per call of `kernel` (with `cfg`) at layer shape (M, N, K), from
    CUDA-graph replay (`replay_ms`; tests pass another `timer`), with QUICK_TIMING or
    FULL_TIMING unless `calls` and `replays` say otherwise. 'dx' is timed with 'dw' (one
    launch runs both); the other kernels of the call run their heuristic tile."""
    device = torch.device("cuda") if device is None else device
    default = QUICK_TIMING if quick else FULL_TIMING
    calls, replays = calls or default[0], replays or default[1]
    timer = timer or (lambda fn: replay_ms(fn, calls, replays))
    act = ACTIVATIONS[activation]
    on_device = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    with on_device, torch.no_grad(), torch.autocast(device.type, enabled=False), _forcing(kernel, m, n, k, dtype, cfg):
        x, w, b = _layer_tensors(m, n, k, dtype, device)
        prec, cls = _precision(dtype), _CLASS_OF[act]
        y, z = _forward(x, w, b, act, prec, cls, _launch_direct)
        saved = z if act == SILU else y
        dy = torch.randn_like(y)
        if kernel == "fwd":
            return timer(lambda: _forward(x, w, b, act, prec, cls, _launch_direct))
        return timer(lambda: _backward(dy, saved, x, w, act, kernel == "dx", prec, cls, _launch_direct))


# Threads compiling candidates ahead of timing (Triton's AsyncCompileMode): compiling is
# most of first-use tuning's cost, and ptxas, a separate process per kernel, and
# Triton's passes run in parallel. Bounded so tuning does not swamp a shared host.
COMPILE_THREADS = int(os.environ.get("LOADBENCH_TUNE_THREADS") or 8)


def precompile(
    kernel: str, m: int, n: int, k: int, dtype: torch.dtype, cfgs: list[LaunchConfig], device: torch.device,
    activation: str = "leaky_relu", threads: int | None = None,
) -> int:  # fmt: skip
    """Compile every candidate's kernels for layer (M, N, K) at once, before any is
    timed: the same code path as a call, with each launch replaced by Triton's
    `warmup` (compile, no launch) under AsyncCompileMode, so the compiles run on a
    thread pool. Returns the number of candidates handed to it; 0 where Triton has no
    AsyncCompileMode or runs its interpreter. A candidate that fails to compile here
    fails again, and is skipped, when it is timed."""
    mode = getattr(triton, "AsyncCompileMode", None)
    if mode is None or os.environ.get("TRITON_INTERPRET") == "1" or not cfgs:
        return 0
    from concurrent.futures import ThreadPoolExecutor

    act = ACTIVATIONS[activation]
    prec, cls = _precision(dtype), _CLASS_OF[act]
    workers = max(1, min(threads or COMPILE_THREADS, os.cpu_count() or 1, len(cfgs)))
    on_device = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    with on_device, torch.no_grad(), torch.autocast(device.type, enabled=False), ThreadPoolExecutor(workers) as pool:
        x, w, b = _layer_tensors(m, n, k, dtype, device)
        y = torch.empty((m, n), device=device, dtype=dtype)
        try:
            compiling = mode(pool, ignore_errors=True)
        except TypeError:  # older Triton: no ignore_errors
            compiling = mode(pool)
        handed = 0
        with contextlib.suppress(Exception), compiling:
            for cfg in cfgs:
                with _forcing(kernel, m, n, k, dtype, cfg):
                    if kernel == "fwd":
                        _forward(x, w, b, act, prec, cls, _launch_warmup)
                    else:
                        _backward(y, y, x, w, act, kernel == "dx", prec, cls, _launch_warmup)
                handed += 1
    return handed


# ---------------------------------------------------------------------- launches


def _launch_traceable(fn: Any, grid: tuple, *args: Any, **kwargs: Any) -> None:
    """Inside the torch ops: wrap_triton lets torch.compile trace the launch."""
    wrap_triton(fn)[grid](*args, **kwargs)


def _launch_direct(fn: Any, grid: tuple, *args: Any, **kwargs: Any) -> None:
    """Eagerly, outside any trace: Triton's own launcher, no wrapper objects."""
    fn[grid](*args, **kwargs)


def _launch_warmup(fn: Any, grid: tuple, *args: Any, **kwargs: Any) -> None:
    """Compile only (precompile): nothing runs, the outputs stay unwritten."""
    fn.warmup(*args, grid=grid, **kwargs)


def _forward(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, activation: int, precision: str, act_class: str, launch: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """Y and, for silu, the pre-activation Z (an empty tensor otherwise)."""
    M, K = x.shape
    N = w.shape[0]
    plan = _plan("fwd", M, N, K, x, precision, act_class)
    cfg, save_z = plan.cfg, activation == SILU
    y = torch.empty((M, N), device=x.device, dtype=x.dtype)
    if cfg.backend == CUBLAS:
        z = torch.mm(x, w.t())  # cuBLAS; bias and activation in our epilogue
        launch(
            _bias_act_kernel, plan.grid,
            z, b, y, M, N, z.stride(0), z.stride(1), y.stride(0), y.stride(1), LEAKY_SLOPE,
            ACTIVATION=activation, SAVE_Z=save_z, BLOCK_M=EPILOGUE_BLOCK[0], BLOCK_N=EPILOGUE_BLOCK[1],
        )  # fmt: skip
        return y, z if save_z else torch.empty((0, N), device=x.device, dtype=x.dtype)
    z = torch.empty((M, N) if save_z else (0, N), device=x.device, dtype=x.dtype)
    launch(
        _forward_kernel, plan.grid,
        x, w, b, y, z if save_z else y, M, N, K,
        x.stride(0), x.stride(1), w.stride(0), w.stride(1), y.stride(0), y.stride(1), LEAKY_SLOPE,
        ACTIVATION=activation, SAVE_Z=save_z, PRECISION=precision,
        BLOCK_M=cfg.block_r, BLOCK_N=cfg.block_c, BLOCK_K=cfg.block_red, GROUP=cfg.group,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return y, z


def _backward(
    dy: torch.Tensor, saved: torch.Tensor, x: torch.Tensor, w: torch.Tensor, activation: int, input_grad: bool,
    precision: str, act_class: str, launch: Any,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """dX (empty unless `input_grad`), dW and db, from dY and the saved Y (or Z for silu)."""
    dy = dy.contiguous()
    M, K = x.shape
    N = w.shape[0]
    dw_plan = _plan("dw", N, K, M, x, precision, act_class)
    dx_plan = _plan("dx", M, K, N, x, precision, act_class) if input_grad else None
    db = torch.empty((N,), device=w.device, dtype=w.dtype)
    dz = None
    if dw_plan.cfg.backend == CUBLAS or (dx_plan is not None and dx_plan.cfg.backend == CUBLAS):
        # The cuBLAS route: dZ once, in the GEMMs' dtype (as the fused kernels cast it
        # before their dot), and db from fp32 dZ.
        dz = torch.empty((M, N), device=x.device, dtype=x.dtype)
        launch(
            _act_grad_kernel, (triton.cdiv(N, GRAD_BLOCK[1]),),
            dy, saved, dz, db, M, N, dy.stride(0), dy.stride(1), dz.stride(0), dz.stride(1), LEAKY_SLOPE,
            ACTIVATION=activation, BLOCK_M=GRAD_BLOCK[0], BLOCK_N=GRAD_BLOCK[1],
        )  # fmt: skip
    cfg = dw_plan.cfg
    if cfg.backend == CUBLAS:
        dw = torch.mm(dz.t(), x)  # db came with dz
    else:
        dw = torch.empty_like(w)
        split = dw_plan.splits > 1
        # split-K: every slice's partials (dW then db) in one fp32 workspace row
        ws = torch.empty((dw_plan.splits, N * K + N), device=x.device, dtype=torch.float32) if split else dw
        launch(
            _weight_grad_kernel, dw_plan.grid,
            dy, saved, x, ws if split else dw, ws if split else db, M, N, K, dw_plan.m_per_split,
            dy.stride(0), dy.stride(1), x.stride(0), x.stride(1), dw.stride(0), dw.stride(1), N * K + N, LEAKY_SLOPE,
            ACTIVATION=activation, PRECISION=precision, SPLIT=split,
            BLOCK_M=cfg.block_red, BLOCK_N=cfg.block_r, BLOCK_K=cfg.block_c, GROUP=cfg.group,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip
        if split:
            launch(
                _split_sum_kernel, dw_plan.sum_grid,
                ws, dw, db, dw_plan.splits, N, K, ws.stride(0), dw.stride(0), dw.stride(1), BLOCK=SUM_BLOCK,
            )  # fmt: skip
    if dx_plan is None:
        return torch.empty((0, K), device=x.device, dtype=x.dtype), dw, db
    cfg = dx_plan.cfg
    if cfg.backend == CUBLAS:
        return torch.mm(dz, w), dw, db
    dx = torch.empty_like(x)
    launch(
        _input_grad_kernel, dx_plan.grid,
        dy, saved, w, dx, M, N, K,
        dy.stride(0), dy.stride(1), w.stride(0), w.stride(1), dx.stride(0), dx.stride(1), LEAKY_SLOPE,
        ACTIVATION=activation, PRECISION=precision,
        BLOCK_M=cfg.block_r, BLOCK_N=cfg.block_red, BLOCK_K=cfg.block_c, GROUP=cfg.group,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return dx, dw, db


# ---------------------------------------------------------------------- torch ops


@triton_op("loadbench::linear_act_fwd", mutates_args={})
def linear_act_fwd(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, activation: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns Y and, for silu, the pre-activation Z (an empty tensor otherwise)."""
    return _forward(x, w, b, activation, _precision(x.dtype), _CLASS_OF[activation], _launch_traceable)


@triton_op("loadbench::linear_act_bwd", mutates_args={})
def linear_act_bwd(
    dy: torch.Tensor, saved: torch.Tensor, x: torch.Tensor, w: torch.Tensor, activation: int, input_grad: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dX (empty unless `input_grad`), dW and db, from dY and the saved Y (or Z for silu)."""
    prec = _precision(x.dtype)
    return _backward(dy, saved, x, w, activation, input_grad, prec, _CLASS_OF[activation], _launch_traceable)


def _setup_context(ctx, inputs, output) -> None:  # type: ignore[no-untyped-def]
    x, w, _, activation = inputs
    y, z = output
    ctx.activation = activation
    ctx.save_for_backward(x, w, z if activation == SILU else y)


def _op_backward(ctx, dy, _dz):  # type: ignore[no-untyped-def]
    x, w, saved = ctx.saved_tensors
    dx, dw, db = linear_act_bwd(dy, saved, x, w, ctx.activation, ctx.needs_input_grad[0])
    return (dx if ctx.needs_input_grad[0] else None), dw, db, None


linear_act_fwd.register_autograd(_op_backward, setup_context=_setup_context)
AUTOCAST_DTYPE = torch.bfloat16
for _device in ("cuda", "cpu"):
    # Our op takes its dtype from its inputs: under autocast, cast them the way
    # autocast casts a linear layer's.
    torch.library.register_autocast("loadbench::linear_act_fwd", _device, AUTOCAST_DTYPE)


class _EagerLinearAct(torch.autograd.Function):
    """The same forward and backward as the ops, for eager calls: no dispatcher round
    trip through the custom op (and its autograd and autocast wrappers), no wrap_triton
    objects per launch. torch.compile never sees it (`linear_act` takes the op path
    while tracing), so the ops stay what compile, export and opcheck work with."""

    @staticmethod
    def forward(ctx, x, w, b, activation):  # type: ignore[no-untyped-def]
        prec, cls = _precision(x.dtype), _CLASS_OF[activation]
        y, z = _forward(x, w, b, activation, prec, cls, _launch_direct)
        ctx.activation = activation
        ctx.save_for_backward(x, w, z if activation == SILU else y)
        return y

    @staticmethod
    def backward(ctx, dy):  # type: ignore[no-untyped-def]
        x, w, saved = ctx.saved_tensors
        act, want_dx = ctx.activation, ctx.needs_input_grad[0]
        dx, dw, db = _backward(dy, saved, x, w, act, want_dx, _precision(x.dtype), _CLASS_OF[act], _launch_direct)
        return (dx if want_dx else None), dw, db, None


_PLAIN = (torch.Tensor, torch.nn.Parameter)
try:  # a module flag torch keeps up to date on every mode's entry and exit (infra modes too)
    from torch.utils._python_dispatch import is_in_torch_dispatch_mode as _in_dispatch_mode
except ImportError:  # pragma: no cover - older torch

    def _in_dispatch_mode() -> bool:
        return bool(torch._C._len_torch_dispatch_stack())


def _eager(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a call may skip the op: plain tensors, no torch.compile trace and no
    dispatch mode (fake tensors, make_fx, FlopCounter) that must see the op."""
    return (
        type(x) in _PLAIN and type(w) in _PLAIN and type(b) in _PLAIN
        and not torch.compiler.is_compiling() and not _in_dispatch_mode()
    )  # fmt: skip


def _autocast_cast(t: torch.Tensor) -> torch.Tensor:
    """What the op's autocast rule does to an input (torch.library.register_autocast)."""
    return t.to(AUTOCAST_DTYPE) if t.is_floating_point() and t.dtype is not torch.float64 else t


def linear_act(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, activation: str = "identity") -> torch.Tensor:
    """act(x @ w.T + b) through the fused kernels; `activation` is a name in ACTIVATIONS."""
    code = ACTIVATIONS.get(activation)
    if code is None:
        raise ValueError(f"activation {activation!r}: expected one of {', '.join(ACTIVATIONS)}")
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1] or b.shape != (w.shape[0],):
        raise ValueError(f"linear_act: shapes x {tuple(x.shape)}, w {tuple(w.shape)}, b {tuple(b.shape)} do not fit")
    if not _eager(x, w, b):
        return linear_act_fwd(x, w, b, code)[0]
    if torch.is_autocast_enabled(x.device.type):
        kind = x.device.type
        x, w, b = (_autocast_cast(t) if t.device.type == kind else t for t in (x, w, b))
    return _EagerLinearAct.apply(x, w, b, code)
