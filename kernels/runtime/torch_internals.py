"""torch's private checks the fused op needs, each with a public fallback.

`in_dispatch_mode()` says whether a torch dispatch mode is active (fake tensors,
make_fx, FlopCounter): the op must then go through its registered torch.library op
instead of the eager autograd.Function. `is_fake(t)` says whether `t` is a traced
tensor with no data, which first-use tuning cannot time. Neither has a public
equivalent; outside the torch versions they were written for (kernels/runtime/versions.py)
the fallbacks stay correct at some cost: every call counts as under a dispatch mode
(the op path, slower eagerly), and any tensor subclass counts as fake (the heuristic
tile, no tuning, on such tensors).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kernels.runtime import versions


def _public_in_dispatch_mode() -> bool:
    return True


def _public_is_fake(t: torch.Tensor) -> bool:
    return type(t) not in (torch.Tensor, torch.nn.Parameter)


def _private_checks() -> tuple[Callable[[], bool], Callable[[torch.Tensor], bool]] | None:
    """torch's own checks, or None where this torch is outside the range or lacks them."""
    if not versions.torch_internals_fit(versions.installed_torch()):
        return None
    try:
        from torch._subclasses.fake_tensor import is_fake as private_is_fake
        from torch.utils._python_dispatch import is_in_torch_dispatch_mode
    except ImportError:
        return None
    return is_in_torch_dispatch_mode, private_is_fake


_CHECKS = _private_checks()
in_dispatch_mode: Callable[[], bool] = _CHECKS[0] if _CHECKS else _public_in_dispatch_mode
is_fake: Callable[[torch.Tensor], bool] = _CHECKS[1] if _CHECKS else _public_is_fake
