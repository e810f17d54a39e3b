"""The lr_scheduler family against torch: lr (and momentum) sequences, state_dict keys and values, resuming from a
state_dict, step(epoch) closed forms, composite schedulers and ReduceLROnPlateau."""
from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

import runtime

SCHEDULERS = {
    "StepLR": lambda m, opt: m.StepLR(opt, step_size=3, gamma=0.5),
    "MultiStepLR": lambda m, opt: m.MultiStepLR(opt, milestones=[2, 5, 5, 9], gamma=0.5),
    "ConstantLR": lambda m, opt: m.ConstantLR(opt, factor=0.25, total_iters=4),
    "LinearLR": lambda m, opt: m.LinearLR(opt, start_factor=0.2, end_factor=0.9, total_iters=6),
    "ExponentialLR": lambda m, opt: m.ExponentialLR(opt, gamma=0.8),
    "PolynomialLR": lambda m, opt: m.PolynomialLR(opt, total_iters=7, power=2.0),
    "MultiplicativeLR": lambda m, opt: m.MultiplicativeLR(opt, lr_lambda=lambda e: 0.95),
    "CosineAnnealingWarmRestarts": lambda m, opt: m.CosineAnnealingWarmRestarts(opt, T_0=3, T_mult=2, eta_min=1e-3),
    "CosineAnnealingWarmRestarts-mult1": lambda m, opt: m.CosineAnnealingWarmRestarts(opt, T_0=4),
    "CyclicLR": lambda m, opt: m.CyclicLR(opt, base_lr=0.01, max_lr=[0.1, 0.05], step_size_up=3, step_size_down=2),
    "CyclicLR-triangular2": lambda m, opt: m.CyclicLR(opt, 0.01, 0.1, step_size_up=2, mode="triangular2"),
    "CyclicLR-exp_range": lambda m, opt: m.CyclicLR(opt, 0.01, 0.1, step_size_up=2, mode="exp_range", gamma=0.9),
    "OneCycleLR": lambda m, opt: m.OneCycleLR(opt, max_lr=[0.5, 0.2], total_steps=30),
    "OneCycleLR-linear-3phase": lambda m, opt: m.OneCycleLR(opt, max_lr=0.3, epochs=3, steps_per_epoch=10,
                                                            anneal_strategy="linear", three_phase=True,
                                                            pct_start=0.2),
    "OneCycleLR-no-momentum": lambda m, opt: m.OneCycleLR(opt, 0.3, total_steps=26, cycle_momentum=False),
    "SequentialLR": lambda m, opt: m.SequentialLR(opt, [m.LinearLR(opt, 0.1, total_iters=3),
                                                        m.ExponentialLR(opt, gamma=0.9),
                                                        m.StepLR(opt, 2, 0.5)], milestones=[4, 9]),
    "ChainedScheduler": lambda m, opt: m.ChainedScheduler([m.ConstantLR(opt, 0.5, total_iters=3),
                                                           m.ExponentialLR(opt, gamma=0.9)]),
}
EPOCHS = 25


def _optimizer(lib, momentum=True):
    params = [lib.zeros(2, requires_grad=True) for _ in range(2)]
    groups = [{"params": [p], "lr": lr} for p, lr in zip(params, (0.1, 0.02))]
    return lib.optim.SGD(groups, lr=0.5, momentum=0.9) if momentum else lib.optim.SGD(groups, lr=0.5)


def _record(lib, make, epochs=EPOCHS):
    opt = _optimizer(lib)
    sched = make(lib.optim.lr_scheduler, opt)
    rows = []
    for epoch in range(epochs + 1):
        if epoch:
            opt.step()
            sched.step()
        rows.append([list(sched.get_last_lr()), [g["lr"] for g in opt.param_groups],
                     [g["momentum"] for g in opt.param_groups]])
    return rows, sched


