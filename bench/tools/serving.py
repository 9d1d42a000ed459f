"""The serving summary: one row per configuration of a serving matrix's records
(bench/test_inference.py), written by the report as ``serving.md``.

Per configuration: the fp32 model's batch-1 p50 / p99 through each implementation
(from a CUDA graph where one was measured, else eager; the column says which), its
samples/s at the largest batch through eager torch's kernels, the variant x
implementation with the most samples/s at that batch among those within the accuracy
limit, its speed-up and accuracy drop, and energy per 1,000 inferences of both.
Figures the run could not measure are shown as "n/a", never as zero.

    python -m bench.tools.serving RUN.json ... [--rows docs/data/serving.csv]

prints that table for stored runs and appends a row per serving record to --rows.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tabulate import tabulate

from kernels.ground.cases import study_order
from bench.gate.record import INFERENCE_KIND
from bench.gate.record import KIND
from bench.gate.runs import BaselineError
from bench.gate.runs import read_run
from bench.tools.rows import KINDS
from bench.tools.rows import append_rows
from bench.tools.rows import card_of
from bench.tools.rows import csv_problem
from bench.tools.rows import serving_rows as record_rows
from kernels.ground.axes import SERVING_IMPLS as IMPLS

DEFAULT_MAX_DROP = 0.01  # one point of accuracy, the search's default limit


def batch1(record: Mapping[str, Any]) -> tuple[str, str]:
    """('p50 / p99' in µs, 'graph' or 'eager') of a record's batch-1 latency."""
    for mode in ("graph", "eager"):
        stats = record.get(f"latency_{mode}_s")
        if isinstance(stats, Mapping) and stats.get("p50") is not None and stats.get("p99") is not None:
            return f"{stats['p50'] * 1e6:.1f} / {stats['p99'] * 1e6:.1f}", mode
    return "n/a", ""


def largest_batch(record: Mapping[str, Any]) -> tuple[str, float] | None:
    """(batch, samples/s) at the largest batch a record measured."""
    throughput = record.get("throughput") or {}
    measured = {k: v for k, v in throughput.items() if isinstance(v, (int, float))}
    if not measured:
        return None
    batch = max(measured, key=int)
    return batch, float(measured[batch])


def best_variant(records: Iterable[Mapping[str, Any]], max_drop: float) -> Mapping[str, Any] | None:
    """The record with the most samples/s at its largest batch among those whose
    accuracy drop is known and at most `max_drop`."""
    within = [r for r in records if isinstance(r.get("accuracy_drop"), (int, float)) and r["accuracy_drop"] <= max_drop
              and largest_batch(r) is not None]
    return max(within, key=lambda r: largest_batch(r)[1], default=None)  # type: ignore[index]


def _energy(record: Mapping[str, Any] | None) -> str:
    value = record.get("energy_j_per_1k") if record else None
    return f"{value * 1e3:.2f}" if isinstance(value, (int, float)) else "n/a"


def serving_rows(records: Iterable[Mapping[str, Any]], max_drop: float = DEFAULT_MAX_DROP) -> list[list[str]]:
    by_case: dict[str, list[Mapping[str, Any]]] = {}
    for record in records:
        by_case.setdefault(str(record.get("case")), []).append(record)
    rows = []
    for case in sorted(by_case, key=study_order):
        group = by_case[case]
        fp32 = {r.get("impl"): r for r in group if r.get("variant") == "fp32"}
        latencies = []
        for impl in IMPLS:
            text, mode = batch1(fp32[impl]) if impl in fp32 else ("n/a", "")
            latencies.append(f"{text} ({mode})" if mode else text)
        reference = fp32.get("torch")
        ref_batch = largest_batch(reference) if reference else None
        best = best_variant(group, max_drop)
        if best is not None:
            speedup = best.get("speedup")
            best_cells = [f"{best.get('variant')} {best.get('impl')}",
                          f"{speedup:.2f}x" if isinstance(speedup, (int, float)) else "n/a",
                          f"{best['accuracy_drop'] * 100:+.2f}"]
        else:
            best_cells = ["none within the limit", "", ""]
        rows.append([case, *latencies,
                     f"{ref_batch[1] / 1e6:.1f} M at {ref_batch[0]}" if ref_batch else "n/a",
                     *best_cells, f"{_energy(reference)} / {_energy(best)}"])
    return rows


def serving_markdown(records: Iterable[Mapping[str, Any]], title: str, max_drop: float = DEFAULT_MAX_DROP) -> str:
    """``serving.md``: the per-configuration table and what its columns mean."""
    records = list(records)
    headers = ["case", *(f"fp32 batch-1 p50 / p99 µs: {impl}" for impl in IMPLS), "fp32 samples/s (torch)",
               f"best within {max_drop * 100:g} pt", "speed-up", "drop (pts)", "mJ per 1k: fp32 torch / best"]
    note = (f"{len(records)} serving records. Batch-1 latency from a CUDA graph where one was measured, else "
            "eager (in brackets), p99 over all calls (budgets judge the median of the rounds' p99s). Samples/s at "
            "the largest batch measured; the best variant x implementation is the one with the most samples/s "
            f"there whose accuracy drop against the fp32 model is at most {max_drop * 100:g} point(s); its "
            "speed-up is against the fp32 model through eager torch's kernels. n/a: not measured in this run.")
    table = tabulate(serving_rows(records, max_drop), headers=headers, tablefmt="github", disable_numparse=True)
    lines = [f"# Serving: {title}", "", note, "", table, ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tools.serving", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN.json")
    parser.add_argument("--rows", type=Path, default=None, metavar="CSV",
                        help="append a row per serving record to this CSV (docs/data/serving.csv)")
    parser.add_argument("--max-drop", type=float, default=DEFAULT_MAX_DROP,
                        help="the accuracy drop a best variant may have. Default: %(default)s")
    args = parser.parse_args(argv)
    problem = csv_problem(args.rows, KINDS["serving"]) if args.rows is not None else None
    if problem:
        parser.error(f"--rows {args.rows}: {problem}")
    rows = []
    for path in args.runs:
        try:
            run = read_run(path)
        except BaselineError as exc:
            print(f"mlp-loadbench serving: {str(exc).replace('baseline ', 'run ', 1)}", file=sys.stderr)
            return 2
        records = [b["extra_info"] for b in run["benchmarks"]
                   if (b.get("extra_info") or {}).get(KIND) == INFERENCE_KIND]
        print(serving_markdown(records, f"{card_of(run['machine_info'])}, {path}", args.max_drop))
        rows += record_rows(run, str(path))
    if args.rows is not None:
        print(f"appended {append_rows(args.rows, rows, KINDS['serving'])} of {len(rows)} row(s) to {args.rows}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
