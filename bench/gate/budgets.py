"""Budgets: a TOML file of floors, ceilings and baseline limits, resolved per case.

Tables, each optional, later ones overriding earlier ones: ``[defaults]``,
``[experiments.<name>]``, ``[cases."<case id>"]``, the same under
``[profiles.<profile>]``, and all of that again under ``[datasets.<dataset>]``. Floors
and ceilings (accuracy, F1, memory, energy) hold only for the data they were set on, so
they live under ``[datasets.<name>]``; accuracy and F1 floors also hold only for the
profile's epochs. Limits against a baseline (time, drops, growth) apply to any data.
Serving has its own ``[inference]`` tables at the same places.

Each check is a pure function of the case's record returning a `Failure` or None.
Anything the file says that is not understood (a key, table, experiment, case id or
profile that does not exist, a value of the wrong type) is a start-up error. The full
layout: docs/selftest.md and docs/reference/budgets.md.
"""

from __future__ import annotations

import difflib
import statistics
import sys
from dataclasses import dataclass
from dataclasses import fields
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from kernels.ground.cases import CASE_IDS
from kernels.ground.cases import EXPERIMENTS
from bench.gate.profiles import PROFILES
from kernels.ground.axes import VARIANT_NAMES as VARIANTS


class BudgetError(ValueError):
    """A budgets file that cannot be used; the message names the file, table and key."""


@dataclass(frozen=True)
class Budget:
    """The limits that apply to one case; None means no limit."""

    # floors on the trained model
    accuracy_min: float | None = None
    macro_f1_min: float | None = None
    # ceilings on load
    vram_peak_mib_max: float | None = None  # torch allocator peak, not NVML "used"
    rss_peak_mib_max: float | None = None
    energy_per_epoch_j_max: float | None = None  # where the GPU has an energy counter
    # limits against a baseline run (--benchmark-compare)
    time_slower_pct: float | None = None  # median epoch time, when also beyond noise and significant
    time_noise_k: float | None = None  # how many run-to-run spreads a slowdown must exceed (default 3)
    time_noise_unknown_pct: float | None = None  # the spread assumed without history (default 25)
    time_alpha: float | None = None  # one-sided Mann-Whitney U level
    time_hard_ratio: float | None = None  # fails on effect size alone, however few samples
    accuracy_drop_max: float | None = None  # absolute
    macro_f1_drop_max: float | None = None
    memory_growth_pct: float | None = None  # allocator peak and RSS
    energy_growth_pct: float | None = None


_RANGES = {  # key: (low, high) accepted
    "accuracy_min": (0.0, 1.0),
    "macro_f1_min": (0.0, 1.0),
    "time_alpha": (1e-9, 0.5),
    "accuracy_drop_max": (0.0, 1.0),
    "macro_f1_drop_max": (0.0, 1.0),
    "time_hard_ratio": (1.0, 1e6),
    "time_noise_k": (0.0, 100.0),
}
KEYS = tuple(f.name for f in fields(Budget))


@dataclass(frozen=True)
class InferenceBudget:
    """The limits on one served variant of one case; None means no limit."""

    accuracy_drop_vs_fp32_max: float | None = None  # the fp32 model's accuracy minus this variant's (absolute)
    latency_p99_us_max: float | None = None  # batch-1 p99 (graph replay where there is one), microseconds
    throughput_4096_min: float | None = None  # samples/s at batch 4096
    # against a baseline run: the batch-1 p99, judged like epoch time (noise and significance)
    latency_slower_pct: float | None = None
    latency_noise_k: float | None = None
    latency_noise_unknown_pct: float | None = None
    latency_alpha: float | None = None
    # A variant whose drop is a measured trade-off (prune-90): no fixed drop limit; its drop
    # is recorded and may grow by at most accuracy_drop_growth_max over the baseline run's.
    trade_off: bool | None = None
    accuracy_drop_growth_max: float | None = None


INFERENCE_KEYS = tuple(f.name for f in fields(InferenceBudget))
INFERENCE_DATASET_KEYS = ("latency_p99_us_max", "throughput_4096_min")
_INFERENCE_RANGES = {
    "accuracy_drop_vs_fp32_max": (0.0, 1.0),
    "accuracy_drop_growth_max": (0.0, 1.0),
    "latency_alpha": (1e-9, 0.5),
    "latency_noise_k": (0.0, 100.0),
}
BOOLEAN_KEYS = ("trade_off",)
# Floors and ceilings: set for one dataset, so allowed only under [datasets.<name>].
DATASET_KEYS = ("accuracy_min", "macro_f1_min", "vram_peak_mib_max", "rss_peak_mib_max", "energy_per_epoch_j_max")
LEVELS = ("defaults", "experiments", "cases")


