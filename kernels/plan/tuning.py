"""Tuning the fused op's launch table offline: the shapes the MLP launches, the dry
run's counts, the tuner (first-use tuning's own, `launches.Launches.tune`) and the
table file (write, read, merge; entries from a first-use tuning cache).

Contract: `tune` needs a CUDA GPU and the op's launch code registered (import
kernels.ops.linear_act first: `compile_keys` and the tuner run it through
`trials.op_code`); everything else is pure or reads and writes files only. The
command line is bench/tools/tune.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kernels.plan import launch_plan
from kernels.plan import trials
from kernels.plan import launches
from kernels.plan import tuning_cache
from kernels.plan.launch_plan import LaunchConfig

DEFAULT_BATCHES = (64, 128, 256, 512)
DEFAULT_WIDTHS = (128, 256, 512, 1024, 2048)
FEATURES, DEPTH, CLASSES = 75, 3, 10
SILU_AT = (512, 512)  # the act experiment's batch x width
H100_SMS = 132  # H100 SXM and H200 alike: the dry run's default SM count
# Table timing of the finalists: more than first use spends, as the table is committed.
TABLE_TIMING = (100, 20)


def candidates(dtype: torch.dtype) -> list[LaunchConfig]:
    """The fused-kernel tiles (kept here for callers of the old name)."""
    return launch_plan.candidates(dtype)


def layer_shapes(batches: Sequence[int], widths: Sequence[int]) -> list[tuple[int, int, int]]:
    """(M, N, K) of every Linear in the MLP at these batch sizes and widths."""
    shapes = set()
    for m in batches:
        for w in widths:
            shapes |= {(m, w, FEATURES), (m, w, w), (m, CLASSES, w)}
    return sorted(shapes)


@dataclass(frozen=True)
class KernelShape:
    kernel: str
    rows: int
    cols: int
    red: int
    dtype: torch.dtype
    precision: str
    act_class: str

    @property
    def mnk(self) -> tuple[int, int, int]:
        return launch_plan.layer_mnk(self.kernel, self.rows, self.cols, self.red)

    @property
    def key(self) -> str:
        return launch_plan.shape_key(self.kernel, self.rows, self.cols, self.red, self.dtype, self.precision,
                                     self.act_class)


def _precision_of(dtype: torch.dtype) -> str:
    return launch_plan.STRICT_FP32 if dtype == torch.float32 else "ieee"  # tuning runs fp32 at 'highest'


def kernel_shapes(
    pairs: Sequence[tuple[int, int]], dtypes: Sequence[torch.dtype], silu_at: tuple[int, int] | None = SILU_AT
) -> list[KernelShape]:
    """Every kernel shape the MLP launches at these (batch, width) pairs, leaky_relu
    hidden layers and an identity head, plus silu's at `silu_at`; in launch order, not
    yet deduplicated by class."""
    out: list[KernelShape] = []
    for dtype in dtypes:
        runs = [(b, w, "leaky_relu") for b, w in pairs] + ([(*silu_at, "silu")] if silu_at in pairs else [])
        for batch, width, activation in runs:
            sizes = [FEATURES] + [width] * DEPTH
            layers = ([(batch, o, i, activation) for i, o in zip(sizes[:-1], sizes[1:])]
                      + [(batch, CLASSES, width, "identity")])
            for m, n, k, act in layers:
                for kernel, rows, cols, red in launch_plan.kernel_shapes(m, n, k, input_grad=k != FEATURES):
                    out.append(KernelShape(kernel, rows, cols, red, dtype, _precision_of(dtype),
                                           launch_plan.activation_class(act)))
    return out


def unique_classes(shapes: Sequence[KernelShape]) -> list[KernelShape]:
    """The first shape of each shape class: what tuning times."""
    seen: dict[str, KernelShape] = {}
    for s in shapes:
        seen.setdefault(s.key, s)
    return list(seen.values())


# ----------------------------------------------------------------- the dry run


def _int_spec(v: int) -> str:
    """How Triton specializes an integer argument: == 1, divisible by 16, or neither."""
    return "1" if v == 1 else "D" if v % 16 == 0 else "-"


def compile_keys(shape: KernelShape, cfg: LaunchConfig) -> set[tuple]:
    """The Triton compilations timing `cfg` at `shape` needs: the launch code run on
    meta tensors with a launcher that records each kernel, its constexprs and launch
    options, its tensors' dtypes and its integers' specialization (an estimate of
    Triton's cache key: pointers are taken as aligned)."""
    keys: set[tuple] = set()

    def record(fn: Any, grid: tuple, *args: Any, **kwargs: Any) -> None:
        spec = tuple(
            str(a.dtype) if isinstance(a, torch.Tensor) else _int_spec(a) if isinstance(a, int) else "f" for a in args
        )
        keys.add((fn.__name__, spec, tuple(sorted(kwargs.items()))))

    m, n, k = shape.mnk
    meta = torch.device("meta")
    forward, backward, _ = trials.op_code()
    act = launch_plan.ACTIVATION_CODES[launch_plan.TIMED_ACTIVATION[shape.act_class]]
    with trials.forcing(shape.kernel, m, n, k, shape.dtype, cfg):
        x = torch.empty((m, k), device=meta, dtype=shape.dtype)
        w, b = (torch.empty(s, device=meta, dtype=launch_plan.param_dtype(shape.dtype)) for s in ((n, k), (n,)))
        if shape.kernel == "fwd":
            forward(x, w, b, act, shape.precision, shape.act_class, record)
        else:
            y = torch.empty((m, n), device=meta, dtype=shape.dtype)
            backward(y, y, x, w, act, shape.kernel == "dx", shape.precision, shape.act_class, record)
    return keys


def _executions(calls: int, replays: int) -> int:
    """Kernel executions of one timing: a first call, replay_ms's warm call, and the
    graph of `calls` replayed once plus `replays` times."""
    return 2 + calls * (replays + 1)


def dry_run(shapes: Sequence[KernelShape], sm_count: int) -> dict[str, Any]:
    """Counts under the policy before (every exact shape, every candidate that fits,
    each timed fully) and now (one shape per class, the occupancy and reduction-step
    rules, silu seeded from the pointwise finalists, quick timing of all and full
    timing of the finalists), and the per-shape rows of the present one. Which tiles
    become finalists is known only on a GPU: the count takes the first ones listed."""
    # Before, a process tuned each exact shape once, whatever its activation.
    exact = {(s.kernel, s.rows, s.cols, s.red, s.dtype): s for s in reversed(shapes)}
    before_shapes = [s for s in shapes if exact.get((s.kernel, s.rows, s.cols, s.red, s.dtype)) is s]
    now_shapes = unique_classes(shapes)
    full_runs = _executions(*trials.FULL_TIMING)
    quick_runs = _executions(*trials.QUICK_TIMING)

    def count(which: Sequence[KernelShape], prune: bool, halving: bool) -> tuple[dict[str, int], list[dict]]:
        compiles: set[tuple] = set()
        totals = {"shapes": len(which), "candidates": 0, "quick": 0, "full": 0, "executions": 0}
        rows = []
        finalists: dict[str, list[LaunchConfig]] = {}
        for s in which:
            cands = launch_plan.tuning_candidates(s.kernel, s.rows, s.cols, s.red, s.dtype, sm_count, prune=prune,
                                                  precision=s.precision)
            seed = launches.SEED_CLASSES.get(s.act_class)
            seeded = finalists.get(s.key.replace(f":{s.act_class}:", f":{seed}:")) if halving and seed else None
            if seeded is not None:  # the seeding class's finalists: here, its first candidates
                cands = list(dict.fromkeys([cands[0], *seeded, cands[-1]]))
            finalists[s.key] = cands[: launches.FINALISTS]
            new = set().union(*(compile_keys(s, c) for c in cands)) - compiles
            compiles |= new
            quick = len(cands) if halving and len(cands) > launches.FINALISTS + 1 else 0
            full = min(len(cands), launches.FINALISTS + 1) if quick else len(cands)
            totals["candidates"] += len(cands)
            totals["quick"] += quick
            totals["full"] += full
            totals["executions"] += quick * quick_runs + full * full_runs
            m, n, k = s.mnk
            rows.append({"key": s.key, "M": m, "N": n, "K": k, "candidates": len(cands), "new_compiles": len(new)})
        totals["compiles"] = len(compiles)
        return totals, rows

    before, _ = count(before_shapes, prune=False, halving=False)
    now, rows = count(now_shapes, prune=True, halving=True)
    return {"sm_count": sm_count, "kernel_launch_shapes": len(shapes), "before": before, "now": now, "rows": rows}


# ------------------------------------------------------------------- the tuner


def tune(
    shapes: Sequence[KernelShape], cache_dir: str, save: Any = None, log: bool = True
) -> tuple[dict[str, dict], dict[str, Any]]:
    """Tune one shape per class with first-use tuning's own tuner into a fresh cache
    at `cache_dir`; returns the entries (the table) and the tuner's counts. `save(table)`
    is called after every shape, so a run stopped by a time limit keeps what it measured."""
    torch.set_float32_matmul_precision("highest")
    device = torch.device("cuda", torch.cuda.current_device())

    def measure(kernel, m, n, k, dtype, cfg, device, activation="leaky_relu", quick=False):  # type: ignore[no-untyped-def]
        calls, replays = trials.QUICK_TIMING if quick else TABLE_TIMING
        return trials.time_launch(kernel, m, n, k, dtype, cfg, device, calls, replays, activation=activation)

    tuner = launches.Launches(mode="always", cache_dir=cache_dir, tables={}, measure=measure,
                              prepare=trials.precompile)
    gpu = tuner.model(device)
    for s in unique_classes(shapes):
        tuner.tune(s.kernel, s.rows, s.cols, s.red, s.dtype, device, measure, s.precision, s.act_class)
        if save is not None:
            save(tuner.cache(gpu).entries())
    return dict(tuner.cache(gpu).entries()), {**tuner.tuning_counts, "seconds": round(tuner.tuning_seconds, 1)}


def write_table(
    path: str, gpu: str, measured: dict[str, dict], versions: tuple[str, str] | None = None, timing: str | None = None
) -> None:
    """Merge this GPU's entries into the table file (other GPUs' entries stay).
    `versions` (triton, torch) default to this process's; `timing` to this module's."""
    try:
        with open(path) as handle:
            tables = json.load(handle)
    except (OSError, json.JSONDecodeError):
        tables = {}
    triton_version, torch_version = versions or (__import__("triton").__version__, torch.__version__)
    tables[gpu] = {
        "key_format": launch_plan.KEY_FORMAT,
        "torch": torch_version,
        "triton": triton_version,
        "timing": timing
        or f"CUDA-graph replay, median ms per call (trials.replay_ms): every candidate "
        f"{trials.QUICK_TIMING[0]} calls x {trials.QUICK_TIMING[1]} replays, "
        f"the fastest {launches.FINALISTS} and the heuristic {TABLE_TIMING[0]} x {TABLE_TIMING[1]}",
        "configs": {key: entry["config"] for key, entry in sorted(measured.items())},
        "evidence": {key: evidence(entry) for key, entry in sorted(measured.items())},
    }
    tmp = f"{path}.partial"
    with open(tmp, "w") as handle:
        json.dump(tables, handle, indent=1, sort_keys=True)
    os.replace(tmp, path)


# The config is the table's entry itself; the runners-up would triple the file's size.
NOT_EVIDENCE = ("config", "finalists", "finalists_ms")


def evidence(entry: dict) -> dict:
    """A tuned entry's evidence as the table keeps it: its timings and counts, and for a
    cuBLAS-route winner the fused finalist eager calls take instead ('eager': config and
    the ms per call it is slower by; kernels/plan/launches.py, "Eager calls")."""
    out = {k: v for k, v in entry.items() if k not in NOT_EVIDENCE}
    try:
        finalists = [LaunchConfig.from_dict(c) for c in entry.get("finalists", [])]
        second = launches.fused_second(finalists, list(entry.get("finalists_ms", [])))
    except (ValueError, TypeError):
        second = None
    if second is not None:
        out["eager"] = {"config": dataclasses.asdict(second[0]), "gives_up_ms": second[1]}
    return out
FROM_CACHE_TIMING = "first-use tuning (kernels/plan/tuning_cache.py), each entry's own: see its evidence's 'timing'"


def read_cache_groups(path: str) -> list[tuple[str, tuple[str, str], dict[str, dict]]]:
    """(gpu, (triton, torch), entries) of each group of a first-use tuning cache file."""
    try:
        with open(path) as handle:
            groups = json.load(handle)["groups"]
        out = []
        for key, entries in groups.items():
            gpu, triton_version, torch_version = tuning_cache.split_key(key)
            for shape, entry in entries.items():
                if not isinstance(entry, dict) or "config" not in entry or "ms" not in entry:
                    raise ValueError(f"group {key!r}: entry {shape!r} has no config and ms")
            out.append((gpu, (triton_version, torch_version), entries))
        return out
    except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError) as exc:
        raise ValueError(f"{path}: not a tuning cache file ({type(exc).__name__}: {exc})") from None


def read_measured(path: str) -> dict[str, dict[str, dict]]:
    """The measured entries of a table file, per GPU, in the form `tune` returns."""
    try:
        with open(path) as handle:
            tables = json.load(handle)
        return {
            gpu: {key: {**table["evidence"][key], "config": config} for key, config in table["configs"].items()}
            for gpu, table in tables.items()
        }
    except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path}: not a launch table written by bench.tools.tune "
                         f"({type(exc).__name__}: {exc})") from None


def merge_measured(parts: Sequence[dict[str, dict]]) -> dict[str, dict]:
    """Several runs' entries for one GPU as one: where two runs measured the same shape
    class, the costlier shape's choice stands."""
    merged: dict[str, dict] = {}
    for measured in parts:
        for key, entry in measured.items():
            if key not in merged or entry["ms"] > merged[key]["ms"]:
                merged[key] = entry
    return merged


