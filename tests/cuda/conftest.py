"""tests/cuda: CUDA tensors and eager CUDA ops, run as their own pytest invocation under numba's CUDA simulator
(`NUMBA_ENABLE_CUDASIM=1 python -m pytest -q tests/cuda`; the simulator must be on before numba is imported, so the
main run does not collect this folder: see tests/conftest.py). On a machine with a GPU they run on it instead."""
from __future__ import annotations

import os
import sys

def _make_shared_arrays_thread_safe() -> None:
    """Guard the simulator's cuda.shared.array with a lock.

    NOTE: numba-cuda's simulator finds a block's shared array by the allocating line with an unlocked get-then-set,
    so two of the block's threads reaching the line together could each create an array of their own: the first
    thread then reduced into an array nobody else wrote, and a reduction's element 0 came out wrong in about one
    run in four of tests/cuda (a simulator race; a GPU has one shared array per block)."""
    import threading

    import numpy as np
    from numba.core import types
    from numba.cuda.simulator import kernelapi
    from numba.np import numpy_support

    unsafe = kernelapi.FakeCUDAShared.array
    lock = threading.Lock()

    def array(self, shape, dtype, alignment=None):
        if alignment is not None or shape == 0:  # errors and dynamic shared memory: no allocation to race on
            return unsafe(self, shape, dtype, alignment)
        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        caller = sys._getframe(1)
        key = (caller.f_code.co_filename, caller.f_lineno)  # as the simulator keys them
        with lock:
            found = self._allocations.get(key)
            if found is None:
                found = self._allocations[key] = np.empty(shape, dtype)
        return found

    kernelapi.FakeCUDAShared.array = array


if "numba" not in sys.modules:
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

from numba import config, cuda  # noqa: E402

if config.ENABLE_CUDASIM:
    # NOTE: the simulator runs each CUDA thread as a Python thread, and a block's threads meet at every
    # syncthreads(); with Python's default 5 ms switch interval a reduction or matmul launch took ~0.3 s, at 0.1 ms
    # ~0.03 s
    sys.setswitchinterval(1e-4)
    _make_shared_arrays_thread_safe()
elif not cuda.is_available():
    raise RuntimeError("tests/cuda needs numba's CUDA simulator or a GPU: run NUMBA_ENABLE_CUDASIM=1 python -m pytest "
                       "tests/cuda (numba was imported before this conftest without the simulator)")


def pytest_configure(config):
    # simulated kernels compute with numpy scalars, which warn where a GPU silently gives inf or nan (runtime.cuda
    # filters these too, but pytest resets the filters around each test)
    config.addinivalue_line("filterwarnings", r"ignore::RuntimeWarning:runtime\.cuda\.generated")
