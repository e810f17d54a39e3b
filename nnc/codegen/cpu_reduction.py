"""CPU reduction kernels: the schedule (rows, chunked rows or columns) as a pure value, and the loops that follow it.

One pass computes the prologue (storing the prologue values the kernel outputs) and accumulates every reduction of
the kernel (siblings over the same dims, one accumulator each), then the epilogue runs per kept position. The
layouts (`ReductionSchedule`): rows (one task per kept position, an inner loop over reduced positions; >= 64 of
them: the prologue fills 1024-value blocks that a vectorized helper reduces), chunked rows (too few kept positions
to go parallel: partial results per chunk of the reduced range, then a serial combine), columns (the last dim
kept: tasks of a tile of up to 1024 accumulators x a chunk of rows, swept row by row; with several row chunks,
partial results are combined at the end). Accumulators: float32 sums/products in float64 (the column form adds
float32 spans of at most 256 rows first, see _SPAN); amax/amin propagate nan like numpy.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from runtime.ops import Kind, Reducer

from ..symbolic import has_symbols, is_symbolic
from ..graph import Node
from ..kernel import Kernel
from ..prims import Prim
from .cpu_elementwise import (Function, KernelBuilder, ParallelLoop, indent, launch_line, parallel_work,
                              precompiled_call)
from .indexing import broadcast_strides, c_strides, collapse, emit_offsets, shifted
from .scalar import Dialect, Unsupported, Value, ctor, format_literal, node_dtype, node_shape, op_and_attrs

# Reductions with fewer kept positions than this split the reduced range into chunks (a parallel two-pass form).
_REDUCTION_TASKS = 64
_MIN_CHUNK = 4096
# Reductions over at least _MIN_BLOCKED positions run their prologue block by block (_BLOCK values at a time).
_BLOCK = 1024
_MIN_BLOCKED = 64
# Column reductions (last dim kept) take the column skeleton when a parallel kernel keeps >= 4 * _COLUMN_TILE_MIN
# positions. A task sweeps a tile of up to _COLUMN_TILE kept positions (an accumulator each, per reduction) over a
# chunk of the reduced positions; chunks (of >= _MIN_COLUMN_CHUNK positions) are added until there are
# _COLUMN_TASKS tasks. NOTE: measured on the chain backward (tools/bench_compile.py, case 3): tiles of 128 columns ran
# 1.7x slower than tiles of 1024 (per-row loop overhead), and row chunks give the parallelism that the tiles no
# longer give.
_COLUMN_TILE_MIN = 32
_COLUMN_TILE = 1024
_COLUMN_TASKS = 16
_MIN_COLUMN_CHUNK = 32
# NOTE: a column skeleton's float32 sum adds float32 values over spans of at most _SPAN reduced positions and then
# the span's total into a float64 accumulator: vectorized at float32's width (a float64 accumulator in the sweep
# halves it; storing and adding in a second loop cost 0.4-0.8 ms of the chain backward). A span's error is at most
# ~_SPAN ulps of its magnitude, and the float64 total adds none: more accurate than numpy's own axis-0 float32
# sum, which adds row after row in float32.
_SPAN = 256


@dataclass(frozen=True)
class ReductionSchedule(ParallelLoop):
    """How a reduction kernel's loops are laid out: a pure value of the input shape, the reduced dims and whether
    every accumulator has a block helper (`reduction_schedule`); the skeletons follow it.

    layout "rows": a task per kept position (x a chunk of the reduced range when chunks > 1: the tasks leave partial
      results that a serial loop combines); blocked: the prologue fills buffers of `block` values that a vectorized
      helper reduces. "columns" (the last dim kept): tasks of a tile of `tile` kept positions (`tiles` of them) x a
      chunk of reduced positions, one accumulator per kept position, swept row by row.
    """

    layout: str     # "rows" or "columns"
    parallel: bool  # the task loop is a prange (cpu_elementwise.parallel_work)
    n_outer: int    # kept positions (the reduced result's size)
    n_red: int      # reduced positions per kept position
    chunks: int     # the reduced range is split into this many chunks (> 1: partial results, then a combine)
    chunk: int      # reduced positions per chunk
    blocked: bool = False  # rows: reduced block by block by a helper
    block: int = 0         # rows: values per block
    tile: int = 0          # columns: kept positions per task
    tiles: int = 0         # columns: tasks along the kept positions

    @property
    def tasks(self) -> int:
        """Iterations of the (parallel) task loop."""
        return (self.tiles if self.layout == "columns" else self.n_outer) * self.chunks


def reduction_schedule(shape, dims, blockable: bool = True, prologue=()) -> ReductionSchedule:
    """The schedule of a reduction pass over `shape` reducing `dims`, computing the `prologue` nodes at every
    element; blockable: every accumulator has a block helper (so blocks of at least _MIN_BLOCKED values go through
    it)."""
    ndim = len(shape)
    n_outer = math.prod(shape[d] for d in range(ndim) if d not in dims)
    n_red = math.prod(shape[d] for d in dims)
    parallel = parallel_work(n_outer * n_red, prologue)
    # NOTE: reducing outer dims while the last dim is kept (a bias gradient: sum over the batch) walks columns:
    # the column skeleton keeps a tile of accumulators and sweeps the input row by row, contiguous and
    # vectorized, instead of striding down one column per accumulator.
    if bool(ndim) and (ndim - 1) not in dims and shape[-1] > 1 and n_red > 1 and n_outer > 1 \
            and (not parallel or n_outer >= 4 * _COLUMN_TILE_MIN):
        tile, tiles, chunk, chunks = _column_tasks(n_outer, n_red, parallel)
        return ReductionSchedule("columns", parallel, n_outer, n_red, chunks, chunk, tile=tile, tiles=tiles)
    chunks = 1
    if parallel and n_outer < _REDUCTION_TASKS:
        chunks = max(1, min(-(-_REDUCTION_TASKS // max(n_outer, 1)), n_red // _MIN_CHUNK))
    chunk = n_red
    if chunks > 1:
        chunk = -(-n_red // chunks)
        chunk = -(-chunk // _BLOCK) * _BLOCK  # whole blocks per chunk
        chunks = -(-n_red // chunk)
    if is_symbolic(n_red):  # one schedule for every size: blocks handle a short row too
        return ReductionSchedule("rows", parallel, n_outer, n_red, chunks, chunk, blockable, _BLOCK)
    blocked = n_red >= _MIN_BLOCKED and blockable
    return ReductionSchedule("rows", parallel, n_outer, n_red, chunks, chunk, blocked, min(_BLOCK, chunk))


def reduction_schedule_of(kernel: Kernel) -> ReductionSchedule:
    """The schedule of a reduction kernel (after checking its reductions can share one pass)."""
    accs = accumulators(kernel, Dialect())
    prologue, _ = _split_reduction_kernel(kernel.nodes, [a.node for a in accs])
    return reduction_schedule(tuple(kernel.shape), accs[0].dims, blockable(accs), prologue)


def blockable(accs) -> bool:
    """Whether every accumulator has a block helper."""
    return all(a.reducer.block is not None for a in accs)


def reduction_parts(kb: KernelBuilder):
    """(accumulators, prologue nodes, epilogue nodes) of a reduction kernel, checked for every target's skeleton:
    prologue values broadcast to the input shape, epilogue nodes have the reduced shape and read no prologue value."""
    k = kb.kernel
    accs = accumulators(k, kb.dialect)
    shape, out_shape = tuple(k.shape), accs[0].out_shape
    prologue, epilogue = _split_reduction_kernel(k.nodes, [a.node for a in accs])
    prologue_set = set(prologue)
    for n in prologue:
        broadcast_strides(node_shape(n), shape)
    for n in epilogue:
        if node_shape(n) != out_shape:
            raise Unsupported(f"epilogue node {n.name} has shape {list(node_shape(n))}, not the reduced "
                              f"shape {list(out_shape)}")
        if any(a in prologue_set for a in n.all_input_nodes):
            raise Unsupported(f"epilogue node {n.name} reads a prologue value")
    return accs, prologue, epilogue


def gen_reduction(kb: KernelBuilder) -> None:
    """The reduction skeleton: one pass over the input shape computes the prologue (storing the prologue values
    the kernel outputs) and accumulates every reduction of the kernel (siblings: same input shape, same reduced
    dims, same output shape), then the epilogue runs per kept position on the reduced shape."""
    k = kb.kernel
    accs, prologue, epilogue = reduction_parts(kb)
    red_nodes = [a.node for a in accs]
    shape = tuple(k.shape)
    ndim = len(shape)
    dims, out_shape = accs[0].dims, accs[0].out_shape
    prologue_set = set(prologue)
    pro_ins = [a for a in kb.reads if any(a.node in n.all_input_nodes for n in prologue + red_nodes)]
    epi_ins = [a for a in kb.reads if any(a.node in n.all_input_nodes for n in epilogue)]
    for a in epi_ins:
        a.strides_in(out_shape)
    pro_outs = [a for a in kb.outs if a.node in prologue_set]
    epi_outs = [a for a in kb.outs if a.node not in prologue_set]

    kept = [d for d in range(ndim) if d not in dims]
    schedule = reduction_schedule(shape, dims, blockable(accs), prologue)
    if kb.standalone and _precompiled_column_sum(kb, schedule, accs, prologue + epilogue):
        return

    # epilogue over the reduced shape at flat index o
    e_lines, e_offs = emit_offsets(out_shape, [a.strides_in(out_shape) for a in epi_ins + epi_outs], "o", "e_")
    e_offs = [shifted(off, a.offset) for a, off in zip(epi_ins + epi_outs, e_offs)]
    env: dict[Node, Value] = {}

    def finish_lines(results: list[str]) -> list[str]:
        """The reductions' values from their accumulator expressions, then the epilogue and the stores."""
        lines = []
        for a, result in zip(accs, results):
            env[a.node] = Value(kb.value_name(a.node), a.out_dtype)
            lines.append(f"{kb.value_name(a.node)} = {kb.dialect.cast(result, a.out_dtype)}")
        lines += e_lines + [f"{kb.value_name(a.node)} = {a.arg}[{off}]" for a, off in zip(epi_ins, e_offs)]
        for a in epi_ins:
            env[a.node] = Value(kb.value_name(a.node), a.dtype)
        lines += kb.body.emit(epilogue, env)
        lines += [f"{a.arg}[{off}] = {env[a.node].name}" for a, off in zip(epi_outs, e_offs[len(epi_ins):])]
        return lines

    if schedule.layout == "columns":
        lines = column_reduction(kb, schedule, shape, kept, dims, pro_ins, pro_outs, prologue, accs, env,
                                 finish_lines)
    else:
        lines = _row_reduction(kb, schedule, shape, kept, dims, pro_ins, pro_outs, prologue, accs, env,
                               finish_lines)
    f = Function(kb.name, kb.ins + kb.outs, lines, schedule.parallel)
    kb.functions.append(f)
    kb.launch = [launch_line(f)]


