"""What a search found: the Pareto front (Optuna's `best_trials`: feasible, complete,
non-dominated), the hand-picked variants beside it, and the files.

The comparison answers the issue's question directly: on which objective does the
front reach a value no single preset reaches (its best point below the best feasible
preset's by more than BEAT_MARGIN), and which presets does a searched point dominate.
A preset is a trial of the study too, so it can sit on the front; beating the presets
means a searched point did better. Each trial is measured once, so a front point ahead
by less than the margin is reported as level with the preset, not as a win.

Files (into --out): `search.json` (everything below; the report reads it),
`front.md` (tables by tabulate, also printed), `front.png` and `front.svg`.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial
from optuna.trial import TrialState
from tabulate import tabulate

from bench.search.study import IDENTITY_KEY
from bench.search.study import REFERENCE_KEY
from bench.search.study import SearchSettings
from kernels.ground.files import write_atomic

FORMAT = "mlp-loadbench-search"
VERSION = 1
# How far below the best preset the front's best must be to count as beating it. One
# measurement each: on an H100 the same setting's batch-1 p99 moved by several us between
# fifths of one run, and a preset's energy per 1,000 inferences by about 20% between two
# searches, so a smaller lead says nothing.
BEAT_MARGIN = 0.05


def trial_row(trial: FrozenTrial, keys: list[str], limit: float, front: set[int]) -> dict[str, Any]:
    record = trial.user_attrs.get("record") or {}
    drop = trial.user_attrs.get("drop")
    complete = trial.state == TrialState.COMPLETE
    return {
        "number": trial.number,
        "state": trial.state.name.lower(),
        "label": trial.user_attrs.get("label"),
        "preset": trial.user_attrs.get("preset"),
        "params": trial.params,
        "config": trial.user_attrs.get("config"),
        "compression": trial.user_attrs.get("compression"),
        "values": dict(zip(keys, trial.values)) if complete and trial.values else None,
        "latency_kind": trial.user_attrs.get("latency_kind"),
        "accuracy": record.get("accuracy"),
        "macro_f1": record.get("macro_f1"),
        "accuracy_drop": drop,
        "feasible": complete and drop is not None and drop <= limit,
        "on_front": trial.number in front,
        "energy_j_per_1k": record.get("energy_j_per_1k"),
        "reason": trial.user_attrs.get("reason"),
        "repeat_of": trial.user_attrs.get("repeat_of"),
        "explored": bool(trial.user_attrs.get("explored")),
        "duration_s": trial.duration.total_seconds() if trial.duration else None,
    }


def summarise(study: optuna.Study, settings: SearchSettings, skipped_presets: Mapping[str, str]) -> dict[str, Any]:
    """The JSON the search writes and the report reads."""
    identity = study.user_attrs.get(IDENTITY_KEY, {})
    keys = [o.key for o in settings.objectives]
    front = {t.number for t in study.best_trials if "repeat_of" not in t.user_attrs}  # a repeat is listed once
    rows = [trial_row(t, keys, settings.max_accuracy_drop, front) for t in study.trials
            if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)]
    counts = {state: sum(r["state"] == state for r in rows) for state in ("complete", "pruned", "fail")}
    counts["repeats"] = sum(r["repeat_of"] is not None for r in rows)
    counts["explored"] = sum(r["explored"] for r in rows)
    counts["settings"] = sum(r["repeat_of"] is None for r in rows)
    return {
        "format": FORMAT,
        "version": VERSION,
        "study": settings.study_name,
        "storage": redact(settings.storage),
        "context": {k: identity.get(k) for k in settings.context},
        "objectives": [{"key": o.key, "label": o.label, "unit": o.unit, "scale": o.scale} for o in settings.objectives],
        "objectives_note": settings.objectives_note,
        "max_accuracy_drop": settings.max_accuracy_drop,
        "train_space": settings.train_space,
        "reference_accuracy": study.user_attrs.get(REFERENCE_KEY),
        "space": identity.get("space"),
        "counts": counts,
        "trials": rows,
        "front": sorted(front, key=lambda n: next(r["values"][keys[0]] for r in rows if r["number"] == n)),
        "presets_not_evaluated": dict(skipped_presets),
        "comparison": compare(rows, keys),
    }


def redact(url: str) -> str:
    """A storage URL without its password, for files that get shared."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url


