"""runtime.optim follows torch.optim: parameter trajectories, state dicts, param groups, schedulers and errors."""
from __future__ import annotations

import copy
import math
import pickle

import numpy as np
import pytest

import runtime
import runtime.optim as optim
from runtime.optim import lr_scheduler

SHAPES = [(4, 3), (5,), ()]
STEPS = 12
TOLERANCE = {"float64": dict(rtol=1e-6, atol=1e-12), "float32": dict(rtol=1e-5, atol=1e-6)}

CONFIGS = [
    ("SGD", dict(lr=0.1)),
    ("SGD", dict(lr=0.05, momentum=0.9)),
    ("SGD", dict(lr=0.05, momentum=0.9, dampening=0.3)),
    ("SGD", dict(lr=0.05, momentum=0.8, nesterov=True)),
    ("SGD", dict(lr=0.1, weight_decay=0.1)),
    ("SGD", dict(lr=0.1, maximize=True)),
    ("SGD", dict(lr=0.05, momentum=0.9, weight_decay=0.05, nesterov=True, maximize=True)),
    ("Adam", dict()),
    ("Adam", dict(lr=0.05)),
    ("Adam", dict(lr=0.05, betas=(0.3, 0.5))),
    ("Adam", dict(lr=0.05, weight_decay=0.1)),
    ("Adam", dict(lr=0.05, amsgrad=True)),
    ("Adam", dict(lr=0.05, maximize=True)),
    ("Adam", dict(lr=0.05, eps=1e-3, weight_decay=0.1, amsgrad=True, maximize=True)),
    ("Adam", dict(lr=0.05, weight_decay=0.1, decoupled_weight_decay=True)),
    ("AdamW", dict(lr=0.05)),
    ("AdamW", dict(lr=0.05, weight_decay=0.2, amsgrad=True)),
    ("AdamW", dict(lr=0.05, betas=(0.6, 0.9), maximize=True)),
    ("RMSprop", dict()),
    ("RMSprop", dict(lr=0.01, alpha=0.4)),
    ("RMSprop", dict(lr=0.01, momentum=0.9)),
    ("RMSprop", dict(lr=0.01, centered=True)),
    ("RMSprop", dict(lr=0.01, momentum=0.5, centered=True, weight_decay=0.1)),
    ("RMSprop", dict(lr=0.01, eps=1e-4, maximize=True)),
]
CONFIG_IDS = [f"{name}-{'-'.join(f'{k}={v}' for k, v in kw.items()) or 'defaults'}" for name, kw in CONFIGS]


# ---------------------------------------------------------------------------------------------
# helpers: the same code drives runtime and torch
# ---------------------------------------------------------------------------------------------

