"""`python -m bench.search`: a multi-objective Optuna search over compression settings.

Minimises batch-1 p99 latency and energy per 1,000 inferences (time per 1,000 where
the machine has no energy counter) under an accuracy-drop limit, optionally over the
training hyperparameters too; writes the Pareto front as a table, a figure and a JSON
the report reads. Parts: `space` (what is searched), `objective` (one trial's
measurement and its objective values), `study` (Optuna study, resume, progress),
`results` (front, comparison with the hand-picked variants, files), `cli`.
"""
