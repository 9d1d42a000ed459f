"""The one-launch step's phase budget: what each phase moves and must cost for a goal.

    python -m bench.tools.step_budget PHASES.json --run LOOPS.json --goal-epoch-s 0.008
    python -m bench.tools.step_budget PHASES.json --run LOOPS.json --goal-epoch-s 0.008 --rows docs/data/step-budget.csv

Reads a `python -m bench.tools.step_phases --json` result (the phases timed on a GPU) and
the run file of the same model through the fused step (its median epoch), and prints a
row per phase: its tiles, the longest reduction chain of one tile, the bytes its tiles
read through L2 (a model of kernels/ops/mlp_step.py's tiling, checked against Nsight
Compute's lts__t_bytes), its measured work, the time it added to the step (when its last
program finished it, less when the phase before finished: these sum to the step) and its
share of the step the goal allows. The goal's step is (goal epoch - the epoch's time
outside the steps) / steps an epoch; each phase's goal scales the time it added (where the
result has it, else its work) by goal step / measured step. Explained in
docs/step-budget.md.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tabulate import tabulate

from bench.gate.runs import BaselineError
from bench.gate.runs import read_run
from bench.tools.rows import KINDS
from bench.tools.rows import append_rows
from bench.tools.rows import csv_problem

IN_FEATURES, CLASSES = 75, 10  # the study's frames and classes
F0_K = 80  # the input's columns, zero-padded for dW_0 (kernels/ops/mlp_step.py)
ADAM_WORDS = 7  # per weight the optimizer reads gradient, weight, two moments and writes three back
WORD = 4  # every operand the model counts is an fp32 word (bf16 copies halve some: the model's margin)


@dataclass(frozen=True)
class PhaseModel:
    """One phase's work as the kernel tiles it."""

    name: str
    tiles: int
    chain: int  # reduction steps of the longest tile, one after another
    l2_bytes: int  # operand bytes its tiles read (weights the optimizer rewrites included)


def _product(rows: int, cols: int, reduce: int, m: int, n: int, k: int) -> tuple[int, int, int]:
    """Tiles, chain and bytes read of an output of rows x cols reduced over `reduce`, in m x n tiles."""
    tiles = math.ceil(rows / m) * math.ceil(cols / n)
    return tiles, math.ceil(reduce / k), tiles * (m + n) * reduce * WORD


def phase_models(depth: int, width: int, batch: int, blocks: Mapping[str, Any]) -> list[PhaseModel]:
    """The phases of a depth x width MLP's step at `batch` rows with the kernel's `blocks`
    (step_phases' JSON): F_i the forward layers, H the head, D_k and last the backward."""
    m, n, k = blocks["m"], blocks["n"], blocks["k"]
    kf = blocks.get("k_forward") or k
    out = []
    for i in range(depth):
        reduce = F0_K if i == 0 else width
        tiles, chain, moved = _product(batch, width, reduce, m, n, kf)
        out.append(PhaseModel(f"F_{i}", tiles, chain, moved))
    head_m = blocks["head_m"]
    head_tiles = math.ceil(batch / head_m) * math.ceil(width / n)
    head_bytes = head_tiles * (head_m * width + CLASSES * width + CLASSES * n) * WORD
    out.append(PhaseModel("H", head_tiles, math.ceil(width / blocks["head_k"]), head_bytes))

    def weight_tiles(rows: int, cols: int) -> tuple[int, int, int]:
        tiles, chain, moved = _product(rows, cols, batch, m, n, k)
        return tiles, chain, moved + tiles * m * n * ADAM_WORDS * WORD

    # D_k: G_{k-1} = G_k W_k beside dW_{k+1}; the head's dW in the first of them.
    for layer in range(depth - 1, 0, -1):
        g = _product(batch, width, width, m, n, k)
        w = weight_tiles(CLASSES if layer == depth - 1 else width, width)
        out.append(PhaseModel(f"D_{layer}", g[0] + w[0], max(g[1], w[1]), g[2] + w[2]))
    last = [weight_tiles(width, width), weight_tiles(width, F0_K)] if depth > 1 else [weight_tiles(width, F0_K)]
    out.append(PhaseModel("last", sum(t[0] for t in last), max(t[1] for t in last), sum(t[2] for t in last)))
    return out


@dataclass(frozen=True)
class Budget:
    step_us: float  # measured, CUDA-graph replays
    epoch_s: float  # measured, the trainer's median epoch
    steps: int  # steps an epoch
    goal_epoch_s: float

    @property
    def outside_s(self) -> float:
        """An epoch's time outside its steps (shuffle, the loss read, the epoch's launches)."""
        return max(self.epoch_s - self.steps * self.step_us * 1e-6, 0.0)

    @property
    def goal_step_us(self) -> float:
        return (self.goal_epoch_s - self.outside_s) / self.steps * 1e6


