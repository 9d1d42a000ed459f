"""Entry point of `python -m bench.search` and of the `mlp-loadbench-search` command."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence

NO_OPTUNA = "python -m bench.search: needs optuna, an optional dependency: pip install -e '.[search]'"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the search's command line; without optuna (an optional dependency), one line
    on stderr that says how to get it, and exit 1."""
    if importlib.util.find_spec("optuna") is None:
        print(NO_OPTUNA, file=sys.stderr)
        return 1
    from bench.search.cli import main as search_main  # imports optuna

    return search_main(argv)


if __name__ == "__main__":
    sys.exit(main())
