"""Adafactor (Shazeer & Stern 2018) as torch.optim.Adafactor: the second moment of a matrix gradient kept as its row
and column means (factored along the last two dims), a relative step size, and an update clipped by its RMS."""
from __future__ import annotations

import numpy as np

from ..tensor import Tensor
from .optimizer import Optimizer, as_float, check_hyper, increment_step, lerp_, new_step


class Adafactor(Optimizer):
    def __init__(self, params, lr=1e-2, beta2_decay=-0.8, eps=(None, 1e-3), d=1.0, weight_decay=0.0, *,
                 foreach=None, maximize=False) -> None:
        defaults = {"lr": lr, "beta2_decay": beta2_decay, "eps": eps, "d": d, "weight_decay": weight_decay,
                    "foreach": foreach, "maximize": maximize}
        self._validate(defaults)
        super().__init__(params, defaults)

    def _validate(self, hyper: dict) -> None:
        check_hyper(as_float(hyper["lr"]) >= 0.0, f"Learning rate should be >= 0 but is: {hyper['lr']}")
        check_hyper(hyper["beta2_decay"] <= 0.0, f"beta2_decay should be <= 0 but is: {hyper['beta2_decay']}")
        eps1, eps2 = hyper["eps"]
        check_hyper(eps1 is None or eps1 >= 0.0, f"epsilon1 should be >= 0 but is: {eps1}")
        check_hyper(eps2 >= 0.0, f"epsilon2 should be >= 0 but is: {eps2}")
        check_hyper(hyper["d"] >= 1.0, f"Clipping threshold d should be >= 1 but is: {hyper['d']}")
        check_hyper(hyper["weight_decay"] >= 0.0, f"weight_decay should be >= 0 but is: {hyper['weight_decay']}")

    def _step_param(self, p: Tensor, g: Tensor, group: dict) -> None:
        if p.dtype.is_complex:
            raise RuntimeError("Adafactor does not support complex parameters")
        super()._step_param(p, g, group)

    def _state_of(self, p: Tensor, grad: np.ndarray) -> dict:
        state = self.state[p]
        if not state:
            state["step"] = new_step()
            if grad.ndim > 1:  # the variance's row means (last dim reduced) and column means (the one before)
                state["row_var"] = Tensor._from_array(np.zeros(grad.shape[:-1] + (1,), grad.dtype))
                state["col_var"] = Tensor._from_array(np.zeros(grad.shape[:-2] + (1, grad.shape[-1]), grad.dtype))
            else:
                state["variance"] = Tensor._from_array(np.zeros_like(grad))
        return state

    def _update(self, p: Tensor, grad: np.ndarray, group: dict) -> None:
        state = self._state_of(p, grad)
        if group["maximize"]:
            grad = -grad
        lr, (eps1, eps2) = as_float(group["lr"]), group["eps"]
        eps1 = float(np.finfo(p._data.dtype).eps) if eps1 is None else eps1
        step = increment_step(state)
        one_minus_beta2 = step ** group["beta2_decay"]
        relative = min(lr, 1 / step ** 0.5)
        alpha = max(eps2, float(np.linalg.norm(p._data.ravel())) / p._data.size ** 0.5) * relative
        if group["weight_decay"] != 0:
            p._data *= 1 - lr * group["weight_decay"]
        if grad.ndim > 1:
            row_var, col_var = state["row_var"]._data, state["col_var"]._data
            squares = grad * grad
            lerp_(row_var, squares.mean(axis=-1, keepdims=True), one_minus_beta2)
            lerp_(col_var, squares.mean(axis=-2, keepdims=True), one_minus_beta2)
            estimate = (row_var @ col_var) / np.maximum(row_var.mean(axis=-2, keepdims=True), eps1)
        else:
            variance = state["variance"]._data
            lerp_(variance, grad * grad, one_minus_beta2)
            estimate = variance.copy()
        update = grad / np.sqrt(np.maximum(estimate, eps1 * eps1))
        denominator = max(1.0, float(np.linalg.norm(update.ravel())) / (update.size ** 0.5 * group["d"]))
        p._data -= (alpha / denominator) * update
