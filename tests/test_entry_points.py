"""The commands pyproject.toml installs: each names a function that imports and runs."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]


def test_the_search_and_the_self_test_are_installed_as_commands() -> None:
    assert SCRIPTS["mlp-loadbench-search"] == "bench.search.__main__:main"
    assert SCRIPTS["mlp-loadbench-selftest"] == "bench.tools.selftest:main"


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_each_command_names_a_function_that_shows_its_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    module_name, _, function_name = SCRIPTS[name].partition(":")
    function = getattr(importlib.import_module(module_name), function_name)
    assert callable(function)
    with pytest.raises(SystemExit) as done:
        function(["--help"])
    assert done.value.code == 0
    assert "usage:" in capsys.readouterr().out
