"""tests/cuda: CUDA tensors and eager CUDA ops, run as their own pytest invocation under numba's CUDA simulator
(`NUMBA_ENABLE_CUDASIM=1 python -m pytest -q tests/cuda`; the simulator must be on before numba is imported, so the
main run does not collect this folder: see tests/conftest.py). On a machine with a GPU they run on it instead."""
from __future__ import annotations

import os
import sys

if "numba" not in sys.modules:
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

from numba import config, cuda  # noqa: E402

if config.ENABLE_CUDASIM:
    # NOTE: the simulator runs each CUDA thread as a Python thread, and a block's threads meet at every
    # syncthreads(); with Python's default 5 ms switch interval a reduction or matmul launch took ~0.3 s, at 0.1 ms
    # ~0.03 s
    sys.setswitchinterval(1e-4)
elif not cuda.is_available():
    raise RuntimeError("tests/cuda needs numba's CUDA simulator or a GPU: run NUMBA_ENABLE_CUDASIM=1 python -m pytest "
                       "tests/cuda (numba was imported before this conftest without the simulator)")


def pytest_configure(config):
    # simulated kernels compute with numpy scalars, which warn where a GPU silently gives inf or nan (runtime.cuda
    # filters these too, but pytest resets the filters around each test)
    config.addinivalue_line("filterwarnings", r"ignore::RuntimeWarning:runtime\.cuda\.generated")
