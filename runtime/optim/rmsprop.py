"""RMSprop with optional momentum, centering, weight decay and maximize, as torch.optim.RMSprop."""
from __future__ import annotations

import numpy as np

from ..tensor import Tensor
from .optimizer import Optimizer, as_float, check_hyper, increment_step, lerp_, new_step, reject_unsupported, zeros_like


class RMSprop(Optimizer):
    """Divide each gradient by a running root-mean-square of recent gradients (optionally centered)."""

    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0, centered=False,
                 capturable=False, foreach=None, maximize=False, differentiable=False) -> None:
        reject_unsupported(capturable=capturable, differentiable=differentiable)
        defaults = {"lr": lr, "momentum": momentum, "alpha": alpha, "eps": eps, "centered": centered,
                    "weight_decay": weight_decay, "capturable": capturable, "foreach": foreach,
                    "maximize": maximize, "differentiable": differentiable}
        self._validate(defaults)
        super().__init__(params, defaults)

    def _validate(self, hyper: dict) -> None:
        check_hyper(hyper["lr"] >= 0.0, f"Invalid learning rate: {hyper['lr']}")
        check_hyper(hyper["eps"] >= 0.0, f"Invalid epsilon value: {hyper['eps']}")
        check_hyper(hyper["momentum"] >= 0.0, f"Invalid momentum value: {hyper['momentum']}")
        check_hyper(hyper["weight_decay"] >= 0.0, f"Invalid weight_decay value: {hyper['weight_decay']}")
        check_hyper(hyper["alpha"] >= 0.0, f"Invalid alpha value: {hyper['alpha']}")

    def _init_state(self, p: Tensor, group: dict) -> dict:
        state = self.state[p]
        if not state:
            state["step"] = new_step()
            state["square_avg"] = zeros_like(p)
            if group["momentum"] > 0:
                state["momentum_buffer"] = zeros_like(p)
            if group["centered"]:
                state["grad_avg"] = zeros_like(p)
        return state

    def _update(self, p: Tensor, grad: np.ndarray, group: dict) -> None:
        state = self._init_state(p, group)
        alpha, weight_decay, momentum = group["alpha"], group["weight_decay"], group["momentum"]
        if group["maximize"]:
            grad = -grad
        increment_step(state)
        if weight_decay != 0:
            grad = grad + weight_decay * p._data
        square_avg = state["square_avg"]._data
        square_avg *= alpha
        square_avg += (1 - alpha) * grad * grad
        if group["centered"]:
            grad_avg = state["grad_avg"]._data
            lerp_(grad_avg, grad, 1 - alpha)
            avg = np.sqrt(square_avg - grad_avg * grad_avg)
        else:
            avg = np.sqrt(square_avg)
        avg += group["eps"]
        lr = as_float(group["lr"])
        if momentum > 0:
            buf = state["momentum_buffer"]._data
            buf *= momentum
            buf += grad / avg
            p._data += -lr * buf
        else:
            p._data += (-lr * grad) / avg
