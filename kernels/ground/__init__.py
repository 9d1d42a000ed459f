"""The ground floor: the small pieces every package and layer reads, standard library only.

`env` (every LOADBENCH_* variable: one table, parsers, one check), `axes` (implementation,
precision, loop, serving variants), `cases` (the study's experiments and case ids),
`files` (atomic writes), `args` (the argument checks the commands share), `processes` (a
child process's environment on a checkout). It lives in kernels/ because kernels/ is the
lowest package (model/ and bench/ stand on it), and it imports nothing of the project:
model/, kernels/ and bench/, the gate and the JSON-only tools included, import it without
loading torch or triton (tests/test_layout.py).
"""
