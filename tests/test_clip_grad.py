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


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.5, math.inf])
def test_float32_and_strided_gradients_clip_as_torch_and_count_as_writes(torch, norm_type):
    """float32 gradients, one of them a transposed (strided) view, clip as torch's do; each scaled gradient's version
    counter moves, as mul_ moves it (the numpy path for CPU gradients must write as an in-place op)."""
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal((5, 3)).astype(np.float32) * 4, rng.standard_normal(7).astype(np.float32)]
    params = [nn.Parameter(runtime.zeros(3, 5)), nn.Parameter(runtime.zeros(7))]
    params[0].grad = runtime.tensor(arrays[0]).t()
    params[1].grad = runtime.tensor(arrays[1])
    tparams = [torch.nn.Parameter(torch.zeros(3, 5)), torch.nn.Parameter(torch.zeros(7))]
    tparams[0].grad = torch.tensor(arrays[0]).t()
    tparams[1].grad = torch.tensor(arrays[1])
    versions = [p.grad._version for p in params]
    got = nn.utils.clip_grad_norm_(params, max_norm=0.5, norm_type=norm_type)
    want = torch.nn.utils.clip_grad_norm_(tparams, max_norm=0.5, norm_type=norm_type)
    assert got.dtype is runtime.float32 and got.item() == pytest.approx(want.item(), rel=1e-6)
    for p, t in zip(params, tparams):
        np.testing.assert_allclose(p.grad.numpy(), t.grad.numpy(), rtol=1e-6, atol=1e-7)
    assert [p.grad._version for p in params] == [v + 1 for v in versions]


def test_a_gradient_with_history_is_scaled_by_its_op():
    """A gradient that requires grad (from backward(create_graph=True)) is scaled by mul_, as an op; plain CPU
    gradients go through numpy; both give torch's values."""
    params = [nn.Parameter(runtime.zeros(4)), nn.Parameter(runtime.zeros(2))]
    params[0].grad = runtime.tensor([3.0, -4.0, 0.0, 12.0]).requires_grad_()
    params[1].grad = runtime.tensor([5.0, 0.0])
    total = nn.utils.clip_grad_norm_(params, max_norm=1.0)
    assert total.item() == pytest.approx(math.sqrt(9 + 16 + 144 + 25), rel=1e-6)
    scale = 1.0 / (total.item() + 1e-6)
    np.testing.assert_allclose(params[0].grad.detach().numpy(), np.array([3.0, -4.0, 0.0, 12.0]) * scale, rtol=1e-6)
    np.testing.assert_allclose(params[1].grad.numpy(), np.array([5.0, 0.0]) * scale, rtol=1e-6)
