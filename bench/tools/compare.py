"""Judge two saved runs with the gate's rules, outside pytest, or export one run's figures.

    python -m bench.tools.compare OLD NEW                      # Markdown for a job summary
    python -m bench.tools.compare OLD NEW --json --out verdicts.json
    python -m bench.tools.compare --export bencher bmf.json NEW   # NEW's figures only, no judgement

OLD and NEW are run files (pytest-benchmark storage, --benchmark-json, run.partial.json).
Each case of NEW is judged against OLD's record of it through the gate's one judge, as
the fixture and the serving test judge against --benchmark-compare's baseline, with the
noise history read from the runs beside OLD; two runs that did not measure the same
thing are shown, not gated, by the session's rule (bench.gate.compare.gating: a planted
NEW is judged against an unplanted OLD). pytest-benchmark's own compare judges nothing
of extra_info, hence this command.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tabulate import tabulate

from kernels.ground.cases import study_order
from bench.gate.budgets import Budget
from bench.gate.budgets import BudgetError
from bench.gate.budgets import Budgets
from bench.gate.budgets import InferenceBudget
from bench.gate.budgets import dataset_key
from bench.gate.budgets import floors_unjudged
from bench.gate.compare import DIRECTIONS
from bench.gate.compare import SERVING_DIRECTIONS
from bench.gate.compare import Delta
from bench.gate.compare import Gating
from bench.gate.compare import deltas
from bench.gate.compare import failed_metrics
from bench.gate.compare import gating
from bench.gate.compare import is_number
from bench.gate.compare import planted_note
from bench.gate.judge import judge as judge_record
from bench.gate.profiles import DEFAULT_BUDGETS
from bench.gate.runs import BaselineError
from bench.gate.runs import Run
from bench.gate.runs import case_history
from bench.gate.runs import find_run_files
from bench.gate.runs import is_inference
from bench.gate.runs import load_history
from bench.gate.runs import read_run
from bench.gate.runs import unreadable_reason
from bench.gate.timing import CALL_TIME
from bench.gate.timing import EPOCH_TIME
from bench.gate.timing import MEDIAN_CALL
from bench.gate.timing import TIMED_CALL
from bench.gate.timing import call_samples
from bench.gate.timing import latency_rounds
from bench.gate.timing import time_note
from bench.gate.timing import time_samples
from bench.gate.runs import run_state
from bench.gate.verdict import NOT_GATED
from bench.gate.verdict import REGRESSED
from bench.gate.verdict import Verdict
from kernels.ground.files import write_atomic

PROG = "mlp-loadbench compare"
TRAINING = "training"
SERVING = "serving"
CALLS = "calls"  # a timed call: a kernel cell, a batch-1 forward, the monitor's overhead
CALL_DIRECTIONS = {MEDIAN_CALL: -1}
EXPORTS = ("github-action-benchmark", "bencher")




class CompareError(ValueError):
    """Input that cannot be compared; the message names the file and the problem in one line."""


@dataclass(frozen=True)
class RunFile:
    """One run file as read: its role on the command line, the raw run and its `Run` view."""

    role: str  # "OLD" or "NEW"
    path: Path
    data: dict[str, Any]
    run: Run

    @property
    def title(self) -> str:
        when = self.run.datetime[:16].replace("T", " ") or "no date"
        return f"`{self.run.commit}` {when} on {self.run.gpu}"


@dataclass(frozen=True)
class Case:
    """One case of a run: a training case or a serving record, by its benchmark fullname."""

    label: str  # the case id; a serving record's "case variant impl"
    fullname: str
    kind: str  # TRAINING or SERVING
    info: dict[str, Any]  # the benchmark's extra_info


@dataclass(frozen=True)
class Judged:
    """The verdict on one case of NEW, with its record and OLD's (None: a new case)."""

    case: Case
    verdict: Verdict
    old: dict[str, Any] | None
    deltas: dict[str, Delta]

    def as_dict(self) -> dict[str, Any]:
        return {"case": self.case.label, "fullname": self.case.fullname, "kind": self.case.kind,
                "verdict": self.verdict.as_dict(), "deltas": {m: d.as_dict() for m, d in self.deltas.items()}}


