"""Gradient clipping (nn.utils.clip_grad_norm_, clip_grad_value_, get_total_norm, clip_grads_with_norm_) against
torch: the same scaled gradients, the same returned norm and dtype, the same errors."""
from __future__ import annotations

import math

import numpy as np
import pytest

import runtime
from runtime import nn


def _grads(seed: int, dtype, scale: float):
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(shape) * scale for shape in ((3, 4), (4,), (2, 2, 2))]
    params = []
    for array in arrays:
        p = nn.Parameter(runtime.zeros(*array.shape, dtype=dtype))
        p.grad = runtime.tensor(array, dtype=dtype)
        params.append(p)
    return arrays, params


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.5, math.inf])
@pytest.mark.parametrize("scale", [0.01, 10.0])  # below and above max_norm
def test_clip_grad_norm_matches_torch(torch, norm_type, scale):
    arrays, params = _grads(0, runtime.float64, scale)
    tparams = [torch.nn.Parameter(torch.zeros(a.shape, dtype=torch.float64)) for a in arrays]
    for p, a in zip(tparams, arrays):
        p.grad = torch.tensor(a)
    got = nn.utils.clip_grad_norm_(params, max_norm=1.5, norm_type=norm_type)
    want = torch.nn.utils.clip_grad_norm_(tparams, max_norm=1.5, norm_type=norm_type)
    assert got.dtype is runtime.float64 and got.item() == pytest.approx(want.item(), rel=1e-12)
    for p, t in zip(params, tparams):
        np.testing.assert_allclose(p.grad.numpy(), t.grad.numpy(), rtol=1e-12)


def test_clip_grad_norm_without_gradients_returns_zero_and_a_nonfinite_norm_raises():
    assert nn.utils.clip_grad_norm_([nn.Parameter(runtime.zeros(2))], 1.0).item() == 0.0
    _, params = _grads(1, runtime.float32, 1.0)
    params[0].grad[0, 0] = float("inf")
    with pytest.raises(RuntimeError, match="non-finite"):
        nn.utils.clip_grad_norm_(params, 1.0, error_if_nonfinite=True)
    before = params[1].grad.numpy().copy()
    nn.utils.clip_grad_norm_(params, 1.0)  # scaled by 1 / inf: zeros, as torch
    np.testing.assert_array_equal(params[1].grad.numpy(), before * 0)


def test_clip_grad_value_matches_torch(torch):
    arrays, params = _grads(2, runtime.float32, 3.0)
    tparams = [torch.nn.Parameter(torch.zeros(a.shape)) for a in arrays]
    for p, a in zip(tparams, arrays):
        p.grad = torch.tensor(a, dtype=torch.float32)
    nn.utils.clip_grad_value_(params, 0.7)
    torch.nn.utils.clip_grad_value_(tparams, 0.7)
    for p, t in zip(params, tparams):
        np.testing.assert_array_equal(p.grad.numpy(), t.grad.numpy())
