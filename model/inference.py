"""Serving a trained MLP: latency, throughput, energy and accuracy of exactly the model timed.

`trained_model` trains a configuration once and keeps its weights on disk (the
benchmark and the search ask for the same model many times); `measure` times a
model at batch 1 (eagerly and replayed from a CUDA graph) and at serving batches,
reads the NVML energy counter over the throughput loop, and scores the same
callables on the test set; `evaluate` chains trained_model -> compress -> measure
and states the accuracy drop and speed-up against the uncompressed model.

Times are taken with `clock` (time.perf_counter by default) and a device sync at
the end of each call, batch-1 latency with the garbage collector paused; tests plant a
clock. What cannot be measured here (graph latency without CUDA, energy without NVML)
is None, with the reason under ``unavailable``, never a zero.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import hashlib
import io
import json
import math
import statistics
import os
import time
import warnings
from collections.abc import Callable
from collections.abc import Sequence
from pathlib import Path

import torch

from model.axes import Impl
from model.axes import SERVING_IMPLS
from model.compress import Compression
from model.compress import Unsupported
from model.compress import compress
from model.config import TrainConfig
from model.data import Dataset
from model.files import write_atomic
from model.metrics import classification_report
from model.mlp import MLP
from model.train import Trainer
from model.train import precision_mode

LATENCY_CALLS = {"cuda": 2000, "cpu": 100}  # batch-1 calls per latency mode
LATENCY_ROUNDS = 5  # the calls split into rounds: one p99 per round for the noise estimate
# Untimed batch-1 calls before each latency mode's timed ones, as any benchmark warms up:
# on an H100 the first of five rounds often held the tail (round p99s of 83-90 us against
# 27-41 us in the others); a new CUDA graph, for one, is uploaded at its first launch.
LATENCY_WARMUP = {"cuda": 50, "cpu": 3}
# A mode whose batch-1 call is slow gets fewer calls: as many as fill LATENCY_SECONDS, never
# fewer than LATENCY_MIN_CALLS (100 a round, so each round's p99 is read from 100 calls).
# Without it one slow variant (a quantized model at milliseconds a call) spends 2000 calls
# per mode per case, most of the nightly serving matrix's time.
LATENCY_SECONDS = {"cuda": 2.0, "cpu": 2.0}
LATENCY_MIN_CALLS = 100 * LATENCY_ROUNDS
BATCHES = (512, 4096)
IMPLS = SERVING_IMPLS
THROUGHPUT_SECONDS = {"cuda": 0.5, "cpu": 0.2}  # timed per batch size (the energy counter needs a window)
MAX_REPEATS = 100_000
WARMUP_CALLS = 3  # before timing or capture: compilation, autotuning, allocator growth
CACHE_FORMAT = 1  # bump when what a cache file holds changes
LatencyTimer = Callable[[Callable[[], None], int], list[float]]  # (one call, count) -> seconds per call


def latency_call_count(calls: int, once_s: float, seconds: float, minimum: int = LATENCY_MIN_CALLS) -> int:
    """The batch-1 calls to time: `calls`, or as many as fill `seconds` at `once_s` a call
    if that is fewer, but never fewer than `minimum` (nor more than `calls`)."""
    if once_s <= 0 or not math.isfinite(once_s):
        return calls
    return min(calls, max(minimum, math.ceil(seconds / once_s)))


def latency_stats(samples_s: Sequence[float]) -> dict[str, float]:
    """p50, p99 and max of per-call latencies (seconds); nearest-rank percentiles, so
    every figure is a latency that was actually observed."""
    values = sorted(float(s) for s in samples_s)
    if not values:
        raise ValueError("latency_stats: no samples")
    if any(not math.isfinite(v) or v < 0 for v in values):
        raise ValueError("latency_stats: samples must be finite and non-negative seconds")

    def rank(q: float) -> float:
        return values[max(0, math.ceil(q * len(values)) - 1)]

    return {"p50": rank(0.50), "p99": rank(0.99), "max": values[-1]}


def measure(
    model: torch.nn.Module,
    data: Dataset,
    device: torch.device,
    *,
    impl: str = "torch",
    latency_calls: int | None = None,
    batches: Sequence[int] = BATCHES,
    graph: bool = True,
    clock: Callable[[], float] = time.perf_counter,
    latency_timer: LatencyTimer | None = None,
    energy_mj: Callable[[], float | None] | None = None,
    latency_quiet: Callable[[], contextlib.AbstractContextManager] | None = None,
    pin: bool = False,
) -> dict[str, object]:
    """Latency (batch 1), throughput (`batches`), energy per 1,000 inferences and the
    accuracy and macro-F1 of `model` run through `impl` ('torch' eager, 'compile'
    torch.compile, 'triton' our fused kernel). Keys: latency_graph_s, latency_eager_s
    ({p50, p99, max} seconds, or None), throughput ({"512": samples/s, ...}),
    energy_j_per_1k, accuracy, macro_f1, routes (triton: each batch size's forward
    launches, `forward_routes`; else None), notes, unavailable (metric -> reason).

    `latency_timer` times the primary latency mode (the graph where there is one, else
    eager) instead of the own loop: the benchmark passes pytest-benchmark's pedantic
    there. `energy_mj` reads a cumulative energy counter (default: NVML's, on a GPU).
    `latency_quiet` is entered around each batch-1 latency loop, besides the garbage
    collector's pause: the benchmark passes its load monitor's `paused`, whose readings
    would otherwise take the GIL from calls being timed. `pin` holds the timing thread
    on the CPU it runs on for the batch-1 loops (`thread_pinned`); `latency_pinned_cpu`
    says which, or is None."""
    device = torch.device(device)
    _check_measure_args(impl, latency_calls, batches)
    cuda = device.type == "cuda"
    calls = latency_calls if latency_calls is not None else LATENCY_CALLS["cuda" if cuda else "cpu"]
    notes: list[str] = list(getattr(model, "notes", []))
    unavailable: dict[str, str] = {}
    served = prepare(model, impl, device)
    use_graph = graph and cuda
    if not cuda:
        unavailable["latency_graph_s"] = f"CUDA graphs need a GPU; device is {device.type}"
    elif not graph:
        unavailable["latency_graph_s"] = "graph=False: not measured"
    reader, why = (energy_mj, None) if energy_mj is not None else nvml_energy(device)
    if reader is None:
        unavailable["energy_j_per_1k"] = str(why)

    # The stream the calls run on, synchronized directly: torch.cuda.synchronize(device)
    # also enters and leaves a device context each time, host work that would count in
    # every batch-1 latency sample (and in its tail) without being part of serving.
    stream = torch.cuda.current_stream(device) if cuda else None

    def sync() -> None:
        if stream is not None:
            stream.synchronize()

    def own_timer(call: Callable[[], None], count: int) -> list[float]:
        sync()
        out = []
        for _ in range(count):  # each call ends synchronized: no sync between them
            start = clock()
            call()
            out.append(clock() - start)
        return out

    features = data.n_features
    with torch.no_grad():
        eager1 = Runner(served, 1, features, device, graph=False)
        blocker = host_sync_in(eager1) if use_graph else None
        if blocker is not None:  # a capture would fail, and leave the process unable to capture again
            use_graph = False
            unavailable["latency_graph_s"] = blocker
        graph1 = Runner(served, 1, features, device, graph=True) if use_graph else None
        primary = graph1 or eager1

        pinned_cpus: list[int | None] = []  # per latency mode, with pin
        call_counts: list[int] = []  # per latency mode: eager, then graph

        def timed(runner: Runner) -> list[float]:
            def call() -> None:  # one inference, finished on the device
                runner()
                sync()

            warm = own_timer(call, LATENCY_WARMUP["cuda" if cuda else "cpu"])
            count = calls if latency_calls is not None else latency_call_count(
                calls, statistics.median(warm), LATENCY_SECONDS["cuda" if cuda else "cpu"])
            call_counts.append(count)
            timer = latency_timer if (latency_timer is not None and runner is primary) else own_timer
            quiet = latency_quiet() if latency_quiet is not None else contextlib.nullcontext()
            with collector_paused(), quiet, (thread_pinned() if pin else contextlib.nullcontext(None)) as cpu:
                pinned_cpus.append(cpu)
                return timer(call, count)

        eager_samples = timed(eager1)
        graph_samples = timed(graph1) if graph1 is not None else None
        primary_samples = graph_samples if graph_samples is not None else eager_samples

        throughput: dict[str, float] = {}
        energy_per_1k: float | None = None
        runners: dict[int, Runner] = {}
        for batch in batches:
            runner = runners[batch] = Runner(served, batch, features, device, graph=use_graph)
            repeats = _repeats(runner, sync, clock, THROUGHPUT_SECONDS["cuda" if cuda else "cpu"])
            before = reader() if reader is not None else None
            sync()
            start = clock()
            for _ in range(repeats):
                runner()
            sync()
            seconds = clock() - start
            after = reader() if reader is not None else None
            throughput[str(batch)] = repeats * batch / seconds if seconds > 0 else float("inf")
            if batch == max(batches) and before is not None and after is not None:
                energy_per_1k = (after - before) / 1000 / (repeats * batch) * 1000
            elif batch == max(batches) and reader is not None:
                unavailable["energy_j_per_1k"] = "the energy counter gave no reading"
        scorer = runners[max(batches)]
        predictions = scorer.predict(data.x_test.to(device))
    if pin and None in pinned_cpus:
        unavailable["latency_pinned_cpu"] = PIN_UNAVAILABLE
    report = classification_report(data.y_test.to(device), predictions, data.n_classes)
    routes = forward_routes((1, *batches)) if impl == Impl.TRITON else None
    notes.append(f"impl {impl}; throughput {'replayed from CUDA graphs' if use_graph else 'eager'}; "
                 f"accuracy from the batch-{max(batches)} callable that was timed")
    return {
        "latency_graph_s": latency_stats(graph_samples) if graph_samples is not None else None,
        "latency_eager_s": latency_stats(eager_samples),
        "latency_calls": call_counts[-1],
        "latency_mode": "graph" if graph_samples is not None else "eager",
        "latency_p99_by_round_s": round_p99s(primary_samples),
        "latency_pinned_cpu": pinned_cpus[-1] if pin else None,
        "throughput": throughput,
        "energy_j_per_1k": energy_per_1k,
        "accuracy": report["accuracy"],
        "macro_f1": report["macro_f1"],
        "impl": impl,
        "routes": routes,
        "notes": notes,
        "unavailable": unavailable,
    }


@contextlib.contextmanager
def collector_paused():  # type: ignore[no-untyped-def]
    """Python's garbage collector off while batch-1 latency is timed, as timeit runs:
    a collection landing inside a call of some 20 us would count as serving latency."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


PIN_UNAVAILABLE = "this platform cannot hold a thread on one CPU (no sched_setaffinity, or it was refused)"


@contextlib.contextmanager
def thread_pinned():  # type: ignore[no-untyped-def]
    """The calling thread held on the CPU it is running on; yields that CPU, or None where
    the platform cannot pin (the calls then run free). Restores the thread's CPU set.

    Why: batch-1 calls slower than twice the p50 come in bursts of milliseconds, and one
    burst sets a round's p99; a migration of the timing thread is one cause that pinning
    removes. On an H100 host it did not lower the p99 (docs/measurements.md, serving), hence off
    by default. Linux applies sched_setaffinity(0, ...) to the calling thread only: the
    load monitor's thread and the CUDA driver's threads keep their CPUs."""
    setaffinity = getattr(os, "sched_setaffinity", None)
    cpu = _current_cpu() if setaffinity is not None else None
    before = os.sched_getaffinity(0) if cpu is not None else None
    if cpu is not None:
        try:
            setaffinity(0, {cpu})
        except OSError:
            cpu = None
    try:
        yield cpu
    finally:
        if cpu is not None:
            setaffinity(0, before)


def _current_cpu() -> int | None:
    """The CPU the calling thread runs on (field 39 of /proc/thread-self/stat), or None."""
    try:
        with open("/proc/thread-self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        cpu = int(fields[36])
    except (OSError, IndexError, ValueError):
        return None
    allowed = os.sched_getaffinity(0)
    return cpu if cpu in allowed else None


def round_p99s(samples: Sequence[float], rounds: int = LATENCY_ROUNDS) -> list[float]:
    """The p99 of each of `rounds` consecutive slices of the calls: one sample of the
    tail per round, for the compare's run-to-run noise and significance test."""
    size = len(samples) // rounds
    if size < 1:
        return [latency_stats(samples)["p99"]]
    return [latency_stats(samples[k * size : (k + 1) * size])["p99"] for k in range(rounds)]


def _check_measure_args(impl: str, latency_calls: int | None, batches: Sequence[int]) -> None:
    if impl not in IMPLS:
        raise ValueError(f"measure: impl={impl!r}: expected one of {', '.join(IMPLS)}")
    if latency_calls is not None and (isinstance(latency_calls, bool) or not isinstance(latency_calls, int)
                                      or latency_calls < 1):
        raise ValueError(f"measure: latency_calls={latency_calls!r}: expected a positive integer")
    if not batches or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in batches):
        raise ValueError(f"measure: batches={tuple(batches)!r}: expected positive integers")


def _repeats(runner: Runner, sync: Callable[[], None], clock: Callable[[], float], seconds: float) -> int:
    """How many calls fill about `seconds`, from one timed call (at least 3)."""
    sync()
    start = clock()
    runner()
    sync()
    once = clock() - start
    if once <= 0:
        return 3
    return int(min(MAX_REPEATS, max(3, math.ceil(seconds / once))))


def prepare(model: torch.nn.Module, impl: str, device: torch.device) -> torch.nn.Module:
    """`model` ready to serve through `impl`, without changing it. 'triton' routes every
    layer of the MLP inside through our fused kernel, which takes plain dense fp32 or
    bf16 weights only (quantized and 2:4 tensors raise Unsupported); 'compile' is
    torch.compile with static shapes, one compilation per batch size."""
    model = model.to(device).eval()
    if impl == Impl.TRITON:
        mlps = [m for m in model.modules() if isinstance(m, MLP)]
        if not mlps:
            raise Unsupported("impl 'triton' routes model.mlp.MLP layers through the fused kernel; none inside")
        for mlp in mlps:
            for name, p in mlp.named_parameters():
                if type(p.data) is not torch.Tensor or p.layout != torch.strided or p.dtype not in (
                    torch.float32, torch.bfloat16
                ):
                    raise Unsupported(
                        f"impl 'triton': the fused kernel takes dense fp32 or bf16 weights; {name} is "
                        f"{type(p.data).__name__} {p.dtype}"
                    )
        model = copy.deepcopy(model)
        for mlp in model.modules():
            if isinstance(mlp, MLP):
                mlp.impl = "triton"
    elif impl == Impl.COMPILE:
        model = torch.compile(model, dynamic=False)
    return model


def host_sync_in(runner: Runner) -> str | None:
    """Why `runner`'s call cannot be captured in a CUDA graph, or None: the reason is a
    host read of the GPU inside the forward (torchao's int8 matmul formats its input's
    repr, for one), which fails a capture and leaves the stream unable to capture again,
    so it is looked for on one eager call under torch's sync debug mode instead. torch
    warns that the mode does not catch every synchronizing operation: one it misses still
    fails the capture, as before this check."""
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():  # that warning, once per case, would only repeat the above
        warnings.filterwarnings("ignore", message="Synchronization debug mode is a prototype")
        torch.cuda.set_sync_debug_mode("error")
    try:
        runner()
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"not capturable in a CUDA graph: the forward reads the GPU from the host ({first}); timed eagerly"
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    return None


class Runner:
    """One batch size: a static input buffer and the model's call on it, captured in a
    CUDA graph where asked (a replay is then the whole forward as one launch)."""

    def __init__(self, model: torch.nn.Module, batch: int, features: int, device: torch.device, graph: bool) -> None:
        self.model = model
        self.batch = batch
        self.x = torch.zeros(batch, features, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        with torch.no_grad(), precision_mode("fp32"):
            if graph:
                side = torch.cuda.Stream(device)
                side.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(side):
                    for _ in range(WARMUP_CALLS):
                        self.out = model(self.x)
                torch.cuda.current_stream(device).wait_stream(side)
                self.graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(self.graph):
                    self.out = model(self.x)
            else:
                for _ in range(WARMUP_CALLS):
                    self.out = model(self.x)

    def __call__(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            with torch.no_grad(), precision_mode("fp32"):
                self.out = self.model(self.x)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Class predictions for `x` through exactly this callable, chunk by chunk (the
        last chunk padded with zeros, its padding dropped)."""
        out = []
        for chunk in x.split(self.batch):
            n = len(chunk)
            self.x[:n].copy_(chunk)
            self.x[n:].zero_()
            self()
            out.append(self.out[:n].argmax(1).clone())
        return torch.cat(out)


def forward_routes(batches: Sequence[int]) -> dict[str, list[str]]:
    """For the fused kernel: each batch size's forward launches, from the process's
    launch reports (a shape served earlier in the process is listed too): per layer
    'M x N x K: route (source)', e.g. '512x512x512: triton (table)', and for a forward
    of a few rows in one launch 'one launch, 4 layers: 128 programs, tile 1x4x512'."""
    from kernels.ops import mlp_forward  # lazily: kernels/ needs triton
    from kernels.plan.launches import launch_report

    out: dict[str, list[str]] = {}
    for entry in launch_report():
        m, n, k = entry["shape"]
        if entry["kernel"] == "fwd" and m in batches:
            out.setdefault(str(m), []).append(f"{m}x{n}x{k}: {entry['route']} ({entry['source']})")
    for (rows, widths, _dtype), launch in mlp_forward.LAUNCHES.items():
        if rows in batches:
            programs = f"{launch['programs']} program{'s' if launch['programs'] != 1 else ''}"
            line = f"one launch, {len(widths) - 1} layers: {programs}, tile {launch['tile']}"
            out.setdefault(str(rows), []).append(line)
    return {b: sorted(set(lines)) for b, lines in sorted(out.items(), key=lambda kv: int(kv[0]))}


def nvml_energy(device: torch.device) -> tuple[Callable[[], float | None] | None, str | None]:
    """A reader of the GPU's cumulative energy counter (mJ), or None and the reason."""
    if device.type != "cuda":
        return None, f"no NVML energy counter: device is {device.type}"
    try:
        import pynvml

        pynvml.nvmlInit()
        index = device.index if device.index is not None else torch.cuda.current_device()
        uuid = "GPU-" + str(torch.cuda.get_device_properties(index).uuid)  # NVML ignores CUDA_VISIBLE_DEVICES
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid.encode())
        pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    except Exception as exc:  # ImportError, or NVML's own error family
        return None, f"NVML energy counter unavailable: {exc}"

    def read() -> float | None:
        try:
            return float(pynvml.nvmlDeviceGetTotalEnergyConsumption(handle))
        except Exception:
            return None

    return read, None


# ------------------------------------------------------------------ trained models


_FINGERPRINTS: dict[int, tuple[Dataset, str]] = {}


def dataset_fingerprint(data: Dataset) -> str:
    """A digest of the split's contents (features, labels, classes): two datasets with the
    same frames give the same key, whatever their source string."""
    known = _FINGERPRINTS.get(id(data))
    if known is not None and known[0] is data:
        return known[1]
    digest = hashlib.sha256()
    for tensor in (data.x_train, data.y_train, data.x_test, data.y_test):
        array = tensor.detach().cpu().contiguous()
        digest.update(str((tuple(array.shape), str(array.dtype))).encode())
        digest.update(array.numpy().tobytes())
    digest.update("\n".join(data.classes).encode())
    _FINGERPRINTS[id(data)] = (data, digest.hexdigest())
    return _FINGERPRINTS[id(data)][1]


def cache_key(config: TrainConfig, data: Dataset, profile: str) -> dict[str, object]:
    """What a trained model depends on: the configuration (seed and epochs included), the
    dataset's contents and the profile."""
    return {"format": CACHE_FORMAT, "config": config.as_dict(), "dataset": dataset_fingerprint(data),
            "profile": profile}


def cache_path(config: TrainConfig, data: Dataset, profile: str, cache_dir: Path) -> Path:
    key = json.dumps(cache_key(config, data, profile), sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:20]
    return Path(cache_dir) / f"{profile}-d{config.depth}-w{config.width}-b{config.batch_size}-{digest}.pt"


def _build(config: TrainConfig, data: Dataset) -> MLP:
    return MLP(data.n_features, config.width, config.depth, data.n_classes, config.activation, "torch")


def trained_model(config: TrainConfig, data: Dataset, *, profile: str, cache_dir: Path) -> torch.nn.Module:
    """`config` trained on `data` (model.train.Trainer), from the disk cache when the same
    configuration, seed, dataset and profile were trained before; a corrupt cache file
    is retrained with a warning. Returns a fresh eager-torch MLP in eval mode on the
    data's device each call (callers may change theirs)."""
    if not isinstance(profile, str) or not profile:
        raise ValueError(f"trained_model: profile={profile!r}: expected a profile name")
    path = cache_path(config, data, profile, Path(cache_dir))
    key = cache_key(config, data, profile)
    if path.exists():
        try:
            stored = torch.load(path, map_location="cpu", weights_only=True)
            if not isinstance(stored, dict) or stored.get("key") != json.dumps(key, sort_keys=True):
                raise ValueError("it holds another configuration's weights")
            model = _build(config, data)
            model.load_state_dict(stored["state_dict"])
            return model.to(data.device).eval()
        except Exception as exc:  # unreadable, truncated, foreign: never fatal, retrain
            warnings.warn(f"trained-model cache {path} could not be used ({exc}); retraining", stacklevel=2)
    trainer = Trainer(config, data)
    trainer.fit()
    state = {k: v.detach().cpu() for k, v in trainer.model.state_dict().items()}
    metrics = trainer.evaluate()
    trainer.release()
    _save(path, {"key": json.dumps(key, sort_keys=True), "state_dict": state,
                             "accuracy": metrics["accuracy"], "macro_f1": metrics["macro_f1"]})
    model = _build(config, data)
    model.load_state_dict(state)
    return model.to(data.device).eval()


def _save(path: Path, payload: dict[str, object]) -> None:
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    write_atomic(path, buffer.getvalue())  # a crash or a parallel run never leaves half a file


# ------------------------------------------------------------------ one trial


_REFERENCES: dict[str, dict[str, object]] = {}  # fp32 eager-torch measurements, per process
REFERENCE = "fp32, impl torch"


def reference_key(config: TrainConfig, data: Dataset, device: torch.device, profile: str) -> str:
    return json.dumps({**cache_key(config, data, profile), "device": str(device)}, sort_keys=True)


def evaluate(
    config: TrainConfig,
    compression: Compression,
    data: Dataset,
    device: torch.device,
    *,
    profile: str,
    cache_dir: Path,
    impl: str = "torch",
    **measure_options: object,
) -> dict[str, object]:
    """trained_model -> compress -> measure, plus accuracy_drop (the fp32 model's accuracy
    minus this one's, in [0, 1] units) and speedup (throughput at the largest batch
    over the fp32 model's under eager torch, measured once per process and reused).
    What the search calls per trial; `measure_options` go to `measure`. Raises
    Unsupported where the variant or impl cannot run here."""
    device = torch.device(device)
    model = trained_model(config, data, profile=profile, cache_dir=cache_dir)
    key = reference_key(config, data, device, profile)
    plain = compression == Compression() and impl == Impl.TORCH
    if key not in _REFERENCES and not plain:
        _REFERENCES[key] = measure(model, data, device, **_reference_options(measure_options))
    served = compress(model, compression, data, config)
    result = measure(served, data, device, impl=impl, **measure_options)  # type: ignore[arg-type]
    if plain and key not in _REFERENCES:
        _REFERENCES[key] = result
    reference = _REFERENCES[key]
    largest = str(max(int(b) for b in result["throughput"]))  # type: ignore[union-attr]
    ref_throughput = reference["throughput"].get(largest)  # type: ignore[union-attr]
    result.update(
        compression=compression.as_dict(),
        accuracy_drop=float(reference["accuracy"]) - float(result["accuracy"]),  # type: ignore[arg-type]
        macro_f1_drop=float(reference["macro_f1"]) - float(result["macro_f1"]),  # type: ignore[arg-type]
        speedup=result["throughput"][largest] / ref_throughput if ref_throughput else None,  # type: ignore[index]
        speedup_batch=int(largest),
        reference={"what": REFERENCE, "accuracy": reference["accuracy"], "macro_f1": reference["macro_f1"],
                   "throughput": reference["throughput"]},
    )
    return result


def _reference_options(options: dict[str, object]) -> dict[str, object]:
    """The fp32 reference is measured like the trial, but never through the trial's own
    latency timer (the benchmark's pedantic may time one loop per test)."""
    return {k: v for k, v in options.items() if k != "latency_timer"}


def clear_references() -> None:
    """Forget the fp32 reference measurements (tests; a long-lived process changing devices)."""
    _REFERENCES.clear()
