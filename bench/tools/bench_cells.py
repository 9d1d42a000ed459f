"""python -m bench.tools.bench_cells: first-use tuning and the fused kernel's cells, one GPU.

    python -m bench.tools.bench_cells                          # fresh cache, LOADBENCH_TUNE=always
    python -m bench.tools.bench_cells --tune cache --cache-dir ~/.cache/mlp-loadbench
    python -m bench.tools.bench_cells --batches 64 --widths 2048 --precisions bf16 --activations silu

Phase 1 tunes, in an empty cache, every batch x width x precision the five experiments
train, as a user's first run on a new GPU model would (--tune-only stops there). Phase
2 times one forward + backward of the MLP per cell for eager torch, torch.compile and
our kernels, eagerly and replayed from CUDA graphs (bench/test_kernels.py imports this
measurement). One line per cell as it finishes, a table at the end; --json is rewritten
after every cell and --budget-s stops starting new cells in time. Details:
docs/kernels.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from bench.tools.rows import KINDS
from bench.tools.rows import append_rows
from bench.tools.rows import cell_rows
from bench.tools.rows import cpu_name
from bench.tools.rows import csv_problem
from bench.tools.rows import measured_here
from kernels.ground import env as loadbench_env
from kernels.plan import launches
from kernels.ops import linear_act  # noqa: F401  (the op loads at import, outside any timed first call)
from kernels.plan.tuning_cache import FILE_NAME
from kernels.plan.tuning_cache import TUNE_MODES
from kernels.ground.axes import ACTIVATIONS
from model.mlp import MLP
from model.train import precision_mode

FEATURES, DEPTH, CLASSES = 75, 3, 10
BATCHES = (64, 128, 256, 512)
WIDTHS = (128, 256, 512, 1024, 2048)
PRECISIONS = ("fp32", "bf16")
CENTRE = (512, 512)  # the study's optimal batch x width, what every experiment varies around
LOSING = 0.95  # a cell whose speedup over the best baseline is below this loses
EAGER_ROUNDS = 10  # eager timings: rounds taking the implementations in turn, median per implementation
# do_bench's time per eager round and its warm-up, in ms: a host-bound step of 1-2 ms on
# the GPU hosts measured moved by 20% between rounds of 10 ms (a few steps each)
EAGER_ROUND_MS, EAGER_WARMUP_MS = 20, 10
# Named in the issue as losing on an H100: measured first, so a time limit cuts others.
PRIORITY = [("fp32", 64, 2048, "leaky_relu"), ("bf16", 512, 512, "silu"), ("fp32", 512, 512, "silu")] + [
    (p, b, 2048, "leaky_relu") for p in PRECISIONS for b in BATCHES
]


def experiment_pairs(batches: Sequence[int] = BATCHES, widths: Sequence[int] = WIDTHS) -> list[tuple[int, int]]:
    """(batch, width) of every configuration the five experiments train."""
    return sorted({(CENTRE[0], w) for w in widths} | {(b, CENTRE[1]) for b in batches})


def layers(batch: int, width: int, depth: int = DEPTH) -> list[tuple[int, int, int]]:
    """(M, N, K) of each Linear of the MLP, input layer first, head last."""
    sizes = [FEATURES] + [width] * depth
    return [(batch, o, i) for i, o in zip(sizes[:-1], sizes[1:])] + [(batch, CLASSES, width)]


def layer_shapes(batch: int, width: int, depth: int = DEPTH) -> set[tuple[int, int, int]]:
    """The distinct (M, N, K) of the MLP's Linears: what tuning sees."""
    return set(layers(batch, width, depth))


def make_step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, precision: str) -> Callable[[], None]:
    """One forward + backward with the loss, no optimizer step."""

    def run() -> None:
        with torch.autocast(x.device.type, torch.bfloat16, enabled=precision == "bf16", cache_enabled=False):
            loss = F.cross_entropy(model(x), y)
        loss.backward()

    return run


