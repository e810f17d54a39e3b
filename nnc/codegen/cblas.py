"""Matrix products callable from numba code through numpy's own OpenBLAS (its cblas gemm and gemv, bound by symbol
name), so a whole graph (nnc.codegen.whole_graph) calls BLAS without scipy, through which numba's np.dot goes.

`dot_f32(a, b, out)` and `dot_f64(a, b, out)` compute out = a @ b for 2-D arrays (out C-contiguous); an operand
that is C- or Fortran-ordered (a transposed view, `w.T`) is read in place, any other is copied first. A product of
one row is a gemv, as numpy's np.dot makes it (a gemm of one row is several times slower). `AVAILABLE` says
whether the library and its symbols were found (numpy wheels bundle OpenBLAS as scipy-openblas, with ILP64
symbols `scipy_cblas_sgemm64_`); without them the callers keep numba's np.dot.
"""
from __future__ import annotations

import ctypes
import glob
import os

import numpy as np
from numba import njit, types

# NOTE: written into the source of whole graphs that call these, so a change here is a new cached graph (numba's
# cache of a graph holds the code of the functions it calls)
VERSION = 2

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
_NAMES = ("sgemm", "dgemm", "sgemv", "dgemv")


def _numpy_openblas() -> tuple[ctypes.CDLL, str, type] | None:
    """(numpy's OpenBLAS, its symbols' prefix/suffix pattern, its integer type), or None when not found."""
    here = os.path.dirname(np.__file__)
    for path in sorted(glob.glob(os.path.join(here, os.pardir, "numpy.libs", "*openblas*"))):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for pattern, integer in (("scipy_cblas_{}64_", types.int64), ("scipy_cblas_{}", types.int32)):
            if all(hasattr(lib, pattern.format(name)) for name in _NAMES):
                return lib, pattern, integer
    return None


def _bind():
    """Register the symbols with LLVM under nnc's names; the numba signatures of gemm and gemv, or None."""
    import llvmlite.binding as llvm

    found = _numpy_openblas()
    if found is None:
        return None
    lib, pattern, integer = found
    for name in _NAMES:
        llvm.add_symbol(f"nnc_cblas_{name}", ctypes.cast(getattr(lib, pattern.format(name)), ctypes.c_void_p).value)
    i, p = integer, types.voidptr
    gemm = {t: types.ExternalFunction(f"nnc_cblas_{c}gemm", types.void(types.intc, types.intc, types.intc, i, i, i,
                                                                      t, p, i, p, i, t, p, i))
            for t, c in ((types.float32, "s"), (types.float64, "d"))}
    gemv = {t: types.ExternalFunction(f"nnc_cblas_{c}gemv", types.void(types.intc, types.intc, i, i, t, p, i, p, i,
                                                                      t, p, i))
            for t, c in ((types.float32, "s"), (types.float64, "d"))}
    return gemm, gemv


_BOUND = _bind()
AVAILABLE = _BOUND is not None
if AVAILABLE:
    _sgemm, _dgemm = _BOUND[0][types.float32], _BOUND[0][types.float64]
    _sgemv, _dgemv = _BOUND[1][types.float32], _BOUND[1][types.float64]
else:  # NOTE: never called (whole_graph checks AVAILABLE); the names keep the functions below compilable text
    _sgemm = _dgemm = _sgemv = _dgemv = None


