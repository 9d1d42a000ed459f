"""The report: the study's tables and figures, history across commits, the Pareto view.

    python -m bench.tools.report                       # every run in .benchmarks
    python -m bench.tools.report --storage DIR --out reports/
    python -m bench.tools.report run1.json run2.json   # given run files
    python -m bench.tools.report --measurements docs/data --out docs   # docs/measurements.md

Writes into --out ``tables.md``, a resource figure per experiment, ``pareto.png``,
``inference.png`` with ``serving.md``, ``search-<study>.png`` per ``--search`` JSON,
``history.html`` (bench.tools.history) and ``summary.md`` for a CI job summary. Each run
is judged by the gate's rules against the newest earlier run that measured the same
thing, so a planted or other-settings run is never judged against an ordinary one.
Every file is written to a temporary name and renamed. The outputs in full:
docs/reports.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tabulate import tabulate

from kernels.ground.args import directory_problem
from bench.gate.budgets import BudgetError
from bench.gate.budgets import Budgets
from kernels.ground.cases import TITLES
from kernels.ground.cases import study_order
from bench.gate.compare import FAILURE_METRICS
from bench.gate.runs import HISTORY_SETTINGS
from bench.gate.runs import MAX_HISTORY
from bench.gate.compare import check_against
from bench.gate.compare import explain
from bench.gate.runs import same_measurement
from bench.gate.runs import setting
from bench.gate.profiles import DEFAULT_BUDGETS
from bench.tools.history import FIRST_RUN
from bench.tools.history import METRICS
from bench.tools.history import Flagged
from bench.tools.history import Pairing
from bench.tools.history import Section
from bench.tools.history import Summary
from bench.tools.history import history_page
from bench.tools.history import plant_note
from bench.tools.history import run_labels
from bench.tools.history import settings_text
from bench.gate.runs import Run
from bench.gate.runs import by_gpu
from bench.gate.runs import find_run_files
from bench.gate.runs import load_runs
from bench.tools.measurements import PAGE
from bench.tools.measurements import measurements_page
from bench.tools.rows import RowsError
from bench.tools.serving import serving_markdown
from kernels.ground.files import write_atomic
from bench.monitor.series import read_series
from bench.gate.summary import COLUMNS
from bench.gate.summary import bound_note
from bench.gate.summary import bound_table
from bench.gate.summary import study_row

HISTORY_METRICS = tuple(METRICS)  # the history page's charts, in its order
LOAD_METRICS = ("gpu_busy", "sm_activity")  # in extra_info['load']['normalized'], fractions; None: not measured
NO_RUNS = "no mlp-loadbench runs with training cases"
RUN_FIRST = "run `pytest bench/ --benchmark-autosave` first"
SEARCH_FORMAT = "mlp-loadbench-search"  # bench.search.results.FORMAT: the report reads the file, not the package
TIME_NOTE = ("Time(s) is the whole training of the case (its last timed round, where the profile times several): "
             "every epoch, the first included (allocator growth, compilation, autotuning); 1st epoch s is that first "
             "epoch alone. The time gate judges the median of the later epochs (s/epoch in summary.md).")



class ReportError(Exception):
    """Nothing to report; the message says why."""




def png(fig: Any) -> bytes:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return buffer.getvalue()


def by_experiment(run: Run) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for bench in run.cases():
        groups.setdefault(bench["extra_info"]["experiment"], []).append(bench)
    return groups


def tables_markdown(run: Run) -> str:
    """The study's tables of one run, its settings line (unset settings left out) and a
    note on what n/a and Time(s) mean."""
    lines = [f"# mlp-loadbench: {run.gpu}, {run_labels([run])[0]}", ""]
    lines += [f"Settings: {settings_line(run.settings)}", ""]
    if plant_note(run.settings):
        lines += [f"**Planted run**: --plant-slowdown {run.settings['plant']} slowed every timed epoch on purpose "
                  "(the gate's self-test); these times are not the code's own.", ""]
    any_na = False
    for experiment, benches in by_experiment(run).items():
        rows = [study_row(str(b["extra_info"]["case"]).split("-", 1)[1], b["extra_info"]) for b in benches]
        any_na = any_na or any(cell == "n/a" for row in rows for cell in row)
        lines += [f"## {TITLES.get(experiment, experiment)}", ""]
        lines += [tabulate(rows, headers=[TITLES.get(experiment, experiment), *COLUMNS], tablefmt="github",
                           disable_numparse=True), ""]
        labelled = [(str(b["extra_info"]["case"]).split("-", 1)[1], b["extra_info"]) for b in benches]
        lines += [*bound_table(f"{TITLES.get(experiment, experiment)}: step bound", labelled)[1:], ""]
    notes = bound_note(b["extra_info"] for b in run.cases())
    lines += [*notes[1:], ""] if notes else []
    lines += [TIME_NOTE, ""]
    if any_na:
        lines += [na_note(run), ""]
    return "\n".join(lines)


def settings_line(settings: dict[str, Any]) -> str:
    """'profile quick, epochs 22, ...': the settings a run was made with; unset ones
    (None, empty) are left out."""
    return ", ".join(f"{key} {value}" for key, value in settings.items() if value not in (None, "", {}, []))


def na_note(run: Run) -> str:
    """What n/a in the tables means, with the monitor's reasons (load.unavailable) where
    the run recorded them."""
    unavailable = [(b["extra_info"].get("load") or {}).get("unavailable") or {} for b in run.cases()]
    reasons = dict.fromkeys(f"{what}: {why}" for found in unavailable for what, why in found.items())
    if reasons:
        return f"n/a: not measured on this machine ({'; '.join(reasons)}), or not recorded by this run."
    return "n/a: not measured on this machine, or not recorded by this run."


def resolve_series(path: str, roots: Sequence[Path]) -> Path | None:
    """The series file where the run wrote it, or under a root it was copied to."""
    candidate = Path(path)
    if candidate.is_file():
        return candidate
    for root in roots:
        for guess in (root / candidate.parent.name / candidate.name, root / candidate.name):
            if guess.is_file():
                return guess
    return None


def experiment_figures(run: Run, window: int, roots: Sequence[Path], warnings: list[str]) -> dict[str, bytes]:
    from bench.figures.training import resource_figure

    out, unrecorded = {}, []
    for experiment, benches in by_experiment(run).items():
        series = {}
        for bench in benches:
            info = bench["extra_info"]
            if not info.get("series_path"):  # a run that was not stored keeps none
                unrecorded.append(info["case"])
                continue
            found = resolve_series(info["series_path"], roots)
            if found is None:
                warnings.append(f"no series for {info['case']}: {info.get('series_path')} not found")
                continue
            series[info["case"]] = read_series(found)
        if series:
            out[experiment] = png(resource_figure(TITLES.get(experiment, experiment), series, window))
    if unrecorded:  # one line, not one per case
        shown = ", ".join(unrecorded[:5]) + (", ..." if len(unrecorded) > 5 else "")
        warnings.append(f"no series for {len(unrecorded)} case(s) ({shown}): the run recorded none (not stored)")
    return out


def metric_value(info: dict[str, Any] | None, metric: str) -> float | None:
    """A case record's value of a history metric; None where it was not measured."""
    if not info:
        return None
    if metric in LOAD_METRICS:
        return (info.get("load") or {}).get("normalized", {}).get(metric)
    return info.get(metric)


