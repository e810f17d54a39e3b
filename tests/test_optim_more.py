"""Adadelta, Adagrad, Adamax, NAdam, RAdam, ASGD, Rprop, Adafactor and Muon against torch: parameter trajectories
(float64 and float32), state_dict layout and values, resuming from torch's state_dict, and hyperparameter errors."""
from __future__ import annotations

import numpy as np
import pytest

import runtime
import test_optim as base

CONFIGS = [
    ("Adadelta", dict()),
    ("Adadelta", dict(lr=0.5, rho=0.5, eps=1e-4)),
    ("Adadelta", dict(weight_decay=0.1, maximize=True)),
    ("Adagrad", dict()),
    ("Adagrad", dict(lr=0.1, lr_decay=0.05, initial_accumulator_value=0.3)),
    ("Adagrad", dict(lr=0.1, weight_decay=0.1, eps=1e-4, maximize=True)),
    ("Adamax", dict()),
    ("Adamax", dict(lr=0.05, betas=(0.5, 0.8), weight_decay=0.1)),
    ("Adamax", dict(lr=0.05, maximize=True)),
    ("NAdam", dict()),
    ("NAdam", dict(lr=0.05, momentum_decay=0.01, weight_decay=0.1)),
    ("NAdam", dict(lr=0.05, weight_decay=0.1, decoupled_weight_decay=True, maximize=True)),
    ("RAdam", dict()),
    ("RAdam", dict(lr=0.05, betas=(0.5, 0.6))),  # rho_t passes 5 within the run
    ("RAdam", dict(lr=0.05, betas=(0.5, 0.6), weight_decay=0.1, decoupled_weight_decay=True, maximize=True)),
    ("RAdam", dict(lr=0.05, weight_decay=0.1)),
    ("ASGD", dict()),
    ("ASGD", dict(lr=0.1, lambd=0.01, alpha=0.5, t0=4, weight_decay=0.1)),
    ("ASGD", dict(lr=0.1, t0=2, maximize=True)),
    ("Rprop", dict()),
    ("Rprop", dict(lr=0.1, etas=(0.3, 1.5), step_sizes=(1e-3, 0.2))),
    ("Rprop", dict(lr=0.05, maximize=True)),
]
IDS = [f"{name}-{'-'.join(f'{k}={v}' for k, v in kw.items()) or 'defaults'}" for name, kw in CONFIGS]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name,kwargs", CONFIGS, ids=IDS)
def test_trajectory_matches_torch(name, kwargs, dtype, torch):
    ours = base.trajectory_of(runtime, name, kwargs, dtype)
    theirs = base.trajectory_of(torch, name, kwargs, dtype)
    base.assert_trajectories_close(ours, theirs, dtype)


