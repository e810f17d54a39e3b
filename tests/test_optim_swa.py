"""swa_utils against torch: AveragedModel (SWA and EMA, with and without buffers), update_bn and SWALR."""
from __future__ import annotations

import numpy as np
import pytest

import runtime
from nn_oracle import copy_weights

RNG = np.random.default_rng(0)


def _model(lib):
    return lib.nn.Sequential(lib.nn.Linear(3, 4), lib.nn.BatchNorm1d(4), lib.nn.ReLU(), lib.nn.Linear(4, 2)).double()


@pytest.mark.parametrize("kind", ["swa", "ema", "ema-buffers"])
def test_averaged_model_matches_torch(kind, torch):
    results = []
    data = [RNG.standard_normal((5, 3)) for _ in range(4)]
    theirs_init = _model(torch)
    for lib in (runtime, torch):
        model = _model(lib)
        if lib is runtime:
            copy_weights(theirs_init, model)
        else:
            model.load_state_dict(theirs_init.state_dict())
        kw = {}
        if kind.startswith("ema"):
            kw["multi_avg_fn"] = lib.optim.swa_utils.get_ema_multi_avg_fn(0.9)
        if kind.endswith("buffers"):
            kw["use_buffers"] = True
        averaged = lib.optim.swa_utils.AveragedModel(model, **kw)
        opt = lib.optim.SGD(model.parameters(), lr=0.1)
        for batch in data:
            opt.zero_grad()
            model(lib.tensor(batch)).pow(2).sum().backward()
            opt.step()
            averaged.update_parameters(model)
        results.append({k: v.detach().numpy().copy() for k, v in averaged.state_dict().items()})
    ours, theirs = results
    assert list(ours) == list(theirs)
    for k in theirs:
        np.testing.assert_allclose(ours[k], theirs[k], rtol=1e-12, atol=1e-14, err_msg=k)


def test_update_bn_matches_torch(torch):
    loader = [(RNG.standard_normal((6, 3)),) for _ in range(3)]
    stats = []
    theirs_init = _model(torch)
    for lib in (runtime, torch):
        model = _model(lib)
        if lib is runtime:
            copy_weights(theirs_init, model)
        else:
            model.load_state_dict(theirs_init.state_dict())
        lib.optim.swa_utils.update_bn([(lib.tensor(b),) for (b,) in loader], model)
        bn = model[1]
        stats.append((bn.running_mean.numpy().copy(), bn.running_var.numpy().copy(), bn.momentum, model.training))
    for a, b in zip(stats[0], stats[1]):
        np.testing.assert_allclose(a, b, rtol=1e-12)


@pytest.mark.parametrize("kw", [dict(swa_lr=0.05), dict(swa_lr=[0.01, 0.2], anneal_epochs=3, anneal_strategy="linear"),
                                dict(swa_lr=0.05, anneal_epochs=0)])
def test_swalr_matches_torch(kw, torch):
    rows = []
    for lib in (runtime, torch):
        params = [lib.zeros(2, requires_grad=True) for _ in range(2)]
        opt = lib.optim.SGD([{"params": [p], "lr": lr} for p, lr in zip(params, (0.1, 0.02))], lr=0.5)
        sched = lib.optim.swa_utils.SWALR(opt, **kw)
        row = [sched.get_last_lr()]
        for _ in range(12):
            opt.step()
            sched.step()
            row.append(sched.get_last_lr())
        rows.append((row, sorted(sched.state_dict())))
    np.testing.assert_allclose(rows[0][0], rows[1][0], rtol=1e-12)
    assert rows[0][1] == rows[1][1]


def test_multi_tensor_ema_and_swa_give_torchs_float32_bits(torch):
    """torch's multi-tensor averages are lerps (_foreach_lerp_), whose bits differ from decay * ema + (1 - decay) *
    model's in a quarter of the elements."""
    values = np.random.default_rng(0).standard_normal((4, 1000)).astype(np.float32)
    results = []
    for lib in (runtime, torch):
        averaged = [lib.tensor(values[0].copy()), lib.tensor(values[2].copy())]
        current = [lib.tensor(values[1]), lib.tensor(values[3])]
        ema = lib.optim.swa_utils.get_ema_multi_avg_fn(0.999)
        for _ in range(5):
            ema(averaged, current, None)
        lib.optim.swa_utils.get_swa_multi_avg_fn()(averaged, current, lib.tensor(3))
        results.append(np.concatenate([a.numpy() for a in averaged]))
    np.testing.assert_array_equal(results[0], results[1])
    with pytest.raises(ValueError, match="decay"):
        runtime.optim.swa_utils.get_ema_multi_avg_fn(1.5)
