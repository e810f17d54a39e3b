"""NAdam and RAdam (Adam with Nesterov momentum / with a rectified adaptive term), as torch.optim."""
from __future__ import annotations

import numpy as np

from ..tensor import Tensor
from .optimizer import (Optimizer, as_float, check_hyper, increment_step, lerp_, new_step, reject_unsupported,
                        scalar_dtype, validate_adam_family, zeros_like)


def _adam_defaults(lr, betas, eps, weight_decay, decoupled_weight_decay, foreach, maximize, capturable,
                   differentiable) -> dict:
    reject_unsupported(capturable=capturable, differentiable=differentiable)
    return {"lr": lr, "betas": tuple(as_float(b) for b in betas), "eps": eps, "weight_decay": weight_decay,
            "decoupled_weight_decay": decoupled_weight_decay, "maximize": maximize, "foreach": foreach,
            "capturable": capturable, "differentiable": differentiable}


def _moments(p: Tensor, grad: np.ndarray, group: dict, state: dict) -> np.ndarray:
    """maximize, weight decay (L2 or decoupled) and the two moment updates; returns the gradient used."""
    if group["maximize"]:
        grad = -grad
    weight_decay, lr = group["weight_decay"], as_float(group["lr"])
    if weight_decay != 0:
        if group["decoupled_weight_decay"]:
            p._data *= 1 - lr * weight_decay
        else:
            grad = grad + weight_decay * p._data
    beta1, beta2 = group["betas"]
    lerp_(state["exp_avg"]._data, grad, 1 - beta1)
    exp_avg_sq = state["exp_avg_sq"]._data
    exp_avg_sq *= beta2
    exp_avg_sq += (1 - beta2) * grad * grad
    return grad


class NAdam(Optimizer):
    """Adam with Nesterov momentum and a momentum schedule (Dozat 2016)."""

    def __init__(self, params, lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, momentum_decay=4e-3,
                 decoupled_weight_decay=False, *, foreach=None, maximize=False, capturable=False,
                 differentiable=False) -> None:
        defaults = _adam_defaults(lr, betas, eps, weight_decay, decoupled_weight_decay, foreach, maximize,
                                  capturable, differentiable)
        defaults["momentum_decay"] = momentum_decay
        self._validate(defaults)
        super().__init__(params, defaults)

    def _validate(self, hyper: dict) -> None:
        validate_adam_family(hyper)
        check_hyper(hyper["momentum_decay"] >= 0.0, f"Invalid momentum_decay value: {hyper['momentum_decay']}")

    def _update(self, p: Tensor, grad: np.ndarray, group: dict) -> None:
        state = self.state[p]
        if not state:
            state["step"] = new_step()
            state["mu_product"] = Tensor._from_array(np.ones((), scalar_dtype()))
            state["exp_avg"] = zeros_like(p)
            state["exp_avg_sq"] = zeros_like(p)
        step = increment_step(state)
        (beta1, beta2), lr, decay = group["betas"], as_float(group["lr"]), group["momentum_decay"]
        grad = _moments(p, grad, group, state)
        mu = beta1 * (1.0 - 0.5 * 0.96 ** (step * decay))
        mu_next = beta1 * (1.0 - 0.5 * 0.96 ** ((step + 1) * decay))
        # NOTE: mu_product lives in the step counter's dtype (float32 by default) and is rounded there, as torch's.
        product = state["mu_product"]._data
        product *= mu
        product_now = float(product)
        denom = np.sqrt(state["exp_avg_sq"]._data / (1 - beta2 ** step)) + group["eps"]
        p._data += (-lr * (1.0 - mu) / (1.0 - product_now)) * grad / denom
        p._data += (-lr * mu_next / (1.0 - product_now * mu_next)) * state["exp_avg"]._data / denom


class RAdam(Optimizer):
    """Adam whose adaptive term is switched on and rectified once its variance is tractable (Liu et al. 2019)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, decoupled_weight_decay=False,
                 *, foreach=None, maximize=False, capturable=False, differentiable=False) -> None:
        defaults = _adam_defaults(lr, betas, eps, weight_decay, decoupled_weight_decay, foreach, maximize,
                                  capturable, differentiable)
        self._validate(defaults)
        super().__init__(params, defaults)

    def _validate(self, hyper: dict) -> None:
        validate_adam_family(hyper)

    def _update(self, p: Tensor, grad: np.ndarray, group: dict) -> None:
        state = self.state[p]
        if not state:
            state["step"] = new_step()
            state["exp_avg"] = zeros_like(p)
            state["exp_avg_sq"] = zeros_like(p)
        step = increment_step(state)
        (beta1, beta2), lr = group["betas"], as_float(group["lr"])
        _moments(p, grad, group, state)
        correction2 = 1 - beta2 ** step
        corrected_avg = state["exp_avg"]._data / (1 - beta1 ** step)
        rho_inf = 2 / (1 - beta2) - 1
        rho_t = rho_inf - 2 * step * (beta2 ** step) / correction2
        if rho_t > 5.0:
            rect = ((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)) ** 0.5
            adaptive = (correction2 ** 0.5) / (np.sqrt(state["exp_avg_sq"]._data) + group["eps"])
            p._data -= corrected_avg * lr * adaptive * rect
        else:
            p._data -= corrected_avg * lr
