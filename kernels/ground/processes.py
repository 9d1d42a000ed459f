"""The environment of a child process that must import this checkout's packages.

The bisect tools run pytest on another checkout, and the pytest plugin starts worker
processes that compile ahead: both put a checkout first on PYTHONPATH, ahead of the
inherited entries and of any installed copy of the project.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def checkout_env(repo: Path, environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` with `repo` first on PYTHONPATH (once), the inherited entries after it."""
    rest = [entry for entry in environ.get("PYTHONPATH", "").split(os.pathsep) if entry and Path(entry) != repo]
    return {**environ, "PYTHONPATH": os.pathsep.join([str(repo), *rest])}