# the nnc.codegen.precompiled column sum of each dtype
_COLUMN_SUMS = {np.dtype(np.float32): "column_sum_f32", np.dtype(np.float64): "column_sum_f64"}


def _precompiled_column_sum(kb: KernelBuilder, schedule: ReductionSchedule, accs, others) -> bool:
    """Launch a serial kernel that only sums a contiguous float32/float64 input over its leading dims (a bias
    gradient) as nnc.codegen.precompiled's column sum, compiled once for every shape; False if it is not one."""
    if (schedule.layout != "columns" or schedule.parallel or len(accs) != 1 or others or len(kb.outs) != 1
            or has_symbols(kb.kernel.shape)):
        return False
    acc, out = accs[0], kb.outs[0]
    function = _COLUMN_SUMS.get(acc.in_dtype)
    read = next((a for a in kb.reads if a.node is acc.source), None)
    if (acc.op_name != "sum" or function is None or acc.out_dtype != acc.in_dtype or out.node is not acc.node
            or acc.dims != list(range(len(acc.dims))) or read is None or tuple(read.shape) != tuple(kb.kernel.shape)
            or (read.strides is not None and list(read.strides) != c_strides(read.shape))):
        return False
    kb.launch = [precompiled_call(kb, function, [read, read.offset, schedule.n_red, schedule.n_outer, out])]
    return True


