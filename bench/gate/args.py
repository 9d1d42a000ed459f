"""The argparse validators more than one command shares: one definition, one message each.

Each parse_* takes the option's text and returns its value, or raises
argparse.ArgumentTypeError with one line that argparse prefixes with the option's name.
The *_problem checks take an output path and return what is wrong with it, or None.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from pathlib import Path


def parse_device(value: str) -> str:
    """'auto', 'cpu', 'cuda' or 'cuda:N', unchanged; resolving it to a device is the caller's."""
    if value in ("auto", "cpu", "cuda") or (value.startswith("cuda:") and value[5:].isdigit()):
        return value
    raise argparse.ArgumentTypeError(f"{value!r} is not a device: use auto, cpu, cuda or cuda:N")


def parse_positive_int(value: str) -> int:
    """A whole number of at least 1, written in digits."""
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive integer")
    return int(value)


def parse_epochs(value: str) -> int:
    """At least 2: the first epoch is the warm-up round, so one epoch would time nothing."""
    epochs = parse_positive_int(value)
    if epochs < 2:
        raise argparse.ArgumentTypeError(f"{value!r}: the first epoch is the warm-up (compilation, graph capture), "
                                         "so at least 2 are needed for one timed epoch")
    return epochs


def parse_seconds(value: str) -> float:
    """A finite number of seconds above 0 (a timeout: --timeout, --stop-after)."""
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not (math.isfinite(seconds) and seconds > 0):
        raise argparse.ArgumentTypeError(f"{value!r}: the timeout must be a positive number of seconds")
    return seconds


def parse_period(value: str) -> float:
    """The load monitor's sampling period: seconds between 0.001 and 60."""
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not 0.001 <= seconds <= 60:
        raise argparse.ArgumentTypeError(f"{value!r}: the monitor period must be between 0.001 and 60 s")
    return seconds


def parse_shard(value: str) -> tuple[int, int]:
    """'i/n' (1-based): this process runs the i-th of n deterministic shards."""
    try:
        index, count = (int(part) for part in value.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a shard: use i/n, e.g. 1/4") from None
    if count < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: the shard count must be at least 1")
    if not 1 <= index <= count:
        raise argparse.ArgumentTypeError(f"{value!r}: the shard index must be between 1 and {count}")
    return index, count


def directory_problem(path: Path) -> str | None:
    """Why `path` cannot be a directory this run writes into, or None once it is one
    (made, with its parents, when missing, and written to)."""
    for part in (path, *path.parents):
        if part.exists() and not part.is_dir():
            return "is a file; give a directory" if part == path else f"{part} is a file, not a directory"
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        return f"cannot be written ({exc.strerror or exc})"
    return None


def file_problem(path: Path) -> str | None:
    """Why `path` cannot be a file this run writes at its end, or None once its folder
    exists and takes a new file. Checked at start-up whatever pytest-benchmark does with
    the option (5.2 opened the file while parsing; 5.3 opens it only to write the run,
    after every case has trained)."""
    if path.is_dir():
        return "is a directory; give a file path"
    if path.exists() and not os.access(path, os.W_OK):
        return "cannot be written (permission denied)"
    for part in path.parents:
        if part.exists() and not part.is_dir():
            return f"{part} is a file, not a directory"
    return directory_problem(path.parent)