def case_experiments(runs: list[Run]) -> dict[str, str]:
    """case -> experiment over the runs, in the study's order."""
    found = {b["extra_info"]["case"]: b["extra_info"]["experiment"] for r in runs for b in r.cases()}
    return {case: found[case] for case in sorted(found, key=study_order)}


def pairings(runs: list[Run]) -> list[Pairing]:
    """Per run (oldest first, one GPU model): the newest earlier run that measured the same
    thing (same_measurement), which it is judged against, or why there is none."""
    out = []
    for i, run in enumerate(runs):
        same = [j for j in range(i) if same_measurement(runs[j].gpu, runs[j].settings, run.gpu, run.settings)]
        out.append(Pairing(same[-1]) if same else Pairing(None, unpaired_reason(run, runs[:i])))
    return out


def unpaired_reason(run: Run, earlier: list[Run]) -> str:
    """Why no run of `earlier` may judge `run`: none at all, or the settings that set it
    apart from the run before it, e.g. 'no earlier run with the same settings (plant
    150%:host; the run before: plant unset)'."""
    if not earlier:
        return FIRST_RUN
    before = earlier[-1]
    if before.gpu != run.gpu:
        return f"no earlier run on {run.gpu}"
    keys = [k for k in HISTORY_SETTINGS if setting(run.settings, k) != setting(before.settings, k)]
    return (f"no earlier run with the same settings ({settings_text(run.settings, keys)}; "
            f"the run before: {settings_text(before.settings, keys)})")


