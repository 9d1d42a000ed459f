"""The report: the study's tables and figures, history across commits, the Pareto view.

    python -m bench.tools.report                       # every run in .benchmarks
    python -m bench.tools.report --storage DIR --out reports/
    python -m bench.tools.report run1.json run2.json   # given run files

Writes into --out: ``tables.md``, ``<experiment>.png`` (resources over the run, one
line per value, smoothed), ``pareto.png``, ``history.html`` (self-contained: images
embedded) and ``summary.md`` (fit for a CI job summary). The tables, figures and
Pareto view describe the newest run; the history covers every run read. Every file
is written to a temporary name and renamed, so a report is never half-written.
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tabulate import tabulate

from bench.plugin.budgets import Budgets
from bench.cases import TITLES
from bench.plugin.compare import DIRECTIONS
from bench.plugin.compare import FAILURE_METRICS
from bench.plugin.compare import HISTORY_SETTINGS
from bench.plugin.compare import MAX_HISTORY
from bench.plugin.compare import check_against
from bench.plugin.compare import explain
from bench.plugin.options import DEFAULT_BUDGETS
from bench.tools.runs import Run
from bench.tools.runs import find_run_files
from bench.tools.runs import load_runs
from bench.monitor.series import read_series
from bench.plugin.summary import COLUMNS
from bench.plugin.summary import study_row

HISTORY_METRICS = {  # extra_info key: title; direction from DIRECTIONS
    "median_epoch_s": "median epoch time (s)",
    "accuracy": "test accuracy",
    "macro_f1": "macro-F1",
    "vram_peak_mib": "allocator peak (MiB)",
    "rss_peak_mib": "process RSS peak (MiB)",
    "energy_per_epoch_j": "energy per epoch (J)",
}
NO_RUNS = "no mlp-loadbench runs with training cases"
RUN_FIRST = "run `pytest bench/ --benchmark-autosave` first"

# metric -> case -> index of the run that regressed against the one before -> the gate's message
Flagged = dict[str, dict[str, dict[int, str]]]


class ReportError(Exception):
    """Nothing to report; the message says why."""


def write_atomic(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(raw)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; reports are for reading
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


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
    lines = [f"# mlp-loadbench: {run.gpu}, {run.label}", ""]
    settings = ", ".join(f"{k} {v}" for k, v in run.settings.items())
    lines += [f"Settings: {settings}", ""]
    for experiment, benches in by_experiment(run).items():
        rows = [study_row(str(b["extra_info"]["case"]).split("-", 1)[1], b["extra_info"]) for b in benches]
        lines += [f"## {TITLES.get(experiment, experiment)}", ""]
        lines += [tabulate(rows, headers=[TITLES.get(experiment, experiment), *COLUMNS], tablefmt="github",
                           disable_numparse=True), ""]  # fmt: skip
    return "\n".join(lines)


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
    from bench.tools.figures import resource_figure

    out = {}
    for experiment, benches in by_experiment(run).items():
        series = {}
        for bench in benches:
            info = bench["extra_info"]
            found = resolve_series(info.get("series_path", ""), roots)
            if found is None:
                warnings.append(f"no series for {info['case']}: {info.get('series_path')} not found")
                continue
            series[info["case"]] = read_series(found)
        if series:
            out[experiment] = png(resource_figure(TITLES.get(experiment, experiment), series, window))
    return out


def regressions(runs: list[Run], budgets: Budgets) -> tuple[dict[str, dict[str, list]], Flagged]:
    """Per metric: case -> values across runs, and the runs that regressed against the run
    before them, judged by the gate's own rules (check_against) so report and gate agree."""
    lines: dict[str, dict[str, list]] = {m: {} for m in HISTORY_METRICS}
    flagged: Flagged = {m: {} for m in HISTORY_METRICS}
    cases = sorted({b["extra_info"]["case"]: b["extra_info"]["experiment"] for r in runs for b in r.cases()}.items())
    for case, experiment in cases:
        infos = [case_info(run, case) for run in runs]
        for metric in HISTORY_METRICS:
            lines[metric][case] = [info.get(metric) if info else None for info in infos]
        for i in range(1, len(runs)):
            now, then = infos[i], infos[i - 1]
            if not now or not then:
                continue  # the case is new or gone: nothing to judge
            profile, dataset = runs[i].settings.get("profile", "quick"), runs[i].settings.get("dataset", "synthetic")
            budget = budgets.resolve(profile, experiment, case, dataset)  # as the gate resolves it
            history = noise_history(runs[:i], case)
            for found in check_against(budget=budget, current=now, baseline=then, history=history):
                failure = explain(found, now, then)  # with the kernels that grew, where both runs hold a trace
                metric = FAILURE_METRICS.get(failure.metric, failure.metric)  # the gate's mapping: time ratio -> median
                flagged.setdefault(metric, {}).setdefault(case, {})[i] = failure.message
    return lines, flagged


def case_info(run: Run, case: str) -> dict[str, Any] | None:
    return next((b["extra_info"] for b in run.cases() if b["extra_info"]["case"] == case), None)


def noise_history(earlier: list[Run], case: str) -> list[dict[str, Any]]:
    """The case's records the gate would read for its run-to-run noise with the last of
    `earlier` as baseline: that run and the newest before it on the same GPU model with
    the same settings (compare.load_history, on runs already read), oldest first."""
    baseline = earlier[-1]
    same = [run for run in earlier if run.gpu == baseline.gpu
            and all(run.settings.get(k) == baseline.settings.get(k) for k in HISTORY_SETTINGS)]  # fmt: skip
    return [info for info in (case_info(run, case) for run in same[-MAX_HISTORY:]) if info]


