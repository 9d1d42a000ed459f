"""Every LOADBENCH_* environment variable: one table, one parser each, one check of all.

Stdlib only and free of triton, so that model/, bench/ and the tools read their
variables here; the pytest plugin checks them all at start-up (`validate_all`) and
every command's main calls `check` first, before anything trains or is imported that
keeps a value from its import on (`read_at_import`). A value that is unset or blank
means the variable's default.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PREFIX = "LOADBENCH_"
TUNE_MODES = ("off", "cache", "always")
STRICT_FP32_CHOICES = ("ieee", "tf32x3")
_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Variable:
    name: str
    allowed: str  # the error's text after 'NAME=value: '
    default: str
    meaning: str
    parse: Callable[[str], Any]  # the stripped, non-empty value -> its meaning; ValueError if bad
    fallback: Any = None  # what an unset or blank value reads as (None: the reader computes the default)


def _choice(choices: tuple[str, ...]) -> Callable[[str], str]:
    def parse(value: str) -> str:
        if value not in choices:
            raise ValueError(value)
        return value

    return parse


def _switch(value: str) -> bool:
    if value.lower() in _ON:
        return True
    if value.lower() in _OFF:
        return False
    raise ValueError(value)


def _whole(minimum: int) -> Callable[[str], int]:
    def parse(value: str) -> int:
        number = int(value)
        if number < minimum:
            raise ValueError(value)
        return number

    return parse


def _size(value: str) -> float:
    number = float(value)
    if not (math.isfinite(number) and number >= 0):
        raise ValueError(value)
    return number


def _seconds(value: str) -> float:
    number = float(value)
    if not (math.isfinite(number) and number > 0):
        raise ValueError(value)
    return number


def _text(value: str) -> str:
    return value


VARIABLES = (
    Variable("LOADBENCH_TUNE", f"use one of {', '.join(TUNE_MODES)}", "cache",
             "how Triton launch configurations are chosen: off (committed table, then the heuristic), cache (table, "
             "then the local tuning cache, else tune and store), always (re-tune each shape class once per process)",
             _choice(TUNE_MODES), "cache"),
    Variable("LOADBENCH_CACHE_DIR", "a directory (created if missing)",
             "the platform's cache directory + mlp-loadbench",
             "where the tuning cache (launch-cache.json) lives", _text),
    Variable("LOADBENCH_TUNE_THREADS", "a whole number, 1 or more", "8",
             "threads that load the kernels compiled ahead while tuning", _whole(1), 8),
    Variable("LOADBENCH_COMPILE_PROCESSES", "a whole number of processes, 0 or more (0: compile on threads only)",
             "one per core up to 16; 0 below four cores or without fork",
             "worker processes that compile tuning candidates ahead", _whole(0)),
    Variable("LOADBENCH_FUSED_FORWARD", "use 1 (one launch for a few-row forward) or 0 (layer by layer)", "1",
             "whether impl=triton serves a few-row forward in one fused launch", _choice(("1", "0")), "1"),
    Variable("LOADBENCH_FUSED_STEP", "use auto, 1 (one launch per training step) or 0 (the layer kernels)", "auto",
             "whether impl=triton with optimizer-impl=triton trains through the one-launch fused step "
             "(auto: on a CUDA GPU, where it was measured faster than the layer kernels; docs/fused-step.md)",
             _choice(("auto", "1", "0")), "auto"),
    Variable("LOADBENCH_STRICT_FP32", f"use one of {', '.join(STRICT_FP32_CHOICES)}", "tf32x3",
             "how impl=triton runs fp32 at 'highest' precision: ieee (exact fp32 FMAs) or tf32x3 (three TF32 products)",
             _choice(STRICT_FP32_CHOICES), "tf32x3"),
    Variable("LOADBENCH_DP_GRAPH", "use 1 (replay from CUDA graphs, the default) or 0 (run eagerly); "
             "true/yes/on and false/no/off too", "1",
             "whether data-parallel graph loops replay CUDA graphs on NCCL", _switch, True),
    Variable("LOADBENCH_DP_BUCKET_MB", "a bucket size in MiB, 0 or more "
             "(0: one all-reduce of the whole gradient after the backward pass)", "1",
             "the data-parallel gradient bucket size", _size, 1.0),
    Variable("LOADBENCH_DUMP_STACKS_S", "a number of seconds, more than 0", "unset (no dumps)",
             "each data-parallel rank dumps its threads' stacks every N seconds (to debug a hang)", _seconds),
    Variable("LOADBENCH_LAUNCHER_PID", "a process id (set by the data-parallel launcher for its ranks)", "unset",
             "a rank ends itself when its launcher is gone", _whole(1)),
    Variable("LOADBENCH_MODEL_CACHE", "a directory (created if missing)",
             "trained-models/ in the benchmark storage (python -m bench.search: .benchmarks/trained-models)",
             "where trained models are kept for the serving cases and the search", _text),
    Variable("LOADBENCH_STORAGE", "a directory", ".benchmarks/main",
             "python -m bench.tools.ci's default --storage", _text),
    Variable("LOADBENCH_GIT_NAME", "any text", "mlp-loadbench", "the committer name on the data branch", _text),
    Variable("LOADBENCH_GIT_EMAIL", "any text", "mlp-loadbench@localhost", "the committer email on the data branch",
             _text),
)
BY_NAME = {variable.name: variable for variable in VARIABLES}
PATH_VARIABLES = ("LOADBENCH_CACHE_DIR", "LOADBENCH_MODEL_CACHE")  # directories written to during a run


def parse(name: str, value: str | None) -> Any:
    """`value` of the variable `name` read for what it means: its fallback when unset or
    blank; ValueError 'NAME='value': allowed values' when it is not one of them."""
    variable = BY_NAME[name]
    if value is None or not value.strip():
        return variable.fallback
    try:
        return variable.parse(value.strip())
    except ValueError:
        raise ValueError(f"{name}={value!r}: {variable.allowed}") from None


def read(name: str, env: Mapping[str, str] | None = None) -> Any:
    """The variable `name` as set in `env` (the process's environment by default), parsed."""
    env = os.environ if env is None else env
    return parse(name, env.get(name))


def read_at_import(name: str, env: Mapping[str, str] | None = None) -> Any:
    """`read`, for a module that keeps the value from its import on: a bad value reads as
    the fallback instead of raising, so that an import never ends a command with a
    traceback; every entry point refuses that value first, in one line (`check`, and the
    plugin's start-up), before the value is used."""
    try:
        return read(name, env)
    except ValueError:
        return BY_NAME[name].fallback


def validate_all(env: Mapping[str, str] | None = None) -> str | None:
    """The first problem among the LOADBENCH_* variables set in `env` (the process's
    environment by default), as one line naming the variable and its allowed values;
    None when all are well. A name not in the table counts as a problem (a typo)."""
    env = os.environ if env is None else env
    for name in sorted(env):
        if name.startswith(PREFIX) and name not in BY_NAME:
            return f"{name} is not a variable mlp-loadbench reads (they are: {', '.join(BY_NAME)})"
    for variable in VARIABLES:
        try:
            read(variable.name, env)
        except ValueError as exc:
            return str(exc)
    return None


def check(prog: str, env: Mapping[str, str] | None = None) -> None:
    """The one check every command's main calls first: exit 2 with `prog: problem` on
    stderr where a LOADBENCH_* variable set in `env` (the process's by default) is bad."""
    problem = validate_all(env)
    if problem:
        print(f"{prog}: {problem}", file=sys.stderr)
        raise SystemExit(2)


def table() -> list[tuple[str, str, str, str]]:
    """(name, allowed values, default, meaning) of each variable, for the README."""
    return [(v.name, v.allowed, v.default, v.meaning) for v in VARIABLES]
