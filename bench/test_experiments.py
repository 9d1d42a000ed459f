"""The study's five experiments, one hyperparameter varied around the optimal configuration.

On a CPU at the smoke profile the values of one experiment run the same eager code, and
the optimal configuration is trained again by bench/test_loops.py (loop-fast): there each
experiment keeps the values of SMOKE_CPU_CASES, and the others belong to the nightly tier
(`--tier nightly` runs them). With a GPU, or at any other profile, every value runs.
"""

from __future__ import annotations

import pytest

from kernels.ground.cases import case_ids
from kernels.ground.cases import experiment_cases
from bench.plugin import get_session

# A value off the optimum per experiment, the cheapest that still varies its axis, and
# two optimizers (each is its own torch.optim class, set up from its own row).
SMOKE_CPU_CASES = frozenset({"blocks-2", "units-128", "batch-128", "act-sigmoid", "opt-sgd", "opt-rmsprop"})
EXPERIMENT_OF_TEST = {
    "test_hidden_blocks": "blocks",
    "test_hidden_units": "units",
    "test_batch_size": "batch",
    "test_activation": "act",
    "test_optimizer": "opt",
}


def smoke_on_cpu(config: pytest.Config) -> bool:
    """Whether this session trains the smoke profile on a CPU."""
    session = get_session(config)
    return session is not None and session.options.profile.name == "smoke" and session.options.device.type == "cpu"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Each test's experiment, value by value; on a CPU at the smoke profile the values outside
    SMOKE_CPU_CASES are marked nightly."""
    experiment = EXPERIMENT_OF_TEST.get(metafunc.function.__name__)
    if experiment is None or "case" not in metafunc.fixturenames:
        return
    few = smoke_on_cpu(metafunc.config)
    metafunc.parametrize(
        "case",
        [
            pytest.param(case, marks=[pytest.mark.nightly] if few and case not in SMOKE_CPU_CASES else [])
            for case in case_ids(experiment_cases(experiment))
        ],
    )


def test_hidden_blocks(loadbench, case: str) -> None:
    loadbench.run(case)


def test_hidden_units(loadbench, case: str) -> None:
    loadbench.run(case)


def test_batch_size(loadbench, case: str) -> None:
    loadbench.run(case)


def test_activation(loadbench, case: str) -> None:
    loadbench.run(case)


def test_optimizer(loadbench, case: str) -> None:
    loadbench.run(case)
