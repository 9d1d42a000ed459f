"""Kernel tables: the per-kernel time a traced case stored, and what grew against a baseline.

bench/monitor/trace.py profiles steady epochs into a `KernelTable`; it is stored in
``extra_info["kernel_trace"]`` (`KernelTable.to_dict`: the top `MAX_ROWS` rows plus one
'other' row summing the rest, with an 8-hex-digit CRC-32 of each name it folds, so that
a kernel below the top rows is not mistaken for a new one). When a case regresses
against a baseline that holds a table, `diff` lists the kernels whose time per epoch
grew most and `describe` writes one line for each.

Usage::

    then = KernelTable.from_dict(baseline_extra_info["kernel_trace"])  # ValueError if malformed
    lines = describe(diff(KernelTable.from_dict(extra_info["kernel_trace"]), then, top=5))
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

FORMAT_VERSION = 1
MAX_ROWS = 40  # rows kept by KernelTable.from_totals and stored by to_dict; the rest fold into 'other'
NAME_WIDTH = 80  # characters of a kernel name shown by describe (the diff uses full names)
DEVICES = ("cuda", "cpu")
COLUMNS = ("name", "calls_per_epoch", "us_per_epoch")


@dataclass(frozen=True)
class KernelRow:
    name: str
    calls_per_epoch: float
    us_per_epoch: float  # self device time per epoch (self CPU time on a CPU), microseconds


@dataclass(frozen=True)
class KernelTable:
    """Per-kernel calls and time per epoch over `epochs` profiled epochs on `device`.

    `rows` are sorted by time per epoch, largest first (the constructor sorts them);
    `other` sums the kernels beyond the top rows, or is None when nothing was folded;
    `folded_ids` holds `name_id` of each kernel it sums.
    """

    device: str  # 'cuda' or 'cpu'
    epochs: int
    rows: tuple[KernelRow, ...]
    other: KernelRow | None = None
    folded_ids: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.rows, key=lambda r: (-r.us_per_epoch, r.name)))
        object.__setattr__(self, "rows", ordered)
        object.__setattr__(self, "folded_ids", frozenset(self.folded_ids))

    @property
    def folded(self) -> int:
        """How many kernel names the 'other' row sums."""
        return len(self.folded_ids)

    def was_folded(self, name: str) -> bool:
        """Whether `name` is one of the kernels summed into 'other' (so below the top rows)."""
        return name_id(name) in self.folded_ids

    @property
    def total_us_per_epoch(self) -> float:
        return sum(r.us_per_epoch for r in self.rows) + (self.other.us_per_epoch if self.other else 0.0)

    @property
    def total_calls_per_epoch(self) -> float:
        return sum(r.calls_per_epoch for r in self.rows) + (self.other.calls_per_epoch if self.other else 0.0)

    def row(self, name: str) -> KernelRow | None:
        return next((r for r in self.rows if r.name == name), None)

    @classmethod
    def from_totals(
        cls, device: str, epochs: int, totals: Mapping[str, tuple[int, float]], max_rows: int = MAX_ROWS
    ) -> KernelTable:
        """A table from name -> (calls, microseconds) summed over `epochs` epochs.

        Keeps the `max_rows` names with the most time and folds the rest into 'other'."""
        if device not in DEVICES:
            raise ValueError(f"kernel table: device {device!r}: expected one of {', '.join(DEVICES)}")
        if epochs < 1:
            raise ValueError(f"kernel table: epochs={epochs}: expected at least 1")
        rows = sorted(
            (
                KernelRow(name, round(calls / epochs, 3), round(us / epochs, 2))
                for name, (calls, us) in totals.items()
            ),
            key=lambda r: (-r.us_per_epoch, r.name),
        )
        kept, rest = rows[:max_rows], rows[max_rows:]
        other = None
        if rest:
            other = KernelRow(
                "other",
                round(sum(r.calls_per_epoch for r in rest), 3),
                round(sum(r.us_per_epoch for r in rest), 2),
            )
        return cls(device, epochs, tuple(kept), other, frozenset(name_id(r.name) for r in rest))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready and compact: rows as [name, calls per epoch, µs per epoch], at most MAX_ROWS."""
        table = self
        if len(self.rows) > MAX_ROWS:  # a table built by hand with more rows: fold before storing
            extra = self.rows[MAX_ROWS:]
            folded = [*extra, *([self.other] if self.other else [])]
            calls = sum(r.calls_per_epoch for r in folded)
            us = sum(r.us_per_epoch for r in folded)
            table = KernelTable(
                self.device, self.epochs, self.rows[:MAX_ROWS],
                KernelRow("other", round(calls, 3), round(us, 2)),
                self.folded_ids | {name_id(r.name) for r in extra},
            )
        return {
            "version": FORMAT_VERSION,
            "device": table.device,
            "epochs": table.epochs,
            "total_us_per_epoch": round(table.total_us_per_epoch, 2),
            "columns": list(COLUMNS),
            "rows": [[r.name, r.calls_per_epoch, r.us_per_epoch] for r in table.rows],
            "other": None
            if table.other is None
            else {
                "kernels": sorted(table.folded_ids),
                "calls_per_epoch": table.other.calls_per_epoch,
                "us_per_epoch": table.other.us_per_epoch,
            },
        }

    @classmethod
    def from_dict(cls, data: object) -> KernelTable:
        """The table `to_dict` wrote; a ValueError naming the field for anything else."""
        if not isinstance(data, Mapping):
            raise ValueError(f"kernel trace: expected a mapping, got {type(data).__name__}")
        missing = [k for k in ("version", "device", "epochs", "rows") if k not in data]
        if missing:
            raise ValueError(f"kernel trace: missing key(s) {', '.join(missing)}")
        if data["version"] != FORMAT_VERSION:
            raise ValueError(f"kernel trace: version {data['version']!r}: this reader knows {FORMAT_VERSION}")
        device = data["device"]
        if device not in DEVICES:
            raise ValueError(f"kernel trace: device {device!r}: expected one of {', '.join(DEVICES)}")
        epochs = data["epochs"]
        if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
            raise ValueError(f"kernel trace: epochs {epochs!r}: expected a positive integer")
        raw_rows = data["rows"]
        if not isinstance(raw_rows, Sequence) or isinstance(raw_rows, (str, bytes)):
            raise ValueError(f"kernel trace: rows: expected a list, got {type(raw_rows).__name__}")
        rows: list[KernelRow] = []
        seen: set[str] = set()
        for i, raw in enumerate(raw_rows):
            where = f"kernel trace: rows[{i}]"
            if not isinstance(raw, Sequence) or isinstance(raw, (str, bytes)) or len(raw) != 3:
                raise ValueError(f"{where}: expected [name, calls per epoch, µs per epoch], got {raw!r}")
            name, calls, us = raw
            if not isinstance(name, str) or not name:
                raise ValueError(f"{where}: name {name!r}: expected a non-empty string")
            if name in seen:
                raise ValueError(f"{where}: kernel {shorten(name)!r} appears twice")
            seen.add(name)
            rows.append(
                KernelRow(name, _amount(calls, f"{where}: calls per epoch"), _amount(us, f"{where}: µs per epoch"))
            )
        other, folded = None, frozenset()
        raw_other = data.get("other")
        if raw_other is not None:
            if not isinstance(raw_other, Mapping):
                raise ValueError(f"kernel trace: other: expected a mapping or null, got {raw_other!r}")
            try:
                ids = raw_other["kernels"]
                calls, us = raw_other["calls_per_epoch"], raw_other["us_per_epoch"]
            except KeyError as exc:
                raise ValueError(f"kernel trace: other: missing key {exc.args[0]!r}") from None
            if not isinstance(ids, list) or not all(isinstance(i, str) and _is_id(i) for i in ids):
                raise ValueError(f"kernel trace: other: kernels {ids!r}: expected a list of 8-hex-digit ids")
            folded = frozenset(ids)
            other = KernelRow(
                "other",
                _amount(calls, "kernel trace: other: calls per epoch"),
                _amount(us, "kernel trace: other: µs per epoch"),
            )
        return cls(device, epochs, tuple(rows), other, folded)


