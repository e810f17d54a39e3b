"""The intra-op thread count, as torch.set_num_threads / get_num_threads set and read it: the threads numpy's
OpenBLAS products use (one count for the whole process) and numba's parallel kernels (nnc's compiled ones and the
fused optimizers) launched by the calling thread."""
from __future__ import annotations

import operator
import os

from ._openblas import thread_count_functions

_requested: int | None = None  # the count last set, or None: the libraries' own defaults


def set_num_threads(count: int) -> None:
    """Run OpenBLAS on `count` threads, and numba's parallel kernels of this thread on as many (at most the pool
    numba started with, NUMBA_NUM_THREADS: numba sizes its pool once, at import)."""
    global _requested
    if isinstance(count, bool) or not hasattr(count, "__index__"):
        raise RuntimeError(f"set_num_threads expects an int, but got {type(count).__name__}")
    count = operator.index(count)
    if count <= 0:
        raise RuntimeError("set_num_threads expects a positive integer")
    import numba

    blas = thread_count_functions()
    if blas is not None:
        blas[1](count)
    numba.set_num_threads(min(count, numba.config.NUMBA_NUM_THREADS))
    _requested = count


def get_num_threads() -> int:
    """The count set_num_threads last set; before any, OpenBLAS's (its default follows OPENBLAS_NUM_THREADS or
    OMP_NUM_THREADS, else the cores), or the cores this process may run on."""
    if _requested is not None:
        return _requested
    blas = thread_count_functions()
    if blas is not None:
        return blas[0]()
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
