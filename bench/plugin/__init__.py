"""mlp-loadbench's pytest plugin: options, session set-up and the `loadbench` fixture.

Registered from the root conftest.py. The hooks that need session state live on
`LoadBenchSession` (bench/plugin/session.py), registered here as the plugin 'loadbench'.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench.plugin.fixture import LoadBench
from bench.plugin.options import add_options
from bench.plugin.session import LoadBenchSession

PLUGIN_NAME = "loadbench"


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    # Before pytest-benchmark's own pytest_configure, which loads the baseline and
    # calls our pytest_benchmark_compare_machine_info.
    if not config.pluginmanager.has_plugin(PLUGIN_NAME):
        config.pluginmanager.register(LoadBenchSession(config), PLUGIN_NAME)


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
