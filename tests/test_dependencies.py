"""pyproject's dependencies: what the main job imports, bounded where the code needs it."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
# distribution name -> the module it is imported as, where they differ
IMPORTED_AS = {"nvidia-ml-py": "pynvml", "pytest-benchmark": "pytest_benchmark"}


def name_of(requirement: str) -> str:
    return re.split(r"[<>=!~;\s\[]", requirement, maxsplit=1)[0].lower()


def spec_of(requirement: str) -> str:
    return requirement.split(";", 1)[0][len(name_of(requirement)) :].strip()


def imported_top_levels() -> set[str]:
    """Top-level modules the package's source imports (bench/, kernels/, model/)."""
    found = set()
    for package in ("bench", "kernels", "model"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    found.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    found.add(node.module.split(".")[0])
    return found


def test_every_runtime_dependency_is_imported_by_the_package():
    imported = imported_top_levels()
    unused = [
        requirement for requirement in PROJECT["dependencies"]
        if IMPORTED_AS.get(name_of(requirement), name_of(requirement).replace("-", "_")) not in imported
    ]
    assert not unused, f"runtime dependencies nothing in bench/, kernels/ or model/ imports: {unused}"


def test_hypothesis_is_a_test_dependency_only():
    assert "hypothesis" not in {name_of(r) for r in PROJECT["dependencies"]}
    assert "hypothesis" in {name_of(r) for r in PROJECT["optional-dependencies"]["test"]}


def test_torch_and_triton_are_bounded_where_the_code_needs_it():
    specs = {name_of(r): spec_of(r) for r in PROJECT["dependencies"]}
    assert specs["torch"] == ">=2.11"  # the GPU machines' torch; torch.library.triton_op is public from 2.6
    assert re.fullmatch(r">=3\.\d+,<3\.\d+", specs["triton"]), specs["triton"]


def test_the_triton_bound_ends_where_the_runtime_corner_was_tested():
    from kernels.runtime import versions

    upper = re.search(r"<(\d+)\.(\d+)", spec_of(next(r for r in PROJECT["dependencies"] if name_of(r) == "triton")))
    assert upper is not None
    below = (int(upper.group(1)), int(upper.group(2)) - 1)
    assert below == versions.TRITON_NEWEST


def test_the_lowest_version_check_pins_every_lower_bound_but_torch():
    import importlib.util

    spec = importlib.util.spec_from_file_location("lowest", ROOT / ".ci" / "lowest.py")
    lowest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lowest)  # type: ignore[union-attr]
    pins = dict(pin.split("==") for pin in lowest.lowest_pins(ROOT / "pyproject.toml", ["test"]))
    assert "torch" not in pins
    triton = spec_of(next(r for r in PROJECT["dependencies"] if name_of(r) == "triton"))
    assert pins["triton"] == re.search(r">=([\d.]+)", triton).group(1)  # type: ignore[union-attr]
    bound = spec_of(next(r for r in PROJECT["dependencies"] if name_of(r) == "pytest-benchmark"))
    assert pins["pytest-benchmark"] == re.search(r">=([\d.]+)", bound).group(1)  # type: ignore[union-attr]
    assert "hypothesis" in pins and "tomli" not in pins  # the test extra's too; tomli's marker is false on 3.11+
    assert "lowest.py" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
