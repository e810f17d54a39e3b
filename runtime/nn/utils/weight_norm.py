"""torch.nn.utils.weight_norm, the hook-based form older models use (WaveNet- and HiFi-GAN-style vocoders): the
weight becomes two parameters, `<name>_g` (magnitude) and `<name>_v` (direction), and a forward pre-hook recomputes
the weight from them before every forward. State dict keys are torch's, so its checkpoints load unchanged.
parametrizations.weight_norm is the newer form of the same."""
from __future__ import annotations

import warnings

from ..parameter import Parameter
from ._norm_hooks import remove_named_pre_hook
from .parametrizations import _norm_except_dim

__all__ = ["WeightNorm", "weight_norm", "remove_weight_norm"]


class WeightNorm:
    """The forward pre-hook: sets module.<name> = v * g / ||v|| (the norm over every dim but `dim`; -1: over all)."""

    def __init__(self, name: str, dim: int | None):
        self.name = name
        self.dim = -1 if dim is None else dim

    def compute_weight(self, module):
        g, v = getattr(module, self.name + "_g"), getattr(module, self.name + "_v")
        return v * (g / _norm_except_dim(v, self._dim_of(v)))

    def _dim_of(self, v) -> int:
        return self.dim if self.dim == -1 else self.dim % v.ndim

    @staticmethod
    def apply(module, name: str, dim: int | None) -> "WeightNorm":
        for hook in module._forward_pre_hooks.values():
            if isinstance(hook, WeightNorm) and hook.name == name:
                raise RuntimeError(f"Cannot register two weight_norm hooks on the same parameter {name}")
        fn = WeightNorm(name, dim)
        weight = getattr(module, name)
        del module._parameters[name]
        module.register_parameter(name + "_g", Parameter(_norm_except_dim(weight, fn._dim_of(weight)).detach()))
        module.register_parameter(name + "_v", Parameter(weight.detach()))
        setattr(module, name, fn.compute_weight(module))
        module.register_forward_pre_hook(fn)
        return fn

    def remove(self, module) -> None:
        weight = self.compute_weight(module)
        delattr(module, self.name)
        del module._parameters[self.name + "_g"]
        del module._parameters[self.name + "_v"]
        setattr(module, self.name, Parameter(weight.detach()))

    def __call__(self, module, inputs) -> None:
        setattr(module, self.name, self.compute_weight(module))


def weight_norm(module, name: str = "weight", dim: int | None = 0):
    """Replace module.<name> by <name>_g and <name>_v, recombined before every forward (deprecated in torch in
    favour of parametrizations.weight_norm, with the same warning)."""
    warnings.warn("`torch.nn.utils.weight_norm` is deprecated in favor of "
                  "`torch.nn.utils.parametrizations.weight_norm`.", FutureWarning, stacklevel=2)
    WeightNorm.apply(module, name, dim)
    return module


def remove_weight_norm(module, name: str = "weight"):
    """Put module.<name> back as one parameter holding the current g * v / ||v||."""
    remove_named_pre_hook(module, WeightNorm, name, "weight_norm")
    return module