def initial_values(dtype: str, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [np.asarray(rng.standard_normal(s)).astype(dtype) for s in SHAPES]


def gradient_sequence(dtype: str, steps: int = STEPS, seed: int = 1) -> list:
    """Per step, one gradient per parameter; parameter 1 has no gradient at step 3 (it must be skipped)."""
    rng = np.random.default_rng(seed)
    seq = []
    for step in range(steps):
        scale = 0.1 + 2.0 * rng.random()  # varying magnitudes, so amsgrad's running max matters
        seq.append([np.asarray(scale * rng.standard_normal(s)).astype(dtype) for s in SHAPES])
        if step == 3:
            seq[-1][1] = None
    return seq


def make_params(lib, values) -> list:
    return [lib.tensor(v.copy(), requires_grad=True) for v in values]


def run_steps(lib, opt, params, grads) -> list:
    """Set each gradient by hand, step, and record every parameter after every step."""
    trajectory = []
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = None if g is None else lib.tensor(g.copy())
        opt.step()
        trajectory.append([p.detach().numpy().copy() for p in params])
    return trajectory


def trajectory_of(lib, name, kwargs, dtype) -> list:
    params = make_params(lib, initial_values(dtype))
    opt = getattr(lib.optim, name)(params, **kwargs)
    return run_steps(lib, opt, params, gradient_sequence(dtype))


def assert_trajectories_close(ours, theirs, dtype) -> None:
    for step, (a_step, b_step) in enumerate(zip(ours, theirs)):
        for i, (a, b) in enumerate(zip(a_step, b_step)):
            assert a.dtype == b.dtype
            np.testing.assert_allclose(a, b, **TOLERANCE[dtype], err_msg=f"step {step}, parameter {i}")


def to_numpy(value):
    """State values from either library as numpy arrays / plain Python values, for comparisons."""
    if hasattr(value, "detach"):
        return value.detach().numpy()
    if isinstance(value, dict):
        return {k: to_numpy(v) for k, v in value.items()}
    return value


# ---------------------------------------------------------------------------------------------
# trajectories against torch
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name,kwargs", CONFIGS, ids=CONFIG_IDS)
def test_trajectory_matches_torch(name, kwargs, dtype, torch):
    ours = trajectory_of(runtime, name, kwargs, dtype)
    theirs = trajectory_of(torch, name, kwargs, dtype)
    assert_trajectories_close(ours, theirs, dtype)


@pytest.mark.parametrize("name,kwargs", CONFIGS, ids=CONFIG_IDS)
def test_state_dict_layout_matches_torch(name, kwargs, torch):
    dicts = []
    for lib in (runtime, torch):
        params = make_params(lib, initial_values("float64"))
        opt = getattr(lib.optim, name)(params, **kwargs)
        run_steps(lib, opt, params, gradient_sequence("float64", steps=3))
        dicts.append(opt.state_dict())
    ours, theirs = dicts
    assert ours["param_groups"] == theirs["param_groups"]
    assert list(ours["state"]) == list(theirs["state"])
    for index, their_state in theirs["state"].items():
        our_state = ours["state"][index]
        assert list(our_state) == list(their_state)
        for key, value in their_state.items():
            assert our_state[key].dtype.name == str(value.dtype).replace("torch.", ""), key
            np.testing.assert_allclose(to_numpy(our_state[key]), to_numpy(value), rtol=1e-6, atol=1e-12)


def test_param_groups_with_different_options_match_torch(torch):
    values, grads = initial_values("float64"), gradient_sequence("float64")
    trajectories = []
    for lib in (runtime, torch):
        a, b, c = make_params(lib, values)
        opt = lib.optim.SGD([{"params": [a], "lr": 0.3}, {"params": [b, c], "momentum": 0.5}], lr=0.05)
        trajectories.append(run_steps(lib, opt, [a, b, c], grads))
    assert_trajectories_close(*trajectories, "float64")


def test_adam_param_groups_match_torch(torch):
    values, grads = initial_values("float32"), gradient_sequence("float32")
    trajectories = []
    for lib in (runtime, torch):
        a, b, c = make_params(lib, values)
        opt = lib.optim.Adam([{"params": [a, c], "betas": (0.5, 0.9), "amsgrad": True}, {"params": [b]}], lr=0.02)
        trajectories.append(run_steps(lib, opt, [a, b, c], grads))
    assert_trajectories_close(*trajectories, "float32")


def test_add_param_group_midway_matches_torch(torch):
    values, grads = initial_values("float64"), gradient_sequence("float64")
    trajectories = []
    for lib in (runtime, torch):
        a, b, c = make_params(lib, values)
        opt = lib.optim.RMSprop([a], lr=0.01, momentum=0.3)
        first = run_steps(lib, opt, [a, b, c], grads[:4])
        opt.add_param_group({"params": [b, c], "lr": 0.05, "centered": True})
        trajectories.append(first + run_steps(lib, opt, [a, b, c], grads[4:]))
    assert_trajectories_close(*trajectories, "float64")


def test_training_loop_with_backward_matches_torch(torch):
    """Gradients from backward() on a least-squares problem, Adam + StepLR, zero_grad each step."""
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((16, 4)), rng.standard_normal((16, 1))
    w0 = rng.standard_normal((4, 1))
    runs = []
    for lib in (runtime, torch):
        w, xt, yt = lib.tensor(w0.copy(), requires_grad=True), lib.tensor(x), lib.tensor(y)
        opt = lib.optim.Adam([w], lr=0.1)
        sched = lib.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
        losses = []
        for _ in range(15):
            opt.zero_grad()
            loss = ((xt @ w - yt) ** 2).mean()
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.item())
        runs.append((np.array(losses), w.detach().numpy().copy()))
    np.testing.assert_allclose(runs[0][0], runs[1][0], rtol=1e-6)
    np.testing.assert_allclose(runs[0][1], runs[1][1], rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# behaviour that needs no torch
# ---------------------------------------------------------------------------------------------

def quadratic_losses(make_opt, steps=30) -> list:
    target = runtime.tensor([1.0, -2.0, 3.0])
    w = runtime.zeros(3, requires_grad=True)
    opt = make_opt([w])
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = ((w - target) ** 2).sum()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("make_opt", [
    lambda ps: optim.SGD(ps, lr=0.1),
    lambda ps: optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True),
    lambda ps: optim.Adam(ps, lr=0.3),
    lambda ps: optim.AdamW(ps, lr=0.3),
    lambda ps: optim.RMSprop(ps, lr=0.1),
], ids=["SGD", "SGD-nesterov", "Adam", "AdamW", "RMSprop"])
def test_optimizers_decrease_a_quadratic(make_opt):
    losses = quadratic_losses(make_opt)
    assert losses[-1] < 0.05 * losses[0]
    assert all(math.isfinite(v) for v in losses)


def test_sgd_step_is_exact_on_small_example():
    w = runtime.tensor([1.0, 2.0], dtype=runtime.float64, requires_grad=True)
    opt = optim.SGD([w], lr=0.5, momentum=0.5)
    for _ in range(2):
        w.grad = runtime.tensor([2.0, -4.0], dtype=runtime.float64)
        opt.step()
    # buf1 = g, w1 = w0 - 0.5 g; buf2 = 0.5 g + g, w2 = w1 - 0.75 g
    np.testing.assert_array_equal(w.detach().numpy(), [1.0 - 2.5, 2.0 + 5.0])


def _numpy_sgd_momentum(p, g, buf, lr, momentum, dampening, weight_decay, nesterov, maximize):
    """The update as numpy operations, one rounding each: what the one-pass kernel must reproduce exactly."""
    d = -g if maximize else g
    if weight_decay:
        d = d + weight_decay * p
    buf *= momentum
    buf += d if dampening == 0 else (1 - dampening) * d
    p -= lr * (d + momentum * buf if nesterov else buf)


