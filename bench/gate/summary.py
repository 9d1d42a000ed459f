"""The terminal summary: one table per experiment in the study's form, via tabulate."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tabulate import tabulate

from kernels.ground.cases import TITLES
from kernels.ground.cases import study_order
from bench.gate.compare import failed_metrics

COLUMNS = ("Time(s)", "1st epoch s", "Accuracy", "F1", "GPU busy", "SM act.", "VRAM MiB", "CPU", "RSS MiB", "Energy J")


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
        _num(record.get("first_epoch_s"), ".2f"),
        _num(record["accuracy"], ".3f"),
        _num(record["macro_f1"], ".3f"),
        _pct(norm["gpu_busy"]),
        _pct(norm["sm_activity"]),
        _num(record["vram_peak_mib"]),
        _pct(norm["cpu_process"]),
        _num(record["rss_peak_mib"], ".0f"),
        _num(record["energy_j"], ".0f"),
    ]


BOUND_COLUMNS = ("kernels/step", "kernel us/step", "step us", "compute us", "memory us", "launch us", "nearest",
                 "floor/step")


def bound_row(label: str, record: dict[str, Any]) -> list[str] | None:
    """A case's step beside its three floors (model/bound.py), or None without a bound."""
    bound = record.get("bound")
    if not bound:
        return None
    return [
        label,
        _num(bound["kernels_per_step"], ".0f"),
        _num(bound["device_us_per_step"], ".0f"),
        _num(bound["step_us"], ".0f"),
        _num(bound["compute_us"], ".1f"),
        _num(bound["memory_us"], ".1f"),
        _num(bound["launch_us"], ".1f"),
        bound["nearest"],
        _pct(bound["floor_fraction"]),
    ]


def bound_table(title: str, labelled: Iterable[tuple[str, dict[str, Any]]]) -> list[str]:
    """The bound table of the (label, record) pairs that hold a bound; nothing when none does."""
    rows = [r for label, record in labelled if (r := bound_row(label, record)) is not None]
    if not rows:
        return []
    return ["", tabulate(rows, headers=[title, *BOUND_COLUMNS], tablefmt="github", disable_numparse=True)]


def bound_note(records: Iterable[dict[str, Any]]) -> list[str]:
    """What the bound tables' columns are, once; nothing when no record holds a bound."""
    devices = {record["bound"]["device"] for record in records if record.get("bound")}
    if not devices:
        return []
    kernel = "kernel" if devices == {"cuda"} else "kernel (aten op on a CPU)"
    return ["", f"step bound: per optimizer step, {kernel} count and time beside three floors: FLOPs at the "
                "measured matmul ceiling; parameter, gradient and optimizer-state bytes at the measured copy "
                "bandwidth; kernels x the measured per-kernel gap of a CUDA graph. nearest: the largest floor"]


def row(entry: dict[str, Any]) -> list[str]:
    cells = study_row(str(entry["case"].value), entry["record"])
    if entry["deltas"] is not None:
        broke = failed_metrics(entry["failures"])  # '!' marks what broke a limit, not every worse digit
        cells.append(" ".join(
            f"{name.split('_')[0]} {delta.change:+.1%}{'!' if name in broke else ''}"
            for name, delta in entry["deltas"].items() if delta.change is not None
        ))
    else:
        cells.append("")
    cells.append("FAILED: " + ", ".join(f.metric for f in entry["failures"]) if entry["failures"] else "ok")
    return cells


def noise_lines(entries: list[dict[str, Any]]) -> list[str]:
    """How the time gate knew each compared case's run-to-run noise."""
    noises = [(e["case"].id, e["noise"]) for e in entries if e.get("noise") is not None]
    if not noises:
        return []
    known = [(case, n) for case, n in noises if n.known]
    unknown = [case for case, n in noises if not n.known]
    lines = [""]
    if known:
        spreads = sorted(n.spread for _, n in known)
        lines.append(
            f"time gate: {len(known)} case(s) judged against their run-to-run spread "
            f"({spreads[0]:.2%} to {spreads[-1]:.2%}; from {known[0][1].source})"
        )
    if unknown:
        lines.append(
            f"time gate: noise bound unknown for {len(unknown)} case(s) ({', '.join(unknown[:6])}"
            f"{', ...' if len(unknown) > 6 else ''}): fewer than 3 stored runs on this GPU, so a conservative "
            "bound (time_noise_unknown_pct) applies; store more runs or run python -m bench.tools.selftest"
        )
    return lines


def floors_lines(entries: list[dict[str, Any]]) -> list[str]:
    """One line saying for how many cases the accuracy and F1 floors were not judged, and
    why (entries carry the reason as "floors_skipped"); nothing where none was skipped."""
    skipped = [(e["case"].id, e["floors_skipped"]) for e in entries if e.get("floors_skipped")]
    if not skipped:
        return []
    reasons = "; ".join(dict.fromkeys(why for _, why in skipped))
    return ["", f"floors: accuracy and F1 floors not judged for {len(skipped)} case(s): {reasons}; "
                "load ceilings and limits against a baseline still judged"]


def render_summary(entries: Iterable[dict[str, Any]], messages: Iterable[str]) -> list[str]:
    entries = sorted(entries, key=lambda e: study_order(e["case"].id))  # the study's order, not the run's
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
    loops = [(str(e["case"].value), e["record"]) for e in entries if e["case"].experiment == "loop"]
    lines += bound_table(f"{TITLES.get('loop', 'loop')}: step bound", loops)
    lines += bound_note(record for _, record in loops)
    states = sorted({str(e["record"].get("kernel_caches")) for e in entries if e["record"].get("kernel_caches")})
    if states:
        lines += ["", f"1st epoch s: compilation and capture included; Triton/Inductor caches {', '.join(states)}"]
    lines += noise_lines(entries)
    lines += floors_lines(entries)
    reasons = {what: why for e in entries for what, why in e["record"]["load"]["unavailable"].items()}
    if reasons:
        lines += [""] + [f"n/a: {what}: {why}" for what, why in reasons.items()]
    return lines