def _row_reduction(kb: KernelBuilder, schedule: ReductionSchedule, shape, kept, dims, pro_ins, pro_outs, prologue,
                   accs, env, finish_lines) -> list[str]:
    """The row skeleton: a task per kept position (per chunk of reduced positions, with partial results that a
    last loop combines), reducing its positions one by one or, blocked, a block of prologue values at a time."""
    n_outer, n_red, chunks, chunk = schedule.n_outer, schedule.n_red, schedule.chunks, schedule.chunk
    block = schedule.block
    # Offsets of prologue arrays: base(o) over the kept dims + an offset over the reduced dims. When the reduced
    # dims collapse to one (the usual case) every array is read through a per-task slice at r * step (r >= 0 is
    # provable there, so no negative-index wraparound and the prologue loop vectorizes); otherwise from the
    # digits of the absolute reduced index.
    pro_arrays = pro_ins + pro_outs
    full_strides = [a.strides_in(shape) for a in pro_arrays]
    o_lines, o_offs = emit_offsets([shape[d] for d in kept], [[s[d] for d in kept] for s in full_strides],
                                   "o", "o_")
    o_offs = [shifted(off, a.offset) for a, off in zip(pro_arrays, o_offs)]
    red_sizes, red_strides = collapse([shape[d] for d in dims], [[s[d] for d in dims] for s in full_strides])
    linear = len(red_sizes) <= 1
    lo = "0" if chunks == 1 else f"c * {chunk}"
    length = str(n_red) if chunks == 1 else "m"
    task_lines, refs, hoisted = [], [], set()
    if chunks > 1:
        task_lines.append(f"m = min({chunk}, {n_red} - c * {chunk})  # this chunk's length")
    if linear:
        digit_lines = []
        for k, (a, oo, st) in enumerate(zip(pro_arrays, o_offs, red_strides)):
            step = st[0] if st else 0
            if not step:
                refs.append(f"{a.arg}[{oo}]")
                if k < len(pro_ins):
                    hoisted.add(k)
                continue
            start = " + ".join(t for t in (oo, lo if step == 1 else f"{lo} * {step}") if t not in ("0", "0 * 1"))
            start = "" if lo == "0" and oo == "0" else start
            view = a.arg
            if start:
                view = _read_name("red", a, k)
                task_lines.append(f"{view} = {a.arg}[{start}:]")
            refs.append(f"{view}[{'r' if step == 1 else f'r * {step}'}]")
    else:
        absolute = "r" if lo == "0" else "ra"
        digit_lines, r_offs = emit_offsets([shape[d] for d in dims], [[s[d] for d in dims] for s in full_strides],
                                           absolute, "r_")
        if absolute == "ra":
            digit_lines = [f"ra = {lo} + r"] + digit_lines
        for k, (a, oo, ro) in enumerate(zip(pro_arrays, o_offs, r_offs)):
            if oo != "0" and ro != "0":
                task_lines.append(f"{_read_name('b', a, k)} = {oo}")
                oo = _read_name("b", a, k)
            refs.append(f"{a.arg}[{' + '.join(t for t in (oo, ro) if t != '0') or '0'}]")
            if ro == "0" and k < len(pro_ins):
                hoisted.add(k)
    task_loads, loads, pro_body, pro_stores, pass_env = kb.scalar_pass(pro_ins, pro_outs, refs, hoisted, prologue)
    env.update(pass_env)
    task_lines += task_loads
    values = [env[a.source] for a in accs]
    per_element = digit_lines + loads + pro_body + pro_stores
    if schedule.blocked:
        # NOTE: the prologue fills a block buffer per reduction in a loop with no loop-carried dependence (it
        # vectorizes, approx.py's exp included), then a helper reduces each block with the reassociation a
        # serial accumulator forbids (measured 10x faster for a row sum).
        reduce_lines = [f"{a.acc} = {a.identity}" for a in accs]
        reduce_lines += [f"{a.buf} = np.empty({block}, dtype={ctor(a.in_dtype)})" for a in accs]
        reduce_lines += [f"for r0 in range(0, {length}, {block}):"]
        reduce_lines += indent([f"n = min({block}, {length} - r0)", "for q in range(n):"])
        fills = [f"{a.buf}[q] = {v.name}" for a, v in zip(accs, values)]
        reduce_lines += indent(["r = r0 + q"] + per_element + fills, 2)
        combines = [f"{a.acc} = {_combine(kb, a, a.acc, f'{_block_helper_of(kb, a)}({a.buf}, n)')}"
                    for a in accs]
        reduce_lines += indent(combines)
    else:
        combines = [f"{a.acc} = {_combine(kb, a, a.acc, _acc_term(kb.dialect, v, a))}"
                    for a, v in zip(accs, values)]
        reduce_lines = [f"{a.acc} = {a.identity}" for a in accs] + [f"for r in range({length}):"]
        reduce_lines += indent(per_element + combines)

    if chunks == 1:
        lines = [f"for o in {schedule.loop}({n_outer}):"]
        lines += indent(o_lines + task_lines + reduce_lines + finish_lines([a.acc for a in accs]))
    else:
        tasks = schedule.tasks
        lines = [f"{a.partial} = np.empty({tasks}, dtype={ctor(a.acc_dtype)})" for a in accs]
        lines += [f"for t in {schedule.loop}({tasks}):"]
        lines += indent([f"o = t // {chunks}", f"c = t - o * {chunks}"] + o_lines + task_lines + reduce_lines
                        + [f"{a.partial}[t] = {a.acc}" for a in accs])
        lines += [f"for o in range({n_outer}):"]
        lines += indent([f"{a.acc} = {a.partial}[o * {chunks}]" for a in accs] + [f"for c in range(1, {chunks}):"])
        lines += indent([f"{a.acc} = {_combine(kb, a, a.acc, f'{a.partial}[o * {chunks} + c]')}" for a in accs],
                        2)
        lines += indent(finish_lines([a.acc for a in accs]))
    return lines


