"""Tests for runtime._special.erf: accuracy against math.erf, dtypes, and special values."""
import math

import numpy as np
import pytest

from runtime._special import erf

_math_erf = np.frompyfunc(math.erf, 1, 1)


def reference(x: np.ndarray) -> np.ndarray:
    """math.erf elementwise, in float64."""
    return _math_erf(np.asarray(x, dtype=np.float64)).astype(np.float64)


def max_relative_error(got: np.ndarray, want: np.ndarray) -> float:
    scale = np.maximum(np.abs(want), np.finfo(np.float64).tiny)
    return float(np.max(np.abs(got.astype(np.float64) - want) / scale))


def test_float64_dense_grid_matches_math_erf():
    rng = np.random.default_rng(0)
    x = np.concatenate([
        np.linspace(-10.0, 10.0, 1_000_001),
        rng.uniform(-7.0, 7.0, 500_000),
        # Around the split points 0.46875, 4 and 6 of the piecewise approximation.
        np.concatenate([np.linspace(c - 1e-6, c + 1e-6, 2001) for c in (0.46875, 4.0, 6.0)]),
    ])
    got = erf(x)
    assert got.dtype == np.float64
    assert max_relative_error(got, reference(x)) < 1e-13


def test_float64_tiny_and_huge_values():
    tiny = np.array([1e-300, 1e-200, 1e-20, 1e-10, 2.2250738585072014e-308, 1e-310, 5e-324])
    huge = np.array([6.0, 26.0, 27.0, 1e3, 1e10, 1e300, np.finfo(np.float64).max])
    x = np.concatenate([tiny, -tiny, huge, -huge])
    got = erf(x)
    want = reference(x)
    normal = np.abs(want) >= np.finfo(np.float64).tiny
    assert max_relative_error(got[normal], want[normal]) < 1e-13
    # Subnormal results can only be compared to within one subnormal step.
    assert np.all(np.abs(got[~normal] - want[~normal]) <= 5e-324)
    assert np.all(erf(huge) == 1.0) and np.all(erf(-huge) == -1.0)


def test_signed_zero():
    got = erf(np.array([0.0, -0.0]))
    assert got[0] == 0.0 and math.copysign(1.0, got[0]) == 1.0
    assert got[1] == 0.0 and math.copysign(1.0, got[1]) == -1.0


def test_inf_and_nan():
    got = erf(np.array([np.inf, -np.inf, np.nan]))
    assert got[0] == 1.0 and got[1] == -1.0 and np.isnan(got[2])


def test_no_floating_point_warnings():
    x = np.array([0.0, -0.0, 5e-324, 1e-310, 4.5, 1e300, np.inf, -np.inf, np.nan])
    x32 = np.array([0.0, -0.0, 1e-45, 1e-40, 4.5, 3e38, np.inf, -np.inf, np.nan], np.float32)
    x16 = np.array([0.0, -0.0, 6e-8, 4.5, 65504.0, np.inf, -np.inf, np.nan], np.float16)
    with np.errstate(all="raise"):
        erf(x)
        erf(x32)
        erf(x16)


def test_odd_symmetry_is_exact():
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.standard_normal(100_000) * 3, rng.uniform(-7.0, 7.0, 100_000)])
    assert np.array_equal(erf(-x), -erf(x))
    x32 = x.astype(np.float32)
    assert np.array_equal(erf(-x32), -erf(x32))


def test_float32_dtype_and_accuracy():
    rng = np.random.default_rng(2)
    x = np.concatenate([
        np.linspace(-10.0, 10.0, 200_001, dtype=np.float32),
        rng.standard_normal(200_000).astype(np.float32),
        np.geomspace(1e-37, 1.0, 10_000, dtype=np.float32),
    ])
    got = erf(x)
    assert got.dtype == np.float32
    assert max_relative_error(got, reference(x)) < 1e-6


def test_float32_special_values():
    x = np.array([0.0, -0.0, 1e-45, np.inf, -np.inf, np.nan], dtype=np.float32)
    got = erf(x)
    assert got.dtype == np.float32
    assert math.copysign(1.0, got[1]) == -1.0
    assert got[2] == np.float32(math.erf(float(x[2])))
    assert got[3] == 1.0 and got[4] == -1.0 and np.isnan(got[5])


def test_float16_keeps_dtype():
    x = np.linspace(-5.0, 5.0, 1001).astype(np.float16)
    got = erf(x)
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float64), reference(x), rtol=1e-3, atol=1e-7)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_zero_dim_input(dtype):
    got = erf(np.array(0.5, dtype=dtype))
    assert isinstance(got, np.ndarray) and got.shape == () and got.dtype == dtype
    assert abs(float(got) - math.erf(0.5)) <= 1e-3 * math.erf(0.5)


def test_numpy_scalar_input():
    got = erf(np.float32(0.5))
    assert got.shape == () and got.dtype == np.float32
    assert float(got) == pytest.approx(math.erf(0.5), rel=1e-6)


def test_shape_preserved_and_input_untouched():
    x = np.linspace(-3.0, 3.0, 24).reshape(2, 3, 4)
    before = x.copy()
    got = erf(x)
    assert got.shape == (2, 3, 4)
    assert np.array_equal(x, before)
    assert max_relative_error(got, reference(x)) < 1e-13
    # Non-contiguous input and more elements than one internal block.
    big = np.linspace(-8.0, 8.0, 300_000).reshape(600, 500).T
    assert max_relative_error(erf(big), reference(big)) < 1e-13
    assert erf(np.empty((0, 3))).shape == (0, 3)
