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

Launch configurations come from `launch_config`: a table per GPU model
and shape class measured offline by kernels/tune.py and checked in, with a heuristic
for shapes it does not cover; nothing is autotuned on the hot path. The ops are declared with
`torch.library.triton_op`, so they run eagerly, under torch.compile, inside CUDA-graph
capture and, with TRITON_INTERPRET=1, on CPU tensors.

The structure follows Triton's matrix-multiplication tutorial (grouped program order,
masked loads); the fused prologue, the bias-gradient reduction and the op wiring are
ours.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl
from torch.library import triton_op
from torch.library import wrap_triton

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
    # Pointers
    dy_ptr, s_ptr, x_ptr, dw_ptr, db_ptr,
    # Matrix dimensions
    M, N, K,
    # Strides
    stride_dm, stride_dn, stride_xm, stride_xk, stride_wn, stride_wk,
    slope,
    # Meta-parameters
    ACTIVATION: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr,
):  # fmt: skip
    pid_n, pid_k = _tile_ids(tl.program_id(0).to(tl.int64), N, K, BLOCK_N, BLOCK_K, GROUP)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    offs_m = tl.arange(0, BLOCK_M)
    d_off = offs_n[:, None] * stride_dn + offs_m[None, :] * stride_dm  # dZ.T tile (N, M)
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    bias = tl.zeros((BLOCK_N,), dtype=tl.float32)
    bias_lost = tl.zeros((BLOCK_N,), dtype=tl.float32)  # Kahan: db is a long sequential sum over M
    for m in range(0, tl.cdiv(M, BLOCK_M)):
        m_left = M - m * BLOCK_M
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
    out = offs_n[:, None] * stride_wn + offs_k[None, :] * stride_wk
    tl.store(dw_ptr + out, acc.to(dw_ptr.dtype.element_ty), mask=mask)
    if pid_k == 0:
        tl.store(db_ptr + offs_n, bias.to(db_ptr.dtype.element_ty), mask=offs_n < N)


# ----------------------------------------------------------------- launch table


@dataclass(frozen=True)
class LaunchConfig:
    block_r: int  # rows of the output tile
    block_c: int  # columns of the output tile
    block_red: int  # reduction step
    num_warps: int
    num_stages: int
    group: int = 8


def _pow2_at_least(n: int, low: int, high: int) -> int:
    return max(low, min(high, triton.next_power_of_2(n)))


# Tuned configurations: kernels/launch_table.json, written by `python -m kernels.tune`
# on each GPU model, keyed by GPU name, then "kernel:dtype:rows:cols" with rows and
# cols rounded up to powers of two (the shape class). Shapes without an entry use
# `heuristic_config`.
TABLE_PATH = Path(__file__).with_name("launch_table.json")
KERNELS = ("fwd", "dw", "dx")


def _load_table() -> dict[str, LaunchConfig]:
    if not torch.cuda.is_available() or not TABLE_PATH.is_file():
        return {}
    table = json.loads(TABLE_PATH.read_text()).get(torch.cuda.get_device_name(), {})
    return {key: LaunchConfig(**cfg) for key, cfg in table.get("configs", {}).items()}


_TABLE = _load_table()
_FORCED: dict[str, LaunchConfig] = {}  # set only by kernels/tune.py while it measures


def shape_key(kernel: str, rows: int, cols: int, dtype: torch.dtype) -> str:
    bucket = lambda n: max(16, triton.next_power_of_2(n))  # noqa: E731
    return f"{kernel}:{str(dtype).removeprefix('torch.')}:{bucket(rows)}:{bucket(cols)}"


def launch_config(kernel: str, rows: int, cols: int, reduction: int, dtype: torch.dtype) -> LaunchConfig:
    """The tile for `kernel` writing a `rows` x `cols` output, reducing over `reduction`."""
    if kernel in _FORCED:
        return _FORCED[kernel]
    return _TABLE.get(shape_key(kernel, rows, cols, dtype)) or heuristic_config(rows, cols, reduction, dtype)


def heuristic_config(rows: int, cols: int, reduction: int, dtype: torch.dtype) -> LaunchConfig:
    """A tile no larger than the output (the head has 10 columns, the first layer
    reduces over 75); small outputs (batch <= 512 at width <= 512) split into 64 x 32
    tiles so there are enough programs for the SMs; tl.dot needs every side >= 16. A
    16-bit dtype moves twice the reduction per stage."""
    red_max = 64 if dtype.itemsize == 2 else 32
    block_c = _pow2_at_least(cols, 16, 128)
    block_r = _pow2_at_least(rows, 16, 128)
    block_red = _pow2_at_least(reduction, 16, red_max)
    if rows * cols <= 512 * 512:
        block_r, block_c = min(block_r, 64), min(block_c, 32 if cols > 32 else block_c)
    warps = 8 if block_r * block_c >= 128 * 128 else 4
    return LaunchConfig(block_r, block_c, block_red, warps, 3)


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