def accumulators(kernel: Kernel, dialect: Dialect) -> list[_Accumulator]:
    """One accumulator per reduction node of the kernel, after checking they can share one pass: each reads one
    tensor of the kernel's shape, and all reduce the same dims to the same output shape."""
    k = kernel
    reductions = [n for n in k.nodes if isinstance(n.target, Prim) and n.target.op.kind == Kind.REDUCTION]
    if not reductions:
        raise Unsupported("a reduction kernel needs at least one reduction node, found none")
    accs = []
    for i, red in enumerate(reductions):
        op, args, attrs = op_and_attrs(red)
        if op.reducer is None:
            raise Unsupported(f"reduction {op.name} has no reducer (runtime.ops.OpDef.reducer) to accumulate it")
        if len(args) != 1 or not isinstance(args[0], Node):
            raise Unsupported(f"reduction {red.name} must read one tensor")
        shape = node_shape(args[0])
        if tuple(k.shape) != shape:
            raise Unsupported(f"kernel shape {list(k.shape)} is not the input shape {list(shape)} of "
                              f"reduction {red.name}")
        ndim = len(shape)
        dims = sorted({d % ndim if ndim else 0 for d in attrs.get("dims", ())} & set(range(ndim)))
        reducer = op.reducer
        in_dtype, out_dtype = node_dtype(args[0]), node_dtype(red)
        acc_dtype = np.dtype(reducer.accumulator(in_dtype, out_dtype))
        suffix = "" if len(reductions) == 1 else str(i)
        accs.append(_Accumulator(red, op.name, reducer, args[0], dims, node_shape(red), in_dtype, out_dtype,
                                 acc_dtype, dialect.literal(reducer.identity(acc_dtype), acc_dtype), suffix))
    first = accs[0]
    for a in accs[1:]:
        if (a.dims, a.out_shape) != (first.dims, first.out_shape):
            raise Unsupported(f"reductions {first.node.name} and {a.node.name} reduce different dims or to "
                              f"different shapes, so they cannot share one pass")
    return accs