def dominates(a: Mapping[str, float], b: Mapping[str, float]) -> bool:
    return all(a[k] <= b[k] for k in a) and any(a[k] < b[k] for k in a)


def compare(rows: list[dict[str, Any]], keys: list[str]) -> dict[str, Any]:
    """Per objective: the front's best point, the best feasible preset, and whether the
    front beats every preset there; per preset: the searched front point dominating it."""
    front = [r for r in rows if r["on_front"]]
    presets = [r for r in rows if r["preset"] and r["state"] == "complete"]
    feasible = [r for r in presets if r["feasible"]]
    per_objective = {}
    for key in keys:
        best_front = min(front, key=lambda r: r["values"][key], default=None)
        best_preset = min(feasible, key=lambda r: r["values"][key], default=None)
        ahead = (best_front is not None and best_preset is not None
                 and best_front["values"][key] < best_preset["values"][key])
        beats = ahead and best_front["values"][key] < (1 - BEAT_MARGIN) * best_preset["values"][key]  # type: ignore[index]
        per_objective[key] = {
            "best_front": _point(best_front, key),
            "best_preset": _point(best_preset, key),
            "front_beats_every_preset": bool(beats),
            "front_ahead_within_margin": bool(ahead and not beats),
        }
    dominated = {}
    for preset in presets:
        by = next((r for r in front if not r["preset"] and dominates(r["values"], preset["values"])), None)
        dominated[preset["preset"]] = by["number"] if by else None
    return {
        "objectives": per_objective,
        "margin": BEAT_MARGIN,
        "beats_every_preset_on": [k for k in keys if per_objective[k]["front_beats_every_preset"]],
        "presets_dominated_by": dominated,
        "infeasible_presets": [r["preset"] for r in presets if not r["feasible"]],
        # A preset cut short and measured on resume has both rows: it counts as measured.
        "unmeasured_presets": {r["preset"]: r["reason"] or "interrupted, not yet run again" for r in rows
                               if r["preset"] and r["state"] != "complete"
                               and not any(o["preset"] == r["preset"] and o["state"] == "complete" for o in rows)},
    }


def _point(row: dict[str, Any] | None, key: str) -> dict[str, Any] | None:
    if row is None:
        return None
    return {"number": row["number"], "label": row["label"], "preset": row["preset"], "value": row["values"][key]}


def verdict(summary: Mapping[str, Any]) -> str:
    """One or two sentences: where the front beats every preset, with the numbers, and
    where it is ahead by less than the margin (level, not a win)."""
    comparison = summary["comparison"]
    margin = comparison.get("margin", 0.0)  # search files from before the margin: none
    objectives = {o["key"]: o for o in summary["objectives"]}

    def lead(key: str) -> str:
        o, c = objectives[key], comparison["objectives"][key]
        return (f"{o['label']}: {_fmt(c['best_front']['value'], o)} (trial {c['best_front']['number']}, "
                f"{c['best_front']['label']}) against the best preset's {_fmt(c['best_preset']['value'], o)} "
                f"({c['best_preset']['preset']})")

    wins = [lead(k) for k in comparison["beats_every_preset_on"]]
    level = [lead(k) for k, c in comparison["objectives"].items() if c.get("front_ahead_within_margin")]
    within = f"ahead by less than {margin:.0%}, which one measurement each does not tell from noise"
    out = []
    if wins:
        out.append(f"The front beats every single preset by more than {margin:.0%} on " + "; ".join(wins) + ".")
    elif not any(c["best_preset"] for c in comparison["objectives"].values()):
        return "No preset was measured and feasible here, so the front has nothing to be compared with."
    else:
        out.append(f"The front beats no preset by more than {margin:.0%} on any objective: the best points are "
                   "presets, or level with them.")
    if level:
        out.append("Level with the best preset on " + "; ".join(level) + f": {within}.")
    return " ".join(out)


def _fmt(value: float | None, objective: Mapping[str, Any]) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value * objective['scale']:.4g} {objective['unit']}"