def name_id(name: str) -> str:
    """A kernel name's short id (CRC-32, 8 hex digits), stored for the kernels folded into 'other'."""
    return f"{zlib.crc32(name.encode('utf-8')):08x}"


def _is_id(text: str) -> bool:
    return len(text) == 8 and all(c in "0123456789abcdef" for c in text)


def _amount(value: object, where: str) -> float:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value < 0:  # type: ignore[arg-type]
        raise ValueError(f"{where}: {value!r}: expected a finite non-negative number")
    return float(value)


# ---------------------------------------------------------------------------- diff


@dataclass(frozen=True)
class KernelChange:
    name: str  # the full kernel name
    us_now: float  # per epoch
    us_then: float  # per epoch; 0 where the kernel is not in the baseline's table
    calls_now: float  # per epoch
    calls_then: float | None  # per epoch; None where the kernel is not among the baseline's rows
    # The kernel was summed into the baseline's 'other' row: its time then is unknown
    # but at most `us_then_bound` (the baseline's smallest row); delta_us counts from 0.
    was_folded: bool = False
    us_then_bound: float = 0.0

    @property
    def delta_us(self) -> float:
        return self.us_now - self.us_then

    @property
    def new(self) -> bool:
        """Absent from the baseline altogether (neither a row nor folded into 'other')."""
        return self.calls_then is None and not self.was_folded

    @property
    def growth(self) -> float | None:
        """Relative growth of time per epoch (0.12 for +12%), None for a kernel new in `now`."""
        return None if self.calls_then is None or self.us_then <= 0 else self.delta_us / self.us_then

    @property
    def calls_changed(self) -> bool:
        return self.calls_then is not None and self.calls_then != self.calls_now