# ------------------------------------------------------------------------ reading


def read(path: Path, role: str) -> RunFile:
    """A run file with at least one training case or serving record; CompareError otherwise."""
    where = f"{role} {path}"
    if not path.exists():
        raise CompareError(f"{where}: no such file")
    if path.is_dir():
        raise CompareError(f"{where}: a directory; give one run file (e.g. .benchmarks/<machine>/0001_x.json)")
    try:
        empty = path.stat().st_size == 0
    except OSError as exc:
        raise CompareError(f"{where}: cannot be read: {exc.strerror or exc}") from None
    if empty:
        raise CompareError(f"{where}: empty file")
    try:
        data = read_run(path)
    except BaselineError as exc:
        raise CompareError(f"{where}: {unreadable_reason(path, exc)}") from None
    if not isinstance(data["machine_info"], dict) or not isinstance(data["machine_info"].get("loadbench"), dict):
        raise CompareError(f"{where}: machine_info.loadbench is not an object")
    if not data["benchmarks"]:
        raise CompareError(f"{where}: a run with no benchmarks")
    for index, bench in enumerate(data["benchmarks"]):
        if not isinstance(bench, dict) or not isinstance(bench.get("fullname"), str):
            raise CompareError(f"{where}: benchmarks[{index}] has no 'fullname'")
        if not isinstance(bench.get("extra_info", {}), dict):
            raise CompareError(f"{where}: benchmarks[{index}] ({bench['fullname']}): 'extra_info' is not an object")
    commit = str(data.get("commit_info", {}).get("id") or "unknown")
    run = Run(path=path, datetime=str(data.get("datetime", "")), commit=commit[:8],
              gpu=gpu_of(data), settings=data["machine_info"]["loadbench"].get("settings") or {},
              benchmarks=data["benchmarks"])
    found = RunFile(role, path, data, run)
    if not cases_of(found):
        count = len(data["benchmarks"])
        raise CompareError(f"{where}: no training cases or serving records among its {count} benchmark(s)")
    return found


def gpu_of(data: dict[str, Any]) -> str:
    gpu = data["machine_info"]["loadbench"].get("gpu") or {}
    return str(gpu.get("name") or "no GPU")


def cases_of(run_file: RunFile) -> list[Case]:
    """Training cases, then serving records, each in the study's order, then the timed
    calls (kernel cells, batch-1 forwards, the monitor's overhead) in the run's order."""
    training = [(b["extra_info"]["case"], b) for b in run_file.run.cases()]
    serving = sorted((b for b in run_file.run.benchmarks if is_inference(b.get("extra_info", {}))),
                     key=lambda b: study_order(str(b["extra_info"].get("case", ""))))
    found = [Case(str(label), b["fullname"], TRAINING, b["extra_info"]) for label, b in training]
    for b in serving:
        info = b["extra_info"]
        label = " ".join(str(info.get(key, "?")) for key in ("case", "variant", "impl"))
        found.append(Case(label, b["fullname"], SERVING, info))
    kept = {case.fullname for case in found}
    for b in run_file.run.benchmarks:
        if b["fullname"] not in kept and call_samples(b.get("extra_info", {})):
            found.append(Case(str(b.get("name") or b["fullname"]), b["fullname"], CALLS, b["extra_info"]))
    return unique_labels(found, {b["fullname"]: str(b.get("name") or b["fullname"]) for b in run_file.run.benchmarks})


def unique_labels(cases: list[Case], names: dict[str, str]) -> list[Case]:
    """The cases, a label two benchmarks share given the test's name too."""
    counts: dict[str, int] = {}
    for case in cases:
        counts[case.label] = counts.get(case.label, 0) + 1
    return [case if counts[case.label] == 1 else Case(f"{case.label} ({names[case.fullname]})", case.fullname,
                                                       case.kind, case.info)
            for case in cases]


