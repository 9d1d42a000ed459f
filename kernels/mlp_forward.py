"""The whole MLP forward in one launch, for serving batches of a few rows.

    H_0 = X,  H_{i+1} = act_i(H_i @ W_i.T + b_i),  Y = H_L      X (M, K), M <= 16, L <= 6

At batch 1 each layer is a matrix-vector product of a few microseconds, so a forward
launched layer by layer, even replayed from a CUDA graph, is a chain of short kernels,
each with its launch gap and ramp. This kernel runs every layer in one launch: P
programs, at most one per SM so that all are resident at once, each computing strips
of a layer's output columns (products on the FMA units in fp32, W rounded to the
activations' dtype first, bias and activation in the same pass) into a scratch row,
then waiting at a grid-wide barrier before the next layer reads the whole row.

The barrier is an arrival counter in device memory: a program arrives with a release
atomic and spins with acquire atomics until the layer's arrivals are all in; the next
layer's loads go to L2 (".cg"), never to a stale L1 line. After the last layer every
program arrives once more, and the last of those (which every other program has
passed every barrier before) puts the counter back to 0, so no memset precedes a
launch and a CUDA graph replays it as one node. Counters live in a small per-device
buffer allocated on the first eager call, one slot per stream: two launches on one
stream never overlap, and eager launches on two streams take two slots. A captured
launch keeps its capture stream's slot, so two graphs captured on one stream must not
be replayed at the same time on two streams (their barriers would share a counter and
could wait forever); the serving runners replay one graph at a time. A first call
during CUDA-graph capture, before any eager call made the buffer, is refused
(`fused_forward` returns None and the caller launches layer by layer).

On a GPU it takes a forward only where each program's strip of every layer fits its
registers whole, loaded before the barrier; wider layers (2048 columns at batch 1)
go layer by layer, which measured faster than streaming the strips (`fused_forward`).

Triton's interpreter runs programs one after another, so there P = 1 and the barriers
pass at once: CPU tests run this same code, streamed strips included.

Written by hand: Triton has no grid-wide barrier, torch no fused whole-network GEMV.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from kernels import direct_launch
from kernels.linear_act import LEAKY_SLOPE
from kernels.linear_act import _epilogue
from kernels.launch_plan import cdiv
from kernels.launch_plan import next_power_of_2

MAX_LAYERS = 6  # the study's deepest MLP: 5 hidden blocks and the head
MAX_ROWS = 16
MAX_TILE = 4096  # rows x columns x reduction step of one program's product, in registers
FIT_TILE = 8192  # the same where a layer's whole strip is held (and prefetched) at once
COUNTER_SLOTS = 64
INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"


def enabled_from_env(value: str | None) -> bool:
    """LOADBENCH_FUSED_FORWARD: '1' (the default) or '0' (layer by layer, to compare)."""
    if value in (None, "", "1"):
        return True
    if value == "0":
        return False
    raise ValueError(f"LOADBENCH_FUSED_FORWARD={value!r}: use 1 (one launch for a few-row forward) or 0 (layer by layer)")


ENABLED = enabled_from_env(os.environ.get("LOADBENCH_FUSED_FORWARD"))

_COUNTERS: dict[int, torch.Tensor] = {}  # device index -> int32 [COUNTER_SLOTS], zero between launches
_SMS: dict[int, int] = {}
LAUNCHES: dict[tuple, dict[str, Any]] = {}  # (rows, widths, dtype) -> what launched: programs, tile


@triton.jit
def _layer(
    src, w_ptr, b_ptr, dst, M, N, K, slope, pid, programs,
    ACTIVATION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """dst[:M, strips] = act(src[:M] @ W.T + b) for this program's strips of BLOCK_N
    columns (every `programs`-th one); src and dst are contiguous rows."""
    offs_m = tl.arange(0, BLOCK_M)
    for n0 in range(pid * BLOCK_N, N, programs * BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            a = tl.load(
                src + offs_m[:, None] * K + offs_k[None, :],
                mask=(offs_m[:, None] < M) & (offs_k[None, :] < K), other=0.0, cache_modifier=".cg",
            ).to(tl.float32)  # fmt: skip
            w = tl.load(w_ptr + offs_n[:, None] * K + offs_k[None, :], mask=(offs_n[:, None] < N) & (offs_k[None, :] < K), other=0.0)
            acc += tl.sum(a[:, None, :] * w.to(src.dtype.element_ty).to(tl.float32)[None, :, :], axis=2)
        _epilogue(acc, b_ptr, dst, dst, offs_m, offs_n, M, N, N, 1, slope, ACTIVATION, False)


@triton.jit
def _w_tile(w_ptr, N, K, pid, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """This program's strip of W whole (the layer fits one strip and one reduction step)."""
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    return tl.load(w_ptr + offs_n[:, None] * K + offs_k[None, :], mask=(offs_n[:, None] < N) & (offs_k[None, :] < K), other=0.0)


