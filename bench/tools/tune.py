"""Measure launch configurations for the fused kernels on this GPU and write the table.

    python -m bench.tools.tune                      # updates kernels/launch_table.json
    python -m bench.tools.tune --out table.json --batches 64 512 --widths 512
    python -m bench.tools.tune --merge a.json b.json    # one table from runs split over GPUs
    python -m bench.tools.tune --from-cache ~/.cache/mlp-loadbench/launch-cache.json
    python -m bench.tools.tune --dry-run --experiments  # what first-use tuning costs, no GPU

Every Linear of the MLP at each batch x width of the grid, each kernel, dtype and
activation class, tuned once per shape class with first-use tuning's own tuner
(kernels/plan/tuning.py) and timed longer, since the table is committed. The table is
keyed by the GPU's name and wins over the per-user cache. Details: docs/kernels.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import torch

from kernels.ground import env as loadbench_env
from kernels.ops import linear_act  # noqa: F401  (registers the op's launch code, which the tuner times)
from kernels.plan import trials
from kernels.plan import launches
from kernels.plan.tuning import DEFAULT_BATCHES
from kernels.plan.tuning import DEFAULT_WIDTHS
from kernels.plan.tuning import FROM_CACHE_TIMING
from kernels.plan.tuning import H100_SMS
from kernels.plan.tuning import dry_run
from kernels.plan.tuning import kernel_shapes
from kernels.plan.tuning import merge_measured
from kernels.plan.tuning import read_cache_groups
from kernels.plan.tuning import read_measured
from kernels.plan.tuning import tune
from kernels.plan.tuning import write_table


def print_dry_run(result: dict[str, Any]) -> None:
    for r in result["rows"]:
        print(f"{r['key']:42s} M={r['M']:5d} N={r['N']:5d} K={r['K']:5d}  {r['candidates']:3d} candidates, "
              f"{r['new_compiles']:3d} new compilations")
    b, n = result["before"], result["now"]
    print(f"\n{result['sm_count']} SMs; counts before -> now:")
    for name, what in (
        ("shapes", "shapes tuned (before: every exact shape; now: one per shape class)"),
        ("candidates", "candidates"),
        ("compiles", "distinct Triton compilations (estimate; now compiled ahead in forked workers)"),
        ("full", f"full timings ({trials.FULL_TIMING[0]} calls x {trials.FULL_TIMING[1]} replays)"),
        ("quick", f"quick timings ({trials.QUICK_TIMING[0]} calls x {trials.QUICK_TIMING[1]} replays)"),
        ("executions", "kernel executions while timing"),
    ):
        ratio = f"  ({n[name] / b[name]:.2f}x)" if b[name] else ""
        print(f"  {b[name]:7d} -> {n[name]:7d}{ratio}  {what}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tools.tune", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(launches.TABLE_PATH))
    parser.add_argument("--batches", type=int, nargs="+", default=list(DEFAULT_BATCHES))
    parser.add_argument("--widths", type=int, nargs="+", default=list(DEFAULT_WIDTHS))
    parser.add_argument("--experiments", action="store_true",
                        help="only the batch x width pairs the five experiments train (what first-use tuning covers)")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    parser.add_argument("--merge", nargs="+", metavar="TABLE",
                        help="merge these table files into --out; measures nothing")
    parser.add_argument("--from-cache", metavar="CACHE",
                        help="write a first-use tuning cache file's groups into --out; measures nothing")
    parser.add_argument("--dry-run", action="store_true",
                        help="list shapes and count candidates and compilations; no GPU")
    parser.add_argument("--sm-count", type=int, default=None,
                        help=f"for --dry-run (default: this GPU's, else {H100_SMS})")
    args = parser.parse_args(argv)
    loadbench_env.check("bench.tools.tune")
    if args.merge:
        try:
            runs = [read_measured(path) for path in args.merge]
        except ValueError as exc:
            print(f"bench.tools.tune: {exc}", file=sys.stderr)
            return 2
        for gpu in sorted({gpu for run in runs for gpu in run}):
            write_table(args.out, gpu, merge_measured([run[gpu] for run in runs if gpu in run]))
        print(f"merged {len(args.merge)} tables -> {args.out}")
        return 0
    if args.from_cache:
        try:
            groups = read_cache_groups(args.from_cache)
        except ValueError as exc:
            print(f"bench.tools.tune: {exc}", file=sys.stderr)
            return 2
        for gpu, versions, entries in groups:
            write_table(args.out, gpu, entries, versions, FROM_CACHE_TIMING)
            print(f"{gpu} (triton {versions[0]}, torch {versions[1]}): {len(entries)} shape classes -> {args.out}")
        return 0
    if args.experiments:
        from bench.tools.bench_cells import experiment_pairs

        pairs = experiment_pairs(args.batches, args.widths)
    else:
        pairs = [(b, w) for b in args.batches for w in args.widths]
    shapes = kernel_shapes(pairs, [getattr(torch, d) for d in args.dtypes])
    if args.dry_run:
        sms = args.sm_count or (
            torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else H100_SMS
        )
        print(f"{len(pairs)} batch x width pairs: {' '.join(f'{b}x{w}' for b, w in pairs)}")
        print_dry_run(dry_run(shapes, sms))
        return 0
    if not torch.cuda.is_available():
        print("bench.tools.tune: needs a CUDA GPU (the table holds timings of the GPU it ran on)", file=sys.stderr)
        return 2
    start = time.perf_counter()
    name = torch.cuda.get_device_name()

    def save(measured: dict[str, dict]) -> None:
        write_table(args.out, name, measured)

    with tempfile.TemporaryDirectory(prefix="loadbench-tune-") as cache:
        measured, counts = tune(shapes, cache, save)
    save(measured)
    print(f"{len(measured)} shape classes for {name} in {time.perf_counter() - start:.0f} s -> {args.out}; {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
