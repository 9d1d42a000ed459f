"""The whole MLP forward in one launch, for serving batches of a few rows.

    H_0 = X,  H_{i+1} = act_i(H_i @ W_i.T + b_i),  Y = H_L      X (M, K), M <= 16, L <= 6

P programs, at most one per SM, each compute strips of a layer's output into a scratch
row that all read whole for the next layer. Layers hand over without a barrier: each
64-bit scratch word holds the activation and the launch's tag, and a reader loads
until every word of its input carries this launch's tag (NCCL's LL protocol's way).
Tags, scratch rows and epochs are per stream slot; two graphs captured on one stream
must not replay at once on two streams. `usable` says where a forward fits (each
program's strip of every layer in registers); `fused_forward` runs it, or returns None
(a first call during capture that needs a new buffer) and the caller goes layer by
layer. Under the interpreter P = 1, so CPU tests run this same code.
Design notes and measurements: docs/kernels.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from kernels.runtime import direct_launch
from kernels.ground import env
from kernels.ops.activations import LEAKY_SLOPE
from kernels.ops.activations import activation
from kernels.plan.launch_plan import cdiv
from kernels.plan.launch_plan import next_power_of_2

MAX_LAYERS = 6  # the study's deepest MLP: 5 hidden blocks and the head
MAX_ROWS = 16
MAX_TILE = 4096  # rows x columns x reduction step of one program's product, in registers
FIT_TILE = 8192  # the same where a layer's whole strip is held (and prefetched) at once
SLOTS = 64
MAX_PROGRAMS = 256  # epochs per slot: programs of a launch at most (one per SM)
MIN_SLOT_WORDS = 2048  # scratch words per slot at least: 16 KiB, 1 MiB for the device's 64 slots
INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"


def enabled_from_env(value: str | None) -> bool:
    """LOADBENCH_FUSED_FORWARD: '1' (the default) or '0' (layer by layer, to compare)."""
    return env.parse("LOADBENCH_FUSED_FORWARD", value) == "1"


ENABLED = env.read_at_import("LOADBENCH_FUSED_FORWARD") == "1"  # a bad value: refused by env.check

# device index -> int32 [SLOTS, MAX_PROGRAMS], equal along a slot between launches
_EPOCHS: dict[int, torch.Tensor] = {}
_SCRATCH: dict[int, list[torch.Tensor]] = {}  # device index -> int64 [SLOTS, words], the largest last
_SMS: dict[int, int] = {}
LAUNCHES: dict[tuple, dict[str, Any]] = {}  # (rows, widths, dtype) -> what launched: programs, tile


@triton.jit
def _tag(word):
    return (word >> 32).to(tl.int32)


@triton.jit
def _read(src, offs_m, offs_k, M, K, tag, PACKED: tl.constexpr):
    """Rows of a layer's input in fp32: X itself, or scratch words once all carry `tag`."""
    mask = (offs_m[:, None] < M) & (offs_k[None, :] < K)
    ptrs = src + offs_m[:, None] * K + offs_k[None, :]
    if PACKED:
        word = tl.load(ptrs, mask=mask, other=0, volatile=True)
        while tl.min(tl.where(mask, _tag(word) == tag, 1).to(tl.int32)) == 0:
            word = tl.load(ptrs, mask=mask, other=0, volatile=True)
        # The reduction counts each element once, but where the layout gives an element to
        # several threads, each loaded a copy of its own and one may predate the copy that
        # was counted (on an H100 a forward of 128-wide layers on 8 warps read stale words).
        # Such a copy is loaded again, after the reduction's synchronisation, so after a
        # load that saw the tag: it sees the tag too. With no stale copy no lane loads.
        stale = mask & (_tag(word) != tag)
        word = tl.where(stale, tl.load(ptrs, mask=stale, other=0, volatile=True), word)
        return word.to(tl.uint32).to(tl.float32, bitcast=True)
    else:
        return tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _write(acc, b, dst, x_ptr, offs_m, offs_n, M, N, slope, tag, ACTIVATION: tl.constexpr, PACKED: tl.constexpr):
    """act(acc + b) into rows of dst: Y in dst's dtype, or scratch words tagged `tag`."""
    y = activation(acc + b.to(tl.float32)[None, :], ACTIVATION, slope)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    out = offs_m[:, None] * N + offs_n[None, :]
    if PACKED:
        bits = y.to(x_ptr.dtype.element_ty).to(tl.float32).to(tl.uint32, bitcast=True).to(tl.int64)
        tl.store(dst + out, (tag.to(tl.int64) << 32) | bits, mask=mask)
    else:
        tl.store(dst + out, y.to(dst.dtype.element_ty), mask=mask)


@triton.jit
def _w_strip(w_ptr, offs_n, offs_k, N, K):
    return tl.load(w_ptr + offs_n[:, None] * K + offs_k[None, :], mask=(offs_n[:, None] < N) & (offs_k[None, :] < K),
                   other=0.0)