def time_ms(fn: Callable[[], None], device: torch.device, graph: bool, rep: int = 100) -> float:
    """Milliseconds per call: do_bench_cudagraph (graph) or do_bench on a GPU; on a CPU
    one call after a warm one (the interpreter: the code path, not the speed)."""
    if device.type != "cuda":
        fn()
        start = time.perf_counter()
        fn()
        return 1000 * (time.perf_counter() - start)
    from triton.testing import do_bench
    from triton.testing import do_bench_cudagraph

    return do_bench_cudagraph(fn, rep=rep) if graph else do_bench(fn, warmup=25, rep=rep)


def eager_ms(fn: Callable[[], None], device: torch.device) -> float:
    """One eager round: do_bench over EAGER_ROUND_MS on a GPU, `time_ms` elsewhere."""
    if device.type != "cuda":
        return time_ms(fn, device, False)
    from triton.testing import do_bench

    return do_bench(fn, warmup=EAGER_WARMUP_MS, rep=EAGER_ROUND_MS)


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:300]


@dataclass
class CellResult:
    batch: int
    width: int
    activation: str
    precision: str
    device: torch.device
    times_ms: dict[str, float | None] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # what failed, per implementation or timing
    tiles: list[dict[str, Any]] = field(default_factory=list)  # launch_report entries of this cell's layers
    tuning_s: float = 0.0  # first-use tuning spent in this cell's warm-up
    steps: dict[str, Callable[[], None]] = field(default_factory=dict, repr=False)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def flops(self) -> float:
        """Forward + backward GEMM FLOPs of one step (3x forward), every layer counted."""
        return 6.0 * sum(m * n * k for m, n, k in layers(self.batch, self.width))

    def ratio(self, a: str, b: str) -> float | None:
        ta, tb = self.times_ms.get(a), self.times_ms.get(b)
        return ta / tb if ta and tb else None

    def best_baseline(self) -> tuple[str | None, float | None]:
        """The fastest baseline in the mode the bench compares in (graphs on a GPU, eager
        on a CPU) and our speedup over it (> 1: ours is faster)."""
        mode = "graph" if self.cuda else "eager"
        measured = {f"{n}_{mode}_ms": self.times_ms.get(f"{n}_{mode}_ms") for n in ("torch", "compile")}
        measured = {k: v for k, v in measured.items() if v}
        if not measured:
            return None, None
        best = min(measured, key=measured.__getitem__)
        return best.removesuffix("_ms"), self.ratio(best, f"triton_{mode}_ms")

    def sources(self) -> dict[str, int]:
        return dict(Counter(t["source"] for t in self.tiles))

    def routes(self) -> dict[str, int]:
        """Non-default routes by count; a cuBLAS-route kernel whose uncaptured calls take
        a fused finalist (kernels/plan/launches.py, "Eager calls") as 'cublas+epilogue/eager triton'."""
        named = (t["route"] + (f"/eager {t['eager']['route']}" if "eager" in t else "") for t in self.tiles)
        return dict(Counter(r for r in named if r != "triton"))

    def record(self) -> dict[str, Any]:
        """The cell as bench extra_info and the --json file hold it."""
        best, speedup = self.best_baseline()
        return {
            "batch": self.batch, "width": self.width, "activation": self.activation, "precision": self.precision,
            "times_ms": self.times_ms,
            "tflops": {k: self.flops / (v / 1000) / 1e12 for k, v in self.times_ms.items() if v},
            "speedup_graph_vs_torch": self.ratio("torch_graph_ms", "triton_graph_ms"),
            "speedup_graph_vs_compile": self.ratio("compile_graph_ms", "triton_graph_ms"),
            "speedup_eager_vs_torch": self.ratio("torch_eager_ms", "triton_eager_ms"),
            "best_baseline": best, "speedup_vs_best": speedup,
            "losing": speedup is not None and speedup < LOSING,
            "tile_sources": self.sources(), "tile_routes": self.routes(), "tiles": self.tiles,
            "tuning_s": round(self.tuning_s, 3), "errors": self.errors,
        }


