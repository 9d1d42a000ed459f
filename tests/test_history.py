"""The interactive history page (bench.tools.history) on runs the tests write themselves:
the study's 22 cases on two GPU models, in a shuffled order, with planted regressions.
The page is checked by parsing its HTML; one test opens it in a real headless browser
when a chromium binary is found."""

from __future__ import annotations

import html as htmlmod
import json
import random
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from kernels.ground.cases import all_cases
from kernels.ground.cases import study_order
from bench.gate.budgets import Budgets
from bench.tools.history import METRICS
from bench.tools.history import metric_figure
from bench.tools.report import build_report
from bench.tools.report import sections
from bench.gate.runs import load_runs
from tests import runs
from tests.runs import H100
from tests.runs import H200
from tests.runs import STEADY
from tests.runs import fullname
from tests.runs import record
from tests.runs import write_run

pytest.importorskip("plotly", reason="the history page is drawn with plotly (pip install -e '.[test]')")

CASES = [case.id for case in all_cases()]  # the study's order
BUDGETS = runs.BUDGETS + "memory_growth_pct = 20\n"


def case_record(case: str, gpu: str | None, slower: float = 1.0, accuracy: float = 0.75) -> dict[str, Any]:
    """A case's record whose figures grow with its place in the study's order; sm_activity
    is read on the H200 alone."""
    rank = CASES.index(case)
    on_gpu = gpu is not None
    return record(
        case, [slower * (1 + rank / 100) * s for s in STEADY], gpu=gpu, accuracy=accuracy,
        vram_peak_mib=100.0 + rank if on_gpu else None, energy_j=300.0 + rank if on_gpu else None,
        energy_per_epoch_j=10.0 + rank / 10 if on_gpu else None,
        load={"normalized": {"gpu_busy": 0.7 + rank / 100 if on_gpu else None,
                             "sm_activity": 0.3 if gpu == H200 else None, "cpu_process": 0.05},
              "unavailable": {} if gpu == H200 else {"sm_activity": "GPM not supported on this GPU"}},
    )


def nth_run(folder: Path, n: int, gpu: str | None, changes: dict[str, dict] | None = None, seed: int = 0) -> Path:
    """Run number n (a day apart, commit c<n>...) of every case, in a shuffled order."""
    changes = changes or {}
    cases = list(CASES)
    random.Random(seed + n).shuffle(cases)
    records = {fullname(case): case_record(case, gpu, **changes.get(case, {})) for case in cases}
    return write_run(folder / f"{n:04d}_run.json", records, gpu=gpu, commit=f"c{n:07d}",
                     when=f"2999-01-{n + 1:02d}T10:00:00")


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[Path, list[Path]]:
    """Four H200 runs with an H100 run among them; on H200 the last run is 3x slower on
    units-1024 and act-sigmoid's accuracy fell in the third."""
    folder = tmp_path_factory.mktemp("history")
    paths = [
        nth_run(folder, 0, H200),
        nth_run(folder, 1, H100, {case: {"slower": 3.0} for case in CASES}),  # a slower card: never judged
        nth_run(folder, 2, H200),
        nth_run(folder, 3, H200, {"act-sigmoid": {"accuracy": 0.55}}),
        nth_run(folder, 4, H200, {"units-1024": {"slower": 3.0}, "act-sigmoid": {"accuracy": 0.55}}),
    ]
    (folder / "budgets.toml").write_text(BUDGETS)
    build_report(paths, folder / "out", budgets_path=folder / "budgets.toml")
    return folder / "out", paths


def page(report) -> str:
    return (report[0] / "history.html").read_text()


def section_of(text: str, gpu: str) -> str:
    sid = "gpu-" + re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
    match = re.search(f"<section id='{sid}'>(.*?)</section>", text, re.DOTALL)
    assert match, f"no section for {gpu}"
    return match.group(1)


