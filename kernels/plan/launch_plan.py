"""Launch planning for the fused linear + activation kernels, without running anything.

`LaunchConfig` (tile, split-K slices, route: 'triton', 'cublas', 'gemv'),
`heuristic_config` (the tile where nothing was measured), `candidates` and
`tuning_candidates` (what tuning times for a shape), `shape_key` (the shape class a
measured tile holds for: kernel, dtype, dot precision, activation class, shape),
`make_plan` (a configuration made into a launch's grid and split-K slices), the dot's
precision per dtype (`precision_for`) and the activation codes the kernels take
(ACTIVATION_CODES, CLASS_OF). Which configuration a process launches is decided in
kernels/plan/launches.py; this module imports neither it nor the ops.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any

import torch

from kernels.ground import env

# Each activation's ACTIVATION code, the branch kernels/ops/activations.py takes: the head's
# identity, then the names of kernels.ground.axes.ACTIVATIONS (tests/test_kernels.py holds them alike).
ACTIVATION_CODES = {"identity": 0, "relu": 1, "leaky_relu": 2, "tanh": 3, "sigmoid": 4, "silu": 5}
SILU = ACTIVATION_CODES["silu"]


# Fixed tiles of the small helper kernels: memory-bound, so no tuning.
SUM_BLOCK = 1024
EPILOGUE_BLOCK = (32, 128)  # rows, columns (columns contiguous)
GRAD_BLOCK = (64, 32)  # rows walked per step, columns per program


# ---------------------------------------------------------------- launch configs


TRITON, CUBLAS, GEMV, PRESPLIT = "triton", "cublas", "gemv", "presplit"
BACKENDS = (TRITON, CUBLAS, GEMV, PRESPLIT)
# The few-row forward: tl.dot pads a tile to 16 rows, so at batch 1 a tensor-core tile
# does 16x the work and its few wide programs leave most SMs idle. The gemv route
# multiplies on the FMA units (fp32 exactly, at any matmul precision) with one program
# per strip of output columns, so a batch-1 layer reads W with many SMs at once.
GEMV_MAX_ROWS = 16
GEMV_MAX_TILE = 8192  # rows x columns x reduction step of one program's product, in registers
GEMV_TILES = ((16, 128), (32, 128), (16, 256), (64, 64), (32, 256))  # (columns, reduction step)
# The presplit route (kernels/ops/presplit.py): 3xTF32 products from operands split into
# TF32 parts, for fp32 at 'tf32x3' only. Its tiles are over the product it launches, which
# for dX and dW is the transpose (dX.T, dW.T): the tile's rows run along the layer's K.
# Tuned only where a layer is large enough to gain (PRESPLIT_MIN_WORK, M x N x K): widths
# 1024 and up at batch 512, where it was measured faster (docs/kernels.md, "Five routes").
PRESPLIT_PRECISION = "tf32x3"
PRESPLIT_MIN_WORK = 1 << 29
PRESPLIT_TILES = ((64, 64, 32, 4, 3), (64, 64, 64, 4, 3), (64, 128, 64, 4, 3), (128, 64, 32, 4, 4),
                  (128, 128, 32, 8, 4))  # (rows, columns, reduction step, warps, stages)


@dataclass(frozen=True)
class LaunchConfig:
    block_r: int  # rows of the output tile
    block_c: int  # columns of the output tile
    block_red: int  # reduction step
    num_warps: int
    num_stages: int
    group: int = 8
    split_k: int = 1  # dw only: slices of the batch reduced by separate programs
    backend: str = TRITON  # 'cublas': torch.mm plus our epilogue / prologue kernel; 'gemv': few rows

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
        low_r = 1 if cfg.backend == GEMV else 16  # the gemv route has no tl.dot: a tile of one row is fine
        if (any(b < low or b & (b - 1) for b, low in zip(blocks, (low_r, 16, 16)))
                or cfg.num_warps not in (1, 2, 4, 8, 16)):
            raise ValueError(f"launch config {data!r}: blocks must be powers of two >= 16 (gemv rows >= 1), warps 1-16")
        if cfg.backend == PRESPLIT and cfg.split_k != 1:
            raise ValueError(f"launch config {data!r}: the presplit route has no split-K")
        if cfg.backend == GEMV and (cfg.block_r > GEMV_MAX_ROWS or cfg.split_k != 1):
            raise ValueError(f"launch config {data!r}: the gemv route takes at most {GEMV_MAX_ROWS} rows, no split-K")
        if not (1 <= cfg.num_stages <= 8 and cfg.group >= 1 and 1 <= cfg.split_k <= 64):
            raise ValueError(f"launch config {data!r}: stages 1-8, group >= 1, split_k 1-64")
        return cfg

    def describe(self) -> str:
        if self.backend == CUBLAS:
            return "cublas+epilogue"
        if self.backend == GEMV:
            return f"gemv {self.block_r}x{self.block_c}x{self.block_red} w{self.num_warps}"
        if self.backend == PRESPLIT:
            return f"presplit {self.block_r}x{self.block_c}x{self.block_red} w{self.num_warps} s{self.num_stages}"
        split = f" split-K {self.split_k}" if self.split_k > 1 else ""
        return f"{self.block_r}x{self.block_c}x{self.block_red} w{self.num_warps} s{self.num_stages}{split}"


# Host-side integer helpers. triton.cdiv and triton.next_power_of_2 are constexpr
# functions in recent Triton, a hundred times the arithmetic's cost on the host
# (docs/measurements.md, kernel-cells), and cdiv sat on the eager path once per layer backward.


def cdiv(a: int, b: int) -> int:
    """ceil(a / b)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of 2 >= n (n >= 1), as triton.next_power_of_2."""
    return 1 << (n - 1).bit_length() if n > 1 else n


def _pow2_at_least(n: int, low: int, high: int) -> int:
    return max(low, min(high, next_power_of_2(n)))


def _bucket(n: int) -> int:
    return max(16, next_power_of_2(n))


# What the tuned kernel's speed depends on besides its tile, and so what a measured
# tile is keyed by. The activation matters little in most cases (a few elementwise
# operations on the tile) but not for silu: its forward also stores the pre-activation
# and its backward prologue re-reads it and computes a sigmoid. Every other activation
# shares one class and is timed with leaky_relu, the study's; the head (identity) is
# its own class, so this costs no tuning beyond the silu layers.
ACTIVATION_CLASSES = {"identity": "identity", "silu": "silu"}  # any other: "pointwise"
TIMED_ACTIVATION = {"identity": "identity", "silu": "silu", "pointwise": "leaky_relu"}
CLASS_OF = {code: ACTIVATION_CLASSES.get(name, "pointwise") for name, code in ACTIVATION_CODES.items()}
# Version of the key below. Tables and cache entries keyed before the precision and
# the activation class were part of the key (format 1) are not reused.
KEY_FORMAT = 2


def activation_class(activation: int | str) -> str:
    """'identity', 'silu' or 'pointwise' (relu, leaky_relu, tanh, sigmoid)."""
    return CLASS_OF[ACTIVATION_CODES[activation] if isinstance(activation, str) else activation]


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
]
REDUCTION_STEPS = {torch.float32: (16, 32), torch.bfloat16: (32, 64), torch.float16: (32, 64)}
SPLITS = (2, 4, 8, 16)
# Occupancy rule: where some candidate tile gives at least one program per SM, a
# candidate giving fewer than this many programs per SM is not timed (a quarter of the
# SMs or fewer busy). No winner of the format-1 launch table, which timed every
# candidate, falls under it (docs/measurements.md, kernel-cells; tests/test_tuning_cache.py).
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
    return make_plan(kernel, rows, cols, reduction, cfg).programs


def tuning_candidates(
    kernel: str, rows: int, cols: int, reduction: int, dtype: torch.dtype, sm_count: int | None, prune: bool = True,
    precision: str | None = None,
) -> list[LaunchConfig]:
    """What tuning one shape times: the heuristic's tile, the tiles that fit the output
    (a 128-row tile over a 16-row output is mostly masked work), for dW split-K over
    the tiles that leave SMs idle, the presplit route's tiles where it applies
    (`presplit_applies`), and the cuBLAS route; where the SM count is known, less the
    tiles the occupancy rule (MIN_PROGRAMS_PER_SM) and, in 16 bits, the reduction-step
    rule (ONE_STEP_DTYPES) rule out; `prune=False`: neither rule."""
    heuristic = heuristic_config(rows, cols, reduction, dtype)
    fits = [c for c in candidates(dtype, reduction if prune else None)
            if c.block_r <= max(32, _bucket(rows)) and c.block_c <= max(32, _bucket(cols))]
    out = [heuristic] + [c for c in fits if c != heuristic]
    if kernel == "dw" and sm_count:
        longest = max(REDUCTION_STEPS[dtype])  # a slice is short: take the long step
        for c in fits:
            tiles = cdiv(rows, c.block_r) * cdiv(cols, c.block_c)
            if c.block_red != longest or tiles >= sm_count:
                continue
            for s in SPLITS:  # at least one reduction step per slice, at most two waves
                if s <= cdiv(reduction, c.block_red) and tiles * s <= 2 * sm_count:
                    out.append(dataclasses.replace(c, split_k=s))
    if sm_count and prune:  # among whole tiles: split-K has its own bounds above
        programs = [_programs(kernel, rows, cols, reduction, c) if c.split_k == 1 else None for c in out]
        if max(p for p in programs if p is not None) >= sm_count:
            floor = MIN_PROGRAMS_PER_SM * sm_count
            out = [c for i, (c, p) in enumerate(zip(out, programs)) if i == 0 or p is None or p >= floor]
    if kernel == "fwd" and rows <= GEMV_MAX_ROWS:
        out += gemv_candidates(rows, reduction)
    if presplit_applies(rows, cols, reduction, dtype, precision):
        out += [LaunchConfig(r, c, red, w, s, backend=PRESPLIT) for r, c, red, w, s in PRESPLIT_TILES]
    out.append(dataclasses.replace(heuristic, backend=CUBLAS))  # last: first-use tuning's seeds keep it there
    return out


def presplit_applies(rows: int, cols: int, reduction: int, dtype: torch.dtype, precision: str | None) -> bool:
    """Whether tuning times the presplit route: fp32 at 'tf32x3', a layer of at least
    PRESPLIT_MIN_WORK multiply-adds."""
    return (dtype == torch.float32 and precision == PRESPLIT_PRECISION
            and rows * cols * reduction >= PRESPLIT_MIN_WORK)


def check_route(key: str, cfg: LaunchConfig) -> LaunchConfig:
    """`cfg` if its route can run the kernel of shape key `key`; a table or cache entry
    giving a weight or input gradient the forward-only gemv route, or anything but fp32
    at 'tf32x3' the presplit route, raises ValueError."""
    if cfg.backend == GEMV and not key.startswith("fwd:"):
        raise ValueError(f"the gemv route is forward-only, not for {key.split(':')[0]}")
    if cfg.backend == PRESPLIT and key.split(":")[1:3] != ["float32", PRESPLIT_PRECISION]:
        given = ":".join(key.split(":")[1:3])
        raise ValueError(f"the presplit route is for float32 at {PRESPLIT_PRECISION}, not {given}")
    return cfg


def gemv_candidates(rows: int, reduction: int) -> list[LaunchConfig]:
    """The gemv route's tiles for a forward of `rows` <= GEMV_MAX_ROWS rows: all rows in
    one tile, strips of 16-64 output columns, a reduction step no longer than the
    reduction needs, within GEMV_MAX_TILE."""
    block_r = next_power_of_2(rows)
    out = []
    for cols, red in GEMV_TILES:
        red = min(red, _pow2_at_least(reduction, 16, red))
        cfg = LaunchConfig(block_r, cols, red, 4, 1, backend=GEMV)
        if block_r * cols * red <= GEMV_MAX_TILE and cfg not in out:
            out.append(cfg)
    return out

STRICT_FP32_CHOICES = env.STRICT_FP32_CHOICES


def strict_fp32_from_env(value: str | None) -> str:
    """How 'highest' fp32 runs, from LOADBENCH_STRICT_FP32 (unset: 'tf32x3')."""
    return env.parse("LOADBENCH_STRICT_FP32", value)


STRICT_FP32 = env.read_at_import("LOADBENCH_STRICT_FP32")  # a bad value: refused by env.check


def param_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of W and b beside inputs of `dtype`: fp32 master weights under a
    16-bit autocast (the eager path hands them to the kernels uncast), else the same."""
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def precision_for(dtype: torch.dtype) -> str:
    if dtype != torch.float32:
        return "ieee"  # 16-bit inputs: the tensor cores, fp32 accumulation
    return STRICT_FP32 if torch.get_float32_matmul_precision() == "highest" else "tf32"


