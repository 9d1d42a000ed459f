"""Triton compiles in worker processes, for first-use tuning's compile-ahead.

`precompile` (kernels/launches.py) hands every tuning candidate to Triton's
AsyncCompileMode, which submits one compile closure per kernel to an executor. On a
thread pool those closures share the GIL: on an H100 host with Triton 3.6, eight and
sixteen threads compiled the 111 candidates of the first fp32 configuration in the same
16.8-16.9 s, about 0.15 s a candidate one after another. `CompileExecutor` sends each
closure's compile to a process instead: the worker compiles the same source for the same
target and options, which writes Triton's on-disk cache, and the closure itself then
runs here and loads that entry. The key is Triton's own (source, target, options,
cache-invalidating environment), so the closure's result is the kernel Triton would have
compiled itself; a worker that fails costs nothing but time (the closure compiles, or
fails, as it would have).

A closure is sent only where its source, target and options can be read off it (the
free variables `src`, `target`, `options` of JITFunction._do_compile's closure, Triton
3.4 to 3.9) and pickled, and the kernel is a module-level function a worker can import;
anything else runs on the thread pool as before. Workers are fresh interpreters
(`python -m kernels.compile_pool`, tasks and replies pickled over their pipes), not
multiprocessing children: a CUDA context must not be forked, and a spawned child would
first re-run the caller's main script. They start on the first compile, live for the
process, and import the kernel's module once (torch with it: a few seconds, once).

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
import subprocess
import sys
import threading
from concurrent.futures import Executor
from concurrent.futures import Future
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from typing import Callable

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
    """`processes` worker interpreters, each fed by a thread of its own from one queue."""

    def __init__(self, processes: int) -> None:
        self.size = processes
        self.tasks: queue.Queue = queue.Queue()
        paths = [p for p in sys.path if p]  # the parent's, pytest's rootdir included
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
        self.procs = [
            subprocess.Popen([sys.executable, "-m", "kernels.compile_pool"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, env=env)  # fmt: skip
            for _ in range(processes)
        ]
        for proc in self.procs:
            threading.Thread(target=self._feed, args=(proc,), daemon=True).start()

    def submit(self, task: tuple) -> Future:
        future: Future = Future()
        self.tasks.put((future, task))
        return future

    def _feed(self, proc: subprocess.Popen) -> None:
        while True:
            item = self.tasks.get()
            if item is None:
                break
            future, task = item
            try:
                _send(proc.stdin, task)
                status, value = _receive(proc.stdout)
            except Exception as exc:  # the worker died: its tasks fail, the closures compile here
                future.set_exception(RuntimeError(f"compile worker {proc.pid} gone: {exc}"))
                continue
            if status == "ok":
                future.set_result(value)
            else:
                future.set_exception(RuntimeError(value))
        with contextlib.suppress(Exception):
            proc.stdin.close()
            proc.wait(timeout=10)

    def close(self) -> None:
        for _ in self.procs:
            self.tasks.put(None)


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
        if _POOL is None or _POOL.size < processes:
            if _POOL is not None:
                _POOL.close()
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


def serve() -> None:
    """A worker's loop: a task in, ("ok", kernel name) or ("error", message) out, until
    the parent closes the pipe."""
    source = sys.stdin.buffer
    sink = os.fdopen(os.dup(1), "wb")  # the replies' own descriptor; whatever else writes to
    os.dup2(2, 1)  # standard output (Triton, ptxas, the kernels' modules) goes to stderr
    sys.stdout = sys.stderr
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

        try:
            worker = _pool(self.processes).submit(task)
        except OSError:  # no worker could start here
            return self.threads.submit(fn)
        worker.add_done_callback(lambda _: self.threads.submit(finish))
        return out

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.threads.shutdown(wait=wait, cancel_futures=cancel_futures)


def processes_for(requested: int | None) -> int:
    """Worker processes for compiling ahead: LOADBENCH_COMPILE_PROCESSES, else one per
    core up to 16; 0 (threads only) on a machine of fewer than four cores."""
    if requested is None:
        env = os.environ.get("LOADBENCH_COMPILE_PROCESSES")
        if env not in (None, ""):
            try:
                requested = int(env)
            except ValueError:
                raise ValueError(f"LOADBENCH_COMPILE_PROCESSES={env!r}: expected a whole number of processes") from None
    cores = os.cpu_count() or 1
    if requested is None:
        return min(16, cores) if cores >= 4 else 0
    return max(0, requested)


if __name__ == "__main__":
    serve()
