"""The capturable Adagrad and the flat one-launch optimizers against torch.optim.

On a CPU the Triton kernels run through the interpreter; the last tests train on a
GPU through the CUDA-graph loops.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.ops.optim import FlatOptimizer
from model.config import TrainConfig
from model.data import load_dataset
from model.mlp import MLP
from model.train import GRAPH_LOOPS
from model.train import OPTIMIZERS
from model.train import CapturableAdagrad
from model.train import Trainer
from model.train import autocast
from model.train import make_optimizer
from model.train import train
from tests.devices import DEVICE

DATA_SCALE, DATA_DEVICE = 0.05, DEVICE  # the data fixture's (tests/conftest.py): the trainers' kernels run on it
gpu = pytest.mark.gpu
SHAPES = [(64, 75), (64,), (33, 64), (33,), (10, 33), (10,)]  # slices of odd lengths


def twin_parameters(seed: int = 0) -> tuple[list[torch.nn.Parameter], list[torch.nn.Parameter]]:
    g = torch.Generator().manual_seed(seed)
    first = [torch.nn.Parameter((torch.randn(s, generator=g) * 0.1).to(DEVICE)) for s in SHAPES]
    return first, [torch.nn.Parameter(p.detach().clone()) for p in first]


Run = tuple[torch.optim.Optimizer, list[torch.nn.Parameter]]


def step_together(runs: list[Run], steps: int, seed: int = 1) -> None:
    """`steps` steps of each (optimizer, its parameters) on the same random gradients."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        grads = [torch.randn(shape, generator=g).to(DEVICE) for shape in SHAPES]
        for optimizer, params in runs:
            optimizer.zero_grad()
            for p, grad in zip(params, grads):
                if p.grad is None:
                    p.grad = grad.clone()
                else:
                    p.grad.copy_(grad)  # into the flat gradient's view
            optimizer.step()