def dataset_key(dataset: str) -> str:
    """How a budgets file names a dataset: 'synthetic', or a CSV's file name."""
    return dataset if dataset == "synthetic" else Path(dataset).name


@dataclass(frozen=True)
class Failure:
    """One broken limit, with the message the failing test shows."""

    metric: str
    value: float
    limit: float
    baseline: float | None = None
    detail: str = ""

    @property
    def message(self) -> str:
        base = f" (baseline {self.baseline:.6g})" if self.baseline is not None else ""
        extra = f"; {self.detail}" if self.detail else ""
        return f"{self.metric} = {self.value:.6g} breaks its limit {self.limit:.6g}{base}{extra}"


class Budgets:
    """A validated budgets file."""

    def __init__(self, tables: dict[str, Any], path: Path) -> None:
        self.tables = tables
        self.path = path

    @classmethod
    def load(cls, path: str | Path) -> Budgets:
        path = Path(path)
        if path.is_dir():
            raise BudgetError(f"{path}: is a directory; give the budgets TOML file")
        if not path.is_file():
            raise BudgetError(f"{path}: budgets file not found")
        try:
            tables = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise BudgetError(f"{path}: not valid TOML: {exc}") from None
        _validate(tables, path)
        return cls(tables, path)

    def resolve(self, profile: str, experiment: str, case_id: str, dataset: str = "synthetic") -> Budget:
        merged: dict[str, float] = {}
        for root in (self.tables, self.tables.get("datasets", {}).get(dataset_key(dataset), {})):
            for scope in (root, root.get("profiles", {}).get(profile, {})):
                merged.update(scope.get("defaults", {}))
                merged.update(scope.get("experiments", {}).get(experiment, {}))
                merged.update(scope.get("cases", {}).get(case_id, {}))
        return Budget(**{k: float(v) for k, v in merged.items()})

    def resolve_inference(self, profile: str, variant: str, case_id: str,
                          dataset: str = "synthetic") -> InferenceBudget:
        """The serving limits of one variant of one case: defaults < variants < cases < one
        variant of one case (``cases."id".variants."V"``) at each scope, scopes in the order
        `resolve` uses."""
        merged: dict[str, float] = {}
        for root in (self.tables, self.tables.get("datasets", {}).get(dataset_key(dataset), {})):
            for scope in (root, root.get("profiles", {}).get(profile, {})):
                tables = scope.get("inference", {})
                merged.update(tables.get("defaults", {}))
                merged.update(tables.get("variants", {}).get(variant, {}))
                case = tables.get("cases", {}).get(case_id, {})
                merged.update({k: v for k, v in case.items() if k != "variants"})
                merged.update(case.get("variants", {}).get(variant, {}))
        return InferenceBudget(**{k: v if isinstance(v, bool) else float(v) for k, v in merged.items()})

    def datasets(self) -> list[str]:
        """The datasets this file sets floors and ceilings for."""
        return sorted(self.tables.get("datasets", {}))

    def covers(self, dataset: str) -> bool:
        return dataset_key(dataset) in self.tables.get("datasets", {})


def _bare(key: str) -> str:
    """A TOML key as it is written in a table header: quoted unless it is a bare key."""
    return key if key.replace("_", "").isalnum() else f'"{key}"'


