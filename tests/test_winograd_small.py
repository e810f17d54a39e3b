"""Winograd at a small batch: the batched-rows product loop (nnc/codegen/cpu_small_gemm.py) against the
interpreter, at its edges (one row, one column, an odd sum); which products take it; the MNIST CNN's conv2 at
batch 1 rewritten by default; the blocked filter transforms over several blocks; and convolutions whose Winograd
products take it, compiled against eager and the interpreter, forward and both gradients, float64."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import nnc
import runtime
from nnc.codegen import cpu_matmul, cpu_small_gemm, cpu_winograd, rows_kernel
from nnc.codegen.cpu import schedule
from nnc.codegen.cpu_matmul import matmul_schedule
from nnc.passes import winograd as winograd_pass

from helpers import call
from test_codegen_cpu import Case, assert_close, compiled
from runtime import _winograd
from test_winograd import CONVS, _module, _ops_in, _plans, _run

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)


@pytest.mark.parametrize("a,b,dtype,form", [
    ((36, 64, 32), (36, 32, 36), F32, "batched_rows"),   # conv2's F(4x4) products at batch 1
    ((36, 64, 32), (36, 32, 36), F64, "batched_rows"),
    ((2, 8, 12), (2, 12, 10), F32, "batched_small"),     # smaller: the axpy loop
    ((36, 64, 32), (36, 32, 72), F32, "blas"),           # rows longer than MAX_COLUMNS
    ((36, 64, 64), (36, 64, 36), F32, "blas"),           # a sum longer than MAX_K (conv2's dV = U^T dM)
    ((16, 64, 32), (16, 32, 64), F32, "blas"),           # attention's q k^T at T = 64: np.matmul, with stores
    ((4096, 64, 32), (4096, 32, 36), F32, "blas"),       # more than MAX_WORK
    ((1, 64, 32), (36, 32, 36), F32, "blas"),            # a broadcast batch
])
def test_which_batched_products_take_the_rows_loop(a, b, dtype, form):
    got = matmul_schedule("matmul", a, b, dtype, dtype, dtype)
    assert got.form == form
    assert not (form == "batched_rows" and got.parallel)  # serial (see cpu_small_gemm's note)


# (name, a shape, b shape): each above the batched_small loop's work, so it takes the rows loop
PRODUCTS = [("one_row_odd_sum", (1100, 1, 33), (1100, 33, 29)),
            ("one_column", (1000, 27, 48), (1000, 48, 1))]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name,a,b", PRODUCTS, ids=[p[0] for p in PRODUCTS])
def test_rows_loop_matches_the_interpreter(name, a, b, dtype):
    rng = np.random.default_rng(5)
    inputs = {"a": runtime.tensor(rng.standard_normal(a).astype(dtype)),
              "b": runtime.tensor(rng.standard_normal(b).astype(dtype))}
    case, kernel = compiled(("batched_rows", name, np.dtype(dtype).name),
                            lambda: Case(inputs, lambda g, a, b: [call(g, "matmul", a, b)], kind="matmul",
                                         name="bmm_rows"))
    assert schedule(case.kernel).form == "batched_rows"
    (got,), (want,) = kernel.run(case.inputs), case.expected()
    tol = dict(rtol=1e-13, atol=1e-13) if dtype == np.float64 else dict(rtol=1e-5, atol=1e-5)
    assert_close(got, want, tol)


# (batch, rows, kdim, n_out): conv2's shape (float32: rows' 4-column tails packed in one vector), a sum of one,
# rows left after the blocks of 4, one row, one column, float64 rows of two column passes, empty sums and batches
KERNEL_SHAPES = [(36, 64, 32, 36), (3, 7, 33, 29), (2, 1, 5, 1), (2, 5, 48, 48), (1, 9, 1, 17), (2, 3, 0, 4),
                 (0, 4, 3, 5), (3, 6, 7, 34)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rows_kernel_matches_numpy_and_any_split_of_its_tasks(dtype):
    """rows_kernel against float64 numpy; and its tasks computed in any pieces (the caller's and the helper's
    chunks) give the whole product bit for bit."""
    rng = np.random.default_rng(3)
    for batch, rows, kdim, n_out in KERNEL_SHAPES:
        a = rng.standard_normal((batch, rows, kdim)).astype(dtype)
        b = rng.standard_normal((batch, kdim, n_out)).astype(dtype)
        out = np.full((batch, rows, n_out), np.nan, dtype)
        rows_kernel.rows_product(a.ravel(), b.ravel(), out.ravel(), rows, kdim, n_out)
        tol = 1e-5 if dtype == np.float32 else 1e-13
        np.testing.assert_allclose(out, a.astype(np.float64) @ b.astype(np.float64), rtol=tol, atol=tol,
                                   err_msg=str((batch, rows, kdim, n_out)))
        ntasks = batch * rows_kernel.blocks_per_product(rows)
        pieces = np.full_like(out, np.nan)
        bounds = sorted({0, min(1, ntasks), ntasks // 2, ntasks})
        for t0, t1 in zip(bounds, bounds[1:]):
            rows_kernel.rows_tasks(a.ravel(), b.ravel(), pieces.ravel(), t0, t1, rows, kdim, n_out)
        np.testing.assert_array_equal(pieces, out)


def test_the_mnist_cnn_conv2_at_batch_1_is_rewritten(monkeypatch):
    """With the default thresholds: 10.6 M direct multiply-adds, below MIN_DIRECT_WORK, but its 36 products of
    64 x 32 x 36 take the rows loop. (test_winograd's MNIST CNN test runs it compiled, in whole-graph mode.)"""
    runtime.manual_seed(0)
    conv = runtime.nn.Conv2d(32, 64, 3)
    x = runtime.randn(1, 32, 26, 26)
    rewritten = nnc.compile(conv, codegen=False)
    with runtime.no_grad():
        np.testing.assert_allclose(rewritten(x).numpy(), conv(x).numpy(), rtol=1e-4, atol=1e-4)
    assert "winograd_input" in _ops_in(rewritten) and "im2col" not in _ops_in(rewritten)
    monkeypatch.setattr(winograd_pass, "MIN_LOOPED_DIRECT_WORK", 64 * 32 * 9 * 24 * 24 + 1)  # above conv2's
    kept = nnc.compile(conv, codegen=False)
    with runtime.no_grad():
        kept(x)
    assert "im2col" in _ops_in(kept)


@pytest.mark.parametrize("op,shape", [("winograd_filter", (20, 15, 3, 3)),
                                      ("winograd_filter_backward", (36, 20, 15))])
def test_filter_transforms_over_several_blocks_match_the_interpreter(op, shape, monkeypatch):
    """300 filters: a full block of FILTER_BLOCK (256 here) and a partial one."""
    monkeypatch.setattr(cpu_winograd, "FILTER_BLOCK", 256)
    rng = np.random.default_rng(7)
    inputs = {"w": runtime.tensor(rng.standard_normal(shape))}
    case, kernel = compiled(("filter_blocks", op), lambda: Case(inputs, lambda g, w: [call(g, op, w, tile=4)],
                                                               kind="winograd", name="filter"))
    (got,), (want,) = kernel.run(case.inputs), case.expected()
    assert_close(got, want, dict(rtol=1e-14, atol=1e-14))


def _products(compiled_module) -> list:
    """The schedules of the matmul kernels of every plan of a compiled module (whole-graph steps' included)."""
    steps = [s for p in _plans(compiled_module) for s in p.steps]
    kernels = [k for s in steps for k in (getattr(s, "kernels", None) or [getattr(s, "kernel", None)])]
    return [schedule(k) for k in kernels if getattr(k, "kind", None) == "matmul"]


def test_a_convolution_with_rows_loop_products_matches_eager_and_the_interpreter(monkeypatch):
    """One of test_winograd's convolutions (its transform kernels shared), with every Winograd product in the rows
    loop: the forward's U V, and the backward's dM V^T and U^T dM."""
    name, shape, out_ch, padding, bias, act = next(c for c in CONVS if c[0] == "large_tile_partial_padded")
    monkeypatch.setattr(winograd_pass, "MIN_DIRECT_WORK", 0)
    monkeypatch.setattr(cpu_matmul, "_SERIAL_LOOP_WORK", 0)  # these products are small: no batched_small loop
    runtime.manual_seed(0)
    m = _module(runtime, shape, out_ch, padding, bias, act).double()
    rng = np.random.default_rng(6)
    x = rng.standard_normal(shape)
    gy = rng.standard_normal((shape[0], out_ch) + _winograd.output_sizes(shape[2:], ((padding,) * 2,) * 2))
    compiled_m = nnc.compile(m)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got, want = _run(m, compiled_m, x, gy), _run(m, m, x, gy)
    interpreted = _run(m, nnc.compile(m, codegen=False), x, gy)
    for g, w, i in zip(got, want, interpreted):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(g, i, rtol=1e-12, atol=1e-12)
    forms = [s.form for s in _products(compiled_m)]
    assert forms.count("batched_rows") == 3, forms  # (sums over 9 channels, 24 tiles and 3 outputs)
    assert all(not p.fallbacks for p in _plans(compiled_m))


def test_rows_loop_limits_are_consistent():
    assert cpu_small_gemm.takes_batched_rows(36, 64, 32, 36)
    assert not cpu_small_gemm.takes_batched_rows(36, 64, 0, 36)  # an empty sum: BLAS writes the zeros
    assert not cpu_small_gemm.takes_batched_rows(36, 64, cpu_small_gemm.MAX_K + 1, 36)
