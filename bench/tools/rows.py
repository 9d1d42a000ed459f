"""Measurements as data: one CSV per kind in docs/data/, one row per measurement, appended.

`KINDS` declares each CSV: its stem, what it measures and its columns, every one starting
with date, card, commit and caches and ending with source (the run file) and note. Each
measuring tool builds its rows with a pure function here from its own result and appends
them with `append_rows` (`--rows CSV`), the way Liger-Kernel keeps its measurements in one
machine-written CSV: a re-measurement only ever adds rows, a row already in the file is
not written again. `python -m bench.tools.rows RUN.json ... --csv FILE` appends the rows of
stored runs (gate-runs by default; --kind experiments, serving); `python -m
bench.tools.report --measurements docs/data --out docs` renders every CSV as one page.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import math
import platform
import subprocess
import sys
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.gate.record import CASE
from bench.gate.record import EXPERIMENT
from bench.gate.record import INFERENCE_KIND
from bench.gate.record import KERNEL_CACHES
from bench.gate.record import KIND
from bench.gate.record import RECORD_KEY
from bench.gate.runs import BaselineError
from bench.gate.runs import read_run
from bench.gate.runs import run_state

COMMON = ("date", "card", "commit", "caches")  # first in every CSV; source and note close it
CACHES = ("cold", "warm", "empty", "unknown", "")  # "": not stated where the figure was taken from


@dataclass(frozen=True)
class Kind:
    """One CSV of measurements: its stem, what a row measures, its measurement columns;
    `key`: the columns that name a row (empty: the whole row)."""

    stem: str
    about: str
    columns: tuple[str, ...]
    key: tuple[str, ...] = ()
    header: tuple[str, ...] = ()  # the CSV's columns in order, when not COMMON + columns + source, note

    @property
    def fields(self) -> tuple[str, ...]:
        return self.header or (*COMMON, *self.columns, "source", "note")


KINDS: dict[str, Kind] = {k.stem: k for k in (
    Kind("tier-times", "the wall time of a tier or command on one card, from start to exit",
         ("command", "tier", "cases", "pytest_s", "wall_s")),
    Kind("experiments", "the study's five experiments: median epoch time and load per configuration and card",
         ("experiment", "case", "profile", "loop", "precision", "median_epoch_s", "first_epoch_s", "train_s",
          "gpu_busy", "sm_activity", "vram_peak_mib", "accuracy")),
    Kind("loops", "the training loops per precision: epoch and step times, the fused step against torch.compile",
         ("loop", "precision", "config", "epoch_s", "step_us", "first_epoch_s", "against", "against_epoch_s",
          "ratio")),
    Kind("kernel-cells", "one forward + backward step of the MLP per batch x width x precision x activation: "
         "eager torch, torch.compile and our kernels, replayed from CUDA graphs on a GPU (mode graph), eager on a CPU; "
         "a row of several cells gives their geometric mean",
         ("precision", "batch", "width", "activation", "mode", "torch_us", "compile_us", "ours_us", "speedup_vs_torch",
          "speedup_vs_compile", "best_baseline", "speedup_vs_best")),
    Kind("step-phases", "the one-launch training step phase by phase: the slowest program's work, the wait "
         "at the barrier after it and when the phase's last program finished it, from the step's start; "
         "rows named 'in F_0: ...' and 'in F_1: ...' time a part of those phases' first tiles, the median "
         "over the programs (bench.tools.step_phases)",
         ("precision", "depth", "width", "batch", "blocks", "step_us", "phase", "work_us", "barrier_us", "done_us")),
    Kind("step-budget", "the one-launch step's phase budget: each phase's tiles, longest reduction chain, "
         "L2 bytes (a model of the tiling), measured work, the time it added to the step and its share of the "
         "step a goal allows (bench.tools.step_budget)",
         ("precision", "depth", "width", "batch", "phase", "tiles", "chain", "l2_mb", "work_us", "added_us", "step_us",
          "epoch_s", "goal_epoch_s", "goal_step_us", "phase_goal_us")),
    Kind("step-builds", "the one-launch step as Triton builds it for sm_90 at the study shape, no GPU needed: "
         "registers a thread, stack, spill stores and loads, SASS instructions (bench.tools.step_compile)",
         ("precision", "blocks", "triton", "registers", "stack_bytes", "spill_stores", "spill_loads", "instructions",
          "shared_bytes")),
    Kind("serving", "batch-1 latency, throughput and accuracy drop per case, compression variant and "
         "serving implementation",
         ("case", "variant", "impl", "latency_mode", "p50_us", "p99_us", "batch", "samples_per_s", "drop_pts",
          "speedup", "mj_per_1k")),
    Kind("data-parallel", "one training over several GPUs of one host: epoch time and scaling against one GPU",
         ("width", "scaling", "global_batch", "gpus", "loop", "one_gpu_epoch_s", "epoch_s", "speedup", "efficiency",
          "allreduce_share", "accuracy")),
    Kind("selftest", "the gate's self-test: how often an unchanged run is red (false red) and which planted "
         "slowdowns it catches",
         ("profile", "case", "runs", "spread_pct", "largest_aa_pct", "between_cards", "false_red", "plant", "caught",
          "smallest_detectable", "suggested_time_slower_pct")),
    Kind("gate-runs", "one gated run: its verdicts counted and what the paired runs decided",
         ("dirty", "profile", "plant", "run_state", "gate", "cases", "ok", "regressed", "over_budget", "not_gated",
          "not_compared", "no_verdict", "first_run_red", "paired_confirmed", "paired_cleared"),
         key=("date", "commit", "card"),
         header=("date", "card", "commit", "dirty", "profile", "plant", "run_state", "gate", "cases", "ok",
                 "regressed", "over_budget", "not_gated", "not_compared", "no_verdict", "first_run_red",
                 "paired_confirmed", "paired_cleared", "caches", "source", "note")),
)}
COLUMNS = KINDS["gate-runs"].fields
KEY = KINDS["gate-runs"].key


class RowsError(ValueError):
    """A CSV the rows cannot be appended to; the message names the file and what is wrong."""


# ------------------------------------------------------------ where a row was measured


def cpu_name() -> str:
    """This machine's CPU model, for rows measured without a GPU."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return "CPU " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return f"CPU {platform.processor() or platform.machine() or 'unknown'}"


