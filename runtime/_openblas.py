"""numpy's own OpenBLAS (its wheels bundle it as scipy-openblas), found through ctypes: its cblas symbols for
nnc.codegen.cblas, and its thread count for runtime.set_num_threads and nnc's thread-pool choices."""
from __future__ import annotations

import ctypes
import functools
import glob
import os

import numpy as np

_CBLAS_NAMES = ("sgemm", "dgemm", "sgemv", "dgemv")


@functools.lru_cache(maxsize=None)
def numpy_openblas() -> tuple[ctypes.CDLL, str, bool] | None:
    """(the library, its cblas symbols' name pattern (format with "sgemm" ...), whether its integers are 64-bit),
    or None when numpy's OpenBLAS or those symbols are not found."""
    here = os.path.dirname(np.__file__)
    for path in sorted(glob.glob(os.path.join(here, os.pardir, "numpy.libs", "*openblas*"))):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for pattern, ilp64 in (("scipy_cblas_{}64_", True), ("scipy_cblas_{}", False)):
            if all(hasattr(lib, pattern.format(name)) for name in _CBLAS_NAMES):
                return lib, pattern, ilp64
    return None


@functools.lru_cache(maxsize=None)
def thread_count_functions():
    """(get, set) for OpenBLAS's thread count (one count for the whole process), or None without them."""
    found = numpy_openblas()
    if found is None:
        return None
    lib, _, ilp64 = found
    suffix = "64_" if ilp64 else ""
    get_name, set_name = (f"scipy_openblas_{verb}_num_threads{suffix}" for verb in ("get", "set"))
    if not (hasattr(lib, get_name) and hasattr(lib, set_name)):
        return None
    get, set_ = getattr(lib, get_name), getattr(lib, set_name)
    get.restype, get.argtypes = ctypes.c_int, []
    set_.restype, set_.argtypes = None, [ctypes.c_int]
    return get, set_
