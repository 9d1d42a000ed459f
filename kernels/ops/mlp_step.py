"""The whole MLP training step in one launch: forward, loss, backward and optimizer update.

P programs (one or two per SM, all resident) walk the step in phases: the hidden forward
tiles; the head (logits, loss, G_{L-1}, G_{L-2}); then per layer its input-gradient
tiles beside the next layer's weight-gradient tiles, the optimizer in their epilogue;
last dW_1 and dW_0. Between phases either a grid barrier, or (Blocks.flags) each tile
waits on counters for the tiles it reads, and a weight's update for its last readers.
At TF32 and bf16 the backward tiles read transposed copies of W, A and G (bf16 at bf16);
with 64-column tiles every hidden product runs transposed (Hopper's wgmma). Each dW tile
is reduced by one program in order: a step is deterministic and its bits do not depend
on P. Parameters, gradients and state are a FlatOptimizer's, so either route continues
the other's run. Under the interpreter P = 1 and every wait passes at once, so CPU tests
run this code; a wait that polls too long sets a flag `check` raises on, rather than
hang the device. The trainer takes this route under LOADBENCH_FUSED_STEP=auto (the
default) where it was measured faster. Docs: fused-step.md, step-budget.md (the options).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.ground import env
from kernels.ops.activations import LEAKY_SLOPE
from kernels.ops.activations import activation
from kernels.ops.activations import activation_grad
from kernels.ops.optim import STATE
from kernels.ops.optim import FlatOptimizer
from kernels.ops.optim import adagrad_update
from kernels.ops.optim import adam_update
from kernels.ops.optim import constants
from kernels.ops.optim import rmsprop_update
from kernels.ops.optim import sgd_update
from kernels.ops.presplit import split_hi
from kernels.plan.launch_plan import ACTIVATION_CODES
from kernels.plan.launch_plan import STRICT_FP32
from kernels.plan.launch_plan import cdiv
from kernels.plan.launch_plan import next_power_of_2

INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"
_INTERPRETED = tl.constexpr(INTERPRETER)
MAX_CLASSES = 64  # the head tile holds a row's logits whole
MAX_SCRATCH_BYTES = 1 << 30
SPIN_LIMIT = 1 << 20  # barrier polls before giving up: about half a second, thousands of phases
ALGORITHMS = {"adam": 0, "sgd": 1, "adagrad": 2, "rmsprop": 3}
DOTS = {"fp32": None, "tf32": "tf32", "bf16": "bf16"}  # fp32: STRICT_FP32's mode ('tf32x3' or 'ieee')
HYPERPARAMETERS = ("LR", "WEIGHT_DECAY", "EPS", "BETA1", "BETA2", "LOG2_BETA1", "LOG2_BETA2", "MOMENTUM", "LR_DECAY",
                   "ALPHA")


# Where this step was measured faster than the layer kernels (the five experiments, each
# axis moved alone; docs/fused-step.md): 'auto' takes it there and nowhere else.
AUTO_MAX_DEPTH = 5
AUTO_MAX_WIDTH = 512
AUTO_MIN_ROWS = 64
ALL_COPIES = 3  # Blocks.copies: W, A and G transposed (in bf16 at bf16)
# Blocks.swap: every hidden product transposed, the weight tiles' (4) too since db's rows
# got their own load (before, they gave different bits run to run; docs/fused-step.md).
SWAP_CHOSEN = 7


def switch_from_env(value: str | None) -> str:
    """LOADBENCH_FUSED_STEP: '1' (this step wherever it fits), '0' (the layer kernels) or
    'auto' (the default: this step on a CUDA GPU where it was measured faster)."""
    return env.parse("LOADBENCH_FUSED_STEP", value)


def auto_refusal(widths: list[int], rows: int, cuda: bool) -> str | None:
    """Why 'auto' keeps a model of these layer widths (hidden then head), trained on
    batches of `rows`, on the layer kernels; None where it takes this step. `cuda`: the
    kernel compiles for a GPU (not Triton's interpreter)."""
    if not cuda:
        return "auto: no CUDA GPU"
    hidden = widths[:-1]
    if len(hidden) > AUTO_MAX_DEPTH:
        return f"auto: {len(hidden)} hidden layers > {AUTO_MAX_DEPTH}"
    if max(hidden) > AUTO_MAX_WIDTH:
        return f"auto: width {max(hidden)} > {AUTO_MAX_WIDTH}"
    if rows < AUTO_MIN_ROWS:
        return f"auto: batch {rows} < {AUTO_MIN_ROWS}"
    return None


SWITCH = env.read_at_import("LOADBENCH_FUSED_STEP")  # a bad value: refused by every entry point (env.check)


# ----------------------------------------------------------------------- kernels


@triton.jit
def _dot(a, b, acc, DOT: tl.constexpr):
    """acc + a @ b in fp32: bf16 operands for 'bf16', else fp32 at input precision DOT."""
    if DOT == "bf16":
        if _INTERPRETED:  # its bf16 dot multiplies raw bits; bf16 products are exact in fp32
            return tl.dot(a.to(tl.bfloat16).to(tl.float32), b.to(tl.bfloat16).to(tl.float32), acc,
                          input_precision="ieee")
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)
    elif DOT == "tf32x3 chains":
        # 3xTF32 as three independent chains of MMAs, each from zero, summed in fp32 after
        # each reduction step. Triton's tf32x3 chains the three products one after another
        # (a_lo b_hi, then a_hi b_lo, then a_hi b_hi into the same accumulator), so each waits
        # for the last. `zero` is not a constant: Triton folds x + dot(a, b, 0) into
        # dot(a, b, x), which would chain them again; the running sum stays out of the
        # MMA, whose accumulation drops low bits of what it adds. Inf operands give NaN.
        a_hi = split_hi(a)
        b_hi = split_hi(b)
        zero = acc * 0.0
        lo_hi = tl.dot(a - a_hi, b_hi, zero, input_precision="tf32")
        hi_lo = tl.dot(a_hi, b - b_hi, zero, input_precision="tf32")
        hi_hi = tl.dot(a_hi, b_hi, zero, input_precision="tf32")
        return acc + (hi_hi + (lo_hi + hi_lo))
    else:
        return tl.dot(a, b, acc, input_precision=DOT)


@triton.jit
def _zeros(BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SWAP: tl.constexpr):
    """A tile's fp32 accumulator: (BLOCK_M, BLOCK_N), or with SWAP its transpose."""
    if SWAP:
        return tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        return tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)


@triton.jit
def _mma(a, b, acc, DOT: tl.constexpr, SWAP: tl.constexpr):
    """acc + a @ b as _dot does; with SWAP, acc holds the transpose and gets b.T @ a.T:
    the MMA's M is then b's columns, so a 64-column tile of 16 rows takes Hopper's
    warpgroup MMA (wgmma needs M = 64 for four warps) rather than mma.sync."""
    if SWAP:
        return _dot(tl.trans(b), tl.trans(a), acc, DOT)
    else:
        return _dot(a, b, acc, DOT)


@triton.jit
def _unswap(acc, SWAP: tl.constexpr):
    """The (rows, columns) tile from an accumulator _mma filled."""
    if SWAP:
        return tl.trans(acc)
    else:
        return acc


@triton.jit
def _stamp(times_ptr, column, TIMING: tl.constexpr):
    """With TIMING, this program's %globaltimer (ns) into its row of times_ptr (docs only)."""
    if TIMING:
        tl.store(times_ptr + tl.program_id(0) * 32 + column, tl.extra.cuda.globaltimer())


@triton.jit
def _inner(times_ptr, column, TIMING: tl.constexpr, L: tl.constexpr):
    """With TIMING, a stamp inside the first two forward phases (columns 20-27; docs
    only), where the phases' own columns leave them free (L < 6)."""
    if L < 6:
        _stamp(times_ptr, column, TIMING)


@triton.jit
def _first(pid, P, base, BALANCE: tl.constexpr):
    """This program's first tile of a phase that follows `base` tiles of the step's earlier
    phases: with BALANCE the step's tiles are dealt out as one sequence, program p taking
    every P-th from p, so the programs a phase left without a tile take the next phase's
    first ones; without, every phase deals from program 0."""
    if BALANCE:
        return (pid + P - base % P) % P
    else:
        return pid


@triton.jit
def _part(length, s, SPLIT: tl.constexpr, STEP: tl.constexpr):
    """Part s of SPLIT of a reduction over `length` as (lo, hi): whole steps of STEP,
    the parts as equal as that allows, the last one short."""
    if SPLIT == 1:
        return 0, length
    else:
        size = tl.cdiv(tl.cdiv(length, STEP), SPLIT) * STEP
        return tl.multiple_of(s * size, STEP), tl.minimum(length, (s + 1) * size)


@triton.jit
def _barrier(bar_ptr, flag_ptr, P, SPIN: tl.constexpr, times_ptr, slot, TIMING: tl.constexpr):
    """Wait until all P programs have arrived. The counter only grows, by P per barrier,
    so an arrival's old value names its barrier; after SPIN polls the program sets
    the flag and goes on (a wrong result, caught by `check`, rather than a hung device)."""
    tl.debug_barrier()
    _stamp(times_ptr, 1 + 2 * slot, TIMING)
    old = tl.atomic_add(bar_ptr, 1, sem="acq_rel", scope="gpu")
    target = old - old % P + P
    seen = old + 1
    polls = 0
    # Poll with plain loads (an atomic per poll from every SM queues behind the arrivals
    # on the counter's one L2 slice), then one acquiring read orders what follows.
    while (seen < target) & (polls < SPIN):
        seen = tl.load(bar_ptr, volatile=True)
        polls += 1
    seen = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
    if seen < target:
        tl.atomic_xchg(flag_ptr, 1)
    _stamp(times_ptr, 2 + 2 * slot, TIMING)
    tl.debug_barrier()


