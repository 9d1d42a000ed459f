"""bench.tools.merge on bad command lines and incomplete runs: one line naming the file,
exit 2, before any work, and every file as it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.tools.merge import main as merge_main
from bench.tools.merge import make_parser

SETTINGS = {"profile": "quick", "epochs": 40, "dataset": "synthetic", "device": "cpu", "loop": "fast"}


def shard_run(i: int, settings: dict[str, Any] | None = SETTINGS) -> dict[str, Any]:
    """Shard i of 2: one benchmark of its own; `settings` None leaves the key out."""
    record: dict[str, Any] = {"gpu": None}
    if settings is not None:
        record["settings"] = settings | {"shard": f"{i}/2"}
    bench = {"fullname": f"bench/test_experiments.py::test_units[{i}]", "name": f"test_units[{i}]",
             "params": {}, "stats": {"median": 1.0}, "extra_info": {}}
    return {"datetime": "2024-01-01T00:00:00", "commit_info": {"id": "abc"}, "benchmarks": [bench],
            "machine_info": {"loadbench": record}}


def write_shards(tmp_path: Path, *runs: dict[str, Any]) -> list[Path]:
    paths = []
    for i, run in enumerate(runs, start=1):
        paths.append(tmp_path / f"shard-{i}.json")
        paths[-1].write_text(json.dumps(run, indent=2))
    return paths


def snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every path under `folder` and its bytes (None for a folder): what must not change."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))}


def one_line(err: str) -> str:
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith("mlp-loadbench merge: ") and "Traceback" not in err
    return err


def test_shards_merge_and_stay_as_they_were(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shards = write_shards(tmp_path, shard_run(1), shard_run(2))
    before = snapshot(tmp_path)
    out = tmp_path / "new" / "merged.json"  # a folder not made yet is made
    assert merge_main([str(out), *map(str, shards)]) == 0
    merged = json.loads(out.read_text())
    assert len(merged["benchmarks"]) == 2
    assert merged["machine_info"]["loadbench"]["settings"]["shard"] == "merged from 2"
    assert {k: v for k, v in snapshot(tmp_path).items() if not k.startswith("new")} == before
    assert f"-> {out}" in capsys.readouterr().out


def test_the_output_may_not_be_a_shard(tmp_path: Path) -> None:
    """`merge shard-1.json shard-1.json shard-2.json` used to merge and then write over shard 1."""
    shards = write_shards(tmp_path, shard_run(1), shard_run(2))
    before = snapshot(tmp_path)
    done = subprocess.run([sys.executable, "-m", "bench.tools.merge", str(shards[0]), *map(str, shards)],
                          capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    err = one_line(done.stderr)
    assert err == (f"mlp-loadbench merge: {shards[0]}: the output is also a shard and would be overwritten; "
                   "name a new file to write\n")
    assert done.stdout == ""
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("spelling", ["same", "dot", "link"])
def test_a_shard_given_twice_is_refused(tmp_path: Path, spelling: str, capsys: pytest.CaptureFixture[str]) -> None:
    shards = write_shards(tmp_path, shard_run(1), shard_run(2))
    again = {"same": shards[0], "dot": tmp_path / "." / shards[0].name, "link": tmp_path / "link.json"}[spelling]
    if spelling == "link":
        again.symlink_to(shards[0])
    before = snapshot(tmp_path)
    assert merge_main([str(tmp_path / "merged.json"), str(shards[0]), str(shards[1]), str(again)]) == 2
    err = one_line(capsys.readouterr().err)
    assert err == f"mlp-loadbench merge: {again}: given twice as a shard ({shards[0]}); name each shard once\n"
    assert snapshot(tmp_path) == before


def test_the_output_given_as_a_link_to_a_shard_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shards = write_shards(tmp_path, shard_run(1), shard_run(2))
    link = tmp_path / "merged.json"
    link.symlink_to(shards[1])
    before = snapshot(tmp_path)
    assert merge_main([str(link), *map(str, shards)]) == 2
    assert f": {link}: the output is also a shard" in one_line(capsys.readouterr().err)
    assert snapshot(tmp_path) == before


def test_an_output_that_is_a_folder_is_refused_before_the_work(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """`merge SOMEDIR shard ...` used to merge and then stop on IsADirectoryError."""
    shards = write_shards(tmp_path, shard_run(1), shard_run(2))
    folder = tmp_path / "runs"
    folder.mkdir()
    before = snapshot(tmp_path)
    assert merge_main([str(folder), *map(str, shards)]) == 2
    err = one_line(capsys.readouterr().err)
    assert err == (f"mlp-loadbench merge: {folder}: the output is a folder or other non-file; "
                   "name a file to write the merged run to\n")
    assert snapshot(tmp_path) == before


def test_an_output_under_a_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shards = write_shards(tmp_path, shard_run(1), shard_run(2))
    out = shards[0] / "merged.json"  # shard-1.json/merged.json: its folder is a file
    before = snapshot(tmp_path)
    assert merge_main([str(out), *map(str, shards)]) == 2
    err = one_line(capsys.readouterr().err)
    assert err == f"mlp-loadbench merge: {out}: cannot be written: {shards[0]} is not a folder\n"
    assert snapshot(tmp_path) == before


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes into any folder")
def test_an_output_in_a_read_only_folder_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shards = write_shards(tmp_path, shard_run(1), shard_run(2))
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        before = snapshot(tmp_path)
        assert merge_main([str(locked / "merged.json"), *map(str, shards)]) == 2
        assert f"folder {locked} is not writable" in one_line(capsys.readouterr().err)
        assert snapshot(tmp_path) == before
    finally:
        locked.chmod(0o755)


@pytest.mark.parametrize("bad", ["folder", "missing"])
def test_a_shard_that_is_not_a_readable_file_is_refused(tmp_path: Path, bad: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    shards = write_shards(tmp_path, shard_run(1), shard_run(2))
    odd = tmp_path / "shard-3"
    if bad == "folder":
        odd.mkdir()
    before = snapshot(tmp_path)
    assert merge_main([str(tmp_path / "merged.json"), *map(str, shards), str(odd)]) == 2
    err = one_line(capsys.readouterr().err)
    expected = ("shard is not a regular file but a folder" if bad == "folder"
                else "shard cannot be read: No such file or directory")
    assert err == f"mlp-loadbench merge: {odd}: {expected}\n"
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("without", [1, 2])
def test_a_run_without_settings_names_the_file_and_key(tmp_path: Path, without: int,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A run without machine_info.loadbench.settings used to end in a KeyError traceback."""
    runs = [shard_run(1, None if without == 1 else SETTINGS), shard_run(2, None if without == 2 else SETTINGS)]
    shards = write_shards(tmp_path, *runs)
    before = snapshot(tmp_path)
    assert merge_main([str(tmp_path / "merged.json"), *map(str, shards)]) == 2
    err = one_line(capsys.readouterr().err)
    assert err == (f"mlp-loadbench merge: {shards[without - 1]}: machine_info.loadbench.settings is missing; "
                   "not a complete run of this suite\n")
    assert snapshot(tmp_path) == before


