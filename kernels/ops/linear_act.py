"""Fused linear + bias + activation, forward and backward: Y = act(X @ W.T + b).

X (M, K), W (N, K), b (N,), Y (M, N). Backward turns dY into dZ = dY * act'(.) in
the GEMMs' prologue, from the saved output (the saved pre-activation for silu).
Under autocast W and b stay fp32 (master weights): X arrives in bf16, W is rounded in
registers, dW and db are written in fp32. fp32 follows torch's float32 matmul
precision; 'highest' runs LOADBENCH_STRICT_FP32's mode ('tf32x3' or 'ieee').
Routes per kernel and shape, from kernels/plan/launches.py: 'triton' (the fused kernels),
split-K for dW (deterministic partial sums), 'cublas' (torch.mm plus our epilogue/prologue
kernel), 'gemv' (forward, at most 16 rows), 'presplit' (kernels/ops/presplit.py).
Entry points: `linear_act` (one layer) and `linear_act_stack` (the MLP's layers; one
autograd node eagerly, one launch for a gradient-free forward of a few rows through
mlp_forward). The ops are torch.library triton_ops (torch.compile, CUDA-graph capture,
TRITON_INTERPRET=1 on CPU); eager calls skip the dispatcher through an autograd.Function
running the same launch code. Design notes, measurements: docs/kernels.md.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
import triton
import triton.language as tl
from torch.library import triton_op
from torch.library import wrap_triton

from kernels.ops import mlp_forward
from kernels.ops import presplit
from kernels.ops.activations import LEAKY_SLOPE
from kernels.ops.activations import activation
from kernels.ops.activations import activation_grad
from kernels.ops.presplit import split_hi
from kernels.ops.tiles import epilogue
from kernels.ops.tiles import tile_ids
from kernels.runtime import direct_launch
from kernels.runtime.torch_internals import in_dispatch_mode
from kernels.plan.launch_plan import ACTIVATION_CODES
from kernels.plan.launch_plan import CUBLAS
from kernels.plan.launch_plan import EPILOGUE_BLOCK
from kernels.plan.launch_plan import GEMV
from kernels.plan.launch_plan import GRAD_BLOCK
from kernels.plan.launch_plan import PRESPLIT
from kernels.plan.launch_plan import SILU
from kernels.plan.launch_plan import SUM_BLOCK
from kernels.plan.launch_plan import CLASS_OF
from kernels.plan.launch_plan import precision_for
from kernels.plan.launch_plan import cdiv
from kernels.plan.launches import plan_for
from kernels.plan.trials import use_launch_code

# Re-exported for the op's callers: the strict-fp32 mode the kernels run (bench/plugin
# reads it; to change it, set kernels.plan.launch_plan.STRICT_FP32) and what ran (README).
from kernels.plan.launch_plan import STRICT_FP32  # noqa: F401
from kernels.plan.launches import launch_report  # noqa: F401


# ----------------------------------------------------------------------- kernels


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
):
    pid_m, pid_n = tile_ids(tl.program_id(0).to(tl.int64), M, N, BLOCK_M, BLOCK_N, GROUP)
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
        acc = tl.dot(a, b.to(x_ptr.dtype.element_ty), acc, input_precision=PRECISION)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk
    epilogue(acc, b_ptr, y_ptr, z_ptr, offs_m, offs_n, M, N, stride_ym, stride_yn, slope, ACTIVATION, SAVE_Z)


@triton.jit
def _forward_gemv_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, z_ptr,
    M, N, K,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yn,
    slope,
    ACTIVATION: tl.constexpr, SAVE_Z: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """The gemv route's forward, for a few rows: each program a strip of BLOCK_N output
    columns for all BLOCK_M rows, products on the FMA units in fp32 (W rounded to X's
    dtype first, as the tensor-core kernel does), the same epilogue."""
    offs_n = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.program_id(1).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk
    w_ptrs = w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :] * stride_wk  # W rows, contiguous along K
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(x_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_left), other=0.0).to(tl.float32)
        w = tl.load(w_ptrs, mask=(offs_n[:, None] < N) & (offs_k[None, :] < k_left), other=0.0)
        w = w.to(x_ptr.dtype.element_ty).to(tl.float32)
        acc += tl.sum(a[:, None, :] * w[None, :, :], axis=2)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk
    epilogue(acc, b_ptr, y_ptr, z_ptr, offs_m, offs_n, M, N, stride_ym, stride_yn, slope, ACTIVATION, SAVE_Z)


@triton.jit
def _input_grad_kernel(
    # Pointers
    dy_ptr, s_ptr, w_ptr, dx_ptr,
    # Matrix dimensions
    M, N, K,
    # Strides (dy and the saved tensor share strides)
    stride_dm, stride_dn, stride_wn, stride_wk, stride_xm, stride_xk,
    slope, one,
    # Meta-parameters
    ACTIVATION: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr,
):
    pid_m, pid_k = tile_ids(tl.program_id(0).to(tl.int64), M, K, BLOCK_M, BLOCK_K, GROUP)
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
        dz = activation_grad(dy, saved, ACTIVATION, slope, one).to(dx_ptr.dtype.element_ty)
        w = tl.load(w_ptrs, mask=(offs_n[:, None] < n_left) & (offs_k[None, :] < K), other=0.0)
        acc = tl.dot(dz, w.to(dx_ptr.dtype.element_ty), acc, input_precision=PRECISION)
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
    slope, one,
    # Meta-parameters
    ACTIVATION: tl.constexpr, PRECISION: tl.constexpr, SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr,
):
    pid_n, pid_k = tile_ids(tl.program_id(0).to(tl.int64), N, K, BLOCK_N, BLOCK_K, GROUP)
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
        dz = activation_grad(dy, saved, ACTIVATION, slope, one)
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
):
    """The cuBLAS route's forward epilogue: Y = act(Z + b) from torch.mm's Z; for silu
    Z + b (the pre-activation the backward needs) is written back over Z."""
    offs_m = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    z_off = offs_m[:, None] * stride_zm + offs_n[None, :] * stride_zn
    z = tl.load(z_ptr + z_off, mask=mask, other=0.0).to(tl.float32)
    z += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    y = activation(z, ACTIVATION, slope)
    tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :] * stride_yn, y.to(y_ptr.dtype.element_ty), mask=mask)
    if SAVE_Z:
        tl.store(z_ptr + z_off, z.to(z_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _act_grad_kernel(
    dy_ptr, s_ptr, dz_ptr, db_ptr, lo_ptr, t_ptr, t_lo_ptr,
    M, N, stride_dm, stride_dn, stride_zm, stride_zn, stride_tn, stride_tm, slope,
    ACTIVATION: tl.constexpr, SPLIT: tl.constexpr, SPLIT_T: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """The cuBLAS and presplit routes' backward prologue: dZ and db, each program a
    strip of columns walking the batch, so db is one compensated sum in a fixed order,
    as in the fused weight-gradient kernel. dZ goes to dz_ptr in the GEMMs' dtype or,
    for the presplit route, as TF32 parts: with SPLIT hi to dz_ptr and lo to lo_ptr
    (dZ's layout), with SPLIT_T hi to t_ptr and lo to t_lo_ptr (dZ transposed)."""
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
        dz = activation_grad(dy, saved, ACTIVATION, slope, 1.0)  # no GEMM here: a literal will do
        z_off = rows[:, None] * stride_zm + offs_n[None, :] * stride_zn
        if SPLIT or SPLIT_T:
            hi = split_hi(dz)
            if SPLIT:
                tl.store(dz_ptr + z_off, hi, mask=mask)
                tl.store(lo_ptr + z_off, dz - hi, mask=mask)
            if SPLIT_T:
                t_off = offs_n[None, :] * stride_tn + rows[:, None] * stride_tm
                tl.store(t_ptr + t_off, hi, mask=mask)
                tl.store(t_lo_ptr + t_off, dz - hi, mask=mask)
        else:
            tl.store(dz_ptr + z_off, dz.to(dz_ptr.dtype.element_ty), mask=mask)
        part = tl.sum(dz, axis=0) - bias_lost
        total = bias + part
        bias_lost = (total - bias) - part
        bias = total
    tl.store(db_ptr + offs_n, (bias - bias_lost).to(db_ptr.dtype.element_ty), mask=offs_n < N)


# ---------------------------------------------------------------------- launches


def _launch_traceable(fn: Any, grid: tuple, *args: Any, **kwargs: Any) -> None:
    """Inside the torch ops: wrap_triton lets torch.compile trace the launch."""
    wrap_triton(fn)[grid](*args, **kwargs)


def _uncaptured(t: torch.Tensor) -> bool:
    """Whether a call on `t`'s device runs now, not into a CUDA graph being captured."""
    return not (t.is_cuda and torch.cuda.is_current_stream_capturing())


_BLAS_READY = threading.local()


def _fused_instead_of_cublas(t: torch.Tensor) -> None:
    """Before an uncaptured call runs a cuBLAS-route kernel's fused finalist: make sure
    this thread has its cuBLAS handle. A capture of the same code later takes the cuBLAS
    route, and cuBLAS cannot create a handle inside a capture (CUBLAS_STATUS_NOT_
    INITIALIZED); handles are per thread, and autograd runs the backward in its own."""
    if not t.is_cuda:
        return
    ready = getattr(_BLAS_READY, "devices", None)
    if ready is None:
        ready = _BLAS_READY.devices = set()
    if t.device.index not in ready:
        with torch.cuda.device(t.device):
            torch.cuda.current_blas_handle()
        ready.add(t.device.index)


# Eagerly, outside any trace: the compiled kernel's launcher, Triton's binding done once
# per launch signature (kernels/runtime/direct_launch.py). Bound by name, not wrapped: a wrapper
# would pack and unpack the twenty-odd arguments of every launch once more.
_launch_direct = direct_launch.launch


def _split(t: torch.Tensor, launch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """t's TF32 parts (hi, lo), contiguous, for the presplit route's second operand."""
    hi, lo = (torch.empty(t.shape, device=t.device, dtype=torch.float32) for _ in "hl")
    rows, cols = t.shape
    launch(presplit._split_kernel, (cdiv(rows, presplit.SPLIT_BLOCK[0]), cdiv(cols, presplit.SPLIT_BLOCK[1])),
           t, hi, lo, rows, cols, *t.stride(), BLOCK_R=presplit.SPLIT_BLOCK[0], BLOCK_C=presplit.SPLIT_BLOCK[1])
    return hi, lo


def _launch_product(
    launch: Any, plan: Any, a: torch.Tensor, b_hi: torch.Tensor, b_lo: torch.Tensor, c: torch.Tensor,
    bias: torch.Tensor | None = None, z: torch.Tensor | None = None, activation: int = 0,
) -> None:
    """c = a @ (b_hi + b_lo) through the presplit route's kernel, views as they come
    (b's parts contiguous along the reduction); with `bias`, the forward's epilogue:
    c = act(a @ b + bias), and for silu the pre-activation into `z`."""
    cfg = plan.cfg
    launch(
        presplit._product_kernel, plan.grid,
        a, b_hi, b_lo, c, c if bias is None else bias, c if z is None else z, c.shape[0], c.shape[1], a.shape[1],
        *a.stride(), *b_hi.stride(), *c.stride(), LEAKY_SLOPE,
        ACTIVATION=activation, SAVE_Z=z is not None, EPILOGUE=bias is not None,
        BLOCK_M=cfg.block_r, BLOCK_N=cfg.block_c, BLOCK_K=cfg.block_red, GROUP=cfg.group,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )


def _forward(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, activation: int, precision: str, act_class: str, launch: Any
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Y and, for silu, the pre-activation Z (None otherwise: the op wraps that in an
    empty tensor, the eager path saves an allocation per layer)."""
    M, K = x.shape
    N = w.shape[0]
    plan = plan_for("fwd", M, N, K, x, precision, act_class)
    if plan.eager is not None and launch is not _launch_traceable and _uncaptured(x):
        _fused_instead_of_cublas(x)
        plan = plan.eager  # the host bounds an uncaptured call: the fused kernel (kernels/plan/launches.py)
    cfg, save_z = plan.cfg, activation == SILU
    y = torch.empty((M, N), device=x.device, dtype=x.dtype)
    if cfg.backend == CUBLAS:
        # cuBLAS (linear: the transpose and the GEMM in one call); bias and activation in our epilogue
        z = torch.nn.functional.linear(x, w if w.dtype == x.dtype else w.to(x.dtype))
        launch(
            _bias_act_kernel, plan.grid,
            z, b, y, M, N, *z.stride(), *y.stride(), LEAKY_SLOPE,
            ACTIVATION=activation, SAVE_Z=save_z, BLOCK_M=EPILOGUE_BLOCK[0], BLOCK_N=EPILOGUE_BLOCK[1],
        )
        return y, z if save_z else None
    z = torch.empty((M, N), device=x.device, dtype=x.dtype) if save_z else None
    if cfg.backend == PRESPLIT:  # Y = X @ W.T: B = W.T, whose reduction is W's contiguous dimension
        w_hi, w_lo = _split(w, launch)
        _launch_product(launch, plan, x, w_hi.t(), w_lo.t(), y, bias=b, z=z, activation=activation)
        return y, z
    if cfg.backend == GEMV:
        launch(
            _forward_gemv_kernel, plan.grid,
            x, w, b, y, z if save_z else y, M, N, K,
            *x.stride(), *w.stride(), *y.stride(), LEAKY_SLOPE,
            ACTIVATION=activation, SAVE_Z=save_z, BLOCK_M=cfg.block_r, BLOCK_N=cfg.block_c, BLOCK_K=cfg.block_red,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
        return y, z
    launch(
        _forward_kernel, plan.grid,
        x, w, b, y, z if save_z else y, M, N, K,
        *x.stride(), *w.stride(), *y.stride(), LEAKY_SLOPE,
        ACTIVATION=activation, SAVE_Z=save_z, PRECISION=precision,
        BLOCK_M=cfg.block_r, BLOCK_N=cfg.block_c, BLOCK_K=cfg.block_red, GROUP=cfg.group,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return y, z


def _backward(
    dy: torch.Tensor, saved: torch.Tensor, x: torch.Tensor, w: torch.Tensor, activation: int, input_grad: bool,
    precision: str, act_class: str, launch: Any,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """dX (None unless `input_grad`), dW and db, from dY and the saved Y (or Z for silu)."""
    dy = dy.contiguous()
    M, K = x.shape
    N = w.shape[0]
    dw_plan = plan_for("dw", N, K, M, x, precision, act_class)
    dx_plan = plan_for("dx", M, K, N, x, precision, act_class) if input_grad else None
    if launch is not _launch_traceable and (dw_plan.eager or (dx_plan and dx_plan.eager)) and _uncaptured(x):
        _fused_instead_of_cublas(x)
        dw_plan = dw_plan.eager or dw_plan
        dx_plan = dx_plan and (dx_plan.eager or dx_plan)
    db = torch.empty((N,), device=w.device, dtype=w.dtype)
    dz = None
    routes = (dw_plan.cfg.backend, dx_plan.cfg.backend if dx_plan is not None else None)
    if PRESPLIT in routes:
        # The presplit route: dZ once, as TF32 parts (dX's product reads them in dZ's
        # layout, dW's transposed: each along its reduction), and db from fp32 dZ.
        split, split_t = routes[1] == PRESPLIT, routes[0] == PRESPLIT
        dz_hi, dz_lo = (torch.empty((M, N) if split else (0,), device=x.device, dtype=torch.float32) for _ in "hl")
        dzt_hi, dzt_lo = (torch.empty((N, M) if split_t else (0,), device=x.device, dtype=torch.float32)
                          for _ in "hl")
        launch(
            _act_grad_kernel, (cdiv(N, GRAD_BLOCK[1]),),
            dy, saved, dz_hi, db, dz_lo, dzt_hi, dzt_lo, M, N, *dy.stride(), N, 1, M, 1, LEAKY_SLOPE,
            ACTIVATION=activation, SPLIT=split, SPLIT_T=split_t, BLOCK_M=GRAD_BLOCK[0], BLOCK_N=GRAD_BLOCK[1],
        )
        if CUBLAS in routes:  # the other kernel on cuBLAS: dZ = hi + lo, exactly
            dz = (dz_hi + dz_lo) if split else (dzt_hi + dzt_lo).t()
    elif CUBLAS in routes:
        # The cuBLAS route: dZ once, in the GEMMs' dtype (as the fused kernels cast it
        # before their dot), and db from fp32 dZ.
        dz = torch.empty((M, N), device=x.device, dtype=x.dtype)
        launch(
            _act_grad_kernel, (cdiv(N, GRAD_BLOCK[1]),),
            dy, saved, dz, db, dz, dz, dz, M, N, *dy.stride(), *dz.stride(), 0, 0, LEAKY_SLOPE,
            ACTIVATION=activation, SPLIT=False, SPLIT_T=False, BLOCK_M=GRAD_BLOCK[0], BLOCK_N=GRAD_BLOCK[1],
        )
    cfg = dw_plan.cfg
    if cfg.backend == PRESPLIT:
        # dW.T = X.T @ dZ: B = dZ, along the batch in dZ's transposed parts; C stored transposed
        dw = torch.empty_like(w)
        _launch_product(launch, dw_plan, x.t(), dzt_hi.t(), dzt_lo.t(), dw.t())
    elif cfg.backend == CUBLAS:
        dw = torch.mm(dz.t(), x)  # db came with dz
        dw = dw if dw.dtype == w.dtype else dw.to(w.dtype)
    else:
        dw = torch.empty_like(w)
        split = dw_plan.splits > 1
        # split-K: every slice's partials (dW then db) in one fp32 workspace row
        ws = torch.empty((dw_plan.splits, N * K + N), device=x.device, dtype=torch.float32) if split else dw
        launch(
            _weight_grad_kernel, dw_plan.grid,
            dy, saved, x, ws if split else dw, ws if split else db, M, N, K, dw_plan.m_per_split,
            *dy.stride(), *x.stride(), *dw.stride(), N * K + N, LEAKY_SLOPE, 1.0,
            ACTIVATION=activation, PRECISION=precision, SPLIT=split,
            BLOCK_M=cfg.block_red, BLOCK_N=cfg.block_r, BLOCK_K=cfg.block_c, GROUP=cfg.group,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
        if split:
            launch(
                _split_sum_kernel, dw_plan.sum_grid,
                ws, dw, db, dw_plan.splits, N, K, ws.stride(0), *dw.stride(), BLOCK=SUM_BLOCK,
            )
    if dx_plan is None:
        return None, dw, db
    cfg = dx_plan.cfg
    if cfg.backend == PRESPLIT:
        # dX.T = W.T @ dZ.T: B = dZ.T, along the columns in dZ's parts; C stored transposed
        dx = torch.empty_like(x)
        _launch_product(launch, dx_plan, w.t(), dz_hi.t(), dz_lo.t(), dx.t())
        return dx, dw, db
    if cfg.backend == CUBLAS:
        return torch.mm(dz, w if w.dtype == dz.dtype else w.to(dz.dtype)), dw, db
    dx = torch.empty_like(x)
    launch(
        _input_grad_kernel, dx_plan.grid,
        dy, saved, w, dx, M, N, K,
        *dy.stride(), *w.stride(), *dx.stride(), LEAKY_SLOPE, 1.0,
        ACTIVATION=activation, PRECISION=precision,
        BLOCK_M=cfg.block_r, BLOCK_N=cfg.block_red, BLOCK_K=cfg.block_c, GROUP=cfg.group,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return dx, dw, db


# First-use tuning times candidates and compiles them ahead through this launch code.
use_launch_code(_forward, _backward, _launch_direct)


# ---------------------------------------------------------------------- torch ops


@triton_op("loadbench::linear_act_fwd", mutates_args={})
def linear_act_fwd(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor,
                   activation: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns Y and, for silu, the pre-activation Z (an empty tensor otherwise)."""
    y, z = _forward(x, w, b, activation, precision_for(x.dtype), CLASS_OF[activation], _launch_traceable)
    return y, z if z is not None else x.new_empty((0, w.shape[0]))


@triton_op("loadbench::linear_act_bwd", mutates_args={})
def linear_act_bwd(
    dy: torch.Tensor, saved: torch.Tensor, x: torch.Tensor, w: torch.Tensor, activation: int, input_grad: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dX (empty unless `input_grad`), dW and db, from dY and the saved Y (or Z for silu)."""
    prec = precision_for(x.dtype)
    dx, dw, db = _backward(dy, saved, x, w, activation, input_grad, prec, CLASS_OF[activation], _launch_traceable)
    return (dx if dx is not None else x.new_empty((0, x.shape[1]))), dw, db


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
        prec, cls = precision_for(x.dtype), CLASS_OF[activation]
        y, z = _forward(x, w, b, activation, prec, cls, _launch_direct)
        ctx.activation = activation
        ctx.save_for_backward(x, w, z if activation == SILU else y)
        return y

    @staticmethod
    def backward(ctx, dy):  # type: ignore[no-untyped-def]
        x, w, saved = ctx.saved_tensors
        act, want_dx = ctx.activation, ctx.needs_input_grad[0]
        dx, dw, db = _backward(dy, saved, x, w, act, want_dx, precision_for(x.dtype), CLASS_OF[act], _launch_direct)
        return (dx if want_dx else None), dw, db, None


class _EagerStack(torch.autograd.Function):
    """Several layers in a row as one autograd node, for eager calls: the launches of
    _EagerLinearAct layer by layer, without a Function call and a backward node per
    layer: a Function call costs more than a small layer's launches (docs/kernels.md)."""

    @staticmethod
    def forward(ctx, x, activations, *params):  # type: ignore[no-untyped-def]
        n = len(activations)
        weights, biases = params[:n], params[n:]
        prec = precision_for(x.dtype)
        inputs, saved = [], []
        for w, b, act in zip(weights, biases, activations):
            y, z = _forward(x, w, b, act, prec, CLASS_OF[act], _launch_direct)
            inputs.append(x)
            saved.append(z if act == SILU else y)
            x = y
        ctx.activations = activations
        ctx.save_for_backward(*inputs, *weights, *saved)
        return x

    @staticmethod
    def backward(ctx, dy):  # type: ignore[no-untyped-def]
        acts = ctx.activations
        n = len(acts)
        tensors = ctx.saved_tensors
        inputs, weights, saved = tensors[:n], tensors[n : 2 * n], tensors[2 * n :]
        prec = precision_for(inputs[0].dtype)
        dws: list[torch.Tensor] = [None] * n  # type: ignore[list-item]
        dbs: list[torch.Tensor] = [None] * n  # type: ignore[list-item]
        want_dx = ctx.needs_input_grad[0]
        for i in reversed(range(n)):
            dy, dws[i], dbs[i] = _backward(
                dy, saved[i], inputs[i], weights[i], acts[i], i > 0 or want_dx, prec, CLASS_OF[acts[i]], _launch_direct
            )
        return (dy if want_dx else None), None, *dws, *dbs


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _eager(*tensors: torch.Tensor) -> bool:
    """Whether a call may skip the op: plain tensors, no torch.compile trace and no
    dispatch mode (fake tensors, make_fx, FlopCounter) that must see the op."""
    return (
        all(type(t) in _PLAIN for t in tensors) and not torch.compiler.is_compiling() and not in_dispatch_mode()
    )


def _autocast_input(x: torch.Tensor) -> torch.Tensor:
    """What autocast does to a linear layer's input, in the autocast's own dtype; the
    eager path leaves W and b as they are (the kernels round W in registers). The op's
    registered autocast rule, which torch.compile traces, casts all three to bf16."""
    if not x.is_floating_point() or x.dtype is torch.float64:
        return x
    return x.to(torch.get_autocast_dtype(x.device.type))


def linear_act(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, activation: str = "identity") -> torch.Tensor:
    """act(x @ w.T + b) through the fused kernels; `activation` is a name in ACTIVATION_CODES."""
    code = ACTIVATION_CODES.get(activation)
    if code is None:
        raise ValueError(f"activation {activation!r}: expected one of {', '.join(ACTIVATION_CODES)}")
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1] or b.shape != (w.shape[0],):
        raise ValueError(f"linear_act: shapes x {tuple(x.shape)}, w {tuple(w.shape)}, b {tuple(b.shape)} do not fit")
    if not _eager(x, w, b):
        return linear_act_fwd(x, w, b, code)[0]
    if torch.is_autocast_enabled(x.device.type):
        x = _autocast_input(x)
    return _EagerLinearAct.apply(x, w, b, code)


def _layer_by_layer(x: torch.Tensor, weights: list, biases: list, activations: list[str]) -> torch.Tensor:
    for w, b, name in zip(weights, biases, activations):
        x = linear_act(x, w, b, name)
    return x


def linear_act_stack(
    x: torch.Tensor, weights: list[torch.Tensor], biases: list[torch.Tensor], activations: list[str]
) -> torch.Tensor:
    """Layers in a row, each act_i(h @ W_i.T + b_i): what `linear_act` gives called layer
    by layer, the same launches and bits. Eagerly and outside CUDA-graph capture the
    stack is one autograd node (one Function call and one backward node instead of one
    per layer). Under capture each layer keeps its own node, so gradient hooks (the
    data-parallel graph loop's bucketed all-reduces) fire layer by layer, as they do
    under torch.compile, which always sees the per-layer ops. Without gradients, a
    forward of at most 16 rows (serving) is one launch for all layers where each layer
    fits a strip per program, eagerly and under capture (kernels/ops/mlp_forward.py, which
    says where it does not); its sums run in another order than the
    layer kernels', so its bits may differ from theirs in the last places."""
    if not (len(weights) == len(biases) == len(activations) > 0):
        raise ValueError(f"linear_act_stack: {len(weights)} weights, {len(biases)} biases, "
                         f"{len(activations)} activations")
    codes = []
    for i, name in enumerate(activations):
        code = ACTIVATION_CODES.get(name)
        if code is None:
            raise ValueError(f"layer {i}: activation {name!r}: expected one of {', '.join(ACTIVATION_CODES)}")
        codes.append(code)
    if not _eager(x, *weights, *biases):
        return _layer_by_layer(x, weights, biases, activations)
    width = x.shape[-1] if x.dim() == 2 else None
    for i, (w, b) in enumerate(zip(weights, biases)):
        if w.dim() != 2 or w.shape[1] != width or b.shape != (w.shape[0],):
            shapes = f"input {tuple(x.shape) if i == 0 else ('?', width)}, w {tuple(w.shape)}, b {tuple(b.shape)}"
            raise ValueError(f"linear_act_stack: layer {i}: shapes {shapes} do not fit")
        width = w.shape[0]
    if torch.is_autocast_enabled(x.device.type):
        x = _autocast_input(x)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (x, *weights, *biases))
    if not grad:
        if mlp_forward.usable(x, weights, biases):
            y = mlp_forward.fused_forward(x, weights, biases, codes)
            if y is not None:
                return y
    if x.is_cuda and torch.cuda.is_current_stream_capturing():
        return _layer_by_layer(x, weights, biases, activations)
    return _EagerStack.apply(x, tuple(codes), *weights, *biases)
