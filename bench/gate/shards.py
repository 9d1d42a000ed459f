"""Which collected cases a shard runs.

Cases travel in units: a serving case (bench/test_inference.py) goes with every other
variant and implementation of its configuration, since they serve one trained model
and a shard holding them all trains it once; any other case is a unit of its own.
Without timings, shard i of n takes every n-th unit of the sorted unit names. With the
durations of an earlier run (`--shard-durations RUN.json`, any run of this suite, a
merged one too), the units are dealt longest first, each to the shard with the least
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


def unit_of(node_id: str, params: Mapping[str, Any]) -> str:
    """The unit a collected case travels with: a serving case's test and configuration
    (its `case` and `variant` parameters), else the case itself."""
    case = params.get("case")
    if "variant" in params and case is not None:
        return f"{node_id.split('[', 1)[0]}[{getattr(case, 'id', case)}]"
    return node_id


def assign(
    node_ids: Sequence[str], count: int, durations: Mapping[str, float] | None = None,
    units: Mapping[str, str] | None = None,
) -> list[list[str]]:
    """The node ids of each of `count` shards; `units` maps a node id to its unit
    (`unit_of`; a node id it does not name is a unit of its own)."""
    ordered = sorted(node_ids)
    unit = units or {}
    members: dict[str, list[str]] = {}
    for node_id in ordered:
        members.setdefault(unit.get(node_id, node_id), []).append(node_id)
    shards: list[list[str]] = [[] for _ in range(count)]
    if not durations:
        for rank, name in enumerate(sorted(members)):
            shards[rank % count].extend(members[name])
        return shards
    known = [durations[n] for n in ordered if n in durations]
    default = statistics.median(known) if known else 1.0
    cost = {unit: sum(durations.get(n, default) for n in nodes) for unit, nodes in members.items()}
    load = [0.0] * count
    for unit in sorted(members, key=lambda u: (-cost[u], u)):
        target = min(range(count), key=lambda k: (load[k], k))
        shards[target].extend(members[unit])
        load[target] += cost[unit]
    return shards