def _combine(kb: KernelBuilder, acc: _Accumulator, accumulated: str, value: str) -> str:
    """acc's reducer combining an accumulator expression with a value expression (both in its accumulator dtype)."""
    return kb.body.fold(acc.reducer.combine, accumulated, value, acc.acc_dtype)


def _acc_term(dialect: Dialect, value: Value, acc: _Accumulator) -> str:
    """A prologue value as the accumulator's dtype."""
    return value.name if value.dtype == acc.acc_dtype else dialect.cast(value.name, acc.acc_dtype)


def _block_helper_of(kb: KernelBuilder, acc: _Accumulator) -> str:
    return block_helper(kb, acc.op_name, acc.reducer, acc.in_dtype, acc.acc_dtype)


def column_reduction(kb: KernelBuilder, schedule: ReductionSchedule, shape, kept, dims, pro_ins, pro_outs, prologue,
                     accs, env, finish_lines) -> list[str]:
    """The column skeleton: tasks of a tile of kept positions x a chunk of reduced positions, each with a tile of
    accumulators per reduction; for each reduced position r, one vectorizable sweep over the tile. With several
    chunks, tasks leave partial results that a last loop combines per kept position before the epilogue."""
    n_outer, n_red = schedule.n_outer, schedule.n_red
    tile, chunk, chunks = schedule.tile, schedule.chunk, schedule.chunks
    arrays = pro_ins + pro_outs
    strides = [a.strides_in(shape) for a in arrays]
    r_lines, r_offs = emit_offsets([shape[d] for d in dims], [[s[d] for d in dims] for s in strides], "r", "r_")
    r_offs = [shifted(off, a.offset) for a, off in zip(arrays, r_offs)]
    ksizes, kstrides = collapse([shape[d] for d in kept], [[s[d] for d in kept] for s in strides])
    per_r, inner, refs, hoisted = list(r_lines), [], [], set()
    if len(ksizes) <= 1:  # the kept positions are one strided run per array: read through per-r slices
        for k, (a, ro, kst) in enumerate(zip(arrays, r_offs, kstrides)):
            step = kst[0] if kst else 0
            if not step:
                refs.append(f"{a.arg}[{ro}]")
                if k < len(pro_ins):
                    hoisted.add(k)
                continue
            start = " + ".join(t for t in (ro, "o0" if step == 1 else f"o0 * {step}") if t != "0")
            col = _read_name("col", a, k)
            per_r.append(f"{col} = {a.arg}[{start}:]")
            refs.append(f"{col}[{'oo' if step == 1 else f'oo * {step}'}]")
    else:
        o_lines, o_offs = emit_offsets([shape[d] for d in kept], [[s[d] for d in kept] for s in strides], "o",
                                       "o_")
        inner = ["o = o0 + oo"] + o_lines
        for k, (a, ro, oo_off) in enumerate(zip(arrays, r_offs, o_offs)):
            refs.append(f"{a.arg}[{' + '.join(t for t in (oo_off, ro) if t != '0') or '0'}]")
            if oo_off == "0" and k < len(pro_ins):
                hoisted.add(k)
    r_loads, loads, body, stores, pass_env = kb.scalar_pass(pro_ins, pro_outs, refs, hoisted, prologue)
    env.update(pass_env)
    per_r += r_loads
    sweep = ["for oo in range(nt):"] + indent(inner + loads + body + stores)
    # NOTE: accumulating float32 values into float64 inside the sweep makes LLVM vectorize the whole sweep at
    # float64's width (half as many lanes): the sweep stores the values to a tile buffer and a second loop
    # accumulates them (measured 1.5x faster on the chain backward).
    def accumulate(a: _Accumulator, value: Value) -> str:
        return f"{a.acc}[oo] = {_combine(kb, a, f'{a.acc}[oo]', _acc_term(kb.dialect, value, a))}"

    # float32 sums add float32 values over spans of at most _SPAN reduced positions, then each span's total
    # into the float64 accumulator (see _SPAN); other widened reductions (products) store, then accumulate.
    widened = [a for a in accs if env[a.source].dtype != a.acc_dtype]
    spanned = [a for a in widened if a.reducer.additive and a.out_dtype == a.in_dtype]
    stored = [a for a in widened if a not in spanned]
    sweep += indent([f"{a.vals}[oo] += {env[a.source].name}" for a in spanned])
    sweep += indent([f"{a.vals}[oo] = {env[a.source].name}" for a in stored])
    sweep += indent([accumulate(a, env[a.source]) for a in accs if a not in widened])
    if stored:
        sweep += ["for oo in range(nt):"]
        sweep += indent([accumulate(a, Value(f"{a.vals}[oo]", env[a.source].dtype)) for a in stored])
    task = ([f"o0 = task * {tile}"] if chunks == 1 else
            [f"c = task % {chunks}", f"o0 = (task // {chunks}) * {tile}"])
    task += [f"nt = min({tile}, {n_outer} - o0)"]
    task += [f"{a.acc} = np.empty({tile}, dtype={ctor(a.acc_dtype)})" for a in accs]
    task += [f"{a.vals} = np.empty({tile}, dtype={ctor(env[a.source].dtype)})" for a in widened]
    task += ["for oo in range(nt):"] + indent([f"{a.acc}[oo] = {a.identity}" for a in accs])
    start, stop = ("0", str(n_red)) if chunks == 1 else (f"c * {chunk}", f"min({n_red}, (c + 1) * {chunk})")
    if spanned:
        task += [f"for r0 in range({start}, {stop}, {_SPAN}):"]
        task += indent(["for oo in range(nt):"] + indent([f"{a.vals}[oo] = {a.identity_of_values}"
                                                          for a in spanned]))
        task += indent([f"for r in range(r0, min({stop}, r0 + {_SPAN})):"] + indent(per_r + sweep))
        task += indent(["for oo in range(nt):"]
                       + indent([accumulate(a, Value(f"{a.vals}[oo]", env[a.source].dtype)) for a in spanned]))
    else:
        task += [f"for r in range({start}, {stop}):"] + indent(per_r + sweep)
    lines = [f"{a.partial} = np.empty({chunks * n_outer}, dtype={ctor(a.acc_dtype)})" for a in accs
             if chunks > 1]
    lines += [f"for task in {schedule.loop}({schedule.tasks}):"]
    if chunks == 1:
        task += ["for oo in range(nt):"] + indent(["o = o0 + oo"] + finish_lines([f"{a.acc}[oo]" for a in accs]))
        return lines + indent(task)
    task += ["for oo in range(nt):"] + indent([f"{a.partial}[c * {n_outer} + o0 + oo] = {a.acc}[oo]"
                                               for a in accs])
    lines += indent(task) + [f"for o in range({n_outer}):"]
    lines += indent([f"{a.total} = {a.partial}[o]" for a in accs] + [f"for c in range(1, {chunks}):"])
    lines += indent([f"{a.total} = {_combine(kb, a, a.total, f'{a.partial}[c * {n_outer} + o]')}"
                     for a in accs], 2)
    return lines + indent(finish_lines([a.total for a in accs]))


