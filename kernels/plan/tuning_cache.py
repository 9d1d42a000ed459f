"""The per-user cache of launch configurations tuned on first use.

One JSON file, `launch-cache.json`, under `mlp-loadbench/` in LOADBENCH_CACHE_DIR or
the platform's cache directory. Entries are grouped by `cache_key(gpu, triton, torch)`
(a version change re-tunes) and keyed inside a group by `launch_plan.shape_key`.
Writes are atomic and merge (lock file, re-read, add, write beside, os.replace), so
processes tuning at once lose no entry and a reader never sees half a file; a file
that does not parse is ignored with one warning. LOADBENCH_TUNE picks the policy
(`tune_mode_from_env`): 'off', 'cache' (the default) or 'always'. This module only
stores and reads; it knows nothing about kernels.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kernels.ground import env as loadbench_env

FORMAT = 1
FILE_NAME = "launch-cache.json"
APP_DIR = "mlp-loadbench"

TUNE_MODES = loadbench_env.TUNE_MODES


def tune_mode_from_env(value: str | None) -> str:
    """The LOADBENCH_TUNE policy; unset or empty means 'cache'."""
    return loadbench_env.parse("LOADBENCH_TUNE", value)


def cache_dir(env: Mapping[str, str] | None = None, platform: str | None = None) -> Path:
    """LOADBENCH_CACHE_DIR, else this user's platform cache directory + 'mlp-loadbench'."""
    env = os.environ if env is None else env
    platform = sys.platform if platform is None else platform
    if loadbench_env.read("LOADBENCH_CACHE_DIR", env):
        return Path(loadbench_env.read("LOADBENCH_CACHE_DIR", env).strip()).expanduser()
    home = Path(env.get("HOME") or Path.home())
    if platform == "darwin":
        root = home / "Library" / "Caches"
    elif platform.startswith("win"):
        root = Path(env.get("LOCALAPPDATA") or home / "AppData" / "Local")
    else:
        root = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else home / ".cache"
    return root / APP_DIR


def cache_key(gpu: str, triton_version: str, torch_version: str) -> str:
    """The group a measurement belongs to: GPU model, Triton and torch builds."""
    return f"{gpu} | triton {triton_version} | torch {torch_version}"


def split_key(key: str) -> tuple[str, str, str]:
    """`cache_key`'s parts back: (gpu, triton version, torch version); ValueError if `key`
    is not one of its keys."""
    rest, torch_sep, torch_version = key.rpartition(" | torch ")
    gpu, triton_sep, triton_version = rest.rpartition(" | triton ")
    if not (torch_sep and triton_sep and gpu and triton_version and torch_version):
        raise ValueError(f"group {key!r} is not 'GPU | triton X | torch Y'")
    return gpu, triton_version, torch_version


try:  # POSIX; on Windows the merge still happens, only without the lock
    import fcntl
except ImportError:  # pragma: no cover - not on Linux
    fcntl = None  # type: ignore[assignment]


class TuningCache:
    """One group of the cache file: read once per process, written through on `put`."""

    def __init__(self, directory: Path | str, key: str) -> None:
        self.directory = Path(directory)
        self.path = self.directory / FILE_NAME
        self.key = key
        self._entries: dict[str, dict[str, Any]] | None = None
        self._warned = False

    # ------------------------------------------------------------------ read

    def entries(self) -> dict[str, dict[str, Any]]:
        """This group's entries. Read from disk once; later lookups are dict lookups
        (the hot path must not touch the file)."""
        if self._entries is None:
            self._entries = dict(self._read_groups().get(self.key, {}))
        return self._entries

    def get(self, shape_key: str) -> dict[str, Any] | None:
        return self.entries().get(shape_key)

    def _read_groups(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Every group in the file; {} when there is no file or it does not parse."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except OSError as exc:
            self._warn(f"cannot read it ({exc})")
            return {}
        try:
            data = json.loads(text)
            groups = data["groups"]
            if data.get("format") != FORMAT or not isinstance(groups, dict):
                raise ValueError(f"format {data.get('format')!r}, expected {FORMAT}")
            if not all(isinstance(g, dict) and all(isinstance(e, dict) for e in g.values()) for g in groups.values()):
                raise ValueError("a group or entry is not an object")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            self._warn(f"not a tuning cache ({type(exc).__name__}: {exc})")
            return {}
        return groups

    def _warn(self, why: str) -> None:
        if not self._warned:  # one warning per process and file, not one per lookup
            self._warned = True
            warnings.warn(f"{self.path}: {why}; ignoring it (the next tuned entry rewrites it)", stacklevel=3)

    # ----------------------------------------------------------------- write

    def put(self, shape_key: str, entry: dict[str, Any]) -> None:
        """Add one entry: lock, re-read, merge, replace atomically."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with self._locked():
            groups = self._read_groups()  # what other processes wrote since we last read
            groups.setdefault(self.key, {})[shape_key] = entry
            self._write_atomically({"format": FORMAT, "groups": groups})
        self._entries = dict(groups[self.key])

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """An exclusive lock on a file beside the cache: the data file itself is
        replaced on every write, so a lock on it would lock an old inode."""
        if fcntl is None:  # pragma: no cover
            yield
            return
        with open(self.directory / (FILE_NAME + ".lock"), "a+") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def _write_atomically(self, data: dict[str, Any]) -> None:
        handle, tmp = tempfile.mkstemp(dir=self.directory, prefix=FILE_NAME + ".", suffix=".tmp")
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                json.dump(data, out, indent=1, sort_keys=True)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
