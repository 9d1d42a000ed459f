"""The declared record (bench/gate/record.py): the run format readers check, and the
fields the fixture and the serving test write."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.gate.record import CALL_FIELDS
from bench.gate.record import CASE_FIELDS
from bench.gate.record import FORMAT_KEY
from bench.gate.record import RECORD_FORMAT
from bench.gate.record import RUN_FIELDS
from bench.gate.record import UNVERSIONED_FORMAT
from bench.gate.record import SERVING_FIELDS
from bench.gate.record import SETTINGS_FIELDS
from bench.gate.record import names
from bench.gate.record import required
from bench.gate.runs import BaselineError
from bench.gate.runs import read_run
from bench.gate.runs import load_runs
from bench.gate.runs import run_format
from bench.gate.runs import run_state
from bench.tools.compare import main as compare_main
from bench.tools.merge import main as merge_main
from bench.tools.report import resolve_series

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "data" / "runs"  # a run file of each format, as its plugin wrote it (README.md there)
SETTINGS = {"profile": "quick", "epochs": 40, "dataset": "synthetic", "device": "cpu", "loop": "fast"}


def run_file(path: Path, fmt: object = None, index: int = 1) -> Path:
    """A small run of one training case; `fmt` None leaves the format key out (format 1)."""
    made: dict[str, Any] = {"gpu": None, "settings": SETTINGS | {"shard": f"{index}/2"}}
    if fmt is not None:
        made[FORMAT_KEY] = fmt
    info = {"case": "units-128", "experiment": "units", "epoch_seconds_by_round": [[1.0, 0.1, 0.1, 0.1]],
            "median_epoch_s": 0.1, "accuracy": 0.8, "macro_f1": 0.7}
    bench = {"fullname": f"bench/test_experiments.py::test_hidden_units[units-128-{index}]", "name": "t",
             "params": {}, "stats": {"median": 1.0}, "extra_info": info}
    run = {"datetime": "2026-01-01T00:00:00", "commit_info": {"id": "ab" * 20}, "benchmarks": [bench],
           "machine_info": {"loadbench": made}}
    path.write_text(json.dumps(run))
    return path


def test_runs_without_a_format_are_format_1_and_this_format_reads(tmp_path: Path) -> None:
    assert run_format(read_run(run_file(tmp_path / "old.json"))) == 1
    assert run_format(read_run(run_file(tmp_path / "now.json", RECORD_FORMAT))) == RECORD_FORMAT


@pytest.mark.parametrize("fmt", ["2", 0, True, 1.5])
def test_a_format_that_is_no_format_is_refused_naming_the_key(tmp_path: Path, fmt: object) -> None:
    with pytest.raises(BaselineError, match=f"machine_info.loadbench.{FORMAT_KEY} = .* is not a record format"):
        read_run(run_file(tmp_path / "odd.json", fmt))


def test_a_newer_format_is_refused_with_the_file_its_format_and_the_newest_read(tmp_path: Path) -> None:
    path = run_file(tmp_path / "new.json", RECORD_FORMAT + 1)
    with pytest.raises(BaselineError) as exc:
        read_run(path)
    assert str(exc.value).startswith(f"baseline {path}: record format {RECORD_FORMAT + 1} is newer")
    assert f"(up to {RECORD_FORMAT})" in str(exc.value)


def test_compare_and_merge_refuse_a_newer_run_in_one_line_with_exit_2(tmp_path: Path, capsys) -> None:
    old = run_file(tmp_path / "old.json", RECORD_FORMAT, 1)
    new = run_file(tmp_path / "new.json", RECORD_FORMAT + 1, 2)
    before = new.read_bytes()
    assert compare_main([str(old), str(new)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(new) in err and f"record format {RECORD_FORMAT + 1} is newer" in err
    out = tmp_path / "merged.json"
    assert merge_main([str(out), str(old), str(new)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"shard {new}: record format {RECORD_FORMAT + 1}" in err
    assert f"up to {RECORD_FORMAT}" in err
    assert not out.exists() and new.read_bytes() == before  # nothing written, nothing lost


def golden() -> dict[int, Path]:
    """The golden run files by the format their name gives (format-N.json)."""
    return {int(path.stem.removeprefix("format-")): path for path in GOLDEN.glob("format-*.json")}


def test_every_format_this_code_reads_has_a_golden_run_and_one_newer_is_kept_too() -> None:
    kept = set(golden())
    missing = set(range(UNVERSIONED_FORMAT, RECORD_FORMAT + 1)) - kept
    assert not missing, f"no tests/data/runs/format-N.json for format(s) {sorted(missing)}: write one with the plugin"
    assert max(kept) > RECORD_FORMAT, "no golden run of a format newer than this code reads"


@pytest.mark.parametrize("fmt", range(UNVERSIONED_FORMAT, RECORD_FORMAT + 1))
def test_a_golden_run_of_each_format_is_read_and_judged_against(fmt: int, tmp_path: Path, capsys) -> None:
    """Read as the gate and the report read it, with its series found beside it, and
    judged by compare as the baseline of the newest format's run."""
    path = golden()[fmt]
    run = read_run(path)
    assert run_format(run) == fmt and run_state(run).whole
    assert (FORMAT_KEY in run["machine_info"]["loadbench"]) is (fmt != UNVERSIONED_FORMAT)
    (read,), warnings = load_runs([path])
    assert warnings == [] and [b["extra_info"]["case"] for b in read.benchmarks] == ["units-128"]
    assert resolve_series(read.benchmarks[0]["extra_info"]["series_path"], [GOLDEN]) is not None
    newest = tmp_path / "newest.json"  # a copy: compare refuses one file given twice
    newest.write_bytes(golden()[RECORD_FORMAT].read_bytes())
    assert compare_main([str(path), str(newest)]) == 0
    out = capsys.readouterr().out
    assert "1 case(s) of NEW; 1 ok" in out and out.count("| units-128 |") == 1


