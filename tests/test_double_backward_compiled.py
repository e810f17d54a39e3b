"""Compiled == eager for gradients of gradients: create_graph=True through a compiled model, autograd in forward."""
from __future__ import annotations

import copy

import numpy as np
import pytest

import nnc
import runtime
from runtime import nn


def _mlp(seed=0, dropout=0.0):
    runtime.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Dropout(dropout), nn.Linear(8, 2), nn.Softplus()).double()


def _penalty_step(model, x):
    """A WGAN-GP style loss: the output plus the squared norm of its gradient with respect to the input."""
    x = x.detach().clone().requires_grad_(True)
    out = model(x).sum()
    (gx,) = runtime.autograd.grad(out, x, create_graph=True)
    loss = out + (gx.pow(2).sum(-1) - 1).pow(2).mean()
    loss.backward()
    return [loss.detach().numpy().copy(), x.grad.numpy().copy()] + [p.grad.numpy().copy() for p in model.parameters()]


@pytest.mark.parametrize("rows", [1, 5])
def test_gradient_penalty_through_a_compiled_model_matches_eager(rows):
    eager = _mlp()
    compiled = nnc.compile(copy.deepcopy(eager))
    x = runtime.randn(rows, 4, dtype=runtime.float64)
    for step in range(2):  # the second step reuses the compiled graph
        got, want = _penalty_step(compiled, x), _penalty_step(eager, x)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
        for m in (compiled, eager):
            m.zero_grad()


def test_hessian_vector_product_through_a_compiled_model_matches_eager():
    eager = _mlp(1)
    compiled = nnc.compile(copy.deepcopy(eager))
    x = runtime.randn(3, 4, dtype=runtime.float64)
    results = []
    for model in (compiled, eager):
        params = list(model.parameters())
        loss = model(x).pow(2).sum()
        grads = runtime.autograd.grad(loss, params, create_graph=True)
        vector = [runtime.ones_like(g) for g in grads]
        hvp = runtime.autograd.grad(grads, params, vector)
        results.append([h.numpy().copy() for h in hvp])
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_first_order_training_still_runs_the_compiled_backward():
    compiled = nnc.compile(_mlp())
    compiled(runtime.randn(3, 4, dtype=runtime.float64)).sum().backward()
    (artifact,) = compiled._cache.values()
    assert artifact.backward_plan is not None and not artifact.opaque


class GradientInForward(nn.Module):
    """autograd.grad inside forward (an energy model's force): the forward needs eager autograd."""

    def __init__(self):
        super().__init__()
        self.energy = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))

    def forward(self, x):
        x = x.detach().requires_grad_(True)
        energy = self.energy(x).sum()
        (force,) = runtime.autograd.grad(energy, x, create_graph=True)
        return force.pow(2).sum() + energy


def test_autograd_grad_inside_forward_is_a_graph_break_with_eager_numbers():
    runtime.manual_seed(2)
    eager = GradientInForward().double()
    compiled_model = copy.deepcopy(eager)
    compiled = nnc.compile(compiled_model)
    x = runtime.randn(3, 4, dtype=runtime.float64)
    got, want = compiled(x), eager(x)
    got.backward()
    want.backward()
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-12)
    for a, b in zip(compiled_model.parameters(), eager.parameters()):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-10, atol=1e-12)
    (artifact,) = compiled._cache.values()
    assert "autograd.grad()" in artifact.reason  # the forward runs eagerly; its submodule compiled


def test_create_graph_through_compiled_dropout_is_a_clear_error():
    compiled = nnc.compile(_mlp(dropout=0.5))
    x = runtime.randn(3, 4, dtype=runtime.float64, requires_grad=True)
    out = compiled(x).sum()
    with pytest.raises(RuntimeError, match="draws random numbers"):
        runtime.autograd.grad(out, x, create_graph=True)


def test_create_graph_after_an_input_was_modified_in_place_is_torchs_error():
    compiled = nnc.compile(_mlp())
    x = runtime.randn(3, 4, dtype=runtime.float64)
    h = x.clone().requires_grad_(True)
    h2 = h * 1
    out = compiled(h2).sum()
    with runtime.no_grad():
        h2.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        runtime.autograd.grad(out, h, create_graph=True)


def test_create_graph_through_a_compiled_model_called_with_substituted_parameters():
    """MAML and Hessian-vector products call the model through func.functional_call and differentiate twice: the
    replay under create_graph must read the call's substitutes (swapped back by then), not the module's own
    parameters, whose graph the substitutes are not in (every gradient came back None)."""
    runtime.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 2)).double()
    compiled = nnc.compile(copy.deepcopy(model))
    x = runtime.randn(6, 4, dtype=runtime.float64)
    results = []
    for m in (model, compiled):
        params = {n: p.detach().clone().requires_grad_(True) for n, p in model.named_parameters()}
        loss = (runtime.func.functional_call(m, params, (x,)) ** 2).mean()
        grads = runtime.autograd.grad(loss, list(params.values()), create_graph=True)
        second = runtime.autograd.grad(sum((g ** 2).sum() for g in grads), list(params.values()))
        results.append([g.detach().numpy() for g in grads + second])
    for got, want in zip(results[1], results[0]):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
