"""Eager launches of Triton kernels without Triton's per-call binding.

`kernel[grid](*args)` binds every argument, specializes each one, builds a cache key and
looks the compiled kernel up on every call. At the MLP's sizes a layer's forward and
backward are three launches of a few microseconds of GPU work each, so an eager step is
bound by the host. `launch` does that bookkeeping once per launch signature and then
calls the compiled kernel's launcher the way JITFunction.run does (the same call form
from Triton 3.4 to 3.9): on an H100 with triton 3.6 that took 8-22% off an eager forward
+ backward of the MLP (docs/results-h200.md, "Fused kernel with fp32 master weights").

The signature is at least as fine as Triton's specialization on NVIDIA GPUs: the
kernel, the device, every constexpr and launch option, each tensor's dtype and 16-byte
alignment, each integer's class (equal to 1, a multiple of 16, 32- or 64-bit), so a
compiled kernel is never reused where Triton would have compiled another. Anything else
(another backend, the interpreter, an argument type it does not know, a Triton without
this call form) takes Triton's own launch path every time. Environment knobs read at
compile time (TRITON_DEBUG and the like) are taken as fixed for the process.

Written by hand: neither Triton nor torch offers a cached launch for a kernel called
outside torch.compile.
"""

from __future__ import annotations

import os
from typing import Any

import torch

try:
    from triton import knobs as _knobs
    from triton.runtime.driver import driver as _driver
except ImportError:  # pragma: no cover - Triton before 3.4: no knobs, another call form
    _knobs = _driver = None

# launch signature -> (compiled kernel, argument names in the kernel's order)
_COMPILED: dict[tuple, tuple[Any, tuple[str, ...]]] = {}
_INT32 = (-(2**31), 2**31 - 1)


def _arg_class(arg: Any) -> Any:
    """What Triton's specialization can tell apart in one argument; None where unknown."""
    if isinstance(arg, torch.Tensor):
        return (arg.dtype, arg.data_ptr() % 16 == 0)
    if isinstance(arg, bool):
        return ("b", arg)
    if isinstance(arg, int):
        return ("i", arg == 1, arg % 16 == 0, _INT32[0] <= arg <= _INT32[1], arg >= 2**63)
    if isinstance(arg, float):
        return ("f",)
    return None


def signature(fn: Any, args: tuple, kwargs: dict) -> tuple | None:
    """The launch signature of `fn(*args, **kwargs)`, or None where it cannot be told."""
    classes = tuple(_arg_class(a) for a in args)
    if None in classes:
        return None
    try:
        extra = tuple(sorted(kwargs.items()))
        hash(extra)
    except TypeError:
        return None
    device = torch.cuda.current_device() if torch.cuda.is_available() else -1
    return (fn, device, classes, extra)


def _usable(fn: Any) -> bool:
    return (
        _knobs is not None
        and os.environ.get("TRITON_INTERPRET") != "1"
        and hasattr(fn, "arg_names")
        and _driver.active.get_current_target().backend == "cuda"
    )


def launch(fn: Any, grid: tuple, *args: Any, **kwargs: Any) -> None:
    """`fn[grid](*args, **kwargs)`, from the second call of a launch signature on
    straight through the compiled kernel's launcher."""
    key = signature(fn, args, kwargs)
    hit = _COMPILED.get(key) if key is not None else None
    if hit is None:
        kernel = fn[grid](*args, **kwargs)  # binds, compiles where needed, launches
        if key is not None and _usable(fn) and all(hasattr(kernel, a) for a in ("run", "function", "packed_metadata")):
            names = tuple(fn.arg_names)
            if set(names) == set(names[: len(args)]) | {n for n in kwargs if n in names}:
                _COMPILED[key] = (kernel, names)
        return
    kernel, names = hit
    values = args + tuple(kwargs[n] for n in names[len(args) :])
    # key[1]: torch's current device, the one Triton's CUDA driver reports too
    stream = _driver.active.get_current_stream(key[1])
    grid_0 = grid[0]
    grid_1 = grid[1] if len(grid) > 1 else 1
    grid_2 = grid[2] if len(grid) > 2 else 1
    runtime = _knobs.runtime
    kernel.run(
        grid_0, grid_1, grid_2, stream, kernel.function, kernel.packed_metadata,
        kernel.launch_metadata(grid, stream, *values), runtime.launch_enter_hook, runtime.launch_exit_hook, *values,
    )  # fmt: skip


def cached_signatures() -> int:
    """How many launch signatures skip Triton's binding (tests, reports)."""
    return len(_COMPILED)


def clear() -> None:
    _COMPILED.clear()