def cell_tiles(batch: int, width: int, dtype: torch.dtype) -> list[dict[str, Any]]:
    """This process's launch report, narrowed to the cell's layers in its dtype."""
    shapes, name = layer_shapes(batch, width), str(dtype).removeprefix("torch.")
    return [e for e in launches.launch_report() if e["dtype"] == name and tuple(e["shape"]) in shapes]


def measure_cell(
    batch: int, width: int, activation: str, precision: str, device: torch.device,
    rep: int = 100, compile_baseline: bool = True,
) -> CellResult:
    """Every implementation's step at one cell, eagerly and under CUDA graphs (GPU).
    A baseline that fails is recorded in `errors` and left out; our own kernel failing
    raises (that is the thing under test)."""
    cell = CellResult(batch, width, activation, precision, device)
    torch.manual_seed(0)
    x = torch.randn(batch, FEATURES, device=device)
    y = torch.randint(0, CLASSES, (batch,), device=device)
    base = MLP(FEATURES, width, DEPTH, CLASSES, activation).to(device)
    fused = MLP(FEATURES, width, DEPTH, CLASSES, activation, impl="triton").to(device)
    fused.load_state_dict(base.state_dict())
    models: dict[str, Callable[[], torch.nn.Module]] = {"torch": lambda: base, "triton": lambda: fused}
    if cell.cuda and compile_baseline:

        def compiled() -> torch.nn.Module:
            # A fresh compile per cell: past dynamo's recompile limit a compiled module
            # quietly runs eagerly, and the baseline would no longer be torch.compile.
            torch._dynamo.reset()
            return torch.compile(MLP(FEATURES, width, DEPTH, CLASSES, activation).to(device))

        models["compile"] = compiled
    with precision_mode(precision):
        for name, make in models.items():
            tuned_before = launches.tuning_seconds()
            try:
                step = make_step(make(), x, y, precision)
                step()  # compile, tune and allocate outside any timing
            except Exception as exc:
                if name == "triton":
                    raise
                cell.errors[name] = _error(exc)
                cell.times_ms.update({f"{name}_eager_ms": None, f"{name}_graph_ms": None})
                continue
            finally:
                cell.tuning_s += launches.tuning_seconds() - tuned_before
            cell.steps[name] = step
            key = f"{name}_graph_ms"
            if not cell.cuda:
                cell.times_ms[key] = None  # no graphs on a CPU
                continue
            try:
                cell.times_ms[key] = float(time_ms(step, device, True, rep))
            except Exception as exc:
                if name == "triton":
                    raise
                cell.errors[key] = _error(exc)
                cell.times_ms[key] = None
        _time_eager_interleaved(cell, device)
    cell.tiles = cell_tiles(batch, width, torch.bfloat16 if precision == "bf16" else torch.float32)
    return cell


def _time_eager_interleaved(cell: CellResult, device: torch.device) -> None:
    """Eager times, in rounds that take every implementation in turn, the median round
    per implementation: an eager step is bound by the host, whose speed drifts (other
    tenants, clocks) by more than the gaps measured, so implementations timed one after
    another would compare moments as much as code."""
    rounds = EAGER_ROUNDS if cell.cuda else 1
    samples: dict[str, list[float]] = {name: [] for name in cell.steps}
    failed: set[str] = set()
    for _ in range(rounds):
        for name, step in cell.steps.items():
            if name in failed:
                continue
            try:
                samples[name].append(float(eager_ms(step, device)))
            except Exception as exc:
                if name == "triton":
                    raise
                cell.errors[f"{name}_eager_ms"] = _error(exc)
                failed.add(name)
    for name, values in samples.items():
        cell.times_ms[f"{name}_eager_ms"] = None if name in failed else statistics.median(values)


# ------------------------------------------------------------------------- the CLI


