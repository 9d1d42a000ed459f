"""Whether a session's first epochs paid for compilation: Triton's and Inductor's caches.

A first epoch holds Triton's JIT compilation and Inductor's codegen when their caches
are empty, and little of either when they are warm, so a first-epoch figure means
something only beside the caches' state. `--cold-caches` points both caches at empty
folders for the session (removed at its end); otherwise the state is read from the
folders the libraries use by default (TRITON_CACHE_DIR or ~/.triton/cache;
TORCHINDUCTOR_CACHE_DIR or the system temp folder's torchinductor_<user>). The folders'
state is the session's; `TritonBuilds` counts what one case's Triton kernels cost: how many
this process compiled and how many it loaded from the cache.
"""

from __future__ import annotations

import getpass
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any


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


class TritonBuilds:
    """While entered, counts the Triton kernels this process compiles and those it loads
    from Triton's on-disk cache, through Triton's compilation listener (chained to any
    listener already set, restored on exit). Compiles in other processes (Inductor's
    compile workers) are not seen; the interpreter compiles nothing. `counts()`: None
    where this Triton has no listener knob."""

    def __init__(self) -> None:
        self.compiled = self.cache_hits = 0
        self.available = False
        self._compilation: Any = None
        self._before: Any = None

    def __enter__(self) -> TritonBuilds:
        try:
            from triton import knobs
        except ImportError:  # no Triton, or one before knobs (3.4)
            return self
        compilation = getattr(knobs, "compilation", None)
        if compilation is None or not hasattr(compilation, "listener"):
            return self
        before = compilation.listener

        def listener(*args: Any, **kwargs: Any) -> None:
            if kwargs.get("cache_hit"):
                self.cache_hits += 1
            else:
                self.compiled += 1
            if before is not None:
                before(*args, **kwargs)

        self._compilation, self._before, self.available = compilation, before, True
        compilation.listener = listener
        return self

    def __exit__(self, *exc: object) -> None:
        if self._compilation is not None:
            self._compilation.listener = self._before
            self._compilation = None

    def counts(self) -> dict[str, int] | None:
        return {"compiled": self.compiled, "cache_hits": self.cache_hits} if self.available else None
