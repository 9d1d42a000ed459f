"""The study's five experiments, one hyperparameter varied around the optimal configuration."""

import pytest

from bench.cases import case_ids
from bench.cases import experiment_cases


def _cases(experiment: str) -> object:
    return pytest.mark.parametrize("case", case_ids(experiment_cases(experiment)))


@_cases("blocks")
def test_hidden_blocks(loadbench, case: str) -> None:
    loadbench.run(case)


@_cases("units")
def test_hidden_units(loadbench, case: str) -> None:
    loadbench.run(case)


@_cases("batch")
def test_batch_size(loadbench, case: str) -> None:
    loadbench.run(case)


@_cases("act")
def test_activation(loadbench, case: str) -> None:
    loadbench.run(case)


@_cases("opt")
def test_optimizer(loadbench, case: str) -> None:
    loadbench.run(case)
