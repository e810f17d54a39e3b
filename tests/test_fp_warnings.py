"""Eager ops give inf and nan as torch does, without numpy's RuntimeWarnings, and leave numpy's error state as the
program set it."""
import warnings

import numpy as np
import pytest

import runtime

_SPECIAL = np.array([[3e38, 3e38, -np.inf, np.inf, np.nan, 0.0, -1.0]], np.float32)
_MASKED = np.array([[-np.inf] * 4, [0.0, 1.0, -np.inf, 2.0]], np.float32)

CASES = {
    "sum": lambda t, x, m: x.sum(),
    "var": lambda t, x, m: x.var(1),
    "cumsum": lambda t, x, m: x.cumsum(1),  # torch accumulates in double: 3e38 + 3e38 - inf is -inf, not nan
    "cumprod": lambda t, x, m: x.cumprod(1),
    "sub": lambda t, x, m: x - x,
    "mul": lambda t, x, m: x * x,
    "sin": lambda t, x, m: x.sin(),
    "softmax of a fully masked row": lambda t, x, m: m.softmax(1),
    "log_softmax of a fully masked row": lambda t, x, m: m.log_softmax(1),
    "cross_entropy": lambda t, x, m: t.nn.functional.cross_entropy(m, t.tensor([1, 3])),
    "layer_norm": lambda t, x, m: t.nn.functional.layer_norm(x, (7,)),
    "gelu": lambda t, x, m: t.nn.functional.gelu(x),
    "matmul": lambda t, x, m: x @ x.T,
    "cdist": lambda t, x, m: t.cdist(x, x),
    "lerp": lambda t, x, m: t.lerp(x, x, 0.5),
    "addcmul": lambda t, x, m: t.addcmul(x, x, x),
}

# NOTE: torch's float32 gelu overflows inside on some CPUs (an AMD EPYC's vector path gives gelu(3e38) = inf and
# gelu(inf) = nan, where x * Phi(x) is 3e38 and inf); for these the oracle is torch's float64 result, rounded
_BY_CPU = {"gelu"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_special_values_compute_without_warnings(name):
    fn = CASES[name]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = fn(runtime, runtime.tensor(_SPECIAL), runtime.tensor(_MASKED)).numpy()
    try:
        import torch
    except ImportError:
        assert not np.isfinite(got).all()  # the case reaches inf or nan
        return
    if name in _BY_CPU:
        want = fn(torch, torch.tensor(_SPECIAL).double(), torch.tensor(_MASKED).double()).float().numpy()
    else:
        want = fn(torch, torch.tensor(_SPECIAL), torch.tensor(_MASKED)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)


def test_gradients_through_masked_rows_and_zeros_come_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = runtime.tensor([[0.0, -np.inf, 0.0], [-np.inf, -np.inf, -np.inf]], requires_grad=True)
        t.softmax(1).sum().backward()
        z = runtime.tensor([[0.0, 0.0]], requires_grad=True)
        z.norm().backward()
    assert np.isnan(t.grad.numpy()[1]).all() and not np.isnan(t.grad.numpy()[0]).any()
    assert np.array_equal(z.grad.numpy(), [[0.0, 0.0]])


def test_the_programs_numpy_error_state_is_kept():
    with np.errstate(over="raise", invalid="warn", divide="ignore", under="ignore"):
        before = np.geterr()
        runtime.tensor(_SPECIAL) * 2  # overflows: numpy's own setting would raise
        assert np.geterr() == before
        with pytest.raises(FloatingPointError):
            np.float32(3e38) * np.float32(10)


def test_an_op_that_fails_still_restores_the_error_state():
    with np.errstate(all="raise"):
        with pytest.raises(RuntimeError):
            runtime.ones(2, 3) @ runtime.ones(2, 3)
        with pytest.raises(FloatingPointError):
            np.float32(3e38) * np.float32(10)