SGD_MOMENTUM_CONFIGS = [c for n, c in CONFIGS if n == "SGD" and c.get("momentum")]


@pytest.mark.parametrize("parallel", [False, True], ids=["serial", "parallel"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("kwargs", SGD_MOMENTUM_CONFIGS, ids=str)
def test_sgd_one_pass_update_equals_the_numpy_operations_bit_for_bit(kwargs, dtype, parallel):
    from runtime.optim._fused import sgd_momentum

    options = dict(dict(dampening=0, weight_decay=0, nesterov=False, maximize=False), **kwargs)
    rng = np.random.default_rng(3)
    p, g, buf = (rng.standard_normal((37, 19)).astype(dtype) for _ in range(3))
    expected_p, expected_buf = p.copy(), buf.copy()
    for _ in range(3):
        _numpy_sgd_momentum(expected_p, g, expected_buf, **options)
        sgd_momentum(p, g, buf, **options, parallel=parallel)
    np.testing.assert_array_equal(p, expected_p)
    np.testing.assert_array_equal(buf, expected_buf)


def test_sgd_one_pass_and_numpy_paths_give_the_same_trajectory():
    """A large contiguous parameter takes the one-pass kernel (serial and parallel steps while the optimizer
    times both), one with a transposed gradient the numpy path: the same values at every step."""
    from runtime.optim._launch import MIN_ELEMENTS, fusable

    shape = (4, MIN_ELEMENTS // 4)
    assert not fusable(np.zeros(shape, np.float16), np.zeros(shape, np.float16), np.zeros(shape, np.float16))
    assert not fusable(np.zeros((4, 3), np.float32), np.zeros((4, 3), np.float32), np.zeros((4, 3), np.float32))
    w = runtime.tensor(np.ones(shape, np.float32), requires_grad=True)
    v = runtime.tensor(np.ones(shape, np.float32), requires_grad=True)
    opt = optim.SGD([w, v], lr=0.1, momentum=0.9, weight_decay=0.01)
    rng = np.random.default_rng(4)
    for step in range(2 * opt._launch.TRIALS + 2):
        g = rng.standard_normal(shape[::-1]).astype(np.float32)
        w.grad = runtime.tensor(np.ascontiguousarray(g.T))
        v.grad = runtime.tensor(g).t()  # a transposed view: not C-contiguous
        assert fusable(w.detach().numpy(), w.grad.numpy(), w.detach().numpy())
        assert not fusable(v.detach().numpy(), v.grad.numpy(), v.detach().numpy())
        opt.step()
        np.testing.assert_array_equal(w.detach().numpy(), v.detach().numpy(), err_msg=f"step {step}")
    assert opt._launch.parallel is not None  # the timing trials are over and one mode was kept


def test_sgd_subclass_with_its_own_step_still_updates_through_the_one_pass_kernel():
    from runtime.optim._launch import MIN_ELEMENTS

    class OwnStep(optim.SGD):
        def step(self, closure=None):
            with runtime.no_grad():
                for group in self.param_groups:
                    for p in group["params"]:
                        self._update(p, p.grad.numpy(), group)

    shape = (2, MIN_ELEMENTS // 2)
    w = runtime.tensor(np.ones(shape, np.float32), requires_grad=True)
    opt = OwnStep([w], lr=0.1, momentum=0.9)
    for _ in range(3):
        w.grad = runtime.tensor(np.ones(shape, np.float32))
        opt.step()
    expected = np.ones(shape, np.float32)
    buf = np.zeros(shape, np.float32)
    for step in range(3):
        g = np.ones(shape, np.float32)
        buf = g.copy() if step == 0 else buf * np.float32(0.9) + g
        expected -= np.float32(0.1) * buf
    np.testing.assert_array_equal(w.detach().numpy(), expected)


ADAM_CONFIGS = [(n, c) for n, c in CONFIGS if n in ("Adam", "AdamW")]


def _adam_trajectory(name, kwargs, dtype, fused, shape=(23, 17), steps=6):
    """Parameter and moment values after each step, with the one-pass kernel on (fused) or numpy's operations."""
    from runtime.optim import adam

    saved = adam.ADAM_MIN_ELEMENTS
    adam.ADAM_MIN_ELEMENTS = 0 if fused else 1 << 62
    try:
        rng = np.random.default_rng(5)
        w = runtime.tensor(rng.standard_normal(shape).astype(dtype), requires_grad=True)
        opt = getattr(optim, name)([w], **kwargs)
        trajectory = []
        for _ in range(steps):
            w.grad = runtime.tensor(rng.standard_normal(shape).astype(dtype))
            opt.step()
            state = opt.state[w]
            trajectory.append([w.detach().numpy().copy()] + [state[k].numpy().copy() for k in
                                                              ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
                                                              if k in state])
        return trajectory, opt
    finally:
        adam.ADAM_MIN_ELEMENTS = saved


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name,kwargs", ADAM_CONFIGS, ids=[str(c) for c in ADAM_CONFIGS])
def test_adam_one_pass_update_equals_the_numpy_operations_bit_for_bit(name, kwargs, dtype):
    """Serial and parallel steps (the optimizer times both on its first steps) give numpy's bits exactly."""
    from runtime.optim._launch import LaunchChoice

    fused, opt = _adam_trajectory(name, kwargs, dtype, fused=True, steps=2 * LaunchChoice.TRIALS + 2)
    numpy_path, _ = _adam_trajectory(name, kwargs, dtype, fused=False, steps=len(fused))
    assert opt._launch.parallel is not None  # both modes ran
    for step, (a_arrays, b_arrays) in enumerate(zip(fused, numpy_path)):
        for a, b in zip(a_arrays, b_arrays):
            np.testing.assert_array_equal(a, b, err_msg=f"step {step}")


@pytest.mark.parametrize("shape", [(0,), (1,), (1, 1)])
def test_adam_one_pass_update_on_edge_shapes(shape):
    fused, _ = _adam_trajectory("AdamW", {"amsgrad": True}, "float32", fused=True, shape=shape, steps=3)
    numpy_path, _ = _adam_trajectory("AdamW", {"amsgrad": True}, "float32", fused=False, shape=shape, steps=3)
    for a_arrays, b_arrays in zip(fused, numpy_path):
        for a, b in zip(a_arrays, b_arrays):
            np.testing.assert_array_equal(a, b)


def test_adam_one_pass_gives_inf_and_nan_as_numpy():
    """A zero denominator (eps 0, zero gradient) and a non-finite gradient: numpy's inf/nan, no exception."""
    for grad in (0.0, np.inf, np.nan):
        results = []
        for fused in (True, False):
            from runtime.optim import adam

            saved, adam.ADAM_MIN_ELEMENTS = adam.ADAM_MIN_ELEMENTS, (0 if fused else 1 << 62)
            try:
                w = runtime.tensor(np.ones(3, np.float32), requires_grad=True)
                opt = optim.Adam([w], eps=0.0)
                w.grad = runtime.tensor(np.full(3, grad, np.float32))
                with np.errstate(all="ignore"):
                    opt.step()
                results.append(w.detach().numpy().copy())
            finally:
                adam.ADAM_MIN_ELEMENTS = saved
        np.testing.assert_array_equal(results[0], results[1])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kwargs", [dict(), dict(weight_decay=0.1, maximize=True), dict(betas=(0.3, 0.5))],
                         ids=["defaults", "wd-maximize", "betas"])
def test_adam_many_parameters_in_few_calls_equal_one_call_per_parameter(kwargs, dtype):
    """More parameters than one many-parameter call takes (sizes 0, 1 and past a parallel chunk, one without a
    gradient, one non-contiguous gradient): serial and parallel batched steps give the per-parameter path's bits."""
    from runtime.optim import _fused, adam
    from runtime.optim._launch import LaunchChoice

    rng = np.random.default_rng(3)
    shapes = [(0,), (1,), (3, 5), (_fused._CHUNK + 7,), (64,)] * 4 + [(2 * _fused._CHUNK, 3)]
    assert len(shapes) > _fused.MANY

    def trajectory(batched):
        values = [rng.standard_normal(s).astype(dtype) for s in shapes]
        params = [runtime.tensor(v.copy(), requires_grad=True) for v in values]
        opt = optim.AdamW(params, lr=0.05, **kwargs)
        if not batched:  # the per-parameter path: one _update call each
            opt._step_group = lambda group: optim.Optimizer._step_group(opt, group)
        out = []
        for step in range(2 * LaunchChoice.TRIALS + 2):
            for k, p in enumerate(params):
                g = np.asarray(rng.standard_normal(shapes[k]), dtype=dtype)
                p.grad = None if k == 2 and step % 3 == 0 else runtime.tensor(g if k != 4 else g[::-1])
            opt.step()
            out.append([p.detach().numpy().copy() for p in params] + [opt.state[p][m].numpy().copy() for p in
                                                                      params if opt.state[p] for m in
                                                                      ("exp_avg", "exp_avg_sq")])
        return out, opt

    saved = adam.ADAM_MIN_ELEMENTS
    try:
        adam.ADAM_MIN_ELEMENTS = 0
        rng = np.random.default_rng(3)
        batched, opt = trajectory(True)
        rng = np.random.default_rng(3)
        single, _ = trajectory(False)
    finally:
        adam.ADAM_MIN_ELEMENTS = saved
    assert opt._launch.parallel is not None  # both modes ran
    for step, (a_arrays, b_arrays) in enumerate(zip(batched, single)):
        assert len(a_arrays) == len(b_arrays)
        for a, b in zip(a_arrays, b_arrays):
            np.testing.assert_array_equal(a, b, err_msg=f"step {step}")


def test_launch_choice_tries_serial_then_parallel_and_keeps_the_faster():
    from runtime.optim._launch import LaunchChoice

    for parallel_seconds, expected in ((0.001, True), (0.05, False)):
        choice = LaunchChoice()
        modes = []
        while choice.parallel is None:
            mode = choice.next()
            modes.append(mode)
            choice.record(mode, parallel_seconds if mode else 0.002)
        assert modes == [False] * LaunchChoice.TRIALS + [True] * LaunchChoice.TRIALS
        assert choice.parallel is expected and choice.next() is expected


@pytest.mark.parametrize("name,kwargs", CONFIGS, ids=CONFIG_IDS)
def test_state_dict_round_trip_continues_identically(name, kwargs):
    values, grads = initial_values("float64"), gradient_sequence("float64")
    params = make_params(runtime, values)
    reference = run_steps(runtime, getattr(optim, name)(params, **kwargs), params, grads)

    params = make_params(runtime, values)
    first = getattr(optim, name)(params, **kwargs)
    run_steps(runtime, first, params, grads[:5])
    saved = pickle.loads(pickle.dumps(first.state_dict()))  # as a checkpoint on disk would be
    resumed_params = make_params(runtime, [p.detach().numpy() for p in params])
    resumed = getattr(optim, name)(resumed_params, **kwargs)
    resumed.load_state_dict(saved)
    continued = run_steps(runtime, resumed, resumed_params, grads[5:])
    for a_step, b_step in zip(reference[5:], continued):
        for a, b in zip(a_step, b_step):
            np.testing.assert_array_equal(a, b)


def test_load_state_dict_copies_state_tensors():
    p = runtime.tensor([1.0, 2.0], requires_grad=True)
    source = optim.Adam([p], lr=0.1)
    p.grad = runtime.tensor([0.5, -0.5])
    source.step()
    q = runtime.tensor([1.0, 2.0], requires_grad=True)
    target = optim.Adam([q], lr=0.1)
    target.load_state_dict(source.state_dict())
    before = target.state[q]["exp_avg"].numpy().copy()
    source.step()  # mutates the source's state in place
    np.testing.assert_array_equal(target.state[q]["exp_avg"].numpy(), before)
    assert target.state[q]["exp_avg"] is not source.state[p]["exp_avg"]
    assert target.state[q]["step"].item() == 1.0


def test_load_state_dict_restores_hyperparameters_and_keeps_params():
    a, b = make_params(runtime, initial_values("float64")[:2])
    source = optim.SGD([{"params": [a], "lr": 0.2}, {"params": [b]}], lr=0.01, momentum=0.9)
    x, y = make_params(runtime, initial_values("float64")[:2])
    target = optim.SGD([{"params": [x]}, {"params": [y]}], lr=0.5)
    target.load_state_dict(source.state_dict())
    assert [g["lr"] for g in target.param_groups] == [0.2, 0.01]
    assert target.param_groups[0]["momentum"] == 0.9
    assert target.param_groups[0]["params"][0] is x and target.param_groups[1]["params"][0] is y


def test_load_state_dict_casts_float_state_to_the_parameter_dtype():
    p = runtime.tensor([1.0, 2.0], dtype=runtime.float64, requires_grad=True)
    source = optim.RMSprop([p], momentum=0.5)
    p.grad = runtime.tensor([1.0, 1.0], dtype=runtime.float64)
    source.step()
    q = runtime.tensor([1.0, 2.0], requires_grad=True)  # float32
    target = optim.RMSprop([q], momentum=0.5)
    target.load_state_dict(source.state_dict())
    assert target.state[q]["square_avg"].dtype is runtime.float32
    assert target.state[q]["step"].dtype is source.state[p]["step"].dtype


def test_state_dict_indices_run_across_groups():
    a, b, c = make_params(runtime, initial_values("float64"))
    opt = optim.SGD([{"params": [a, b]}, {"params": [c]}], lr=0.1, momentum=0.9)
    for p in (a, b, c):
        p.grad = runtime.ones_like(p)
    opt.step()
    sd = opt.state_dict()
    assert [g["params"] for g in sd["param_groups"]] == [[0, 1], [2]]
    assert sorted(sd["state"]) == [0, 1, 2]
    assert sd["state"][2]["momentum_buffer"] is opt.state[c]["momentum_buffer"]  # live, as in torch


def test_sgd_without_momentum_keeps_no_state():
    p = runtime.tensor([1.0], requires_grad=True)
    opt = optim.SGD([p], lr=0.1)
    p.grad = runtime.tensor([1.0])
    opt.step()
    assert opt.state_dict()["state"] == {}


def snapshot(opt):
    return copy.deepcopy(to_numpy({"groups": [{k: v for k, v in g.items() if k != "params"}
                                              for g in opt.param_groups],
                                   "state": {id(k): to_numpy(v) for k, v in opt.state.items()}}))


@pytest.mark.parametrize("mutate,message", [
    (lambda sd: sd["param_groups"].append(dict(sd["param_groups"][0], params=[])), "number of parameter groups"),
    (lambda sd: sd["param_groups"][0]["params"].pop(), "doesn't match the size"),
    (lambda sd: sd["state"][0].update(exp_avg=runtime.zeros(7)), "shape"),
    (lambda sd: sd.pop("state"), "'state' and 'param_groups'"),
])
def test_load_state_dict_errors_leave_the_optimizer_unchanged(mutate, message):
    params = make_params(runtime, initial_values("float64"))
    source = optim.Adam(params, lr=0.1)
    run_steps(runtime, source, params, gradient_sequence("float64", steps=2))
    bad = copy.deepcopy(source.state_dict())
    mutate(bad)
    target_params = make_params(runtime, initial_values("float64"))
    target = optim.Adam(target_params, lr=0.5)
    run_steps(runtime, target, target_params, gradient_sequence("float64", steps=1, seed=7))
    before, groups_before = snapshot(target), target.param_groups
    with pytest.raises(ValueError, match=message):
        target.load_state_dict(bad)
    assert target.param_groups is groups_before
    after = snapshot(target)
    assert after["groups"] == before["groups"]
    for key, state in before["state"].items():
        for name, value in state.items():
            np.testing.assert_array_equal(after["state"][key][name], value)


def test_zero_grad_set_to_none_and_in_place():
    a, b = runtime.ones(3, requires_grad=True), runtime.ones(2, requires_grad=True)
    opt = optim.SGD([a, b], lr=0.1)
    (a.sum() * 2 + b.sum()).backward()
    opt.zero_grad()
    assert a.grad is None and b.grad is None

    (a.sum() * 2).backward()
    grad = a.grad
    opt.zero_grad(set_to_none=False)
    assert a.grad is grad
    np.testing.assert_array_equal(a.grad.numpy(), np.zeros(3))
    assert b.grad is None


def test_zero_grad_detaches_a_grad_built_with_create_graph():
    w = runtime.tensor([1.0, 2.0], requires_grad=True)
    (w ** 3).sum().backward(create_graph=True)
    assert w.grad.requires_grad
    optim.SGD([w], lr=0.1).zero_grad(set_to_none=False)
    assert not w.grad.requires_grad and w.grad.grad_fn is None
    np.testing.assert_array_equal(w.grad.numpy(), [0.0, 0.0])


def test_step_updates_parameters_in_place_without_recording():
    w = runtime.tensor([1.0, 2.0], requires_grad=True)
    data, version = w._data, w._version
    opt = optim.Adam([w], lr=0.1)
    w.grad = runtime.tensor([1.0, 1.0])
    assert runtime.is_grad_enabled()
    opt.step()
    assert w._data is data and w._version > version
    assert w.is_leaf and w.requires_grad and w.grad_fn is None
    assert runtime.is_grad_enabled()


def test_backward_through_a_graph_saved_before_step_raises():
    w = runtime.tensor([1.0, 2.0], requires_grad=True)
    loss = (w * w).sum()
    w.grad = runtime.tensor([1.0, 1.0])
    optim.SGD([w], lr=0.1).step()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_step_with_closure_returns_loss_and_records_gradients():
    w = runtime.tensor([3.0], requires_grad=True)
    opt = optim.SGD([w], lr=0.25)

    def closure():
        opt.zero_grad()
        loss = (w * w).sum()
        loss.backward()
        return loss

    with runtime.no_grad():  # the closure still runs with gradients on
        loss = opt.step(closure)
    assert loss.item() == 9.0
    np.testing.assert_allclose(w.detach().numpy(), [3.0 - 0.25 * 6.0])


def test_parameters_without_gradients_are_left_alone():
    a, b = runtime.ones(2, requires_grad=True), runtime.ones(2, requires_grad=True)
    opt = optim.Adam([a, b], lr=0.1)
    a.grad = runtime.ones(2)
    opt.step()
    np.testing.assert_array_equal(b.detach().numpy(), [1.0, 1.0])
    assert b not in opt.state and a in opt.state


def test_custom_torch_style_optimizer_on_the_base_class():
    class PlainSGD(optim.Optimizer):
        def __init__(self, params, lr=optim.required):
            super().__init__(params, {"lr": lr})

        @runtime.no_grad()
        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.add_(p.grad, alpha=-group["lr"])

    w = runtime.tensor([1.0, 2.0], requires_grad=True)
    opt = PlainSGD([w], lr=0.5)
    w.grad = runtime.tensor([1.0, 1.0])
    opt.step()
    np.testing.assert_array_equal(w.detach().numpy(), [0.5, 1.5])
    with pytest.raises(ValueError, match="required optimization parameter lr"):
        PlainSGD([runtime.ones(1, requires_grad=True)])


def test_named_parameters_are_recorded_as_param_names():
    a, b = runtime.ones(2, requires_grad=True), runtime.ones(3, requires_grad=True)
    opt = optim.SGD([("layer.weight", a), ("layer.bias", b)], lr=0.1)
    assert opt.param_groups[0]["params"] == [a, b]
    assert opt.state_dict()["param_groups"][0]["param_names"] == ["layer.weight", "layer.bias"]


# ---------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------

def leaf(n=2):
    return runtime.ones(n, requires_grad=True)


@pytest.mark.parametrize("build,error,message", [
    (lambda: optim.SGD(leaf(), lr=0.1), TypeError, "iterable of Tensors or dicts"),
    (lambda: optim.SGD([], lr=0.1), ValueError, "empty parameter list"),
    (lambda: optim.SGD({leaf()}, lr=0.1), TypeError, "ordered collections"),
    (lambda: optim.SGD([leaf(), 3.0], lr=0.1), TypeError, "can only optimize Tensors"),
    (lambda: optim.SGD([leaf() * 2], lr=0.1), ValueError, "non-leaf"),
    (lambda: optim.SGD([{"lr": 0.1}], lr=0.1), ValueError, "'params'"),
    (lambda: optim.SGD([leaf(), ("name", leaf())], lr=0.1), ValueError, "with/without names"),
    (lambda: optim.SGD(leaf(), lr=0.1), TypeError, "but got a Tensor"),
    (lambda: optim.SGD([leaf()], lr=-0.1), ValueError, "Invalid learning rate: -0.1"),
    (lambda: optim.SGD([leaf()], lr=0.1, momentum=-1), ValueError, "Invalid momentum value"),
    (lambda: optim.SGD([leaf()], lr=0.1, weight_decay=-1), ValueError, "Invalid weight_decay value"),
    (lambda: optim.SGD([leaf()], lr=0.1, nesterov=True), ValueError, "Nesterov momentum requires"),
    (lambda: optim.SGD([leaf()], lr=0.1, momentum=0.9, dampening=0.1, nesterov=True), ValueError, "Nesterov"),
    (lambda: optim.Adam([leaf()], lr=-1.0), ValueError, "Invalid learning rate"),
    (lambda: optim.Adam([leaf()], betas=(1.0, 0.999)), ValueError, "beta parameter at index 0"),
    (lambda: optim.Adam([leaf()], betas=(0.9, -0.1)), ValueError, "beta parameter at index 1"),
    (lambda: optim.Adam([leaf()], eps=-1e-8), ValueError, "Invalid epsilon value"),
    (lambda: optim.AdamW([leaf()], weight_decay=-0.1), ValueError, "Invalid weight_decay value"),
    (lambda: optim.RMSprop([leaf()], alpha=-0.5), ValueError, "Invalid alpha value"),
    (lambda: optim.RMSprop([leaf()], momentum=-0.5), ValueError, "Invalid momentum value"),
    (lambda: optim.SGD([{"params": [leaf()], "lr": -1.0}], lr=0.1), ValueError, "Invalid learning rate"),
    (lambda: optim.Adam([leaf()], fused=True, foreach=True), RuntimeError, "cannot be `True` together"),
    (lambda: optim.RMSprop([leaf()], capturable=True), NotImplementedError, "capturable=True"),
])
def test_constructor_errors(build, error, message):
    with pytest.raises(error, match=message):
        build()


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW", "Adagrad"])
def test_fused_true_is_accepted_and_steps_as_the_default(name):
    """torch accepts fused=True for these on the CPU (nanochat builds AdamW with it); runtime's update is the same."""
    extra = {"momentum": 0.9} if name == "SGD" else {}
    trajectories = []
    for fused in (None, True):
        runtime.manual_seed(0)
        w = leaf()
        opt = getattr(optim, name)([w], lr=0.1, fused=fused, **extra)
        assert opt.param_groups[0]["fused"] is fused
        for _ in range(3):
            opt.zero_grad()
            (w * w).sum().backward()
            opt.step()
        trajectories.append(w.detach().numpy().copy())
    np.testing.assert_array_equal(*trajectories)


def test_a_parameter_given_twice_is_an_error():
    w = leaf()
    with pytest.raises(ValueError, match="more than once"):
        optim.SGD([w, w], lr=0.1)
    with pytest.raises(ValueError, match="more than one parameter group"):
        optim.SGD([{"params": [w]}, {"params": [leaf(), w]}], lr=0.1)
    opt = optim.SGD([w], lr=0.1)
    with pytest.raises(ValueError, match="more than one parameter group"):
        opt.add_param_group({"params": w})
    assert len(opt.param_groups) == 1


def test_add_param_group_errors_leave_groups_unchanged():
    opt = optim.Adam([leaf()], lr=0.1)
    with pytest.raises(TypeError, match="must be a dict"):
        opt.add_param_group([leaf()])
    with pytest.raises(ValueError, match="beta parameter"):
        opt.add_param_group({"params": [leaf()], "betas": (2.0, 0.9)})
    assert len(opt.param_groups) == 1


def test_the_callers_group_dict_is_not_modified():
    group = {"params": (leaf(), leaf()), "lr": 0.2}
    opt = optim.SGD([group], lr=0.1)
    assert group == {"params": group["params"], "lr": 0.2} and isinstance(group["params"], tuple)
    assert opt.param_groups[0]["momentum"] == 0


# ---------------------------------------------------------------------------------------------
# learning-rate schedulers
# ---------------------------------------------------------------------------------------------

def scheduled_lrs(lib, make_scheduler, epochs=25, lrs=(0.1, 0.02)) -> list:
    params = [lib.zeros(2, requires_grad=True) for _ in lrs]
    opt = lib.optim.SGD([{"params": [p], "lr": lr} for p, lr in zip(params, lrs)], lr=0.5)
    sched = make_scheduler(lib.optim.lr_scheduler, opt)
    record = [(sched.get_last_lr(), [g["lr"] for g in opt.param_groups], [g["initial_lr"] for g in opt.param_groups])]
    for _ in range(epochs):
        opt.step()
        sched.step()
        record.append((sched.get_last_lr(), [g["lr"] for g in opt.param_groups],
                       [g["initial_lr"] for g in opt.param_groups]))
    return record


SCHEDULERS = {
    "StepLR": lambda m, opt: m.StepLR(opt, step_size=3, gamma=0.5),
    "StepLR-default-gamma": lambda m, opt: m.StepLR(opt, step_size=7),
    "CosineAnnealingLR": lambda m, opt: m.CosineAnnealingLR(opt, T_max=5, eta_min=0.001),
    "CosineAnnealingLR-zero-min": lambda m, opt: m.CosineAnnealingLR(opt, T_max=8),
    "LambdaLR": lambda m, opt: m.LambdaLR(opt, lr_lambda=lambda epoch: 0.9 ** epoch),
    "LambdaLR-per-group": lambda m, opt: m.LambdaLR(opt, lr_lambda=[lambda e: 1 / (e + 1), lambda e: e // 4]),
}


@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_scheduler_lrs_match_torch(name, torch):
    ours = scheduled_lrs(runtime, SCHEDULERS[name])
    theirs = scheduled_lrs(torch, SCHEDULERS[name])
    assert len(ours) == len(theirs)
    for epoch, (a, b) in enumerate(zip(ours, theirs)):
        for x, y in zip(a, b):
            np.testing.assert_allclose(x, y, rtol=1e-12, atol=0, err_msg=f"epoch {epoch}")


def test_scheduler_records_initial_lr_and_sets_it_on_construction():
    w = leaf()
    opt = optim.SGD([w], lr=0.1)
    sched = lr_scheduler.StepLR(opt, step_size=2, gamma=0.1)
    assert opt.param_groups[0]["initial_lr"] == 0.1
    assert sched.get_last_lr() == [0.1] and sched.last_epoch == 0 and sched.base_lrs == [0.1]
    for _ in range(4):
        opt.step()
        sched.step()
    assert sched.get_last_lr() == pytest.approx([0.001])
    assert opt.param_groups[0]["initial_lr"] == 0.1


def test_cosine_schedule_reaches_eta_min_and_comes_back():
    opt = optim.SGD([leaf()], lr=1.0)
    sched = lr_scheduler.CosineAnnealingLR(opt, T_max=4, eta_min=0.1)
    lrs = [sched.get_last_lr()[0]]
    for _ in range(8):
        opt.step()
        sched.step()
        lrs.append(sched.get_last_lr()[0])
    closed = [0.1 + 0.9 * (1 + math.cos(math.pi * t / 4)) / 2 for t in range(9)]
    np.testing.assert_allclose(lrs, closed, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_scheduler_state_dict_round_trip(name):
    make = SCHEDULERS[name]
    reference = scheduled_lrs(runtime, make, epochs=12)

    def resume(split=5):
        params = [runtime.zeros(2, requires_grad=True) for _ in range(2)]
        opt = optim.SGD([{"params": [p], "lr": lr} for p, lr in zip(params, (0.1, 0.02))], lr=0.5)
        sched = make(lr_scheduler, opt)
        for _ in range(split):
            opt.step()
            sched.step()
        saved_opt, saved_sched = copy.deepcopy(opt.state_dict()), pickle.loads(pickle.dumps(sched.state_dict()))
        fresh = optim.SGD([{"params": [p], "lr": 0.7} for p in params], lr=0.5)
        fresh_sched = make(lr_scheduler, fresh)
        fresh.load_state_dict(saved_opt)
        fresh_sched.load_state_dict(saved_sched)
        lrs = []
        for _ in range(12 - split):
            fresh.step()
            fresh_sched.step()
            lrs.append(fresh_sched.get_last_lr())
        return lrs

    expected = [r[0] for r in reference[6:]]
    np.testing.assert_allclose(resume(), expected, rtol=1e-12)


def test_lambda_scheduler_state_dict_skips_functions_but_saves_callable_objects():
    class Decay:
        def __init__(self, rate):
            self.rate = rate

        def __call__(self, epoch):
            return self.rate ** epoch

    opt = optim.SGD([{"params": [leaf()]}, {"params": [leaf()]}], lr=0.1)
    sched = lr_scheduler.LambdaLR(opt, [lambda e: 1.0, Decay(0.5)])
    sd = sched.state_dict()
    assert sd["lr_lambdas"] == [None, {"rate": 0.5}] and "optimizer" not in sd
    other = lr_scheduler.LambdaLR(opt, [lambda e: 1.0, Decay(0.9)])
    other.load_state_dict(sd)
    assert other.lr_lambdas[1].rate == 0.5


def test_scheduler_errors():
    with pytest.raises(TypeError, match="is not an Optimizer"):
        lr_scheduler.StepLR(object(), step_size=2)
    opt = optim.SGD([leaf()], lr=0.1)
    with pytest.raises(KeyError, match="initial_lr"):
        lr_scheduler.StepLR(opt, step_size=2, last_epoch=3)
    with pytest.raises(ValueError, match="Expected 1 lr_lambdas, but got 2"):
        lr_scheduler.LambdaLR(opt, [lambda e: 1.0, lambda e: 1.0])


def test_step_with_epoch_uses_the_closed_form_and_warns(torch):
    values = []
    for lib in (runtime, torch):
        opt = lib.optim.SGD([lib.zeros(1, requires_grad=True)], lr=0.1)
        sched = lib.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        opt.step()
        with pytest.warns(UserWarning, match="epoch parameter"):
            sched.step(7)
        values.append(sched.get_last_lr())
    assert values[0] == pytest.approx(values[1], rel=1e-12)
