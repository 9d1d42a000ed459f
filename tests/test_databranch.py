"""The data branch (bench.tools.databranch): runners push runs to a bare repository in
tmp_path, pull them back, and build the history page from them. Git runs with no system
or global config; every identity it needs is passed on the command line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.tools import databranch
from bench.tools.databranch import main
from bench.tools.databranch import shown
from bench.tools.databranch import thin
from tests.runs import H100
from tests.runs import H200
from tests.runs import STEADY
from tests.runs import fullname
from tests.runs import not_a_run
from tests.runs import record
from tests.runs import write_run

CASES = ("units-128", "units-256")


@pytest.fixture(autouse=True)
def plain_git(tmp_path, monkeypatch) -> None:
    """No system or global git config and no identity from the environment."""
    (tmp_path / "gitconfig").write_text("")
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "gitconfig"))
    for var in ("GIT_DIR", "GIT_WORK_TREE", "GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME",
                "GIT_COMMITTER_EMAIL", "LOADBENCH_GIT_NAME", "LOADBENCH_GIT_EMAIL", "RUNNER_NAME"):
        monkeypatch.delenv(var, raising=False)


def git(*args: str, cwd: Path | None = None) -> str:
    command = ["git", "-c", "init.defaultBranch=main", "-c", "user.name=test", "-c", "user.email=test@localhost", *args]
    return subprocess.run(command, cwd=cwd, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def bare(tmp_path) -> Path:
    git("init", "-q", "--bare", str(tmp_path / "data.git"))
    return tmp_path / "data.git"


def branch_files(bare: Path, branch: str = "bench-data") -> list[str]:
    return git("ls-tree", "-r", "--name-only", branch, cwd=bare).split()


def saved_run(path: Path, gpu: str | None, commit: str, when: str) -> Path:
    """A run of the two cases on `gpu` at commit `commit` (hex), saved at `when` (ISO, UTC)."""
    records = {fullname(case, "test_units"): record(case, [(1 + CASES.index(case) / 10) * s for s in STEADY], gpu=gpu,
                                                    series_path=f"series/test_units[{case}].csv")
               for case in CASES}
    return write_run(path, records, gpu=gpu, commit=commit, when=when)


def push(run: Path, repo: Path | str, runner: str, *extra: str) -> int:
    return main(["push", str(run), "--repo", str(repo), "--runner", runner, "--backoff", "0", *extra])


def test_two_runners_share_one_history(tmp_path, bare, monkeypatch, capsys) -> None:
    checkout = tmp_path / "checkout"  # the caller's checkout, with the data repository as origin
    git("init", "-q", str(checkout))
    (checkout / "code.py").write_text("")
    git("add", "code.py", cwd=checkout)
    git("commit", "-q", "-m", "code", cwd=checkout)
    git("remote", "add", "origin", str(bare), cwd=checkout)
    head = git("rev-parse", "HEAD", cwd=checkout)
    monkeypatch.chdir(checkout)
    h100 = saved_run(tmp_path / "h100.json", H100, "aaaa1111", "2999-01-01T10:00:00.5+00:00")
    h200 = saved_run(tmp_path / "h200.json", H200, "aaaa1111", "2999-01-01T11:00:00+01:00")
    assert push(h100, "origin", "gpu-box_1") == 0
    assert push(h200, "origin", "gpu-box-2") == 0
    assert branch_files(bare) == ["runs/nvidia-h100-80gb-hbm3/29990101T100000Z_aaaa1111_gpu-box-1.json",
                                  "runs/nvidia-h200/29990101T100000Z_aaaa1111_gpu-box-2.json"]
    assert git("log", "--format=%s|%an|%ae", "bench-data", cwd=bare).splitlines() == [
        "bench: aaaa1111 on NVIDIA H200 (29990101T100000Z_aaaa1111_gpu-box-2)|mlp-loadbench|mlp-loadbench@localhost",
        "bench: aaaa1111 on NVIDIA H100 80GB HBM3 (29990101T100000Z_aaaa1111_gpu-box-1)"
        "|mlp-loadbench|mlp-loadbench@localhost",
    ]
    assert git("status", "--porcelain", cwd=checkout) == "" and git("rev-parse", "HEAD", cwd=checkout) == head
    assert git("branch", "--list", "bench-data", cwd=checkout) == ""  # the caller's checkout is only read
    capsys.readouterr()

    assert main(["pull", "--repo", "origin", "--out", str(tmp_path / "all")]) == 0
    table = capsys.readouterr().out
    assert "| nvidia-h100-80gb-hbm3 |      1 |" in table and "| nvidia-h200 " in table
    assert sorted(p.relative_to(tmp_path / "all").as_posix()
                  for p in (tmp_path / "all").rglob("*.json")) == branch_files(bare)
    assert (tmp_path / "all" / branch_files(bare)[0]).read_bytes() == h100.read_bytes()  # the file as pushed
    assert main(["pull", "--repo", str(bare), "--out", str(tmp_path / "h200"), "--gpu", H200]) == 0
    assert [p.name for p in (tmp_path / "h200").rglob("*.json")] == ["29990101T100000Z_aaaa1111_gpu-box-2.json"]


def test_the_identity_comes_from_the_environment_where_set(tmp_path, bare, monkeypatch) -> None:
    monkeypatch.setenv("LOADBENCH_GIT_NAME", "bench bot")
    monkeypatch.setenv("LOADBENCH_GIT_EMAIL", "bot@example.org")
    assert push(saved_run(tmp_path / "r.json", None, "bbbb2222", "2999-01-01T10:00:00"), bare, "cpu") == 0
    assert branch_files(bare) == ["runs/no-gpu/29990101T100000Z_bbbb2222_cpu.json"]
    assert git("log", "--format=%an <%ae>", "bench-data", cwd=bare).strip() == "bench bot <bot@example.org>"


def test_series_are_thinned_to_500_rows_beside_the_run(tmp_path, bare) -> None:
    series = tmp_path / "series"
    series.mkdir()
    rows = [f"{i * 0.1:.1f},{i % 7}" for i in range(1200)]
    (series / "test_units[units-128].csv").write_text("t,cpu_process\n" + "\n".join(rows) + "\n")
    (series / "unrelated.csv").write_text("t\n1\n")  # another run's: not pushed
    run = saved_run(tmp_path / "r.json", H100, "cccc3333", "2999-01-01T10:00:00")
    assert push(run, bare, "box", "--series", str(series)) == 0
    stem = "29990101T100000Z_cccc3333_box"
    assert branch_files(bare) == [f"runs/nvidia-h100-80gb-hbm3/{stem}.json", f"series/{stem}/test_units[units-128].csv"]
    kept = git("show", f"bench-data:series/{stem}/test_units[units-128].csv", cwd=bare).splitlines()
    assert kept == ["t,cpu_process", *rows[::3]]  # every 3rd row: 400, the header kept


def test_thin_keeps_short_series_whole_and_long_ones_under_the_limit() -> None:
    assert thin("t\n1\n2\n", limit=500) == "t\n1\n2\n"
    text = "t\n" + "\n".join(str(i) for i in range(1001)) + "\n"
    assert thin(text, limit=500).splitlines() == ["t", *(str(i) for i in range(0, 1001, 3))]


def test_a_rerun_of_one_commit_gets_its_own_file(tmp_path, bare, capsys) -> None:
    first = saved_run(tmp_path / "1.json", H100, "dddd4444", "2999-01-01T10:00:00")
    again = saved_run(tmp_path / "2.json", H100, "dddd4444", "2999-01-01T10:00:01")  # a second later
    assert push(first, bare, "box-a") == 0 and push(again, bare, "box-a") == 0
    assert push(first, bare, "box-b") == 0  # another runner in the same second
    assert [Path(f).stem for f in branch_files(bare)] == [
        "29990101T100000Z_dddd4444_box-a", "29990101T100000Z_dddd4444_box-b", "29990101T100001Z_dddd4444_box-a",
    ]
    capsys.readouterr()
    assert push(first, bare, "box-a") == 0  # the same run again: nothing to add
    assert "is already on bench-data" in capsys.readouterr().out
    assert len(branch_files(bare)) == 3 and len(git("log", "--format=%H", "bench-data", cwd=bare).split()) == 3


def test_a_push_that_loses_the_race_is_redone_on_the_new_tip(tmp_path, bare, monkeypatch, capsys) -> None:
    ours = saved_run(tmp_path / "ours.json", H100, "eeee5555", "2999-01-02T10:00:00")
    theirs = saved_run(tmp_path / "theirs.json", H200, "eeee5555", "2999-01-02T10:00:00")
    assert push(saved_run(tmp_path / "old.json", H100, "eeee0000", "2999-01-01T10:00:00"), bare, "box-1") == 0
    real_git = databranch.git
    raced = []

    def git_with_a_rival(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        if args[0] == "push" and not raced:  # between our fetch and our push, another runner lands
            raced.append(args)
            databranch.push(theirs, str(bare), runner="box-2", backoff=0)
        return real_git(*args, cwd=cwd)

    monkeypatch.setattr(databranch, "git", git_with_a_rival)
    assert push(ours, bare, "box-1") == 0
    out = capsys.readouterr().out
    assert "push rejected (attempt 1 of 5): ! [rejected]" in out and "(attempt 2 of 5)" in out
    assert git("log", "--format=%s", "bench-data", cwd=bare).splitlines() == [
        "bench: eeee5555 on NVIDIA H100 80GB HBM3 (29990102T100000Z_eeee5555_box-1)",
        "bench: eeee5555 on NVIDIA H200 (29990102T100000Z_eeee5555_box-2)",
        "bench: eeee0000 on NVIDIA H100 80GB HBM3 (29990101T100000Z_eeee0000_box-1)",
    ]  # one line of history: ours on top of the rival's, nothing lost
    assert len(branch_files(bare)) == 3


def test_a_push_rejected_every_time_gives_up_with_one_line(tmp_path, bare, capsys) -> None:
    hook = bare / "hooks" / "pre-receive"
    hook.write_text(f'#!/bin/sh\necho tried >> "{tmp_path / "tries"}"\necho "pushes are closed" >&2\nexit 1\n')
    hook.chmod(0o755)
    run = saved_run(tmp_path / "r.json", H100, "ffff6666", "2999-01-01T10:00:00")
    assert push(run, bare, "box", "--attempts", "3") == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"mlp-loadbench history: push to bench-data of {bare} gave up after 3 attempts: ")
    assert "(pre-receive hook declined)" in err and "pushes are closed" in err
    assert (tmp_path / "tries").read_text().count("tried") == 3
    assert git("for-each-ref", cwd=bare) == ""  # nothing landed


# Files of tests.runs.NOT_RUNS: what the error must say of each.
BAD_RUNS = {"missing.json": "cannot be read", "corrupt.json": "corrupt JSON at line 1",
            "foreign.json": "not made by mlp-loadbench"}


@pytest.mark.parametrize("name", BAD_RUNS)
@pytest.mark.parametrize("command", ["push", "build"])
def test_a_file_that_is_not_our_run_is_refused_before_any_git_work(tmp_path, bare, capsys, name, command) -> None:
    path, reason = not_a_run(tmp_path, name), BAD_RUNS[name]
    args = [str(path)] if command == "push" else ["--extra", str(path), "--out", str(tmp_path / "site")]
    assert main([command, *args, "--repo", str(bare)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"mlp-loadbench history: run {path}: ") and reason in err, err
    assert git("for-each-ref", cwd=bare) == "" and not (tmp_path / "site").exists()


def test_a_series_folder_that_is_not_there_is_refused(tmp_path, bare, capsys) -> None:
    run = saved_run(tmp_path / "r.json", H100, "abab1212", "2999-01-01T10:00:00")
    assert push(run, bare, "box", "--series", str(tmp_path / "nowhere")) == 2
    assert capsys.readouterr().err == f"mlp-loadbench history: --series {tmp_path / 'nowhere'}: not a folder\n"
    assert git("for-each-ref", cwd=bare) == ""


@pytest.mark.parametrize("command", ["push", "pull"])
def test_a_repository_that_cannot_be_reached_is_named(tmp_path, capsys, command) -> None:
    nowhere = tmp_path / "nowhere.git"
    run = saved_run(tmp_path / "r.json", H100, "cdcd3434", "2999-01-01T10:00:00")
    args = [str(run)] if command == "push" else ["--out", str(tmp_path / "out")]
    assert main([command, *args, "--repo", str(nowhere)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"mlp-loadbench history: repository {nowhere}: cannot be reached: ")


@pytest.mark.parametrize("kind", ["missing path", "not a repository", "unknown remote"])
def test_a_repository_that_cannot_be_used_is_named_by_gits_first_line(tmp_path, monkeypatch, capsys, kind) -> None:
    """git ends with advice ("...and the repository exists."); its first line says what is wrong."""
    checkout = tmp_path / "checkout"
    git("init", "-q", str(checkout))
    monkeypatch.chdir(checkout)
    (tmp_path / "plain").mkdir()
    repo = {"missing path": str(tmp_path / "nowhere.git"), "not a repository": str(tmp_path / "plain"),
            "unknown remote": "upstream"}[kind]
    assert main(["pull", "--repo", repo, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err == (f"mlp-loadbench history: repository {repo}: cannot be reached: "
                   f"'{repo}' does not appear to be a git repository\n")


def test_first_line_skips_hints_and_the_level_of_gits_message() -> None:
    said = subprocess.CompletedProcess([], 1, "", "hint: try this\nfatal: what is wrong\nmore advice\n")
    assert databranch.first_line(said) == "what is wrong"
    assert databranch.first_line(subprocess.CompletedProcess([], 3, "", "")) == "git exited with 3"


def test_a_url_is_named_without_its_token() -> None:
    assert shown("https://x-access-token:s3cret@github.com/o/r.git") == "https://github.com/o/r.git"
    assert shown("/srv/data.git") == "/srv/data.git"


def test_pull_without_the_branch_gives_an_empty_folder_and_a_note(tmp_path, bare, capsys) -> None:
    assert main(["pull", "--repo", str(bare), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert f"note: {bare} has no branch bench-data yet: no history to pull" in out and "0 runs" in out
    assert (tmp_path / "out").is_dir() and not any((tmp_path / "out").iterdir())


def test_build_draws_one_section_per_gpu_model_from_the_branch(tmp_path, bare, monkeypatch, capsys) -> None:
    pytest.importorskip("plotly", reason="the history page is drawn with plotly (pip install -e '.[report]')")
    series = tmp_path / "series"
    series.mkdir()
    for case in CASES:
        samples = "".join(f"{i / 10},{i // 10},50\n" for i in range(40))
        (series / f"test_units[{case}].csv").write_text("t,epoch,cpu_process\n" + samples)
    for day, gpu in ((1, H100), (2, H200), (3, H100)):
        run = saved_run(tmp_path / f"{day}.json", gpu, f"{day}" * 8, f"2999-01-0{day}T10:00:00")
        assert push(run, bare, "box", "--series", str(series)) == 0
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # the runs' series paths lead nowhere from here
    capsys.readouterr()

    site = tmp_path / "site"
    assert main(["build", "--repo", str(bare), "--out", str(site)]) == 0
    captured = capsys.readouterr()
    assert "| nvidia-h100-80gb-hbm3 |      2 |" in captured.out and "| nvidia-h200           |      1 |" in captured.out
    page = (site / "history.html").read_text()
    assert re.findall(r"<section id='gpu-[^']+'><h2>([^<]+)</h2>", page) == [H100, H200]  # the newest run's model first
    # the newest run's series, from the branch
    assert "no series" not in captured.err and (site / "units.png").is_file()
    index = (site / "index.html").read_text()
    assert 'url=history.html"' in index and '<a href="history.html">' in index

    pr = saved_run(tmp_path / "pr.json", H200, "9" * 8, "2999-01-04T10:00:00")  # a pull request's own run
    assert main(["build", "--repo", str(bare), "--out", str(site), "--extra", str(pr),
                 "--series-root", str(series)]) == 0
    summary = (site / "summary.md").read_text()
    assert (summary.startswith(f"## mlp-loadbench: {H200}, 99999999 2999-01-04 10:00")
            and "4 run(s) in the history" in summary)
    page = (site / "history.html").read_text()
    assert re.findall(r"<section id='gpu-[^']+'><h2>([^<]+)</h2>", page) == [H200, H100]


@pytest.mark.parametrize(("args", "said"), [
    (["--attempts", "0"], "argument --attempts: 0: must be at least 1"),
    (["--attempts", "x"], "argument --attempts: 'x' is not a whole number (at least 1)"),
    (["--backoff", "-1"], "argument --backoff: -1: must be at least 0"),
    (["--backoff", "inf"], "argument --backoff: inf: must be a finite number of seconds"),
])
def test_attempts_and_backoff_name_their_minimum_at_parse_time(tmp_path, bare, capsys, args, said) -> None:
    run = saved_run(tmp_path / "r.json", H100, "efef5656", "2999-01-01T10:00:00")
    with pytest.raises(SystemExit) as exit_:
        main(["push", str(run), "--repo", str(bare), "--runner", "box", *args])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.splitlines()[-1].endswith(f"error: {said}"), err
    assert git("for-each-ref", cwd=bare) == ""


def test_push_called_with_a_negative_backoff_refuses_before_any_git_work(tmp_path, bare) -> None:
    run = saved_run(tmp_path / "r.json", H100, "efef5656", "2999-01-01T10:00:00")
    with pytest.raises(databranch.DataBranchError, match=r"^--backoff -1: must be a finite number of seconds"):
        databranch.push(run, str(bare), runner="box", backoff=-1)
    with pytest.raises(databranch.DataBranchError, match=r"^--attempts 0: must be at least 1$"):
        databranch.push(run, str(bare), runner="box", attempts=0)
    assert git("for-each-ref", cwd=bare) == ""


@pytest.mark.parametrize("command", ["pull", "build"])
def test_an_out_folder_that_is_a_file_or_cannot_be_made_is_one_line(tmp_path, bare, capsys, command) -> None:
    (tmp_path / "a-file").write_text("in the way\n")
    for out, said in ((tmp_path / "a-file", "is a file; give a directory"),
                      (tmp_path / "a-file" / "sub", f"{tmp_path / 'a-file'} is a file, not a directory"),
                      (Path("/proc/nope/out"), "cannot be written (")):
        assert main([command, "--repo", str(bare), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"mlp-loadbench history: --out {out}: {said}"), err


@pytest.mark.parametrize("branch", ["-x", "a..b", "has space", "HEAD", "@{-1}", "x.lock"])
def test_a_branch_name_git_calls_invalid_is_refused_before_anything_is_pushed(tmp_path, bare, capsys,
                                                                                 branch) -> None:
    run = saved_run(tmp_path / "r.json", H100, "efef5656", "2999-01-01T10:00:00")
    assert push(run, bare, "box", f"--branch={branch}") == 2
    assert main(["pull", "--repo", str(bare), f"--branch={branch}", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"mlp-loadbench history: --branch {branch}: not a valid branch name by git's rules "
                                "(git check-ref-format --branch)"] * 2
    assert git("for-each-ref", cwd=bare) == "" and not (tmp_path / "out").exists()
    assert push(run, bare, "box", "--branch=bench/data-2") == 0  # a name with a folder is a branch like any
    assert branch_files(bare, "bench/data-2")


def test_a_different_run_under_a_name_already_on_the_branch_is_refused_not_called_already_on(
    tmp_path, bare, capsys
) -> None:
    first = saved_run(tmp_path / "1.json", H100, "dddd4444", "2999-01-01T10:00:00")
    assert push(first, bare, "box") == 0
    other = json.loads(first.read_text())
    other["benchmarks"][0]["extra_info"]["accuracy"] = 0.5  # same commit, second and runner: same name
    (tmp_path / "2.json").write_text(json.dumps(other))
    capsys.readouterr()
    assert push(tmp_path / "2.json", bare, "box") == 1
    captured = capsys.readouterr()
    name = "runs/nvidia-h100-80gb-hbm3/29990101T100000Z_dddd4444_box.json"
    assert "already on" not in captured.out + captured.err
    assert captured.err == f"mlp-loadbench history: bench-data of {bare} already holds a different {name}\n"
    assert git("show", f"bench-data:{name}", cwd=bare) == first.read_text()  # the first run kept as it was


def test_the_module_runs_as_a_command() -> None:
    result = subprocess.run([sys.executable, "-m", "bench.tools.databranch", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "{push,pull,build}" in result.stdout


def test_a_run_cut_short_is_marked_in_its_name_on_the_branch(tmp_path, bare, capsys) -> None:
    run = saved_run(tmp_path / "run.json", "NVIDIA H200", "abc123", "2026-11-29T04:00:00")
    data = json.loads(run.read_text())
    data["machine_info"]["loadbench"]["run"] = {"state": "interrupted", "collected": 3, "stored": 2,
                                                "cut_short": ["bench/test_experiments.py::test_units[256]"]}
    run.write_text(json.dumps(data))
    assert push(run, bare, "lane") == 0
    (name,) = [f for f in branch_files(bare) if f.startswith("runs/")]
    assert name.endswith("_interrupted.json")
    assert "note: the run was interrupted: it holds 2 finished case(s) of 3 collected" in capsys.readouterr().out
