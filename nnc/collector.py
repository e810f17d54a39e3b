"""Defer the garbage collector's full passes while a compilation runs: they walk numba's whole heap, over and over.

A cold compile builds numba's registries (145,000 objects the collector tracks) and grows the heap as it goes, so
CPython's collector kept starting full (oldest-generation) passes, each walking every object: 8 passes, about 1 s of
a 13-16 s single-process compile of a 2-layer GPT, 0.15 s of a 1 s compile from the disk cache. Within
`full_collections_deferred()` only those passes are held back: the young generations are still collected, so the
short-lived cycles of each kernel's compile are freed as before. Cycles that outlive a young collection wait for the
first full pass after the block (about 50 MB more at peak for that GPT). The caller's thresholds come back when the
outermost block ends, whatever thread it runs on.
"""
from __future__ import annotations

import contextlib
import gc
import threading

_NEVER = 1 << 30  # full passes wait for this many young-generation passes: none within a compile
_lock = threading.Lock()
_depth = 0
_saved: tuple | None = None


@contextlib.contextmanager
def full_collections_deferred():
    """Within the block, the collector runs no full pass (nesting and threads share one deferral)."""
    _enter()
    try:
        yield
    finally:
        _exit()


def _enter() -> None:
    global _depth, _saved
    with _lock:
        if _depth == 0:
            _saved = gc.get_threshold()
            gc.set_threshold(_saved[0], _saved[1], _NEVER)
        _depth += 1


def _exit() -> None:
    global _depth, _saved
    with _lock:
        _depth -= 1
        if _depth == 0:
            current = gc.get_threshold()
            if len(current) == 3 and current[2] == _NEVER:  # unless the program set its own thresholds meanwhile
                gc.set_threshold(current[0], current[1], _saved[2])
            _saved = None
