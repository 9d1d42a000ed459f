"""The house rules the layout promises: data flows one way, no import circles."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def imports_of(path: Path) -> set[str]:
    """Every module a file imports, at any depth (lazy and TYPE_CHECKING imports too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_model_and_kernels_never_import_bench_or_pytest() -> None:
    for folder in ("model", "kernels"):
        for path in (ROOT / folder).glob("*.py"):
            bad = {name for name in imports_of(path) if name.split(".")[0] in ("bench", "pytest")}
            assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_no_import_circles_in_the_project() -> None:
    files = [p for folder in ("model", "kernels", "bench") for p in (ROOT / folder).rglob("*.py")]
    modules = {module_name(p): p for p in files}
    graph = {name: {m for m in imports_of(path) if m in modules and m != name} for name, path in modules.items()}

    def cycle_from(start: str) -> list[str] | None:
        stack = [(start, [start])]
        seen: set[str] = set()
        while stack:
            node, trail = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    return trail + [start]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, trail + [nxt]))
        return None

    for name in sorted(graph):
        cycle = cycle_from(name)
        assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_bench_folder_shows_the_suite_apart_from_the_harness() -> None:
    top = sorted(p.name for p in (ROOT / "bench").iterdir() if not p.name.startswith(("_", ".")))
    harness = {"gate", "plugin", "monitor", "tools", "search"}
    assert harness <= set(top)
    suite = [name for name in top if name not in harness]
    assert all(name.startswith("test_") or name in ("cases.py", "budgets.toml") for name in suite), suite
