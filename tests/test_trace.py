"""Kernel traces: the diff and its lines on recorded tables, the stored form, and real
profiles of a tiny trainer (CPU always, GPU where there is one) with a planted op."""

from __future__ import annotations

import json
import math

import pytest
import torch

from bench.gate.kernel_table import MAX_ROWS
from bench.gate.kernel_table import KernelRow
from bench.gate.kernel_table import KernelTable
from bench.gate.kernel_table import describe
from bench.gate.kernel_table import name_id
from bench.gate.kernel_table import diff
from bench.monitor.trace import profile_epochs
from bench.monitor.trace import profile_trainer
from bench.gate.kernel_table import shorten
from model.config import TrainConfig
from model.data import load_dataset
from model.train import Trainer

gpu = pytest.mark.gpu

LONG = (
    "void cutlass::Kernel2<cutlass_80_simt_sgemm_128x64_8x5_nn_align1>(cutlass_80_simt_sgemm_128x64_8x5_nn_align1::"
    "Params)<float, float, float, cutlass::arch::Sm80, cutlass::gemm::GemmShape<128, 64, 8>>"
)


def table(rows: dict[str, tuple[float, float]], device: str = "cuda", epochs: int = 3) -> KernelTable:
    """name -> (calls per epoch, µs per epoch)."""
    return KernelTable(device, epochs, tuple(KernelRow(n, c, u) for n, (c, u) in rows.items()))


THEN = table({"sgemm_nn": (159, 800.0), "sgemm_tn": (159, 600.0), "adam": (53, 300.0), "relu": (159, 100.0)})


# ---------------------------------------------------------------------------- diff of recorded tables


def test_diff_lists_growth_and_new_kernels_largest_first_and_not_shrinkage() -> None:
    now = table(
        {
            "sgemm_nn": (159, 895.0),  # +95, +11.9%
            "sgemm_tn": (159, 400.0),  # shrank: not listed
            "adam": (53, 300.0),  # unchanged: not listed
            "relu": (318, 130.0),  # +30, calls doubled
            "my_extra_kernel": (159, 812.0),  # new: +812
        }
    )
    changes = diff(now, THEN)
    assert [c.name for c in changes] == ["my_extra_kernel", "sgemm_nn", "relu"]
    new, grown, relu = changes
    assert new.new and new.us_then == 0 and new.calls_then is None and new.delta_us == 812
    assert not grown.new and grown.delta_us == pytest.approx(95) and grown.growth == pytest.approx(95 / 800)
    assert not grown.calls_changed and relu.calls_changed
    assert describe(changes) == [
        "+812 µs/epoch  my_extra_kernel (new: 159 calls/epoch)",
        "+95 µs/epoch (+12%)  sgemm_nn (159 -> 159 calls/epoch)",
        "+30 µs/epoch (+30%)  relu (159 -> 318 calls/epoch)",
    ]


def test_diff_respects_top_and_orders_ties_by_name() -> None:
    now = table({f"k{i}": (1, 1000.0 + 10 * i) for i in range(8)} | {"z": (1, 1010.0), "a": (1, 1010.0)})
    names = [c.name for c in diff(now, table({}), top=3)]
    assert names == ["k7", "k6", "k5"]
    assert len(diff(now, table({}))) == 5
    assert diff(now, table({}), top=0) == []
    assert [c.name for c in diff(now, table({}), top=100)][-4:] == ["a", "k1", "z", "k0"]
    with pytest.raises(ValueError, match="top"):
        diff(now, THEN, top=-1)


def test_nothing_grew_means_no_changes() -> None:
    assert diff(THEN, THEN) == []
    assert describe([]) == []


def test_tables_of_different_devices_are_not_compared() -> None:
    with pytest.raises(ValueError, match="cpu table cannot be compared with a cuda table"):
        diff(table({"aten::mm": (5, 10.0)}, device="cpu"), THEN)


