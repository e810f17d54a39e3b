"""A two-layer network written with raw tensors trains like the same network in torch, step for step."""
from __future__ import annotations

import numpy as np

import runtime


def make_problem(seed=0, n=64, d_in=10, hidden=32, classes=3):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d_in)).astype(np.float32)
    y = rng.integers(0, classes, n)
    weights = [rng.standard_normal((d_in, hidden)).astype(np.float32) * 0.3,
               np.zeros(hidden, np.float32),
               rng.standard_normal((hidden, classes)).astype(np.float32) * 0.3,
               np.zeros(classes, np.float32)]
    return x, y, weights


def train(lib, x, y, weights, steps=25, lr=0.1):
    """Hand-written SGD on a ReLU MLP with cross-entropy; the same code for runtime and torch."""
    x, y = lib.tensor(x), lib.tensor(y)
    w1, b1, w2, b2 = (lib.tensor(w, requires_grad=True) for w in weights)
    rows = lib.arange(x.shape[0])
    losses = []
    for _ in range(steps):
        logits = (x @ w1 + b1).relu() @ w2 + b2
        loss = -logits.log_softmax(1)[rows, y].mean()
        loss.backward()
        with lib.no_grad():
            for p in (w1, b1, w2, b2):
                p -= lr * p.grad
                p.grad = None
        losses.append(loss.item())
    return np.array(losses), [p.detach().numpy() for p in (w1, b1, w2, b2)]


def test_training_reduces_loss_without_torch():
    x, y, weights = make_problem()
    losses, _ = train(runtime, x, y, weights, steps=40, lr=0.2)
    assert losses[-1] < 0.7 * losses[0]
    assert np.all(np.isfinite(losses))


def test_training_matches_torch_step_for_step(torch):
    x, y, weights = make_problem()
    ours, our_params = train(runtime, x, y, weights)
    theirs, their_params = train(torch, x, y, weights)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)
    for a, b in zip(our_params, their_params):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