def regressions(runs: list[Run], budgets: Budgets) -> tuple[dict[str, dict[str, list]], Flagged]:
    """Per metric: case -> values across runs, and the runs that regressed against the
    newest earlier run that measured the same thing (pairings), judged by the gate's own
    rules (check_against) on a noise history of such runs only, so report and gate agree.
    A planted run or one with other settings is judged only against its like.
    Give it the runs of one GPU model (by_gpu): the gate does not judge across models."""
    lines: dict[str, dict[str, list]] = {m: {} for m in HISTORY_METRICS}
    flagged: Flagged = {m: {} for m in HISTORY_METRICS}
    paired = pairings(runs)
    for case, experiment in case_experiments(runs).items():
        infos = [case_info(run, case) for run in runs]
        for metric in HISTORY_METRICS:
            lines[metric][case] = [metric_value(info, metric) for info in infos]
        for i in range(1, len(runs)):
            j = case_baseline(runs, paired, i, case)
            if j is None:
                continue  # nothing measured this case the same way before it: not gated
            now, then = infos[i], infos[j]
            if not now or not then:
                continue  # the case is new or gone: nothing to judge
            profile, dataset = runs[i].settings.get("profile", "quick"), runs[i].settings.get("dataset", "synthetic")
            budget = budgets.resolve(profile, experiment, case, dataset)  # as the gate resolves it
            history = noise_history(runs[: j + 1], case)
            for found in check_against(budget=budget, current=now, baseline=then, history=history):
                failure = explain(found, now, then)  # with the kernels that grew, where both runs hold a trace
                metric = FAILURE_METRICS.get(failure.metric, failure.metric)  # the gate's mapping: time ratio -> median
                flagged.setdefault(metric, {}).setdefault(case, {})[i] = failure.message
    return lines, flagged


def case_baseline(runs: list[Run], paired: list[Pairing], i: int, case: str) -> int | None:
    """The run that judges `case` of run i: its pairing where that run holds the case, else
    the newest earlier run that measured the same thing and holds it (a run of part of
    the matrix, such as the experiments alone, does not hide the rest's history)."""
    j = paired[i].baseline
    if j is None:
        return None
    if case_info(runs[j], case) is not None:
        return j
    same = [k for k in range(j) if same_measurement(runs[k].gpu, runs[k].settings, runs[i].gpu, runs[i].settings)
            and case_info(runs[k], case) is not None]
    return same[-1] if same else None


def case_info(run: Run, case: str) -> dict[str, Any] | None:
    return next((b["extra_info"] for b in run.cases() if b["extra_info"]["case"] == case), None)


