"""Compile a compilation's new kernels in parallel: helper processes fill numba's disk cache while this process
compiles too, then this process loads theirs from that cache.

numba compiles one function at a time per process (a global lock, and most of the work holds the GIL), so a cold
compile of a model with many kernels runs on one core. `precompile(kernels)` runs before a compilation's plans are
generated: it generates every kernel's source and queues those numba has not compiled to disk yet. This process then
compiles them in plan order, from the front of the queue, while each helper process (`python -m
nnc.codegen.compile_workers`, kept for the life of this process) takes one module at a time from the back. Whoever
comes first takes a module, so the work splits by what each side gets done, not by a count fixed in advance:
`wait_for(source)` (called by codegen.cpu before compiling a module) takes a module no helper has started out of the
queue (this process compiles it), or waits until the helper working on it is done, so numba loads it from the disk
cache instead of compiling it again.

A helper is a fresh interpreter running only this module (never the user's script, which multiprocessing's spawn
would import again), reads jobs as JSON lines on stdin and answers each with one line when its module is in the cache
or it gave up. Whatever a helper fails at, this process compiles itself, so the outcome (a kernel, or a fallback to
the interpreter with its warning) never depends on the helpers. Helpers write into the directory `cache.cache_dir()`
checked for this process (docs/security.md): they are this user's processes.

`$NNC_COMPILE_WORKERS` sets how many helpers may run (default: one fewer than the cores, at most 4; 0 turns this
off). Fewer than MIN_NEW_KERNELS new kernels compile here alone: a helper's start (about a second) would not pay.
"""
from __future__ import annotations

import atexit
import collections
import gc
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np

from . import cache

ENV_VAR = "NNC_COMPILE_WORKERS"
MAX_WORKERS = 4
MIN_NEW_KERNELS = 4
EARLY_START_OPS = 16  # see start_early
_WAIT_S = 600.0  # a helper that takes longer than this on one module is given up on: this process compiles it
SIZE = "size"    # a size symbol's argument type (codegen.cpu.SIZE)

_lock = threading.Lock()
_pending: dict[str, threading.Event] = {}  # source digest -> set once a helper is done with it (or gone)
_queue: collections.deque = collections.deque()  # (digest, job line) no helper has taken yet; helpers take the last
_workers: list["_Worker"] = []


def worker_count() -> int:
    """How many helper processes may run ($NNC_COMPILE_WORKERS, default min(cores - 1, MAX_WORKERS))."""
    value = os.environ.get(ENV_VAR)
    if value is not None:
        try:
            return max(0, int(value))
        except ValueError:
            pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(0, min(cores - 1, MAX_WORKERS))


def precompile(generated: list) -> int:
    """Queue the modules of `generated` (codegen.cpu.Generated, in the order they will be compiled) that numba has
    not compiled to disk, for this process from the front and helper processes from the back (the first stays
    this process's); returns how many were queued."""
    count = worker_count()
    new = _not_on_disk(generated)
    if count == 0 or len(new) < MIN_NEW_KERNELS:
        return 0
    directory = str(cache.cache_dir())
    with _lock:
        for g in new[1:]:
            key = cache.digest(g.source)
            _pending[key] = threading.Event()
            _queue.append((key, json.dumps({"digest": key, "dir": directory, "source": g.source,
                                            "libraries": g.libraries,
                                            "signatures": {f: [_encode(d) for d in ds]
                                                           for f, ds in g.signatures.items()}})))
    for k in range(count):
        worker = _worker(k)
        if worker is None:
            break
        worker.feed()
    return len(new) - 1


def start_early(fingerprint: str, ops: int) -> None:
    """Start the helpers at the beginning of a compilation of `ops` traced operations (counted twice with a
    backward) that has not finished with this cache before (its kernels are then likely new), so that their start
    (about 1.3 s: imports and numba's setup) overlaps the passes instead of delaying the first module they take.
    A compilation seen before starts none: a helper starting beside a 2-layer GPT's disk-cache compile slowed it
    from 1.05-1.10 s to 1.49-1.60 s on 2 cores. Nor does a small one (fewer than EARLY_START_OPS operations): its
    few kernels would not repay a helper's start, and precompile still starts one if MIN_NEW_KERNELS are new."""
    count = worker_count()
    if count == 0 or ops < EARLY_START_OPS or cache.seen(fingerprint):
        return
    for k in range(count):
        if _worker(k) is None:
            break


def wait_for(source: str) -> None:
    """Return once no helper is working on `source`'s module: at once when none was asked to or none has started
    it (it leaves the queue: this process compiles it), else when the helper is done."""
    if not _pending:
        return
    key = cache.digest(source)
    with _lock:
        event = _pending.get(key)
        queued = [job for job in _queue if job[0] == key]
        for job in queued:
            _queue.remove(job)
        if queued:
            _pending.pop(key, None)
            return
    if event is not None:
        event.wait(_WAIT_S)
        with _lock:
            _pending.pop(key, None)


