"""Command-line options of the harness: profiles, validators and the resolved `Options`."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from kernels.ground import env
from kernels.ground.args import parse_device
from kernels.ground.args import parse_epochs
from kernels.ground.args import parse_period
from kernels.ground.args import parse_shard
from bench.gate.profiles import DEFAULT_BUDGETS
from bench.gate.profiles import PROFILES
from bench.gate.profiles import Profile
from bench.gate.profiles import TIERS
from bench.gate.timing import time_note
from kernels.ground.axes import IMPLS
from kernels.ground.axes import Impl
from kernels.ground.axes import LOOPS
from kernels.ground.axes import OPTIMIZER_IMPLS
from kernels.ground.axes import PRECISIONS
from kernels.ground.axes import Precision


@dataclass(frozen=True)
class Plant:
    """A slowdown planted inside every timed epoch, for the gate's self-test."""

    fraction: float  # 0.05: each epoch takes 5% longer
    mode: str  # 'host': the host sleeps; 'gpu': the device spins
    note: str | None = None  # why the mode that runs is not the one asked for

    def __str__(self) -> str:
        return f"{100 * self.fraction:g}%:{self.mode}"


def parse_plant(value: str) -> Plant:
    """'PCT[:host|gpu]', e.g. '5' or '15:gpu'."""
    pct, _, mode = value.partition(":")
    mode = mode or "host"
    try:
        fraction = float(pct) / 100
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a slowdown: use PCT[:host|gpu], e.g. 5:gpu") from None
    if mode not in ("host", "gpu") or not 0 < fraction <= 10:
        raise argparse.ArgumentTypeError(f"{value!r}: use a percentage in (0, 1000] and mode host or gpu")
    return Plant(fraction, mode)


def plant_on(plant: Plant | None, device: torch.device) -> Plant | None:
    """The slowdown that runs on `device`: a GPU spin needs a CUDA device, so elsewhere
    the host sleeps instead, and the plant says so (the run records what ran)."""
    if plant is None or plant.mode != "gpu" or device.type == "cuda":
        return plant
    note = f"--plant-slowdown {plant}: no GPU to spin on {device}, so the host sleeps instead (recorded as host)"
    return Plant(plant.fraction, "host", note)


def parse_workers(value: str) -> int | str:
    """'auto' (one process per CPU) or a whole number of processes, 0 (the default) for none."""
    if value == "auto":
        return value
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of processes: use 0, a whole number or auto")
    return int(value)


