"""Budgets: a TOML file of floors, ceilings and baseline limits, resolved per case.

Layout (every table optional; later ones override earlier ones):

    [defaults]                      every profile, every case
    [experiments.<name>]            e.g. [experiments.opt]
    [cases."<case id>"]             e.g. [cases."opt-rmsprop"]
    [profiles.<profile>.defaults]   then .experiments.<name>, then .cases."<id>"

Each check is a pure function of the case's record and returns a `Failure` (or
None); the fixture raises them inside the test, so exactly that test fails and its
record is still saved. Anything the file says that is not understood is a start-up
error: a key, table, experiment, case id or profile that does not exist, or a value
of the wrong type.
"""

from __future__ import annotations

import difflib
import sys
from dataclasses import dataclass
from dataclasses import fields
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from bench.cases import CASE_IDS
from bench.cases import EXPERIMENTS
from bench.plugin.options import PROFILES


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
    time_slower_pct: float | None = None  # median epoch time, when also significant
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
}
KEYS = tuple(f.name for f in fields(Budget))
LEVELS = ("defaults", "experiments", "cases")


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
        if not path.is_file():
            raise BudgetError(f"{path}: budgets file not found")
        try:
            tables = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise BudgetError(f"{path}: not valid TOML: {exc}") from None
        _validate(tables, path)
        return cls(tables, path)

    def resolve(self, profile: str, experiment: str, case_id: str) -> Budget:
        merged: dict[str, float] = {}
        for scope in (self.tables, self.tables.get("profiles", {}).get(profile, {})):
            merged.update(scope.get("defaults", {}))
            merged.update(scope.get("experiments", {}).get(experiment, {}))
            merged.update(scope.get("cases", {}).get(case_id, {}))
        return Budget(**{k: float(v) for k, v in merged.items()})


def _validate(tables: dict[str, Any], path: Path) -> None:
    def fail(where: str, problem: str) -> None:
        raise BudgetError(f"{path}: [{where}]: {problem}")

    def hint(name: str, allowed: object) -> str:
        close = difflib.get_close_matches(name, list(allowed), n=1)  # type: ignore[arg-type]
        return f" (did you mean {close[0]!r}?)" if close else ""

    def check_limits(where: str, table: object) -> None:
        if not isinstance(table, dict):
            fail(where, "must be a table of limits")
        for key, value in table.items():  # type: ignore[union-attr]
            if key not in KEYS:
                fail(where, f"unknown key {key!r}{hint(key, KEYS)}; known keys: {', '.join(KEYS)}")
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                fail(where, f"{key} = {value!r} must be a number")
            low, high = _RANGES.get(key, (0.0, float("inf")))
            if not low <= value <= high:
                fail(where, f"{key} = {value!r} must be between {low:g} and {high:g}")

    def check_scope(prefix: str, scope: dict[str, Any], allow_profiles: bool) -> None:
        for name, table in scope.items():
            where = f"{prefix}{name}"
            if name == "defaults":
                check_limits(where, table)
            elif name in ("experiments", "cases"):
                allowed = EXPERIMENTS if name == "experiments" else CASE_IDS
                if not isinstance(table, dict):
                    fail(where, "must be a table")
                for key, limits in table.items():
                    if key not in allowed:
                        what = "experiment" if name == "experiments" else "case id"
                        fail(f"{where}.{key}", f"unknown {what} {key!r}{hint(key, allowed)}")
                    check_limits(f"{where}.{key}", limits)
            elif name == "profiles" and allow_profiles:
                if not isinstance(table, dict):
                    fail(where, "must be a table")
                for profile, inner in table.items():
                    if profile not in PROFILES:
                        fail(f"{where}.{profile}", f"unknown profile {profile!r}{hint(profile, PROFILES)}")
                    if not isinstance(inner, dict):
                        fail(f"{where}.{profile}", "must be a table")
                    check_scope(f"profiles.{profile}.", inner, allow_profiles=False)
            else:
                allowed = LEVELS + (("profiles",) if allow_profiles else ())
                fail(where, f"unknown table {name!r}{hint(name, allowed)}; expected one of {', '.join(allowed)}")

    check_scope("", tables, allow_profiles=True)


# ------------------------------------------------------------------------ checks


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
