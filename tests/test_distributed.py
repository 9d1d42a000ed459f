"""Data parallelism with 2 processes (gloo on the CPU; NCCL on 2 GPUs where marked gpu),
shard selection and merging.

Both data-parallel loops must train exactly as one process does at the same global
batch: DistributedDataParallel (loop 'fast') and the flat all-reduce (loop 'graph':
replayed from CUDA graphs on NCCL, eager on gloo and with LOADBENCH_DP_GRAPH=0). On a
CPU the flat loop's optimizer and loss kernels run through Triton's interpreter: the
models here stay tiny.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from bench.gate.record import RECORD_KEY
from bench.tools.merge import MergeError
from bench.tools.merge import merge_runs
from bench.tools.report import build_report
from kernels.ops.optim import FlatOptimizer
from model import distributed
from model.config import TrainConfig
from model.data import load_dataset
from model.distributed import DistributedError
from model.distributed import finished_within
from model.distributed import launch
from model.dp_graph import BUCKET_ENV
from model.dp_graph import DEFAULT_BUCKET_MB
from model.dp_graph import GRAPH_ENV
from model.dp_graph import GradientBuckets
from model.dp_graph import bucket_cap_bytes
from model.dp_graph import plan_buckets
from model.dp_graph import resolve_loop
from model.mlp import MLP
from model.train import Trainer

pytestmark = pytest.mark.distributed
SCALE = 0.02
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
gpu = pytest.mark.gpu
needs_two_gpus = pytest.mark.skipif(GPUS < 2, reason="needs 2 CUDA GPUs")


def single_process_weights(config: TrainConfig, device: str = "cpu") -> dict[str, torch.Tensor]:
    trainer = Trainer(config, load_dataset("synthetic", scale=SCALE, device=device))
    trainer.fit()
    return {name: value.cpu() for name, value in trainer.model.state_dict().items()}


def ddp_weights(config: TrainConfig, tmp_path: Path) -> dict[str, torch.Tensor]:
    return trained(config, tmp_path)[1]


def trained(config: TrainConfig, tmp_path: Path, backend: str = "gloo") -> tuple[dict, dict[str, torch.Tensor]]:
    """Rank 0's record and final weights of a 2-rank run."""
    path = tmp_path / "weights.pt"
    record = launch(config, 2, scale=SCALE, backend=backend, timeout_s=300, weights_out=str(path), workdir=tmp_path)
    return record, torch.load(path)


def batch_leaving_one_frame() -> int:
    """A batch size whose last batch is one frame: on 2 ranks, one share is empty."""
    n = len(load_dataset("synthetic", scale=SCALE).y_train)
    return next(b for b in range(60, n) if n % b == 1)


def assert_same_weights(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor], atol: float) -> None:
    assert ours.keys() == theirs.keys()
    for name in theirs:
        difference = (ours[name] - theirs[name]).abs().max().item()
        assert difference <= atol, f"{name}: differs by {difference:.3g}"


def test_one_global_step_has_the_single_process_gradient(tmp_path) -> None:
    # One SGD step over the whole training set: w1 = w0 - lr * grad, so equal weights mean equal gradients.
    n = len(load_dataset("synthetic", scale=SCALE).y_train)
    config = TrainConfig(width=32, depth=2, epochs=1, batch_size=n, optimizer="sgd")
    ours, theirs = ddp_weights(config, tmp_path), single_process_weights(config)
    for name in theirs:
        assert torch.allclose(ours[name], theirs[name], atol=1e-6), name


def test_the_record_gives_the_training_window_on_the_launchers_clock(tmp_path) -> None:
    before = time.perf_counter()
    record = launch(TrainConfig(width=16, depth=1, epochs=2), 2, scale=SCALE, backend="gloo", timeout_s=180,
                    workdir=tmp_path)
    after = time.perf_counter()
    begin, end = record["train_window"]
    assert before < begin < end < after
    assert end - begin >= sum(record["epoch_seconds"])


def test_final_weights_match_single_process_training(tmp_path) -> None:
    config = TrainConfig(width=32, depth=2, epochs=2, batch_size=100)  # uneven last batch included
    ours, theirs = ddp_weights(config, tmp_path), single_process_weights(config)
    for name in theirs:
        assert torch.allclose(ours[name], theirs[name], atol=1e-5), name