def noise_history(earlier: list[Run], case: str) -> list[dict[str, Any]]:
    """The case's records the gate would read for its run-to-run noise with the last of
    `earlier` as baseline: that run and the newest before it on the same GPU model with
    the same settings (compare.load_history, on runs already read), oldest first."""
    baseline = earlier[-1]
    same = [run for run in earlier if same_measurement(run.gpu, run.settings, baseline.gpu, baseline.settings)]
    return [info for info in (case_info(run, case) for run in same[-MAX_HISTORY:]) if info]


def latest_summary(section: Section, runs: int, warnings: list[str]) -> Summary:
    """The newest run of `section` (the newest run's GPU model) against the newest earlier
    run there that measured the same thing; "not gated: WHY" where there is none."""
    latest, last = section.runs[-1], len(section.runs) - 1
    labels, pairing = section.labels, section.pairing(last)
    against = section.runs[pairing.baseline] if pairing.baseline is not None else None
    notes = []
    if plant_note(latest.settings):
        notes.append(f"**Planted run**: --plant-slowdown {latest.settings['plant']} slowed every timed epoch on "
                     "purpose, so its times are not the code's own; it is judged only against runs planted alike.")
    if against is not None:
        notes.append(f"Judged against {labels[pairing.baseline]}, the newest earlier run on this GPU with the same "  # type: ignore[index]
                     f"settings ({settings_text(latest.settings, ('profile', 'epochs', 'dataset'))}).")
    else:
        notes.append(f"Not gated: {pairing.reason}.")
    paired = [section.pairing(k) for k in range(len(section.runs))]
    rows, reasons = [], []
    for bench in latest.cases():
        info = bench["extra_info"]
        marks = {m: cases[info["case"]][last] for m, cases in section.flagged.items()
                 if last in cases.get(info["case"], {})}
        if marks:
            verdict = "REGRESSED: " + ", ".join(marks)
        elif against is None:
            verdict = f"not gated: {pairing.reason}"
        elif case_baseline(section.runs, paired, last, info["case"]) is None:
            verdict = "not gated: no earlier run of this case with the same settings"
        elif case_info(against, info["case"]) is None:
            other = case_baseline(section.runs, paired, last, info["case"])
            verdict = f"ok (against {labels[other]}, the newest run holding it)"  # type: ignore[index]
        else:
            verdict = "ok"
        rows.append([info["case"], f"{info['median_epoch_s']:.4f}", f"{info['accuracy']:.3f}",
                     f"{info['macro_f1']:.3f}", verdict])
        reasons += [(info["case"], metric, message) for metric, message in marks.items()]
    headers = ["case", "s/epoch", "accuracy", "macro-F1", "vs previous comparable run"]
    return Summary(latest.gpu, labels[-1], headers, rows, reasons, runs, list(warnings), notes,
                   labels[pairing.baseline] if pairing.baseline is not None else "")


def summary_markdown(summary: Summary) -> str:
    lines = [f"## mlp-loadbench: {summary.gpu}, {summary.label}", ""]
    for note in summary.notes:  # a paragraph each
        lines += [note, ""]
    lines += [tabulate(summary.rows, headers=summary.headers, tablefmt="github", disable_numparse=True)]
    if summary.reasons:  # which rule of the gate flagged each regression
        lines += ["", f"Regressions against {summary.against}:", ""]
        lines += [f"- {case}, {metric}: {message}" for case, metric, message in summary.reasons]
    lines += ["", f"{summary.runs} run(s) in the history."]
    lines += [f"- warning: {w}" for w in summary.warnings]
    return "\n".join(lines) + "\n"


def sections(runs: list[Run], budgets: Budgets) -> list[Section]:
    """One section per GPU model, the newest run's first, each judged on its own."""
    out = []
    for gpu, group in by_gpu(runs).items():
        lines, flagged = regressions(group, budgets)
        out.append(Section(gpu, group, lines, flagged, case_experiments(group), pairings(group)))
    return out


