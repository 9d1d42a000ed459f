"""The report, the workflow files and bisect, on runs the tests make themselves."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.tools.figures import moving_average
from bench.tools.figures import pareto_front
from bench.tools.figures import resource_figure
from bench.tools.report import ReportError
from bench.tools.report import build_report
from bench.tools.report import main as report_main
from bench.tools.runs import find_run_files
from bench.monitor.series import read_series

ROOT = Path(__file__).resolve().parents[1]

CASES = """
from bench.cases import Case
import pytest

@pytest.mark.parametrize("case", [Case("units", 128), Case("units", 256)], ids=lambda c: c.id)
def test_units(loadbench, case):
    loadbench.run(case, width=16 if case.value == 128 else 32)

def test_opt(loadbench):
    loadbench.run(Case("opt", "sgd"), width=16)
"""


@pytest.fixture(scope="module")
def storage(tmp_path_factory) -> Path:
    """Two saved runs of three small cases, with their series."""
    root = tmp_path_factory.mktemp("runs")
    (root / "conftest.py").write_text('pytest_plugins = ["bench.plugin"]\n')
    (root / "test_cases.py").write_text(CASES)
    (root / "budgets.toml").write_text("")  # no floors: these runs are 3 epochs of tiny models
    for _ in range(2):
        subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--device=cpu", "--profile=smoke",
             "--epochs=3", f"--budgets={root / 'budgets.toml'}", f"--benchmark-storage={root / 'store'}",
             "--benchmark-autosave", f"--series-dir={root / 'series'}"],
            cwd=root, check=True, capture_output=True,
        )  # fmt: skip
    return root


def test_tables_figures_history_and_summary(storage, tmp_path) -> None:
    written, warnings = build_report(find_run_files(storage / "store"), tmp_path)
    names = {p.name for p in written}
    assert {"tables.md", "units.png", "opt.png", "pareto.png", "summary.md", "history.html"} <= names
    tables = (tmp_path / "tables.md").read_text()
    assert "## hidden units" in tables and "| 128 " in tables and "Accuracy" in tables
    html = (tmp_path / "history.html").read_text()
    assert html.count("data:image/png;base64,") >= 4 and "<script" not in html  # self-contained, images embedded
    summary = (tmp_path / "summary.md").read_text()
    assert "units-256" in summary and "2 run(s) in the history" in summary
    for png in tmp_path.glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert warnings == []


def test_resource_figure_has_one_line_per_case(storage) -> None:
    series = {p.stem: read_series(p) for p in sorted((storage / "series").glob("*units*.csv"))}
    assert len(series) == 2
    fig = resource_figure("hidden units", series, window=50)
    for ax in fig.axes:
        assert len(ax.lines) == 2  # CPU and RSS panels on a CPU run; GPU panels absent, not zero
    assert [ax.get_ylabel() for ax in fig.axes] == ["CPU, process (% of usable cores)", "RAM, process RSS (MiB)"]


def test_bad_files_are_skipped_with_a_warning_naming_each(storage, tmp_path) -> None:
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text("{oops")
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps({"benchmarks": [], "machine_info": {}}))
    missing = tmp_path / "missing.json"
    paths = find_run_files(storage / "store") + [corrupt, foreign, missing]
    _, warnings = build_report(paths, tmp_path / "out")
    assert any("corrupt.json" in w and "corrupt JSON" in w for w in warnings)
    assert any("foreign.json" in w and "not made by mlp-loadbench" in w for w in warnings)
    assert any("missing.json: no such file" in w for w in warnings)


def test_empty_storage_gives_a_clear_message(tmp_path, capsys) -> None:
    with pytest.raises(ReportError, match="no mlp-loadbench runs"):
        build_report([], tmp_path)
    assert report_main(["--storage", str(tmp_path / "nothing"), "--out", str(tmp_path / "out")]) == 1
    assert "run `pytest bench/ --benchmark-autosave` first" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_regression_is_marked_in_the_summary(storage, tmp_path) -> None:
    files = find_run_files(storage / "store")
    slower = json.loads(files[-1].read_text())
    for bench in slower["benchmarks"]:
        bench["extra_info"]["median_epoch_s"] *= 3
    slowed = tmp_path / "9999_slower.json"
    slowed.write_text(json.dumps(slower | {"datetime": "2999-01-01T00:00:00"}))
    build_report(files + [slowed], tmp_path / "out")
    assert "REGRESSED: median_epoch_s" in (tmp_path / "out" / "summary.md").read_text()


def test_pure_helpers() -> None:
    assert list(moving_average([1, 1, 1, 1], 2)) == [1, 1, 1, 1]
    assert moving_average([0, 10, float("nan"), 10], 3)[2] == 10
    assert pareto_front([(1, 0.5), (2, 0.9), (3, 0.8), (1, 0.4)]) == [0, 1]


def test_workflow_files_are_valid() -> None:
    workflows = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
    assert {p.name for p in workflows} == {"ci.yml", "gpu-bench.yml"}
    result = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows", *map(str, workflows)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_broken_workflow_is_caught(tmp_path) -> None:
    broken = tmp_path / "broken.yml"
    broken.write_text("on: push\njobs:\n  a:\n    runs-onn: ubuntu-latest\n    steps:\n      - run: echo\n")
    result = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows", str(broken)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode != 0 and "runs-on" in result.stdout


@pytest.mark.slow
def test_bisect_finds_the_planted_slow_commit(tmp_path) -> None:
    repo = tmp_path / "repo"
    (repo / "perf").mkdir(parents=True)
    (repo / "conftest.py").write_text(
        'pytest_plugins = ["bench.plugin"]\n'
        "import time, pytest\nfrom model.train import Trainer\n"
        "@pytest.fixture(autouse=True)\ndef planted(monkeypatch):\n"
        "    import delay\n    original = Trainer._fast_epoch\n"
        "    monkeypatch.setattr(Trainer, '_fast_epoch', lambda self: (time.sleep(delay.SECONDS), original(self))[1])\n"
    )
    (repo / "perf" / "test_case.py").write_text(
        "from bench.cases import Case\n\ndef test_units(loadbench):\n    loadbench.run(Case('units', 128), width=16)\n"
    )
    # The planted delay makes epochs ~10x slower; a 2x limit keeps CPU timing noise out.
    (repo / "budgets.toml").write_text("[defaults]\ntime_slower_pct = 100\ntime_alpha = 0.01\n")
    git = lambda *a: subprocess.run(["git", *a], cwd=repo, check=True, capture_output=True, text=True).stdout  # noqa: E731
    git("init", "-q")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    commits = []
    for i, seconds in enumerate([0.0, 0.0, 0.0, 0.08, 0.08]):
        (repo / "delay.py").write_text(f"SECONDS = {seconds}\n")
        (repo / "notes.txt").write_text(f"change {i}\n")
        git("add", "-A")
        git("commit", "-qm", f"change {i}" + (" (slow)" if i == 3 else ""))
        commits.append(git("rev-parse", "HEAD").strip())
    out = subprocess.run(
        [sys.executable, "-m", "bench.tools.bisect", commits[0], commits[-1], "-k", "test_units", "--path", "perf/",
         "--", "--device=cpu", "--profile=smoke", "--epochs=8", f"--budgets={repo / 'budgets.toml'}",
         "--dataset=" + str(_tiny_csv(tmp_path))],
        cwd=repo, capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"first bad commit: {commits[3]}" in out.stdout
    assert "change 3 (slow)" in out.stdout
    assert git("rev-parse", "HEAD").strip() == commits[-1]  # left where it was


def _tiny_csv(tmp_path: Path) -> Path:
    from model.data import synthesize
    from model.data import write_csv

    return write_csv(synthesize(scale=0.02), tmp_path / "tiny.csv")


def test_bisect_refuses_a_dirty_tree(tmp_path) -> None:
    repo = tmp_path / "r"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    (repo / "a.txt").write_text("1")
    subprocess.run(["git", "add", "a.txt"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.email=t@e", "-c", "user.name=t", "commit", "-qm", "a"], cwd=repo, check=True)
    (repo / "a.txt").write_text("2")
    out = subprocess.run([sys.executable, "-m", "bench.tools.bisect", "HEAD", "HEAD", "-k", "x", "--repo", str(repo)],
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 2 and "uncommitted changes" in out.stderr
    assert shutil.which("git")
