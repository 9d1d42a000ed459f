"""The self-test's run files: their names (aa-NN, plantX-NN), reading them into a
Campaign, and the checks that every run measured the same thing."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

from bench.gate.runs import HISTORY_SETTINGS
from bench.gate.runs import PARTIAL_SUFFIX
from bench.gate.record import RECORD_KEY
from bench.gate.runs import BaselineError
from bench.gate.runs import gpu_name
from bench.gate.runs import read_run
from bench.gate.timing import time_samples


AA_NAME = re.compile(r"^aa-(\d+)\.json$")
PLANT_NAME = re.compile(r"^plant(\d+(?:\.\d+)?)-(\d+)\.json$")


class SelftestError(Exception):
    """The self-test cannot go on; the message is one line that says why."""


@dataclass(frozen=True)
class Campaign:
    """The run files of one self-test, each as (file name, run dict), in run order."""

    aa: list[tuple[str, dict[str, Any]]]
    planted: dict[float, list[tuple[str, dict[str, Any]]]] = field(default_factory=dict)  # percentage -> runs

    @property
    def aa_runs(self) -> list[dict[str, Any]]:
        return [run for _, run in self.aa]

    @property
    def planted_runs(self) -> dict[float, list[dict[str, Any]]]:
        return {pct: [run for _, run in runs] for pct, runs in sorted(self.planted.items())}

    def labelled(self) -> list[tuple[str, dict[str, Any]]]:
        return self.aa + [entry for pct in sorted(self.planted) for entry in self.planted[pct]]


def run_name(plant_pct: float | None, index: int) -> str:
    """aa-01, plant05-01: the stem of a run's files."""
    return f"aa-{index:02d}" if plant_pct is None else f"plant{plant_pct:02g}-{index:02d}"


def classify(name: str) -> tuple[float | None, int] | None:
    """(planted percentage or None for A/A, run number) from a run file's name; None: not one."""
    if found := AA_NAME.match(name):
        return None, int(found.group(1))
    if found := PLANT_NAME.match(name):
        return float(found.group(1)), int(found.group(2))
    return None


def run_files(folder: Path) -> list[Path]:
    """The self-test's run files in `folder`; other files there (the outputs, logs) are
    passed over, but a JSON named like a run file that does not parse as one is an error."""
    if not folder.is_dir():
        raise SelftestError(f"{folder}: no such directory")
    # run.partial.json: the cases a killed run finished (bench/plugin/partial.py); the
    # campaign runs that run again whole
    paths = sorted(p for p in folder.glob("*.json") if not p.name.endswith(PARTIAL_SUFFIX))
    for path in paths:
        if path.name.startswith(("aa-", "plant")) and classify(path.name) is None:
            raise SelftestError(f"{path}: not a self-test run name; use aa-NN.json or plantX-NN.json "
                                "(X the percentage)")
    found = [path for path in paths if classify(path.name) is not None]
    if not found:
        raise SelftestError(f"{folder}: no self-test run files (aa-NN.json, plantX-NN.json)")
    return found


def load_campaign(paths: Sequence[Path]) -> Campaign:
    """Read the run files named aa-NN / plantX-NN; SelftestError on anything unusable."""
    aa: list[tuple[int, str, dict[str, Any]]] = []
    planted: dict[float, list[tuple[int, str, dict[str, Any]]]] = {}
    for path in paths:
        kind = classify(path.name)
        if kind is None:
            raise SelftestError(f"{path}: not a self-test run name; use aa-NN.json or plantX-NN.json")
        try:
            run = read_run(path)
        except BaselineError as exc:
            raise SelftestError(str(exc).replace("baseline ", "run ", 1)) from None
        pct, index = kind
        (aa if pct is None else planted.setdefault(pct, [])).append((index, path.name, run))
    if not aa:
        where = f" in {paths[0].parent}" if paths else ""
        raise SelftestError(f"no A/A run files (aa-NN.json){where}: the planted runs need them as baseline")

    def ordered(entries: list[tuple[int, str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
        entries = sorted(entries, key=lambda entry: entry[0])  # by number: run order, also past 99
        for (index, one, _), (again, other, _) in zip(entries, entries[1:]):
            if index == again:
                raise SelftestError(f"{one} and {other} are both run {index}: keep one")
        return [(name, run) for _, name, run in entries]

    campaign = Campaign(ordered(aa), {pct: ordered(runs) for pct, runs in planted.items()})
    check_campaign(campaign)
    return campaign


# ------------------------------------------------------------------------ checks


def settings(run: dict[str, Any]) -> dict[str, Any]:
    return run["machine_info"][RECORD_KEY].get("settings", {}) or {}


def plant_pct(plant: object) -> float | None:
    """The percentage of a recorded plant setting ('5%:gpu' -> 5.0); None without one."""
    if not plant:
        return None
    try:
        return float(str(plant).partition("%")[0])
    except ValueError:
        return math.nan  # recorded, but not as --plant-slowdown writes it: never equal to a name's X


def timed_cases(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """fullname -> extra_info of the benchmarks that are timed training cases."""
    return {
        b["fullname"]: b["extra_info"]
        for b in run["benchmarks"]
        if "case" in b.get("extra_info", {}) and time_samples(b["extra_info"])
    }


def check_campaign(campaign: Campaign) -> None:
    """One GPU model and one set of settings, the plant the names say, the same cases."""
    if len(campaign.aa) < 2:
        raise SelftestError(f"{len(campaign.aa)} A/A run: the false-alarm rate needs at least 2 (--runs 2)")
    first_name, first = campaign.aa[0]
    gpu, base = gpu_name(first["machine_info"]), settings(first)
    keys = [key for key in HISTORY_SETTINGS if key != "plant"]  # the plant differs by design
    for name, run in campaign.labelled():
        if gpu_name(run["machine_info"]) != gpu:
            raise SelftestError(f"{name}: measured on {gpu_name(run['machine_info'])}, {first_name} on {gpu}: "
                                "a self-test's runs must come from one GPU model")
        ours = settings(run)
        differ = ", ".join(f"{k} {ours.get(k)!r} vs {base.get(k)!r}" for k in keys if ours.get(k) != base.get(k))
        if differ:
            raise SelftestError(f"{name}: settings differ from {first_name}'s: {differ}")
    for name, run in campaign.aa:
        if settings(run).get("plant"):
            raise SelftestError(f"{name}: ran with --plant-slowdown {settings(run)['plant']}; A/A runs run without one")
    for pct, runs in campaign.planted.items():
        for name, run in runs:
            recorded = settings(run).get("plant")
            if plant_pct(recorded) != pct:
                what = f"--plant-slowdown {recorded}" if recorded else "no planted slowdown"
                raise SelftestError(f"{name}: ran with {what}, but its name says {pct:g}%")
    if not any(timed_cases(run) for _, run in campaign.labelled()):
        raise SelftestError(f"no timed training cases in {campaign.aa[0][0]} or the other runs")


def missing_cases(campaign: Campaign) -> list[str]:
    """Runs that lack cases others hold (a case that crashed in one run): each case is
    judged on the runs that hold it, and the outputs say which runs lacked what."""
    every = [(name, set(timed_cases(run))) for name, run in campaign.labelled()]
    union = set().union(*(cases for _, cases in every))
    notes = []
    for name, cases in every:
        missing = sorted(union - cases)
        if missing:
            shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
            notes.append(f"{name}: lacks {len(missing)} case(s) that other runs hold: {shown}; "
                         "judged on the runs that hold them")
    return notes
