"""Eager launches of Triton kernels without Triton's per-call binding.

`kernel[grid](*args)` binds every argument, specializes each one, builds a cache key and
looks the compiled kernel up on every call. At the MLP's sizes a layer's forward and
backward are three launches of a few microseconds of GPU work each, so an eager step is
bound by the host. `launch` does that bookkeeping once per launch signature and then
calls the compiled kernel's launcher the way JITFunction.run does (the same call form
from Triton 3.4 to 3.9): on an H100 with triton 3.6 that took 8-22% off an eager forward
+ backward of the MLP (docs/results-h200.md, "Fused kernel with fp32 master weights").

The signature is at least as fine as Triton's specialization on NVIDIA GPUs: the
kernel, the device, every constexpr and launch option, each tensor's dtype, device kind
and 16-byte alignment, each integer's value (finer than Triton's classes: equal to 1, a
multiple of 16, 32- or 64-bit), so a compiled kernel is never reused where Triton would
have compiled another. Integers go in as they are because classifying one costs more
than the lookup saves; the ints of our launches are shapes and strides, so a process
holds a few signatures per shape (the table is emptied past MAX_SIGNATURES).
Tensors reach the launcher as plain addresses: Triton's launcher then skips their
data_ptr() calls and a driver pointer query per tensor (cuPointerGetAttribute), which
the signature's first launch made. With a launch hook set (a profiler) the launcher
gets the tensors, as on Triton's path. Anything else
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

# launch signature -> (the kernel, its compiled kernel, positions of the tensor arguments,
# constexpr and defaulted values after the positional ones, in the kernel's order).
# Kernels are keyed by id(): a JITFunction hashes through a locked property, twice a
# launch; the entry holds the kernel, so a hit is checked to be the same object.
_COMPILED: dict[tuple, tuple[Any, Any, tuple[int, ...], tuple]] = {}
_USABLE: dict[int, tuple[Any, bool]] = {}
# torch.cuda.current_device() without its initialization check, which the caller makes
_current_device = getattr(torch._C, "_cuda_getDevice", lambda: -1)
MAX_SIGNATURES = 4096  # a process serving every batch size from 1 to 4096 stays near this
_Tensor = torch.Tensor


def signature(fn: Any, args: tuple, kwargs: dict) -> tuple[tuple, list[int]] | None:
    """The launch signature of `fn(*args, **kwargs)` and the tensors' addresses, or None
    where it cannot be told: per argument what Triton's specialization can tell apart
    or finer (a tensor's dtype, device kind and 16-byte alignment; an int's value; a
    bool's value; a float is a float). The hot path of every eager launch: one pass."""
    key: list[Any] = [id(fn), _current_device() if torch.cuda.is_initialized() else -1]
    add = key.append
    addresses: list[int] = []
    for a in args:
        kind = type(a)
        if kind is int:
            add(a)
        elif kind is float:
            add(float)
        elif isinstance(a, _Tensor):
            address = a.data_ptr()
            addresses.append(address)
            add((a.dtype, a.is_cuda, not address & 15))
        elif kind is bool:
            add((bool, a))  # True == 1 as a dict key: keep a bool apart from the int 1
        else:
            return None
    add(tuple(kwargs.items()))  # in the call's order: a call site always passes the same
    return tuple(key), addresses


def _usable(fn: Any) -> bool:
    return (
        _knobs is not None
        and os.environ.get("TRITON_INTERPRET") != "1"
        and hasattr(fn, "arg_names")
        and _driver.active.get_current_target().backend == "cuda"
    )


def _hooked(hook: Any) -> bool:
    """Whether a launch hook is set: None, or an empty HookChain (Triton 3.5 on), is not."""
    return hook is not None and bool(getattr(hook, "calls", True))


def launch(fn: Any, grid: tuple, *args: Any, **kwargs: Any) -> None:
    """`fn[grid](*args, **kwargs)`, from the second call of a launch signature on
    straight through the compiled kernel's launcher."""
    known = _USABLE.get(id(fn))
    if known is None or known[0] is not fn:
        known = _USABLE[id(fn)] = (fn, bool(_usable(fn)))
    signed = signature(fn, args, kwargs) if known[1] and type(grid) is tuple else None
    try:
        hit = _COMPILED.get(signed[0]) if signed is not None else None
    except TypeError:  # a constexpr that does not hash
        signed = hit = None
    if hit is not None and hit[0] is not fn:  # another kernel under a reused id
        hit = None
    if hit is None:
        kernel = fn[grid](*args, **kwargs)  # binds, compiles where needed, launches
        if signed is not None and all(hasattr(kernel, a) for a in ("run", "function", "packed_metadata")):
            names = tuple(fn.arg_names)
            if set(names) == set(names[: len(args)]) | {n for n in kwargs if n in names}:
                if len(_COMPILED) >= MAX_SIGNATURES:
                    _COMPILED.clear()
                tensors = tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor))
                _COMPILED[signed[0]] = (fn, kernel, tensors, tuple(kwargs[n] for n in names[len(args) :]))
        return
    _, kernel, tensors, tail = hit
    stream = _driver.active.get_current_stream(signed[0][1])  # torch's current device, the one Triton's driver reports
    runtime = _knobs.runtime
    enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
    if not (_hooked(enter) or _hooked(leave)):
        # Plain addresses: the launcher then skips each tensor's data_ptr() call and the
        # driver's pointer check, which the first launch of this signature has done.
        values = list(args)
        for i, address in zip(tensors, signed[1]):
            values[i] = address
        values.extend(tail)
        metadata = enter = leave = None
    else:  # a profiler's hooks see the tensors and the launch metadata, as on Triton's path
        values = [*args, *tail]
        metadata = kernel.launch_metadata(grid, stream, *values)
    size = len(grid)
    kernel.run(
        grid[0], grid[1] if size > 1 else 1, grid[2] if size > 2 else 1, stream, kernel.function,
        kernel.packed_metadata, metadata, enter, leave, *values,
    )  # fmt: skip


def cached_signatures() -> int:
    """How many launch signatures skip Triton's binding (tests, reports)."""
    return len(_COMPILED)


def clear() -> None:
    _COMPILED.clear()
    _USABLE.clear()
