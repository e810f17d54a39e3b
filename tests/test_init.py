"""runtime.nn.init: distribution statistics, orthogonality, eye/dirac, gains and fans vs torch, errors, and that
initialisers fill in place without recording autograd history."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import runtime
import runtime.nn.functional as F
import runtime.nn.init as init

from helpers import needs_torch, torch


def param(*shape, dtype=runtime.float32):
    """A leaf that requires grad, as a module parameter would be."""
    return runtime.empty(*shape, dtype=dtype).requires_grad_(True)


def values(t):
    return t.detach().numpy().astype(np.float64)


# ---------------------------------------------------------------------------------------------
# Distributions
# ---------------------------------------------------------------------------------------------

def test_uniform_and_normal_statistics():
    runtime.manual_seed(0)
    u = values(init.uniform_(param(400, 500), -2.0, 3.0))
    assert u.min() >= -2.0 and u.max() < 3.0
    assert abs(u.mean() - 0.5) < 0.02 and abs(u.std() - 5 / math.sqrt(12)) < 0.02
    n = values(init.normal_(param(400, 500), 1.5, 0.3))
    assert abs(n.mean() - 1.5) < 0.005 and abs(n.std() - 0.3) < 0.005


def _truncated_moments(mean, std, a, b):
    phi = lambda z: math.exp(-z * z / 2) / math.sqrt(2 * math.pi)  # noqa: E731
    cdf = lambda z: 0.5 * (1 + math.erf(z / math.sqrt(2)))  # noqa: E731
    alpha, beta = (a - mean) / std, (b - mean) / std
    z = cdf(beta) - cdf(alpha)
    m = mean + std * (phi(alpha) - phi(beta)) / z
    var = std ** 2 * (1 + (alpha * phi(alpha) - beta * phi(beta)) / z - ((phi(alpha) - phi(beta)) / z) ** 2)
    return m, math.sqrt(var)


@pytest.mark.parametrize("mean, std, a, b", [(0.0, 1.0, -2.0, 2.0), (0.5, 2.0, -1.0, 4.0), (0.0, 0.02, -0.04, 0.04),
                                             (0.0, 1.0, 1.0, 3.0)])
def test_trunc_normal_statistics(mean, std, a, b):
    runtime.manual_seed(1)
    x = values(init.trunc_normal_(param(300, 400), mean, std, a, b))
    assert x.min() >= a and x.max() <= b
    want_mean, want_std = _truncated_moments(mean, std, a, b)
    assert abs(x.mean() - want_mean) < 0.01 * std
    assert abs(x.std() - want_std) < 0.01 * std


def test_trunc_normal_warns_far_from_bounds():
    with pytest.warns(UserWarning, match="more than 2 std"):
        x = init.trunc_normal_(param(1000), mean=10.0, std=1.0, a=-1.0, b=1.0)
    assert values(x).max() <= 1.0


def test_constant_ones_zeros_eye():
    assert (values(init.constant_(param(3, 4), 0.25)) == 0.25).all()
    assert (values(init.ones_(param(5))) == 1).all()
    assert (values(init.zeros_(param(2, 2, 2))) == 0).all()
    np.testing.assert_array_equal(values(init.eye_(param(3, 5))), np.eye(3, 5))
    np.testing.assert_array_equal(values(init.eye_(param(4, 2, dtype=runtime.float64))), np.eye(4, 2))
    with pytest.raises(ValueError, match="Only tensors with 2 dimensions"):
        init.eye_(param(2, 2, 2))


@pytest.mark.parametrize("groups", [1, 2])
def test_dirac_is_the_identity_convolution(groups):
    w = init.dirac_(param(6, 6 // groups, 3, 3, dtype=runtime.float64), groups=groups)
    x = runtime.randn(2, 6, 5, 5, dtype=runtime.float64)
    out = F.conv2d(x, w, padding=1, groups=groups)
    np.testing.assert_allclose(values(out), x.numpy())
    with pytest.raises(ValueError, match="3, 4, or 5 dimensions"):
        init.dirac_(param(3, 3))
    with pytest.raises(ValueError, match="divisible by groups"):
        init.dirac_(param(5, 2, 3), groups=2)


def test_xavier_statistics():
    runtime.manual_seed(2)
    w = values(init.xavier_uniform_(param(300, 200, 3), gain=2.0))
    fan_in, fan_out = 200 * 3, 300 * 3
    bound = 2.0 * math.sqrt(6.0 / (fan_in + fan_out))
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.99 * bound
    assert abs(w.std() - bound / math.sqrt(3)) < 0.01 * bound
    w = values(init.xavier_normal_(param(400, 300)))
    assert abs(w.std() - math.sqrt(2.0 / 700)) < 0.01 * math.sqrt(2.0 / 700)
    assert abs(w.mean()) < 0.01 * math.sqrt(2.0 / 700)


@pytest.mark.parametrize("mode, nonlinearity, a", [("fan_in", "leaky_relu", 0), ("fan_out", "relu", 0),
                                                   ("fan_in", "leaky_relu", math.sqrt(5)), ("fan_out", "tanh", 0)])
def test_kaiming_statistics(mode, nonlinearity, a):
    runtime.manual_seed(3)
    shape = (256, 128, 3, 3)
    fan = 128 * 9 if mode == "fan_in" else 256 * 9
    std = init.calculate_gain(nonlinearity, a) / math.sqrt(fan)
    u = values(init.kaiming_uniform_(param(*shape), a=a, mode=mode, nonlinearity=nonlinearity))
    bound = math.sqrt(3.0) * std
    assert np.abs(u).max() <= bound * (1 + 1e-6) and np.abs(u).max() > 0.99 * bound
    assert abs(u.std() - std) < 0.01 * std
    n = values(init.kaiming_normal_(param(*shape), a=a, mode=mode, nonlinearity=nonlinearity))
    assert abs(n.std() - std) < 0.01 * std and abs(n.mean()) < 0.01 * std


def test_kaiming_on_zero_element_tensor_warns():
    for fn in (init.kaiming_uniform_, init.kaiming_normal_):
        with pytest.warns(UserWarning, match="no-op"):
            t = param(0, 3)
            assert fn(t) is t


@pytest.mark.parametrize("shape", [(30, 30), (20, 50), (50, 20), (8, 4, 3, 3)])
def test_orthogonal(shape):
    runtime.manual_seed(4)
    w = values(init.orthogonal_(param(*shape, dtype=runtime.float64), gain=1.5))
    flat = w.reshape(shape[0], -1)
    rows, cols = flat.shape
    gram = flat @ flat.T if rows <= cols else flat.T @ flat
    np.testing.assert_allclose(gram, 1.5 ** 2 * np.eye(min(rows, cols)), atol=1e-12)
    f32 = values(init.orthogonal_(param(*shape)))
    g32 = f32.reshape(rows, -1)
    gram32 = g32 @ g32.T if rows <= cols else g32.T @ g32
    np.testing.assert_allclose(gram32, np.eye(min(rows, cols)), atol=1e-5)
    with pytest.raises(ValueError, match="2 or more dimensions"):
        init.orthogonal_(param(4))


def test_orthogonal_is_not_biased():
    """The sign correction makes Q Haar-distributed: entries average to ~0 over draws (no sign bias)."""
    runtime.manual_seed(5)
    draws = np.stack([values(init.orthogonal_(param(4, 4, dtype=runtime.float64))) for _ in range(400)])
    assert np.abs(draws.mean(0)).max() < 0.1


def test_sparse():
    runtime.manual_seed(6)
    w = values(init.sparse_(param(40, 30), 0.25, std=0.1))
    assert ((w == 0).sum(0) >= 10).all()
    nonzero = w[w != 0]
    assert abs(nonzero.std() - 0.1) < 0.01
    with pytest.raises(ValueError, match="2 dimensions"):
        init.sparse_(param(3, 3, 3), 0.5)


def test_generator_makes_runs_reproducible():
    for fn in (init.uniform_, init.normal_, init.trunc_normal_, init.xavier_uniform_, init.xavier_normal_,
               init.kaiming_uniform_, init.kaiming_normal_, init.orthogonal_):
        a = fn(param(6, 5), generator=runtime.Generator().manual_seed(7))
        runtime.manual_seed(99)
        b = fn(param(6, 5), generator=runtime.Generator().manual_seed(7))
        np.testing.assert_array_equal(values(a), values(b), err_msg=fn.__name__)


def test_dtype_is_kept():
    for dtype in (runtime.float32, runtime.float64):
        for fn in (init.trunc_normal_, init.orthogonal_, init.eye_, init.kaiming_uniform_):
            assert fn(param(4, 3, dtype=dtype)).dtype is dtype


# ---------------------------------------------------------------------------------------------
# Autograd: initialisers record nothing
# ---------------------------------------------------------------------------------------------

INITIALISERS = {
    "uniform_": lambda t: init.uniform_(t, -1, 1),
    "normal_": lambda t: init.normal_(t),
    "trunc_normal_": lambda t: init.trunc_normal_(t, std=0.02),
    "constant_": lambda t: init.constant_(t, 0.5),
    "ones_": init.ones_,
    "zeros_": init.zeros_,
    "eye_": init.eye_,
    "xavier_uniform_": init.xavier_uniform_,
    "xavier_normal_": init.xavier_normal_,
    "kaiming_uniform_": lambda t: init.kaiming_uniform_(t, a=math.sqrt(5)),
    "kaiming_normal_": lambda t: init.kaiming_normal_(t, mode="fan_out", nonlinearity="relu"),
    "orthogonal_": init.orthogonal_,
    "sparse_": lambda t: init.sparse_(t, 0.5),
}


@pytest.mark.parametrize("name", sorted(INITIALISERS))
def test_initialisers_record_no_history(name):
    p = param(4, 3)
    before = p._version
    out = INITIALISERS[name](p)
    assert out is p
    assert p.is_leaf and p.grad_fn is None and p.requires_grad
    assert p._version > before  # written in place
    assert runtime.is_grad_enabled()
    (p * 2).sum().backward()  # the parameter still works as a leaf afterwards
    np.testing.assert_array_equal(p.grad.numpy(), 2.0)


def test_dirac_records_no_history():
    p = param(4, 4, 3)
    assert init.dirac_(p) is p and p.grad_fn is None and p.is_leaf


# ---------------------------------------------------------------------------------------------
# Gains, fans and errors
# ---------------------------------------------------------------------------------------------

GAIN_CASES = [("linear", None), ("conv1d", None), ("conv2d", None), ("conv3d", None), ("conv_transpose2d", None),
              ("sigmoid", None), ("tanh", None), ("relu", None), ("leaky_relu", None), ("leaky_relu", 0.2),
              ("leaky_relu", 1), ("leaky_relu", math.sqrt(5)), ("selu", None)]


def test_calculate_gain_values():
    assert init.calculate_gain("linear") == 1
    assert init.calculate_gain("tanh") == pytest.approx(5 / 3)
    assert init.calculate_gain("relu") == pytest.approx(math.sqrt(2))
    assert init.calculate_gain("leaky_relu", 0.2) == pytest.approx(math.sqrt(2 / 1.04))
    assert init.calculate_gain("selu") == 0.75


@needs_torch
@pytest.mark.parametrize("nonlinearity, param_", GAIN_CASES)
def test_calculate_gain_matches_torch(nonlinearity, param_):
    assert init.calculate_gain(nonlinearity, param_) == torch.nn.init.calculate_gain(nonlinearity, param_)


@pytest.mark.parametrize("call, error, pattern", [
    (lambda: init.calculate_gain("swish"), ValueError, "Unsupported nonlinearity swish"),
    (lambda: init.calculate_gain("leaky_relu", "big"), ValueError, "negative_slope big not a valid number"),
    (lambda: init.calculate_gain("leaky_relu", True), ValueError, "not a valid number"),
    (lambda: init._calculate_fan_in_and_fan_out(param(5)), ValueError, "fewer than 2 dimensions"),
    (lambda: init.xavier_uniform_(param(5)), ValueError, "fewer than 2 dimensions"),
    (lambda: init.kaiming_normal_(param(5)), ValueError, "fewer than 2 dimensions"),
    (lambda: init.kaiming_uniform_(param(3, 4), mode="fan_avg"), ValueError, "Mode fan_avg not supported"),
])
def test_errors(call, error, pattern):
    with pytest.raises(error, match=pattern):
        call()


@needs_torch
@pytest.mark.parametrize("shape", [(3, 4), (5, 2, 3), (8, 4, 3, 3), (2, 3, 1, 2, 2)])
def test_fans_match_torch(shape):
    assert init._calculate_fan_in_and_fan_out(param(*shape)) == \
        torch.nn.init._calculate_fan_in_and_fan_out(torch.empty(shape))


@needs_torch
@pytest.mark.parametrize("call, error_type", [
    (lambda m: m.calculate_gain("swish"), ValueError),
    (lambda m: m.calculate_gain("leaky_relu", "big"), ValueError),
    (lambda m: m.kaiming_uniform_(m_empty(m, 3, 4), mode="fan_avg"), ValueError),
    (lambda m: m.xavier_normal_(m_empty(m, 5)), ValueError),
    (lambda m: m.eye_(m_empty(m, 2, 2, 2)), ValueError),
    (lambda m: m.orthogonal_(m_empty(m, 4)), ValueError),
    (lambda m: m.dirac_(m_empty(m, 3, 3)), ValueError),
])
def test_error_messages_match_torch(call, error_type):
    with pytest.raises(error_type) as ours:
        call(init)
    with pytest.raises(error_type) as theirs:
        call(torch.nn.init)
    assert str(ours.value) == str(theirs.value)


def m_empty(module, *shape):
    return runtime.empty(*shape) if module is init else torch.empty(*shape)


def test_deprecated_aliases_warn():
    with pytest.warns(FutureWarning, match="deprecated in favor of `nn.init.uniform_`"):
        t = init.uniform(param(3, 3))
    assert t.grad_fn is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        init.uniform_(param(3, 3))  # the current names do not warn