def test_ddp_records_say_which_loop_ran(tmp_path) -> None:
    record = launch(TrainConfig(width=16, depth=1, epochs=1), 2, scale=SCALE, backend="gloo", timeout_s=180,
                    workdir=tmp_path)
    assert (record["data_parallel"], record["loop"]) == ("ddp", "fast")
    profile = record["allreduce_profile"]
    assert profile["allreduce_calls"] > 0 and profile["steps"] > 0
    # gloo's all-reduce spans overlap the backward pass and each other: a share, not a fraction of 1
    assert record["allreduce_share"] > 0


# ------------------------------------------------------- flat all-reduce loop


@pytest.mark.interpreter
@pytest.mark.parametrize(("bucket_mb", "buckets"), [("", 1), ("0", 1), ("0.001", 2)], ids=["default", "one", "two"])
def test_flat_allreduce_loop_trains_like_one_process(tmp_path, monkeypatch, bucket_mb, buckets) -> None:
    # The flat gradient all-reduced in buckets and the flat optimizer's kernel, eager on
    # gloo; against one process with the same optimizer and loss kernels. The last batch
    # is one frame, so rank 1's share of it is empty and it all-reduces zeros, bucket by
    # bucket as rank 0's backward pass launches them.
    monkeypatch.setenv(BUCKET_ENV, bucket_mb)
    config = TrainConfig(width=16, depth=2, epochs=2, batch_size=batch_leaving_one_frame(), optimizer_impl="triton")
    record, ours = trained(config.replace(loop="graph"), tmp_path)
    assert (record["data_parallel"], record["loop"]) == ("flat-allreduce", "fast")  # no graph on gloo
    assert record["note"] == "'graph' requested, runs eagerly on gloo: CUDA graphs need NCCL on GPUs"
    assert record["optimizer_impl"] == "triton-flat+capturable"
    assert len(record["allreduce_buckets"]) == buckets
    assert_same_weights(ours, single_process_weights(config), atol=1e-5)


# ------------------------------------------------------- gradient buckets


def flat_mlp(width: int = 16, depth: int = 2) -> tuple[MLP, FlatOptimizer]:
    torch.manual_seed(0)
    model = MLP(75, width, depth, 7, "relu", "torch")
    return model, FlatOptimizer(list(model.parameters()), "sgd", lr=0.1)


class RecordedAllReduce:
    """Stands in for dist.all_reduce: notes each launch's span, whether the backward
    pass was over by then and what the span held, and hands back a work to wait on."""

    def __init__(self, grad: torch.Tensor) -> None:
        self.grad, self.launches, self.waited = grad, [], 0
        self.backward_done = False

    def __call__(self, tensor: torch.Tensor, async_op: bool = False):
        assert async_op, "bucket all-reduces must not block the backward pass"
        start = (tensor.data_ptr() - self.grad.data_ptr()) // tensor.element_size()
        self.launches.append((start, start + tensor.numel(), self.backward_done, tensor.clone()))
        return self

    def wait(self) -> None:
        self.waited += 1


def test_buckets_close_from_the_last_layer_back_at_the_size_asked() -> None:
    _, optimizer = flat_mlp(width=16, depth=2)  # layers 75->16, 16->16, 16->7
    spans = optimizer.spans()
    sizes = [4 * (stop - start) for _, start, stop in spans]  # w0 b0 w1 b1 w2 b2
    assert sizes == [4800, 64, 1024, 64, 448, 28]
    per_layer = plan_buckets(spans, cap_bytes=1000)
    assert [members for _, _, members in per_layer] == [[5, 4, 3, 2], [1, 0]]
    assert [members for _, _, members in plan_buckets(spans, cap_bytes=1)] == [[i] for i in reversed(range(6))]
    whole = plan_buckets(spans, cap_bytes=0)
    assert whole == [(spans[0][1], spans[-1][2], list(range(6)))]
    for start, stop, members in per_layer:  # each bucket is the span of exactly its parameters
        assert (start, stop) == (spans[members[-1]][1], spans[members[0]][2])


