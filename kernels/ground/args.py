"""The argument checks more than one command shares: one definition, one message each.

The parsers take the option's text and return its value, or raise
argparse.ArgumentTypeError with one line that argparse prefixes with the option's name.
`directory_problem` and `file_problem` check an output folder or file after parsing, for
the pytest plugin and the tools alike (they make the folder, which a parser should not do
before --help).
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from collections.abc import Callable
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


def at_least(minimum: int) -> Callable[[str], int]:
    """A parser of whole numbers of at least `minimum`, whose message names the minimum."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a whole number (at least {minimum})") from None
        if number < minimum:
            raise argparse.ArgumentTypeError(f"{value}: must be at least {minimum}")
        return number

    return parse


def seconds_at_least(minimum: float) -> Callable[[str], float]:
    """A parser of a finite number of seconds of at least `minimum` (a wait: 0 waits none)."""

    def parse(value: str) -> float:
        try:
            seconds = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
        if not math.isfinite(seconds):
            raise argparse.ArgumentTypeError(f"{value}: must be a finite number of seconds")
        if seconds < minimum:
            raise argparse.ArgumentTypeError(f"{value}: must be at least {minimum:g}")
        return seconds

    return parse


def parse_epochs(value: str) -> int:
    """At least 2: the first epoch is the warm-up round, so one epoch would time nothing."""
    epochs = parse_positive_int(value)
    if epochs < 2:
        raise argparse.ArgumentTypeError(f"{value!r}: the first epoch is the warm-up (compilation, graph capture), "
                                         "so at least 2 are needed for one timed epoch")
    return epochs


def _seconds(value: str) -> float:
    """`value` as a float, or the usage error that it is not a number of seconds."""
    try:
        return float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None


def parse_seconds(value: str) -> float:
    """A finite number of seconds above 0 (a timeout: --timeout, --stop-after)."""
    seconds = _seconds(value)
    if not (math.isfinite(seconds) and seconds > 0):
        raise argparse.ArgumentTypeError(f"{value!r}: the timeout must be a positive number of seconds")
    return seconds


def parse_period(value: str) -> float:
    """The load monitor's sampling period: seconds between 0.001 and 60."""
    seconds = _seconds(value)
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


def directory_problem(path: Path, keep: bool = True) -> str | None:
    """Why `path` cannot be a directory a run or a tool writes into, or None once it is
    one (made, with its parents, when missing, and written to). With `keep` False the
    folders it made are removed again: a tool that may still find nothing to write
    leaves nothing behind."""
    for part in (path, *path.parents):
        if part.exists() and not part.is_dir():
            return "is a file; give a directory" if part == path else f"{part} is a file, not a directory"
    made = [part for part in (path, *path.parents) if not part.exists()]  # the deepest first
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        return f"cannot be written ({exc.strerror or exc})"
    finally:
        for part in made if not keep else ():
            try:
                part.rmdir()
            except OSError:
                break  # not made here after all, or no longer empty: leave it and what holds it
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
