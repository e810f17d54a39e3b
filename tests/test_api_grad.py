"""Composite public functions (built from primitives): values vs torch, gradients vs torch and finite differences."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import runtime
from runtime.autograd import gradcheck

from helpers import needs_torch, torch

# name -> (function written once for either library, input shapes)
COMPOSITES = {
    "softmax": (lambda lib, x: lib.softmax(x, 1), [(3, 5)]),
    "log_softmax": (lambda lib, x: x.log_softmax(-1), [(2, 3, 4)]),
    "logsumexp": (lambda lib, x: lib.logsumexp(x, (0, 2)), [(2, 3, 4)]),
    "logsumexp_keepdim": (lambda lib, x: x.logsumexp(1, keepdim=True), [(3, 4)]),
    "mean": (lambda lib, x: x.mean((0, 1)), [(3, 4, 2)]),
    "var": (lambda lib, x: x.var(1), [(3, 5)]),
    "var_biased": (lambda lib, x: x.var(0, unbiased=False, keepdim=True), [(4, 3)]),
    "std": (lambda lib, x: x.std(), [(3, 4)]),
    "std_correction": (lambda lib, x: lib.std(x, 1, correction=0), [(3, 4)]),
    "max_dim_values": (lambda lib, x: x.max(1).values, [(3, 5)]),
    "min_dim_keepdim": (lambda lib, x: x.min(0, keepdim=True)[0], [(3, 5)]),
    "max_all": (lambda lib, x: x.max(), [(3, 5)]),
    "matmul_vec_mat": (lambda lib, x, y: x @ y, [(4,), (4, 3)]),
    "matmul_mat_vec": (lambda lib, x, y: lib.matmul(x, y), [(2, 3, 4), (4,)]),
    "matmul_dot": (lambda lib, x, y: x @ y, [(4,), (4,)]),
    "mm": (lambda lib, x, y: lib.mm(x, y), [(2, 3), (3, 2)]),
    "bmm": (lambda lib, x, y: lib.bmm(x, y), [(2, 2, 3), (2, 3, 4)]),
    "split": (lambda lib, x: lib.cat([p * (i + 1) for i, p in enumerate(x.split(2, 1))], 1), [(2, 5)]),
    "split_sections": (lambda lib, x: x.split([1, 3], 0)[1], [(4, 2)]),
    "chunk": (lambda lib, x: x.chunk(3, 0)[2], [(7, 2)]),
    "stack": (lambda lib, x, y: lib.stack([x, y * 2], 1), [(3, 2), (3, 2)]),
    "unbind": (lambda lib, x: x.unbind(1)[2], [(3, 4)]),
    "squeeze_unsqueeze": (lambda lib, x: x.unsqueeze(0).squeeze(2).unsqueeze(-1), [(3, 1, 2)]),
    "flatten": (lambda lib, x: x.flatten(1), [(2, 3, 4)]),
    "unflatten": (lambda lib, x: x.unflatten(1, (2, 2)), [(3, 4)]),
    "transpose": (lambda lib, x: x.transpose(0, 2), [(2, 3, 4)]),
    "T": (lambda lib, x: x.T, [(2, 3)]),
    "mT": (lambda lib, x: x.mT, [(2, 3, 4)]),
    "t": (lambda lib, x: x.t(), [(2, 3)]),
    "permute": (lambda lib, x: x.permute(1, 2, 0), [(2, 3, 4)]),
    "view": (lambda lib, x: x.view(4, -1), [(2, 6)]),
    "expand_as": (lambda lib, x, y: x.expand_as(y), [(3, 1), (2, 3, 4)]),
    "broadcast_to": (lambda lib, x: lib.broadcast_to(x, (2, 3)), [(3,)]),
    "narrow": (lambda lib, x: x.narrow(1, 1, 2), [(3, 4)]),
    "select": (lambda lib, x: x.select(0, -1), [(3, 4)]),
    "index_select": (lambda lib, x: x.index_select(1, lib.tensor([2, 0, 2])), [(3, 4)]),
    "masked_fill": (lambda lib, x: x.masked_fill(x > 0.5, -1.0), [(3, 4)]),
    "clamp_tensor_bounds": (lambda lib, x, lo: x.clamp(min=lo), [(3, 4), (4,)]),
    "repeat": (lambda lib, x: x.repeat(2, 1, 3), [(2, 3)]),
    "div_trunc": (lambda lib, x, y: lib.div(x * 7, y, rounding_mode="trunc"), [(3,), (3,)]),
    "square": (lambda lib, x: x.square(), [(3, 4)]),
    "addcmul": (lambda lib, x, y, z: lib.addcmul(x, y, z, value=0.5), [(3,), (3,), (3,)]),
    "lerp": (lambda lib, x, y: lib.lerp(x, y, 0.3), [(3,), (3,)]),
    "sum_to_size": (lambda lib, x: x.sum_to_size(1, 4), [(3, 4)]),
    "getitem_mixed": (lambda lib, x: x[1:, lib.tensor([0, 3, 3])], [(3, 4)]),
    "getitem_mask": (lambda lib, x: x[x > 0], [(3, 4)]),
    "gather": (lambda lib, x: lib.gather(x, 1, lib.tensor([[1], [0], [3]])), [(3, 4)]),
}
# Finite differences need smooth points: div_trunc is piecewise constant, masks and max ties are kinks.
NO_FD = {"div_trunc"}


def _inputs(shapes, seed):
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1.5, 1.5, s) for s in shapes]


@pytest.mark.parametrize("name", sorted(set(COMPOSITES) - NO_FD))
def test_composite_gradients_match_finite_differences(name):
    fn, shapes = COMPOSITES[name]
    xs = [runtime.tensor(a, requires_grad=True) for a in _inputs(shapes, 0)]
    assert gradcheck(lambda *t: fn(runtime, *t), xs, atol=1e-6, rtol=1e-5)


@needs_torch
@pytest.mark.parametrize("name", sorted(COMPOSITES))
def test_composite_matches_torch(name):
    fn, shapes = COMPOSITES[name]
    arrays = _inputs(shapes, 1)
    ours = [runtime.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    out_ours, out_theirs = fn(runtime, *ours), fn(torch, *theirs)
    np.testing.assert_allclose(out_ours.detach().numpy(), out_theirs.detach().numpy(), rtol=1e-12, atol=1e-12)
    seed = np.random.default_rng(2).standard_normal(tuple(out_theirs.shape))
    out_ours.backward(runtime.tensor(seed))
    out_theirs.backward(torch.tensor(seed))
    for a, b in zip(ours, theirs):
        expected = np.zeros(a.shape) if b.grad is None else b.grad.numpy()
        got = np.zeros(a.shape) if a.grad is None else a.grad.numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


@st.composite
def broadcastable_shapes(draw):
    """Two shapes that broadcast together: drop leading dims and set some sizes to 1."""
    shape = draw(st.lists(st.integers(1, 4), min_size=0, max_size=4))
    def variant():
        keep = draw(st.integers(0, len(shape)))
        return [1 if draw(st.booleans()) else s for s in shape[len(shape) - keep:]]
    return variant(), variant()


@settings(max_examples=60, deadline=None)
@given(shapes=broadcastable_shapes(), op=st.sampled_from(["add", "sub", "mul", "div", "maximum"]))
def test_broadcast_gradients_sum_back_to_input_shapes(shapes, op):
    rng = np.random.default_rng(0)
    a, b = (rng.uniform(0.5, 1.5, s) * rng.choice([-1, 1], s) for s in shapes)
    x, y = runtime.tensor(a, requires_grad=True), runtime.tensor(b, requires_grad=True)
    out = getattr(runtime, op)(x, y)
    assert tuple(out.shape) == np.broadcast_shapes(a.shape, b.shape)
    out.sum().backward()
    assert tuple(x.grad.shape) == a.shape and tuple(y.grad.shape) == b.shape
    if op == "add":
        n = int(np.prod(out.shape))
        assert x.grad.sum().item() == pytest.approx(n) and y.grad.sum().item() == pytest.approx(n)
