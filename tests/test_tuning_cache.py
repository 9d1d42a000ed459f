"""The per-user tuning cache and the policy that fills it (kernels/plan/tuning_cache.py,
kernels/plan/launches.py and kernels/plan/launch_plan.py), on CPU.

Nothing here times anything: tuning is driven by a stand-in `measure` that returns
chosen numbers, so the tests check what is kept, where it comes from and when tuning
may run, never how fast anything is.
"""

from __future__ import annotations

import json
import multiprocessing
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from kernels.plan import launch_plan
from kernels.plan import trials
from kernels.plan import launches
from kernels.ops import linear_act as op
from kernels.plan import tuning_cache
from kernels.plan.launch_plan import LaunchConfig
from kernels.ops.linear_act import linear_act
from kernels.plan.tuning_cache import TuningCache
from kernels.plan.tuning_cache import cache_dir
from kernels.plan.tuning_cache import cache_key
from kernels.plan.tuning_cache import tune_mode_from_env

M, N, K = 40, 24, 32  # one small layer: the interpreter is slow
CONFIG = {"block_r": 16, "block_c": 32, "block_red": 16, "num_warps": 4, "num_stages": 3}


@pytest.fixture(autouse=True)
def _fresh_launches(tmp_path, monkeypatch):
    """Every test starts from an empty cache in its own directory and the default mode,
    and leaves no plans behind for the next module."""
    monkeypatch.setenv("LOADBENCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("LOADBENCH_TUNE", raising=False)
    launches.reset_launch_state()
    yield
    launches.reset_launch_state()


def layer(m=M, n=N, k=K, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g), torch.randn(n, k, generator=g) / k**0.5, torch.randn(n, generator=g)


def train_step(x, w, b, activation="leaky_relu"):
    """Forward and backward through the op (every kernel: fwd, dw, dx)."""
    x, w, b = (t.clone().requires_grad_() for t in (x, w, b))
    y = linear_act(x, w, b, activation)
    y.sum().backward()
    return [y.detach(), x.grad, w.grad, b.grad]


def sources() -> dict[str, str]:
    return {e["kernel"]: e["source"] for e in launches.launch_report()}


class FakeMeasure:
    """Stands in for CUDA-graph timing: 1 ms for the candidates `wins` picks, 2 ms else."""

    def __init__(self, wins=lambda kernel, cfg: False):
        self.wins = wins
        self.calls: list[tuple[str, LaunchConfig]] = []

    def __call__(self, kernel, m, n, k, dtype, cfg, device, activation="leaky_relu", quick=False):
        self.calls.append((kernel, cfg))
        return 1.0 if self.wins(kernel, cfg) else 2.0


def refuse(*args, **kwargs):
    raise AssertionError("nothing should be tuned here")


def key(kernel, rows, cols, red, act_class="pointwise", dtype=torch.float32):
    """The shape class at the current float32 precision."""
    return launch_plan.shape_key(kernel, rows, cols, red, dtype, launch_plan.precision_for(dtype), act_class)


def table(configs: dict) -> dict:
    return {"cpu": {"key_format": launch_plan.KEY_FORMAT, "configs": configs}}


# ------------------------------------------------------------------ the mode


def test_tune_mode_parsing() -> None:
    assert tune_mode_from_env(None) == "cache" and tune_mode_from_env("") == "cache"
    assert [tune_mode_from_env(v) for v in ("off", "cache", "always")] == ["off", "cache", "always"]
    with pytest.raises(ValueError, match="LOADBENCH_TUNE='fast': use one of off, cache, always"):
        tune_mode_from_env("fast")


def test_a_bad_mode_stops_the_first_launch(monkeypatch) -> None:
    monkeypatch.setenv("LOADBENCH_TUNE", "sometimes")
    launches.reset_launch_state()
    with pytest.raises(ValueError, match="LOADBENCH_TUNE='sometimes'"):
        launches.launch_config("fwd", 64, 64, 64, torch.float32)


# ------------------------------------------------------------------ the store


def test_cache_directory_per_platform(tmp_path) -> None:
    home = str(tmp_path)
    assert cache_dir({"LOADBENCH_CACHE_DIR": "/x/y", "HOME": home}, "linux") == Path("/x/y")
    assert cache_dir({"XDG_CACHE_HOME": "/xdg", "HOME": home}, "linux") == Path("/xdg/mlp-loadbench")
    assert cache_dir({"HOME": home}, "linux") == tmp_path / ".cache" / "mlp-loadbench"
    assert cache_dir({"HOME": home}, "darwin") == tmp_path / "Library" / "Caches" / "mlp-loadbench"
    assert cache_dir({"HOME": home, "LOCALAPPDATA": "/appdata"}, "win32") == Path("/appdata/mlp-loadbench")


def test_the_key_holds_gpu_and_versions_and_groups_stay_apart(tmp_path) -> None:
    key = cache_key("NVIDIA H100 80GB HBM3", "3.6.0", "2.11.0+cu130")
    assert key == "NVIDIA H100 80GB HBM3 | triton 3.6.0 | torch 2.11.0+cu130"
    TuningCache(tmp_path, key).put("fwd:float32:64:64:64", {"config": CONFIG})
    newer_torch = cache_key("NVIDIA H100 80GB HBM3", "3.6.0", "2.13.0")
    assert TuningCache(tmp_path, newer_torch).get("fwd:float32:64:64:64") is None  # a new build re-tunes
    TuningCache(tmp_path, newer_torch).put("fwd:float32:64:64:64", {"config": {**CONFIG, "block_r": 32}})
    groups = json.loads((tmp_path / tuning_cache.FILE_NAME).read_text())["groups"]
    assert groups[key]["fwd:float32:64:64:64"]["config"]["block_r"] == 16
    assert groups[newer_torch]["fwd:float32:64:64:64"]["config"]["block_r"] == 32


def test_writes_replace_the_file_whole_and_leave_no_temporary(tmp_path, monkeypatch) -> None:
    cache = TuningCache(tmp_path, "k")
    cache.put("a", {"config": CONFIG})
    before = (tmp_path / tuning_cache.FILE_NAME).read_text()

    def broken_dump(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(tuning_cache.json, "dump", broken_dump)
    with pytest.raises(OSError, match="disk full"):
        cache.put("b", {"config": CONFIG})
    assert (tmp_path / tuning_cache.FILE_NAME).read_text() == before  # the old file, untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == [tuning_cache.FILE_NAME, tuning_cache.FILE_NAME + ".lock"]


def _writer(directory: str, prefix: str, count: int, start) -> None:  # type: ignore[no-untyped-def]
    """A child process: add `count` entries one by one, as a tuning shard would."""
    start.wait()
    cache = TuningCache(directory, "GPU X | triton 3 | torch 2")
    for i in range(count):
        cache.put(f"{prefix}:{i}", {"config": CONFIG, "ms": float(i)})


def test_two_processes_writing_at_once_lose_no_entry(tmp_path) -> None:
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    writers = [ctx.Process(target=_writer, args=(str(tmp_path), prefix, 20, start)) for prefix in ("a", "b")]
    for p in writers:
        p.start()
    start.set()
    for p in writers:
        p.join(120)
        assert p.exitcode == 0
    entries = TuningCache(tmp_path, "GPU X | triton 3 | torch 2").entries()
    assert sorted(entries) == sorted(f"{p}:{i}" for p in "ab" for i in range(20))


@pytest.mark.parametrize("content", ["{not json", "[]", '{"format": 99, "groups": {}}',
                                     '{"format": 1, "groups": {"k": 3}}'])
def test_a_corrupt_cache_file_is_ignored_with_one_warning(tmp_path, content) -> None:
    (tmp_path / tuning_cache.FILE_NAME).write_text(content)
    cache = TuningCache(tmp_path, "k")
    with pytest.warns(UserWarning, match="ignoring it") as caught:
        assert cache.get("a") is None
        cache._read_groups()  # read again: no second warning
    assert len(caught) == 1
    cache.put("a", {"config": CONFIG})  # the next write replaces it with a good file
    assert TuningCache(tmp_path, "k").get("a") == {"config": CONFIG}


# ----------------------------------------------------------------- the policy


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
    store = TuningCache(cache, cache_key("cpu", launches.triton.__version__, torch.__version__))
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
    store = TuningCache(cache, cache_key("cpu", launches.triton.__version__, torch.__version__))
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
    stored = TuningCache(cache, cache_key("cpu", launches.triton.__version__, torch.__version__)).entries()
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
    store = TuningCache(cache, cache_key("cpu", launches.triton.__version__, torch.__version__))
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


def test_tuning_candidates() -> None:
    dw = launch_plan.tuning_candidates("dw", 512, 512, 512, torch.float32, sm_count=132)
    assert dw[0] == launch_plan.heuristic_config(512, 512, 512, torch.float32)  # measured first: the baseline
    assert {c.split_k for c in dw} >= {1, 2, 4} and dw[-1].backend == "cublas"
    assert all(c.split_k * -(-512 // c.block_r) * -(-512 // c.block_c) <= 2 * 132 for c in dw if c.split_k > 1)
    assert all(c.split_k == 1 for c in launch_plan.tuning_candidates("fwd", 512, 512, 512, torch.float32, 132))
    assert all(c.split_k == 1 for c in launch_plan.tuning_candidates("dw", 512, 512, 512, torch.float32, None))
    head = launch_plan.tuning_candidates("fwd", 512, 10, 512, torch.bfloat16, 132)
    assert all(c.block_c <= 32 for c in head if c.backend == "triton")  # no 128-column tiles over 10 columns
    assert len(set(dw)) == len(dw)


def test_gemv_candidates_only_for_a_few_row_forward() -> None:
    one = launch_plan.tuning_candidates("fwd", 1, 512, 512, torch.float32, 132)
    gemv = [c for c in one if c.backend == "gemv"]
    assert gemv and one[-1].backend == "cublas"  # cuBLAS stays last (first-use tuning's seeds keep it there)
    assert all(c.block_r == 1 and c.block_r * c.block_c * c.block_red <= launch_plan.GEMV_MAX_TILE for c in gemv)
    first = launch_plan.tuning_candidates("fwd", 3, 512, 75, torch.float32, 132)
    assert {c.block_r for c in first if c.backend == "gemv"} == {4}
    assert all(c.block_red <= 128 for c in first if c.backend == "gemv")  # no step past the 75-long reduction
    for kernel, rows in (("fwd", 17), ("fwd", 512), ("dw", 1), ("dx", 1)):
        assert all(c.backend != "gemv"
                   for c in launch_plan.tuning_candidates(kernel, rows, 512, 512, torch.float32, 132))


def test_gemv_configs_are_checked() -> None:
    ok = {"block_r": 1, "block_c": 16, "block_red": 128, "num_warps": 4, "num_stages": 1, "backend": "gemv"}
    assert LaunchConfig.from_dict(ok).describe() == "gemv 1x16x128 w4"
    for bad in ({"block_r": 32}, {"block_r": 3}, {"split_k": 2}, {"block_c": 8}):
        with pytest.raises(ValueError):
            LaunchConfig.from_dict({**ok, **bad})
    with pytest.raises(ValueError, match="not for dx"):
        launch_plan.check_route("dx:float32:tf32x3:pointwise:16:512:512", LaunchConfig.from_dict(ok))


def test_experiment_shapes_match_the_suite() -> None:
    """kernels/ may not import bench/: bench_cells keeps its own copy of the axes."""
    from kernels.ground.cases import EXPERIMENTS
    from bench.tools import bench_cells
    from model.config import TrainConfig

    assert tuple(EXPERIMENTS["batch"][1]) == bench_cells.BATCHES
    assert tuple(EXPERIMENTS["units"][1]) == bench_cells.WIDTHS
    assert bench_cells.CENTRE == (TrainConfig.OPTIMAL.batch_size, TrainConfig.OPTIMAL.width)
    assert bench_cells.DEPTH == TrainConfig.OPTIMAL.depth


def test_eager_times_come_from_interleaved_rounds(monkeypatch) -> None:
    """Each round takes every implementation in turn; each gets its median round, and a
    baseline failing part-way is recorded without a time (planted timer, a stand-in GPU)."""
    from bench.tools import bench_cells

    order, planted = [], {"torch": iter([5.0, 1.0, 3.0, 2.0, 4.0]), "triton": iter([9.0, 7.0, 8.0, 6.0, 10.0])}

    def timer(step, device):
        name = step()
        order.append(name)
        if name == "compile" and len(order) > 3:
            raise RuntimeError("recompile limit\nmore")
        return next(planted[name]) if name in planted else 1.0

    monkeypatch.setattr(bench_cells, "eager_ms", timer)
    monkeypatch.setattr(bench_cells, "EAGER_ROUNDS", 5)
    cell = bench_cells.CellResult(512, 512, "relu", "fp32", torch.device("cuda"))
    cell.steps = {name: (lambda n=name: n) for name in ("torch", "compile", "triton")}
    bench_cells._time_eager_interleaved(cell, cell.device)
    assert order[:6] == ["torch", "compile", "triton", "torch", "compile", "triton"]
    assert cell.times_ms == {"torch_eager_ms": 3.0, "compile_eager_ms": None, "triton_eager_ms": 8.0}
    assert cell.errors == {"compile_eager_ms": "RuntimeError: recompile limit"}
    assert order.count("torch") == 5


def test_the_cell_list_measures_each_cell_once_losing_cells_first() -> None:
    from bench.tools import bench_cells

    cells = bench_cells.cell_list(bench_cells.BATCHES, bench_cells.WIDTHS, bench_cells.PRECISIONS,
                                  bench_cells.ACTIVATIONS)
    assert len(cells) == len(set(cells)) == 2 * (4 * 5 + 4)
    assert cells[:3] == bench_cells.PRIORITY[:3]



# -------------------------------------------------- what the key holds (format 2)


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
    stored = TuningCache(cache, cache_key("cpu", launches.triton.__version__, torch.__version__)).entries()
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
    group = cache_key("cpu", launches.triton.__version__, torch.__version__)
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


# ----------------------------------------------------- what tuning costs


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


def test_the_occupancy_rule_drops_only_tiles_that_leave_most_sms_idle() -> None:
    full = launch_plan.tuning_candidates("fwd", 512, 512, 512, torch.float32, 132, prune=False)
    pruned = launch_plan.tuning_candidates("fwd", 512, 512, 512, torch.float32, 132)
    gone = set(full) - set(pruned)
    assert gone and all(-(-512 // c.block_r) * -(-512 // c.block_c) < 33 for c in gone)
    # a small output where no tile fills the GPU: nothing is dropped for occupancy
    small = launch_plan.tuning_candidates("fwd", 64, 128, 128, torch.float32, 132)
    assert small == launch_plan.tuning_candidates("fwd", 64, 128, 128, torch.float32, 132, prune=False)
    # bf16: one reduction step, the one that fits
    assert {c.block_red for c in launch_plan.tuning_candidates("dw", 512, 512, 512, torch.bfloat16, 132)
            if c.backend == "triton"} == {64}
    assert {c.block_red for c in launch_plan.tuning_candidates("dx", 64, 128, 10, torch.bfloat16, 132)[1:-1]} == {32}


def test_every_winner_of_the_committed_table_is_a_candidate_the_rules_keep() -> None:
    """The committed table's winners must be tiles the tuner still tries on the GPUs
    they were measured on (132 SMs each), under the occupancy and reduction-step rules;
    a rule change that would drop one must re-tune the table first."""
    tables = json.loads(launches.TABLE_PATH.read_text())
    checked = 0
    for group in tables.values():
        for name, cfg in group["configs"].items():
            kernel, dtype = name.split(":")[:2]
            m, n, k = group["evidence"][name]["shape"]
            rows, cols, red = {"fwd": (m, n, k), "dw": (n, k, m), "dx": (m, k, n)}[kernel]
            won = LaunchConfig.from_dict(cfg)
            assert won in launch_plan.tuning_candidates(kernel, rows, cols, red, getattr(torch, dtype), 132), name
            checked += 1
    assert checked >= 100, f"the committed table holds {checked} entries"


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


def test_the_dry_run_lists_what_first_use_tuning_of_the_experiments_costs(capsys) -> None:
    from bench.tools import tune
    from kernels.plan import tuning

    assert tune.main(["--dry-run", "--experiments", "--sm-count", "132"]) == 0
    out = capsys.readouterr().out
    assert "8 batch x width pairs" in out and "distinct Triton compilations" in out
    assert "fwd:bfloat16:ieee:silu:512:512:512" in out and "fwd:float32:tf32x3:identity:512:16:512" in out
    from bench.tools.bench_cells import experiment_pairs

    result = tuning.dry_run(tuning.kernel_shapes(experiment_pairs(), [torch.float32, torch.bfloat16]), 132)
    before, now = result["before"], result["now"]
    assert now["candidates"] < 0.8 * before["candidates"] and now["full"] < 0.3 * before["full"]
    assert now["executions"] < 0.4 * before["executions"] and now["compiles"] <= before["compiles"]


# ---------------------------------------------------------- the eager path


def _grads(fn, x, w, b, autocast=False):
    x, w, b = (t.clone().requires_grad_() for t in (x, w, b))
    # fp16: Triton's interpreter does not support bf16 dots (triton-lang/triton#11584)
    with torch.autocast("cpu", torch.float16, enabled=autocast):
        y = fn(x, w, b)
    y.float().pow(2).sum().backward()
    return y, [y.detach(), x.grad, w.grad, b.grad]


@pytest.mark.interpreter
@pytest.mark.parametrize(("activation", "autocast"), [("silu", False), ("tanh", True)])
def test_the_eager_path_skips_the_op_and_gives_the_same_bits(activation, autocast) -> None:
    code = launch_plan.ACTIVATION_CODES[activation]
    x, w, b = layer()
    y, eager = _grads(lambda x, w, b: linear_act(x, w, b, activation), x, w, b, autocast)
    # Under autocast the eager path hands the kernels a 16-bit X and the fp32 W and b; the
    # op given the same tensors runs the same kernels (its registered autocast rule would
    # cast all three, to bf16).
    cast = (lambda t: t.half()) if autocast else (lambda t: t)  # noqa: E731
    z, via_op = _grads(lambda x, w, b: op.linear_act_fwd(cast(x), w, b, code)[0], x, w, b)
    assert type(y.grad_fn).__name__ == "_EagerLinearActBackward" and "loadbench" in type(z.grad_fn).__name__
    assert y.dtype == (torch.float16 if autocast else torch.float32) and eager[2].dtype == torch.float32
    for name, a, c in zip(("y", "dx", "dw", "db"), eager, via_op):
        assert a.dtype == c.dtype and torch.equal(a, c), name


def test_the_eager_path_steps_aside_for_dispatch_modes_and_fake_tensors() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    x, w, b = layer()
    assert op._eager(x, w, b)
    with Passthrough():
        assert not op._eager(x, w, b)
    with FakeTensorMode() as mode:
        assert not op._eager(mode.from_tensor(x), w, b)


@pytest.mark.interpreter
def test_bench_cells_tune_only_reports_the_tuning_phase_and_no_cells(tmp_path, capsys) -> None:
    """The one-time cost alone (--tune-only), here through the interpreter on the CPU."""
    from bench.tools import bench_cells

    out = tmp_path / "cells.json"
    argv = ["--device", "cpu", "--tune-only", "--batches", "64", "--widths", "128", "--precisions", "fp32",
            "--activations", "--cache-dir", str(tmp_path / "cache"), "--json", str(out)]
    assert bench_cells.main(argv) == 0
    result = json.loads(out.read_text())
    # the experiments vary one axis around the centre: batch 64 at width 512, width 128 at batch 512
    assert [(r["batch"], r["width"]) for r in result["tuning"]["rows"]] == [(64, 512), (512, 128)]
    assert "cells" not in result and result["skipped"] == []
    printed = capsys.readouterr().out
    assert "first-use tuning" in printed and "geomean" not in printed


# -------------------------------------------------- eager calls of a cuBLAS winner


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


def launched_kernels(monkeypatch) -> list[str]:
    """The names of the kernels the eager path launches from here on."""
    names: list[str] = []
    real = op._launch_direct

    def spy(fn, grid, *args, **kwargs):
        names.append(getattr(getattr(fn, "fn", fn), "__name__", str(fn)))
        return real(fn, grid, *args, **kwargs)

    monkeypatch.setattr(op, "_launch_direct", spy)
    return names


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


@pytest.mark.interpreter
def test_the_table_keeps_a_cublas_winners_fused_finalist_for_eager_calls(tmp_path, monkeypatch) -> None:
    """bench.tools.tune writes a cuBLAS winner's fastest fused finalist into the table's
    evidence (not the other finalists); a run reading the table takes it eagerly."""
    from kernels.plan.tuning import write_table

    cublas = {**CONFIG, "backend": "cublas"}
    fused = {**CONFIG, "block_c": 16}
    measured = {
        key(kernel, *shape): {"config": cublas, "ms": 0.010, "finalists": [cublas, CONFIG, fused],
                              "finalists_ms": [0.010, 0.012, 0.013]}
        for kernel, *shape in launch_plan.kernel_shapes(M, N, K)
    }
    path = tmp_path / "table.json"
    write_table(str(path), "cpu", measured)
    written = json.loads(path.read_text())
    kept = written["cpu"]["evidence"][key("fwd", M, N, K)]
    assert "finalists" not in kept and "finalists_ms" not in kept
    assert (kept["eager"]["config"]["block_c"] == CONFIG["block_c"]
            and kept["eager"]["gives_up_ms"] == pytest.approx(0.002))
    launches.reset_launch_state(cache_dir=tmp_path / "cache", tables=written, measure=refuse, host_call_ms=0.005)
    names = launched_kernels(monkeypatch)
    train_step(*layer())
    assert sources() == {"fwd": "table", "dw": "table", "dx": "table"}
    assert {e["eager"]["route"] for e in launches.launch_report()} == {"triton"}
    assert ({"_forward_kernel", "_weight_grad_kernel", "_input_grad_kernel"} <= set(names)
            and "_bias_act_kernel" not in names)


def test_a_fused_winner_keeps_no_eager_finalist_in_the_table() -> None:
    from kernels.plan.tuning import evidence

    fused = {**CONFIG, "backend": "triton"}
    entry = {"config": fused, "ms": 0.01, "finalists": [fused, {**CONFIG, "backend": "cublas"}],
             "finalists_ms": [0.01, 0.011]}
    assert "eager" not in evidence(entry) and evidence({"config": fused, "ms": 0.01}) == {"ms": 0.01}
