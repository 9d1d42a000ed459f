"""Entry point of `python -m bench.search`."""

from __future__ import annotations

import importlib.util
import sys

# optuna is an optional dependency: without it, one line that says how to get it.
if importlib.util.find_spec("optuna") is None:
    sys.exit("python -m bench.search: needs optuna, an optional dependency: pip install -e '.[search]'")

from bench.search.cli import main  # noqa: E402

sys.exit(main())
