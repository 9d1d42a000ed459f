"""The step bound (model/bound.py), its ceilings on this CPU (bench/monitor/ceiling.py)
and its table (bench/gate/summary.py)."""

from __future__ import annotations

import pytest
import torch

from bench.gate.summary import bound_note
from bench.gate.summary import bound_table
from bench.monitor.ceiling import measure_ceilings
from model.bound import Bound
from model.bound import Ceilings
from model.bound import step_bound
from model.bound import step_bytes
from model.bound import steps_per_epoch
from model.config import TrainConfig
from model.cost import training_cost

# One TFLOP/s, 1 GB/s and 2 us a kernel keep the arithmetic readable.
UNIT = Ceilings(matmul_tflops=1.0, copy_gb_per_s=1.0, kernel_gap_us=2.0)


def config(**changes: object) -> TrainConfig:
    return TrainConfig().replace(**{"depth": 3, "width": 512, "batch_size": 512, "optimizer": "adam", **changes})


def test_steps_count_the_last_partial_batch() -> None:
    assert steps_per_epoch(1024, 512) == 2 and steps_per_epoch(1025, 512) == 3 and steps_per_epoch(10, 512) == 1


def test_step_bytes_are_parameter_sized_tensors_read_and_written_plus_the_batch() -> None:
    cost = training_cost(config(), 1024)
    params = cost.parameters * 4
    # weights, gradients and Adam's two moments, each read and written; 75 fp32 features and a label a sample
    assert step_bytes(cost, 512, 75) == 2 * (params + params + 2 * params) + 512 * (75 * 4 + 8)


def test_the_floors_follow_from_the_cost_the_trace_and_the_ceilings() -> None:
    cfg = config()
    cost = training_cost(cfg, 1024)
    bound = step_bound(cost, cfg, n_train=1024, in_features=75, kernels_per_epoch=60, device_us_per_epoch=400.0,
                       epoch_seconds=0.001, ceilings=Ceilings(1.0, 100.0, 2.0))
    assert bound.kernels_per_step == 30 and bound.device_us_per_step == 200 and bound.step_us == pytest.approx(500)
    assert bound.compute_us == pytest.approx(cost.train_flops_per_epoch / 2 / 1e6)
    assert bound.memory_us == pytest.approx(step_bytes(cost, 512, 75) / 1e5)
    assert bound.launch_us == 60.0
    # 1.7 GFLOP a step at 1 TFLOP/s is above 18 MB at 100 GB/s and 60 us of launches
    assert bound.nearest == "compute" and bound.floor_fraction == pytest.approx(bound.compute_us / 500)


@pytest.mark.parametrize(("floors", "nearest"), [((1.0, 5.0, 2.0), "memory"), ((1.0, 2.0, 9.0), "launch"),
                                                ((3.0, 2.0, 1.0), "compute")])
def test_the_nearest_floor_is_the_largest(floors: tuple[float, float, float], nearest: str) -> None:
    bound = Bound(kernels_per_step=1, device_us_per_step=1, step_us=10, compute_us=floors[0], memory_us=floors[1],
                  launch_us=floors[2])
    assert bound.nearest == nearest and bound.as_dict()["nearest"] == nearest
    assert bound.as_dict()["floor_fraction"] == pytest.approx(max(floors) / 10)


@pytest.mark.parametrize("field", ["epoch_seconds", "matmul_tflops", "copy_gb_per_s", "kernel_gap_us"])
def test_a_non_positive_time_or_ceiling_is_refused_by_name(field: str) -> None:
    cfg = config()
    ceilings = {**UNIT.as_dict()}
    epoch = 0.0 if field == "epoch_seconds" else 1.0
    if field in ceilings:
        ceilings[field] = 0.0
    with pytest.raises(ValueError, match=f"step_bound: {field}=0.0"):
        step_bound(training_cost(cfg, 1024), cfg, 1024, 75, 60, 400.0, epoch, Ceilings(**ceilings))


