"""Print the import graph of bench/, kernels/ and model/: each module and what it
imports of the project, then the import circles and the back-arrows (arrows the house's
layer table in bench/gate/imports.py forbids).

    python -m bench.tools.imports            # the whole graph
    python -m bench.tools.imports --problems # only circles and back-arrows

Exit 0 when there is neither a circle nor a back-arrow, 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from bench.gate.imports import GROUND
from bench.gate.imports import LAYERS
from bench.gate.imports import PACKAGES
from bench.gate.imports import SUITE_PREFIX
from bench.gate.imports import back_arrows
from bench.gate.imports import build_graph
from bench.gate.imports import cycles

ROOT = Path(__file__).resolve().parents[2]


def render(root: Path, problems_only: bool = False) -> tuple[list[str], bool]:
    """The report's lines, and whether the graph holds a circle or a back-arrow."""
    graph = build_graph(root, PACKAGES)
    lines: list[str] = []
    if not problems_only:
        for module in sorted(graph.edges):
            targets = sorted(graph.edges[module])
            lines.append(module + (f" -> {', '.join(targets)}" if targets else ""))
        lines.append("")
    circles = cycles(graph)
    backs = back_arrows(graph, LAYERS, SUITE_PREFIX, (GROUND,))
    lines.append(f"import circles: {len(circles)}")
    lines += [f"  {' -> '.join(circle)}" for circle in circles]
    lines.append(f"back-arrows: {len(backs)}")
    lines += [f"  {src} -> {dst}" for src, dst in backs]
    return lines, bool(circles or backs)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tools.imports", description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems", action="store_true", help="print only import circles and back-arrows")
    args = parser.parse_args(argv)
    lines, bad = render(ROOT, problems_only=args.problems)
    print("\n".join(lines))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
