"""The study's five experiments, one hyperparameter varied around the optimal configuration."""

import pytest

from bench.cases import Case
from bench.cases import experiment_cases


def _cases(experiment: str) -> object:
    return pytest.mark.parametrize("case", experiment_cases(experiment), ids=lambda case: case.id)


@_cases("blocks")
def test_hidden_blocks(loadbench, case: Case) -> None:
    loadbench.run(case)


@_cases("units")
def test_hidden_units(loadbench, case: Case) -> None:
    loadbench.run(case)


@_cases("batch")
def test_batch_size(loadbench, case: Case) -> None:
    loadbench.run(case)


@_cases("act")
def test_activation(loadbench, case: Case) -> None:
    loadbench.run(case)


@_cases("opt")
def test_optimizer(loadbench, case: Case) -> None:
    loadbench.run(case)
