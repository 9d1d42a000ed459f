"""The serving figures: accuracy against batch-1 p99 latency and energy per inference
of a run's inference records, and a search's trials with their Pareto front."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from typing import Any

from matplotlib.figure import Figure

from bench.figures.common import finite
from bench.figures.common import pareto_front
from bench.figures.common import place_labels
from bench.figures.common import plt
from bench.figures.common import say_no_data

INFERENCE_COSTS = {  # panel: (axis label, scale to the axis unit, what a panel without data says)
    "p99_latency_s": ("batch-1 p99 latency (µs)", 1e6, "no latency data: no inference record holds a p99 latency"),
    "energy_j_per_1k": ("energy per 1,000 inferences (J)", 1.0,
                        "no energy data: no GPU energy counter (NVML) on this run"),
}


def record_p99(record: Mapping[str, Any]) -> float | None:
    """The batch-1 p99 latency of an inference record: from the CUDA graph replay where
    it was measured, else eager (the search ranks its trials the same way)."""
    for kind in ("graph", "eager"):
        stats = record.get(f"latency_{kind}_s") or {}
        if finite(stats.get("p99")):
            return float(stats["p99"])
    return None


LOG_SPAN = 100  # an inference panel whose costs span more than this factor gets a log x axis


def inference_figure(records: list[dict[str, Any]]) -> Figure:
    """Accuracy against batch-1 p99 latency and against energy per 1,000 inferences of
    every inference record of a run (case x variant x implementation), coloured by
    variant; each panel's Pareto front in red, its points labelled."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6))
    variants = list(dict.fromkeys(str(r.get("variant", "?")) for r in records))
    palette = [c for i, c in enumerate(plt.get_cmap("tab20").colors) if i not in (6, 7)]  # red is the front's
    colours = {v: palette[i % len(palette)] for i, v in enumerate(variants)}
    drawn = []
    for ax, (key, (label, scale, missing)) in zip(axes, INFERENCE_COSTS.items()):
        usable = [r for r in records if finite(_inference_cost(r, key)) and finite(r.get("accuracy"))]
        if not usable:
            say_no_data(ax, missing)
            continue
        points = [(_inference_cost(r, key) * scale, float(r["accuracy"])) for r in usable]
        front = set(pareto_front(points))
        for variant in variants:
            mine = [i for i, r in enumerate(usable) if str(r.get("variant", "?")) == variant and i not in front]
            if mine:
                ax.scatter([points[i][0] for i in mine], [points[i][1] for i in mine], s=16, alpha=0.75,
                           color=colours[variant], label=variant, zorder=2)
        order = sorted(front, key=lambda i: points[i][0])
        ax.plot([points[i][0] for i in order], [points[i][1] for i in order], color="tab:red", linewidth=1,
                marker="o", markersize=5, label="Pareto front", zorder=3)
        xs = [x for x, _ in points]
        logged = min(xs) > 0 and max(xs) > LOG_SPAN * min(xs)
        if logged:  # eager dynamic int8 at milliseconds beside graph replays at microseconds
            ax.set_xscale("log")
        ax.set_xlabel(label + (", log scale" if logged else ""))
        ax.set_ylabel("test accuracy")
        ax.grid(alpha=0.3)
        ax.margins(0.15)
        ax.legend(fontsize=6.5, loc="lower right")
        names = [" ".join(str(usable[i].get(k, "")) for k in ("case", "variant", "impl")).strip() for i in order]
        drawn.append((ax, [points[i] for i in order], names))
    axes[0].set_title("Inference: accuracy against serving cost (front in red)")
    fig.tight_layout()
    for ax, points, names in drawn:
        place_labels(ax, points, names, first=range(len(points)))
    return fig


def _inference_cost(record: Mapping[str, Any], key: str) -> float | None:
    return record_p99(record) if key == "p99_latency_s" else record.get(key)


def search_figure(summary: Mapping[str, Any]) -> Figure:
    """A search's trials (the JSON `python -m bench.search` writes): its two objectives
    against each other, then accuracy against p99 latency and against energy per 1,000
    inferences. The front (feasible, non-dominated) in red and labelled; hand-picked
    variants as labelled squares; trials over the accuracy-drop limit as grey x."""
    objectives = summary.get("objectives") or []
    keys = [o["key"] for o in objectives]
    rows = [r for r in summary.get("trials", []) if r.get("values")]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
    if len(keys) < 2 or not rows:
        why = "no measured trial in this search" if len(keys) >= 2 else "not a two-objective search"
        for ax in axes:
            say_no_data(ax, why)
        fig.tight_layout()
        return fig
    x_obj, y_obj = objectives[0], objectives[1]
    accuracy = lambda r: r.get("accuracy")  # noqa: E731
    energy = lambda r: r.get("energy_j_per_1k")  # noqa: E731
    panels = [
        (axes[0], lambda r: r["values"][x_obj["key"]] * x_obj["scale"],
         lambda r: r["values"][y_obj["key"]] * y_obj["scale"],
         f"{x_obj['label']} ({x_obj['unit']})", f"{y_obj['label']} ({y_obj['unit']})", None),
        (axes[1], lambda r: r["values"][x_obj["key"]] * x_obj["scale"], accuracy,
         f"{x_obj['label']} ({x_obj['unit']})", "test accuracy", None),
        (axes[2], energy, accuracy, "energy per 1,000 inferences (J)", "test accuracy",
         textwrap.fill("no energy data in this search"
                       + (f": {summary['objectives_note']}" if summary.get("objectives_note") else ""), 45)),
    ]
    drawn = []
    for ax, fx, fy, xlabel, ylabel, missing in panels:
        usable = [r for r in rows if finite(fx(r)) and finite(fy(r))]
        if not usable:
            say_no_data(ax, missing or "no trial holds both values")
            continue
        groups = {
            "feasible": [r for r in usable if r["feasible"] and not r["on_front"] and not r.get("preset")],
            "over the accuracy-drop limit": [r for r in usable if not r["feasible"] and not r.get("preset")],
            "hand-picked variant": [r for r in usable if r.get("preset") and not r["on_front"]],
            "Pareto front": sorted((r for r in usable if r["on_front"]), key=fx),
        }
        style = {"feasible": dict(color="0.55", marker="o", s=16),
                 "over the accuracy-drop limit": dict(color="0.6", marker="x", s=18),
                 "hand-picked variant": dict(color="tab:blue", marker="s", s=26),
                 "Pareto front": dict(color="tab:red", marker="o", s=28)}
        for name, group in groups.items():
            if group:
                ax.scatter([fx(r) for r in group], [fy(r) for r in group], label=name, zorder=3, **style[name])
        if ax is axes[0] and groups["Pareto front"]:
            front = groups["Pareto front"]
            ax.step([fx(r) for r in front], [fy(r) for r in front], where="post", color="tab:red", linewidth=1)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.margins(0.15)
        ax.legend(fontsize=6.5, loc="best")
        named = groups["Pareto front"] + groups["hand-picked variant"]
        names = [f"{r['preset']}" if r.get("preset") else f"#{r['number']} {r['label']}" for r in named]
        drawn.append((ax, [(fx(r), fy(r)) for r in named], names, len(groups["Pareto front"])))
    limit = summary.get("max_accuracy_drop")
    axes[0].set_title(f"Search {summary.get('study', '')}: front in red (accuracy drop <= {limit:g})", fontsize=9)
    fig.tight_layout()
    for ax, points, names, first in drawn:
        place_labels(ax, points, names, first=range(first))
    return fig
