"""Writing a file so that readers never see half of it.

The benchmark storage, the report, the sample series and the trained-model cache are
read while other processes (shards, parallel runs on other GPUs) may be writing them:
each file is written under a temporary name of its own beside the target, then renamed
over it (atomic on one filesystem).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, data: bytes | str) -> Path:
    """Write `data` to `path` through a temporary file and a rename; returns `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode() if isinstance(data, str) else data
    # A temporary name of its own: shards or runs started in the same second may share a folder.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(raw)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; these files are for reading
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
