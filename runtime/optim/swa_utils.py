"""Stochastic weight averaging, as torch.optim.swa_utils: AveragedModel (SWA or EMA of a model's parameters),
update_bn (recompute BatchNorm statistics for the averaged weights) and SWALR (anneal to a constant SWA lr)."""
from __future__ import annotations

import copy
import itertools
import math

from .. import dtypes as dt
from .. import factories
from ..autograd.grad_mode import no_grad
from .lr_scheduler import LRScheduler, _per_group

__all__ = ["AveragedModel", "update_bn", "SWALR", "get_ema_avg_fn", "get_swa_avg_fn", "get_ema_multi_avg_fn",
           "get_swa_multi_avg_fn"]


def get_ema_avg_fn(decay=0.999):
    def ema_update(ema_param, current_param, num_averaged):
        return decay * ema_param + (1 - decay) * current_param

    return ema_update


def get_swa_avg_fn():
    def swa_update(averaged_param, current_param, num_averaged):
        return averaged_param + (current_param - averaged_param) / (num_averaged + 1)

    return swa_update


def get_ema_multi_avg_fn(decay=0.999):
    """EMA over lists of parameters, as torch's: a lerp towards the model's for floating ones (its bits differ from
    decay * ema + (1 - decay) * model's), that formula for the others."""
    if decay < 0.0 or decay > 1.0:
        raise ValueError(f"Invalid decay value {decay} provided. Please provide a value in [0,1] range.")

    def ema_update(averaged_params, current_params, num_averaged):
        with no_grad():
            if averaged_params[0].dtype.is_floating_point or averaged_params[0].dtype.is_complex:
                for a, c in zip(averaged_params, current_params):
                    a.lerp_(c, 1 - decay)
            else:
                for a, c in zip(averaged_params, current_params):
                    a.copy_(a * decay + c * (1 - decay))

    return ema_update


def get_swa_multi_avg_fn():
    """Running means over lists of parameters, as torch's: a lerp by 1 / (n + 1) for floating ones."""

    def swa_update(averaged_params, current_params, num_averaged):
        with no_grad():
            if averaged_params[0].dtype.is_floating_point or averaged_params[0].dtype.is_complex:
                weight = 1 / (float(num_averaged) + 1)
                for a, c in zip(averaged_params, current_params):
                    a.lerp_(c, weight)
            else:
                for a, c in zip(averaged_params, current_params):
                    a.copy_(a + (c - a) / (num_averaged + 1))

    return swa_update


def _module_class():
    from ..nn.modules.module import Module

    return Module


class AveragedModel(_module_class()):
    """A copy of `model` whose parameters are the running average (or avg_fn) of the model's at each update."""

    def __init__(self, model, device=None, avg_fn=None, multi_avg_fn=None, use_buffers=False):
        super().__init__()
        if avg_fn is not None and multi_avg_fn is not None:
            raise AssertionError("Only one of avg_fn and multi_avg_fn should be provided")
        self.module = copy.deepcopy(model)
        if device is not None:
            self.module = self.module.to(device)
        self.register_buffer("n_averaged", factories.tensor(0, dtype=dt.int64))
        self.avg_fn, self.multi_avg_fn, self.use_buffers = avg_fn, multi_avg_fn, use_buffers

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def update_parameters(self, model) -> None:
        if self.use_buffers:
            mine = list(itertools.chain(self.module.parameters(), self.module.buffers()))
            theirs = list(itertools.chain(model.parameters(), model.buffers()))
        else:
            mine, theirs = list(self.parameters()), list(model.parameters())
        with no_grad():
            averaged = [p.detach() for p in mine]
            current = [p.detach() for p in theirs]
            n = int(self.n_averaged)
            if n == 0:
                for a, c in zip(averaged, current):
                    a.copy_(c)
            elif self.multi_avg_fn is not None:  # per dtype and device, as torch groups them
                groups: dict = {}
                for a, c in zip(averaged, current):
                    group = groups.setdefault((a.dtype, str(a.device)), ([], []))
                    group[0].append(a)
                    group[1].append(c)
                for group_averaged, group_current in groups.values():
                    self.multi_avg_fn(group_averaged, group_current, self.n_averaged)
            else:
                fn = self.avg_fn if self.avg_fn is not None else get_swa_avg_fn()
                for a, c in zip(averaged, current):
                    a.copy_(fn(a, c, self.n_averaged))
            if not self.use_buffers:
                for mine_b, theirs_b in zip(self.module.buffers(), model.buffers()):
                    mine_b.copy_(theirs_b.detach())
            self.n_averaged.add_(1)


def update_bn(loader, model, device=None) -> None:
    """One pass over loader in train mode with cumulative BatchNorm averages (momentum None), then restore."""
    from ..nn.modules.layers import _BatchNorm

    momenta = {}
    for module in model.modules():
        if isinstance(module, _BatchNorm):
            module.reset_running_stats()
            momenta[module] = module.momentum
    if not momenta:
        return
    was_training = model.training
    model.train()
    for module in momenta:
        module.momentum = None
    with no_grad():
        for batch in loader:
            if isinstance(batch, (list, tuple)):
                batch = batch[0]
            model(batch)
    for module, momentum in momenta.items():
        module.momentum = momentum
    model.train(was_training)


class SWALR(LRScheduler):
    """Anneal each group's lr to its swa_lr over anneal_epochs (cos or linear), then hold it."""

    def __init__(self, optimizer, swa_lr, anneal_epochs=10, anneal_strategy="cos", last_epoch=-1) -> None:
        for lr, group in zip(_per_group("swa_lr", optimizer, swa_lr), optimizer.param_groups):
            group["swa_lr"] = lr
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"anneal_strategy must be one of 'cos' or 'linear', instead got {anneal_strategy}")
        self._set_anneal_func(anneal_strategy)
        if not isinstance(anneal_epochs, int) or anneal_epochs < 0:
            raise ValueError(f"anneal_epochs must be equal or greater than 0, got {anneal_epochs}")
        self.anneal_epochs = anneal_epochs
        super().__init__(optimizer, last_epoch)

    @staticmethod
    def _linear_anneal(t):
        return t

    @staticmethod
    def _cosine_anneal(t):
        return (1 - math.cos(math.pi * t)) / 2

    @staticmethod
    def _get_initial_lr(lr, swa_lr, alpha):
        return swa_lr if alpha == 1 else (lr - alpha * swa_lr) / (1 - alpha)

    def _set_anneal_func(self, strategy) -> None:
        self._anneal_strategy = strategy
        self.anneal_func = self._cosine_anneal if strategy == "cos" else self._linear_anneal

    def get_lr(self) -> list:
        step = self._step_count - 1
        if self.anneal_epochs == 0:
            step = max(1, step)
        span = max(1, self.anneal_epochs)
        prev_alpha = self.anneal_func(max(0, min(1, (step - 1) / span)))
        groups = self.optimizer.param_groups
        prev_lrs = [self._get_initial_lr(g["lr"], g["swa_lr"], prev_alpha) for g in groups]
        alpha = self.anneal_func(max(0, min(1, step / span)))
        return [g["swa_lr"] * alpha + lr * (1 - alpha) for g, lr in zip(groups, prev_lrs)]

    def state_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "anneal_func")}

    def load_state_dict(self, state_dict: dict) -> None:
        self.__dict__.update(state_dict)
        self._set_anneal_func(self._anneal_strategy)
