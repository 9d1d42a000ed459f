"""The time gate's self-test: how often the gate fails a case that did not change, how
often it catches a planted slowdown, and which per-case budget keeps it quiet.

    python -m bench.tools.selftest -k EXPR [--runs N] [--plant PCT ...] [--mode host|gpu]
                                   [--gpus 0,1,...] [--out DIR] [--resume] [-- PYTEST ARGS...]
    python -m bench.tools.selftest --from DIR [--out DIR] [--budgets PATH]

The chosen cases run N times as they are (A/A), then N times per planted slowdown, each
run one pytest process writing its own JSON (``--gpus`` runs one lane per GPU). The
analysis judges every A/A run against the others and every planted run against the A/A
history with the gate's own rules, and writes ``selftest.md`` (false alarms, catches per
case) and ``suggested-budgets.toml``; docs/reports.md has it in full. Parts: `campaign`
(run files), `running` (pytest sessions), `analysis` (statistics, budgets), `outputs`, `cli`.
"""

from bench.tools.selftest.cli import main

__all__ = ["main"]