def test_each_bucket_is_all_reduced_during_backward_once_its_gradients_are_final(monkeypatch) -> None:
    model, optimizer = flat_mlp()
    grad = optimizer.flat.grad
    buckets = GradientBuckets(grad, optimizer.spans(), cap_bytes=1)  # one bucket per parameter
    recorder = RecordedAllReduce(grad)
    monkeypatch.setattr("model.dp_graph.dist.all_reduce", recorder)
    optimizer.zero_grad()
    buckets.begin()
    model(torch.randn(32, 75)).logsumexp(1).mean().backward()
    recorder.backward_done = True
    buckets.finish()
    assert [(start, stop) for start, stop, *_ in recorder.launches] == [(b[0], b[1]) for b in buckets.buckets]
    assert recorder.waited == len(buckets.buckets) == 6
    # Launched from the backward pass, not after it, and only once the span was final.
    assert not any(done for _, _, done, _ in recorder.launches)
    for start, stop, _, held in recorder.launches:
        assert torch.equal(held, grad[start:stop])
        assert held.abs().sum() > 0


def test_one_bucket_or_no_backward_pass_launches_everything_in_finish(monkeypatch) -> None:
    model, optimizer = flat_mlp()
    grad = optimizer.flat.grad
    recorder = RecordedAllReduce(grad)
    monkeypatch.setattr("model.dp_graph.dist.all_reduce", recorder)
    whole = GradientBuckets(grad, optimizer.spans(), cap_bytes=0)
    whole.begin()
    model(torch.randn(8, 75)).sum().backward()
    assert recorder.launches == []  # no hook: one all-reduce after the backward pass
    whole.finish()
    assert [(start, stop) for start, stop, *_ in recorder.launches] == [(whole.buckets[0][0], whole.buckets[0][1])]
    # A rank whose share is empty runs no backward pass and still launches every bucket, in order.
    recorder.launches.clear()
    per_layer = GradientBuckets(grad, optimizer.spans(), cap_bytes=1000)
    per_layer.begin()
    per_layer.finish()
    assert [(start, stop) for start, stop, *_ in recorder.launches] == [(b[0], b[1]) for b in per_layer.buckets]
    assert per_layer.sizes == [4 * (b[1] - b[0]) for b in per_layer.buckets]


@pytest.mark.parametrize(("value", "cap"), [("", 2**20), (" 2 ", 2 * 2**20), ("0", 0), ("0.5", 2**19)])
def test_the_bucket_size_comes_from_the_environment_in_mib(value, cap) -> None:
    assert bucket_cap_bytes({BUCKET_ENV: value}) == cap
    assert bucket_cap_bytes({}) == int(DEFAULT_BUCKET_MB * 2**20)


@pytest.mark.parametrize("value", ["-1", "1MB", "nan", "inf"])
def test_a_bad_bucket_size_is_one_clear_error(value) -> None:
    with pytest.raises(ValueError, match=f"{BUCKET_ENV}='{value}': a bucket size in MiB, 0 or more"):
        bucket_cap_bytes({BUCKET_ENV: value})


@pytest.mark.interpreter
def test_flat_allreduce_loop_with_torchs_loss_matches_one_process(tmp_path) -> None:
    # optimizer_impl 'torch' keeps F.cross_entropy; the flat optimizer runs either way.
    config = TrainConfig(width=16, depth=1, epochs=1, batch_size=100, optimizer="sgd")
    _, ours = trained(config.replace(loop="graph"), tmp_path)
    assert_same_weights(ours, single_process_weights(config), atol=1e-6)


def test_flat_allreduce_loop_refuses_compile_with_one_clear_error(tmp_path) -> None:
    with pytest.raises(DistributedError, match="impl 'compile' is not supported"):
        launch(TrainConfig(epochs=1, width=16, loop="graph", impl="compile"), 2, scale=SCALE, backend="gloo",
               timeout_s=120, workdir=tmp_path)


# ------------------------------------------------- which loop a request runs


