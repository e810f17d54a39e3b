"""Batch-1 linear layers on two cores without ever waiting: a helper thread computes some of a matrix-vector
product's row chunks while the caller computes the others, and the caller takes back whatever the helper has not
finished when it runs out of work of its own.

A parallel region (numba's prange, OpenMP) ends in a join: when the machine is loaded and one of its threads is
descheduled, the caller waits for it a whole scheduler slice (milliseconds, against a ~15 us product). Here nothing
joins. `gemv(x, w, out)` (numba code: out[s] = w[s, :] . x for a flat row-major weight w) splits the output into
chunks of rows (a multiple of 4, about CHUNK_BYTES of weights: `chunk_rows`), each with a state word in a shared
"mailbox" tagged with the job's generation:
gen * 4 + FREE / HELPER (the helper claimed it) / CALLER (the caller claimed it) / READY (the helper's result
is in the scratch). Every change of state is an atomic compare-and-swap (LLVM cmpxchg, sequentially consistent):

- the caller copies x into the mailbox, publishes the job (weight address, sizes, chunk states) and claims chunks
  from the front (FREE -> CALLER), computing them straight into `out`;
- the helper claims chunks from the back (FREE -> HELPER), computes each into a scratch slot the mailbox owns,
  then marks it READY (HELPER -> READY);
- when the caller meets a chunk that is not free it finishes: it copies every READY chunk from the scratch into
  `out` and steals every HELPER chunk (HELPER -> CALLER) to compute it itself.

So the helper never writes `out`, a late helper's result is never read (its generation's states are gone), and the
caller never waits for it. The helper and the caller run the same per-chunk function (`gemv_rows`: explicit
vector FMAs, two rows a sweep), whose arithmetic for a row does not depend on the chunk or the rows beside it, so
the result is bit-identical to the serial loop (`gemv_serial`) whoever computed which chunk.

The helper is one daemon thread per process (`ensure_helper`), which never holds the GIL once started: it runs
`_helper_main`, nogil numba code that spins on the mailbox for a bounded time after its last job (SPIN_SECONDS),
then sleeps on a futex (a Linux syscall, called from numba) until a caller wakes it. A caller that finds it asleep
wakes it and goes on alone: waking costs the caller one syscall, never a wait. Jobs take one caller at a time (a
try-lock: a second thread calling at once runs serially), and only products of at least MIN_WORK multiply-adds
(smaller ones run serially: the hand-off costs more than half of them). Without Linux's futex (other systems), or
before the helper started, every product runs serially.

Memory a stale helper may touch: the mailbox, x's copy and the scratch are the module's for the process's
lifetime. The weight is the caller's: a helper descheduled in the middle of a chunk can read it after the call
returned, until it finishes that chunk. nnc passes only parameters here (a model's weights, which the compiled
module holds), and `retain(arrays)` (called by the Python side of a plan after a run) keeps a run's arrays
referenced while the helper is inside a chunk of an earlier job (HELPER_IN names it).

`batched_rows(a, b, out, rows, kdim, n_out)` shares Winograd's batched products (nnc.codegen.rows_kernel: out[p] =
a[p] @ b[p], tasks of four output rows) the same way: a job of kind ROWS, chunks of whole tasks (about
ROWS_CHUNK_WORK multiply-adds), the helper's results in a scratch of ROWS_SCRATCH_BYTES (larger products run
serially). Its operands are a whole graph's temporaries, freed when the numba function returns, where `retain`
cannot see them: so when the caller finishes while the helper is inside one of the job's chunks, the job takes NRT
references to a and b (HOLD_A, HOLD_B) and the next job drops them once the helper has left (until then jobs run
serially: the helper is descheduled and could not help anyway).
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import platform
import sys
import threading
import time

import numpy as np
from llvmlite import ir
from numba import carray, njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .rows_kernel import BLOCK_ROWS, blocks_per_product, rows_product, rows_tasks

# A chunk holds about this many bytes of weight rows: the caller loses at most one chunk's time to a stolen chunk,
# and each chunk costs two compare-and-swaps on a cache line both threads write. NOTE: measured with
# tools/bench_nowait.py --chunk-bytes in two quiet moments, time against the serial loop for 16, 32, 64, 128 KiB:
# 512x784 0.57-0.69 / 0.51-0.59 / 0.48-0.56 / 0.50-0.55x, 512x512 0.60-0.75 / 0.56-0.67 / 0.55-0.68 / 0.59-0.68x,
# 256x512 0.71-1.03 / 0.69-0.99 / 0.74-0.98 / 0.83-1.05x.
CHUNK_BYTES = 2 ** 16
MAX_CHUNKS = 256
MAX_K = 16384  # the longest x the mailbox holds a copy of (longer products run serially)
MAX_N = 16384  # the most outputs (the scratch's size)
# A product of fewer multiply-adds runs serially (kernels below it do not call gemv; gemv checks the mailbox's copy,
# which a measurement may lower). NOTE: measured with tools/bench_nowait.py on a quiet moment of the 2-core machine:
# 256 x 512 (2^17) took 0.74-0.76x the serial loop's time, 256 x 256 (2^16) 1.05x (the helper reached 2% of its
# chunks in its 2.4 us), 128 x 256 1.08x.
MIN_WORK = 2 ** 17
# A batched-rows chunk holds about this many multiply-adds (whole tasks of rows_kernel.BLOCK_ROWS rows).
# NOTE: measured on the MNIST CNN's conv2 products (36 x 64x32 @ 32x36: 2.65 M), minimums of 5 x 200 calls, two
# quiet runs, the chunks copied by slice (before memcpy): 2^14 28.6-29.6 us, 2^16 24.2-25.5, 2^17 24.3-25.8, 2^18
# 24.5-24.8, 2^19 24.4-24.7, against 25.4-26.1 alone; the helper computed 40-50% of the chunks at 2^16 and above.
# Smaller chunks lose to the two compare-and-swaps each, larger ones to the chunk the caller recomputes when the
# helper is late.
ROWS_CHUNK_WORK = 2 ** 17
SPIN_SECONDS = 200e-6  # how long the helper keeps spinning after its last job before it sleeps

# the mailbox: int64 words
_LOCK, _GEN, _SLEEP, _STOP = 0, 8, 16, 24  # one cache line each (the caller and the helper write them)
_HELPER_IN = 32  # the generation whose chunk the helper is computing (0: none)
_W, _KDIM, _N, _NCHUNKS, _DTYPE, _ROWS, _CHUNK_BYTES = 40, 41, 42, 43, 44, 45, 46  # the job
_SPIN_CYCLES, _TIMESPEC, _RUNNING, _HOOK = 48, 50, 52, 53
_MIN_WORK = 54
# a batched-rows job (KIND ROWS): a's address, the rows and columns of one product (b's address is _W, its sum's
# length _KDIM, its task count _N, tasks a chunk _ROWS), the scratch its helper chunks go to, multiply-adds a chunk
_KIND, _A, _NOUT, _PROWS, _RSCRATCH, _RCHUNK_WORK = 47, 49, 55, 64, 65, 66
_HOLD_GEN, _HOLD_A, _HOLD_B = 67, 68, 69  # a job's operands kept (NRT references) while the helper may read them
_JOBS, _CHUNKS, _HELPED, _STOLEN = 56, 57, 58, 59  # counts (the caller's, under the lock): see `counts`
_STATES = 72
_STATE_WORDS = 8  # a chunk's state word has a cache line of its own (the threads CAS different chunks)
_X = _STATES + _STATE_WORDS * MAX_CHUNKS  # x's copy (MAX_K elements of up to 8 bytes)
_SCRATCH = _X + MAX_K
_WORDS = _SCRATCH + MAX_N
FREE, HELPER, CALLER, READY = 0, 1, 2, 3
_F32, _F64 = 0, 1
GEMV, ROWS = 0, 1  # job kinds

_FUTEX_WAIT, _FUTEX_WAKE, _FUTEX_PRIVATE = 0, 1, 128
# NOTE: x86-64 Linux only: the helper's spin budget reads the cycle counter (LLVM's readcyclecounter, the TSC;
# on other CPUs it may read a counter user code cannot), and the futex's syscall number is the architecture's
_SYS_FUTEX = 202 if platform.machine() == "x86_64" else None

MAILBOX = np.zeros(_WORDS + 8, dtype=np.int64)
# NOTE: never freed, not even when the interpreter clears modules at exit: a daemon helper may still read it then
ctypes.pythonapi.Py_IncRef(ctypes.py_object(MAILBOX))
MAILBOX[_TIMESPEC] = 0
MAILBOX[_CHUNK_BYTES] = CHUNK_BYTES
MAILBOX[_MIN_WORK] = MIN_WORK
MAILBOX[_TIMESPEC + 1] = 100_000_000  # a sleeping helper looks at the stop flag every 0.1 s
# the helper's results of a batched-rows job (its whole output: larger products run serially); like the mailbox,
# never freed
ROWS_SCRATCH_BYTES = 2 ** 20
_ROWS_SCRATCH = np.zeros(ROWS_SCRATCH_BYTES // 8, dtype=np.int64)
ctypes.pythonapi.Py_IncRef(ctypes.py_object(_ROWS_SCRATCH))
MAILBOX[_RSCRATCH] = _ROWS_SCRATCH.ctypes.data
MAILBOX[_RCHUNK_WORK] = ROWS_CHUNK_WORK


def _bind() -> bool:
    """Register the mailbox and libc's syscall with LLVM under nnc's names; whether the helper can run here."""
    import llvmlite.binding as llvm

    llvm.add_symbol("nnc_nowait_mailbox", MAILBOX.ctypes.data)
    syscall = None
    if sys.platform.startswith("linux") and _SYS_FUTEX is not None:
        try:
            syscall = ctypes.CDLL(None).syscall
        except (OSError, AttributeError):
            pass
    # without it, a function that is never called (no helper starts: gemv stays serial) keeps the code linkable
    llvm.add_symbol("nnc_nowait_syscall", ctypes.cast(syscall or _NEVER_CALLED, ctypes.c_void_p).value)
    return syscall is not None


_NEVER_CALLED = ctypes.CFUNCTYPE(ctypes.c_int64)(lambda: 0)


AVAILABLE = _bind()
_FUTEX_SYSCALL = _SYS_FUTEX or 0
_i64 = types.int64
# NOTE: glibc's syscall() is variadic; it only moves its integer arguments into registers, so a fixed signature of
# six integers calls it correctly (on x86-64 and aarch64, where it is written in assembly)
_syscall = types.ExternalFunction("nnc_nowait_syscall", _i64(_i64, _i64, _i64, _i64, _i64, _i64, _i64))


# --- LLVM intrinsics: the mailbox's address, atomics, the cycle counter --------------------------------------------

@intrinsic
def _mailbox(typingctx):
    """The mailbox's address (the symbol registered in _bind, so cached code finds it in every process)."""
    def codegen(context, builder, sig, args):
        gv = builder.module.globals.get("nnc_nowait_mailbox")
        if gv is None:
            gv = ir.GlobalVariable(builder.module, ir.IntType(64), "nnc_nowait_mailbox")
            gv.linkage = "external"
        return builder.ptrtoint(gv, ir.IntType(64))
    return types.int64(), codegen


