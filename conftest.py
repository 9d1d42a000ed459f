"""Registers the mlp-loadbench pytest plugin for every run inside this checkout."""

import os

import torch

if not torch.cuda.is_available():
    # Without a GPU the Triton kernels run on CPU tensors through Triton's interpreter,
    # which must be chosen before triton is first imported.
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest_plugins = ["bench.plugin"]
