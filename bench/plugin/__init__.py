"""mlp-loadbench's pytest plugin: options, session set-up and the `loadbench` fixture.

Registered from the root conftest.py. The hooks that need session state live on
`LoadBenchSession` (bench/plugin/session.py), registered here as the plugin 'loadbench'.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pytest_benchmark.logger import PytestBenchmarkWarning

from kernels.ground.args import directory_problem
from kernels.ground.args import file_problem
from bench.plugin import startup
from bench.gate.runs import machine_difference
from bench.plugin.fixture import LoadBench
from bench.plugin.options import add_options
from bench.plugin.session import LoadBenchSession
from kernels.ground import env as loadbench_env

PLUGIN_NAME = "loadbench"
MACHINE_INFO_DUMP = "Benchmark machine_info is different"  # how pytest-benchmark's warning begins


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    # Before pytest-benchmark's own pytest_configure, which loads the baseline (raising
    # on a path it cannot read) and calls our pytest_benchmark_compare_machine_info.
    check_start(config)
    if not config.pluginmanager.has_plugin(PLUGIN_NAME):
        config.pluginmanager.register(LoadBenchSession(config), PLUGIN_NAME)


def check_start(config: pytest.Config) -> None:
    """Refuse, in one line, a bad LOADBENCH_* variable, a baseline path that names no
    file, or an output folder that cannot be written, before anything trains."""
    problem = loadbench_env.validate_all()
    compare = config.getoption("benchmark_compare", None)
    if compare is not None:
        config.option.benchmark_compare = compare = startup.compare_path(compare)
        problem = problem or startup.compare_problem(compare, config.getoption("benchmark_storage", ""))
    json_path = startup.json_path(config.getoption("benchmark_json", None))
    if problem is None and json_path is not None:
        trouble = file_problem(json_path.expanduser())
        problem = trouble and f"--benchmark-json {json_path}: {trouble}"
    folders = [(f"--series-dir {config.getoption('series_dir')}", config.getoption("series_dir"))]
    if config.getoption("benchmark_save", None) or config.getoption("benchmark_autosave", None):
        storage = startup.storage_dir(str(config.getoption("benchmark_storage", "") or ""))
        folders.append((f"--benchmark-storage {storage}", storage))
    folders += [(f"{name}={loadbench_env.read(name)}", loadbench_env.read(name))
                for name in loadbench_env.PATH_VARIABLES]
    for where, folder in folders:
        if problem is None and folder:
            trouble = directory_problem(Path(folder).expanduser())
            problem = trouble and f"{where}: {trouble}"
    if problem:
        raise pytest.UsageError(problem)


@pytest.hookimpl(wrapper=True)
def pytest_benchmark_compare_machine_info(
    config: pytest.Config, benchmarksession: Any, machine_info: dict[str, Any], compared_benchmark: Any
) -> Any:
    """Say in one short line what differs from the baseline's machine_info, in place of
    pytest-benchmark's own warning, which prints both dicts whole (kilobytes on one
    line), and keep that warning from ending the session.

    pytest-benchmark (5.3) names its storage relative to the working directory in that
    warning, and raises ValueError when the storage lies outside it and the machine
    info differs: the very case our session's hook (which runs first) judges and
    reports as 'shown, not gated'. The self-hosted workflow keeps its baselines
    outside the checkout, so one driver update would break every pull request."""
    logger = benchmarksession.logger
    level = logger.level  # --benchmark-verbose would also print the dump on the terminal
    logger.level = min(level, logger.NORMAL)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=MACHINE_INFO_DUMP, category=PytestBenchmarkWarning)
        try:
            result = yield
        except ValueError as exc:
            if "subpath" not in str(exc) and "relative" not in str(exc):
                raise
            result = None
        finally:
            logger.level = level
    line = machine_difference(machine_info, compared_benchmark.get("machine_info") or {})
    if line is not None:
        logger.warning(line)
    return result


def pytest_sessionstart(session: pytest.Session) -> None:
    loadbench = session.config.pluginmanager.get_plugin(PLUGIN_NAME)
    if loadbench is not None:
        loadbench.check_baseline_files()


def get_session(config: pytest.Config) -> LoadBenchSession:
    return config.pluginmanager.get_plugin(PLUGIN_NAME)


@pytest.fixture
def loadbench(benchmark: object, request: pytest.FixtureRequest) -> Iterator[LoadBench]:
    """Train one case under pytest-benchmark with the load monitor; see bench/plugin/fixture.py."""
    yield LoadBench(benchmark, get_session(request.config), request)