@triton.jit
def _products(a, w, x_ptr):
    """sum_k a[m, k] * w[n, k] in fp32, W rounded to the activations' dtype first."""
    return tl.sum(a[:, None, :] * w.to(x_ptr.dtype.element_ty).to(tl.float32)[None, :, :], axis=2)


@triton.jit
def _step(
    src, w_ptr, b_ptr, dst, x_ptr, M, N, K, slope, pid, programs, tag,
    IN_PACKED: tl.constexpr, OUT_PACKED: tl.constexpr, FITS: tl.constexpr, ACTIVATION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """dst[:M, strips] = act(src[:M] @ W.T + b) for this program's strips of BLOCK_N
    columns (every `programs`-th one). Where every layer fits one strip and one
    reduction step (FITS), the strips of W and b are loaded before the input is waited
    for: they do not depend on the previous layer, so their latency overlaps the wait."""
    offs_m = tl.arange(0, BLOCK_M)
    if FITS:
        if pid * BLOCK_N < N:  # a narrower layer than the widest leaves the last programs idle: no wait
            offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
            offs_k = tl.arange(0, BLOCK_K)
            w = _w_strip(w_ptr, offs_n, offs_k, N, K)
            b = tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0)
            acc = _products(_read(src, offs_m, offs_k, M, K, tag, IN_PACKED), w, x_ptr)
            _write(acc, b, dst, x_ptr, offs_m, offs_n, M, N, slope, tag, ACTIVATION, OUT_PACKED)
    else:
        for n0 in range(pid * BLOCK_N, N, programs * BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                offs_k = k0 + tl.arange(0, BLOCK_K)
                a = _read(src, offs_m, offs_k, M, K, tag, IN_PACKED)
                acc += _products(a, _w_strip(w_ptr, offs_n, offs_k, N, K), x_ptr)
            b = tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0)
            _write(acc, b, dst, x_ptr, offs_m, offs_n, M, N, slope, tag, ACTIVATION, OUT_PACKED)


