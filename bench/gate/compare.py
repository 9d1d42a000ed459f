"""Baseline compare: read the run named by --benchmark-compare, decide whether it may
gate this run, and judge each case's metrics against it, direction-aware.

pytest-benchmark finds and loads the baseline file (and compares time statistics
with --benchmark-compare-fail); it skips a file it cannot parse with a warning and
keeps no extra_info rules, so the reading and judging of our metrics is here. The
report judges a run against the one before it with these same functions.

Time is judged against the case's own run-to-run noise (`check_time`). A run is
slow throughout or fast throughout far more often than its epochs scatter inside
it, so the epochs of one run are not independent samples of its speed; what varies
between runs is estimated from runs of the case: the stored history (earlier runs
on the same GPU model with the same settings) and the rounds of this run where the
profile times several. A case regressed only when its median epoch ratio exceeds
the larger of the budget's ``time_slower_pct`` and ``time_noise_k`` times that
spread, *and* a one-sided Mann-Whitney U test on the epochs says the slowdown is
real within the run (``time_alpha``). With fewer than ``MIN_NOISE_DOF + 1`` run
medians the spread is unknown, and ``time_noise_unknown_pct`` stands in for it.
``time_hard_ratio`` fails on the median ratio alone.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace
from pathlib import Path
from typing import Any

from scipy.stats import mannwhitneyu

from bench.monitor.trace import KernelTable
from bench.monitor.trace import describe
from bench.monitor.trace import diff

from bench.plugin.budgets import Budget
from bench.plugin.budgets import Failure
from bench.plugin.budgets import InferenceBudget

RECORD_KEY = "loadbench"  # machine_info key and extra_info marker of our runs
# What must match for a stored run to count in a case's noise history.
HISTORY_SETTINGS = ("profile", "epochs", "dataset", "loop", "impl", "optimizer_impl", "precision", "plant",
                    "latency_pin")  # fmt: skip
# What a run made before a setting existed measured: its value then.
SETTING_DEFAULTS: dict[str, Any] = {"latency_pin": False}
MAX_HISTORY = 10  # newest stored runs used for the noise estimate
MIN_NOISE_DOF = 2  # degrees of freedom before a spread counts as known (3 runs, or 2 + 2 rounds)
DEFAULT_NOISE_K = 3.0
DEFAULT_UNKNOWN_NOISE_PCT = 25.0
DEFAULT_ALPHA = 0.01


class BaselineError(ValueError):
    """A baseline run that cannot be read or was not made by mlp-loadbench."""


@dataclass
class Baseline:
    path: Path
    machine_info: dict[str, Any]
    benchmarks: dict[str, dict[str, Any]]  # fullname -> saved benchmark
    gating: bool = True
    reason: str = ""  # why it does not gate
    differs: tuple[str, ...] = ()  # what set it apart: "gpu" and the settings that differ
    notes: list[str] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)  # stored runs for the noise estimate, oldest first

    @property
    def gpu(self) -> str:
        return gpu_name(self.machine_info)


def gpu_name(machine_info: dict[str, Any]) -> str:
    gpu = machine_info.get(RECORD_KEY, {}).get("gpu") or {}
    return str(gpu.get("name") or "no GPU")


def read_run(path: Path) -> dict[str, Any]:
    """A saved pytest-benchmark run made by mlp-loadbench; BaselineError otherwise."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise BaselineError(f"baseline {path}: cannot be read: {exc.strerror or exc}") from None
    try:
        run = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BaselineError(f"baseline {path}: corrupt JSON at line {exc.lineno}: {exc.msg}") from None
    if not isinstance(run, dict) or not isinstance(run.get("benchmarks"), list) or "machine_info" not in run:
        raise BaselineError(f"baseline {path}: not a pytest-benchmark run file (no 'benchmarks' or 'machine_info')")
    if RECORD_KEY not in run["machine_info"]:
        raise BaselineError(
            f"baseline {path}: a pytest-benchmark run, but not made by mlp-loadbench "
            f"(machine_info has no {RECORD_KEY!r}); compare against a run of this suite"
        )
    return run


