"""CPU matmul kernels: numpy BLAS (`np.dot`/`np.matmul`) into the output buffer, or for the shapes BLAS is slow on
(small batches) a generated loop (`matmul_schedule` picks which); then the elementwise skeleton runs the epilogue in
place over the product."""
from __future__ import annotations

import math
from dataclasses import dataclass

from runtime.ops import Kind

from ..graph import Node
from ..kernel import Kernel, matmul_nodes
from ..symbolic import has_symbols
from . import nowait
from .cpu_elementwise import Array, Function, KernelBuilder, ParallelLoop, flat_view, indent
from .cpu_small_gemm import batched_rows_lines, takes_batched_rows
from .indexing import emit_offsets, shifted
from .scalar import Unsupported, ctor, node_dtype, node_shape, op_and_attrs

# A matmul/linear whose first operand has at most FEW_ROWS rows, or a matmul that sums over at most FEW_ROWS
# (a weight gradient g^T @ x at a small batch), runs as a generated loop instead of BLAS (see
# matmul_schedule): linear in tasks of _FEW_ROWS_BLOCK output columns, matmul in tasks of a row x
# _AXPY_BLOCK columns, the short sum one output row a task.
# NOTE: measured on the MLP at batch 8 (2 cores): 8 x 784 x 512 linear 59 us (OpenBLAS 141, torch 84); g^T @ x with
# a sum over 8: 106 us (OpenBLAS 144, torch 66). The limit also keeps OpenBLAS out of a small-batch training step
# altogether: a parallel numba region between OpenBLAS calls makes both thread pools spin against each other on a
# 2-core machine (a batch-8 step ran 10x slower when only the forward used loops).
FEW_ROWS = 8
# Smaller still (at most _SERIAL_LOOP_WORK multiply-adds), a linear with at most FEW_COLUMNS outputs or a matmul
# summing over at most FEW_COLUMNS (a classifier head and its input gradient at batch 128) runs as a *serial*
# generated loop: OpenBLAS wakes its threads for these tiny products (40 us in a batch-128 step for a
# 128 x 512 x 10 linear, 15 us as a loop), and a serial loop has no thread pool to contend with BLAS's.
FEW_COLUMNS = 16
_SERIAL_LOOP_WORK = 2 ** 20
# A matmul loop runs as a prange from this many multiply-adds. NOTE: a numba parallel region leaves its OpenMP threads
# spinning, and the OpenBLAS calls around it then wait for the cores: MNIST-CNN batch-1 inference, whose 1 x 9216 x 128
# linear ran as a prange between BLAS products, took 8.9 ms against 0.22 ms with the spinning turned off.
PARALLEL_MIN_WORK = 2 ** 21
_FEW_ROWS_BLOCK = 8
# A linear of one row and at least GEMV_BLAS_MIN_WORK multiply-adds runs in BLAS (its gemv, on OpenBLAS's threads)
# unless its weight is a parameter nnc.codegen.nowait can take: a weight this large is read from L3 or memory, which
# two threads read about twice as fast as the serial loop. NOTE: measured on the MNIST CNN's 1 x 9216 x 128 linear
# (4.7 MB of weights, 2 cores): OpenBLAS sgemv 27 us, the generated loop 52 us; the batch-1 MLP's 784 x 512 layer
# (0.4 M multiply-adds) stays a loop (15.5 us, see _gemv_lines). nowait's helper thread reads the other half without
# a join: OpenBLAS's gemv joins its threads, and beside busy processes the MNIST CNN's batch-1 forward took 1.2-5 ms
# with it (0.3-1 ms with OpenBLAS on one thread).
GEMV_BLAS_MIN_WORK = 2 ** 20
_AXPY_BLOCK = 1024
# A matmul summing over at most FEW_COLUMNS into at least WIDE_COLUMNS columns (a convolution with few input
# channels: the MNIST CNN's first, 32 x 9 by 9 x 43264 at batch 64) runs as a loop over blocks of _WIDE_BLOCK
# columns: the block's kdim rows of b stay in L1 while every output row of it is written once.
# NOTE: measured single-threaded on that product: 0.26 ms against OpenBLAS's 0.30 ms; in a training step the BLAS call
# between two parallel numba kernels took 4 ms (the two thread pools contend), the loop shares numba's pool.
WIDE_COLUMNS = 4096
_WIDE_BLOCK = 256
_AXPY_UNROLL = 4  # rows of b a sweep over an output row adds (see _axpy_k_lines)
_GEMV_ROWS = 4  # weight rows a batch-1 linear sweeps at once (see _gemv_lines); divides _FEW_ROWS_BLOCK


