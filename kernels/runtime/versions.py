"""Which Triton and torch versions the private-API uses in kernels/runtime/ are made for.

Each use of another project's internals (Triton's launcher call form and compile
closure, torch's dispatch-mode and fake-tensor checks) runs only where the installed
version lies in the range it was written and tested for, and takes the public path
elsewhere. The rules are pure functions of a version tuple, so a test can check them
against the oldest and newest versions supported without installing either.
"""

from __future__ import annotations

import re

# Triton's launcher call form and JITFunction._do_compile's closure, as read on the
# versions the tests ran on: 3.6 (the GPU hosts) and 3.9 (the CPU tests).
TRITON_OLDEST = (3, 6)
TRITON_NEWEST = (3, 9)
# torch.utils._python_dispatch.is_in_torch_dispatch_mode and
# torch._subclasses.fake_tensor.is_fake: present as used from 2.1 through 2.13.
TORCH_OLDEST = (2, 1)
TORCH_NEWEST = (2, 13)


def version_tuple(text: str) -> tuple[int, int]:
    """(major, minor) of a version string such as '3.6.0' or '2.13.0+cpu'; (0, 0)
    where it does not start with two numbers."""
    match = re.match(r"(\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def triton_internals_fit(version: tuple[int, int]) -> bool:
    """Whether Triton `version` has the launcher call form and compile closure that
    direct_launch and compile_pool read."""
    return TRITON_OLDEST <= version <= TRITON_NEWEST


def torch_internals_fit(version: tuple[int, int]) -> bool:
    """Whether torch `version` has the dispatch-mode and fake-tensor checks that
    torch_internals imports."""
    return TORCH_OLDEST <= version <= TORCH_NEWEST


def installed_triton() -> tuple[int, int]:
    """The installed Triton's (major, minor); (0, 0) where none is installed."""
    try:
        import triton
    except ImportError:
        return (0, 0)
    return version_tuple(triton.__version__)


def installed_torch() -> tuple[int, int]:
    """The installed torch's (major, minor)."""
    import torch

    return version_tuple(torch.__version__)