def test_the_ceilings_measure_on_a_cpu() -> None:
    ceilings = measure_ceilings(torch.device("cpu"), "fp32")
    assert ceilings.matmul_tflops > 0 and ceilings.copy_gb_per_s > 0 and ceilings.kernel_gap_us > 0


def test_the_bound_table_lists_cases_with_a_bound_and_says_what_the_floors_are() -> None:
    bound = Bound(kernels_per_step=31, device_us_per_step=120, step_us=150, compute_us=2.5, memory_us=6.0,
                  launch_us=45.0)
    record = {"bound": {**bound.as_dict(), "device": "cuda", "ceilings": UNIT.as_dict()}}
    lines = bound_table("loop", [("graph", record), ("reference", {"bound": None})])
    text = "\n".join(lines)
    assert "| graph " in text and "reference" not in text
    assert "| 31 " in text and "launch" in text and "30%" in text  # 45 of 150 us
    note = "\n".join(bound_note([record]))
    assert "per optimizer step, kernel count" in note and bound_note([{"bound": None}]) == []
    assert bound_table("loop", [("reference", {"bound": None})]) == []


def bound_record(case: str, nearest_launch: bool = False) -> dict:
    bound = Bound(kernels_per_step=31, device_us_per_step=120, step_us=100, compute_us=50.0, memory_us=10.0,
                  launch_us=80.0 if nearest_launch else 5.0)
    return {"case": case, "config": config().as_dict(),
            "bound": {**bound.as_dict(), "device": "cuda", "ceilings": UNIT.as_dict()}}


def test_a_step_point_recovers_intensity_and_rate_from_the_floors() -> None:
    from bench.figures.training import step_point

    intensity, tflops = step_point(bound_record("blocks-3")["bound"])
    # 50 us at 1 TFLOP/s is 5e7 FLOP; 10 us at 1 GB/s is 1e4 bytes; 5e7 FLOP in 100 us is 0.5 TFLOP/s
    assert intensity == pytest.approx(5e3) and tflops == pytest.approx(0.5)


def test_the_roofline_draws_each_bounded_case_and_says_when_there_is_none() -> None:
    from bench.figures.training import roofline_figure

    fig = roofline_figure([bound_record("blocks-3"), bound_record("loop-graph", nearest_launch=True),
                           {"case": "units-128", "bound": None}])
    (ax,) = fig.axes
    labels = [t.get_text() for t in ax.texts]
    assert "blocks-3" in labels and "loop-graph" in labels and "units-128" not in labels
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("nearest the launch floor" in t for t in legend) and any("ridge" in t for t in legend)
    empty = roofline_figure([{"case": "units-128", "bound": None}])
    assert "no step bounds" in empty.axes[0].texts[0].get_text()


def test_the_memory_floor_of_a_data_set_smaller_than_a_batch_moves_that_data_set_once() -> None:
    """100 training rows and batch 512: one step a epoch, reading the 100 rows, not 512."""
    cfg = config()
    cost = training_cost(cfg, 100)
    bound = step_bound(cost, cfg, n_train=100, in_features=75, kernels_per_epoch=30, device_us_per_epoch=90.0,
                       epoch_seconds=0.001, ceilings=UNIT)
    assert step_bytes(cost, 100, 75) < step_bytes(cost, 512, 75)
    assert bound.memory_us == pytest.approx(step_bytes(cost, 100, 75) / 1e9 * 1e6)
    assert bound.compute_us == pytest.approx(cost.train_flops_per_epoch / 1e12 * 1e6)  # the one step is the epoch
    assert bound.kernels_per_step == 30 and bound.step_us == pytest.approx(1000)