def history_candidates(given: Sequence[Path] | None, old: RunFile, new: RunFile) -> list[Path]:
    """The files load_history may read for OLD's noise history: the paths given (a folder
    gives its run files, in pytest-benchmark's storage layout or flat), else every run
    file beside OLD. NEW is never its own baseline's history."""
    if given is None:
        paths = sorted(old.path.parent.glob("*.json"))
    else:
        paths = []
        for path in given:
            if not path.exists():
                raise CompareError(f"--history {path}: no such file or directory")
            paths += find_run_files(path) if path.is_dir() else [path]
    return [p for p in paths if p.resolve() != new.path.resolve()]


# ------------------------------------------------------------------------ judging


def gating_of(old: RunFile, new: RunFile) -> Gating:
    """Whether OLD may gate NEW, by the session's rule (bench.gate.compare.gating)."""
    return gating(new.run.gpu, new.run.settings, old.run.gpu, old.run.settings, run="NEW", baseline="OLD")


def judge(old: RunFile, new: RunFile, budgets: Budgets, history: list[dict[str, Any]], *,
          budgets_too: bool = False) -> list[Judged]:
    """The verdict on every case of NEW against OLD, as the fixture (training) and the
    serving test judge a case against their baseline. `history`: OLD and the stored runs
    that tell each case's noise (compare.load_history). Floors and ceilings judge NEW alone
    and count only with `budgets_too`."""
    found = gating_of(old, new)
    saved = {b["fullname"]: b.get("extra_info", {}) for b in old.run.benchmarks}
    profile = str(new.run.settings.get("profile", "quick"))
    dataset = str(new.run.settings.get("dataset", "synthetic"))
    epochs = new.run.settings.get("epochs")
    untimed = time_note(new.run.settings.get("time_gated", True), str(new.run.settings.get("device", "")))
    judged = []
    for case in cases_of(new):
        then = saved.get(case.fullname)
        verdict = judge_record(
            case.info, budget_of(budgets, profile, dataset, case), then=then,
            history=case_history(history, case.fullname) if then is not None else (),
            baseline=str(old.path), gating=found.gates,
            reason=found.reason if then is not None else "a new case: not in OLD",
            profile=profile, epochs=epochs, budgets_too=budgets_too and case.kind != CALLS, time_note=untimed,
            timed=CALL_TIME if case.kind == CALLS else EPOCH_TIME,
        ).verdict
        directions = SERVING_DIRECTIONS if case.kind == SERVING else CALL_DIRECTIONS if case.kind == CALLS \
            else DIRECTIONS
        judged.append(Judged(case, verdict, then, deltas(case.info, then, directions) if then is not None else {}))
    return judged


def budget_of(budgets: Budgets, profile: str, dataset: str, case: Case) -> Budget | InferenceBudget:
    """The limits on a saved record: a training case's budget, or a serving record's."""
    record = case.info
    if case.kind == CALLS:  # the budget judge_calls gave it: its time_* keys
        called = record.get(TIMED_CALL) or {}
        return budgets.resolve(profile, str(called.get("experiment", "")), str(called.get("case", "")), dataset)
    if case.kind == TRAINING:
        return budgets.resolve(profile, str(record.get("experiment", "")), str(record.get("case", "")), dataset)
    return budgets.resolve_inference(profile, str(record.get("variant", "")), str(record.get("case", "")), dataset)


# ------------------------------------------------------------------------ Markdown