def plotted(text: str) -> dict[str, list[dict[str, Any]]]:
    """div id -> the traces Plotly.newPlot draws there, read back from the page."""
    decoder = json.JSONDecoder()
    out = {}
    for match in re.finditer(r'Plotly\.newPlot\(\s*"([^"]+)",\s*', text):
        out[match.group(1)] = decoder.raw_decode(text, match.end())[0]
    return out


def test_the_page_is_self_contained_with_plotly_embedded_once(report) -> None:
    text = page(report)
    assert len(re.findall(r"\* plotly\.js v\d", text)) == 1  # the library's own header, once
    assert not re.search(r"<script[^>]+src=", text) and "<link" not in text  # nothing to fetch
    assert "data:image/png;base64," in text  # the Pareto view, embedded


def test_one_section_per_gpu_model_newest_first(report) -> None:
    text = page(report)
    assert re.findall(r"<section id='([^']+)'><h2>([^<]+)</h2>", text) == [("gpu-nvidia-h200", H200),
                                                                           ("gpu-nvidia-h100-80gb-hbm3", H100)]
    h100 = section_of(text, H100)
    # 3x slower than H200: not judged
    assert "1 run(s)" in h100 and "none between runs with the same settings on this GPU" in h100


def test_one_chart_per_metric_with_data_and_a_line_per_case_in_study_order(report) -> None:
    text = page(report)
    charts = plotted(text)
    assert text.count("class=\"plotly-graph-div\"") == len(charts)
    h200 = [k for k in charts if k.startswith("gpu-nvidia-h200-")]
    assert h200 == [f"gpu-nvidia-h200-{m}" for m in METRICS]  # every metric has data on the H200 runs
    lines = [t for t in charts["gpu-nvidia-h200-median_epoch_s"] if t.get("showlegend", True)]
    assert [t["name"] for t in lines] == CASES  # study order, though every run file is shuffled
    assert all(len(t["x"]) == 4 for t in lines)  # the H200 runs only: the H100 run is not on the line
    assert [t["meta"]["experiment"] for t in lines] == [c.split("-")[0] for c in CASES]


def test_hover_names_case_commit_date_value_and_change(report) -> None:
    trace = next(t for t in plotted(page(report))["gpu-nvidia-h200-median_epoch_s"] if t["name"] == "units-1024")
    template = trace["hovertemplate"]
    assert "units-1024" in template and "commit %{customdata[0]}" in template and "%{customdata[1]}" in template
    assert "change vs the run judged against: %{customdata[3]}" in template
    commit, date, value, change, settings = trace["customdata"][-1]
    assert (commit, date) == ("c0000004", "2999-01-05 10:00:00") and value.endswith(" s")
    assert change.startswith("+200.0% (was ") and change.endswith(", worse vs c0000003 2999-01-04 10:00:00")
    assert settings == "profile quick, epochs 22"
    assert trace["customdata"][0][3] == "first run on this GPU"


def test_a_metric_nobody_measured_says_so_instead_of_an_empty_chart(report) -> None:
    h100 = section_of(page(report), H100)
    assert "no SM activity in these runs: GPM not supported on this GPU" in h100
    assert "gpu-nvidia-h100-80gb-hbm3-sm_activity" not in h100


def test_an_unmeasured_value_is_no_point_not_zero(report) -> None:
    runs, _ = load_runs(report[1])
    runs[2].benchmarks[0]["extra_info"]["load"]["normalized"]["gpu_busy"] = None
    h200 = sections(runs, Budgets.load(report[0].parent / "budgets.toml"))[0]
    case = runs[2].benchmarks[0]["extra_info"]["case"]
    fig = metric_figure(h200, "gpu_busy", METRICS["gpu_busy"])
    line = next(t for t in fig.data if t.name == case)
    assert line.y[1] is None and line.connectgaps is False  # a gap, never 0
    assert next(t for t in fig.data if t.name == "blocks-2").y[0] == pytest.approx(70.0)  # fractions drawn as %


