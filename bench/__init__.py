"""mlp-loadbench's pytest harness: options, the load monitor fixture, budgets, compare and report."""