@triton.jit
def _layer_from_tile(
    src, w, b_ptr, dst, M, N, K, slope, pid,
    ACTIVATION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """`_layer` for a layer that fits: W's tile already in registers."""
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a = tl.load(
        src + offs_m[:, None] * K + offs_k[None, :],
        mask=(offs_m[:, None] < M) & (offs_k[None, :] < K), other=0.0, cache_modifier=".cg",
    ).to(tl.float32)  # fmt: skip
    acc = tl.sum(a[:, None, :] * w.to(src.dtype.element_ty).to(tl.float32)[None, :, :], axis=2)
    _epilogue(acc, b_ptr, dst, dst, offs_m, offs_n, M, N, N, 1, slope, ACTIVATION, False)


@triton.jit
def _grid_sync(counter, target):
    """Wait until `target` arrivals, this program's included, have reached `counter`."""
    tl.debug_barrier()  # every warp's stores of the layer are issued before the arrival
    tl.atomic_add(counter, 1, sem="release")
    seen = tl.atomic_add(counter, 0, sem="acquire")
    while seen < target:
        seen = tl.atomic_add(counter, 0, sem="acquire")
    tl.debug_barrier()


@triton.jit
def _step(
    src, w_ptr, b_ptr, dst, M, N, K, slope, pid, programs, counter, target,
    SYNC: tl.constexpr, FITS: tl.constexpr, ACTIVATION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """One layer, after the barrier on the previous one (SYNC). Where every layer fits
    one strip and one reduction step (FITS), the strip of W is loaded before waiting:
    weights do not depend on the previous layer, so their DRAM latency overlaps the wait."""
    if FITS:
        w = _w_tile(w_ptr, N, K, pid, BLOCK_N, BLOCK_K)
        if SYNC:
            _grid_sync(counter, target)
        _layer_from_tile(src, w, b_ptr, dst, M, N, K, slope, pid, ACTIVATION, BLOCK_M, BLOCK_N, BLOCK_K)
    else:
        if SYNC:
            _grid_sync(counter, target)
        _layer(src, w_ptr, b_ptr, dst, M, N, K, slope, pid, programs, ACTIVATION, BLOCK_M, BLOCK_N, BLOCK_K)


@triton.jit
def _mlp_forward_kernel(
    x_ptr, y_ptr, scratch, counter,
    w0, b0, w1, b1, w2, b2, w3, b3, w4, b4, w5, b5,
    M, K0, N0, N1, N2, N3, N4, N5, row, slope,
    LAYERS: tl.constexpr, A0: tl.constexpr, A1: tl.constexpr, A2: tl.constexpr, A3: tl.constexpr,
    A4: tl.constexpr, A5: tl.constexpr, FITS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Layer i reads scratch row i - 1 (X for i = 0) and writes scratch row i (Y for the
    last), rows `row` elements apart; a barrier before every layer but the first, the
    counter put back at the end."""
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    if LAYERS == 1:
        _step(x_ptr, w0, b0, y_ptr, M, N0, K0, slope, pid, P, counter, 0, False, FITS, A0, BLOCK_M, BLOCK_N, BLOCK_K)
    else:
        _step(x_ptr, w0, b0, scratch, M, N0, K0, slope, pid, P, counter, 0, False, FITS, A0, BLOCK_M, BLOCK_N, BLOCK_K)
    if LAYERS == 2:
        _step(scratch, w1, b1, y_ptr, M, N1, N0, slope, pid, P, counter, P, True, FITS, A1, BLOCK_M, BLOCK_N, BLOCK_K)
    elif LAYERS > 2:
        _step(scratch, w1, b1, scratch + row, M, N1, N0, slope, pid, P, counter, P, True, FITS, A1, BLOCK_M, BLOCK_N, BLOCK_K)
    if LAYERS == 3:
        _step(scratch + row, w2, b2, y_ptr, M, N2, N1, slope, pid, P, counter, 2 * P, True, FITS, A2, BLOCK_M, BLOCK_N, BLOCK_K)
    elif LAYERS > 3:
        _step(scratch + row, w2, b2, scratch + 2 * row, M, N2, N1, slope, pid, P, counter, 2 * P, True, FITS, A2, BLOCK_M, BLOCK_N, BLOCK_K)
    if LAYERS == 4:
        _step(scratch + 2 * row, w3, b3, y_ptr, M, N3, N2, slope, pid, P, counter, 3 * P, True, FITS, A3, BLOCK_M, BLOCK_N, BLOCK_K)
    elif LAYERS > 4:
        _step(scratch + 2 * row, w3, b3, scratch + 3 * row, M, N3, N2, slope, pid, P, counter, 3 * P, True, FITS, A3, BLOCK_M, BLOCK_N, BLOCK_K)
    if LAYERS == 5:
        _step(scratch + 3 * row, w4, b4, y_ptr, M, N4, N3, slope, pid, P, counter, 4 * P, True, FITS, A4, BLOCK_M, BLOCK_N, BLOCK_K)
    elif LAYERS > 5:
        _step(scratch + 3 * row, w4, b4, scratch + 4 * row, M, N4, N3, slope, pid, P, counter, 4 * P, True, FITS, A4, BLOCK_M, BLOCK_N, BLOCK_K)
    if LAYERS == 6:
        _step(scratch + 4 * row, w5, b5, y_ptr, M, N5, N4, slope, pid, P, counter, 5 * P, True, FITS, A5, BLOCK_M, BLOCK_N, BLOCK_K)
    # Every program arrives once more; the last one, which all others have passed every
    # barrier before, puts the counter back for the next launch.
    tl.debug_barrier()
    arrived = tl.atomic_add(counter, 1, sem="acq_rel")
    if arrived == LAYERS * P - 1:
        tl.atomic_xchg(counter, 0)


# ---------------------------------------------------------------------- launch


@dataclass(frozen=True)
class Tile:
    programs: int
    block_m: int
    block_n: int
    block_k: int
    fits: bool  # every layer is one strip and one reduction step per program: W prefetched

    def describe(self) -> str:
        return f"{self.block_m}x{self.block_n}x{self.block_k}{'' if self.fits else ' looped'}"


def tile(rows: int, widths: list[int], programs_max: int) -> Tile:
    """The launch for a forward of `rows` rows through layers of widths [K, N_0, ...,
    N_{L-1}]: strips narrow enough that the widest layer has one for each of up to
    `programs_max` programs; the whole reduction in one step where the product tile
    stays within FIT_TILE (then each program's W strip is loaded before the barrier),
    else a step filling MAX_TILE."""
    block_m = next_power_of_2(rows)
    widest, deepest = max(widths[1:]), next_power_of_2(max(widths[:-1]))
    block_n = max(2, min(64, next_power_of_2(cdiv(widest, programs_max))))
    programs = max(1, min(programs_max, cdiv(widest, block_n)))
    if block_m * block_n * max(16, deepest) <= FIT_TILE and programs * block_n >= widest:
        return Tile(programs, block_m, block_n, max(16, deepest), True)
    block_k = max(16, min(deepest, MAX_TILE // (block_m * block_n)))
    return Tile(programs, block_m, block_n, block_k, False)


def _counter(device: torch.device) -> torch.Tensor | None:
    """This stream's counter slot, or None during a capture before any eager call made
    the buffer (allocated then, its memset would be a node of the graph)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    buffer = _COUNTERS.get(index)
    if buffer is None:
        if torch.cuda.is_current_stream_capturing():
            return None
        buffer = _COUNTERS[index] = torch.zeros(COUNTER_SLOTS, dtype=torch.int32, device=device)
    slot = torch.cuda.current_stream(device).stream_id % COUNTER_SLOTS
    return buffer[slot : slot + 1]


def _programs_max(device: torch.device) -> int:
    if INTERPRETER or device.type != "cuda":
        return 1  # the interpreter runs programs one after another: a barrier would wait forever
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SMS:
        _SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SMS[index]


def usable(x: torch.Tensor, weights: list[torch.Tensor], biases: list[torch.Tensor]) -> bool:
    """Whether `fused_forward` takes this call (the caller knows no gradient is wanted):
    enabled, at most MAX_ROWS rows and MAX_LAYERS layers, dense contiguous fp32 / bf16 /
    fp16 tensors on one GPU (any device under the interpreter)."""
    if not ENABLED or x.dim() != 2 or not 0 < x.shape[0] <= MAX_ROWS or not 0 < len(weights) <= MAX_LAYERS:
        return False
    floats = (torch.float32, torch.bfloat16, torch.float16)
    for t in (x, *weights, *biases):
        if t.dtype not in floats or t.layout != torch.strided or not t.is_contiguous() or t.device != x.device:
            return False
    return x.device.type == "cuda" or INTERPRETER


def fused_forward(
    x: torch.Tensor, weights: list[torch.Tensor], biases: list[torch.Tensor], activations: list[int]
) -> torch.Tensor | None:
    """Y of the layers (activation codes of kernels.launch_plan.ACTIVATIONS) in one
    launch, in X's dtype; None where it cannot launch now (see the module docstring)
    or where, on a GPU, a layer does not fit one strip per program: then the strips
    would stream W through reduction steps after each barrier, nothing loaded ahead,
    and on an H200 that one launch took 30.2 us of GPU time per replay at batch 1
    through 75-2048-2048-2048-10 against 24.7 us layer by layer (eager torch's
    kernels: 25.2 us); at width 1024, which fits, 11.4 against 15.5. The interpreter
    (one program) runs the streamed form. The caller checks `usable` and the shapes."""
    rows, layers = x.shape[0], len(weights)
    widths = [x.shape[1]] + [w.shape[0] for w in weights]
    programs_max = _programs_max(x.device)
    plan = tile(rows, widths, programs_max)
    if not plan.fits and programs_max > 1:
        return None
    counter = _counter(x.device) if x.device.type == "cuda" else torch.zeros(1, dtype=torch.int32)
    if counter is None:
        return None
    row = rows * max(widths[1:-1], default=1)
    scratch = torch.empty(max(1, layers - 1) * row, device=x.device, dtype=x.dtype)
    y = torch.empty((rows, widths[-1]), device=x.device, dtype=x.dtype)
    pad = MAX_LAYERS - layers
    params = [t for pair in zip(weights, biases) for t in pair] + [weights[0], biases[0]] * pad  # unused slots
    sizes = widths[1:] + [1] * pad
    acts = list(activations) + [0] * pad
    direct_launch.launch(
        _mlp_forward_kernel, (plan.programs,),
        x, y, scratch, counter, *params, rows, widths[0], *sizes, row, LEAKY_SLOPE,
        LAYERS=layers, A0=acts[0], A1=acts[1], A2=acts[2], A3=acts[3], A4=acts[4], A5=acts[5],
        FITS=plan.fits, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, BLOCK_K=plan.block_k,
        num_warps=4 if plan.block_m * plan.block_n * plan.block_k <= MAX_TILE else 8,
    )  # fmt: skip
    LAUNCHES[(rows, tuple(widths), str(x.dtype).removeprefix("torch."))] = {
        "programs": plan.programs, "tile": plan.describe(),
    }  # fmt: skip
    return y
