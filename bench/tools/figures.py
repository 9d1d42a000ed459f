"""The report's figures, drawn with matplotlib (Agg): resources over a run, metric
history across runs, and the accuracy / cost Pareto view. Each function returns a
Figure; the report saves or embeds it."""

from __future__ import annotations

import math
from collections.abc import Collection
from collections.abc import Mapping
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

RESOURCES = {  # series column: panel title
    "gpu_util": "GPU busy (%)",
    "sm_activity": "SM activity (%)",
    "vram_used_mib": "VRAM used (MiB, NVML)",
    "cpu_process": "CPU, process (% of usable cores)",
    "rss_mib": "RAM, process RSS (MiB)",
    "power_w": "Power (W)",
}


def moving_average(values: list[float], window: int) -> np.ndarray:
    """Uniform-kernel moving average, normalised at the edges, ignoring NaNs."""
    v = np.asarray(values, dtype=float)
    present = ~np.isnan(v)
    kernel = np.ones(max(1, min(window, len(v))))
    total = np.convolve(np.where(present, v, 0.0), kernel, mode="same")
    count = np.convolve(present.astype(float), kernel, mode="same")
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / count, np.nan)


def resource_figure(title: str, series: dict[str, dict[str, list[float]]], window: int) -> Figure:
    """One panel per resource that has data, one line per case (label -> series columns)."""
    panels = [c for c in RESOURCES if any(_has_data(s.get(c)) for s in series.values())]
    fig, axes = plt.subplots(len(panels) or 1, 1, figsize=(9, 2.3 * max(1, len(panels))), sharex=True, squeeze=False)
    for ax, column in zip(axes[:, 0], panels):
        for label, columns in series.items():
            if _has_data(columns.get(column)):
                ax.plot(moving_average(columns[column], window), label=label, linewidth=1.2)
        ax.set_ylabel(RESOURCES[column], fontsize=8)
        ax.grid(alpha=0.3)
    axes[0, 0].set_title(f"{title} (moving average over {window} samples)")
    axes[0, 0].legend(fontsize=7, ncol=min(5, len(series)), loc="upper right")
    axes[-1, 0].set_xlabel("monitor sample")
    fig.tight_layout()
    return fig


def history_figure(metric: str, labels: list[str], lines: dict[str, list[float | None]],
                   flagged: Mapping[str, Collection[int]]) -> Figure:  # fmt: skip
    """A metric across runs: one line per case, regressions (case -> run indices) marked with a red x."""
    fig, ax = plt.subplots(figsize=(9, 3.2))
    x = np.arange(len(labels))
    for case, values in lines.items():
        y = np.array([np.nan if v is None else v for v in values], dtype=float)
        ax.plot(x, y, marker="o", markersize=3, linewidth=1, label=case)
        bad = sorted(flagged.get(case, ()))
        if bad:
            ax.plot(x[bad], y[bad], "x", color="red", markersize=10, markeredgewidth=2)
    ax.set_xticks(x, labels, rotation=30, ha="right", fontsize=7)
    ax.set_title(metric)
    ax.grid(alpha=0.3)
    if len(lines) <= 12:
        ax.legend(fontsize=6, ncol=3)
    fig.tight_layout()
    return fig


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of points no other point beats on both cost (lower) and accuracy (higher)."""
    front = []
    for i, (cost, acc) in enumerate(points):
        if not any((c <= cost and a >= acc) and (c < cost or a > acc) for j, (c, a) in enumerate(points) if j != i):
            front.append(i)
    return front


PARETO_COSTS = {  # record key: (axis label, what a panel without data says)
    "train_seconds": ("training time (s)", "no training-time data: no case recorded its training time"),
    "energy_j": ("GPU energy (J)", "no energy data: no GPU energy counter on this run"),
}


def pareto_figure(records: list[dict[str, Any]]) -> Figure:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, (key, (label, missing)) in zip(axes, PARETO_COSTS.items()):
        usable = [r for r in records if r.get(key) is not None and not math.isnan(r[key])]
        if not usable:
            _say_no_data(ax, missing)
            continue
        points = [(r[key], r["accuracy"]) for r in usable]
        front = set(pareto_front(points))
        for i, (r, (cost, acc)) in enumerate(zip(usable, points)):
            ax.scatter(cost, acc, color="tab:red" if i in front else "tab:blue", s=22)
            ax.annotate(r["case"], (cost, acc), fontsize=6, xytext=(3, 3), textcoords="offset points")
        order = sorted(front, key=lambda i: points[i][0])
        ax.plot([points[i][0] for i in order], [points[i][1] for i in order], color="tab:red", linewidth=1)
        ax.set_xlabel(label)
        ax.set_ylabel("test accuracy")
        ax.grid(alpha=0.3)
    axes[0].set_title("Pareto front (red): accuracy against cost")
    fig.tight_layout()
    return fig


def _say_no_data(ax: Any, message: str) -> None:
    """A panel without data says why, with no ticks: an empty 0-1 axis reads like zeros."""
    ax.text(0.5, 0.5, message, ha="center", va="center", wrap=True, transform=ax.transAxes, color="dimgray")
    ax.set_xticks([])
    ax.set_yticks([])


def _has_data(values: list[float] | None) -> bool:
    return bool(values) and any(not math.isnan(v) for v in values)  # type: ignore[union-attr]