def build_report(paths: list[Path], out: Path, window: int = 50, series_roots: Sequence[Path] = (),
                 budgets_path: Path = DEFAULT_BUDGETS, searches: Sequence[Path] = (),
                 serving_commits: Sequence[str] = ()) -> tuple[list[Path], list[str]]:
    runs, warnings = load_runs(paths)
    serving = [r for r in runs if r.inference_records()]
    warnings += [f"skipped {r.path}: a run with no training cases" for r in runs if not r.cases() and r not in serving]
    runs = [r for r in runs if r.cases()]
    found = load_searches(searches, warnings)
    if not runs and not serving and not found:
        raise ReportError(nothing_to_report(paths, warnings))
    for commit in serving_commits:
        if not any(_of_commit(r, commit) for r in serving):
            warnings.append(f"--serving-commits {commit}: no serving run of that commit among the runs read")
    joined = serving_runs(serving, serving_commits)
    if serving_commits and not joined:
        known = ", ".join(dict.fromkeys(r.commit for r in serving)) or "none"
        raise ReportError(f"--serving-commits {','.join(serving_commits)}: no serving run of these commits "
                          f"(serving runs read: {known})")
    records = records_of(joined)
    inference = inference_views(records, found)
    written = [write_atomic(out / name, image) for name, image in inference.items()]
    if records:
        written.append(write_atomic(out / "serving.md", serving_markdown(records, serving_title(joined))))
    if not runs:  # serving records or searches only: their views are the report
        return written, warnings
    budgets = Budgets.load(budgets_path)
    latest = runs[-1]
    roots = [*series_roots, latest.path.parent, latest.path.parent.parent]
    written.insert(0, write_atomic(out / "tables.md", tables_markdown(latest)))
    figures = experiment_figures(latest, window, roots, warnings)
    for experiment, image in figures.items():
        written.append(write_atomic(out / f"{experiment}.png", image))
    from bench.figures.training import pareto_figure
    from bench.figures.training import roofline_figure

    pareto = png(pareto_figure([b["extra_info"] for b in latest.cases()]))
    written.append(write_atomic(out / "pareto.png", pareto))
    bounded = [b["extra_info"] for b in latest.cases() if b["extra_info"].get("bound")]
    roofline = png(roofline_figure(bounded)) if bounded else None
    if roofline is not None:
        written.append(write_atomic(out / "roofline.png", roofline))
    history = sections(runs, budgets)  # by_gpu puts the newest run's model first
    plotly = importlib.util.find_spec("plotly") is not None  # the page's charts; the rest needs none
    if not plotly:
        warnings.append("history.html not written: it needs plotly (pip install -e '.[report]')")
    summary = latest_summary(history[0], len(runs), warnings)
    written.append(write_atomic(out / "summary.md", summary_markdown(summary)))
    if plotly:
        images = {"Pareto view (newest run)": pareto}
        if roofline is not None:
            images["Roofline: each case's step and the floor it is nearest (newest run)"] = roofline
        images.update({INFERENCE_TITLES.get(name, f"Search {name[7:-4]}"): image for name, image in inference.items()})
        page = history_page(history, summary, images)
        written.append(write_atomic(out / "history.html", page))
    return written, warnings


INFERENCE_TITLES = {
    "inference.png": "Inference view: accuracy against p99 latency and energy (the joined serving runs)",
}


def load_searches(paths: Sequence[Path], warnings: list[str]) -> list[dict[str, Any]]:
    """The search JSONs that can be read; "skipped PATH: REASON" for each other one."""
    found = []
    for path in paths:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            warnings.append(f"skipped {path}: no such file")
            continue
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            warnings.append(f"skipped {path}: not a readable JSON file ({exc})")
            continue
        if not isinstance(data, dict) or data.get("format") != SEARCH_FORMAT:
            warnings.append(f"skipped {path}: not a search result of python -m bench.search")
            continue
        found.append(data)
    return found


