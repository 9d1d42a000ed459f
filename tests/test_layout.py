"""The house rules the layout promises: data flows one way, no import circles, the ground
floor imports only the standard library, and the gate's floor (bench/gate) and the JSON-only
tools load neither pytest nor torch; the reading tools install without torch.

The import graph is bench/gate/imports.py's (every import form, lazy ones included);
its layer table, LAYERS, says which arrows are allowed (every layer may import the
ground floor, kernels.ground, which imports nothing of the project):

    layer                  may import
    kernels.ground         nothing of the project (stdlib only)
    model                  kernels
    kernels.runtime        nothing of the project but the ground
    kernels.plan           kernels.runtime
    kernels.ops            kernels.runtime, kernels.plan
    bench.gate             nothing of the project but the ground
    bench.monitor          bench.gate, model, kernels
    bench.figures          model
    bench.plugin           bench.gate, bench.monitor, model, kernels
    bench.tools            bench.gate, bench.monitor, bench.figures, model, kernels
    bench.search           bench.gate, bench.figures, model, kernels
    bench/test_*.py        anything
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.gate.imports import GROUND
from bench.gate.imports import LAYERS
from bench.gate.imports import PACKAGES
from bench.gate.imports import SUITE_PREFIX
from bench.gate.imports import Graph
from bench.gate.imports import back_arrows
from bench.gate.imports import build_graph
from bench.gate.imports import cycles

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "triton", "pytest", "_pytest")  # what the gate and the JSON-only tools never load
JSON_TOOLS = ("merge", "compare", "report", "databranch", "ci", "imports")  # history: a library of report
# What requirements-read.txt installs without torch: these tools and what they import.
READING_TOOLS = ("report", "compare", "merge", "databranch", "history", "rows")
READ_REQUIREMENTS = ROOT / "requirements-read.txt"
# Run in a fresh interpreter: any import of HEAVY raises, and the script then checks none was loaded.
BLOCKER = f"""
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {HEAVY!r}:
            raise ImportError("blocked by tests/test_layout.py: " + name)
        return None
