"""What the figures share: matplotlib on its Agg backend (no display), labels placed
clear of points and of each other, a panel without data that says why, the Pareto front."""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def colour(index: int, count: int) -> Any:
    return plt.get_cmap("tab10" if count <= 10 else "tab20")(index % (10 if count <= 10 else 20))


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of points no other point beats on both cost (lower) and accuracy (higher)."""
    front = []
    for i, (cost, acc) in enumerate(points):
        if not any((c <= cost and a >= acc) and (c < cost or a > acc) for j, (c, a) in enumerate(points) if j != i):
            front.append(i)
    return front


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


def say_no_data(ax: Any, message: str) -> None:
    """A panel without data says why, with no ticks: an empty 0-1 axis reads like zeros."""
    ax.text(0.5, 0.5, message, ha="center", va="center", wrap=True, transform=ax.transAxes, color="dimgray")
    ax.set_xticks([])
    ax.set_yticks([])


def has_data(values: list[float] | None) -> bool:
    return bool(values) and any(not math.isnan(v) for v in values)  # type: ignore[union-attr]


def finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
