"""The report's history page, ``history.html``: trends of every case across the stored
runs, one section per GPU model, drawn with Plotly.

Each section holds a table of the regressions the gate's rules flag (each run judged
against the newest earlier run that measured the same thing) and one chart per metric
with a line per case. Runs with other settings than the section's newest (a planted
slowdown, another profile or epoch count) are drawn hollow on lines of their own; a
metric spanning more than ``LOG_RATIO`` times gets a log axis. The page is one
self-contained file (plotly.js embedded once). Written by hand beside Plotly's output:
the HTML and CSS around the charts and ``lbPick``, one JavaScript function behind the
section's two selects (one pair drives every chart of a section, where Plotly's own
menus are one per chart).
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from typing import Any

from kernels.ground.cases import TITLES
from kernels.ground.cases import study_order
from bench.gate.compare import DIRECTIONS
from bench.gate.runs import HISTORY_SETTINGS
from bench.gate.runs import setting
from bench.gate.runs import Run



@dataclass(frozen=True)
class Chart:
    title: str
    unit: str  # on the axis and in the hover; "%" values are stored as fractions
    fmt: str = ".4g"

    @property
    def scale(self) -> float:
        return 100.0 if self.unit == "%" else 1.0


METRICS: dict[str, Chart] = {  # extra_info key (gpu_busy, sm_activity: load.normalized): its chart
    "median_epoch_s": Chart("median epoch time", "s"),
    "accuracy": Chart("test accuracy", "", ".4f"),
    "macro_f1": Chart("macro-F1", "", ".4f"),
    "vram_peak_mib": Chart("allocator peak", "MiB", ".1f"),
    "rss_peak_mib": Chart("process RSS peak", "MiB", ".0f"),
    "energy_per_epoch_j": Chart("energy per epoch", "J", ".4g"),
    "gpu_busy": Chart("GPU busy", "%", ".1f"),
    "sm_activity": Chart("SM activity", "%", ".1f"),
}
FAMILIES = {  # experiment: colour scale, one shade per value
    "blocks": "Blues",
    "units": "Oranges",
    "batch": "Greens",
    "act": "Purples",
    "opt": "Brwnyl",
    "loop": "Greys",
}
SYMBOLS = ("circle", "square", "diamond", "triangle-up", "star", "pentagon", "hexagon", "cross")
REGRESSION_COLOUR = "#d62728"
MAX_TICKS = 24  # run labels on the x axis before every k-th is shown
LOG_RATIO = 10.0  # a chart whose values span more than this (max / min) gets a log y axis
MARGIN = {"l": 60, "r": 10, "t": 30, "b": 10}  # the axes grow it where their labels need room (automargin)
FIRST_RUN = "first run on this GPU"

SCRIPT = """<script>
function lbPick(id, changed) {
  var root = document.getElementById(id);
  var exp = root.querySelector("select[name=experiment]"), cas = root.querySelector("select[name=case]");
  if (changed === "experiment") cas.value = "";
  if (changed === "case" && cas.value) exp.value = cas.selectedOptions[0].dataset.experiment;
  var keep = function (m) {
    return (!exp.value || m.experiment === exp.value) && (!cas.value || m.case === cas.value);
  };
  root.querySelectorAll(".js-plotly-plot").forEach(function (div) {
    Plotly.restyle(div, {visible: div.data.map(function (t) { return keep(t.meta); })});
  });
  root.querySelectorAll("tr[data-case]").forEach(function (tr) { tr.hidden = !keep(tr.dataset); });
}
</script>"""

STYLE = """<style>
body{font-family:system-ui,sans-serif;max-width:1280px;margin:auto;padding:0 16px;color:#222}
table{border-collapse:collapse;margin:8px 0 16px;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f2f2f2} td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.when{white-space:nowrap}
tr.regressed td{background:#fdecea} tr.notgated td{background:#f4f4f4;color:#555}
td.rule{white-space:pre-wrap;font-family:monospace;font-size:12px}
.controls{position:sticky;top:0;background:#fff;padding:6px 0;z-index:10;border-bottom:1px solid #eee}
.controls label{margin-right:16px} .nodata{color:#666;font-style:italic} .note{color:#555;font-size:13px}
section{border-top:2px solid #888;margin-top:24px} img{max-width:100%}
</style>"""


# metric -> case -> index of the run that regressed against the one before -> the gate's message
Flagged = dict[str, dict[str, dict[int, str]]]


@dataclass(frozen=True)
class Pairing:
    """The run one run of a section was judged against, or why it was judged against none."""

    baseline: int | None  # index in the section of the newest earlier run with the same settings
    reason: str = ""  # why there is none: FIRST_RUN, or the settings no earlier run shares


@dataclass
class Section:
    """The runs of one GPU model, oldest first, and what the history page draws of them."""

    gpu: str
    runs: list[Run]
    lines: dict[str, dict[str, list[float | None]]]  # metric -> case -> value per run (None: not measured)
    flagged: Flagged  # metric -> case -> run index -> the gate's message
    experiments: dict[str, str]  # case -> experiment, in the study's order
    pairings: list[Pairing] = field(default_factory=list)  # per run; empty: each against the run before

    def pairing(self, index: int) -> Pairing:
        """Run `index`'s pairing; without pairings, the run before it (or none, for the first)."""
        if self.pairings:
            return self.pairings[index]
        return Pairing(index - 1) if index else Pairing(None, FIRST_RUN)

    @property
    def labels(self) -> list[str]:
        return run_labels(self.runs)


def plant_note(settings: dict[str, Any]) -> str:
    """'planted +150% (host)' for a run made with --plant-slowdown 150:host; '' for one without."""
    plant = settings.get("plant")
    if not plant:
        return ""
    pct, _, mode = str(plant).partition(":")
    return f"planted +{pct}" + (f" ({mode})" if mode else "")


def settings_text(settings: dict[str, Any], keys: Sequence[str]) -> str:
    """'epochs 8, plant 150%:host': the named settings of a run, "unset" where it has none."""
    return ", ".join(f"{key} {'unset' if setting(settings, key) is None else setting(settings, key)}" for key in keys)


def settings_key(settings: dict[str, Any]) -> str:
    """One string per measurement: runs with equal keys are same_measurement on one GPU."""
    return json.dumps([setting(settings, key) for key in HISTORY_SETTINGS], default=str)


def run_note(run: Run, reference: Run) -> str:
    """What sets `run` apart from `reference` (a section's newest run): its planted
    slowdown and the settings it ran with where they differ; '' when alike and unplanted."""
    parts = [plant_note(run.settings)]
    if not parts[0] and reference.settings.get("plant"):
        parts[0] = "not planted"
    others = [k for k in HISTORY_SETTINGS
              if k != "plant" and setting(run.settings, k) != setting(reference.settings, k)]
    parts.append(settings_text(run.settings, others))
    return ", ".join(p for p in parts if p)


def _stamps(runs: Sequence[Run]) -> list[tuple[str, str]]:
    """(commit, when) per run, told apart: the date, its time to the second where another run
    of the commit shares the date, and '#1', '#2'... where they share the second too."""
    dates = Counter((r.commit, r.datetime[:10]) for r in runs)
    whens = [r.datetime[:10] if dates[(r.commit, r.datetime[:10])] == 1 else r.datetime[:19].replace("T", " ")
             for r in runs]
    total = Counter(zip((r.commit for r in runs), whens))
    seen: Counter[tuple[str, str]] = Counter()
    out = []
    for run, when in zip(runs, whens):
        seen[(run.commit, when)] += 1
        n = seen[(run.commit, when)]
        out.append((run.commit, when if total[(run.commit, when)] == 1 else f"{when} #{n}"))
    return out


def run_labels(runs: Sequence[Run], planted: bool = True) -> list[str]:
    """'<commit8> 2999-01-05 10:00:00' per run, with ' #1', ' #2' on reruns of a commit made
    within one second, and (with `planted`) ', planted +150% (host)' on a planted run:
    unique within `runs`."""
    stamps = [f"{r.commit} {r.datetime[:19].replace('T', ' ')}" for r in runs]
    total = Counter(stamps)
    seen: Counter[str] = Counter()
    out = []
    for run, stamp in zip(runs, stamps):
        seen[stamp] += 1
        label = stamp if total[stamp] == 1 else f"{stamp} #{seen[stamp]}"
        note = plant_note(run.settings) if planted else ""
        out.append(f"{label}, {note}" if note else label)
    return out


def tick_labels(runs: Sequence[Run]) -> list[str]:
    """The x axis' label of each run: commit, date (and time or '#n' where needed to tell
    reruns apart), and what sets it apart from the newest run's settings."""
    out = []
    for run, (commit, when) in zip(runs, _stamps(runs)):
        note = run_note(run, runs[-1])
        out.append(f"{html.escape(commit)}<br>{html.escape(when)}" + (f"<br>{html.escape(note)}" if note else ""))
    return out


@dataclass
class Summary:
    """The newest run's cases against the run before it on the same GPU: rendered as
    Markdown for summary.md (a CI job summary) and as a table on the history page."""

    gpu: str
    label: str
    headers: list[str]
    rows: list[list[str]]  # one per case, in the study's order; last cell "ok", "REGRESSED: ..." or "not gated: ..."
    reasons: list[tuple[str, str, str]]  # case, metric, the gate's message
    runs: int  # runs in the history, every GPU
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the run was judged against, whether it was planted
    against: str = ""  # the label of the run it was judged against; "" for none


def history_page(sections: Sequence[Section], summary: Summary, images: dict[str, bytes] | None = None) -> str:
    """The whole page: the newest run's summary, then a section per GPU model."""
    embed = [True]  # plotly.js goes into the first chart drawn, once

    def chart_html(fig: Any, div_id: str) -> str:
        first, embed[0] = embed[0], False
        return fig.to_html(full_html=False, include_plotlyjs=first, div_id=div_id,
                           config={"displaylogo": False, "responsive": True})

    runs = sum(len(s.runs) for s in sections)
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        "<title>mlp-loadbench history</title>", STYLE, SCRIPT, "</head><body>",
        "<h1>mlp-loadbench history</h1>",
        (f"<p class='note'>{runs} run(s) on {len(sections)} GPU model(s). Hover a point for its commit, date, value "
         "and change against the run it was judged against (the newest earlier run with the same settings); a red x "
         "marks a regression; hollow markers are runs with other settings than the section's newest run (a planted "
         "slowdown, another profile or epoch count), on lines of their own. Click a legend entry to hide a case, "
         "double-click to show only it, or pick an experiment or a case above a section's charts.</p>"),
        summary_html(summary),
    ]
    if len(sections) > 1:
        links = " · ".join(f"<a href='#{section_id(s.gpu)}'>{html.escape(s.gpu)}</a> ({len(s.runs)})" for s in sections)
        parts.append(f"<p>GPU models: {links}</p>")
    for section in sections:
        parts.append(section_html(section, chart_html))
    for name, image in (images or {}).items():
        parts.append(f"<h2>{html.escape(name)}</h2><img alt='{html.escape(name)}' "
                     f"src='data:image/png;base64,{base64.b64encode(image).decode()}'>")
    parts.append("</body></html>")
    return "\n".join(parts)


def summary_html(summary: Summary) -> str:
    """The newest run's summary (what summary.md says) as an HTML table."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in summary.headers)
    rows = []
    for row in summary.rows:
        status = " class=regressed" if row[-1].startswith("REGRESSED") else " class=notgated" if row[-1] != "ok" else ""
        cells = "".join(f"<td{' class=num' if 0 < i < len(row) - 1 else ''}>{html.escape(c)}</td>"
                        for i, c in enumerate(row))
        rows.append(f"<tr{status}>{cells}</tr>")
    parts = [f"<h2>Latest run: {html.escape(summary.gpu)}, {html.escape(summary.label)}</h2>"]
    parts += [f"<p class='note'>{_bold(html.escape(note))}</p>" for note in summary.notes]
    parts.append(f"<table class='summary'><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")
    if summary.reasons:
        items = "".join(f"<li><b>{html.escape(case)}</b>, {html.escape(metric)}: "
                        f"<span class='rule'>{html.escape(message)}</span></li>"
                        for case, metric, message in summary.reasons)
        parts.append(f"<p>Regressions against {html.escape(summary.against)}:</p><ul>{items}</ul>")
    parts.append(f"<p class='note'>{summary.runs} run(s) in the history.</p>")
    if summary.warnings:
        parts.append("<ul class='note'>" + "".join(f"<li>warning: {html.escape(w)}</li>" for w in summary.warnings)
                     + "</ul>")
    return "\n".join(parts)


def section_id(gpu: str) -> str:
    return "gpu-" + (re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-") or "unknown")


def section_html(section: Section, chart_html: Any) -> str:
    sid = section_id(section.gpu)
    cases = sorted(section.experiments, key=study_order)
    experiments = list(dict.fromkeys(section.experiments[c] for c in cases))
    labels = section.labels
    parts = [
        f"<section id='{sid}'><h2>{html.escape(section.gpu)}</h2>",
        f"<p class='note'>{len(section.runs)} run(s), {html.escape(labels[0])} to {html.escape(labels[-1])}.</p>",
        "<div class='controls'>",
        f"<label>experiment <select name='experiment' onchange=\"lbPick('{sid}', 'experiment')\">"
        "<option value=''>all experiments</option>"
        + "".join(f"<option value='{html.escape(e)}'>{html.escape(TITLES.get(e, e))}</option>" for e in experiments)
        + "</select></label>",
        f"<label>case <select name='case' onchange=\"lbPick('{sid}', 'case')\"><option value=''>all cases</option>"
        + "".join(f"<option value='{html.escape(c)}' data-experiment='{html.escape(section.experiments[c])}'>"
                  f"{html.escape(c)}</option>" for c in cases)
        + "</select></label></div>",
        other_settings_html(section),
        regression_table(section),
    ]
    for metric, chart in METRICS.items():
        fig = metric_figure(section, metric, chart)
        parts.append(f"<h3>{html.escape(chart_title(metric, chart))}</h3>")
        if fig is None:
            parts.append(f"<p class='nodata'>no {html.escape(chart.title)} in these runs: "
                         f"{html.escape(missing_reason(section, metric))}</p>")
        else:
            parts.append(chart_html(fig, f"{sid}-{metric}"))
    parts.append("</section>")
    return "\n".join(parts)


def chart_title(metric: str, chart: Chart) -> str:
    direction = DIRECTIONS.get(metric)
    better = "" if direction is None else f", {'higher' if direction > 0 else 'lower'} is better"
    return f"{chart.title}{f' ({chart.unit})' if chart.unit else ''}{better}"


def missing_reason(section: Section, metric: str) -> str:
    """Why a metric has no value: the monitor's own reasons where the runs recorded them."""
    reasons = {why for run in section.runs for b in run.cases()
               for why in b["extra_info"].get("load", {}).get("unavailable", {}).values()}
    if metric in ("gpu_busy", "sm_activity", "energy_per_epoch_j", "vram_peak_mib") and reasons:
        return "; ".join(sorted(reasons))
    return "not recorded by these runs"


def other_settings_html(section: Section) -> str:
    """The runs of a section that were planted or ran with other settings than its newest
    run, each with what differs and what it was judged against; '' when there are none."""
    labels, newest = run_labels(section.runs, planted=False), section.runs[-1]
    items = []
    for i, run in enumerate(section.runs):
        note = run_note(run, newest)
        if not note:
            continue
        pairing = section.pairing(i)
        judged = (f"judged against {section.labels[pairing.baseline]}" if pairing.baseline is not None
                  else f"not gated: {pairing.reason}")
        items.append(f"<li>{html.escape(labels[i])}: <b>{html.escape(note)}</b>; {html.escape(judged)}</li>")
    if not items:
        return ""
    return (f"<p class='note'>Runs planted or with other settings than the newest run "
            f"({html.escape(settings_text(newest.settings, HISTORY_SETTINGS))}): drawn with hollow markers on lines "
            f"of their own and judged only against runs with their own settings.</p><ul class='note other-settings'>"
            + "".join(items) + "</ul>")


def fmt(value: float | None, chart: Chart) -> str:
    if value is None:
        return "n/a"
    return f"{value:{chart.fmt}}{'%' if chart.unit == '%' else f' {chart.unit}' if chart.unit else ''}"


def point_change(section: Section, labels: list[str], y: list[float | None], index: int, metric: str,
                 chart: Chart) -> str:
    """The change of a point against the same case in the run it was judged against (named
    by its label in `labels`), or why it was judged against none."""
    pairing = section.pairing(index)
    if pairing.baseline is None:
        return pairing.reason if pairing.reason == FIRST_RUN else f"not gated: {pairing.reason}"
    return f"{change(y[index], y[pairing.baseline], metric, chart)} vs {labels[pairing.baseline]}"


def change(now: float | None, then: float | None, metric: str, chart: Chart) -> str:
    """The change from `then` to `now` in words, direction-aware."""
    if then is None:
        return "no value in the run judged against"
    if now is None:
        return "n/a"
    if chart.unit == "%":
        text = f"{now - then:+.1f} points (was {fmt(then, chart)})"
    elif then == 0:
        text = f"{now - then:+.4g} (was 0)"
    else:
        text = f"{now / then - 1:+.1%} (was {fmt(then, chart)})"
    direction = DIRECTIONS.get(metric)
    if direction is not None and now != then:
        text += ", better" if (now - then) * direction > 0 else ", worse"
    return text


def _colour(experiment: str, rank: int, count: int, fallback: int) -> str:
    import plotly.colors as pc

    scale = FAMILIES.get(experiment)
    if scale is None:
        return pc.qualitative.Dark24[fallback % len(pc.qualitative.Dark24)]
    low, high = 0.4, 0.85  # light enough to stay apart from the regressions' red, dark enough to see
    where = low if count <= 1 else low + (high - low) * rank / (count - 1)
    return pc.sample_colorscale(pc.get_colorscale(scale), [where])[0]


def metric_figure(section: Section, metric: str, chart: Chart) -> Any | None:
    """One line per case that has a value in some run, in the study's order; None when no
    case has one (the page says so instead of drawing an empty axis)."""
    import plotly.graph_objects as go

    values = section.lines.get(metric, {})
    cases = [c for c in sorted(values, key=study_order) if any(v is not None for v in values[c])]
    if not cases:
        return None
    runs = section.runs
    x = list(range(len(runs)))
    groups = settings_groups(runs)  # the newest run's settings first: its lines are the solid ones
    notes = [run_note(run, runs[-1]) for run in runs]
    labels = section.labels
    when = [run.datetime[:19].replace("T", " ") for run in runs]
    fig = go.Figure()
    families: dict[str, list[str]] = {}
    for case in cases:
        families.setdefault(section.experiments[case], []).append(case)
    drawn: list[float] = []
    for n, case in enumerate(cases):
        experiment = section.experiments[case]
        rank = families[experiment].index(case)
        colour = _colour(experiment, rank, len(families[experiment]), n)
        y = [None if v is None else v * chart.scale for v in values[case]]
        drawn += [v for v in y if v is not None]
        customdata = [[run.commit, when[i], fmt(y[i], chart), point_change(section, labels, y, i, metric, chart),
                       settings_text(run.settings, ("profile", "epochs")) + (f"; {notes[i]}" if notes[i] else "")]
                      for i, run in enumerate(runs)]
        name = html.escape(case)
        meta = {"case": case, "experiment": experiment}
        for g, indices in enumerate(groups):
            # A run with other settings measured something else: its points join only their like.
            symbol = SYMBOLS[rank % len(SYMBOLS)] + ("-open" if g else "")
            fig.add_trace(go.Scatter(
                x=indices, y=[y[i] for i in indices], name=case if g == 0 else f"{case} ({notes[indices[0]]})",
                legendgroup=case, showlegend=g == 0, meta=meta, customdata=[customdata[i] for i in indices],
                mode="lines+markers", connectgaps=False,
                line={"color": colour, "width": 1.6 if g == 0 else 1.0, "dash": "solid" if g == 0 else "dot"},
                marker={"symbol": symbol, "size": 7 if g == 0 else 9, "color": colour,
                        "line": {"color": colour, "width": 1.5}},
                hovertemplate=(f"<b>{name}</b><br>commit %{{customdata[0]}}, %{{customdata[1]}}<br>"
                               f"{html.escape(chart.title)}: %{{customdata[2]}}<br>"
                               "change vs the run judged against: %{customdata[3]}<br>%{customdata[4]}<extra></extra>"),
            ))
        flagged = sorted(i for i in section.flagged.get(metric, {}).get(case, {}) if y[i] is not None)
        if flagged:
            rules = section.flagged[metric][case]
            fig.add_trace(go.Scatter(
                x=flagged, y=[y[i] for i in flagged], name=f"{case} regression", legendgroup=case, showlegend=False,
                meta=meta, mode="markers",
                marker={"symbol": "x", "size": 14, "color": REGRESSION_COLOUR, "line": {"width": 1, "color": "white"}},
                customdata=[[*customdata[i][:4], _rule(rules[i])] for i in flagged],
                hovertemplate=(f"<b>REGRESSION: {name}</b><br>commit %{{customdata[0]}}, %{{customdata[1]}}<br>"
                               f"{html.escape(chart.title)}: %{{customdata[2]}}<br>"
                               "change vs the run judged against: %{customdata[3]}<br>"
                               "rule that flagged it:<br>  %{customdata[4]}<extra></extra>"),
            ))
    step = max(1, math.ceil(len(runs) / MAX_TICKS))
    log = log_axis(drawn)
    title = chart.title + (f" ({chart.unit})" if chart.unit else "") + (", log scale" if log else "")
    fig.update_layout(
        template="plotly_white", height=max(420, 190 + 21 * len(cases)),  # the legend fits unscrolled
        margin=MARGIN, hovermode="closest",
        legend={"title": {"text": "case"}, "font": {"size": 11}, "tracegroupgap": 0},
        xaxis={"tickmode": "array", "tickvals": x[::step], "tickangle": -30, "range": [-0.3, len(runs) - 0.7],
               "ticktext": tick_labels(runs)[::step], "title": {"text": "run (commit, date)"}, "automargin": True},
        yaxis={"title": {"text": title}, "type": "log" if log else "linear", "automargin": True},
    )
    return fig


def log_axis(values: Sequence[float]) -> bool:
    """Whether a chart's values span more than LOG_RATIO times (all positive): on a linear
    axis the small ones would be flattened against the large."""
    return bool(values) and min(values) > 0 and max(values) / min(values) > LOG_RATIO


def settings_groups(runs: Sequence[Run]) -> list[list[int]]:
    """The indices of `runs` grouped by what they measured (settings_key), the newest run's
    group first, then the others by their first run."""
    groups: dict[str, list[int]] = {}
    for i, run in enumerate(runs):
        groups.setdefault(settings_key(run.settings), []).append(i)
    newest = groups.pop(settings_key(runs[-1].settings))
    return [newest, *groups.values()]


def regression_table(section: Section) -> str:
    """Every regression in the section, newest first: commit, case, metric, the value in
    the run judged against, the new value, the gate's message naming the rule that
    flagged it, and the run judged against."""
    rows = []
    labels = section.labels
    for metric, chart in METRICS.items():
        for case, found in section.flagged.get(metric, {}).items():
            for i, message in found.items():
                values = section.lines.get(metric, {}).get(case, [])
                then = section.pairing(i).baseline
                old = values[then] if then is not None and then < len(values) else None
                new = values[i] if i < len(values) else None
                order = (i, study_order(case), list(METRICS).index(metric))
                rows.append((*order, case, metric, chart, old, new, message, then))
    if not rows:
        return "<h3>Regressions</h3><p class='note'>none between runs with the same settings on this GPU.</p>"
    rows.sort(key=lambda r: (-r[0], r[1], r[2]))
    body = []
    for i, _, _, case, metric, chart, old, new, message, then in rows:
        run = section.runs[i]
        old_text = fmt(None if old is None else old * chart.scale, chart)
        new_text = fmt(None if new is None else new * chart.scale, chart)
        against = labels[then] if then is not None else ""
        body.append(
            f"<tr class='regressed' data-case='{html.escape(case)}' "
            f"data-experiment='{html.escape(section.experiments[case])}'>"
            f"<td>{html.escape(run.commit)}</td><td class=when>{html.escape(run.datetime[:19].replace('T', ' '))}</td>"
            f"<td>{html.escape(case)}</td><td>{html.escape(metric)}</td><td class=num>{html.escape(old_text)}</td>"
            f"<td class=num>{html.escape(new_text)}</td><td class='rule'>{html.escape(message)}</td>"
            f"<td class=when>{html.escape(against)}</td></tr>"
        )
    head = "".join(f"<th>{h}</th>" for h in ("commit", "date", "case", "metric", "old value", "new value",
                                             "rule that flagged it", "judged against"))
    return (f"<h3>Regressions ({len(rows)})</h3><table class='regressions'><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table>")


def _bold(text: str) -> str:
    """Markdown's **bold** (the summary's notes are written for summary.md) as HTML."""
    return re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", text)


def _rule(message: str) -> str:
    """The gate's message for a hover label: its first line, broken at its clauses."""
    first = message.splitlines()[0] if message else ""
    return "<br>  ".join(html.escape(part) for part in first.split("; "))
