"""torch.nn.attention: the backends scaled_dot_product_attention may use, and `sdpa_kernel` to restrict them.

runtime has one implementation, the math one (softmax(q k^T * scale + mask) v); it also stands for the fused CPU
kernel (FLASH_ATTENTION), whose results torch's math kernel reproduces. The other backends are CUDA kernels, so
restricting SDPA to them leaves no backend, and scaled_dot_product_attention raises torch's error.
"""
from __future__ import annotations

import contextlib
import enum

__all__ = ["SDPBackend", "sdpa_kernel"]


class SDPBackend(enum.IntEnum):
    ERROR = -1
    MATH = 0
    FLASH_ATTENTION = 1
    EFFICIENT_ATTENTION = 2
    CUDNN_ATTENTION = 3
    OVERRIDEABLE = 4


_RUNTIME_BACKENDS = frozenset({SDPBackend.MATH, SDPBackend.FLASH_ATTENTION})
_ALL = frozenset(b for b in SDPBackend if b is not SDPBackend.ERROR)
_enabled: list[frozenset] = [_ALL]  # the backends sdpa_kernel allows now (process-wide, as torch's flags)


@contextlib.contextmanager
def sdpa_kernel(backends, set_priority: bool = False):
    """Within the block, scaled_dot_product_attention may use only `backends` (an SDPBackend or a list of them)."""
    listed = [backends] if isinstance(backends, SDPBackend) else backends
    if not isinstance(listed, (list, tuple, set)) or not all(isinstance(b, SDPBackend) for b in listed):
        raise AssertionError(f"Backend must be an instance of SDPBackend or a list of SDPBackend instances, got "
                             f"{type(backends).__name__}")
    previous = _enabled[0]
    _enabled[0] = frozenset(listed)
    try:
        yield {}
    finally:
        _enabled[0] = previous


def check_usable() -> None:
    """Raise torch's error when sdpa_kernel has turned off every backend runtime implements."""
    if not _enabled[0] & _RUNTIME_BACKENDS:
        raise RuntimeError("No viable backend for scaled_dot_product_attention was found. This is likely due to "
                           "turning off both the math kernel and the fused kernels.")