# ------------------------------------------------------------------------ planning


KERNELS = ("fwd", "dw", "dx")


def layer_mnk(kernel: str, rows: int, cols: int, reduction: int) -> tuple[int, int, int]:
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
class Plan:
    """Everything a launch needs besides the tensors, worked out once per shape."""

    cfg: LaunchConfig
    grid: tuple
    splits: int = 1  # dw: split-K slices in use (never an empty one)
    m_per_split: int = 0  # dw: batch rows per slice
    sum_grid: tuple = ()  # dw with splits > 1: the partial-sum kernel's grid
    # A cuBLAS-route plan's fused alternative for calls no graph captures, where the host
    # bounds the step (kernels/plan/launches.py, "Eager calls"); None: the same plan always.
    eager: Plan | None = None

    @property
    def programs(self) -> int:
        return math.prod(self.grid) if self.grid else 0


def make_plan(kernel: str, rows: int, cols: int, reduction: int, cfg: LaunchConfig) -> Plan:
    if cfg.backend == GEMV:
        if kernel != "fwd":
            raise ValueError(f"the gemv route is forward-only; {kernel} was given {cfg.describe()}")
        return Plan(cfg, (cdiv(cols, cfg.block_c), cdiv(rows, cfg.block_r)))
    if cfg.backend == PRESPLIT:  # dX and dW launch their transposes: tiles over (cols, rows)
        r, c = (rows, cols) if kernel == "fwd" else (cols, rows)
        return Plan(cfg, (cdiv(r, cfg.block_r) * cdiv(c, cfg.block_c),), 1, reduction)
    if cfg.backend == CUBLAS:  # only the forward's epilogue has a grid per shape
        fwd = kernel == "fwd"
        return Plan(cfg, (cdiv(rows, EPILOGUE_BLOCK[0]), cdiv(cols, EPILOGUE_BLOCK[1])) if fwd else ())
    tiles = cdiv(rows, cfg.block_r) * cdiv(cols, cfg.block_c)
    if kernel == "dw" and cfg.split_k > 1:
        steps = cdiv(reduction, cfg.block_red)
        per_split = cdiv(steps, max(1, min(cfg.split_k, steps))) * cfg.block_red  # on step boundaries
        splits = cdiv(reduction, per_split) if reduction else 1
        if splits > 1:
            sum_grid = (cdiv(rows * cols + rows, SUM_BLOCK),)
            return Plan(cfg, (tiles, splits), splits, per_split, sum_grid)
    return Plan(cfg, (tiles,), 1, reduction)
