"""`python -m bench.tools.selftest`."""

import sys

from bench.tools.selftest.cli import main

sys.exit(main())
