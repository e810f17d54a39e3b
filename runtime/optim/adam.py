"""Adam and AdamW (decoupled weight decay), with amsgrad and maximize, as torch.optim.Adam/AdamW."""
from __future__ import annotations

import numpy as np

from ..tensor import Tensor
from ._launch import LaunchChoice, OnePassUpdates, fusable
from .optimizer import (Optimizer, as_float, check_fused, increment_step, lerp_, new_step, reject_unsupported,
                        validate_adam_family, zeros_like)


# NOTE: Adam's numpy update takes about twelve passes, so one numba pass wins from small sizes on (measured below)
ADAM_MIN_ELEMENTS = 0


class Adam(OnePassUpdates, Optimizer):
    """Bias-corrected first and second moment estimates of the gradient scale each parameter's step."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, *,
                 foreach=None, maximize=False, capturable=False, differentiable=False, fused=None,
                 decoupled_weight_decay=False) -> None:
        reject_unsupported(capturable=capturable, differentiable=differentiable)
        check_fused(fused, foreach)
        defaults = {"lr": lr, "betas": tuple(as_float(b) for b in betas), "eps": eps, "weight_decay": weight_decay,
                    "amsgrad": amsgrad, "maximize": maximize, "foreach": foreach, "capturable": capturable,
                    "differentiable": differentiable, "fused": fused,
                    "decoupled_weight_decay": decoupled_weight_decay}
        self._validate(defaults)
        super().__init__(params, defaults)
        self._launch = LaunchChoice()  # serial or parallel one-pass updates (see runtime/optim/_launch.py)

    def _validate(self, hyper: dict) -> None:
        validate_adam_family(hyper)

    def _init_state(self, p: Tensor, group: dict) -> dict:
        state = self.state[p]
        if not state:
            state["step"] = new_step()
            state["exp_avg"] = zeros_like(p)
            state["exp_avg_sq"] = zeros_like(p)
            if group["amsgrad"]:
                state["max_exp_avg_sq"] = zeros_like(p)
        return state

    def _update(self, p: Tensor, grad: np.ndarray, group: dict) -> None:
        state = self._init_state(p, group)
        if self._fused_update(p, grad, group, state):
            return
        lr, (beta1, beta2), weight_decay = as_float(group["lr"]), group["betas"], group["weight_decay"]
        if group["maximize"]:
            grad = -grad
        step = increment_step(state)
        data = p._data
        if weight_decay != 0:
            if group["decoupled_weight_decay"]:
                data *= 1 - lr * weight_decay
            else:
                grad = grad + weight_decay * data
        exp_avg, exp_avg_sq = state["exp_avg"]._data, state["exp_avg_sq"]._data
        lerp_(exp_avg, grad, 1 - beta1)
        exp_avg_sq *= beta2
        exp_avg_sq += (1 - beta2) * grad * grad
        second = _running_max(state, exp_avg_sq) if group["amsgrad"] else exp_avg_sq
        denom = np.sqrt(second) / (1 - beta2 ** step) ** 0.5 + group["eps"]
        data += (-(lr / (1 - beta1 ** step)) * exp_avg) / denom

    def _step_group(self, group: dict) -> None:
        """Without amsgrad, the one-pass updates of a group's CPU parameters run as a few kernel calls for all of
        them (runtime/optim/_fused.py's adam_many: the same bits as a call per parameter); the rest one by one."""
        if group["amsgrad"] or type(self)._update is not Adam._update:
            return super()._step_group(group)
        batches: dict = {}  # (dtype, step) -> [params, grads, exp_avgs, exp_avg_sqs]
        for p in group["params"]:
            g = p._grad
            if g is None:
                continue
            if p.is_cuda:
                self._step_param(p, g, group)
                continue
            state = self._init_state(p, group)
            arrays = (p._data, g._data, state["exp_avg"]._data, state["exp_avg_sq"]._data)
            if not fusable(*arrays, min_elements=ADAM_MIN_ELEMENTS):
                self._step_param(p, g, group)
                continue
            lists = batches.setdefault((p._data.dtype, increment_step(state)), ([], [], [], [], []))
            for array, into in zip(arrays, lists):
                into.append(array)
            lists[4].append(p)
        if batches:
            from ._fused import adam_many, adam_scalars

            for (dtype, step), (params, grads, exp_avgs, exp_avg_sqs, tensors) in batches.items():
                scalars = adam_scalars(dtype, step, as_float(group["lr"]), group["betas"], group["eps"],
                                       group["weight_decay"], group["decoupled_weight_decay"], group["maximize"])
                self._run_one_pass(lambda parallel: adam_many(params, grads, exp_avgs, exp_avg_sqs, scalars,  # noqa: B023
                                                              parallel))
                for p in tensors:
                    p._bump_version()

    def _fused_update(self, p: Tensor, grad: np.ndarray, group: dict, state: dict) -> bool:
        """_update's arithmetic as one numba pass (runtime/optim/_fused.py), where the arrays allow it."""
        moments = [state["exp_avg"]._data, state["exp_avg_sq"]._data]
        if group["amsgrad"]:
            moments.append(state["max_exp_avg_sq"]._data)
        if not fusable(p._data, grad, *moments, min_elements=ADAM_MIN_ELEMENTS):
            return False
        from ._fused import adam, adam_scalars

        step = increment_step(state)
        scalars = adam_scalars(p._data.dtype, step, as_float(group["lr"]), group["betas"], group["eps"],
                               group["weight_decay"], group["decoupled_weight_decay"], group["maximize"])
        update = lambda parallel: adam(p._data, grad, *moments[:2], moments[2] if group["amsgrad"] else None,  # noqa: E731
                                       scalars, parallel)
        self._run_one_pass(update)
        return True

    def _update_cuda(self, p: Tensor, grad: Tensor, group: dict) -> None:
        """The same arithmetic as _update (each operation rounded in the parameter's dtype), as CUDA kernels."""
        state = self._init_state(p, group)
        lr, (beta1, beta2), weight_decay = as_float(group["lr"]), group["betas"], group["weight_decay"]
        if group["maximize"]:
            grad = -grad
        step = increment_step(state)
        data = p.detach()
        if weight_decay != 0:
            if group["decoupled_weight_decay"]:
                data.mul_(1 - lr * weight_decay)
            else:
                grad = grad + weight_decay * data
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        weight = 1 - beta1
        if abs(weight) < 0.5:  # lerp's two-sided formula, as optimizer.lerp_
            exp_avg.add_(weight * (grad - exp_avg))
        else:
            exp_avg.copy_(grad - (grad - exp_avg) * (1 - weight))
        exp_avg_sq.mul_(beta2)
        exp_avg_sq.add_((1 - beta2) * grad * grad)
        second = exp_avg_sq
        if group["amsgrad"]:
            second = state["max_exp_avg_sq"]
            second.copy_(second.maximum(exp_avg_sq))
        denom = second.sqrt() / (1 - beta2 ** step) ** 0.5 + group["eps"]
        data.add_((-(lr / (1 - beta1 ** step)) * exp_avg) / denom)


def _running_max(state: dict, exp_avg_sq: np.ndarray) -> np.ndarray:
    """amsgrad: max_exp_avg_sq <- max(max_exp_avg_sq, exp_avg_sq), used in place of exp_avg_sq."""
    running = state["max_exp_avg_sq"]._data
    np.maximum(running, exp_avg_sq, out=running)
    return running


class AdamW(Adam):
    """Adam whose weight decay shrinks the parameters directly instead of entering the moment estimates."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
                 maximize=False, foreach=None, capturable=False, differentiable=False, fused=None) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach, maximize=maximize,
                         capturable=capturable, differentiable=differentiable, fused=fused,
                         decoupled_weight_decay=True)