@triton.jit
def _wait(ctr_ptr, target, flag_ptr, SPIN: tl.constexpr):
    """Wait until the counter at ctr_ptr reaches `target` (its producers' signals), then
    order this program's later reads after their writes; after SPIN polls set the flag
    and go on, as _barrier does."""
    seen = tl.atomic_add(ctr_ptr, 0, sem="acquire", scope="gpu")
    polls = 0
    while (seen < target) & (polls < SPIN):
        seen = tl.load(ctr_ptr, volatile=True)
        polls += 1
    if polls > 0:
        seen = tl.atomic_add(ctr_ptr, 0, sem="acquire", scope="gpu")
    if seen < target:
        tl.atomic_xchg(flag_ptr, 1)
    tl.debug_barrier()


@triton.jit
def _signal(ctr_ptr, other_ptr, OTHER: tl.constexpr):
    """Count a finished tile at ctr_ptr (and at other_ptr with OTHER), after all of its
    threads' stores: a consumer that waits for the count reads what the tile wrote."""
    tl.debug_barrier()
    tl.atomic_add(ctr_ptr, 1, sem="release", scope="gpu")
    if OTHER:
        tl.atomic_add(other_ptr, 1, sem="release", scope="gpu")


@triton.jit
def _phase_end(bar_ptr, flag_ptr, P, SPIN: tl.constexpr, times_ptr, slot, TIMING: tl.constexpr,
               FLAGS: tl.constexpr):
    """The end of a phase: a grid barrier, or with FLAGS (tiles wait for the tiles they
    read) only the stamps, arrival and departure at once."""
    if FLAGS:
        _stamp(times_ptr, 1 + 2 * slot, TIMING)
        _stamp(times_ptr, 2 + 2 * slot, TIMING)
    else:
        _barrier(bar_ptr, flag_ptr, P, SPIN, times_ptr, slot, TIMING)


@triton.jit
def _rows_of(x_ptr, idx_ptr, offs_m, M, F, GATHER: tl.constexpr, a_ptr, W_MAX):
    """Row starts of a layer input: X's rows at the batch's indices, or scratch rows."""
    if GATHER:
        return x_ptr + tl.load(idx_ptr + offs_m, mask=offs_m < M, other=0) * F
    else:
        return a_ptr + offs_m.to(tl.int64) * W_MAX


@triton.jit
def _load_a(rows, offs_k, offs_m, M, K, GATHER: tl.constexpr, EVEN: tl.constexpr = False):
    """The (rows, offs_k) tile of a layer input in fp32, zero outside (M, K); with EVEN
    unmasked (the caller's rows and columns lie inside the scratch plane)."""
    mask = (offs_m[:, None] < M) & (offs_k[None, :] < K)
    if EVEN:
        return tl.load(rows[:, None] + offs_k[None, :], cache_modifier=".cg")
    elif GATHER:
        return tl.load(rows[:, None] + offs_k[None, :], mask=mask, other=0.0).to(tl.float32)
    else:  # written by other programs this launch: read through L2, not a stale L1 line
        return tl.load(rows[:, None] + offs_k[None, :], mask=mask, other=0.0, cache_modifier=".cg")


@triton.jit
def _store_t(t_ptr, tile, offs_m, offs_c, M, M16, M_PAD, C):
    """A (rows offs_m, columns offs_c) tile of a scratch matrix into its transposed copy
    (column c at c * M_PAD), rows M to M16 as zeros, so readers load up to M16 aligned."""
    tile = tl.where(offs_m[:, None] < M, tile, 0.0)
    tl.store(t_ptr + offs_c[None, :].to(tl.int64) * M_PAD + offs_m[:, None], tile.to(t_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < M16) & (offs_c[None, :] < C))


@triton.jit
def _descriptors(a_ptr, a_rows, a_cols, A_BLOCK_R: tl.constexpr, A_BLOCK_C: tl.constexpr, a_stride,
                 b_ptr, b_rows, b_cols, B_BLOCK_R: tl.constexpr, B_BLOCK_C: tl.constexpr, b_stride, TMA: tl.constexpr):
    """With TMA, tensor-memory descriptors of two row-major operands (rows x cols, `stride`
    elements apart, read in blocks of BLOCK_R x BLOCK_C, zero outside): a tile's loads
    are then one instruction each, not per-element addresses. Else the two pointers, which
    the tiles then leave unread: Triton 3.6 cannot return None from a JIT function."""
    if TMA:
        return (tl.make_tensor_descriptor(a_ptr, shape=[a_rows, a_cols], strides=[a_stride, 1],
                                          block_shape=[A_BLOCK_R, A_BLOCK_C]),
                tl.make_tensor_descriptor(b_ptr, shape=[b_rows, b_cols], strides=[b_stride, 1],
                                          block_shape=[B_BLOCK_R, B_BLOCK_C]))
    else:
        return a_ptr, b_ptr


