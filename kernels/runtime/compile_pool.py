"""Triton compiles in forked worker processes, for first-use tuning's compile-ahead.

`precompile` (kernels/plan/launches.py) hands every tuning candidate to Triton's
AsyncCompileMode, which submits one compile closure per kernel to an executor.
`CompileExecutor` sends each closure's compile to a worker process forked from this
one (it holds every module already imported), which compiles the same source for the
same target and options into Triton's on-disk cache; the closure then runs here and
loads that entry, so its result is the kernel Triton would have compiled itself. A
worker runs only Triton's compiler, never the parent's CUDA context, and leaves by
os._exit; a worker that fails costs only time. A private-API shim: it reads the free
variables `src`, `target`, `options` of JITFunction._do_compile's closure, only on the
Triton versions of `versions.triton_internals_fit`; elsewhere, for closures it cannot
read and without os.fork, compiles run on threads (the public path). Kept for
first-use tuning (the figure: `ENABLED`; the design: docs/kernels.md).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import pickle
import queue
import struct
import threading
import warnings
from concurrent.futures import Executor
from concurrent.futures import Future
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from typing import Callable

from kernels.ground import env
from kernels.runtime import versions

# Pays off in first-use tuning against threads (docs/measurements.md, kernel-cells).
# False: compiles run on threads only (tests switch it off to check that path).
ENABLED = versions.triton_internals_fit(versions.installed_triton())
_POOL: _Workers | None = None
_LOCK = threading.Lock()


def compile_task(compile_fn: Callable[[], Any]) -> tuple | None:
    """What a worker needs to compile what `compile_fn` (Triton's async compile
    closure) compiles: (module, name, signature, constants, attrs, target, options),
    picklable; None where it cannot be read off the closure."""
    code, cells = getattr(compile_fn, "__code__", None), getattr(compile_fn, "__closure__", None)
    if code is None or not cells:
        return None
    try:
        free = {name: cell.cell_contents for name, cell in zip(code.co_freevars, cells)}
    except ValueError:  # an empty cell
        return None
    src, target, options = free.get("src"), free.get("target"), free.get("options")
    kernel = getattr(getattr(src, "fn", None), "fn", None)  # src.fn: the JITFunction; .fn: its Python function
    if kernel is None or target is None or not hasattr(options, "__dict__"):
        return None
    module, name = getattr(kernel, "__module__", None), getattr(kernel, "__qualname__", "")
    if not module or module == "__main__" or not name.isidentifier():  # a worker could not import it
        return None
    task = (module, name, dict(src.signature), dict(src.constants), dict(src.attrs), target, dict(options.__dict__))
    try:
        pickle.dumps(task)
    except Exception:  # an option or constant of a type a worker cannot receive
        return None
    return task


def compile_in_worker(module: str, name: str, signature: dict, constants: dict, attrs: dict, target: Any,
                      options: dict) -> str:
    """In a worker: compile the kernel `module.name` as the closure would; Triton stores
    it in its cache. Returns the compiled kernel's name (for tests)."""
    import triton
    from triton.compiler import ASTSource

    kernel = getattr(importlib.import_module(module), name)
    compiled = triton.compile(ASTSource(kernel, signature, constants, attrs), target=target, options=options)
    return compiled.name


class _Workers:
    """`processes` forked workers, each fed by a thread of its own from one queue."""

    def __init__(self, processes: int) -> None:
        self.tasks: queue.Queue = queue.Queue()
        self.workers = [_fork_worker() for _ in range(processes)]  # all forked before a feeder thread starts
        for worker in self.workers:
            threading.Thread(target=self._feed, args=worker, daemon=True).start()

    def submit(self, task: tuple) -> Future:
        future: Future = Future()
        self.tasks.put((future, task))
        return future

    def _feed(self, pid: int, to_worker: Any, from_worker: Any) -> None:
        while True:
            item = self.tasks.get()
            if item is None:
                break
            future, task = item
            try:
                _send(to_worker, task)
                status, value = _receive(from_worker)
            except Exception as exc:  # the worker died: its tasks fail, the closures compile here
                future.set_exception(RuntimeError(f"compile worker {pid} gone: {exc}"))
                continue
            if status == "ok":
                future.set_result(value)
            else:
                future.set_exception(RuntimeError(value))
        with contextlib.suppress(Exception):
            to_worker.close()  # the worker reads end of file and exits
            os.waitpid(pid, 0)

    def close(self) -> None:
        for _ in self.workers:
            self.tasks.put(None)


