"""Measure launch configurations for the fused kernels on this GPU and write the table.

    python -m kernels.tune                      # updates kernels/launch_table.json
    python -m kernels.tune --out table.json --batches 64 512 --widths 512
    python -m kernels.tune --merge a.json b.json    # one table from runs split over GPUs

For every shape the MLP trains with (batch x width, the first layer's K = 75 and the
head's N = 10), every kernel (forward, weight gradient, input gradient) and dtype
(fp32 IEEE, bf16), each candidate of `linear_act.tuning_candidates` (the tiles that fit
the output, split-K for weight gradients that leave SMs idle, the cuBLAS route) is
timed from a CUDA graph and the fastest is kept for the shape class. The table is keyed
by the GPU's name, so tables of several GPU models live side by side, and wins over
the per-user cache that first-use tuning fills (kernels/tuning_cache.py). Run it
offline, once per GPU model, and commit the result.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import torch

from kernels import linear_act as op
from kernels.linear_act import LaunchConfig
from kernels.linear_act import shape_key


def candidates(dtype: torch.dtype) -> list[LaunchConfig]:
    """The fused-kernel tiles (kept here for callers of the old name)."""
    return op.candidates(dtype)


def layer_shapes(batches: Sequence[int], widths: Sequence[int]) -> list[tuple[int, int, int]]:
    """(M, N, K) of every Linear in the MLP at these batch sizes and widths."""
    shapes = set()
    for m in batches:
        for w in widths:
            shapes |= {(m, w, 75), (m, w, w), (m, 10, w)}
    return sorted(shapes)


def time_kernel(kernel: str, m: int, n: int, k: int, dtype: torch.dtype, cfg: LaunchConfig) -> float:
    """Milliseconds per call replayed from a CUDA graph (linear_act.time_launch), with
    more calls and replays than first-use tuning spends: this table is committed."""
    return op.time_launch(kernel, m, n, k, dtype, cfg, calls=100, replays=20)


def tune(
    batches: Sequence[int], widths: Sequence[int], dtypes: Sequence[torch.dtype], save: Any = None, log: bool = True
) -> dict[str, dict]:
    """Best tile per shape class; where several shapes share a class, the costliest
    shape's choice stands. `save(table)` is called after every shape, so a run stopped
    by a time limit keeps what it measured."""
    torch.set_float32_matmul_precision("highest")
    sm_count = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    table: dict[str, dict] = {}
    for dtype in dtypes:
        for m, n, k in layer_shapes(batches, widths):
            for kernel, rows, cols in (("fwd", m, n), ("dw", n, k), ("dx", m, k)):
                if kernel == "dx" and k == 75:
                    continue  # the first layer needs no input gradient
                key = shape_key(kernel, rows, cols, dtype)
                red = {"fwd": k, "dw": m, "dx": n}[kernel]
                best, heuristic = None, None
                # candidate 0 is the heuristic's tile; split-K and cuBLAS come last
                for i, cfg in enumerate(op.tuning_candidates(kernel, rows, cols, red, dtype, sm_count)):
                    try:
                        ms = time_kernel(kernel, m, n, k, dtype, cfg)
                    except Exception:  # a tile too large for shared memory on this GPU
                        continue
                    heuristic = ms if i == 0 else heuristic
                    if best is None or ms < best[0]:
                        best = (ms, cfg)
                if best is not None and (key not in table or best[0] > table[key]["ms"]):
                    table[key] = {"ms": best[0], "heuristic_ms": heuristic, "config": asdict(best[1]), "shape": [m, n, k]}
                    if save is not None:
                        save(table)
                if log and best is not None:
                    versus = f"{heuristic * 1000:8.1f} us" if heuristic is not None else "  failed"
                    print(f"{key:28s} M={m:5d} N={n:5d} K={k:5d}  best {best[0] * 1000:8.1f} us  heuristic {versus}  {best[1].describe()}", flush=True)
    return table


def write_table(path: str, gpu: str, measured: dict[str, dict]) -> None:
    """Merge this GPU's entries into the table file (other GPUs' entries stay)."""
    try:
        with open(path) as handle:
            tables = json.load(handle)
    except (OSError, json.JSONDecodeError):
        tables = {}
    tables[gpu] = {
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "timing": "CUDA-graph replay, median ms per call (linear_act.replay_ms)",
        "configs": {key: entry["config"] for key, entry in sorted(measured.items())},
        "evidence": {key: {k: v for k, v in entry.items() if k != "config"} for key, entry in sorted(measured.items())},
    }
    tmp = f"{path}.partial"
    with open(tmp, "w") as handle:
        json.dump(tables, handle, indent=1, sort_keys=True)
    os.replace(tmp, path)


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
        raise ValueError(f"{path}: not a launch table written by kernels.tune ({type(exc).__name__}: {exc})") from None


def merge_measured(parts: Sequence[dict[str, dict]]) -> dict[str, dict]:
    """Several runs' entries for one GPU as one: where two runs measured the same shape
    class, the costlier shape's choice stands, as within one run."""
    merged: dict[str, dict] = {}
    for measured in parts:
        for key, entry in measured.items():
            if key not in merged or entry["ms"] > merged[key]["ms"]:
                merged[key] = entry
    return merged


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.tune", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(op.TABLE_PATH))
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 128, 256, 512, 4096])
    parser.add_argument("--widths", type=int, nargs="+", default=[128, 256, 512, 1024, 2048])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    parser.add_argument("--merge", nargs="+", metavar="TABLE", help="merge these table files into --out; measures nothing")
    args = parser.parse_args(argv)
    if args.merge:
        try:
            runs = [read_measured(path) for path in args.merge]
        except ValueError as exc:
            print(f"kernels.tune: {exc}", file=sys.stderr)
            return 2
        for gpu in sorted({gpu for run in runs for gpu in run}):
            write_table(args.out, gpu, merge_measured([run[gpu] for run in runs if gpu in run]))
        print(f"merged {len(args.merge)} tables -> {args.out}")
        return 0
    if not torch.cuda.is_available():
        print("kernels.tune: needs a CUDA GPU (the table holds timings of the GPU it ran on)", file=sys.stderr)
        return 2
    start = time.perf_counter()
    name = torch.cuda.get_device_name()

    def save(measured: dict[str, dict]) -> None:
        write_table(args.out, name, measured)

    measured = tune(args.batches, args.widths, [getattr(torch, d) for d in args.dtypes], save)
    save(measured)
    print(f"{len(measured)} shape classes for {name} in {time.perf_counter() - start:.0f} s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