def test_runs_without_settings_fail_as_a_command_too(tmp_path: Path) -> None:
    shards = write_shards(tmp_path, shard_run(1, None), shard_run(2, None))
    before = snapshot(tmp_path)
    done = subprocess.run([sys.executable, "-m", "bench.tools.merge", str(tmp_path / "m.json"), *map(str, shards)],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert f"{shards[0]}: machine_info.loadbench.settings is missing" in one_line(done.stderr)
    assert snapshot(tmp_path) == before


def test_a_benchmark_without_fullname_names_the_file_and_index(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    second = shard_run(2)
    del second["benchmarks"][0]["fullname"]
    shards = write_shards(tmp_path, shard_run(1), second)
    assert merge_main([str(tmp_path / "merged.json"), *map(str, shards)]) == 2
    assert one_line(capsys.readouterr().err) == f"mlp-loadbench merge: {shards[1]}: benchmarks[0] has no 'fullname'\n"
    assert not (tmp_path / "merged.json").exists()


def test_every_argument_is_explained_and_the_exit_codes_are_given() -> None:
    parser = make_parser()
    for action in parser._actions:
        assert action.help, action.dest
    text = parser.format_help()
    assert "exit codes:" in text
    assert "  0  merged and written" in text
    assert "  2  bad input" in text and "nothing written" in text
    assert "never one of the shards" in " ".join(text.split())  # however argparse wraps it


def test_a_shard_cut_short_makes_the_merged_run_partial_and_says_so(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from bench.gate.runs import read_run
    from bench.gate.runs import run_state

    whole, killed = shard_run(1), shard_run(2)
    whole["machine_info"]["loadbench"]["run"] = {"state": "complete", "collected": 1, "stored": 1, "cut_short": []}
    killed["machine_info"]["loadbench"]["run"] = {"state": "partial", "collected": 3, "stored": 1, "cut_short": []}
    paths = write_shards(tmp_path, whole, killed)
    assert merge_main([str(tmp_path / "merged.json"), *map(str, paths)]) == 0
    state = run_state(read_run(tmp_path / "merged.json"))
    assert (state.state, state.collected, state.stored, state.whole) == ("partial", 4, 2, False)
    assert "a shard was cut short, so the run was cut short" in capsys.readouterr().err
    paths = write_shards(tmp_path, shard_run(1), shard_run(2))  # runs made before the state was written
    assert merge_main([str(tmp_path / "merged.json"), *map(str, paths)]) == 0
    assert run_state(read_run(tmp_path / "merged.json")).whole
