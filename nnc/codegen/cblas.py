"""Matrix products callable from numba code through numpy's own OpenBLAS (its cblas gemm and gemv, bound by symbol
name), so a whole graph (nnc.codegen.whole_graph) calls BLAS without scipy, through which numba's np.dot goes.

`dot_f32(a, b, out)` and `dot_f64(a, b, out)` compute out = a @ b for 2-D arrays (out's rows contiguous); an operand
that is C- or Fortran-ordered (a transposed view, `w.T`) is read in place, any other is copied first. A product of
one row is a gemv, as numpy's np.dot makes it (a gemm of one row is several times slower). `AVAILABLE` says
whether the library and its symbols were found (numpy wheels bundle OpenBLAS as scipy-openblas, with ILP64
symbols `scipy_cblas_sgemm64_`); without them the callers keep numba's np.dot.

`dot_threaded_f32`/`_f64` split a product in blocks of output rows or columns over numba's threads, each block a
single-threaded OpenBLAS call: kernel-by-kernel plans run their large products so, with OpenBLAS set to one thread
(`set_blas_threads`), and numba's pool is the only one (nnc.executor.one_thread_pool).
"""
from __future__ import annotations

import ctypes
import threading

import numpy as np
from numba import njit, prange, types

from runtime._openblas import numpy_openblas, thread_count_functions

# NOTE: written into the source of whole graphs that call these, so a change here is a new cached graph (numba's
# cache of a graph holds the code of the functions it calls)
VERSION = 2

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
_NAMES = ("sgemm", "dgemm", "sgemv", "dgemv")


def _bind():
    """Register the symbols with LLVM under nnc's names; the numba signatures of gemm and gemv, or None."""
    import llvmlite.binding as llvm

    found = numpy_openblas()
    if found is None:
        return None
    lib, pattern, ilp64 = found
    integer = types.int64 if ilp64 else types.int32
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
def _dot_f32(a, b, out):
    """out = a @ b for float32 2-D arrays (out C-contiguous, of a's rows and b's columns)."""
    call, a, b, ta, lda, tb, ldb, ldc, inc = _prepare(a, b, out)
    k, n, one, zero = a.shape[1], b.shape[1], np.float32(1.0), np.float32(0.0)
    if call == _GEMV:
        _sgemv(_ROW_MAJOR, _NO_TRANS if tb else _TRANS, n if tb else k, k if tb else n, one, b.ctypes.data, ldb,
               a.ctypes.data, inc, zero, out.ctypes.data, 1)
    elif call == _GEMM:
        _sgemm(_ROW_MAJOR, _TRANS if ta else _NO_TRANS, _TRANS if tb else _NO_TRANS, a.shape[0], n, k, one,
               a.ctypes.data, lda, b.ctypes.data, ldb, zero, out.ctypes.data, ldc)


def _dot_f64(a, b, out):
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


# --- products on numba's threads: OpenBLAS on one thread in each (see nnc.executor.one_thread_pool) ---

# A threaded product splits into blocks of at least this many multiply-adds (OpenBLAS's own threshold for using
# more than one thread for a gemm: 65536 * GEMM_MULTITHREAD_THRESHOLD) and this many output rows or columns.
THREAD_MIN_WORK = 1 << 18
_MIN_BLOCK = 16