def _word(builder, address, index):
    base = builder.inttoptr(address, ir.IntType(64).as_pointer())
    return builder.gep(base, [index])


@intrinsic
def _load(typingctx, address, index):
    """The int64 word at address[index], an atomic (sequentially consistent) load."""
    def codegen(context, builder, sig, args):
        return builder.load_atomic(_word(builder, *args), "seq_cst", 8)
    return types.int64(types.int64, types.int64), codegen


@intrinsic
def _store(typingctx, address, index, value):
    """address[index] = value, an atomic (sequentially consistent) store."""
    def codegen(context, builder, sig, args):
        builder.store_atomic(args[2], _word(builder, args[0], args[1]), "seq_cst", 8)
        return context.get_dummy_value()
    return types.void(types.int64, types.int64, types.int64), codegen


@intrinsic
def _store_relaxed(typingctx, address, index, value):
    """address[index] = value, an atomic store with no ordering of its own (a plain store on x86: no locked
    instruction). A later sequentially consistent store (a job's generation) publishes it."""
    def codegen(context, builder, sig, args):
        builder.store_atomic(args[2], _word(builder, args[0], args[1]), "monotonic", 8)
        return context.get_dummy_value()
    return types.void(types.int64, types.int64, types.int64), codegen


@intrinsic
def _cas(typingctx, address, index, expected, new):
    """Atomically set address[index] to `new` if it holds `expected`; whether it did."""
    def codegen(context, builder, sig, args):
        pair = builder.cmpxchg(_word(builder, args[0], args[1]), args[2], args[3], "seq_cst", "seq_cst")
        return builder.extract_value(pair, 1)
    return types.boolean(types.int64, types.int64, types.int64, types.int64), codegen


