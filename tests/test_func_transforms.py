"""runtime.func's transforms (torch.func): grad, grad_and_value, vjp, jvp, jacrev, jacfwd, hessian, vmap and
stack_module_state, against torch and, without it, against runtime.autograd.functional and finite differences."""
from __future__ import annotations

import copy

import numpy as np
import pytest

import runtime
from helpers import needs_torch, torch

X = np.random.default_rng(0).standard_normal(3)
W = np.random.default_rng(1).standard_normal((3, 3))


def arrays(value):
    if isinstance(value, (tuple, list)):
        return [arrays(v) for v in value]
    if isinstance(value, dict):
        return {k: arrays(v) for k, v in value.items()}
    return value.detach().numpy()


def assert_close(got, want):
    if isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want)
        for key in want:
            assert_close(got[key], want[key])
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want)
        for g, w in zip(got, want):
            assert_close(g, w)
    else:
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def ensemble(lib):
    """Four linear models' outputs on one batch, by vmap over functional_call of their stacked state."""
    models = [lib.nn.Linear(3, 2).double() for _ in range(4)]
    for k, model in enumerate(models):
        for p in model.parameters():
            p.data = lib.tensor(np.random.default_rng(k + p.numel()).standard_normal(tuple(p.shape)))
    params, buffers = lib.func.stack_module_state(models)
    base = copy.deepcopy(models[0])
    call = lambda p, b, x: lib.func.functional_call(base, (p, b), (x,))  # noqa: E731
    return lib.func.vmap(call, in_dims=(0, 0, None))(params, buffers, lib.tensor(W))


PROGRAMS = {
    "grad": lambda L, x, w: L.func.grad(lambda x: (x.sin() * x).sum())(x),
    "grad-argnums": lambda L, x, w: L.func.grad(lambda x, w: (w @ x).tanh().sum(), argnums=(0, 1))(x, w),
    "grad-of-grad": lambda L, x, w: L.func.grad(lambda x: L.func.grad(lambda y: (y ** 3).sum())(x).sum())(x),
    "grad-aux": lambda L, x, w: L.func.grad(lambda x: ((x ** 2).sum(), x.mean()), has_aux=True)(x),
    "grad_and_value": lambda L, x, w: L.func.grad_and_value(lambda x: (x ** 2).sum())(x),
    "jacrev": lambda L, x, w: L.func.jacrev(lambda x, w: (w @ x).sin(), argnums=(0, 1))(x, w),
    "jacfwd": lambda L, x, w: L.func.jacfwd(lambda x: x.exp() * x.sum())(x),
    "jacrev-dict-output": lambda L, x, w: L.func.jacrev(lambda x: {"a": x.sin(), "b": (x * w).sum(0)})(x),
    "hessian": lambda L, x, w: L.func.hessian(lambda x: (x.sin() * x.prod()).sum())(x),
    "vjp": lambda L, x, w: L.func.vjp(lambda x: x.sin() * 2, x)[1](w[0]),
    "jvp": lambda L, x, w: L.func.jvp(lambda x: x.sin() * x, (x,), (w[0],)),
    "vmap": lambda L, x, w: L.func.vmap(lambda a, b: a @ b, in_dims=(0, None))(w, x),
    "vmap-dims": lambda L, x, w: L.func.vmap(lambda a: a * 2 + a.sum(), in_dims=1, out_dims=1)(w),
    "per-sample-grads": lambda L, x, w: L.func.vmap(L.func.grad(lambda w, x: (w @ x).tanh().sum()),
                                                    in_dims=(None, 0))(w, w),
    "vmap-of-jacrev": lambda L, x, w: L.func.vmap(L.func.jacrev(lambda x: x.sin() * x.sum()))(w),
    "ensemble": lambda L, x, w: ensemble(L),
}


@needs_torch
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_transforms_match_torch(name):
    got = PROGRAMS[name](runtime, runtime.tensor(X), runtime.tensor(W))
    want = PROGRAMS[name](torch, torch.tensor(X), torch.tensor(W))
    assert_close(arrays(got), arrays(want))


def test_top_level_results_are_plain_tensors_and_nested_ones_keep_their_graph():
    x = runtime.tensor(X)
    g = runtime.func.grad(lambda x: (x ** 3).sum())(x)
    assert not g.requires_grad and g.grad_fn is None
    leaf = runtime.tensor(X, requires_grad=True)  # an outer autograd graph (a meta-learning step) through grad
    inner = runtime.func.grad(lambda x: (x ** 3).sum())(leaf)
    (outer,) = runtime.autograd.grad(inner.sum(), leaf)
    np.testing.assert_allclose(outer.numpy(), 6 * X, rtol=1e-12)


