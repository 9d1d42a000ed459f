"""A launch configuration of the fused op timed or compiled ahead, as tuning needs it.

`time_launch` times one candidate tile of a kernel at a layer shape from CUDA-graph
replay (`replay_ms`), `precompile` compiles many at once before any is timed, and
`forcing` makes every call inside it run the candidate (`FORCED`, which
kernels/plan/launches.py reads before any plan). Both run the op's own launch code,
which kernels/ops/linear_act.py hands over when it loads (`use_launch_code`), so this
module does not import the op. kernels/plan/launches.py decides what to time.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

import torch
import triton

from kernels.ground import env
from kernels.plan.launch_plan import ACTIVATION_CODES
from kernels.plan.launch_plan import CLASS_OF
from kernels.plan.launch_plan import SILU
from kernels.plan.launch_plan import LaunchConfig
from kernels.plan.launch_plan import heuristic_config
from kernels.plan.launch_plan import kernel_shapes
from kernels.plan.launch_plan import param_dtype
from kernels.plan.launch_plan import precision_for

# A timing's (CUDA-graph calls, replays): brief for ranking every candidate, full for the
# finalists (kernels/plan/launches.py, successive halving).
QUICK_TIMING = (5, 3)
FULL_TIMING = (20, 10)
# Set only by a tuner while it measures a candidate: the config every call then uses.
FORCED: dict[str, LaunchConfig] = {}


# What time_launch and precompile run: kernels/ops/linear_act.py's `_forward` and
# `_backward` (each takes a launcher last) and its eager launcher, handed over when it
# loads. It imports kernels/plan/launches.py for its plans, which imports this module, so this
# module does not import it: the dependency goes one way (tests/test_layout.py allows no import circle, lazy or not).
_OP_CODE: tuple[Callable[..., Any], Callable[..., Any], Callable[..., None]] | None = None


def use_launch_code(forward: Callable[..., Any], backward: Callable[..., Any], launch: Callable[..., None]) -> None:
    """The op's forward and backward launch code and its eager launcher, for timing."""
    global _OP_CODE
    _OP_CODE = (forward, backward, launch)


def op_code() -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., None]]:
    if _OP_CODE is None:
        raise RuntimeError("kernels.plan.trials: no launch code to time; import kernels.ops.linear_act first")
    return _OP_CODE


def _launch_warmup(fn: Any, grid: tuple, *args: Any, **kwargs: Any) -> None:
    """Compile only (precompile): nothing runs, the outputs stay unwritten."""
    fn.warmup(*args, grid=grid, **kwargs)


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
def forcing(kernel: str, m: int, n: int, k: int, dtype: torch.dtype, cfg: LaunchConfig) -> Any:
    """Every call inside runs `cfg` for `kernel` and the heuristic's tile for the
    layer's other kernels, so nothing in it resolves or tunes (it may run inside a call
    of the op: first-use tuning); the forced tiles before it come back after."""
    before = dict(FORCED)
    FORCED.update({kn: heuristic_config(r, c, red, dtype) for kn, r, c, red in kernel_shapes(m, n, k)})
    FORCED[kernel] = cfg
    try:
        yield
    finally:
        FORCED.clear()
        FORCED.update(before)


def _layer_tensors(m: int, n: int, k: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, ...]:
    """X in the compute dtype, W and b as a layer holds them (param_dtype): the tensors
    a training step hands the kernels, so a timed candidate reads what a real call does."""
    x = torch.randn(m, k, device=device, dtype=dtype)
    w = torch.randn(n, k, device=device, dtype=param_dtype(dtype))
    b = torch.randn(n, device=device, dtype=param_dtype(dtype))
    return x, w, b


