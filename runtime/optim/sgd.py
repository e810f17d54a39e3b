"""SGD with optional momentum, dampening, Nesterov momentum, weight decay and maximize, as torch.optim.SGD."""
from __future__ import annotations

import numpy as np

from ..tensor import Tensor
from ._launch import LaunchChoice, OnePassUpdates, fusable
from .optimizer import Optimizer, as_float, check_hyper, check_fused, reject_unsupported


class SGD(OnePassUpdates, Optimizer):
    """p <- p - lr * g, where g is the gradient plus weight decay, optionally through a momentum buffer."""

    def __init__(self, params, lr=1e-3, momentum=0, dampening=0, weight_decay=0, nesterov=False, *,
                 maximize=False, foreach=None, differentiable=False, fused=None) -> None:
        reject_unsupported(differentiable=differentiable)
        check_fused(fused, foreach)
        defaults = {"lr": lr, "momentum": momentum, "dampening": dampening, "weight_decay": weight_decay,
                    "nesterov": nesterov, "maximize": maximize, "foreach": foreach,
                    "differentiable": differentiable, "fused": fused}
        self._validate(defaults)
        super().__init__(params, defaults)
        self._launch = LaunchChoice()  # serial or parallel one-pass updates (see runtime/optim/_launch.py)

    def _validate(self, hyper: dict) -> None:
        check_hyper(hyper["lr"] >= 0.0, f"Invalid learning rate: {hyper['lr']}")
        check_hyper(hyper["momentum"] >= 0.0, f"Invalid momentum value: {hyper['momentum']}")
        check_hyper(hyper["weight_decay"] >= 0.0, f"Invalid weight_decay value: {hyper['weight_decay']}")
        check_hyper(not hyper["nesterov"] or (hyper["momentum"] > 0 and hyper["dampening"] == 0),
                    "Nesterov momentum requires a momentum and zero dampening")

    def _update(self, p: Tensor, grad: np.ndarray, group: dict) -> None:
        buf = self.state[p].get("momentum_buffer") if group["momentum"] != 0 else None
        if buf is not None and fusable(p._data, grad, buf._data):
            from ._fused import sgd_momentum

            update = lambda parallel: sgd_momentum(  # noqa: E731
                p._data, grad, buf._data, as_float(group["lr"]), group["momentum"], group["dampening"],
                group["weight_decay"], group["nesterov"], group["maximize"], parallel)
            self._run_one_pass(update)
            buf._bump_version()
            return
        if group["maximize"]:
            grad = -grad
        weight_decay, momentum = group["weight_decay"], group["momentum"]
        if weight_decay != 0:
            grad = grad + weight_decay * p._data
        if momentum != 0:
            grad = self._apply_momentum(p, grad, momentum, group)
        p._data -= as_float(group["lr"]) * grad

    def _update_cuda(self, p: Tensor, grad: Tensor, group: dict) -> None:
        """The same arithmetic as _update (each operation rounded in the parameter's dtype), as CUDA kernels."""
        if group["maximize"]:
            grad = -grad
        weight_decay, momentum = group["weight_decay"], group["momentum"]
        data = p.detach()
        if weight_decay != 0:
            grad = grad + weight_decay * data
        if momentum != 0:
            state = self.state[p]
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = state["momentum_buffer"] = grad.detach().clone()
            else:
                buf.mul_(momentum)
                dampening = group["dampening"]
                buf.add_(grad if dampening == 0 else (1 - dampening) * grad)
            grad = grad + momentum * buf if group["nesterov"] else buf
        data.sub_(as_float(group["lr"]) * grad)

    def _apply_momentum(self, p: Tensor, grad: np.ndarray, momentum: float, group: dict) -> np.ndarray:
        """Update p's momentum buffer (created from the first gradient) and return the step direction."""
        state = self.state[p]
        buf = state.get("momentum_buffer")
        if buf is None:
            buf = state["momentum_buffer"] = Tensor._from_array(np.array(grad, copy=True))
        else:
            b = buf._data
            b *= momentum
            dampening = group["dampening"]
            b += grad if dampening == 0 else (1 - dampening) * grad
            buf._bump_version()
        return grad + momentum * buf._data if group["nesterov"] else buf._data