@intrinsic
def _cycles(typingctx):
    """The CPU's cycle counter (x86's TSC: constant rate), for the helper's spin budget."""
    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(64), []),
                                            "llvm.readcyclecounter")
        return builder.call(fn, [])
    return types.int64(), codegen


@intrinsic
def _pause(typingctx):
    """A spin-wait hint (x86 pause), so a spinning helper leaves its core's sibling and the bus alone."""
    def codegen(context, builder, sig, args):
        if platform.machine() in ("x86_64", "AMD64"):
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                "llvm.x86.sse2.pause")
            builder.call(fn, [])
        return context.get_dummy_value()
    return types.void(), codegen


@intrinsic
def _copy(typingctx, dst, src, nbytes):
    """memcpy(dst, src, nbytes) on addresses. NOTE: numba's slice assignment copied the MNIST CNN's conv2 helper
    results (165 KB) in 7.5 us, memcpy (np.copyto) in 1.6 us."""
    def codegen(context, builder, sig, args):
        pointer = [builder.inttoptr(v, cgutils.voidptr_t) for v in args[:2]]
        cgutils.raw_memcpy(builder, pointer[0], pointer[1], args[2], 1)
        return context.get_dummy_value()
    return types.void(types.int64, types.int64, types.int64), codegen


@intrinsic
def _address(typingctx, array):
    """An array's data address."""
    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        return builder.ptrtoint(data, ir.IntType(64))
    return types.int64(array), codegen


@intrinsic
def _pointer(typingctx, address, like):
    """The address as a pointer to elements of the array `like`'s dtype (for numba.carray)."""
    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], context.get_value_type(sig.return_type))
    return types.CPointer(like.dtype)(types.int64, like), codegen


@intrinsic
def _hold(typingctx, address, index, array):
    """Take an NRT reference to the array's memory and store its meminfo at address[index] (0: it has none)."""
    def codegen(context, builder, sig, args):
        context.nrt.incref(builder, sig.args[2], args[2])
        meminfo = context.make_array(sig.args[2])(context, builder, args[2]).meminfo
        builder.store_atomic(builder.ptrtoint(meminfo, ir.IntType(64)), _word(builder, args[0], args[1]), "seq_cst", 8)
        return context.get_dummy_value()
    return types.void(types.int64, types.int64, array), codegen


@intrinsic
def _drop(typingctx, meminfo):
    """Release an NRT reference taken by _hold (the meminfo's address; 0 is none)."""
    def codegen(context, builder, sig, args):
        pointer = builder.inttoptr(args[0], cgutils.voidptr_t)
        context.nrt.decref(builder, types.MemInfoPointer(types.voidptr), pointer)
        return context.get_dummy_value()
    return types.void(types.int64), codegen


# --- the product ------------------------------------------------------------------------------------------------

# The per-chunk kernel: SWEEP_ROWS weight rows a sweep, each with SWEEP_VECTORS vector accumulators (so a sweep
# keeps SWEEP_ROWS * SWEEP_VECTORS FMA chains in flight). NOTE: measured serially (aligned float32, minimums of 9
# interleaved rounds, a loaded 2-core Zen 5): 2 rows x 2 vectors streamed 256x784 from L2 at 0.69-0.74x the time of
# the loop LLVM vectorized before (4 rows, 16 zmm accumulators: ~117 GB/s), 512x512 at 0.74x, 128x512 at 0.71x,
# and 512x784 / 1024x784 (from L3) at 0.91-0.95x. More rows or vectors a sweep (4x1 close behind, 2x4, 4x2, 8x1,
# 8x2, 6x2, 1x8) and software prefetch (prefetcht0 / t1, 8 to 32 lines ahead) measured slower: a sweep over fewer
# row streams at once streams faster from L2.
SWEEP_ROWS = 2
SWEEP_VECTORS = 2
_VECTOR_BYTES = 64  # one 512-bit register (narrower hardware splits the LLVM vectors)