@njit(cache=True)
def _blocks(m, n, k, threads):
    """How a product of (m, k) by (k, n) splits among `threads`: (blocks, along_rows): `blocks` parts of the output's
    rows (along_rows) or columns, whichever dimension is longer."""
    along_rows = m > n
    extent = m if along_rows else n
    blocks = min(threads, max(1, (m * n * k) // THREAD_MIN_WORK), max(1, extent // _MIN_BLOCK))
    return blocks, along_rows


@njit(cache=True)
def _bounds(block, blocks, extent):
    step = (extent + blocks - 1) // blocks
    return min(extent, block * step), min(extent, (block + 1) * step)


def _dot_threaded_f32(a, b, out, threads):
    """dot_f32 with the output split in blocks of rows or columns, a block per thread of numba's `threads`."""
    blocks, along_rows = _blocks(out.shape[0], out.shape[1], a.shape[1], threads)
    if blocks == 1:
        dot_f32(a, b, out)  # noqa: F821 (_public defines it)
        return
    extent = out.shape[0] if along_rows else out.shape[1]
    for block in prange(blocks):
        lo, hi = _bounds(block, blocks, extent)
        if along_rows:
            dot_f32(a[lo:hi], b, out[lo:hi])  # noqa: F821 (_public defines it)
        else:
            dot_f32(a, b[:, lo:hi], out[:, lo:hi])  # noqa: F821 (_public defines it)


def _dot_threaded_f64(a, b, out, threads):
    """dot_f64 with the output split in blocks of rows or columns, a block per thread of numba's `threads`."""
    blocks, along_rows = _blocks(out.shape[0], out.shape[1], a.shape[1], threads)
    if blocks == 1:
        dot_f64(a, b, out)  # noqa: F821 (_public defines it)
        return
    extent = out.shape[0] if along_rows else out.shape[1]
    for block in prange(blocks):
        lo, hi = _bounds(block, blocks, extent)
        if along_rows:
            dot_f64(a[lo:hi], b, out[lo:hi])  # noqa: F821 (_public defines it)
        else:
            dot_f64(a, b[:, lo:hi], out[:, lo:hi])  # noqa: F821 (_public defines it)


def _dot_batch_threaded_f32(a, b, out):
    """out[i] = a[i] @ b[i] for 3-D float32 arrays, the batch's products spread over numba's threads."""
    for i in prange(out.shape[0]):
        dot_f32(a[i], b[i], out[i])  # noqa: F821 (_public defines it)


def _dot_batch_threaded_f64(a, b, out):
    """out[i] = a[i] @ b[i] for 3-D float64 arrays, the batch's products spread over numba's threads."""
    for i in prange(out.shape[0]):
        dot_f64(a[i], b[i], out[i])  # noqa: F821 (_public defines it)


# --- the public products: compiled once per dtype, for operands of any layout, on first use ---

# NOTE: numba compiles a function once per argument type, and a C-ordered, a Fortran-ordered (a transposed view)
# and a strided array are three types: every mix of layouts compiled anew (a test run compiled 21 overloads of
# _prepare and 11 of the threaded products, seconds each). Each public function has one signature of any-layout
# ('A') arrays, which the others convert to (no copy; BLAS reads the strides either way). A read-only array does
# not convert: numba refuses it with a TypeError, and the callers copy it (codegen.cpu.CompiledKernel.run).
_THREADS = (types.int64,)  # the threaded products' last argument
# name -> (function, dtype, dimensions, arguments after the arrays, parallel, the public functions it calls)
_FUNCTIONS = {
    "dot_f32": (_dot_f32, types.float32, 2, (), False, ()),
    "dot_f64": (_dot_f64, types.float64, 2, (), False, ()),
    "dot_threaded_f32": (_dot_threaded_f32, types.float32, 2, _THREADS, True, ("dot_f32",)),
    "dot_threaded_f64": (_dot_threaded_f64, types.float64, 2, _THREADS, True, ("dot_f64",)),
    "dot_batch_threaded_f32": (_dot_batch_threaded_f32, types.float32, 3, (), True, ("dot_f32",)),
    "dot_batch_threaded_f64": (_dot_batch_threaded_f64, types.float64, 3, (), True, ("dot_f64",)),
}
_compile_lock = threading.Lock()


def __getattr__(name: str):
    """A public product (`_FUNCTIONS`), compiled (or loaded from numba's cache) on first use."""
    if name not in _FUNCTIONS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    with _compile_lock:
        return _public(name)


def _public(name: str):
    if name in globals():
        return globals()[name]
    function, dtype, ndim, extra, parallel, calls = _FUNCTIONS[name]
    for callee in calls:  # in the module's namespace before numba types the body that calls it
        _public(callee)
    array = types.Array(dtype, ndim, "A")
    globals()[name] = njit([types.void(array, array, array, *extra)], cache=True, parallel=parallel)(function)
    return globals()[name]


# the functions a kernel's launcher calls for a product (a batch of products) of this numpy dtype run on numba's
# threads
DOT_THREADED = {np.dtype(np.float32): "dot_threaded_f32", np.dtype(np.float64): "dot_threaded_f64"}
DOT_BATCH_THREADED = {np.dtype(np.float32): "dot_batch_threaded_f32", np.dtype(np.float64): "dot_batch_threaded_f64"}


_THREAD_COUNT = thread_count_functions() if AVAILABLE else None
# NOTE: OpenBLAS's openblas_set_num_threads_local is no per-thread setting in its pthreads builds (it sets the
# global count), so the threaded products need the global count set to 1 while they run.
THREADS_SETTABLE = _THREAD_COUNT is not None


def blas_threads() -> int:
    """OpenBLAS's thread count now."""
    return _THREAD_COUNT[0]()


def set_blas_threads(count: int) -> None:
    """Set OpenBLAS's thread count (for every thread of the process)."""
    _THREAD_COUNT[1](count)
