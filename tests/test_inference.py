"""Serving on CPU: latency statistics on planted samples, measure under a planted clock,
the trained-model cache (hit, misses, corrupt file), evaluate's drop and speed-up,
and the inference budgets and p99 compare as pure checks."""

from __future__ import annotations

import contextlib

import gc

import itertools
import os
from pathlib import Path

import pytest
import torch

from bench.gate.budgets import BudgetError
from bench.gate.budgets import Budgets
from bench.gate.budgets import InferenceBudget
from bench.gate.budgets import check_inference
from bench.gate.timing import check_latency
from bench.plugin.serving import RECORD_KEYS
from bench.plugin.serving import skip_reason
from model import inference
from model import latency
from model import serving
from model import trained
from model.compress import Compression
from model.compress import Unsupported
from model.config import TrainConfig
from model.data import load_dataset
from model.inference import evaluate
from model.inference import measure
from model.latency import latency_call_count
from model.latency import latency_stats
from model.latency import round_p99s
from model.trained import trained_model
from model.mlp import MLP

CPU = torch.device("cpu")
CONFIG = TrainConfig(width=32, depth=2, epochs=1, loop="fast")


def stepping_clock(step: float):
    """A planted clock: each reading `step` seconds after the last."""
    counter = itertools.count()
    return lambda: next(counter) * step


# ---------------------------------------------------------------- latency statistics


def test_latency_stats_on_planted_samples():
    samples = [i * 1e-6 for i in range(1, 101)]  # 1..100 us
    stats = latency_stats(samples[::-1])
    assert stats == {"p50": pytest.approx(50e-6), "p99": pytest.approx(99e-6), "max": pytest.approx(100e-6)}
    assert latency_stats([7e-6]) == {"p50": 7e-6, "p99": 7e-6, "max": 7e-6}


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")], [-1e-6]])
def test_latency_stats_rejects_bad_samples(bad):
    with pytest.raises(ValueError, match="latency_stats"):
        latency_stats(bad)


def test_round_p99s_one_per_round():
    samples = [1.0] * 10 + [2.0] * 10
    assert round_p99s(samples, rounds=2) == [1.0, 2.0]
    assert round_p99s([3.0, 1.0], rounds=5) == [3.0]


# ---------------------------------------------------------------- measure


@pytest.mark.parametrize(
    ("calls", "once", "expected"),
    [(2000, 50e-6, 2000), (2000, 2e-3, 1000), (2000, 8e-3, 500), (2000, 1.0, 500), (100, 1.0, 100), (2000, 0.0, 2000)],
)
def test_latency_call_count_caps_a_slow_mode_by_time_with_a_floor(calls, once, expected):
    assert latency_call_count(calls, once, seconds=2.0, minimum=500) == expected


def test_measure_times_fewer_calls_where_one_call_is_slow(data, monkeypatch):
    """The planted clock makes every call 10 ms: 2000 default calls would fill 20 s, so the
    mode gets the floor of 500 (2 s / 10 ms = 200, raised to the floor)."""
    import model.inference as inference

    monkeypatch.setitem(latency.LATENCY_CALLS, "cpu", 2000)
    monkeypatch.setitem(latency.LATENCY_SECONDS, "cpu", 2.0)
    result = measure(MLP(75, 32, 2, 10).eval(), data, CPU, batches=(64,), clock=stepping_clock(0.01))
    assert result["latency_calls"] == latency.LATENCY_MIN_CALLS == 500
    assert len(result["latency_p99_by_round_s"]) == latency.LATENCY_ROUNDS


def test_measure_keeps_every_call_where_calls_are_fast(data, monkeypatch):
    import model.inference as inference

    monkeypatch.setitem(latency.LATENCY_CALLS, "cpu", 700)
    result = measure(MLP(75, 32, 2, 10).eval(), data, CPU, batches=(64,), clock=stepping_clock(1e-5))
    assert result["latency_calls"] == 700




def test_measure_with_a_planted_clock(data):
    model = MLP(75, 32, 2, 10).eval()
    result = measure(model, data, CPU, latency_calls=20, batches=(64, 128), clock=stepping_clock(0.1))
    assert result["latency_eager_s"] == {"p50": pytest.approx(0.1), "p99": pytest.approx(0.1),
                                         "max": pytest.approx(0.1)}
    assert result["latency_graph_s"] is None and "GPU" in result["unavailable"]["latency_graph_s"]
    # 0.1 s per reading: 3 calls of batch 64 between two readings
    assert result["throughput"] == {"64": pytest.approx(3 * 64 / 0.1), "128": pytest.approx(3 * 128 / 0.1)}
    assert result["energy_j_per_1k"] is None and "cpu" in result["unavailable"]["energy_j_per_1k"]
    predictions = model(data.x_test).argmax(1)
    assert result["accuracy"] == pytest.approx(float((predictions == data.y_test).float().mean()))
    assert len(result["latency_p99_by_round_s"]) == 5