def tune_phase(
    pairs: Sequence[tuple[int, int]], precisions: Sequence[str], device: torch.device,
    deadline: float = math.inf, on_row: Callable[[list[dict[str, Any]]], None] = lambda rows: None,
) -> list[dict[str, Any]]:
    """One eager step per (precision, batch, width): the first calls tune every shape.
    No new configuration starts after `deadline` (time.perf_counter())."""
    rows: list[dict[str, Any]] = []
    runs = [(b, w, "leaky_relu") for b, w in pairs] + ([(*CENTRE, "silu")] if CENTRE in pairs else [])
    for precision in precisions:
        for batch, width, activation in runs:  # silu: the act experiment's own activation class
            if time.perf_counter() > deadline:
                rows.append({"precision": precision, "batch": batch, "width": width, "activation": activation,
                             "skipped": "time budget"})
                continue
            tuned = sum(e["source"] == "tuned" for e in launches.launch_report())
            seconds = launches.tuning_seconds()
            torch.manual_seed(0)
            model = MLP(FEATURES, width, DEPTH, CLASSES, activation, impl="triton").to(device)
            x = torch.randn(batch, FEATURES, device=device)
            y = torch.randint(0, CLASSES, (batch,), device=device)
            start = time.perf_counter()
            with precision_mode(precision):
                make_step(model, x, y, precision)()
            if device.type == "cuda":
                torch.cuda.synchronize()
            rows.append({
                "precision": precision, "batch": batch, "width": width, "activation": activation,
                "wall_s": round(time.perf_counter() - start, 3),  # tuning + Triton compiles + the step
                "tuning_s": round(launches.tuning_seconds() - seconds, 3),  # timing candidates alone
                "kernels_tuned": sum(e["source"] == "tuned" for e in launches.launch_report()) - tuned,
            })
            print(f"tune  {precision:4s} batch {batch:4d} width {width:4d} {activation:10s}: "
                  f"{rows[-1]['wall_s']:7.1f} s, {rows[-1]['kernels_tuned']} kernel shapes tuned", flush=True)
            on_row(rows)
    return rows


def cell_list(
    batches: Sequence[int], widths: Sequence[int], precisions: Sequence[str], activations: Sequence[str]
) -> list[tuple[str, int, int, str]]:
    """The grid with leaky_relu, each other activation at 512 x 512 (where the grid
    holds it), the issue's losing cells first."""
    cells = [(p, b, w, "leaky_relu") for p in precisions for b in batches for w in widths]
    if CENTRE[0] in batches and CENTRE[1] in widths:
        cells += [(p, *CENTRE, a) for p in precisions for a in activations if a != "leaky_relu"]
    first = list(dict.fromkeys(c for c in PRIORITY if c in cells))  # PRIORITY names fp32 64 x 2048 twice
    return first + [c for c in cells if c not in first]


def _fmt_us(ms: float | None) -> str:
    return "-" if ms is None else f"{ms * 1000:.0f}"


def _counts(counter: dict[str, int]) -> str:
    return " ".join(f"{k} {v}" for k, v in sorted(counter.items())) or "-"


def cell_line(cell: CellResult) -> str:
    t, mode = cell.times_ms, "graph" if cell.cuda else "eager"
    _, speedup = cell.best_baseline()
    flag = " LOSING" if speedup is not None and speedup < LOSING else ""
    failed = f"  failed: {', '.join(cell.errors)}" if cell.errors else ""
    return (
        f"{cell.precision:4s} {cell.batch:5d} {cell.width:5d} {cell.activation:10s} "
        f"{_fmt_us(t.get(f'triton_{mode}_ms')):>7s} {_fmt_us(t.get(f'torch_{mode}_ms')):>7s} "
        f"{_fmt_us(t.get(f'compile_{mode}_ms')):>7s} {'-' if speedup is None else f'{speedup:.2f}':>6s}{flag:8s} "
        f"{_counts(cell.sources()):24s} {_counts(cell.routes())}{failed}"
    )


HEADER = (
    f"{'prec':4s} {'batch':>5s} {'width':>5s} {'activation':10s} {'ours':>7s} {'torch':>7s} {'compile':>7s} "
    f"{'vs best':>6s}{'':8s} {'tile sources':24s} routes   (us per step; CUDA graphs on a GPU, eager on a CPU)"
)


