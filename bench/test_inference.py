"""Serving every case of the five experiments: each compression variant through each
implementation (eager torch, torch.compile, our fused forward kernel 'triton').

The case's model is trained once at the run's profile and kept on disk, then
compressed and measured by model.inference.evaluate: batch-1 latency (pytest-benchmark's
pedantic times the primary mode: the CUDA-graph replay on a GPU, the eager call on a
CPU), throughput, energy per 1,000 inferences, accuracy and macro-F1 of the callable that
was timed and their drop against the case's fp32 model, and the GPU load. Budgets and
the baseline's p99 are judged inside the test (bench/gate/judge.py). The smoke profile
serves the optimal configuration once, eagerly; a variant this machine cannot run is
skipped with the reason. More: docs/serving.md.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from kernels.ground.cases import Case
from kernels.ground.cases import EXPERIMENTS
from kernels.ground.cases import experiment_cases
from bench.gate.record import SERVING_FIELDS
from bench.gate.record import names
from bench.plugin.verdicts import fail_on
from bench.plugin.verdicts import judge_in_test
from bench.monitor.loadstats import summarize_monitor
from bench.monitor.sampler import GpuProbe
from bench.monitor.sampler import LoadMonitor
from bench.plugin import get_session
from bench.plugin.fixture import LoadBench
from kernels.ground import env as loadbench_env
from model.compress import Unsupported
from model.compress import VARIANTS
from model.compress import unsupported_reason
from model.inference import IMPLS
from model.inference import evaluate

# On a GPU the whole matrix is 22 cases x 9 variants x 3 implementations, about 5 s each at
# the quick profile: `pytest bench/ -m "not serving"` leaves it out of a training run.
pytestmark = pytest.mark.serving

SMOKE_CASES = ("blocks-3",)  # the optimal configuration (every experiment holds it once)
PR_CASES = ("blocks-3",)  # the pull-request tier serves the optimal configuration; the rest is nightly
CACHE_ENV = "LOADBENCH_MODEL_CACHE"
# What this test writes itself; every other declared serving field comes from
# model.inference.evaluate's result under the same name.
WRITTEN_HERE = frozenset({"kind", "case", "experiment", "variant", "impl", "config", "profile", "dataset",
                          "latency_p99_s", "load", "throttled", "verdict"})
RECORD_KEYS = tuple(name for name in names(SERVING_FIELDS) if name not in WRITTEN_HERE)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """case x variant x impl; the smoke profile keeps only the optimal configuration, and
    every other configuration belongs to the nightly tier."""
    if "variant" not in metafunc.fixturenames:
        return
    session = get_session(metafunc.config)
    cases = [case for name in EXPERIMENTS for case in experiment_cases(name)]
    if session is not None and session.options.profile.name == "smoke":
        cases = [case for case in cases if case.id in SMOKE_CASES]
    nightly = [pytest.mark.nightly]
    metafunc.parametrize(
        ("case", "variant", "impl"),
        [
            pytest.param(case.id, variant, impl, id=f"{case.id}-{variant}-{impl}",
                         marks=() if case.id in PR_CASES else nightly)
            for case in cases
            for variant in VARIANTS
            for impl in IMPLS
        ],
    )


def model_cache_dir(config: pytest.Config) -> Path:
    """$LOADBENCH_MODEL_CACHE, else `trained-models/` inside the benchmark storage when the
    run is stored, else a folder of this session's own (a run that stores nothing writes
    nothing into the checkout)."""
    if loadbench_env.read(CACHE_ENV):
        return Path(loadbench_env.read(CACHE_ENV))
    session = get_session(config)
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


def test_serving(benchmark, request, case: str, variant: str, impl: str) -> None:
    case = Case.parse(case)
    session = get_session(request.config)
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
                cache_dir=model_cache_dir(request.config), impl=impl,
                latency_timer=pedantic_timer(benchmark), energy_mj=energy, latency_quiet=monitor.paused,
                pin=options.latency_pin,
            )
    except Unsupported as exc:
        pytest.skip(str(exc))
    load = summarize_monitor(monitor, 1)
    primary = result["latency_graph_s"] or result["latency_eager_s"]
    record = {
        "kind": "inference",
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
    judge(session, benchmark, case, variant, record)


def judge(session: Any, benchmark: Any, case: Case, variant: str, record: dict[str, Any]) -> None:
    """The gate's judge on this record, inside the test: each broken limit is one line of
    this test's failure, and the record (with its verdict) is already in extra_info."""
    options = session.options
    budget = session.budgets.resolve_inference(options.profile.name, variant, case.id, options.dataset)
    judged, _ = judge_in_test(session, benchmark, record, budget)
    fail_on(judged, f"{case.id} {variant} {record['impl']}")
