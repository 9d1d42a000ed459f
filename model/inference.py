"""Serving a trained MLP: latency, throughput, energy and accuracy of exactly the model timed.

`measure` times a model at batch 1 (eagerly and replayed from a CUDA graph: the
callables of model/serving.py, the statistics of model/latency.py) and at serving
batches, reads the NVML energy counter over the throughput loop, and scores the same
callables on the test set; `evaluate` chains model.trained.trained_model -> compress ->
measure and states the accuracy drop and speed-up against the uncompressed model.

Times are taken with `clock` (time.perf_counter by default) and a device sync at
the end of each call, batch-1 latency with the garbage collector paused; tests plant a
clock. What cannot be measured here (graph latency without CUDA, energy without NVML)
is None, with the reason under ``unavailable``, never a zero.
"""

from __future__ import annotations

import contextlib
import json
import math
import statistics
import time
from collections.abc import Callable
from collections.abc import Sequence
from pathlib import Path

import torch

from kernels.ground.axes import SERVING_IMPLS
from kernels.ground.axes import Impl
from model.compress import Compression
from model.compress import compress
from model.config import TrainConfig
from model.data import Dataset
from model.latency import LATENCY_CALLS
from model.latency import LATENCY_SECONDS
from model.latency import LATENCY_WARMUP
from model.latency import PIN_UNAVAILABLE
from model.latency import collector_paused
from model.latency import latency_call_count
from model.latency import latency_stats
from model.latency import round_p99s
from model.latency import thread_pinned
from model.metrics import classification_report
from model.serving import Runner
from model.serving import forward_routes
from model.serving import host_sync_in
from model.serving import prepare
from model.trained import cache_key
from model.trained import trained_model

BATCHES = (512, 4096)
THROUGHPUT_SECONDS = {"cuda": 0.5, "cpu": 0.2}  # timed per batch size (the energy counter needs a window)
MAX_REPEATS = 100_000
LatencyTimer = Callable[[Callable[[], None], int], list[float]]  # (one call, count) -> seconds per call


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


def _check_measure_args(impl: str, latency_calls: int | None, batches: Sequence[int]) -> None:
    if impl not in SERVING_IMPLS:
        raise ValueError(f"measure: impl={impl!r}: expected one of {', '.join(SERVING_IMPLS)}")
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