def diff(now: KernelTable, then: KernelTable, top: int = 5) -> list[KernelChange]:
    """The `top` kernels whose time per epoch grew most from `then` to `now` (absolute µs).

    Kernels absent from `then`'s rows count from zero (new ones, and ones that `then`
    folded into its 'other' row, which are flagged); kernels that shrank or vanished
    are not listed, nor is the 'other' row. Names are compared in full."""
    if not isinstance(top, int) or top < 0:
        raise ValueError(f"diff: top={top!r}: expected a non-negative integer")
    if now.device != then.device:
        raise ValueError(f"diff: a {now.device} table cannot be compared with a {then.device} table")
    before = {r.name: r for r in then.rows}
    bound = then.rows[-1].us_per_epoch if then.rows else 0.0
    changes = []
    for row in now.rows:
        old = before.get(row.name)
        change = KernelChange(
            name=row.name,
            us_now=row.us_per_epoch,
            us_then=old.us_per_epoch if old else 0.0,
            calls_now=row.calls_per_epoch,
            calls_then=old.calls_per_epoch if old else None,
            was_folded=old is None and then.was_folded(row.name),
            us_then_bound=bound if old is None and then.was_folded(row.name) else 0.0,
        )
        if change.delta_us > 0:
            changes.append(change)
    changes.sort(key=lambda c: (-c.delta_us, c.name))
    return changes[:top]


def shorten(name: str, width: int = NAME_WIDTH) -> str:
    """`name` cut to `width` characters with an ellipsis (C++ template kernel names run long)."""
    name = " ".join(name.split())
    return name if len(name) <= width else name[: width - 1].rstrip() + "…"


def _number(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 10 or value == int(value) else f"{value:.1f}"


def _calls(value: float) -> str:
    return f"{value:g}"


def describe(changes: Sequence[KernelChange]) -> list[str]:
    """One line per change, e.g. ``+95 µs/epoch (+12%)  sgemm_64x64_nn (159 -> 159 calls/epoch)``."""
    lines = []
    for c in changes:
        amount = f"+{_number(c.delta_us)} µs/epoch"
        if c.growth is not None:
            percent = c.growth * 100
            amount += f" (+{_number(percent)}%)"
        if c.was_folded:
            note = (
                f"below the baseline's top rows, then at most {_number(c.us_then_bound)} µs/epoch; "
                f"now {_calls(c.calls_now)} calls/epoch"
            )
        elif c.new:
            note = f"new: {_calls(c.calls_now)} calls/epoch"
        else:
            note = f"{_calls(c.calls_then)} -> {_calls(c.calls_now)} calls/epoch"  # type: ignore[arg-type]
        lines.append(f"{amount}  {shorten(c.name)} ({note})")
    return lines