def _halving_sum(builder, v, nrows, lanes):
    """Each row's sum of its `lanes` lanes (rows side by side in v), by halving: element i plus element i + h of
    every row's segment, until one lane is left a row. The same additions in the same order for a row whatever
    rows share v."""
    i32 = ir.IntType(32)
    m = lanes
    while m > 1:
        h = m // 2
        lo = [r * m + i for r in range(nrows) for i in range(h)]
        hi = [r * m + h + i for r in range(nrows) for i in range(h)]
        v = builder.fadd(builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(i32, len(lo)), lo)),
                         builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(i32, len(hi)), hi)))
        m = h
    return v


def _sweep_codegen(nrows):
    """LLVM code for out[s + r] = w[(s + r) * kdim:(s + r + 1) * kdim] . x, r < nrows: see _sweep."""
    def codegen(context, builder, sig, args):
        x, w, out, s = args[:4]
        arrays = [context.make_array(t)(context, builder, a) for t, a in zip(sig.args[:3], args[:3])]
        dt = sig.args[0].dtype
        size = dt.bitwidth // 8
        nlanes, et = _VECTOR_BYTES // size, context.get_value_type(dt)
        vt, i64, i32 = ir.VectorType(et, nlanes), ir.IntType(64), ir.IntType(32)
        module = builder.module
        fma = cgutils.get_or_insert_function(module, ir.FunctionType(vt, [vt, vt, vt]),
                                             f"llvm.fma.v{nlanes}f{dt.bitwidth}")
        mask_t = ir.VectorType(ir.IntType(1), nlanes)
        masked_load = cgutils.get_or_insert_function(
            module, ir.FunctionType(vt, [ir.PointerType(vt), i32, mask_t, vt]),
            f"llvm.masked.load.v{nlanes}f{dt.bitwidth}.p0")
        kdim = cgutils.unpack_tuple(builder, arrays[0].shape, 1)[0]
        xp, wp, op = (a.data for a in arrays)
        rows = [builder.gep(wp, [builder.mul(builder.add(s, ir.Constant(i64, r)), kdim)]) for r in range(nrows)]
        zero = ir.Constant(vt, [ir.Constant(et, 0.0)] * nlanes)
        accs = [[cgutils.alloca_once_value(builder, zero) for _ in range(SWEEP_VECTORS)] for _ in range(nrows)]
        step = SWEEP_VECTORS * nlanes

        def at(p, k, j):  # p[k + j * nlanes] as a pointer to a vector
            return builder.bitcast(builder.gep(p, [builder.add(k, ir.Constant(i64, j * nlanes))]), ir.PointerType(vt))

        def accumulate(r, j, xv, wv):
            builder.store(builder.call(fma, [xv, wv, builder.load(accs[r][j])]), accs[r][j])

        nsteps = builder.udiv(kdim, ir.Constant(i64, step))
        with cgutils.for_range(builder, nsteps) as loop:
            k = builder.mul(loop.index, ir.Constant(i64, step))
            xvs = [builder.load(at(xp, k, j), align=size) for j in range(SWEEP_VECTORS)]
            for r in range(nrows):
                for j in range(SWEEP_VECTORS):
                    accumulate(r, j, xvs[j], builder.load(at(rows[r], k, j), align=size))
        k = builder.mul(nsteps, ir.Constant(i64, step))
        left = builder.sub(kdim, k)
        with builder.if_then(builder.icmp_signed(">", left, ir.Constant(i64, 0))):  # the last columns, masked
            lane = ir.Constant(ir.VectorType(i64, nlanes), list(range(nlanes)))
            for j in range(SWEEP_VECTORS):
                count = builder.sub(left, ir.Constant(i64, j * nlanes))
                mask = builder.icmp_signed("<", lane, _splat(builder, count, nlanes))
                xv = builder.call(masked_load, [at(xp, k, j), ir.Constant(i32, size), mask, zero])
                for r in range(nrows):
                    accumulate(r, j, xv, builder.call(masked_load, [at(rows[r], k, j), ir.Constant(i32, size),
                                                                    mask, zero]))
        sums = []
        for r in range(nrows):
            v = builder.load(accs[r][0])
            for j in range(1, SWEEP_VECTORS):
                v = builder.fadd(v, builder.load(accs[r][j]))
            sums.append(v)
        v = _halving_sum(builder, _side_by_side(builder, sums), nrows, nlanes)
        first = builder.gep(op, [s])
        if nrows == 1:
            builder.store(builder.extract_element(v, ir.Constant(i32, 0)), first)
        else:
            builder.store(v, builder.bitcast(first, ir.PointerType(v.type)), align=size)
        return context.get_dummy_value()
    return codegen


def _side_by_side(builder, vectors):
    """One vector of the given vectors' lanes, in order (a power of two of them, of one length)."""
    while len(vectors) > 1:
        n = 2 * vectors[0].type.count
        mask = ir.Constant(ir.VectorType(ir.IntType(32), n), list(range(n)))
        vectors = [builder.shuffle_vector(a, b, mask) for a, b in zip(vectors[::2], vectors[1::2])]
    return vectors[0]


def _splat(builder, value, n):
    """The scalar in all n lanes."""
    vt = ir.VectorType(value.type, n)
    v = builder.insert_element(ir.Constant(vt, ir.Undefined), value, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(ir.IntType(32), n), [0] * n))


@intrinsic
def _sweep(typingctx, x, w, out, s, nrows):
    """out[s + r] = w[(s + r) * kdim:(s + r + 1) * kdim] . x for r < nrows (1 or SWEEP_ROWS; kdim = len(x)), each
    x vector loaded once for the rows. A row's sum: SWEEP_VECTORS accumulators of one vector each, accumulator j
    taking the columns k with k // lanes % SWEEP_VECTORS == j, in k order, by fused multiply-adds (llvm.fma, never
    reassociated; the last columns masked, the lanes past kdim adding 0 * 0), then the accumulators added in order
    and their lanes by halving (_halving_sum). So a row's bits never depend on which rows share its sweep, nor on
    which function or thread runs it."""
    if not isinstance(nrows, types.IntegerLiteral) or nrows.literal_value not in (1, SWEEP_ROWS):
        return None  # numba retries with the literal value
    return types.void(x, w, out, types.int64, nrows), _sweep_codegen(nrows.literal_value)


