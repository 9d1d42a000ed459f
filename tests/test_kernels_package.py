"""The kernels package pins Triton's floating-point contraction default (kernels/__init__.py)."""

from __future__ import annotations

import importlib

import kernels


def test_importing_the_kernels_turns_fp_fusion_on_unless_the_user_chose(monkeypatch) -> None:
    monkeypatch.delenv("TRITON_DEFAULT_FP_FUSION", raising=False)
    importlib.reload(kernels)
    assert kernels.os.environ["TRITON_DEFAULT_FP_FUSION"] == "1"
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0")
    importlib.reload(kernels)
    assert kernels.os.environ["TRITON_DEFAULT_FP_FUSION"] == "0"
