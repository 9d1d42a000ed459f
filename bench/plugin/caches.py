"""Whether a session's first epochs paid for compilation: Triton's and Inductor's caches.

A first epoch holds Triton's JIT compilation and Inductor's codegen when their caches
are empty, and little of either when they are warm, so a first-epoch figure means
something only beside the caches' state. `--cold-caches` points both caches at empty
folders for the session (removed at its end); otherwise the state is read from the
folders the libraries use by default (TRITON_CACHE_DIR or ~/.triton/cache;
TORCHINDUCTOR_CACHE_DIR or the system temp folder's torchinductor_<user>).
"""

from __future__ import annotations

import getpass
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path


def _has_files(folder: Path) -> bool:
    return folder.is_dir() and any(folder.iterdir())


def triton_cache_dir() -> Path:
    return Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")


def inductor_cache_dir() -> Path:
    default = Path(tempfile.gettempdir()) / f"torchinductor_{getpass.getuser()}"
    return Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or default)


@dataclass
class KernelCaches:
    state: str  # 'cold (emptied for this session)', 'warm' or 'empty'
    scratch: Path | None = None  # the session's own empty caches, removed at the end
    saved_env: dict[str, str | None] | None = None

    @classmethod
    def for_session(cls, cold: bool) -> KernelCaches:
        if not cold:
            warm = _has_files(triton_cache_dir()) or _has_files(inductor_cache_dir())
            return cls("warm" if warm else "empty")
        scratch = Path(tempfile.mkdtemp(prefix="loadbench-caches-"))
        saved = {name: os.environ.get(name) for name in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")}
        os.environ["TRITON_CACHE_DIR"] = str(scratch / "triton")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(scratch / "inductor")
        return cls("cold (emptied for this session)", scratch, saved)

    def close(self) -> None:
        if self.scratch is None:
            return
        for name, value in (self.saved_env or {}).items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(self.scratch, ignore_errors=True)
        self.scratch = None
