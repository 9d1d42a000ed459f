"""Merge the run files of a sharded sweep into one run.

    python -m bench.tools.merge merged.json shard-1.json shard-2.json ...

The shards must come from the same commit, GPU model and settings (shard aside)
and must not repeat a case; the merged file is an ordinary pytest-benchmark run that
`--benchmark-compare`, `pytest-benchmark compare` and the report read like any other.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kernels.ground.cases import study_order
from bench.gate.record import RECORD_KEY
from bench.gate.record import RUN_KEY
from bench.gate.runs import RUN_STATES
from bench.gate.runs import BaselineError
from bench.gate.runs import RunState
from bench.gate.runs import gpu_name
from bench.gate.runs import read_run
from bench.gate.runs import run_state
from kernels.ground.files import write_atomic


class MergeError(ValueError):
    """Shards that cannot be one run; the message names the file and the difference."""


DESCRIPTION = """\
Merge the run files of a sharded sweep (pytest --shard I/N --benchmark-json ...) into one
pytest-benchmark run file. The shards must come from one commit, GPU model and settings and
must not repeat a case.

exit codes:
  0  merged and written
  2  bad input, said in one line on stderr, nothing written: a shard missing, not a regular
     file, unreadable or not a run of this suite (no machine_info.loadbench.settings); shards
     of different commits, GPUs or settings; a case in two shards; a shard given twice; the
     output one of the shards; an output that cannot be written
"""


def settings(run: dict[str, Any]) -> dict[str, Any]:
    """The run's settings but its shard, which differs between shards by design."""
    return {k: v for k, v in run["machine_info"][RECORD_KEY].get("settings", {}).items() if k != "shard"}


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file: through links and spellings when both exist, by
    their absolute paths otherwise."""
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


def check_paths(out: Path, shards: Sequence[Path]) -> None:
    """MergeError before any work when a shard is given twice, the output is a shard (it
    would be overwritten), a shard is not a readable regular file, or the output cannot be
    written (a folder, or no writable folder to hold it)."""
    for i, shard in enumerate(shards):
        for earlier in shards[:i]:
            if same_file(shard, earlier):
                raise MergeError(f"{shard}: given twice as a shard ({earlier}); name each shard once")
        if same_file(out, shard):
            raise MergeError(f"{out}: the output is also a shard and would be overwritten; name a new file to write")
    for shard in shards:
        try:
            mode = shard.stat().st_mode
        except OSError as exc:
            raise MergeError(f"{shard}: shard cannot be read: {exc.strerror or exc}") from None
        if not stat.S_ISREG(mode):
            raise MergeError(f"{shard}: shard is not a regular file" + (" but a folder" if stat.S_ISDIR(mode) else ""))
        if not os.access(shard, os.R_OK):
            raise MergeError(f"{shard}: shard cannot be read: permission denied")
    if out.exists() and not out.is_file():
        raise MergeError(f"{out}: the output is a folder or other non-file; name a file to write the merged run to")
    folder = out.absolute().parent
    while not folder.exists():  # write_atomic makes the missing folders
        folder = folder.parent
    if not folder.is_dir():
        raise MergeError(f"{out}: cannot be written: {folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise MergeError(f"{out}: cannot be written: folder {folder} is not writable")


def check_record(path: Path, run: dict[str, Any]) -> None:
    """MergeError naming the file and key when a run lacks what merging reads: its
    machine_info.loadbench.settings and each benchmark's fullname."""
    record = run["machine_info"].get(RECORD_KEY)
    if not isinstance(record, dict):
        raise MergeError(f"{path}: machine_info.{RECORD_KEY} is not a mapping; not a run of this suite")
    if not isinstance(record.get("settings"), dict):
        what = "is missing" if "settings" not in record else "is not a mapping"
        raise MergeError(f"{path}: machine_info.{RECORD_KEY}.settings {what}; not a complete run of this suite")
    for i, bench in enumerate(run["benchmarks"]):
        if not isinstance(bench, dict) or "fullname" not in bench:
            raise MergeError(f"{path}: benchmarks[{i}] has no 'fullname'")


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
    """One run of the shards' benchmarks in the study's order; MergeError naming the file
    when a shard cannot be read or does not belong with the first."""
    if not paths:
        raise MergeError("no shard files given")
    runs = []
    for path in paths:
        try:
            run = read_run(path)
        except BaselineError as exc:
            raise MergeError(str(exc).replace("baseline ", "shard ", 1)) from None
        check_record(path, run)
        runs.append((path, run))
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
    merged["machine_info"][RECORD_KEY][RUN_KEY] = merged_state([run for _, run in runs]).as_dict()
    merged["benchmarks"].sort(key=benchmark_order)
    return merged


def merged_state(runs: Sequence[dict[str, Any]]) -> RunState:
    """How the merged run ended: as its least finished shard (a partial shard makes a
    partial run), with the shards' counts added."""
    states = [run_state(run) for run in runs]
    worst = max(states, key=lambda state: RUN_STATES.index(state.state))
    collected = [s.collected for s in states]
    return RunState(worst.state, sum(collected) if None not in collected else None,  # type: ignore[arg-type]
                    sum(len(run["benchmarks"]) for run in runs), tuple(t for s in states for t in s.cut_short))


def benchmark_order(bench: dict[str, Any]) -> tuple[object, ...]:
    """The study's order of cases (blocks-2 .. opt-adam, then the loops), not the sorted
    strings of their names; benchmarks of no case last, each tie by full name."""
    case = bench.get("extra_info", {}).get("case")
    return (case is None, study_order(case) if case else (), bench["fullname"])


def make_parser() -> argparse.ArgumentParser:
    """The command line: the output first, then the shards."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.tools.merge",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,  # keep the exit codes' lines
    )
    parser.add_argument("out", type=Path, metavar="OUT",
                        help="the merged run file to write (replaced if it exists); never one of the shards")
    parser.add_argument("shards", type=Path, nargs="+", metavar="shard",
                        help="the run files of the shards (pytest --shard I/N --benchmark-json ...), each once")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Check the paths, merge the shards and write OUT: 0, or 2 with one line on stderr."""
    args = make_parser().parse_args(argv)
    try:
        check_paths(args.out, args.shards)
        merged = merge_runs(args.shards)
        write_atomic(args.out, json.dumps(merged, indent=2))
    except MergeError as exc:
        print(f"mlp-loadbench merge: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # checked above; a folder can still change under us
        print(f"mlp-loadbench merge: {args.out}: cannot be written: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"merged {len(args.shards)} shards, {len(merged['benchmarks'])} benchmarks -> {args.out}")
    state = run_state(merged)
    if not state.whole:  # kept, and marked: the merged run is never read as a whole one
        print(f"mlp-loadbench merge: note: a shard was cut short, so {state.line()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