def _not_on_disk(generated: list) -> list:
    """The distinct modules among `generated` some function of which numba has neither in memory nor on disk."""
    out, seen = [], set()
    for g in generated:
        key = cache.digest(g.source)
        if key in seen:
            continue
        seen.add(key)
        with _lock:
            if key in _pending:
                continue
        if not _compiled(g):
            out.append(g)
    return out


def _compiled(g) -> bool:
    """Whether every numba function of g's module is compiled in memory or has an index in numba's disk cache.

    A function without a disk cache (numba's NullCache) counts as compiled: a helper's work could not reach it."""
    module, _, _ = cache.load_module(g.source)  # executes the module: defines its dispatchers, compiles nothing
    for fname in g.signatures:
        dispatcher = getattr(module, fname)
        if dispatcher.overloads:
            continue
        index = getattr(getattr(dispatcher._cache, "_cache_file", None), "_index_path", None)
        if index is None or not Path(index).exists():
            return False
    return True


class _Worker:
    """One helper process and the thread that reads its answers."""

    def __init__(self):
        root = str(Path(__file__).resolve().parents[2])  # the directory holding the nnc package
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([root] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
        env[ENV_VAR] = "0"
        self.process = subprocess.Popen([sys.executable, "-m", "nnc.codegen.compile_workers"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True,
                                        bufsize=1)
        self.jobs: set[str] = set()
        self.reader = threading.Thread(target=self._read, name="nnc-compile-worker", daemon=True)
        self.reader.start()

    def alive(self) -> bool:
        return self.process.poll() is None

    def feed(self) -> None:
        """Hand this helper the last queued module when it has none (one at a time, so the rest stay takeable)."""
        with _lock:
            if self.jobs or not _queue:
                return
            key, line = _queue.pop()
            self.jobs.add(key)
        try:
            self.process.stdin.write(line + "\n")
            self.process.stdin.flush()
        except (OSError, ValueError):  # the helper is gone: this process compiles it
            self._release_all()

    def _read(self) -> None:
        for line in self.process.stdout:
            try:
                key = json.loads(line)["digest"]
            except (ValueError, KeyError, TypeError):
                continue
            self._release(key)
            self.feed()
        self._release_all()

    def _release(self, key: str) -> None:
        """The helper is done with `key`'s module (or gone): its waiters wake, and later callers need not wait."""
        with _lock:
            self.jobs.discard(key)
            event = _pending.pop(key, None)
        if event is not None:
            event.set()

    def _release_all(self) -> None:
        for key in list(self.jobs):
            self._release(key)

    def stop(self) -> None:
        try:
            self.process.stdin.close()
            self.process.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
        self.reader.join(timeout=5)
        self.process.stdout.close()


def _worker(k: int) -> _Worker | None:
    """The k-th helper, started if needed; None when it cannot start."""
    with _lock:
        while len(_workers) <= k:
            _workers.append(None)
        worker = _workers[k]
        if worker is not None and worker.alive():
            return worker
        try:
            worker = _workers[k] = _Worker()
        except OSError:
            return None
    return worker


@atexit.register
def _stop_workers() -> None:
    for worker in _workers:
        if worker is not None:
            worker.stop()


def _encode(d) -> str:
    return SIZE if isinstance(d, str) and d == SIZE else np.dtype(d).str


def _numba_types(encoded: list):
    from numba import types
    from numba.np.numpy_support import from_dtype

    return tuple(types.int64 if e == SIZE else types.Array(from_dtype(np.dtype(e)), 1, "C") for e in encoded)


def _serve(lines, answer) -> None:
    """The helper's loop: compile each job's module into the disk cache, then answer with its digest."""
    for line in lines:
        job = json.loads(line)
        os.environ[cache.ENV_VAR] = job["dir"]
        try:
            for library in job.get("libraries", []):
                cache.library(library)
            module, path, _ = cache.load_module(job["source"])
            with cache.compiling(path):
                for fname, encoded in job["signatures"].items():
                    getattr(module, fname).compile(_numba_types(encoded))
        except Exception:  # noqa: BLE001  the parent compiles it again and reports the error itself
            pass
        answer(json.dumps({"digest": job["digest"]}))


def _set_up_numba() -> None:
    """numba's registries (and the scipy they import), loaded by the first compile otherwise: done while the
    parent's compilation reaches its kernels. They live as long as this process, so they are frozen out of the
    garbage collector's passes (gc.freeze), which would otherwise walk them again and again (see nnc/collector.py)."""
    from numba.core.registry import cpu_target

    cpu_target.target_context.refresh()
    cpu_target.typing_context.refresh()
    gc.freeze()


if __name__ == "__main__":
    _set_up_numba()

    def _answer(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    _serve(sys.stdin, _answer)
