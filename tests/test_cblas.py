"""nnc.codegen.cblas: numpy's OpenBLAS called from numba code computes what numpy's matmul does, for every layout
of its operands (C-ordered, transposed, strided views), one-row products (gemv) and empty sums."""
import numpy as np
import pytest

from nnc.codegen import cblas

pytestmark = pytest.mark.skipif(not cblas.AVAILABLE, reason="numpy's OpenBLAS symbols were not found")

DOTS = {np.float32: cblas.dot_f32, np.float64: cblas.dot_f64}
TOL = {np.float32: 1e-5, np.float64: 1e-12}


def _operand(rng, shape, dtype, layout):
    """A 2-D array of `shape` stored C-ordered, transposed (Fortran-ordered) or as a strided view."""
    if layout == "C":
        return rng.standard_normal(shape).astype(dtype)
    if layout == "T":
        return rng.standard_normal(shape[::-1]).astype(dtype).T
    return rng.standard_normal((shape[0] * 2, shape[1] * 3)).astype(dtype)[::2, ::3]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m,k,n", [(5, 7, 3), (1, 9, 4), (1, 1, 1), (4, 1, 6), (3, 6, 1), (1, 300, 70)])
@pytest.mark.parametrize("layouts", ["CC", "CT", "TC", "TT", "SC", "CS", "SS"])
def test_dot_matches_numpy(dtype, m, k, n, layouts):
    rng = np.random.default_rng(m * 100 + k * 10 + n)
    a, b = _operand(rng, (m, k), dtype, layouts[0]), _operand(rng, (k, n), dtype, layouts[1])
    out = np.full((m, n), np.nan, dtype=dtype)
    DOTS[dtype](a, b, out)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b.astype(np.float64), rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_an_empty_sum_is_zero_and_empty_outputs_are_left_alone(dtype):
    out = np.full((3, 4), np.nan, dtype=dtype)
    DOTS[dtype](np.ones((3, 0), dtype), np.ones((0, 4), dtype), out)
    assert (out == 0).all()
    out = np.empty((0, 4), dtype=dtype)
    DOTS[dtype](np.ones((0, 2), dtype), np.ones((2, 4), dtype), out)
    assert out.shape == (0, 4)


def test_operands_are_left_unchanged():
    rng = np.random.default_rng(0)
    a, b = _operand(rng, (4, 5), np.float64, "S"), _operand(rng, (5, 3), np.float64, "T")
    a0, b0 = a.copy(), b.copy()
    cblas.dot_f64(a, b, np.empty((4, 3)))
    np.testing.assert_array_equal(a, a0)
    np.testing.assert_array_equal(b, b0)
