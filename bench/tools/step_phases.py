"""Where the one-launch training step's time goes, phase by phase (needs a CUDA GPU).

    python -m bench.tools.step_phases                        # 3x512, batch 512, fp32
    python -m bench.tools.step_phases --precision tf32 --per-sm 1 --batch 64
    python -m bench.tools.step_phases --tiles 32x64           # another tile shape than blocks_for's
    python -m bench.tools.step_phases --sync flags            # no grid barriers: tiles wait on counters
    python -m bench.tools.step_phases --precision tf32 --swap 0  # no product transposed (wgmma off)
    python -m bench.tools.step_phases --precision bf16 --set head_k=128 --set k=64  # any Blocks field

Trains a random-data MLP through kernels/ops/mlp_step.py, times its steps in replays
of a CUDA graph, then runs a few with %globaltimer stamps at every grid barrier and prints,
per phase, the slowest program's work and the wait at the barrier after it, the
reading behind docs/fused-step.md and the step-phases rows of docs/measurements.md.
With counter waits (`--sync flags`) phases overlap: a phase ends at each program's last
tile of it, and the barrier column reads how far the next phase had already started.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tabulate import tabulate

from kernels.ground.args import file_problem
from kernels.ground.files import write_atomic
from bench.tools.rows import KINDS
from bench.tools.rows import append_rows
from bench.tools.rows import csv_problem
from bench.tools.rows import measured_here
from bench.tools.rows import phase_rows

if TYPE_CHECKING:  # torch and the kernels load after the arguments are read
    import torch

    from kernels.ops.mlp_step import FusedStep


@dataclass(frozen=True)
class Phase:
    name: str
    work_us: float  # the slowest program's time from the previous barrier's departure to its arrival
    barrier_us: float | None  # from the last arrival to the median departure; None after the last phase
    # When the phase's last program finished it, from the first program's start: with
    # counter waits a program's work holds its waits (an idle program's phase spans the
    # wait for its first tile), so these steps, not the work, say what the phase added.
    done_us: float | None = None


def study_step(x: torch.Tensor, y: torch.Tensor, width: int, depth: int, precision: str, batch: int,
               sms: int | None = None) -> FusedStep:
    """A FusedStep of the study's MLP (75 frames in, `depth` x `width` leaky_relu, 10
    classes, Adam) on x, y, on their device; `sms`: see FusedStep."""
    from kernels.ops import mlp_step
    from kernels.ops.optim import FlatOptimizer
    from model.mlp import MLP
    from model.train import OPTIMIZERS

    model = MLP(75, width, depth, 10, "leaky_relu").to(x.device)
    optimizer = FlatOptimizer(list(model.parameters()), "adam", **OPTIMIZERS["adam"][1])
    return mlp_step.FusedStep(x, y, [*model.hidden, model.head], optimizer, "leaky_relu", precision, batch, sms=sms)


def phase_names(layers: int) -> list[str]:
    """The step's phases for an MLP of `layers` Linear layers, in launch order."""
    return [f"F_{i}" for i in range(layers - 1)] + ["H"] + [f"D_{i}" for i in range(layers - 2, 0, -1)] + ["last"]