def budget_rows(result: Mapping[str, Any], run: Mapping[str, Any], goal_epoch_s: float, source: str,
                note: str = "") -> tuple[Budget, list[dict[str, Any]]]:
    """The budget and a row per phase from a step_phases result and the fused-step run of its model."""
    config = result["config"]
    record = fused_record(run, config)
    steps = math.ceil(record["dataset"]["train_frames"] / config["batch"])
    budget = Budget(result["per_step_us"], record["median_epoch_s"], steps, goal_epoch_s)
    models = {p.name: p for p in phase_models(config["depth"], config["width"], config["batch"], result["blocks"])}
    scale = budget.goal_step_us / budget.step_us
    rows = []
    done_before = 0.0
    for phase in result["phases"]:
        model = models[phase["name"]]
        added = None if phase.get("done_us") is None else round(phase["done_us"] - done_before, 2)
        done_before = phase.get("done_us") or done_before
        rows.append({key: result.get(key, "") for key in ("date", "card", "commit", "caches")} | {
            "precision": config["precision"], "depth": config["depth"], "width": config["width"],
            "batch": config["batch"], "phase": model.name, "tiles": model.tiles, "chain": model.chain,
            "l2_mb": round(model.l2_bytes / 1e6, 1), "work_us": phase["work_us"], "added_us": "" if added is None
            else added, "step_us": budget.step_us, "epoch_s": round(budget.epoch_s, 5), "goal_epoch_s": goal_epoch_s,
            "goal_step_us": round(budget.goal_step_us, 1),
            "phase_goal_us": round((phase["work_us"] if added is None else added) * scale, 2),
            "source": source, "note": note,
        })
    return budget, rows


def fused_record(run: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """The run's record of the fused step at the result's shape and precision; ValueError if none."""
    for bench in run["benchmarks"]:
        info = bench.get("extra_info", {})
        c = info.get("config") or {}
        if (info.get("step_route") == "fused-step" and c.get("precision") == config["precision"]
                and c.get("depth") == config["depth"] and c.get("width") == config["width"]
                and c.get("batch_size") == config["batch"]):
            return info
    raise ValueError(f"no fused-step record of {config['depth']}x{config['width']}, batch {config['batch']}, "
                     f"{config['precision']} in the run")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tools.step_budget", description=__doc__.split("\n\n")[0])
    parser.add_argument("phases", type=Path, metavar="PHASES.json", help="python -m bench.tools.step_phases --json")
    parser.add_argument("--run", type=Path, required=True, metavar="RUN.json",
                        help="a run file holding the fused step's record of the same model and precision")
    parser.add_argument("--goal-epoch-s", type=float, required=True, metavar="SECONDS")
    parser.add_argument("--rows", type=Path, default=None, metavar="CSV", help="append the rows to this CSV")
    parser.add_argument("--note", default="")
    args = parser.parse_args(argv)
    if args.goal_epoch_s <= 0:
        parser.error(f"--goal-epoch-s {args.goal_epoch_s}: must be above 0")
    if args.rows is not None and (problem := csv_problem(args.rows, KINDS["step-budget"])):
        parser.error(f"--rows {args.rows}: {problem}")
    try:
        result = json.loads(args.phases.read_text(encoding="utf-8"))
        run = read_run(args.run)
        budget, rows = budget_rows(result, run, args.goal_epoch_s, f"{args.phases} + {args.run}", args.note)
    except (OSError, ValueError, KeyError, BaselineError) as exc:
        print(f"{parser.prog}: {exc}", file=sys.stderr)
        return 2
    print(f"{rows[0]['card']} {rows[0]['precision']} {rows[0]['depth']}x{rows[0]['width']} batch {rows[0]['batch']}: "
          f"step {budget.step_us:.1f} us, epoch {budget.epoch_s:.5f} s ({budget.steps} steps, "
          f"{budget.outside_s * 1e3:.2f} ms outside them); the goal {args.goal_epoch_s} s allows "
          f"{budget.goal_step_us:.1f} us a step")
    print(tabulate([(r["phase"], r["tiles"], r["chain"], r["l2_mb"], r["work_us"], r["added_us"], r["phase_goal_us"])
                    for r in rows],
                   headers=["phase", "tiles", "chain", "L2 MB (model)", "work us", "added us", "goal us"]))
    print(f"L2 read by the model: {sum(r['l2_mb'] for r in rows):.0f} MB a step")
    if args.rows is not None:
        print(f"appended {append_rows(args.rows, rows, KINDS['step-budget'])} row(s) to {args.rows}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
