"""Adadelta, Adagrad and Adamax, as torch.optim (single-tensor updates on numpy, torch's state layout)."""
from __future__ import annotations

import numpy as np

from ..tensor import Tensor
from .optimizer import (Optimizer, as_float, check_fused, check_hyper, increment_step, lerp_, new_step,
                        reject_unsupported, validate_adam_family, zeros_like)


def _decayed(grad: np.ndarray, p: Tensor, group: dict) -> np.ndarray:
    """The gradient with maximize's sign flip and L2 weight decay applied (a new array when either applies)."""
    if group["maximize"]:
        grad = -grad
    if group["weight_decay"] != 0:
        grad = grad + group["weight_decay"] * p._data
    return grad


class Adadelta(Optimizer):
    """Steps scaled by the ratio of running RMS of past updates to running RMS of gradients (Zeiler 2012)."""

    def __init__(self, params, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0, foreach=None, *, capturable=False,
                 maximize=False, differentiable=False) -> None:
        reject_unsupported(capturable=capturable, differentiable=differentiable)
        defaults = {"lr": lr, "rho": rho, "eps": eps, "weight_decay": weight_decay, "maximize": maximize,
                    "capturable": capturable, "foreach": foreach, "differentiable": differentiable}
        self._validate(defaults)
        super().__init__(params, defaults)

    def _validate(self, hyper: dict) -> None:
        check_hyper(hyper["lr"] >= 0.0, f"Invalid learning rate: {hyper['lr']}")
        check_hyper(0.0 <= hyper["rho"] <= 1.0, f"Invalid rho value: {hyper['rho']}")
        check_hyper(hyper["eps"] >= 0.0, f"Invalid epsilon value: {hyper['eps']}")
        check_hyper(hyper["weight_decay"] >= 0.0, f"Invalid weight_decay value: {hyper['weight_decay']}")

    def _update(self, p: Tensor, grad: np.ndarray, group: dict) -> None:
        state = self.state[p]
        if not state:
            state["step"] = new_step()
            state["square_avg"] = zeros_like(p)
            state["acc_delta"] = zeros_like(p)
        increment_step(state)
        rho, eps, lr = group["rho"], group["eps"], as_float(group["lr"])
        grad = _decayed(grad, p, group)
        square_avg, acc_delta = state["square_avg"]._data, state["acc_delta"]._data
        square_avg *= rho
        square_avg += (1 - rho) * grad * grad
        std = np.sqrt(square_avg + eps)
        delta = np.sqrt(acc_delta + eps) / std * grad
        acc_delta *= rho
        acc_delta += (1 - rho) * delta * delta
        p._data += -lr * delta


class Adagrad(Optimizer):
    """Steps divided by the root of the running sum of squared gradients, with an optional lr decay."""

    def __init__(self, params, lr=1e-2, lr_decay=0, weight_decay=0, initial_accumulator_value=0, eps=1e-10,
                 foreach=None, *, maximize=False, differentiable=False, fused=None) -> None:
        reject_unsupported(differentiable=differentiable)
        check_fused(fused, foreach)
        defaults = {"lr": lr, "lr_decay": lr_decay, "eps": eps, "weight_decay": weight_decay,
                    "initial_accumulator_value": initial_accumulator_value, "foreach": foreach,
                    "maximize": maximize, "differentiable": differentiable, "fused": fused}
        self._validate(defaults)
        super().__init__(params, defaults)
        for group in self.param_groups:  # torch creates Adagrad's state up front
            for p in group["params"]:
                self._init_state(p, group)

    def _validate(self, hyper: dict) -> None:
        check_hyper(hyper["lr"] >= 0.0, f"Invalid learning rate: {hyper['lr']}")
        check_hyper(hyper["lr_decay"] >= 0.0, f"Invalid lr_decay value: {hyper['lr_decay']}")
        check_hyper(hyper["weight_decay"] >= 0.0, f"Invalid weight_decay value: {hyper['weight_decay']}")
        check_hyper(hyper["initial_accumulator_value"] >= 0.0,
                    f"Invalid initial_accumulator_value value: {hyper['initial_accumulator_value']}")
        check_hyper(hyper["eps"] >= 0.0, f"Invalid epsilon value: {hyper['eps']}")

    def _init_state(self, p: Tensor, group: dict) -> dict:
        state = self.state[p]
        if not state:
            state["step"] = new_step()
            state["sum"] = Tensor._from_array(np.full_like(p._data, group["initial_accumulator_value"]))
        return state

    def _update(self, p: Tensor, grad: np.ndarray, group: dict) -> None:
        state = self._init_state(p, group)
        step = increment_step(state)
        grad = _decayed(grad, p, group)
        clr = as_float(group["lr"]) / (1 + (step - 1) * group["lr_decay"])
        total = state["sum"]._data
        total += grad * grad
        p._data += (-clr * grad) / (np.sqrt(total) + group["eps"])

    def share_memory(self) -> None:
        """A no-op: there is one process (torch moves the sums to shared memory for multiprocessing)."""


class Adamax(Optimizer):
    """Adam with the infinity norm: steps divided by a decaying running max of |gradient|."""

    def __init__(self, params, lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, foreach=None, *,
                 maximize=False, differentiable=False, capturable=False) -> None:
        reject_unsupported(capturable=capturable, differentiable=differentiable)
        defaults = {"lr": lr, "betas": tuple(as_float(b) for b in betas), "eps": eps, "weight_decay": weight_decay,
                    "foreach": foreach, "maximize": maximize, "differentiable": differentiable,
                    "capturable": capturable}
        self._validate(defaults)
        super().__init__(params, defaults)

    def _validate(self, hyper: dict) -> None:
        validate_adam_family(hyper)

    def _update(self, p: Tensor, grad: np.ndarray, group: dict) -> None:
        state = self.state[p]
        if not state:
            state["step"] = new_step()
            state["exp_avg"] = zeros_like(p)
            state["exp_inf"] = zeros_like(p)
        step = increment_step(state)
        (beta1, beta2), lr = group["betas"], as_float(group["lr"])
        grad = _decayed(grad, p, group)
        exp_avg, exp_inf = state["exp_avg"]._data, state["exp_inf"]._data
        lerp_(exp_avg, grad, 1 - beta1)
        exp_inf *= beta2
        np.maximum(exp_inf, np.abs(grad) + group["eps"], out=exp_inf)
        p._data += (-(lr / (1 - beta1 ** step)) * exp_avg) / exp_inf