def test_long_kernel_names_are_shortened_for_display_but_diffed_in_full() -> None:
    twin = LONG[:-5] + "ZZZZ>"  # same first 80 characters, another kernel
    then = table({LONG: (10, 100.0), twin: (10, 100.0)})
    now = table({LONG: (10, 100.0), twin: (10, 150.0)})
    (change,) = diff(now, then)
    assert change.name == twin  # the full name, not the shortened one
    (line,) = describe([change])
    shown = shorten(twin)
    assert len(shown) <= 80 and shown.endswith("…") and shown[:-1] in line and twin not in line
    assert line.startswith("+50 µs/epoch (+50%)  void cutlass::Kernel2<")
    assert shorten("short_kernel") == "short_kernel"


def test_a_kernel_the_baseline_folded_into_other_is_not_called_new() -> None:
    folded = frozenset(name_id(n) for n in ("rare", "tiny"))
    then = KernelTable("cuda", 3, THEN.rows, KernelRow("other", 40, 12.0), folded)
    assert then.folded == 2 and then.was_folded("rare") and not then.was_folded("fresh")
    rare, fresh = diff(table({"rare": (2, 9.5), "fresh": (1, 2.0), "tiny": (1, 0.0)}), then)
    assert rare.name == "rare" and rare.was_folded and not rare.new and rare.us_then_bound == 100.0
    assert fresh.new and not fresh.was_folded
    assert describe([rare, fresh]) == [
        "+9.5 µs/epoch  rare (below the baseline's top rows, then at most 100 µs/epoch; now 2 calls/epoch)",
        "+2 µs/epoch  fresh (new: 1 calls/epoch)",
    ]


# ---------------------------------------------------------------------------- the stored form


def test_round_trip_through_json_keeps_the_table() -> None:
    original = KernelTable.from_totals("cuda", 2, {LONG: (318, 1700.5), "memset": (2, 3.25), "relu": (636, 200.0)})
    assert [r.name for r in original.rows] == [LONG, "relu", "memset"]  # time, largest first
    assert original.rows[0] == KernelRow(LONG, 159.0, 850.25)
    stored = json.loads(json.dumps(original.to_dict()))
    assert stored["total_us_per_epoch"] == pytest.approx(850.25 + 100 + 1.625, abs=0.01)
    assert KernelTable.from_dict(stored) == original


def test_only_the_top_rows_are_kept_and_the_rest_sums_into_other() -> None:
    totals = {f"kernel_{i:03d}": (2 * (i + 1), 4.0 * (i + 1)) for i in range(MAX_ROWS + 10)}
    built = KernelTable.from_totals("cpu", 2, totals)
    assert len(built.rows) == MAX_ROWS and built.folded == 10
    assert all(built.was_folded(f"kernel_{i:03d}") for i in range(10)) and not built.was_folded("kernel_010")
    assert built.rows[0].name == f"kernel_{MAX_ROWS + 9:03d}"
    assert built.other == KernelRow("other", sum(range(1, 11)), 2.0 * sum(range(1, 11)))
    assert built.total_us_per_epoch == pytest.approx(sum(2.0 * (i + 1) for i in range(MAX_ROWS + 10)))
    stored = built.to_dict()
    assert len(stored["rows"]) == MAX_ROWS and len(stored["other"]["kernels"]) == 10
    assert KernelTable.from_dict(stored) == built

    # A table made by hand with more rows is folded when stored.
    wide = table({f"k{i}": (1, float(i + 1)) for i in range(MAX_ROWS + 3)}, device="cpu")
    back = KernelTable.from_dict(wide.to_dict())
    assert len(back.rows) == MAX_ROWS and back.folded == 3 and back.other.us_per_epoch == 6.0
    assert back.was_folded("k0") and not back.was_folded(f"k{MAX_ROWS + 2}")
    assert back.total_us_per_epoch == pytest.approx(wide.total_us_per_epoch)