def _grid(rows: int, cols: int, cfg: LaunchConfig) -> tuple[int]:
    return (triton.cdiv(rows, cfg.block_r) * triton.cdiv(cols, cfg.block_c),)


# ---------------------------------------------------------------------- torch ops


@triton_op("loadbench::linear_act_fwd", mutates_args={})
def linear_act_fwd(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, activation: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns Y and, for silu, the pre-activation Z (an empty tensor otherwise)."""
    M, K = x.shape
    N = w.shape[0]
    y = torch.empty((M, N), device=x.device, dtype=x.dtype)
    z = torch.empty((M, N) if activation == SILU else (0, N), device=x.device, dtype=x.dtype)
    cfg = launch_config("fwd", M, N, K, x.dtype)
    wrap_triton(_forward_kernel)[_grid(M, N, cfg)](
        x, w, b, y, z if activation == SILU else y, M, N, K,
        x.stride(0), x.stride(1), w.stride(0), w.stride(1), y.stride(0), y.stride(1), LEAKY_SLOPE,
        ACTIVATION=activation, SAVE_Z=activation == SILU, PRECISION=_precision(x.dtype),
        BLOCK_M=cfg.block_r, BLOCK_N=cfg.block_c, BLOCK_K=cfg.block_red, GROUP=cfg.group,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return y, z


@triton_op("loadbench::linear_act_bwd", mutates_args={})
def linear_act_bwd(
    dy: torch.Tensor, saved: torch.Tensor, x: torch.Tensor, w: torch.Tensor, activation: int, input_grad: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dX (empty unless `input_grad`), dW and db, from dY and the saved Y (or Z for silu)."""
    dy = dy.contiguous()
    M, K = x.shape
    N = w.shape[0]
    precision = _precision(x.dtype)
    dw = torch.empty_like(w)
    db = torch.empty((N,), device=w.device, dtype=w.dtype)
    cfg = launch_config("dw", N, K, M, x.dtype)
    wrap_triton(_weight_grad_kernel)[_grid(N, K, cfg)](
        dy, saved, x, dw, db, M, N, K,
        dy.stride(0), dy.stride(1), x.stride(0), x.stride(1), dw.stride(0), dw.stride(1), LEAKY_SLOPE,
        ACTIVATION=activation, PRECISION=precision,
        BLOCK_M=cfg.block_red, BLOCK_N=cfg.block_r, BLOCK_K=cfg.block_c, GROUP=cfg.group,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    if not input_grad:
        return torch.empty((0, K), device=x.device, dtype=x.dtype), dw, db
    dx = torch.empty_like(x)
    cfg = launch_config("dx", M, K, N, x.dtype)
    wrap_triton(_input_grad_kernel)[_grid(M, K, cfg)](
        dy, saved, w, dx, M, N, K,
        dy.stride(0), dy.stride(1), w.stride(0), w.stride(1), dx.stride(0), dx.stride(1), LEAKY_SLOPE,
        ACTIVATION=activation, PRECISION=precision,
        BLOCK_M=cfg.block_r, BLOCK_N=cfg.block_red, BLOCK_K=cfg.block_c, GROUP=cfg.group,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return dx, dw, db


def _setup_context(ctx, inputs, output) -> None:  # type: ignore[no-untyped-def]
    x, w, _, activation = inputs
    y, z = output
    ctx.activation = activation
    ctx.save_for_backward(x, w, z if activation == SILU else y)


def _backward(ctx, dy, _dz):  # type: ignore[no-untyped-def]
    x, w, saved = ctx.saved_tensors
    dx, dw, db = linear_act_bwd(dy, saved, x, w, ctx.activation, ctx.needs_input_grad[0])
    return (dx if ctx.needs_input_grad[0] else None), dw, db, None


linear_act_fwd.register_autograd(_backward, setup_context=_setup_context)
for _device in ("cuda", "cpu"):
    # Our op takes its dtype from its inputs: under autocast, cast them the way
    # autocast casts a linear layer's.
    torch.library.register_autocast("loadbench::linear_act_fwd", _device, torch.bfloat16)


def linear_act(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, activation: str = "identity") -> torch.Tensor:
    """act(x @ w.T + b) through the fused kernels; `activation` is a name in ACTIVATIONS."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation {activation!r}: expected one of {', '.join(ACTIVATIONS)}")
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1] or b.shape != (w.shape[0],):
        raise ValueError(f"linear_act: shapes x {tuple(x.shape)}, w {tuple(w.shape)}, b {tuple(b.shape)} do not fit")
    return linear_act_fwd(x, w, b, ACTIVATIONS[activation])[0]
