"""torch.cuda.amp (deprecated in torch): a CUDA autocast and GradScaler, both disabled here as runtime has no CUDA
autocast; importable as a module, as scripts do (`from torch.cuda.amp import autocast`)."""
from __future__ import annotations

from .. import amp as _amp


def autocast(enabled=True, dtype=None, cache_enabled=True):
    """A CUDA autocast: torch warns that CUDA is unavailable and disables it, and so does runtime."""
    return _amp.autocast("cuda", dtype=dtype, enabled=enabled)


def GradScaler(init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,  # noqa: N802
               enabled=True):
    return _amp.GradScaler("cuda", init_scale, growth_factor, backoff_factor, growth_interval, enabled)
