"""`python -m bench.tools.rows RUN.json ... --csv FILE`: one row per gated run, appended to a CSV.

The gate's figures in the docs (how often an unchanged pull request is red, what a planted
slowdown gets caught) come from run files; this writes each run's row as data, the way
Liger-Kernel keeps its measurements in one machine-written CSV: card, commit, date, what
ran, the verdicts' tally and what the paired runs decided, with the file it came from. A
row already in the file (same date, commit and card) is not written again, so a
re-measurement only ever adds rows. `python -m bench.tools.ci --rows FILE` appends its own.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.gate.runs import BaselineError
from bench.gate.runs import gpu_name
from bench.gate.runs import read_run
from bench.gate.runs import run_state

COLUMNS = ("date", "card", "commit", "dirty", "profile", "plant", "run_state", "gate", "cases", "ok", "regressed",
           "over_budget", "not_gated", "not_compared", "no_verdict", "first_run_red", "paired_confirmed",
           "paired_cleared", "caches", "source", "note")
KEY = ("date", "commit", "card")


def gate_row(run: dict[str, Any], source: str, note: str = "") -> dict[str, Any]:
    """The row of one run file: its verdicts counted, and what paired runs made of a slowdown."""
    loadbench = run["machine_info"]["loadbench"]
    settings = loadbench.get("settings", {})
    commit = run.get("commit_info") or {}
    counts = dict.fromkeys(("ok", "regressed", "over budget", "not gated", "not compared", "no verdict"), 0)
    paired = [0, 0]  # confirmed, cleared
    for bench in run["benchmarks"]:
        verdict = (bench.get("extra_info") or {}).get("verdict")
        status = verdict.get("status", "no verdict") if isinstance(verdict, dict) else "no verdict"
        counts[status] = counts.get(status, 0) + 1
        pairs = verdict.get("paired") if isinstance(verdict, dict) else None
        if pairs:
            paired[0 if pairs.get("confirmed") else 1] += 1
    return {
        "date": str(run.get("datetime", "")), "card": gpu_name(run["machine_info"]),
        "commit": str(commit.get("id") or "unknown")[:12], "dirty": bool(commit.get("dirty")),
        "profile": settings.get("profile"), "plant": settings.get("plant") or "",
        "run_state": run_state(run).state, "cases": len(run["benchmarks"]),
        # green: every case's verdict passed (after paired runs), as the CI job reports it
        "gate": "red" if counts["regressed"] or counts["over budget"] or counts["no verdict"] else "green",
        "ok": counts["ok"], "regressed": counts["regressed"], "over_budget": counts["over budget"],
        "not_gated": counts["not gated"], "not_compared": counts["not compared"], "no_verdict": counts["no verdict"],
        "first_run_red": sum(paired) + counts["regressed"] - paired[0],
        "paired_confirmed": paired[0], "paired_cleared": paired[1],
        "caches": settings.get("kernel_caches", ""), "source": source, "note": note,
    }


def append_rows(csv_path: Path, rows: Sequence[dict[str, Any]]) -> int:
    """Append the rows not yet in `csv_path` (by KEY), with the header for a new file; how many were written."""
    seen: set[tuple[str, ...]] = set()
    if csv_path.is_file():
        with csv_path.open(newline="", encoding="utf-8") as handle:
            seen = {tuple(row.get(k, "") for k in KEY) for row in csv.DictReader(handle)}
    new = [row for row in rows if tuple(str(row[k]) for k in KEY) not in seen]
    if not new:
        return 0
    fresh = not csv_path.is_file() or csv_path.stat().st_size == 0
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    with csv_path.open("a", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        if fresh:
            writer.writeheader()
        writer.writerows(new)
    return len(new)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tools.rows", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN.json")
    parser.add_argument("--csv", type=Path, required=True, metavar="FILE", help="the CSV the rows are appended to")
    parser.add_argument("--note", default="", help="what the rows say of how the runs were made")
    args = parser.parse_args(argv)
    if args.csv.is_dir():
        parser.error(f"--csv {args.csv}: is a directory; give the CSV file")
    rows = []
    for path in args.runs:
        try:
            rows.append(gate_row(read_run(path), str(path), args.note))
        except BaselineError as exc:
            print(f"mlp-loadbench rows: {str(exc).replace('baseline ', 'run ', 1)}", file=sys.stderr)
            return 2
    written = append_rows(args.csv, rows)
    print(f"appended {written} of {len(rows)} row(s) to {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
