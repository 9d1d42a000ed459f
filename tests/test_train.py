"""Training loops, optimizers and precision modes on the CPU."""

from __future__ import annotations

import pytest
import torch

from model.config import TrainConfig
from model.data import load_dataset
from model.mlp import MLP
from model.train import OPTIMIZERS
from model.train import Trainer
from model.train import make_optimizer
from model.train import train


@pytest.fixture(scope="module")
def data():
    return load_dataset("synthetic", scale=0.05)


def test_mlp_has_the_study_architecture() -> None:
    model = MLP(75, 512, 3, 10, "leaky_relu")
    assert sum(p.numel() for p in model.parameters()) == 569_354
    assert len(model.hidden) == 3 and model.head.out_features == 10
    assert model(torch.randn(4, 75)).shape == (4, 10)


def test_bad_config_values_are_named() -> None:
    with pytest.raises(ValueError, match="TrainConfig.activation='gelu'"):
        TrainConfig(activation="gelu")
    with pytest.raises(ValueError, match="TrainConfig.batch_size=0"):
        TrainConfig(batch_size=0)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizers_carry_the_study_settings(name) -> None:
    params = [torch.nn.Parameter(torch.zeros(3))]
    for fast in (False, True):
        optimizer, how = make_optimizer(name, params, fast=fast)
        for key, value in OPTIMIZERS[name][1].items():
            assert optimizer.defaults[key] == value
        assert how in ("default", "fused", "foreach")


def test_same_seed_gives_identical_results(data) -> None:
    config = TrainConfig(epochs=2, width=64, depth=2)
    first, second = train(config, data), train(config, data)
    assert first.losses == second.losses
    assert first.accuracy == second.accuracy and first.confusion == second.confusion


def test_epoch_callback_reports_every_epoch(data) -> None:
    seen = []
    train(TrainConfig(epochs=3, width=32, depth=2), data, on_epoch=lambda *args: seen.append(args))
    assert [e for e, _, _ in seen] == [0, 1, 2]
    assert all(seconds > 0 and loss > 0 for _, seconds, loss in seen)


def test_last_partial_batch_is_kept(data) -> None:
    n = len(data.y_train)
    batch = 500 if n % 500 else 512
    steps = []
    trainer = Trainer(TrainConfig(epochs=1, width=16, depth=2, batch_size=batch), data)
    original = trainer.step
    trainer.step = lambda x, y: (steps.append(len(y)), original(x, y))[1]
    trainer.fit()
    assert sum(steps) == n and steps[-1] == n % batch


@pytest.mark.slow
def test_reference_and_fast_loops_reach_equivalent_accuracy(data) -> None:
    # Different batch orders, same math: run-to-run noise here is about 0.01.
    config = TrainConfig(epochs=15, width=128, depth=2, batch_size=128)
    reference = train(config.replace(loop="reference"), data)
    fast = train(config.replace(loop="fast"), data)
    assert reference.accuracy > 0.4 and fast.accuracy > 0.4  # always-NONE scores 0.23
    assert abs(reference.accuracy - fast.accuracy) < 0.03
    assert abs(reference.final_loss - fast.final_loss) < 0.05


def test_graph_loop_runs_the_fast_loop_on_cpu_and_says_so(data) -> None:
    result = train(TrainConfig(epochs=1, width=16, depth=2, loop="graph"), data)
    assert result.loop == "fast"
    assert "runs as 'fast' on cpu" in result.notes[0]


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
def test_precision_modes_train(data, precision) -> None:
    before = torch.get_float32_matmul_precision()
    result = train(TrainConfig(epochs=1, width=32, depth=2, precision=precision), data)
    assert result.final_loss == result.final_loss  # not NaN
    assert torch.get_float32_matmul_precision() == before  # restored
