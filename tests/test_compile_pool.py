"""Compiling ahead in forked worker processes (kernels/runtime/compile_pool.py), on CPU: Triton
compiles for an sm_90 target without a GPU, so a worker's compile and the cache hit
after it run here as they do on a GPU host. The suite runs Triton's interpreter
(conftest.py), and a process that has imported Triton for its interpreter cannot
compile, nor can its forks: the pool's tests run in a fresh interpreter with the
interpreter off (`run_pool_script`), whose closures, shaped like Triton's, report what
the workers left in the cache instead of compiling it again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

from kernels.runtime import compile_pool
from kernels.ops import linear_act

ROOT = Path(__file__).resolve().parents[1]
TARGET = GPUTarget("cuda", 90, 32)
SPLIT_SUM = JITFunction(getattr(linear_act._split_sum_kernel, "fn", linear_act._split_sum_kernel))
SIGNATURE = {"ws_ptr": "*fp32", "dw_ptr": "*fp32", "db_ptr": "*fp32", "S": "i32", "N": "i32", "K": "i32",
             "stride_split": "i32", "stride_wn": "i32", "stride_wk": "i32", "BLOCK": "constexpr"}


def triton_closure(src, target, options, body=None):
    """The shape of JITFunction._do_compile's async closure (src, target, options free);
    its body is `body`, since this process cannot compile."""

    def async_compile():
        return body() if body is not None else (src, target, options)

    return async_compile


def split_sum_closure(block: int = 128, body=None):
    src = ASTSource(SPLIT_SUM, SIGNATURE, {"BLOCK": block})
    return triton_closure(src, TARGET, types.SimpleNamespace(num_warps=4, num_stages=1), body)


def cubins(directory):
    return sorted(path.name for path in directory.rglob("*.cubin"))


def test_a_triton_closure_becomes_a_task_a_worker_can_import():
    module, name, signature, constants, attrs, target, options = compile_pool.compile_task(split_sum_closure())
    assert (module, name) == ("kernels.ops.linear_act", "_split_sum_kernel")
    assert signature == SIGNATURE and list(constants.values()) == [128] and target == TARGET
    assert options == {"num_warps": 4, "num_stages": 1}


def test_what_a_worker_cannot_import_or_receive_is_not_a_task():
    assert compile_pool.compile_task(lambda: None) is None  # no closure
    here = 1
    assert compile_pool.compile_task(lambda: here) is None  # a closure without src/target/options

    @triton.jit
    def local_kernel(x_ptr):  # defined in a function: no module-level name to import
        pass

    src = ASTSource(local_kernel, {"x_ptr": "*fp32"}, {})
    assert compile_pool.compile_task(triton_closure(src, TARGET, types.SimpleNamespace())) is None
    unpicklable = types.SimpleNamespace(hook=lambda: None)
    src = ASTSource(SPLIT_SUM, SIGNATURE, {"BLOCK": 128})
    assert compile_pool.compile_task(triton_closure(src, TARGET, unpicklable)) is None


# Run in a fresh interpreter without TRITON_INTERPRET; prints one JSON line of results.
POOL_SCRIPT = r"""
import json, os, sys, types
from pathlib import Path
sys.path[:0] = [os.environ["LOADBENCH_ROOT"], os.environ["LOADBENCH_TESTS"]]
from test_compile_pool import split_sum_closure, cubins
from kernels.runtime import compile_pool
cache = Path(os.environ["TRITON_CACHE_DIR"])
out = {}
with compile_pool.CompileExecutor(processes=1, threads=1) as executor:
    # the closure runs after the worker's compile and sees its cubin
    out["seen"] = executor.submit(split_sum_closure(256, body=lambda: cubins(cache))).result(timeout=300)
    workers = compile_pool._POOL.workers
    out["workers"] = len(workers)
    out["forked"] = all(pid != os.getpid() for pid, _, _ in workers)

    def compile_here():  # BLOCK 100 is not a power of two: the worker's compile failed
        raise RuntimeError(f"compile failed; cache holds {cubins(cache)}")

    try:
        executor.submit(split_sum_closure(100, body=compile_here)).result(timeout=300)
    except RuntimeError as exc:
        out["failed"] = str(exc)
    os.kill(workers[0][0], 9)  # a worker that dies: the closure still runs, here
    os.waitpid(workers[0][0], 0)
    out["after_death"] = executor.submit(split_sum_closure(64, body=lambda: "ran here")).result(timeout=300)
compile_pool.shutdown()
out["pool_after_shutdown"] = compile_pool._POOL is None
print(json.dumps(out))
"""


def run_pool_script(tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "triton"), LOADBENCH_ROOT=str(ROOT), LOADBENCH_TESTS=str(ROOT / "tests"))
    done = subprocess.run([sys.executable, "-c", POOL_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="compile workers are forked")
def test_forked_workers_compile_before_the_closures_run(tmp_path):
    got = run_pool_script(tmp_path)
    assert got["seen"] == ["_split_sum_kernel.cubin"] and got["workers"] == 1 and got["forked"]
    assert got["failed"] == "compile failed; cache holds ['_split_sum_kernel.cubin']"  # nothing new from BLOCK 100
    assert got["after_death"] == "ran here"
    assert got["pool_after_shutdown"]


def test_other_callables_and_threads_only_run_on_threads():
    compile_pool.shutdown()
    with compile_pool.CompileExecutor(processes=0, threads=1) as executor:
        assert executor.submit(lambda a, b: a + b, 2, 3).result() == 5
        assert executor.submit(split_sum_closure(64, body=lambda: "ran here")).result() == "ran here"
    assert compile_pool._POOL is None  # nothing forked


def test_compile_processes_from_the_environment(monkeypatch):
    monkeypatch.setenv("LOADBENCH_COMPILE_PROCESSES", "3")
    assert compile_pool.processes_for(None) == 3
    monkeypatch.setenv("LOADBENCH_COMPILE_PROCESSES", "0")
    assert compile_pool.processes_for(None) == 0
    monkeypatch.setenv("LOADBENCH_COMPILE_PROCESSES", "many")
    with pytest.raises(ValueError, match="LOADBENCH_COMPILE_PROCESSES='many'"):
        compile_pool.processes_for(None)
    monkeypatch.delenv("LOADBENCH_COMPILE_PROCESSES")
    monkeypatch.setattr(compile_pool.os, "cpu_count", lambda: 2)
    assert compile_pool.processes_for(None) == 0  # a small machine compiles on threads
    monkeypatch.setattr(compile_pool.os, "cpu_count", lambda: 64)
    assert compile_pool.processes_for(None) == 16
    monkeypatch.delattr(compile_pool.os, "fork")
    assert compile_pool.processes_for(None) == 0  # no fork (Windows): threads


def test_with_the_shim_off_compiles_run_on_threads_and_nothing_is_forked(monkeypatch):
    compile_pool.shutdown()
    monkeypatch.setattr(compile_pool, "ENABLED", False)
    monkeypatch.setenv("LOADBENCH_COMPILE_PROCESSES", "3")
    assert compile_pool.processes_for(None) == 0
    with compile_pool.CompileExecutor(processes=2, threads=1) as executor:
        assert executor.processes == 0
        assert executor.submit(split_sum_closure(64, body=lambda: "ran here")).result() == "ran here"
    assert compile_pool._POOL is None
