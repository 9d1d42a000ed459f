"""Command line of `python -m bench.search`.

    python -m bench.search --trials 50 --profile quick --out search/
    python -m bench.search --trials 80 --train-space --storage postgresql://host/db --study-name shared

Every input is checked before any model is trained: an unknown option, a bad storage
URL, a bad space file, an unknown device or dataset stop the command with one message
(exit 2). Ctrl-C writes what the study holds so far and says how to continue (exit 130).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from kernels.ground.args import parse_device
from kernels.ground.args import parse_positive_int
from kernels.ground.args import parse_seconds
from bench.gate.profiles import PROFILES
from bench.search.objective import Evaluator
from bench.search.objective import choose_objectives
from bench.search.objective import energy_unavailable
from bench.search.objective import real_evaluator
from bench.search.space import SpaceError
from bench.search.space import load_space
from bench.search.study import SAMPLERS
from bench.search.study import SearchError
from bench.search.study import SearchSettings
from bench.search.study import run_search
from bench.search.results import summarise
from bench.search.results import verdict
from bench.search.results import write_outputs
from kernels.ground import env as loadbench_env
from model.compress import VARIANTS
from model.config import IMPLS
from model.config import TrainConfig

USAGE_ERROR = 2
INTERRUPTED = 130


def parse_drop(value: str) -> float:
    try:
        drop = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not 0 <= drop < 1 or math.isnan(drop):
        raise argparse.ArgumentTypeError(f"{value!r}: an accuracy drop is a fraction in [0, 1), "
                                         "e.g. 0.01 for one point")
    return drop


DESCRIPTION = (
    "A multi-objective Optuna search over compression settings (and, with --train-space, the training "
    "hyperparameters): minimises batch-1 p99 latency and energy per 1,000 inferences under an accuracy-drop "
    "limit and writes the Pareto front as a table, a figure and a JSON the report reads."
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.search", description=DESCRIPTION)
    p.add_argument("--trials", type=parse_positive_int, default=50,
                   help="trials the study should hold with an answer; a rerun runs only the rest. Default: %(default)s")
    p.add_argument("--timeout", type=parse_seconds, default=None, metavar="SECONDS",
                   help="stop starting trials after this long (the study can be resumed)")
    p.add_argument("--out", type=Path, default=Path("search"), help="output folder. Default: search")
    p.add_argument("--storage", default=None, metavar="URL",
                   help="Optuna storage, any database URL it accepts. Default: sqlite:///OUT/search.db")
    p.add_argument("--study-name", default=None, help="Default: mlp-loadbench-PROFILE[-train]")
    p.add_argument("--max-accuracy-drop", type=parse_drop, default=0.01, metavar="FRACTION",
                   help="feasible trials lose at most this much test accuracy. Default: %(default)s")
    p.add_argument("--train-space", action="store_true",
                   help="search the training hyperparameters too (depth, width, activation by default)")
    p.add_argument("--space", type=Path, default=None, metavar="TOML", help="narrow or widen the search space")
    p.add_argument("--profile", choices=sorted(PROFILES), default=None,
                   help="training profile of the models. Default: quick with a GPU, smoke without")
    p.add_argument("--device", type=parse_device, default="auto", help="auto, cpu, cuda or cuda:N. Default: auto")
    p.add_argument("--dataset", default="synthetic", metavar="synthetic|PATH.csv", help="Default: synthetic")
    p.add_argument("--impl", choices=IMPLS, default="torch", help="serving implementation. Default: torch")
    p.add_argument("--latency-pin", choices=("off", "on"), default="off",
                   help="on: hold the thread that times batch-1 latency on one CPU while it times (Linux). "
                        "Default: off")
    p.add_argument("--sampler", choices=SAMPLERS, default="tpe", help="Default: tpe")
    p.add_argument("--seed", type=int, default=0, help="sampler seed. Default: 0")
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="trained models are kept here. Default: $LOADBENCH_MODEL_CACHE, "
                        "else .benchmarks/trained-models (where the inference bench keeps them)")
    return p


def resolve_device(value: str) -> torch.device:
    if value == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(value)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SearchError(f"--device {value}: no CUDA GPU is visible to torch on this machine")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise SearchError(f"--device {value}: only {torch.cuda.device_count()} CUDA device(s) are visible")
    return device


def default_cache_dir() -> Path:
    """Where `pytest bench/test_inference.py` keeps trained models by default, so the
    search reuses them: $LOADBENCH_MODEL_CACHE, else .benchmarks/trained-models."""
    return Path(loadbench_env.read("LOADBENCH_MODEL_CACHE") or Path(".benchmarks") / "trained-models")


def gpu_model(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "no GPU"


def main(argv: Sequence[str] | None = None, evaluator: Evaluator | None = None) -> int:
    """The command. `evaluator` replaces the real measurement (tests inject a fake)."""
    args = parser().parse_args(argv)  # exits 2 with argparse's one message on a bad option
    loadbench_env.check("mlp-loadbench search")
    try:
        return search(args, evaluator)
    except (SearchError, SpaceError) as exc:
        print(f"mlp-loadbench search: {exc}", file=sys.stderr)
        return USAGE_ERROR


def search(args: argparse.Namespace, evaluator: Evaluator | None) -> int:
    space = load_space(args.space)
    device = resolve_device(args.device)
    profile = PROFILES[args.profile or ("quick" if device.type == "cuda" else "smoke")]
    if args.dataset != "synthetic" and not Path(args.dataset).is_file():
        raise SearchError(f"--dataset {args.dataset}: no such file (use 'synthetic' or a CSV path)")
    if args.out.exists() and not args.out.is_dir():
        raise SearchError(f"--out {args.out}: is a file; give a folder")
    args.out.mkdir(parents=True, exist_ok=True)
    storage = args.storage or f"sqlite:///{args.out / 'search.db'}"
    name = args.study_name or f"mlp-loadbench-{profile.name}" + ("-train" if args.train_space else "")
    objectives, note = choose_objectives(energy_unavailable(device))
    base = TrainConfig(epochs=profile.epochs, loop="graph" if device.type == "cuda" else "fast")
    pin = args.latency_pin == "on"
    settings = SearchSettings(
        study_name=name, storage=storage, trials=args.trials, objectives=objectives, objectives_note=note,
        max_accuracy_drop=args.max_accuracy_drop, train_space=args.train_space, space=space, base=base,
        timeout=args.timeout, sampler=args.sampler, seed=args.seed,
        context={"profile": profile.name, "dataset": Path(args.dataset).name, "gpu": gpu_model(device),
                 "impl": args.impl,
                 # Only when on: a study stored before the option existed ran unpinned and resumes as one.
                 **({"latency_pin": True} if pin else {})},
    )
    if note:
        print(f"search: {note}")
    if evaluator is None:
        evaluator = real_evaluator(load_data(args.dataset, profile.scale, device), device, profile.name,
                                   args.cache_dir or default_cache_dir(), args.impl, pin)
    outcome = run_search(settings, evaluator, VARIANTS, log=lambda line: print(line, flush=True))
    summary = summarise(outcome.study, settings, outcome.skipped_presets)
    written = write_outputs(summary, args.out)
    print((args.out / "front.md").read_text())
    for path in written:
        print(f"wrote {path}")
    if outcome.interrupted:
        print(f"search: interrupted; rerun the same command to continue the study ({args.trials} trials)",
              file=sys.stderr)
        return INTERRUPTED
    if outcome.stopped:
        print(f"search: stopped early: {outcome.stopped}", file=sys.stderr)
        return 1 if "failed" in outcome.stopped else 0
    print(f"search: {verdict(summary)}")
    return 0


def load_data(dataset: str, scale: float, device: torch.device):  # type: ignore[no-untyped-def]
    from model.data import DataError
    from model.data import load_frames
    from model.data import to_device

    try:
        return to_device(load_frames(dataset, scale=scale), device)
    except DataError as exc:
        raise SearchError(str(exc)) from None
