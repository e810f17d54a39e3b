"""An MLP built from runtime.nn trains like the same MLP in torch.nn: step-for-step losses and final weights.

Both models start from torch's initial weights (copied into runtime through numpy) and see the same
mini-batches, drawn once with a numpy RNG from a fixed data set. The labels come from a linear teacher with
some of them flipped at random, so the loss stays well away from zero, where float32 rounding alone would
make a relative comparison meaningless.
"""
from __future__ import annotations

import numpy as np
import pytest

import runtime

SIZES = (20, 64, 64, 5)
STEPS = 100
LOSS_RTOL = 1e-4
PARAM_TOL = dict(rtol=1e-4, atol=1e-5)

OPTIMIZERS = {
    "adam": lambda lib, params: lib.optim.Adam(params, lr=1e-2),
    "sgd_momentum_wd": lambda lib, params: lib.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-4),
}


# ---------------------------------------------------------------------------------------------
# helpers: the same code drives runtime and torch
# ---------------------------------------------------------------------------------------------

def make_data(seed=0, n=2048, batch=64, steps=STEPS, noise=0.2):
    """Features, noisy teacher labels and one index array per training step (all from numpy)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, SIZES[0])).astype(np.float32)
    teacher = rng.standard_normal((SIZES[0], SIZES[-1]))
    y = (x @ teacher).argmax(1)
    flip = rng.random(n) < noise
    y[flip] = rng.integers(0, SIZES[-1], int(flip.sum()))
    batches = [rng.choice(n, batch, replace=False) for _ in range(steps)]
    return x, y.astype(np.int64), batches


def make_mlp(lib, sizes=SIZES):
    """Linear -> ReLU -> ... -> Linear, as lib.nn.Sequential."""
    layers = []
    for i, (d_in, d_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        if i:
            layers.append(lib.nn.ReLU())
        layers.append(lib.nn.Linear(d_in, d_out))
    return lib.nn.Sequential(*layers)


def full_loss(lib, model, x, y) -> float:
    """Cross-entropy over the whole data set, without building a graph."""
    with lib.no_grad():
        return lib.nn.CrossEntropyLoss()(model(lib.tensor(x)), lib.tensor(y)).item()


def train(lib, model, make_optimizer, x, y, batches):
    """One optimizer step per mini-batch; returns the per-step losses and the final state_dict as numpy."""
    opt = make_optimizer(lib, model.parameters())
    loss_fn = lib.nn.CrossEntropyLoss()
    losses = []
    for idx in batches:
        xb, yb = lib.tensor(x[idx]), lib.tensor(y[idx])
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    params = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    return np.array(losses), params


def twin_models(torch, seed=0):
    """A torch MLP (torch's default init) and a runtime MLP loaded with the very same weights."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        torch_model = make_mlp(torch)
    runtime_model = make_mlp(runtime)
    runtime_model.load_state_dict({k: runtime.tensor(v.numpy()) for k, v in torch_model.state_dict().items()})
    return runtime_model, torch_model


# ---------------------------------------------------------------------------------------------
# tests
# ---------------------------------------------------------------------------------------------

def test_weights_copied_from_torch(torch):
    ours, theirs = twin_models(torch)
    ours_sd, theirs_sd = ours.state_dict(), theirs.state_dict()
    assert list(ours_sd) == list(theirs_sd)
    for k in theirs_sd:
        np.testing.assert_array_equal(ours_sd[k].detach().numpy(), theirs_sd[k].numpy(), err_msg=k)
    x, y, _ = make_data()
    np.testing.assert_allclose(full_loss(runtime, ours, x, y), full_loss(torch, theirs, x, y), rtol=1e-6)


@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_mlp_training_matches_torch_step_for_step(opt_name, torch):
    x, y, batches = make_data()
    ours_model, theirs_model = twin_models(torch)
    start = full_loss(torch, theirs_model, x, y)

    ours, ours_params = train(runtime, ours_model, OPTIMIZERS[opt_name], x, y, batches)
    theirs, theirs_params = train(torch, theirs_model, OPTIMIZERS[opt_name], x, y, batches)

    assert ours.shape == theirs.shape == (STEPS,)
    assert np.all(np.isfinite(ours))
    rel = np.abs(ours - theirs) / np.abs(theirs)
    worst = int(rel.argmax())
    assert rel.max() <= LOSS_RTOL, (
        f"{opt_name}: loss differs by {rel.max():.3g} (relative) at step {worst}: "
        f"runtime {ours[worst]!r} vs torch {theirs[worst]!r}; first bad step "
        f"{int(np.argmax(rel > LOSS_RTOL))}")

    assert list(ours_params) == list(theirs_params)
    for k in theirs_params:
        np.testing.assert_allclose(ours_params[k], theirs_params[k], **PARAM_TOL, err_msg=f"{opt_name}: {k}")

    # the comparison is not vacuous: both runs actually trained
    end = full_loss(torch, theirs_model, x, y)
    assert end < 0.75 * start
    np.testing.assert_allclose(full_loss(runtime, ours_model, x, y), end, rtol=LOSS_RTOL)


def test_runtime_mlp_loss_decreases_with_adam_without_torch():
    runtime.manual_seed(0)
    model = make_mlp(runtime)
    x, y, batches = make_data()
    start = full_loss(runtime, model, x, y)
    losses, params = train(runtime, model, OPTIMIZERS["adam"], x, y, batches)
    end = full_loss(runtime, model, x, y)
    assert np.all(np.isfinite(losses))
    assert all(np.all(np.isfinite(v)) for v in params.values())
    assert end < 0.6 * start, (start, end)
    assert losses[-10:].mean() < 0.75 * losses[:10].mean(), (losses[:10], losses[-10:])