def test_measure_reads_a_planted_energy_counter(data):
    readings = iter([1000.0, 1000.0 + 3 * 128 * 2.0])  # mJ: 2 mJ a sample over the largest batch's loop
    result = measure(MLP(75, 32, 2, 10), data, CPU, latency_calls=5, batches=(128,), clock=stepping_clock(0.1),
                     energy_mj=lambda: next(readings))
    assert result["energy_j_per_1k"] == pytest.approx(2.0)  # 2 mJ x 1000 = 2 J per 1,000
    assert "energy_j_per_1k" not in result["unavailable"]


def test_latency_is_timed_with_the_garbage_collector_paused(data):
    seen = []

    def timer(call, count):
        seen.append(gc.isenabled())
        return [5e-6] * count

    assert gc.isenabled()
    measure(MLP(75, 32, 2, 10), data, CPU, latency_calls=3, batches=(64,), clock=stepping_clock(0.1),
            latency_timer=timer)
    assert seen == [False] and gc.isenabled()  # paused for the timer, back on after


def test_latency_is_timed_inside_the_quiet_context_it_is_given(data):
    """The benchmark hands its load monitor's `paused`: every batch-1 loop (eager and,
    on a GPU, graph) runs inside it, nothing else does."""
    state = {"quiet": False, "entered": 0}
    seen = []

    @contextlib.contextmanager
    def quiet():
        state["quiet"], state["entered"] = True, state["entered"] + 1
        yield
        state["quiet"] = False

    def timer(call, count):
        seen.append(state["quiet"])
        return [5e-6] * count

    measure(MLP(75, 32, 2, 10), data, CPU, latency_calls=3, batches=(64,), clock=stepping_clock(0.1),
            latency_timer=timer, latency_quiet=quiet)
    assert seen == [True] and state == {"quiet": False, "entered": 1}  # CPU: the eager loop only


needs_affinity = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs os.sched_setaffinity (Linux)")


def affinity_seen_by_the_timer(data, **options):
    """measure() with a planted timer that records the CPUs its thread may run on."""
    seen = []

    def timer(call, count):
        seen.append(os.sched_getaffinity(0))
        return [5e-6] * count

    result = measure(MLP(75, 32, 2, 10), data, CPU, latency_calls=3, batches=(64,), clock=stepping_clock(0.1),
                     latency_timer=timer, **options)
    return result, seen


@needs_affinity
def test_pin_holds_the_timing_thread_on_one_cpu_and_gives_its_cpus_back(data):
    before = os.sched_getaffinity(0)
    result, seen = affinity_seen_by_the_timer(data, pin=True)
    cpu = result["latency_pinned_cpu"]
    assert seen == [{cpu}] and cpu in before
    assert os.sched_getaffinity(0) == before
    assert "latency_pinned_cpu" not in result["unavailable"]


@needs_affinity
def test_without_pin_the_thread_runs_free(data):
    before = os.sched_getaffinity(0)
    result, seen = affinity_seen_by_the_timer(data)
    assert seen == [before] and result["latency_pinned_cpu"] is None


@pytest.mark.parametrize("platform", ["no sched_setaffinity", "refused"])
def test_pin_where_the_platform_cannot_pin_runs_free_and_says_so(data, monkeypatch, platform):
    if platform == "no sched_setaffinity":
        monkeypatch.delattr(os, "sched_setaffinity", raising=False)
    else:
        def refuse(pid, cpus):
            raise PermissionError("Operation not permitted")

        monkeypatch.setattr(os, "sched_setaffinity", refuse)
    timed = []
    result = measure(MLP(75, 32, 2, 10), data, CPU, latency_calls=3, batches=(64,), clock=stepping_clock(0.1),
                     latency_timer=lambda call, count: timed.append(count) or [5e-6] * count, pin=True)
    assert timed == [3] and result["latency_pinned_cpu"] is None
    assert result["unavailable"]["latency_pinned_cpu"] == latency.PIN_UNAVAILABLE


@needs_affinity
def test_thread_pinned_gives_the_cpus_back_when_the_timed_work_raises():
    before = os.sched_getaffinity(0)
    with pytest.raises(RuntimeError, match="timed work failed"):
        with latency.thread_pinned() as cpu:
            assert os.sched_getaffinity(0) == {cpu}
            raise RuntimeError("timed work failed")
    assert os.sched_getaffinity(0) == before