def _plain(value):
    """A state_dict value with functions and tensors made comparable."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_lrs_and_momentum_match_torch(name, torch):
    ours, our_sched = _record(runtime, SCHEDULERS[name])
    theirs, their_sched = _record(torch, SCHEDULERS[name])
    for epoch, (a, b) in enumerate(zip(ours, theirs)):
        np.testing.assert_allclose(np.array(a, float), np.array(b, float), rtol=1e-12, atol=1e-15,
                                   err_msg=f"epoch {epoch}")
    a, b = our_sched.state_dict(), their_sched.state_dict()
    assert sorted(a) == sorted(b)
    skip = {"lr_lambdas", "_schedulers", "_scale_fn_custom", "_scale_fn_ref", "_last_lr"}
    for key in b:
        if key not in skip:
            assert a[key] == b[key], key
    if "_schedulers" in b:
        for x, y in zip(a["_schedulers"], b["_schedulers"]):
            assert sorted(x) == sorted(y)


@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_state_dict_round_trip_resumes_the_schedule(name):
    make = SCHEDULERS[name]
    reference, _ = _record(runtime, make, epochs=12)
    opt = _optimizer(runtime)
    sched = make(runtime.optim.lr_scheduler, opt)
    for _ in range(5):
        opt.step()
        sched.step()
    saved_opt, saved_sched = copy.deepcopy(opt.state_dict()), pickle.loads(pickle.dumps(sched.state_dict()))
    fresh = _optimizer(runtime)
    fresh_sched = make(runtime.optim.lr_scheduler, fresh)
    fresh.load_state_dict(saved_opt)
    fresh_sched.load_state_dict(saved_sched)
    for epoch in range(6, 13):
        fresh.step()
        fresh_sched.step()
        np.testing.assert_allclose(fresh_sched.get_last_lr(), reference[epoch][0], rtol=1e-12)


def test_lr_scheduler_state_dict_has_torchs_keys(torch):
    keys = []
    for lib in (runtime, torch):
        opt = _optimizer(lib)
        keys.append(sorted(lib.optim.lr_scheduler.StepLR(opt, 3).state_dict()))
    assert keys[0] == keys[1]
    assert "_get_lr_called_within_step" in keys[0]


@pytest.mark.parametrize("name,make", [
    ("MultiStepLR", lambda m, o: m.MultiStepLR(o, [2, 4], 0.5)),
    ("ExponentialLR", lambda m, o: m.ExponentialLR(o, 0.7)),
    ("LinearLR", lambda m, o: m.LinearLR(o, 0.5, total_iters=4)),
    ("PolynomialLR", lambda m, o: m.PolynomialLR(o, 6, 1.5)),
    ("ConstantLR", lambda m, o: m.ConstantLR(o, 0.5, 3)),
    ("CosineAnnealingWarmRestarts", lambda m, o: m.CosineAnnealingWarmRestarts(o, 3, 2)),
])
def test_step_with_epoch_matches_torch(name, make, torch):
    values = []
    for lib in (runtime, torch):
        opt = _optimizer(lib)
        sched = make(lib.optim.lr_scheduler, opt)
        opt.step()
        row = []
        for epoch in (5, 2, 7.5 if name == "CosineAnnealingWarmRestarts" else 7):
            with pytest.warns(UserWarning) if name != "CosineAnnealingWarmRestarts" else _nothing():
                sched.step(epoch)
            row.append(sched.get_last_lr())
        values.append(row)
    np.testing.assert_allclose(values[0], values[1], rtol=1e-12)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("kw", [dict(), dict(mode="max", threshold_mode="abs", patience=1, cooldown=2),
                                dict(factor=0.5, patience=0, min_lr=[0.05, 0.001], threshold=0.1)])
def test_reduce_lr_on_plateau_matches_torch(kw, torch):
    metrics = [1.0, 0.9, 0.95, 0.95, 0.96, 0.89, 0.9, 0.91, 0.92, 0.93, 0.94] * 3
    if kw.get("mode") == "max":
        metrics = [-m for m in metrics]
    rows = []
    for lib in (runtime, torch):
        opt = _optimizer(lib)
        sched = lib.optim.lr_scheduler.ReduceLROnPlateau(opt, **kw)
        row = []
        for m in metrics:
            opt.step()
            sched.step(m)
            row.append(list(sched.get_last_lr()))
        rows.append((row, sched.state_dict()))
    np.testing.assert_allclose(rows[0][0], rows[1][0], rtol=1e-12)
    assert sorted(rows[0][1]) == sorted(rows[1][1])
    assert rows[0][1]["num_bad_epochs"] == rows[1][1]["num_bad_epochs"]


def test_cyclic_lr_cycles_adam_betas(torch):
    rows = []
    for lib in (runtime, torch):
        opt = lib.optim.Adam([lib.zeros(2, requires_grad=True)], lr=0.1)
        sched = lib.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.3, total_steps=10)
        row = []
        for _ in range(9):
            opt.step()
            sched.step()
            row.append(opt.param_groups[0]["betas"][0])
        rows.append(row)
    np.testing.assert_allclose(rows[0], rows[1], rtol=1e-12)


def test_scheduler_errors():
    opt = _optimizer(runtime)
    sched = runtime.optim.lr_scheduler
    with pytest.raises(ValueError, match="Factor should be < 1.0"):
        sched.ReduceLROnPlateau(opt, factor=1.5)
    with pytest.raises(ValueError, match="total_steps"):
        sched.OneCycleLR(opt, 0.1)
    with pytest.raises(ValueError, match="momentum"):
        sched.CyclicLR(runtime.optim.Adagrad([runtime.zeros(2, requires_grad=True)]), 0.01, 0.1)
    with pytest.raises(ValueError, match="number of milestone"):
        sched.SequentialLR(opt, [sched.StepLR(opt, 2)], milestones=[3])
    with pytest.raises(ValueError, match="T_0"):
        sched.CosineAnnealingWarmRestarts(opt, 0)
    one = sched.OneCycleLR(_optimizer(runtime), 0.1, total_steps=2)
    one.step()
    one.step()
    with pytest.raises(ValueError, match="Tried to step 3 times"):
        one.step()