def test_a_golden_run_of_a_newer_format_is_refused_in_one_line_naming_it(capsys) -> None:
    newer = {fmt: path for fmt, path in golden().items() if fmt > RECORD_FORMAT}
    assert newer
    for fmt, path in newer.items():
        with pytest.raises(BaselineError, match=f"record format {fmt} is newer than this code reads"):
            read_run(path)
        assert compare_main([str(path), str(golden()[RECORD_FORMAT])]) == 2
        err = capsys.readouterr().err
        assert err == (f"mlp-loadbench compare: OLD {path}: record format {fmt} is newer than this code reads "
                       f"(up to {RECORD_FORMAT})\n")
        _, warnings = load_runs([path])
        assert warnings == [f"skipped {path}: record format {fmt} is newer than this code reads "
                            f"(up to {RECORD_FORMAT})"]


def test_the_serving_test_writes_only_declared_fields_and_each_declared_field_once() -> None:
    from bench.plugin.serving import RECORD_KEYS
    from bench.plugin.serving import WRITTEN_HERE

    assert WRITTEN_HERE <= set(names(SERVING_FIELDS)), sorted(WRITTEN_HERE - set(names(SERVING_FIELDS)))
    assert set(RECORD_KEYS) | WRITTEN_HERE == set(names(SERVING_FIELDS))
    assert len(names(SERVING_FIELDS)) == len(set(names(SERVING_FIELDS)))


def test_the_plugin_writes_the_format_and_the_declared_case_fields(
    inprocess_ready: None, pytester: pytest.Pytester, tmp_path: Path,
) -> None:
    """One smoke case of the suite on this CPU, a session inside this process: machine_info
    carries the format, and the record holds every required declared field and nothing
    undeclared."""
    out = tmp_path / "run.json"
    result = pytester.runpytest_inprocess(
        str(ROOT / "bench" / "test_experiments.py"), f"--rootdir={ROOT}", "-k", "units-128", "--profile", "smoke",
        "--epochs", "2", "--device", "cpu", "-q", "-p", "no:cacheprovider", f"--benchmark-json={out}",
        f"--series-dir={tmp_path / 'series'}",
    )
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()[-2000:]
    run = json.loads(out.read_text())
    made = run["machine_info"]["loadbench"]
    assert made[FORMAT_KEY] == RECORD_FORMAT
    for fields, written in ((RUN_FIELDS, set(made)), (SETTINGS_FIELDS, set(made["settings"]))):
        assert required(fields) <= written, sorted(required(fields) - written)
        assert written <= set(names(fields)), sorted(written - set(names(fields)))
    (bench,) = run["benchmarks"]
    keys = set(bench["extra_info"])
    assert required(CASE_FIELDS) <= keys, sorted(required(CASE_FIELDS) - keys)
    assert keys <= set(names(CASE_FIELDS)), sorted(keys - set(names(CASE_FIELDS)))
    bound = bench["extra_info"]["bound"]  # profiled on this CPU: ops stand in for kernels
    assert bound["device"] == "cpu" and bound["kernels_per_step"] > 0 and bound["step_us"] > 0
    assert bound["nearest"] in ("compute", "memory", "launch")


def stored_runs() -> list[Path]:
    """The run files under docs/data/runs (beside them: step_phases results and profiles, not runs)."""
    paths = sorted((ROOT / "docs" / "data" / "runs").glob("*/*.json"))
    return [p for p in paths if "machine_info" in json.loads(p.read_text())]


@pytest.mark.parametrize("path", stored_runs(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_stored_runs_in_the_repository_hold_only_declared_fields(path: Path) -> None:
    run = json.loads(path.read_text())
    made = run["machine_info"]["loadbench"]
    assert set(made) <= set(names(RUN_FIELDS)) and set(made["settings"]) <= set(names(SETTINGS_FIELDS))
    declared = set(names(CASE_FIELDS)) | set(names(SERVING_FIELDS)) | set(names(CALL_FIELDS))
    for bench in run["benchmarks"]:
        assert set(bench["extra_info"]) <= declared, (bench["fullname"], set(bench["extra_info"]) - declared)
