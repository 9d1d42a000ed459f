"""The project's import graph, read from the source: which module imports which.

Every import form counts, at any depth of a file (lazy imports inside functions and
TYPE_CHECKING blocks too): ``import a.b``, ``from a import b`` (an import of the module
``a.b`` where ``a/b.py`` or ``a/b/`` exists, else of ``a``) and relative imports. Only
modules of the given packages are nodes; everything else a file imports is kept as
its top-level name (`Graph.external`) for rules such as "the gate imports no torch".
tests/test_layout.py holds the house rules to this graph; bench/tools/imports.py prints it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Graph:
    """Project modules (dotted name -> file), their imports of each other, and the
    top-level names of what else each imports."""

    files: Mapping[str, Path]
    edges: Mapping[str, frozenset[str]]
    external: Mapping[str, frozenset[str]]

    def arrows(self) -> list[tuple[str, str]]:
        """Every (importer, imported) pair, sorted."""
        return sorted((src, dst) for src, targets in self.edges.items() for dst in targets)


def module_name(root: Path, path: Path) -> str:
    """The dotted module a file under `root` defines (a package's __init__.py is the package)."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def find_modules(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Every module of the named top-level packages under `root`."""
    return {module_name(root, p): p for package in packages for p in sorted((root / package).rglob("*.py"))}


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module an ImportFrom names (relative ones from `module`'s package)."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
    return ".".join([*base, *([node.module] if node.module else [])])


def imports_of(module: str, path: Path, modules: Mapping[str, Path]) -> tuple[set[str], set[str]]:
    """(project modules `module` imports, top-level names of everything else it imports)."""
    inside: set[str] = set()
    outside: set[str] = set()
    is_package = path.name == "__init__.py"

    def add(name: str) -> None:
        # `import a.b.c` binds the module a.b.c; the nearest project module is the target.
        parts = name.split(".")
        for end in range(len(parts), 0, -1):
            candidate = ".".join(parts[:end])
            if candidate in modules:
                inside.add(candidate)
                return
        if name:
            outside.add(parts[0])

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                add(submodule if submodule in modules else base)
    inside.discard(module)
    return inside, outside


def build_graph(root: Path, packages: Iterable[str]) -> Graph:
    """The import graph of `packages` (top-level folders under `root`)."""
    files = find_modules(root, packages)
    edges: dict[str, frozenset[str]] = {}
    external: dict[str, frozenset[str]] = {}
    for name, path in files.items():
        inside, outside = imports_of(name, path, files)
        edges[name], external[name] = frozenset(inside), frozenset(outside)
    return Graph(files, edges, external)


def cycles(graph: Graph) -> list[list[str]]:
    """One import circle per strongly connected group of modules (Tarjan's algorithm),
    each as a path that starts and ends at its smallest module name; sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []
    counter = [0]

    def visit(start: str) -> None:
        # Iterative, so a deep graph does not meet Python's recursion limit.
        work = [(start, iter(sorted(graph.edges[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(group)

    for name in sorted(graph.edges):
        if name not in index:
            visit(name)
    return sorted(_circle(graph, group) for group in groups)


def _circle(graph: Graph, group: set[str]) -> list[str]:
    """A shortest path from the group's smallest module back to itself, inside the group."""
    start = min(group)
    trails = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for nxt in sorted(graph.edges[node] & group):
            if nxt == start:
                return trails[node] + [start]
            if nxt not in trails:
                trails[nxt] = trails[node] + [nxt]
                queue.append(nxt)
    return [start, start]  # unreachable for a strongly connected group


def layer_of(module: str, layers: Iterable[str]) -> str | None:
    """The longest layer name that is `module` or a package above it."""
    found = [layer for layer in layers if module == layer or module.startswith(layer + ".")]
    return max(found, key=len) if found else None


def back_arrows(graph: Graph, allowed: Mapping[str, Iterable[str]], free: str = "",
                ground: Iterable[str] = ()) -> list[tuple[str, str]]:
    """The arrows a layer table forbids: `allowed` maps a layer (a package or module
    prefix) to the layers (or single modules) its modules may import. An arrow to a
    module inside the importer's own layer or an allowed one is allowed, and so is every
    arrow into a module of `ground` (the floor every layer stands on); modules of no
    layer, and importers whose name starts with `free` (when given), are not judged."""
    out = []
    ground = tuple(ground)
    for src, dst in graph.arrows():
        if free and src.startswith(free):
            continue
        mine, theirs = layer_of(src, allowed), layer_of(dst, allowed)
        if mine is None or theirs is None or layer_of(dst, ground) is not None:
            continue
        if not any(dst == ok or dst.startswith(ok + ".") for ok in (mine, *allowed[mine])):
            out.append((src, dst))
    return out


# The house's layers and the arrows allowed between them (an arrow inside a layer is
# always allowed; the more specific layer of a module wins). Data flows one way: the
# ground floor (kernels/ground: standard library only) under everything; model/ and
# kernels/ know nothing of bench/; bench/gate is the floor the plugin, the tools and the
# search stand on side by side, bench/figures what the tools and the search draw with;
# only the suite (bench/test_*.py) stands on the plugin.
PACKAGES = ("bench", "kernels", "model")
GROUND = "kernels.ground"  # every layer may import it; it imports nothing of the project
LAYERS: dict[str, tuple[str, ...]] = {
    GROUND: (),
    "model": ("kernels",),
    "kernels": (),
    # kernels/ in floors: the runtime corner, launch planning above it, the fused ops on top
    "kernels.runtime": (),
    "kernels.plan": ("kernels.runtime",),
    "kernels.ops": ("kernels.runtime", "kernels.plan"),
    "bench": (),
    "bench.gate": (),
    "bench.monitor": ("bench.gate", "model", "kernels"),
    "bench.figures": ("model",),
    "bench.plugin": ("bench.gate", "bench.monitor", "model", "kernels"),
    "bench.tools": ("bench.gate", "bench.monitor", "bench.figures", "model", "kernels"),
    "bench.search": ("bench.gate", "bench.figures", "model", "kernels"),
}
# The suite's test modules (bench/test_*.py) may import every layer.
SUITE_PREFIX = "bench.test_"