@triton.jit
def _async_reads(TMA: tl.constexpr):
    """With TMA, order the tensor-memory loads that follow (the async proxy) after the
    writes a wait just acquired and this program's own (the generic proxy)."""
    if TMA:
        if not _INTERPRETED:
            tl.inline_asm_elementwise("fence.proxy.async.global; mov.u32 $0, $1;", "=r,r",
                                      [tl.full((1,), 0, tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _finish(acc, at, mask, s, pair_ptr, flag_ptr, SPLIT: tl.constexpr, SPIN: tl.constexpr):
    """A tile whose reduction is split over SPLIT (1 or 2) parts, each its own work item:
    part 0 stores its sum at `at` (where the tile's result goes) and counts it at
    pair_ptr; the last part waits for that count and returns the partial + its own sum.
    The sum's order is fixed, so the bits do not depend on which programs took the parts.
    Returns (the tile's sum, whether this part finishes the tile)."""
    if SPLIT == 1:
        return acc, True
    else:
        last = s == SPLIT - 1
        if last:
            _wait(pair_ptr, SPLIT - 1, flag_ptr, SPIN)
            acc = tl.load(at, mask=mask, other=0.0, cache_modifier=".cg") + acc
        else:
            tl.store(at, acc, mask=mask)
            _signal(pair_ptr, pair_ptr, False)
        return acc, last


@triton.jit
def _forward_tile(
    t, x_ptr, idx_ptr, a_ptr, w_ptr, b_ptr, out_ptr, z_ptr, a_t_ptr, out_t_ptr, w_t_ptr, M, M16, M_PAD, N, K, F,
    F_PAD, W_MAX, slope, lo, hi, s, pair_ptr, flag_ptr, times_ptr, stamp, a_desc, w_desc, TMA: tl.constexpr,
    TIMING: tl.constexpr, L: tl.constexpr, GATHER: tl.constexpr, SAVE_Z: tl.constexpr,
    ACTIVATION: tl.constexpr, DOT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    COPIES: tl.constexpr, EVEN: tl.constexpr, SWAP: tl.constexpr, SPLIT: tl.constexpr, SPIN: tl.constexpr,
):
    """Tile t of A_{i+1} = act(A_i @ W_i.T + b_i) (and Z_i for silu) into scratch. With
    GATHER, the tiles of column 0 also copy the batch's rows of X into a_ptr, zero-padded
    to F_PAD columns, so that dW_0 reads them aligned rather than gathers them again.
    With COPIES & 2 the tile also writes A_{i+1} transposed (out_t_ptr; X's copy to
    a_t_ptr), and with COPIES & 1 and no GATHER its share of W_i transposed (w_t_ptr),
    for the backward tiles (see _input_grad_tile, _weight_tile). EVEN (not with GATHER):
    the product's loads go unmasked (see _step_kernel). SWAP: see _mma. The tile reduces
    K's part [lo, hi), part s of SPLIT (see _finish). TMA (not with GATHER): A_i and W_i
    through the descriptors a_desc and w_desc (_descriptors)."""
    tiles_n = tl.cdiv(N, BLOCK_N)
    row_block = t // tiles_n
    offs_m = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = (t % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    rows = _rows_of(x_ptr, idx_ptr, offs_m, M, F, GATHER, a_ptr, W_MAX)
    acc = _zeros(BLOCK_M, BLOCK_N, SWAP)
    for k0 in range(lo, hi, BLOCK_K):
        if TMA:
            a = a_desc.load([tl.cast(row_block * BLOCK_M, tl.int32), tl.cast(k0, tl.int32)])
        else:
            a = _load_a(rows, k0 + offs_k, offs_m, M, K, GATHER, EVEN)
        if GATHER:
            if t % tiles_n == 0:
                rows_x = a
                if SWAP:
                    # The copy loads the rows again: a swapped product's operand that is also
                    # read into registers got one shared-memory buffer too few from Triton's
                    # pipeliner (3.6 and 3.9), so a load for a later step overwrote the
                    # buffer while the asynchronous wgmma still read it. ".cv" keeps the
                    # two loads apart (docs/fused-step.md).
                    rows_x = tl.load(rows[:, None] + (k0 + offs_k)[None, :], cache_modifier=".cv",
                                     mask=(offs_m[:, None] < M) & ((k0 + offs_k)[None, :] < K), other=0.0)
                copy = (offs_m[:, None] < M) & ((k0 + offs_k)[None, :] < F_PAD)
                tl.store(a_ptr + offs_m[:, None].to(tl.int64) * W_MAX + (k0 + offs_k)[None, :], rows_x, mask=copy)
                if COPIES & 2:  # rows M to M16 as zeros: dW_0 reads up to M16, aligned
                    tl.store(a_t_ptr + (k0 + offs_k)[None, :].to(tl.int64) * M_PAD + offs_m[:, None],
                             rows_x.to(a_t_ptr.dtype.element_ty),
                             mask=(offs_m[:, None] < M16) & ((k0 + offs_k)[None, :] < F_PAD))
        if TMA:
            w = tl.trans(w_desc.load([tl.cast((t % tiles_n) * BLOCK_N, tl.int32), tl.cast(k0, tl.int32)]))
        elif EVEN:
            w = tl.load(w_ptr + offs_n[None, :] * K + (k0 + offs_k)[:, None])
        else:
            w = tl.load(w_ptr + offs_n[None, :] * K + (k0 + offs_k)[:, None],
                        mask=(offs_n[None, :] < N) & ((k0 + offs_k)[:, None] < K), other=0.0)
        acc = _mma(a, w, acc, DOT, SWAP)
    _inner(times_ptr, stamp, TIMING, L)  # the product's end
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    out = offs_m[:, None].to(tl.int64) * W_MAX + offs_n[None, :]
    z, last = _finish(_unswap(acc, SWAP), out_ptr + out, mask, s, pair_ptr, flag_ptr, SPLIT, SPIN)
    if last:
        z += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0)[None, :]
        a_next = activation(z, ACTIVATION, slope)
        tl.store(out_ptr + out, a_next, mask=mask)
        if SAVE_Z:
            tl.store(z_ptr + out, z, mask=mask)
        if COPIES & 2:
            _store_t(out_t_ptr, a_next, offs_m, offs_n, M, M16, M_PAD, N)
        if (COPIES & 1) and not GATHER:
            # W_i^T for G_{i-1} = G_i W_i: chunk j of K by row block j mod the row blocks, once
            # each, after the product (stored inside its loop, it stalled the loop's pipeline).
            for k0 in range(row_block * BLOCK_K, K, tl.cdiv(M, BLOCK_M) * BLOCK_K):
                w_mask = (offs_n[None, :] < N) & ((k0 + offs_k)[:, None] < K)
                w = tl.load(w_ptr + offs_n[None, :] * K + (k0 + offs_k)[:, None], mask=w_mask, other=0.0)
                tl.store(w_t_ptr + (k0 + offs_k)[:, None].to(tl.int64) * W_MAX + offs_n[None, :],
                         w.to(w_t_ptr.dtype.element_ty), mask=w_mask)


@triton.jit
def _head_tile(
    t, y_ptr, idx_ptr, a_ptr, saved_ptr, w_ptr, b_ptr, g_ptr, g_prev_ptr, g_t_ptr, g_prev_t_ptr, part_ptr, M, M16,
    M_PAD, C, K, W_MAX, inv_m, slope, one, ACTIVATION: tl.constexpr, DOT: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr, HEAD_K: tl.constexpr, COPIES: tl.constexpr,
):
    """Tile t = (rows r, columns c) of the head: the logits of BLOCK_M rows, and from them
    G_{L-2} = (G_{L-1} @ W_{L-1}) * act'(.) for column block c of BLOCK_K. Every column
    block of a row block recomputes its rows' logits (a few MFLOP) so that the phase has
    as many tiles as G_{L-2}, not one per row block; block 0 stores G_{L-1} and the rows'
    summed loss into part_ptr[r]."""
    chunks = tl.cdiv(K, BLOCK_K)
    r = t // chunks
    offs_m = r * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_c = tl.arange(0, BLOCK_C)
    offs_k = tl.arange(0, HEAD_K)
    row_ok = offs_m < M
    col_ok = offs_c < C
    rows = a_ptr + offs_m.to(tl.int64) * W_MAX
    acc = tl.zeros((BLOCK_M, BLOCK_C), dtype=tl.float32)
    for k0 in range(0, K, HEAD_K):
        a = _load_a(rows, k0 + offs_k, offs_m, M, K, False)
        w = tl.load(w_ptr + offs_c[None, :] * K + (k0 + offs_k)[:, None],
                    mask=col_ok[None, :] & ((k0 + offs_k)[:, None] < K), other=0.0)
        acc = _dot(a, w, acc, DOT)
    z = acc + tl.load(b_ptr + offs_c, mask=col_ok, other=0.0)[None, :]
    z = tl.where(col_ok[None, :], z, float("-inf"))
    peak = tl.max(z, axis=1)
    e = tl.exp(z - peak[:, None])
    total = tl.sum(e, axis=1)
    lse = peak + tl.log(total)
    target = tl.load(y_ptr + tl.load(idx_ptr + offs_m, mask=row_ok, other=0), mask=row_ok, other=0)
    hit = offs_c[None, :] == target[:, None]
    g = (e / total[:, None] - hit.to(tl.float32)) * inv_m
    g = tl.where(row_ok[:, None] & col_ok[None, :], g, 0.0)
    if t % chunks == 0:
        loss = lse - tl.sum(tl.where(hit, z, 0.0), axis=1)
        tl.store(part_ptr + r, tl.sum(tl.where(row_ok, loss, 0.0), axis=0))
        tl.store(g_ptr + offs_m[:, None].to(tl.int64) * W_MAX + offs_c[None, :], g,
                 mask=row_ok[:, None] & col_ok[None, :])
        if COPIES & 2:
            _store_t(g_t_ptr, g, offs_m, offs_c, M, M16, M_PAD, C)
    cols = (t % chunks) * BLOCK_K + tl.arange(0, BLOCK_K)
    w = tl.load(w_ptr + offs_c[:, None] * K + cols[None, :], mask=col_ok[:, None] & (cols[None, :] < K), other=0.0)
    dh = _dot(g, w, tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32), DOT)
    out = offs_m[:, None].to(tl.int64) * W_MAX + cols[None, :]
    mask = row_ok[:, None] & (cols[None, :] < K)
    saved = tl.load(saved_ptr + out, mask=mask, other=0.0, cache_modifier=".cg")
    g_prev = activation_grad(dh, saved, ACTIVATION, slope, one)
    tl.store(g_prev_ptr + out, g_prev, mask=mask)
    if COPIES & 2:
        _store_t(g_prev_t_ptr, g_prev, offs_m, cols, M, M16, M_PAD, K)


@triton.jit
def _input_grad_tile(
    t, g_ptr, saved_ptr, w_ptr, w_t_ptr, g_prev_ptr, g_prev_t_ptr, M, M16, M_PAD, N, K, W_MAX, slope, one, lo, hi, s,
    pair_ptr, flag_ptr, g_desc, w_desc, ACTIVATION: tl.constexpr, DOT: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, COPIES: tl.constexpr, EVEN: tl.constexpr, SWAP: tl.constexpr,
    SPLIT: tl.constexpr, SPIN: tl.constexpr, TMA: tl.constexpr,
):
    """Tile t of G_{i-1} = (G_i @ W_i) * act'(.): (M, K) out, reduced over W_i's N rows.
    With COPIES & 1, W_i comes from its transposed copy (N contiguous, so the MMA's operand
    loads whole from shared memory); with COPIES & 2, G_{i-1} also goes out transposed.
    EVEN: the product's loads go unmasked (see _step_kernel). SWAP: see _mma. The tile
    reduces N's part [lo, hi), part s of SPLIT (see _finish). TMA: G_i and W_i (or its
    copy) through the descriptors g_desc and w_desc (_descriptors)."""
    tiles_k = tl.cdiv(K, BLOCK_N)
    offs_m = (t // tiles_k) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = (t % tiles_k) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_r = tl.arange(0, BLOCK_K)
    rows = g_ptr + offs_m.to(tl.int64) * W_MAX
    acc = _zeros(BLOCK_M, BLOCK_N, SWAP)
    for n0 in range(lo, hi, BLOCK_K):
        if TMA:
            g = g_desc.load([tl.cast((t // tiles_k) * BLOCK_M, tl.int32), tl.cast(n0, tl.int32)])
        else:
            g = _load_a(rows, n0 + offs_r, offs_m, M, N, False, EVEN)
        w_mask = ((n0 + offs_r)[:, None] < N) & (offs_k[None, :] < K)
        if TMA:
            if COPIES & 1:  # W_i^T's rows are W_i's columns: a (BLOCK_N, BLOCK_K) block, transposed
                w = tl.trans(w_desc.load([tl.cast((t % tiles_k) * BLOCK_N, tl.int32), tl.cast(n0, tl.int32)]))
            else:
                w = w_desc.load([tl.cast(n0, tl.int32), tl.cast((t % tiles_k) * BLOCK_N, tl.int32)])
        elif COPIES & 1:
            w_t = w_t_ptr + offs_k[None, :].to(tl.int64) * W_MAX + (n0 + offs_r)[:, None]
            if EVEN:
                w = tl.load(w_t, cache_modifier=".cg")
            else:
                w = tl.load(w_t, mask=w_mask, other=0.0, cache_modifier=".cg")
        elif EVEN:
            w = tl.load(w_ptr + (n0 + offs_r)[:, None] * K + offs_k[None, :])
        else:
            w = tl.load(w_ptr + (n0 + offs_r)[:, None] * K + offs_k[None, :], mask=w_mask, other=0.0)
        acc = _mma(g, w, acc, DOT, SWAP)
    out = offs_m[:, None].to(tl.int64) * W_MAX + offs_k[None, :]
    mask = (offs_m[:, None] < M) & (offs_k[None, :] < K)
    dh, last = _finish(_unswap(acc, SWAP), g_prev_ptr + out, mask, s, pair_ptr, flag_ptr, SPLIT, SPIN)
    if last:
        saved = tl.load(saved_ptr + out, mask=mask, other=0.0, cache_modifier=".cg")
        g_prev = activation_grad(dh, saved, ACTIVATION, slope, one)
        tl.store(g_prev_ptr + out, g_prev, mask=mask)
        if COPIES & 2:
            _store_t(g_prev_t_ptr, g_prev, offs_m, offs_k, M, M16, M_PAD, K)


@triton.jit
def _update(
    p_ptr, g_ptr, s1_ptr, s2_ptr, offs, mask, grad, step, STORE_GRAD: tl.constexpr,
    ALGORITHM: tl.constexpr, LR: tl.constexpr, WEIGHT_DECAY: tl.constexpr, EPS: tl.constexpr, BETA1: tl.constexpr,
    BETA2: tl.constexpr, LOG2_BETA1: tl.constexpr, LOG2_BETA2: tl.constexpr, MOMENTUM: tl.constexpr,
    LR_DECAY: tl.constexpr, ALPHA: tl.constexpr,
):
    """Apply the optimizer with `grad` to the parameters and state at offs (and, with
    STORE_GRAD, store `grad` there first)."""
    if STORE_GRAD:
        tl.store(g_ptr + offs, grad, mask=mask)
    p = tl.load(p_ptr + offs, mask=mask)
    s1 = tl.load(s1_ptr + offs, mask=mask)
    if ALGORITHM == 0:
        p, s1, s2 = adam_update(p, grad, s1, tl.load(s2_ptr + offs, mask=mask), step,
                                LR, BETA1, BETA2, LOG2_BETA1, LOG2_BETA2, EPS, WEIGHT_DECAY)
        tl.store(s2_ptr + offs, s2, mask=mask)
    elif ALGORITHM == 1:
        p, s1 = sgd_update(p, grad, s1, LR, MOMENTUM, WEIGHT_DECAY)
    elif ALGORITHM == 2:
        p, s1 = adagrad_update(p, grad, s1, step, LR, LR_DECAY, EPS, WEIGHT_DECAY)
    else:
        p, s1 = rmsprop_update(p, grad, s1, LR, ALPHA, EPS, WEIGHT_DECAY)
    tl.store(p_ptr + offs, p, mask=mask)
    tl.store(s1_ptr + offs, s1, mask=mask)


@triton.jit
def _weight_operands(
    g_ptr, a_ptr, g_t_ptr, a_t_ptr, offs_b, offs_n, offs_k, rows, N_LOAD, K_LOAD, M_PAD, W_MAX, COPIES: tl.constexpr,
    BATCH_MASK: tl.constexpr, SWAP: tl.constexpr, gt_desc, at_desc, first_n, first_k, m0, TMA: tl.constexpr,
):
    """G_i.T's (offs_n, offs_b) and A_i's (offs_b, offs_k) tiles for dW_i, from the
    transposed copies with COPIES & 2; zero past N_LOAD and K_LOAD, and with BATCH_MASK
    past `rows` of the batch; and G_i.T's tile again for db's sum (with SWAP or TMA its own
    load). TMA (with COPIES & 2): the two products' tiles through the copies' descriptors,
    blocks at (first_n, m0) and (first_k, m0)."""
    if COPIES & 2:
        g_at = g_t_ptr + offs_n[:, None].to(tl.int64) * M_PAD + offs_b[None, :]
        a_at = a_t_ptr + offs_k[None, :].to(tl.int64) * M_PAD + offs_b[:, None]
    else:
        g_at = g_ptr + offs_b[None, :].to(tl.int64) * W_MAX + offs_n[:, None]
        a_at = a_ptr + offs_b[:, None].to(tl.int64) * W_MAX + offs_k[None, :]
    g_mask = offs_n[:, None] < N_LOAD
    a_mask = offs_k[None, :] < K_LOAD
    if BATCH_MASK:
        g_mask = g_mask & (offs_b[None, :] < rows)
        a_mask = a_mask & (offs_b[:, None] < rows)
    if TMA:
        gt = gt_desc.load([tl.cast(first_n, tl.int32), tl.cast(m0, tl.int32)])
        a = tl.trans(at_desc.load([tl.cast(first_k, tl.int32), tl.cast(m0, tl.int32)]))
    else:
        gt = tl.load(g_at, mask=g_mask, other=0.0, cache_modifier=".cg")
        a = tl.load(a_at, mask=a_mask, other=0.0, cache_modifier=".cg")
    if SWAP or TMA:  # db's rows loaded apart from the swapped MMA's operand (see _forward_tile)
        g_rows = tl.load(g_at, mask=g_mask, other=0.0, cache_modifier=".cv")
    else:
        g_rows = gt
    return gt, a, g_rows


@triton.jit
def _weight_tile(
    t, a_ptr, g_ptr, a_t_ptr, g_t_ptr, p_ptr, grad_ptr, s1_ptr, s2_ptr, w_off, b_off, M, M16, M_PAD, N, N_LOAD, K,
    K_LOAD, W_MAX, step, ready_ptr, ready, flag_ptr, lo, hi, s, pair_ptr, gt_desc, at_desc, TMA: tl.constexpr,
    DOT: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, CHUNK: tl.constexpr, COPIES: tl.constexpr, FLAGS: tl.constexpr,
    BATCH_TAIL: tl.constexpr, SWAP: tl.constexpr, SPIN: tl.constexpr, SPLIT: tl.constexpr,
    ALGORITHM: tl.constexpr, LR: tl.constexpr, WEIGHT_DECAY: tl.constexpr, EPS: tl.constexpr, BETA1: tl.constexpr,
    BETA2: tl.constexpr, LOG2_BETA1: tl.constexpr, LOG2_BETA2: tl.constexpr, MOMENTUM: tl.constexpr,
    LR_DECAY: tl.constexpr, ALPHA: tl.constexpr,
):
    """Tile t of dW_i = G_i.T @ A_i (BLOCK_M of W's rows by BLOCK_N of its columns),
    reduced over the batch in order, and db_i from the tiles of column 0; then the
    optimizer's update of those parameters. G_i's columns are read up to N_LOAD >= N and
    A_i's up to K_LOAD >= K (X's copy's zero padding), which keeps the loads aligned. With
    COPIES & 2 both come from their transposed copies, the batch contiguous, read up to M16
    (zeros past M): the MMA's operands then load whole from shared memory. With FLAGS the
    update waits for the counter at ready_ptr to reach `ready`: the old weights' last reads.
    SWAP: see _mma. Before db's rows had their own load, SWAP with COPIES & 2 gave
    different bits run to run (H200, Triton 3.6); with it, runs repeat their bits. The
    tile reduces the batch's part [lo, hi), part s of SPLIT: part 0's sums go through the
    gradient's place in grad_ptr (_finish), and the last part alone updates."""
    tiles_k = tl.cdiv(K, BLOCK_N)
    offs_n = _first_row(t, tiles_k, BLOCK_M) + tl.arange(0, BLOCK_M)
    offs_k = (t % tiles_k) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_r = tl.arange(0, BLOCK_K)
    acc = _zeros(BLOCK_M, BLOCK_N, SWAP)
    # db summed as a tile and reduced after the loop: a reduction carried through the
    # loop fails Triton 3.6's thread-locality pass.
    gsum = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    # The batch's whole BLOCK_K steps mask only their columns (the same mask every step);
    # a short batch's last, partial step is masked, after the loop (BATCH_TAIL).
    if COPIES & 2:
        batch_rows = M16  # the copies are zero from M to M16
    else:
        batch_rows = M
    if BATCH_TAIL:
        whole = lo + (hi - lo) // BLOCK_K * BLOCK_K
    else:
        whole = lo
    for m0 in range(lo, whole, BLOCK_K):
        gt, a, g_rows = _weight_operands(g_ptr, a_ptr, g_t_ptr, a_t_ptr, m0 + offs_r, offs_n, offs_k, batch_rows,
                                         N_LOAD, K_LOAD, M_PAD, W_MAX, COPIES, False, SWAP, gt_desc, at_desc,
                                         _first_row(t, tiles_k, BLOCK_M), (t % tiles_k) * BLOCK_N, m0, TMA)
        acc = _mma(gt, a, acc, DOT, SWAP)
        gsum += g_rows
    for m0 in tl.range(whole, hi, BLOCK_K, num_stages=1 if BATCH_TAIL else None):
        gt, a, g_rows = _weight_operands(g_ptr, a_ptr, g_t_ptr, a_t_ptr, m0 + offs_r, offs_n, offs_k, batch_rows,
                                         N_LOAD, K_LOAD, M_PAD, W_MAX, COPIES, True, SWAP, gt_desc, at_desc,
                                         _first_row(t, tiles_k, BLOCK_M), (t % tiles_k) * BLOCK_N, m0, TMA)
        acc = _mma(gt, a, acc, DOT, SWAP)
        gsum += g_rows
    db = tl.sum(gsum, axis=1)
    at = grad_ptr + w_off + offs_n[:, None] * K + offs_k[None, :]
    mask = (offs_n[:, None] < N) & (offs_k[None, :] < K)
    bias_at = grad_ptr + b_off + offs_n
    if SPLIT > 1:  # db's partial sum goes in the bias gradient's place, before _finish counts the part
        if (s < SPLIT - 1) & (t % tiles_k == 0):
            tl.store(bias_at, db, mask=offs_n < N)
    dw, last = _finish(_unswap(acc, SWAP), at, mask, s, pair_ptr, flag_ptr, SPLIT, SPIN)
    if last:
        if SPLIT > 1:
            if t % tiles_k == 0:
                db = tl.load(bias_at, mask=offs_n < N, other=0.0, cache_modifier=".cg") + db
        # The gradient goes out first and the optimizer then walks the tile CHUNK elements at a
        # time: a loop, where updating the tile in registers unrolled into thousands of
        # instructions, each step fetched anew into a cold instruction cache.
        tl.store(at, dw, mask=mask)
        tl.debug_barrier()  # the tile's stores, by all its threads, before any thread reads them back
        if FLAGS:
            _wait(ready_ptr, ready, flag_ptr, SPIN)
        for c in range(0, BLOCK_M * BLOCK_N, CHUNK):
            e = c + tl.arange(0, CHUNK)
            rows = _first_row(t, tiles_k, BLOCK_M) + e // BLOCK_N
            cols = (t % tiles_k) * BLOCK_N + e % BLOCK_N
            offs = w_off + rows * K + cols
            mask_e = (rows < N) & (cols < K)
            _update(p_ptr, grad_ptr, s1_ptr, s2_ptr, offs, mask_e,
                    tl.load(grad_ptr + offs, mask=mask_e, cache_modifier=".cg"), step, False, ALGORITHM, LR,
                    WEIGHT_DECAY, EPS, BETA1, BETA2, LOG2_BETA1, LOG2_BETA2, MOMENTUM, LR_DECAY, ALPHA)
        if t % tiles_k == 0:
            _update(p_ptr, grad_ptr, s1_ptr, s2_ptr, b_off + offs_n, offs_n < N, db, step, True,
                    ALGORITHM, LR, WEIGHT_DECAY, EPS, BETA1, BETA2, LOG2_BETA1, LOG2_BETA2, MOMENTUM, LR_DECAY, ALPHA)


@triton.jit
def _first_row(t, tiles_k, BLOCK_M: tl.constexpr):
    """The first of W's rows in weight tile t."""
    return (t // tiles_k) * BLOCK_M


@triton.jit
def _layer(layout_ptr, i, HINT_N: tl.constexpr, HINT_K: tl.constexpr):
    """Layer i's weight offset, bias offset, N and K, with what is known of their alignment:
    offsets are FlatOptimizer.ALIGN-aligned; N and K are multiples of 16 where the host
    said so. Without these hints a masked tile load is not vectorized (4-byte copies).
    tl.multiple_of marks the load that made the value, so only constexpr flags decide."""
    w_off = tl.multiple_of(tl.load(layout_ptr + 4 * i), 16)
    b_off = tl.multiple_of(tl.load(layout_ptr + 4 * i + 1), 16)
    N = tl.load(layout_ptr + 4 * i + 2)
    if HINT_N:
        N = tl.multiple_of(N, 16)
    K = tl.load(layout_ptr + 4 * i + 3)
    if HINT_K:
        K = tl.multiple_of(K, 16)
    return w_off, b_off, N, K


@triton.jit
def _step_kernel(
    x_ptr, y_ptr, idx_ptr, p_ptr, grad_ptr, s1_ptr, s2_ptr, step_ptr, n_steps, layout_ptr,
    act_ptr, z_ptr, g_ptr, act_t_ptr, g_t_ptr, w_t_ptr, part_ptr, total_ptr, loss_ptr, bar_ptr, flag_ptr, sync_ptr,
    M, M16, F, F_PAD, C, M_MAX, M_PAD, W_MAX, inv_m, slope, one, PAIR_T,
    L: tl.constexpr, SPLIT: tl.constexpr, TMA: tl.constexpr, COPIES: tl.constexpr, FLAGS: tl.constexpr,
    BALANCE: tl.constexpr, ACTIVATION: tl.constexpr, SAVE_Z: tl.constexpr,
    DOT: tl.constexpr, ALIGNED: tl.constexpr, EVEN: tl.constexpr, BATCH_TAIL: tl.constexpr, SWAP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FORWARD_K: tl.constexpr, CHUNK: tl.constexpr,
    HEAD_M: tl.constexpr, HEAD_K: tl.constexpr, BLOCK_C: tl.constexpr, PARTS: tl.constexpr,
    ALGORITHM: tl.constexpr, LR: tl.constexpr, WEIGHT_DECAY: tl.constexpr, EPS: tl.constexpr, BETA1: tl.constexpr,
    BETA2: tl.constexpr, LOG2_BETA1: tl.constexpr, LOG2_BETA2: tl.constexpr, MOMENTUM: tl.constexpr,
    LR_DECAY: tl.constexpr, ALPHA: tl.constexpr, SPIN: tl.constexpr, times_ptr, TIMING: tl.constexpr,
):
    """One training step of an L-layer MLP on the batch X[idx[:M]] (see the module docstring).

    layout_ptr: int64 (L, 4) of each layer's weight offset, bias offset, N and K in the
    flat buffers. Scratch layer j (act, z, g) starts at j * M_MAX * W_MAX, rows W_MAX apart:
    act[j] holds A_j (j >= 1; act[0] the batch's rows of X, F_PAD wide), z[j] Z_{j-1}
    (silu), g[j] G_j. COPIES (bits): 2, act_t and g_t hold A_j and G_j transposed (planes
    of W_MAX columns M_PAD apart); 1, w_t[i] holds W_i transposed (rows W_MAX apart).
    FLAGS: no grid barriers; a tile waits for counters of the tiles it reads (sync_ptr,
    int64, `sync_counters`), which the last program to finish zeroes for the next launch.
    EVEN: M_MAX and the hidden widths are whole tiles and reduction steps (`whole_tiles`): the
    hidden products load unmasked. BATCH_TAIL: the weight tiles mask the batch only in a
    short batch's last, partial reduction step. A shorter batch's rows past M then read scratch rows
    below M_MAX, which feed only output rows past M, never stored. SWAP (bits): 1 the forward
    tiles', 2 the input-gradient tiles', 4 the weight tiles' products run transposed (_mma).
    BALANCE: the step's tiles are dealt to the programs as one sequence (_first). A tile
    computes the same bits whichever program takes it, and a program still takes its tiles
    in the step's order, so the lowest unfinished tile can always run. SPLIT (1 or 2): each
    hidden tile (forward, input-gradient, weight) is SPLIT work items, each reducing a part
    of its reduction (_part, _finish); the last part, later in the step's order, waits for
    the others at a counter of its own (PAIR_T per phase), so the same argument holds.
    TMA: the hidden layers' forward (past layer 0) and input-gradient products load their
    operands through tensor-memory descriptors made once a layer (_descriptors)."""
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    plane = M_MAX * W_MAX
    plane_t = W_MAX * M_PAD
    plane_w = W_MAX * W_MAX
    step = tl.load(step_ptr).to(tl.float64) + 1.0
    R = tl.cdiv(M, BLOCK_M)  # row blocks of the hidden tiles
    # Counters: [0] programs started, [1] finished; rows of A_{i+1} done, per (i, row
    # block); rows of G_k, per (k, row block); all of G_k (k < L-2: its tiles; the head's
    # tiles count for G_{L-2} and G_{L-1}); all of F_i (whose tiles write W_i's copy).
    rb = tl.cdiv(M_MAX, BLOCK_M)
    rows_a = sync_ptr + 2
    rows_g = rows_a + L * rb
    done_g = rows_a + 2 * L * rb
    done_f = done_g + L
    pairs = done_f + L  # SPLIT: a counter per tile, PAIR_T a phase: forward i, G_{k-1} at L + k, dW_u at 2L + u
    if FLAGS:  # after the read of step, which program 0 overwrites once all have started
        tl.atomic_add(sync_ptr, 1, sem="acq_rel", scope="gpu")
    _stamp(times_ptr, 0, TIMING)
    if TIMING:
        tl.store(times_ptr + pid * 32 + 31, tl.extra.cuda.smid().to(tl.int64))
    # Forward through the hidden layers: layer 0 gathers X's rows; the others share one
    # copy of the tile code (a run-time loop), so a phase finds its instructions cached.
    w_off, b_off, N, K = _layer(layout_ptr, 0, ALIGNED, False)
    base = pid.to(tl.int64) * 0  # tiles of the phases before this one (BALANCE)
    for item in range(pid, R * tl.cdiv(N, BLOCK_N) * SPLIT, P):
        t, s = item // SPLIT, item % SPLIT
        lo, hi = _part(K, s, SPLIT, FORWARD_K)
        _forward_tile(t, x_ptr, idx_ptr, act_ptr, p_ptr + w_off, p_ptr + b_off, act_ptr + plane, z_ptr + plane,
                      act_t_ptr, act_t_ptr + plane_t, w_t_ptr, M, M16, M_PAD, N, K, F, F_PAD, W_MAX, slope,
                      lo, hi, s, pairs + t, flag_ptr, times_ptr, 20, None, None, False, TIMING, L, True, SAVE_Z,
                      ACTIVATION, DOT, BLOCK_M, BLOCK_N, FORWARD_K, COPIES, False, SWAP & 1, SPLIT, SPIN)
        _inner(times_ptr, 21, TIMING, L)  # the tile's end
        if FLAGS:
            if s == SPLIT - 1:
                _signal(rows_a + t // tl.cdiv(N, BLOCK_N), rows_a, False)
        _inner(times_ptr, 22, TIMING, L)  # its signal's end
    _phase_end(bar_ptr, flag_ptr, P, SPIN, times_ptr, 0, TIMING, FLAGS)
    base += R * tl.cdiv(N, BLOCK_N) * SPLIT
    for i in range(1, L - 1):
        w_off, b_off, N, K = _layer(layout_ptr, i, ALIGNED, ALIGNED)
        a_desc, w_desc = _descriptors(act_ptr + i * plane, M, K, BLOCK_M, FORWARD_K, W_MAX,
                                      p_ptr + w_off, N, K, BLOCK_N, FORWARD_K, K, TMA)
        for item in range(_first(pid, P, base, BALANCE), R * tl.cdiv(N, BLOCK_N) * SPLIT, P):
            t, s = item // SPLIT, item % SPLIT
            if FLAGS:  # row block r of A_i: the previous layer's tiles of those rows
                _wait(rows_a + (i - 1) * rb + t // tl.cdiv(N, BLOCK_N), tl.cdiv(K, BLOCK_N), flag_ptr, SPIN)
            if i == 1:
                _inner(times_ptr, 23, TIMING, L)  # F_1's wait's end
            lo, hi = _part(K, s, SPLIT, FORWARD_K)
            _async_reads(TMA)
            _forward_tile(t, x_ptr, idx_ptr, act_ptr + i * plane, p_ptr + w_off, p_ptr + b_off,
                          act_ptr + (i + 1) * plane, z_ptr + (i + 1) * plane, act_t_ptr + i * plane_t,
                          act_t_ptr + (i + 1) * plane_t, w_t_ptr + i * plane_w, M, M16, M_PAD, N, K, F, F_PAD,
                          W_MAX, slope, lo, hi, s, pairs + i * PAIR_T + t, flag_ptr, times_ptr, 23 + tl.minimum(i, 2),
                          a_desc, w_desc, TMA, TIMING, L, False, SAVE_Z, ACTIVATION, DOT, BLOCK_M, BLOCK_N, FORWARD_K,
                          COPIES, EVEN, SWAP & 1, SPLIT, SPIN)
            if i == 1:
                _inner(times_ptr, 26, TIMING, L)  # F_1's tile's end
            if FLAGS:
                if s == SPLIT - 1:
                    _signal(rows_a + i * rb + t // tl.cdiv(N, BLOCK_N), done_f + i, COPIES & 1)
            if i == 1:
                _inner(times_ptr, 27, TIMING, L)  # its signal's end
        _phase_end(bar_ptr, flag_ptr, P, SPIN, times_ptr, i, TIMING, FLAGS)
        base += R * tl.cdiv(N, BLOCK_N) * SPLIT
    # The head, the loss, G_{L-1} and G_{L-2}.
    h = L - 1
    w_off, b_off, _, K = _layer(layout_ptr, L - 1, False, ALIGNED)
    saved = z_ptr  # the host passes act as z where no Z is kept
    head_tiles = tl.cdiv(M, HEAD_M) * tl.cdiv(K, BLOCK_N)
    for t in range(_first(pid, P, base, BALANCE), head_tiles, P):
        r = t // tl.cdiv(K, BLOCK_N) * HEAD_M // BLOCK_M
        if FLAGS:
            _wait(rows_a + (L - 2) * rb + r, tl.cdiv(K, BLOCK_N), flag_ptr, SPIN)
        _head_tile(t, y_ptr, idx_ptr, act_ptr + h * plane, saved + h * plane, p_ptr + w_off, p_ptr + b_off,
                   g_ptr + h * plane, g_ptr + (h - 1) * plane, g_t_ptr + h * plane_t, g_t_ptr + (h - 1) * plane_t,
                   part_ptr, M, M16, M_PAD, C, K, W_MAX, inv_m, slope, one,
                   ACTIVATION, DOT, HEAD_M, BLOCK_C, BLOCK_N, HEAD_K, COPIES)
        if FLAGS:
            _signal(rows_g + (L - 2) * rb + r, done_g + L - 1, True)
    _phase_end(bar_ptr, flag_ptr, P, SPIN, times_ptr, L - 1, TIMING, FLAGS)
    base += head_tiles
    # Phase j: G_{k-1} for k = L-2-j (none when k = 0) beside dW_{k+1}, whose old weights
    # were last read in the phase before; the last phase (k = 0) adds dW_0. One run-time
    # loop, so every phase runs the same copy of the tile code. Layer 0's K (the input
    # features) has no known alignment: its weight tiles are a second copy, unhinted.
    w0_off, b0_off, N0, K0 = _layer(layout_ptr, 0, ALIGNED, False)
    g0_desc, x_desc = _descriptors(g_t_ptr, N0, M16, BLOCK_M, BLOCK_K, M_PAD, act_t_ptr, F_PAD, M16, BLOCK_N, BLOCK_K,
                                   M_PAD, TMA and COPIES & 2)
    for j in range(0, L - 1):
        k = L - 2 - j
        u = k + 1
        w_off, _, N, K = _layer(layout_ptr, tl.maximum(k, 1), ALIGNED and L > 2, ALIGNED and L > 2)
        if COPIES & 1:  # G_k, and W_k's copy (K x N) or W_k (N x K)
            g_desc, wk_desc = _descriptors(g_ptr + tl.maximum(k, 1) * plane, M, N, BLOCK_M, BLOCK_K, W_MAX,
                                           w_t_ptr + tl.maximum(k, 1) * plane_w, K, N, BLOCK_N, BLOCK_K, W_MAX, TMA)
        else:
            g_desc, wk_desc = _descriptors(g_ptr + tl.maximum(k, 1) * plane, M, N, BLOCK_M, BLOCK_K, W_MAX,
                                           p_ptr + w_off, N, K, BLOCK_K, BLOCK_N, K, TMA)
        data_tiles = tl.where(k > 0, R * tl.cdiv(K, BLOCK_N), 0)
        wu_off, bu_off, Nu, Ku = _layer(layout_ptr, u, False, ALIGNED)
        # dW_u's copies of G_u and A_u (COPIES & 2), read to Nu's next 16 and M16
        gu_desc, au_desc = _descriptors(g_t_ptr + u * plane_t, (Nu + 15) // 16 * 16, M16, BLOCK_M, BLOCK_K, M_PAD,
                                        act_t_ptr + u * plane_t, Ku, M16, BLOCK_N, BLOCK_K, M_PAD, TMA and COPIES & 2)
        # G_u is read up to the next multiple of 16 columns (the head's 10 too), so the
        # loads stay 16 bytes: those columns are inside a row (W_MAX >= BLOCK_C) and
        # only feed rows of dW past N, which are never stored.
        if ALIGNED:
            Nu_load = (Nu + 15) // 16 * 16
        else:
            Nu_load = Nu
        # Work items: each tile's SPLIT parts, the data tiles', then dW_u's, then (k = 0) dW_0's.
        data_items = data_tiles * SPLIT
        weight_items = data_items + tl.cdiv(Nu, BLOCK_M) * tl.cdiv(Ku, BLOCK_N) * SPLIT
        items = weight_items + tl.where(k == 0, tl.cdiv(N0, BLOCK_M) * tl.cdiv(K0, BLOCK_N), 0) * SPLIT
        # What the tiles wait for (FLAGS), as (counter, count per launch): all of G_k (the
        # weight tiles' update: W_{k+1}'s last reads; dW_0's product) and of G_{k+1} (dW_{k+1}'s
        # product). The head's tiles count for G_{L-1} and G_{L-2}.
        Nk = tl.where(k > 0, N, N0)
        if k >= L - 2:
            all_k = done_g + L - 1
            all_k_count = head_tiles
        else:
            all_k = done_g + k
            all_k_count = R * tl.cdiv(Nk, BLOCK_N)
        if u >= L - 2:
            all_u = done_g + L - 1
            all_u_count = head_tiles
        else:
            all_u = done_g + u
            all_u_count = R * tl.cdiv(Nu, BLOCK_N)
        for item in range(_first(pid, P, base, BALANCE), items, P):
            if item < data_items:
                t, s = item // SPLIT, item % SPLIT
                if FLAGS:
                    r = t // tl.cdiv(K, BLOCK_N)
                    count = tl.cdiv(N, BLOCK_N)  # G_k's tiles of a row block
                    if k == L - 2:  # the head's, HEAD_M rows each (the last row block may hold fewer)
                        count *= tl.minimum(BLOCK_M // HEAD_M, tl.cdiv(M, HEAD_M) - r * (BLOCK_M // HEAD_M))
                    _wait(rows_g + k * rb + r, count, flag_ptr, SPIN)
                    if COPIES & 1:  # W_k's copy, written by all of F_k's tiles
                        _wait(done_f + k, R * tl.cdiv(N, BLOCK_N), flag_ptr, SPIN)
                n_lo, n_hi = _part(N, s, SPLIT, BLOCK_K)  # names of their own: N is int64, M int32
                _async_reads(TMA)
                _input_grad_tile(t, g_ptr + k * plane, saved + k * plane, p_ptr + w_off, w_t_ptr + k * plane_w,
                                 g_ptr + (k - 1) * plane, g_t_ptr + (k - 1) * plane_t, M, M16, M_PAD, N, K, W_MAX,
                                 slope, one, n_lo, n_hi, s, pairs + (L + k) * PAIR_T + t, flag_ptr, g_desc, wk_desc,
                                 ACTIVATION, DOT, BLOCK_M, BLOCK_N, BLOCK_K, COPIES, EVEN, SWAP & 2, SPLIT, SPIN, TMA)
                if FLAGS:
                    if s == SPLIT - 1:
                        _signal(rows_g + (k - 1) * rb + r, done_g + k - 1, True)
            elif item < weight_items:
                t, s = (item - data_items) // SPLIT, (item - data_items) % SPLIT
                if FLAGS:  # G_u whole; the update then waits for G_{u-1} (W_u's last reads)
                    _wait(all_u, all_u_count, flag_ptr, SPIN)
                m_lo, m_hi = _part(M, s, SPLIT, BLOCK_K)
                _async_reads(TMA and COPIES & 2)
                _weight_tile(t, act_ptr + u * plane, g_ptr + u * plane, act_t_ptr + u * plane_t,
                             g_t_ptr + u * plane_t, p_ptr, grad_ptr, s1_ptr, s2_ptr, wu_off, bu_off,
                             M, M16, M_PAD, Nu, Nu_load, Ku, Ku, W_MAX, step, all_k, all_k_count, flag_ptr,
                             m_lo, m_hi, s, pairs + (2 * L + u) * PAIR_T + t, gu_desc, au_desc, TMA and COPIES & 2,
                             DOT, BLOCK_M, BLOCK_N, BLOCK_K, CHUNK, COPIES, FLAGS, BATCH_TAIL, SWAP & 4, SPIN, SPLIT,
                             ALGORITHM, LR, WEIGHT_DECAY, EPS, BETA1, BETA2, LOG2_BETA1, LOG2_BETA2, MOMENTUM,
                             LR_DECAY, ALPHA)
            else:
                t, s = (item - weight_items) // SPLIT, (item - weight_items) % SPLIT
                if FLAGS:  # G_0 whole; W_0's last reads were F_0's, so its update waits for nothing more
                    _wait(all_k, all_k_count, flag_ptr, SPIN)
                m_lo, m_hi = _part(M, s, SPLIT, BLOCK_K)
                _async_reads(TMA and COPIES & 2)
                _weight_tile(t, act_ptr, g_ptr, act_t_ptr, g_t_ptr,  # X's copy, from F_0
                             p_ptr, grad_ptr, s1_ptr, s2_ptr, w0_off, b0_off, M, M16, M_PAD, N0, N0, K0, F_PAD, W_MAX,
                             step, all_k, 0, flag_ptr, m_lo, m_hi, s, pairs + 2 * L * PAIR_T + t, g0_desc, x_desc,
                             TMA and COPIES & 2,
                             DOT, BLOCK_M, BLOCK_N, BLOCK_K, CHUNK, COPIES, FLAGS, BATCH_TAIL, SWAP & 4, SPIN, SPLIT,
                             ALGORITHM, LR, WEIGHT_DECAY, EPS, BETA1, BETA2, LOG2_BETA1, LOG2_BETA2, MOMENTUM,
                             LR_DECAY, ALPHA)
        if k > 0:
            _phase_end(bar_ptr, flag_ptr, P, SPIN, times_ptr, L + j, TIMING, FLAGS)
        base += items
    # Program 0 adds the batch's loss to the total and advances the step counts.
    _stamp(times_ptr, 4 * L - 3, TIMING)
    if pid == 0:
        if FLAGS:  # the head's partial sums, and every program's read of the step count
            _wait(done_g + L - 1, head_tiles, flag_ptr, SPIN)
            _wait(sync_ptr, P, flag_ptr, SPIN)
        offs = tl.arange(0, PARTS)
        loss = tl.sum(tl.load(part_ptr + offs, mask=offs < tl.cdiv(M, HEAD_M), other=0.0, cache_modifier=".cg"), axis=0)
        tl.store(total_ptr, tl.load(total_ptr) + loss)
        tl.store(loss_ptr, loss * inv_m)
        for s0 in range(0, n_steps, 1024):
            counts = s0 + tl.arange(0, 1024)
            tl.store(step_ptr + counts, step.to(tl.float32), mask=counts < n_steps)
    if FLAGS or SPLIT > 1:  # the last program to finish: every wait and signal of the launch is behind it
        if tl.atomic_add(sync_ptr + 1, 1, sem="acq_rel", scope="gpu") == P - 1:
            counters = 2 + 2 * L * rb + 2 * L + 3 * L * PAIR_T
            for c0 in range(0, counters, 1024):
                offs = c0 + tl.arange(0, 1024)
                tl.store(sync_ptr + offs, tl.zeros((1024,), tl.int64), mask=offs < counters)


# --------------------------------------------------------------------- launching


@dataclass(frozen=True)
class Blocks:
    """Tile sizes: BLOCK_M x BLOCK_N output tiles reduced BLOCK_K at a time; head rows HEAD_M;
    warps and pipeline stages per program."""

    m: int
    n: int
    k: int
    head_m: int
    warps: int
    stages: int = 3
    head_k: int = 128  # the head's reduction step: its logits are a short, latency-bound loop
    per_sm: int = 1  # programs per SM, where the compiled kernel's registers and shared memory allow
    copies: int = 0  # backward operands from transposed copies: 1 W (_input_grad_tile), 2 A and G (_weight_tile)
    flags: bool = False  # tiles wait for the tiles they read (counters), not for grid barriers
    k_forward: int = 0  # the forward tiles' reduction step, where not k
    swap: int = 0  # bits: the forward (1), input-gradient (2), weight (4) tiles' products run transposed (_mma)
    balance: bool = False  # the step's tiles dealt to the programs as one sequence, not phase by phase
    chains: bool = False  # fp32 at 'tf32x3': its three products as independent chains (_dot)
    # The three below measured slower than blocks_for's tiles on an H200 (docs/step-budget.md); options for a
    # design probe.
    split: int = 1  # 1 or 2: each hidden tile's reduction over this many work items, summed in a fixed order
    tma: bool = False  # the hidden forward and input-gradient products load through tensor-memory descriptors
    max_regs: int = 0  # registers a thread at most (ptxas's maxnreg; 0: 255): 168 fits per_sm=3 of 4 warps, 128 four

    @property
    def chunk(self) -> int:
        """Elements of a weight tile the optimizer updates per loop step: four a thread."""
        return min(self.m * self.n, 128 * self.warps)


def blocks_for(
    rows: int, width: int, sms: int, precision: str = "fp32", interpreter: bool = INTERPRETER,
) -> Blocks:
    """The largest tiles that still give a phase work for most of the 2 x `sms` programs:
    16 x 64 where a hidden layer has half as many tiles as programs (at TF32 3/8 as many),
    else 16 x 32. Past one tile a program, two rounds of 16 x 64 tiles beat one of 32 x 64
    (batch 1024), which the study shape's 256 tiles left half the programs idle with;
    wider than 512, fp32 keeps 32 x 64 where those are 3/4 as many as programs.
    At TF32 and bf16 every hidden product runs transposed (`swap`: Hopper's wgmma) with
    64-column tiles, bf16 at any tile, the backward tiles reading W, A and G from
    transposed copies (`copies`; bf16 copies at bf16). Tiles wait for what they read, not
    for grid barriers (`flags`), except at fp32 under 128 rows. The forward tiles reduce
    64 at a time (`k_forward`) where that was faster, and at TF32 with 16 x 64 tiles the
    backward tiles too (`k`). With 16 x 32 tiles and counter waits the step's tiles are
    dealt out as one sequence (`balance`; not at fp32 and width 256): phase by phase, half
    the programs had no tile of a 128-tile phase. fp32 runs 3xTF32's three products as
    chains apart (`chains`), and its 16 x 64 tiles' backward then reduces 64 at a time.
    Measured choices: docs/fused-step.md."""
    bf16, tf32 = precision == "bf16", precision == "tf32"
    copies = ALL_COPIES if bf16 else 0
    if interpreter:  # the swapped products and copies too, so that CI runs the GPU's choice
        fp32 = precision == "fp32"
        return Blocks(16, 16, 16, 16, 4, head_k=16, copies=0 if fp32 else ALL_COPIES, flags=True,
                      swap=0 if fp32 else SWAP_CHOSEN, balance=True, chains=fp32)
    programs = 2 * sms  # Blocks.per_sm below; one per SM only where two do not fit
    if precision == "fp32" and width > 512 and cdiv(rows, 32) * cdiv(width, 64) >= programs * 3 // 4:
        return Blocks(32, 64, 32, 16, 4, per_sm=2, chains=True)
    tiles = cdiv(rows, 16) * cdiv(width, 64)
    if tiles >= programs // 2 or (tf32 and tiles >= programs * 3 // 8):
        if precision == "fp32":  # chains apart: 89.5 us a step against 112.8 (k=32 with them: 100.8)
            return Blocks(16, 64, 64, 16, 4, 2, per_sm=2, flags=True, k_forward=64, chains=True)
        backward_k = 64 if tf32 else 32  # 64 was 4-5% faster at TF32, 11% slower at bf16
        head_k = 64 if bf16 else 128  # bf16's logits: 2% faster in steps of 64, TF32's even
        return Blocks(16, 64, backward_k, 16, 4, per_sm=2, copies=ALL_COPIES, flags=True, k_forward=64,
                      swap=SWAP_CHOSEN, head_k=head_k)
    flags = precision != "fp32" or rows >= 128  # fp32's 128 rows: only with balance
    k_forward = 64 if bf16 or (tf32 and rows < 256) else 0
    swap = SWAP_CHOSEN if bf16 else 0
    balance = flags and (precision != "fp32" or width != 256)  # 2% slower there, 3-13% faster elsewhere
    return Blocks(16, 32, 32, 16, 4, per_sm=2, copies=copies, flags=flags, k_forward=k_forward, swap=swap,
                  balance=balance, chains=precision == "fp32")


def _scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    """Global scratch for the kernel's tensor-memory descriptors (triton.set_allocator):
    from torch's allocator, so a CUDA graph's capture keeps it for its replays."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def whole_tiles(rows: int, hidden: list[int], blocks: Blocks) -> bool:
    """Whether batches of up to `rows` (the step's built batch) and these hidden widths are
    whole tiles and reduction steps of `blocks` (rows in BLOCK_M, widths in every column
    block and reduction step), so that the hidden layers' forward and input-gradient
    products load unmasked: one build for an epoch's full and short batches alike."""
    return rows % blocks.m == 0 and all(
        w % max(blocks.n, blocks.k, blocks.k_forward) == 0 for w in hidden)


def sync_counters(layers: int, rows: int, block_m: int, pair_tiles: int = 0) -> int:
    """The int64 counters a step with Blocks.flags or split keeps (see _step_kernel):
    programs started and finished, rows of A and of G done per row block of `block_m`, all
    of G and F per layer, and with split a counter per tile of a phase (`pair_tiles`, at
    most; three kinds of phase per layer)."""
    return 2 + 2 * layers * cdiv(rows, block_m) + 2 * layers + 3 * layers * pair_tiles


def pair_tiles(rows: int, width: int, blocks: Blocks) -> int:
    """The most tiles of one phase with blocks.split > 1 (0 without): the hidden tiles of
    `rows` by `width` columns or the weight tiles of a `width` x `width` matrix, where
    `width` is the widest layer or input."""
    if blocks.split == 1:
        return 0
    return max(cdiv(rows, blocks.m), cdiv(width, blocks.m)) * cdiv(width, blocks.n)


def resident_per_sm(
    wanted: int, regs_per_thread: int, shared_bytes: int, warps: int, regs_per_sm: int, shared_per_sm: int,
    threads_per_sm: int,
) -> int:
    """Programs per SM, at most `wanted` and at least 1, that the SM holds at once: registers
    go to warps 256 at a time, and the driver reserves 1 KiB of shared memory per block."""
    regs = -(-regs_per_thread * 32 // 256) * 256 * warps
    fit = min(regs_per_sm // max(regs, 1), shared_per_sm // (shared_bytes + 1024), threads_per_sm // (32 * warps))
    return max(1, min(wanted, fit))


def unfit_reason(widths: list[int], classes: int, rows: int, in_features: int) -> str | None:
    """Why a model of these layer widths (hidden then head) does not take the fused
    step, or None where it does."""
    if classes > MAX_CLASSES:
        return f"{classes} classes > {MAX_CLASSES}"
    if len(widths) < 2:
        return "no hidden layer"
    w, pad = max(widths + [in_features]), cdiv(rows, 16) * 16
    scratch = (3 * rows * w + 2 * w * pad + w * w) * len(widths) * 4  # FusedStep's act, z, g, act_t, g_t, w_t
    if scratch > MAX_SCRATCH_BYTES:
        return f"scratch of {scratch >> 20} MiB > {MAX_SCRATCH_BYTES >> 20} MiB"
    return None


class FusedStep:
    """One launch per training step for an MLP whose parameters a FlatOptimizer holds.

    `(index, total)` trains on rows `index` of `x`/`y`, adds the batch's summed loss to
    `total` (a device scalar) and leaves its mean in `loss`. Build it with `usable`
    first: it refuses what it cannot run.
    """

    def __init__(
        self, x: torch.Tensor, y: torch.Tensor, layers: list[torch.nn.Linear], optimizer: FlatOptimizer,
        activation_name: str, precision: str, batch: int, sms: int | None = None,
    ) -> None:
        self.x, self.y = x.contiguous(), y.contiguous()
        self.device = x.device
        self.optimizer = optimizer
        spans = {id(p): start for p, start, _ in optimizer.spans()}
        self.widths = [m.out_features for m in layers]
        self.layout = torch.tensor(
            [[spans[id(m.weight)], spans[id(m.bias)], m.out_features, m.in_features] for m in layers],
            dtype=torch.int64, device=self.device,
        )
        self.L = len(layers)
        self.aligned = all(w % 16 == 0 for w in self.widths[:-1])
        if any(start % 16 for start in spans.values()):
            raise ValueError("FusedStep: the flat buffer's parameters must start 64-byte aligned")
        self.activation = ACTIVATION_CODES[activation_name]
        self.save_z = activation_name == "silu"
        self.dot = DOTS[precision] or STRICT_FP32
        self.rows = batch
        self.f_pad = cdiv(x.shape[1], 16) * 16  # X's copy in scratch plane 0, zero-padded
        self.block_c = max(16, next_power_of_2(self.widths[-1]))  # >= the columns of G_{L-1} read
        self.w_max = max(self.widths + [self.f_pad, self.block_c])
        self.classes = self.widths[-1]
        # `sms`: the GPU's, unless given (a build for another GPU than this machine's, if any)
        self.sms = 1 if INTERPRETER else sms or torch.cuda.get_device_properties(self.device).multi_processor_count
        self.programs = self.sms
        self.blocks = blocks_for(batch, max(self.widths[:-1]), self.sms, precision)
        plane = batch * self.w_max
        self.m_pad = cdiv(batch, 16) * 16  # rows of the transposed copies: readers load 16 at a time
        self.act = torch.zeros(self.L * plane, device=self.device)
        self.z = torch.zeros(self.L * plane, device=self.device) if self.save_z else self.act
        self.g = torch.zeros(self.L * plane, device=self.device)
        self.parts = next_power_of_2(max(cdiv(batch, self.blocks.head_m), 2))
        self.part = torch.zeros(self.parts, device=self.device)
        self.loss = torch.zeros((), device=self.device)
        self.barrier = torch.zeros(1, dtype=torch.int64, device=self.device)
        self.flag = torch.zeros(1, dtype=torch.int32, device=self.device)
        group = optimizer.param_groups[0]
        hyper = {name: 0.0 for name in HYPERPARAMETERS}
        hyper.update(constants(optimizer.algorithm, group))
        self.hyper = hyper
        self.algorithm = ALGORITHMS[optimizer.algorithm]
        # Set `timing` for each program's %globaltimer at its start, at each barrier's
        # arrival and departure and at its end: `times` (programs, 32) int64 ns.
        self.timing = False
        self.unmasked = True  # False: every load masked, as before whole_tiles and BATCH_TAIL (for measurement)
        self.times = torch.zeros(self.programs, 32, dtype=torch.int64, device=self.device)
        self.grid: int | None = None  # programs per launch, settled at the first
        self.precision = precision
        self.use_blocks(self.blocks)

    def use_blocks(self, blocks: Blocks) -> None:
        """Run with these tiles and copies from the next launch on (the transposed copies'
        buffers sized to match; one element where a copy is not kept)."""
        self.blocks, self.grid = blocks, None
        # The copies feed only the MMA: at bf16 they are kept in bf16, the rounding the MMA
        # applies anyway, so a copy is half the bytes and shared memory hands it whole.
        dtype = torch.bfloat16 if self.precision == "bf16" else torch.float32
        columns = self.L * self.w_max * self.m_pad if blocks.copies & 2 else 1
        self.act_t = torch.zeros(columns, dtype=dtype, device=self.device)
        self.g_t = torch.zeros(columns, dtype=dtype, device=self.device)
        self.w_t = torch.zeros(self.L * self.w_max * self.w_max if blocks.copies & 1 else 1, dtype=dtype,
                               device=self.device)
        if blocks.split not in (1, 2):
            raise ValueError(f"FusedStep: Blocks.split={blocks.split}; a tile's reduction splits in 1 or 2 parts")
        if blocks.tma and not self.aligned:
            raise ValueError("FusedStep: Blocks.tma needs hidden widths in multiples of 16 (a descriptor's rows "
                             f"are 16-byte aligned); these are {self.widths[:-1]}")
        if blocks.tma and not INTERPRETER:  # descriptors made in the kernel live in scratch Triton asks for
            triton.set_allocator(_scratch)
        self.pair_tiles = pair_tiles(self.rows, self.w_max, blocks)
        self.sync = torch.zeros(sync_counters(self.L, self.rows, blocks.m, self.pair_tiles), dtype=torch.int64,
                                device=self.device)
        self.barrier.zero_()  # counts arrivals by the grid's programs, which may change

    def dot_for(self, blocks: Blocks) -> str:
        """The products' mode: the precision's, with Blocks.chains 3xTF32's chains apart."""
        return f"{self.dot} chains" if blocks.chains and self.dot == "tf32x3" else self.dot

    @staticmethod
    def usable(layers: list[torch.nn.Linear], rows: int) -> str | None:
        """None where the fused step runs these layers on batches of `rows`, else why not."""
        return unfit_reason([m.out_features for m in layers], layers[-1].out_features, rows, layers[0].in_features)

    def __call__(self, index: torch.Tensor, total: torch.Tensor) -> None:
        """One step on rows `index` of x/y (int64, on the device): one launch."""
        m = index.numel()
        if m > self.rows:
            raise ValueError(f"FusedStep: a batch of {m} rows > the {self.rows} it was built for")
        if self.grid is None:
            self.grid = self._programs_that_fit(index, total)
        args, kwargs = self._arguments(index, total)
        _step_kernel[(self.grid,)](*args, **kwargs)

    def _arguments(self, index: torch.Tensor, total: torch.Tensor) -> tuple[list, dict]:
        """The kernel's positional arguments and its constexprs and launch options."""
        flat = self.optimizer.flat
        state = self.optimizer.state[flat]
        buffers = [state[name] for name in STATE[self.optimizer.algorithm]]
        s1 = buffers[0]
        s2 = buffers[1] if len(buffers) > 1 else buffers[0]
        m = index.numel()
        b = self.blocks
        args = [
            self.x, self.y, index, flat, flat.grad, s1, s2, state["step"], state["step"].numel(), self.layout,
            self.act, self.z, self.g, self.act_t, self.g_t, self.w_t, self.part, total, self.loss, self.barrier,
            self.flag, self.sync, m, cdiv(m, 16) * 16, self.x.shape[1], self.f_pad, self.classes, self.rows, self.m_pad,
            self.w_max, 1.0 / m, LEAKY_SLOPE, 1.0, self.pair_tiles,
        ]
        kwargs = dict(
            L=self.L, SPLIT=b.split, TMA=b.tma, COPIES=b.copies, FLAGS=b.flags, BALANCE=b.balance,
            ACTIVATION=self.activation, SAVE_Z=self.save_z, DOT=self.dot_for(b),
            ALIGNED=self.aligned, EVEN=self.unmasked and whole_tiles(self.rows, self.widths[:-1], b),
            BATCH_TAIL=self.unmasked, SWAP=b.swap,
            BLOCK_M=b.m, BLOCK_N=b.n, BLOCK_K=b.k, FORWARD_K=b.k_forward or b.k, CHUNK=b.chunk, HEAD_M=b.head_m,
            HEAD_K=b.head_k,
            BLOCK_C=self.block_c, PARTS=self.parts, ALGORITHM=self.algorithm,
            SPIN=SPIN_LIMIT, times_ptr=self.times, TIMING=self.timing, num_warps=b.warps, num_stages=b.stages,
            **self.hyper,
        )
        if b.max_regs:
            kwargs["maxnreg"] = b.max_regs
        return args, kwargs

    def _programs_that_fit(self, index: torch.Tensor, total: torch.Tensor) -> int:
        """The grid: blocks.per_sm programs per SM where the compiled kernel's registers,
        shared memory and threads let that many stay resident at once (a barrier waits
        for every program, so all must be), else one per SM."""
        self.programs = self.sms
        if INTERPRETER or self.blocks.per_sm == 1:
            return self.programs
        args, kwargs = self._arguments(index, total)
        kernel = _step_kernel.warmup(*args, grid=(self.programs,), **kwargs)
        if hasattr(kernel, "_init_handles"):
            kernel._init_handles()
        props = torch.cuda.get_device_properties(self.device)
        self.programs = self.sms * resident_per_sm(
            self.blocks.per_sm, kernel.n_regs, kernel.metadata.shared, self.blocks.warps,
            getattr(props, "regs_per_multiprocessor", 65536),
            getattr(props, "shared_memory_per_multiprocessor", 228 * 1024),
            getattr(props, "max_threads_per_multi_processor", 2048),
        )
        self.times = torch.zeros(self.programs, 32, dtype=torch.int64, device=self.device)
        return self.programs

    def check(self) -> None:
        """Raise if a barrier or counter wait of any step so far gave up (one host read)."""
        if int(self.flag.item()):
            raise RuntimeError(
                f"FusedStep: a wait between tiles timed out (grid barrier or counter; {self.programs} programs "
                f"on {self.device}); "
                "the step's results are wrong. Set LOADBENCH_FUSED_STEP=0 to train through the layer kernels"
            )