def test_measure_through_a_latency_timer(data):
    seen = []

    def timer(call, count):
        seen.append(count)
        call()
        return [5e-6] * count

    result = measure(MLP(75, 32, 2, 10), data, CPU, latency_calls=7, batches=(64,), clock=stepping_clock(0.1),
                     latency_timer=timer)
    assert seen == [7] and result["latency_eager_s"]["p99"] == 5e-6


class HostReadingMLP(MLP):
    """Reads the GPU from the host inside its forward, as torchao's int8 matmul does."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if float(x.abs().sum()) < 0:  # never true: only the read matters
            x = -x
        return super().forward(x)


@pytest.mark.gpu
def test_a_forward_that_reads_the_gpu_is_timed_eagerly_and_capture_still_works_after(data):
    cuda = torch.device("cuda")
    blocked = measure(HostReadingMLP(75, 32, 2, 10), data, cuda, latency_calls=20, batches=(64,))
    assert blocked["latency_mode"] == "eager" and blocked["latency_graph_s"] is None
    assert "reads the GPU from the host" in blocked["unavailable"]["latency_graph_s"]
    assert "throughput eager" in blocked["notes"][-1]
    # No capture was tried, so the process can still capture the next model.
    plain = measure(MLP(75, 32, 2, 10), data, cuda, latency_calls=20, batches=(64,))
    assert plain["latency_mode"] == "graph" and "latency_graph_s" not in plain["unavailable"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"impl": "jax"}, "impl='jax'"), ({"latency_calls": 0}, "latency_calls=0"), ({"batches": (0,)}, "batches")],
)
def test_measure_bad_arguments(data, kwargs, match):
    with pytest.raises(ValueError, match=match):
        measure(MLP(75, 32, 2, 10), data, CPU, **kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tensors through Triton's interpreter; on a GPU "
                    "bench/test_inference.py records the routes")
@pytest.mark.parametrize("fused", [True, False], ids=["one-launch", "layer-by-layer"])
def test_the_triton_impl_records_its_forward_routes(data, monkeypatch, tmp_path, fused):
    """The fused kernel's serving record names each batch size's forward launches: at
    batch 1 the whole forward in one launch, or (switched off) the gemv route planted for
    each layer, on the interpreter; the same accuracy either way."""
    import dataclasses

    from kernels.plan import launch_plan
    from kernels.plan import launches
    from kernels.ops import mlp_forward

    monkeypatch.setenv("LOADBENCH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(mlp_forward, "ENABLED", fused)
    monkeypatch.setattr(mlp_forward, "LAUNCHES", {})
    gemv = launch_plan.LaunchConfig(1, 16, 16, 4, 1, backend="gemv")
    prec, f32 = launch_plan.precision_for(torch.float32), torch.float32
    configs = {
        launch_plan.shape_key("fwd", 1, n, k, f32, prec, cls): dataclasses.asdict(gemv)
        for n, k, cls in ((32, 75, "pointwise"), (32, 32, "pointwise"), (10, 32, "identity"))
    }
    launches.reset_launch_state(mode="off", tables={"cpu": {"key_format": launch_plan.KEY_FORMAT, "configs": configs}})
    try:
        model = MLP(75, 32, 2, 10).eval()
        result = measure(model, data, CPU, impl="triton", latency_calls=3, batches=(64,), clock=stepping_clock(0.1))
    finally:
        launches.reset_launch_state()
    if fused:
        assert result["routes"]["1"] == ["one launch, 3 layers: 1 program, tile 1x32x128"]
    else:
        assert result["routes"]["1"] == [
            "1x10x32: gemv 1x16x16 w4 (table)", "1x32x32: gemv 1x16x16 w4 (table)", "1x32x75: gemv 1x16x16 w4 (table)"
        ]
    assert result["routes"]["64"] and all("gemv" not in line and "one launch" not in line
                                          for line in result["routes"]["64"])
    assert result["accuracy"] == pytest.approx(float((model(data.x_test).argmax(1) == data.y_test).float().mean()))
    assert measure(model, data, CPU, latency_calls=3, batches=(64,), clock=stepping_clock(0.1))["routes"] is None


def test_triton_impl_refuses_quantized_weights(data):
    class Fake(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.network = MLP(75, 32, 2, 10).to(torch.float16)

    with pytest.raises(Unsupported, match="dense fp32 or bf16"):
        serving.prepare(Fake(), "triton", CPU)
    with pytest.raises(Unsupported, match="none inside"):
        serving.prepare(torch.nn.Linear(75, 10), "triton", CPU)


# ---------------------------------------------------------------- the model cache


class CountingTrainer(trained.Trainer):
    fits = 0

    def fit(self, *args, **kwargs):
        type(self).fits += 1
        return super().fit(*args, **kwargs)


@pytest.fixture
def counting(monkeypatch):
    CountingTrainer.fits = 0
    monkeypatch.setattr(trained, "Trainer", CountingTrainer)
    return CountingTrainer


def test_cache_hit_and_misses(tmp_path, data, counting):
    first = trained_model(CONFIG, data, profile="smoke", cache_dir=tmp_path)
    again = trained_model(CONFIG, data, profile="smoke", cache_dir=tmp_path)
    assert counting.fits == 1
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), again.state_dict().values()))
    trained_model(CONFIG.replace(width=16), data, profile="smoke", cache_dir=tmp_path)
    trained_model(CONFIG.replace(seed=7), data, profile="smoke", cache_dir=tmp_path)
    trained_model(CONFIG, data, profile="quick", cache_dir=tmp_path)
    trained_model(CONFIG, load_dataset(scale=0.02, seed=3), profile="smoke", cache_dir=tmp_path)
    assert counting.fits == 5
    assert len(list(tmp_path.glob("*.pt"))) == 5


@pytest.mark.parametrize("damage", ["garbage", "truncate", "foreign"])
def test_corrupt_cache_retrains_with_a_warning(tmp_path, data, counting, damage):
    trained_model(CONFIG, data, profile="smoke", cache_dir=tmp_path)
    (path,) = tmp_path.glob("*.pt")
    if damage == "garbage":
        path.write_bytes(b"not a checkpoint")
    elif damage == "truncate":
        path.write_bytes(path.read_bytes()[:100])
    else:
        torch.save({"key": "another", "state_dict": {}}, path)
    with pytest.warns(UserWarning, match="could not be used"):
        model = trained_model(CONFIG, data, profile="smoke", cache_dir=tmp_path)
    assert counting.fits == 2 and isinstance(model, MLP)
    trained_model(CONFIG, data, profile="smoke", cache_dir=tmp_path)  # rewritten: a hit again
    assert counting.fits == 2


def test_evaluate_states_drop_and_speedup(tmp_path, data, monkeypatch):
    inference.clear_references()
    monkeypatch.setattr(inference, "THROUGHPUT_SECONDS", {"cpu": 0.0, "cuda": 0.0})
    options = {"latency_calls": 5, "batches": (64,)}
    fp32 = evaluate(CONFIG, Compression(), data, CPU, profile="smoke", cache_dir=tmp_path, **options)
    assert fp32["accuracy_drop"] == 0.0 and fp32["speedup"] == 1.0
    assert set(RECORD_KEYS) <= set(fp32), sorted(set(RECORD_KEYS) - set(fp32))  # every declared serving field
    pruned = evaluate(CONFIG, Compression(sparsity=0.9), data, CPU, profile="smoke", cache_dir=tmp_path, **options)
    assert pruned["accuracy_drop"] == pytest.approx(fp32["accuracy"] - pruned["accuracy"])
    assert pruned["speedup"] == pytest.approx(pruned["throughput"]["64"] / fp32["throughput"]["64"])
    assert pruned["compression"]["name"] == "prune-90"
    inference.clear_references()


# ---------------------------------------------------------------- budgets and compare


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "budgets.toml"
    path.write_text(text)
    return path


def test_inference_budgets_resolve_by_variant_and_case(tmp_path):
    budgets = Budgets.load(write(tmp_path, """
