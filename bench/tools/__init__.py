"""Tools that read saved runs: report, figures, merge, shards, bisect and the self-test."""
