"""Checks of the command line and the environment that run before anything trains.

Each returns the problem as one line (what is wrong and where) or None; the plugin's
first pytest_configure turns a problem into a usage error, so a typo costs seconds,
not a session of training followed by a traceback.
"""

from __future__ import annotations

from pathlib import Path

FILE_SCHEME = "file://"
RUNS_SHOWN = 3  # the newest stored runs a 'no such file' line names


def storage_dir(storage: str) -> Path | None:
    """The folder of a --benchmark-storage value; None for a storage that is not a folder."""
    if "://" not in storage:
        return Path(storage)
    if storage.startswith(FILE_SCHEME):
        return Path(storage[len(FILE_SCHEME) :])
    return None


def stored_runs(storage: Path) -> list[Path]:
    """The run files in a pytest-benchmark storage folder, oldest name first."""
    if not storage.is_dir():
        return []
    return sorted(storage.glob("*/*.json"), key=lambda path: path.name)


def _matches(value: str, storage: Path) -> bool:
    """Whether pytest-benchmark's storage query would find a run for the run id or glob `value`."""
    parts = Path(value).parts
    if len(parts) > 2:
        return False
    platform, name = parts if len(parts) == 2 else ("*", parts[0] if parts else "")
    pattern = name.rstrip("*") + "*.json"
    return any(storage.glob(f"{platform}/{pattern}")) or any(storage.glob(pattern))


def compare_path(value: str | bool | None) -> str | bool | None:
    """`value` without a leading file:// when what follows names a file: pytest-benchmark
    takes a baseline's path, never its URL."""
    if isinstance(value, str) and value.startswith(FILE_SCHEME) and Path(value[len(FILE_SCHEME) :]).is_file():
        return value[len(FILE_SCHEME) :]
    return value


def compare_problem(value: str | bool | None, storage: str) -> str | None:
    """Why `--benchmark-compare value` names nothing to compare with, for a value that
    reads as a file path (a folder in it, a .json name, a file:// URL) that does not
    exist and that no stored run matches either; None otherwise (a run id such as 0003
    is left to the session's own check, which knows what pytest-benchmark loads)."""
    if not isinstance(value, str) or not value:
        return None
    path = value[len(FILE_SCHEME) :] if value.startswith(FILE_SCHEME) else value
    if Path(path).is_file():
        return None
    folder = storage_dir(storage)
    path_like = path != value or value.endswith(".json") or Path(value).is_absolute() or len(Path(value).parts) > 1
    if not path_like or folder is None or (path == value and _matches(value, folder)):
        return None
    line = f"--benchmark-compare {value}: no such file ({Path(path).resolve()})"
    runs = stored_runs(folder)
    if runs:
        shown = ", ".join(str(run.relative_to(folder)) for run in runs[-RUNS_SHOWN:])
        return (f"{line}; the storage {folder} holds {len(runs)} run(s), the newest {shown} "
                "(give a run number or a file)")
    return f"{line}, and the storage {folder} holds no runs yet"
