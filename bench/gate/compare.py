"""Baseline compare: decide whether a stored run may gate this one (`gating`, the one rule
the session and the compare tool share), and judge each case's metrics against it,
direction-aware.

pytest-benchmark finds and loads the baseline file (and compares time statistics
with --benchmark-compare-fail); it skips a file it cannot parse with a warning and
keeps no extra_info rules, so the judging of our metrics is here. The report judges a
run against the one before it with these same functions; the time rule itself is in
bench/gate/timing.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.gate.budgets import Budget
from bench.gate.budgets import Failure
from bench.gate.kernel_table import KernelTable
from bench.gate.kernel_table import describe
from bench.gate.kernel_table import diff
from bench.gate.record import RECORD_KEY
from bench.gate.runs import HISTORY_SETTINGS
from bench.gate.runs import gpu_name
from bench.gate.runs import setting
from bench.gate.timing import DEFAULT_NOISE_K
from bench.gate.timing import EPOCH_TIME
from bench.gate.timing import Timed
from bench.gate.timing import check_time
from bench.gate.timing import estimate_noise


@dataclass(frozen=True)
class Gating:
    """Whether a stored run may gate a run, and why not."""

    differs: tuple[str, ...] = ()  # what sets them apart: "gpu", then the HISTORY_SETTINGS that differ
    reason: str = ""  # the differences in words; "" when the stored run gates
    planted: str = ""  # the run's planted slowdown, judged against the unplanted baseline; "" when none

    @property
    def gates(self) -> bool:
        return not self.differs


def gating(gpu: str, settings: dict[str, Any], baseline_gpu: str, baseline_settings: dict[str, Any], *,
           run: str = "this run", baseline: str = "baseline") -> Gating:
    """Whether a baseline (on `baseline_gpu`, with `baseline_settings`) may gate a run: only
    one that measured the same thing, on the same GPU model with the HISTORY_SETTINGS alike
    (same_measurement). A planted run is the exception: it exists to show what the gate
    catches, so it is judged against the unplanted baseline and says so; a planted baseline
    never gates. `run` and `baseline` name the two in the reason."""
    differs, parts = [], []
    if gpu != baseline_gpu:
        differs.append("gpu")
        parts.append(f"{baseline} ran on {baseline_gpu}, {run} on {gpu}")
    planted = ""
    for key in HISTORY_SETTINGS:
        ours, theirs = setting(settings, key), setting(baseline_settings, key)
        if ours == theirs:
            continue
        if key == "plant" and theirs is None:
            planted = str(ours)
            continue
        differs.append(key)
        parts.append(f"{baseline} ran {key}={theirs!r}, {run} {key}={ours!r}")
    reason = "; ".join(parts) + ": shown, not gated" if parts else ""
    return Gating(tuple(differs), reason, planted)


def planted_note(found: Gating, baseline: str = "baseline") -> str:
    """What a planted run says of the baseline that judged it; "" for an unplanted one."""
    if not found.planted:
        return ""
    return f"planted slowdown {found.planted}: judged against the unplanted {baseline}, to show what the gate catches"


@dataclass
class Baseline:
    path: Path
    machine_info: dict[str, Any]
    benchmarks: dict[str, dict[str, Any]]  # fullname -> saved benchmark
    gate: Gating = Gating()  # whether it may gate this run, and why not
    notes: list[str] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)  # stored runs for the noise estimate, oldest first

    @property
    def gpu(self) -> str:
        return gpu_name(self.machine_info)

    @property
    def gating(self) -> bool:
        return self.gate.gates

    @property
    def reason(self) -> str:
        return self.gate.reason

    @property
    def differs(self) -> tuple[str, ...]:
        return self.gate.differs


def make_baseline(path: Path, run: dict[str, Any], machine_info: dict[str, Any], settings: dict[str, Any]) -> Baseline:
    """A stored run as the baseline of this run (on `machine_info`'s GPU, with `settings`)."""
    theirs = run["machine_info"][RECORD_KEY].get("settings") or {}
    found = gating(gpu_name(machine_info), settings, gpu_name(run["machine_info"]), theirs)
    return Baseline(path, run["machine_info"], {b["fullname"]: b for b in run["benchmarks"]}, found)


def check_drops(budget: Budget, current: dict[str, Any], baseline: dict[str, Any]) -> list[Failure]:
    out = []
    for metric, limit in (("accuracy", budget.accuracy_drop_max), ("macro_f1", budget.macro_f1_drop_max)):
        if limit is None or metric not in baseline:
            continue
        drop = baseline[metric] - current[metric]
        if drop > limit:
            out.append(Failure(f"{metric}_drop", drop, limit, baseline[metric], f"now {current[metric]:.4f}"))
    return out


# Figures that hold the first epoch's compilation and tuning: the allocator peak (tuning's
# candidates) and, in records that count every epoch's energy, the energy per epoch.
FIRST_EPOCH_METRICS = ("vram_peak_mib", "energy_per_epoch_j")
STEADY = "after the first"  # a record's "energy_epochs" when its energy leaves the warm-up epoch out


def holds_first_epoch(metric: str, record: dict[str, Any]) -> bool:
    """Whether `record`'s `metric` holds the first epoch's compilation and tuning."""
    if metric == "energy_per_epoch_j":
        return record.get("energy_epochs") != STEADY
    return metric in FIRST_EPOCH_METRICS


def warm_caches(current: dict[str, Any], baseline: dict[str, Any]) -> bool:
    """Whether both records' first epochs found Triton's and Inductor's caches warm: an
    empty or cold cache compiles and tunes inside the first epoch, for a time that moves
    with the host's load. Records made before the state was recorded count as warm, and so do
    those whose kernels were compiled ahead ('warm (compiled ahead ...)')."""
    return all(str(record.get("kernel_caches", "warm")).split()[0] == "warm" for record in (current, baseline))


def growth_limit(pct: float, metric: str, history: Sequence[dict[str, Any]]) -> tuple[float, str]:
    """The growth a load figure may show, in percent, and the rule that set it: the budget's
    `pct`, or DEFAULT_NOISE_K times the figure's run-to-run spread over the stored records of
    the case where that is larger. An RSS peak moves with what ran before the case in its
    process, an energy counter with the card's temperature; an unknown spread (fewer than
    three stored values) leaves the budget alone."""
    noise = estimate_noise(history, samples=lambda record: [v] if isinstance(v := record.get(metric), (int, float))
                           and v > 0 else [])
    if not noise.known:
        return pct, f"limit {pct:g}%"
    bound = 100 * (math.exp(DEFAULT_NOISE_K * noise.spread) - 1)  # type: ignore[operator]
    if bound <= pct:
        return pct, f"limit {pct:g}%"
    return bound, f"limit {bound:.1f}%: {DEFAULT_NOISE_K:g} x run-to-run spread {noise.spread:.2%} from {noise.source}"


def check_growth(
    budget: Budget, current: dict[str, Any], baseline: dict[str, Any], *, history: Sequence[dict[str, Any]] = ()
) -> list[Failure]:
    """Allocator peak, RSS and energy per epoch against the baseline's, each by the larger of
    its budget and its noise (`growth_limit` over `history`, the baseline's record when
    empty). Figures that hold the first epoch (`holds_first_epoch`) are judged only between
    records made with warm kernel caches: compilation and tuning in the first epoch move
    them far more than any change of the steady epochs does (docs/gate.md, "Cold caches").
    An energy per epoch is compared only with one counted over the same epochs."""
    out = []
    for metric, pct in (
        ("vram_peak_mib", budget.memory_growth_pct),
        ("rss_peak_mib", budget.memory_growth_pct),
        ("energy_per_epoch_j", budget.energy_growth_pct),
    ):
        records = history or [baseline]
        if metric == "energy_per_epoch_j":
            if current.get("energy_epochs") != baseline.get("energy_epochs"):
                continue  # one counts the warm-up epoch, the other does not: not the same figure
            records = [r for r in records if r.get("energy_epochs") == baseline.get("energy_epochs")] or [baseline]
        if holds_first_epoch(metric, current) and not warm_caches(current, baseline):
            continue
        now, then = current.get(metric), baseline.get(metric)
        if pct is None or now is None or not then:
            continue
        allowed, why = growth_limit(pct, metric, records)
        limit = then * (1 + allowed / 100)
        if now > limit:
            out.append(Failure(metric, now, limit, then, f"grew {100 * (now / then - 1):.1f}% ({why})"))
    return out


def check_against(
    budget: Budget, current: dict[str, Any], baseline: dict[str, Any], *, history: Sequence[dict[str, Any]] = (),
    timed: Timed = EPOCH_TIME,
) -> list[Failure]:
    """Every limit against a baseline record; `history`: stored records of the case for its noise;
    `timed`: what the time rule reads (a training case's epochs, a timed call's rounds)."""
    return (
        check_time(budget, current, baseline, history=history, timed=timed)
        + check_drops(budget, current, baseline)
        + check_growth(budget, current, baseline, history=history)
    )


# Metrics shown with deltas; +1 means higher is better, -1 lower is better.
DIRECTIONS = {
    "median_epoch_s": -1,
    "accuracy": 1,
    "macro_f1": 1,
    "weighted_f1": 1,
    "vram_peak_mib": -1,
    "rss_peak_mib": -1,
    "energy_per_epoch_j": -1,
}
# The same for a serving record.
SERVING_DIRECTIONS = {"latency_p99_s": -1, "accuracy": 1, "macro_f1": 1, "accuracy_drop": -1, "energy_j_per_1k": -1}

def explain(failure: Failure, current: dict[str, Any], baseline: dict[str, Any], top: int = 5) -> Failure:
    """A time failure with the kernels whose time grew most, where both runs hold a trace."""
    if failure.metric != "epoch_time_ratio" or not current.get("kernel_trace") or not baseline.get("kernel_trace"):
        return failure
    try:
        lines = describe(diff(KernelTable.from_dict(current["kernel_trace"]),
                              KernelTable.from_dict(baseline["kernel_trace"]), top=top))
    except ValueError as exc:
        lines = [f"kernel traces not compared: {exc}"]
    grown = "\n    kernels that grew most:\n      " + "\n      ".join(lines) if lines else "; no kernel grew"
    return replace(failure, detail=failure.detail + grown)


# The metric of DIRECTIONS each kind of Failure concerns (floors and ceilings use the metric's own name).
FAILURE_METRICS = {"epoch_time_ratio": "median_epoch_s", "accuracy_drop": "accuracy", "macro_f1_drop": "macro_f1"}


def failed_metrics(failures: Sequence[Failure]) -> set[str]:
    return {FAILURE_METRICS.get(f.metric, f.metric) for f in failures}


@dataclass(frozen=True)
class Delta:
    """One metric of a case against the baseline's record of it."""

    old: float
    new: float
    change: float | None  # relative; None from a zero
    worse: bool

    def as_dict(self) -> dict[str, Any]:
        return {"old": self.old, "new": self.new, "change": self.change, "worse": self.worse}


def deltas(current: dict[str, Any], baseline: dict[str, Any], directions: dict[str, int] = DIRECTIONS
           ) -> dict[str, Delta]:
    """metric -> its Delta, for the metrics of `directions` both records hold as numbers."""
    out = {}
    for metric, direction in directions.items():
        new, old = current.get(metric), baseline.get(metric)
        if not is_number(new) or not is_number(old):
            continue
        out[metric] = Delta(old, new, new / old - 1 if old else None, (new - old) * direction < 0)
    return out


def is_number(value: object) -> bool:
    """A finite int or float, not a bool: a figure a delta can be taken of."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
