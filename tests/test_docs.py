"""The prose pages (README.md, docs/*.md) hold no measurement history: every relative link
resolves, every measured figure links to the row that holds it (docs/measurements.md or
docs/data/), and no paragraph names a commit. Code blocks and code spans are commands and
settings, not prose, so the figure and commit checks leave them out."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# Generated pages: docs/measurements.md renders the CSVs docs/data/<stem>.csv, one section per
# stem; docs/reference/ renders the code's own tables. Both are built from data, so the prose
# rules do not apply to them, and a link to one holds once the generator has written it.
MEASUREMENTS = DOCS / "measurements.md"
GENERATED = {MEASUREMENTS, *(DOCS / "reference" / name for name in ("records.md", "environment.md", "budgets.md"))}
STEMS = tuple(sorted(path.stem for path in (DOCS / "data").glob("*.csv")))
LINK = re.compile(r"\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(([^()\s]+)\)")
CODE_SPAN = re.compile(r"(`+).+?\1", re.DOTALL)
UNIT = r"(?:TFLOP/s|GB/s|MB/s|minutes?|seconds?|hours?|min|ms|us|µs|μs|s|h|W|J)"
# A measured figure: a number with a unit of time, rate, power or energy, a percentage or a ratio.
FIGURE = re.compile(rf"(?<![\w.^/-])-?\d+(?:[.,]\d+)*(?:\s?{UNIT}(?!\w)|\s?%|x(?!\w))")
COMMIT = re.compile(r"(?<![\w/.-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w/.-])")


def pages() -> list[Path]:
    return [ROOT / "README.md", *(path for path in sorted(DOCS.glob("*.md")) if path not in GENERATED)]


def paragraphs(text: str) -> list[tuple[int, str]]:
    """(first line, text) of each paragraph, table or list: blank-line separated, fenced and
    indented code blocks left out."""
    found: list[tuple[int, str]] = []
    block: list[str] = []
    start = 0
    fenced = False

    def close() -> None:
        if block and not all(line.startswith(("    ", "\t")) for line in block):
            found.append((start, "\n".join(block)))
        block.clear()

    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            close()
            fenced = not fenced
        elif fenced:
            continue
        elif not line.strip():
            close()
        else:
            if not block:
                start = number
            block.append(line)
    close()
    return found


def prose(paragraph: str) -> str:
    return CODE_SPAN.sub("", paragraph)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(line.lstrip("#")) for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("#")}


def link_problem(page: Path, target: str) -> str | None:
    """What is wrong with one link of `page`, or None."""
    if re.match(r"[a-z][a-z0-9+.-]*:", target):
        return None  # http:, https:, mailto:
    path_part, _, anchor = target.partition("#")
    path = (page.parent / path_part).resolve() if path_part else page
    if not path.is_relative_to(ROOT):
        return f"{target}: outside the repository"
    if path == MEASUREMENTS:
        return None if not anchor or anchor in STEMS else f"{target}: no section '{anchor}' (stems: {', '.join(STEMS)})"
    if path in GENERATED:
        return None
    if not path.exists():
        return f"{target}: no such file"
    if anchor and path.suffix == ".md" and anchor not in anchors(path):
        return f"{target}: no heading with the anchor '{anchor}'"
    return None


def broken_links(page: Path, text: str) -> list[str]:
    return [f"{page.name}:{line}: {problem}" for line, paragraph in paragraphs(text)
            for target in LINK.findall(prose(paragraph)) if (problem := link_problem(page, target))]


def unlinked_figures(page: Path, text: str) -> list[str]:
    problems = []
    for line, paragraph in paragraphs(text):
        words = prose(paragraph)
        figures = [match.group(0) for match in FIGURE.finditer(words)]
        linked = any(target.split("#")[0].endswith("measurements.md") or "data/" in target
                     for target in LINK.findall(words))
        if figures and not linked:
            problems.append(f"{page.name}:{line}: {', '.join(figures[:4])} without a link to measurements.md")
    return problems


def commit_ids(page: Path, text: str) -> list[str]:
    return [f"{page.name}:{line}: {match.group(0)}" for line, paragraph in paragraphs(text)
            for match in COMMIT.finditer(prose(paragraph))]


def test_every_relative_link_points_to_a_file_and_a_heading_there():
    problems = [problem for page in pages() for problem in broken_links(page, page.read_text(encoding="utf-8"))]
    assert not problems, "\n".join(problems)


def test_every_measured_figure_links_to_its_row():
    problems = [problem for page in pages() for problem in unlinked_figures(page, page.read_text(encoding="utf-8"))]
    assert not problems, "\n".join(problems)


def test_no_commit_ids_in_prose():
    problems = [problem for page in pages() for problem in commit_ids(page, page.read_text(encoding="utf-8"))]
    assert not problems, "\n".join(problems)


def test_every_page_the_code_names_exists():
    """Comments and docstrings point readers at docs/ pages: a page that moved leaves none dangling."""
    named = re.compile(r"docs/[\w/-]+\.md")
    folders = ("bench", "kernels", "model", "tests")
    sources = [ROOT / "bench" / "budgets.toml", ROOT / "pyproject.toml",
               *(path for folder in folders for path in sorted((ROOT / folder).rglob("*.py")))]
    problems = [f"{path.relative_to(ROOT)}: {name}" for path in sources
                for name in sorted(set(named.findall(path.read_text(encoding="utf-8"))))
                if not (ROOT / name).exists() and ROOT / name not in GENERATED]
    assert not problems, "\n".join(problems)


def test_the_generated_pages_are_not_checked_as_prose():
    assert MEASUREMENTS not in pages() and (ROOT / "README.md") in pages()


# Planted paragraphs: each check fails on a bad one and passes its good twin.
@pytest.mark.parametrize(
    ("text", "bad"),
    [("See [the tiers](tiers.md).", False),
     ("See [the tiers](no-such-page.md).", True),
     ("See [the gate](gate.md#the-time-rule).", False),
     ("See [the gate](gate.md#no-such-heading).", True),
     ("See [the rows](measurements.md#loops).", False),
     ("See [the rows](measurements.md#history-of-loops).", True),
     ("See [outside](../../etc/passwd).", True),
     ("A link in code is none: `[x](no-such-page.md)`.", False),
     ("See [the site](https://example.org/missing).", False)],
)
def test_a_planted_link(text, bad):
    assert bool(broken_links(DOCS / "planted.md", text)) is bad


@pytest.mark.parametrize(
    ("text", "bad"),
    [("The tier took 4 min 27 s on one H100.", True),
     ("An epoch takes 0.0186 s.", True),
     ("The kernel was 1.53x eager torch.", True),
     ("It lost 45% of the energy.", True),
     ("A step of 117.2 us.", True),
     ("Power 300 W, energy 12 J.", True),
     ("An epoch takes [0.0186 s](measurements.md#loops).", False),
     ("The rows: [gate-runs.csv](data/gate-runs.csv), 4 of 4 green in 312 s.", False),
     ("An epoch\ntakes 0.0186 s,\nsee [the rows](measurements.md#loops).", False),
     ("The default is `time_slower_pct = 10`, the `--monitor-period 0.1` s.", False),
     ("    pytest bench/  # took 5 min", False),
     ("8 epochs of batch 512 x 512 on 3xTF32, fp32 and bf16 at sm_90.", False)],
)
def test_a_planted_figure(text, bad):
    assert bool(unlinked_figures(DOCS / "planted.md", text)) is bad


@pytest.mark.parametrize(
    ("text", "bad"),
    [("Measured at 74c3d7f on one H200.", True),
     ("The build of a184d86ef0 was faster.", True),
     ("Measured on one H200 at the tree of today.", False),
     ("The run `git show 74c3d7f` is code.", False),
     ("```\ngit checkout 74c3d7f\n```", False)],
)
def test_a_planted_commit_id(text, bad):
    assert bool(commit_ids(DOCS / "planted.md", text)) is bad


def test_paragraphs_leave_out_code_blocks_and_keep_tables_whole():
    text = "Prose.\n\n    indented code\n\n```\nfenced\n\ncode\n```\n| a | b |\n|---|---|\n| 1 | 2 |\n"
    assert [line for line, _ in paragraphs(text)] == [1, 10]
    assert paragraphs(text)[1][1].count("\n") == 2
