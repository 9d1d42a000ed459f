"""The self-test's command line: run a campaign (-k) or analyse one made elsewhere
(--from), then write the outputs."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from bench.gate.budgets import BudgetError
from bench.gate.budgets import Budgets
from bench.gate.profiles import DEFAULT_BUDGETS
from kernels.ground.args import parse_seconds
from kernels.ground import env as loadbench_env
from bench.tools.selftest.analysis import analyse
from bench.tools.selftest.campaign import SelftestError
from bench.tools.selftest.campaign import load_campaign
from bench.tools.selftest.campaign import missing_cases
from bench.tools.selftest.campaign import run_files
from bench.tools.selftest.outputs import write_outputs
from bench.tools.selftest.running import CampaignStopped
from bench.tools.selftest.running import gpus_problem
from bench.tools.selftest.running import parse_gpus
from bench.tools.selftest.running import run_campaign
from bench.tools.selftest.running import visible_gpus


EPILOG = """\
Everything after -- goes to every pytest run unchanged (profile, device, dataset, ...), e.g.:

    python -m bench.tools.selftest -k units-512 --runs 10 --plant 5 --mode gpu -- --profile quick
    python -m bench.tools.selftest -k "" --runs 10 --plant 5 --plant 15 --mode gpu --gpus 0,1 -- --profile quick

Run files (written here, read by --from): aa-01.json ... aa-NN.json and plantX-01.json ...,
X the planted percentage (plant05-01.json, plant15-02.json).
"""


def parse_pct(value: str) -> float:
    try:
        pct = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a percentage") from None
    if not 0 < pct <= 1000:
        raise argparse.ArgumentTypeError(f"{value!r}: the planted slowdown must be in (0, 1000] percent")
    return pct


def parse_runs(value: str) -> int:
    if not value.isdigit() or int(value) < 2:
        raise argparse.ArgumentTypeError(f"{value!r}: at least 2 runs (one A/A comparison)")
    return int(value)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.tools.selftest",
        usage="%(prog)s (-k EXPR | --from DIR) [--runs N] [--plant PCT ...] [--mode host|gpu] [--gpus 0,1] [--out DIR] "
              "[--path PATH] [--budgets PATH] [--resume] [--stop-after SECONDS] [-- PYTEST ARGS...]",
        description=sys.modules[__package__].__doc__.split("\n\n")[0],  # the package's: what the self-test is
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,  # keep the epilog's lines
    )
    parser.add_argument("-k", dest="expr", help="the cases (a pytest -k expression)")
    parser.add_argument("--runs", type=parse_runs, default=None, metavar="N", help="runs of each kind. Default: 10")
    parser.add_argument("--plant", type=parse_pct, action="append", default=[], metavar="PCT",
                        help="a planted slowdown in percent; repeat for several")
    parser.add_argument("--mode", choices=("host", "gpu"), default=None,
                        help="how the slowdown is planted (--plant-slowdown's mode). Default: host")
    parser.add_argument("--gpus", type=parse_gpus, default=None, metavar="0,1,...",
                        help="run on these GPUs (this machine's GPU indices) at once, one run per GPU at a "
                             "time; refused where a GPU is not there. Default: one run at a time")
    parser.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="where the run files and outputs go. "
                             "Default: selftest/ (with --from: its folder)")
    parser.add_argument("--path", default=None, help="what pytest runs. Default: bench/test_experiments.py")
    parser.add_argument("--budgets", type=Path, default=DEFAULT_BUDGETS, metavar="PATH",
                        help="the budgets file the runs are judged with. Default: bench/budgets.toml")
    parser.add_argument("--resume", action="store_true",
                        help="keep the runs already complete in --out; run only the rest")
    parser.add_argument("--stop-after", type=parse_seconds, default=None, metavar="SECONDS",
                        help="start no run that would end later than this (judged by the longest run so far); "
                             "exit 3, to go on with --resume")
    parser.add_argument("--from", dest="from_dir", type=Path, default=None, metavar="DIR",
                        help="do not run: analyse the run files already in DIR")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    args, pytest_args = parser.parse_args(argv[:split]), argv[split + 1 :]  # after --: for pytest
    loadbench_env.check("mlp-loadbench selftest")  # before any of the pytest sessions would refuse it each
    running = (("-k", args.expr), ("--runs", args.runs), ("--plant", args.plant), ("--mode", args.mode),
               ("--path", args.path), ("--gpus", args.gpus), ("--resume", args.resume),
               ("--stop-after", args.stop_after), ("pytest arguments", pytest_args))
    running_only = [name for name, given in running if given not in (None, False, [])]  # -k "": every case
    if args.from_dir is not None and running_only:
        parser.error(f"--from analyses runs already made: {', '.join(running_only)} do not apply")
    if args.from_dir is None and args.expr is None:
        parser.error("-k EXPR (the cases to run) or --from DIR (runs already made) is required")
    out = args.out or args.from_dir or Path("selftest")
    problem = gpus_problem(args.gpus, visible_gpus()) if args.gpus else None
    if problem:  # before any run: the lanes would train on no GPU, or on GPUs that are not there
        print(f"mlp-loadbench selftest: {problem}", file=sys.stderr)
        return 2
    try:
        budgets = Budgets.load(args.budgets)
        if args.from_dir is not None:
            paths = run_files(args.from_dir)
        else:
            paths = run_campaign(out, args.path or "bench/test_experiments.py", args.expr, args.runs or 10,
                                 args.plant, args.mode or "host", pytest_args, args.gpus or (),
                                 resume=args.resume, stop_after=args.stop_after)
        campaign = load_campaign(paths)
        results = analyse(campaign.aa_runs, campaign.planted_runs, budgets, [name for name, _ in campaign.aa])
    except CampaignStopped as exc:
        print(f"mlp-loadbench selftest: {exc}", file=sys.stderr)
        return 3
    except (SelftestError, BudgetError) as exc:
        print(f"mlp-loadbench selftest: {exc}", file=sys.stderr)
        return 2
    for note in missing_cases(campaign):
        print(f"warning: {note}", file=sys.stderr)
    print(write_outputs(out, campaign, results, args.budgets))
    print(f"wrote {out / 'selftest.md'} and {out / 'suggested-budgets.toml'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
