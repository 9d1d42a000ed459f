"""The study's five experiments: one hyperparameter varied around the optimal configuration.

Case ids are the pytest ids (`blocks-2`, `units-1024`, `batch-64`, `act-sigmoid`,
`opt-sgd`) and the keys of per-case budgets.
"""

from __future__ import annotations

from dataclasses import dataclass

EXPERIMENTS: dict[str, tuple[str, tuple[object, ...]]] = {
    # experiment: (TrainConfig field, values), in the study's order
    "blocks": ("depth", (2, 3, 4, 5)),
    "units": ("width", (128, 256, 512, 1024, 2048)),
    "batch": ("batch_size", (64, 128, 256, 512)),
    "act": ("activation", ("relu", "leaky_relu", "tanh", "sigmoid", "silu")),
    "opt": ("optimizer", ("adagrad", "rmsprop", "sgd", "adam")),
}
TITLES = {
    "blocks": "hidden blocks",
    "units": "hidden units",
    "batch": "batch size",
    "act": "activation",
    "opt": "optimizer",
    "loop": "training loop",
}


# The headline comparison of training loops on the optimal configuration.
LOOP_CASES = {  # case value: TrainConfig changes
    "reference": {"loop": "reference"},
    "fast": {"loop": "fast"},
    "step-graph": {"loop": "step-graph"},
    "graph": {"loop": "graph"},
    "graph-triton": {"loop": "graph", "impl": "triton"},
    # the step's optimizer and loss as one kernel each, over a flat parameter buffer
    "graph-fused-step": {"loop": "graph", "optimizer_impl": "triton"},
    "graph-triton-fused-step": {"loop": "graph", "impl": "triton", "optimizer_impl": "triton"},
    # the peer: torch.compile of the same step, inside the same graph loop
    "graph-compile": {"loop": "graph", "impl": "compile"},
}


@dataclass(frozen=True)
class Case:
    experiment: str
    value: object

    @property
    def id(self) -> str:
        return f"{self.experiment}-{self.value}"

    @classmethod
    def parse(cls, case_id: str) -> Case:
        """The case of a case id ('units-128', 'loop-graph-triton'); ValueError names an unknown id."""
        if case_id not in CASE_IDS:
            raise ValueError(f"unknown case id {case_id!r}")
        experiment, _, value = case_id.partition("-")
        values = LOOP_CASES if experiment == "loop" else EXPERIMENTS[experiment][1]
        return cls(experiment, next(v for v in values if str(v) == value))

    @property
    def changes(self) -> dict[str, object]:
        if self.experiment == "loop":
            return dict(LOOP_CASES[str(self.value)])
        return {EXPERIMENTS[self.experiment][0]: self.value}


def case_ids(cases: list[Case]) -> list[str]:
    """Case ids as pytest parameters: strings, so pytest-benchmark's group-by, CSV and
    JSON show 'units-128' (a Case object there reads UNSERIALIZABLE[Case(...)])."""
    return [case.id for case in cases]


def experiment_cases(experiment: str) -> list[Case]:
    return [Case(experiment, value) for value in EXPERIMENTS[experiment][1]]


def all_cases() -> list[Case]:
    return [case for name in EXPERIMENTS for case in experiment_cases(name)]


def loop_cases() -> list[Case]:
    return [Case("loop", value) for value in LOOP_CASES]


CASE_IDS = frozenset(case.id for case in all_cases() + loop_cases())


_STUDY_RANKS = {name: rank for rank, name in enumerate([*EXPERIMENTS, "loop"])}


def study_order(case_id: str) -> tuple[object, ...]:
    """Sort key that lists case ids in the study's order: the experiments as EXPERIMENTS
    lists them (blocks, units, batch, act, opt), then the training loops, each with its
    values in the study's order (units-128 before units-1024, batch-64 before batch-512).
    A value the study does not list follows its experiment's own (numbers by size), and
    an id of no known experiment comes last, by name."""
    experiment, _, value = str(case_id).partition("-")
    rank = _STUDY_RANKS.get(experiment)
    if rank is None:
        return (len(_STUDY_RANKS), 0, (), str(case_id))
    values = [str(v) for v in (LOOP_CASES if experiment == "loop" else EXPERIMENTS[experiment][1])]
    if value in values:
        return (rank, values.index(value), (), "")
    try:
        number: tuple[object, ...] = (0, float(value))
    except ValueError:
        number = (1, value)
    return (rank, len(values), number, value)
