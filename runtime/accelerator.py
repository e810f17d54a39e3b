"""runtime.accelerator: torch.accelerator's queries. runtime computes on the CPU, so there is no accelerator."""
from __future__ import annotations


def is_available() -> bool:
    return False


def current_accelerator(check_available: bool = False):
    return None


def device_count() -> int:
    return 0


def current_device_index() -> int:
    raise RuntimeError("runtime has no accelerator (runtime.accelerator.is_available() is False)")


current_device_idx = current_device_index


def set_device_index(device) -> None:
    raise RuntimeError("runtime has no accelerator (runtime.accelerator.is_available() is False)")


set_device_idx = set_device_index


def synchronize(device=None) -> None:
    """Nothing to wait for: runtime's work is done when each call returns."""