def markdown(old: RunFile, new: RunFile, judged: list[Judged], notes: list[str]) -> str:
    """The job summary: both runs, a table of training cases and one of serving records,
    the broken rules with their numbers, and the notes."""
    counts: dict[str, int] = {}
    for item in judged:
        key = "new" if item.old is None else item.verdict.status
        counts[key] = counts.get(key, 0) + 1
    lines = [
        f"### mlp-loadbench compare: OLD {old.title} → NEW {new.title}",
        "",
        f"OLD `{old.path}`, NEW `{new.path}`: {len(judged)} case(s) of NEW; "
        + ", ".join(f"{n} {status}" for status, n in sorted(counts.items())),
    ]
    found = gating_of(old, new)
    reason = found.reason
    if reason:
        lines += ["", f"**Not gated**: {reason}."]
    if found.planted:
        lines += ["", f"**Planted**: NEW's {planted_note(found, 'OLD')}."]
    training = [item for item in judged if item.case.kind == TRAINING]
    serving = [item for item in judged if item.case.kind == SERVING]
    calls = [item for item in judged if item.case.kind == CALLS]
    if training:
        rows = [[item.case.label, cell(item, "median_epoch_s", seconds), cell(item, "accuracy", score),
                 cell(item, "macro_f1", score), verdict_cell(item, reason)] for item in training]
        lines += ["", tabulate(rows, ["case", "median epoch", "accuracy", "macro-F1", "verdict"], tablefmt="github")]
    if serving:
        rows = [[item.case.label, cell(item, "latency_p99_s", microseconds), cell(item, "accuracy", score),
                 cell(item, "accuracy_drop", score), verdict_cell(item, reason)] for item in serving]
        headers = ["serving", "batch-1 p99", "accuracy", "drop vs fp32", "verdict"]
        lines += ["", tabulate(rows, headers, tablefmt="github")]
    if calls:
        rows = [[item.case.label, cell(item, MEDIAN_CALL, microseconds), verdict_cell(item, reason)] for item in calls]
        lines += ["", tabulate(rows, ["timed call", "median call", "verdict"], tablefmt="github")]
    broken = [item for item in judged if item.verdict.failures]
    if broken:
        regressed = any(item.verdict.status == REGRESSED for item in broken)
        lines += ["", "#### Regressions" if regressed else "#### Over budget", ""]
        for item in broken:
            lines.append(f"- **{item.case.label}** ({item.verdict.status}, `{item.case.fullname}`)")
            for failure in item.verdict.failures:
                # explain() adds the kernels that grew on lines of their own: nested items,
                # since a table-free summary still folds bare continuation lines into one.
                first, *rest = failure.message.splitlines()
                lines.append(f"  - {first}")
                lines += [f"    - {line.strip()}" for line in rest if line.strip()]
    if notes:
        lines += ["", *(f"- {note}" for note in notes)]
    return "\n".join(lines) + "\n"


def cell(item: Judged, metric: str, show: Callable[[float, float | None], str]) -> str:
    """NEW's value, with OLD's and the change where OLD holds the case."""
    new = item.case.info.get(metric)
    if not is_number(new):
        return "–"
    old = item.old.get(metric) if item.old is not None else None
    return show(new, old if is_number(old) else None)


def seconds(new: float, old: float | None) -> str:
    return f"{new:.4g} s" if old is None else f"{old:.4g} → {new:.4g} s ({relative(new, old)})"


def microseconds(new: float, old: float | None) -> str:
    return f"{new * 1e6:.4g} us" if old is None else f"{old * 1e6:.4g} → {new * 1e6:.4g} us ({relative(new, old)})"


def score(new: float, old: float | None) -> str:
    return f"{new:.4f}" if old is None else f"{old:.4f} → {new:.4f} ({new - old:+.4f})"


def relative(new: float, old: float) -> str:
    return f"{new / old - 1:+.1%}" if old else "from 0"


def verdict_cell(item: Judged, run_reason: str) -> str:
    """The status, the metrics that broke, or a reason that is this case's alone."""
    verdict = item.verdict
    if verdict.failures:
        return f"**{verdict.status}**: " + ", ".join(sorted(failed_metrics(verdict.failures)))
    if verdict.status == NOT_GATED and verdict.reason == run_reason:
        return verdict.status  # the run-wide reason heads the summary
    return f"{verdict.status} ({verdict.reason})" if verdict.reason else verdict.status


