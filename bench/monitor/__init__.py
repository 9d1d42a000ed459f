"""The load monitor: the sampler thread, its summaries and the per-case sample series."""
