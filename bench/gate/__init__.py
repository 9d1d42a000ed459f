"""The gate's floor: run files, the rules that judge a case, and the verdict, in plain Python.

Nothing here imports pytest or torch (tests/test_layout.py holds it to that), so the
pytest plugin, the JSON-only tools and the search stand on it side by side and the
tools start without loading the training stack.
"""
