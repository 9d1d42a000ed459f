"""Prose belongs in docs/: module docstrings say the job and the contract in at most
15 lines, comments carry no commit ids, and no `# fmt: skip` marker waits for a
formatter that does not run."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bench", "kernels", "model")
DOCSTRING_LINES = 15
# A commit id in prose: 7 to 40 hex digits holding both a digit and a letter, standing alone.
COMMIT = re.compile(r"(?<![\w/.-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w/.-])")


def sources() -> list[Path]:
    files = [ROOT / "conftest.py"]
    for package in PACKAGES:
        files += sorted((ROOT / package).rglob("*.py"))
    return [path for path in files if path.exists()]


def comments(text: str) -> list[tuple[int, str]]:
    """(line, text) of every comment in a Python source."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            found.append((token.start[0], token.string))
    return found


def long_docstrings(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    doc = ast.get_docstring(tree, clean=False)
    if doc is not None and len(doc.strip().splitlines()) > DOCSTRING_LINES:
        return [f"{path.relative_to(ROOT)}: module docstring of {len(doc.strip().splitlines())} lines"]
    return []


def test_module_docstrings_are_at_most_fifteen_lines():
    problems = [problem for path in sources() for problem in long_docstrings(path)]
    assert not problems, "\n".join(problems)


def test_no_commit_ids_in_comments_or_docstrings():
    problems = []
    for path in sources():
        text = path.read_text(encoding="utf-8")
        for line, comment in comments(text):
            if COMMIT.search(comment):
                problems.append(f"{path.relative_to(ROOT)}:{line}: {comment.strip()}")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                doc = ast.get_docstring(node, clean=False) or ""
                if COMMIT.search(doc):
                    problems.append(f"{path.relative_to(ROOT)}: docstring of {getattr(node, 'name', 'the module')}")
    assert not problems, "\n".join(problems)


def test_no_fmt_skip_markers_without_a_formatter():
    problems = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in [*sources(), *sorted((ROOT / "tests").rglob("*.py"))]
        for line, comment in comments(path.read_text(encoding="utf-8"))
        if "fmt: skip" in comment or "fmt: off" in comment
    ]
    assert not problems, f"{len(problems)} markers, first: {problems[:5]}"


@pytest.mark.parametrize(
    ("text", "found"),
    [("# measured at 74c3d7f", True), ("# see a184d86ef0", True), ("# 1024 rows", False), ("# deadbeef", False),
     ("# sha256 of the file", False), ("# cafe123", True)],
)
def test_the_commit_pattern(text, found):
    assert bool(COMMIT.search(text)) is found


def test_the_readme_is_short_and_has_contents():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 160, f"README.md has {len(lines)} lines; results and details belong in docs/"
    assert any(line.startswith("**Contents:**") for line in lines[:30])
