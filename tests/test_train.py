"""Training loops, optimizers and precision modes on the CPU."""

from __future__ import annotations

import inspect
import itertools

import pytest
import torch
from sklearn.metrics import accuracy_score
from sklearn.metrics import confusion_matrix
from sklearn.metrics import f1_score

import model.train as training
from model.config import OPTIMIZERS as CONFIG_OPTIMIZERS
from model.config import TrainConfig
from model.data import load_dataset
from model.mlp import MLP
from model.train import OPTIMIZERS
from model.train import Trainer
from model.train import make_optimizer
from model.train import predict
from model.train import train

DATA_SCALE = 0.05  # the data fixture's scale here (tests/conftest.py): the accuracy bounds below hold on this much


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


# The study's optimizer settings, written out rather than read from model/train.py, so
# that changing one there fails here.
STUDY_OPTIMIZERS = {
    "adam": (torch.optim.Adam, {"lr": 1e-4, "weight_decay": 1e-4}),
    "sgd": (torch.optim.SGD, {"lr": 0.01, "momentum": 0.9}),
    "adagrad": (torch.optim.Adagrad, {"lr": 0.01, "lr_decay": 1e-6, "weight_decay": 1e-4}),
    "rmsprop": (torch.optim.RMSprop, {"lr": 0.01, "alpha": 0.99, "eps": 1e-8, "weight_decay": 1e-4}),
}
# How a step runs, not what it computes: these may differ from torch's defaults.
IMPLEMENTATION_FLAGS = {"self", "params", "foreach", "fused", "capturable", "differentiable"}


def test_every_optimizer_a_config_can_name_is_pinned() -> None:
    assert set(STUDY_OPTIMIZERS) == set(CONFIG_OPTIMIZERS) == set(OPTIMIZERS)


@pytest.mark.parametrize("fast", [False, True], ids=["default", "fast"])
@pytest.mark.parametrize("name", sorted(STUDY_OPTIMIZERS))
def test_optimizers_carry_the_study_settings(name, fast) -> None:
    cls, settings = STUDY_OPTIMIZERS[name]
    optimizer, how = make_optimizer(name, [torch.nn.Parameter(torch.zeros(3))], fast=fast)
    assert type(optimizer) is cls
    group = optimizer.param_groups[0]  # what step() reads
    for key, value in settings.items():
        assert group[key] == value, key
    # Every other hyperparameter is torch's default, as in the study.
    for key, parameter in inspect.signature(cls.__init__).parameters.items():
        if key not in settings and key not in IMPLEMENTATION_FLAGS:
            assert group[key] == parameter.default, key
    assert how in (("fused", "foreach") if fast else ("default",))


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


def test_each_epoch_is_timed_between_two_synchronizes(data, monkeypatch) -> None:
    # An epoch's kernels run asynchronously on a GPU: without a synchronize before
    # each clock reading the timer would measure kernel launches, not the epoch.
    events: list[str] = []
    trainer = Trainer(TrainConfig(epochs=3, width=16, depth=2), data)
    ticks = itertools.count(0.0, 10.0)

    def planted_clock() -> float:
        events.append("clock")
        return next(ticks)

    def recording_synchronize(device: torch.device) -> None:
        assert device == trainer.device
        events.append("synchronize")

    monkeypatch.setattr(training, "synchronize", recording_synchronize)
    monkeypatch.setattr(Trainer, "clock", staticmethod(planted_clock))
    step = trainer.step
    trainer.step = lambda x, y: (events.append("epoch work"), step(x, y))[1]
    trainer.fit()

    one_epoch = ["synchronize", "clock", "epoch work", "synchronize", "clock"]
    assert [event for event, _ in itertools.groupby(events)] == one_epoch * 3
    assert trainer.epoch_seconds == [10.0, 10.0, 10.0]  # stop minus start, from the timer


def test_metrics_cover_the_whole_test_set() -> None:
    data = load_dataset("synthetic", scale=1.0)
    chunk = inspect.signature(predict).parameters["batch"].default
    assert len(data.y_test) > chunk  # so the trainer predicts in more than one chunk
    trainer = Trainer(TrainConfig(epochs=1, width=16, depth=2, batch_size=2048), data)
    trainer.fit()
    result = trainer.result()

    model = trainer.model.eval()
    with torch.no_grad():  # one forward pass over every test frame, no chunks
        y_pred = model(data.x_test).argmax(1).numpy()
    y_true = data.y_test.numpy()
    assert result.confusion == confusion_matrix(y_true, y_pred, labels=range(data.n_classes)).tolist()
    assert result.accuracy == pytest.approx(accuracy_score(y_true, y_pred), rel=1e-12)
    assert result.macro_f1 == pytest.approx(f1_score(y_true, y_pred, average="macro", zero_division=0), rel=1e-12)
    assert result.weighted_f1 == pytest.approx(
        f1_score(y_true, y_pred, average="weighted", zero_division=0), rel=1e-12
    )


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



@pytest.mark.slow
def test_compiled_step_trains_like_the_eager_step(data) -> None:
    """impl 'compile' runs the same math through torch.compile (Inductor on this CPU)."""
    config = TrainConfig(width=16, depth=2, epochs=2)
    eager, compiled = Trainer(config, data), Trainer(config.replace(impl="compile"), data)
    eager.fit()
    compiled.fit()
    assert compiled.losses == pytest.approx(eager.losses, rel=1e-5)
    for a, b in zip(compiled.model.parameters(), eager.model.parameters()):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)
