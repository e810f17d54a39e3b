"""runtime.cpu as torch.cpu: the CPU as a device module (available, one device, synchronous) and its deprecated amp
namespace (`torch.cpu.amp.autocast`, which older training scripts still use)."""
from __future__ import annotations

from . import amp  # noqa: F401

__all__ = ["amp", "current_device", "device_count", "is_available", "is_initialized", "set_device", "synchronize"]


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def device_count() -> int:
    return 1


def current_device() -> str:
    return "cpu"


def set_device(device) -> None:
    """There is one CPU device: nothing to select (torch.cpu.set_device does nothing either)."""


def synchronize(device=None) -> None:
    """CPU ops finish before they return: nothing to wait for."""