def notes_of(old: RunFile, new: RunFile, judged: list[Judged], budgets: Budgets, budgets_too: bool) -> list[str]:
    """What the reader should know beside the verdicts: unknown noise, cases on one side
    only, and which budgets were left out."""
    notes = [f"{side.role} is not a whole run: {run_state(side.data).line()}" for side in (old, new)
             if not run_state(side.data).whole]
    gated = gating_of(old, new).gates
    unknown = [item for item in judged if gated and item.verdict.noise is not None and not item.verdict.noise["known"]]
    if unknown:
        notes.append(f"noise unknown for {len(unknown)} case(s): a conservative bound applied "
                     "(fewer than 3 stored runs of the case beside OLD; give more with --history)")
    fresh = [item.case.label for item in judged if item.old is None]
    if fresh:
        notes.append(f"{len(fresh)} case(s) not in OLD, not compared: {', '.join(fresh)}")
    ours = {case.fullname for case in cases_of(new)}
    gone = [case.label for case in cases_of(old) if case.fullname not in ours]
    if gone:
        notes.append(f"{len(gone)} case(s) of OLD not in NEW: {', '.join(gone)}")
    dataset = str(new.run.settings.get("dataset", "synthetic"))
    if budgets_too and not budgets.covers(dataset):
        notes.append(f"no floors or ceilings for dataset {dataset_key(dataset)!r} in {budgets.path}")
    skipped = floors_unjudged(str(new.run.settings.get("profile", "quick")), new.run.settings.get("epochs"))
    if budgets_too and skipped:
        notes.append(f"accuracy and F1 floors not judged: {skipped}")
    if not budgets_too:
        notes.append("floors and ceilings (they judge one run, not a pair) left out; --budgets-too adds them")
    return notes


# ------------------------------------------------------------------------ exports


@dataclass(frozen=True)
class Metric:
    """One figure of one case for a dashboard: value, unit, and a range where measured."""

    name: str  # of the metric, e.g. "median epoch"
    slug: str  # Bencher's measure slug
    unit: str
    value: float
    lower: float | None = None
    upper: float | None = None
    about: str = ""  # how the range was taken


def metrics_of(case: Case) -> list[Metric]:
    """The figures a dashboard tracks for a case; a figure not measured (None) is left out."""
    info, out = case.info, []
    if case.kind == TRAINING:
        median = info.get("median_epoch_s")
        if is_number(median):
            samples = time_samples(info)
            low, high = quartiles(samples) if len(samples) >= 2 else (None, None)
            about = f"IQR of {len(samples)} epochs (each round's first left out)" if low is not None else ""
            out.append(bounded(Metric("median epoch", "median-epoch-s", "s", median), low, high, about))
        if is_number(info.get("accuracy")):
            out.append(Metric("accuracy", "accuracy", "fraction", info["accuracy"]))
        if is_number(info.get("energy_per_epoch_j")):
            out.append(Metric("energy per epoch", "energy-per-epoch-j", "J", info["energy_per_epoch_j"]))
    else:
        p99 = info.get("latency_p99_s")
        if is_number(p99):
            rounds = [r for r in latency_rounds(info) if is_number(r)]
            low, high = (min(rounds), max(rounds)) if rounds else (None, None)
            about = f"min-max of {len(rounds)} rounds' p99" if rounds else ""
            out.append(bounded(Metric("batch-1 p99", "batch1-p99-us", "us", p99 * 1e6), low and low * 1e6,
                               high and high * 1e6, about))
        if is_number(info.get("accuracy")):
            out.append(Metric("accuracy", "accuracy", "fraction", info["accuracy"]))
    return out


def quartiles(samples: list[float]) -> tuple[float, float]:
    q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return q1, q3


def bounded(metric: Metric, low: float | None, high: float | None, about: str) -> Metric:
    """The metric with its range where the range holds its value."""
    if low is None or high is None or not low <= metric.value <= high:
        return metric
    return Metric(metric.name, metric.slug, metric.unit, metric.value, low, high, about)