def max_relative_difference(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    scale = max(p.abs().max().item() for p in a)
    return max((p.detach() - q.detach()).abs().max().item() for p, q in zip(a, b)) / scale


# ------------------------------------------------------------------ Adagrad


def test_capturable_adagrad_matches_torch_adagrad_for_50_steps() -> None:
    cls, settings = OPTIMIZERS["adagrad"]
    ref_params, our_params = twin_parameters()
    reference, ours = cls(ref_params, **settings), CapturableAdagrad(our_params, **settings)
    step_together([(reference, ref_params), (ours, our_params)], steps=50)
    for p, q in zip(ref_params, our_params):
        assert torch.allclose(p, q, rtol=0, atol=1e-6), (p - q).abs().max().item()
    assert ours.state[our_params[0]]["step"].item() == 50


def test_capturable_adagrad_keeps_its_step_count_as_a_tensor_on_the_parameters_device() -> None:
    params = [torch.nn.Parameter(torch.zeros(3, device=DEVICE))]
    optimizer = CapturableAdagrad(params, **OPTIMIZERS["adagrad"][1])
    step = optimizer.state[params[0]]["step"]
    assert torch.is_tensor(step) and step.device == params[0].device and step.dim() == 0


def test_make_optimizer_names_each_implementation() -> None:
    optimizer, how = make_optimizer("adagrad", [torch.nn.Parameter(torch.zeros(3))], fast=True, capturable=True)
    assert isinstance(optimizer, torch.optim.Adagrad)  # a CPU runs no graphs: torch's own (fused)
    for name in OPTIMIZERS:
        params = [torch.nn.Parameter(torch.zeros(3, device=DEVICE))]
        optimizer, how = make_optimizer(name, params, fast=True, impl="triton")
        assert isinstance(optimizer, FlatOptimizer) and how == "triton-flat+capturable"
        assert optimizer.algorithm == name


# ---------------------------------------------------------- flat optimizers


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_flat_optimizer_matches_torch_for_20_steps(name) -> None:
    cls, settings = OPTIMIZERS[name]
    ref_params, our_params = twin_parameters()
    reference, ours = cls(ref_params, **settings), FlatOptimizer(our_params, name, **settings)
    step_together([(reference, ref_params), (ours, our_params)], steps=20)
    assert max_relative_difference(ref_params, our_params) <= 1e-6
    assert (ours.state[ours.flat]["step"] == 20).all()


def test_parameters_and_gradients_are_views_of_the_flat_buffers() -> None:
    torch.manual_seed(0)
    reference = MLP(75, 32, 2, 10).to(DEVICE)
    model = MLP(75, 32, 2, 10).to(DEVICE)
    model.load_state_dict(reference.state_dict())
    optimizer = FlatOptimizer(list(model.parameters()), "sgd", lr=0.01)
    flat, flat_grad = optimizer.flat, optimizer.flat.grad
    start, end = flat.data_ptr(), flat.data_ptr() + 4 * flat.numel()
    for p, r in zip(model.parameters(), reference.parameters()):
        assert start <= p.data_ptr() < end and p.data_ptr() % 128 == start % 128
        assert torch.equal(p, r)  # the values came along
    x, y = torch.randn(9, 75, device=DEVICE), torch.randint(0, 10, (9,), device=DEVICE)
    for _ in range(2):  # twice: zero_grad zeroes in place, nothing carries over
        optimizer.zero_grad(set_to_none=True)  # zeroes in place whatever it is asked
        reference.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        F.cross_entropy(reference(x), y).backward()
        for p, r in zip(model.parameters(), reference.parameters()):
            assert p.grad.data_ptr() - flat_grad.data_ptr() == p.data_ptr() - flat.data_ptr()  # accumulated in place
            assert torch.allclose(p.grad, r.grad, atol=1e-7)
    assert torch.allclose(flat_grad.sum(), sum(r.grad.sum() for r in reference.parameters()), atol=1e-5)
    optimizer.step()
    for p in model.parameters():
        assert start <= p.data_ptr() < end  # updated in place


def test_a_gradient_set_to_none_is_caught_and_restored() -> None:
    model = MLP(75, 16, 1, 10).to(DEVICE)
    optimizer = FlatOptimizer(list(model.parameters()), "adam", lr=1e-3)
    x, y = torch.randn(4, 75, device=DEVICE), torch.tensor([1, 2, 3, 4], device=DEVICE)
    model.zero_grad(set_to_none=True)  # the model's, not the optimizer's
    F.cross_entropy(model(x), y).backward()
    with pytest.raises(RuntimeError, match="no longer its view of the flat gradient"):
        optimizer.step()
    optimizer.zero_grad()
    F.cross_entropy(model(x), y).backward()
    optimizer.step()


def test_unsupported_options_are_named() -> None:
    params = [torch.nn.Parameter(torch.zeros(3, device=DEVICE))]
    with pytest.raises(TypeError, match="does not implement amsgrad"):
        FlatOptimizer(params, "adam", amsgrad=True)
    with pytest.raises(ValueError, match="algorithm 'lion'"):
        FlatOptimizer(params, "lion")
    with pytest.raises(ValueError, match="fp32"):
        FlatOptimizer([torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))], "sgd")


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_zeroed_state_is_fresh_state(name) -> None:
    """The graph loop's warm-up reset (parameters copied back in place, every state
    tensor zeroed, step counts included) leaves a flat optimizer as if new."""
    cls, settings = OPTIMIZERS[name]
    used_params, fresh_params = twin_parameters()
    used = FlatOptimizer(used_params, name, **settings)
    saved = [p.detach().clone() for p in used_params]
    step_together([(used, used_params)], steps=3, seed=7)  # the warm-up
    with torch.no_grad():
        for p, s in zip(used_params, saved):
            p.copy_(s)
        for state in used.state.values():
            for value in state.values():
                value.zero_()
    fresh = FlatOptimizer(fresh_params, name, **settings)
    step_together([(fresh, fresh_params), (used, used_params)], steps=5)
    assert all(torch.equal(p, q) for p, q in zip(fresh_params, used_params))


