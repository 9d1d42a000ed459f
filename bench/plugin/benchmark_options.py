"""pytest-benchmark's own options, each honoured or refused at start-up.

A training case's rounds are its steady epochs: the profile (or ``--epochs``) fixes how
many there are, the first epoch is the warm-up, and nothing is calibrated. The options
that would size or calibrate rounds therefore mean nothing here, and rather than ignore
them silently the session stops with one line saying why. The README's option table
lists every option with what it does here; tests/test_benchmark_options.py has a test
per row.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
from collections.abc import Sequence

import pytest

from bench.gate.compare import Baseline

# option: why the suite refuses it (a line of the start-up error)
REFUSED = {
    "--benchmark-min-time": "rounds are epochs, whose count the profile or --epochs sets; nothing is calibrated",
    "--benchmark-max-time": "rounds are epochs, whose count the profile or --epochs sets; a time limit would "
                            "change the training, and with it accuracy",
    "--benchmark-calibration-precision": "rounds are epochs, timed once each; nothing is calibrated",
    "--benchmark-warmup": "the first epoch of every case is its warm-up round (compilation, graph capture), "
                          "timed and recorded apart as first_epoch_s",
    "--benchmark-warmup-iterations": "the first epoch of every case is its warm-up round, recorded apart as "
                                     "first_epoch_s",
}
SAVING = ("--benchmark-save", "--benchmark-autosave", "--benchmark-json")
NO_FILE_STORAGE = ("the time gate reads its baselines and history from pytest-benchmark's file storage; "
                   "use --benchmark-storage=file://PATH (or a folder path)")


def given(config: pytest.Config, flag: str) -> bool:
    """Whether the user passed `flag` (on the command line, in PYTEST_ADDOPTS or in the ini
    file's addopts), as opposed to pytest-benchmark's default standing in."""
    sources: list[str] = [*config.invocation_params.args, *shlex.split(os.environ.get("PYTEST_ADDOPTS", ""))]
    sources += list(config.getini("addopts") or [])
    return any(arg == flag or arg.startswith(flag + "=") for arg in sources)


def check(config: pytest.Config, timed_epochs: int) -> None:
    """Refuse at start-up what has no meaning for epochs, and what asks for more timed
    epochs than a case has; `timed_epochs` is the epochs after the warm-up."""
    for flag, why in REFUSED.items():
        if given(config, flag):
            raise pytest.UsageError(f"{flag}: not used by mlp-loadbench: {why}")
    if given(config, "--benchmark-min-rounds"):
        wanted = config.getoption("benchmark_min_rounds")
        if wanted > timed_epochs:
            raise pytest.UsageError(
                f"--benchmark-min-rounds {wanted}: a training case times {timed_epochs} epoch(s) (its epochs after "
                f"the warm-up); pass --epochs {wanted + 1} or more, or fewer rounds"
            )
    if config.getoption("benchmark_compare_fail", None) and not config.getoption("benchmark_compare", None):
        raise pytest.UsageError("--benchmark-compare-fail: needs --benchmark-compare, the baseline its thresholds "
                                "judge against (pytest-benchmark would find none only after training every case)")
    if config.getoption("benchmark_disable", False) and not config.getoption("benchmark_enable", False):
        asked = [flag for flag, dest in zip(SAVING, ("benchmark_save", "benchmark_autosave", "benchmark_json"))
                 if config.getoption(dest, None)]
        if asked:
            raise pytest.UsageError(f"--benchmark-disable with {' and '.join(asked)}: a disabled run times nothing "
                                    "and pytest-benchmark stores nothing; drop one of them")
    storage = str(config.getoption("benchmark_storage", "") or "")
    if "://" in storage and not storage.startswith("file://"):
        scheme = storage.split("://", 1)[0]
        raise pytest.UsageError(f"--benchmark-storage {scheme}://...: refused: {NO_FILE_STORAGE}")
    if config.getoption("benchmark_histogram", None) and importlib.util.find_spec("pygal") is None:
        raise pytest.UsageError(
            "--benchmark-histogram: needs pygal and pygaljs, which are not installed: "
            "pip install 'mlp-loadbench[report]'"
        )


def check_compare_fail(config: pytest.Config, baselines: Sequence[Baseline]) -> None:
    """--benchmark-compare-fail judges pytest-benchmark's statistics against the baseline
    with none of the suite's comparability rules: refuse it against a baseline that
    measured something else. A planted slowdown alone is let through: such a run exists
    to show what a threshold catches."""
    if not config.getoption("benchmark_compare_fail", None):
        return
    for baseline in baselines:
        if set(baseline.differs) - {"plant"}:
            raise pytest.UsageError(
                f"--benchmark-compare-fail: the baseline measured something else ({baseline.reason}); "
                "pytest-benchmark would judge it anyway. Compare against a run with the same settings"
            )