def time_launch(
    kernel: str, m: int, n: int, k: int, dtype: torch.dtype, cfg: LaunchConfig,
    device: torch.device | None = None, calls: int | None = None, replays: int | None = None,
    timer: Callable[[Callable[[], object]], float] | None = None,
    activation: str = "leaky_relu", quick: bool = False,
) -> float:
    """Milliseconds per call of `kernel` (with `cfg`) at layer shape (M, N, K), from
    CUDA-graph replay (`replay_ms`; tests pass another `timer`), with QUICK_TIMING or
    FULL_TIMING unless `calls` and `replays` say otherwise. 'dx' is timed with 'dw' (one
    launch runs both); the other kernels of the call run their heuristic tile."""
    device = torch.device("cuda") if device is None else device
    default = QUICK_TIMING if quick else FULL_TIMING
    calls, replays = calls or default[0], replays or default[1]
    timer = timer or (lambda fn: replay_ms(fn, calls, replays))
    act = ACTIVATION_CODES[activation]
    forward, backward, launch = op_code()
    on_device = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    with on_device, torch.no_grad(), torch.autocast(device.type, enabled=False), forcing(kernel, m, n, k, dtype, cfg):
        x, w, b = _layer_tensors(m, n, k, dtype, device)
        prec, cls = precision_for(dtype), CLASS_OF[act]
        y, z = forward(x, w, b, act, prec, cls, launch)
        saved = z if act == SILU else y
        dy = torch.randn_like(y)
        if kernel == "fwd":
            return timer(lambda: forward(x, w, b, act, prec, cls, launch))
        return timer(lambda: backward(dy, saved, x, w, act, kernel == "dx", prec, cls, launch))


# Compiling candidates ahead of timing (Triton's AsyncCompileMode) is most of first-use
# tuning's cost, and more threads do not shorten it: the compiles share the GIL
# (docs/kernels.md, "Measurements"). So they run in
# forked worker processes where the machine has the cores (kernels/runtime/compile_pool.py;
# LOADBENCH_COMPILE_PROCESSES, 0 for threads only), these threads loading what the
# workers compiled. Bounded so tuning does not swamp a shared host.
COMPILE_THREADS = env.read("LOADBENCH_TUNE_THREADS")


def precompile(
    kernel: str, m: int, n: int, k: int, dtype: torch.dtype, cfgs: list[LaunchConfig], device: torch.device,
    activation: str = "leaky_relu", threads: int | None = None,
) -> int:
    """Compile every candidate's kernels for layer (M, N, K) at once, before any is
    timed: the same code path as a call, with each launch replaced by Triton's
    `warmup` (compile, no launch) under AsyncCompileMode, so the compiles run in
    forked workers or on threads (kernels/runtime/compile_pool.py). Returns the number of
    candidates handed to it; 0 where Triton has no AsyncCompileMode or runs its
    interpreter. A candidate that fails to compile here fails again, and is skipped,
    when it is timed."""
    mode = getattr(triton, "AsyncCompileMode", None)
    if mode is None or os.environ.get("TRITON_INTERPRET") == "1" or not cfgs:
        return 0
    from kernels.runtime.compile_pool import CompileExecutor
    from kernels.runtime.compile_pool import processes_for

    act = ACTIVATION_CODES[activation]
    forward, backward, _ = op_code()
    prec, cls = precision_for(dtype), CLASS_OF[act]
    workers = max(1, min(threads or COMPILE_THREADS, os.cpu_count() or 1, len(cfgs)))
    on_device = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    pool = CompileExecutor(processes_for(None) if device.type == "cuda" else 0, workers)
    with on_device, torch.no_grad(), torch.autocast(device.type, enabled=False), pool:
        x, w, b = _layer_tensors(m, n, k, dtype, device)
        y = torch.empty((m, n), device=device, dtype=dtype)
        try:
            compiling = mode(pool, ignore_errors=True)
        except TypeError:  # older Triton: no ignore_errors
            compiling = mode(pool)
        handed = 0
        with contextlib.suppress(Exception), compiling:
            for cfg in cfgs:
                with forcing(kernel, m, n, k, dtype, cfg):
                    if kernel == "fwd":
                        forward(x, w, b, act, prec, cls, _launch_warmup)
                    else:
                        backward(y, y, x, w, act, kernel == "dx", prec, cls, _launch_warmup)
                handed += 1
    return handed
