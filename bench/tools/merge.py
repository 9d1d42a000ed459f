"""Merge the run files of a sharded sweep into one run.

    python -m bench.tools.merge merged.json shard-1.json shard-2.json ...

The shards must come from the same commit, GPU model and settings (shard aside)
and must not repeat a case; the merged file is an ordinary pytest-benchmark run that
`--benchmark-compare`, `pytest-benchmark compare` and the report read like any other.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.cases import study_order
from bench.plugin.compare import RECORD_KEY
from bench.plugin.compare import BaselineError
from bench.plugin.compare import gpu_name
from bench.plugin.compare import read_run
from model.files import write_atomic


class MergeError(ValueError):
    """Shards that cannot be one run; the message names the file and the difference."""


def settings(run: dict[str, Any]) -> dict[str, Any]:
    """The run's settings but its shard, which differs between shards by design."""
    return {k: v for k, v in run["machine_info"][RECORD_KEY].get("settings", {}).items() if k != "shard"}


def settings_diff(theirs: dict[str, Any], ours: dict[str, Any]) -> str:
    """Only the keys that differ, "epochs 8 vs 40, profile 'smoke' vs 'quick'": whole
    dicts of a dozen settings hide the one that matters."""
    missing = object()

    def show(value: object) -> str:
        return "(not set)" if value is missing else repr(value)

    return ", ".join(
        f"{key} {show(theirs.get(key, missing))} vs {show(ours.get(key, missing))}"
        for key in sorted(theirs.keys() | ours.keys())
        if theirs.get(key, missing) != ours.get(key, missing)
    )


def merge_runs(paths: Sequence[Path]) -> dict[str, Any]:
    if not paths:
        raise MergeError("no shard files given")
    runs = []
    for path in paths:
        try:
            runs.append((path, read_run(path)))
        except BaselineError as exc:
            raise MergeError(str(exc).replace("baseline ", "shard ", 1)) from None
    first_path, first = runs[0]
    merged = json.loads(json.dumps(first))
    merged["benchmarks"] = []
    seen: dict[str, Path] = {}

    for path, run in runs:
        for what, ours, theirs in (
            ("GPU", gpu_name(first["machine_info"]), gpu_name(run["machine_info"])),
            ("commit", first.get("commit_info", {}).get("id"), run.get("commit_info", {}).get("id")),
        ):
            if ours != theirs:
                raise MergeError(f"{path}: {what} {theirs!r} differs from {first_path}'s {ours!r}")
        differ = settings_diff(settings(run), settings(first))
        if differ:
            raise MergeError(f"{path}: settings differ from {first_path}'s: {differ}")
        for bench in run["benchmarks"]:
            if bench["fullname"] in seen:
                raise MergeError(f"{path}: {bench['fullname']} is also in {seen[bench['fullname']]}")
            seen[bench["fullname"]] = path
            merged["benchmarks"].append(bench)
    merged["datetime"] = max(run.get("datetime", "") for _, run in runs)
    merged["machine_info"][RECORD_KEY]["settings"]["shard"] = f"merged from {len(runs)}"
    merged["benchmarks"].sort(key=benchmark_order)
    return merged


def benchmark_order(bench: dict[str, Any]) -> tuple[object, ...]:
    """The study's order of cases (blocks-2 .. opt-adam, then the loops), not the sorted
    strings of their names; benchmarks of no case last, each tie by full name."""
    case = bench.get("extra_info", {}).get("case")
    return (case is None, study_order(case) if case else (), bench["fullname"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tools.merge", description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the merged run file to write")
    parser.add_argument("shards", type=Path, nargs="+", metavar="shard",
                        help="the run files of the shards (pytest --shard I/N --benchmark-json ...), one per shard")
    args = parser.parse_args(argv)
    try:
        merged = merge_runs(args.shards)
    except MergeError as exc:
        print(f"mlp-loadbench merge: {exc}", file=sys.stderr)
        return 2

    write_atomic(args.out, json.dumps(merged, indent=2))
    print(f"merged {len(args.shards)} shards, {len(merged['benchmarks'])} benchmarks -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