def github_action_benchmark(run_file: RunFile) -> list[dict[str, Any]]:
    """github-action-benchmark's `customSmallerIsBetter` input: one entry per case and
    metric, {name, unit, value, range?, extra?}. Accuracy is not smaller-is-better, so it
    goes out as the error rate, 1 - accuracy."""
    entries = []
    for case in cases_of(run_file):
        for metric in metrics_of(case):
            entry: dict[str, Any] = {"name": f"{case.label} {metric.name}", "unit": metric.unit, "value": metric.value}
            if metric.slug == "accuracy":
                entry.update(name=f"{case.label} error rate (1 - accuracy)", value=1 - metric.value)
            if metric.lower is not None and metric.upper is not None:
                entry["range"] = f"{metric.lower:.6g} .. {metric.upper:.6g} {metric.unit} ({metric.about})"
            entry["extra"] = f"{case.fullname}\ncommit {run_file.run.commit}, {run_file.run.gpu}"
            entries.append(entry)
    return entries


def bencher(run_file: RunFile) -> dict[str, dict[str, dict[str, float]]]:
    """Bencher Metric Format: {case: {measure slug: {value, lower_value?, upper_value?}}}.
    Accuracy stays accuracy (Bencher's thresholds take a lower boundary)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for case in cases_of(run_file):
        measures = {}
        for metric in metrics_of(case):
            measure = {"value": metric.value}
            if metric.lower is not None and metric.upper is not None:
                measure.update(lower_value=metric.lower, upper_value=metric.upper)
            measures[metric.slug] = measure
        if measures:
            out[case.label] = measures
    return out


WRITERS: dict[str, Callable[[RunFile], Any]] = {"github-action-benchmark": github_action_benchmark, "bencher": bencher}


# ------------------------------------------------------------------------ command


def parse_export(value: str) -> str:
    if value not in EXPORTS:
        raise argparse.ArgumentTypeError(f"{value!r} is not an export format: use {' or '.join(EXPORTS)}")
    return value


USAGE = """\
python -m bench.tools.compare [options] OLD NEW
       python -m bench.tools.compare --export FORMAT FILE [--export FORMAT FILE] NEW"""
EPILOG = """\
judgement: a case regresses by the rules of bench/budgets.toml against OLD's record of it
(time beyond the case's noise and significant, accuracy and F1 drops, memory and energy
growth; a serving record's batch-1 p99 and a trade-off variant's drop growth). Floors and
ceilings judge one run, not a pair: only --budgets-too adds them (a case beyond one is
"over budget"). The noise history is OLD with the runs beside it (or --history) on the same
GPU model with the same settings; with fewer than 3 the noise is unknown and the budget's
conservative bound applies.

exports (the figures of NEW, the run being published; a figure not measured is left out):
  github-action-benchmark FILE  a list of {name, unit, value, range, extra} for its
      customSmallerIsBetter tool: "<case> median epoch" (s, range: IQR of the epochs),
      "<case> error rate (1 - accuracy)" (accuracy is not smaller-is-better),
      "<case> energy per epoch" (J), "<case> batch-1 p99" (us, range: min-max of rounds).
  bencher FILE  Bencher Metric Format, {"<case>": {"<measure>": {value, lower_value,
      upper_value}}}, measures median-epoch-s, accuracy, energy-per-epoch-j, batch1-p99-us.

