"""The terminal summary: one table per experiment in the study's form, via tabulate."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tabulate import tabulate

from bench.cases import TITLES

COLUMNS = ("Time(s)", "Accuracy", "F1", "GPU busy", "SM act.", "VRAM MiB", "CPU", "RSS MiB", "Energy J")


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.0f}%"


def _num(value: float | None, fmt: str = ".1f") -> str:
    return "n/a" if value is None else format(value, fmt)


def study_row(label: str, record: dict[str, Any]) -> list[str]:
    """The study's columns for one case record (as stored in extra_info)."""
    norm = record["load"]["normalized"]
    return [
        label,
        _num(record["train_seconds"], ".2f"),
        _num(record["accuracy"], ".3f"),
        _num(record["macro_f1"], ".3f"),
        _pct(norm["gpu_busy"]),
        _pct(norm["sm_activity"]),
        _num(record["vram_peak_mib"]),
        _pct(norm["cpu_process"]),
        _num(record["rss_peak_mib"], ".0f"),
        _num(record["energy_j"], ".0f"),
    ]


def row(entry: dict[str, Any]) -> list[str]:
    cells = study_row(str(entry["case"].value), entry["record"])
    if entry["deltas"] is not None:
        d = entry["deltas"]
        cells.append(" ".join(
            f"{name.split('_')[0]} {change:+.1%}{'!' if worse else ''}" for name, (change, worse) in d.items()
        ))  # fmt: skip
    else:
        cells.append("")
    cells.append("FAILED: " + ", ".join(f.metric for f in entry["failures"]) if entry["failures"] else "ok")
    return cells


def render_summary(entries: Iterable[dict[str, Any]], messages: Iterable[str]) -> list[str]:
    entries = list(entries)
    lines = [f"baseline: {m}" for m in messages]
    by_experiment: dict[str, list[dict[str, Any]]] = {}
    for entry in entries:
        by_experiment.setdefault(entry["case"].experiment, []).append(entry)
    for experiment, group in by_experiment.items():
        rows = [row(e) for e in group]
        headers = [TITLES.get(experiment, experiment), *COLUMNS, "vs baseline", "budgets"]
        if all(e["deltas"] is None for e in group):  # not comparing: drop the empty column
            rows = [r[:-2] + r[-1:] for r in rows]
            headers.remove("vs baseline")
        lines += ["", tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)]
    reasons = {what: why for e in entries for what, why in e["record"]["load"]["unavailable"].items()}
    if reasons:
        lines += [""] + [f"n/a: {what}: {why}" for what, why in reasons.items()]
    return lines
