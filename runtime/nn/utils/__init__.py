"""runtime.nn.utils: skip_init, gradient clipping, parameter vectors, and the rnn packing helpers."""
from __future__ import annotations

import math

from ...autograd import grad_mode
from . import rnn  # noqa: F401
from . import parametrizations, parametrize  # noqa: F401,E402
from .clip_grad import clip_grads_with_norm_, get_total_norm  # noqa: F401
from .fusion import fuse_conv_bn_eval, fuse_conv_bn_weights, fuse_linear_bn_eval, fuse_linear_bn_weights  # noqa: F401,E501


def skip_init(module_cls, *args, **kwargs):
    """Build a module without running its nn.init initialisers: parameters keep their zero fill."""
    from .. import init

    with init.skipped():
        return module_cls(*args, **kwargs)


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                    foreach=None):
    """Scale gradients in place so their joint norm is at most max_norm; returns the norm before clipping."""
    from ... import factories

    params = [parameters] if hasattr(parameters, "grad") else list(parameters)
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return factories.tensor(0.0)
    with grad_mode.no_grad():
        if norm_type == math.inf:
            total = max(float(g.abs().max()) for g in grads)
        else:
            total = sum(float((g.abs() ** norm_type).sum()) for g in grads) ** (1.0 / norm_type)
        if error_if_nonfinite and not math.isfinite(total):
            raise RuntimeError(f"The total norm of order {norm_type} for gradients from `parameters` is non-finite")
        coef = max_norm / (total + 1e-6)
        if coef < 1:
            for g in grads:
                g.mul_(coef)
    return factories.tensor(total)


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