@triton.jit
def _mlp_forward_kernel(
    x_ptr, y_ptr, scratch, epochs,
    w0, b0, w1, b1, w2, b2, w3, b3, w4, b4, w5, b5,
    M, K0, N0, N1, N2, N3, N4, N5, row, slope,
    LAYERS: tl.constexpr, A0: tl.constexpr, A1: tl.constexpr, A2: tl.constexpr, A3: tl.constexpr,
    A4: tl.constexpr, A5: tl.constexpr, FITS: tl.constexpr, MAX_PROGRAMS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Layer i reads scratch row i - 1 (X for i = 0) and writes scratch row i (Y for the
    last), rows `row` words apart; epochs holds the slot's MAX_PROGRAMS epochs."""
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    tag = tl.load(epochs + pid) % 2147483647 + 1
    if LAYERS == 1:
        _step(x_ptr, w0, b0, y_ptr, x_ptr, M, N0, K0, slope, pid, P, tag, False, False, FITS, A0,
              BLOCK_M, BLOCK_N, BLOCK_K)
    else:
        _step(x_ptr, w0, b0, scratch, x_ptr, M, N0, K0, slope, pid, P, tag, False, True, FITS, A0,
              BLOCK_M, BLOCK_N, BLOCK_K)
    if LAYERS == 2:
        _step(scratch, w1, b1, y_ptr, x_ptr, M, N1, N0, slope, pid, P, tag, True, False, FITS, A1,
              BLOCK_M, BLOCK_N, BLOCK_K)
    elif LAYERS > 2:
        _step(scratch, w1, b1, scratch + row, x_ptr, M, N1, N0, slope, pid, P, tag, True, True, FITS, A1,
              BLOCK_M, BLOCK_N, BLOCK_K)
    if LAYERS == 3:
        _step(scratch + row, w2, b2, y_ptr, x_ptr, M, N2, N1, slope, pid, P, tag, True, False, FITS, A2,
              BLOCK_M, BLOCK_N, BLOCK_K)
    elif LAYERS > 3:
        _step(scratch + row, w2, b2, scratch + 2 * row, x_ptr, M, N2, N1, slope, pid, P, tag, True, True, FITS, A2,
              BLOCK_M, BLOCK_N, BLOCK_K)
    if LAYERS == 4:
        _step(scratch + 2 * row, w3, b3, y_ptr, x_ptr, M, N3, N2, slope, pid, P, tag, True, False, FITS, A3,
              BLOCK_M, BLOCK_N, BLOCK_K)
    elif LAYERS > 4:
        _step(scratch + 2 * row, w3, b3, scratch + 3 * row, x_ptr, M, N3, N2, slope, pid, P, tag, True, True, FITS, A3,
              BLOCK_M, BLOCK_N, BLOCK_K)
    if LAYERS == 5:
        _step(scratch + 3 * row, w4, b4, y_ptr, x_ptr, M, N4, N3, slope, pid, P, tag, True, False, FITS, A4,
              BLOCK_M, BLOCK_N, BLOCK_K)
    elif LAYERS > 5:
        _step(scratch + 3 * row, w4, b4, scratch + 4 * row, x_ptr, M, N4, N3, slope, pid, P, tag, True, True, FITS, A4,
              BLOCK_M, BLOCK_N, BLOCK_K)
    if LAYERS == 6:
        _step(scratch + 4 * row, w5, b5, y_ptr, x_ptr, M, N5, N4, slope, pid, P, tag, True, False, FITS, A5,
              BLOCK_M, BLOCK_N, BLOCK_K)
    owned = tl.arange(0, MAX_PROGRAMS)
    tl.store(epochs + owned, tl.zeros([MAX_PROGRAMS], tl.int32) + tag, mask=owned % P == pid)


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
    stays within FIT_TILE (then each program's W strip is loaded before its input is
    waited for), else a step filling MAX_TILE."""
    block_m = next_power_of_2(rows)
    widest, deepest = max(widths[1:]), next_power_of_2(max(widths[:-1]))
    block_n = max(2, min(64, next_power_of_2(cdiv(widest, programs_max))))
    programs = max(1, min(programs_max, cdiv(widest, block_n)))
    if block_m * block_n * max(16, deepest) <= FIT_TILE and programs * block_n >= widest:
        return Tile(programs, block_m, block_n, max(16, deepest), True)
    block_k = max(16, min(deepest, MAX_TILE // (block_m * block_n)))
    return Tile(programs, block_m, block_n, block_k, False)


def _buffers(device: torch.device, words: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """This stream's slot: its epochs and at least `words` scratch words; None
    during a capture where they would be allocated (their zeroing would join the graph).
    On a GPU every slot of the device is allocated at once, so a graph captured on a
    stream no eager call used still finds its slot; a larger forward allocates larger
    rows for all slots, and the smaller stay alive for graphs captured on them. On a CPU
    (the interpreter) both are fresh zeros each call."""
    if device.type != "cuda":
        return torch.zeros(MAX_PROGRAMS, dtype=torch.int32), torch.zeros(words, dtype=torch.int64)
    index = device.index if device.index is not None else torch.cuda.current_device()
    epochs, rows = _EPOCHS.get(index), _SCRATCH.get(index)
    if epochs is None or rows is None or rows[-1].shape[1] < words:
        if torch.cuda.is_current_stream_capturing():
            return None
        if epochs is None:
            epochs = _EPOCHS[index] = torch.zeros(SLOTS, MAX_PROGRAMS, dtype=torch.int32, device=device)
        size = max(MIN_SLOT_WORDS, next_power_of_2(words))
        rows = _SCRATCH.setdefault(index, [])
        rows.append(torch.zeros(SLOTS, size, dtype=torch.int64, device=device))
    slot = torch.cuda.current_stream(device).stream_id % SLOTS
    return epochs[slot], rows[-1][slot]


def _programs_max(device: torch.device) -> int:
    if INTERPRETER or device.type != "cuda":
        return 1  # the interpreter runs programs one after another: a wait on another program would never end
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SMS:
        _SMS[index] = min(MAX_PROGRAMS, torch.cuda.get_device_properties(index).multi_processor_count)
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
    """Y of the layers (activation codes of kernels.launch_plan.ACTIVATION_CODES) in one
    launch, in X's dtype; None where it cannot launch now (see the module docstring)
    or where, on a GPU, a layer does not fit one strip per program: then the strips
    would stream W through reduction steps after each hand-over, nothing loaded ahead,
    slower than layer by layer (docs/measurements.md, kernel-cells). The interpreter (one
    program) runs the streamed form. The caller checks `usable` and the shapes."""
    rows, layers = x.shape[0], len(weights)
    widths = [x.shape[1]] + [w.shape[0] for w in weights]
    programs_max = _programs_max(x.device)
    plan = tile(rows, widths, programs_max)
    if not plan.fits and programs_max > 1:
        return None
    row = rows * max(widths[1:-1], default=1)
    buffers = _buffers(x.device, max(1, layers - 1) * row)
    if buffers is None:
        return None
    epochs, scratch = buffers
    y = torch.empty((rows, widths[-1]), device=x.device, dtype=x.dtype)
    pad = MAX_LAYERS - layers
    params = [t for pair in zip(weights, biases) for t in pair] + [weights[0], biases[0]] * pad  # unused slots
    sizes = widths[1:] + [1] * pad
    acts = list(activations) + [0] * pad
    direct_launch.launch(
        _mlp_forward_kernel, (plan.programs,),
        x, y, scratch, epochs, *params, rows, widths[0], *sizes, row, LEAKY_SLOPE,
        LAYERS=layers, A0=acts[0], A1=acts[1], A2=acts[2], A3=acts[3], A4=acts[4], A5=acts[5],
        FITS=plan.fits, MAX_PROGRAMS=MAX_PROGRAMS, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, BLOCK_K=plan.block_k,
        num_warps=4 if plan.block_m * plan.block_n * plan.block_k <= MAX_TILE else 8,
    )
    LAUNCHES[(rows, tuple(widths), str(x.dtype).removeprefix("torch."))] = {
        "programs": plan.programs, "tile": plan.describe(),
    }
    return y