def records_of(runs: list[Run]) -> list[dict[str, Any]]:
    """The serving records of `runs` (oldest first), in the study's order; a case served
    twice shows its newest record."""
    records: dict[tuple[str, str, str], dict[str, Any]] = {}
    for run in runs:  # oldest first: a newer record of a case replaces it
        for record in run.inference_records():
            records[(str(record.get("case")), str(record.get("variant")), str(record.get("impl")))] = record
    return sorted(records.values(), key=lambda r: study_order(str(r.get("case", ""))))


def serving_runs(serving: list[Run], commits: Sequence[str] = ()) -> list[Run]:
    """The runs of one serving view, oldest first: a serving matrix is run a configuration,
    a shard or a GPU at a time. By default the runs of the newest serving run's commit
    and GPU model; a run of an unknown commit stands alone, since nothing says which runs
    belong with it. `commits` (ids or prefixes) joins the runs of those commits instead,
    on the GPU model of the newest of them: for a matrix whose parts were served at
    commits that did not change serving."""
    if commits:
        chosen = [r for r in serving if any(_of_commit(r, c) for c in commits)]
        return [r for r in chosen if r.gpu == chosen[-1].gpu] if chosen else []
    if not serving:
        return []
    newest = serving[-1]
    together = [r for r in serving if r.commit == newest.commit and r.gpu == newest.gpu and r.commit != "unknown"]
    return together or [newest]


def _of_commit(run: Run, given: str) -> bool:
    """Whether a run (short id, or "unknown") was made at a commit id or prefix given on
    the command line."""
    n = min(len(run.commit), len(given))
    return run.commit != "unknown" and n >= 4 and run.commit[:n] == given[:n]


def serving_title(runs: list[Run]) -> str:
    """'GPU, commit X' or, for a joined view, 'GPU, commits X (n configurations), Y (m)':
    each configuration counted under the commit of its newest record."""
    newest_of: dict[str, str] = {}
    for run in runs:
        for record in run.inference_records():
            newest_of[str(record.get("case"))] = run.commit
    tally = Counter(newest_of.values())
    counts = {commit: tally[commit] for commit in dict.fromkeys(r.commit for r in runs) if tally[commit]}
    if len(counts) == 1:
        return f"{runs[-1].gpu}, commit {runs[-1].commit}"
    return f"{runs[-1].gpu}, commits " + ", ".join(f"{c} ({n} configuration{'s' * (n > 1)})" for c, n in counts.items())


def inference_views(records: list[dict[str, Any]], searches: list[dict[str, Any]]) -> dict[str, bytes]:
    """inference.png from serving records, search-<study>.png per search; nothing where
    there is neither (a training-only report has no inference view)."""
    from bench.figures.serving import inference_figure
    from bench.figures.serving import search_figure

    out = {}
    if records:
        out["inference.png"] = png(inference_figure(records))
    for data in searches:
        study = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(data.get("study") or "search"))
        out[f"search-{study}.png"] = png(search_figure(data))
    return out


def nothing_to_report(paths: Sequence[Path], warnings: list[str]) -> str:
    """Why no run could be used, naming each file given and its reason."""
    if not paths:
        return f"{NO_RUNS}: no run files given; {RUN_FIRST}"
    reasons = "; ".join(w.removeprefix("skipped ") for w in warnings)
    return f"{NO_RUNS} in the {len(paths)} file(s) read: {reasons}"


def commit_list(value: str) -> tuple[str, ...]:
    """'<commit>,<commit>': commit ids or prefixes of at least 4 hex digits."""
    commits = tuple(c.strip() for c in value.split(",") if c.strip())
    bad = [c for c in commits if len(c) < 4 or any(ch not in "0123456789abcdef" for ch in c.lower())]
    if not commits or bad:
        raise argparse.ArgumentTypeError(f"{value!r}: give commit ids of at least 4 hex digits, comma-separated")
    return tuple(c.lower() for c in commits)