# A block helper's numba flags. NOTE: no_cfunc_wrapper: nothing takes a generated function's address, and the C
# wrapper numba builds for that otherwise costs ~5% of a kernel's compile time
_HELPER_FLAGS = "cache=True, error_model='numpy', no_cfunc_wrapper=True"


def block_helper(kb: KernelBuilder, op_name: str, reducer: Reducer, in_dtype: np.dtype, acc_dtype: np.dtype) -> str:
    """The name of a module-level helper reducing buf[:n] (buf of in_dtype) into acc_dtype; defines it once."""
    name = f"block_{op_name}_{in_dtype.name}"
    if name in kb.helpers:
        return name
    one = ctor(acc_dtype)
    if reducer.block == "fold":
        value = kb.dialect.cast("buf[q]", acc_dtype)
        lines = [f"@njit({_HELPER_FLAGS}, fastmath={{'reassoc'}})", f"def {name}(buf, n):",
                 f'    """{op_name} of buf[:n] in {acc_dtype} (reassociated, so it vectorizes)."""',
                 f"    acc = {kb.dialect.literal(reducer.identity(acc_dtype), acc_dtype)}",
                 "    for q in range(n):",
                 f"        acc = {kb.body.fold(reducer.combine, 'acc', value, acc_dtype)}",
                 "    return acc"]
    elif reducer.block in ("all", "any"):
        # NOTE: a chain of short-circuit `and`s runs one branch per element; counting the true values vectorizes.
        # Forced inline, as the extremum helpers are, so that a row kernel's constant n unrolls.
        lines = [f"@njit({_HELPER_FLAGS}, forceinline=True)", f"def {name}(buf, n):",
                 f'    """{op_name} of buf[:n]: its true (nonzero) values counted."""',
                 "    count = 0", "    for q in range(n):", "        count += 1 if buf[q] != 0 else 0",
                 f"    return {'count == n' if reducer.block == 'all' else 'count > 0'}"]
    elif in_dtype in _ORDER_KEYS:
        lines = _float_extreme_helper(name, op_name, reducer.block, in_dtype)
    else:
        # NOTE: one serial max chain runs at one element per compare latency and does not vectorize (not even
        # under nnan); eight independent accumulators do (measured 0.52 -> 0.15 ns per element, numpy 0.13).
        # The select ignores nan, so a float block is checked for nan separately (numpy's max propagates it).
        # Inlined into the caller (forceinline: LLVM's alwaysinline): a row kernel's short rows pass a constant n,
        # which LLVM then unrolls and vectorizes whole; called, each short block paid ~25 ns.
        pick = ">" if reducer.block == "max" else "<"
        lanes = [f"a{k}" for k in range(8)]
        pick_into = lambda a, v: f"{a} = {v} if {v} {pick} {a} else {a}"  # noqa: E731
        lines = [f"@njit({_HELPER_FLAGS}, forceinline=True)", f"def {name}(buf, n):",
                 f'    """{op_name} of buf[:n] (n >= 1), eight accumulators wide'
                 + (", nan if any is nan (numpy's)." if in_dtype.kind == "f" else ".") + '"""',
                 f"    {' = '.join(lanes)} = buf[0]", "    full = n - n % 8", "    for q in range(0, full, 8):"]
        for k in range(8):
            lines += [f"        v{k} = buf[q + {k}]" if k else "        v0 = buf[q]",
                      "        " + pick_into(f"a{k}", f"v{k}")]
        for step in (1, 2, 4):
            for k in range(0, 8, 2 * step):
                lines.append("    " + pick_into(f"a{k}", f"a{k + step}"))
        lines += ["    for q in range(full, n):", "        v = buf[q]", "        " + pick_into("a0", "v")]
        if in_dtype.kind == "f":
            lines += ["    bad = False", "    for q in range(n):", "        bad |= buf[q] != buf[q]",
                      f"    return {one}(np.nan) if bad else a0"]
        else:
            lines.append("    return a0")
    kb.helpers[name] = "\n".join(lines)
    return name


