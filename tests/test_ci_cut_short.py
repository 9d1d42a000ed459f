"""`python -m bench.tools.ci main` cut short on the CPU: pytest killed (SIGKILL) or
interrupted (Ctrl-C, SIGINT) after its first case. The stored run says it is not whole and
holds only the case that finished; the next pull request is judged case by case against
the newest stored run that holds each case, so the case the cut run lacks is still gated."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from bench.gate.runs import read_run
from bench.gate.runs import run_state
from tests.projects import CONFTEST
from tests.projects import ci
from tests.projects import write_project

# The project's conftest ends the session from inside after the case KILL_AFTER names, as
# a runner's OOM killer (SIGKILL) or a user's Ctrl-C (SIGINT) would between two cases.
KILLER = CONFTEST + '''
import os, signal

def pytest_runtest_logfinish(nodeid, location):
    if os.environ.get("KILL_AFTER") and nodeid.endswith(os.environ["KILL_AFTER"]):
        os.kill(os.getpid(), getattr(signal, os.environ["KILL_SIGNAL"]))
'''


def stored(root: Path) -> list[Path]:
    return sorted((root / "main-runs").glob("*/*.json"))


@pytest.mark.slow
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT], ids=["kill-9", "ctrl-c"])
def test_a_main_run_cut_short_is_stored_as_not_whole_and_never_hides_a_case(tmp_path: Path, how) -> None:
    root = write_project(tmp_path)
    (root / "conftest.py").write_text(KILLER)
    whole = ci(root, "main", "main-1", PLANTED_EPOCH_S="0.1")
    assert whole.returncode == 0, whole.stdout + whole.stderr

    cut = ci(root, "main", "main-2", PLANTED_EPOCH_S="0.1", KILL_AFTER="test_small", KILL_SIGNAL=how.name)
    assert cut.returncode != 0, cut.stdout + cut.stderr
    _, second = stored(root)
    state = run_state(read_run(second))
    assert state.state == ("partial" if how == signal.SIGKILL else "interrupted"), state
    assert [b["name"] for b in json.loads(second.read_text())["benchmarks"]] == ["test_small"]
    summary = (root / "main-2" / "summary.md").read_text()
    assert "**Not a whole run:**" in summary and "Stored as main's newest run" in summary, summary

    same = ci(root, "pr", "pr-same", PLANTED_EPOCH_S="0.1")
    summary = (root / "pr-same" / "summary.md").read_text()
    assert same.returncode == 0, same.stdout + same.stderr
    assert "2 ok" in summary and "not compared" not in summary, summary
    if how == signal.SIGKILL:  # the case the cut run lacks is judged against the run before it
        slow = ci(root, "pr", "pr-slow", PLANTED_EPOCH_S="0.14")
        summary = (root / "pr-slow" / "summary.md").read_text()
        assert slow.returncode == 1 and "2 regressed" in summary, summary
        assert "**test_other** (regressed)" in summary, summary
        # test_other's history is the whole run alone: the cut run holds no record of it
        assert "median epoch 0.14 s vs 0.1 s; limit from noise unknown (1 stored run(s)" in summary, summary