@pytest.mark.parametrize(
    ("loop", "backend", "env", "runs", "note"),
    [
        ("graph", "nccl", {}, "graph", None),
        ("step-graph", "nccl", {}, "step-graph", None),
        ("graph", "nccl", {GRAPH_ENV: ""}, "graph", None),
        ("graph", "nccl", {GRAPH_ENV: "1"}, "graph", None),
        ("step-graph", "nccl", {GRAPH_ENV: " True "}, "step-graph", None),
        ("graph", "nccl", {GRAPH_ENV: "0"}, "fast", f"'graph' requested, runs eagerly on NCCL: {GRAPH_ENV}=0"),
        ("step-graph", "nccl", {GRAPH_ENV: "off"}, "fast", "'step-graph' requested, runs eagerly on NCCL"),
        ("graph", "gloo", {}, "fast", "'graph' requested, runs eagerly on gloo"),
        ("graph", "gloo", {GRAPH_ENV: "1"}, "fast", "'graph' requested, runs eagerly on gloo"),  # no graphs on a CPU
    ],
)
def test_nccl_replays_graphs_unless_the_environment_says_0(loop, backend, env, runs, note) -> None:
    ran, why = resolve_loop(loop, backend, env)
    assert ran == runs
    if note is None:
        assert why is None
    else:
        assert why.startswith(note)


@pytest.mark.parametrize("value", ["graph", "2", "eager"])
def test_an_unknown_graph_setting_is_one_clear_error(value) -> None:
    with pytest.raises(ValueError, match=f"{GRAPH_ENV}='{value}': use 1 .* or 0"):
        resolve_loop("graph", "nccl", {GRAPH_ENV: value})


def test_resolving_a_loop_that_is_no_graph_loop_is_an_error() -> None:
    with pytest.raises(ValueError, match="'fast' is not a graph loop"):
        resolve_loop("fast", "nccl", {})


def test_resolving_reads_the_process_environment_by_default(monkeypatch) -> None:
    monkeypatch.setenv(GRAPH_ENV, "0")
    assert resolve_loop("graph", "nccl")[0] == "fast"
    monkeypatch.delenv(GRAPH_ENV)
    assert resolve_loop("graph", "nccl") == ("graph", None)


def test_a_bounded_teardown_says_whether_it_returned() -> None:
    # No timing involved: one call returns at once, the other never does.
    never = threading.Event()
    assert finished_within(lambda: None, timeout_s=60)
    assert not finished_within(never.wait, timeout_s=0.05)
    with pytest.raises(KeyError, match="raised in the teardown"):
        finished_within(lambda: {}["raised in the teardown"], timeout_s=60)


def test_a_timed_out_run_reports_what_the_ranks_left(tmp_path, monkeypatch) -> None:
    # Ranks stand in for ones hung in their teardown: one wrote its error, and their output
    # holds a stack (what LOADBENCH_DUMP_STACKS_S prints). Both reach the caller.
    real_popen = subprocess.Popen

    def hanging_ranks(command, **kwargs):
        out = command[command.index("--out") + 1]
        Path(f"{out}.rank1.err").write_text("RuntimeError: rank 1 gave up")
        script = ("echo 'Thread 0x1 (most recent call first):'; echo '  File \"x.py\", line 9 in release'; "
                  "exec sleep 600")
        return real_popen(["sh", "-c", script], **kwargs)

    monkeypatch.setattr(distributed.subprocess, "Popen", hanging_ranks)
    # The stand-ins print at once and then only sleep: a few seconds are enough to time out on.
    with pytest.raises(DistributedError, match="timed out after 5 s; all ranks stopped") as error:
        launch(TrainConfig(epochs=1), 2, backend="gloo", timeout_s=5, workdir=tmp_path)
    message = str(error.value)
    assert "rank1: RuntimeError: rank 1 gave up" in message
    assert "(most recent call first)" in message and "line 9 in release" in message
    assert not list(tmp_path.glob("ddp-*"))  # the error file is gone too


@gpu
@needs_two_gpus
def test_nccl_graph_request_runs_the_flat_loop_eagerly_when_told(tmp_path, monkeypatch) -> None:
    # The same flat step, all-reduced by NCCL eagerly, against the single-GPU graph loop.
    monkeypatch.setenv(GRAPH_ENV, "0")  # the launcher hands its environment to the ranks
    config = TrainConfig(width=64, depth=2, epochs=2, batch_size=batch_leaving_one_frame(), optimizer="sgd",
                         optimizer_impl="triton", loop="graph")
    record, ours = trained(config, tmp_path, backend="nccl")
    assert (record["data_parallel"], record["loop"]) == ("flat-allreduce", "fast")
    assert "runs eagerly on NCCL" in record["note"]
    assert record["allreduce_profile"]["allreduce_calls"] >= record["allreduce_profile"]["steps"]
    assert_same_weights(ours, single_process_weights(config, device="cuda"), atol=1e-5)