def _validate(tables: dict[str, Any], path: Path) -> None:
    def fail(where: str, problem: str) -> None:
        raise BudgetError(f"{path}: [{where}]: {problem}")

    def hint(name: str, allowed: object) -> str:
        close = difflib.get_close_matches(name, list(allowed), n=1)  # type: ignore[arg-type]
        return f" (did you mean {close[0]!r}?)" if close else ""

    def check_limits(where: str, table: object, in_dataset: bool, serving: bool = False) -> None:
        keys, ranges, dataset_keys = (
            (INFERENCE_KEYS, _INFERENCE_RANGES, INFERENCE_DATASET_KEYS) if serving else (KEYS, _RANGES, DATASET_KEYS)
        )
        if not isinstance(table, dict):
            fail(where, "must be a table of limits")
        for key, value in table.items():  # type: ignore[union-attr]
            if key not in keys:
                fail(where, f"unknown key {key!r}{hint(key, keys)}; known keys: {', '.join(keys)}")
            if key in BOOLEAN_KEYS:
                if not isinstance(value, bool):
                    fail(where, f"{key} = {value!r} must be true or false")
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                fail(where, f"{key} = {value!r} must be a number")
            low, high = ranges.get(key, (0.0, float("inf")))
            if not low <= value <= high:
                fail(where, f"{key} = {value!r} must be between {low:g} and {high:g}")
            if key in dataset_keys and not in_dataset:
                fail(where, f"{key} is a floor or ceiling, which holds for one dataset: set it under "
                            f"[datasets.synthetic.{where}] (the embedded data) or [datasets.\"FILE.csv\".{where}]")

    def check_variants(where: str, table: object, in_dataset: bool) -> None:
        if not isinstance(table, dict):
            fail(where, "must be a table")
        for variant, limits in table.items():  # type: ignore[union-attr]
            if variant not in VARIANTS:
                fail(f"{where}.{_bare(variant)}", f"unknown variant {variant!r}{hint(variant, VARIANTS)}")
            check_limits(f"{where}.{_bare(variant)}", limits, in_dataset, serving=True)

    def check_inference(where: str, table: object, in_dataset: bool) -> None:
        if not isinstance(table, dict):
            fail(where, "must be a table")
        for name, inner in table.items():  # type: ignore[union-attr]
            if name == "defaults":
                check_limits(f"{where}.defaults", inner, in_dataset, serving=True)
            elif name in ("variants", "cases"):
                allowed = VARIANTS if name == "variants" else CASE_IDS
                if not isinstance(inner, dict):
                    fail(f"{where}.{name}", "must be a table")
                for key, limits in inner.items():
                    if key not in allowed:
                        what = "variant" if name == "variants" else "case id"
                        fail(f"{where}.{name}.{_bare(key)}", f"unknown {what} {key!r}{hint(key, allowed)}")
                    if name == "cases" and isinstance(limits, dict) and "variants" in limits:
                        limits = dict(limits)
                        check_variants(f"{where}.{name}.{_bare(key)}.variants", limits.pop("variants"), in_dataset)
                    check_limits(f"{where}.{name}.{_bare(key)}", limits, in_dataset, serving=True)
            else:
                fail(f"{where}.{_bare(name)}",
                     f"unknown table {name!r}{hint(name, ('defaults', 'variants', 'cases'))}; "
                     "expected one of defaults, variants, cases")

    def check_scope(prefix: str, scope: dict[str, Any], allow_profiles: bool, in_dataset: bool) -> None:
        for name, table in scope.items():
            where = f"{prefix}{name}"
            if name == "defaults":
                check_limits(where, table, in_dataset)
            elif name in ("experiments", "cases"):
                allowed = EXPERIMENTS if name == "experiments" else CASE_IDS
                if not isinstance(table, dict):
                    fail(where, "must be a table")
                for key, limits in table.items():
                    inner = f"{where}.{_bare(key)}"
                    if key not in allowed:
                        what = "experiment" if name == "experiments" else "case id"
                        fail(inner, f"unknown {what} {key!r}{hint(key, allowed)}")
                    check_limits(inner, limits, in_dataset)
            elif name == "inference":
                check_inference(where, table, in_dataset)
            elif name == "profiles" and allow_profiles:
                if not isinstance(table, dict):
                    fail(where, "must be a table")
                for profile, inner in table.items():
                    if profile not in PROFILES:
                        fail(f"{where}.{profile}", f"unknown profile {profile!r}{hint(profile, PROFILES)}")
                    if not isinstance(inner, dict):
                        fail(f"{where}.{profile}", "must be a table")
                    check_scope(f"{prefix}profiles.{profile}.", inner, allow_profiles=False, in_dataset=in_dataset)
            elif name == "datasets" and not in_dataset and not prefix:
                if not isinstance(table, dict):
                    fail(where, "must be a table")
                for dataset, inner in table.items():
                    if not isinstance(inner, dict):
                        fail(f"{where}.{_bare(dataset)}", "must be a table")
                    check_scope(f"datasets.{_bare(dataset)}.", inner, allow_profiles=True, in_dataset=True)
            else:
                allowed = (LEVELS + ("inference",) + (("profiles",) if allow_profiles else ())
                           + (("datasets",) if not prefix else ()))
                fail(where, f"unknown table {name!r}{hint(name, allowed)}; expected one of {', '.join(allowed)}")

    check_scope("", tables, allow_profiles=True, in_dataset=False)


# ------------------------------------------------------------------------ checks


def floors_unjudged(profile: str, epochs: int | None) -> str | None:
    """Why the accuracy and F1 floors of `profile` do not judge a run that trained
    `epochs` epochs: they were set for the profile's own epoch count, and a shorter or
    longer training reaches another accuracy. None where they judge it (the profile's
    own count, or a profile or count not known)."""
    own = PROFILES.get(profile)
    if own is None or epochs is None or int(epochs) == own.epochs:
        return None
    return f"floors set for {own.epochs} epochs of the {profile} profile; this run trained {epochs}"


