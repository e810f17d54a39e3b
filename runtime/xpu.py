"""runtime.xpu: torch.xpu's queries, answered for runtime, which has no Intel GPU backend (scripts probe it before
choosing a device)."""
from __future__ import annotations


def is_available() -> bool:
    return False


def device_count() -> int:
    return 0


def is_initialized() -> bool:
    return False