# Integer keys ordered as the floats they come from: the float's bits, with the magnitude bits flipped when the sign
# bit is set. (bits dtype, mask of the magnitude bits, key of +inf, key of -inf) per float dtype.
_ORDER_KEYS = {np.dtype(np.float32): ("int32", 0x7FFFFFFF, 0x7F800000, -0x7F800001),
               np.dtype(np.float64): ("int64", 0x7FFFFFFFFFFFFFFF, 0x7FF0000000000000, -0x7FF0000000000001)}


def _float_extreme_helper(name: str, op_name: str, block: str, dtype: np.dtype) -> list[str]:
    """Lines of a helper giving the max (block "max") or min of a float block buf[:n], nan if any is nan.

    NOTE: a float max chain does not vectorize (LLVM needs nnan for that, and nan must propagate); the same
    reduction over integer keys (_ORDER_KEYS) does. One pass takes the largest and the smallest key: a nan's key
    lies above +inf's (positive nan) or below -inf's (negative nan), so the two tell whether the block holds one.
    Forced inline, the loop sees a row kernel's constant n. Attention's softmax rows (1024 of 64 float32): 27 us
    with eight float accumulators called per row, 9 us inlined, 3.2 us with keys (numpy's max: 4 us for rows of
    4096). The keys order -0.0 below +0.0, so max(-0.0, 0.0) is 0.0 and min is -0.0 whatever their order (numpy's
    and torch's give either zero, by position; the two compare equal)."""
    bits, mask, key_inf, key_ninf = _ORDER_KEYS[dtype]
    f, i = f"np.{dtype.name}", f"np.{bits}"
    width = 8 * dtype.itemsize
    key = lambda v: f"{i}({v} ^ (({v} >> {i}({width - 1})) & {i}({mask})))"  # noqa: E731 (its own inverse)
    result = "hi" if block == "max" else "lo"
    return [f"@njit({_HELPER_FLAGS}, forceinline=True)", f"def {name}(buf, n):",
            f'    """{op_name} of buf[:n] (n >= 1), nan if any is nan (numpy\'s): the {block} of integer keys '
            'ordered as the floats."""',
            f"    hi = {i}({-(1 << (width - 1))})", f"    lo = {i}({(1 << (width - 1)) - 1})",
            "    for q in range(n):", f"        b = {f}(buf[q]).view({i})", f"        k = {key('b')}",
            "        hi = k if k > hi else hi", "        lo = k if k < lo else lo",
            f"    if hi > {i}({key_inf}) or lo < {i}({key_ninf}):", f"        return {f}(np.nan)",
            f"    return {key(result)}.view({f})"]


