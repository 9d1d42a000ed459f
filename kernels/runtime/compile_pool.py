"""Triton compiles in forked worker processes, for first-use tuning's compile-ahead.

`precompile` (kernels/plan/launches.py) hands every tuning candidate to Triton's
AsyncCompileMode, which submits one compile closure per kernel to an executor. On a
thread pool those closures share the GIL: on an H100 host with Triton 3.6, eight and
sixteen threads compiled the 111 candidates of the first fp32 configuration in the same
16.8-16.9 s, about 0.15 s a candidate one after another. `CompileExecutor` sends each
closure's compile to a worker process instead: the worker compiles the same source for
the same target and options, which writes Triton's on-disk cache, and the closure itself
then runs here and loads that entry. The key is Triton's own (source, target, options,
cache-invalidating environment), so the closure's result is the kernel Triton would have
compiled itself; a worker that fails costs nothing but time (the closure compiles, or
fails, as it would have).

A closure is sent only where its source, target and options can be read off it (the
free variables `src`, `target`, `options` of JITFunction._do_compile's closure, Triton
3.4 to 3.9) and pickled, and the kernel is a module-level function a worker can look
up; anything else runs on the thread pool as before.

Workers are forked from this process on the first compile and live as long as it does:
they hold every module already imported, so they start in milliseconds. Fresh
interpreters (7bdd1ce, reverted) had to import torch first, sixteen at once 10-25 s on
a GPU host, more than they saved. A forked child must not touch the parent's CUDA
context; a worker runs only Triton's compiler (the target is passed in, so no driver
query) and ptxas, and leaves by os._exit. Where os.fork does not exist the closures run
on threads.

Written by hand: Triton offers the executor hook but no process-based compile outside
torch.compile, and Inductor's pool compiles Inductor's own kernels.
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

from kernels import env

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


def compile_in_worker(module: str, name: str, signature: dict, constants: dict, attrs: dict, target: Any, options: dict) -> str:
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
        self.processes = processes
        if processes > 0:
            try:
                _pool(processes)  # forked here, before this executor starts a thread
            except OSError:  # no process could start: threads only
                self.processes = 0
        self.threads = ThreadPoolExecutor(max(1, threads))

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        task = compile_task(fn) if self.processes > 0 and not args and not kwargs else None
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
    core up to 16; 0 (threads only) on a machine of fewer than four cores or without
    os.fork."""
    if requested is None:
        requested = env.read("LOADBENCH_COMPILE_PROCESSES")
    cores = os.cpu_count() or 1
    if not hasattr(os, "fork"):
        return 0
    if requested is None:
        return min(16, cores) if cores >= 4 else 0
    return max(0, requested)
