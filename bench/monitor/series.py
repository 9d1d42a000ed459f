"""Sidecar files holding each case's raw load samples (the study's figures' data).

One CSV per case, beside the run rather than inside its JSON, so saved runs stay
small; empty cells are values that were not available.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Iterable
from collections.abc import Mapping
from pathlib import Path

from kernels.ground.files import write_atomic


def safe_name(test_name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", test_name).strip("_")


def write_series(path: Path, samples: Iterable[Mapping[str, float | None]]) -> Path:
    rows = list(samples)
    columns: list[str] = []
    for row in rows:
        columns.extend(key for key in row if key not in columns)
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(columns)
    for row in rows:
        writer.writerow(["" if row.get(c) is None else f"{row[c]:.6g}" for c in columns])
    return write_atomic(path, text.getvalue())


def read_series(path: Path) -> dict[str, list[float]]:
    """column -> values, NaN where a value was not available."""
    with Path(path).open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        columns = next(reader)
        values: dict[str, list[float]] = {c: [] for c in columns}
        for row in reader:
            for column, cell in zip(columns, row):
                values[column].append(float(cell) if cell else math.nan)
    return values