@gpu
@needs_two_gpus
@pytest.mark.parametrize("bucket_mb", ["0", "0.01"], ids=["one-bucket", "buckets"])
@pytest.mark.parametrize(("optimizer", "atol"), [("sgd", 1e-5), ("adam", 1e-4)])
def test_nccl_graph_loop_trains_like_one_gpu(tmp_path, monkeypatch, optimizer, atol, bucket_mb) -> None:
    # Replayed from one CUDA graph per epoch with the all-reduces captured, against the
    # single-GPU graph loop. Splitting a batch over GPUs changes the order of the sums
    # (cuBLAS per share, then NCCL), so the weights agree to rounding, not bitwise;
    # Adam's first steps move each weight by about lr whatever the gradient's size, so a
    # rounding-level gradient near zero can differ by that much: a looser tolerance.
    monkeypatch.delenv(GRAPH_ENV, raising=False)  # the default: graphs
    monkeypatch.setenv(BUCKET_ENV, bucket_mb)  # "0.01": the bucket all-reduces launched from autograd, captured
    config = TrainConfig(width=64, depth=2, epochs=3, batch_size=batch_leaving_one_frame(), optimizer=optimizer,
                         optimizer_impl="triton", loop="graph")
    record, ours = trained(config, tmp_path, backend="nccl")
    assert (record["data_parallel"], record["loop"], record["note"]) == ("flat-allreduce", "graph", None)
    assert len(record["allreduce_buckets"]) == (1 if bucket_mb == "0" else 2)
    profile = record["allreduce_profile"]
    # The profiler must see the captured NCCL kernels, or the share is not measured.
    assert profile["allreduce_calls"] >= profile["steps"], profile
    assert 0 < record["allreduce_share"] < 1
    assert_same_weights(ours, single_process_weights(config, device="cuda"), atol=atol)