@dataclass(frozen=True)
class MatmulSchedule(ParallelLoop):
    """How a matmul/linear of `rows` x `kdim` by `kdim` x `n_out` runs (a pure value of the op, shapes and dtypes).

    form: "blas" (numpy's np.dot/np.matmul into the output: OpenBLAS's own threads), or a generated loop:
      "linear_few_rows"     a linear with at most FEW_ROWS rows of `a` (one row: below GEMV_BLAS_MIN_WORK, or a
                            parameter weight nnc.codegen.nowait takes, run with its helper thread): dot
                            products of contiguous rows, all rows at once, so each weight element is loaded once (the
                            rows of `a` stay in L1); tasks of _FEW_ROWS_BLOCK output columns.
      "matmul_few_rows"     a matmul with at most FEW_ROWS rows: each output row is rows of b scaled and added,
                            vectorized along N; tasks of a row x _AXPY_BLOCK columns.
      "short_sum"           a matmul summing over at most FEW_ROWS (a weight gradient at a small batch), or over at
                            most FEW_COLUMNS when the product is small: each output element is its short sum
                            written out, one output row a task.
      "short_sum_wide"      a matmul summing over at most FEW_COLUMNS into at least WIDE_COLUMNS columns (a
                            convolution with few input channels): the short sum written out, a block of _WIDE_BLOCK
                            columns of every output row a task.
      "linear_few_columns"  a small linear with at most FEW_COLUMNS outputs: every column's dot product in one sweep
                            over a row of `a`.
      "batched_small"       a batched matmul (same batch dims, nothing broadcast) of at most _SERIAL_LOOP_WORK
                            multiply-adds, serial: a row of one product a task (attention's products at batch 1, where
                            np.matmul's per-call cost dominates; numba has no batched np.matmul for whole-graph mode).
      "batched_rows"        a larger batched matmul of the same kind with short sums into short rows (Winograd's
                            products at a small batch; nnc.codegen.cpu_small_gemm): blocks of four rows in vector
                            registers, shared with nnc.codegen.nowait's helper thread (never a parallel region).
    parallel: the loop is a prange (>= PARALLEL_MIN_WORK multiply-adds; the FEW_COLUMNS forms are serial).
    Measured against OpenBLAS here: tools/bench_compile.py cases 4 and 5. Loops sum in the output dtype with
    reassociation and FMA, as BLAS does.
    """

    form: str
    parallel: bool = False
    rows: int = 0
    kdim: int = 0
    n_out: int = 0
    batch_rows: int = 0  # batched_small, batched_rows: the rows of one product (rows // batch_rows products)


