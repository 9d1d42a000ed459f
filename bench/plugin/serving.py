"""Serving one case in a test: train (or load) its model, compress it, time and score it,
record it and judge it (`serve`), for bench/test_inference.py.

model.inference.evaluate measures; pytest-benchmark's pedantic times the primary batch-1
mode (the CUDA-graph replay on a GPU, the eager call on a CPU) through `pedantic_timer`,
so its saved statistics are the latency; the monitor watches the load. The record
holds every declared serving field (bench/gate/record.py) and the gate judges it inside
the test (bench/plugin/verdicts.py). Trained models are kept where `model_cache_dir` says.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from kernels.ground.cases import Case
from bench.gate.record import INFERENCE_KIND
from bench.gate.record import SERVING_FIELDS
from bench.gate.record import names
from bench.monitor.loadstats import summarize_monitor
from bench.monitor.sampler import GpuProbe
from bench.monitor.sampler import LoadMonitor
from bench.plugin.fixture import LoadBench
from bench.plugin.session import LoadBenchSession
from bench.plugin.verdicts import budget_for
from bench.plugin.verdicts import gate
from kernels.ground import env as loadbench_env
from model.compress import Unsupported
from model.compress import VARIANTS
from model.compress import unsupported_reason
from model.inference import evaluate

CACHE_ENV = "LOADBENCH_MODEL_CACHE"
# What `serve` writes itself; every other declared serving field comes from
# model.inference.evaluate's result under the same name.
WRITTEN_HERE = frozenset({"kind", "case", "experiment", "variant", "impl", "config", "profile", "dataset",
                          "latency_p99_s", "load", "throttled", "verdict"})
RECORD_KEYS = tuple(name for name in names(SERVING_FIELDS) if name not in WRITTEN_HERE)


def model_cache_dir(config: pytest.Config, session: LoadBenchSession | None) -> Path:
    """$LOADBENCH_MODEL_CACHE, else `trained-models/` inside the benchmark storage when the
    run is stored, else a folder of this session's own (a run that stores nothing writes
    nothing into the checkout)."""
    if loadbench_env.read(CACHE_ENV):
        return Path(loadbench_env.read(CACHE_ENV))
    if session is not None and not session.saving:
        return session.scratch("trained-models")
    storage = getattr(getattr(config, "_benchmarksession", None), "storage", None)
    return Path(getattr(storage, "path", ".benchmarks")) / "trained-models"


def skip_reason(variant: str, impl: str, device: Any, profile: str) -> str | None:
    """Why this variant x impl is not served here, or None."""
    if device.type == "cpu" and profile == "smoke" and impl != "torch":
        return (f"impl {impl!r} on a CPU in the smoke profile: torch.compile builds C++ and the Triton "
                "interpreter takes seconds a call, neither says anything about serving; run on a GPU")
    return unsupported_reason(VARIANTS[variant], device)


def pedantic_timer(benchmark: Any) -> Any:
    """A latency timer through pytest-benchmark: one round per call, so its saved statistics
    are the batch-1 latency. Under --benchmark-disable it times the calls itself."""

    def timer(call: Any, count: int) -> list[float]:
        benchmark.pedantic(call, rounds=count, iterations=1, warmup_rounds=0)
        stats = getattr(getattr(benchmark, "stats", None), "stats", None)
        data = list(getattr(stats, "data", []) or [])
        if len(data) == count:
            return data
        out = []
        for _ in range(count):
            start = time.perf_counter()
            call()
            out.append(time.perf_counter() - start)
        return out

    return timer


def serve(benchmark: Any, request: pytest.FixtureRequest, session: LoadBenchSession, case: Case, variant: str,
          impl: str) -> dict[str, Any]:
    """Serve `case`'s model compressed by `variant` through `impl`: measure, record into
    extra_info and judge; skip where this machine cannot serve it. The record."""
    options = session.options
    reason = skip_reason(variant, impl, options.device, options.profile.name)
    if reason is not None:
        pytest.skip(reason)
    config = LoadBench(benchmark, session, request).config_for(case)
    data = session.dataset()
    benchmark.group = f"inference-{case.experiment}"
    monitor = LoadMonitor(options.device, options.monitor_period, probe=session.probe)
    energy = session.probe.energy_mj if isinstance(session.probe, GpuProbe) else None
    try:
        with monitor:
            result = evaluate(
                config, VARIANTS[variant], data, options.device, profile=options.profile.name,
                cache_dir=model_cache_dir(request.config, session), impl=impl,
                latency_timer=pedantic_timer(benchmark), energy_mj=energy, latency_quiet=monitor.paused,
                pin=options.latency_pin,
            )
    except Unsupported as exc:
        pytest.skip(str(exc))
    load = summarize_monitor(monitor, 1)
    primary = result["latency_graph_s"] or result["latency_eager_s"]
    record = {
        "kind": INFERENCE_KIND,
        "case": case.id,
        "experiment": case.experiment,
        "variant": variant,
        "impl": impl,
        "config": config.as_dict(),
        "profile": options.profile.name,
        "dataset": data.describe(),
        **{key: result.get(key) for key in RECORD_KEYS},
        "latency_p99_s": primary["p99"],  # type: ignore[index]
        "load": load,
        "throttled": bool(load["throttle"] and load["throttle"]["throttled"]),  # type: ignore[index]
    }
    benchmark.extra_info.update(record)
    gate(session, benchmark, record, budget_for(session, case.id, variant=variant), f"{case.id} {variant} {impl}")
    return record
