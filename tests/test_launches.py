"""The policy that picks each kernel's launch (kernels/plan/launches.py), on CPU: where a
tile comes from (the committed table, the cache, first-use tuning, the heuristic), when
tuning may run, what it costs, and the eager calls of a cuBLAS winner.

Nothing here times anything: tuning is driven by a stand-in `measure` that returns
chosen numbers, so the tests check what is kept, where it comes from and when tuning
may run, never how fast anything is."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
import torch

from kernels.ops import linear_act as op
from kernels.ops.linear_act import linear_act
from kernels.plan import launch_plan
from kernels.plan import launches
from kernels.plan import trials
from kernels.plan import tuning_cache
from kernels.plan.launch_plan import LaunchConfig
from kernels.plan.tuning_cache import TuningCache
from kernels.plan.tuning_cache import cache_key
from tests.plans import CONFIG
from tests.plans import K
from tests.plans import M
from tests.plans import N
from tests.plans import key
from tests.plans import launched_kernels
from tests.plans import layer
from tests.plans import refuse
from tests.plans import sources
from tests.plans import train_step

pytestmark = pytest.mark.usefixtures("launches")  # an empty cache of its own, no plans left behind


class FakeMeasure:
    """Stands in for CUDA-graph timing: 1 ms for the candidates `wins` picks, 2 ms else."""

    def __init__(self, wins=lambda kernel, cfg: False):
        self.wins = wins
        self.calls: list[tuple[str, LaunchConfig]] = []

    def __call__(self, kernel, m, n, k, dtype, cfg, device, activation="leaky_relu", quick=False):
        self.calls.append((kernel, cfg))
        return 1.0 if self.wins(kernel, cfg) else 2.0


def table(configs: dict) -> dict:
    return {"cpu": {"key_format": launch_plan.KEY_FORMAT, "configs": configs}}


def test_a_bad_mode_stops_the_first_launch(monkeypatch) -> None:
    monkeypatch.setenv("LOADBENCH_TUNE", "sometimes")
    launches.reset_launch_state()
    with pytest.raises(ValueError, match="LOADBENCH_TUNE='sometimes'"):
        launches.launch_config("fwd", 64, 64, 64, torch.float32)


# ------------------------------------------------------------------ the policy


@pytest.mark.interpreter
def test_on_a_cpu_nothing_is_tuned_and_the_source_is_the_heuristic(tmp_path) -> None:
    train_step(*layer())
    assert sources() == {"fwd": "heuristic", "dw": "heuristic", "dx": "heuristic"}
    assert not (tmp_path / "cache" / tuning_cache.FILE_NAME).exists()


@pytest.mark.interpreter
def test_tuned_on_first_use_stored_and_reused_by_a_later_run(tmp_path, capsys) -> None:
    cache = tmp_path / "cache"
    split = lambda kernel, cfg: kernel == "dw" and cfg.split_k == 2  # noqa: E731
    measure = FakeMeasure(split)
    launches.reset_launch_state(cache_dir=cache, measure=measure, sm_count=132)
    expected = train_step(*layer())
    assert sources() == {"fwd": "tuned", "dw": "tuned", "dx": "tuned"}
    assert [e["route"] for e in launches.launch_report() if e["kernel"] == "dw"] == ["triton split-K 2"]
    assert f"loadbench: tuning {key('dw', N, K, M)}" in capsys.readouterr().err  # the progress line
    tuned = len(measure.calls)
    train_step(*layer())  # the same process: planned once, never tuned again
    assert len(measure.calls) == tuned

    launches.reset_launch_state(cache_dir=cache, measure=refuse, sm_count=132)  # a later run
    got = train_step(*layer())
    assert sources() == {"fwd": "cache", "dw": "cache", "dx": "cache"}
    assert [e["config"]["split_k"] for e in launches.launch_report() if e["kernel"] == "dw"] == [2]
    for g, e in zip(got, expected):
        assert torch.equal(g, e)


@pytest.mark.interpreter
def test_first_use_tuning_runs_candidates_inside_the_op_and_backward(tmp_path) -> None:
    """The real tuning path (time_launch calls the op again, from inside the op's own
    forward and from autograd's backward), a CPU stand-in for the CUDA-graph timer:
    every candidate runs, the nested calls never tune, the results stay right."""
    ran: list[str] = []

    def cpu_timer(fn):
        fn()
        ran.append("x")
        return float(len(ran))  # the first candidate (the heuristic's) wins: nothing timed

    def measure(kernel, m, n, k, dtype, cfg, device, activation="leaky_relu", quick=False):
        return trials.time_launch(kernel, m, n, k, dtype, cfg, device, timer=cpu_timer, activation=activation)

    launches.reset_launch_state(cache_dir=tmp_path / "cache", measure=measure, sm_count=4)
    x, w, b = layer()
    got = train_step(x, w, b, "silu")
    assert sources() == {"fwd": "tuned", "dw": "tuned", "dx": "tuned"} and ran and not trials.FORCED
    assert len(launches._PLANS) == 3  # the nested calls left no plans of their own
    ref = [t.clone().requires_grad_() for t in (x, w, b)]
    y = torch.nn.functional.silu(torch.nn.functional.linear(*ref))
    y.sum().backward()
    for g, e in zip(got, [y.detach()] + [t.grad for t in ref]):
        assert torch.allclose(g, e, atol=1e-4)


@pytest.mark.interpreter
def test_the_committed_table_wins_over_the_cache(tmp_path) -> None:
    cache = tmp_path / "cache"
    table_cfg, cached_cfg = LaunchConfig(16, 16, 16, 4, 3), LaunchConfig(32, 32, 32, 4, 3)
    store = TuningCache(cache, cache_key("cpu", trials.triton.__version__, torch.__version__))
    for kernel, rows, cols, red in (("fwd", M, N, K), ("dw", N, K, M)):
        store.put(key(kernel, rows, cols, red), {"config": asdict(cached_cfg)})
    launches.reset_launch_state(cache_dir=cache, tables=table({key("fwd", M, N, K): asdict(table_cfg)}), measure=refuse)
    train_step(*layer())
    report = {e["kernel"]: e for e in launches.launch_report()}
    assert report["fwd"]["source"] == "table" and report["fwd"]["config"] == asdict(table_cfg)
    assert report["dw"]["source"] == "cache" and report["dw"]["config"] == asdict(cached_cfg)


@pytest.mark.interpreter
def test_off_uses_table_then_heuristic_and_never_reads_the_cache(tmp_path) -> None:
    cache = tmp_path / "cache"
    store = TuningCache(cache, cache_key("cpu", trials.triton.__version__, torch.__version__))
    store.put(key("dw", N, K, M), {"config": CONFIG})
    launches.reset_launch_state(mode="off", cache_dir=cache, tables=table({key("fwd", M, N, K): CONFIG}),
                                measure=refuse)
    train_step(*layer())
    assert sources() == {"fwd": "table", "dw": "heuristic", "dx": "heuristic"}


@pytest.mark.interpreter
def test_always_re_tunes_over_table_and_cache(tmp_path) -> None:
    cache = tmp_path / "cache"
    measure = FakeMeasure(lambda kernel, cfg: cfg.block_r == 32 and cfg.block_c == 32 and cfg.block_red == 32)
    launches.reset_launch_state(mode="always", cache_dir=cache, tables=table({key("fwd", M, N, K): CONFIG}),
                                measure=measure)
    train_step(*layer())
    assert sources() == {"fwd": "tuned", "dw": "tuned", "dx": "tuned"}
    assert all(e["config"]["block_r"] == 32 for e in launches.launch_report())
    stored = TuningCache(cache, cache_key("cpu", trials.triton.__version__, torch.__version__)).entries()
    assert len(stored) == 3 and all(e["config"]["block_red"] == 32 for e in stored.values())


@pytest.mark.interpreter
def test_a_first_call_during_graph_capture_falls_back_then_tunes(tmp_path, monkeypatch) -> None:
    measure = FakeMeasure()
    launches.reset_launch_state(cache_dir=tmp_path / "cache", measure=measure)
    monkeypatch.setattr(launches, "_stream_capturing", lambda device: True)
    x, w, b = layer()
    linear_act(x, w, b, "relu")
    (entry,) = launches.launch_report()
    assert entry["source"] == "heuristic" and "CUDA-graph capture" in entry["note"] and not measure.calls
    monkeypatch.setattr(launches, "_stream_capturing", lambda device: False)
    linear_act(x, w, b, "relu")  # the next eager call tunes
    (entry,) = launches.launch_report()
    assert entry["source"] == "tuned" and measure.calls
    assert entry["fallback"]["source"] == "heuristic"  # what the captured call ran


def test_tracing_never_tunes(tmp_path) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    launches.reset_launch_state(cache_dir=tmp_path / "cache", measure=refuse)
    with FakeTensorMode() as mode:
        # what the op's body asks while torch.compile traces it (through the interpreter
        # the body would go on to run its kernels on the fake tensors, so plan alone)
        x = mode.from_tensor(layer()[0])
        plan = launches.plan_for("fwd", M, N, K, x, "tf32x3", "pointwise")
    # asked again next call
    assert plan.cfg == launch_plan.heuristic_config(M, N, K, torch.float32) and not launches._PLANS
    (entry,) = launches.launch_report()
    assert entry["source"] == "heuristic" and "torch.compile tracing" in entry["note"]


@pytest.mark.interpreter
def test_a_bad_cached_config_is_re_tuned_with_a_warning(tmp_path) -> None:
    cache = tmp_path / "cache"
    store = TuningCache(cache, cache_key("cpu", trials.triton.__version__, torch.__version__))
    store.put(key("fwd", M, N, K, "pointwise"), {"config": {**CONFIG, "block_r": 24}})
    launches.reset_launch_state(cache_dir=cache, measure=FakeMeasure())
    with pytest.warns(UserWarning, match="powers of two"):
        linear_act(*layer(), "relu")
    assert sources() == {"fwd": "tuned"}


@pytest.mark.interpreter
def test_an_unwritable_cache_keeps_the_tile_for_the_process(tmp_path, monkeypatch) -> None:
    def no_space(self, key, entry):
        raise OSError("read-only file system")

    monkeypatch.setattr(TuningCache, "put", no_space)
    launches.reset_launch_state(cache_dir=tmp_path / "cache", measure=FakeMeasure())
    with pytest.warns(UserWarning, match="last this process only"):
        linear_act(*layer(), "relu")
    assert sources() == {"fwd": "tuned"}


@pytest.mark.interpreter
def test_a_candidate_that_fails_is_skipped(tmp_path) -> None:
    def measure(kernel, m, n, k, dtype, cfg, device, activation="leaky_relu", quick=False):
        if cfg.block_r == 64:  # the heuristic's tile among them
            raise RuntimeError("out of shared memory")
        return 1.0 if cfg.block_red == 16 else 2.0

    launches.reset_launch_state(cache_dir=tmp_path / "cache", measure=measure)
    linear_act(*layer(), "relu")
    (entry,) = launches.launch_report()
    assert entry["source"] == "tuned" and entry["config"]["block_red"] == 16 and entry["config"]["block_r"] == 32


# ----------------------------------------------- what the key holds (format 2)


@pytest.mark.interpreter
def test_a_tile_tuned_in_one_strict_fp32_mode_is_not_reused_in_the_other(tmp_path, monkeypatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setattr(launch_plan, "STRICT_FP32", "ieee")
    launches.reset_launch_state(cache_dir=cache, measure=FakeMeasure())
    linear_act(*layer(), "relu")
    monkeypatch.setattr(launch_plan, "STRICT_FP32", "tf32x3")
    measure = FakeMeasure()
    launches.reset_launch_state(cache_dir=cache, measure=measure)
    linear_act(*layer(), "relu")
    (entry,) = launches.launch_report()
    assert entry["source"] == "tuned" and entry["precision"] == "tf32x3" and measure.calls
    stored = TuningCache(cache, cache_key("cpu", trials.triton.__version__, torch.__version__)).entries()
    assert {e["precision"] for e in stored.values()} == {"ieee", "tf32x3"}


@pytest.mark.interpreter
def test_silu_is_tuned_apart_from_its_finalists_and_relu_shares_leaky_relus_class(tmp_path) -> None:
    measure = FakeMeasure()
    launches.reset_launch_state(cache_dir=tmp_path / "cache", measure=measure)
    x, w, b = layer()
    linear_act(x, w, b, "leaky_relu")
    pointwise = len(measure.calls)
    linear_act(x, w, b, "relu")  # the same class: no tuning
    assert len(measure.calls) == pointwise
    linear_act(x, w, b, "silu")
    silu = [cfg for _, cfg in measure.calls[pointwise:]]
    assert silu and len(set(silu)) <= launches.FINALISTS + 2  # heuristic, the finalists, cuBLAS
    report = {e["activation"]: e for e in launches.launch_report()}
    assert report["silu"]["source"] == "tuned" and report["silu"]["key"].count(":silu:") == 1
    stored = launches._state().cache("cpu").get(report["silu"]["key"])
    assert stored["seeded_from"] == "pointwise" and stored["timed_with"] == "silu"


@pytest.mark.interpreter
def test_an_old_cache_file_is_read_and_its_entries_not_reused(tmp_path) -> None:
    """Format-1 entries (keyed without precision and activation class) stay in the file,
    are never matched, and the shape is tuned anew beside them: no crash, no warning."""
    cache = tmp_path / "cache"
    cache.mkdir()
    group = cache_key("cpu", trials.triton.__version__, torch.__version__)
    old = {"fwd:float32:64:32:32": {"config": CONFIG, "ms": 0.01}}
    (cache / tuning_cache.FILE_NAME).write_text(json.dumps({"format": 1, "groups": {group: old}}))
    launches.reset_launch_state(cache_dir=cache, measure=FakeMeasure())
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        linear_act(*layer(), "relu")
    assert sources() == {"fwd": "tuned"}
    stored = TuningCache(cache, group).entries()
    assert "fwd:float32:64:32:32" in stored and key("fwd", M, N, K) in stored


@pytest.mark.interpreter
def test_a_table_keyed_in_the_old_format_is_not_used_and_says_so(tmp_path) -> None:
    legacy = {"cpu": {"configs": {"fwd:float32:64:32": CONFIG}, "evidence": {}}}
    launches.reset_launch_state(mode="off", cache_dir=tmp_path / "cache", tables=legacy)
    with pytest.warns(UserWarning, match="key format 1, not 2"):
        linear_act(*layer(), "relu")
    assert sources() == {"fwd": "heuristic"}


# ----------------------------------------------------------- what tuning costs


@pytest.mark.interpreter
def test_successive_halving_decides_on_the_full_timing(tmp_path) -> None:
    """Every candidate timed quickly, the FINALISTS fastest and the heuristic's tile
    fully; the winner is the fastest in the full timing, not the quick one."""
    cands = launch_plan.tuning_candidates("fwd", 64, 64, 32, torch.float32, None)  # the forward of a 64 x 64 x 32 layer
    quick_best, full_best = cands[3], cands[4]
    calls: list[tuple[LaunchConfig, bool]] = []

    def measure(kernel, m, n, k, dtype, cfg, device, activation="leaky_relu", quick=False):
        calls.append((cfg, quick))
        order = {quick_best: 1.0, full_best: 1.1} if quick else {quick_best: 1.2, full_best: 0.9}
        return order.get(cfg, 5.0 + len(cands) - cands.index(cfg))  # the heuristic's tile slowest

    launches.reset_launch_state(cache_dir=tmp_path / "cache", measure=measure)
    linear_act(*layer(m=64, n=64, k=32), "relu")
    assert [c for c, q in calls if q] == cands
    full = [c for c, q in calls if not q]
    assert len(full) == launches.FINALISTS + 1 and cands[0] in full and {quick_best, full_best} <= set(full)
    (entry,) = launches.launch_report()
    assert LaunchConfig.from_dict(entry["config"]) == full_best
    assert launches.tuning_counts()["quick"] == len(cands) and launches.tuning_counts()["full"] == len(full)


@pytest.mark.interpreter
def test_shapes_of_one_class_are_tuned_once_even_when_always(tmp_path) -> None:
    measure = FakeMeasure()
    launches.reset_launch_state(mode="always", cache_dir=tmp_path / "cache", measure=measure)
    x, w, b = layer(m=40)
    linear_act(x, w, b, "relu")
    tuned = len(measure.calls)
    linear_act(*layer(m=36), "relu")  # 36 and 40 both round up to 64 rows
    assert len(measure.calls) == tuned
    assert [e["source"] for e in launches.launch_report()] == ["tuned", "tuned"]


def test_precompile_runs_the_launch_path_with_warmup_for_every_candidate(monkeypatch) -> None:
    """Compiling ahead: each candidate's kernels are handed to Triton's warmup (no
    launch) inside AsyncCompileMode; a CPU stand-in for both records what was asked."""
    entered: list[object] = []

    class FakeMode:
        def __init__(self, executor, ignore_errors=False):
            self.executor = executor

        def __enter__(self):
            entered.append(self.executor)

        def __exit__(self, *exc):
            return False

    warmed: list[tuple[str, dict]] = []
    monkeypatch.setattr(trials.triton, "AsyncCompileMode", FakeMode, raising=False)
    monkeypatch.setattr(trials, "_launch_warmup", lambda fn, grid, *a, **kw: warmed.append((fn.__name__, kw)))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cfgs = launch_plan.tuning_candidates("dw", N, K, M, torch.float32, 4)
    assert trials.precompile("dw", M, N, K, torch.float32, cfgs, torch.device("cpu")) == len(cfgs)
    assert len(entered) == 1
    tiles = {(kw["BLOCK_N"], kw["BLOCK_K"], kw["BLOCK_M"]) for name, kw in warmed if name == "_weight_grad_kernel"}
    assert tiles == {(c.block_r, c.block_c, c.block_red) for c in cfgs if c.backend == "triton"}
    assert not trials.FORCED and not launches._PLANS


@pytest.mark.interpreter
def test_precompile_does_nothing_under_the_interpreter() -> None:
    cfgs = launch_plan.tuning_candidates("fwd", M, N, K, torch.float32, None)
    assert trials.precompile("fwd", M, N, K, torch.float32, cfgs, torch.device("cpu")) == 0


# ---------------------------------------------- eager calls of a cuBLAS winner


def cublas_first(gap_ms: float):
    """Timing where the cuBLAS route wins every kernel, the heuristic's fused tile is
    `gap_ms` slower, everything else far slower."""

    def measure(kernel, m, n, k, dtype, cfg, device, activation="leaky_relu", quick=False):
        if cfg.backend == "cublas":
            return 1.0
        return (1.0 + gap_ms if cfg == launch_plan.heuristic_config(*_output_and_reduction(kernel, m, n, k), dtype)
                else 5.0)

    return measure


def _output_and_reduction(kernel, m, n, k):
    """(rows, cols, reduction) of `kernel` for layer (M, N, K)."""
    return {kn: shape for kn, *shape in launch_plan.kernel_shapes(m, n, k)}[kernel]


@pytest.mark.interpreter
def test_a_cublas_winner_keeps_its_fused_finalist_for_uncaptured_calls(tmp_path, monkeypatch) -> None:
    """Eagerly the host bounds the step: a kernel that tuning sent to cuBLAS runs its
    fastest fused finalist where that gives up less GPU time than a torch call costs
    the host; the report says so, the results stay right, a later run reads it back."""
    cache = tmp_path / "cache"
    launches.reset_launch_state(cache_dir=cache, measure=cublas_first(0.004), sm_count=132, host_call_ms=0.01)
    names = launched_kernels(monkeypatch)
    x, w, b = layer()
    got = train_step(x, w, b)
    assert {"_forward_kernel", "_weight_grad_kernel", "_input_grad_kernel"} <= set(names)
    assert not {"_bias_act_kernel", "_act_grad_kernel"} & set(names)  # the cuBLAS route's kernels
    report = {e["kernel"]: e for e in launches.launch_report()}
    assert {k: e["route"] for k, e in report.items()} == {k: "cublas+epilogue" for k in ("fwd", "dw", "dx")}
    assert {k: e["eager"]["route"] for k, e in report.items()} == {k: "triton" for k in ("fwd", "dw", "dx")}
    assert {(e["eager"]["gives_up_us"], e["eager"]["host_call_us"]) for e in report.values()} == {(4.0, 10.0)}
    ref = [t.clone().requires_grad_() for t in (x, w, b)]
    y = torch.nn.functional.leaky_relu(torch.nn.functional.linear(*ref), 0.01)
    y.sum().backward()
    for g, e in zip(got, [y.detach()] + [t.grad for t in ref]):
        torch.testing.assert_close(g, e, atol=1e-4, rtol=1e-4)

    launches.reset_launch_state(cache_dir=cache, measure=refuse, sm_count=132, host_call_ms=0.01)  # a later run
    names.clear()
    train_step(x, w, b)
    assert sources() == {"fwd": "cache", "dw": "cache", "dx": "cache"}
    assert all("eager" in e for e in launches.launch_report()) and "_bias_act_kernel" not in names


@pytest.mark.interpreter
def test_the_op_path_keeps_the_tuned_winner(tmp_path, monkeypatch) -> None:
    """What torch.compile traces and CUDA graphs capture runs the GPU-time winner."""
    launches.reset_launch_state(cache_dir=tmp_path / "cache", measure=cublas_first(0.004), sm_count=132,
                                host_call_ms=0.01)
    train_step(*layer())  # tunes
    names: list[str] = []
    real = op._launch_traceable
    monkeypatch.setattr(op, "_launch_traceable",
                        lambda fn, grid, *a, **k: (names.append(fn.fn.__name__), real(fn, grid, *a, **k)))
    x, w, b = layer()
    y, _ = torch.ops.loadbench.linear_act_fwd(x, w, b, launch_plan.ACTIVATION_CODES["leaky_relu"])
    torch.ops.loadbench.linear_act_bwd(torch.ones_like(y), y, x, w, launch_plan.ACTIVATION_CODES["leaky_relu"], True)
    assert names == ["_bias_act_kernel", "_act_grad_kernel"]


@pytest.mark.interpreter
@pytest.mark.parametrize("gap_ms, host_ms", [(0.02, 0.01), (0.004, 0.0)], ids=["gap-above-a-host-call", "no-host-cost"])
def test_no_fused_finalist_where_it_gives_up_more_than_a_host_call(tmp_path, monkeypatch, gap_ms, host_ms) -> None:
    launches.reset_launch_state(cache_dir=tmp_path / "cache", measure=cublas_first(gap_ms), sm_count=132,
                                host_call_ms=host_ms)
    names = launched_kernels(monkeypatch)
    train_step(*layer())
    assert {"_bias_act_kernel", "_act_grad_kernel"} <= set(names)
    assert not any("eager" in e for e in launches.launch_report())


def test_fused_second_reads_only_a_cublas_winner() -> None:
    fused, cublas = LaunchConfig(16, 32, 16, 4, 3), LaunchConfig(16, 32, 16, 4, 3, backend="cublas")
    assert launches.fused_second([cublas, fused], [1.0, 1.5]) == (fused, 0.5)
    assert launches.fused_second([fused, cublas], [1.0, 1.5]) is None  # the fused kernel won
    assert launches.fused_second([cublas], [1.0]) is None  # no fused finalist
    assert launches.fused_second([cublas, fused], [1.0]) is None  # an entry without every time