@pytest.mark.parametrize("name,kwargs", CONFIGS, ids=IDS)
def test_state_dict_layout_matches_torch(name, kwargs, torch):
    dicts = []
    for lib in (runtime, torch):
        params = base.make_params(lib, base.initial_values("float64"))
        opt = getattr(lib.optim, name)(params, **kwargs)
        base.run_steps(lib, opt, params, base.gradient_sequence("float64", steps=5))
        dicts.append(opt.state_dict())
    ours, theirs = dicts
    assert ours["param_groups"] == theirs["param_groups"]
    assert list(ours["state"]) == list(theirs["state"])
    for index, their_state in theirs["state"].items():
        our_state = ours["state"][index]
        assert list(our_state) == list(their_state)
        for key, value in their_state.items():
            assert our_state[key].dtype.name == str(value.dtype).replace("torch.", ""), key
            np.testing.assert_allclose(base.to_numpy(our_state[key]), base.to_numpy(value), rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("name,kwargs", CONFIGS[::3], ids=IDS[::3])
def test_resume_from_torch_state_dict(name, kwargs, torch):
    """Run 4 steps in torch, load its state_dict into runtime, and continue: both trajectories agree."""
    values, grads = base.initial_values("float64"), base.gradient_sequence("float64")
    t_params = base.make_params(torch, values)
    t_opt = getattr(torch.optim, name)(t_params, **kwargs)
    base.run_steps(torch, t_opt, t_params, grads[:4])
    state = t_opt.state_dict()
    converted = {"param_groups": state["param_groups"],
                 "state": {i: {k: runtime.tensor(v.numpy()) for k, v in s.items()} for i, s in state["state"].items()}}
    r_params = [runtime.tensor(p.detach().numpy().copy(), requires_grad=True) for p in t_params]
    r_opt = getattr(runtime.optim, name)(r_params, **kwargs)
    r_opt.load_state_dict(converted)
    ours = base.run_steps(runtime, r_opt, r_params, grads[4:])
    theirs = base.run_steps(torch, t_opt, t_params, grads[4:])
    base.assert_trajectories_close(ours, theirs, "float64")


@pytest.mark.parametrize("name,kwargs", [("Adadelta", dict(rho=1.5)), ("Adagrad", dict(lr_decay=-1)),
                                         ("Adamax", dict(betas=(1.0, 0.9))), ("NAdam", dict(momentum_decay=-1)),
                                         ("RAdam", dict(eps=-1)), ("Rprop", dict(etas=(1.5, 1.2))),
                                         ("ASGD", dict(lr=-1))])
def test_invalid_hyperparameters_raise_value_error(name, kwargs):
    with pytest.raises(ValueError):
        getattr(runtime.optim, name)([runtime.zeros(2, requires_grad=True)], **kwargs)


def test_unsupported_flags_raise_not_implemented():
    with pytest.raises(NotImplementedError, match="capturable"):
        runtime.optim.NAdam([runtime.zeros(2, requires_grad=True)], capturable=True)


@pytest.mark.parametrize("options", [{}, {"weight_decay": 0.1, "maximize": True},
                                     {"lr": 0.1, "d": 2.0, "eps": (1e-20, 1e-4), "beta2_decay": -0.5}],
                         ids=["defaults", "decay-maximize", "options"])
def test_adafactor_matches_torch(torch, options):
    """A 3-D weight (factored second moment over its last two dims) and a bias (a full one), four steps."""
    results = []
    for lib in (runtime, torch):
        rng = np.random.default_rng(0)
        w = lib.nn.Parameter(lib.tensor(rng.standard_normal((2, 3, 4))))
        b = lib.nn.Parameter(lib.tensor(rng.standard_normal(4)))
        opt = lib.optim.Adafactor([w, b], **options)
        for _ in range(4):
            opt.zero_grad()
            ((w.sum(0) * b).sin().sum() + (w ** 2).sum()).backward()
            opt.step()
        state = opt.state_dict()["state"]
        results.append((w.detach().numpy(), b.detach().numpy(), {k: sorted(v) for k, v in state.items()}))
    (w, b, keys), (tw, tb, tkeys) = results
    np.testing.assert_allclose(w, tw, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(b, tb, rtol=1e-12, atol=1e-14)
    assert keys == tkeys == {0: ["col_var", "row_var", "step"], 1: ["step", "variance"]}


def test_adafactor_fits_a_linear_map_and_refuses_bad_hyperparameters():
    runtime.manual_seed(0)
    model = runtime.nn.Linear(4, 3)
    x = runtime.randn(64, 4)
    y = x @ runtime.randn(4, 3)
    opt = runtime.optim.Adafactor(model.parameters(), lr=0.05)
    first = None
    for _ in range(200):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        first = loss.item() if first is None else first
    assert loss.item() < 0.05 * first
    with pytest.raises(ValueError, match="beta2_decay"):
        runtime.optim.Adafactor(model.parameters(), beta2_decay=0.5)


@pytest.mark.parametrize("options", [{}, {"nesterov": False, "adjust_lr_fn": "match_rms_adamw", "lr": 0.05},
                                     {"momentum": 0.5, "weight_decay": 0.0, "ns_steps": 3, "eps": 1e-3}],
                         ids=["defaults", "plain-momentum-moonshot", "options"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_muon_matches_torch(torch, options, dtype):
    """A tall and a wide matrix (the iteration runs on the wide side), four steps: torch's parameters and state."""
    results = []
    for lib in (runtime, torch):
        rng = np.random.default_rng(0)
        w = lib.nn.Parameter(lib.tensor(rng.standard_normal((6, 4)), dtype=getattr(lib, dtype)))
        v = lib.nn.Parameter(lib.tensor(rng.standard_normal((3, 5)), dtype=getattr(lib, dtype)))
        opt = lib.optim.Muon([w, v], **options)
        for _ in range(4):
            opt.zero_grad()
            ((w.sum(1)[:3, None] * v).sin().sum() + (w ** 3).sum()).backward()
            opt.step()
        state = opt.state_dict()
        results.append((w.detach().numpy(), v.detach().numpy(), state["state"][0]["momentum_buffer"].numpy(),
                        state["param_groups"]))
    for ours, theirs in zip(results[0][:3], results[1][:3]):
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-7)
    assert results[0][3] == results[1][3]


def test_muon_orthogonalizes_its_update_and_fits_a_linear_map():
    from runtime.optim.muon import orthogonalize

    g = runtime.randn(16, 6, generator=runtime.Generator().manual_seed(0))
    singular = np.linalg.svd(orthogonalize(g, (3.4445, -4.775, 2.0315), 5, 1e-7).float().numpy(), compute_uv=False)
    assert singular.min() > 0.5 and singular.max() < 1.5  # U S' V^T with S' near 1, whatever g's spread
    runtime.manual_seed(0)
    x = runtime.randn(64, 8)
    target = x @ runtime.randn(8, 8)
    w = runtime.nn.Parameter(runtime.zeros(8, 8))
    opt = runtime.optim.Muon([w], lr=0.05, weight_decay=0.0)
    losses = []
    for _ in range(100):
        opt.zero_grad()
        loss = ((x @ w - target) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.05 * losses[0]


def test_muon_refuses_what_torch_refuses():
    with pytest.raises(ValueError, match="2D parameters"):
        runtime.optim.Muon([runtime.nn.Parameter(runtime.zeros(3))])
    with pytest.raises(ValueError, match="not supported"):
        runtime.optim.Muon([runtime.nn.Parameter(runtime.zeros(3, 3))], adjust_lr_fn="other")
    with pytest.raises(ValueError, match="Learning rate"):
        runtime.optim.Muon([runtime.nn.Parameter(runtime.zeros(3, 3))], lr=-1.0)
    z = runtime.nn.Parameter(runtime.zeros(2, 2, dtype=runtime.complex64))
    z.grad = runtime.ones(2, 2, dtype=runtime.complex64)
    before = z.detach().clone()
    with pytest.raises(RuntimeError, match="complex"):
        runtime.optim.Muon([z]).step()
    assert runtime.equal(z.detach(), before)
