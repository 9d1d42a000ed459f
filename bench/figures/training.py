"""A training run's figures: resources over the run, accuracy against cost (the Pareto
view) and the roofline of each case's step, cases in the study's order."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from bench.figures.common import LABEL_FONT
from bench.figures.common import colour
from bench.figures.common import has_data
from bench.figures.common import pareto_front
from bench.figures.common import place_labels
from bench.figures.common import plt
from bench.figures.common import say_no_data
from kernels.ground.cases import study_order

MAX_EPOCH_MARKS = 40  # epoch ends marked on one line before only every k-th is
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
    """One panel per resource that has data, one line per case (label -> series columns),
    in the study's order, against seconds since the monitor started, each epoch's end
    marked on its line. Resources no case measured get no panel; a note names them."""
    labels = sorted(series, key=study_order)
    colours = {label: colour(i, len(labels)) for i, label in enumerate(labels)}
    panels = [c for c in RESOURCES if any(has_data(series[label].get(c)) for label in labels)]
    unmeasured = [RESOURCES[c].split(" (")[0] for c in RESOURCES if c not in panels]
    rows = max(1, len(panels))
    fig, axes = plt.subplots(rows, 1, figsize=(9, 2.3 * rows + 0.5), sharex=True, squeeze=False)
    timed = all(has_data(series[label].get("t")) for label in labels)
    most = max((len(epoch_ends(series[label])) for label in labels), default=0)
    every = max(1, math.ceil(most / MAX_EPOCH_MARKS))
    for ax, column in zip(axes[:, 0], panels):
        for label in labels:
            columns = series[label]
            if not has_data(columns.get(column)):
                continue  # not measured for this case: no line, never zeros
            x = columns["t"] if timed else np.arange(len(columns[column]))
            ax.plot(x, moving_average(columns[column], window), label=label, linewidth=1.2, color=colours[label],
                    marker="|", markersize=7, markeredgewidth=1.1, markevery=epoch_ends(columns, every))
        ax.set_ylabel(RESOURCES[column], fontsize=8)
        ax.grid(alpha=0.3)
    if not panels:
        say_no_data(axes[0, 0], "no resource samples in these series")
    axes[0, 0].set_title(f"{title} (moving average over {window} samples)")
    if panels:
        axes[0, 0].legend(fontsize=7, ncol=min(5, len(labels)), loc="upper right")
    axes[-1, 0].set_xlabel(("time since the monitor started (s)" if timed else "monitor sample")
                           + ("; | marks the end of an epoch" if every == 1
                              else f"; | marks the end of every {every} epochs"),
                           fontsize=8)
    bottom = 0.0
    if unmeasured and panels:
        fig.text(0.01, 0.01, "not measured on this run: " + ", ".join(unmeasured), fontsize=7, color="dimgray")
        bottom = 0.25 / fig.get_figheight()
    fig.tight_layout(rect=(0, bottom, 1, 1))
    return fig


def epoch_ends(columns: Mapping[str, list[float]], every: int = 1) -> list[int]:
    """Indices of the samples where the trainer had reported a new epoch: the monitor
    carries the epoch last reported, so each change is an epoch's end (a new round
    starting again at 0 included). With `every` > 1, only where a multiple of `every`
    epochs was completed (epochs shorter than the monitor's period would mark every sample)."""
    epochs = columns.get("epoch") or []
    out = []
    for i in range(1, len(epochs)):
        then, now = epochs[i - 1], epochs[i]
        if math.isnan(then) or math.isnan(now) or now == then:
            continue
        if every == 1 or now < then or (now + 1) // every != (then + 1) // every:
            out.append(i)
    return out

PARETO_COSTS = {  # record key: (axis label, what a panel without data says)
    "train_seconds": ("training time (s)", "no training-time data: no case recorded its training time"),
    "energy_j": ("GPU energy (J)", "no energy data: no GPU energy counter on this run"),
}


def pareto_figure(records: list[dict[str, Any]]) -> Figure:
    """Accuracy against training time and against energy, the front in red, each point
    labelled with its case where the label overlaps no other label and no point."""
    records = sorted(records, key=lambda r: study_order(r["case"]))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    drawn = []
    for ax, (key, (label, missing)) in zip(axes, PARETO_COSTS.items()):
        usable = [r for r in records if r.get(key) is not None and not math.isnan(r[key])]
        if not usable:
            say_no_data(ax, missing)
            continue
        points = [(r[key], r["accuracy"]) for r in usable]
        front = set(pareto_front(points))
        for i, (cost, acc) in enumerate(points):
            ax.scatter(cost, acc, color="tab:red" if i in front else "tab:blue", s=22, zorder=3)
        order = sorted(front, key=lambda i: points[i][0])
        ax.plot([points[i][0] for i in order], [points[i][1] for i in order], color="tab:red", linewidth=1)
        ax.set_xlabel(label)
        ax.set_ylabel("test accuracy")
        ax.grid(alpha=0.3)
        ax.margins(0.15)  # room for the labels inside the axes
        drawn.append((ax, points, [r["case"] for r in usable], front))
    axes[0].set_title("Pareto front (red): accuracy against cost")
    fig.tight_layout()
    for ax, points, names, front in drawn:  # after the layout: placement is in display coordinates
        place_labels(ax, points, names, first=front)
    return fig


NEAREST_MARKERS = {"compute": "o", "memory": "s", "launch": "^"}


def step_point(bound: Mapping[str, Any]) -> tuple[float, float]:
    """A bound's (arithmetic intensity in FLOP/byte, achieved TFLOP/s), recovered from its
    floors and the ceilings they were measured at."""
    ceilings = bound["ceilings"]
    flops = bound["compute_us"] * 1e-6 * ceilings["matmul_tflops"] * 1e12
    moved = bound["memory_us"] * 1e-6 * ceilings["copy_gb_per_s"] * 1e9
    return flops / moved, flops / (bound["step_us"] * 1e-6) / 1e12


def layer_intensities(config: Mapping[str, Any], in_features: int = 75, classes: int = 10) -> list[float]:
    """FLOP/byte of each layer's forward GEMM at the configuration's batch, fp32 operands
    each read or written once."""
    from model.cost import layer_shapes
    from model.config import TrainConfig

    shapes = layer_shapes(TrainConfig(**config), in_features, classes)
    batch = config["batch_size"]
    return [2 * batch * i * o / (4 * (batch * i + i * o + batch * o)) for i, o in shapes]


def roofline_figure(records: list[dict[str, Any]]) -> Figure:
    """Each case's step on the roofline of the ceilings it was measured at: the memory
    slope, the compute roof, the ridge point between them, the optimal configuration's
    per-layer GEMM intensities, and a marker per case for the floor it is nearest."""
    usable = [r for r in sorted(records, key=lambda r: study_order(r["case"])) if r.get("bound")]
    fig, ax = plt.subplots(figsize=(8, 5))
    if not usable:
        say_no_data(ax, "no step bounds: no case of this run was profiled")
        return fig
    points = [step_point(r["bound"]) for r in usable]
    roofs = {(r["bound"]["ceilings"]["matmul_tflops"], r["bound"]["ceilings"]["copy_gb_per_s"],
              r["config"]["precision"]) for r in usable}
    study = next((r for r in usable if r["case"] == "blocks-3"), usable[0])
    layers = layer_intensities(study["config"])
    spots = [*(x for x, _ in points), *(p * 1e3 / bw for p, bw, _ in roofs), *layers]
    xs = np.geomspace(min(spots) / 3, max(spots) * 3, 200)
    for k, (peak, bandwidth, precision) in enumerate(sorted(roofs)):
        ridge = peak * 1e3 / bandwidth  # FLOP/byte where the slope meets the roof
        ax.plot(xs, np.minimum(peak, xs * bandwidth / 1e3), color=colour(k, len(roofs)), linewidth=1.2,
                label=f"{precision}: {peak:.3g} TFLOP/s, {bandwidth:.3g} GB/s; ridge {ridge:.3g} FLOP/B")
        ax.axvline(ridge, color=colour(k, len(roofs)), linestyle=":", linewidth=0.8)
    for i, intensity in enumerate(layers):
        ax.axvline(intensity, ymax=0.06, color="dimgray", linewidth=1.5)
        ax.annotate(f"L{i}", (intensity, 0.07), xycoords=("data", "axes fraction"), fontsize=LABEL_FONT,
                    ha="center", color="dimgray")
    for nearest, marker in NEAREST_MARKERS.items():
        mine = [p for p, r in zip(points, usable) if r["bound"]["nearest"] == nearest]
        if mine:
            ax.scatter(*zip(*mine), marker=marker, s=26, zorder=3, color="tab:red",
                       label=f"a case's step, nearest the {nearest} floor")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity of a step (FLOP per byte it must move)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title(f"Roofline: each case's training step (L0..: {study['case']}'s per-layer forward GEMMs)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    place_labels(ax, points, [r["case"] for r in usable])
    return fig