def card_of(machine_info: Mapping[str, Any]) -> str:
    """The GPU a stored run measured on, else its CPU as pytest-benchmark recorded it."""
    gpu = (machine_info.get(RECORD_KEY) or {}).get("gpu") or {}
    if gpu.get("name"):
        return str(gpu["name"])
    cpu = machine_info.get("cpu") or {}
    brand = cpu.get("brand_raw") or cpu.get("brand") or machine_info.get("processor") or machine_info.get("machine")
    return f"CPU {brand}" if brand else cpu_name()


def git_commit(repo: Path | None = None) -> str:
    """The checkout's commit (12 characters, '+' when files differ from it), or 'unknown'."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=30).stdout.strip()

    try:
        head = git("rev-parse", "HEAD")[:12]
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}+" if head and dirty else head or "unknown"


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def common(run: Mapping[str, Any]) -> dict[str, Any]:
    """date, card, commit and caches of a stored run."""
    info = run["machine_info"].get(RECORD_KEY) or {}
    commit = run.get("commit_info") or {}
    caches = str((info.get("settings") or {}).get(KERNEL_CACHES) or "unknown").split()[0]  # 'cold (emptied...)'
    return {"date": str(run.get("datetime", "")), "card": card_of(run["machine_info"]),
            "commit": str(commit.get("id") or "unknown")[:12], "caches": caches}


def _round(value: Any, digits: int = 4) -> Any:
    return round(value, digits) if isinstance(value, float) else ("" if value is None else value)


# ------------------------------------------------------------ one builder per kind


def gate_row(run: dict[str, Any], source: str, note: str = "") -> dict[str, Any]:
    """The row of one run file: its verdicts counted, and what paired runs made of a slowdown."""
    settings = run["machine_info"][RECORD_KEY].get("settings", {})
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
        **common(run), "dirty": bool((run.get("commit_info") or {}).get("dirty")),
        "profile": settings.get("profile"), "plant": settings.get("plant") or "",
        "run_state": run_state(run).state, "cases": len(run["benchmarks"]),
        # green: every case's verdict passed (after paired runs), as the CI job reports it
        "gate": "red" if counts["regressed"] or counts["over budget"] or counts["no verdict"] else "green",
        "ok": counts["ok"], "regressed": counts["regressed"], "over_budget": counts["over budget"],
        "not_gated": counts["not gated"], "not_compared": counts["not compared"], "no_verdict": counts["no verdict"],
        "first_run_red": sum(paired) + counts["regressed"] - paired[0],
        "paired_confirmed": paired[0], "paired_cleared": paired[1],
        "source": source, "note": note,
    }


def tier_row(
    run: dict[str, Any], command: str, wall_s: float, source: str, note: str = "", pytest_s: float | None = None,
) -> dict[str, Any]:
    """A tier's or command's wall time, from start to exit (and its pytest session's), with the run it stored."""
    settings = run["machine_info"][RECORD_KEY].get("settings", {})
    return {**common(run), "command": command, "tier": settings.get("tier") or "", "cases": len(run["benchmarks"]),
            "pytest_s": "" if pytest_s is None else round(pytest_s, 1), "wall_s": round(wall_s, 1),
            "source": source, "note": note}


def experiment_rows(run: dict[str, Any], source: str, note: str = "") -> list[dict[str, Any]]:
    """One row per training case of a stored run."""
    settings = run["machine_info"][RECORD_KEY].get("settings", {})
    rows = []
    for bench in run["benchmarks"]:
        info = bench.get("extra_info") or {}
        if CASE not in info or info.get(KIND) == INFERENCE_KIND:
            continue
        load = (info.get("load") or {}).get("normalized") or {}
        rows.append({**common(run), "experiment": info.get(EXPERIMENT, ""), "case": info[CASE],
                     "profile": info.get("profile") or settings.get("profile") or "",
                     "loop": info.get("loop_ran", ""), "precision": settings.get("precision") or "",
                     **{k: _round(info.get(k)) for k in ("median_epoch_s", "first_epoch_s", "vram_peak_mib",
                                                         "accuracy")},
                     "train_s": _round(info.get("train_seconds"), 2),
                     "gpu_busy": _round(load.get("gpu_busy")), "sm_activity": _round(load.get("sm_activity")),
                     "source": source, "note": note})
    return rows


def serving_rows(run: dict[str, Any], source: str, note: str = "") -> list[dict[str, Any]]:
    """One row per serving record of a stored run: batch-1 latency (graph replay where
    measured), samples/s at the largest batch, accuracy drop and speed-up."""
    rows = []
    for bench in run["benchmarks"]:
        info = bench.get("extra_info") or {}
        if info.get(KIND) != INFERENCE_KIND:
            continue
        mode = info.get("latency_mode") or ""
        stats = info.get(f"latency_{mode}_s") or {}
        throughput = {k: v for k, v in (info.get("throughput") or {}).items() if isinstance(v, (int, float))}
        batch = max(throughput, key=int, default="")
        rows.append({**common(run), "case": info.get(CASE, ""), "variant": info.get("variant", ""),
                     "impl": info.get("impl", ""), "latency_mode": mode,
                     "p50_us": _us(stats.get("p50")), "p99_us": _us(stats.get("p99")), "batch": batch,
                     "samples_per_s": round(throughput[batch]) if batch != "" else "",
                     "drop_pts": _scaled(info.get("accuracy_drop"), 100), "speedup": _round(info.get("speedup"), 3),
                     "mj_per_1k": _scaled(info.get("energy_j_per_1k"), 1e3),
                     "source": source, "note": note})
    return rows


def _scaled(value: Any, factor: float) -> Any:
    return round(value * factor, 3) if isinstance(value, (int, float)) else ""


def _us(seconds: Any) -> Any:
    return round(seconds * 1e6, 2) if isinstance(seconds, (int, float)) else ""


def _seconds(ms: Any) -> float | None:
    return ms / 1e3 if isinstance(ms, (int, float)) else None


def cell_rows(result: Mapping[str, Any], where: Mapping[str, str], source: str, note: str = "") -> list[dict[str, Any]]:
    """One row per measured cell of bench_cells' result (its --json); `where`: date,
    card, commit and caches."""
    rows = []
    for cell in result.get("cells") or []:
        times = cell.get("times_ms") or {}
        mode = "graph" if times.get("triton_graph_ms") else "eager"  # the mode the tool compares in
        rows.append({**where, **{k: cell[k] for k in ("precision", "batch", "width", "activation")}, "mode": mode,
                     **{f"{column}_us": _us(_seconds(times.get(f"{name}_{mode}_ms")))
                        for column, name in (("torch", "torch"), ("compile", "compile"), ("ours", "triton"))},
                     "speedup_vs_torch": _round(cell.get(f"speedup_{mode}_vs_torch"), 3),
                     "speedup_vs_compile": _round(cell.get(f"speedup_{mode}_vs_compile"), 3),
                     "best_baseline": cell.get("best_baseline") or "",
                     "speedup_vs_best": _round(cell.get("speedup_vs_best"), 3), "source": source, "note": note})
    return rows


def phase_rows(
    setup: Mapping[str, Any], step_us: float, phases: Iterable[tuple[str, float, float | None, float | None]],
    where: Mapping[str, str], source: str, note: str = "",
    inner: Mapping[str, Sequence[float]] | None = None,
) -> list[dict[str, Any]]:
    """One row per phase of step_phases' reading (name, work, barrier, done at), then one per
    part of the first forward tiles (`inner`: name -> median, slowest); `setup`: precision,
    depth, width, batch, blocks."""
    fixed = {**where, **{k: setup[k] for k in ("precision", "depth", "width", "batch", "blocks")},
             "step_us": round(step_us, 2), "source": source}
    rows = [{**fixed, "phase": name, "work_us": work, "barrier_us": "" if barrier is None else barrier,
             "done_us": "" if done is None else done, "note": note}
            for name, work, barrier, done in phases]
    for name, (median, slowest) in (inner or {}).items():
        phase, _, part = name.partition(" ")
        rows.append({**fixed, "phase": f"in {phase}: {part}", "work_us": median, "barrier_us": "", "done_us": "",
                     "note": "; ".join(x for x in (note, f"median over the programs, slowest {slowest}") if x)})
    return rows


def measured_here(card: str, caches: str = "unknown", repo: Path | None = None) -> dict[str, str]:
    """date, card, commit and caches of a measurement this process just made."""
    return {"date": now(), "card": card, "commit": git_commit(repo), "caches": caches}


# ------------------------------------------------------------ the CSV


def read_rows(csv_path: Path) -> tuple[tuple[str, ...], list[dict[str, str]]]:
    """(header, rows) of a CSV of measurements; RowsError naming the file if it is none."""
    try:
        with csv_path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            return tuple(reader.fieldnames or ()), list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise RowsError(f"{csv_path}: cannot be read as CSV: {exc}") from None


def kind_of(csv_path: Path) -> Kind:
    """The kind a CSV's file name declares."""
    kind = KINDS.get(csv_path.stem)
    if kind is None:
        raise RowsError(f"{csv_path}: no kind of measurement is named {csv_path.stem!r} "
                        f"(known: {', '.join(KINDS)})")
    return kind


def csv_problem(csv_path: Path, kind: Kind) -> str | None:
    """Why rows of `kind` cannot be appended to `csv_path`, or None: checked before a
    measurement starts, so a long run never ends on an unusable CSV."""
    if csv_path.is_dir():
        return "is a directory; give the CSV file"
    if not csv_path.is_file() or not csv_path.stat().st_size:
        return None
    try:
        header, _ = read_rows(csv_path)
    except RowsError as exc:
        return str(exc).split(": ", 1)[1]
    if header != kind.fields:
        return f"its header is not that of {kind.stem} ({', '.join(kind.fields)})"
    return None


def append_rows(csv_path: Path, rows: Sequence[dict[str, Any]], kind: Kind | None = None) -> int:
    """Append the rows not yet in `csv_path` (by the kind's key), with the header for a new
    file; how many were written. `kind`: by default the one the file's stem names, else
    gate-runs."""
    kind = kind or KINDS.get(csv_path.stem) or KINDS["gate-runs"]
    key = kind.key or tuple(c for c in kind.fields if c != "note")
    for row in rows:
        if set(row) != set(kind.fields):
            raise RowsError(f"{csv_path}: a {kind.stem} row needs the columns {', '.join(kind.fields)}; "
                            f"this one has {', '.join(row)}")
    seen: set[tuple[str, ...]] = set()
    if csv_path.is_file() and csv_path.stat().st_size:
        header, old = read_rows(csv_path)
        if header != kind.fields:
            raise RowsError(f"{csv_path}: its header is not that of {kind.stem} ({', '.join(kind.fields)})")
        seen = {tuple(r.get(k) or "" for k in key) for r in old}
    new = []
    for row in rows:
        named = tuple("" if row[k] is None else str(row[k]) for k in key)
        if named not in seen:
            seen.add(named)
            new.append(row)
    if not new:
        return 0
    fresh = not csv_path.is_file() or csv_path.stat().st_size == 0
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    with csv_path.open("a", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=kind.fields)
        if fresh:
            writer.writeheader()
        writer.writerows(new)
    return len(new)


def loop_label(config: Mapping[str, Any]) -> str:
    """A training route as loop/impl/optimizer_impl, e.g. graph/triton/triton (the fused step)."""
    return f"{config.get('loop')}/{config.get('impl')}/{config.get('optimizer_impl')}"


def loop_rows(runs: Sequence[tuple[dict[str, Any], str]], note: str = "") -> list[dict[str, Any]]:
    """A row per training record of `runs` ((run, source) pairs): its median epoch and step,
    against the torch.compile route of the same model, precision and profile among them."""
    records = [(run, source, b["extra_info"]) for run, source in runs for b in run["benchmarks"]
               if isinstance(b.get("extra_info", {}).get("median_epoch_s"), (int, float))]

    def shape(info: Mapping[str, Any]) -> tuple[Any, ...]:
        c = info["config"]
        return (c.get("precision"), c.get("depth"), c.get("width"), c.get("batch_size"), c.get("activation"),
                c.get("optimizer"), info.get("profile"))

    compiled = {shape(info): info for _, _, info in records if info["config"].get("impl") == "compile"}
    rows = []
    for run, source, info in records:
        c, frames = info["config"], (info.get("dataset") or {}).get("train_frames")
        steps = math.ceil(frames / c["batch_size"]) if frames and c.get("batch_size") else None
        peer = compiled.get(shape(info))
        against = None if peer is None or peer is info else peer
        rows.append({
            **common(run), "caches": str(info.get(KERNEL_CACHES) or "unknown").split()[0],
            "loop": loop_label(c), "precision": c.get("precision"),
            "config": f"{c.get('depth')}x{c.get('width')} {c.get('activation')}, {c.get('optimizer')}, "
                      f"batch {c.get('batch_size')}, {info.get('profile')} profile ({c.get('epochs')} epochs)",
            "epoch_s": _round(info["median_epoch_s"], 5),
            "step_us": "" if steps is None else round(info["median_epoch_s"] / steps * 1e6, 1),
            "first_epoch_s": _round(info.get("first_epoch_s"), 2),
            "against": "" if against is None else loop_label(against["config"]),
            "against_epoch_s": "" if against is None else _round(against["median_epoch_s"], 5),
            "ratio": "" if against is None else round(against["median_epoch_s"] / info["median_epoch_s"], 3),
            "source": source, "note": "; ".join(x for x in (f"route {info.get('step_route')}", note) if x),
        })
    return rows


def phase_rows_of(result: Mapping[str, Any], source: str, note: str = "") -> list[dict[str, Any]]:
    """The step-phases rows of a `python -m bench.tools.step_phases --json` result."""
    blocks = result["blocks"]
    setup = {**result["config"], "blocks": " ".join(f"{k}={v}" for k, v in blocks.items())
             if isinstance(blocks, dict) else blocks}
    where = {key: result.get(key, "") for key in COMMON}
    return phase_rows(setup, result["per_step_us"],
                      [(p["name"], p["work_us"], p["barrier_us"], p.get("done_us")) for p in result["phases"]],
                      where, source, "; ".join(x for x in (f"{result.get('grid')} programs", note) if x),
                      result.get("inner"))


BUILDERS = {"gate-runs": lambda run, source, note: [gate_row(run, source, note)],
            "experiments": experiment_rows, "serving": serving_rows}
WHOLE = {"loops": loop_rows}  # kinds whose rows read every run at once (a row names its peer in another)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tools.rows", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN.json")
    parser.add_argument("--csv", type=Path, required=True, metavar="FILE", help="the CSV the rows are appended to")
    parser.add_argument("--kind", choices=(*BUILDERS, *WHOLE, "step-phases"), default="gate-runs",
                        help="which rows a run gives. Default: %(default)s")
    parser.add_argument("--note", default="", help="what the rows say of how the runs were made")
    args = parser.parse_args(argv)
    problem = csv_problem(args.csv, KINDS[args.kind])
    if problem:
        parser.error(f"--csv {args.csv}: {problem}")
    rows = []
    for path in args.runs if args.kind == "step-phases" else ():  # step_phases --json results, not run files
        try:
            rows += phase_rows_of(json.loads(path.read_text(encoding="utf-8")), str(path), args.note)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"mlp-loadbench rows: {path}: not a step_phases --json result ({exc!r})", file=sys.stderr)
            return 2
    try:
        if args.kind in WHOLE:
            rows = WHOLE[args.kind]([(read_run(path), str(path)) for path in args.runs], args.note)
        elif args.kind in BUILDERS:
            for path in args.runs:
                rows += BUILDERS[args.kind](read_run(path), str(path), args.note)
    except BaselineError as exc:
        print(f"mlp-loadbench rows: {str(exc).replace('baseline ', 'run ', 1)}", file=sys.stderr)
        return 2
    written = append_rows(args.csv, rows, KINDS[args.kind])
    print(f"appended {written} of {len(rows)} row(s) to {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
