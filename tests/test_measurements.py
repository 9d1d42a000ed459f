"""bench/tools/measurements.py: docs/measurements.md is what docs/data's CSVs give."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.tools.measurements import PAGE
from bench.tools.measurements import measurements_page
from bench.tools.report import main as report_main
from bench.tools.rows import KINDS
from bench.tools.rows import RowsError
from bench.tools.rows import append_rows

ROOT = Path(__file__).resolve().parents[1]


def test_the_committed_page_is_what_the_rows_give() -> None:
    expected = measurements_page(ROOT / "docs" / "data", ROOT / "docs")
    assert (ROOT / "docs" / PAGE).read_text(encoding="utf-8") == expected, (
        "docs/measurements.md is stale: run python -m bench.tools.report --measurements docs/data --out docs")


def test_every_csv_in_the_repository_is_a_declared_kind_with_its_columns() -> None:
    for path in sorted((ROOT / "docs" / "data").glob("*.csv")):
        assert path.stem in KINDS, path
    page = measurements_page(ROOT / "docs" / "data", ROOT / "docs")
    for path in sorted((ROOT / "docs" / "data").glob("*.csv")):
        assert f"\n## {path.stem}\n" in page and f"(data/{path.name})" in page


def test_a_section_per_csv_newest_row_first_with_its_link(tmp_path: Path) -> None:
    data, docs = tmp_path / "docs" / "data", tmp_path / "docs"
    row = {"date": "2026-01-01", "card": "NVIDIA H200", "commit": "abc", "caches": "warm", "command": "pytest bench/",
           "tier": "pr", "cases": 22, "pytest_s": "", "wall_s": 147.0, "source": "docs/tiers.md", "note": "a | b"}
    append_rows(data / "tier-times.csv", [row, {**row, "date": "2026-02-01", "wall_s": 136.0}])
    assert report_main(["--measurements", str(data), "--out", str(docs)]) == 0
    page = (docs / PAGE).read_text()
    assert "\n## tier-times\n" in page and "[tier-times.csv](data/tier-times.csv)" in page
    assert page.index("136.0") < page.index("147.0")  # newest first
    assert "a \\| b" in page  # a bar inside a cell does not split it
    assert "\n## serving\n" not in page  # no CSV, no section


def test_a_csv_no_kind_names_is_refused_in_one_line(tmp_path: Path, capsys) -> None:
    (tmp_path / "timings.csv").write_text("date,card\n")
    with pytest.raises(RowsError, match="timings.csv: no kind of measurement is named 'timings'"):
        measurements_page(tmp_path, tmp_path)
    assert report_main(["--measurements", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mlp-loadbench report: --measurements ") and err.count("\n") == 1


def test_a_csv_with_another_kinds_header_is_refused(tmp_path: Path) -> None:
    (tmp_path / "serving.csv").write_text("date,card,commit,caches,command,tier,cases,wall_s,source,note\n")
    with pytest.raises(RowsError, match="serving.csv: its header is not that of serving"):
        measurements_page(tmp_path, tmp_path)
