"""runtime.cuda: the torch.cuda queries; the eager runtime keeps tensors on the CPU, so CUDA is never available."""
from __future__ import annotations

import types


def is_available() -> bool:
    return False


def device_count() -> int:
    return 0


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return False


def manual_seed(seed: int) -> None:
    """Accepted for compatibility: there is no CUDA generator to seed."""


manual_seed_all = manual_seed


def synchronize(device=None) -> None:
    """Nothing to wait for: there is no CUDA device."""


def empty_cache() -> None:
    """Nothing to free: there is no CUDA memory."""


def _unavailable(*args, **kwargs):
    raise RuntimeError("runtime has no CUDA device (runtime.cuda.is_available() is False)")


current_device = get_device_name = get_device_properties = set_device = _unavailable


def _amp_module():
    from . import amp as _amp

    def autocast(enabled=True, dtype=None, cache_enabled=True):
        """torch.cuda.amp.autocast (deprecated in torch): a CUDA autocast, disabled here as there is no CUDA."""
        return _amp.autocast("cuda", dtype=dtype, enabled=enabled)

    def grad_scaler(init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000, enabled=True):
        return _amp.GradScaler("cuda", init_scale, growth_factor, backoff_factor, growth_interval, enabled)

    return types.SimpleNamespace(autocast=autocast, GradScaler=grad_scaler)


def __getattr__(name):
    if name == "amp":
        return _amp_module()
    raise AttributeError(f"module 'runtime.cuda' has no attribute {name!r}")
