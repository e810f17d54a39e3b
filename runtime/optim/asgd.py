"""ASGD (averaged SGD) and Rprop (resilient backpropagation), as torch.optim."""
from __future__ import annotations

import numpy as np

from ..tensor import Tensor
from .optimizer import (Optimizer, as_float, check_hyper, increment_step, new_step, reject_unsupported, scalar_dtype,
                        zeros_like)


def _scalar(value) -> Tensor:
    return Tensor._from_array(np.array(value, scalar_dtype()))


class ASGD(Optimizer):
    """SGD with a decaying step size eta and a running average `ax` of the iterates (Polyak-Ruppert)."""

    def __init__(self, params, lr=1e-2, lambd=1e-4, alpha=0.75, t0=1e6, weight_decay=0, foreach=None,
                 maximize=False, differentiable=False, capturable=False) -> None:
        reject_unsupported(capturable=capturable, differentiable=differentiable)
        defaults = {"lr": lr, "lambd": lambd, "alpha": alpha, "t0": t0, "weight_decay": weight_decay,
                    "foreach": foreach, "maximize": maximize, "differentiable": differentiable,
                    "capturable": capturable}
        self._validate(defaults)
        super().__init__(params, defaults)

    def _validate(self, hyper: dict) -> None:
        check_hyper(hyper["lr"] >= 0.0, f"Invalid learning rate: {hyper['lr']}")
        check_hyper(hyper["weight_decay"] >= 0.0, f"Invalid weight_decay value: {hyper['weight_decay']}")

    def _update(self, p: Tensor, grad: np.ndarray, group: dict) -> None:
        state = self.state[p]
        lr = as_float(group["lr"])
        if not state:
            state["step"] = new_step()
            state["eta"] = _scalar(lr)
            state["mu"] = _scalar(1.0)
            state["ax"] = zeros_like(p)
        step = increment_step(state)
        if group["maximize"]:
            grad = -grad
        if group["weight_decay"] != 0:
            grad = grad + group["weight_decay"] * p._data
        # NOTE: eta and mu are read back from their (float32 by default) scalars, as torch reads them.
        eta, mu = float(state["eta"]._data), float(state["mu"]._data)
        lambd = group["lambd"]
        p._data *= 1 - lambd * eta
        p._data += -eta * grad
        ax = state["ax"]._data
        if mu != 1:
            ax += (p._data - ax) * mu
        else:
            ax[...] = p._data
        state["eta"]._data[...] = lr / ((1 + lambd * lr * step) ** group["alpha"])
        state["mu"]._data[...] = 1 / max(1, step - group["t0"])


class Rprop(Optimizer):
    """Per-element step sizes grown by etaplus while the gradient keeps its sign and shrunk by etaminus when it
    flips; only the gradient's sign is used."""

    def __init__(self, params, lr=1e-2, etas=(0.5, 1.2), step_sizes=(1e-6, 50), *, capturable=False, foreach=None,
                 maximize=False, differentiable=False) -> None:
        reject_unsupported(capturable=capturable, differentiable=differentiable)
        defaults = {"lr": lr, "etas": tuple(etas), "step_sizes": tuple(step_sizes), "foreach": foreach,
                    "maximize": maximize, "differentiable": differentiable, "capturable": capturable}
        self._validate(defaults)
        super().__init__(params, defaults)

    def _validate(self, hyper: dict) -> None:
        etaminus, etaplus = hyper["etas"]
        check_hyper(hyper["lr"] >= 0.0, f"Invalid learning rate: {hyper['lr']}")
        check_hyper(0.0 < etaminus < 1.0 < etaplus, f"Invalid eta values: {etaminus}, {etaplus}")

    def _update(self, p: Tensor, grad: np.ndarray, group: dict) -> None:
        state = self.state[p]
        if not state:
            state["step"] = new_step()
            state["prev"] = zeros_like(p)
            state["step_size"] = Tensor._from_array(np.full_like(p._data, as_float(group["lr"])))
        increment_step(state)
        etaminus, etaplus = group["etas"]
        low, high = group["step_sizes"]
        if group["maximize"]:
            grad = -grad
        prev, step_size = state["prev"]._data, state["step_size"]._data
        sign = np.sign(grad * prev)
        flipped = sign < 0
        factor = np.where(sign > 0, etaplus, np.where(flipped, etaminus, 1.0)).astype(step_size.dtype)
        step_size *= factor
        np.clip(step_size, low, high, out=step_size)
        grad = np.where(flipped, 0, grad).astype(p._data.dtype)
        p._data -= np.sign(grad) * step_size
        prev[...] = grad
