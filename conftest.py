"""Registers the mlp-loadbench pytest plugin for every run inside this checkout."""

pytest_plugins = ["bench.plugin"]