sys.meta_path.insert(0, Block())
"""


@pytest.fixture(scope="module")
def graph() -> Graph:
    return build_graph(ROOT, PACKAGES)


def blocked_python(code: str) -> subprocess.CompletedProcess[str]:
    """Run `code` after BLOCKER in a fresh interpreter from the repository root."""
    return subprocess.run([sys.executable, "-c", BLOCKER + code], cwd=ROOT, capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)


def write_package(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


# ------------------------------------------------------------------------ the graph itself


def test_a_planted_from_import_circle_is_found_lazy_imports_too(tmp_path: Path) -> None:
    write_package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg import b\n",
        "pkg/b.py": "def late():\n    from pkg import a\n    return a\n",
        "pkg/c.py": "from pkg import VERSION\n",  # a name, not a module: an import of the package
    })
    graph = build_graph(tmp_path, ["pkg"])
    assert graph.edges["pkg.a"] == {"pkg.b"} and graph.edges["pkg.b"] == {"pkg.a"}
    assert graph.edges["pkg.c"] == {"pkg"}
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.a"]]


def test_relative_and_dotted_imports_resolve_to_project_modules(tmp_path: Path) -> None:
    write_package(tmp_path, {
        "pkg/__init__.py": "from . import sub\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/deep.py": "from ..sub import leaf\nimport pkg.sub.leaf as again\nimport numpy\n",
        "pkg/sub/leaf.py": "",
    })
    graph = build_graph(tmp_path, ["pkg"])
    assert graph.edges["pkg"] == {"pkg.sub"}
    assert graph.edges["pkg.sub.deep"] == {"pkg.sub.leaf"} and graph.external["pkg.sub.deep"] == {"numpy"}
    assert cycles(graph) == []


def test_a_planted_back_arrow_is_found(tmp_path: Path) -> None:
    write_package(tmp_path, {"low/__init__.py": "", "low/rule.py": "from high import tool\n",
                             "high/__init__.py": "", "high/tool.py": "from low import rule\n"})
    graph = build_graph(tmp_path, ["low", "high"])
    assert back_arrows(graph, {"low": (), "high": ("low",)}) == [("low.rule", "high.tool")]


# ------------------------------------------------------------------------ the real tree


def test_model_and_kernels_never_import_bench_or_pytest(graph: Graph) -> None:
    for module in graph.edges:
        if module.split(".")[0] in ("model", "kernels"):
            bad = {m for m in graph.edges[module] if m.split(".")[0] == "bench"} | (graph.external[module] & {"pytest"})
            assert not bad, f"{module} imports {sorted(bad)}"


def test_no_back_arrows_between_layers(graph: Graph) -> None:
    assert back_arrows(graph, LAYERS, SUITE_PREFIX, (GROUND,)) == []


def test_every_layer_may_import_the_ground_but_the_ground_imports_no_layer(tmp_path: Path) -> None:
    write_package(tmp_path, {"pkg/__init__.py": "", "pkg/ground/__init__.py": "", "pkg/ground/env.py": "",
                             "pkg/ground/bad.py": "from pkg.high import tool\n",
                             "pkg/high/__init__.py": "", "pkg/high/tool.py": "from pkg.ground import env\n"})
    graph = build_graph(tmp_path, ["pkg"])
    layers = {"pkg.ground": (), "pkg.high": ()}
    assert back_arrows(graph, layers, ground=("pkg.ground",)) == [("pkg.ground.bad", "pkg.high.tool")]
    assert back_arrows(graph, layers) == [("pkg.ground.bad", "pkg.high.tool"), ("pkg.high.tool", "pkg.ground.env")]


def test_no_import_circles_in_the_project(graph: Graph) -> None:
    """Every circle but the kernels one, which the next test names."""
    others = cycles(graph)
    assert not others, "import circles:\n" + "\n".join(" -> ".join(c) for c in others)


def test_the_gate_imports_neither_pytest_nor_torch_statically(graph: Graph) -> None:
    """From the source: no gate module, nor any project module it reaches, names them."""
    reach = {m for m in graph.edges if m == "bench.gate" or m.startswith("bench.gate.")}
    todo = list(reach)
    while todo:
        for nxt in graph.edges[todo.pop()] - reach:
            reach.add(nxt)
            todo.append(nxt)
    bad = {m: sorted(graph.external[m] & set(HEAVY)) for m in sorted(reach) if graph.external[m] & set(HEAVY)}
    assert not bad, f"the gate's floor reaches {bad}"


def test_the_gate_imports_neither_pytest_nor_torch_when_run(graph: Graph) -> None:
    modules = sorted(m for m in graph.edges if m == "bench.gate" or m.startswith("bench.gate."))
    assert "bench.gate.runs" in modules and "bench.gate.judge" in modules
    code = "import importlib\n" + "".join(f"importlib.import_module({m!r})\n" for m in modules)
    code += f"loaded = sorted(n for n in sys.modules if n.split('.')[0] in {HEAVY!r})\nassert not loaded, loaded\n"
    done = blocked_python(code)
    assert done.returncode == 0, done.stderr[-2000:]


def ground_modules(graph: Graph) -> list[str]:
    return sorted(m for m in graph.edges if m == GROUND or m.startswith(GROUND + "."))


def test_the_ground_imports_only_the_standard_library_statically(graph: Graph) -> None:
    modules = ground_modules(graph)
    assert {"kernels.ground.env", "kernels.ground.axes", "kernels.ground.cases"} <= set(modules)
    for module in modules:
        outside = {m for m in graph.edges[module] if not m.startswith(GROUND)}
        third_party = graph.external[module] - set(sys.stdlib_module_names)
        assert not outside and not third_party, f"{module} imports {sorted(outside | third_party)}"


def test_the_ground_imports_only_the_standard_library_when_run(graph: Graph) -> None:
    """In a fresh interpreter with HEAVY blocked: every module importing the ground loads
    is the standard library's, the ground's, or the package it lives in (kernels/__init__.py)."""
    code = ("import importlib\nbefore = set(sys.modules)\n"
            + "".join(f"importlib.import_module({m!r})\n" for m in ground_modules(graph))
            + f"new = sorted(n for n in set(sys.modules) - before if n.split('.')[0] not in sys.stdlib_module_names"
            f" and n != 'kernels' and not n.startswith({GROUND + '.'!r}) and n != {GROUND!r})\n"
            "assert not new, new\n")
    done = blocked_python(code)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("tool", JSON_TOOLS)
def test_json_only_tools_start_without_torch(tool: str) -> None:
    """--help runs with torch and pytest unimportable: the tool's start loads neither."""
    code = (f"import runpy\nsys.argv = ['bench.tools.{tool}', '--help']\n"
            f"try:\n    runpy.run_module('bench.tools.{tool}', run_name='__main__')\n"
            "except SystemExit as exc:\n    assert exc.code in (0, None), exc.code\n")
    done = blocked_python(code)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout


def test_bench_folder_shows_the_suite_apart_from_the_harness() -> None:
    top = sorted(p.name for p in (ROOT / "bench").iterdir() if not p.name.startswith(("_", ".")))
    harness = {"gate", "plugin", "monitor", "figures", "tools", "search"}
    assert harness <= set(top)
    suite = [name for name in top if name not in harness]
    assert all(name.startswith("test_") or name == "budgets.toml" for name in suite), suite


# ------------------------------------------------------------------------ the reading tools' install


def reached(graph: Graph, start: str) -> set[str]:
    """`start` and every project module it imports, directly or not."""
    seen, todo = {start}, [start]
    while todo:
        for nxt in graph.edges[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def test_the_reading_tools_load_neither_torch_nor_triton(graph: Graph) -> None:
    """From the source (lazy imports too), and when every one is imported in a fresh interpreter."""
    modules = [f"bench.tools.{tool}" for tool in READING_TOOLS]
    for module in modules:
        heavy = {m: sorted(graph.external[m] & set(HEAVY)) for m in reached(graph, module)
                 if graph.external[m] & set(HEAVY)}
        assert not heavy, f"{module} reaches {heavy}"
    code = "import importlib\n" + "".join(f"importlib.import_module({m!r})\n" for m in modules)
    code += f"loaded = sorted(n for n in sys.modules if n.split('.')[0] in {HEAVY!r})\nassert not loaded, loaded\n"
    done = blocked_python(code)
    assert done.returncode == 0, done.stderr[-2000:]


def read_requirements() -> dict[str, str]:
    """requirements-read.txt as {distribution name: the requirement as packaging writes it}."""
    from packaging.requirements import Requirement

    lines = [line.split("#")[0].strip() for line in READ_REQUIREMENTS.read_text().splitlines()]
    return {canonical(Requirement(line).name): str(Requirement(line)) for line in lines if line}


def canonical(name: str) -> str:
    return name.lower().replace("_", "-")


def test_the_read_install_names_exactly_what_the_reading_tools_import(graph: Graph) -> None:
    """Every third-party module the reading tools reach (lazy imports too) comes from a
    distribution the file lists, and the file lists nothing they do not import."""
    from importlib.metadata import packages_distributions

    providers = packages_distributions()
    needed: dict[str, set[str]] = {}
    for tool in READING_TOOLS:
        for module in reached(graph, f"bench.tools.{tool}"):
            for name in graph.external[module] - set(sys.stdlib_module_names):
                for dist in providers.get(name, [name]):  # not installed here (tomli on 3.11): its own name
                    needed.setdefault(canonical(dist), set()).add(module)
    listed = read_requirements()
    missing = {dist: sorted(users) for dist, users in needed.items() if dist not in listed}
    assert not missing, f"requirements-read.txt lacks what these modules import: {missing}"
    assert set(listed) <= set(needed), f"requirements-read.txt lists unused {sorted(set(listed) - set(needed))}"


def test_the_read_install_has_the_bounds_of_pyproject() -> None:
    from packaging.requirements import Requirement

    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]
    bounds: dict[str, set[str]] = {}
    for line in declared:
        requirement = Requirement(line)
        bounds.setdefault(canonical(requirement.name), set()).add(str(requirement))
    for dist, requirement in read_requirements().items():
        assert bounds.get(dist) == {requirement}, f"{dist}: {requirement} here, {bounds.get(dist)} in pyproject.toml"