@gpu
@needs_two_gpus
def test_a_hanging_nccl_graph_run_leaves_nothing_on_the_gpus(tmp_path) -> None:
    # A run far longer than its timeout (replayed from graphs unless LOADBENCH_DP_GRAPH=0;
    # captured collectives are out of the NCCL watchdog's reach): the
    # launcher's timeout must still stop every rank, and the driver then frees their GPUs.
    pattern = f"model.distributed.*{tmp_path.name}"
    seen: set[str] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.5):
            seen.update(_pids(pattern))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        with pytest.raises(DistributedError, match="timed out after 40 s; all ranks stopped"):
            launch(TrainConfig(epochs=10**6, width=64, loop="graph"), 2, scale=SCALE, backend="nccl", timeout_s=40,
                   workdir=tmp_path)
    finally:
        done.set()
        watcher.join()
    time.sleep(1)
    assert len(seen) >= 3, "torchrun and its two ranks were never seen"
    assert _count(pattern) == 0
    # The driver frees a killed process's context shortly after it is reaped.
    deadline = time.monotonic() + 10
    while (left := seen & _pids_on_gpus()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"ranks still on a GPU: {sorted(left)}"


def test_a_failing_rank_ends_the_run_with_its_error(tmp_path) -> None:
    with pytest.raises(DistributedError, match=r"failed \(exit 1\)[\s\S]*missing.csv: no such file"):
        launch(TrainConfig(epochs=1), 2, source=str(tmp_path / "missing.csv"), backend="gloo", timeout_s=120,
               workdir=tmp_path)


@pytest.mark.parametrize("loop", ["fast", "graph"])
def test_a_hanging_run_times_out_and_leaves_nothing_running(tmp_path, loop) -> None:
    with pytest.raises(DistributedError, match="timed out after 2 s; all ranks stopped"):
        launch(TrainConfig(epochs=1000, width=64, loop=loop), 2, scale=SCALE, backend="gloo", timeout_s=2,
               workdir=tmp_path)
    time.sleep(0.5)
    assert _count(f"model.distributed.*{tmp_path.name}") == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ranks are found through /proc")
def test_stopping_a_launch_kills_ranks_in_sessions_of_their_own(tmp_path) -> None:
    # torchrun starts every rank with start_new_session: killing torchrun's process group
    # alone leaves running ranks behind, and the launcher waits on their output forever.
    pid_file = tmp_path / "rank.pid"
    rank = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(600)"
    torchrun = (
        "import subprocess, sys, time; "
        f"subprocess.Popen([sys.executable, '-c', {rank!r}], start_new_session=True); time.sleep(600)"
    )
    process = subprocess.Popen([sys.executable, "-c", torchrun], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while not (pid_file.is_file() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    rank_pid = int(pid_file.read_text())
    assert os.getsid(rank_pid) == rank_pid != os.getsid(process.pid)  # as torchrun's ranks are
    distributed._stop(process)  # returns: nothing holds the output pipe any more
    assert process.returncode is not None
    deadline = time.monotonic() + 10  # the killed rank is reaped by init
    while _alive(rank_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(rank_pid)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")  # a zombie is dead, waiting to be reaped


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="the launcher binds torchrun to its parent through prctl")
@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "kill-9"])
def test_stopping_the_launching_process_stops_every_rank(tmp_path, how) -> None:
    script = (
        "from model.config import TrainConfig; from model.distributed import launch; from pathlib import Path; "
        f"launch(TrainConfig(epochs=1000, width=64), 2, scale={SCALE}, backend='gloo', timeout_s=300, "
        f"workdir=Path({str(tmp_path)!r}))"
    )
    parent = subprocess.Popen([sys.executable, "-c", script])
    pattern = f"model.distributed.*{tmp_path.name}"
    deadline = time.monotonic() + 60
    while _count(pattern) < 4 and time.monotonic() < deadline:  # the launcher, torchrun, two ranks
        time.sleep(0.2)
    assert _count(pattern) == 4, "the ranks never started"
    time.sleep(5)  # past start-up, when torchrun stops writing to the launcher's pipe
    parent.send_signal(how)  # Ctrl-C: the launcher stops the ranks; kill -9: torchrun is bound to it
    parent.wait()
    # Orphaned ranks die too once something writes to the launcher's closed pipe, but
    # only then: seconds to minutes. Bound to the launcher, they stop at once.
    deadline = time.monotonic() + 5
    while _count(pattern) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _count(pattern) == 0


def _count(pattern: str) -> int:
    return len(_pids(pattern))


def _pids(pattern: str) -> list[str]:
    return subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()


def _pids_on_gpus() -> set[str]:
    query = ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"]
    return set(subprocess.run(query, capture_output=True, text=True, check=True).stdout.split())


# --------------------------------------------------------------------- shards

EXPERIMENTS = Path(__file__).resolve().parents[1] / "bench" / "test_experiments.py"


def collected(pytester: pytest.Pytester, *args: str) -> list[str]:
    pytester.makeconftest('pytest_plugins = ["bench.plugin"]')
    (pytester.path / "test_experiments.py").write_text(EXPERIMENTS.read_text())
    # --profile quick: every value of every experiment (a CPU's smoke profile leaves some to the nightly tier)
    result = pytester.runpytest_inprocess("--collect-only", "-q", "--device=cpu", "--profile=quick", *args)
    return [line for line in result.outlines if "::" in line]


def test_shards_cover_every_case_exactly_once(pytester) -> None:
    everything = collected(pytester)
    assert len(everything) == 22
    for n in (2, 3, 5):
        shards = [collected(pytester, f"--shard={i}/{n}") for i in range(1, n + 1)]
        assert sorted(sum(shards, [])) == sorted(everything)
        assert all(abs(len(s) - len(everything) / n) < 1 for s in shards)


def test_shards_balanced_by_durations_cover_every_case_once(pytester) -> None:
    everything = collected(pytester)
    slow = {"test_experiments.py::test_optimizer[opt-adagrad]": 120.0,
            "test_experiments.py::test_batch_size[batch-64]": 80.0}
    run = {"benchmarks": [{"fullname": n, "stats": {"total": t}} for n, t in slow.items()],
           "machine_info": {RECORD_KEY: {}}}
    (pytester.path / "durations.json").write_text(json.dumps(run))
    shards = [collected(pytester, f"--shard={i}/3", "--shard-durations=durations.json") for i in (1, 2, 3)]
    assert sorted(sum(shards, [])) == sorted(everything)
    assert [sum(n in slow for n in shard) for shard in shards] == [1, 1, 0]  # the two slow cases apart


@pytest.mark.parametrize(
    ("args", "content", "message"),
    [
        (["--shard=1/2", "--shard-durations=nowhere.json"], None, "--shard-durations: nowhere.json: cannot be read"),
        (["--shard=1/2", "--shard-durations=d.json"], "{oops", "--shard-durations: d.json: corrupt JSON at line 1"),
        (["--shard=1/2", "--shard-durations=d.json"], '{"a": 1}', "d.json: not a pytest-benchmark run file"),
        (["--shard-durations=d.json"], "{}", "--shard-durations d.json: only means something with --shard I/N"),
    ],
    ids=["missing", "corrupt", "foreign", "without-shard"],
)
def test_bad_shard_durations_are_usage_errors(pytester, args, content, message) -> None:
    pytester.makeconftest('pytest_plugins = ["bench.plugin"]')
    if content is not None:
        (pytester.path / "d.json").write_text(content)
    result = pytester.runpytest_inprocess("--collect-only", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()


@pytest.mark.parametrize(("value", "message"), [("3/2", "between 1 and 2"), ("x", "use i/n")])
def test_bad_shard_is_a_usage_error(pytester, value, message) -> None:
    pytester.makeconftest('pytest_plugins = ["bench.plugin"]')
    result = pytester.runpytest_inprocess(f"--shard={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()


CASES = """
from kernels.ground.cases import Case
import pytest

@pytest.mark.parametrize("case", [Case("units", 128), Case("units", 256), Case("opt", "sgd")], ids=lambda c: c.id)
def test_case(loadbench, case):
    loadbench.run(case, width=16)
"""


def test_merged_shards_read_like_one_run(inprocess_ready, pytester, tmp_path) -> None:
    pytester.makeconftest('pytest_plugins = ["bench.plugin"]')
    pytester.makepyfile(test_cases=CASES)
    (pytester.path / "budgets.toml").write_text("")
    shards = []
    for i in (1, 2):
        out = tmp_path / f"shard-{i}.json"
        pytester.runpytest_inprocess("--device=cpu", "--profile=smoke", "--epochs=2", f"--shard={i}/2",
                                      f"--budgets={pytester.path / 'budgets.toml'}", f"--benchmark-json={out}",
                                      f"--series-dir={tmp_path / 'series'}").assert_outcomes(passed=2 if i == 1 else 1)
        shards.append(out)
    merged = tmp_path / "merged.json"
    subprocess.run([sys.executable, "-m", "bench.tools.merge", str(merged), *map(str, shards)], check=True)
    run = json.loads(merged.read_text())
    assert sorted(b["extra_info"]["case"] for b in run["benchmarks"]) == ["opt-sgd", "units-128", "units-256"]
    compare = subprocess.run([sys.executable, "-m", "pytest_benchmark", "compare", str(merged)],
                             capture_output=True, text=True, check=True)
    assert "units-256" in compare.stdout
    written, warnings = build_report([merged], tmp_path / "report")
    assert ("units-128" in (tmp_path / "report" / "tables.md").read_text()
            or "128" in (tmp_path / "report" / "tables.md").read_text())
    with pytest.raises(MergeError, match="is also in"):
        merge_runs([shards[0], shards[0]])


def test_a_rank_that_dies_without_an_exception_is_reported_with_its_last_words() -> None:
    from model.distributed import failure_detail

    output = "\n".join(
        ["epoch 1", "terminate called after throwing an instance of 'gloo::IoException'",
         "  what():  Connection closed by peer", "Traceback (most recent call last):", "  File torchrun",
         "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"]
        + ["=" * 20, "model.distributed FAILED", "Root Cause (first observed failure):",
           "  rank      : 1 (local_rank: 1)", "  exitcode  : -6 (pid: 31306)",
           "  traceback : Signal 6 (SIGABRT) received by PID 31306", "=" * 20]
    )
    detail = failure_detail(output)
    assert "what():  Connection closed by peer" in detail and "Signal 6 (SIGABRT)" in detail
    assert failure_detail("one line") == "one line"