@njit(cache=True)
def _layout(x):
    """(transposed, leading dimension) with which BLAS reads the 2-D array x in place; (-1, 0) when it cannot."""
    item = x.itemsize
    rows, cols = x.shape
    s0, s1 = x.strides
    if (s1 == item or cols <= 1) and s0 % item == 0 and (rows <= 1 or s0 // item >= max(1, cols)):
        return 0, (s0 // item if rows > 1 else max(1, cols))
    if (s0 == item or rows <= 1) and s1 % item == 0 and (cols <= 1 or s1 // item >= max(1, rows)):
        return 1, (s1 // item if cols > 1 else max(1, rows))
    return -1, 0


@njit(cache=True)
def _plan(a, b, out):
    """(a, b, then each one's transposed flag and leading dimension), copying an operand BLAS cannot read in place."""
    ta, lda = _layout(a)
    if ta < 0:
        a = np.ascontiguousarray(a)
        ta, lda = _layout(a)
    tb, ldb = _layout(b)
    if tb < 0:
        b = np.ascontiguousarray(b)
        tb, ldb = _layout(b)
    return a, b, ta, lda, tb, ldb


@njit(cache=True)
def _zero_sum(out):
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            out[i, j] = 0


_NOTHING, _GEMV, _GEMM = 0, 1, 2


@njit(cache=True)
def _prepare(a, b, out):
    """What computes out = a @ b, dtype aside: (_NOTHING (an empty product, or a sum over k = 0 written as zeros),
    _GEMV (one row: op(b)^T times a's row with stride inc) or _GEMM; a and b as BLAS reads them, the transposed
    flags and leading dimensions ta, lda, tb, ldb, ldc; inc)."""
    m, k, n = a.shape[0], a.shape[1], b.shape[1]
    if k == 0 and m > 0 and n > 0:
        _zero_sum(out)
    if m == 0 or n == 0 or k == 0:
        return _NOTHING, a, b, 0, 0, 0, 0, 0, 0
    a, b, ta, lda, tb, ldb = _plan(a, b, out)
    ldc = out.strides[0] // out.itemsize if m > 1 else n
    if m == 1 and a.strides[1] > 0:  # a row times a matrix: gemv (a gemm of one row is several times slower)
        return _GEMV, a, b, ta, lda, tb, ldb, ldc, (a.strides[1] // a.itemsize if k > 1 else 1)
    return _GEMM, a, b, ta, lda, tb, ldb, ldc, 0


# NOTE: one function per dtype: each calls its own external BLAS symbol, which numba binds at compile time.
# In a gemv, b is w.T for a C-ordered w (n, k) when tb (y = w x), else C-ordered (k, n) (y = b^T x).
@njit(cache=True)
def dot_f32(a, b, out):
    """out = a @ b for float32 2-D arrays (out C-contiguous, of a's rows and b's columns)."""
    call, a, b, ta, lda, tb, ldb, ldc, inc = _prepare(a, b, out)
    k, n, one, zero = a.shape[1], b.shape[1], np.float32(1.0), np.float32(0.0)
    if call == _GEMV:
        _sgemv(_ROW_MAJOR, _NO_TRANS if tb else _TRANS, n if tb else k, k if tb else n, one, b.ctypes.data, ldb,
               a.ctypes.data, inc, zero, out.ctypes.data, 1)
    elif call == _GEMM:
        _sgemm(_ROW_MAJOR, _TRANS if ta else _NO_TRANS, _TRANS if tb else _NO_TRANS, a.shape[0], n, k, one,
               a.ctypes.data, lda, b.ctypes.data, ldb, zero, out.ctypes.data, ldc)


@njit(cache=True)
def dot_f64(a, b, out):
    """out = a @ b for float64 2-D arrays (out C-contiguous, of a's rows and b's columns)."""
    call, a, b, ta, lda, tb, ldb, ldc, inc = _prepare(a, b, out)
    k, n, one, zero = a.shape[1], b.shape[1], np.float64(1.0), np.float64(0.0)
    if call == _GEMV:
        _dgemv(_ROW_MAJOR, _NO_TRANS if tb else _TRANS, n if tb else k, k if tb else n, one, b.ctypes.data, ldb,
               a.ctypes.data, inc, zero, out.ctypes.data, 1)
    elif call == _GEMM:
        _dgemm(_ROW_MAJOR, _TRANS if ta else _NO_TRANS, _TRANS if tb else _NO_TRANS, a.shape[0], n, k, one,
               a.ctypes.data, lda, b.ctypes.data, ldb, zero, out.ctypes.data, ldc)


# the function a whole graph calls for a product of this numpy dtype
DOT = {np.dtype(np.float32): "dot_f32", np.dtype(np.float64): "dot_f64"}
