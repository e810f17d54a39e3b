"""Shared checks of runtime.distributions' tests: float64 parameters for runtime and torch, and rsample gradients
by central finite differences under a fixed seed."""
from __future__ import annotations

import numpy as np

import runtime
from helpers import torch


def draws(rng):
    """(real, positive, unit): functions of a shape drawing parameters from `rng`, each call advancing it."""
    return ((lambda *shape: rng.normal(size=shape)), (lambda *shape: rng.uniform(0.5, 2.0, size=shape)),
            (lambda *shape: rng.uniform(0.1, 0.9, size=shape)))


def ours(values, grad=True):
    return runtime.tensor(np.asarray(values, np.float64), requires_grad=grad)


def theirs(values, grad=True):
    return torch.tensor(np.asarray(values, np.float64), requires_grad=grad)


def rsample_objective(build, params, weights):
    runtime.manual_seed(11)
    return (build(*params).rsample((5,)) * weights).sum()


def finite_difference_gradient(build, arrays, weights, index, h=1e-6):
    grad = np.zeros_like(arrays[index])
    for pos in np.ndindex(grad.shape):
        values = []
        for step in (h, -h):
            shifted = [a.copy() for a in arrays]
            shifted[index][pos] += step
            values.append(rsample_objective(build, [ours(a, False) for a in shifted], weights).item())
        grad[pos] = (values[0] - values[1]) / (2 * h)
    return grad