@pytest.fixture
def planted_seconds(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Each timed call of bench/monitor/ceiling.py takes 0.5 s on a planted clock; the list
    keeps what each timed function returned once."""
    from bench.monitor import ceiling

    returned: list[object] = []
    monkeypatch.setattr(ceiling, "_seconds", lambda fn, device, repeats=3: returned.append(fn()) or 0.5)
    return returned


def test_the_matmul_ceiling_counts_two_flops_per_multiply_add(planted_seconds: list[object]) -> None:
    from bench.monitor import ceiling

    n = ceiling.SIZE["cpu"]
    assert ceiling.matmul_tflops(torch.device("cpu"), "fp32") == pytest.approx(2 * n**3 / 0.5 / 1e12)
    (product,) = planted_seconds
    assert product.shape == (n, n)  # an n x n by n x n product: n**3 multiply-adds
    assert ceiling.copy_gb_per_s(torch.device("cpu")) == pytest.approx(2 * ceiling.COPY_BYTES["cpu"] / 0.5 / 1e9)


def test_the_cpus_per_op_gap_is_the_loops_time_over_its_ops(planted_seconds: list[object]) -> None:
    from bench.monitor import ceiling

    assert ceiling.kernel_gap_us(torch.device("cpu")) == pytest.approx(0.5 / ceiling.CPU_OPS * 1e6)


def test_bf16_is_held_to_a_ceiling_measured_in_bf16(planted_seconds: list[object],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The matmul runs in the precision asked for, and the session keeps one ceiling per
    precision, so a bf16 case's compute floor is not the fp32 ceiling's."""
    from types import SimpleNamespace

    from bench.monitor import ceiling
    from bench.plugin import session as session_module

    ceiling.matmul_tflops(torch.device("cpu"), "bf16")
    ceiling.matmul_tflops(torch.device("cpu"), "fp32")
    assert [product.dtype for product in planted_seconds] == [torch.bfloat16, torch.float32]
    measured: list[str] = []

    def measure(device: torch.device, precision: str) -> Ceilings:
        measured.append(precision)
        return Ceilings({"fp32": 1.0, "bf16": 4.0}[precision], 10.0, 2.0)

    monkeypatch.setattr(session_module, "measure_ceilings", measure)
    session = SimpleNamespace(_ceilings={}, options=SimpleNamespace(device=torch.device("cpu")))
    ceilings = session_module.LoadBenchSession.ceilings
    assert [ceilings(session, p).matmul_tflops for p in ("bf16", "fp32", "bf16")] == [4.0, 1.0, 4.0]
    assert measured == ["bf16", "fp32"]  # each measured once, at its first use


PLANTED_CEILINGS = """
import pytest
from model.bound import Ceilings

pytest_plugins = ["bench.plugin"]


@pytest.fixture(autouse=True)
def planted_ceilings(monkeypatch):
    from bench.plugin import session
    monkeypatch.setattr(session, "measure_ceilings",
                        lambda device, precision: Ceilings({"fp32": 1.0, "bf16": 4.0}[precision], 10.0, 2.0))
"""


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_a_cases_bound_reads_the_ceiling_of_its_own_precision(inprocess_ready: None, pytester: pytest.Pytester,
                                                              precision: str) -> None:
    import json

    from model.data import synthesize
    from model.data import write_csv

    pytester.makeconftest(PLANTED_CEILINGS)
    pytester.makepyfile(test_case="from kernels.ground.cases import Case\n\ndef test_small(loadbench):\n"
                                  "    loadbench.run(Case('blocks', 2), width=16)\n")
    data = write_csv(synthesize(scale=0.02), pytester.path / "tiny.csv")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--device=cpu", "--profile=smoke", "--epochs=2",
                                          f"--precision={precision}", f"--dataset={data}",
                                          "--benchmark-json=out.json", f"--benchmark-storage={pytester.path / 'runs'}")
    result.assert_outcomes(passed=1)
    (bench,) = json.loads((pytester.path / "out.json").read_text())["benchmarks"]
    bound = bench["extra_info"]["bound"]
    tflops = {"fp32": 1.0, "bf16": 4.0}[precision]
    assert bound["ceilings"]["matmul_tflops"] == tflops
    steps = bench["extra_info"]["cost"]["train_flops_per_epoch"] / (bound["compute_us"] * 1e-6 * tflops * 1e12)
    assert steps == pytest.approx(round(steps)) and steps >= 1  # the floor is the epoch's FLOPs a step at that rate
