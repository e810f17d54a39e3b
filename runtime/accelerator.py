"""runtime.accelerator: torch.accelerator's queries. The one accelerator runtime knows is CUDA (runtime.cuda)."""
from __future__ import annotations

from . import cuda


def is_available() -> bool:
    return cuda.is_available()


def current_accelerator(check_available: bool = False):
    from .device import CUDA

    return CUDA if cuda.is_available() else None


def device_count() -> int:
    return cuda.device_count()


def current_device_index() -> int:
    if cuda.is_available():
        return 0
    raise RuntimeError("runtime has no accelerator (runtime.accelerator.is_available() is False)")


current_device_idx = current_device_index


def set_device_index(device) -> None:
    if not cuda.is_available():
        raise RuntimeError("runtime has no accelerator (runtime.accelerator.is_available() is False)")
    cuda.set_device(device)


set_device_idx = set_device_index


def synchronize(device=None) -> None:
    """Wait for the CUDA device's kernels (CPU work is done when each call returns)."""
    cuda.synchronize()