def good() -> dict:
    return KernelTable.from_totals("cuda", 3, {"a": (3, 30.0), "b": (6, 3.0)}).to_dict()


@pytest.mark.parametrize(
    ("break_it", "message"),
    [
        (lambda d: [d], "expected a mapping"),
        (lambda d: {k: v for k, v in d.items() if k != "rows"}, "missing key.*rows"),
        (lambda d: d | {"version": 99}, "version 99"),
        (lambda d: d | {"device": "tpu"}, "device 'tpu'"),
        (lambda d: d | {"epochs": 0}, "epochs 0"),
        (lambda d: d | {"epochs": True}, "epochs True"),
        (lambda d: d | {"rows": "a,b"}, "rows: expected a list"),
        (lambda d: d | {"rows": [["a", 1.0]]}, r"rows\[0\]: expected \[name"),
        (lambda d: d | {"rows": [["a", 1.0, 2.0], [7, 1.0, 2.0]]}, r"rows\[1\]: name 7"),
        (lambda d: d | {"rows": [["a", 1.0, 2.0], ["", 1.0, 2.0]]}, r"rows\[1\]: name ''"),
        (lambda d: d | {"rows": [["a", "many", 2.0]]}, r"rows\[0\]: calls per epoch: 'many'"),
        (lambda d: d | {"rows": [["a", 1.0, -2.0]]}, r"rows\[0\]: µs per epoch: -2.0"),
        (lambda d: d | {"rows": [["a", 1.0, math.nan]]}, r"rows\[0\]: µs per epoch: nan"),
        (lambda d: d | {"rows": [["a", 1.0, 2.0], ["a", 1.0, 2.0]]}, r"rows\[1\]: kernel 'a' appears twice"),
        (lambda d: d | {"other": [1, 2, 3]}, "other: expected a mapping or null"),
        (lambda d: d | {"other": {"kernels": [], "calls_per_epoch": 1.0}}, "other: missing key 'us_per_epoch'"),
        (lambda d: d | {"other": {"kernels": 2, "calls_per_epoch": 1.0, "us_per_epoch": 1.0}},
         "kernels 2: expected a list"),
        (lambda d: d | {"other": {"kernels": ["xyz"], "calls_per_epoch": 1.0, "us_per_epoch": 1.0}}, "8-hex-digit"),
    ],
)
def test_malformed_stored_tables_are_refused_with_the_field_named(break_it, message) -> None:
    with pytest.raises(ValueError, match=message):
        KernelTable.from_dict(break_it(good()))


def test_from_totals_refuses_unknown_devices_and_no_epochs() -> None:
    with pytest.raises(ValueError, match="device 'mps'"):
        KernelTable.from_totals("mps", 1, {})
    with pytest.raises(ValueError, match="epochs=0"):
        KernelTable.from_totals("cpu", 0, {})


# ---------------------------------------------------------------------------- real profiles