EPILOG = """\
What it builds (in --out): tables.md, a figure per experiment, pareto.png, summary.md and
history.html; inference.png and serving.md from serving runs; search-<study>.png per --search.

Regressions: each run is judged by the gate's own rules (the limits against a baseline in
--budgets: time beyond noise, accuracy and F1 drops, memory and energy growth) against the
newest earlier run that measured the same thing (compare.same_measurement: one GPU model
and the same profile, epochs, dataset, loop, implementation, precision, planted
slowdown...). A run with no such earlier run is "not gated", and summary.md says why;
summary.md marks each regressed case of the newest run REGRESSED with the rule that
flagged it; history.html marks and lists every regression.

Exit codes: 0 the report was written, regressions or not (the gate that fails a pull
request is pytest's own run; read summary.md for the verdicts); 1 nothing to report (no
run files, none with training cases, serving runs or searches, or no serving run of
--serving-commits); 2 a bad command line or budgets file, or an --out that is not a
folder that can be written (one line).
"""


def write_measurements(folder: Path, out: Path) -> int:
    """measurements.md from the CSVs in `folder`, into `out`."""
    if not folder.is_dir():
        print(f"mlp-loadbench report: --measurements {folder}: not a folder of CSVs", file=sys.stderr)
        return 2
    problem = directory_problem(out)
    if problem:
        print(f"mlp-loadbench report: --out {out}: {problem}", file=sys.stderr)
        return 2
    try:
        page = measurements_page(folder, out)
    except RowsError as exc:
        print(f"mlp-loadbench report: --measurements {exc}", file=sys.stderr)
        return 2
    print(f"wrote {write_atomic(out / PAGE, page)}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tools.report", description=__doc__.split("\n\n")[0],
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="*", type=Path, help="run files (default: every run in --storage)")
    parser.add_argument("--storage", type=Path, default=Path(".benchmarks"),
                        help="pytest-benchmark storage. Default: .benchmarks")
    parser.add_argument("--out", type=Path, default=Path("reports"), help="output folder. Default: reports")
    parser.add_argument("--window", type=int, default=50, choices=(50, 100), help="moving-average window. Default: 50")
    parser.add_argument("--series-root", type=Path, action="append", default=[], help="where series files were copied")
    parser.add_argument("--budgets", type=Path, default=DEFAULT_BUDGETS, help="budgets that define a regression")
    parser.add_argument("--search", type=Path, action="append", default=[], metavar="SEARCH.json",
                        help="a search's result (python -m bench.search) for the inference view; repeatable")
    parser.add_argument("--measurements", type=Path, default=None, metavar="DIR",
                        help="write only measurements.md into --out: the tables of every CSV of rows in DIR "
                             "(docs/data; bench/tools/rows.py)")
    parser.add_argument("--serving-commits", type=commit_list, default=(), metavar="SHA[,SHA...]",
                        help="join the serving runs of these commits in inference.png and serving.md "
                             "(default: the newest serving run's commit)")
    args = parser.parse_args(argv)
    if args.measurements is not None:
        return write_measurements(args.measurements, args.out)
    paths = list(args.runs) or find_run_files(args.storage)
    if not paths and not args.search:
        print(f"mlp-loadbench report: {NO_RUNS} in {args.storage}: no run files there; {RUN_FIRST}", file=sys.stderr)
        return 1
    problem = directory_problem(args.out, keep=False)  # made when the report is written
    if problem:
        print(f"mlp-loadbench report: --out {args.out}: {problem}", file=sys.stderr)
        return 2
    try:
        written, warnings = build_report(paths, args.out, args.window, args.series_root, args.budgets, args.search,
                                         args.serving_commits)
    except ReportError as exc:
        print(f"mlp-loadbench report: {exc}", file=sys.stderr)
        return 1
    except BudgetError as exc:
        print(f"mlp-loadbench report: --budgets {exc}", file=sys.stderr)
        return 2
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if (args.out / "tables.md") in written:
        print((args.out / "tables.md").read_text())
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
