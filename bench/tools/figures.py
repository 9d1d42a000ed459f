"""The report's static figures, drawn with matplotlib (Agg): resources over a run and
the accuracy / cost Pareto view, cases in the study's order. Each function returns a
Figure; the report saves or embeds it. The history across runs is interactive and
drawn by bench.tools.history."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Collection
from collections.abc import Mapping
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from bench.cases import study_order  # noqa: E402

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
    colours = {label: _colour(i, len(labels)) for i, label in enumerate(labels)}
    panels = [c for c in RESOURCES if any(_has_data(series[label].get(c)) for label in labels)]
    unmeasured = [RESOURCES[c].split(" (")[0] for c in RESOURCES if c not in panels]
    rows = max(1, len(panels))
    fig, axes = plt.subplots(rows, 1, figsize=(9, 2.3 * rows + 0.5), sharex=True, squeeze=False)
    timed = all(_has_data(series[label].get("t")) for label in labels)
    most = max((len(epoch_ends(series[label])) for label in labels), default=0)
    every = max(1, math.ceil(most / MAX_EPOCH_MARKS))
    for ax, column in zip(axes[:, 0], panels):
        for label in labels:
            columns = series[label]
            if not _has_data(columns.get(column)):
                continue  # not measured for this case: no line, never zeros
            x = columns["t"] if timed else np.arange(len(columns[column]))
            ax.plot(x, moving_average(columns[column], window), label=label, linewidth=1.2, color=colours[label],
                    marker="|", markersize=7, markeredgewidth=1.1, markevery=epoch_ends(columns, every))
        ax.set_ylabel(RESOURCES[column], fontsize=8)
        ax.grid(alpha=0.3)
    if not panels:
        _say_no_data(axes[0, 0], "no resource samples in these series")
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


def _colour(index: int, count: int) -> Any:
    return plt.get_cmap("tab10" if count <= 10 else "tab20")(index % (10 if count <= 10 else 20))


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
    """Accuracy against training time and against energy, the front in red, each point
    labelled with its case where the label overlaps no other label and no point."""
    records = sorted(records, key=lambda r: study_order(r["case"]))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    drawn = []
    for ax, (key, (label, missing)) in zip(axes, PARETO_COSTS.items()):
        usable = [r for r in records if r.get(key) is not None and not math.isnan(r[key])]
        if not usable:
            _say_no_data(ax, missing)
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
        _say_no_data(ax, "no step bounds: no case of this run was profiled")
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
        ax.plot(xs, np.minimum(peak, xs * bandwidth / 1e3), color=_colour(k, len(roofs)), linewidth=1.2,
                label=f"{precision}: {peak:.3g} TFLOP/s, {bandwidth:.3g} GB/s; ridge {ridge:.3g} FLOP/B")
        ax.axvline(ridge, color=_colour(k, len(roofs)), linestyle=":", linewidth=0.8)
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


LABEL_FONT = 6.5
_DIRECTIONS = [(math.cos(math.radians(a)), math.sin(math.radians(a))) for a in (45, 135, 315, 225, 90, 270, 0, 180,
                                                                                 22, 158, 338, 202, 68, 112, 292, 248)]
_RADII = (5, 11, 18, 27, 38, 52, 70, 92, 120, 155, 200, 250)  # points from the marker; far ones get a leader line


def place_labels(ax: Any, points: list[tuple[float, float]], names: list[str],
                 first: Collection[int] = ()) -> list[Any]:
    """Annotate each point with its name at the nearest of a ring of positions around it
    where the label stays inside the axes and overlaps no marker and no label placed
    before it (the points in `first` are placed first); where none is free, the position
    that overlaps least. A label set away from its point gets a thin leader line. The
    axes' limits are frozen: call this after the layout is final."""
    fig = ax.figure
    ax.set_xlim(ax.get_xlim())
    ax.set_ylim(ax.get_ylim())
    renderer = fig.canvas.get_renderer()
    px = fig.dpi / 72  # display pixels per point
    frame = ax.get_window_extent(renderer)
    centres = ax.transData.transform(np.asarray(points, dtype=float))
    marker = 3.5 * px
    taken = [(x - marker, y - marker, x + marker, y + marker) for x, y in centres]
    order = sorted(range(len(points)), key=lambda i: (i not in first, points[i][0]))
    out = []
    for i in order:
        probe = ax.text(0, 0, names[i], fontsize=LABEL_FONT)
        box = probe.get_window_extent(renderer)
        probe.remove()
        width, height = box.width, box.height
        best = None
        for radius in _RADII:
            for dx, dy in _DIRECTIONS:
                ox, oy = radius * dx * px, radius * dy * px
                left = centres[i][0] + ox - (width if dx < -0.3 else 0 if dx > 0.3 else width / 2)
                bottom = centres[i][1] + oy - (height if dy < -0.3 else 0 if dy > 0.3 else height / 2)
                rect = (left, bottom, left + width, bottom + height)
                inside = frame.x0 <= rect[0] and rect[2] <= frame.x1 and frame.y0 <= rect[1] and rect[3] <= frame.y1
                cost = sum(_overlap(rect, other) for other in taken) + (0 if inside else width * height)
                if best is None or cost < best[0]:
                    best = (cost, radius, dx, dy, rect)
                if cost == 0:
                    break
            if best is not None and best[0] == 0:
                break
        assert best is not None
        _, radius, dx, dy, rect = best
        taken.append(rect)
        out.append(ax.annotate(
            names[i], points[i], xytext=(radius * dx, radius * dy), textcoords="offset points", fontsize=LABEL_FONT,
            ha="right" if dx < -0.3 else "left" if dx > 0.3 else "center",
            va="top" if dy < -0.3 else "bottom" if dy > 0.3 else "center",
            arrowprops=({"arrowstyle": "-", "color": "0.55", "linewidth": 0.6, "shrinkA": 0, "shrinkB": 3}
                        if radius > 8 else None),
        ))
    return out


def _overlap(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> float:
    pad = 1.0  # a pixel of air between labels
    width = min(a[2], b[2]) - max(a[0], b[0]) + pad
    height = min(a[3], b[3]) - max(a[1], b[1]) + pad
    return width * height if width > 0 and height > 0 else 0.0


def _say_no_data(ax: Any, message: str) -> None:
    """A panel without data says why, with no ticks: an empty 0-1 axis reads like zeros."""
    ax.text(0.5, 0.5, message, ha="center", va="center", wrap=True, transform=ax.transAxes, color="dimgray")
    ax.set_xticks([])
    ax.set_yticks([])


def _has_data(values: list[float] | None) -> bool:
    return bool(values) and any(not math.isnan(v) for v in values)  # type: ignore[union-attr]


# ------------------------------------------------------------------ inference views

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
        if _finite(stats.get("p99")):
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
        usable = [r for r in records if _finite(_inference_cost(r, key)) and _finite(r.get("accuracy"))]
        if not usable:
            _say_no_data(ax, missing)
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
            _say_no_data(ax, why)
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
        usable = [r for r in rows if _finite(fx(r)) and _finite(fy(r))]
        if not usable:
            _say_no_data(ax, missing or "no trial holds both values")
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


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
