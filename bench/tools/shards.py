"""Which collected cases a shard runs.

Without timings, shard i of n takes every n-th case of the sorted node ids. With the
durations of an earlier run (`--shard-durations RUN.json`, any run of this suite, a
merged one too), the cases are dealt longest first, each to the shard with the least
work so far (LPT scheduling), so one shard does not end up with all the slow cases;
a case the run does not know counts as the median known case. Every shard process
computes the same assignment from the same inputs, so the shards cover every case
exactly once.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any


def durations_of(run: Mapping[str, Any]) -> dict[str, float]:
    """Seconds per node id in a pytest-benchmark run: the summed time of its rounds."""
    durations = {}
    for bench in run["benchmarks"]:
        stats = bench.get("stats", {})
        total = stats.get("total", stats.get("mean", 0.0) * stats.get("rounds", 1))
        if bench.get("fullname") and total > 0:
            durations[bench["fullname"]] = float(total)
    return durations


def assign(node_ids: Sequence[str], count: int, durations: Mapping[str, float] | None = None) -> list[list[str]]:
    """The node ids of each of `count` shards."""
    ordered = sorted(node_ids)
    shards: list[list[str]] = [[] for _ in range(count)]
    if not durations:
        for rank, node_id in enumerate(ordered):
            shards[rank % count].append(node_id)
        return shards
    known = [durations[n] for n in ordered if n in durations]
    default = statistics.median(known) if known else 1.0
    cost = {n: durations.get(n, default) for n in ordered}
    load = [0.0] * count
    for node_id in sorted(ordered, key=lambda n: (-cost[n], n)):
        target = min(range(count), key=lambda k: (load[k], k))
        shards[target].append(node_id)
        load[target] += cost[node_id]
    return shards
