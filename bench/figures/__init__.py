"""The figures the report and the search draw, with matplotlib (Agg); each function
returns a Figure that its caller saves or embeds. `common` (labels, empty panels, the
Pareto front), `training` (resources over a run, Pareto view, roofline), `serving`
(inference records, a search's trials). The history across runs is interactive and
drawn by bench.tools.history.
"""
