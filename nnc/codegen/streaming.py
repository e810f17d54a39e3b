"""Streaming (non-temporal) stores for kernels whose outputs outgrow the last-level cache.

A plain store first reads its cache line (read-for-ownership), so a kernel writing an output larger than the cache
moves each output line across the memory bus twice. A non-temporal store writes the whole line without reading it
and without keeping it in the cache. Generated loops compute a row into a stage on the stack with plain,
vectorized stores (`stack_row`), then `stream_row` writes it out line by line: x86's vmovntps/movntdq and other
targets' equivalents, from LLVM's `!nontemporal` stores of one aligned 64-byte vector.

NOTE: measured on relu(x*w+b)+0.5*x over float32 [R, 1024] (2 cores, 32 MiB L3, tools/bench_compile.py's
membound): at 64 MiB of output, plain stores reached 0.72-0.79x of a memcpy's speed and streamed ones 1.07-1.17x;
at 24 MiB the two were equal, and at 16 MiB (the output fits in the cache beside the input) streaming took 1.6x
the time of plain stores. Hence STREAM_MIN_BYTES, glibc's threshold for its own non-temporal memcpy: 3/4 of the
last-level cache. nnc.codegen.cpu_elementwise decides which loops stream (stream_stage); this module is what the
generated code calls.
"""
from __future__ import annotations

import platform

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.np.arrayobj import populate_array

LINE = 64  # bytes a streaming store writes: one cache line, as one aligned vector
_I64 = ir.IntType(64)


@intrinsic
def stack_row(typingctx, n, dtype):
    """A 1-D array of n (a literal) elements of `dtype` on the stack, 64-byte aligned. Its memory lives as long as
    the calling function's frame: it is allocated once per call, in the function's entry block, however often a
    loop reaches the call."""
    if not isinstance(n, types.IntegerLiteral) or not isinstance(dtype, (types.NumberClass, types.DType)):
        return None
    array_type = types.Array(dtype.dtype, 1, "C")
    count = n.literal_value

    def codegen(context, builder, signature, args):
        element = context.get_data_type(array_type.dtype)
        with builder.goto_entry_block():
            data = builder.alloca(element, size=ir.Constant(_I64, count))
            data.align = LINE
        itemsize = ir.Constant(_I64, context.get_abi_sizeof(element))
        array = context.make_array(array_type)(context, builder)
        populate_array(array, data=data, shape=[ir.Constant(_I64, count)], strides=[itemsize], itemsize=itemsize,
                       meminfo=None)
        return array._getvalue()
    return array_type(n, dtype), codegen


@intrinsic
def _address(typingctx, array):
    """The address of a 1-D array's first element, as an int64."""
    if not isinstance(array, types.Array):
        return None

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        return builder.ptrtoint(data, _I64)
    return types.int64(array), codegen


@intrinsic
def _stream_line(typingctx, dst, at, src, start):
    """dst[at:at + n] = src[start:start + n], n elements making LINE bytes, as one non-temporal vector store; the
    destination must be LINE-aligned (the source need not be)."""
    if not (isinstance(dst, types.Array) and isinstance(src, types.Array) and dst.dtype == src.dtype):
        return None

    def codegen(context, builder, signature, args):
        element = context.get_data_type(signature.args[0].dtype)
        itemsize = context.get_abi_sizeof(element)
        vector = ir.VectorType(element, LINE // itemsize).as_pointer()
        dst_data = context.make_array(signature.args[0])(context, builder, args[0]).data
        src_data = context.make_array(signature.args[2])(context, builder, args[2]).data
        value = builder.load(builder.bitcast(builder.gep(src_data, [args[3]]), vector), align=itemsize)
        store = builder.store(value, builder.bitcast(builder.gep(dst_data, [args[1]]), vector), align=LINE)
        store.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()
    return types.void(dst, at, src, start), codegen


_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


@intrinsic
def _store_fence(typingctx):
    """Orders the streaming stores before it before every store after it (x86's sfence: its non-temporal stores
    are weakly ordered, and LLVM's fence instructions do not wait for them)."""
    def codegen(context, builder, signature, args):
        if _X86:
            sfence = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                    "llvm.x86.sse.sfence")
            builder.call(sfence, [])
        else:
            builder.fence("seq_cst")
        return context.get_dummy_value()
    return types.void(), codegen


@njit
def stream_row(dst, src):
    """dst[:] = src[:dst.size]: the whole LINE-aligned lines of dst by streaming stores, the elements before the
    first and after the last such line by plain ones, then a store fence (the row is complete in memory before any
    later store, e.g. the thread's signal that its tasks are done, is seen). A dst not aligned to its itemsize
    (a view into bytes at an odd offset) is stored plainly throughout."""
    n = dst.size
    per_line = LINE // dst.itemsize
    address = _address(dst)
    head = n if address % dst.itemsize else min(n, ((-address) % LINE) // dst.itemsize)
    body_end = head + (n - head) // per_line * per_line
    for j in range(head):
        dst[j] = src[j]
    for j in range(head, body_end, per_line):
        _stream_line(dst, j, src, j)
    for j in range(body_end, n):
        dst[j] = src[j]
    _store_fence()
