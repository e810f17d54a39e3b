"""Parallel kernels as tasks: one compiled launcher runs any kernel's task function over numba's threads.

A parallel kernel used to be one numba function with a `prange` loop. numba compiles every such function as a
"parfor": its passes, a gufunc for the loop body, and LLVM optimizing that gufunc again with everything it calls
linked in, 0.6-0.9 s more than the same loop run serially (the GPT's softmax: 1.0-1.4 s against 0.3-0.4 s). Here
the loop is a serial numba function of its own, `task(lo, hi, addrs) -> 0` running the body for lo <= t < hi,
called through its C entry point (numba's cfunc wrapper), and `run_tasks(task, n, *arrays)` runs the only parfor,
`_run`: compiled once (and kept in numba's cache beside this file), it splits 0..n-1 into at most CHUNKS contiguous
ranges and runs them on numba's threads as a prange over the ranges, honouring `numba.set_num_threads` as a prange
does. As with the prange it replaces, the tasks must not depend on each other or on their order. run_tasks itself
is compiled once per kind of argument list (the dtypes of the arrays), also kept in that cache.

The arrays a task reads and writes travel as `addrs`: the address of an int64 array of (data address, length)
pairs packed from run_tasks's arrays; `task_array(addrs, k, dtype)` is the k-th as a 1-D array again (no copy, no
reference count: run_tasks holds them until the tasks are done).
nnc.codegen.cpu_tasks rewrites a generated prange function into this form.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import get_num_threads, njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.np.arrayobj import populate_array

from .cpu_tasks import PAGE, PLACED_SKEW

_I64 = ir.IntType(64)


# A range of tasks per call: a thread of numba's pool runs CHUNKS / threads of them (a static split, as a prange's).
# NOTE: not one call per task: a cat's copy is a task per element, and a loop inside the task function vectorizes.
CHUNKS = 64


@intrinsic
def _call_task(typingctx, task, lo, hi, addrs):
    """task(lo, hi, addrs) through a C function pointer `task` (an int64 address): int64 (int64, int64, int64)."""
    sig = types.int64(types.int64, types.int64, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(_I64, [_I64, _I64, _I64])
        return builder.call(builder.inttoptr(args[0], fnty.as_pointer()), list(args[1:]))
    return sig, codegen


@intrinsic
def _fill(typingctx, out, arrays):
    """out[2k], out[2k + 1] = the data address and the length of arrays[k] (a tuple of 1-D arrays)."""
    if not isinstance(arrays, types.BaseTuple) or not all(isinstance(a, types.Array) and a.ndim == 1
                                                          for a in arrays):
        return None
    sig = types.void(out, arrays)

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        for k, (aty, value) in enumerate(zip(signature.args[1], cgutils.unpack_tuple(builder, args[1]))):
            array = context.make_array(aty)(context, builder, value)
            builder.store(builder.ptrtoint(array.data, _I64), builder.gep(data, [ir.Constant(_I64, 2 * k)]))
            builder.store(builder.extract_value(array.shape, 0), builder.gep(data, [ir.Constant(_I64, 2 * k + 1)]))
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def task_array(typingctx, addrs, k, dtype):
    """The k-th array run_tasks packed at `addrs`, as a 1-D C-contiguous array of `dtype` over the same memory.

    NOTE: an intrinsic, not a numba function: a function called with the literal k and dtype each task writes would be
    compiled once per (k, dtype)."""
    if not isinstance(dtype, (types.NumberClass, types.DType)):
        return None
    array_type = types.Array(dtype.dtype, 1, "C")
    sig = array_type(types.int64, types.int64, dtype)

    def codegen(context, builder, signature, args):
        words = builder.inttoptr(args[0], _I64.as_pointer())
        at = builder.mul(args[1], ir.Constant(_I64, 2))
        address = builder.load(builder.gep(words, [at]))
        length = builder.load(builder.gep(words, [builder.add(at, ir.Constant(_I64, 1))]))
        array = context.make_array(array_type)(context, builder)
        itemsize = ir.Constant(_I64, context.get_abi_sizeof(context.get_data_type(array_type.dtype)))
        populate_array(array, data=builder.inttoptr(address, array.data.type), shape=[length], strides=[itemsize],
                       itemsize=itemsize, meminfo=None)
        return array._getvalue()
    return sig, codegen


@njit(forceinline=True, no_cfunc_wrapper=True, cache=True)
def _pack(arrays):
    """The (data address, length) pairs of a tuple of 1-D arrays, as each task gets them."""
    addrs = np.empty(2 * len(arrays), np.int64)
    _fill(addrs, arrays)
    return addrs


# NOTE: one signature, compiled when this module loads: called with a literal count, numba would compile the parfor
# again for each count.
@njit([types.void(types.int64, types.int64, types.int64[::1])], parallel=True, cache=True, no_cfunc_wrapper=True,
      error_model="numpy")
def _run(task, n_tasks, addrs):
    """Tasks 0..n_tasks-1 as task(lo, hi, address of addrs) over contiguous ranges, on numba's threads."""
    base = addrs.ctypes.data
    chunks = min(n_tasks, CHUNKS)
    for c in prange(chunks):
        _call_task(task, c * n_tasks // chunks, (c + 1) * n_tasks // chunks, base)


@njit(cache=True, no_cfunc_wrapper=True, error_model="numpy")
def run_tasks(task, n_tasks, *arrays):
    """Run tasks 0..n_tasks-1 of the task function at C address `task` (cpu.py sets it once the function is
    compiled; never 0) on numba's threads, each task seeing `arrays` (1-D) through task_array.

    NOTE: the arrays are this function's arguments, so they stay alive until every task is done: the tasks only
    get their addresses (a temporary packed from them first, or a launcher's array dead after that packing,
    could be freed while the tasks still read it)."""
    if task == 0:
        raise ValueError("nnc: a parallel kernel ran before its task function was compiled")
    _run(task, n_tasks, _pack(arrays))


def placed_row(row: np.ndarray, like: np.ndarray, length: int) -> np.ndarray:
    """A copy of row[:length] in fresh memory half a page after the address of `like` modulo a page: what a
    launcher's prologue
    computes for a task function that reads a broadcast row (nnc.codegen.cpu_elementwise.placed_row_lines says
    why), done by a launch line in numpy instead."""
    size = row.itemsize
    pad = np.empty(length + PAGE // size, row.dtype)
    at = ((like.__array_interface__["data"][0] + PLACED_SKEW - pad.__array_interface__["data"][0]) % PAGE) // size
    view = pad[at:at + length]
    view[...] = row[:length]
    return view


def start_threads() -> None:
    """Start numba's thread pool if it is not running. NOTE: a launcher loaded from numba's cache runs run_tasks's
    parfor linked into its own code, without the dispatch of a parallel function that starts the pool otherwise
    (a launcher compiled in this process typed run_tasks, which started it); get_num_threads starts it first."""
    get_num_threads()