# ------------------------------------------------------------- bf16 training


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_bf16_autocast_training_matches_torch(name) -> None:
    """A tiny MLP trained 20 steps under bf16 autocast (fp32 parameters, fp32 gradients
    accumulated into the flat views), torch's optimizer against ours: the weights agree
    to 1e-6 of their largest value.

    Both optimizers step on the reference model's gradients. Left to their own forward
    passes the two runs separate, through no fault of either optimizer: Adam's, RMSprop's
    and Adagrad's steps are normalised by the gradient's own size, so once a 1-ulp weight
    difference flips one bf16 rounding, near-zero gradient entries take lr-sized steps
    apart (measured: 2e-7 for 10 steps, then up to 0.13 by step 20 for RMSprop on a CPU,
    0.03 for Adagrad on an H200). The trainer test below compares whole bf16 runs."""
    cls, settings = OPTIMIZERS[name]
    torch.manual_seed(0)
    reference, model = MLP(75, 32, 2, 10).to(DEVICE), MLP(75, 32, 2, 10).to(DEVICE)
    model.load_state_dict(reference.state_dict())
    theirs = cls(reference.parameters(), **settings)
    ours = FlatOptimizer(list(model.parameters()), name, **settings)
    g = torch.Generator().manual_seed(1)
    for step in range(20):
        x, y = torch.randn(64, 75, generator=g).to(DEVICE), torch.randint(0, 10, (64,), generator=g).to(DEVICE)
        for net, optimizer in ((reference, theirs), (model, ours)):
            optimizer.zero_grad()
            with autocast("bf16", torch.device(DEVICE)):
                logits = net(x)
            assert logits.dtype == torch.bfloat16
            F.cross_entropy(logits, y).backward()
        for p, r in zip(model.parameters(), reference.parameters()):
            assert p.dtype == p.grad.dtype == r.grad.dtype == torch.float32
            if step == 0:  # the same weights: the same bf16 forward, the same gradients
                assert torch.allclose(p.grad, r.grad, rtol=1e-5, atol=1e-7)
            p.grad.copy_(r.grad)
        theirs.step()
        ours.step()
    assert max_relative_difference(list(reference.parameters()), list(model.parameters())) <= 1e-6


# ------------------------------------------------------------------ trainer


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_trainer_with_triton_optimizer_impl_matches_torch(data, name) -> None:
    config = TrainConfig(epochs=2, width=32, depth=2, optimizer=name)
    theirs = train(config, data)
    ours = train(config.replace(optimizer_impl="triton"), data)
    assert ours.optimizer_impl == "triton-flat+capturable"
    assert ours.losses == pytest.approx(theirs.losses, rel=1e-5)


def test_trainer_with_triton_optimizer_impl_trains_in_bf16(data) -> None:
    result = train(TrainConfig(epochs=2, width=32, depth=2, precision="bf16", optimizer_impl="triton"), data)
    reference = train(TrainConfig(epochs=2, width=32, depth=2, precision="bf16"), data)
    assert result.losses[1] < result.losses[0]
    # The loss kernel rounds its gradient to bf16 once, as autocast's fp32 loss does;
    # Adam's normalised step turns rare 1-ulp flips into lr-sized differences.
    assert result.losses == pytest.approx(reference.losses, rel=1e-2)


def test_triton_optimizer_impl_is_checked() -> None:
    with pytest.raises(ValueError, match="TrainConfig.optimizer_impl='cuda'"):
        TrainConfig(optimizer_impl="cuda")


# ------------------------------------------------------------------------ GPU only


@pytest.fixture(scope="module")
def gpu_data():
    return load_dataset("synthetic", scale=0.1, device="cuda")


@gpu
@pytest.mark.parametrize("impl", ["triton", "torch"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_graph_loops_replay_the_fast_loop(gpu_data, name, impl) -> None:
    """The optimal configuration at width 64: the graph loops capture every optimizer's
    step (Adagrad included) and give the fast loop's per-epoch losses and weights."""
    config = TrainConfig(width=64, epochs=3, optimizer=name, optimizer_impl=impl)
    runs = {}
    for loop in ("fast", *GRAPH_LOOPS):
        trainer = Trainer(config.replace(loop=loop), gpu_data)
        trainer.fit()
        runs[loop] = (trainer.result(), [p.detach().clone() for p in trainer.model.parameters()])
    fast, fast_weights = runs["fast"]
    for loop in GRAPH_LOOPS:
        result, weights = runs[loop]
        assert result.loop == loop and result.notes == [], (loop, result.notes)
        assert result.optimizer_impl.endswith("+capturable")
        assert result.losses == pytest.approx(fast.losses, rel=1e-6, abs=0), loop
        for w, f in zip(weights, fast_weights):
            assert torch.allclose(w, f, rtol=0, atol=1e-6), (loop, (w - f).abs().max().item())
