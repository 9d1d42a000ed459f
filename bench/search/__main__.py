"""Entry point of `python -m bench.search`."""

from __future__ import annotations

import sys

from bench.search.cli import main

sys.exit(main())