def _geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summary_lines(cells: list[CellResult], skipped: list[tuple[str, int, int, str]]) -> list[str]:
    order = {(p, b, w, a): i for i, (p, b, w, a) in enumerate(cell_list(BATCHES, WIDTHS, PRECISIONS, ACTIVATIONS))}
    cells = sorted(cells, key=lambda c: order.get((c.precision, c.batch, c.width, c.activation), len(order)))
    lines = ["", HEADER] + [cell_line(c) for c in cells]
    for precision in PRECISIONS:
        mine = [c.record() for c in cells if c.precision == precision]
        if not mine:
            continue
        means = {
            name: _geomean([r[key] for r in mine if r[key]])
            for name, key in (("torch", "speedup_graph_vs_torch"), ("compile", "speedup_graph_vs_compile"),
                              ("best", "speedup_vs_best"), ("eager", "speedup_eager_vs_torch"))
        }
        text = {k: "n/a" if v is None else f"{v:.2f}" for k, v in means.items()}
        lines.append(f"{precision}: geomean speedup under graphs over torch {text['torch']}, over torch.compile "
                     f"{text['compile']}, over the best baseline {text['best']}; eager (no graphs) over eager "
                     f"torch {text['eager']} ({len(mine)} cells)")
        rated = [c for c in cells if c.precision == precision and c.best_baseline()[1] is not None]
        if rated:
            worst = min(rated, key=lambda c: c.best_baseline()[1])
            name, speedup = worst.best_baseline()
            lines.append(f"{precision}: worst cell {worst.batch}x{worst.width} {worst.activation} "
                         f"{speedup:.2f} of {name}"
                         f" (tiles: {_counts(worst.sources())}; routes: {_counts(worst.routes())})")
    losing = [c for c in cells if c.record()["losing"]]
    lines.append(
        f"losing cells (< {LOSING} of the best baseline): "
        + (", ".join(f"{c.precision} {c.batch}x{c.width} {c.activation} {c.best_baseline()[1]:.2f}"
                     f" [{_counts(c.sources())}; {_counts(c.routes())}]" for c in losing) or "none")
    )
    if skipped:
        lines.append("not measured (time budget): " + ", ".join(f"{p} {b}x{w} {a}" for p, b, w, a in skipped))
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tools.bench_cells", description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    parser.add_argument("--widths", type=int, nargs="+", default=list(WIDTHS))
    parser.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=PRECISIONS)
    parser.add_argument("--activations", nargs="*", default=list(ACTIVATIONS), choices=ACTIVATIONS,
                        help="activations measured at 512 x 512 besides leaky_relu")
    parser.add_argument("--tune", default="always", choices=TUNE_MODES, help="LOADBENCH_TUNE for the whole run")
    parser.add_argument("--cache-dir", help="tuning cache directory (emptied first); default: a fresh temporary one")
    parser.add_argument("--skip-tuning-phase", action="store_true")
    parser.add_argument("--tune-only", action="store_true", help="the tuning phase alone: its one-time cost, no cells")
    parser.add_argument("--no-compile", action="store_true", help="leave out the torch.compile baseline")
    parser.add_argument("--rep", type=int, default=100, help="do_bench / do_bench_cudagraph rep (ms)")
    parser.add_argument("--budget-s", type=float, default=500.0,
                        help="start no configuration or cell after this many seconds")
    parser.add_argument("--json", default="bench_cells.json", help="results, rewritten after every cell")
    parser.add_argument("--rows", type=Path, default=None, metavar="CSV",
                        help="append a row per measured cell to this CSV (docs/data/kernel-cells.csv)")
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N, or cpu (the interpreter: a smoke run)")
    args = parser.parse_args(argv)
    loadbench_env.check("bench.tools.bench_cells")
    problem = csv_problem(Path(args.rows), KINDS["kernel-cells"]) if args.rows is not None else None
    if problem:
        parser.error(f"--rows {args.rows}: {problem}")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench.tools.bench_cells: no CUDA GPU here (--device cpu runs the code path through the interpreter)",
              file=sys.stderr)
        return 2
    started = time.perf_counter()
    temporary = args.cache_dir is None
    cache = args.cache_dir or tempfile.mkdtemp(prefix="loadbench-cache-")
    if not temporary:
        os.makedirs(cache, exist_ok=True)
        for name in (FILE_NAME, FILE_NAME + ".lock"):
            if os.path.exists(os.path.join(cache, name)):
                os.remove(os.path.join(cache, name))
    os.environ["LOADBENCH_CACHE_DIR"] = cache
    os.environ["LOADBENCH_TUNE"] = args.tune
    launches.reset_launch_state()  # re-read both
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (Triton interpreter)"
    print(f"bench.tools.bench_cells on {name}: torch {torch.__version__}, LOADBENCH_TUNE={args.tune}, cache {cache}",
          flush=True)
    out: dict[str, Any] = {"device": name, "torch": torch.__version__, "tune": args.tune, "cache_dir": cache}

    def save() -> None:
        with open(args.json, "w") as handle:
            json.dump(out, handle, indent=1)

    try:
        if not args.skip_tuning_phase:

            def tuned_so_far(rows: list[dict[str, Any]]) -> None:
                total = sum(r.get("wall_s", 0.0) for r in rows)
                out["tuning"] = {"rows": rows, "wall_s": round(total, 2),
                                 "timing_s": round(launches.tuning_seconds(), 2),
                                 "counts": launches.tuning_counts()}
                save()

            pairs = experiment_pairs(args.batches, args.widths)
            tuned_so_far(tune_phase(pairs, args.precisions, device, started + args.budget_s, tuned_so_far))
            total = out["tuning"]["wall_s"]
            print(f"first-use tuning of the experiments' shapes: {total:.1f} s wall "
                  f"({launches.tuning_seconds():.1f} s in the tuner: compiling ahead and timing; the rest the steps "
                  f"and the chosen tiles' compiles); {launches.tuning_counts()}", flush=True)
        todo = [] if args.tune_only else cell_list(args.batches, args.widths, args.precisions, args.activations)
        cells: list[CellResult] = []
        skipped: list[tuple[str, int, int, str]] = []
        failed: list[dict[str, Any]] = []
        if todo:
            print(HEADER, flush=True)
        for precision, batch, width, activation in todo:
            if time.perf_counter() - started > args.budget_s:
                skipped.append((precision, batch, width, activation))
                continue
            try:
                cell = measure_cell(batch, width, activation, precision, device, args.rep, not args.no_compile)
            except Exception as exc:  # our kernel failed: say so, and go on with the other cells
                failed.append({"precision": precision, "batch": batch, "width": width, "activation": activation,
                               "error": _error(exc)})
                out["failed"] = failed
                print(f"{precision:4s} {batch:5d} {width:5d} {activation:10s} FAILED: {_error(exc)}", flush=True)
                continue
            cell.steps.clear()
            cells.append(cell)
            print(cell_line(cell), flush=True)
            out["cells"] = [c.record() for c in cells]
            out["skipped"] = skipped
            save()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        out["skipped"] = skipped
        out["launch_report"] = launches.launch_report()
        cache_file = os.path.join(cache, FILE_NAME)
        if os.path.exists(cache_file):  # what was tuned, to read or to seed a table from
            with open(cache_file) as handle:
                out["tuning_cache"] = json.load(handle)
        out["seconds"] = round(time.perf_counter() - started, 1)
        save()
        if not args.tune_only:
            print("\n".join(summary_lines(cells, skipped)))
        for f in failed:
            print(f"failed: {f['precision']} {f['batch']}x{f['width']} {f['activation']}: {f['error']}")
        print(f"{out['seconds']:.0f} s in all; results in {args.json}")
        if args.rows is not None:
            # the tuning cache was emptied first: every tile this run used was tuned in it
            where = measured_here(name if device.type == "cuda" else cpu_name(), "empty")
            written = append_rows(args.rows, cell_rows(out, where, args.json, "bench_cells"), KINDS["kernel-cells"])
            print(f"appended {written} row(s) to {args.rows}")
    finally:
        if temporary:
            shutil.rmtree(cache, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
