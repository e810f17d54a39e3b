"""torch.nn.utils' two-step gradient clipping: get_total_norm, then clip_grads_with_norm_ (clip_grad_norm_ in one)."""
from __future__ import annotations

import math

from ...autograd import grad_mode

__all__ = ["get_total_norm", "clip_grads_with_norm_"]


def get_total_norm(tensors, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """The norm of the tensors' norms: the norm of all their elements taken together."""
    from ... import factories

    tensors = [tensors] if hasattr(tensors, "shape") else [t for t in tensors if t is not None]
    if not tensors:
        return factories.tensor(0.0)
    norm_type = float(norm_type)
    with grad_mode.no_grad():
        if norm_type == math.inf:
            total = max(float(t.abs().max()) for t in tensors)
        else:
            total = sum(float((t.abs() ** norm_type).sum()) for t in tensors) ** (1.0 / norm_type)
    if error_if_nonfinite and not math.isfinite(total):
        raise RuntimeError(f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, "
                           f"so it cannot be clipped. To disable this error and scale the gradients by the "
                           f"non-finite norm anyway, set `error_if_nonfinite=False`")
    return factories.tensor(total, dtype=tensors[0].dtype)


def clip_grads_with_norm_(parameters, max_norm, total_norm, foreach=None) -> None:
    """Scale the gradients by max_norm / (total_norm + 1e-6) where that is below 1."""
    params = [parameters] if hasattr(parameters, "grad") else list(parameters)
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    coef = min(float(max_norm) / (float(total_norm) + 1e-6), 1.0)
    with grad_mode.no_grad():
        for g in grads:
            g.mul_(coef)