def markdown(summary: Mapping[str, Any]) -> str:
    objectives = summary["objectives"]
    limit = summary["max_accuracy_drop"]
    rows = {r["number"]: r for r in summary["trials"]}
    context = ", ".join(f"{k} {v}" for k, v in summary["context"].items())
    lines = [f"# Search {summary['study']}: Pareto front", "", f"{context}; storage {summary['storage']}.", ""]
    lines.append(f"Minimising {' and '.join(o['label'] for o in objectives)} with the accuracy drop at most {limit:g}"
                 + (f" (against the base configuration's fp32 accuracy {summary['reference_accuracy']:.4f})"
                    if summary["reference_accuracy"] is not None else "") + ".")
    if summary["objectives_note"]:
        lines.append(f"Note: {summary['objectives_note']}.")
    counts = summary["counts"]
    lines += ["", f"{counts['complete']} trial(s) measured, {counts['pruned']} unsupported (pruned), "
              f"{counts['fail']} failed; {counts['repeats']} of them repeated an earlier trial's parameters "
              f"and took its answer, {counts['explored']} were drawn at random after a repeat; "
              f"{counts['settings']} distinct settings.", ""]
    headers = ["trial", "setting", "preset", *(f"{o['label']} ({o['unit']})" for o in objectives), "latency from",
               "accuracy", "drop"]

    def table(numbers: list[int]) -> str:
        body = [[n, rows[n]["label"], rows[n]["preset"] or "", *(_num(rows[n]["values"], o) for o in objectives),
                 rows[n]["latency_kind"], _f(rows[n]["accuracy"]), _f(rows[n]["accuracy_drop"], "+.4f")]
                for n in numbers]
        return tabulate(body, headers=headers, tablefmt="github", disable_numparse=True)

    lines += ["## Front", "",
              table(summary["front"]) if summary["front"] else "No feasible trial: the front is empty.", ""]
    preset_numbers = [r["number"] for r in summary["trials"] if r["preset"] and r["state"] == "complete"]
    if preset_numbers:
        lines += ["## Hand-picked variants", "", table(preset_numbers), ""]
    comparison = summary["comparison"]
    lines += [verdict(summary), ""]
    dominated = [f"{p} (by trial {n})" for p, n in comparison["presets_dominated_by"].items() if n is not None]
    if dominated:
        lines += ["Presets dominated by a searched point: " + ", ".join(dominated) + ".", ""]
    if comparison["infeasible_presets"]:
        lines += ["Presets over the accuracy-drop limit: " + ", ".join(comparison["infeasible_presets"]) + ".", ""]
    for name, reason in {**comparison["unmeasured_presets"], **summary["presets_not_evaluated"]}.items():
        lines.append(f"- preset {name} not measured: {reason}")
    reasons: dict[str, int] = {}
    for r in summary["trials"]:
        if r["state"] != "complete" and r["reason"] and r["repeat_of"] is None:
            reasons[r["reason"]] = reasons.get(r["reason"], 0) + 1
    if reasons:
        lines += ["", "Trials without a measurement:", ""] + [f"- {n}x {why}" for why, n in reasons.items()]
    return "\n".join(lines).rstrip() + "\n"


def _num(values: Mapping[str, float] | None, objective: Mapping[str, Any]) -> str:
    return f"{values[objective['key']] * objective['scale']:.4g}" if values else "n/a"


def _f(value: Any, spec: str = ".4f") -> str:
    return format(value, spec) if isinstance(value, (int, float)) else "n/a"


def write_outputs(summary: Mapping[str, Any], out: Path) -> list[Path]:
    """search.json, front.md, front.png, front.svg; each written whole or not at all."""
    from bench.figures.serving import search_figure

    written = [write_atomic(out / "search.json", json.dumps(summary, indent=2) + "\n"),
               write_atomic(out / "front.md", markdown(summary))]
    fig = search_figure(summary)
    for fmt in ("png", "svg"):
        buffer = io.BytesIO()
        fig.savefig(buffer, format=fmt, dpi=110)
        written.append(write_atomic(out / f"front.{fmt}", buffer.getvalue()))
    import matplotlib.pyplot as plt

    plt.close(fig)
    return written

