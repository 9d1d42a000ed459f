"""Compiling ahead in worker processes (kernels/compile_pool.py), on CPU: Triton compiles
for an sm_90 target without a GPU, so a worker's compile and the cache hit after it run
here as they do on a GPU host. The suite runs Triton's interpreter (conftest.py), so
nothing compiles in this process: the workers start with the interpreter off, and the
closures here, shaped like Triton's, report what the workers left in the cache instead
of compiling it again."""

from __future__ import annotations

import types

import pytest
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

from kernels import compile_pool
from kernels import linear_act

TARGET = GPUTarget("cuda", 90, 32)
SPLIT_SUM = JITFunction(getattr(linear_act._split_sum_kernel, "fn", linear_act._split_sum_kernel))
SIGNATURE = {"ws_ptr": "*fp32", "dw_ptr": "*fp32", "db_ptr": "*fp32", "S": "i32", "N": "i32", "K": "i32",
             "stride_split": "i32", "stride_wn": "i32", "stride_wk": "i32", "BLOCK": "constexpr"}  # fmt: skip


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


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # for the workers: import the kernels compiled
    yield tmp_path / "triton"
    compile_pool.shutdown()  # workers keep the cache directory they started with


def test_a_triton_closure_becomes_a_task_a_worker_can_import():
    module, name, signature, constants, attrs, target, options = compile_pool.compile_task(split_sum_closure())
    assert (module, name) == ("kernels.linear_act", "_split_sum_kernel")
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


def test_a_worker_compiles_before_the_closure_runs(cache_dir):
    with compile_pool.CompileExecutor(processes=1, threads=1) as executor:
        seen = executor.submit(split_sum_closure(256, body=lambda: cubins(cache_dir))).result(timeout=300)
    assert seen == ["_split_sum_kernel.cubin"]  # the closure ran after the worker's compile
    assert compile_pool._POOL is not None


def test_other_callables_and_threads_only_run_on_threads(cache_dir):
    with compile_pool.CompileExecutor(processes=0, threads=1) as executor:
        assert executor.submit(lambda a, b: a + b, 2, 3).result() == 5
        assert executor.submit(split_sum_closure(64, body=lambda: cubins(cache_dir))).result() == []
    assert compile_pool._POOL is None


def test_a_failed_compile_in_a_worker_leaves_the_closure_to_raise(cache_dir):
    def compile_here():
        raise RuntimeError(f"compile failed; cache holds {cubins(cache_dir)}")

    with compile_pool.CompileExecutor(processes=1, threads=1) as executor:
        future = executor.submit(split_sum_closure(100, body=compile_here))  # BLOCK not a power of two
        with pytest.raises(RuntimeError, match=r"compile failed; cache holds \[\]"):
            future.result(timeout=300)


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