def matmul_schedule(op_name: str, a_shape, b_shape, a_dtype, b_dtype, out_dtype,
                    weight_is_parameter: bool = False) -> MatmulSchedule:
    """The schedule of `op_name` ("matmul" or "linear") on operands of these shapes and dtypes; weight_is_parameter:
    a linear's weight is a parameter read as is (nnc.codegen.nowait may read it after the call returns)."""
    if out_dtype.kind != "f" or a_dtype != out_dtype or b_dtype != out_dtype or len(b_shape) < 2 or not a_shape:
        return MatmulSchedule("blas")
    if has_symbols((a_shape, b_shape)):  # the loop forms unroll by their sizes: BLAS serves every size
        return MatmulSchedule("blas")
    rows, kdim = math.prod(a_shape[:-1]), a_shape[-1]
    if kdim == 0:
        return MatmulSchedule("blas")
    n_out = b_shape[0] if op_name == "linear" else b_shape[-1]
    work = rows * kdim * n_out  # multiply-adds
    if len(b_shape) > 2:  # a batched product: a loop when small and nothing broadcasts, else np.matmul
        same_batch = len(a_shape) == len(b_shape) and tuple(a_shape[:-2]) == tuple(b_shape[:-2])
        if op_name == "matmul" and same_batch and work <= _SERIAL_LOOP_WORK:
            return MatmulSchedule("batched_small", False, rows, kdim, n_out, a_shape[-2])
        if op_name == "matmul" and same_batch and a_shape[-2] and \
                takes_batched_rows(rows // a_shape[-2], a_shape[-2], kdim, n_out):
            return MatmulSchedule("batched_rows", False, rows, kdim, n_out, a_shape[-2])  # serial: see its module
        return MatmulSchedule("blas")
    parallel = work >= PARALLEL_MIN_WORK
    batched = len(a_shape) >= 2
    if op_name == "linear" and rows == 1 and work >= GEMV_BLAS_MIN_WORK and not (
            weight_is_parameter and nowait.takes(n_out, kdim)):
        return MatmulSchedule("blas")
    if op_name == "linear" and rows <= FEW_ROWS:
        form = "linear_few_rows"
    elif op_name == "matmul" and batched and rows <= FEW_ROWS:
        form = "matmul_few_rows"
    elif op_name == "matmul" and batched and kdim <= FEW_COLUMNS and n_out >= WIDE_COLUMNS:
        form = "short_sum_wide"
    elif op_name == "matmul" and batched and kdim <= FEW_ROWS:
        form = "short_sum"
    elif work <= _SERIAL_LOOP_WORK and op_name == "linear" and n_out <= FEW_COLUMNS:
        form, parallel = "linear_few_columns", False
    elif work <= _SERIAL_LOOP_WORK and op_name == "matmul" and batched and kdim <= FEW_COLUMNS:
        form, parallel = "short_sum", False
    else:
        return MatmulSchedule("blas")
    return MatmulSchedule(form, parallel, rows, kdim, n_out)


def _anchor(kernel: Kernel):
    """(the matmul/linear node, its op, its two operand nodes) of a matmul kernel."""
    anchors = matmul_nodes(kernel)
    if len(anchors) != 1:
        raise Unsupported("a matmul kernel has exactly one matmul/linear node")
    mm = anchors[0]
    op, args, _ = op_and_attrs(mm)
    if op.kind != Kind.MATMUL or len(args) != 2 or not all(isinstance(a, Node) for a in args):
        raise Unsupported(f"matmul anchor {mm.name} ({op.name}) is not a matmul/linear of two tensors")
    return mm, op, args


def matmul_schedule_of(kernel: Kernel) -> MatmulSchedule:
    """The schedule of a matmul kernel's anchor."""
    mm, op, (a, b) = _anchor(kernel)
    return matmul_schedule(op.name, node_shape(a), node_shape(b), node_dtype(a), node_dtype(b), node_dtype(mm),
                           weight_is_parameter=b.op == "get_attr")


def gen_matmul(kb: KernelBuilder) -> None:
    """A matmul kernel: the product (a loop function or a BLAS call in the launcher), then the epilogue."""
    k = kb.kernel
    mm, op, args = _anchor(k)
    a_arr, b_arr = kb.read_of(args[0]), kb.read_of(args[1])
    mm_shape, mm_dtype = node_shape(mm), node_dtype(mm)
    store = k.meta.get("stores", {}).get(mm)
    if store is not None:
        _gen_stored_matmul(kb, mm, a_arr, b_arr, store)
        return
    epilogue = [n for n in k.nodes if n is not mm]  # in graph order: side inputs (a relu mask) come first
    for n in epilogue:
        if node_shape(n) != mm_shape:
            raise Unsupported(f"epilogue node {n.name} has shape {list(node_shape(n))}, not the matmul "
                              f"output shape {list(mm_shape)}")
    out_of = {a.node: a for a in kb.outs}
    # where the product goes: its own output, else (in place) an epilogue output of the same shape and dtype
    in_place = None
    if mm in out_of:
        target = f"outs[{kb.outs.index(out_of[mm])}]"
    else:
        same = [a for a in kb.outs if a.shape == mm_shape and a.dtype == mm_dtype]
        in_place = same[-1] if same else None
        target = f"outs[{kb.outs.index(in_place)}]" if same else None
    lines = []
    if target is None:
        lines.append(f"mm = np.empty({mm_shape!r}, dtype={ctor(mm_dtype)})")
    else:
        lines.append(f"mm = {target}")
    schedule = matmul_schedule(op.name, a_arr.shape, b_arr.shape, a_arr.dtype, b_arr.dtype, mm_dtype,
                               weight_is_parameter=_nowait_weight(b_arr))
    batched = schedule.form == "blas" and op.name == "matmul" and not (len(b_arr.shape) == 2 and len(a_arr.shape) >= 2)
    blas_2d = schedule.form == "blas" and not batched
    a_view_2d = blas_2d and len(a_arr.shape) == 2 and a_arr.strides is not None  # read whole: no reshape
    ia = operand(a_arr, strided_ok=batched, transposed_ok=a_view_2d)
    ib = operand(b_arr, strided_ok=batched, transposed_ok=blas_2d)
    if schedule.form != "blas":
        loop = _loop_function(kb, schedule, mm, a_arr, b_arr)
        kb.functions.append(loop)
        ia, ib = _loop_operands(schedule, a_arr, b_arr, ia, ib)
        lines.append(f"{loop.name}({ia}.reshape(-1), {ib}.reshape(-1), mm.reshape(-1))")
    elif op.name == "linear":
        kdim, n_out = b_arr.shape[1], b_arr.shape[0]
        rows = ia if a_view_2d else f"{ia}.reshape(-1, {kdim})"
        lines.append(f"np.dot({rows}, {ib}.T, out=mm.reshape(-1, {n_out}))")
    elif len(b_arr.shape) == 2 and len(a_arr.shape) >= 2:
        kdim, n_out = b_arr.shape
        rows = ia if a_view_2d else f"{ia}.reshape(-1, {kdim})"
        lines.append(f"np.dot({rows}, {ib}, out=mm.reshape(-1, {n_out}))")
    elif _same_batch_3d(a_arr.shape, b_arr.shape):
        # NOTE: one np.dot per batch entry: np.matmul ran a batch whose operand is transposed (Winograd's weight
        # gradient, dM @ V^T over (36, 64, 2304) x (36, 2304, 32)) without BLAS, 100x slower; and numba (whole-graph
        # mode) has np.dot but no batched np.matmul
        lines += [f"lhs3 = {ia}", f"rhs3 = {ib}", f"for bi in range({a_arr.shape[0]}):", PER_ENTRY_DOT]
    else:
        lines.append(f"np.matmul({ia}, {ib}, out=mm)")
    if epilogue:
        # NOTE: in place, the product is read through the output's own argument: with two arguments pointing at
        # the same memory LLVM's runtime alias check fails and the loop runs scalar (measured 3.4x slower).
        mm_arr = Array(in_place.arg if in_place is not None else "mm", mm, mm_shape, mm_dtype)
        ins = [mm_arr] + [a for a in kb.reads if any(a.node in n.all_input_nodes for n in epilogue)]
        outs = [a for a in kb.outs if a.node is not mm]
        f = kb.elementwise_function(f"{kb.name}_epilogue", epilogue, ins, outs, mm_shape)
        kb.functions.append(f)
        flat = ["mm.reshape(-1)" if a.arg == "mm" else flat_view(a) for a in f.args]
        lines.append(f"{f.name}({', '.join(flat + f.symbols)})")
    kb.launch = lines


def _gen_stored_matmul(kb: KernelBuilder, mm, a_arr: Array, b_arr: Array, store) -> None:
    """A matmul kernel whose product is stored into another value's buffer (nnc.passes.stores): np.matmul into the
    strided place (swapping the operands, C^T = B^T A^T, where the place's rows run down a column, so BLAS writes it
    directly), or the batched loop writing its rows there. The target is an output of the kernel or, for a cat
    another kernel allocated, an array it writes into (`meta["writes_into"]`, after the outputs)."""
    (target,) = [k for k, a in enumerate(kb.outs) if a.node is store.target]
    dtype = node_dtype(mm)
    schedule = matmul_schedule("matmul", a_arr.shape, b_arr.shape, a_arr.dtype, b_arr.dtype, dtype)
    if schedule.form == "batched_small":
        ia, ib = _loop_operands(schedule, a_arr, b_arr, operand(a_arr), operand(b_arr))
        loop = _loop_function(kb, schedule, mm, a_arr, b_arr, store)
        kb.functions.append(loop)
        kb.launch = [f"{loop.name}({ia}.reshape(-1), {ib}.reshape(-1), outs[{target}].reshape(-1))"]
        return
    if schedule.form != "blas":
        raise Unsupported(f"a stored matmul runs as np.matmul or the batched loop, not {schedule.form!r}")
    ia, ib = operand(a_arr, strided_ok=True), operand(b_arr, strided_ok=True)
    strides = tuple(s * dtype.itemsize for s in store.strides)
    lines = [f"mm = np.ndarray({tuple(store.shape)!r}, dtype={ctor(dtype)}, buffer=outs[{target}], "
             f"offset={store.offset * dtype.itemsize}, strides={strides!r})"]
    if store.strides[-1] == 1 or store.shape[-1] == 1:
        lines.append(f"np.matmul({ia}, {ib}, out=mm)")
    else:
        lines.append(f"np.matmul(np.swapaxes({ib}, -1, -2), np.swapaxes({ia}, -1, -2), out=np.swapaxes(mm, -1, -2))")
    kb.launch = lines


# The body of the launcher's loop over a batch's products (nnc.codegen.cpu runs the loop on numba's threads).
PER_ENTRY_DOT = "    np.dot(lhs3[bi], rhs3[bi], out=mm[bi])"


def _same_batch_3d(a_shape, b_shape) -> bool:
    """Whether a batched product is one batch dim of equal size on both sides (a loop of 2-D BLAS products)."""
    return len(a_shape) == 3 and len(b_shape) == 3 and a_shape[0] == b_shape[0]


def operand(a: Array, strided_ok: bool = False, transposed_ok: bool = False) -> str:
    """The launcher's expression for a matmul operand: its input array, or a folded view (nnc.passes.views) of its
    base's. A C-contiguous view is a slice of the flat base; a 2-D transposed one, where np.dot reads it whole,
    its transpose (BLAS reads it as is); any other is numpy's strided view where BLAS may read it (np.matmul: the
    batched products, run from Python), else its C-contiguous copy (np.dot's first operand when it is reshaped to
    rows, and the generated loops, take contiguous operands)."""
    flat = f"np.ascontiguousarray(ins[{int(a.arg[2:])}]).reshape(-1)"  # a strided input's flat view is no base
    if a.strides is None:
        return f"ins[{int(a.arg[2:])}]"
    shape, strides, size = tuple(a.shape), tuple(a.strides), math.prod(a.shape)
    at = a.start + a.offset  # in the launcher's array
    run = f"{flat}[{at}:{at + size}]"
    if strides == _c_order(shape, strides):
        return f"{run}.reshape({shape!r})"
    if transposed_ok and len(shape) == 2 and strides == _c_order(shape[::-1], strides[::-1])[::-1]:
        return f"{run}.reshape({shape[::-1]!r}).T"
    itemsize = a.dtype.itemsize
    view = (f"np.lib.stride_tricks.as_strided({flat}[{at}:], {shape!r}, "
            f"{tuple(s * itemsize for s in strides)!r})")
    return view if strided_ok else f"np.ascontiguousarray({view})"


def rows_in_place(a: Array) -> bool:
    """Whether the batched loop reads a folded view in place (no copy): its rows run along unit strides."""
    return a.strides is not None and (a.strides[-1] == 1 or a.shape[-1] == 1)


def _loop_operands(schedule: MatmulSchedule, a: Array, b: Array, ia: str, ib: str) -> tuple[str, str]:
    """The batched loop's operands: a folded view it reads in place is its base's array (the loop indexes it with
    the view's offset and strides), any other operand its launcher expression (`operand`)."""
    if schedule.form != "batched_small":
        return ia, ib
    return tuple((flat_view(x) if x.start else f"ins[{int(x.arg[2:])}]") if rows_in_place(x) else expr
                 for x, expr in ((a, ia), (b, ib)))


def _c_order(shape, strides) -> tuple:
    """C-contiguous element strides of `shape` (a size-1 dim keeps its given stride: any stride fits it)."""
    out, step = [0] * len(shape), 1
    for k in reversed(range(len(shape))):
        out[k] = strides[k] if shape[k] == 1 else step
        step *= shape[k]
    return tuple(out)


def _loop_function(kb: KernelBuilder, schedule: MatmulSchedule, mm, a_arr, b_arr, store=None) -> Function:
    """The product as the generated loop the schedule names: a numba function of (a, b, out); with a `store`
    (nnc.passes.stores), `out` is the target's buffer and the batched loop writes each row at its place there."""
    dtype = node_dtype(mm)
    rows, kdim, n_out = schedule.rows, schedule.kdim, schedule.n_out
    out = Array("out", mm, node_shape(mm), dtype) if store is None else \
        Array("out", store.target, node_shape(store.target), dtype)
    args = [Array("a", a_arr.node, a_arr.shape, dtype), Array("b", b_arr.node, b_arr.shape, dtype), out]
    if store is not None and schedule.form != "batched_small":
        raise Unsupported(f"the {schedule.form} loop writes a C-contiguous product only")
    zero = kb.dialect.literal(0, dtype)
    if schedule.form == "linear_few_rows" and rows == 1 and _nowait_weight(b_arr) and n_out * kdim >= nowait.MIN_WORK:
        kb.dialect.nowait = True  # a product this large runs on two cores, never waiting (nnc.codegen.nowait)
        return Function(f"{kb.name}_rows", args, ["nowait_gemv(a, b, out)"], False)
    if schedule.form == "linear_few_rows" and rows == 1:  # a matrix-vector product: weight rows in groups
        lines = _gemv_lines(n_out, kdim, zero)
    elif schedule.form == "linear_few_rows":  # each weight row swept once, every row of `a` held
        lines = _dot_lines("b", "a", n_out, rows, kdim, lambda h: f"{h * n_out} + s", zero, _FEW_ROWS_BLOCK)
    elif schedule.form == "matmul_few_rows":
        lines = _axpy_rows_lines(rows, kdim, n_out, zero)
    elif schedule.form == "short_sum":
        lines = _short_sum_lines(rows, kdim, n_out)
    elif schedule.form == "short_sum_wide":
        lines = _short_sum_wide_lines(rows, kdim, n_out)
    elif schedule.form == "batched_small":
        lines = _batched_axpy_lines(rows, schedule.batch_rows, kdim, n_out, zero, store,
                                    a_arr if rows_in_place(a_arr) else None, b_arr if rows_in_place(b_arr) else None)
    elif schedule.form == "batched_rows":  # a call of nnc.codegen.nowait.batched_rows
        kb.dialect.nowait_rows = True
        lines = batched_rows_lines(rows // schedule.batch_rows, schedule.batch_rows, kdim, n_out)
    elif schedule.form == "linear_few_columns":  # each row of `a` swept once, every weight row held
        lines = _dot_lines("a", "b", rows, n_out, kdim, lambda h: f"s * {n_out} + {h}", zero, 1)
    else:
        raise Unsupported(f"matmul schedule {schedule.form!r} has no loop")
    lines[0] = lines[0].replace("LOOP", schedule.loop)
    return Function(f"{kb.name}_rows", args, lines, schedule.parallel, reassociate=True)


def _nowait_weight(b: Array) -> bool:
    """Whether a batch-1 linear's weight is a parameter read as is, so nnc.codegen.nowait's helper may read it:
    a parameter lives as long as the compiled module (a copy of a view would be freed when the call returns,
    maybe while a late helper still reads it)."""
    return b.strides is None and b.node.op == "get_attr"


def _dot_lines(swept, held, n_swept, n_held, kdim, out_at, zero, block) -> list[str]:
    """out = a . w^T as dot products of contiguous rows of length kdim: tasks of `block` rows s of `swept`;
    each is read once, in one sweep over k that adds it into a sum per row h of `held` (n_held rows, which
    stay in L1). out_at(h) is the flat output index (of s and h) a sum is stored at."""
    accs = [f"acc{h}" for h in range(n_held)]
    rows = ([f"for s in LOOP({n_swept}):"] if block == 1 else
            [f"for blk in LOOP({-(-n_swept // block)}):",
             f"    for s in range(blk * {block}, min({n_swept}, blk * {block} + {block})):"])
    body = ([f"sr = {swept}[s * {kdim}:s * {kdim} + {kdim}]",
             f"{', '.join(accs)} = {', '.join([zero] * n_held)}",
             f"for k in range({kdim}):",
             "    v = sr[k]"]
            + [f"    {acc} += {held}[{h * kdim} + k] * v" for h, acc in enumerate(accs)]
            + [f"out[{out_at(h)}] = {acc}" for h, acc in enumerate(accs)])
    return rows + indent(body, len(rows))


def _gemv_lines(n_out, kdim, zero) -> list[str]:
    """out[s] = the dot product of weight row s with the one row of `a`: tasks of _FEW_ROWS_BLOCK weight rows, swept
    _GEMV_ROWS at a time (each a[k] loaded feeds that many sums, which also run independently), the rows left over
    one by one. NOTE: measured on the 512 x 784 layer of a batch-1 MLP: 15.5 us against 19.7 us a row at a time."""
    group, block = _GEMV_ROWS, _FEW_ROWS_BLOCK
    accs = [f"acc{u}" for u in range(group)]
    grouped = ([f"r{u} = b[(s + {u}) * {kdim}:(s + {u}) * {kdim} + {kdim}]" for u in range(group)]
               + [f"{', '.join(accs)} = {', '.join([zero] * group)}",
                  f"for k in range({kdim}):",
                  "    x = a[k]"]
               + [f"    {acc} += x * r{u}[k]" for u, acc in enumerate(accs)]
               + [f"out[s + {u}] = {acc}" for u, acc in enumerate(accs)])
    single = [f"sr = b[s * {kdim}:s * {kdim} + {kdim}]",
              f"acc = {zero}",
              f"for k in range({kdim}):",
              "    acc += a[k] * sr[k]",
              "out[s] = acc"]
    return ([f"for blk in LOOP({-(-n_out // block)}):",
             f"    s0 = blk * {block}",
             f"    s1 = min({n_out}, s0 + {block})",
             f"    whole = s0 + (s1 - s0) // {group} * {group}",
             f"    for s in range(s0, whole, {group}):"]
            + indent(grouped, 2)
            + ["    for s in range(whole, s1):"]
            + indent(single, 2))


def _short_sum_lines(rows, kdim, n_out) -> list[str]:
    """out[i, :] = sum over k < kdim of a[i, k] * b[k, :] with the sum written out: one task per output row,
    the kdim rows of b in L1, each output element written once."""
    terms = " + ".join(f"a{k} * b[{k * n_out} + j]" for k in range(kdim))
    return ([f"for i in LOOP({rows}):"]
            + [f"    a{k} = a[i * {kdim} + {k}]" for k in range(kdim)]
            + [f"    base = i * {n_out}",
               f"    for j in range({n_out}):",
               f"        out[base + j] = {terms}"])


def _short_sum_wide_lines(rows, kdim, n_out) -> list[str]:
    """out[:, j0:j1] = a @ b[:, j0:j1] with each element's short sum (over kdim) written out: one task per block of
    _WIDE_BLOCK columns, its kdim rows of b sliced once and held in L1 while every output row of the block is
    written."""
    blocks = -(-n_out // _WIDE_BLOCK)
    terms = " + ".join(f"a{k} * b{k}[j]" for k in range(kdim))
    return ([f"for blk in LOOP({blocks}):",
             f"    j0 = blk * {_WIDE_BLOCK}",
             f"    w = min({n_out}, j0 + {_WIDE_BLOCK}) - j0"]
            + [f"    b{k} = b[{k * n_out} + j0:{k * n_out} + j0 + w]" for k in range(kdim)]
            + [f"    for i in range({rows}):"]
            + [f"        a{k} = a[i * {kdim} + {k}]" for k in range(kdim)]
            + [f"        orow = out[i * {n_out} + j0:i * {n_out} + j0 + w]",
               "        for j in range(w):",
               f"            orow[j] = {terms}"])


def _batched_axpy_lines(rows, batch_rows, kdim, n_out, zero, store=None, a_view=None, b_view=None) -> list[str]:
    """out[p, i, :] = sum over k of a[p, i, k] * b[p, k, :] for every product p of `batch_rows` rows: a row a task,
    vectorized along the output row. With a `store`, row t starts at its place in the target's buffer (and steps
    along it by the place's last stride); an operand given as a view (an Array with strides: `rows_in_place`) is
    read in its base at the view's offset and strides, rows along unit strides."""
    body = []
    if b_view is None:
        body.append(f"boff = (t // {batch_rows}) * {kdim * n_out}")
        b_row = n_out
    else:
        index_lines, (start,) = emit_offsets(b_view.shape[:-2], [b_view.strides[:-2]], "p", "rb_")
        body += [f"p = t // {batch_rows}"] + index_lines + [f"boff = {shifted(start, b_view.offset)}"]
        b_row = b_view.strides[-2]
    a_at = f"t * {kdim}"
    if a_view is not None:
        index_lines, (start,) = emit_offsets(a_view.shape[:-1], [a_view.strides[:-1]], "t", "ra_")
        body += index_lines + [f"ao = {shifted(start, a_view.offset)}"]
        a_at = "ao"
    body += _output_row_lines(n_out, store) + [f"for j in range({n_out}):", f"    orow[j] = {zero}"]
    body += _axpy_k_lines(kdim, a_at, lambda k: f"boff + {k} * {b_row}", n_out, "orow", str(n_out))
    return [f"for t in LOOP({rows}):"] + indent(body, 1)


def _output_row_lines(n_out, store=None) -> list[str]:
    """`orow = ...`: output row t of a batched product, C-contiguous or at a store's place (nnc.passes.stores)."""
    if store is None:
        return [f"orow = out[t * {n_out}:t * {n_out} + {n_out}]"]
    index_lines, (start,) = emit_offsets(store.shape[:-1], [store.strides[:-1]], "t", "r_")
    step = store.strides[-1] if store.shape[-1] > 1 else 1
    span = f"ro:ro + {(n_out - 1) * step + 1}" + (f":{step}" if step != 1 else "")
    return index_lines + [f"ro = {shifted(start, store.offset)}", f"orow = out[{span}]"]


def _axpy_rows_lines(rows, kdim, n_out, zero) -> list[str]:
    """out[i, n0:n1] = sum over k of a[i, k] * b[k, n0:n1], one task per row i and block of columns."""
    block = min(n_out, _AXPY_BLOCK)
    blocks = -(-n_out // block)
    return ([f"for task in LOOP({rows * blocks}):",
             f"    i = task // {blocks}",
             f"    n0 = (task % {blocks}) * {block}",
             f"    n1 = min({n_out}, n0 + {block})",
             f"    orow = out[i * {n_out} + n0:i * {n_out} + n1]",
             "    for j in range(n1 - n0):",
             f"        orow[j] = {zero}"]
            + indent(_axpy_k_lines(kdim, f"i * {kdim}", lambda k: f"{k} * {n_out} + n0", "n1 - n0", "orow",
                                   "n1 - n0"), 1))


def _axpy_k_lines(kdim, a_at, b_at, width, orow, length) -> list[str]:
    """orow[:length] += sum over k < kdim of a[a_at + k] * b[b_at(k):b_at(k) + width], _AXPY_UNROLL values of k per
    sweep over the row (then the rest one by one).

    NOTE: a sweep per k loads and stores the output row once per k: each sweep waits for the last one's stores
    (store-to-load forwarding, then the FMA), which made a [64, 64] @ [64, 32] product 5x slower than its
    arithmetic; a sweep adding _AXPY_UNROLL rows of b waits that many times less."""
    unroll, lines = _AXPY_UNROLL, []
    whole = kdim - kdim % unroll
    if whole:
        terms = " + ".join(f"a{u} * b{u}[j]" for u in range(unroll))
        lines += [f"for k in range(0, {whole}, {unroll}):"]
        for u in range(unroll):
            k = f"(k + {u})" if u else "k"
            lines += [f"    a{u} = a[{a_at} + {k}]", f"    b{u} = b[{b_at(k)}:{b_at(k)} + {width}]"]
        lines += [f"    for j in range({length}):", f"        {orow}[j] += {terms}"]
    if whole < kdim:
        lines += [f"for k in range({whole}, {kdim}):",
                  f"    aik = a[{a_at} + k]",
                  f"    brow = b[{b_at('k')}:{b_at('k')} + {width}]",
                  f"    for j in range({length}):",
                  f"        {orow}[j] += aik * brow[j]"]
    return lines