exit status: 0 nothing regressed (or export only), 1 a case regressed (or, with
--budgets-too, is over budget), 2 unusable input (one line on stderr names the file):
OLD and NEW one file, or --out or --export naming a run it reads, among them."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.tools.compare", usage=USAGE, description=__doc__.split("\n\n")[0],
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path, metavar="RUN",
                   help="OLD NEW, the runs to judge; with --export, NEW alone: export, judge nothing")
    p.add_argument("--budgets", type=Path, default=DEFAULT_BUDGETS, metavar="PATH",
                   help="budgets, resolved with NEW's profile and dataset. Default: bench/budgets.toml")
    p.add_argument("--budgets-too", action="store_true",
                   help="also judge NEW against the floors and ceilings (not only against OLD)")
    history = p.add_mutually_exclusive_group()
    history.add_argument("--history", type=Path, action="append", metavar="DIR_OR_FILE",
                         help="stored runs for each case's run-to-run noise (repeatable; a folder gives its "
                              "run files). Default: the run files beside OLD")
    history.add_argument("--no-history", action="store_true", help="OLD alone tells the noise")
    p.add_argument("--json", action="store_true",
                   help="a JSON list of {case, fullname, kind, verdict, deltas} instead of Markdown")
    p.add_argument("--out", type=Path, metavar="FILE", help="write the Markdown or JSON here instead of stdout")
    p.add_argument("--export", nargs=2, action="append", default=[], metavar=("FORMAT", "FILE"),
                   help=f"write NEW's figures as FORMAT ({', '.join(EXPORTS)}) to FILE; repeatable")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    for index, (format_, _) in enumerate(args.export):
        try:
            args.export[index][0] = parse_export(format_)
        except argparse.ArgumentTypeError as exc:
            p.error(f"--export: {exc}")
    if len(args.runs) > 2:
        p.error(f"give OLD NEW (two run files), not {len(args.runs)}")
    if len(args.runs) == 1 and not args.export:
        p.error("give OLD NEW to compare; one run file only with --export")
    try:
        return run(args)
    except (CompareError, BudgetError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file (a link, another spelling of the path)."""
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and a.samefile(b))
    except OSError:
        return False


def check_paths(runs: Sequence[Path], outputs: Sequence[tuple[str, Path]]) -> None:
    """CompareError when OLD and NEW are one file (a run judged against itself passes,
    whatever it holds) or an output would be written over a run it reads."""
    if len(runs) == 2 and same_file(*runs):
        raise CompareError(f"OLD {runs[0]} and NEW {runs[1]} are the same file: give two runs")
    for option, path in outputs:
        for role, run in zip(("OLD", "NEW") if len(runs) == 2 else ("NEW",), runs):
            if same_file(path, run):
                raise CompareError(f"{option} {path}: is {role}, a run this reads; write elsewhere")


def run(args: argparse.Namespace) -> int:
    outputs = [("--export", Path(path)) for _, path in args.export]
    check_paths(args.runs, outputs + ([("--out", args.out)] if args.out is not None else []))
    if len(args.runs) == 1:
        new = read(args.runs[0], "NEW")
        for format_, path in args.export:
            entries = WRITERS[format_](new)
            write(Path(path), json.dumps(entries, indent=2) + "\n", "--export")
            print(f"wrote {path}: {format_}, {len(entries)} {'entries' if isinstance(entries, list) else 'cases'}")
        return 0
    old, new = read(args.runs[0], "OLD"), read(args.runs[1], "NEW")
    ours = {case.fullname for case in cases_of(new)}
    if not any(case.fullname in ours for case in cases_of(old)):
        raise CompareError(f"no case in common: NEW {new.path} has {len(ours)} case(s), none of them in OLD {old.path}")
    budgets = Budgets.load(args.budgets)
    candidates = [] if args.no_history else history_candidates(args.history, old, new)
    history = load_history(old.path, old.data, candidates)
    judged = judge(old, new, budgets, history, budgets_too=args.budgets_too)
    if args.json:
        text = json.dumps([item.as_dict() for item in judged], indent=2) + "\n"
    else:
        text = markdown(old, new, judged, notes_of(old, new, judged, budgets, args.budgets_too))
    for format_, path in args.export:
        write(Path(path), json.dumps(WRITERS[format_](new), indent=2) + "\n", "--export")
    if args.out is not None:
        write(args.out, text, "--out")
    else:
        sys.stdout.write(text)
    return 0 if all(item.verdict.passed for item in judged) else 1


def write(path: Path, text: str, option: str) -> None:
    try:
        write_atomic(path, text)
    except OSError as exc:
        raise CompareError(f"{option} {path}: cannot be written: {exc.strerror or exc}") from None


if __name__ == "__main__":
    sys.exit(main())