def test_jacobians_and_hessians_match_autograd_functional():
    x, w = runtime.tensor(X), runtime.tensor(W)
    f = lambda x: (w @ x).sin() * x  # noqa: E731
    np.testing.assert_allclose(runtime.func.jacrev(f)(x).numpy(), runtime.autograd.functional.jacobian(f, x).numpy(),
                               rtol=1e-12)
    s = lambda x: (x.sin() * x.prod()).sum()  # noqa: E731
    np.testing.assert_allclose(runtime.func.hessian(s)(x).numpy(), runtime.autograd.functional.hessian(s, x).numpy(),
                               rtol=1e-10)
    out, tangent_out = runtime.func.jvp(f, (x,), (runtime.ones(3, dtype=runtime.float64),))
    np.testing.assert_allclose(tangent_out.numpy(), runtime.func.jacrev(f)(x).numpy().sum(1), rtol=1e-12)


def test_vmap_randomness_modes():
    draw = lambda x: x + runtime.randn(())  # noqa: E731
    xs = runtime.zeros(4, dtype=runtime.float64)
    with pytest.raises(RuntimeError, match="randomness error mode"):
        runtime.func.vmap(draw)(xs)
    same = runtime.func.vmap(draw, randomness="same")(xs).numpy()
    different = runtime.func.vmap(draw, randomness="different")(xs).numpy()
    assert len(set(same.tolist())) == 1 and len(set(different.tolist())) == 4


@pytest.mark.parametrize("call,message", [
    (lambda: runtime.func.grad(lambda x: x * 2)(runtime.tensor(X)), "scalar Tensor"),
    (lambda: runtime.func.grad(lambda x: x.sum(), argnums=2)(runtime.tensor(X)), "argnums=2"),
    (lambda: runtime.func.vmap(lambda a, b: a + b)(runtime.zeros(2), runtime.zeros(3)), "same size"),
    (lambda: runtime.func.vmap(lambda a: a, in_dims=None)(runtime.zeros(2)), "at least one input"),
    (lambda: runtime.func.vmap(lambda a: 1.0)(runtime.zeros(2)), "tensors only"),
    (lambda: runtime.func.grad(lambda x: x.sum())(runtime.arange(3)), "floating point"),
])
def test_misuse_raises_naming_it(call, message):
    with pytest.raises((RuntimeError, ValueError), match=message):
        call()


def test_forward_ad_dual_tensors_give_torchs_tangents(torch):
    """make_dual / unpack_dual inside dual_level: the Jacobian-vector products of a scalar and a vector result (and
    of an intermediate dual), None for a tensor that depends on no dual, and the level's errors."""
    rng = np.random.default_rng(0)
    xv, tv, wv = rng.standard_normal(4), rng.standard_normal(4), rng.standard_normal((3, 4))
    results = []
    for lib in (runtime, torch):
        forward_ad = lib.autograd.forward_ad
        w = lib.tensor(wv, requires_grad=True)
        with forward_ad.dual_level():
            x = forward_ad.make_dual(lib.tensor(xv), lib.tensor(tv))
            h = (w @ x).tanh()
            scalar = h.sum() * 2 + (x ** 3).sum()
            vector = (w @ x).softmax(0) * h
            unrelated = forward_ad.unpack_dual(lib.tensor([1.0]))
            assert unrelated.tangent is None
            results.append([forward_ad.unpack_dual(v) for v in (scalar, vector, h, x)])
    for (ours_p, ours_t), (theirs_p, theirs_t) in zip(*results):
        np.testing.assert_allclose(ours_p.detach().numpy(), theirs_p.detach().numpy(), rtol=1e-12)
        np.testing.assert_allclose(ours_t.detach().numpy(), theirs_t.detach().numpy(), rtol=1e-10, atol=1e-12)
    with pytest.raises(RuntimeError, match="dual_level"):
        runtime.autograd.forward_ad.make_dual(runtime.ones(2), runtime.ones(2))
    with runtime.autograd.forward_ad.dual_level(), pytest.raises(RuntimeError, match="different size"):
        runtime.autograd.forward_ad.make_dual(runtime.ones(2), runtime.ones(3))


def test_hessians_and_jacobians_of_linear_and_piecewise_linear_maps_are_zeros(torch):
    """A derivative that is a constant (x * 2, relu) does not require grad: torch's autograd.functional and func
    transforms give zeros for the next derivative, where runtime raised 'does not require grad'."""
    x = [1.0, -2.0]
    cases = [lambda lib: lib.autograd.functional.hessian(lambda v: (v * 2).sum(), lib.tensor(x, dtype=lib.float64)),
             lambda lib: lib.autograd.functional.hvp(lambda v: (v * 2).sum(), lib.tensor(x, dtype=lib.float64),
                                                     lib.ones(2, dtype=lib.float64))[1],
             lambda lib: lib.autograd.functional.jacobian(lambda v: lib.ones(2, dtype=lib.float64),
                                                          lib.tensor(x, dtype=lib.float64)),
             lambda lib: lib.func.hessian(lambda v: lib.relu(v).sum())(lib.tensor(x, dtype=lib.float64))]
    for case in cases:
        np.testing.assert_array_equal(case(runtime).numpy(), case(torch).numpy())
