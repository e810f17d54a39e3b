"""runtime.nn.utils: skip_init, gradient clipping, parameter vectors, and the rnn packing helpers."""
from __future__ import annotations

import math

from ...autograd import grad_mode
from . import rnn  # noqa: F401


def skip_init(module_cls, *args, **kwargs):
    """Build a module without running its nn.init initialisers: parameters keep their zero fill."""
    from .. import init

    with init.skipped():
        return module_cls(*args, **kwargs)


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False):
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
