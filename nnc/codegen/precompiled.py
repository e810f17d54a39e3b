"""Kernels compiled once per installation instead of once per shape: small serial loops whose code does not depend
on sizes, which take their sizes as arguments.

A generated kernel is specialized to its sizes, so each new shape is a numba compilation of its own (0.2-0.5 s). The
kernels here are what a model's shapes change most and their sizes help least: a bias gradient's column sum (one per
linear layer width), an embedding's row gather and its backward's row scatter. numba compiles each once per
argument dtypes and keeps the machine code in its cache beside this file (as for nnc.codegen.approx), so a new
model, a new width or a fresh kernel cache (nnc.codegen.cache) loads them in milliseconds. A kernel module that uses
one imports it and calls it from `launch` (nnc.codegen.cpu_reduction, cpu_gather); only serial kernels do: a
parallel kernel's work is large enough that its own specialized, task-split code pays for its compilation.

Arrays are 1-D and C-contiguous (the flat views a launcher passes), sizes int64. Each function computes exactly what
the generated loop it replaces computes, in the same order, so results are bit for bit the same.
"""
from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["PRECOMPILED", "column_sum_f32", "column_sum_f64", "gather_rows", "scatter_rows"]

# NOTE: the generated kernels' flags: numpy's float semantics (no ZeroDivisionError branches in loops), and no C
# entry point, which nothing takes the address of
_FLAGS = dict(cache=True, error_model="numpy", no_cfunc_wrapper=True)

# A column sum keeps at most _TILE float64 accumulators (and as many float32 partial sums) while it sweeps the rows.
_TILE = 1024
# float32 values add in float32 over spans of _SPAN rows, each span's total into a float64 accumulator
# (nnc.codegen.cpu_reduction._SPAN, whose rounding this keeps).
_SPAN = 256


@njit(**_FLAGS)
def column_sum_f32(x, start, rows, cols, out):
    """out[c] = the sum over r < rows of x[start + r * cols + c], for float32 x and out: spans of _SPAN rows
    added in float32, each span's total into a float64 accumulator, the total rounded to float32."""
    tile = min(_TILE, cols)
    acc = np.empty(tile, dtype=np.float64)
    vals = np.empty(tile, dtype=np.float32)
    for o0 in range(0, cols, tile):
        nt = min(tile, cols - o0)
        for oo in range(nt):
            acc[oo] = 0.0
        for r0 in range(0, rows, _SPAN):
            for oo in range(nt):
                vals[oo] = np.float32(0.0)
            for r in range(r0, min(rows, r0 + _SPAN)):
                row = x[start + r * cols + o0:]
                for oo in range(nt):
                    vals[oo] += row[oo]
            for oo in range(nt):
                acc[oo] = acc[oo] + np.float64(vals[oo])
        for oo in range(nt):
            out[o0 + oo] = np.float32(acc[oo])


@njit(**_FLAGS)
def column_sum_f64(x, start, rows, cols, out):
    """out[c] = the sum over r < rows of x[start + r * cols + c], for float64 x and out, added row after row."""
    tile = min(_TILE, cols)
    acc = np.empty(tile, dtype=np.float64)
    for o0 in range(0, cols, tile):
        nt = min(tile, cols - o0)
        for oo in range(nt):
            acc[oo] = 0.0
        for r in range(rows):
            row = x[start + r * cols + o0:]
            for oo in range(nt):
                acc[oo] = acc[oo] + row[oo]
        for oo in range(nt):
            out[o0 + oo] = acc[oo]


@njit(**_FLAGS)
def _indices_in_range(index, start, n, k):
    """Whether every index[start:start + n] lies in [-k, k)."""
    for i in range(n):
        j = index[start + i]
        if j < -k or j >= k:
            return False
    return True


@njit(forceinline=True, **_FLAGS)
def _indexed_row(index, i_start, t, n, k):
    """(a, j) of task t of a gather or scatter: its outer position and the row index[i_start + t % n] names, -k..-1
    wrapped."""
    j = index[i_start + t % n]
    if j < 0:
        j += k
    return t // n, j


@njit(**_FLAGS)
def gather_rows(x, x_start, index, i_start, out, outer, k, n, inner):
    """x viewed as [outer, k, inner] from x_start, the n indices from i_start: out[a, i, :] = x[a, index[i], :]
    (-k..-1 wrap). Returns 0 having moved nothing when an index is outside [-k, k) (the launcher raises), else 1."""
    if not _indices_in_range(index, i_start, n, k):
        return 0
    for t in range(outer * n):
        a, j = _indexed_row(index, i_start, t, n, k)
        src = x_start + (a * k + j) * inner
        dst = t * inner
        for b in range(inner):
            out[dst + b] = x[src + b]
    return 1


@njit(**_FLAGS)
def scatter_rows(x, x_start, values, v_start, index, i_start, out, outer, k, n, inner, accumulate, one_value):
    """out = x (viewed as [outer, k, inner] from x_start) with values[a, i, :] written into row index[i] (-k..-1
    wrap), in index order: added when `accumulate` (numpy's add.at), else the last write wins; `one_value`: the
    single value values[v_start] everywhere. Returns 0 having written nothing when an index is outside [-k, k)."""
    if not _indices_in_range(index, i_start, n, k):
        return 0
    for e in range(outer * k * inner):
        out[e] = x[x_start + e]
    for t in range(outer * n):
        a, j = _indexed_row(index, i_start, t, n, k)
        dst = (a * k + j) * inner
        src = v_start + t * inner
        if one_value:
            if accumulate:
                for b in range(inner):
                    out[dst + b] += values[v_start]
            else:
                for b in range(inner):
                    out[dst + b] = values[v_start]
        elif accumulate:
            for b in range(inner):
                out[dst + b] += values[src + b]
        else:
            for b in range(inner):
                out[dst + b] = values[src + b]
    return 1


# name -> function, for generated source and for compile_generated's signatures (nnc.codegen.cpu)
PRECOMPILED = {f.py_func.__name__: f for f in (column_sum_f32, column_sum_f64, gather_rows, scatter_rows)}
