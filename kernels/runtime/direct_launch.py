"""Eager launches of Triton kernels without Triton's per-call binding.

`launch(fn, grid, *args, **kwargs)` does what `fn[grid](*args, **kwargs)` does. The
first launch of each launch signature takes that public path; later ones call the
compiled kernel's launcher directly, with tensors passed as plain addresses, skipping
the argument binding, specialization and cache lookup Triton repeats on every call.
The signature is at least as fine as Triton's specialization on NVIDIA GPUs (each
constexpr and option, each tensor's dtype, device kind and 16-byte alignment, each
int's value), so a compiled kernel is never reused where Triton would compile another.
A private-API shim: it runs only on CUDA, outside the interpreter, without a launch
hook set, and on the Triton versions of `versions.triton_internals_fit`; everything
else takes the public path every time. Kept for eager training steps through the
fused op (the figure: `ENABLED`; the design: docs/kernels.md).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from kernels.runtime import versions

try:
    from triton import knobs as _knobs
    from triton.runtime.driver import driver as _driver
except ImportError:  # pragma: no cover - Triton before 3.4: no knobs, another call form
    _knobs = _driver = None

# Pays off on the eager path (docs/measurements.md, kernel-cells).
# False: every launch takes Triton's public path (tests switch it off to check that path).
ENABLED = versions.triton_internals_fit(versions.installed_triton())

# launch signature -> (the kernel, its compiled kernel, positions of the tensor arguments,
# constexpr and defaulted values after the positional ones, in the kernel's order).
# Kernels are keyed by id(): a JITFunction hashes through a locked property, twice a
# launch; the entry holds the kernel, so a hit is checked to be the same object.
_COMPILED: dict[tuple, tuple[Any, Any, tuple[int, ...], tuple]] = {}
_USABLE: dict[int, tuple[Any, bool]] = {}
MAX_SIGNATURES = 4096  # a process serving every batch size from 1 to 4096 stays near this
_Tensor = torch.Tensor


def signature(fn: Any, args: tuple, kwargs: dict) -> tuple[tuple, list[int]] | None:
    """The launch signature of `fn(*args, **kwargs)` and the tensors' addresses, or None
    where it cannot be told: per argument what Triton's specialization can tell apart
    or finer (a tensor's dtype, device kind and 16-byte alignment; an int's value; a
    bool's value; a float is a float). The hot path of every eager launch: one pass."""
    key: list[Any] = [id(fn), torch.cuda.current_device() if torch.cuda.is_initialized() else -1]
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
    """Whether launches of `fn` may skip Triton's binding: the shim is on for this Triton,
    the kernel is a JITFunction and runs compiled on CUDA."""
    return (
        ENABLED
        and _knobs is not None
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
    )


def cached_signatures() -> int:
    """How many launch signatures skip Triton's binding (tests, reports)."""
    return len(_COMPILED)


def clear() -> None:
    """Forget every launch signature and kernel (tests)."""
    _COMPILED.clear()
    _USABLE.clear()