def phases(times: Sequence[Sequence[int]], layers: int) -> list[Phase]:
    """Phases from FusedStep.times rows (ns: start, then arrival and departure per barrier,
    then the end, one row per program)."""
    names = phase_names(layers)
    barriers = len(names) - 1
    out = []
    left = [row[0] for row in times]  # each program's departure from the previous barrier
    start = min(left)
    for b, name in enumerate(names):
        arrive = [row[1 + 2 * b] for row in times] if b < barriers else [row[2 * barriers + 1] for row in times]
        work = max(a - d for a, d in zip(arrive, left)) / 1e3
        wait = None
        if b < barriers:
            depart = sorted(row[2 + 2 * b] for row in times)
            wait = (depart[len(depart) // 2] - max(arrive)) / 1e3
            left = [row[2 + 2 * b] for row in times]
        out.append(Phase(name, round(work, 2), None if wait is None else round(wait, 2),
                         round((max(arrive) - start) / 1e3, 2)))
    return out


# The stamps inside a forward tile (kernels/ops/mlp_step.py, _inner): (name, from column,
# to column). Column 2 is F_0's end, where F_1 starts.
INNER = (("F_0 product", 0, 20), ("F_0 epilogue", 20, 21), ("F_0 signal", 21, 22),
         ("F_1 wait", 2, 23), ("F_1 product", 23, 24), ("F_1 epilogue", 24, 26), ("F_1 signal", 26, 27))


def inner_spans(times: Sequence[Sequence[int]], layers: int) -> dict[str, tuple[float, float]] | None:
    """Median and slowest program's span (us) of each part of the first forward tiles
    (INNER), over the programs that stamped both ends; None where the kernel kept no
    inner stamps (six or more layers: their phases use those columns)."""
    if layers >= 6:
        return None
    out = {}
    for name, a, b in INNER:
        spans = sorted((row[b] - row[a]) / 1e3 for row in times if row[a] and row[b])
        if spans:
            out[name] = (round(spans[len(spans) // 2], 2), round(spans[-1], 2))
    return out


def parse_tiles(text: str) -> tuple[int, int]:
    """'MxN' (powers of two, 16 to 128) as the fused step's output tile (rows, columns)."""
    parts = text.lower().split("x")
    sizes = [int(p) for p in parts if p.isdigit()]
    if len(parts) != 2 or len(sizes) != 2 or any(n not in (16, 32, 64, 128) for n in sizes):
        raise argparse.ArgumentTypeError(f"{text!r}: expected MxN with M and N in 16, 32, 64, 128 (e.g. 16x64)")
    return sizes[0], sizes[1]


def parse_setting(text: str) -> tuple[str, int]:
    """'FIELD=VALUE' (a whole number; for flags 0 or 1) as one Blocks field for the run."""
    name, sep, value = text.partition("=")
    if not sep or not name.isidentifier() or not value.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: expected FIELD=VALUE with a whole number (e.g. k=64)")
    return name, int(value)


def blocks_changes(
    settings: Sequence[tuple[str, int]], fields: Sequence[str], switches: Sequence[str] = ("flags",),
) -> dict[str, int | bool]:
    """The --set pairs as Blocks.replace keywords: each a field of `fields`, each named
    once, the `switches` (bool fields) 0 or 1, as a bool."""
    changes: dict[str, int | bool] = {}
    for name, value in settings:
        if name not in fields:
            raise ValueError(f"--set {name}={value}: Blocks has no field {name!r} (it has: {', '.join(fields)})")
        if name in changes:
            raise ValueError(f"--set {name}: given twice")
        if name in switches and value not in (0, 1):
            raise ValueError(f"--set {name}={value}: a switch, 0 (off) or 1 (on)")
        changes[name] = bool(value) if name in switches else value
    return changes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tools.step_phases", description=__doc__.split("\n\n")[0])
    parser.add_argument("--precision", choices=("fp32", "tf32", "bf16"), default="fp32")
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--per-sm", type=int, choices=(1, 2, 3, 4), default=None,
                        help="programs per SM (default: the kernel's choice); past two only with registers capped "
                             "to fit, --set max_regs=168 (three) or 128 (four)")
    parser.add_argument("--tiles", type=parse_tiles, default=None, metavar="MxN",
                        help="output tile rows x columns (default: the kernel's choice, blocks_for)")
    parser.add_argument("--sync", choices=("barriers", "flags"), default=None,
                        help="grid barriers between phases, or tiles that wait for what they read "
                             "(default: the kernel's choice)")
    parser.add_argument("--swap", type=int, choices=range(8), default=None, metavar="BITS",
                        help="hidden products run transposed, bits: 1 forward, 2 input-gradient, 4 weight tiles "
                             "(default: the kernel's choice)")
    parser.add_argument("--set", type=parse_setting, action="append", default=[], metavar="FIELD=VALUE",
                        help="any field of kernels/ops/mlp_step.py's Blocks for this run, after the options "
                             "above (repeatable), e.g. k=64, head_k=128, stages=2, copies=0")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--json", type=Path, default=None, metavar="PATH",
                        help="also write the result (card, versions, blocks, per-step time, phases) as JSON")
    parser.add_argument("--rows", type=Path, default=None, metavar="CSV",
                        help="append a row per phase to this CSV (docs/data/step-phases.csv)")
    args = parser.parse_args(argv)
    if args.json is not None and (problem := file_problem(args.json)):
        parser.error(f"--json {args.json}: {problem}")
    problem = csv_problem(args.rows, KINDS["step-phases"]) if args.rows is not None else None
    if problem:
        parser.error(f"--rows {args.rows}: {problem}")
    from kernels.ground import env

    env.check(parser.prog)  # before kernels/ops, which keeps LOADBENCH_FUSED_STEP from its import on
    from kernels.ops.mlp_step import Blocks

    try:
        fields = dataclasses.fields(Blocks)
        changes = blocks_changes(args.set, [f.name for f in fields], [f.name for f in fields if f.type == "bool"])
    except ValueError as exc:
        parser.error(str(exc))

    import torch

    if not torch.cuda.is_available():
        print("python -m bench.tools.step_phases: needs a CUDA GPU (the phases are timed with %globaltimer)",
              file=sys.stderr)
        return 2
    torch.manual_seed(0)
    rows = 20 * args.batch
    x = torch.randn(rows, 75, device="cuda")
    y = torch.randint(0, 10, (rows,), device="cuda")
    step = study_step(x, y, args.width, args.depth, args.precision, args.batch)
    if args.per_sm is not None:
        step.use_blocks(dataclasses.replace(step.blocks, per_sm=args.per_sm))
    if args.tiles is not None:
        step.use_blocks(dataclasses.replace(step.blocks, m=args.tiles[0], n=args.tiles[1]))
    if args.sync is not None:
        step.use_blocks(dataclasses.replace(step.blocks, flags=args.sync == "flags"))
    if args.swap is not None:
        step.use_blocks(dataclasses.replace(step.blocks, swap=args.swap))
    if changes:
        step.use_blocks(dataclasses.replace(step.blocks, **changes))
    batches = torch.randint(0, rows, (args.steps, args.batch), device="cuda")
    total = torch.zeros((), device="cuda")
    for index in batches[:10]:  # compiles, and settles the grid
        step(index, total)
    # Replays of a CUDA graph, as the trainer's graph loops run the step: launched one by
    # one from Python, the host's gaps between launches showed in the figure.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(batches[0], total)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for index in batches:
            step(index, total)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    rounds = []
    for _ in range(5):
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        rounds.append(start.elapsed_time(end))
    per_step_us = min(rounds) / args.steps * 1e3
    step.timing = True
    for index in batches[:5]:  # the first compiles the stamped kernel; the last is read
        step(index, total)
    torch.cuda.synchronize()
    step.check()
    stamps = step.times[:, :32].tolist()
    table = phases(stamps, step.L)
    inner = inner_spans(stamps, step.L)
    print(f"{torch.cuda.get_device_name()}: {args.depth}x{args.width}, batch {args.batch}, {args.precision}, "
          f"{step.grid} programs, {step.blocks}: {per_step_us:.1f} us per step "
          f"(a CUDA graph of {args.steps} steps, best of five replays)")
    print(tabulate([(p.name, p.work_us, "" if p.barrier_us is None else p.barrier_us, p.done_us) for p in table],
                   headers=["phase", "work us (slowest program)", "barrier us", "done at us"]))
    if inner:
        print(tabulate([(name, *spans) for name, spans in inner.items()],
                       headers=["inside the first forward tiles", "median us", "slowest us"]))
    if args.json is not None:
        import triton

        result = {
            **measured_here(torch.cuda.get_device_name()), "tool": "bench.tools.step_phases",
            "torch": torch.__version__, "triton": triton.__version__,
            "config": {"depth": args.depth, "width": args.width, "batch": args.batch, "precision": args.precision,
                       "steps": args.steps},
            "grid": step.grid, "blocks": dataclasses.asdict(step.blocks), "per_step_us": round(per_step_us, 2),
            "phases": [dataclasses.asdict(p) for p in table], "inner": inner,
        }
        write_atomic(args.json, json.dumps(result, indent=1) + "\n")
    if args.rows is not None:
        setup = {"precision": args.precision, "depth": args.depth, "width": args.width, "batch": args.batch,
                 "blocks": str(step.blocks)}
        command = " ".join([parser.prog, *(sys.argv[1:] if argv is None else argv)])  # no file: the command
        rows = phase_rows(setup, per_step_us, [(p.name, p.work_us, p.barrier_us, p.done_us) for p in table],
                          measured_here(torch.cuda.get_device_name()), command, f"{step.grid} programs", inner)
        print(f"appended {append_rows(args.rows, rows, KINDS['step-phases'])} row(s) to {args.rows}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
