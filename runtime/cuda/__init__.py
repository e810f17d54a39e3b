"""runtime.cuda: torch.cuda's API. CUDA tensors keep their values in numba device arrays (numba-cuda, the `cuda`
extra) and run eager ops as kernels generated from the op table (runtime/cuda/dispatch.py). Without numba-cuda or
a GPU, is_available() is False; NUMBA_ENABLE_CUDASIM=1 (set before numba is imported) runs numba's CUDA simulator.

numba is imported only when CUDA is first asked about, so `import runtime` does not load it.
"""
from __future__ import annotations

import functools

from ..random import Generator


@functools.lru_cache(maxsize=None)
def is_available() -> bool:
    """Whether CUDA tensors can be made: numba-cuda is installed and finds a GPU (or runs its simulator)."""
    try:
        from numba import cuda
    except ImportError:
        return False
    try:
        return bool(cuda.is_available())
    except Exception:  # noqa: BLE001 - a broken driver install means no CUDA, as torch says
        return False


def _require(what: str) -> None:
    if not is_available():
        raise RuntimeError(f"runtime has no CUDA device for {what} (runtime.cuda.is_available() is False: "
                           f"numba-cuda found no GPU; NUMBA_ENABLE_CUDASIM=1 runs numba's CUDA simulator)")


def device_count() -> int:
    if not is_available():
        return 0
    from numba import cuda

    return len(cuda.gpus)


def current_device() -> int:
    _require("current_device()")
    return 0


def set_device(device) -> None:
    _require("set_device()")
    from ..device import check_device

    check_device(device if not isinstance(device, int) else f"cuda:{device}")


def get_device_name(device=None) -> str:
    _require("get_device_name()")
    from numba import cuda

    name = getattr(cuda.get_current_device(), "name", "CUDA simulator")
    return name.decode() if isinstance(name, bytes) else str(name)


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return False


# CUDA tensors' random values are drawn by this generator on the host and copied to the device (so a seed gives
# the same values on every GPU, and under the simulator).
default_generator = Generator()


def manual_seed(seed: int) -> None:
    """Seed the generator that random CUDA tensors are drawn from."""
    default_generator.manual_seed(seed)


manual_seed_all = manual_seed


def synchronize(device=None) -> None:
    """Wait for every kernel launched so far to finish (nothing to wait for without CUDA)."""
    if is_available():
        from numba import cuda

        cuda.synchronize()


def empty_cache() -> None:
    """numba frees device arrays when they are collected; there is no cache to empty."""


def __getattr__(name):
    if name == "amp":  # NOTE: loaded on first use: runtime.amp imports the tensor module, which imports this one
        import importlib

        return importlib.import_module(f"{__name__}.amp")
    raise AttributeError(f"module 'runtime.cuda' has no attribute {name!r}")
