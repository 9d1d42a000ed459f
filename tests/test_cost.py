"""The cost model against the hand count of the optimal configuration."""

from model.config import TrainConfig
from model.cost import training_cost


def test_optimal_configuration_matches_the_hand_count() -> None:
    cost = training_cost(TrainConfig(), n_train=80_909)
    assert cost.parameters == 569_354  # 75*512+512 + 2*(512*512+512) + 512*10+10
    assert cost.macs_per_sample == 567_808  # 75*512 + 2*512*512 + 512*10
    assert cost.train_flops_per_epoch == 6 * 80_909 * 567_808  # 0.276 TFLOP
    assert cost.optimizer_state_bytes == 2 * 4 * 569_354  # Adam: two moments


def test_cost_scales_with_width_and_depth() -> None:
    wide = training_cost(TrainConfig(width=2048), n_train=1)
    deep = training_cost(TrainConfig(depth=5), n_train=1)
    assert wide.macs_per_sample == 75 * 2048 + 2 * 2048 * 2048 + 2048 * 10
    assert deep.macs_per_sample == 75 * 512 + 4 * 512 * 512 + 512 * 10


def test_tflops_and_roofline() -> None:
    cost = training_cost(TrainConfig(), n_train=80_909)
    assert abs(cost.tflops(0.276) - 1.0) < 0.01
    assert abs(cost.roofline_seconds_per_epoch(51.6) - 0.00535) < 1e-4
