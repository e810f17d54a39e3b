"""runtime.nn.utils: skip_init, gradient clipping, parameter vectors, pruning, weight and spectral norm, and the
rnn packing helpers."""
from __future__ import annotations

import warnings

from ...autograd import grad_mode
from . import rnn  # noqa: F401
from . import parametrizations, parametrize, prune, stateless  # noqa: F401,E402
from .clip_grad import clip_grads_with_norm_, get_total_norm  # noqa: F401
from .fusion import fuse_conv_bn_eval, fuse_conv_bn_weights, fuse_linear_bn_eval, fuse_linear_bn_weights  # noqa: F401,E501
from .spectral_norm import remove_spectral_norm, spectral_norm  # noqa: F401
from .weight_norm import remove_weight_norm, weight_norm  # noqa: F401


def skip_init(module_cls, *args, **kwargs):
    """Build a module without running its nn.init initialisers: parameters keep their zero fill."""
    from .. import init

    with init.skipped():
        return module_cls(*args, **kwargs)


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                    foreach=None):
    """Scale gradients in place so their joint norm is at most max_norm; returns the norm before clipping (torch's
    composition of get_total_norm and clip_grads_with_norm_)."""
    params = [parameters] if hasattr(parameters, "grad") else list(parameters)
    total = get_total_norm([p.grad for p in params if p.grad is not None], norm_type, error_if_nonfinite)
    clip_grads_with_norm_(params, max_norm, total)
    return total


def clip_grad_norm(parameters, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                   foreach=None):
    """The deprecated name of clip_grad_norm_ (older scripts still call it): warns as torch does, then clips."""
    warnings.warn("`torch.nn.utils.clip_grad_norm` is now deprecated in favor of `torch.nn.utils.clip_grad_norm_`.",
                  FutureWarning, stacklevel=2)
    return clip_grad_norm_(parameters, max_norm, norm_type, error_if_nonfinite, foreach)


def clip_grad_value_(parameters, clip_value: float, foreach=None) -> None:
    """Clamp every gradient in place to [-clip_value, clip_value]."""
    params = [parameters] if hasattr(parameters, "grad") else list(parameters)
    clip_value = float(clip_value)
    with grad_mode.no_grad():
        for p in params:
            if p.grad is not None:
                p.grad.clamp_(-clip_value, clip_value)


def parameters_to_vector(parameters):
    """One 1-D tensor holding every parameter, flattened and concatenated in order."""
    from ... import api

    return api.cat([p.reshape(-1) for p in parameters])


def vector_to_parameters(vec, parameters) -> None:
    """Copy consecutive slices of a 1-D vector into the parameters (their data, not their history)."""
    from ...tensor import Tensor

    if not isinstance(vec, Tensor):
        raise TypeError(f"expected torch.Tensor, but got: {type(vec).__name__}")
    offset = 0
    with grad_mode.no_grad():
        for p in parameters:
            n = p.numel()
            p.copy_(vec[offset:offset + n].reshape(tuple(p.shape)))
            offset += n
