"""Helpers for the tests/test_nn_*.py files: run one module in runtime and in torch with the same weights and
inputs (float64), and compare outputs, input gradients and parameter gradients."""
from __future__ import annotations

import numpy as np

import runtime

TOL = dict(rtol=1e-9, atol=1e-11)


def flatten(out) -> list:
    """The tensors of a (possibly nested) tuple/list output, in order; None entries dropped."""
    if isinstance(out, (tuple, list)):
        return [t for item in out for t in flatten(item)]
    if out is None:
        return []
    if hasattr(out, "data") and hasattr(out, "batch_sizes"):  # PackedSequence
        return [out.data]
    return [out]


def copy_weights(theirs, ours) -> None:
    """ours.load_state_dict(theirs.state_dict()) through numpy."""
    ours.load_state_dict({k: runtime.tensor(v.detach().numpy().copy()) for k, v in theirs.state_dict().items()})


class Const:
    """An input that never requires grad (targets, masks, index tensors)."""

    def __init__(self, value):
        self.value = np.asarray(value)


def to_lib(lib, value, grad: bool):
    if isinstance(value, Const):
        return lib.tensor(value.value.copy())
    if isinstance(value, np.ndarray):
        t = lib.tensor(value.copy())
        if grad and value.dtype.kind == "f":
            t.requires_grad_(True)
        return t
    if isinstance(value, tuple):
        return tuple(to_lib(lib, v, grad) for v in value)
    return value


def run_both(torch, make, inputs, *, call=None, grad=True, train=False, tol=TOL, check_grads=True):
    """make(lib) builds the module; inputs are numpy arrays (float ones get gradients) or plain values.
    call(module, *inputs) runs it (default: module(*inputs)). Returns (ours, theirs) modules."""
    theirs = make(torch).double()
    ours = make(runtime).double()
    copy_weights(theirs, ours)
    theirs.train(train)
    ours.train(train)
    call = call or (lambda m, *xs: m(*xs))
    results = {}
    for lib, module in ((torch, theirs), (runtime, ours)):
        args = [to_lib(lib, v, grad) for v in inputs]
        outs = flatten(call(module, *args))
        float_outs = [o for o in outs if o.dtype in (lib.float64, lib.float32)]
        rng = np.random.default_rng(7)
        seeds = [rng.standard_normal(tuple(o.shape)) for o in float_outs]
        if grad and float_outs:
            total = sum((o * lib.tensor(s)).sum() for o, s in zip(float_outs, seeds) if o.requires_grad)
            if not isinstance(total, int):
                total.backward()
        leaves = [a for a in _leaves(args) if getattr(a, "requires_grad", False)]
        results[lib.__name__] = (outs, leaves, dict(module.named_parameters()))
    (t_outs, t_leaves, t_params), (r_outs, r_leaves, r_params) = results["torch"], results["runtime"]
    assert len(t_outs) == len(r_outs)
    for a, b in zip(r_outs, t_outs):
        assert tuple(a.shape) == tuple(b.shape)
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), **tol)
    if grad and check_grads:
        for a, b in zip(r_leaves, t_leaves):
            _close_grad(a.grad, b.grad, tol)
        assert set(r_params) == set(t_params)
        for name in t_params:
            _close_grad(r_params[name].grad, t_params[name].grad, tol, name)
    return ours, theirs


def _leaves(args):
    for a in args:
        if isinstance(a, tuple):
            yield from _leaves(a)
        else:
            yield a


def _close_grad(ours, theirs, tol, name=""):
    if theirs is None:
        assert ours is None or not np.any(ours.numpy()), name
        return
    assert ours is not None, name
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), err_msg=name, **tol)
