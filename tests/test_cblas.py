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


THREADED = {np.float32: cblas.dot_threaded_f32, np.float64: cblas.dot_threaded_f64}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m,k,n", [(64, 96, 700), (700, 96, 64), (1, 4096, 300), (300, 4096, 1), (17, 1024, 33),
                                   (0, 300, 2000), (2000, 0, 300), (5, 7, 3)])
@pytest.mark.parametrize("layouts", ["CC", "CT", "TC", "SS"])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_threaded_dot_matches_numpy(dtype, m, k, n, layouts, threads):
    """Split in blocks of output rows (m > n) or columns, with blocks that do not divide evenly, or not split (one
    thread, or too little work): the same product, every output element written once."""
    rng = np.random.default_rng(m + k + n)
    a, b = _operand(rng, (m, k), dtype, layouts[0]), _operand(rng, (k, n), dtype, layouts[1])
    out = np.full((m, n), np.nan, dtype=dtype)
    previous = cblas.blas_threads()
    cblas.set_blas_threads(1)
    try:
        THREADED[dtype](a, b, out, threads)
    finally:
        cblas.set_blas_threads(previous)
    want = a.astype(np.float64) @ b.astype(np.float64)
    tol = TOL[dtype] * max(1, k) ** 0.5
    np.testing.assert_allclose(out, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("m,k,n,threads,split", [(64, 288, 36864, 2, (2, False)), (36864, 288, 64, 2, (2, True)),
                                                 (64, 288, 20, 2, (1, True)), (64, 288, 36864, 1, (1, False)),
                                                 (2000, 288, 40, 8, (8, True)), (20, 4096, 40, 8, (2, False))])
def test_threaded_blocks_are_wide_and_large_enough(m, k, n, threads, split):
    """A block is at least THREAD_MIN_WORK multiply-adds and 16 rows or columns: below, fewer blocks."""
    assert cblas._blocks(m, n, k, threads) == split
    blocks, along_rows = split
    extent = m if along_rows else n
    bounds = [cblas._bounds(i, blocks, extent) for i in range(blocks)]
    assert bounds[0][0] == 0 and bounds[-1][1] == extent
    assert all(hi == lo for (_, hi), (lo, _) in zip(bounds, bounds[1:]))


def test_blas_thread_count_can_be_set_and_read_back():
    previous = cblas.blas_threads()
    try:
        cblas.set_blas_threads(1)
        assert cblas.blas_threads() == 1
    finally:
        cblas.set_blas_threads(previous)
    assert cblas.blas_threads() == previous


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("batch,m,k,n", [(36, 64, 32, 300), (3, 1, 50, 7), (1, 5, 5, 5), (0, 4, 4, 4), (5, 4, 0, 3)])
def test_batch_threaded_dot_matches_numpy(dtype, batch, m, k, n):
    rng = np.random.default_rng(batch + m + k + n)
    a = rng.standard_normal((batch, m, k)).astype(dtype)
    b = rng.standard_normal((batch, n, k)).astype(dtype).transpose(0, 2, 1)  # each entry read transposed
    out = np.full((batch, m, n), np.nan, dtype=dtype)
    {np.float32: cblas.dot_batch_threaded_f32, np.float64: cblas.dot_batch_threaded_f64}[dtype](a, b, out)
    tol = TOL[dtype] * max(1, k) ** 0.5
    np.testing.assert_allclose(out, a.astype(np.float64) @ b.astype(np.float64), rtol=tol, atol=tol)