[inference.defaults]
accuracy_drop_vs_fp32_max = 0.01
[inference.variants.prune-90]
accuracy_drop_vs_fp32_max = 0.08
[profiles.smoke.inference.variants.prune-90]
accuracy_drop_vs_fp32_max = 0.2
[datasets.synthetic.profiles.quick.inference.cases."units-512"]
latency_p99_us_max = 30
"""))
    assert budgets.resolve_inference("quick", "bf16", "units-512").accuracy_drop_vs_fp32_max == 0.01
    assert budgets.resolve_inference("quick", "prune-90", "units-512").accuracy_drop_vs_fp32_max == 0.08
    assert budgets.resolve_inference("smoke", "prune-90", "units-512").accuracy_drop_vs_fp32_max == 0.2
    assert budgets.resolve_inference("quick", "bf16", "units-512").latency_p99_us_max == 30
    assert budgets.resolve_inference("quick", "bf16", "units-512", "frames.csv").latency_p99_us_max is None


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("[inference.variants.int4]\naccuracy_drop_vs_fp32_max = 0.1\n", "unknown variant 'int4'"),
        ("[inference.defaults]\nlatency_p99_us_max = 30\n", "holds for one dataset"),
        ("[inference.defaults]\nlatency_slowr_pct = 5\n", "did you mean 'latency_slower_pct'"),
        ("[inference.defaults]\naccuracy_drop_vs_fp32_max = 2\n", "between 0 and 1"),
        ("[inference.cases.\"units-3\"]\nlatency_slower_pct = 5\n", "unknown case id"),
        ("[inference.kernels]\nx = 1\n", "unknown table 'kernels'"),
    ],
)
def test_bad_inference_budgets_stop_at_start(tmp_path, text, match):
    with pytest.raises(BudgetError, match=match):
        Budgets.load(write(tmp_path, text))


def test_shipped_budgets_load():
    Budgets.load(Path(__file__).resolve().parents[1] / "bench" / "budgets.toml")


RECORD = {"accuracy": 0.70, "accuracy_drop": 0.02, "latency_p99_s": 40e-6, "latency_mode": "graph",
          "throughput": {"512": 1e6, "4096": 2e6}}


def test_inference_checks_pass_and_fail_with_one_record_each():
    assert check_inference(InferenceBudget(0.05, 50, 1e6), RECORD) == []
    failures = check_inference(InferenceBudget(0.01, 30, 3e6), RECORD)
    assert [f.metric for f in failures] == ["accuracy_drop_vs_fp32", "latency_p99_us", "throughput_4096"]
    assert "40" in failures[1].message and "30" in failures[1].message
    unmeasured = {**RECORD, "latency_p99_s": None, "throughput": {}}
    assert [f.metric for f in check_inference(InferenceBudget(0.01, 30, 3e6), unmeasured)] == ["accuracy_drop_vs_fp32"]


def test_the_p99_ceiling_judges_the_median_round_so_one_stalled_round_does_not_fail():
    """A host stall fills one round's tail (and the p99 of all calls); a slower forward
    moves every round. Without rounds the p99 of all calls is judged."""
    stalled = {**RECORD, "latency_p99_s": 290e-6, "latency_p99_by_round_s": [30e-6, 31e-6, 300e-6, 29e-6, 30e-6]}
    assert check_inference(InferenceBudget(None, 60, None), stalled) == []
    slower = {**stalled, "latency_p99_by_round_s": [70e-6, 72e-6, 300e-6, 69e-6, 71e-6]}
    (failure,) = check_inference(InferenceBudget(None, 60, None), slower)
    assert failure.value == pytest.approx(71.0) and "median of 5 rounds' p99" in failure.message
    assert [f.metric for f in check_inference(InferenceBudget(None, 60, None), {**RECORD, "latency_p99_s": 61e-6})] == [
        "latency_p99_us"
    ]


def latency_record(p99_us: float, spread: float = 0.0) -> dict:
    rounds = [p99_us * 1e-6 * (1 + spread * k) for k in (-2, -1, 0, 1, 2)]
    return {"latency_p99_s": p99_us * 1e-6, "latency_mode": "graph", "latency_p99_by_round_s": rounds}


BUDGET = InferenceBudget(latency_slower_pct=10, latency_noise_k=3, latency_noise_unknown_pct=25, latency_alpha=0.01)


def test_p99_compare_fails_beyond_noise_and_only_then():
    baseline = latency_record(20, 0.005)
    history = [latency_record(20, 0.005), latency_record(20.2, 0.005), baseline]
    (failure,) = check_latency(BUDGET, latency_record(30, 0.005), baseline, history=history)
    assert failure.metric == "latency_p99_ratio" and "Mann-Whitney" in failure.detail
    assert check_latency(BUDGET, latency_record(21, 0.005), baseline, history=history) == []  # within 10%
    # a noisy case (rounds 10% apart): 3 x its spread is above +20%, so that passes
    noisy = latency_record(20, 0.1)
    assert check_latency(BUDGET, latency_record(24, 0.1), noisy, history=[noisy]) == []
    # a graph p99 is never judged against an eager one
    eager = {**latency_record(30, 0.005), "latency_mode": "eager"}
    assert check_latency(BUDGET, eager, baseline, history=history) == []


def test_skip_reasons():
    assert "smoke" in skip_reason("fp32", "compile", CPU, "smoke")
    assert skip_reason("fp32", "torch", CPU, "smoke") is None
    assert "sm_89" in skip_reason("fp8", "torch", CPU, "quick")
    assert "CUDA" in skip_reason("sparse-2:4", "torch", CPU, "smoke")