@dataclass(frozen=True)
class BudgetCheck:
    """The floors and ceilings of one case record: what broke, and why the quality floors
    were not judged (None where they were, or where the budget sets none)."""

    failures: tuple[Failure, ...]
    floors_skipped: str | None = None


def check_budget(budget: Budget, record: dict[str, Any], *, profile: str, epochs: int | None) -> BudgetCheck:
    """Floors and ceilings of one case record made with `profile` over `epochs` epochs:
    the accuracy and F1 floors only where the run trained the profile's own epochs
    (floors_unjudged); the load ceilings, which no epoch count moves, always."""
    skipped = floors_unjudged(profile, epochs)
    if budget.accuracy_min is None and budget.macro_f1_min is None:
        skipped = None  # nothing left unjudged
    floors = [] if skipped else check_floors(budget, record)
    return BudgetCheck((*floors, *check_ceilings(budget, record)), skipped)


def check_floors(budget: Budget, record: dict[str, Any]) -> list[Failure]:
    out = []
    for metric, limit in (("accuracy", budget.accuracy_min), ("macro_f1", budget.macro_f1_min)):
        if limit is not None and record[metric] < limit:
            out.append(Failure(metric, record[metric], limit, detail="below its floor"))
    return out


def check_ceilings(budget: Budget, record: dict[str, Any]) -> list[Failure]:
    out = []
    for metric, limit in (
        ("vram_peak_mib", budget.vram_peak_mib_max),
        ("rss_peak_mib", budget.rss_peak_mib_max),
        ("energy_per_epoch_j", budget.energy_per_epoch_j_max),
    ):
        value = record.get(metric)
        if limit is not None and value is not None and value > limit:
            out.append(Failure(metric, value, limit, detail="above its ceiling"))
    return out


def judged_p99(record: dict[str, Any]) -> tuple[float | None, str]:
    """The p99 a ceiling judges, and what it is: the median of the rounds' p99s where
    the record has them, else the p99 of all calls. A host stall (another tenant, a
    collector) can fill one round's tail, and the p99 of all calls with it, while the
    code's latency is unchanged; a slower forward moves every round."""
    rounds = [r for r in (record.get("latency_p99_by_round_s") or []) if r is not None]
    if rounds:
        return statistics.median(rounds), f"p99 (median of {len(rounds)} rounds' p99)"
    return record.get("latency_p99_s"), "p99"


def check_inference(budget: InferenceBudget, record: dict[str, Any]) -> list[Failure]:
    """A served variant's accuracy drop against its fp32 model, its batch-1 p99 and its
    throughput at batch 4096; a figure not measured (None) is not judged."""
    out = []
    drop = record.get("accuracy_drop")
    if (not budget.trade_off and budget.accuracy_drop_vs_fp32_max is not None and drop is not None
            and drop > budget.accuracy_drop_vs_fp32_max):
        out.append(Failure("accuracy_drop_vs_fp32", drop, budget.accuracy_drop_vs_fp32_max, None,
                           f"accuracy {record.get('accuracy', float('nan')):.4f} against the fp32 model's"))
    p99, what = judged_p99(record)
    if budget.latency_p99_us_max is not None and p99 is not None and p99 * 1e6 > budget.latency_p99_us_max:
        out.append(Failure("latency_p99_us", p99 * 1e6, budget.latency_p99_us_max, None,
                           f"batch-1 {what} ({record.get('latency_mode')}) above its ceiling"))
    throughput = (record.get("throughput") or {}).get("4096")
    if budget.throughput_4096_min is not None and throughput is not None and throughput < budget.throughput_4096_min:
        out.append(Failure("throughput_4096", throughput, budget.throughput_4096_min, None,
                           "samples/s at batch 4096 below its floor"))
    return out


def check_drop_growth(budget: InferenceBudget, record: dict[str, Any], baseline: dict[str, Any]) -> list[Failure]:
    """A trade-off variant's accuracy drop against the baseline run's drop of the same
    variant and case: it may grow by at most accuracy_drop_growth_max (absolute)."""
    drop, then = record.get("accuracy_drop"), baseline.get("accuracy_drop")
    limit = budget.accuracy_drop_growth_max
    if not budget.trade_off or limit is None or drop is None or then is None:
        return []
    if drop - then <= limit:
        return []
    return [Failure("accuracy_drop_growth", drop - then, limit, then,
                    f"drop against the fp32 model {drop:.4f} now, {then:.4f} in the baseline")]
