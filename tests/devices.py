"""The device the tests put their tensors on: the GPU where torch sees one, else the CPU,
where the Triton kernels run through Triton's interpreter (the root conftest chooses it).
A test marked `gpu` is skipped where there is none (tests/conftest.py)."""

from __future__ import annotations

import torch

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
