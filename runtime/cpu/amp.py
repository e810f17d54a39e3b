"""torch.cpu.amp (deprecated in torch for torch.amp): autocast and GradScaler on the CPU, warning as torch does."""
from __future__ import annotations

import warnings

from .. import amp as _amp
from .. import dtypes as _dt


def autocast(enabled=True, dtype=_dt.bfloat16, cache_enabled=True):
    """runtime.amp.autocast('cpu', ...): a context manager and decorator."""
    warnings.warn("`torch.cpu.amp.autocast(args...)` is deprecated. Please use `torch.amp.autocast('cpu', args...)` "
                  "instead.", FutureWarning, stacklevel=2)
    return _amp.autocast("cpu", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


def GradScaler(init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,  # noqa: N802
               enabled=True):
    warnings.warn("`torch.cpu.amp.GradScaler(args...)` is deprecated. Please use `torch.amp.GradScaler('cpu', "
                  "args...)` instead.", FutureWarning, stacklevel=2)
    return _amp.GradScaler("cpu", init_scale, growth_factor, backoff_factor, growth_interval, enabled)