def summary_markdown(runs: list[Run], flagged: Flagged, warnings: list[str]) -> str:
    latest, last = runs[-1], len(runs) - 1
    lines = [f"## mlp-loadbench: {latest.gpu}, {latest.label}", ""]
    rows, reasons = [], []
    for bench in latest.cases():
        info = bench["extra_info"]
        marks = {m: cases[info["case"]][last] for m, cases in flagged.items() if last in cases.get(info["case"], {})}
        rows.append([info["case"], f"{info['median_epoch_s']:.4f}", f"{info['accuracy']:.3f}", f"{info['macro_f1']:.3f}",
                     "REGRESSED: " + ", ".join(marks) if marks else "ok"])  # fmt: skip
        reasons += [f"- {info['case']}, {metric}: {message}" for metric, message in marks.items()]
    lines += [tabulate(rows, headers=["case", "s/epoch", "accuracy", "macro-F1", "vs previous run"], tablefmt="github",
                       disable_numparse=True)]  # fmt: skip
    if reasons:  # which rule of the gate flagged each regression
        lines += ["", "Regressions against the previous run:", "", *reasons]
    lines += ["", f"{len(runs)} run(s) in the history."]
    lines += [f"- warning: {w}" for w in warnings]
    return "\n".join(lines) + "\n"


def history_html(runs: list[Run], lines: dict, flagged: Flagged, extra_images: dict[str, bytes], summary: str) -> str:
    from bench.tools.figures import history_figure

    labels = [r.label for r in runs]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>mlp-loadbench history</title>",
        "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}img{max-width:100%}"
        "pre{background:#f4f4f4;padding:8px;overflow:auto}</style></head><body>",
        f"<h1>mlp-loadbench history: {html.escape(runs[-1].gpu)}</h1>",
        f"<pre>{html.escape(summary)}</pre>",
    ]
    for metric, title in HISTORY_METRICS.items():
        direction = DIRECTIONS[metric]
        if not any(v is not None for values in lines[metric].values() for v in values):
            continue
        image = png(history_figure(f"{title} ({'higher' if direction > 0 else 'lower'} is better)", labels,
                                   lines[metric], flagged[metric]))  # fmt: skip
        parts.append(f"<h2>{html.escape(title)}</h2><img alt='{metric}' src='data:image/png;base64,{base64.b64encode(image).decode()}'>")
    for name, image in extra_images.items():
        parts.append(f"<h2>{html.escape(name)}</h2><img alt='{name}' src='data:image/png;base64,{base64.b64encode(image).decode()}'>")
    parts.append("</body></html>")
    return "\n".join(parts)


def build_report(paths: list[Path], out: Path, window: int = 50, series_roots: Sequence[Path] = (),
                 budgets_path: Path = DEFAULT_BUDGETS) -> tuple[list[Path], list[str]]:  # fmt: skip
    runs, warnings = load_runs(paths)
    warnings += [f"skipped {r.path}: a run with no training cases" for r in runs if not r.cases()]
    runs = [r for r in runs if r.cases()]
    if not runs:
        raise ReportError(nothing_to_report(paths, warnings))
    budgets = Budgets.load(budgets_path)
    latest = runs[-1]
    roots = [*series_roots, latest.path.parent, latest.path.parent.parent]
    written = [write_atomic(out / "tables.md", tables_markdown(latest))]
    figures = experiment_figures(latest, window, roots, warnings)
    for experiment, image in figures.items():
        written.append(write_atomic(out / f"{experiment}.png", image))
    from bench.tools.figures import pareto_figure

    pareto = png(pareto_figure([b["extra_info"] for b in latest.cases()]))
    written.append(write_atomic(out / "pareto.png", pareto))
    lines, flagged = regressions(runs, budgets)
    summary = summary_markdown(runs, flagged, warnings)
    written.append(write_atomic(out / "summary.md", summary))
    written.append(write_atomic(out / "history.html", history_html(runs, lines, flagged, {"Pareto view": pareto}, summary)))
    return written, warnings


def nothing_to_report(paths: Sequence[Path], warnings: list[str]) -> str:
    """Why no run could be used, naming each file given and its reason."""
    if not paths:
        return f"{NO_RUNS}: no run files given; {RUN_FIRST}"
    reasons = "; ".join(w.removeprefix("skipped ") for w in warnings)
    return f"{NO_RUNS} in the {len(paths)} file(s) read: {reasons}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tools.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="*", type=Path, help="run files (default: every run in --storage)")
    parser.add_argument("--storage", type=Path, default=Path(".benchmarks"), help="pytest-benchmark storage. Default: .benchmarks")
    parser.add_argument("--out", type=Path, default=Path("reports"), help="output folder. Default: reports")
    parser.add_argument("--window", type=int, default=50, choices=(50, 100), help="moving-average window. Default: 50")
    parser.add_argument("--series-root", type=Path, action="append", default=[], help="where series files were copied")
    parser.add_argument("--budgets", type=Path, default=DEFAULT_BUDGETS, help="budgets that define a regression")
    args = parser.parse_args(argv)
    paths = list(args.runs) or find_run_files(args.storage)
    if not paths:
        print(f"mlp-loadbench report: {NO_RUNS} in {args.storage}: no run files there; {RUN_FIRST}", file=sys.stderr)
        return 1
    try:
        written, warnings = build_report(paths, args.out, args.window, args.series_root, args.budgets)
    except ReportError as exc:
        print(f"mlp-loadbench report: {exc}", file=sys.stderr)
        return 1
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print((args.out / "tables.md").read_text())
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