class ShardAction(argparse.Action):
    """--shard I/N. argparse reads a value that begins with '-' (``--shard -1/2``) as the
    next option and would say only "expected one argument": the value is optional to
    argparse, so that a missing one gets this action's line saying what a shard is."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        if values is None:
            raise argparse.ArgumentError(self, "expected I/N after it, e.g. 1/4: none was given, or it began with '-' "
                                               "(-1/2 reads as an option; a shard index counts from 1)")
        setattr(namespace, self.dest, values)


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("loadbench", "mlp-loadbench")
    group.addoption("--profile", choices=sorted(PROFILES), default=None,
                    help="smoke, quick or thesis. Default: quick with a GPU, smoke without.")
    group.addoption("--device", type=parse_device, default="auto", metavar="DEVICE",
                    help="auto, cpu, cuda or cuda:N. Default: %(default)r (cuda when present).")
    group.addoption("--loop", choices=LOOPS, default=None,
                    help="training loop. Default: graph on a GPU, fast on a CPU.")
    group.addoption("--impl", choices=IMPLS, default="torch", help="layer implementation. Default: %(default)r")
    group.addoption("--optimizer-impl", choices=OPTIMIZER_IMPLS, default="torch",
                    help="torch: torch.optim and F.cross_entropy; triton: one optimizer kernel over a flat "
                         "parameter buffer and one loss kernel per step. Default: %(default)r")
    group.addoption("--precision", choices=PRECISIONS, default="fp32",
                    help="fp32 (strict, TF32 off), tf32 or bf16. Default: %(default)r")
    group.addoption("--dataset", default="synthetic", metavar="synthetic|PATH.csv",
                    help="the embedded generator or a CSV in the study's schema. Default: %(default)r")
    group.addoption("--budgets", default=str(DEFAULT_BUDGETS), metavar="PATH",
                    help="budgets TOML file. Default: bench/budgets.toml")
    group.addoption("--monitor-period", type=parse_period, default=0.1, metavar="SECONDS",
                    help="load sampling period. Default: %(default)r")
    group.addoption("--series-dir", default=None, metavar="DIR",
                    help="where per-case sample series go. Default: series/ inside the benchmark storage")
    group.addoption("--epochs", type=parse_epochs, default=None, metavar="N",
                    help="override the profile's epochs (at least 2: the first is the warm-up round)")
    group.addoption("--shard", type=parse_shard, nargs="?", action=ShardAction, default=None, metavar="I/N",
                    help="run the I-th of N deterministic shards of the collected cases (1-based)")
    group.addoption("--shard-durations", default=None, metavar="RUN.json",
                    help="with --shard: balance the shards by each case's time in this earlier run")
    group.addoption("--cold-caches", action="store_true", default=False,
                    help="point Triton's and Inductor's caches at empty folders for this session, so each "
                         "first epoch includes compilation; records say whether caches were cold or warm")
    group.addoption("--compile-workers", type=parse_workers, default=0, metavar="N|auto",
                    help="before the timed cases, run each training case's first epochs in N processes side by "
                         "side (auto: one per CPU), so their kernels compile in parallel into the session's "
                         "caches; records say the caches were warm, compiled ahead. Default: 0 (none)")
    group.addoption("--compile-only", action="store_true", default=False,
                    help="only build: each training case trains two epochs and evaluates, then skips; nothing "
                         "is timed, stored or judged (fills the kernel caches, e.g. on a new runner)")
    group.addoption("--kernel-trace", action="store_true", default=False,
                    help="after each case, profile a few steady epochs and store the kernel table; "
                         "a time regression against a traced baseline names the kernels that grew")
    group.addoption("--latency-pin", choices=("off", "on"), default="off",
                    help="on: hold the thread that times batch-1 serving latency on one CPU while it "
                         "times (Linux); recorded in the run's settings. Default: %(default)r")
    group.addoption("--tier", choices=TIERS, default="pr",
                    help="pr: the pull-request gate (the five experiments, the loops, the kernel cells that tell "
                         "the kernel's story, the optimal configuration served); nightly: every case, cases marked "
                         "nightly too (the whole serving matrix, data parallel, every kernel cell). "
                         "Default: %(default)r")
    group.addoption("--time-gate", choices=("auto", "on", "off"), default="auto",
                    help="judge time against the baseline: on, off, or auto (on with a GPU; off on a CPU, whose "
                         "epochs move with whatever else the machine runs). Memory, accuracy and budgets are "
                         "judged either way. Default: %(default)r")
    group.addoption("--plant-slowdown", type=parse_plant, default=None, metavar="PCT[:host|gpu]",
                    help="make every timed epoch PCT%% slower (host sleep or GPU spin): tests the time gate; "
                         "recorded in the run's settings")


@dataclass(frozen=True)
class Options:
    profile: Profile
    profile_was_default: bool
    device: torch.device
    loop: str
    impl: str
    optimizer_impl: str
    precision: str
    dataset: str
    budgets: Path
    monitor_period: float
    series_dir: Path | None
    epochs: int
    strict_fp32: str  # how impl=triton runs fp32 at 'highest': 'ieee' or 'tf32x3'
    plant: Plant | None
    trace: bool
    cold_caches: bool
    compile_workers: int | str  # --compile-workers: 'auto' or a count, 0 for none
    compile_only: bool
    latency_pin: bool
    tier: str
    time_gated: bool  # whether time is judged against the baseline (--time-gate)

    @classmethod
    def from_config(cls, config: pytest.Config) -> Options:
        device = resolve_device(config.getoption("device"))
        gpu = device.type == "cuda"
        name = config.getoption("profile")
        profile = PROFILES[name or ("quick" if gpu else "smoke")]
        dataset = config.getoption("dataset")
        if dataset != "synthetic" and Path(dataset).is_dir():
            raise pytest.UsageError(f"--dataset {dataset}: is a directory, not a CSV file")
        if dataset != "synthetic" and not Path(dataset).is_file():
            raise pytest.UsageError(f"--dataset {dataset}: no such file (use 'synthetic' or a CSV path)")
        series = config.getoption("series_dir")  # checked, and made, at start-up (bench/plugin/startup.py)
        return cls(
            profile=profile,
            profile_was_default=name is None,
            device=device,
            loop=config.getoption("loop") or ("graph" if gpu else "fast"),
            impl=config.getoption("impl"),
            optimizer_impl=config.getoption("optimizer_impl"),
            precision=config.getoption("precision"),
            dataset=dataset,
            budgets=Path(config.getoption("budgets")),
            monitor_period=config.getoption("monitor_period"),
            series_dir=Path(series) if series else None,
            epochs=config.getoption("epochs") or profile.epochs,
            # what kernels.plan.launch_plan reads at its import; a bad value was refused at start-up
            strict_fp32=env.read_at_import("LOADBENCH_STRICT_FP32"),
            plant=plant_on(config.getoption("plant_slowdown"), device),
            trace=config.getoption("kernel_trace"),
            cold_caches=config.getoption("cold_caches"),
            compile_workers=config.getoption("compile_workers"),
            compile_only=config.getoption("compile_only"),
            latency_pin=config.getoption("latency_pin") == "on",
            tier=config.getoption("tier"),
            time_gated={"on": True, "off": False}.get(config.getoption("time_gate"), gpu),
        )

    @property
    def time_note(self) -> str | None:
        """Why time is not judged against the baseline in this run, for every verdict; None when it is."""
        return time_note(self.time_gated, str(self.device))

    def header(self) -> str:
        default = " (default for this machine)" if self.profile_was_default else ""
        about = self.profile.about
        if self.dataset != "synthetic":  # the profile's frame fraction shrinks only the generator
            about = f"every frame of {Path(self.dataset).name}, {self.profile.epochs} epochs"
        line = (
            f"mlp-loadbench: profile {self.profile.name}{default}: {about}; "
            f"epochs {self.epochs}, device {self.device}, loop {self.loop}, impl {self.impl}, "
            f"optimizer impl {self.optimizer_impl}, "
            f"precision {self.precision}, dataset {self.dataset}"
        )
        if self.impl == Impl.TRITON and self.precision == Precision.FP32:
            line += f", strict fp32 kernel {self.strict_fp32}"
        if self.device.type == "cpu":  # torch's intra-op threads: on a busy 2-core machine one thread is steadier
            line += f", {torch.get_num_threads()} torch thread(s) (OMP_NUM_THREADS sets them)"
        if self.time_note is not None:
            line += f"\nmlp-loadbench: {self.time_note}"
        if self.plant is not None:
            line += f"\nmlp-loadbench: PLANTED SLOWDOWN {self.plant} in every timed epoch (--plant-slowdown)"
            if self.plant.note:
                line += f"; {self.plant.note}"
        if self.impl == Impl.TRITON and self.device.type == "cpu":
            line += (
                "\nmlp-loadbench: --impl triton on a CPU runs Triton's interpreter, about 20 s per "
                "step at width 512: select a few cases with -k and few --epochs"
            )
        return line


def resolve_device(value: str) -> torch.device:
    if value == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(value)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise pytest.UsageError(f"--device {value}: no CUDA GPU is visible to torch on this machine")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise pytest.UsageError(
                f"--device {value}: only {torch.cuda.device_count()} CUDA device(s) are visible"
            )
    return device
