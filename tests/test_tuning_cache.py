"""The per-user tuning cache (kernels/plan/tuning_cache.py) on CPU: the mode, where the
file lives, what its key holds, and that writes are whole and lose nothing."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from kernels.plan import tuning_cache
from kernels.plan.tuning_cache import TuningCache
from kernels.plan.tuning_cache import cache_dir
from kernels.plan.tuning_cache import cache_key
from kernels.plan.tuning_cache import tune_mode_from_env
from tests.plans import CONFIG

pytestmark = pytest.mark.usefixtures("launches")  # an empty cache of its own, no plans left behind


def test_tune_mode_parsing() -> None:
    assert tune_mode_from_env(None) == "cache" and tune_mode_from_env("") == "cache"
    assert [tune_mode_from_env(v) for v in ("off", "cache", "always")] == ["off", "cache", "always"]
    with pytest.raises(ValueError, match="LOADBENCH_TUNE='fast': use one of off, cache, always"):
        tune_mode_from_env("fast")


# ------------------------------------------------------------------- the store


def test_cache_directory_per_platform(tmp_path) -> None:
    home = str(tmp_path)
    assert cache_dir({"LOADBENCH_CACHE_DIR": "/x/y", "HOME": home}, "linux") == Path("/x/y")
    assert cache_dir({"XDG_CACHE_HOME": "/xdg", "HOME": home}, "linux") == Path("/xdg/mlp-loadbench")
    assert cache_dir({"HOME": home}, "linux") == tmp_path / ".cache" / "mlp-loadbench"
    assert cache_dir({"HOME": home}, "darwin") == tmp_path / "Library" / "Caches" / "mlp-loadbench"
    assert cache_dir({"HOME": home, "LOCALAPPDATA": "/appdata"}, "win32") == Path("/appdata/mlp-loadbench")


def test_the_key_holds_gpu_and_versions_and_groups_stay_apart(tmp_path) -> None:
    key = cache_key("NVIDIA H100 80GB HBM3", "3.6.0", "2.11.0+cu130")
    assert key == "NVIDIA H100 80GB HBM3 | triton 3.6.0 | torch 2.11.0+cu130"
    TuningCache(tmp_path, key).put("fwd:float32:64:64:64", {"config": CONFIG})
    newer_torch = cache_key("NVIDIA H100 80GB HBM3", "3.6.0", "2.13.0")
    assert TuningCache(tmp_path, newer_torch).get("fwd:float32:64:64:64") is None  # a new build re-tunes
    TuningCache(tmp_path, newer_torch).put("fwd:float32:64:64:64", {"config": {**CONFIG, "block_r": 32}})
    groups = json.loads((tmp_path / tuning_cache.FILE_NAME).read_text())["groups"]
    assert groups[key]["fwd:float32:64:64:64"]["config"]["block_r"] == 16
    assert groups[newer_torch]["fwd:float32:64:64:64"]["config"]["block_r"] == 32


def test_writes_replace_the_file_whole_and_leave_no_temporary(tmp_path, monkeypatch) -> None:
    cache = TuningCache(tmp_path, "k")
    cache.put("a", {"config": CONFIG})
    before = (tmp_path / tuning_cache.FILE_NAME).read_text()

    def broken_dump(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(tuning_cache.json, "dump", broken_dump)
    with pytest.raises(OSError, match="disk full"):
        cache.put("b", {"config": CONFIG})
    assert (tmp_path / tuning_cache.FILE_NAME).read_text() == before  # the old file, untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == [tuning_cache.FILE_NAME, tuning_cache.FILE_NAME + ".lock"]


def _writer(directory: str, prefix: str, count: int, start) -> None:  # type: ignore[no-untyped-def]
    """A child process: add `count` entries one by one, as a tuning shard would."""
    start.wait()
    cache = TuningCache(directory, "GPU X | triton 3 | torch 2")
    for i in range(count):
        cache.put(f"{prefix}:{i}", {"config": CONFIG, "ms": float(i)})


def test_two_processes_writing_at_once_lose_no_entry(tmp_path) -> None:
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    writers = [ctx.Process(target=_writer, args=(str(tmp_path), prefix, 20, start)) for prefix in ("a", "b")]
    for p in writers:
        p.start()
    start.set()
    for p in writers:
        p.join(120)
        assert p.exitcode == 0
    entries = TuningCache(tmp_path, "GPU X | triton 3 | torch 2").entries()
    assert sorted(entries) == sorted(f"{p}:{i}" for p in "ab" for i in range(20))


@pytest.mark.parametrize("content", ["{not json", "[]", '{"format": 99, "groups": {}}',
                                     '{"format": 1, "groups": {"k": 3}}'])
def test_a_corrupt_cache_file_is_ignored_with_one_warning(tmp_path, content) -> None:
    (tmp_path / tuning_cache.FILE_NAME).write_text(content)
    cache = TuningCache(tmp_path, "k")
    with pytest.warns(UserWarning, match="ignoring it") as caught:
        assert cache.get("a") is None
        cache._read_groups()  # read again: no second warning
    assert len(caught) == 1
    cache.put("a", {"config": CONFIG})  # the next write replaces it with a good file
    assert TuningCache(tmp_path, "k").get("a") == {"config": CONFIG}