def test_regressions_are_marked_and_listed_with_the_rule(report) -> None:
    h200 = section_of(page(report), H200)
    rows = re.findall(r"<tr class='regressed' data-case='([^']+)' data-experiment='([^']+)'>(.*?)</tr>", h200,
                      re.DOTALL)
    cells = [(case, [htmlmod.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", body, re.DOTALL)])
             for case, _, body in rows]
    # newest first, then the study's order: units-1024 before act-sigmoid
    assert [(case, c[0], c[3]) for case, c in cells] == [
        ("units-1024", "c0000004", "median_epoch_s"), ("act-sigmoid", "c0000003", "accuracy"),
        ("act-sigmoid", "c0000003", "macro_f1")]
    slow = cells[0][1]
    assert slow[2] == "units-1024" and slow[4].endswith(" s") and slow[5].endswith(" s")
    assert "epoch_time_ratio = 3 breaks its limit" in slow[6]  # the gate's rule, word for word
    drop = cells[1][1]
    assert (drop[4], drop[5]) == ("0.7500", "0.5500") and "accuracy_drop = 0.2 breaks its limit 0.03" in drop[6]
    marks = [t for t in plotted(page(report))["gpu-nvidia-h200-median_epoch_s"] if t["name"] == "units-1024 regression"]
    assert len(marks) == 1 and marks[0]["x"] == [3] and marks[0]["marker"]["symbol"] == "x"
    assert "epoch_time_ratio = 3 breaks its limit" in marks[0]["customdata"][0][4]
    assert marks[0]["legendgroup"] == "units-1024" and marks[0]["showlegend"] is False  # hidden with its line


def test_the_summary_is_an_html_table_in_study_order(report) -> None:
    text = page(report)
    table = re.search(r"<table class='summary'>(.*?)</table>", text, re.DOTALL).group(1)
    assert "<pre>" not in text
    assert re.findall(r"<th>([^<]+)</th>", table) == ["case", "s/epoch", "accuracy", "macro-F1",
                                                      "vs previous comparable run"]
    rows = re.findall(r"<tr( class=regressed)?><td>([^<]+)</td>", table)
    assert [case for _, case in rows] == CASES
    assert {case for marked, case in rows if marked} == {"units-1024"}
    markdown = (report[0] / "summary.md").read_text()  # still written, for the CI job summary
    assert [line.split("|")[1].strip() for line in markdown.splitlines()
            if line.startswith("| ") and "-" in line.split("|")[1] and not line.startswith("| case")] == CASES


def test_the_selects_list_experiments_and_cases_in_study_order(report) -> None:
    h200 = section_of(page(report), H200)
    experiments = re.search(r"<select name='experiment'[^>]*>(.*?)</select>", h200, re.DOTALL).group(1)
    assert re.findall(r"<option value='([^']*)'", experiments) == ["", "blocks", "units", "batch", "act", "opt"]
    cases = re.search(r"<select name='case'[^>]*>(.*?)</select>", h200, re.DOTALL).group(1)
    assert re.findall(r"<option value='([^']*)'", cases) == ["", *CASES]
    assert "<option value='units-1024' data-experiment='units'>" in cases
    assert "onchange=\"lbPick('gpu-nvidia-h200', 'case')\"" in h200 and "function lbPick(" in page(report)


def test_study_order_sorts_numbers_by_value_and_unknown_ids_last() -> None:
    shuffled = ["opt-adam", "units-2048", "zeta-1", "batch-64", "units-128", "units-4096", "blocks-5", "act-silu",
                "act-relu"]
    assert sorted(shuffled, key=study_order) == ["blocks-5", "units-128", "units-2048", "units-4096", "batch-64",
                                                 "act-relu", "act-silu", "opt-adam", "zeta-1"]


# ---------------------------------------------------------------------- in a real browser

PROBE = """<script>
window.addEventListener("load", function () {
  var out = {charts: document.querySelectorAll(".js-plotly-plot").length,
             svgs: document.querySelectorAll(".js-plotly-plot .main-svg").length};
  var div = document.getElementById("gpu-nvidia-h200-median_epoch_s");
  var mark = div.data.findIndex(function (t) { return t.name === "units-1024 regression"; });
  Plotly.Fx.hover(div, [{curveNumber: mark, pointNumber: 0}]);
  out.hover = Array.from(div.querySelectorAll(".hoverlayer text"))
    .map(function (e) { return e.textContent; }).join(" ");
  var root = document.getElementById("gpu-nvidia-h200");
  root.querySelector("select[name=case]").value = "units-1024";
  lbPick("gpu-nvidia-h200", "case");
  out.experiment = root.querySelector("select[name=experiment]").value;
  out.visible = div.data.filter(function (t) { return t.visible !== false; }).map(function (t) { return t.name; });
  out.rows = Array.from(root.querySelectorAll("tr[data-case]")).filter(function (r) { return !r.hidden; }).length;
  document.body.setAttribute("data-probe", JSON.stringify(out));
});
</script>"""


def chromium() -> str | None:
    return next((found for name in ("chromium", "chromium-browser", "google-chrome", "chrome")
                 if (found := shutil.which(name))), None)


@pytest.mark.skipif(chromium() is None,
                    reason="no chromium binary on PATH (apt-get install chromium) to open the page in")
def test_the_page_renders_and_responds_in_a_real_browser(report, tmp_path) -> None:
    """Headless chromium, offline: every chart is drawn (Plotly's main-svg), hovering a
    regression shows its commit and rule, picking a case leaves only its lines and rows."""
    probed = tmp_path / "probe.html"
    probed.write_text(page(report).replace("</body>", PROBE + "</body>"))
    with tempfile.TemporaryDirectory() as profile:
        result = subprocess.run(
            [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--no-first-run", "--disable-sync", f"--user-data-dir={profile}",
             "--virtual-time-budget=10000", "--dump-dom", probed.as_uri()],
            capture_output=True, text=True, timeout=180, check=False,  # its output says what went wrong
        )
    found = re.search(r'data-probe="([^"]*)"', result.stdout)
    assert found, f"the page's scripts did not run: {result.stderr[-2000:]}"
    probe = json.loads(htmlmod.unescape(found.group(1)))
    charts = len(plotted(page(report)))
    assert probe["charts"] == charts and probe["svgs"] >= charts  # each chart drew its SVG
    assert "REGRESSION: units-1024" in probe["hover"] and "c0000004" in probe["hover"]
    assert "epoch_time_ratio = 3 breaks its limit" in probe["hover"]
    assert probe["experiment"] == "units"
    assert probe["visible"] == ["units-1024", "units-1024 regression"]
    assert probe["rows"] == 1


# ------------------------------------------- planted runs, labels, axes

def write_budgets(folder: Path) -> Path:
    (folder / "budgets.toml").write_text(BUDGETS)
    return folder / "budgets.toml"


def planted_section(tmp_path: Path) -> tuple[Any, str]:
    """Four H200 runs, the third planted (+150%, every case 2.5x slower): the section
    drawn from them and the page."""
    paths = [nth_run(tmp_path, 0, H200), nth_run(tmp_path, 1, H200)]
    planted = nth_run(tmp_path, 2, H200, {case: {"slower": 2.5} for case in CASES})
    run = json.loads(planted.read_text())
    run["machine_info"]["loadbench"]["settings"]["plant"] = "150%:host"
    planted.write_text(json.dumps(run))
    paths += [planted, nth_run(tmp_path, 3, H200)]
    budgets = write_budgets(tmp_path)
    build_report(paths, tmp_path / "out", budgets_path=budgets)
    runs, _ = load_runs(paths)
    return sections(runs, Budgets.load(budgets))[0], (tmp_path / "out" / "history.html").read_text()


def test_a_planted_run_is_drawn_apart_marked_and_not_flagged(tmp_path) -> None:
    section, text = planted_section(tmp_path)
    fig = metric_figure(section, "median_epoch_s", METRICS["median_epoch_s"])
    traces = [t for t in fig.data if t.meta["case"] == "units-1024"]
    line, planted = traces  # no regression mark: the planted run is judged against nothing unplanted
    assert list(line.x) == [0, 1, 3] and line.showlegend is not False and not line.marker.symbol.endswith("-open")
    assert list(planted.x) == [2] and planted.showlegend is False and planted.marker.symbol.endswith("-open")
    assert planted.name == "units-1024 (planted +150% (host))" and planted.legendgroup == "units-1024"
    assert "not gated: no earlier run with the same settings (plant 150%:host" in planted.customdata[0][3]
    # the run after it is judged against the unplanted one
    assert line.customdata[-1][3].endswith(" vs c0000001 2999-01-02 10:00:00")
    assert "planted +150% (host)" in fig.layout.xaxis.ticktext[2] and "planted" not in fig.layout.xaxis.ticktext[3]
    h200 = section_of(text, H200)
    listed = re.search(r"<ul class='note other-settings'>(.*?)</ul>", h200, re.DOTALL).group(1)
    assert re.findall(r"<li>(.*?)</li>", listed) == [
        "c0000002 2999-01-03 10:00:00: <b>planted +150% (host)</b>; not gated: no earlier run "
        "with the same settings (plant 150%:host; the run before: plant unset)"]
    assert "none between runs with the same settings on this GPU" in h200


def test_reruns_of_a_commit_are_told_apart_on_the_x_axis(tmp_path) -> None:
    paths = [nth_run(tmp_path, n, H200) for n in range(3)]
    for path, when in zip(paths, ["2999-01-01T10:00:00", "2999-01-01T10:00:00", "2999-01-01T11:30:00"]):
        run = json.loads(path.read_text())
        path.write_text(json.dumps(run | {"datetime": when, "commit_info": {"id": "d" * 40}}))
    runs, _ = load_runs(paths)
    section = sections(runs, Budgets.load(write_budgets(tmp_path)))[0]
    ticks = metric_figure(section, "accuracy", METRICS["accuracy"]).layout.xaxis.ticktext
    assert list(ticks) == ["dddddddd<br>2999-01-01 10:00:00 #1", "dddddddd<br>2999-01-01 10:00:00 #2",
                           "dddddddd<br>2999-01-01 11:30:00"]
    assert len(set(section.labels)) == 3


def test_a_metric_spanning_more_than_ten_times_gets_a_log_axis(tmp_path) -> None:
    paths = [nth_run(tmp_path, 0, H200, {"units-2048": {"slower": 12.0}}),
             nth_run(tmp_path, 1, H200, {"units-2048": {"slower": 12.0}})]
    runs, _ = load_runs(paths)
    section = sections(runs, Budgets.load(write_budgets(tmp_path)))[0]
    time = metric_figure(section, "median_epoch_s", METRICS["median_epoch_s"])
    assert time.layout.yaxis.type == "log" and time.layout.yaxis.title.text.endswith(", log scale")
    assert metric_figure(section, "accuracy", METRICS["accuracy"]).layout.yaxis.type == "linear"  # all near 0.75


def test_the_charts_keep_their_small_margins(report) -> None:
    runs, _ = load_runs(report[1])
    section = sections(runs, Budgets.load(report[0].parent / "budgets.toml"))[0]
    fig = metric_figure(section, "median_epoch_s", METRICS["median_epoch_s"])
    margin = fig.layout.margin
    assert (margin.l, margin.r, margin.t, margin.b) == (60, 10, 30, 10)
    # grown only where labels need it
    assert fig.layout.xaxis.automargin is True and fig.layout.yaxis.automargin is True
    charts = len(plotted(page(report)))
    assert page(report).count('"margin":{"l":60,"r":10,"t":30,"b":10}') == charts  # every chart on the page