def make_baseline(path: Path, run: dict[str, Any], machine_info: dict[str, Any]) -> Baseline:
    baseline = Baseline(path, run["machine_info"], {b["fullname"]: b for b in run["benchmarks"]})
    ours, theirs = gpu_name(machine_info), baseline.gpu
    if ours != theirs:
        baseline.gating = False
        baseline.differs = ("gpu",)
        baseline.reason = f"baseline {path.name} was measured on {theirs}, this run on {ours}: shown, not gated"
    return baseline


MACHINE_LINE_MAX = 160  # characters of a machine_info difference line, before it names fewer keys
VALUE_WIDTH = 20  # a setting's value shown in that line, at most


def flat(info: Any, prefix: str = "") -> dict[str, Any]:
    """A nested dict as dotted path -> leaf value (lists, None and empty dicts are leaves)."""
    if not isinstance(info, dict) or (not info and prefix):
        return {prefix: info}
    out: dict[str, Any] = {}
    for key, value in info.items():
        out.update(flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def machine_difference(ours: dict[str, Any], theirs: dict[str, Any]) -> str | None:
    """One short line naming what differs between this run's machine_info and a stored
    run's: the settings with both values (this run's first), then the other keys by
    name (those that decide whether the baseline gates first), as many as fit
    MACHINE_LINE_MAX; None when they are alike. It stands in for
    pytest-benchmark's warning, which prints both dicts whole."""
    mine, saved = flat(ours), flat(theirs)
    differ = sorted(key for key in mine.keys() | saved.keys() if mine.get(key) != saved.get(key))
    if not differ:
        return None
    prefix = f"{RECORD_KEY}.settings."

    def shown(value: Any) -> str:
        text = "unset" if value is None else str(value)
        return text if len(text) <= VALUE_WIDTH else text[: VALUE_WIDTH - 3] + "..."

    def listed(items: list[str], most: int) -> str:
        more = len(items) - most
        return ", ".join(items[:most]) + (f" and {more} more" if more > 0 else "")

    first = {f"{prefix}{key}": rank for rank, key in enumerate(HISTORY_SETTINGS)}  # what decides gating
    first[f"{RECORD_KEY}.gpu.name"] = -1
    differ.sort(key=lambda key: (first.get(key, len(first)), key))
    settings = [f"{key[len(prefix):]} {shown(mine.get(key))} vs {shown(saved.get(key))}"
                for key in differ if key.startswith(prefix)]  # fmt: skip
    others = [key for key in differ if not key.startswith(prefix)]
    # Fewer other keys first, then fewer settings, until the line fits.
    counts = [(len(settings), n) for n in range(len(others), 0, -1)] or [(len(settings), 0)]
    counts += [(n, min(1, len(others))) for n in range(len(settings) - 1, 0, -1)]
    line = ""
    for shown_settings, shown_others in counts:
        parts = [f"settings {listed(settings, shown_settings)}"] if settings else []
        parts += [listed(others, shown_others)] if others else []
        line = f"baseline machine_info differs (this run vs baseline): {'; '.join(parts)}"
        if len(line) <= MACHINE_LINE_MAX:
            break
    return line


def same_measurement(gpu: str, settings: dict[str, Any], other_gpu: str, other_settings: dict[str, Any]) -> bool:
    """Whether two runs measured the same thing: one GPU model and the HISTORY_SETTINGS alike."""
    return gpu == other_gpu and all(setting(settings, key) == setting(other_settings, key) for key in HISTORY_SETTINGS)


def setting(settings: dict[str, Any], key: str) -> Any:
    """A run's setting, with SETTING_DEFAULTS standing in for runs made before it existed."""
    return settings.get(key, SETTING_DEFAULTS.get(key))


def comparable(run: dict[str, Any], baseline_run: dict[str, Any]) -> bool:
    """Whether a stored run measured what the baseline measured: same GPU model and settings."""
    return same_measurement(
        gpu_name(run["machine_info"]), run["machine_info"][RECORD_KEY].get("settings", {}),
        gpu_name(baseline_run["machine_info"]), baseline_run["machine_info"][RECORD_KEY].get("settings", {}),
    )  # fmt: skip


def load_history(baseline_path: Path, baseline_run: dict[str, Any], candidates: Sequence[Path]) -> list[dict[str, Any]]:
    """The stored runs that tell a case's run-to-run noise: the baseline and the newest
    earlier runs beside it or in the storage, on the same GPU model with the same
    settings, oldest first. Files that are not our runs are passed over.

    A long-lived runner's storage holds many runs: files are read newest-modified
    first and reading stops once MAX_HISTORY - 1 earlier comparable runs are found."""
    runs = {baseline_path.resolve(): baseline_run}
    newest_first = sorted(candidates, key=lambda p: p.stat().st_mtime if p.exists() else 0.0, reverse=True)
    for path in newest_first:
        if len(runs) >= MAX_HISTORY:
            break
        if path.resolve() in runs:
            continue
        try:
            run = read_run(path)
        except BaselineError:
            continue
        if comparable(run, baseline_run) and str(run.get("datetime", "")) <= str(baseline_run.get("datetime", "")):
            runs[path.resolve()] = run
    ordered = sorted(runs.values(), key=lambda run: str(run.get("datetime", "")))
    return ordered[-MAX_HISTORY:]


def case_history(runs: Sequence[dict[str, Any]], fullname: str) -> list[dict[str, Any]]:
    """The extra_info records of one case across stored runs."""
    return [b.get("extra_info", {}) for run in runs for b in run["benchmarks"] if b.get("fullname") == fullname]


# ------------------------------------------------------------------------ checks


def time_samples(extra_info: dict[str, Any]) -> list[float]:
    """Per-epoch seconds after each round's first epoch (allocator growth, capture, autotune)."""
    return [s for round_ in extra_info.get("epoch_seconds_by_round", []) for s in round_[1:]]


def round_medians(extra_info: dict[str, Any]) -> list[float]:
    """The median steady epoch of each timed round: one sample of the case's speed per round."""
    return [statistics.median(r[1:]) for r in extra_info.get("epoch_seconds_by_round", []) if len(r) > 1]


@dataclass(frozen=True)
class Noise:
    """A case's run-to-run spread: the standard deviation of log run medians, pooled."""

    spread: float | None  # relative (0.01 = 1%); None when too few runs to tell
    runs: int  # run medians it was estimated from
    source: str  # where they came from, for messages

    @property
    def known(self) -> bool:
        return self.spread is not None


def estimate_noise(
    history: Sequence[dict[str, Any]],
    current: dict[str, Any] | None = None,
    samples: Callable[[dict[str, Any]], list[float]] = round_medians,
) -> Noise:
    """Run-to-run spread of one case from stored runs (`history`, extra_info records) and
    the rounds of `current`. The history's run medians form one group and the current
    run's rounds another; each group's squared log deviations from its own mean are
    pooled, so a run that is simply faster than the history does not widen the spread.
    `samples` reads one figure per round from a record (the median epoch by default;
    the serving cases pass their per-round batch-1 p99).
    """
    groups = [[m for record in history for m in samples(record)]]
    if current is not None:
        groups.append(samples(current))
    squares, dof, runs = 0.0, 0, 0
    for group in groups:
        logs = [math.log(m) for m in group if m > 0]
        runs += len(logs)
        if len(logs) >= 2:
            mean = sum(logs) / len(logs)
            squares += sum((x - mean) ** 2 for x in logs)
            dof += len(logs) - 1
    parts = [f"{len(history)} stored run(s)"] + ([f"{len(groups[1])} round(s) of this run"] if current else [])
    source = " and ".join(parts)
    if dof < MIN_NOISE_DOF:
        return Noise(None, runs, source)
    return Noise(math.sqrt(squares / dof), runs, source)


def time_limit(budget: Budget, noise: Noise) -> tuple[float, str]:
    """The relative slowdown a case may show before it fails, and the rule that set it."""
    pct = budget.time_slower_pct or 0.0
    if noise.known:
        k = budget.time_noise_k if budget.time_noise_k is not None else DEFAULT_NOISE_K
        bound = k * noise.spread  # type: ignore[operator]
        rule = f"{k:g} x run-to-run spread {noise.spread:.2%} from {noise.source}"
    else:
        bound = (budget.time_noise_unknown_pct if budget.time_noise_unknown_pct is not None
                 else DEFAULT_UNKNOWN_NOISE_PCT) / 100  # fmt: skip
        rule = f"noise unknown ({noise.source}; needs {MIN_NOISE_DOF + 1} run medians): assumed {bound:.0%}"
    if pct / 100 >= bound:
        return pct / 100, f"budget {pct:g}% (above {rule})"
    return bound, rule


def check_time(
    budget: Budget, current: dict[str, Any], baseline: dict[str, Any], *, history: Sequence[dict[str, Any]] = ()
) -> list[Failure]:
    """Judge the median epoch against the baseline's; `history` holds stored records of
    the same case (the baseline among them) for its run-to-run noise."""
    now, then = time_samples(current), time_samples(baseline)
    if not now or not then:
        return []
    ratio = statistics.median(now) / statistics.median(then)
    if budget.time_hard_ratio is not None and ratio > budget.time_hard_ratio:
        return [Failure("epoch_time_ratio", ratio, budget.time_hard_ratio, 1.0, "hard ceiling on the median ratio")]
    if budget.time_slower_pct is None:
        return []
    limit, rule = time_limit(budget, estimate_noise(history or [baseline], current))
    if ratio <= 1 + limit:
        return []
    if current.get("throttled") or baseline.get("throttled"):
        return []  # inconclusive: clocks were held down
    significance = _significantly_slower(now, then, budget.time_alpha, "epochs")
    if significance is None:
        return []  # not significant within the run (with n <= 3 per side it never can be)
    return [
        Failure(
            "epoch_time_ratio", ratio, 1 + limit, 1.0,
            f"median epoch {statistics.median(now):.4g} s vs {statistics.median(then):.4g} s; limit from {rule}; "
            f"{significance}",
        )
    ]  # fmt: skip


def _significantly_slower(now: Sequence[float], then: Sequence[float], alpha: float | None, what: str) -> str | None:
    """The one-sided Mann-Whitney U test both gates end with: its verdict in words when
    `now` is significantly larger than `then` at `alpha`, else None."""
    alpha = alpha if alpha is not None else DEFAULT_ALPHA
    p = float(mannwhitneyu(now, then, alternative="greater").pvalue)
    if p >= alpha:
        return None
    return f"Mann-Whitney U p={p:.2g} < {alpha:g} over {len(now)} vs {len(then)} {what}"


def latency_rounds(extra_info: dict[str, Any]) -> list[float]:
    """A serving record's batch-1 p99 per round of calls (seconds)."""
    return [float(v) for v in extra_info.get("latency_p99_by_round_s") or []]


def check_latency(
    budget: InferenceBudget, current: dict[str, Any], baseline: dict[str, Any], *, history: Sequence[dict[str, Any]] = ()
) -> list[Failure]:
    """A served variant's batch-1 p99 against the baseline's, by the epoch-time rule: slower
    than both latency_slower_pct and k x the run-to-run spread of per-round p99s (stored
    runs pooled with this run's rounds), and a one-sided Mann-Whitney U test on the
    rounds' p99s below latency_alpha. Records of different latency modes (a graph
    replay against an eager loop) are not compared."""
    now, then = latency_rounds(current), latency_rounds(baseline)
    p99_now, p99_then = current.get("latency_p99_s"), baseline.get("latency_p99_s")
    if not now or not then or not p99_now or not p99_then or budget.latency_slower_pct is None:
        return []
    if current.get("latency_mode") != baseline.get("latency_mode"):
        return []
    rule = Budget(time_slower_pct=budget.latency_slower_pct, time_noise_k=budget.latency_noise_k,
                  time_noise_unknown_pct=budget.latency_noise_unknown_pct)  # fmt: skip
    limit, why = time_limit(rule, estimate_noise(history or [baseline], current, samples=latency_rounds))
    ratio = p99_now / p99_then
    if ratio <= 1 + limit or current.get("throttled") or baseline.get("throttled"):
        return []
    significance = _significantly_slower(now, then, budget.latency_alpha, "rounds' p99")
    if significance is None:
        return []
    return [
        Failure(
            "latency_p99_ratio", ratio, 1 + limit, 1.0,
            f"batch-1 p99 {p99_now * 1e6:.4g} us vs {p99_then * 1e6:.4g} us ({current.get('latency_mode')}); "
            f"limit from {why}; {significance}",
        )
    ]  # fmt: skip


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
# candidates) and the energy per epoch (the whole timed window over its epochs).
FIRST_EPOCH_METRICS = ("vram_peak_mib", "energy_per_epoch_j")


def warm_caches(current: dict[str, Any], baseline: dict[str, Any]) -> bool:
    """Whether both records' first epochs found Triton's and Inductor's caches warm: an
    empty or cold cache compiles and tunes inside the first epoch, for a time that moves
    with the host's load. Records made before the state was recorded count as warm."""
    return all(record.get("kernel_caches", "warm") == "warm" for record in (current, baseline))


def check_growth(budget: Budget, current: dict[str, Any], baseline: dict[str, Any]) -> list[Failure]:
    """Allocator peak, RSS and energy per epoch against the baseline's. FIRST_EPOCH_METRICS
    are judged only between records made with warm kernel caches: compilation and tuning
    in the first epoch move them far more than any change of the steady epochs does
    (docs/gate.md, "Cold caches")."""
    out = []
    for metric, pct in (
        ("vram_peak_mib", budget.memory_growth_pct),
        ("rss_peak_mib", budget.memory_growth_pct),
        ("energy_per_epoch_j", budget.energy_growth_pct),
    ):
        if metric in FIRST_EPOCH_METRICS and not warm_caches(current, baseline):
            continue
        now, then = current.get(metric), baseline.get(metric)
        if pct is None or now is None or not then:
            continue
        limit = then * (1 + pct / 100)
        if now > limit:
            out.append(Failure(metric, now, limit, then, f"grew {100 * (now / then - 1):.1f}% (limit {pct:g}%)"))
    return out


def check_against(
    budget: Budget, current: dict[str, Any], baseline: dict[str, Any], *, history: Sequence[dict[str, Any]] = ()
) -> list[Failure]:
    """Every limit against a baseline record; `history`: stored records of the case for its noise."""
    return (
        check_time(budget, current, baseline, history=history)
        + check_drops(budget, current, baseline)
        + check_growth(budget, current, baseline)
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


def explain(failure: Failure, current: dict[str, Any], baseline: dict[str, Any], top: int = 5) -> Failure:
    """A time failure with the kernels whose time grew most, where both runs hold a trace."""
    if failure.metric != "epoch_time_ratio" or not current.get("kernel_trace") or not baseline.get("kernel_trace"):
        return failure
    try:
        lines = describe(diff(KernelTable.from_dict(current["kernel_trace"]),
                              KernelTable.from_dict(baseline["kernel_trace"]), top=top))  # fmt: skip
    except ValueError as exc:
        lines = [f"kernel traces not compared: {exc}"]
    grown = "\n    kernels that grew most:\n      " + "\n      ".join(lines) if lines else "; no kernel grew"
    return replace(failure, detail=failure.detail + grown)


# The metric of DIRECTIONS each kind of Failure concerns (floors and ceilings use the metric's own name).
FAILURE_METRICS = {"epoch_time_ratio": "median_epoch_s", "accuracy_drop": "accuracy", "macro_f1_drop": "macro_f1"}


def failed_metrics(failures: Sequence[Failure]) -> set[str]:
    return {FAILURE_METRICS.get(f.metric, f.metric) for f in failures}


def deltas(current: dict[str, Any], baseline: dict[str, Any]) -> dict[str, tuple[float, bool]]:
    """metric -> (relative change, whether it got worse)."""
    out = {}
    for metric, direction in DIRECTIONS.items():
        now, then = current.get(metric), baseline.get(metric)
        if now is None or not then:
            continue
        change = now / then - 1
        out[metric] = (change, change * direction < 0)
    return out