@pytest.fixture
def one_thread():
    """One intra-op thread: on a busy machine an op waiting for its OpenMP team would
    charge the wait to whichever op it was; with one thread an op's time is its own."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def planted_step(monkeypatch, size: int, device: torch.device) -> None:
    """Trainer.step also runs a cumsum over `size` floats: an op the plain step never runs."""
    big = torch.ones(size, device=device)
    plain_step = Trainer.step

    def step(self, x, y):
        torch.cumsum(big, 0)
        return plain_step(self, x, y)

    monkeypatch.setattr(Trainer, "step", step)


def steps_per_epoch(trainer: Trainer) -> int:
    return math.ceil(len(trainer.data.y_train) / trainer.config.batch_size)


def test_cpu_profile_of_a_tiny_trainer_names_a_planted_op_first(data, one_thread, monkeypatch) -> None:
    config = TrainConfig(width=16, depth=2, epochs=1)
    trainer = Trainer(config, data)
    device = data.device
    steps = steps_per_epoch(trainer)
    assert steps >= 2

    plain = profile_epochs(trainer._epoch, device, epochs=2)
    assert plain.device == "cpu" and plain.epochs == 2
    assert all(r.name.startswith("aten::") for r in plain.rows)
    rows = {r.name: r for r in plain.rows}
    linears = config.depth + 1
    # Each Linear's forward is one addmm per step; its backward, mm for the weight
    # gradient and (but for the first layer) one for the input gradient.
    assert rows["aten::addmm"].calls_per_epoch == linears * steps
    assert rows["aten::mm"].calls_per_epoch == (2 * linears - 1) * steps
    assert rows["aten::addmm"].us_per_epoch > 0
    assert plain.total_us_per_epoch >= sum(r.us_per_epoch for r in plain.rows) > 0
    assert "aten::cumsum" not in rows
    assert trainer.epoch_seconds == [] and trainer.losses == []  # profiling records no epochs

    # ~16M floats: tens of ms per call, against well under a millisecond for a whole
    # plain step of this tiny model, so the planted op leads by orders of magnitude.
    planted_step(monkeypatch, 1 << 24, device)
    planted = profile_epochs(trainer._epoch, device, epochs=2)
    changes = diff(planted, plain)
    assert changes[0].name == "aten::cumsum" and changes[0].new
    assert changes[0].calls_now == steps
    assert describe(changes)[0].endswith(f"aten::cumsum (new: {steps} calls/epoch)"), describe(changes)
    assert KernelTable.from_dict(json.loads(json.dumps(planted.to_dict()))) == planted


def test_profile_trainer_profiles_in_the_case_precision_and_train_mode(data, one_thread) -> None:
    trainer = Trainer(TrainConfig(width=16, depth=1, epochs=1, precision="bf16"), data)
    trainer.model.eval()
    table = profile_trainer(trainer, epochs=1, warmup=0)
    assert trainer.model.training
    assert any(r.name == "aten::addmm" for r in table.rows)
    assert any(r.name in ("aten::_to_copy", "aten::to") for r in table.rows)  # bf16 autocast casts


def test_profile_epochs_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="epochs=0"):
        profile_epochs(lambda: None, torch.device("cpu"), epochs=0)
    with pytest.raises(ValueError, match="warmup=-1"):
        profile_epochs(lambda: None, torch.device("cpu"), warmup=-1)
    with pytest.raises(ValueError, match="device meta"):
        profile_epochs(lambda: None, torch.device("meta"))


@gpu
@pytest.mark.parametrize("loop", ["fast", "graph"])
def test_gpu_profile_names_a_planted_kernel_first(monkeypatch, loop) -> None:
    device = torch.device("cuda")
    data = load_dataset("synthetic", scale=0.02, device=device)
    trainer = Trainer(TrainConfig(width=16, depth=2, epochs=1, loop=loop), data)
    steps = steps_per_epoch(trainer)
    trainer.fit()  # the timed run comes first in the harness (and captures the graphs)

    plain = profile_epochs(trainer._epoch, device)
    assert plain.device == "cuda" and plain.epochs == 3 and plain.rows
    # Kernels only: the eager loop's Optimizer.step annotation on the GPU timeline is no kernel.
    assert not [r.name for r in plain.rows if r.name.startswith("Optimizer.")]
    assert plain.total_us_per_epoch > 0
    gemm_calls = sum(r.calls_per_epoch for r in plain.rows if "gemm" in r.name.lower())
    assert gemm_calls >= (2 * (2 + 1) - 1 + 3) * steps  # forward and backward matmuls, whatever cuBLAS picks

    if loop == "fast":
        # 64M floats: a scan of a quarter gigabyte per step, against a few µs for
        # each kernel of this tiny model.
        planted_step(monkeypatch, 1 << 26, device)
        planted = profile_epochs(trainer._epoch, device)
        changes = diff(planted, plain)
        first = changes[0]
        assert first.new and "scan" in first.name.lower(), describe(changes)
        assert first.calls_now == steps
