"""The one-pass cross-entropy kernel against F.cross_entropy, on CPU (Triton interpreter) and GPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.ops import cross_entropy as op
from kernels.ops.cross_entropy import cross_entropy
from tests.devices import DEVICE

gpu = pytest.mark.gpu


def both(batch: int, dtype: torch.dtype, classes: int = 10, seed: int = 0):
    """Loss and logits' gradient from our op and from F.cross_entropy on the logits in
    fp32 (what autocast runs for a bf16 head, the gradient cast back to bf16)."""
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(batch, classes, generator=g) * 3).to(DEVICE, dtype)
    target = torch.randint(0, classes, (batch,), generator=g).to(DEVICE)
    ours = logits.clone().requires_grad_()
    loss = cross_entropy(ours, target)
    loss.backward()
    theirs = logits.float().requires_grad_()
    expected = F.cross_entropy(theirs, target)
    expected.backward()
    return loss, ours.grad, expected, theirs.grad.to(dtype)


@pytest.mark.parametrize("batch", [1, 7, 512, 513])
def test_matches_torch_fp32(batch) -> None:
    loss, grad, expected, expected_grad = both(batch, torch.float32)
    assert loss.dtype == torch.float32 and loss.shape == ()
    assert torch.allclose(loss, expected, rtol=1e-6, atol=1e-6)
    assert grad.dtype == torch.float32
    assert torch.allclose(grad, expected_grad, rtol=1e-5, atol=1e-6 / batch)  # |grad| <= 1/batch


@pytest.mark.parametrize("batch", [1, 7, 512, 513])
def test_matches_torch_bf16_logits(batch) -> None:
    loss, grad, expected, expected_grad = both(batch, torch.bfloat16)
    assert loss.dtype == torch.float32  # computed and returned in fp32
    assert torch.allclose(loss, expected, rtol=1e-6, atol=1e-6)
    assert grad.dtype == torch.bfloat16
    # Both round an fp32 gradient to bf16; they may differ by one bf16 step (2^-8 to 2^-7).
    assert torch.allclose(grad.float(), expected_grad.float(), rtol=2**-7, atol=1e-6 / batch)


def test_batches_over_one_program_add_their_partial_sums(monkeypatch) -> None:
    monkeypatch.setattr(op, "ROWS_PER_PROGRAM", 256)  # 513 rows: three programs, the last with one row
    loss, grad, expected, expected_grad = both(513, torch.float32, seed=3)
    assert torch.allclose(loss, expected, rtol=1e-6, atol=1e-6)
    assert torch.allclose(grad, expected_grad, rtol=1e-5, atol=1e-6 / 513)


@pytest.mark.parametrize("classes", [1, 3, 16, 100])
def test_other_class_counts_are_masked_correctly(classes) -> None:
    loss, grad, expected, expected_grad = both(37, torch.float32, classes=classes)
    assert torch.allclose(loss, expected, rtol=1e-6, atol=1e-6)
    assert torch.allclose(grad, expected_grad, rtol=1e-5, atol=1e-6 / 37)


def test_incoming_gradient_scales_the_saved_gradient() -> None:
    logits = torch.randn(9, 10, device=DEVICE, requires_grad=True)
    target = torch.randint(0, 10, (9,), device=DEVICE)
    (cross_entropy(logits, target) * 3).backward()
    reference = logits.detach().clone().requires_grad_()
    (F.cross_entropy(reference, target) * 3).backward()
    assert torch.allclose(logits.grad, reference.grad, atol=1e-7)


def test_extreme_logits_stay_finite() -> None:
    logits = torch.tensor([[1e4, -1e4, 0.0], [-1e4, -1e4, -1e4]], device=DEVICE, requires_grad=True)
    target = torch.tensor([1, 2], device=DEVICE)
    loss = cross_entropy(logits, target)
    loss.backward()
    reference = logits.detach().clone().requires_grad_()
    F.cross_entropy(reference, target).backward()
    assert torch.isfinite(loss) and torch.allclose(loss, F.cross_entropy(reference, target))
    assert torch.allclose(logits.grad, reference.grad, atol=1e-7)


def test_bad_shapes_are_named() -> None:
    with pytest.raises(ValueError, match=r"logits \(4, 10\) and target \(5,\)"):
        cross_entropy(torch.zeros(4, 10), torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="empty batch"):
        cross_entropy(torch.zeros(0, 10), torch.zeros(0, dtype=torch.long))


# ------------------------------------------------------------------------ GPU only


@gpu
def test_cuda_graph_capture_and_replay() -> None:
    logits = torch.randn(513, 10, device="cuda", requires_grad=True)
    target = torch.randint(0, 10, (513,), device="cuda")
    cross_entropy(logits, target).backward()  # compile outside capture
    logits.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = cross_entropy(logits, target)
        loss.backward()
    with torch.no_grad():
        logits.copy_(torch.randn_like(logits))
    target.copy_(torch.randint(0, 10, (513,), device="cuda"))
    graph.replay()
    reference = logits.detach().clone().requires_grad_()
    expected = F.cross_entropy(reference, target)
    expected.backward()
    assert torch.allclose(loss, expected, rtol=1e-6) and torch.allclose(logits.grad, reference.grad, atol=1e-7)