def _fork_worker() -> tuple[int, Any, Any]:
    """A child of this process serving compile tasks over two pipes: (pid, the pipe to
    it, the pipe from it). The child runs nothing but `serve` and leaves by os._exit,
    so neither this process's exit handlers nor its CUDA context run there."""
    task_read, task_write = os.pipe()
    reply_read, reply_write = os.pipe()
    with warnings.catch_warnings():
        # Python 3.12+ warns on fork() beside other threads: the child never takes the
        # locks those threads may hold (CUDA, NVML, the monitor's), only Triton's compiler.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the worker
        status = 0
        try:
            os.close(task_write)
            os.close(reply_read)
            serve(os.fdopen(task_read, "rb"), os.fdopen(reply_write, "wb"))
        except BaseException:
            status = 1
        finally:
            os._exit(status)
    os.close(task_read)
    os.close(reply_write)
    return pid, os.fdopen(task_write, "wb"), os.fdopen(reply_read, "rb")


def _send(pipe: Any, obj: Any) -> None:
    data = pickle.dumps(obj)
    pipe.write(struct.pack("<Q", len(data)) + data)
    pipe.flush()


def _receive(pipe: Any) -> Any:
    head = pipe.read(8)
    if len(head) < 8:
        raise EOFError("pipe closed")
    size = struct.unpack("<Q", head)[0]
    return pickle.loads(pipe.read(size))


def _pool(processes: int) -> _Workers:
    global _POOL
    with _LOCK:
        if _POOL is None:  # forked once: later forks would copy whatever threads then hold
            _POOL = _Workers(processes)
        return _POOL


@atexit.register
def shutdown() -> None:
    """Stop the workers (at exit; tests)."""
    global _POOL
    with _LOCK:
        if _POOL is not None:
            _POOL.close()
        _POOL = None


def serve(source: Any, sink: Any) -> None:
    """A worker's loop: a task in, ("ok", kernel name) or ("error", message) out, until
    the parent closes the pipe."""
    while True:
        try:
            task = _receive(source)
        except EOFError:
            return
        try:
            reply = ("ok", compile_in_worker(*task))
        except Exception as exc:
            reply = ("error", f"{type(exc).__name__}: {exc}")
        _send(sink, reply)


class CompileExecutor(Executor):
    """An executor for AsyncCompileMode: each compile closure's work in a worker
    process where `compile_task` can describe it, then the closure here (a cache hit);
    other callables on `threads` threads."""

    def __init__(self, processes: int, threads: int) -> None:
        self.processes = processes if ENABLED else 0
        if self.processes > 0:
            try:
                _pool(processes)  # forked here, before this executor starts a thread
            except OSError:  # no process could start: threads only
                self.processes = 0
        self.threads = ThreadPoolExecutor(max(1, threads))

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        task = compile_task(fn) if ENABLED and self.processes > 0 and not args and not kwargs else None
        if task is None:
            return self.threads.submit(fn, *args, **kwargs)
        out: Future = Future()

        def finish() -> None:  # here, after the worker: Triton loads what it compiled
            try:
                out.set_result(fn())
            except BaseException as exc:  # the closure's own error, as a thread would raise it
                out.set_exception(exc)

        worker = _pool(self.processes).submit(task)
        worker.add_done_callback(lambda _: self.threads.submit(finish))
        return out

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.threads.shutdown(wait=wait, cancel_futures=cancel_futures)


def processes_for(requested: int | None) -> int:
    """Worker processes for compiling ahead: LOADBENCH_COMPILE_PROCESSES, else one per
    core up to 16; 0 (threads only) on a machine of fewer than four cores, without
    os.fork, or on a Triton the shim is not made for."""
    if requested is None:
        requested = env.read("LOADBENCH_COMPILE_PROCESSES")
    cores = os.cpu_count() or 1
    if not ENABLED or not hasattr(os, "fork"):
        return 0
    if requested is None:
        return min(16, cores) if cores >= 4 else 0
    return max(0, requested)