@njit(cache=True, nogil=True, error_model="numpy")
def gemv_rows(x, w, out, s0, s1):
    """out[s] = w[s, :] . x for s0 <= s < s1 (w flat, row-major, len(x) columns), SWEEP_ROWS weight rows a sweep
    (each x vector loaded feeds them all), a row left over alone. The one per-chunk code of caller and helper: a
    row's bits do not depend on s0 and s1 (see _sweep)."""
    s = s0
    while s + SWEEP_ROWS <= s1:
        _sweep(x, w, out, s, SWEEP_ROWS)
        s += SWEEP_ROWS
    while s < s1:
        _sweep(x, w, out, s, 1)
        s += 1


@njit(cache=True, nogil=True)
def chunk_rows(n, row_bytes, chunk_bytes):
    """Rows a chunk: about chunk_bytes of weight rows of row_bytes, a multiple of 4 (so a chunk's sweeps take
    whole groups of SWEEP_ROWS rows; any boundary would give the same bits), at least 4 and few enough chunks for
    the mailbox."""
    rows = max(4, chunk_bytes // max(1, row_bytes) // 4 * 4)
    least = (n + MAX_CHUNKS - 1) // MAX_CHUNKS
    return max(rows, (least + 3) // 4 * 4)


@njit(cache=True, nogil=True, error_model="numpy")
def _check_operands(x, w, out):
    """Raise unless w holds len(out) rows of len(x) columns (the kernels read w unchecked)."""
    if w.shape[0] != out.shape[0] * x.shape[0]:
        raise ValueError("nowait.gemv: w must hold len(out) * len(x) elements (rows of len(x), row-major)")


@njit(cache=True, nogil=True, error_model="numpy")
def gemv_serial(x, w, out):
    """The product on this thread: what gemv computes, bit for bit (a row's bits do not depend on its chunk)."""
    _check_operands(x, w, out)
    gemv_rows(x, w, out, 0, out.shape[0])


@njit(cache=True, nogil=True, error_model="numpy")
def gemv(x, w, out):
    """out = w @ x (x: kdim, w: n * kdim row-major, out: n; 1-D C-contiguous, one float dtype) with the helper
    thread's help when it is awake and the product is large enough; never waits for the helper."""
    _check_operands(x, w, out)
    n, kdim = out.shape[0], x.shape[0]
    mb = _mailbox()
    if (n * kdim < _load(mb, _MIN_WORK) or kdim > MAX_K or n > MAX_N or _load(mb, _RUNNING) == 0
            or not _cas(mb, _LOCK, 0, 1)):
        gemv_rows(x, w, out, 0, n)  # (the operands are checked above)
        return
    _release_held(mb)
    gen = _load(mb, _GEN) + 1
    rows = chunk_rows(n, kdim * x.itemsize, _load(mb, _CHUNK_BYTES))
    nchunks = (n + rows - 1) // rows
    _publish(mb, gen, x, w, n, rows, nchunks)
    tag = gen * 4
    first_not_mine = nchunks
    for c in range(nchunks):
        if not _cas(mb, _STATES + _STATE_WORDS * c, tag + FREE, tag + CALLER):
            first_not_mine = c
            break
        gemv_rows(x, w, out, c * rows, min(n, (c + 1) * rows))
    _collect(mb, tag, x, w, out, rows, first_not_mine, nchunks)
    _store(mb, _LOCK, 0)


@njit(cache=True, nogil=True, error_model="numpy")
def _open(mb, gen, nchunks):
    """Open a written job to the helper: its chunks free, then its generation; wake the helper if it sleeps."""
    for c in range(nchunks):
        _store_relaxed(mb, _STATES + _STATE_WORDS * c, gen * 4 + FREE)
    _store(mb, _GEN, gen)  # sequentially consistent: the job's words and states are visible to whoever reads it
    if _load(mb, _SLEEP) == 1 and _cas(mb, _SLEEP, 1, 0):
        _syscall(_FUTEX_SYSCALL, mb + 8 * _SLEEP, _FUTEX_WAKE | _FUTEX_PRIVATE, 1, 0, 0, 0)


@njit(cache=True, nogil=True, error_model="numpy")
def _publish(mb, gen, x, w, n, rows, nchunks):
    """Copy x into the mailbox, write the job and its chunk states, then its generation; wake a sleeping helper."""
    xs = carray(_pointer(mb + 8 * _X, x), x.shape[0])
    xs[:] = x
    _store_relaxed(mb, _KIND, GEMV)
    _store_relaxed(mb, _W, _address(w))
    _store_relaxed(mb, _KDIM, x.shape[0])
    _store_relaxed(mb, _N, n)
    _store_relaxed(mb, _NCHUNKS, nchunks)
    _store_relaxed(mb, _ROWS, rows)
    _store_relaxed(mb, _DTYPE, _F32 if x.itemsize == 4 else _F64)
    _open(mb, gen, nchunks)


@njit(cache=True, nogil=True, error_model="numpy")
def _collect(mb, tag, x, w, out, rows, first, nchunks):
    """The caller's end of a job: every chunk from `first` on is the helper's; copy the ready ones from the scratch,
    steal and compute the rest (the helper's result for a stolen chunk is never read). READY is a chunk's last
    state, so plain loads find those (no locked instruction: the loads of the helper's cache lines overlap). The
    ready chunks at the back go first: meanwhile the helper may finish the chunk it is in, which then needs no
    stealing."""
    n = out.shape[0]
    scratch = carray(_pointer(mb + 8 * _SCRATCH, out), n)
    helped = stolen = 0
    end = nchunks
    while end > first and _load(mb, _STATES + _STATE_WORDS * (end - 1)) == tag + READY:
        end -= 1
        s0, s1 = end * rows, min(n, (end + 1) * rows)
        out[s0:s1] = scratch[s0:s1]
        helped += 1
    for c in range(first, end):
        s0, s1 = c * rows, min(n, (c + 1) * rows)
        state = _STATES + _STATE_WORDS * c
        if _load(mb, state) != tag + READY and _cas(mb, state, tag + FREE, tag + CALLER):
            gemv_rows(x, w, out, s0, s1)
        elif _load(mb, state) != tag + READY and _cas(mb, state, tag + HELPER, tag + CALLER):
            gemv_rows(x, w, out, s0, s1)
            stolen += 1
        else:  # READY (nothing else can follow HELPER)
            out[s0:s1] = scratch[s0:s1]
            helped += 1
    _store_relaxed(mb, _HELPED, _load(mb, _HELPED) + helped)
    _store_relaxed(mb, _STOLEN, _load(mb, _STOLEN) + stolen)
    _store_relaxed(mb, _JOBS, _load(mb, _JOBS) + 1)
    _store_relaxed(mb, _CHUNKS, _load(mb, _CHUNKS) + nchunks)


# --- batched rows: Winograd's products at a small batch (nnc.codegen.rows_kernel) ----------------------------------

@njit(cache=True, nogil=True, error_model="numpy")
def _task_rows(t, rows):
    """The first output row (over all products) of rows_kernel's task t, and the row after its last."""
    nblk = blocks_per_product(rows)
    p, r0 = t // nblk, (t % nblk) * BLOCK_ROWS
    return p * rows + r0, p * rows + min(rows, r0 + BLOCK_ROWS)


@njit(cache=True, nogil=True, error_model="numpy")
def _release_held(mb):
    """Drop the operands an earlier job kept while the helper was inside one of its chunks, once it has left that
    job; whether none are kept now (the caller holds the lock)."""
    held = _load(mb, _HOLD_GEN)
    if held == 0:
        return True
    if _load(mb, _HELPER_IN) == held:
        return False
    _drop(_load(mb, _HOLD_A))
    _drop(_load(mb, _HOLD_B))
    _store(mb, _HOLD_GEN, 0)
    return True


@njit(cache=True, nogil=True, error_model="numpy")
def batched_rows(a, b, out, rows, kdim, n_out):
    """out[p] = a[p] @ b[p] (rows_kernel.rows_product's operands: flat, C-contiguous, one float dtype) with the
    helper thread's help when it is awake and the product is large enough; never waits for the helper. When the
    helper is inside one of its chunks as the caller returns, the job keeps NRT references to a and b (so a temporary
    of a whole-graph function stays mapped) until a later job finds the helper gone."""
    n = out.shape[0]
    mb = _mailbox()
    if (rows == 0 or n_out == 0 or kdim == 0 or n * kdim < _load(mb, _MIN_WORK)
            or n * out.itemsize > ROWS_SCRATCH_BYTES or _load(mb, _RUNNING) == 0 or not _cas(mb, _LOCK, 0, 1)):
        rows_product(a, b, out, rows, kdim, n_out)
        return
    if not _release_held(mb):  # the helper is still inside an earlier job: it cannot help with this one
        _store(mb, _LOCK, 0)
        rows_product(a, b, out, rows, kdim, n_out)
        return
    gen = _load(mb, _GEN) + 1
    ntasks, per, nchunks = _publish_rows(mb, gen, a, b, out, rows, kdim, n_out)
    tag = gen * 4
    first_not_mine = nchunks
    for c in range(nchunks):
        if not _cas(mb, _STATES + _STATE_WORDS * c, tag + FREE, tag + CALLER):
            first_not_mine = c
            break
        rows_tasks(a, b, out, c * per, min(ntasks, (c + 1) * per), rows, kdim, n_out)
    _collect_rows(mb, tag, a, b, out, rows, kdim, n_out, first_not_mine)
    _hold_if_helper_inside(mb, gen, a, b)
    _store(mb, _LOCK, 0)


@njit(cache=True, nogil=True, error_model="numpy")
def _publish_rows(mb, gen, a, b, out, rows, kdim, n_out):
    """Write a batched-rows job (its chunks: whole tasks, about RCHUNK_WORK multiply-adds each), then its
    generation; wake a sleeping helper. Returns the job's tasks, tasks a chunk and chunks."""
    ntasks = out.shape[0] // (rows * n_out) * blocks_per_product(rows)
    per = max(1, _load(mb, _RCHUNK_WORK) // (BLOCK_ROWS * kdim * n_out), (ntasks + MAX_CHUNKS - 1) // MAX_CHUNKS)
    nchunks = (ntasks + per - 1) // per
    _store(mb, _KIND, ROWS)
    _store(mb, _A, _address(a))
    _store(mb, _W, _address(b))
    _store(mb, _KDIM, kdim)
    _store(mb, _NOUT, n_out)
    _store(mb, _PROWS, rows)
    _store(mb, _N, ntasks)
    _store(mb, _NCHUNKS, nchunks)
    _store(mb, _ROWS, per)
    _store(mb, _DTYPE, _F32 if out.itemsize == 4 else _F64)
    _open(mb, gen, nchunks)
    return ntasks, per, nchunks


@njit(cache=True, nogil=True, error_model="numpy")
def _collect_rows(mb, tag, a, b, out, rows, kdim, n_out, first):
    """The caller's end of a batched-rows job: every chunk from `first` on is the helper's; copy the ready ones
    from the scratch, steal and compute the rest."""
    ntasks, per, nchunks = _load(mb, _N), _load(mb, _ROWS), _load(mb, _NCHUNKS)
    scratch = _load(mb, _RSCRATCH)
    for c in range(first, nchunks):
        t0, t1 = c * per, min(ntasks, (c + 1) * per)
        if _cas(mb, _STATES + _STATE_WORDS * c, tag + FREE, tag + CALLER):
            rows_tasks(a, b, out, t0, t1, rows, kdim, n_out)
        elif _cas(mb, _STATES + _STATE_WORDS * c, tag + HELPER, tag + CALLER):
            rows_tasks(a, b, out, t0, t1, rows, kdim, n_out)
            _store(mb, _STOLEN, _load(mb, _STOLEN) + 1)
        else:  # READY
            s0, s1 = _task_rows(t0, rows)[0] * n_out, _task_rows(t1 - 1, rows)[1] * n_out
            _copy(_address(out) + s0 * out.itemsize, scratch + s0 * out.itemsize, (s1 - s0) * out.itemsize)
            _store(mb, _HELPED, _load(mb, _HELPED) + 1)
    _store(mb, _JOBS, _load(mb, _JOBS) + 1)
    _store(mb, _CHUNKS, _load(mb, _CHUNKS) + nchunks)


@njit(cache=True, nogil=True, error_model="numpy")
def _hold_if_helper_inside(mb, gen, a, b):
    """Keep a and b (NRT references) while the helper may still read them: it is inside job `gen`.
    NOTE: every chunk is the caller's or READY now, so a helper that has not entered the job yet never claims one
    (it stores HELPER_IN before its claim, and both are sequentially consistent): it never reads a or b."""
    if _load(mb, _HELPER_IN) == gen:
        _hold(mb, _HOLD_A, a)
        _hold(mb, _HOLD_B, b)
        _store(mb, _HOLD_GEN, gen)


@njit(cache=True, nogil=True, error_model="numpy")
def _helper_rows(mb, gen, like):
    """The helper's part of a batched-rows job: claim and compute its chunks from the back into the scratch."""
    tag = gen * 4
    kdim, n_out, rows = _load(mb, _KDIM), _load(mb, _NOUT), _load(mb, _PROWS)
    ntasks, nchunks, per = _load(mb, _N), _load(mb, _NCHUNKS), _load(mb, _ROWS)
    batch = ntasks // blocks_per_product(rows)
    a = carray(_pointer(_load(mb, _A), like), batch * rows * kdim)
    b = carray(_pointer(_load(mb, _W), like), batch * kdim * n_out)
    scratch = carray(_pointer(_load(mb, _RSCRATCH), like), batch * rows * n_out)
    for c in range(nchunks - 1, -1, -1):
        _store(mb, _HELPER_IN, gen)
        if not _cas(mb, _STATES + _STATE_WORDS * c, tag + FREE, tag + HELPER):
            break
        _hook_wait(mb)
        rows_tasks(a, b, scratch, c * per, min(ntasks, (c + 1) * per), rows, kdim, n_out)
        if not _hand_over(mb, c, tag):
            break
    _store(mb, _HELPER_IN, 0)


# --- the helper thread ------------------------------------------------------------------------------------------

@njit(cache=True, nogil=True, error_model="numpy")
def _hand_over(mb, c, tag):
    """The helper's chunk c of the job tagged `tag` is ready in the scratch (HELPER -> READY); False if stolen."""
    return _cas(mb, _STATES + _STATE_WORDS * c, tag + HELPER, tag + READY)


@njit(cache=True, nogil=True, error_model="numpy")
def _hook_wait(mb):
    """Where a test holds the helper (inside a claimed chunk): HOOK 1 -> 2 says it is here; it waits while 2."""
    while _load(mb, _HOOK) == 1:
        _store(mb, _HOOK, 2)
    while _load(mb, _HOOK) == 2:
        _pause()


@njit(cache=True, nogil=True, error_model="numpy")
def _helper_chunks(mb, gen, like):
    """Claim and compute the job's chunks from the back while they are free; like: an array of the job's dtype."""
    tag = gen * 4
    kdim, n, nchunks, rows = _load(mb, _KDIM), _load(mb, _N), _load(mb, _NCHUNKS), _load(mb, _ROWS)
    x = carray(_pointer(mb + 8 * _X, like), kdim)
    w = carray(_pointer(_load(mb, _W), like), n * kdim)
    scratch = carray(_pointer(mb + 8 * _SCRATCH, like), n)
    for c in range(nchunks - 1, -1, -1):
        _store(mb, _HELPER_IN, gen)
        if not _cas(mb, _STATES + _STATE_WORDS * c, tag + FREE, tag + HELPER):
            break
        _hook_wait(mb)
        gemv_rows(x, w, scratch, c * rows, min(n, (c + 1) * rows))
        if not _hand_over(mb, c, tag):
            break  # stolen: the caller has finished this job
    _store(mb, _HELPER_IN, 0)


@njit(cache=True, nogil=True, error_model="numpy")
def _helper_job(mb, gen, f32, f64):
    """Run the helper's part of job `gen`, of the kind and dtype the mailbox names."""
    rows_job = _load(mb, _KIND) == ROWS
    if _load(mb, _DTYPE) == _F32 and rows_job:
        _helper_rows(mb, gen, f32)
    elif _load(mb, _DTYPE) == _F32:
        _helper_chunks(mb, gen, f32)
    elif rows_job:
        _helper_rows(mb, gen, f64)
    else:
        _helper_chunks(mb, gen, f64)


@njit(cache=True, nogil=True, error_model="numpy")
def _helper_main(f32, f64):
    """The helper thread's life: run jobs as they are published, spin SPIN cycles after the last, then sleep on the
    futex until woken (or 0.1 s passes); return when the stop flag is set."""
    mb = _mailbox()
    seen = _load(mb, _GEN)
    idle_since = _cycles()
    while _load(mb, _STOP) == 0:
        gen = _load(mb, _GEN)
        if gen != seen:
            seen = gen
            _helper_job(mb, gen, f32, f64)
            idle_since = _cycles()
        elif _cycles() - idle_since > _load(mb, _SPIN_CYCLES):
            _store(mb, _SLEEP, 1)
            if _load(mb, _GEN) == seen:  # no job published since: sleep (a caller's wake or the timeout ends it)
                _syscall(_FUTEX_SYSCALL, mb + 8 * _SLEEP, _FUTEX_WAIT | _FUTEX_PRIVATE, 1, mb + 8 * _TIMESPEC, 0, 0)
            _store(mb, _SLEEP, 0)
            idle_since = _cycles()
        else:
            _pause()
    _store(mb, _RUNNING, 0)


@njit(cache=True, nogil=True)
def _wake_helper():
    """End the helper's futex sleep now (it then reads the stop flag)."""
    mb = _mailbox()
    _store(mb, _SLEEP, 0)
    _syscall(_FUTEX_SYSCALL, mb + 8 * _SLEEP, _FUTEX_WAKE | _FUTEX_PRIVATE, 1, 0, 0, 0)


@njit(cache=True, nogil=True)
def _cycle_count():
    return _cycles()


def _cycles_per_second() -> float:
    """The cycle counter's rate, measured over 20 ms."""
    c0, t0 = _cycle_count(), time.perf_counter()
    time.sleep(0.02)
    return (_cycle_count() - c0) / (time.perf_counter() - t0)


def _helper_thread(f32, f64) -> None:
    """The helper thread: at the idle scheduling class, its spin budget measured, then _helper_main until stopped
    (loading and measuring here keeps ~0.4 s off the compile that started it)."""
    # NOTE: SCHED_IDLE runs the helper only on a core nothing else wants: on a loaded machine it takes no time from
    # the caller or its neighbours (a helper at normal priority, spinning, took half the caller's core and doubled
    # its time beside busy neighbours), on a quiet one it has the idle core to itself.
    if hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_IDLE"):
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    MAILBOX[_SPIN_CYCLES] = int(SPIN_SECONDS * _cycles_per_second())
    MAILBOX[_RUNNING] = 1  # callers share their products from now on
    _helper_main(f32, f64)


_LOCK_PY = threading.Lock()
_THREAD: threading.Thread | None = None


def takes(n: int, kdim: int) -> bool:
    """Whether gemv can share a product of n outputs over kdim with a helper thread here (its platform and mailbox
    sizes; the helper may still be off: NNC_NOWAIT=0, or not started yet)."""
    return AVAILABLE and kdim <= MAX_K and n <= MAX_N


def ensure_helper() -> bool:
    """Start the helper thread if this process has none (it sleeps until a product needs it); whether one runs."""
    global _THREAD
    if not AVAILABLE or os.environ.get("NNC_NOWAIT", "1") == "0":
        return False
    with _LOCK_PY:
        if _THREAD is not None and _THREAD.is_alive():
            return True
        f32, f64 = np.zeros(1, np.float32), np.zeros(1, np.float64)
        MAILBOX[_STOP] = 0
        _THREAD = threading.Thread(target=_helper_thread, args=(f32, f64), name="nnc-nowait-helper", daemon=True)
        _THREAD.start()
    return True


def _stop_at_exit() -> None:
    """Stop the helper before the interpreter tears down (at most a short wait: it may get no core at once)."""
    with contextlib.suppress(RuntimeError):
        stop_helper(timeout=0.5)


atexit.register(_stop_at_exit)


def stop_helper(timeout: float = 5.0) -> None:
    """Stop the helper thread and wait for it (products run serially until ensure_helper starts another)."""
    global _THREAD
    with _LOCK_PY:
        thread = _THREAD
        if thread is None:
            return
        MAILBOX[_RUNNING] = 0  # callers stop publishing jobs
        MAILBOX[_STOP] = 1
        _wake_helper()
        thread.join(timeout)
        if thread.is_alive():
            raise RuntimeError("the nowait helper thread did not stop")
        _THREAD = None


def counts() -> dict:
    """Jobs run with the helper so far, their chunks, how many the helper computed, how many the caller stole."""
    return {name: int(MAILBOX[k]) for name, k in
            (("jobs", _JOBS), ("chunks", _CHUNKS), ("helped", _HELPED), ("stolen", _STOLEN))}


_RETAINED: list = []


def retain(arrays) -> None:
    """Keep a run's arrays referenced while the helper is inside a chunk (it may still read a weight); drop the kept
    ones once it is not. Called by the Python side of a plan after each run (consecutive runs on the same arrays
    are kept once)."""
    if not MAILBOX[_HELPER_IN]:
        if _RETAINED:
            _RETAINED.clear()
        return
    arrays = list(arrays)
    last = _RETAINED[-1] if _RETAINED else ()
    if len(last) != len(arrays) or any(a is not b for a, b in zip(last, arrays)):
        _RETAINED.append(arrays)


def _after_fork_in_child() -> None:
    """A forked child has no helper thread: its products run serially until ensure_helper starts one."""
    global _THREAD
    _THREAD = None
    MAILBOX[_RUNNING] = 0
    MAILBOX[_LOCK] = 0
    MAILBOX[_SLEEP] = 0
    MAILBOX[_HELPER_IN] = 0
    MAILBOX[_HOLD_GEN] = 0  # (the references it held are the parent's helper's: kept for good)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