@dataclass
class _Accumulator:
    """One reduction of a reduction kernel: what it reads and accumulates, and its variables in generated code
    (acc, buf, partial for a kernel's only reduction; acc0, acc1, ... when several share the pass)."""

    node: Node
    op_name: str
    reducer: Reducer
    source: Node
    dims: list
    out_shape: tuple
    in_dtype: np.dtype
    out_dtype: np.dtype
    acc_dtype: np.dtype
    identity: str  # the reducer's identity as a literal of acc_dtype
    suffix: str

    acc = property(lambda self: f"acc{self.suffix}")
    buf = property(lambda self: f"buf{self.suffix}")
    partial = property(lambda self: f"partial{self.suffix}")
    vals = property(lambda self: f"vals{self.suffix}")
    # the identity in the values' own dtype (a span of float32 values starts at float32 zero)
    identity_of_values = property(lambda self: format_literal(self.reducer.identity(self.in_dtype), self.in_dtype))
    total = property(lambda self: f"total{self.suffix}")


def _column_tasks(n_outer: int, n_red: int, parallel: bool) -> tuple[int, int, int, int]:
    """(tile, tiles, chunk, chunks) of the column skeleton: balanced tiles of at most _COLUMN_TILE kept positions
    (a multiple of 16, whole vectors), and when parallel, reduced positions split into chunks until there are
    _COLUMN_TASKS tasks (chunks of at least _MIN_COLUMN_CHUNK positions)."""
    if is_symbolic(n_outer):  # one schedule for every size: whole tiles, the last one partial, and no row chunks
        return _COLUMN_TILE, -(-n_outer // _COLUMN_TILE), n_red, 1  # (balancing would pin the size)
    n_tiles = -(-n_outer // _COLUMN_TILE)
    balanced = -(-n_outer // n_tiles)
    tile = min(n_outer, -(-balanced // 16) * 16)
    chunks = 1
    if parallel and n_tiles < _COLUMN_TASKS:
        chunks = max(1, min(-(-_COLUMN_TASKS // n_tiles), n_red // _MIN_COLUMN_CHUNK))
    chunk = -(-n_red // chunks)
    return tile, n_tiles, chunk, -(-n_red // chunk)


def _read_name(prefix: str, a, k: int) -> str:
    """A per-task variable for read k of a pass: named by its argument, and by its position too when it is a folded
    view (nnc.passes.views), since a base read through several views is one argument read at several places."""
    return f"{prefix}_{a.arg}" if a.strides is None else f"{prefix}{k}_{a.arg}"


def _split_reduction_kernel(nodes: list[Node], reductions: list[Node]) -> tuple[list[Node], list[Node]]:
    """(prologue, epilogue) of a reduction kernel's nodes (in order): the epilogue is what depends on a reduction
    result, the prologue everything else (computed in the pass over the input). Raises Unsupported when a
    reduction reads another one's result (it would need a second pass)."""
    after = set(reductions)
    for n in nodes:
        late = [a for a in n.all_input_nodes if a in after]
        if late and n in reductions:
            raise Unsupported(f"reduction {n.name} reads {late[0].name}, which depends on a reduction of the same "
                              f"kernel")
        if late:
            after.add(n)
    return [n for n in nodes if n not in after], [n for n in nodes if n in after and n not in reductions]
