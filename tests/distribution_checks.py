"""Shared checks of runtime.distributions' tests: float64 parameters for runtime and torch, values and gradients
against torch, and rsample gradients by central finite differences under a fixed seed."""
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


def close(got, want, tol=1e-10):
    assert tuple(got.shape) == tuple(want.shape)
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=tol, atol=tol)


def check_against_torch(build, params, compute, ours_module, theirs_module, rng, tol=1e-10):
    """compute(distribution, library) on both sides, build(module, *params) making the distribution from runtime's
    `ours_module` and torch's `theirs_module`: equal values, and equal gradients of a random weighting (drawn from
    `rng`) of them with respect to every parameter."""
    our_params, their_params = [ours(p) for p in params], [theirs(p) for p in params]
    got = compute(build(ours_module, *our_params), runtime)
    want = compute(build(theirs_module, *their_params), torch)
    close(got, want, tol)
    if not want.requires_grad:
        assert not got.requires_grad
        return
    weights = rng.normal(size=tuple(want.shape))
    got_grads = runtime.autograd.grad((got * ours(weights, False)).sum(), our_params, allow_unused=True)
    want_grads = torch.autograd.grad((want * theirs(weights, False)).sum(), their_params, allow_unused=True)
    for got_grad, want_grad in zip(got_grads, want_grads):
        assert (got_grad is None) == (want_grad is None)
        if want_grad is not None:
            close(got_grad, want_grad, tol)


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
